//! Where the tower middleware meets each limiter (permits
//! lost, double-spent, over-granted), in paused time.

#![expect(
    clippy::many_single_char_names,
    reason = "services a and b, limiter l, as in the tower docs' sketches"
)]

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::time::{self, Instant};
use tokio_ratelimit::keyed::KeyedFunnel;
use tokio_ratelimit::tower::{KeyedRateLimitLayer, RateLimit, RateLimitLayer};
use tokio_ratelimit::{
    AcquireError, Funnel, LeakyBucket, Limiter, Rate, SmoothBursty, SmoothWarmingUp,
    TryAcquireError,
};
use tokio_test::{assert_pending, assert_ready_ok};
use tower::{Layer, Service, ServiceExt, service_fn};
use tower_test::mock;

mod support;
use support::{bucket, ms};

fn echo(
    calls: &Arc<AtomicUsize>,
) -> impl Service<u32, Response = u32, Error = Infallible, Future: Send> + Clone + Send + Sync + 'static
{
    let calls = Arc::clone(calls);
    service_fn(move |x: u32| {
        calls.fetch_add(1, Ordering::SeqCst);
        async move { Ok::<_, Infallible>(x) }
    })
}

/// Sequential clients until `horizon`: a `TokenBucket` of capacity 3, one
/// permit per 100 ms, grants exactly 3 + 10 over 1 s (the one ready at
/// 1100 ms is dropped, giving its token back).
#[tokio::test(start_paused = true)]
async fn token_bucket_grants_exactly_c_plus_rt_through_the_layer() {
    let b = bucket(3, ms(100));
    let calls = Arc::new(AtomicUsize::new(0));
    let service = RateLimitLayer::new(b.clone()).layer(echo(&calls));
    let start = Instant::now();
    loop {
        let mut s = service.clone();
        s.ready().await.unwrap();
        if start.elapsed() > ms(1000) {
            drop(s);
            break;
        }
        s.call(1).await.unwrap();
    }
    assert_eq!(calls.load(Ordering::SeqCst), 13);
    let stats = b.stats();
    assert_eq!((stats.granted, stats.refused, stats.waiting), (13, 0, 0));
    assert_eq!(b.available(), 1); // at 1100 ms, the dropped one's token is back
}

/// Many clones in parallel tasks, each looping ready/call: still exactly
/// c + r·t, and every permit spent is one inner call.
#[tokio::test(start_paused = true)]
async fn concurrent_clones_grant_exactly_c_plus_rt() {
    let b = bucket(3, ms(100));
    let calls = Arc::new(AtomicUsize::new(0));
    let service = RateLimitLayer::new(b.clone()).layer(echo(&calls));
    let mut tasks = Vec::new();
    for _ in 0..7 {
        let mut s = service.clone();
        tasks.push(tokio::spawn(async move {
            loop {
                s.ready().await.unwrap();
                s.call(1).await.unwrap();
            }
        }));
    }
    time::sleep(ms(1000)).await;
    support::settle().await;
    for t in &tasks {
        t.abort();
    }
    for t in tasks {
        let _ = t.await;
    }
    assert_eq!(calls.load(Ordering::SeqCst), 13);
    assert_eq!(b.stats().granted, 13);
    assert_eq!(b.stats().waiting, 0);
    // Every aborted task's held or queued permit is back: the bucket as it
    // would be with 13 taken over 1 s.
    assert_eq!(b.available(), 0);
    time::sleep(ms(100)).await;
    assert_eq!(b.available(), 1);
}

/// Polled ready twice holds one permit, not two.
#[tokio::test(start_paused = true)]
async fn ready_twice_holds_one_permit() {
    let b = bucket(3, ms(100));
    let (m, _h) = mock::pair::<u32, u32>();
    let mut s = mock::Spawn::new(RateLimit::new(m, b.clone()));
    assert_ready_ok!(s.poll_ready());
    assert_ready_ok!(s.poll_ready());
    assert_ready_ok!(s.poll_ready());
    assert_eq!(b.available(), 2);
    drop(s);
    assert_eq!(b.available(), 3);
    assert_eq!(b.stats().granted, 0);
}

/// A clone does not share its original's reservation: it takes its own,
/// and dropping either returns only its own.
#[tokio::test(start_paused = true)]
async fn a_clone_does_not_share_the_reservation() {
    let b = bucket(3, ms(100));
    let calls = Arc::new(AtomicUsize::new(0));
    let mut a = RateLimit::new(echo(&calls), b.clone());
    a.ready().await.unwrap();
    let mut c = a.clone();
    assert_eq!(b.available(), 2);
    c.ready().await.unwrap();
    assert_eq!(b.available(), 1);
    drop(a);
    assert_eq!(b.available(), 2);
    c.call(7).await.unwrap();
    assert_eq!(b.available(), 2);
    assert_eq!(b.stats().granted, 1);
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

#[tokio::test(start_paused = true)]
#[should_panic(expected = "RateLimit::call without readiness")]
async fn a_clone_of_a_ready_service_is_not_ready() {
    let calls = Arc::new(AtomicUsize::new(0));
    let mut a = RateLimit::new(echo(&calls), bucket(3, ms(100)));
    a.ready().await.unwrap();
    let mut c = a.clone();
    drop(c.call(1));
}

/// Dropping the call future after `call` spends the permit (the inner
/// service was called) — counted once.
#[tokio::test(start_paused = true)]
async fn a_dropped_response_future_spends_exactly_one() {
    let b = bucket(2, ms(100));
    let (m, mut h) = mock::pair::<u32, u32>();
    let mut s = RateLimit::new(m, b.clone());
    s.ready().await.unwrap();
    let fut = s.call(1);
    drop(fut);
    let (req, _send) = h.next_request().await.unwrap();
    assert_eq!(req, 1);
    assert_eq!(b.stats().granted, 1);
    assert_eq!(b.available(), 1);
}

/// The permit is held while the inner service is not ready; dropping the
/// service then gives it to the next waiter at once.
#[tokio::test(start_paused = true)]
async fn permit_held_for_a_not_ready_inner_goes_to_the_next_when_dropped() {
    let b = bucket(1, ms(100));
    let (m, mut h) = mock::pair::<u32, u32>();
    h.allow(0);
    let layer = RateLimitLayer::new(b.clone());
    let mut first = mock::Spawn::new(layer.layer(m.clone()));
    let mut second = mock::Spawn::new(layer.layer(m.clone()));
    assert_pending!(first.poll_ready());
    assert_eq!(b.available(), 0);
    assert_pending!(second.poll_ready());
    assert_eq!(b.stats().waiting, 1);
    time::sleep(ms(10)).await;
    drop(first);
    h.allow(1);
    assert_ready_ok!(second.poll_ready());
    assert_eq!(b.stats().waiting, 0);
    assert_eq!(b.stats().granted, 0);
}

async fn timeline<L: Limiter + Clone + 'static>(
    make: impl Fn() -> L,
    drop_first: bool,
) -> (Vec<Duration>, u64) {
    let l = make();
    let calls = Arc::new(AtomicUsize::new(0));
    let service = RateLimitLayer::new(l.clone()).layer(echo(&calls));
    let start = Instant::now();
    if drop_first {
        let mut s = service.clone();
        s.ready().await.unwrap();
        drop(s);
    }
    let mut at = Vec::new();
    for i in 0..6 {
        let r = service.clone().oneshot(i).await;
        at.push(if r.is_ok() {
            start.elapsed()
        } else {
            Duration::MAX
        });
    }
    (at, l.stats().granted)
}

/// For every limiter: a service made ready and dropped unused at t = 0
/// changes nothing after it (the reservation docs: "as if the request had
/// never come"; smooth: "withdrawn entirely while nothing was reserved
/// after it").
#[tokio::test(start_paused = true)]
async fn ready_then_dropped_is_as_if_never_for_every_limiter() {
    macro_rules! check {
        ($name:expr, $make:expr) => {{
            let a = timeline($make, false).await;
            let b = timeline($make, true).await;
            assert_eq!(a, b, "{}: without vs with a dropped ready service", $name);
            assert_eq!(a.1, 6, "{}: granted", $name);
        }};
    }
    check!("token", || bucket(2, ms(100)));
    check!("funnel", || Funnel::builder()
        .rate(Rate::every(ms(100)))
        .capacity(2)
        .build()
        .unwrap());
    check!("leaky", || LeakyBucket::builder()
        .rate(Rate::every(ms(100)))
        .capacity(8)
        .build()
        .unwrap());
    check!("bursty", || SmoothBursty::builder()
        .permits_per_second(10.0)
        .build()
        .unwrap());
    check!("warming", || SmoothWarmingUp::builder()
        .permits_per_second(10.0)
        .warmup(Duration::from_secs(1))
        .cold_factor(3.0)
        .build()
        .unwrap());
}

/// The same, when the dropped one is dropped while others wait behind it.
#[tokio::test(start_paused = true)]
async fn dropped_ahead_of_waiters_moves_them_forward_every_limiter() {
    macro_rules! check {
        ($name:expr, $make:expr) => {{
            let mut runs = Vec::new();
            for drop_first in [false, true] {
                let l = $make();
                let calls = Arc::new(AtomicUsize::new(0));
                let service = RateLimitLayer::new(l.clone()).layer(echo(&calls));
                let start = Instant::now();
                let mut held = mock::Spawn::new(service.clone());
                if drop_first {
                    assert_ready_ok!(held.poll_ready());
                }
                let mut handles = Vec::new();
                for i in 0..4u32 {
                    let s = service.clone();
                    handles.push(tokio::spawn(async move {
                        s.oneshot(i).await.map(|_| Instant::now())
                    }));
                }
                support::settle().await;
                drop(held);
                let mut at = Vec::new();
                for h in handles {
                    at.push(h.await.unwrap().map(|t| t - start).ok());
                }
                at.sort();
                assert_eq!(l.stats().granted, 4, "{}", $name);
                assert_eq!(calls.load(Ordering::SeqCst), 4);
                runs.push(at);
            }
            // The four waiters are served at the instants they would
            // have been without the dropped one ahead of them.
            assert_eq!(runs[0], runs[1], "{}: without vs with it dropped", $name);
        }};
    }
    check!("token", || bucket(1, ms(100)));
    check!("funnel", || Funnel::builder()
        .rate(Rate::every(ms(100)))
        .capacity(1)
        .build()
        .unwrap());
    check!("leaky", || LeakyBucket::builder()
        .rate(Rate::every(ms(100)))
        .capacity(8)
        .build()
        .unwrap());
    check!("bursty", || SmoothBursty::builder()
        .permits_per_second(10.0)
        .build()
        .unwrap());
}

/// A leaky bucket overflow is decided in `poll_ready` and reported by `call`;
/// a service dropped in the Refused state changes no counts beyond the
/// one refusal.
#[tokio::test(start_paused = true)]
async fn leaky_overflow_refused_then_dropped() {
    let l = LeakyBucket::builder()
        .rate(Rate::every(ms(100)))
        .capacity(1)
        .build()
        .unwrap();
    let calls = Arc::new(AtomicUsize::new(0));
    let service = RateLimit::new(echo(&calls), l.clone());
    let mut a = service.clone();
    a.ready().await.unwrap(); // holds the water
    let mut b = service.clone();
    b.ready().await.unwrap(); // refused: overflow
    drop(b);
    assert_eq!(
        l.stats().refused,
        1,
        "the dropped refused service: one refusal"
    );
    a.call(1).await.unwrap();
    let mut c = service.clone();
    let e = c.ready().await.unwrap().call(2).await.unwrap_err();
    assert_eq!(
        e.downcast_ref::<AcquireError>(),
        Some(&AcquireError::Overflow)
    );
    let st = l.stats();
    assert_eq!(st.granted, 1);
    assert_eq!(st.refused, 2);
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

type Req = (u64, u32);

/// `max_keys`: a new key refused (`Unavailable`, 503-like), inner not called,
/// counted once in the keyed stats; the global permit the inner `RateLimit`
/// held for it is given back when the service is dropped.
#[tokio::test(start_paused = true)]
async fn keyed_max_keys_over_a_global_limit() {
    let map: KeyedFunnel<u64> = KeyedFunnel::builder()
        .rate(Rate::per_second(1))
        .capacity(5)
        .max_keys(1)
        .build()
        .unwrap();
    let global = bucket(3, ms(100));
    let calls = Arc::new(AtomicUsize::new(0));
    let calls2 = Arc::clone(&calls);
    let service = KeyedRateLimitLayer::new(map.clone(), |r: &Req| r.0).layer(
        RateLimitLayer::new(global.clone()).layer(service_fn(move |r: Req| {
            calls2.fetch_add(1, Ordering::SeqCst);
            async move { Ok::<_, Infallible>(r.1) }
        })),
    );
    assert_eq!(service.clone().oneshot((1, 1)).await.unwrap(), 1);
    let e = service.clone().oneshot((2, 2)).await.unwrap_err();
    assert_eq!(
        e.downcast_ref::<TryAcquireError>(),
        Some(&TryAcquireError::Unavailable)
    );
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    assert_eq!(global.stats().granted, 1);
    assert_eq!(global.available(), 2);
    let ks = map.stats();
    assert_eq!((ks.keys, ks.refused, ks.granted, ks.limited), (1, 1, 1, 0));

    // One long-lived service (not dropped between requests): the refused
    // request's held global permit is reused by the next call, not lost
    // and not taken twice.
    let mut s = service.clone();
    s.ready().await.unwrap();
    assert_eq!(global.available(), 1);
    assert!(s.call((2, 3)).await.is_err()); // refused, permit still held
    assert_eq!(global.available(), 1);
    s.ready().await.unwrap();
    assert_eq!(global.available(), 1); // the same held permit
    assert_eq!(s.call((1, 4)).await.unwrap(), 4);
    assert_eq!(global.stats().granted, 2);
    assert_eq!(global.available(), 1);
    drop(s);
    assert_eq!(global.available(), 1);
    let ks = map.stats();
    assert_eq!((ks.refused, ks.granted), (2, 2));
}

/// Counts immediate grants (`try_acquire`) until the first refusal.
fn drain_now<L: Limiter>(l: &L) -> u32 {
    let mut n = 0;
    while l.try_acquire().is_ok() {
        n += 1;
    }
    n
}

/// What `RateLimit`'s docs say of the smooth limiters: a `SmoothBursty` with
/// stored permits, A ready, B ready after it, A dropped unused, B called:
/// A's unelapsed cost comes back, but the stored permit it spent stays
/// spent, so one permit fewer is there at once than with no A at all.
#[tokio::test(start_paused = true)]
async fn a_smooth_bursty_keeps_the_stored_permit_a_dropped_ready_service_spent() {
    let make = || {
        SmoothBursty::builder()
            .permits_per_second(10.0)
            .build()
            .unwrap()
    };
    // Baseline: B alone.
    let base = make();
    let calls = Arc::new(AtomicUsize::new(0));
    time::sleep(Duration::from_secs(2)).await;
    let service = RateLimit::new(echo(&calls), base.clone());
    let _ = base.try_acquire(); // make sure the limiter has started (stores from now)
    time::sleep(Duration::from_secs(2)).await;
    service.clone().oneshot(1).await.unwrap();
    let baseline = drain_now(&base);

    let l = make();
    let _ = l.try_acquire();
    time::sleep(Duration::from_secs(2)).await;
    let service = RateLimit::new(echo(&calls), l.clone());
    let mut a = service.clone();
    a.ready().await.unwrap();
    let mut b = service.clone();
    b.ready().await.unwrap();
    drop(a);
    b.call(2).await.unwrap();
    let with_dropped = drain_now(&l);
    assert_eq!(
        with_dropped,
        baseline - 1,
        "as documented: the stored permit stays spent"
    );
}
