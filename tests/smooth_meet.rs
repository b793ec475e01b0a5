//! Where the smooth limiters' features meet: a reservation given back
//! after a rate change with a waiter behind it, `close` with waiters and
//! reservations, and requests larger than the stored permits. Expected
//! values from Guava's rules, worked by hand in each test's comments.

use std::task::Poll;
use std::time::Duration;

use tokio::time::Instant;
use tokio_ratelimit::{AcquireError, SmoothBursty, TryAcquireError};
use tokio_test::task;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn limited(retry_after: Duration) -> Result<(), TryAcquireError> {
    Err(TryAcquireError::Limited { retry_after })
}

/// A held reservation given back after a rate change, with a waiter behind
/// it: the waiter moves up by the part of the reservation's (old-rate) cost
/// not yet elapsed; its own debt stays at the old rate (Guava's `setRate`
/// leaves the debt alone); the next request is priced at the new rate.
#[tokio::test(start_paused = true)]
async fn reservation_given_back_after_set_rate_moves_the_waiter_up() {
    let limiter = SmoothBursty::builder()
        .permits_per_second(10.0)
        .build()
        .unwrap();
    tokio::time::sleep(ms(300)).await; // 3 stored
    // 5 permits: 3 stored (free), 2 fresh (200 ms): the ticket is at 500 ms.
    let held = limiter.reserve(5).await.unwrap();
    let mut w = task::spawn(limiter.acquire()); // due at 500 ms, ticket 600 ms
    assert!(w.poll().is_pending());
    limiter.set_rate(1.0).unwrap();
    assert_eq!(limiter.try_acquire(), limited(ms(300)));
    tokio::time::advance(ms(50)).await; // 350 ms
    drop(held); // 150 ms of its cost unelapsed: w at 350 ms, ticket at 450 ms
    assert!(w.is_woken());
    assert!(w.poll().is_ready());
    assert_eq!(limiter.try_acquire(), limited(ms(100)));
    tokio::time::advance(ms(100)).await; // 450 ms
    assert_eq!(limiter.try_acquire(), Ok(())); // costs 1 s at the new rate
    assert_eq!(limiter.try_acquire(), limited(ms(1000)));
    let stats = limiter.stats();
    assert_eq!((stats.granted, stats.refused, stats.waiting), (2, 3, 0));
}

/// `close` with a plain waiter, a pending `reserve` and a held reservation:
/// the pending ones fail with `Closed`, the held one can still be committed
/// (and counts then) or dropped (giving nothing back).
#[tokio::test(start_paused = true)]
async fn close_with_waiters_and_reservations() {
    let limiter = SmoothBursty::builder()
        .permits_per_second(10.0)
        .build()
        .unwrap();
    limiter.acquire().await.unwrap(); // ticket at 100 ms
    let mut r1 = task::spawn(limiter.reserve(1)); // due at 100 ms
    let mut r2 = task::spawn(limiter.reserve(1)); // due at 200 ms
    let mut w = task::spawn(limiter.acquire_many(2)); // due at 300 ms
    assert!(r1.poll().is_pending() && r2.poll().is_pending() && w.poll().is_pending());
    assert_eq!(limiter.stats().waiting, 3);
    tokio::time::advance(ms(100)).await;
    let Poll::Ready(Ok(held)) = r1.poll() else {
        panic!("r1 not granted at 100 ms")
    };
    limiter.close();
    assert!(matches!(r2.poll(), Poll::Ready(Err(AcquireError::Closed))));
    assert_eq!(w.poll(), Poll::Ready(Err(AcquireError::Closed)));
    held.commit();
    let stats = limiter.stats();
    assert_eq!((stats.granted, stats.refused, stats.waiting), (2, 0, 0));
    assert_eq!(limiter.try_acquire(), Err(TryAcquireError::Closed));
}

/// `try_acquire_many` and `acquire_timeout` for more permits than are
/// stored: only the earlier debt counts (Guava's `tryAcquire`); the fresh
/// part is paid by the next caller.
#[tokio::test(start_paused = true)]
async fn more_than_stored_is_granted_and_paid_later() {
    let limiter = SmoothBursty::builder()
        .permits_per_second(10.0)
        .build()
        .unwrap();
    tokio::time::sleep(ms(250)).await; // 2.5 stored
    assert_eq!(limiter.try_acquire_many(4), Ok(())); // 1.5 fresh: 150 ms
    assert_eq!(
        limiter.acquire_timeout(7, ms(149)).await,
        Err(AcquireError::Timeout)
    );
    let start = Instant::now();
    assert_eq!(limiter.acquire_timeout(7, ms(150)).await, Ok(()));
    assert_eq!(start.elapsed(), ms(150));
    assert_eq!(limiter.try_acquire(), limited(ms(700)));
    let stats = limiter.stats();
    assert_eq!((stats.granted, stats.refused, stats.waiting), (11, 2, 0));
}
