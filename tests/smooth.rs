//! Paused-clock tests of the async smooth limiters, `SmoothBursty` and
//! `SmoothWarmingUp`: Guava's semantics at exact instants, plus what the
//! async handles add (FIFO waiters, timeouts, close, cancellation, the
//! `Limiter` trait, bad input).

// The rates and stored permits asserted are exact on purpose.
#![expect(clippy::float_cmp, reason = "the values compared are exact on purpose")]

use std::sync::Arc;
use std::time::Duration;

use tokio::time::{self, Instant};
use tokio_ratelimit::test_util::{GrantLog, record_acquires};
use tokio_ratelimit::{
    AcquireError, ConfigError, Limiter, Rate, SmoothBursty, SmoothWarmingUp, TryAcquireError,
};
use tokio_test::{assert_pending, assert_ready, task};

mod support;
use support::{limited, ms};

fn bursty(rate: f64) -> SmoothBursty {
    SmoothBursty::builder()
        .permits_per_second(rate)
        .build()
        .unwrap()
}

fn warming_up(rate: f64, warmup: Duration, cold_factor: f64) -> SmoothWarmingUp {
    SmoothWarmingUp::builder()
        .permits_per_second(rate)
        .warmup(warmup)
        .cold_factor(cold_factor)
        .build()
        .unwrap()
}

/// The wait of each of `n` single-permit acquires in a row.
async fn waits<L: Limiter>(limiter: &L, n: usize) -> Vec<Duration> {
    let mut out = Vec::with_capacity(n);

    for _ in 0..n {
        let start = Instant::now();
        limiter.acquire().await.unwrap();
        out.push(start.elapsed());
    }
    out
}

#[tokio::test(start_paused = true)]
async fn paces_at_exact_instants() {
    let limiter = bursty(10.0);
    let log = GrantLog::new();
    for _ in 0..5 {
        limiter.acquire().await.unwrap();
        log.record(1);
    }
    assert_eq!(log.offsets(), [0, 100, 200, 300, 400].map(ms));
    // 3/s: Guava's 333 333 µs a permit (a third of a second, truncated to
    // the microsecond), each due instant rounded up to the timer's
    // millisecond tick: the 31st permit is due at 9.999 99 s, on the 10 s
    // tick.
    let limiter = bursty(3.0);
    let start = Instant::now();
    for _ in 0..=30 {
        limiter.acquire().await.unwrap();
    }
    assert_eq!(start.elapsed(), Duration::from_secs(10));
}

#[tokio::test(start_paused = true)]
async fn pays_later() {
    let limiter = bursty(10.0);
    let start = Instant::now();
    // A big request on a fresh limiter goes at once...
    limiter.acquire_many(50).await.unwrap();
    assert_eq!(start.elapsed(), ms(0));
    // ...and the next one pays for it, whatever its own size.
    assert_eq!(limiter.try_acquire(), limited(ms(5000)));
    limiter.acquire_many(2).await.unwrap();
    assert_eq!(start.elapsed(), ms(5000));
    limiter.acquire().await.unwrap();
    assert_eq!(start.elapsed(), ms(5200));
    // Any weight: no capacity, never InsufficientCapacity.
    let limiter = bursty(1.0);
    assert_eq!(limiter.acquire_many(u32::MAX).await, Ok(()));
    assert_eq!(
        limiter.try_acquire_many(u32::MAX),
        limited(Duration::from_secs(u64::from(u32::MAX)))
    );
}

#[tokio::test(start_paused = true)]
async fn stores_a_burst_while_idle() {
    let limiter = bursty(10.0);
    limiter.acquire().await.unwrap();
    time::sleep(Duration::from_secs(60)).await;
    assert!((limiter.stored_permits() - 10.0).abs() < 1e-12);
    let start = Instant::now();
    // Ten stored permits are free, and one more request (it pays later).
    for _ in 0..11 {
        assert_eq!(limiter.try_acquire(), Ok(()));
    }
    assert_eq!(limiter.try_acquire(), limited(ms(100)));
    assert_eq!(waits(&limiter, 3).await, [100, 100, 100].map(ms));
    assert_eq!(start.elapsed(), ms(300));

    // Partial idle: 250 ms after the debt is paid, 2.5 permits are stored.
    time::sleep(ms(100 + 250)).await;
    let start = Instant::now();
    limiter.acquire_many(2).await.unwrap(); // stored
    limiter.acquire().await.unwrap(); // half stored, half fresh: costs 50 ms
    limiter.acquire().await.unwrap();
    assert_eq!(start.elapsed(), ms(50));
}

#[tokio::test(start_paused = true)]
async fn custom_max_burst() {
    let limiter = SmoothBursty::builder()
        .permits_per_second(10.0)
        .max_burst(ms(300))
        .build()
        .unwrap();
    time::sleep(Duration::from_secs(10)).await;
    let log = GrantLog::new();
    for _ in 0..6 {
        limiter.acquire().await.unwrap();
        log.record(1);
    }
    assert_eq!(log.offsets(), [0, 0, 0, 0, 100, 200].map(ms));
    // No burst at all.
    let limiter = SmoothBursty::builder()
        .permits_per_second(10.0)
        .max_burst(Duration::ZERO)
        .build()
        .unwrap();
    time::sleep(Duration::from_secs(10)).await;
    assert_eq!(waits(&limiter, 3).await, [0, 100, 100].map(ms));
}

#[tokio::test(start_paused = true)]
async fn warm_up_ramp() {
    // 10/s, warming up over 1 s, cold factor 3: threshold 5 permits,
    // maximum 10. The five cold permits cost 300 → 100 ms along the
    // trapezoid (280, 240, 200, 160, 120 on average), 1 s in all; then
    // every permit costs the stable 100 ms.
    let limiter = warming_up(10.0, Duration::from_secs(1), 3.0);
    assert!((limiter.stored_permits() - 10.0).abs() < 1e-12);
    let ramp = waits(&limiter, 12).await;
    assert_eq!(
        ramp,
        [0, 280, 240, 200, 160, 120, 100, 100, 100, 100, 100, 100].map(ms)
    );
    assert_eq!(ramp[1..6].iter().sum::<Duration>(), Duration::from_secs(1));
    // Warm: it stays at the stable interval.
    assert_eq!(waits(&limiter, 20).await, [ms(100); 20]);
    // Idle for the warm-up period after the debt is paid: cold again.
    time::sleep(ms(100) + Duration::from_secs(1)).await;
    assert!((limiter.stored_permits() - 10.0).abs() < 1e-12);
    assert_eq!(waits(&limiter, 4).await, [0, 280, 240, 200].map(ms));
}

#[tokio::test(start_paused = true)]
async fn warm_up_ramp_for_other_cold_factors() {
    // The first paid wait is the average cost of the coldest permit, just
    // under cold_factor × stable; the waits shrink to the stable interval
    // (within the timer's tick) and stay there.
    for cold_factor in [2.0, 5.0, 10.0, 20.0] {
        let limiter = warming_up(20.0, ms(2000), cold_factor);
        let ramp = waits(&limiter, 80).await;
        let stable = ms(50);
        let coldest = stable.mul_f64(cold_factor);
        // Within the top quarter of the ramp (the coldest permit's average).
        let top_quarter = stable + coldest.saturating_sub(stable).mul_f64(0.75);
        assert!(
            ramp[1] <= coldest && ramp[1] > top_quarter,
            "{cold_factor}: {ramp:?}"
        );
        for pair in ramp[1..].windows(2) {
            assert!(pair[1] <= pair[0] + ms(1), "{cold_factor}: {ramp:?}");
        }
        for &wait in &ramp[60..] {
            assert!(wait.abs_diff(stable) <= ms(1), "{cold_factor}: {ramp:?}");
        }
    }
    // A cold factor of 1 turns the warm-up off.
    let limiter = warming_up(10.0, Duration::from_secs(5), 1.0);
    assert_eq!(waits(&limiter, 4).await, [0, 100, 100, 100].map(ms));
}

#[tokio::test(start_paused = true)]
async fn set_rate_while_in_debt() {
    let limiter = bursty(1.0);
    let start = Instant::now();
    limiter.acquire().await.unwrap();
    let mut waiter = task::spawn(limiter.acquire()); // due at 1 s
    assert_pending!(waiter.poll());
    limiter.set_rate(10.0).unwrap();
    assert_eq!(limiter.rate(), 10.0);
    // The debt incurred stands: the waiter still goes at 1 s, and its own
    // cost (a 1/s permit) is already reserved: the next one goes at 2 s.
    assert_eq!(limiter.try_acquire(), limited(ms(2000)));
    time::sleep(ms(1000)).await;
    assert_ready!(waiter.poll()).unwrap();
    let mut log = vec![];
    for _ in 0..3 {
        limiter.acquire().await.unwrap();
        log.push(start.elapsed());
    }
    assert_eq!(log, [2000, 2100, 2200].map(ms));
    // And down again.
    limiter.set_rate(2.0).unwrap();
    assert_eq!(waits(&limiter, 3).await, [100, 500, 500].map(ms));
    // A bad rate changes nothing.
    for bad in [f64::NAN, 0.0, -1.0, f64::INFINITY] {
        assert!(matches!(
            limiter.set_rate(bad),
            Err(ConfigError::InvalidRate { .. })
        ));
    }
    assert_eq!(limiter.rate(), 2.0);
    assert_eq!(limiter.try_acquire(), limited(ms(500)));
}

#[tokio::test(start_paused = true)]
async fn acquire_timeout_fails_at_once_or_waits() {
    let limiter = bursty(5.0);
    let start = Instant::now();
    limiter.acquire_many(3).await.unwrap(); // 600 ms of debt
    assert_eq!(
        limiter.acquire_timeout(1, ms(599)).await,
        Err(AcquireError::Timeout)
    );
    assert_eq!(start.elapsed(), ms(0)); // at once
    // The failure changed nothing; the timeout is inclusive.
    assert_eq!(limiter.acquire_timeout(1, ms(600)).await, Ok(()));
    assert_eq!(start.elapsed(), ms(600));
    // Only the previous debt counts, not this request's size.
    assert_eq!(limiter.acquire_timeout(100, ms(200)).await, Ok(()));
    assert_eq!(start.elapsed(), ms(800));
    assert_eq!(
        limiter.acquire_timeout(1, Duration::from_secs(19)).await,
        Err(AcquireError::Timeout)
    );
    assert_eq!(limiter.acquire_timeout(1, Duration::MAX).await, Ok(()));
    assert_eq!(start.elapsed(), ms(20_800));
    assert_eq!(limiter.acquire_timeout(0, Duration::ZERO).await, Ok(()));
}

#[tokio::test(start_paused = true)]
async fn concurrent_waiters_are_served_in_call_order() {
    let limiter = bursty(10.0);
    let log = GrantLog::new();
    let sizes = [1, 5, 1, 2, 1];
    let tasks: Vec<_> = sizes
        .iter()
        .enumerate()
        .map(|(who, &n)| {
            let limiter = limiter.clone();
            let log = log.clone();
            tokio::spawn(async move {
                limiter.acquire_many(n).await.unwrap();
                log.record_for(who, n);
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(log.order(), [0, 1, 2, 3, 4]);
    // Each pays for the one before: 1 → 100 ms, 5 → 500 ms, ...
    assert_eq!(log.offsets(), [0, 100, 600, 700, 900].map(ms));
    // Many tasks, many rounds: the rate holds and every task gets its share.
    let limiter = bursty(50.0);
    let log = record_acquires(&limiter, 8, 10).await;
    assert_eq!(log.per_who(), [10; 8]);
    assert_eq!(log.offsets().last(), Some(&ms(79 * 20)));
    log.assert_rate(Rate::per_second(50), 1, Duration::ZERO);
}

#[tokio::test(start_paused = true)]
async fn close_fails_waiters_promptly_and_later_calls() {
    let limiter = warming_up(1.0, Duration::from_secs(10), 3.0);
    let start = Instant::now();
    limiter.acquire().await.unwrap();
    let mut waiter = task::spawn(limiter.acquire());
    assert_pending!(waiter.poll());
    let mut other = task::spawn(limiter.acquire_timeout(1, Duration::MAX));
    assert_pending!(other.poll());
    time::sleep(ms(10)).await;
    assert!(!limiter.is_closed());
    limiter.close();
    assert!(limiter.is_closed());
    assert!(waiter.is_woken());
    assert!(other.is_woken());
    assert_eq!(assert_ready!(waiter.poll()), Err(AcquireError::Closed));
    assert_eq!(assert_ready!(other.poll()), Err(AcquireError::Closed));
    assert_eq!(start.elapsed(), ms(10));
    assert_eq!(limiter.acquire().await, Err(AcquireError::Closed));
    assert_eq!(limiter.acquire_many(0).await, Err(AcquireError::Closed));
    assert_eq!(
        limiter.acquire_timeout(1, ms(1)).await,
        Err(AcquireError::Closed)
    );
    assert_eq!(limiter.try_acquire(), Err(TryAcquireError::Closed));
    assert_eq!(limiter.try_acquire_many(0), Err(TryAcquireError::Closed));
    limiter.close(); // idempotent
    // Clones share the state.
    let clone = limiter.clone();
    assert!(clone.is_closed());
}

#[tokio::test(start_paused = true)]
async fn dropped_tail_reservation_is_withdrawn() {
    let limiter = bursty(10.0);
    limiter.acquire().await.unwrap(); // debt until 100 ms
    let before = format!("{limiter:?}");
    let mut waiter = task::spawn(limiter.acquire_many(5)); // due at 100 ms
    assert_pending!(waiter.poll());
    assert_eq!(limiter.try_acquire(), limited(ms(600)));
    drop(waiter);
    // As if it had never arrived.
    assert_eq!(format!("{limiter:?}"), before);
    assert_eq!(limiter.try_acquire(), limited(ms(100)));
    // After waiting part of its turn too: the state goes back to before its
    // reservation, and the idle time since then counts as idle time.
    let start = Instant::now();
    let mut waiter = task::spawn(limiter.acquire()); // due at 100 ms
    assert_pending!(waiter.poll());
    time::sleep(ms(60)).await;
    drop(waiter);
    assert_eq!(limiter.try_acquire(), limited(ms(40)));
    time::sleep(ms(40 + 300)).await; // 300 ms idle: 3 stored permits
    assert_eq!(start.elapsed(), ms(400));
    assert!((limiter.stored_permits() - 3.0).abs() < 1e-12);
}

#[tokio::test(start_paused = true)]
async fn dropped_reservations_withdraw_from_the_tail_back() {
    let limiter = bursty(10.0);
    limiter.acquire().await.unwrap();
    let mut a = task::spawn(limiter.acquire()); // due at 100 ms
    let mut b = task::spawn(limiter.acquire_many(2)); // due at 200 ms
    assert_pending!(a.poll());
    assert_pending!(b.poll());
    assert_eq!(limiter.try_acquire(), limited(ms(400)));
    // Dropped newest first, each is the tail when it goes.
    drop(b);
    assert_eq!(limiter.try_acquire(), limited(ms(200)));
    drop(a);
    assert_eq!(limiter.try_acquire(), limited(ms(100)));
}

#[tokio::test(start_paused = true)]
async fn dropped_waiter_moves_the_ones_after_it_forward() {
    let limiter = bursty(10.0);
    let start = Instant::now();
    limiter.acquire().await.unwrap();
    let mut big = task::spawn(limiter.acquire_many(3)); // due at 100 ms
    let mut next = task::spawn(limiter.acquire()); // due at 400 ms
    let mut last = task::spawn(limiter.acquire()); // due at 500 ms
    assert_pending!(big.poll());
    assert_pending!(next.poll());
    assert_pending!(last.poll());
    assert_eq!(limiter.stats().waiting, 3);
    time::sleep(ms(50)).await;
    drop(big);
    // `big` gives back its whole cost (300 ms): `next` goes at 100 ms,
    // `last` at 200 ms, and the debt ends at 300 ms instead of 600 ms.
    assert!(next.is_woken() && last.is_woken(), "their turn moved");
    assert_eq!(limiter.stats().waiting, 2);
    assert_eq!(limiter.try_acquire(), limited(ms(250)));
    assert_pending!(next.poll());
    assert_pending!(last.poll());
    time::sleep(ms(49)).await;
    assert_pending!(next.poll());
    time::sleep(ms(1)).await;
    assert_ready!(next.poll()).unwrap();
    assert_eq!(start.elapsed(), ms(100));
    time::sleep(ms(99)).await;
    assert_pending!(last.poll());
    time::sleep(ms(1)).await;
    assert_ready!(last.poll()).unwrap();
    assert_eq!(start.elapsed(), ms(200));
    assert_eq!(limiter.try_acquire(), limited(ms(100)));
    assert_eq!(limiter.stats().waiting, 0);
}

#[tokio::test(start_paused = true)]
async fn dropped_waiter_after_its_turn_gives_back_only_the_rest() {
    let limiter = bursty(10.0);
    let start = Instant::now();
    limiter.acquire().await.unwrap();
    let mut big = task::spawn(limiter.acquire_many(3)); // due at 100 ms, costs 300 ms
    let mut next = task::spawn(limiter.acquire()); // due at 400 ms
    assert_pending!(big.poll());
    assert_pending!(next.poll());
    // At 250 ms `big`'s turn has come but it was never polled: its permits
    // were there from 100 ms, so 150 ms of its cost are gone; the other
    // 150 ms are given back, and `next` is due at once.
    time::sleep(ms(250)).await;
    drop(big);
    assert!(next.is_woken());
    assert_ready!(next.poll()).unwrap();
    assert_eq!(start.elapsed(), ms(250));
    assert_eq!(limiter.try_acquire(), limited(ms(100)));
}

#[tokio::test(start_paused = true)]
async fn dropped_waiter_gives_back_its_time_after_a_rate_change() {
    let limiter = bursty(10.0);
    let start = Instant::now();
    limiter.acquire().await.unwrap();
    let mut a = task::spawn(limiter.acquire()); // due at 100 ms, costs 100 ms
    let mut b = task::spawn(limiter.acquire()); // due at 200 ms
    assert_pending!(a.poll());
    assert_pending!(b.poll());
    // The debt incurred stands at the old rate; new requests cost 1 s.
    limiter.set_rate(1.0).unwrap();
    let mut c = task::spawn(limiter.acquire()); // due at 300 ms, costs 1 s
    assert_pending!(c.poll());
    assert_eq!(limiter.try_acquire(), limited(ms(1300)));
    drop(a); // gives back its 100 ms: b at 100 ms, c at 200 ms
    assert_eq!(limiter.try_acquire(), limited(ms(1200)));
    drop(b); // and b's: c at 100 ms
    assert_eq!(limiter.try_acquire(), limited(ms(1100)));
    time::sleep(ms(100)).await;
    assert_ready!(c.poll()).unwrap();
    assert_eq!(start.elapsed(), ms(100));
    assert_eq!(limiter.try_acquire(), limited(ms(1000)));
}

#[tokio::test(start_paused = true)]
async fn dropped_reservation_gives_back_its_time_not_its_stored_permits() {
    let limiter = bursty(10.0);
    let start = Instant::now();
    time::sleep(ms(200)).await; // two permits stored
    assert_eq!(limiter.stored_permits(), 2.0);
    // Three permits: two stored (free) and one fresh (100 ms, paid later).
    let held = limiter.reserve(3).await.unwrap();
    let mut next = task::spawn(limiter.acquire()); // due at 300 ms
    assert_pending!(next.poll());
    drop(held);
    // The fresh permit's 100 ms are given back: `next` goes at once. The
    // stored permits it took stay spent (re-pricing the requests after it
    // is beyond Guava's model; keeping them spent only slows the limiter).
    assert_ready!(next.poll()).unwrap();
    assert_eq!(start.elapsed(), ms(200));
    assert_eq!(limiter.stored_permits(), 0.0);
    assert_eq!(limiter.try_acquire(), limited(ms(100)));
}

#[tokio::test(start_paused = true)]
async fn dropped_waiter_gives_back_its_warm_up_cost() {
    // 10/s warming up over 1 s, cold factor 3: cold permits cost 280, 240,
    // 200 … ms (see the SmoothWarmingUp example).
    let limiter = warming_up(10.0, Duration::from_secs(1), 3.0);
    let start = Instant::now();
    limiter.acquire().await.unwrap(); // free; the next pays 280 ms
    let mut a = task::spawn(limiter.acquire()); // due at 280 ms, costs 240 ms
    let mut b = task::spawn(limiter.acquire()); // due at 520 ms
    assert_pending!(a.poll());
    assert_pending!(b.poll());
    drop(a);
    // b moves up by a's 240 ms, and keeps its own (cheaper) price: the
    // stored permit a took stays spent, the limiter is that much warmer.
    time::sleep(ms(280)).await;
    assert_ready!(b.poll()).unwrap();
    assert_eq!(start.elapsed(), ms(280));
    assert_eq!(limiter.try_acquire(), limited(ms(200)));
}

#[tokio::test(start_paused = true)]
async fn dropped_tail_after_its_turn_gives_back_idle_time() {
    // Withdrawn at its due time, never polled: the time since the debt
    // before it was paid counts as idle.
    let limiter = bursty(10.0);
    limiter.acquire().await.unwrap();
    let mut a = task::spawn(limiter.acquire()); // due at 100 ms
    assert_pending!(a.poll());
    time::sleep(ms(300)).await;
    drop(a);
    assert!((limiter.stored_permits() - 2.0).abs() < 1e-12);
    for _ in 0..3 {
        assert_eq!(limiter.try_acquire(), Ok(()));
    }
    assert_eq!(limiter.try_acquire(), limited(ms(100)));
}

#[tokio::test(start_paused = true)]
async fn through_the_limiter_trait() {
    let limiters: Vec<Arc<dyn Limiter>> = vec![
        Arc::new(bursty(10.0)),
        Arc::new(warming_up(10.0, Duration::ZERO, 3.0)),
    ];
    for limiter in limiters {
        let start = Instant::now();
        limiter.acquire().await.unwrap();
        limiter.acquire_many(2).await.unwrap();
        limiter.acquire_timeout(1, ms(200)).await.unwrap();
        assert_eq!(start.elapsed(), ms(300));
        assert_eq!(limiter.try_acquire(), limited(ms(100)));
        assert_eq!(limiter.try_acquire_many(0), Ok(()));
        assert_eq!(
            limiter.acquire_timeout(1, ms(99)).await,
            Err(AcquireError::Timeout)
        );
        let log = record_acquires(&limiter, 3, 2).await;
        assert_eq!(log.offsets().last(), Some(&ms(600)));
    }
}

#[test]
fn builds_and_answers_outside_a_runtime() {
    let built = Instant::now();
    let limiter = bursty(2.0);
    let warm = warming_up(2.0, Duration::from_secs(1), 3.0);
    assert_eq!(limiter.try_acquire(), Ok(()));
    assert!(matches!(
        limiter.try_acquire(),
        Err(TryAcquireError::Limited { retry_after }) if retry_after <= ms(500) && retry_after > ms(400)
    ));
    assert_eq!(warm.try_acquire(), Ok(()));
    assert!(!format!("{limiter:?}").is_empty());
    // Later used inside a runtime. Built outside any runtime, the limiter
    // reads the fast clock (where there is one), not a paused runtime's: a
    // runtime in real time, then, and the waits are only checked never to
    // end early.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    rt.block_on(async {
        limiter.acquire().await.unwrap(); // waits for the first one's cost
        limiter.acquire().await.unwrap();
        // Permits at 0, 500 and 1000 ms after the limiter was built (within
        // the fast clock's microseconds of the OS clock).
        assert!(built.elapsed() >= ms(999), "{:?}", built.elapsed());
        warm.acquire().await.unwrap();
    });
}

#[tokio::test(start_paused = true)]
async fn bad_input_is_a_config_error() {
    for rate in [
        f64::NAN,
        0.0,
        -0.0,
        -1.0,
        f64::INFINITY,
        f64::NEG_INFINITY,
        2e9,
    ] {
        let bursty = SmoothBursty::builder().permits_per_second(rate).build();
        assert!(
            matches!(bursty, Err(ConfigError::InvalidRate { .. })),
            "{rate}"
        );
        let warm = SmoothWarmingUp::builder()
            .permits_per_second(rate)
            .warmup(ms(10))
            .build();
        assert!(
            matches!(warm, Err(ConfigError::InvalidRate { .. })),
            "{rate}"
        );
    }
    for cold_factor in [0.5, 0.0, -3.0, f64::NAN, f64::INFINITY] {
        let warm = SmoothWarmingUp::builder()
            .permits_per_second(1.0)
            .warmup(ms(10))
            .cold_factor(cold_factor)
            .build();
        assert!(
            matches!(
                warm,
                Err(ConfigError::InvalidParameter {
                    name: "cold_factor",
                    ..
                })
            ),
            "{cold_factor}"
        );
    }
    assert_eq!(
        SmoothBursty::builder().build().unwrap_err(),
        ConfigError::MissingRate
    );
    assert_eq!(
        SmoothWarmingUp::builder()
            .warmup(ms(1))
            .build()
            .unwrap_err(),
        ConfigError::MissingRate
    );
    assert!(matches!(
        SmoothWarmingUp::builder().permits_per_second(1.0).build(),
        Err(ConfigError::InvalidParameter { name: "warmup", .. })
    ));
    // Rates above 10⁶/s keep limiting (Guava's would let everything through).
    let fast = bursty(2e6);
    fast.try_acquire().unwrap();
    assert_eq!(fast.try_acquire(), limited(Duration::from_nanos(500)));
}

#[tokio::test(start_paused = true)]
async fn zero_warm_up_keeps_limiting() {
    // Guava's stored permits become NaN here and it stops limiting; this
    // limiter stores nothing and paces at the stable rate.
    let limiter = warming_up(10.0, Duration::ZERO, 3.0);
    assert_eq!(limiter.stored_permits(), 0.0);
    assert_eq!(waits(&limiter, 4).await, [0, 100, 100, 100].map(ms));
    time::sleep(Duration::from_secs(60)).await;
    assert_eq!(limiter.stored_permits(), 0.0);
    assert_eq!(waits(&limiter, 3).await, [0, 100, 100].map(ms));
    let log = record_acquires(&limiter, 4, 5).await;
    log.assert_rate(Rate::per_second(10), 1, Duration::ZERO);
}

#[tokio::test(start_paused = true)]
async fn acquire_loops_deliver_high_rates_despite_the_timer_tick() {
    // tokio wakes sleepers on 1 ms ticks; at 100 000/s a caller that asks
    // again right after a late wake is taken as on time, so a single
    // task's acquire loop still gets the full rate (not 2 per tick).
    let makers: [fn() -> Arc<dyn Limiter>; 3] = [
        || Arc::new(warming_up(100_000.0, ms(10), 3.0)),
        || {
            Arc::new(
                SmoothBursty::builder()
                    .permits_per_second(100_000.0)
                    .max_burst(Duration::ZERO)
                    .build()
                    .unwrap(),
            )
        },
        || Arc::new(bursty(100_000.0)),
    ];
    for make in makers {
        let limiter = make();
        let start = Instant::now();
        let mut granted = 0u64;
        while start.elapsed() < Duration::from_secs(1) {
            limiter.acquire().await.unwrap();
            granted += 1;
        }
        // 100 000 in the second, less the warm-up's extra cost (5 ms = 500
        // permits) and the last tick.
        assert!((98_900..=100_100).contains(&granted), "{granted}");
    }
}

#[tokio::test(start_paused = true)]
async fn late_wake_credit_is_not_idle_time() {
    // A waiter due at 10 µs wakes on the 1 ms tick. The caller asking again
    // then is on time: the limiter does not count the overslept time as
    // idle (no cooling), so the warm-up continues where it was.
    let limiter = warming_up(100_000.0, ms(10), 3.0);
    limiter.acquire().await.unwrap();
    let before = limiter.stored_permits();
    limiter.acquire().await.unwrap(); // due at ~30 µs, wakes at 1 ms
    assert!(limiter.stored_permits() <= before);
    // A genuinely idle caller (longer than a tick after the late wake)
    // does cool it down.
    time::sleep(ms(5)).await;
    assert!(limiter.stored_permits() > before);
}

#[tokio::test(start_paused = true)]
async fn late_wake_credit_holds_for_try_acquire_too() {
    // As above, the caller coming back with `try_acquire` (the meter's
    // path): a warm-up limiter at 100 000/s cools by a permit per 10 µs of
    // idle time, so the 970 µs the waiter overslept would add about 97
    // cold permits; taken as on time, the grant only spends one.
    let limiter = warming_up(100_000.0, ms(10), 3.0);
    limiter.acquire().await.unwrap();
    let start = Instant::now();
    limiter.acquire().await.unwrap(); // due at ~30 µs, wakes at 1 ms
    assert_eq!(start.elapsed(), ms(1), "woken on the tick");
    let before = limiter.stored_permits();
    limiter.try_acquire().unwrap();
    let after = limiter.stored_permits();
    assert!(
        after <= before,
        "{after} > {before}: the late wake cooled it"
    );
}

#[test]
fn handles_and_futures_are_send_sync() {
    fn send_sync<T: Send + Sync + Clone + std::fmt::Debug + Unpin + 'static>(_: &T) {}
    fn send<T: Send>(_: &T) {}
    let b = SmoothBursty::builder()
        .permits_per_second(1.0)
        .build()
        .unwrap();
    let w = SmoothWarmingUp::builder()
        .permits_per_second(1.0)
        .warmup(ms(1))
        .build()
        .unwrap();
    send_sync(&b);
    send_sync(&w);
    send(&b.acquire());
    send(&b.acquire_many(2));
    send(&b.acquire_timeout(1, ms(1)));
    send(&w.acquire());
    send(&w.acquire_timeout(1, ms(1)));
}

/// 1e6 / 100 500 per second: Guava's stable interval is 100 500 µs
/// (100 500.000…01 as a double, truncated).
fn every_100_5_ms() -> SmoothBursty {
    bursty(1e6 / 100_500.0)
}

#[tokio::test(start_paused = true)]
async fn a_waiter_timer_looks_a_tick_before_its_turn() {
    // Due at 100.5 ms: the waiter's timer is first armed a tick early (at
    // 99.5 ms, fired on the 100 ms tick), finds its turn not come, and is
    // armed for the turn, which tokio fires on the 101 ms tick.
    let limiter = every_100_5_ms();
    let start = Instant::now();
    limiter.acquire().await.unwrap();
    let mut w = task::spawn(limiter.acquire());
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
    assert_ready!(w.poll()).unwrap();
    assert_eq!(start.elapsed(), ms(101));
}

#[tokio::test(start_paused = true)]
async fn a_tick_processed_after_the_turn_releases_the_waiter_then() {
    // In real time tokio processes a tick some way into the millisecond;
    // here the 100 ms tick is processed at 100.5 ms (one jump of the
    // clock): the early timer wakes the waiter, whose turn has come, so it
    // goes then rather than on the 101 ms tick.
    let limiter = every_100_5_ms();
    let start = Instant::now();
    limiter.acquire().await.unwrap();
    let mut w = task::spawn(limiter.acquire());
    assert_pending!(w.poll());
    time::advance(Duration::from_micros(100_500)).await;
    assert!(w.is_woken());
    assert_ready!(w.poll()).unwrap();
    assert_eq!(start.elapsed(), Duration::from_micros(100_500));
}
