//! The tower middleware (feature `tower`), in paused time: `RateLimit`'s
//! backpressure order, the budget its clones share, what a service dropped
//! between `poll_ready` and `call` gives back, limiter errors; and
//! `KeyedRateLimit`'s refusals (exact `retry_after`, keys independent).

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use tokio::time::{self, Instant};
use tokio_ratelimit::keyed::{Keyed, KeyedFunnel};
use tokio_ratelimit::tower::{
    BoxError, KeyedRateLimit, KeyedRateLimitLayer, RateLimit, RateLimitLayer, RateLimited,
};
use tokio_ratelimit::{
    AcquireError, ConfigError, Funnel, LeakyBucket, Limiter, Rate, TokenBucket, TryAcquireError,
};
use tokio_test::{assert_pending, assert_ready, assert_ready_ok};
use tower::{Layer, Service, ServiceExt, service_fn};
use tower_test::mock;

mod support;
use support::{bucket, ms};

/// An inner service that counts its calls and echoes the request.
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

type Echo = Box<dyn Fn() -> RateLimit<mock::Mock<u32, u32>>>;

/// A limited mock service and the handle that controls the mock's
/// readiness and sees its requests.
fn limited_mock(limiter: impl Limiter + 'static) -> (Echo, mock::Handle<u32, u32>) {
    let (mock, handle) = mock::pair::<u32, u32>();
    let layer = RateLimitLayer::new(limiter);
    (Box::new(move || layer.layer(mock.clone())), handle)
}

#[tokio::test(start_paused = true)]
async fn backpressure_is_fifo_across_clones() {
    let (make, _handle) = limited_mock(bucket(1, ms(100)));
    let service = make();
    let mut clients: Vec<_> = (0..4).map(|_| mock::Spawn::new(service.clone())).collect();
    // Arrival order 2, 0, 3, 1: client 2 takes the token, the rest queue.
    assert_ready_ok!(clients[2].poll_ready());
    for i in [0, 3, 1] {
        assert_pending!(clients[i].poll_ready());
    }
    time::sleep(ms(99)).await;
    assert_pending!(clients[0].poll_ready());
    time::sleep(ms(1)).await;
    // At exactly 100 ms it is client 0's turn, whoever asks first.
    assert_pending!(clients[3].poll_ready());
    assert_pending!(clients[1].poll_ready());
    assert_ready_ok!(clients[0].poll_ready());
    time::sleep(ms(100)).await;
    assert_pending!(clients[1].poll_ready());
    assert_ready_ok!(clients[3].poll_ready());
    time::sleep(ms(100)).await;
    assert_ready_ok!(clients[1].poll_ready());
}

#[tokio::test(start_paused = true)]
async fn waiters_are_woken_in_turn() {
    let (make, _handle) = limited_mock(bucket(1, ms(100)));
    let mut first = mock::Spawn::new(make());
    let mut second = mock::Spawn::new(make()); // another service from the layer
    assert_ready_ok!(first.poll_ready());
    assert_pending!(second.poll_ready());
    time::sleep(ms(101)).await; // one tick past the turn: the actor has run
    assert!(second.is_woken());
    assert_ready_ok!(second.poll_ready());
}

#[tokio::test(start_paused = true)]
async fn every_clone_draws_from_one_budget() {
    let calls = Arc::new(AtomicUsize::new(0));
    let limiter = bucket(2, ms(500));
    let layer = RateLimitLayer::new(limiter.clone());
    let service = layer.layer(echo(&calls));
    let other = layer.layer(echo(&calls)); // a second service from the same layer
    let start = Instant::now();
    let mut done = Vec::new();
    for (i, svc) in [
        service.clone(),
        other.clone(),
        service.clone(),
        other,
        service,
    ]
    .into_iter()
    .enumerate()
    {
        let i = u32::try_from(i).unwrap();
        assert_eq!(svc.oneshot(i).await.unwrap(), i);
        done.push(start.elapsed());
    }
    // A burst of 2, then one every 500 ms: the clones share one bucket.
    assert_eq!(done, [ms(0), ms(0), ms(500), ms(1000), ms(1500)]);
    assert_eq!(calls.load(Ordering::SeqCst), 5);
    assert_eq!(limiter.stats().granted, 5);
}

#[tokio::test(start_paused = true)]
async fn shares_an_arc_dyn_limiter_from_configuration() {
    let limiter: Arc<dyn Limiter> = Arc::new(
        Funnel::builder()
            .rate(Rate::per_second(4))
            .capacity(1)
            .build()
            .unwrap(),
    );
    let calls = Arc::new(AtomicUsize::new(0));
    let service = RateLimit::new(echo(&calls), Arc::clone(&limiter));
    let start = Instant::now();
    for i in 0..3 {
        service.clone().oneshot(i).await.unwrap();
    }
    assert_eq!(start.elapsed(), ms(500));
    assert_eq!(limiter.stats().granted, 3);
}

#[tokio::test(start_paused = true)]
async fn a_service_dropped_after_poll_ready_gives_its_permit_back() {
    let limiter = bucket(1, ms(100));
    let (make, _handle) = limited_mock(limiter.clone());
    let mut ready = mock::Spawn::new(make());
    let mut next = mock::Spawn::new(make());
    assert_ready_ok!(ready.poll_ready());
    assert_eq!(limiter.available(), 0); // held for `ready`
    assert_pending!(next.poll_ready()); // queued behind it, due at 100 ms
    drop(ready); // never called
    // The permit comes back at once and the next in line takes it, at 0 ms.
    assert!(next.is_woken());
    assert_ready_ok!(next.poll_ready());
    assert_eq!(limiter.stats().granted, 0); // held, not spent: nothing called yet
    drop(next.call(7));
    assert_eq!(limiter.stats().granted, 1);
    // Nothing was lost: the next permit is due at 100 ms, as if the dropped
    // service had never asked.
    let mut after = mock::Spawn::new(make());
    assert_pending!(after.poll_ready());
    time::sleep(ms(100)).await;
    assert_ready_ok!(after.poll_ready());
}

#[tokio::test(start_paused = true)]
async fn a_service_dropped_while_waiting_gives_its_place_back() {
    let limiter = bucket(1, ms(100));
    let (make, _handle) = limited_mock(limiter.clone());
    let mut first = mock::Spawn::new(make());
    let mut second = mock::Spawn::new(make());
    let mut third = mock::Spawn::new(make());
    assert_ready_ok!(first.poll_ready()); // 0 ms
    assert_pending!(second.poll_ready()); // due at 100 ms
    assert_pending!(third.poll_ready()); // due at 200 ms
    drop(second);
    time::sleep(ms(100)).await;
    assert_ready_ok!(third.poll_ready()); // moved up to 100 ms
}

#[tokio::test(start_paused = true)]
async fn into_inner_gives_the_permit_back() {
    let limiter = bucket(1, ms(100));
    let (make, _handle) = limited_mock(limiter.clone());
    let mut service = mock::Spawn::new(make());
    assert_ready_ok!(service.poll_ready());
    assert_eq!(limiter.available(), 0);
    let _mock = service.into_inner().into_inner();
    assert_eq!(limiter.available(), 1);
}

#[tokio::test(start_paused = true)]
async fn the_permit_is_held_while_the_inner_service_is_not_ready() {
    let limiter = bucket(2, ms(100));
    let (make, mut handle) = limited_mock(limiter.clone());
    let mut service = mock::Spawn::new(make());
    handle.allow(0);
    assert_pending!(service.poll_ready());
    assert_eq!(limiter.available(), 1); // one reserved, waiting for the inner service
    handle.allow(1);
    assert!(service.is_woken());
    assert_ready_ok!(service.poll_ready());
    let response = service.call(5);
    let (request, send) = handle.next_request().await.unwrap();
    assert_eq!(request, 5);
    send.send_response(6);
    assert_eq!(response.await.unwrap(), 6);
    assert_eq!(limiter.stats().granted, 1);
}

#[tokio::test(start_paused = true)]
async fn an_inner_poll_ready_error_gives_the_permit_back() {
    let limiter = bucket(1, ms(100));
    let (make, mut handle) = limited_mock(limiter.clone());
    let mut service = mock::Spawn::new(make());
    handle.send_error("backend gone");
    let error = assert_ready!(service.poll_ready()).unwrap_err();
    assert_eq!(error.to_string(), "backend gone");
    assert_eq!(limiter.available(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_closed_limiter_fails_the_request_not_the_service() {
    let limiter = bucket(1, ms(100));
    let calls = Arc::new(AtomicUsize::new(0));
    let mut service = RateLimit::new(echo(&calls), limiter.clone());
    assert_eq!(service.ready().await.unwrap().call(1).await.unwrap(), 1);
    limiter.close();
    for _ in 0..2 {
        // poll_ready succeeds; the request fails without reaching the inner service.
        let error = service.ready().await.unwrap().call(2).await.unwrap_err();
        assert_eq!(
            error.downcast_ref::<AcquireError>(),
            Some(&AcquireError::Closed)
        );
    }
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

#[tokio::test(start_paused = true)]
async fn a_closed_limiter_fails_a_waiting_request() {
    let limiter = bucket(1, ms(100));
    let (make, _handle) = limited_mock(limiter.clone());
    let mut first = mock::Spawn::new(make());
    let mut second = mock::Spawn::new(make());
    assert_ready_ok!(first.poll_ready());
    assert_pending!(second.poll_ready());
    limiter.close();
    assert!(second.is_woken());
    assert_ready_ok!(second.poll_ready());
    let error = second.call(1).await.unwrap_err();
    assert_eq!(
        error.downcast_ref::<AcquireError>(),
        Some(&AcquireError::Closed)
    );
}

#[tokio::test(start_paused = true)]
async fn a_shaper_overflow_fails_one_request_and_the_service_goes_on() {
    // Room for one request's water: a second one overflows, at once.
    let shaper = LeakyBucket::builder()
        .rate(Rate::every(ms(100)))
        .capacity(1)
        .build()
        .unwrap();
    let calls = Arc::new(AtomicUsize::new(0));
    let mut service = RateLimit::new(echo(&calls), shaper);
    let start = Instant::now();
    service.ready().await.unwrap().call(1).await.unwrap();
    let error = service.ready().await.unwrap().call(2).await.unwrap_err();
    assert_eq!(
        error.downcast_ref::<AcquireError>(),
        Some(&AcquireError::Overflow)
    );
    assert_eq!(start.elapsed(), ms(0));
    time::sleep(ms(100)).await; // drained
    assert_eq!(service.ready().await.unwrap().call(3).await.unwrap(), 3);
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

#[tokio::test(start_paused = true)]
#[should_panic(expected = "RateLimit::call without readiness")]
async fn call_without_poll_ready_panics() {
    let calls = Arc::new(AtomicUsize::new(0));
    let mut service = RateLimit::new(echo(&calls), bucket(1, ms(100)));
    drop(service.call(1));
}

#[tokio::test(start_paused = true)]
#[should_panic(expected = "RateLimit::call without readiness")]
async fn a_second_call_needs_a_second_poll_ready() {
    let calls = Arc::new(AtomicUsize::new(0));
    let mut service = RateLimit::new(echo(&calls), bucket(5, ms(100)));
    service.ready().await.unwrap();
    drop(service.call(1));
    drop(service.call(2));
}

#[test]
fn layer_and_services_are_clone_debug_send_sync() {
    fn bounds<T: Clone + std::fmt::Debug + Send + Sync + 'static>() {}
    fn send_future<S: Service<u32, Future: Send>>() {}
    bounds::<RateLimitLayer>();
    bounds::<RateLimit<mock::Mock<u32, u32>>>();
    bounds::<KeyedRateLimitLayer<KeyedFunnel<String>, fn(&u32) -> String>>();
    bounds::<KeyedRateLimit<mock::Mock<u32, u32>, KeyedFunnel<String>, fn(&u32) -> String>>();
    send_future::<RateLimit<mock::Mock<u32, u32>>>();
    send_future::<KeyedRateLimit<mock::Mock<u32, u32>, KeyedFunnel<String>, fn(&u32) -> String>>();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let _guard = rt.enter();
    let layer = RateLimitLayer::new(bucket(1, ms(100)));
    assert!(format!("{layer:?}").starts_with("RateLimitLayer { limiter: Stats {"));
}

// ---- KeyedRateLimit ----

/// Requests are `(client, payload)`.
type Req = (&'static str, u32);

fn per_client(rate: Rate, capacity: u32) -> KeyedFunnel<String> {
    KeyedFunnel::builder()
        .rate(rate)
        .capacity(capacity)
        .build()
        .unwrap()
}

fn keyed_echo<L: tokio_ratelimit::keyed::KeyedLimiter<Key = String> + Clone + 'static>(
    limiter: L,
    calls: &Arc<AtomicUsize>,
) -> impl Service<Req, Response = u32, Error = BoxError> + Clone {
    let calls = Arc::clone(calls);
    let inner = service_fn(move |req: Req| {
        calls.fetch_add(1, Ordering::SeqCst);
        async move { Ok::<_, Infallible>(req.1) }
    });
    KeyedRateLimitLayer::new(limiter, |req: &Req| req.0.to_owned()).layer(inner)
}

fn limited(error: &BoxError) -> &RateLimited<String> {
    error
        .downcast_ref::<RateLimited<String>>()
        .unwrap_or_else(|| panic!("not RateLimited: {error:?}"))
}

#[tokio::test(start_paused = true)]
async fn keyed_refuses_at_once_with_the_exact_retry_after() {
    // Two units per 3 s (one every 1.5 s), bursts of 2.
    let calls = Arc::new(AtomicUsize::new(0));
    let service = keyed_echo(per_client(Rate::per(2, Duration::from_secs(3)), 2), &calls);
    let start = Instant::now();
    assert_eq!(service.clone().oneshot(("ann", 1)).await.unwrap(), 1);
    assert_eq!(service.clone().oneshot(("ann", 2)).await.unwrap(), 2);
    let error = service.clone().oneshot(("ann", 3)).await.unwrap_err();
    let refused = limited(&error);
    assert_eq!(refused.key, "ann");
    assert_eq!(refused.retry_after, ms(1500));
    assert_eq!(error.to_string(), "rate limited, retry after 1.5s");
    assert_eq!(start.elapsed(), Duration::ZERO); // refused at once
    assert_eq!(calls.load(Ordering::SeqCst), 2); // never reached the inner service

    time::advance(ms(1499) + Duration::from_nanos(999_999)).await;
    let error = service.clone().oneshot(("ann", 4)).await.unwrap_err();
    assert_eq!(limited(&error).retry_after, Duration::from_nanos(1));
    time::advance(Duration::from_nanos(1)).await;
    assert_eq!(service.clone().oneshot(("ann", 5)).await.unwrap(), 5);
    let error = service.clone().oneshot(("ann", 6)).await.unwrap_err();
    assert_eq!(limited(&error).retry_after, ms(1500));
    assert_eq!(calls.load(Ordering::SeqCst), 3);
}

#[tokio::test(start_paused = true)]
async fn keys_are_independent_and_clones_share_them() {
    let calls = Arc::new(AtomicUsize::new(0));
    let limiter = per_client(Rate::per_second(1), 1);
    let service = keyed_echo(limiter.clone(), &calls);
    let mut outcomes = Vec::new();
    for client in ["ann", "bob", "ann", "cat", "bob", "ann"] {
        outcomes.push(service.clone().oneshot((client, 0)).await.is_ok());
    }
    assert_eq!(outcomes, [true, true, false, true, false, false]);
    assert_eq!(calls.load(Ordering::SeqCst), 3);
    let stats = limiter.stats();
    assert_eq!((stats.keys, stats.granted, stats.limited), (3, 3, 3));
}

#[tokio::test(start_paused = true)]
async fn keyed_poll_ready_is_the_inner_services_alone() {
    let limiter = per_client(Rate::per_second(1), 1);
    let (mut service, mut handle) = mock::spawn_with(|mock| {
        KeyedRateLimit::new(mock, limiter.clone(), |req: &Req| req.0.to_owned())
    });
    handle.allow(0);
    assert_pending!(service.poll_ready());
    assert!(limiter.is_empty()); // nothing asked of the limiter yet
    handle.allow(2);
    assert_ready_ok!(service.poll_ready());
    let response = service.call(("ann", 1));
    let (request, send) = handle.next_request().await.unwrap();
    assert_eq!(request, ("ann", 1));
    send.send_response(("ok", 1));
    assert_eq!(response.await.unwrap(), ("ok", 1));
    // Over the limit: the inner service never sees the request.
    assert_ready_ok!(service.poll_ready());
    let error = service.call(("ann", 2)).await.unwrap_err();
    assert_eq!(limited(&error).retry_after, ms(1000));
    assert!(handle.poll_request().is_pending());
}

#[tokio::test(start_paused = true)]
async fn keyed_token_buckets_work_through_the_same_layer() {
    let per_host: Keyed<String, TokenBucket> = Keyed::builder()
        .limiter(|| {
            TokenBucket::builder()
                .rate(Rate::per_second(10))
                .capacity(2)
                .build()
        })
        .build()
        .unwrap();
    let calls = Arc::new(AtomicUsize::new(0));
    let service = keyed_echo(per_host, &calls);
    assert!(service.clone().oneshot(("a.example", 1)).await.is_ok());
    assert!(service.clone().oneshot(("a.example", 2)).await.is_ok());
    let error = service.clone().oneshot(("a.example", 3)).await.unwrap_err();
    assert_eq!(limited(&error).retry_after, ms(100));
    assert!(service.clone().oneshot(("b.example", 4)).await.is_ok());
    time::advance(ms(100)).await;
    assert!(service.clone().oneshot(("a.example", 5)).await.is_ok());
    assert_eq!(calls.load(Ordering::SeqCst), 4);
}

#[tokio::test(start_paused = true)]
async fn other_keyed_errors_are_passed_on() {
    // A factory that fails for keys after the first: the map answers Closed.
    let ok = Arc::new(AtomicBool::new(true));
    let factory_ok = Arc::clone(&ok);
    let per_host: Keyed<String, Funnel> = Keyed::builder()
        .limiter(move || {
            if factory_ok.load(Ordering::SeqCst) {
                Funnel::builder().rate(Rate::per_second(1)).build()
            } else {
                Err(ConfigError::MissingRate)
            }
        })
        .build()
        .unwrap();
    ok.store(false, Ordering::SeqCst);
    let calls = Arc::new(AtomicUsize::new(0));
    let service = keyed_echo(per_host, &calls);
    let error = service.oneshot(("new", 1)).await.unwrap_err();
    assert_eq!(
        error.downcast_ref::<TryAcquireError>(),
        Some(&TryAcquireError::Closed)
    );
    assert_eq!(calls.load(Ordering::SeqCst), 0);
}

#[tokio::test(start_paused = true)]
async fn keyed_outside_a_global_limit_refuses_without_spending_it() {
    // Per client 1/s; globally a burst of 2, then 10/s.
    let global = bucket(2, ms(100));
    let calls = Arc::new(AtomicUsize::new(0));
    let inner = RateLimitLayer::new(global.clone()).layer(echo(&calls));
    let service = KeyedRateLimitLayer::new(per_client(Rate::per_second(1), 1), |req: &Req| {
        req.0.to_owned()
    })
    .layer(service_fn(move |req: Req| inner.clone().oneshot(req.1)));
    let start = Instant::now();
    assert!(service.clone().oneshot(("ann", 1)).await.is_ok());
    assert!(service.clone().oneshot(("ann", 2)).await.is_err());
    assert!(service.clone().oneshot(("bob", 3)).await.is_ok());
    // The refused request spent nothing: bob had the second token.
    assert_eq!(start.elapsed(), Duration::ZERO);
    assert!(service.clone().oneshot(("cat", 4)).await.is_ok());
    assert_eq!(start.elapsed(), ms(100));
    assert_eq!(global.stats().granted, 3);
}

#[tokio::test(start_paused = true)]
async fn keyed_over_a_global_limit_gives_an_unused_permit_back() {
    // The key is checked in `call`, after the inner RateLimit's readiness:
    // a refused request held a global permit, and gives it back.
    let global = bucket(2, ms(100));
    let calls = Arc::new(AtomicUsize::new(0));
    let service = KeyedRateLimitLayer::new(per_client(Rate::per_second(1), 1), |req: &Req| {
        req.0.to_owned()
    })
    .layer(RateLimitLayer::new(global.clone()).layer(service_fn({
        let calls = Arc::clone(&calls);
        move |req: Req| {
            calls.fetch_add(1, Ordering::SeqCst);
            async move { Ok::<_, Infallible>(req.1) }
        }
    })));
    let start = Instant::now();
    assert!(service.clone().oneshot(("ann", 1)).await.is_ok());
    assert!(service.clone().oneshot(("ann", 2)).await.is_err());
    assert!(service.clone().oneshot(("bob", 3)).await.is_ok());
    assert_eq!(start.elapsed(), Duration::ZERO);
    assert_eq!(global.stats().granted, 2);
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}
