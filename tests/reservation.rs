//! Reservations (permits held until committed, given back when dropped) and
//! `stats()`, in paused time, for every limiter.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tokio::time::{self, Instant};
use tokio_ratelimit::{
    AcquireError, Funnel, LeakyBucket, Limiter, Rate, SmoothBursty, Stats, TokenBucket,
    TryAcquireError,
};
use tokio_test::{assert_pending, assert_ready_ok, task};

mod support;
use support::{limited, ms};

fn bucket(capacity: u32) -> TokenBucket {
    TokenBucket::builder()
        .rate(Rate::every(ms(100)))
        .capacity(capacity)
        .build()
        .unwrap()
}

#[tokio::test(start_paused = true)]
async fn a_dropped_reservation_gives_its_permits_back() {
    let b = bucket(3);

    let r = b.reserve(2).await.unwrap();
    assert!(r.is_returnable());
    assert_eq!(b.available(), 1);
    assert_eq!(b.try_acquire_many(2), limited(ms(100)));
    drop(r);
    assert_eq!(b.available(), 3);
    assert_eq!(b.stats().granted, 0, "nothing was spent");
    // Committed permits stay spent.
    b.reserve(2).await.unwrap().commit();
    assert_eq!(b.available(), 1);
    assert_eq!(b.stats().granted, 2);
}

#[tokio::test(start_paused = true)]
async fn returning_a_reservation_moves_later_waiters_forward() {
    let b = bucket(1);
    let start = Instant::now();
    let held = b.reserve(1).await.unwrap();
    // A waiter behind the held permit: due at 100 ms.
    let mut waiter = task::spawn(b.acquire());
    assert_pending!(waiter.poll());
    time::sleep(ms(10)).await;
    drop(held); // the permit comes back: the waiter's turn is now
    assert_ready_ok!(waiter.poll());
    assert_eq!(start.elapsed(), ms(10));
    assert_eq!(b.try_acquire(), limited(ms(100)));
}

#[tokio::test(start_paused = true)]
async fn a_reservation_that_waited_is_held_until_committed() {
    let b = bucket(1);
    b.acquire().await.unwrap();
    let start = Instant::now();
    let r = b.reserve(1).await.unwrap(); // waits for the refill
    assert_eq!(start.elapsed(), ms(100));
    assert_eq!(b.stats().waiting, 0);
    assert!(!b.is_fresh(), "a held reservation keeps the bucket busy");
    time::sleep(ms(50)).await;
    // Given back at 150 ms: the bucket is as if the request had never come
    // (full since 100 ms). Half of the reservation had drained already, so
    // only that half is returned — exactly what restores that state.
    drop(r);
    assert_eq!(b.try_acquire(), Ok(()));
    assert_eq!(b.try_acquire(), limited(ms(100)));
}

#[tokio::test(start_paused = true)]
async fn a_reservation_dropped_while_waiting_is_a_cancellation() {
    let b = bucket(2);
    b.try_acquire_many(2).unwrap();
    let mut pending = task::spawn(b.reserve(2));
    assert_pending!(pending.poll());
    assert_eq!(b.stats().waiting, 1);
    drop(pending);
    assert_eq!(b.stats().waiting, 0);
    assert_eq!(b.try_acquire(), limited(ms(100)));
}

#[tokio::test(start_paused = true)]
async fn shaper_and_funnel_reservations() {
    let shaper = LeakyBucket::builder()
        .rate(Rate::every(ms(100)))
        .capacity(2)
        .build()
        .unwrap();
    let r = shaper.reserve(2).await.unwrap();
    assert_eq!(shaper.level(), 2);
    assert_eq!(shaper.acquire().await, Err(AcquireError::Overflow));
    drop(r);
    assert_eq!(shaper.level(), 0);
    shaper.acquire().await.unwrap();

    let funnel = Funnel::builder()
        .rate(Rate::every(ms(100)))
        .capacity(1)
        .build()
        .unwrap();
    let r = funnel.reserve(1).await.unwrap();
    assert_eq!(funnel.free(), 0);
    drop(r);
    assert_eq!(funnel.free(), 1);
}

#[tokio::test(start_paused = true)]
async fn smooth_reservations_are_withdrawn_only_while_latest() {
    let limiter = SmoothBursty::builder()
        .permits_per_second(10.0)
        .build()
        .unwrap();
    limiter.acquire().await.unwrap(); // the first is free; the next pays 100 ms
    let start = Instant::now();
    let r = limiter.reserve(1).await.unwrap();
    assert_eq!(start.elapsed(), ms(100));
    drop(r); // nothing came after it: withdrawn
    assert_eq!(
        limiter.try_acquire(),
        Ok(()),
        "the withdrawn reservation's debt is gone"
    );
    let r = limiter.reserve(1).await.unwrap();
    limiter.try_acquire().unwrap_err();
    let _later = limiter.reserve(1).await.unwrap();
    drop(r); // a later request was priced on top of it: it stands
    assert!(limiter.try_acquire().is_err());
}

#[tokio::test(start_paused = true)]
async fn stats_count_grants_and_refusals() {
    let b = bucket(2);
    let fresh = b.stats();
    assert_eq!(
        (fresh.granted, fresh.refused, fresh.waiting, fresh.available),
        (0, 0, 0, Some(2))
    );
    b.try_acquire().unwrap();
    b.acquire().await.unwrap();
    assert_eq!(b.try_acquire(), limited(ms(100)));
    assert_eq!(
        b.try_acquire_many(3),
        Err(TryAcquireError::InsufficientCapacity)
    );
    assert_eq!(
        b.acquire_timeout(1, ms(50)).await,
        Err(AcquireError::Timeout)
    );
    let mut waiter = task::spawn(b.acquire_many(2));
    assert_pending!(waiter.poll());
    let stats = b.stats();
    assert_eq!(
        (stats.granted, stats.refused, stats.waiting, stats.available),
        (2, 3, 1, Some(0))
    );
    time::sleep(ms(201)).await;
    assert_ready_ok!(waiter.poll());
    assert_eq!(b.stats().granted, 4);
    // A closed limiter's refusals are not counted.
    b.close();
    assert_eq!(b.try_acquire(), Err(TryAcquireError::Closed));
    assert_eq!(b.stats().refused, 3);

    let shaper = LeakyBucket::builder()
        .rate(Rate::every(ms(100)))
        .capacity(1)
        .build()
        .unwrap();
    shaper.acquire().await.unwrap();
    assert_eq!(shaper.acquire().await, Err(AcquireError::Overflow));
    let s = shaper.stats();
    assert_eq!((s.granted, s.refused, s.available), (1, 1, Some(0)));

    let smooth = SmoothBursty::builder()
        .permits_per_second(10.0)
        .build()
        .unwrap();
    smooth.acquire_many(5).await.unwrap();
    assert!(smooth.try_acquire().is_err());
    let s = smooth.stats();
    assert_eq!((s.granted, s.refused, s.available), (5, 1, None));
}

/// A user's limiter that only implements the required methods.
#[derive(Debug)]
struct Always;

#[async_trait]
impl Limiter for Always {
    async fn acquire_many(&self, _: u32) -> Result<(), AcquireError> {
        Ok(())
    }
    fn try_acquire_many(&self, _: u32) -> Result<(), TryAcquireError> {
        Ok(())
    }
    async fn acquire_timeout(&self, _: u32, _: Duration) -> Result<(), AcquireError> {
        Ok(())
    }
}

#[tokio::test(start_paused = true)]
async fn the_trait_defaults_and_dyn_forwarding() {
    let custom: Arc<dyn Limiter> = Arc::new(Always);
    let r = custom.reserve(3).await.unwrap();
    assert!(!r.is_returnable(), "the default cannot give permits back");
    assert_eq!(custom.stats(), Stats::default());

    let b = bucket(1);
    let shared: Arc<dyn Limiter> = Arc::new(b.clone());
    let r = shared.reserve(1).await.unwrap();
    assert!(r.is_returnable());
    assert_eq!(b.available(), 0);
    drop(r);
    assert_eq!(shared.stats().available, Some(1));
}
