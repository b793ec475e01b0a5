//! Property tests of the smooth limiters: once warm, grants are spaced by
//! `1 / rate` (Guava's stable interval truncated to the microsecond for
//! `SmoothState`, within tokio's 1 ms timer tick for the async limiter);
//! and over any window of length `T`, a bursty limiter never grants more
//! than `max_burst × rate + rate × T` permits plus one request (the one that
//! pays later), a warm-up limiter never more than `rate × T` plus one
//! request — driving `SmoothState` directly with random arrivals and
//! weights, and the async limiters in paused time.
//!
//! Cancellation: a dropped waiter gives back its turn — with pure pacing,
//! exactly its weight × the interval, and every waiter after it moves up by
//! that much (checked against a model); with random bursts and warm-ups,
//! the survivors still keep the window bound and their order.
//!
//! The limiters reproduce Guava's arithmetic, which truncates each cost
//! term to a whole microsecond: a request can cost up to 1 µs less than its
//! weight / rate per term (at 0.1/s, `1e6 / 0.1` is 9 999 999.999… µs as a
//! double, so a permit costs 9.999 999 s). So the bounds allow that much
//! per request (in the window, or so far).

use std::time::Duration;

use std::sync::Arc;
use std::task::Poll;

use proptest::prelude::*;
use tokio::time::Instant;
use tokio_ratelimit::algorithm::SmoothState;
use tokio_ratelimit::{Limiter, Rate, SmoothBursty, SmoothWarmingUp, TryAcquireError};
use tokio_test::task;

/// The rate as the exact fraction the limiters use: (permits, period in ns).
fn exact(rate: f64) -> (u128, u128) {
    let r = Rate::per_second_f64(rate);
    (u128::from(r.permits()), r.period().as_nanos())
}

/// A rate in permits per second, 0.1/s to 100 000/s: round and awkward
/// values, and log-uniform random ones.
fn rate() -> impl Strategy<Value = f64> {
    prop_oneof![
        prop::sample::select(vec![
            0.1, 0.3, 1.0, 3.0, 7.0, 10.0, 33.0, 999.0, 1000.0, 12_345.0, 100_000.0
        ]),
        (-1.0f64..5.0).prop_map(|e| 10f64.powf(e)),
    ]
}

/// A warm-up period, 1 ms to 100 s, log-uniform.
fn warmup() -> impl Strategy<Value = Duration> {
    (0.0f64..5.0).prop_map(|e| Duration::from_secs_f64(10f64.powf(e) / 1000.0))
}

fn cold_factor() -> impl Strategy<Value = f64> {
    prop_oneof![Just(1.0), Just(3.0), 1.0f64..20.0]
}

/// One caller: arrives `gap` after the previous one, asks for `weight`
/// permits, by `acquire` or by `try_acquire`.
#[derive(Debug, Clone, Copy)]
struct Arrival {
    /// In stable intervals, or (when `idle`) in units of the max burst.
    gap: f64,
    idle: bool,
    weight: u32,
    try_only: bool,
}

fn arrivals(len: usize) -> impl Strategy<Value = Vec<Arrival>> {
    let one = (
        0.0f64..3.0,
        prop::bool::weighted(0.08),
        prop_oneof![4 => 1u32..=4, 1 => 5u32..=40],
        any::<bool>(),
    )
        .prop_map(|(gap, idle, weight, try_only)| Arrival {
            gap,
            idle,
            weight,
            try_only,
        });
    prop::collection::vec(one, 1..len)
}

fn gap(a: &Arrival, rate: f64, max_burst: Duration) -> Duration {
    if a.idle {
        max_burst.mul_f64(a.gap) + Duration::from_secs_f64(a.gap / rate)
    } else {
        Duration::from_secs_f64(a.gap / rate)
    }
}

/// Which request of a window may be left out of the count.
#[derive(Clone, Copy)]
enum Exclude {
    /// The last reserved (grants are in reservation order).
    Last,
    /// The heaviest (grants are in time order; ties may be in any order).
    Heaviest,
}

/// How much cheaper than weight / rate a request can be, from Guava's
/// truncation of each cost term to a microsecond: bursty, 1 µs (its fresh
/// permits; stored ones are free); warm-up, 3 µs (its stored permits above
/// the threshold, those below, and its fresh ones).
const BURSTY_TRUNCATION: Duration = Duration::from_micros(1);
const WARM_UP_TRUNCATION: Duration = Duration::from_micros(3);

/// Checks every window `[g_i, g_j]` of the grants `(time, permits)`: all its
/// permits but one request's are at most `rate × (burst + (g_j − g_i) +
/// slack + per_request × the requests in it)`, exactly. Returns the first
/// violation.
fn window_violation(
    grants: &[(Duration, u64)],
    rate: f64,
    (burst, slack, per_request): (Duration, Duration, Duration),
    exclude: Exclude,
) -> Option<String> {
    let (permits, period) = exact(rate);
    for i in 0..grants.len() {
        let (mut sum, mut heaviest) = (0u128, 0u128);
        for j in i..grants.len() {
            let w = u128::from(grants[j].1);
            sum += w;
            heaviest = heaviest.max(w);
            let counted = match exclude {
                Exclude::Last => sum - w,
                Exclude::Heaviest => sum - heaviest,
            };
            let span = grants[j].0.saturating_sub(grants[i].0);
            let requests = u32::try_from(j - i + 1).unwrap();
            let allowed = permits * (burst + span + slack + per_request * requests).as_nanos();
            if counted * period > allowed {
                return Some(format!(
                    "{counted} permits (+1 request) in [{:?}, {:?}] at {rate}/s with a burst of {burst:?}",
                    grants[i].0, grants[j].0
                ));
            }
        }
    }
    None
}

/// Drives a state machine with the arrivals; returns the grants `(time,
/// permits)` in reservation order.
fn drive(
    state: &mut SmoothState,
    arrivals: &[Arrival],
    max_burst: Duration,
) -> Vec<(Duration, u64)> {
    let rate = state.rate();
    let mut now = Duration::ZERO;
    let mut grants = Vec::new();
    for a in arrivals {
        now += gap(a, rate, max_burst);
        let wait = if a.try_only {
            state.try_reserve(now, a.weight, Duration::ZERO)
        } else {
            Some(state.reserve(now, a.weight))
        };
        if let Some(wait) = wait {
            grants.push((now + wait, u64::from(a.weight)));
        }
    }
    grants
}

/// A paused current-thread runtime.
fn paused_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    /// Once the stored permits are spent, each request is due exactly its
    /// predecessor's weight × Guava's stable interval (`1e6 / rate` µs)
    /// later, truncated to the microsecond: at most 1 µs less than weight /
    /// rate, never more.
    #[test]
    fn state_paces_at_the_stable_interval_once_warm(
        rate in rate(),
        warmup in warmup(),
        cold_factor in cold_factor(),
        bursty in any::<bool>(),
        start_ms in 0u64..10_000,
        weights in prop::collection::vec(1u32..=5, 1..200),
    ) {
        let mut state = if bursty {
            SmoothState::bursty(rate, warmup).unwrap()
        } else {
            SmoothState::warming_up(rate, warmup, cold_factor).unwrap()
        };
        let mut now = Duration::from_millis(start_ms);
        // Spend every stored permit at once (free: it pays later)...
        #[expect(clippy::cast_possible_truncation, clippy::cast_sign_loss, reason = "test values that fit")]
        let all = state.max_permits().ceil() as u32 + 1;
        prop_assert_eq!(state.reserve(now, all), Duration::ZERO);
        // ...and the next request pays for them.
        now += state.reserve(now, 1);
        let (permits, period) = exact(rate);
        let mut previous = 1; // the weight the next wait pays for
        for &w in &weights {
            let wait = state.reserve(now, w);
            now += wait;
            // Guava's `(long) (freshPermits * stableIntervalMicros)`.
            #[expect(clippy::cast_possible_truncation, clippy::cast_sign_loss, reason = "test values that fit")]
            let guava = Duration::from_micros((f64::from(previous) * (1e6 / rate)) as u64);
            prop_assert_eq!(wait, guava);
            // `previous / rate` (exactly: the rate as a fraction, 1 ns of
            // slack for that fraction), less than 1 µs cheaper.
            let exact_ns = u128::from(previous) * period; // × 1/permits
            let actual_ns = wait.as_nanos() * permits;
            prop_assert!(
                actual_ns <= exact_ns + permits && actual_ns + 1000 * permits > exact_ns,
                "{:?} for {} permits, want {}/{} ns", wait, previous, exact_ns, permits
            );
            previous = w;
        }
    }

    /// Over any window, a bursty limiter grants at most its stored burst
    /// plus the rate, plus one request; the exact times are those of the
    /// waits (to the nanosecond).
    #[test]
    fn state_bursty_window_bound(
        rate in rate(),
        max_burst in prop_oneof![Just(Duration::from_secs(1)), (0u64..3000).prop_map(Duration::from_millis)],
        arrivals in arrivals(200),
    ) {
        let mut state = SmoothState::bursty(rate, max_burst).unwrap();
        let grants = drive(&mut state, &arrivals, max_burst);
        // 2 ns of slack for the rate as a fraction.
        let slack = (max_burst, Duration::from_nanos(2), BURSTY_TRUNCATION);
        let v = window_violation(&grants, rate, slack, Exclude::Last);
        prop_assert!(v.is_none(), "{}", v.unwrap_or_default());
    }

    /// A warm-up limiter never grants faster than its stable rate (plus the
    /// one request that pays later): its stored permits are never free.
    #[test]
    fn state_warm_up_window_bound(
        rate in rate(),
        warmup in warmup(),
        cold_factor in cold_factor(),
        arrivals in arrivals(200),
    ) {
        let mut state = SmoothState::warming_up(rate, warmup, cold_factor).unwrap();
        let grants = drive(&mut state, &arrivals, warmup);
        let slack = (Duration::ZERO, Duration::from_nanos(2), WARM_UP_TRUNCATION);
        let v = window_violation(&grants, rate, slack, Exclude::Last);
        prop_assert!(v.is_none(), "{}", v.unwrap_or_default());
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, ..ProptestConfig::default() })]

    /// The async bursty limiter in paused time, callers arriving at random
    /// (each its own task, so waiters overlap): the same bound, with one
    /// timer tick of slack.
    #[test]
    fn async_bursty_window_bound(
        rate in prop_oneof![Just(10.0), Just(3.0), Just(250.0), Just(5000.0), 1.0f64..2000.0],
        max_burst in prop_oneof![Just(Duration::from_secs(1)), (0u64..2000).prop_map(Duration::from_millis)],
        arrivals in arrivals(80),
    ) {
        let grants = paused_runtime().block_on(async {
            let limiter = SmoothBursty::builder()
                .permits_per_second(rate)
                .max_burst(max_burst)
                .build()
                .unwrap();
            let start = Instant::now();
            let mut tasks = Vec::new();
            for a in &arrivals {
                tokio::time::sleep(gap(a, rate, max_burst)).await;
                let limiter = limiter.clone();
                let a = *a;
                tasks.push(tokio::spawn(async move {
                    let ok = if a.try_only {
                        limiter.try_acquire_many(a.weight).is_ok()
                    } else {
                        limiter.acquire_many(a.weight).await.is_ok()
                    };
                    ok.then(|| (start.elapsed(), u64::from(a.weight)))
                }));
            }
            let mut grants = Vec::new();
            for t in tasks {
                grants.extend(t.await.unwrap());
            }
            grants.sort_by_key(|g| g.0);
            grants
        });
        let slack = (max_burst, Duration::from_millis(1), BURSTY_TRUNCATION);
        let v = window_violation(&grants, rate, slack, Exclude::Heaviest);
        prop_assert!(v.is_none(), "{}", v.unwrap_or_default());
    }

    /// The async warm-up limiter in paused time: once warm, the grants of
    /// an acquire loop are `1 / rate` apart, within tokio's 1 ms tick, and
    /// with a drift of at most 1 µs per permit (Guava's truncation).
    #[test]
    fn async_warm_up_paces_once_warm(
        rate in prop_oneof![Just(1.0), Just(3.0), Just(7.0), Just(500.0), 1.0f64..500.0],
        warmup in (0u64..=2000).prop_map(Duration::from_millis),
        cold_factor in cold_factor(),
    ) {
        let times = paused_runtime().block_on(async {
            let limiter = SmoothWarmingUp::builder()
                .permits_per_second(rate)
                .warmup(warmup)
                .cold_factor(cold_factor)
                .build()
                .unwrap();
            #[expect(clippy::cast_possible_truncation, clippy::cast_sign_loss, reason = "test values that fit")]
            let all = limiter.stored_permits().ceil() as u32 + 1;
            limiter.acquire_many(all).await.unwrap();
            limiter.acquire().await.unwrap(); // pays for the stored permits
            let start = Instant::now();
            let mut times = Vec::new();
            for _ in 0..30 {
                limiter.acquire().await.unwrap();
                times.push(start.elapsed());
            }
            times
        });
        let (permits, period) = exact(rate);
        for (k, t) in times.iter().enumerate() {
            let k = k as u128 + 1;
            let exact_ns = k * period; // × 1/permits
            let tick = (Duration::from_millis(1).as_nanos() + 1000 * k) * permits;
            prop_assert!(
                (t.as_nanos() * permits).abs_diff(exact_ns) <= tick,
                "grant {} at {:?}, want {}/{} ns", k, t, exact_ns, permits
            );
        }
    }
}

/// Rates whose interval is a whole number of milliseconds (and of
/// microseconds: Guava's truncation costs nothing), so that every turn
/// falls on a timer tick.
const WHOLE_MS_RATES: [f64; 14] = [
    1.0, 2.0, 4.0, 5.0, 8.0, 10.0, 20.0, 25.0, 40.0, 50.0, 100.0, 200.0, 500.0, 1000.0,
];

/// A smooth limiter that paces at `rate` and stores nothing.
fn pacing(rate: f64, warm_up: bool) -> Arc<dyn Limiter> {
    if warm_up {
        Arc::new(
            SmoothWarmingUp::builder()
                .permits_per_second(rate)
                .warmup(Duration::ZERO)
                .build()
                .unwrap(),
        )
    } else {
        Arc::new(
            SmoothBursty::builder()
                .permits_per_second(rate)
                .max_burst(Duration::ZERO)
                .build()
                .unwrap(),
        )
    }
}

/// Waiter `k` of `weights` asks at 0, in order, and gives up at
/// `give_up[k]` (ms since the start) if its turn has not come by then
/// (biased: at its turn it is granted). Returns when each was granted (ms
/// since the start; `None`: gave up), the instant all were done, and the
/// limiter's `try_acquire()` then.
async fn give_up_at(
    limiter: Arc<dyn Limiter>,
    weights: &[u32],
    give_up: &[Option<u64>],
) -> (Vec<Option<u128>>, u128, Result<(), TryAcquireError>) {
    let start = Instant::now();
    let mut granted = vec![None; weights.len()];
    let mut handles = vec![];
    for (k, (&n, &at)) in weights.iter().zip(give_up).enumerate() {
        let l = Arc::clone(&limiter);
        let mut t = task::spawn(async move {
            let acquire = l.acquire_many(n);
            let done = match at {
                None => Some(acquire.await),
                Some(at) => tokio::select! {
                    biased;
                    r = acquire => Some(r),
                    () = tokio::time::sleep_until(start + Duration::from_millis(at)) => None,
                },
            };
            done.map(|r| {
                r.unwrap();
                start.elapsed().as_millis()
            })
        });
        // The first poll makes the reservation: in order.
        match t.poll() {
            Poll::Ready(g) => granted[k] = g,
            Poll::Pending => handles.push((k, tokio::spawn(t))),
        }
    }
    for (k, h) in handles {
        granted[k] = h.await.unwrap();
    }
    let done = start.elapsed().as_millis();
    (granted, done, limiter.try_acquire())
}

/// The model of [`give_up_at`] with pure pacing at `interval_ms`: waiter
/// `k`'s turn is the previous one's plus its weight × the interval (the
/// first is free); a waiter that gives up before its turn gives back its
/// whole cost, and every waiter after it moves up by that much. Returns the
/// grants and when the debt of the survivors ends.
fn give_up_model(
    interval_ms: u128,
    weights: &[u32],
    give_up: &[Option<u64>],
) -> (Vec<Option<u128>>, u128) {
    let n = weights.len();
    let cost = |k: usize| u128::from(weights[k]) * interval_ms;
    let mut turn: Vec<u128> = (0..n).map(|k| (0..k).map(cost).sum()).collect();
    let mut gone = vec![false; n];
    let mut events: Vec<(u64, usize)> = give_up
        .iter()
        .enumerate()
        .filter_map(|(k, at)| at.map(|at| (at, k)))
        .collect();
    events.sort_unstable();
    for (at, k) in events {
        if turn[k] <= u128::from(at) {
            continue; // granted first
        }
        gone[k] = true;
        for later in &mut turn[k + 1..] {
            *later -= cost(k);
        }
    }
    let survivors = (0..n).filter(|&k| !gone[k]);
    let debt_end = survivors.map(|k| turn[k] + cost(k)).max().unwrap_or(0);
    let grants = (0..n).map(|k| (!gone[k]).then_some(turn[k])).collect();
    (grants, debt_end)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// Pure pacing (no stored permits, bursty or warm-up), waiters all
    /// asking at 0, some giving up at random milliseconds: exactly the
    /// model's grants — every waiter that gives up before its turn gives
    /// back its whole cost at once, and those after it move up by as much —
    /// and afterwards the debt ends exactly where the survivors' weights
    /// alone put it (nothing lost, nothing gained).
    #[test]
    fn given_up_turns_go_to_the_waiters_after(
        rate in prop::sample::select(WHOLE_MS_RATES.to_vec()),
        warm_up in any::<bool>(),
        waiters in prop::collection::vec((1u32..=5, prop::option::of(any::<u64>())), 1..12),
    ) {
        #[expect(clippy::cast_possible_truncation, clippy::cast_sign_loss, reason = "test values that fit")]
        let interval_ms = (1000.0 / rate) as u128;
        let weights: Vec<u32> = waiters.iter().map(|w| w.0).collect();
        let total: u128 = weights.iter().map(|&w| u128::from(w) * interval_ms).sum();
        let span = u64::try_from(total).unwrap() + 2;
        let give_up: Vec<Option<u64>> = waiters.iter().map(|w| w.1.map(|at| at % span)).collect();
        let (grants, done, after) = paused_runtime()
            .block_on(async { give_up_at(pacing(rate, warm_up), &weights, &give_up).await });
        let (want, debt_end) = give_up_model(interval_ms, &weights, &give_up);
        prop_assert_eq!(&grants, &want);
        let owed = debt_end.saturating_sub(done);
        if owed == 0 {
            prop_assert_eq!(after, Ok(()));
        } else {
            let retry_after = Duration::from_millis(u64::try_from(owed).unwrap());
            prop_assert_eq!(after, Err(TryAcquireError::Limited { retry_after }));
        }
    }

    /// Random bursts and warm-ups, callers arriving at random (each its own
    /// task), some giving up after a random wait: the survivors keep the
    /// window bound (one timer tick of slack) and are granted in the order
    /// they asked.
    #[test]
    fn survivors_of_given_up_waiters_keep_the_bound_and_order(
        rate in prop_oneof![Just(10.0), Just(3.0), Just(250.0), 1.0f64..2000.0],
        burst in prop_oneof![Just(Duration::from_secs(1)), (0u64..2000).prop_map(Duration::from_millis)],
        warm_up in any::<bool>(),
        cold_factor in cold_factor(),
        arrivals in arrivals(60),
        patience in prop::collection::vec(prop::option::of(0u64..3000), 60),
    ) {
        let grants = paused_runtime().block_on(async {
            let limiter: Arc<dyn Limiter> = if warm_up {
                Arc::new(SmoothWarmingUp::builder().permits_per_second(rate).warmup(burst).cold_factor(cold_factor).build().unwrap())
            } else {
                Arc::new(SmoothBursty::builder().permits_per_second(rate).max_burst(burst).build().unwrap())
            };
            let start = Instant::now();
            let mut tasks = Vec::new();
            for (a, &patience) in arrivals.iter().zip(&patience) {
                tokio::time::sleep(gap(a, rate, burst)).await;
                let limiter = Arc::clone(&limiter);
                let a = *a;
                let mut t = task::spawn(async move {
                    let ok = if a.try_only {
                        limiter.try_acquire_many(a.weight).is_ok()
                    } else if let Some(ms) = patience {
                        tokio::time::timeout(Duration::from_millis(ms), limiter.acquire_many(a.weight))
                            .await
                            .is_ok()
                    } else {
                        limiter.acquire_many(a.weight).await.is_ok()
                    };
                    ok.then(|| (start.elapsed(), u64::from(a.weight)))
                });
                // The first poll makes the reservation: in arrival order.
                tasks.push(match t.poll() {
                    Poll::Ready(g) => Err(g),
                    Poll::Pending => Ok(tokio::spawn(t)),
                });
            }
            let mut grants = Vec::new();
            for t in tasks {
                match t {
                    Ok(h) => grants.extend(h.await.unwrap()),
                    Err(g) => grants.extend(g),
                }
            }
            grants
        });
        // In arrival order, the survivors' grant instants never go back.
        for pair in grants.windows(2) {
            prop_assert!(pair[0].0 <= pair[1].0, "out of order: {:?}", pair);
        }
        let (burst, truncation) = if warm_up {
            (Duration::ZERO, WARM_UP_TRUNCATION)
        } else {
            (burst, BURSTY_TRUNCATION)
        };
        let slack = (burst, Duration::from_millis(1), truncation);
        let v = window_violation(&grants, rate, slack, Exclude::Heaviest);
        prop_assert!(v.is_none(), "{}", v.unwrap_or_default());
    }
}
