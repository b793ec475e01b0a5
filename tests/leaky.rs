//! `LeakyBucket` in paused time, at exact virtual instants: the shaper
//! (`acquire*`: one request per `n / rate`, overflow refused at once), the
//! meter (`try_acquire*`: pour now or `Limited` with the exact wait), the one
//! water level they share, `acquire_timeout`, `close` and `waiting`.
//!
//! tokio's timer fires on 1 ms ticks, so the rates below are chosen to put
//! turns on whole milliseconds unless a test is about a fraction.

use std::time::Duration;

use tokio::time::{self, Instant};
use tokio_ratelimit::test_util::GrantLog;
use tokio_ratelimit::{AcquireError, LeakyBucket, Rate, TryAcquireError};
use tokio_test::{assert_pending, assert_ready, assert_ready_eq, task};

mod support;
use support::{limited, ms};

fn bucket(rate: Rate, capacity: u32) -> LeakyBucket {
    LeakyBucket::builder()
        .rate(rate)
        .capacity(capacity)
        .build()
        .unwrap()
}

#[tokio::test(start_paused = true)]
async fn shaper_sequential_awaits_are_one_interval_apart() {
    let b = bucket(Rate::per_second(10), 5);

    let start = Instant::now();
    let mut at = vec![];
    for _ in 0..5 {
        b.acquire().await.unwrap();
        at.push(start.elapsed());
    }
    // Into an idle bucket at once, then one per 100 ms: no burst.
    assert_eq!(at, [ms(0), ms(100), ms(200), ms(300), ms(400)]);
    // The last one's unit is still draining (until 500 ms).
    assert_eq!(b.level(), 1);
    time::sleep(ms(100)).await;
    assert_eq!(b.level(), 0);
    // Idle again: the next request proceeds at once.
    let again = Instant::now();
    b.acquire().await.unwrap();
    assert_eq!(again.elapsed(), Duration::ZERO);
}

#[tokio::test(start_paused = true)]
async fn shaper_spawned_tasks_record_exact_turns() {
    // Capacity 5: the first five fit (0, 100, ..., 400 ms), the other two
    // overflow at once (the bucket holds 5 units at time 0).
    let b = bucket(Rate::per_second(10), 5);
    let log = GrantLog::new();
    let handles: Vec<_> = (0..7)
        .map(|who| {
            let b = b.clone();
            let log = log.clone();
            tokio::spawn(async move {
                let r = b.acquire().await;
                if r.is_ok() {
                    log.record_for(who, 1);
                }
                r
            })
        })
        .collect();
    let mut results = vec![];
    for h in handles {
        results.push(h.await.unwrap());
    }
    assert_eq!(
        results,
        [
            Ok(()),
            Ok(()),
            Ok(()),
            Ok(()),
            Ok(()),
            Err(AcquireError::Overflow),
            Err(AcquireError::Overflow)
        ]
    );
    assert_eq!(log.offsets(), [ms(0), ms(100), ms(200), ms(300), ms(400)]);
    assert_eq!(log.order(), [0, 1, 2, 3, 4]);
}

#[tokio::test(start_paused = true)]
async fn shaper_fractional_interval_does_not_drift() {
    // 3/s: turns fall due at exactly k/3 s; the actor's timer releases each
    // on the first 1 ms tick at or after it: 0, 334, 667, 1000, 1334 ms. A
    // schedule that added a rounded interval would drift (0, 334, 668, ...).
    let b = bucket(Rate::per_second(3), 2);
    let start = Instant::now();
    let mut at = vec![];
    for _ in 0..5 {
        b.acquire().await.unwrap();
        at.push(start.elapsed());
    }
    assert_eq!(at, [ms(0), ms(334), ms(667), ms(1000), ms(1334)]);
}

#[tokio::test(start_paused = true)]
async fn shaper_weighted_requests_take_n_over_rate() {
    let b = bucket(Rate::per_second(10), 10);
    let start = Instant::now();
    let mut at = vec![];
    for n in [3, 1, 4, 1, 5] {
        b.acquire_many(n).await.unwrap();
        at.push(start.elapsed());
    }
    // Each request waits for the water ahead of it: 3 units take 300 ms to
    // drain, then 1 takes 100 ms, 4 take 400 ms, 1 takes 100 ms.
    assert_eq!(at, [ms(0), ms(300), ms(400), ms(800), ms(900)]);
    assert_eq!(b.level(), 5);
    // Weighted spawned requests queue behind each other the same way.
    let b = bucket(Rate::per_second(100), 10);
    let start = Instant::now();
    let mut a = task::spawn(b.acquire_many(4));
    let mut c = task::spawn(b.acquire_many(2));
    let mut d = task::spawn(b.acquire_many(3));
    assert_ready!(a.poll()).unwrap();
    assert_pending!(c.poll());
    assert_pending!(d.poll());
    assert_eq!(b.level(), 9);
    assert_eq!(b.waiting(), 2);
    time::sleep(ms(39)).await;
    assert_pending!(c.poll());
    time::sleep(ms(1)).await;
    assert_ready!(c.poll()).unwrap();
    assert_eq!(start.elapsed(), ms(40));
    time::sleep(ms(19)).await;
    assert_pending!(d.poll());
    time::sleep(ms(2)).await; // past the 60 ms turn: the actor has run
    assert!(d.is_woken());
    assert_ready!(d.poll()).unwrap();
}

#[tokio::test(start_paused = true)]
async fn overflow_is_refused_at_once_and_pours_nothing() {
    let b = bucket(Rate::per_second(10), 3);
    let start = Instant::now();
    b.acquire().await.unwrap(); // proceeds at once; its unit drains until 100 ms
    let mut w1 = task::spawn(b.acquire()); // turn at 100 ms
    let mut w2 = task::spawn(b.acquire()); // turn at 200 ms
    assert_pending!(w1.poll());
    assert_pending!(w2.poll());
    assert_eq!((b.level(), b.waiting()), (3, 2));

    // Full: refused on the first poll, no time passes, nothing is poured,
    // nothing is parked.
    let mut over = task::spawn(b.acquire());
    assert_ready_eq!(over.poll(), Err(AcquireError::Overflow));
    assert_eq!(b.acquire_many(2).await, Err(AcquireError::Overflow));
    assert_eq!(start.elapsed(), Duration::ZERO);
    assert_eq!((b.level(), b.waiting()), (3, 2));
    // More than the bucket can ever hold.
    assert_eq!(
        b.acquire_many(4).await,
        Err(AcquireError::InsufficientCapacity)
    );
    assert_eq!(
        b.try_acquire_many(4),
        Err(TryAcquireError::InsufficientCapacity)
    );
    assert_eq!(
        b.acquire_timeout(4, ms(1000)).await,
        Err(AcquireError::InsufficientCapacity)
    );

    // 100 ms later one unit has drained: one unit fits, two do not.
    time::sleep(ms(100)).await;
    assert_ready!(w1.poll()).unwrap();
    assert_eq!(b.level(), 2);
    assert_eq!(b.acquire_many(2).await, Err(AcquireError::Overflow));
    assert_eq!(b.level(), 2);
    let mut w3 = task::spawn(b.acquire());
    assert_pending!(w3.poll()); // behind w2's water: turn at 300 ms
    assert_eq!((b.level(), b.waiting()), (3, 2));
    time::sleep(ms(200)).await;
    assert_ready!(w2.poll()).unwrap();
    assert_ready!(w3.poll()).unwrap();
    assert_eq!(start.elapsed(), ms(300));
}

#[tokio::test(start_paused = true)]
async fn meter_pours_or_reports_the_exact_wait() {
    let b = bucket(Rate::per_second(10), 3);
    assert_eq!(b.try_acquire_many(2), Ok(()));
    assert_eq!(b.level(), 2);
    // 2 + 2 > 3: one unit must drain first.
    assert_eq!(b.try_acquire_many(2), limited(ms(100)));
    assert_eq!(b.try_acquire_many(3), limited(ms(200)));
    assert_eq!(b.level(), 2); // a refusal pours nothing
    time::advance(ms(99)).await;
    assert_eq!(b.try_acquire_many(2), limited(ms(1)));
    time::advance(ms(1)).await;
    assert_eq!(b.try_acquire_many(2), Ok(()));
    assert_eq!(b.level(), 3);
    assert_eq!(b.try_acquire(), limited(ms(100)));

    // A fractional interval: the wait is rounded up to the nanosecond, and
    // the permit is there at exactly that nanosecond, not before.
    let b = bucket(Rate::per_second(3), 1);
    assert_eq!(b.try_acquire(), Ok(()));
    assert_eq!(b.try_acquire(), limited(Duration::from_nanos(333_333_334)));
    time::advance(Duration::from_nanos(333_333_333)).await;
    assert_eq!(b.try_acquire(), limited(Duration::from_nanos(1)));
    time::advance(Duration::from_nanos(1)).await;
    assert_eq!(b.try_acquire(), Ok(()));
    // The bucket had been empty for ⅔ ns (its unit drained at 333 333 333⅓
    // ns), so this unit drains ⅓ s after now: capacity 1 leaves no room to
    // keep the fraction.
    assert_eq!(b.try_acquire(), limited(Duration::from_nanos(333_333_334)));
}

#[tokio::test(start_paused = true)]
async fn meter_pour_delays_the_shaper() {
    let b = bucket(Rate::per_second(10), 5);
    let start = Instant::now();
    b.try_acquire_many(2).unwrap();
    // The shaped request waits for the meter's 2 units to drain.
    b.acquire().await.unwrap();
    assert_eq!(start.elapsed(), ms(200));
    assert_eq!(b.level(), 1);
}

#[tokio::test(start_paused = true)]
async fn shaped_queue_counts_for_the_meter() {
    let b = bucket(Rate::per_second(10), 4);
    b.acquire().await.unwrap(); // water until 100 ms
    let mut w1 = task::spawn(b.acquire()); // turn 100 ms, water until 200 ms
    let mut w2 = task::spawn(b.acquire()); // turn 200 ms, water until 300 ms
    assert_pending!(w1.poll());
    assert_pending!(w2.poll());
    assert_eq!((b.level(), b.waiting()), (3, 2));
    // The meter sees the queued water: 3 + 2 > 4, one unit must drain.
    assert_eq!(b.try_acquire_many(2), limited(ms(100)));
    assert_eq!(b.try_acquire_many(4), limited(ms(300)));
    // One unit fits: the meter pours it and proceeds at once...
    assert_eq!(b.try_acquire(), Ok(()));
    assert_eq!(b.level(), 4);
    // ...so the bucket is full for the shaper too,
    assert_eq!(b.acquire().await, Err(AcquireError::Overflow));
    // and once w1 has come out, the next shaped request queues behind the
    // meter's unit as well: its turn is at 400 ms, not 300 ms.
    time::sleep(ms(100)).await;
    assert_ready!(w1.poll()).unwrap();
    assert_eq!(b.level(), 3);
    let start = Instant::now();
    let mut w3 = task::spawn(b.acquire());
    assert_pending!(w3.poll());
    assert_eq!(b.level(), 4);
    time::sleep(ms(100)).await;
    assert_ready!(w2.poll()).unwrap();
    assert_pending!(w3.poll());
    time::sleep(ms(199)).await;
    assert_pending!(w3.poll());
    time::sleep(ms(1)).await;
    assert_ready!(w3.poll()).unwrap();
    assert_eq!(start.elapsed(), ms(300));
}

#[tokio::test(start_paused = true)]
async fn acquire_timeout_fails_at_once_or_waits_exactly() {
    let b = bucket(Rate::per_second(10), 5);
    let start = Instant::now();
    b.try_acquire_many(3).unwrap(); // 300 ms of water ahead
    assert_eq!(
        b.acquire_timeout(1, ms(299)).await,
        Err(AcquireError::Timeout)
    );
    assert_eq!(start.elapsed(), Duration::ZERO);
    assert_eq!((b.level(), b.waiting()), (3, 0)); // nothing poured
    // Exactly enough time: waits, and proceeds at 300 ms.
    b.acquire_timeout(1, ms(300)).await.unwrap();
    assert_eq!(start.elapsed(), ms(300));
    // Duration::MAX never times out.
    b.acquire_timeout(2, Duration::MAX).await.unwrap();
    assert_eq!(start.elapsed(), ms(400));
    // A weighted request: water ahead is 2 units (200 ms).
    assert_eq!(
        b.acquire_timeout(3, ms(199)).await,
        Err(AcquireError::Timeout)
    );
    assert_eq!(b.level(), 2);
    // A full bucket overflows whatever the timeout.
    b.try_acquire_many(3).unwrap();
    assert_eq!(
        b.acquire_timeout(1, Duration::MAX).await,
        Err(AcquireError::Overflow)
    );
    assert_eq!(start.elapsed(), ms(400));
}

#[tokio::test(start_paused = true)]
async fn close_fails_waiters_and_later_calls() {
    let b = bucket(Rate::per_second(10), 5);
    b.acquire().await.unwrap();
    let mut w1 = task::spawn(b.acquire());
    let mut w2 = task::spawn(b.acquire_many(2));
    assert_pending!(w1.poll());
    assert_pending!(w2.poll());
    // A spawned waiter too, to see the actor-side wake-up.
    let spawned = tokio::spawn({
        let b = b.clone();
        async move { b.acquire().await }
    });
    tokio::task::yield_now().await;
    assert_eq!(b.waiting(), 3);
    assert!(!b.is_closed());

    let start = Instant::now();
    b.close();
    assert!(b.is_closed());
    assert!(w1.is_woken());
    assert!(w2.is_woken());
    assert_ready_eq!(w1.poll(), Err(AcquireError::Closed));
    assert_ready_eq!(w2.poll(), Err(AcquireError::Closed));
    assert_eq!(spawned.await.unwrap(), Err(AcquireError::Closed));
    assert_eq!(start.elapsed(), Duration::ZERO);
    assert_eq!(b.waiting(), 0);

    assert_eq!(b.acquire().await, Err(AcquireError::Closed));
    assert_eq!(
        b.acquire_timeout(1, ms(10)).await,
        Err(AcquireError::Closed)
    );
    assert_eq!(b.try_acquire(), Err(TryAcquireError::Closed));
    time::sleep(ms(1000)).await; // the bucket has drained: still closed
    assert_eq!(b.try_acquire(), Err(TryAcquireError::Closed));
    assert_eq!(b.acquire().await, Err(AcquireError::Closed));
}

#[tokio::test(start_paused = true)]
async fn waiting_counts_queued_shaped_requests() {
    let b = bucket(Rate::per_second(10), 5);
    assert_eq!(b.waiting(), 0);
    b.acquire().await.unwrap(); // proceeds at once: never waits
    assert_eq!(b.waiting(), 0);
    let mut w: Vec<_> = (0..3).map(|_| task::spawn(b.acquire())).collect();
    for (i, f) in w.iter_mut().enumerate() {
        assert_pending!(f.poll());
        assert_eq!(b.waiting(), i + 1);
    }
    b.try_acquire().unwrap(); // the meter does not wait
    assert_eq!((b.level(), b.waiting()), (5, 3));
    // Turns at 100, 200, 300 ms; the actor releases one at each (checked
    // 1 ms later, so that the actor has run).
    time::sleep(ms(1)).await;
    for left in [2, 1, 0] {
        time::sleep(ms(100)).await;
        assert_eq!(b.waiting(), left);
    }
    for f in &mut w {
        assert_ready!(f.poll()).unwrap();
    }
    // Now (301 ms) the water ends at 500 ms (the meter's unit, poured
    // last). A dropped waiter leaves the queue and takes its water back out.
    let start = Instant::now();
    let mut x = task::spawn(b.acquire()); // turn at 500 ms
    let mut y = task::spawn(b.acquire()); // turn at 600 ms
    assert_pending!(x.poll());
    assert_pending!(y.poll());
    assert_eq!((b.level(), b.waiting()), (4, 2));
    drop(x);
    // y moves up to 500 ms.
    assert_eq!((b.level(), b.waiting()), (3, 1));
    time::sleep(ms(198)).await;
    assert_pending!(y.poll());
    time::sleep(ms(2)).await;
    assert!(y.is_woken());
    assert_ready!(y.poll()).unwrap();
    assert_eq!(b.waiting(), 0);
    assert_eq!(start.elapsed(), ms(200));
}

#[tokio::test(start_paused = true)]
async fn high_rate_loop_delivers_the_schedule() {
    // 100 000/s (one unit per 10 µs), capacity 10, one task looping
    // `acquire()` while less than 1 s has passed.
    //
    // The shaper's turns fall due at 0, 10 µs, 20 µs, ... with no gap: the
    // first request proceeds at once; the second is due at 10 µs and the
    // timer releases it on the 1 ms tick. The requests the task makes right
    // after that late release are scheduled from the released one's due
    // time (the timer credit), so their turns (20 µs, 30 µs, ..., 1 ms) have
    // already passed and they proceed at once; the first turn after 1 ms
    // waits for the 2 ms tick, and so on. So on the tick at k ms the task
    // gets every turn in ((k-1) ms, k ms].
    //
    // The loop checks the clock before each request: it runs through the
    // tick at 999 ms (turns 0, 10 µs, ..., 999 ms: 99 901 of them); the
    // request after that is due at 999.01 ms and is released on the 1000 ms
    // tick, and then the loop stops. 99 901 + 1 = 99 902.
    let b = bucket(Rate::per_second(100_000), 10);
    let start = Instant::now();
    let mut n = 0u64;
    let mut last_before_end = Duration::ZERO;
    while start.elapsed() < Duration::from_secs(1) {
        last_before_end = start.elapsed();
        b.acquire().await.unwrap();
        n += 1;
    }
    assert_eq!(n, 99_902);
    assert_eq!(last_before_end, ms(999));
    assert_eq!(start.elapsed(), ms(1000));
    // The last turn handed out was 999.01 ms: its unit drained at
    // 999.02 ms, so the bucket is empty at 1000 ms.
    assert_eq!(b.level(), 0);
}

/// `acquire_room`: the edges (0, more than the capacity, `u32::MAX`, a
/// closed bucket), its place in the queue (behind a shaped waiter, ahead of
/// what comes after), and a drop that gives its water back at once.
#[tokio::test(start_paused = true)]
async fn acquire_room_waits_in_turn_for_room_and_fails_only_on_bad_input() {
    let b = bucket(Rate::per_second(10), 3);
    assert_eq!(b.acquire_room(0).await, Ok(()));
    assert_eq!(
        b.acquire_room(4).await,
        Err(AcquireError::InsufficientCapacity)
    );
    assert_eq!(
        b.acquire_room(u32::MAX).await,
        Err(AcquireError::InsufficientCapacity)
    );
    assert_eq!(b.level(), 0);

    // Two units in; a shaped request of 1 fits and waits 200 ms for the
    // water ahead; a request for 3 does not fit and waits behind it, for
    // room: until the bucket has drained to empty (300 ms), poured on credit.
    b.try_acquire_many(2).unwrap();
    let mut shaped = task::spawn(b.acquire());
    assert_pending!(shaped.poll());
    let mut room = task::spawn(b.acquire_room(3));
    assert_pending!(room.poll());
    // The shaper overflows behind it; the meter is refused.
    assert_eq!(b.acquire().await, Err(AcquireError::Overflow));
    assert_eq!(b.try_acquire(), limited(ms(400))); // 6 units in, room for 1 at 4 drained
    time::advance(ms(200)).await;
    assert_ready_eq!(shaped.poll(), Ok(()));
    assert_pending!(room.poll());
    time::advance(ms(100)).await;
    assert_ready_eq!(room.poll(), Ok(()));
    assert_eq!(b.level(), 3);

    // Dropped while waiting, its units come back out at once.
    let mut room = task::spawn(b.acquire_room(2));
    assert_pending!(room.poll());
    assert_eq!(b.level(), 5);
    drop(room);
    assert_eq!(b.level(), 3);

    // Closed: before and while waiting.
    let mut room = task::spawn(b.acquire_room(3));
    assert_pending!(room.poll());
    b.close();
    assert_ready_eq!(room.poll(), Err(AcquireError::Closed));
    assert_eq!(b.acquire_room(1).await, Err(AcquireError::Closed));
}
