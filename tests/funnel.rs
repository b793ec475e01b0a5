//! `Funnel`, the task-less meter: usable with no runtime, leaks exactly
//! however often it is polled (no truncation of fractional leakage), waits
//! exactly the `retry_after` it reports, serves waiters FIFO, and gives the
//! same numbers as `algorithm::FunnelState`.

use std::future::Future;
use std::pin::pin;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use tokio::time::{self, Instant};
use tokio_ratelimit::algorithm::FunnelState;
use tokio_ratelimit::test_util::GrantLog;
use tokio_ratelimit::{AcquireError, Funnel, Rate, TryAcquireError};
use tokio_test::{assert_pending, assert_ready, assert_ready_eq, task};

mod support;
use support::{Lcg, limited, ms};

fn funnel(rate: Rate, capacity: u32) -> Funnel {
    Funnel::builder()
        .rate(rate)
        .capacity(capacity)
        .build()
        .unwrap()
}

/// Polls a future once with a waker that does nothing (no runtime needed).
fn poll_once<F: Future>(f: F) -> Poll<F::Output> {
    let mut f = pin!(f);

    f.as_mut().poll(&mut Context::from_waker(Waker::noop()))
}

/// The first whole unit of `unit_nanos` at or after `num / den` ns.
fn ceil_to(num: u128, den: u128, unit_nanos: u128) -> u128 {
    num.div_ceil(den * unit_nanos)
}

#[test]
fn works_without_a_runtime() {
    assert!(tokio::runtime::Handle::try_current().is_err());
    let f = funnel(Rate::per_hour(2), 2);
    assert_eq!((f.capacity(), f.free(), f.level()), (2, 2, 0));
    assert_eq!(f.try_acquire(), Ok(()));
    assert_eq!(f.try_acquire(), Ok(()));
    assert_eq!((f.free(), f.level()), (0, 2));
    // Real time runs here: the wait is half an hour minus the few
    // microseconds since the first pour.
    let wait = f.try_acquire().unwrap_err().retry_after().unwrap();
    assert!(wait <= Duration::from_secs(1800), "{wait:?}");
    assert!(wait > Duration::from_secs(1799), "{wait:?}");
    assert_eq!(
        f.try_acquire_many(3),
        Err(TryAcquireError::InsufficientCapacity)
    );
    // An `acquire` that need not wait completes on its first poll, and one
    // that can never succeed fails on it, with no timer and no runtime.
    let g = funnel(Rate::per_second(1), 1);
    assert_eq!(poll_once(g.acquire()), Poll::Ready(Ok(())));
    assert_eq!(
        poll_once(g.acquire_many(2)),
        Poll::Ready(Err(AcquireError::InsufficientCapacity))
    );
    assert_eq!(g.level(), 1);
    f.close();
    assert_eq!(f.try_acquire(), Err(TryAcquireError::Closed));
}

/// The grant instants (in `unit_nanos` units) of a funnel of `capacity`
/// draining one unit per `num / den` ns, polled at every unit of time from
/// 0 to `horizon` (inclusive) by a caller that takes all it can — computed
/// with exact rationals, independently of the crate.
///
/// * Capacity ≥ 2: the funnel never runs dry between polls (one unit is
///   always left draining), so no leakage is ever lost: with a full burst
///   at 0, unit `j ≥ capacity` fits at the first poll at or after
///   `(j - capacity + 1) · num / den` — the exact grid.
/// * Capacity 1: a unit poured at `t` drains at `t + I`, and a funnel
///   cannot hold less than nothing, so the next unit fits at the first poll
///   at or after `t + I`; the fraction of a poll step between the drain and
///   that poll is time the funnel stood empty, not leakage to bank.
fn expected_grants(
    capacity: u32,
    num: u128,
    den: u128,
    unit_nanos: u128,
    horizon: u128,
) -> Vec<u128> {
    let mut out = vec![];
    if capacity == 1 {
        let mut t = 0u128;
        while t <= horizon {
            out.push(t);
            t = ceil_to(t * unit_nanos * den + num, den, unit_nanos);
        }
    } else {
        out.extend(std::iter::repeat_n(0, usize::try_from(capacity).unwrap()));
        for k in 1.. {
            let t = ceil_to(k * num, den, unit_nanos);
            if t > horizon {
                break;
            }
            out.push(t);
        }
    }
    out
}

#[tokio::test(start_paused = true)]
async fn polled_every_microsecond_leaks_exactly() {
    // The source's funnel kept its free space as an integer and added
    // `gap × rate` truncated on each call: polled every 1 µs at 30/s it
    // adds 0.00003 → 0 per call and, once full, never leaks again (one
    // grant in all). Here, at 30/s polled every 1 µs for 1 s:
    // * capacity 2: 2 + 30 grants, the (k+1)-th at the first µs at or after
    //   k/30 s — exactly the rate, no truncation;
    // * capacity 1: the k-th grant 1/30 s after the (k-1)-th, rounded up to
    //   the µs: 0, 33 334, 66 668, ... µs (k · 33 334 µs): 30 grants, the
    //   31st at 1 000 020 µs.
    let f1 = funnel(Rate::per_second(30), 1);
    let f2 = funnel(Rate::per_second(30), 2);
    let start = Instant::now();
    let (mut granted1, mut granted2) = (vec![], vec![]);
    for us in 0..=1_000_000u64 {
        if us > 0 {
            time::advance(Duration::from_micros(1)).await;
        }
        while f1.try_acquire().is_ok() {
            granted1.push(u128::from(us));
        }
        while f2.try_acquire().is_ok() {
            granted2.push(u128::from(us));
        }
    }
    assert_eq!(start.elapsed(), Duration::from_secs(1));
    let interval = (1_000_000_000, 30); // 1/30 s in ns, as num / den
    assert_eq!(
        granted2,
        expected_grants(2, interval.0, interval.1, 1000, 1_000_000)
    );
    assert_eq!(granted2.len(), 2 + 30);
    assert_eq!(&granted2[..5], [0, 0, 33_334, 66_667, 100_000]);
    assert_eq!(
        granted1,
        expected_grants(1, interval.0, interval.1, 1000, 1_000_000)
    );
    let every_33_334: Vec<u128> = (0..30).map(|k| k * 33_334).collect();
    assert_eq!(granted1, every_33_334);
}

#[test]
fn funnel_state_polled_every_microsecond() {
    // The same check on the pure state machine, where polling is cheap.
    // 3/s polled every 1 µs for 10 s: capacity 2 gives 2 + 30 grants on
    // the exact k/3 s grid; capacity 1 gives 1 + 29 (k · 333 334 µs).
    for capacity in [1, 2] {
        let mut s = FunnelState::new(Rate::per_second(3), capacity).unwrap();
        let mut granted = vec![];
        for us in 0..=10_000_000u64 {
            while s.try_pour(Duration::from_micros(us), 1).is_ok() {
                granted.push(u128::from(us));
            }
        }
        let expected = expected_grants(capacity, 1_000_000_000, 3, 1000, 10_000_000);
        assert_eq!(granted, expected, "capacity {capacity}");
        let burst = usize::try_from(capacity).unwrap();
        let steady = if capacity == 1 { 29 } else { 30 };
        assert_eq!(granted.len(), burst + steady, "capacity {capacity}");
    }
}

#[test]
fn funnel_state_polled_every_nanosecond() {
    // 3000/s polled every nanosecond for 10 ms: capacity 2 gives 2 + 30
    // grants on the exact k/3000 s grid; capacity 1 gives 1 + 29.
    for capacity in [1, 2] {
        let mut s = FunnelState::new(Rate::per_second(3000), capacity).unwrap();
        let mut granted = vec![];
        for ns in 0..=10_000_000u64 {
            while s.try_pour(Duration::from_nanos(ns), 1).is_ok() {
                granted.push(u128::from(ns));
            }
        }
        let expected = expected_grants(capacity, 1_000_000_000, 3000, 1, 10_000_000);
        assert_eq!(granted, expected, "capacity {capacity}");
        if capacity == 2 {
            assert_eq!(&granted[..5], [0, 0, 333_334, 666_667, 1_000_000]);
            assert_eq!(granted.len(), 2 + 30);
        } else {
            assert_eq!(&granted[..3], [0, 333_334, 666_668]);
            assert_eq!(granted.len(), 30);
        }
    }
}

#[tokio::test(start_paused = true)]
async fn acquire_waits_exactly_the_reported_retry_after() {
    let f = funnel(Rate::per_second(4), 2);
    f.try_acquire_many(2).unwrap();
    assert_eq!(f.try_acquire(), limited(ms(250)));
    assert_eq!(f.try_acquire_many(2), limited(ms(500)));
    let start = Instant::now();
    f.acquire().await.unwrap();
    assert_eq!(start.elapsed(), ms(250));
    assert_eq!(f.try_acquire(), limited(ms(250)));
    let start = Instant::now();
    f.acquire_many(2).await.unwrap();
    assert_eq!(start.elapsed(), ms(500));

    // A fractional wait. Awaited, it ends on the first 1 ms tick at or
    // after the turn (⅓ s → 334 ms; time is on a whole millisecond here).
    let f = funnel(Rate::per_second(3), 1);
    let origin = Instant::now();
    f.try_acquire().unwrap();
    assert_eq!(f.try_acquire(), limited(Duration::from_nanos(333_333_334)));
    f.acquire().await.unwrap();
    assert_eq!(origin.elapsed(), ms(334));
    // The waiter had reserved its unit at 0, so the next one is due at
    // exactly ⅔ s (666 666 666⅔ ns), not ⅓ s after 334 ms.
    let wait = f.try_acquire().unwrap_err().retry_after().unwrap();
    assert_eq!(wait, Duration::from_nanos(332_666_667));
    // Polled then, a waiter is ready at exactly the nanosecond reported,
    // before its own timer (rounded up to the tick) has fired.
    let mut w = task::spawn(f.acquire());
    assert_pending!(w.poll());
    time::advance(wait.checked_sub(Duration::from_nanos(1)).unwrap()).await;
    assert_pending!(w.poll());
    time::advance(Duration::from_nanos(1)).await;
    assert_ready!(w.poll()).unwrap();
    assert_eq!(origin.elapsed(), Duration::from_nanos(666_666_667));
}

#[tokio::test(start_paused = true)]
async fn waiters_are_served_fifo_at_exact_instants() {
    let f = funnel(Rate::per_second(10), 2);
    f.try_acquire_many(2).unwrap(); // water until 200 ms
    let log = GrantLog::new();
    let mut handles = vec![];
    // Each waiter makes its reservation on its first poll, in this order.
    for (who, n) in [(0, 1), (1, 2), (2, 1)] {
        let f = f.clone();
        let log = log.clone();
        let mut t = task::spawn(async move {
            f.acquire_many(n).await.unwrap();
            log.record_for(who, n);
        });
        assert_pending!(t.poll());
        handles.push(tokio::spawn(t));
    }
    // The reservations fill the funnel until 600 ms: try_acquire cannot
    // jump them (1 unit fits once the water is at 1 unit: 500 ms).
    assert_eq!(f.free(), 0);
    assert_eq!(f.try_acquire(), limited(ms(500)));
    for h in handles {
        h.await.unwrap();
    }
    // Turns: 1 unit fits at 100 ms; then 2 units fit at 300 ms; then 1 at
    // 400 ms.
    assert_eq!(log.offsets(), [ms(100), ms(300), ms(400)]);
    assert_eq!(log.order(), [0, 1, 2]);
    // A big request at the head is not starved by small ones behind it.
    let f = funnel(Rate::per_second(100), 5);
    f.try_acquire_many(5).unwrap();
    let start = Instant::now();
    let mut big = task::spawn(f.acquire_many(5));
    let mut small = task::spawn(f.acquire());
    assert_pending!(big.poll());
    assert_pending!(small.poll());
    time::sleep(ms(49)).await;
    assert_pending!(big.poll());
    assert_pending!(small.poll());
    time::sleep(ms(1)).await;
    assert_ready!(big.poll()).unwrap();
    assert_pending!(small.poll());
    time::sleep(ms(10)).await;
    assert!(small.is_woken());
    assert_ready!(small.poll()).unwrap();
    assert_eq!(start.elapsed(), ms(60));
}

/// 2/s, capacity 1: a unit at 0 (water until 500 ms), then A and B wait
/// (turns 500 ms and 1 s: water until 1 s and 1.5 s). At 100 ms the rate
/// changes: A's 1.8 units of water ahead and B's 2.8 drain at the new
/// rate, each turn a unit (its own) before its water ends.
#[tokio::test(start_paused = true)]
async fn set_rate_moves_each_waiters_turn_and_keeps_their_order() {
    // (new rate, A's turn, B's turn): 4/s: 100 + 450 − 250 ms, 100 + 700 − 250;
    // 1/s: 100 + 1800 − 1000, 100 + 2800 − 1000.
    for (rate, turns) in [(4, [ms(300), ms(550)]), (1, [ms(900), ms(1900)])] {
        let f = funnel(Rate::per_second(2), 1);
        let start = Instant::now();
        f.try_acquire().unwrap();
        let mut w = [task::spawn(f.acquire()), task::spawn(f.acquire())];
        for t in &mut w {
            assert_pending!(t.poll());
        }
        // (`advance`, not `sleep_until`: a timer rounds up to the tick.)
        let advance_to = |at: Duration| time::advance(start + at - Instant::now());
        advance_to(ms(100)).await;
        f.set_rate(Rate::per_second(rate)).unwrap();
        for (t, turn) in w.iter_mut().zip(turns) {
            advance_to(turn.saturating_sub(Duration::from_nanos(1))).await;
            assert_pending!(t.poll(), "{rate}/s: before {turn:?}");
            advance_to(turn).await;
            assert_ready_eq!(t.poll(), Ok(()), "{rate}/s: at {turn:?}");
        }
    }
}

#[tokio::test(start_paused = true)]
async fn more_than_capacity_fails_at_once() {
    let f = funnel(Rate::per_second(10), 2);
    let start = Instant::now();
    let mut w = task::spawn(f.acquire_many(3));
    assert_ready_eq!(w.poll(), Err(AcquireError::InsufficientCapacity));
    let mut w = task::spawn(f.acquire_timeout(3, Duration::MAX));
    assert_ready_eq!(w.poll(), Err(AcquireError::InsufficientCapacity));
    assert_eq!(
        f.try_acquire_many(3),
        Err(TryAcquireError::InsufficientCapacity)
    );
    assert_eq!(
        f.try_acquire_many(u32::MAX),
        Err(TryAcquireError::InsufficientCapacity)
    );
    assert_eq!(start.elapsed(), Duration::ZERO);
    assert_eq!(f.free(), 2);
}

#[tokio::test(start_paused = true)]
async fn close_fails_waiters_and_later_calls() {
    let f = funnel(Rate::per_second(10), 1);
    f.try_acquire().unwrap();
    let mut w = task::spawn(f.acquire());
    assert_pending!(w.poll());
    f.close();
    assert!(w.is_woken());
    assert_ready_eq!(w.poll(), Err(AcquireError::Closed));
    assert_eq!(f.acquire().await, Err(AcquireError::Closed));
    assert_eq!(f.try_acquire(), Err(TryAcquireError::Closed));
}

#[tokio::test(start_paused = true)]
async fn same_numbers_as_funnel_state() {
    for (rate, capacity, seed) in [
        (Rate::per_second(7), 3, 1),
        (Rate::per(5, Duration::from_secs(3)), 4, 2),
        (Rate::per_second(999_983), 10, 3),
    ] {
        let f = funnel(rate, capacity);
        let mut s = FunnelState::new(rate, capacity).unwrap();
        let origin = Instant::now();
        let mut rng = Lcg(seed);
        // Gaps up to about two intervals, at nanosecond resolution.
        let max_gap = u64::try_from(rate.interval().as_nanos() * 2).unwrap();
        for step in 0..2000 {
            time::advance(Duration::from_nanos(rng.below(max_gap))).await;
            let now = origin.elapsed();
            let n = u32::try_from(rng.below(u64::from(capacity) + 2)).unwrap();
            let expected = s.try_pour(now, n);
            assert_eq!(f.try_acquire_many(n), expected, "step {step} at {now:?}");
            assert_eq!(f.level(), s.level(now), "step {step}");
            assert_eq!(f.free(), s.free(now), "step {step}");
        }
    }
}

#[tokio::test(start_paused = true)]
async fn a_waiter_timer_looks_a_tick_before_its_turn() {
    // Due at 100.5 ms: the waiter's own timer is first armed a tick early,
    // so it is woken on the 100 ms tick (not due yet), then armed for the
    // turn, which tokio fires on the 101 ms tick.
    let f = funnel(Rate::every(Duration::from_micros(100_500)), 1);
    let start = Instant::now();
    assert_eq!(f.try_acquire(), Ok(()));
    let mut w = task::spawn(f.acquire());
    assert_pending!(w.poll());
    time::advance(Duration::from_nanos(99_999_999)).await;
    assert!(!w.is_woken());
    time::advance(Duration::from_nanos(1)).await;
    assert!(w.is_woken(), "the early timer fires on the 100 ms tick");
    assert_pending!(w.poll());
    time::advance(Duration::from_nanos(999_999)).await;
    assert!(!w.is_woken());
    time::advance(Duration::from_nanos(1)).await;
    assert!(
        w.is_woken(),
        "the timer for the turn fires on the 101 ms tick"
    );
    assert_ready_eq!(w.poll(), Ok(()));
    assert_eq!(start.elapsed(), ms(101));
}

#[tokio::test(start_paused = true)]
async fn a_tick_processed_after_the_turn_releases_the_waiter_then() {
    // Due at 100.5 ms. In real time tokio processes a tick some way into
    // the millisecond; here the 100 ms tick is processed at 100.5 ms (one
    // jump of the clock): the early timer wakes the waiter, whose turn has
    // come, so it proceeds then rather than on the 101 ms tick.
    let f = funnel(Rate::every(Duration::from_micros(100_500)), 1);
    let start = Instant::now();
    assert_eq!(f.try_acquire(), Ok(()));
    let mut w = task::spawn(f.acquire());
    assert_pending!(w.poll());
    time::advance(Duration::from_micros(100_500)).await;
    assert!(w.is_woken());
    assert_ready_eq!(w.poll(), Ok(()));
    assert_eq!(start.elapsed(), Duration::from_micros(100_500));
}
