//! What the crate counts (`stats()` and the `metrics` feature's series)
//! where its layers meet: the keyed maps (full, swept, a factory that
//! fails, a factory replaced), waiting (timeouts, drops, reservations,
//! close, a rate changed under a waiter), the tower middleware and the
//! HTTP layer, and the io wrappers. Every count is asserted exactly, in
//! paused time, against what the callers observed.
#![expect(clippy::float_cmp, reason = "the series are counts, rendered exactly")]

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::body::Body;
use http::{Request, Response, StatusCode};
use tokio::io::AsyncReadExt;
use tokio_ratelimit::http::{Header, HttpRateLimitLayer};
use tokio_ratelimit::io::RateLimitIoExt;
use tokio_ratelimit::keyed::{Keyed, KeyedFunnel};
use tokio_ratelimit::tower::{BoxError, KeyedRateLimitLayer, RateLimit, RateLimited};
use tokio_ratelimit::{AcquireError, ConfigError, Rate, TokenBucket, TryAcquireError};
use tokio_test::{assert_pending, assert_ready, assert_ready_eq, task};
use tower::{Layer, Service, ServiceExt, service_fn};

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

#[path = "support/recorder.rs"]
mod recorder;
use recorder::{Recorded, recorded};

/// The series of a limiter that a test reads, 0 when never recorded.
impl Recorded {
    fn permits(&self, limiter: &str) -> f64 {
        self.of_or_zero("tokio_ratelimit_permits_granted_total", limiter)
    }

    fn waiting(&self, limiter: &str) -> f64 {
        self.of_or_zero("tokio_ratelimit_waiting", limiter)
    }

    fn keys(&self, limiter: &str) -> f64 {
        self.of_or_zero("tokio_ratelimit_keys", limiter)
    }

    fn waits(&self, limiter: &str) -> f64 {
        self.of_or_zero("tokio_ratelimit_wait_seconds_count", limiter)
    }
}

fn bucket(name: &str, per_second: u32, capacity: u32) -> TokenBucket {
    TokenBucket::builder()
        .rate(Rate::per_second(per_second))
        .capacity(capacity)
        .name(name)
        .build()
        .unwrap()
}

fn stats_of(bucket: &TokenBucket) -> (u64, u64, usize) {
    let s = bucket.stats();
    (s.granted, s.refused, s.waiting)
}

// ---------------------------------------------------------------------
// Waiting: timeouts, drops, reservations, close, set_rate
// ---------------------------------------------------------------------

/// A waiter whose turn a `set_rate` pushes past its deadline times out
/// while waiting: one `timeout`, counted once in the stats and the series,
/// no grant, the gauge back to 0, and its wait recorded once.
#[tokio::test(start_paused = true)]
async fn a_waiter_pushed_past_its_deadline_counts_one_timeout() {
    let m = recorded();
    let b = bucket("timeout", 10, 1);
    b.try_acquire().unwrap();
    let mut waiter = task::spawn(b.acquire_timeout(1, ms(150)));
    assert_pending!(waiter.poll());
    assert_eq!(m.waiting("timeout"), 1.0);
    assert_eq!(stats_of(&b), (1, 0, 1));
    // Its turn moves from 100 ms to 1 s: past the 150 ms deadline.
    b.set_rate(Rate::per_second(1)).unwrap();
    tokio::time::advance(ms(150)).await;
    assert_eq!(assert_ready!(waiter.poll()), Err(AcquireError::Timeout));
    drop(waiter);
    assert_eq!(stats_of(&b), (1, 1, 0));
    assert_eq!(m.outcomes("timeout"), [1.0, 0.0, 0.0, 1.0, 0.0, 0.0]);
    assert_eq!(m.permits("timeout"), 1.0);
    assert_eq!(m.waiting("timeout"), 0.0);
    assert_eq!(m.waits("timeout"), 1.0);
}

/// Waiters dropped mid-wait and waiters failed by `close()`: nothing
/// granted, nothing refused (closed refusals are not counted), the gauge
/// and `stats().waiting` back to 0, each wait recorded once.
#[tokio::test(start_paused = true)]
async fn dropped_and_closed_waiters_count_nothing_and_stop_waiting() {
    let m = recorded();
    let b = bucket("drop_close", 10, 1);
    b.try_acquire().unwrap();
    let mut dropped = task::spawn(b.acquire());
    let mut closed = task::spawn(b.acquire_many(1));
    let mut timed = task::spawn(b.acquire_timeout(1, ms(500)));
    assert_pending!(dropped.poll());
    assert_pending!(closed.poll());
    assert_pending!(timed.poll());
    assert_eq!(m.waiting("drop_close"), 3.0);
    assert_eq!(stats_of(&b), (1, 0, 3));
    tokio::time::advance(ms(50)).await;
    drop(dropped);
    assert_eq!(m.waiting("drop_close"), 2.0);
    assert_eq!(stats_of(&b), (1, 0, 2));
    b.close();
    assert_eq!(stats_of(&b), (1, 0, 0));
    assert_eq!(assert_ready!(closed.poll()), Err(AcquireError::Closed));
    assert_eq!(assert_ready!(timed.poll()), Err(AcquireError::Closed));
    drop((closed, timed));
    assert_eq!(m.waiting("drop_close"), 0.0);
    assert_eq!(m.waits("drop_close"), 3.0);
    assert_eq!(m.outcomes("drop_close"), [1.0, 0.0, 0.0, 0.0, 0.0, 0.0]);
    assert_eq!(m.permits("drop_close"), 1.0);
}

/// A `set_rate` that brings a waiter's turn forward: it is granted once,
/// when it sees its grant, and counted once.
#[tokio::test(start_paused = true)]
async fn a_waiter_brought_forward_by_set_rate_is_counted_once() {
    let m = recorded();
    let b = bucket("faster", 1, 1);
    b.try_acquire().unwrap();
    let mut waiter = task::spawn(b.acquire_many(1));
    assert_pending!(waiter.poll());
    b.set_rate(Rate::per_second(100)).unwrap();
    tokio::time::advance(ms(10)).await;
    assert_eq!(stats_of(&b).2, 0);
    assert_ready!(waiter.poll()).unwrap();
    drop(waiter);
    assert_eq!(stats_of(&b), (2, 0, 0));
    assert_eq!(m.outcomes("faster"), [2.0, 0.0, 0.0, 0.0, 0.0, 0.0]);
    assert_eq!(m.permits("faster"), 2.0);
    assert_eq!(m.waiting("faster"), 0.0);
}

/// A reservation counts as granted when committed, never when dropped:
/// one held at once and dropped, one that waited and was dropped after
/// its turn came, one committed.
#[tokio::test(start_paused = true)]
async fn reservations_count_once_committed_and_never_when_dropped() {
    let m = recorded();
    let b = bucket("reserve", 10, 1);
    let held = b.reserve(1).await.unwrap();
    assert_eq!(stats_of(&b), (0, 0, 0));
    drop(held);
    assert_eq!(b.available(), 1);
    b.try_acquire().unwrap();
    // Waits 100 ms, is granted, then dropped unspent.
    let mut waiting = task::spawn(b.reserve(1));
    assert_pending!(waiting.poll());
    assert_eq!(m.waiting("reserve"), 1.0);
    tokio::time::advance(ms(100)).await;
    let reservation = assert_ready!(waiting.poll()).unwrap();
    drop(waiting);
    assert_eq!(m.waiting("reserve"), 0.0);
    assert_eq!(stats_of(&b), (1, 0, 0));
    drop(reservation);
    assert_eq!(stats_of(&b), (1, 0, 0));
    // Committed: one grant.
    b.reserve(1).await.unwrap().commit();
    assert_eq!(stats_of(&b), (2, 0, 0));
    assert_eq!(m.outcomes("reserve"), [2.0, 0.0, 0.0, 0.0, 0.0, 0.0]);
    assert_eq!(m.permits("reserve"), 2.0);
    assert_eq!(m.waits("reserve"), 1.0);
}

// ---------------------------------------------------------------------
// tower: RateLimit (backpressure) and KeyedRateLimit (refusals)
// ---------------------------------------------------------------------

/// `RateLimit`: readiness never used (the service dropped when ready, or
/// while waiting, or the inner service failing its readiness) counts no
/// grant and leaves no waiter; each call is one grant.
#[tokio::test(start_paused = true)]
async fn tower_readiness_never_used_is_not_a_grant() {
    let m = recorded();
    let b = bucket("tower", 10, 1);
    let echo = service_fn(|s: &'static str| async move { Ok::<_, BoxError>(s) });
    // Ready, then dropped: the permit goes back, nothing counted.
    let mut service = RateLimit::new(echo, b.clone());
    service.ready().await.unwrap();
    drop(service);
    assert_eq!(stats_of(&b), (0, 0, 0));
    // Called: one grant.
    let service = RateLimit::new(echo, b.clone());
    assert_eq!(service.oneshot("a").await.unwrap(), "a");
    assert_eq!(stats_of(&b), (1, 0, 0));
    // Waiting in poll_ready, dropped: no grant, no waiter left.
    let mut service = RateLimit::new(echo, b.clone());
    let mut ready = task::spawn(async move { service.ready().await.map(|_| ()) });
    assert_pending!(ready.poll());
    assert_eq!(m.waiting("tower"), 1.0);
    assert_eq!(stats_of(&b), (1, 0, 1));
    tokio::time::advance(ms(50)).await;
    drop(ready);
    assert_eq!(m.waiting("tower"), 0.0);
    assert_eq!(stats_of(&b), (1, 0, 0));
    // An inner service whose readiness fails: the permit goes back.
    tokio::time::advance(ms(50)).await;
    let failing = FailingReady;
    let mut service = RateLimit::new(failing, b.clone());
    assert!(service.ready().await.is_err());
    assert_eq!(b.available(), 1);
    drop(service);
    assert_eq!(stats_of(&b), (1, 0, 0));
    assert_eq!(m.outcomes("tower"), [1.0, 0.0, 0.0, 0.0, 0.0, 0.0]);
    assert_eq!(m.permits("tower"), 1.0);
    assert_eq!(m.waiting("tower"), 0.0);
}

/// A service whose readiness always fails.
#[derive(Clone)]
struct FailingReady;

impl Service<&'static str> for FailingReady {
    type Response = &'static str;
    type Error = BoxError;
    type Future = futures::future::Ready<Result<&'static str, BoxError>>;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), BoxError>> {
        std::task::Poll::Ready(Err("not ready".into()))
    }

    fn call(&mut self, _: &'static str) -> Self::Future {
        unreachable!("never ready")
    }
}

/// `KeyedRateLimit` over a named `KeyedFunnel` with `max_keys`: each
/// request is counted once, by what the caller got (granted, limited, the
/// map full), in the series and the stats alike; a service error after a
/// grant is still one grant.
#[tokio::test(start_paused = true)]
async fn tower_keyed_answers_are_counted_once_each() {
    let m = recorded();
    let map: KeyedFunnel<u32> = KeyedFunnel::builder()
        .rate(Rate::per_second(10))
        .capacity(1)
        .max_keys(1)
        .background_sweep(false)
        .name("tower_keyed")
        .build()
        .unwrap();
    let calls = Arc::new(AtomicUsize::new(0));
    let inner = {
        let calls = Arc::clone(&calls);
        service_fn(move |req: (u32, bool)| {
            calls.fetch_add(1, Ordering::SeqCst);
            async move {
                if req.1 {
                    Err::<(), BoxError>("inner failed".into())
                } else {
                    Ok(())
                }
            }
        })
    };
    let service = KeyedRateLimitLayer::new(map.clone(), |req: &(u32, bool)| req.0).layer(inner);
    // Granted, then the service fails: one grant.
    assert!(service.clone().oneshot((1, true)).await.is_err());
    // Limited.
    let e = service.clone().oneshot((1, false)).await.unwrap_err();
    assert!(e.downcast_ref::<RateLimited<u32>>().is_some());
    // The map full.
    let e = service.clone().oneshot((2, false)).await.unwrap_err();
    assert_eq!(
        e.downcast_ref::<TryAcquireError>(),
        Some(&TryAcquireError::Unavailable)
    );
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    let s = map.stats();
    assert_eq!((s.granted, s.limited, s.refused, s.keys), (1, 1, 1, 1));
    assert_eq!(m.outcomes("tower_keyed"), [1.0, 1.0, 0.0, 0.0, 0.0, 1.0]);
    assert_eq!(m.permits("tower_keyed"), 1.0);
    assert_eq!(m.keys("tower_keyed"), 1.0);
}

/// The HTTP layer over a named `KeyedFunnel`: every 200, 429 and 503
/// counted once, by outcome, in the series and the stats alike.
#[tokio::test(start_paused = true)]
async fn http_answers_are_counted_once_each() {
    let m = recorded();
    let map: KeyedFunnel<tokio_ratelimit::http::ClientKey> = KeyedFunnel::builder()
        .rate(Rate::per_second(10))
        .capacity(2)
        .max_keys(1)
        .background_sweep(false)
        .name("http")
        .build()
        .unwrap();
    let layer = HttpRateLimitLayer::new(map.clone(), Header::new("x-api-key"));
    let inner =
        service_fn(|_: Request<Body>| async { Ok::<_, Infallible>(Response::new(Body::empty())) });
    let service = layer.layer(inner);
    let request = |key: &str| {
        Request::get("/")
            .header("x-api-key", key)
            .body(Body::empty())
            .unwrap()
    };
    let mut statuses = Vec::new();
    for key in ["a", "a", "a", "b", "a"] {
        statuses.push(
            service
                .clone()
                .oneshot(request(key))
                .await
                .unwrap()
                .status(),
        );
    }
    assert_eq!(
        statuses,
        [
            StatusCode::OK,
            StatusCode::OK,
            StatusCode::TOO_MANY_REQUESTS,
            StatusCode::SERVICE_UNAVAILABLE,
            StatusCode::TOO_MANY_REQUESTS,
        ]
    );
    let s = map.stats();
    assert_eq!((s.granted, s.limited, s.refused, s.keys), (2, 2, 1, 1));
    assert_eq!(m.outcomes("http"), [2.0, 2.0, 0.0, 0.0, 0.0, 1.0]);
    assert_eq!(m.permits("http"), 2.0);
}

/// The HTTP layer over a named `Keyed` map of token buckets (the trait's
/// take-then-peek): every 200, 429 and 503 counted once, by outcome, in
/// the series and the stats alike.
#[tokio::test(start_paused = true)]
async fn http_over_a_keyed_map_counts_each_answer_once() {
    let m = recorded();
    let map: Keyed<tokio_ratelimit::http::ClientKey, TokenBucket> = Keyed::builder()
        .limiter(|| {
            TokenBucket::builder()
                .rate(Rate::per_second(10))
                .capacity(2)
                .build()
        })
        .max_keys(1)
        .background_sweep(false)
        .name("http_keyed")
        .build()
        .unwrap();
    let layer = HttpRateLimitLayer::new(map.clone(), Header::new("x-api-key"));
    let inner =
        service_fn(|_: Request<Body>| async { Ok::<_, Infallible>(Response::new(Body::empty())) });
    let service = layer.layer(inner);
    let request = |key: &str| {
        Request::get("/")
            .header("x-api-key", key)
            .body(Body::empty())
            .unwrap()
    };
    let mut statuses = Vec::new();
    for key in ["a", "a", "a", "b", "a"] {
        statuses.push(
            service
                .clone()
                .oneshot(request(key))
                .await
                .unwrap()
                .status(),
        );
    }
    assert_eq!(
        statuses,
        [
            StatusCode::OK,
            StatusCode::OK,
            StatusCode::TOO_MANY_REQUESTS,
            StatusCode::SERVICE_UNAVAILABLE,
            StatusCode::TOO_MANY_REQUESTS,
        ]
    );
    let s = map.stats();
    assert_eq!((s.granted, s.limited, s.refused, s.keys), (2, 2, 1, 1));
    assert_eq!(m.outcomes("http_keyed"), [2.0, 2.0, 0.0, 0.0, 0.0, 1.0]);
    assert_eq!(m.permits("http_keyed"), 2.0);
    assert_eq!(m.keys("http_keyed"), 1.0);
}

// ---------------------------------------------------------------------
// Keyed maps: full, swept, a factory that fails or is replaced
// ---------------------------------------------------------------------

/// A `Keyed` map full (`max_keys`): a new key's request of 0 permits
/// passes, and one over the capacity is `InsufficientCapacity` — neither
/// caller was told the map was full, so `stats().refused` counts neither
/// (the over-capacity ones are in `limited`, once each), nor do the series
/// as `unavailable`; as a `KeyedFunnel` given the same traffic. (Counted
/// in `refused` before the fix: the map counted its look, not the answer.)
#[tokio::test(start_paused = true)]
async fn keyed_full_map_counts_only_unavailable_answers_as_refused() {
    let m = recorded();
    let map: Keyed<u32, TokenBucket> = Keyed::builder()
        .limiter(|| {
            TokenBucket::builder()
                .rate(Rate::per_second(10))
                .capacity(2)
                .build()
        })
        .max_keys(1)
        .background_sweep(false)
        .name("keyed_full")
        .build()
        .unwrap();
    let funnel: KeyedFunnel<u32> = KeyedFunnel::builder()
        .rate(Rate::per_second(10))
        .capacity(2)
        .max_keys(1)
        .background_sweep(false)
        .name("funnel_full")
        .build()
        .unwrap();
    map.try_acquire(&1).unwrap();
    funnel.try_acquire(&1).unwrap();
    // Key 2 is new and the map is full.
    assert_eq!(map.try_acquire_many(&2, 0), Ok(()));
    assert_eq!(funnel.try_acquire_many(&2, 0), Ok(()));
    assert_eq!(
        map.try_acquire_many(&2, 3),
        Err(TryAcquireError::InsufficientCapacity)
    );
    assert_eq!(
        funnel.try_acquire_many(&2, 3),
        Err(TryAcquireError::InsufficientCapacity)
    );
    assert_eq!(
        map.acquire_many(&2, 3).await,
        Err(AcquireError::InsufficientCapacity)
    );
    // The series: one grant, two too_large, no unavailable (for both).
    assert_eq!(m.outcomes("keyed_full"), [1.0, 0.0, 0.0, 0.0, 2.0, 0.0]);
    assert_eq!(m.outcomes("funnel_full"), [1.0, 0.0, 0.0, 0.0, 1.0, 0.0]);
    let f = funnel.stats();
    assert_eq!((f.granted, f.limited, f.refused), (1, 1, 0));
    let s = map.stats();
    assert_eq!(
        (s.granted, s.limited, s.refused),
        (1, 2, 0),
        "Keyed stats vs what the callers got (Ok, InsufficientCapacity ×2)"
    );
}

/// An `acquire` that waits for a slot of a full map and is then granted:
/// the caller was never refused, so neither `stats().refused` nor the
/// series (`unavailable`) count the tries on the way. (Before the fix the
/// map counted each retry: 8 here.)
#[tokio::test(start_paused = true)]
async fn an_acquire_waiting_for_a_slot_is_not_a_refused_key() {
    let m = recorded();
    let funnel: KeyedFunnel<u32> = KeyedFunnel::builder()
        .rate(Rate::per_second(1))
        .capacity(1)
        .max_keys(1)
        .background_sweep(false)
        .name("slot_funnel")
        .build()
        .unwrap();
    let map: Keyed<u32, TokenBucket> = Keyed::builder()
        .limiter(|| {
            TokenBucket::builder()
                .rate(Rate::per_second(1))
                .capacity(1)
                .build()
        })
        .max_keys(1)
        .background_sweep(false)
        .name("slot_keyed")
        .build()
        .unwrap();
    funnel.try_acquire(&1).unwrap();
    map.try_acquire(&1).unwrap();
    // Key 2 waits until key 1 has drained (1 s) and a sweep frees its
    // slot, in both maps at once.
    let start = tokio::time::Instant::now();
    let (f, k) = tokio::join!(funnel.acquire(&2), map.acquire(&2));
    assert_eq!((f, k), (Ok(()), Ok(())));
    assert!(start.elapsed() >= ms(1000), "{:?}", start.elapsed());
    assert_eq!(m.outcomes("slot_funnel"), [2.0, 0.0, 0.0, 0.0, 0.0, 0.0]);
    assert_eq!(m.outcomes("slot_keyed"), [2.0, 0.0, 0.0, 0.0, 0.0, 0.0]);
    let (f, k) = (funnel.stats(), map.stats());
    assert_eq!(
        [(f.granted, f.refused), (k.granted, k.refused)],
        [(2, 0), (2, 0)],
        "stats of the funnel and the map after two grants and no refusal"
    );
}

/// The key gauge of a `Keyed` map whose factory fails for a new key after
/// the map swept a fresh key to make room: the key is gone (`stats().keys`
/// 0) and so says the gauge ("keys held by a keyed map (set as keys come
/// and go)"; it said 1 before the fix).
#[tokio::test(start_paused = true)]
async fn the_key_gauge_follows_a_sweep_before_a_failed_insertion() {
    let m = recorded();
    let map: Keyed<u32, TokenBucket> = Keyed::builder()
        .limiter_for(|key: &u32| {
            if *key == 99 {
                return Err(ConfigError::InvalidParameter {
                    name: "key",
                    reason: "no limiter for 99",
                });
            }
            TokenBucket::builder()
                .rate(Rate::per_second(10))
                .capacity(1)
                .build()
        })
        .max_keys(1)
        .background_sweep(false)
        .name("gauge")
        .build()
        .unwrap();
    map.try_acquire(&1).unwrap();
    assert_eq!(m.keys("gauge"), 1.0);
    // Key 1 refills (fresh); key 99's factory fails after the full map
    // swept key 1 away to make room for it.
    tokio::time::advance(ms(100)).await;
    assert_eq!(map.try_acquire(&99), Err(TryAcquireError::Closed));
    assert_eq!(map.stats().keys, 0);
    assert_eq!(map.stats().evicted, 1);
    assert_eq!(m.keys("gauge"), 0.0, "the key gauge against stats().keys");
}

/// The same without a failing factory: keys added past `max_keys` by
/// `get` (as documented), then a new key refused after the map swept a
/// fresh one: `stats().keys` is 1, and the gauge (2 before the fix).
#[tokio::test(start_paused = true)]
async fn the_key_gauge_follows_a_sweep_before_a_refused_insertion() {
    let m = recorded();
    let map: Keyed<u32, TokenBucket> = Keyed::builder()
        .limiter(|| {
            TokenBucket::builder()
                .rate(Rate::per_second(10))
                .capacity(1)
                .build()
        })
        .max_keys(1)
        .background_sweep(false)
        .name("gauge_forced")
        .build()
        .unwrap();
    // Two keys, one past `max_keys`: key 1 left fresh, key 2 active.
    drop(map.get(&1));
    map.get(&2).try_acquire().unwrap();
    map.try_acquire(&2).unwrap_err();
    assert_eq!(m.keys("gauge_forced"), 2.0);
    // Key 3: the map sweeps key 1 away, is still full, refuses.
    assert_eq!(map.try_acquire(&3), Err(TryAcquireError::Unavailable));
    assert_eq!((map.stats().keys, map.stats().evicted), (1, 1));
    assert_eq!(
        m.keys("gauge_forced"),
        1.0,
        "the key gauge against stats().keys"
    );
}

/// Keys swept by the background sweeper and made again: the key gauge
/// follows `stats().keys` each way, `evicted` counts each key once, and a
/// key made again counts its answers on from where the map was.
#[tokio::test(start_paused = true)]
async fn swept_and_remade_keys_keep_the_gauge_and_the_counts() {
    let m = recorded();
    let map: KeyedFunnel<u32> = KeyedFunnel::builder()
        .rate(Rate::per_second(10))
        .capacity(1)
        .sweep_interval(ms(1000))
        .name("swept")
        .build()
        .unwrap();
    map.try_acquire(&1).unwrap();
    map.try_acquire(&2).unwrap();
    map.try_acquire(&2).unwrap_err();
    assert_eq!(m.keys("swept"), 2.0);
    // Both drained after 100 ms; the sweeper's round at 1 s drops them.
    tokio::time::advance(ms(1100)).await;
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
    let s = map.stats();
    assert_eq!((s.keys, s.evicted), (0, 2));
    assert_eq!(m.keys("swept"), 0.0);
    map.try_acquire(&1).unwrap();
    map.try_acquire(&1).unwrap_err();
    let s = map.stats();
    assert_eq!((s.keys, s.evicted, s.granted, s.limited), (1, 2, 3, 2));
    assert_eq!(m.keys("swept"), 1.0);
    assert_eq!(m.outcomes("swept"), [3.0, 2.0, 0.0, 0.0, 0.0, 0.0]);
}

/// A named map dropped while it holds keys: its counters are published
/// as it goes (documented), and its key gauge ("keys held by a keyed
/// map") falls to 0 (it said two for ever before the fix); so does a
/// `Keyed` map's.
#[tokio::test(start_paused = true)]
async fn a_dropped_map_holds_no_keys() {
    let m = recorded();
    let funnel: KeyedFunnel<u32> = KeyedFunnel::builder()
        .rate(Rate::per_second(10))
        .capacity(1)
        .background_sweep(false)
        .name("dropped_funnel")
        .build()
        .unwrap();
    let map: Keyed<u32, TokenBucket> = Keyed::builder()
        .limiter(|| {
            TokenBucket::builder()
                .rate(Rate::per_second(10))
                .capacity(1)
                .build()
        })
        .background_sweep(false)
        .name("dropped_keyed")
        .build()
        .unwrap();
    for key in [1, 2] {
        funnel.try_acquire(&key).unwrap();
        map.try_acquire(&key).unwrap();
    }
    assert_eq!(
        [m.keys("dropped_funnel"), m.keys("dropped_keyed")],
        [2.0, 2.0]
    );
    drop((funnel, map));
    assert_eq!(m.outcomes("dropped_funnel"), [2.0, 0.0, 0.0, 0.0, 0.0, 0.0]);
    assert_eq!(
        [m.keys("dropped_funnel"), m.keys("dropped_keyed")],
        [0.0, 0.0],
        "key gauges of two dropped maps"
    );
}

/// `set_limiter` with per-key limiters named in the factory: a key held
/// keeps its limiter (and its series), a key made afterwards records under
/// the new factory's name; the map's own series count every answer once.
#[tokio::test(start_paused = true)]
async fn set_limiter_moves_new_keys_to_the_new_series() {
    let m = recorded();
    let factory = |name: &'static str| {
        move || {
            TokenBucket::builder()
                .rate(Rate::per_second(10))
                .capacity(1)
                .name(name)
                .build()
        }
    };
    let map: Keyed<u32, TokenBucket> = Keyed::builder()
        .limiter(factory("v1"))
        .background_sweep(false)
        .name("versions")
        .build()
        .unwrap();
    map.try_acquire(&1).unwrap();
    map.set_limiter(factory("v2")).unwrap();
    map.try_acquire(&1).unwrap_err();
    map.try_acquire(&2).unwrap();
    map.try_acquire(&2).unwrap_err();
    map.try_acquire(&2).unwrap_err();
    assert_eq!(m.outcomes("v1"), [1.0, 1.0, 0.0, 0.0, 0.0, 0.0]);
    assert_eq!(m.outcomes("v2"), [1.0, 2.0, 0.0, 0.0, 0.0, 0.0]);
    assert_eq!(m.outcomes("versions"), [2.0, 3.0, 0.0, 0.0, 0.0, 0.0]);
    let s = map.stats();
    assert_eq!((s.granted, s.limited), (2, 3));
    // Both keys swept, then made again: both from the new factory now.
    tokio::time::advance(ms(100)).await;
    while map.sweep() != 0 {
        std::thread::yield_now();
    }
    map.try_acquire(&1).unwrap();
    assert_eq!(m.outcomes("v1"), [1.0, 1.0, 0.0, 0.0, 0.0, 0.0]);
    assert_eq!(m.outcomes("v2"), [2.0, 2.0, 0.0, 0.0, 0.0, 0.0]);
    assert_eq!(m.keys("versions"), 1.0);
}

// ---------------------------------------------------------------------
// io
// ---------------------------------------------------------------------

/// A reader pays for the bytes it read, not for a chunk: a short stream
/// read to its end is granted exactly its bytes; a read that times out
/// while paying, its wrapper then dropped, is granted nothing and leaves
/// no waiter.
#[tokio::test(start_paused = true)]
async fn a_reader_is_granted_the_bytes_it_handed_out() {
    let m = recorded();
    let b = bucket("io", 10, 4);
    // Three bytes, a chunk of four: three permits.
    let mut reader = (&b"abc"[..]).limited_read(b.clone());
    let mut out = Vec::new();
    reader.read_to_end(&mut out).await.unwrap();
    assert_eq!(out, b"abc");
    assert_eq!(stats_of(&b), (3, 0, 0));
    // Ten bytes once the bucket is full again: four read at once, the
    // next four wait 400 ms for their permits; that read times out after
    // 100 ms and the wrapper is dropped.
    tokio::time::advance(ms(300)).await;
    let mut reader = (&b"0123456789"[..]).limited_read(b.clone());
    let mut buf = [0; 16];
    assert_eq!(reader.read(&mut buf).await.unwrap(), 4);
    let second = tokio::time::timeout(ms(100), reader.read(&mut buf)).await;
    assert!(second.is_err(), "the second read waits for its permits");
    assert_eq!(m.waiting("io"), 1.0);
    assert_eq!(stats_of(&b), (7, 0, 1));
    drop(reader);
    assert_eq!(m.waiting("io"), 0.0);
    assert_eq!(stats_of(&b), (7, 0, 0));
    assert_eq!(m.permits("io"), 7.0);
    assert_eq!(m.outcomes("io"), [2.0, 0.0, 0.0, 0.0, 0.0, 0.0]);
}

/// `RateLimit` over a `LeakyBucket`: readiness that is never used grants
/// nothing. Service A gets ready (holding the shaper's only unit); service
/// B's readiness overflows behind it (`call` would answer `Overflow`);
/// neither is called and both are dropped. A's unit goes back and no
/// grant is counted; B's overflow was the limiter's decision, made and
/// counted in `poll_ready` (documented on `RateLimit`: a refusal counts
/// when decided, a grant when spent), once, in the stats and as
/// `outcome="overflow"`.
#[tokio::test(start_paused = true)]
async fn tower_readiness_never_used_grants_nothing_and_an_overflow_counts_once() {
    let m = recorded();
    let leaky = tokio_ratelimit::LeakyBucket::builder()
        .rate(Rate::per_second(10))
        .capacity(1)
        .name("leaky_tower")
        .build()
        .unwrap();
    let echo = service_fn(|s: &'static str| async move { Ok::<_, BoxError>(s) });
    let mut a = RateLimit::new(echo, leaky.clone());
    a.ready().await.unwrap();
    let mut b = RateLimit::new(echo, leaky.clone());
    // Ready at once: `call` would answer the overflow.
    b.ready().await.unwrap();
    drop((a, b));
    assert_eq!(leaky.level(), 0);
    let s = leaky.stats();
    assert_eq!(
        m.outcomes("leaky_tower"),
        [0.0, 0.0, 1.0, 0.0, 0.0, 0.0],
        "series after two readinesses never used"
    );
    assert_eq!(
        (s.granted, s.refused),
        (0, 1),
        "stats after two readinesses never used"
    );
}

/// A `Keyed` map's `acquire` waiting for a slot of the full map is a
/// caller waiting in `acquire`; the map's own waiting gauge is the only
/// series that could show it (no per-key limiter exists for the key
/// yet), as a `KeyedFunnel` in the same spot shows it. (Before the fix the
/// `Keyed` map's gauge stayed 0 and no wait was recorded.)
#[tokio::test(start_paused = true)]
async fn a_keyed_acquire_waiting_for_a_slot_is_a_waiter() {
    let m = recorded();
    let funnel: KeyedFunnel<u32> = KeyedFunnel::builder()
        .rate(Rate::per_second(1))
        .capacity(1)
        .max_keys(1)
        .background_sweep(false)
        .name("wait_funnel")
        .build()
        .unwrap();
    let map: Keyed<u32, TokenBucket> = Keyed::builder()
        .limiter(|| {
            TokenBucket::builder()
                .rate(Rate::per_second(1))
                .capacity(1)
                .name("wait_per_key")
                .build()
        })
        .max_keys(1)
        .background_sweep(false)
        .name("wait_keyed")
        .build()
        .unwrap();
    funnel.try_acquire(&1).unwrap();
    map.try_acquire(&1).unwrap();
    let mut f = task::spawn(funnel.acquire(&2));
    let mut k = task::spawn(map.acquire(&2));
    assert_pending!(f.poll());
    assert_pending!(k.poll());
    tokio::time::advance(ms(500)).await;
    assert_pending!(f.poll());
    assert_pending!(k.poll());
    let gauges = [
        m.waiting("wait_funnel"),
        m.waiting("wait_keyed") + m.waiting("wait_per_key"),
    ];
    assert_eq!(
        gauges,
        [1.0, 1.0],
        "waiting gauges: funnel, keyed (map + per key)"
    );
    // Key 1 drains at 1 s and a sweep frees its slot; key 2's new bucket
    // is full: granted at once. Each wait recorded once, by its map.
    tokio::time::advance(ms(1000)).await;
    assert_ready_eq!(f.poll(), Ok(()));
    assert_ready_eq!(k.poll(), Ok(()));
    assert_eq!(
        [
            m.waiting("wait_funnel"),
            m.waiting("wait_keyed"),
            m.waiting("wait_per_key")
        ],
        [0.0; 3]
    );
    assert_eq!(
        [
            m.waits("wait_funnel"),
            m.waits("wait_keyed"),
            m.waits("wait_per_key")
        ],
        [1.0, 1.0, 0.0]
    );
}

/// A writer pays a chunk before it writes, and a short write keeps the
/// rest as credit: at every step the permits granted are the bytes
/// written plus the credit, and a wrapper dropped with credit left has
/// been granted exactly that much more than it wrote (documented: "Credit
/// is lost with the wrapper").
#[tokio::test(start_paused = true)]
async fn a_writer_is_granted_its_bytes_plus_its_credit() {
    use tokio::io::AsyncWriteExt;
    let m = recorded();
    let b = bucket("io_write", 10, 4);
    // A writer that takes two bytes a call.
    let written = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut writer = Short(Arc::clone(&written)).limited_write(b.clone());
    writer.write_all(b"abcde").await.unwrap();
    let wrote = |w: &Arc<std::sync::Mutex<Vec<u8>>>| w.lock().unwrap().len() as u64;
    assert_eq!(wrote(&written), 5);
    // Four paid, then one more: five permits, no credit left.
    assert_eq!(b.stats().granted, wrote(&written) + writer.credit());
    assert_eq!(writer.credit(), 0);
    // One write of three bytes: a chunk of three paid, two written.
    tokio::time::advance(ms(400)).await;
    assert_eq!(writer.write(b"xyz").await.unwrap(), 2);
    assert_eq!(writer.credit(), 1);
    assert_eq!(b.stats().granted, wrote(&written) + writer.credit());
    drop(writer);
    assert_eq!(b.stats().granted, 8);
    assert_eq!(wrote(&written), 7);
    assert_eq!(m.permits("io_write"), 8.0);
    assert_eq!(m.waiting("io_write"), 0.0);
}

/// A writer that takes at most two bytes a call.
struct Short(Arc<std::sync::Mutex<Vec<u8>>>);

impl tokio::io::AsyncWrite for Short {
    fn poll_write(
        self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        let n = buf.len().min(2);
        self.0.lock().unwrap().extend_from_slice(&buf[..n]);
        std::task::Poll::Ready(Ok(n))
    }

    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }
}

/// A stream paced by `rate_limited` is granted one permit per item it
/// yields: the permit reserved to look for a next item, given back when
/// the stream ends, counts nothing, and one dropped mid-wait neither.
#[tokio::test(start_paused = true)]
async fn a_paced_stream_is_granted_its_items() {
    use futures::StreamExt;
    use tokio_ratelimit::stream::RateLimitStreamExt;
    let m = recorded();
    let b = bucket("stream", 10, 1);
    let items: Vec<u32> = futures::stream::iter([1, 2, 3])
        .rate_limited(b.clone())
        .map(Result::unwrap)
        .collect()
        .await;
    assert_eq!(items, [1, 2, 3]);
    assert_eq!(stats_of(&b), (3, 0, 0));
    // Dropped while it waits for its second item's permit.
    tokio::time::advance(ms(100)).await;
    let mut paced = futures::stream::iter([4, 5]).rate_limited(b.clone());
    assert_eq!(paced.next().await, Some(Ok(4)));
    let mut next = task::spawn(paced.next());
    assert_pending!(next.poll());
    assert_eq!(m.waiting("stream"), 1.0);
    drop(next);
    drop(paced);
    assert_eq!(stats_of(&b), (4, 0, 0));
    assert_eq!(m.outcomes("stream"), [4.0, 0.0, 0.0, 0.0, 0.0, 0.0]);
    assert_eq!(m.waiting("stream"), 0.0);
}
