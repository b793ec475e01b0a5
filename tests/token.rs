//! `TokenBucket` behaviour in paused time, asserting exact virtual instants:
//! the initial burst, refill, exact boundaries and `retry_after`, weighted
//! and oversized requests, FIFO, timeouts, run-time rate changes, `close`,
//! the actor's lifetime, idle cost and the long-run rate at high rates.

use std::time::Duration;

use tokio::task::JoinHandle;
use tokio::time::{self, Instant};
use tokio_ratelimit::test_util::GrantLog;
use tokio_ratelimit::{AcquireError, ConfigError, Rate, TokenBucket, TryAcquireError};
use tokio_test::{assert_pending, assert_ready_err, assert_ready_ok, task};

mod support;
use support::{join_all, limited, ms, settle};

fn ns(n: u64) -> Duration {
    Duration::from_nanos(n)
}

fn bucket(rate: Rate, capacity: u32) -> TokenBucket {
    TokenBucket::builder()
        .rate(rate)
        .capacity(capacity)
        .build()
        .unwrap()
}

fn empty_bucket(rate: Rate, capacity: u32) -> TokenBucket {
    TokenBucket::builder()
        .rate(rate)
        .capacity(capacity)
        .initial(0)
        .build()
        .unwrap()
}

/// Spawns a task that waits for `n` tokens and returns when it got them
/// (since `start`), and lets it arrive (reserve its turn) before returning,
/// so that arrival order is spawn order.
async fn spawn_acquire(b: &TokenBucket, n: u32, start: Instant) -> JoinHandle<Duration> {
    let b2 = b.clone();

    let handle = tokio::spawn(async move {
        b2.acquire_many(n).await.unwrap();
        start.elapsed()
    });
    settle().await;
    handle
}

// ---------------------------------------------------------------------------
// Starting state and refill
// ---------------------------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn starts_full_then_one_per_interval() {
    let b = bucket(Rate::per_second(10), 3);
    assert_eq!(b.available(), 3);
    let start = Instant::now();
    let mut at = vec![];
    for _ in 0..5 {
        b.acquire().await.unwrap();
        at.push(start.elapsed());
    }
    assert_eq!(at, [ms(0), ms(0), ms(0), ms(100), ms(200)]);
}

#[tokio::test(start_paused = true)]
async fn initial_zero_starts_empty() {
    let b = empty_bucket(Rate::per_second(10), 3);
    assert_eq!(b.available(), 0);
    assert_eq!(b.try_acquire(), limited(ms(100)));
    let start = Instant::now();
    let mut at = vec![];
    for _ in 0..3 {
        b.acquire().await.unwrap();
        at.push(start.elapsed());
    }
    assert_eq!(at, [ms(100), ms(200), ms(300)]);
}

#[tokio::test(start_paused = true)]
async fn initial_k_starts_with_k_tokens() {
    let b = TokenBucket::builder()
        .rate(Rate::per_second(10))
        .capacity(5)
        .initial(2)
        .build()
        .unwrap();
    assert_eq!(b.available(), 2);
    let start = Instant::now();
    let mut at = vec![];
    for _ in 0..4 {
        b.acquire().await.unwrap();
        at.push(start.elapsed());
    }
    assert_eq!(at, [ms(0), ms(0), ms(100), ms(200)]);
    // Idle refill counts from the elapsed time: 500 ms later, full again.
    time::sleep(ms(500)).await;
    assert_eq!(b.available(), 5);
    assert_eq!(b.try_acquire_many(5), Ok(()));
}

#[tokio::test(start_paused = true)]
async fn waiter_woken_by_refill() {
    let b = bucket(Rate::every(ms(100)), 1);
    b.acquire().await.unwrap();
    let start = Instant::now();
    let mut waiter = task::spawn(b.acquire());
    assert_pending!(waiter.poll());
    assert_eq!(b.waiting(), 1);
    time::sleep(ms(99)).await;
    assert!(!waiter.is_woken(), "woken before the token is due");
    assert_pending!(waiter.poll());
    // One tick past the refill: the actor's timer (due at 100 ms) has fired.
    time::sleep(ms(2)).await;
    assert!(waiter.is_woken());
    assert_ready_ok!(waiter.poll());
    assert_eq!(start.elapsed(), ms(101));
    assert_eq!(b.waiting(), 0);
    // The token that came at 100 ms went to the waiter: the next is due at 200 ms.
    assert_eq!(b.try_acquire(), limited(ms(99)));
}

#[tokio::test(start_paused = true)]
async fn waiter_granted_at_the_exact_instant() {
    let b = bucket(Rate::every(ms(100)), 1);
    let start = Instant::now();
    b.acquire().await.unwrap();
    let first = spawn_acquire(&b, 1, start).await;
    let second = spawn_acquire(&b, 1, start).await;
    assert_eq!(first.await.unwrap(), ms(100));
    assert_eq!(second.await.unwrap(), ms(200));
}

// ---------------------------------------------------------------------------
// Exact at the boundary, exact retry_after
// ---------------------------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn try_acquire_exact_at_the_boundary() {
    // 3/s, capacity 2, emptied at t = 0: the next token is due at
    // 333 333 333⅓ ns, so it is available at 333 333 334 ns and not one
    // nanosecond before.
    let b = bucket(Rate::per_second(3), 2);
    assert_eq!(b.try_acquire_many(2), Ok(()));
    time::advance(ns(333_333_333)).await;
    assert_eq!(b.try_acquire(), limited(ns(1)));
    time::advance(ns(1)).await;
    assert_eq!(b.try_acquire(), Ok(()));
    // The bucket never filled up, so the schedule is not reset: the next
    // token is due at ⅔ s → 666 666 667 ns (the fraction is carried).
    assert_eq!(b.try_acquire(), limited(ns(666_666_667 - 333_333_334)));
    time::advance(ns(666_666_666 - 333_333_334)).await;
    assert_eq!(b.try_acquire(), limited(ns(1)));
    time::advance(ns(1)).await;
    assert_eq!(b.try_acquire(), Ok(()));
}

#[tokio::test(start_paused = true)]
async fn pending_waiter_ready_at_its_instant_before_the_actor_runs() {
    // Due at 100.5 ms: the actor's timer fires on the 100 ms tick (a tick
    // early, see the next test), finds the turn not come and is re-armed;
    // it can only fire again on the 101 ms tick, so at 100.5 ms only the
    // waiter's own poll can see that its turn came.
    let b = bucket(Rate::every(Duration::from_micros(100_500)), 1);
    b.acquire().await.unwrap();
    let start = Instant::now();
    let mut waiter = task::spawn(b.acquire());
    assert_pending!(waiter.poll());
    time::advance(ms(100)).await;
    settle().await; // the actor's early round
    assert!(!waiter.is_woken(), "not due on the 100 ms tick");
    time::advance(ns(499_999)).await;
    assert_pending!(waiter.poll());
    time::advance(ns(1)).await;
    assert!(!waiter.is_woken(), "the actor cannot have run yet");
    assert_ready_ok!(waiter.poll());
    assert_eq!(start.elapsed(), ns(100_500_000));
    assert_eq!(b.waiting(), 0);
}

#[tokio::test(start_paused = true)]
async fn the_actor_looks_a_tick_early_and_releases_a_late_turn_at_once() {
    // Due at 100.5 ms. The actor's timer is armed a tick early: it fires on
    // the 100 ms tick, but the actor (kept from running here) only gets to
    // look at 100.5 ms, when the turn has come: it releases the waiter then,
    // without waiting for the 101 ms tick.
    let b = bucket(Rate::every(Duration::from_micros(100_500)), 1);
    b.acquire().await.unwrap();
    let start = Instant::now();
    let mut waiter = task::spawn(b.acquire());
    assert_pending!(waiter.poll());
    time::advance(ns(100_499_999)).await;
    assert_pending!(waiter.poll());
    time::advance(ns(1)).await;
    settle().await;
    assert!(waiter.is_woken(), "released by the actor's early round");
    assert_ready_ok!(waiter.poll());
    assert_eq!(start.elapsed(), ns(100_500_000));
}

#[tokio::test(start_paused = true)]
async fn pending_waiter_ready_at_a_whole_tick_via_advance() {
    let b = bucket(Rate::every(ms(100)), 1);
    b.acquire().await.unwrap();
    let mut waiter = task::spawn(b.acquire());
    assert_pending!(waiter.poll());
    time::advance(ns(99_999_999)).await;
    assert_pending!(waiter.poll());
    time::advance(ns(1)).await;
    assert_ready_ok!(waiter.poll());
}

#[tokio::test(start_paused = true)]
async fn retry_after_is_exact_for_an_empty_bucket_at_three_per_second() {
    let b = empty_bucket(Rate::per_second(3), 1);
    assert_eq!(b.try_acquire(), limited(ns(333_333_334)));
    // Polling more often changes nothing: the answer is a deadline.
    time::advance(ns(333_333_000)).await;
    assert_eq!(b.try_acquire(), limited(ns(334)));
    time::advance(ns(334)).await;
    assert_eq!(b.try_acquire(), Ok(()));
}

#[tokio::test(start_paused = true)]
async fn retry_after_is_exact_at_seven_million_per_second() {
    // One token per 1000/7 ns = 142.857… ns. The k-th token of an empty
    // bucket is due at ceil(1000·k/7) ns.
    let due = |k: u64| (1000 * k).div_ceil(7);
    let b = empty_bucket(Rate::per_second(7_000_000), 5);
    assert_eq!(b.try_acquire(), limited(ns(due(1))));
    assert_eq!(b.try_acquire_many(5), limited(ns(due(5))));
    assert_eq!(due(5), 715);
    let start = Instant::now();
    let mut now = 0;
    for k in 1..=20u64 {
        time::advance(ns(due(k) - 1 - now)).await;
        assert_eq!(b.try_acquire(), limited(ns(1)), "token {k}");
        time::advance(ns(1)).await;
        now = due(k);
        assert_eq!(b.try_acquire(), Ok(()), "token {k}");
    }
    // 20 tokens taken, each the instant it was due: 2 857.14… ns.
    assert_eq!(now, 2858);
    assert_eq!(start.elapsed(), ns(now));
    assert_eq!(b.try_acquire(), limited(ns(due(21) - now)));
}

#[tokio::test(start_paused = true)]
async fn retry_after_counts_the_whole_request() {
    let b = bucket(Rate::per_second(10), 3);
    assert_eq!(b.try_acquire_many(3), Ok(()));
    assert_eq!(b.try_acquire_many(2), limited(ms(200)));
    assert_eq!(b.try_acquire_many(3), limited(ms(300)));
    time::advance(ms(50)).await;
    assert_eq!(b.try_acquire_many(3), limited(ms(250)));
    assert_eq!(b.available(), 0);
    time::advance(ms(250)).await;
    assert_eq!(b.available(), 3);
}

// ---------------------------------------------------------------------------
// Weighted, zero and oversized requests
// ---------------------------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn acquire_many_capacity_from_empty_waits_capacity_intervals() {
    let b = empty_bucket(Rate::per_second(100), 50);
    let start = Instant::now();
    b.acquire_many(50).await.unwrap();
    assert_eq!(start.elapsed(), ms(500));
    assert_eq!(b.available(), 0);
}

#[tokio::test(start_paused = true)]
async fn acquire_many_zero_succeeds_at_once() {
    let b = empty_bucket(Rate::per_second(1), 2);
    let mut queued = task::spawn(b.acquire());
    assert_pending!(queued.poll());
    // n = 0 needs nothing, so it does not wait behind anyone.
    assert_ready_ok!(task::spawn(b.acquire_many(0)).poll());
    assert_ready_ok!(task::spawn(b.acquire_timeout(0, Duration::ZERO)).poll());
    assert_eq!(b.try_acquire_many(0), Ok(()));
    assert_eq!(b.waiting(), 1);
    // And it took nothing: the queued waiter still gets the first token.
    assert_eq!(b.try_acquire(), limited(Duration::from_secs(2)));
}

#[tokio::test(start_paused = true)]
async fn more_than_capacity_fails_at_once() {
    let b = bucket(Rate::per_second(10), 3);
    let start = Instant::now();
    assert_eq!(
        b.try_acquire_many(4),
        Err(TryAcquireError::InsufficientCapacity)
    );
    assert_eq!(
        b.try_acquire_many(u32::MAX),
        Err(TryAcquireError::InsufficientCapacity)
    );
    let mut f = task::spawn(b.acquire_many(4));
    assert_eq!(
        assert_ready_err!(f.poll()),
        AcquireError::InsufficientCapacity
    );
    let mut f = task::spawn(b.acquire_timeout(4, Duration::MAX));
    assert_eq!(
        assert_ready_err!(f.poll()),
        AcquireError::InsufficientCapacity
    );
    // Awaiting it does not hang either.
    assert_eq!(
        b.acquire_many(u32::MAX).await,
        Err(AcquireError::InsufficientCapacity)
    );
    assert_eq!(start.elapsed(), Duration::ZERO);
    // Nothing was taken.
    assert_eq!(b.available(), 3);
}

#[tokio::test(start_paused = true)]
async fn capacity_u32_max_with_n_u32_max() {
    // One token per nanosecond, so u32::MAX of them take 4.29 s to refill.
    let b = bucket(Rate::per_second(1_000_000_000), u32::MAX);
    assert_eq!(b.capacity(), u32::MAX);
    assert_eq!(b.available(), u32::MAX);
    assert_eq!(b.try_acquire_many(u32::MAX), Ok(()));
    assert_eq!(b.available(), 0);
    assert_eq!(
        b.try_acquire_many(u32::MAX),
        limited(ns(u64::from(u32::MAX)))
    );
    let mut big = task::spawn(b.acquire_many(u32::MAX));
    assert_pending!(big.poll());
    time::advance(ns(u64::from(u32::MAX) - 1)).await;
    assert_pending!(big.poll());
    time::advance(ns(1)).await;
    assert_ready_ok!(big.poll());

    // At one per second, u32::MAX tokens are 136 years away, exactly.
    let slow = bucket(Rate::per_second(1), u32::MAX);
    assert_eq!(slow.try_acquire_many(u32::MAX), Ok(()));
    assert_eq!(
        slow.try_acquire_many(u32::MAX),
        limited(Duration::from_secs(u64::from(u32::MAX)))
    );
    assert_eq!(slow.try_acquire(), limited(Duration::from_secs(1)));
}

// ---------------------------------------------------------------------------
// FIFO
// ---------------------------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn large_request_at_the_head_is_served_before_later_small_ones() {
    let b = empty_bucket(Rate::every(ms(10)), 10);
    let start = Instant::now();
    let big = spawn_acquire(&b, 10, start).await;
    let mut small = vec![];
    for _ in 0..5 {
        small.push(spawn_acquire(&b, 1, start).await);
    }
    assert_eq!(b.waiting(), 6);
    // The big one needs a full bucket: 100 ms. The small ones would each
    // have been served every 10 ms from 10 ms on, but they queue behind it.
    assert_eq!(big.await.unwrap(), ms(100));
    for (i, s) in (1u64..).zip(small) {
        assert_eq!(s.await.unwrap(), ms(100 + 10 * i));
    }
}

#[tokio::test(start_paused = true)]
async fn small_large_small_are_served_in_arrival_order() {
    let b = empty_bucket(Rate::every(ms(10)), 4);
    let start = Instant::now();
    let s1 = spawn_acquire(&b, 1, start).await;
    let big = spawn_acquire(&b, 4, start).await;
    let s2 = spawn_acquire(&b, 1, start).await;
    // s1: the first token, 10 ms. big: four more, and the bucket must hold
    // all four at once: 50 ms. s2: the next one after that, 60 ms (not
    // 20 ms, which it would get by jumping the big request).
    assert_eq!(s1.await.unwrap(), ms(10));
    assert_eq!(big.await.unwrap(), ms(50));
    assert_eq!(s2.await.unwrap(), ms(60));
}

#[tokio::test(start_paused = true)]
async fn try_acquire_does_not_jump_queued_waiters() {
    let b = bucket(Rate::every(ms(100)), 3);
    assert_eq!(b.try_acquire_many(3), Ok(()));
    let start = Instant::now();
    let waiter = spawn_acquire(&b, 2, start).await;
    assert_eq!(b.waiting(), 1);
    // Alone, one token would be 100 ms away; behind the waiter's two it is
    // 300 ms away.
    assert_eq!(b.try_acquire(), limited(ms(300)));
    time::advance(ms(150)).await;
    // One token has refilled, but it is the waiter's.
    assert_eq!(b.available(), 0);
    assert_eq!(b.try_acquire(), limited(ms(150)));
    assert_eq!(waiter.await.unwrap(), ms(200));
    assert_eq!(b.try_acquire(), limited(ms(100)));
    time::advance(ms(100)).await;
    assert_eq!(b.try_acquire(), Ok(()));
}

// ---------------------------------------------------------------------------
// acquire_timeout
// ---------------------------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn acquire_timeout_fails_at_once_when_too_far() {
    let b = empty_bucket(Rate::per_second(10), 1);
    let start = Instant::now();
    let mut f = task::spawn(b.acquire_timeout(1, ms(99)));
    assert_eq!(assert_ready_err!(f.poll()), AcquireError::Timeout);
    assert_eq!(
        b.acquire_timeout(1, ms(99)).await,
        Err(AcquireError::Timeout)
    );
    assert_eq!(start.elapsed(), Duration::ZERO);
    // Nothing was reserved.
    assert_eq!(b.waiting(), 0);
    assert_eq!(b.try_acquire(), limited(ms(100)));
}

#[tokio::test(start_paused = true)]
async fn acquire_timeout_waits_when_in_time() {
    let b = empty_bucket(Rate::per_second(10), 1);
    let start = Instant::now();
    assert_eq!(b.acquire_timeout(1, ms(150)).await, Ok(()));
    assert_eq!(start.elapsed(), ms(100));
    // The timeout exactly equal to the wait succeeds, at that instant.
    assert_eq!(b.acquire_timeout(1, ms(100)).await, Ok(()));
    assert_eq!(start.elapsed(), ms(200));
}

#[tokio::test(start_paused = true)]
async fn acquire_timeout_counts_the_queue_ahead() {
    let b = empty_bucket(Rate::per_second(10), 1);
    let start = Instant::now();
    let ahead = spawn_acquire(&b, 1, start).await;
    // Behind the waiter due at 100 ms, a token is 200 ms away.
    assert_eq!(
        b.acquire_timeout(1, ms(199)).await,
        Err(AcquireError::Timeout)
    );
    assert_eq!(start.elapsed(), Duration::ZERO);
    assert_eq!(b.acquire_timeout(1, ms(200)).await, Ok(()));
    assert_eq!(start.elapsed(), ms(200));
    assert_eq!(ahead.await.unwrap(), ms(100));
}

#[tokio::test(start_paused = true)]
async fn acquire_timeout_zero() {
    let b = bucket(Rate::per_second(10), 1);
    let start = Instant::now();
    // Full: no wait needed, so a zero timeout is enough.
    assert_eq!(b.acquire_timeout(1, Duration::ZERO).await, Ok(()));
    // Empty: any wait is too long.
    let mut f = task::spawn(b.acquire_timeout(1, Duration::ZERO));
    assert_eq!(assert_ready_err!(f.poll()), AcquireError::Timeout);
    assert_eq!(start.elapsed(), Duration::ZERO);
    assert_eq!(b.try_acquire(), limited(ms(100)));
}

#[tokio::test(start_paused = true)]
async fn acquire_timeout_max_is_valid_and_waits() {
    let b = empty_bucket(Rate::per_second(10), 2);
    let start = Instant::now();
    let mut f = task::spawn(b.acquire_timeout(2, Duration::MAX));
    assert_pending!(f.poll());
    drop(f);
    assert_eq!(b.acquire_timeout(2, Duration::MAX).await, Ok(()));
    assert_eq!(start.elapsed(), ms(200));
    assert_eq!(b.acquire_timeout(1, Duration::MAX).await, Ok(()));
    assert_eq!(start.elapsed(), ms(300));
}

// ---------------------------------------------------------------------------
// set_rate
// ---------------------------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn set_rate_faster_moves_queued_turns_earlier() {
    let b = empty_bucket(Rate::every(ms(100)), 1);
    let start = Instant::now();
    let mut w = vec![];
    for _ in 0..3 {
        w.push(spawn_acquire(&b, 1, start).await);
    }
    // Due at 100, 200, 300 ms. At 50 ms the bucket is 3.5 tokens short
    // (half a token of the first, then three more); from now on they
    // refill every 10 ms: 55, 65, 75 ms.
    time::sleep(ms(50)).await;
    b.set_rate(Rate::every(ms(10))).unwrap();
    assert_eq!(b.rate(), Rate::every(ms(10)));
    let at = join_all(w).await;
    assert_eq!(at, [ms(55), ms(65), ms(75)]);
}

#[tokio::test(start_paused = true)]
async fn set_rate_slower_moves_queued_turns_later() {
    let b = empty_bucket(Rate::every(ms(10)), 1);
    let start = Instant::now();
    let mut w = vec![];
    for _ in 0..3 {
        w.push(spawn_acquire(&b, 1, start).await);
    }
    // Due at 10, 20, 30 ms. At 5 ms: 3.5 tokens short, now one per 100 ms
    // from 5 ms: 55, 155, 255 ms.
    time::sleep(ms(5)).await;
    b.set_rate(Rate::every(ms(100))).unwrap();
    let at = join_all(w).await;
    assert_eq!(at, [ms(55), ms(155), ms(255)]);
    assert_eq!(b.try_acquire(), limited(ms(100)));
}

#[tokio::test(start_paused = true)]
async fn set_rate_invalid_is_an_error_and_changes_nothing() {
    let b = empty_bucket(Rate::every(ms(100)), 2);
    let start = Instant::now();
    let w = spawn_acquire(&b, 1, start).await;
    assert_eq!(b.try_acquire(), limited(ms(200)));
    for bad in [
        Rate::per_second(0),
        Rate::per(1, Duration::ZERO),
        Rate::per_second_f64(f64::NAN),
        Rate::per(1, Duration::MAX),
    ] {
        assert!(
            matches!(b.set_rate(bad), Err(ConfigError::InvalidRate { .. })),
            "{bad:?}"
        );
    }
    assert_eq!(b.rate(), Rate::every(ms(100)));
    assert_eq!(b.try_acquire(), limited(ms(200)));
    assert_eq!(w.await.unwrap(), ms(100));
}

// ---------------------------------------------------------------------------
// close and the actor's lifetime
// ---------------------------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn close_fails_waiters_and_later_calls() {
    let b = bucket(Rate::every(ms(100)), 1);
    b.acquire().await.unwrap();
    let mut w1 = task::spawn(b.acquire());
    let mut w2 = task::spawn(b.acquire_many(1));
    assert_pending!(w1.poll());
    assert_pending!(w2.poll());
    assert!(!b.is_closed());
    let clone = b.clone();
    b.close();
    assert!(b.is_closed());
    assert!(clone.is_closed());
    assert!(w1.is_woken());
    assert!(w2.is_woken());
    assert_eq!(assert_ready_err!(w1.poll()), AcquireError::Closed);
    assert_eq!(assert_ready_err!(w2.poll()), AcquireError::Closed);
    assert_eq!(b.waiting(), 0);
    assert_eq!(b.acquire().await, Err(AcquireError::Closed));
    assert_eq!(b.acquire_many(1).await, Err(AcquireError::Closed));
    assert_eq!(
        b.acquire_timeout(1, Duration::MAX).await,
        Err(AcquireError::Closed)
    );
    assert_eq!(b.try_acquire(), Err(TryAcquireError::Closed));
    assert_eq!(b.try_acquire_many(1), Err(TryAcquireError::Closed));
    // Even once the bucket would be full again.
    time::sleep(Duration::from_secs(1)).await;
    assert_eq!(clone.try_acquire(), Err(TryAcquireError::Closed));
    assert_eq!(clone.acquire().await, Err(AcquireError::Closed));
    // Closing twice is harmless.
    clone.close();
    assert!(b.is_closed());
}

#[tokio::test(start_paused = true)]
async fn close_keeps_a_grant_already_made() {
    let b = bucket(Rate::every(ms(100)), 1);
    b.acquire().await.unwrap();
    let mut granted = task::spawn(b.acquire());
    assert_pending!(granted.poll());
    time::sleep(ms(101)).await;
    assert!(granted.is_woken()); // the actor granted it at 100 ms
    let mut pending = task::spawn(b.acquire());
    assert_pending!(pending.poll());
    b.close();
    assert_ready_ok!(granted.poll());
    assert_eq!(assert_ready_err!(pending.poll()), AcquireError::Closed);
}

fn alive() -> usize {
    tokio::runtime::Handle::current()
        .metrics()
        .num_alive_tasks()
}

/// An idle bucket holds no task: the actor is spawned by the first waiter
/// and ends once nobody waits — served, cancelled, or closed.
#[tokio::test(start_paused = true)]
async fn the_actor_runs_only_while_someone_waits() {
    let before = alive();
    let b = bucket(Rate::per_second(10), 1);
    settle().await;
    assert_eq!(alive(), before, "built: no task");
    b.try_acquire().unwrap();
    assert_eq!(alive(), before, "a meter call spawns nothing");
    // A waiter starts it; served, it ends.
    let mut w = task::spawn(b.acquire());
    assert_pending!(w.poll());
    assert_eq!(alive(), before + 1);
    time::advance(ms(100)).await;
    settle().await;
    assert!(w.is_woken());
    assert_ready_ok!(w.poll());
    drop(w);
    assert_eq!(alive(), before, "served: the actor ended");
    // Again: a new waiter starts a new one; cancelled, it ends.
    let mut w = task::spawn(b.acquire());
    assert_pending!(w.poll());
    let mut second = task::spawn(b.acquire());
    assert_pending!(second.poll());
    settle().await;
    assert_eq!(alive(), before + 1, "one actor for the whole queue");
    drop(w);
    drop(second);
    settle().await;
    assert_eq!(alive(), before, "cancelled: the actor ended");
    assert_eq!(
        b.try_acquire(),
        Err(TryAcquireError::Limited {
            retry_after: ms(100)
        }),
        "the cancelled waiters gave back their tokens"
    );
    // A waiter in line while the handle is dropped keeps its actor.
    let clone = b.clone();
    let mut w = task::spawn(clone.acquire());
    assert_pending!(w.poll());
    drop(b);
    time::advance(ms(100)).await;
    settle().await;
    assert_ready_ok!(w.poll());
    drop(w);
    settle().await;
    assert_eq!(alive(), before);
    // Closed with nobody waiting: nothing to end, nothing spawned.
    clone.close();
    settle().await;
    assert_eq!(alive(), before);
}

#[tokio::test(start_paused = true)]
async fn actor_exits_after_close() {
    let before = alive();
    let b = bucket(Rate::per_second(1), 1);
    b.try_acquire().unwrap();
    let mut w = task::spawn(b.acquire());
    assert_pending!(w.poll());
    settle().await;
    assert_eq!(alive(), before + 1);
    b.close();
    settle().await;
    assert_eq!(alive(), before, "the handle is alive but closed");
    assert_eq!(assert_ready_err!(w.poll()), AcquireError::Closed);
}

// ---------------------------------------------------------------------------
// Idle cost
// ---------------------------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn ten_thousand_idle_buckets_cost_nothing_for_an_hour() {
    let buckets: Vec<TokenBucket> = (0..10_000)
        .map(|_| {
            let b = bucket(Rate::per_second(10), 5);
            b.try_acquire_many(3).unwrap();
            b
        })
        .collect();
    settle().await;
    assert!(buckets.iter().all(|b| b.available() == 2));
    // A cost check, not a rate check: with a timer armed per bucket (or a
    // ticker), an hour of 1 ms ticks for 10 000 buckets would take minutes.
    let wall = std::time::Instant::now();
    time::sleep(Duration::from_secs(3600)).await;
    let spent = wall.elapsed();
    assert!(
        spent < Duration::from_millis(500),
        "idle hour took {spent:?}"
    );
    assert!(buckets.iter().all(|b| b.available() == 5));
}

// ---------------------------------------------------------------------------
// Never under-delivers
// ---------------------------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn acquire_loop_at_100k_per_second_with_capacity_10() {
    let b = bucket(Rate::per_second(100_000), 10);
    let start = Instant::now();
    let mut n = 0u64;
    while start.elapsed() < Duration::from_secs(1) {
        b.acquire().await.unwrap();
        n += 1;
    }
    // 10 at t = 0 (the burst). Then one token every 10 µs; the waiter for
    // each is released on the 1 ms tick after it is due, and the requests
    // right after it are credited with the time it overslept, so each tick
    // m = 1..999 grants the 100 tokens due in ((m-1) ms, m ms]: 99 900.
    // The loop then waits for the token due at 999.01 ms, released on the
    // 1000 ms tick, and stops: 10 + 99 900 + 1.
    assert_eq!(n, 99_911);
    assert_eq!(start.elapsed(), Duration::from_secs(1));
}

/// Runs `tasks` tasks looping `acquire()` on `b` for `secs` seconds of
/// virtual time and returns the log of their grants.
async fn saturate(b: &TokenBucket, tasks: usize, secs: u64) -> GrantLog {
    let log = GrantLog::new();
    let handles: Vec<_> = (0..tasks)
        .map(|who| {
            let b = b.clone();
            let log = log.clone();
            tokio::spawn(async move {
                while b.acquire().await.is_ok() {
                    log.record_for(who, 1);
                }
            })
        })
        .collect();
    // Sleep past the last tick so its grants are all in, then stop.
    time::sleep(Duration::from_secs(secs) + ms(5)).await;
    b.close();
    for h in handles {
        h.await.unwrap();
    }
    log
}

/// Checks the grants of a saturated bucket over `[0, secs]`.
fn check_saturated(log: &GrantLog, rate: u32, capacity: u32, secs: u64, expected: u64) {
    let horizon = Duration::from_secs(secs);
    let granted = u64::try_from(log.offsets().iter().filter(|&&at| at <= horizon).count()).unwrap();
    assert_eq!(granted, expected, "{rate}/s, capacity {capacity}");
    // Within 0.01 % of the configured rate (the burst aside).
    let ideal = u64::from(rate) * secs;
    let achieved = granted - u64::from(capacity);
    assert!(
        achieved.abs_diff(ideal) * 10_000 <= ideal,
        "{achieved} vs {ideal}"
    );
    // And never more than the bound allows, with one tick of slack.
    log.assert_rate(Rate::per_second(rate), capacity, ms(1));
}

// With 100 tasks each keeping one request outstanding, demand always
// exceeds the rate, so every token due by 2 s is granted by 2 s: the
// capacity at t = 0 plus rate × 2 s. At 1000/s every token is due on a
// whole millisecond and granted on that tick; at 100 000/s the 100 tokens
// due in ((m-1) ms, m ms] are all granted on tick m (the queue always holds
// the next 100 requests, a millisecond's worth), so nothing is late past
// the horizon.

#[tokio::test(start_paused = true)]
async fn hundred_tasks_1000_per_second_capacity_1() {
    let b = bucket(Rate::per_second(1000), 1);
    let log = saturate(&b, 100, 2).await;
    check_saturated(&log, 1000, 1, 2, 1 + 2000);
}

#[tokio::test(start_paused = true)]
async fn hundred_tasks_1000_per_second_capacity_100() {
    let b = bucket(Rate::per_second(1000), 100);
    let log = saturate(&b, 100, 2).await;
    check_saturated(&log, 1000, 100, 2, 100 + 2000);
}

#[tokio::test(start_paused = true)]
async fn hundred_tasks_100k_per_second_capacity_1() {
    let b = bucket(Rate::per_second(100_000), 1);
    let log = saturate(&b, 100, 2).await;
    check_saturated(&log, 100_000, 1, 2, 1 + 200_000);
}

#[tokio::test(start_paused = true)]
async fn hundred_tasks_100k_per_second_capacity_100() {
    let b = bucket(Rate::per_second(100_000), 100);
    let log = saturate(&b, 100, 2).await;
    check_saturated(&log, 100_000, 100, 2, 100 + 200_000);
}

#[tokio::test(start_paused = true)]
async fn try_acquire_polled_every_microsecond_at_7m_per_second() {
    let capacity = 10;
    let b = bucket(Rate::per_second(7_000_000), capacity);
    let start = Instant::now();
    let mut granted = 0u64;
    let mut refused = 0u64;
    loop {
        loop {
            match b.try_acquire() {
                Ok(()) => granted += 1,
                Err(TryAcquireError::Limited { retry_after }) => {
                    assert!(retry_after <= ns(143));
                    refused += 1;
                    break;
                }
                Err(e) => panic!("{e}"),
            }
        }
        if start.elapsed() >= ms(10) {
            break;
        }
        time::advance(Duration::from_micros(1)).await;
    }
    // The burst, then 7 per µs: 70 000 tokens due in (0, 10 ms], the last
    // exactly at 10 ms. Fractions of a token carry from one poll to the next.
    assert_eq!(granted, u64::from(capacity) + 70_000);
    assert_eq!(refused, 10_001);
    assert_eq!(start.elapsed(), ms(10));
}
