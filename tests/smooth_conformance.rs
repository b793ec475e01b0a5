//! Conformance with Guava: replays the scenarios recorded from Guava 31.1's
//! real `RateLimiter` (`tests/data/guava_vectors.json`, see the README
//! there) through `algorithm::SmoothState`, with exact virtual time; then
//! hand-written edge cases and random mixes against a line-by-line port of
//! Guava's arithmetic (`mod guava`).
//!
//! `SmoothState` reproduces Guava's arithmetic bit for bit (doubles, every
//! cost truncated to a whole microsecond, `now` read in whole
//! microseconds), so everything is compared exactly: every wait to the
//! nanosecond, every `try_acquire` answer with the same timeout. The
//! recorded vectors are also checked with the README's tolerance (1 µs
//! plus 1 µs per reservation so far, given to `try_acquire` in the
//! direction of Guava's answer), which an exact replay passes trivially.
//!
//! Why exact and not finer than Guava: Guava's truncation errors are
//! amplified on the warm-up trapezoid (a microsecond less of debt is a
//! microsecond more of cooling, which makes the next cold permits cheaper
//! by up to `(c − 1)(c + 5) / (2 (c + 1))` µs, 11 µs at a cold factor of
//! 20), so arithmetic finer than Guava's leaves the tolerance on random
//! mixes with large cold factors; and beyond 2⁵³ µs of debt Guava's doubles
//! are off the exact value. Only Guava's own arithmetic matches Guava.

use std::fmt::Write as _;
use std::time::Duration;

use serde_json::Value;
use tokio_ratelimit::algorithm::SmoothState;

use guava::Model;

mod support;
use support::us;

const VECTORS: &str = include_str!("data/guava_vectors.json");

/// What the replays drive: `SmoothState`, or the port of Guava.
trait Smooth {
    /// `acquire(permits)` at `now`: the wait.
    fn acquire(&mut self, now: Duration, permits: u32) -> Duration;
    /// `tryAcquire(permits, timeout)` at `now`: the wait, if granted.
    fn try_acquire(&mut self, now: Duration, permits: u32, timeout: Duration) -> Option<Duration>;
    /// `setRate(rate)` at `now`.
    fn set_rate(&mut self, now: Duration, rate: f64);
}

impl Smooth for SmoothState {
    fn acquire(&mut self, now: Duration, permits: u32) -> Duration {
        self.reserve(now, permits)
    }

    fn try_acquire(&mut self, now: Duration, permits: u32, timeout: Duration) -> Option<Duration> {
        self.try_reserve(now, permits, timeout)
    }

    fn set_rate(&mut self, now: Duration, rate: f64) {
        SmoothState::set_rate(self, now, rate).unwrap();
    }
}

impl Smooth for Model {
    fn acquire(&mut self, now: Duration, permits: u32) -> Duration {
        Model::acquire(self, now, permits)
    }

    fn try_acquire(&mut self, now: Duration, permits: u32, timeout: Duration) -> Option<Duration> {
        Model::try_acquire(self, now, permits, timeout)
    }

    fn set_rate(&mut self, now: Duration, rate: f64) {
        Model::set_rate(self, now, rate);
    }
}

fn field<'a>(v: &'a Value, key: &str) -> &'a Value {
    v.get(key)
        .unwrap_or_else(|| panic!("missing field {key:?} in {v}"))
}

fn f64_of(v: &Value, key: &str) -> f64 {
    field(v, key)
        .as_f64()
        .unwrap_or_else(|| panic!("{key:?} is not a number in {v}"))
}

fn u64_of(v: &Value, key: &str) -> u64 {
    field(v, key)
        .as_u64()
        .unwrap_or_else(|| panic!("{key:?} is not a u64 in {v}"))
}

fn u32_of(v: &Value, key: &str) -> u32 {
    u32::try_from(u64_of(v, key)).unwrap_or_else(|_| panic!("{key:?} is not a u32 in {v}"))
}

fn limiter(scenario: &Value) -> SmoothState {
    let rate = f64_of(scenario, "rate");
    match field(scenario, "kind").as_str() {
        Some("bursty") => SmoothState::bursty(rate, Duration::from_secs(1)).unwrap(),
        Some("warmup") => SmoothState::warming_up(
            rate,
            us(u64_of(scenario, "warmup_us")),
            f64_of(scenario, "cold_factor"),
        )
        .unwrap(),
        other => panic!("unknown kind {other:?}"),
    }
}

fn model(scenario: &Value) -> Model {
    let rate = f64_of(scenario, "rate");
    match field(scenario, "kind").as_str() {
        Some("bursty") => Model::bursty(rate, guava::MICROS),
        Some("warmup") => Model::warming_up(
            rate,
            u64_of(scenario, "warmup_us"),
            f64_of(scenario, "cold_factor"),
            guava::MICROS,
        ),
        other => panic!("unknown kind {other:?}"),
    }
}

/// How waits are compared.
#[derive(Clone, Copy, PartialEq)]
enum Check {
    /// Equal, to the nanosecond; `try_acquire` with Guava's timeout.
    Exact,
    /// The README's: 1 µs plus 1 µs per reservation before the one checked.
    Tolerance,
}

/// Replays one scenario; returns a description of each mismatch.
fn replay(scenario: &Value, limiter: &mut dyn Smooth, check: Check) -> Vec<String> {
    let name = field(scenario, "name").as_str().unwrap_or("?");
    let mut now = Duration::ZERO;
    let mut reservations = 0u64;
    let mut failures = Vec::new();
    let ops = field(scenario, "ops").as_array().expect("ops is an array");
    for (i, op) in ops.iter().enumerate() {
        let tol = match check {
            Check::Exact => Duration::ZERO,
            Check::Tolerance => us(1 + reservations),
        };
        match field(op, "op").as_str() {
            Some("sleep") => now += us(u64_of(op, "us")),
            Some("acquire") => {
                let expected = us(u64_of(op, "wait_us"));
                let actual = limiter.acquire(now, u32_of(op, "permits"));
                reservations += 1;
                if actual.abs_diff(expected) > tol {
                    failures.push(format!(
                        "{name} op {i} {op}: expected wait {expected:?}, got {actual:?} (tolerance {tol:?})"
                    ));
                }
                // The recorded timeline moves by Guava's wait.
                now += expected;
            }
            Some("try_acquire") => {
                let permits = u32_of(op, "permits");
                let timeout = us(u64_of(op, "timeout_us"));
                let ok = field(op, "ok").as_bool().expect("ok is a bool");
                let expected = us(u64_of(op, "wait_us"));
                if ok {
                    match limiter.try_acquire(now, permits, timeout.saturating_add(tol)) {
                        Some(actual) => {
                            reservations += 1;
                            if actual.abs_diff(expected) > tol {
                                failures.push(format!(
                                    "{name} op {i} {op}: expected wait {expected:?}, got {actual:?} (tolerance {tol:?})"
                                ));
                            }
                        }
                        None => failures.push(format!(
                            "{name} op {i} {op}: expected Some({expected:?}), got None (timeout + {tol:?})"
                        )),
                    }
                    now += expected;
                } else if let Some(actual) =
                    limiter.try_acquire(now, permits, timeout.saturating_sub(tol))
                {
                    failures.push(format!(
                        "{name} op {i} {op}: expected None, got Some({actual:?}) (timeout − {tol:?})"
                    ));
                    // Keep the timeline Guava's: its state did not change.
                    break;
                }
            }
            Some("set_rate") => limiter.set_rate(now, f64_of(op, "rate")),
            other => panic!("{name} op {i}: unknown op {other:?}"),
        }
    }
    failures
}

fn scenarios() -> Vec<Value> {
    let vectors: Value = serde_json::from_str(VECTORS).expect("valid JSON");
    let scenarios = field(&vectors, "scenarios")
        .as_array()
        .expect("scenarios is an array")
        .clone();
    assert_eq!(scenarios.len(), 31, "the recorded set has 31 scenarios");
    let ops: usize = scenarios
        .iter()
        .map(|s| field(s, "ops").as_array().map_or(0, Vec::len))
        .sum();
    assert_eq!(ops, 360, "the recorded set has 360 operations");
    scenarios
}

fn scenario(name: &str) -> Value {
    scenarios()
        .into_iter()
        .find(|s| field(s, "name").as_str() == Some(name))
        .unwrap_or_else(|| panic!("{name} is recorded"))
}

fn assert_no_failures(failures: &[String]) {
    if !failures.is_empty() {
        let mut report = format!("{} mismatches with Guava:\n", failures.len());
        for f in failures {
            let _ = writeln!(report, "  {f}");
        }
        panic!("{report}");
    }
}

#[test]
fn guava_vectors_replay_exactly() {
    let failures: Vec<String> = scenarios()
        .iter()
        .flat_map(|s| replay(s, &mut limiter(s), Check::Exact))
        .collect();
    assert_no_failures(&failures);
}

#[test]
fn guava_vectors_replay_within_the_readme_tolerance() {
    let failures: Vec<String> = scenarios()
        .iter()
        .flat_map(|s| replay(s, &mut limiter(s), Check::Tolerance))
        .collect();
    assert_no_failures(&failures);
}

#[test]
fn the_port_of_guava_replays_the_vectors_exactly() {
    // The reference of the random mixes below is checked against Guava
    // itself first.
    let failures: Vec<String> = scenarios()
        .iter()
        .flat_map(|s| replay(s, &mut model(s), Check::Exact))
        .collect();
    assert_no_failures(&failures);
}

#[test]
fn the_replay_catches_wrong_answers() {
    // A sanity check of the harness itself: a wait 10 µs off is caught,
    // with or without the tolerance...
    let simple = scenario("guava_simple");
    assert!(replay(&simple, &mut limiter(&simple), Check::Exact).is_empty());
    let mut wrong = simple;
    wrong["ops"][1]["wait_us"] = Value::from(199_990);
    for check in [Check::Exact, Check::Tolerance] {
        let failures = replay(&wrong, &mut limiter(&wrong), check);
        assert!(
            failures
                .first()
                .is_some_and(|f| f.contains("guava_simple op 1")),
            "{failures:?}"
        );
    }
    // ...and so is a try_acquire answer that Guava did not give.
    let mut wrong = scenario("guava_try_acquire_some_wait_allowed");
    assert!(replay(&wrong, &mut limiter(&wrong), Check::Exact).is_empty());
    let ops = wrong["ops"].as_array_mut().unwrap();
    let (i, op) = ops
        .iter_mut()
        .enumerate()
        .find(|(_, op)| op["op"] == "try_acquire" && op["ok"] == true && op["wait_us"] != 0)
        .expect("a try_acquire that waits");
    op["timeout_us"] = Value::from(op["wait_us"].as_u64().unwrap() - 10);
    for check in [Check::Exact, Check::Tolerance] {
        let failures = replay(&wrong, &mut limiter(&wrong), check);
        assert!(
            failures
                .first()
                .is_some_and(|f| f.contains(&format!("op {i} "))),
            "{failures:?}"
        );
    }
    // Exactly: a wait 1 µs off is caught too.
    let mut wrong = scenario("guava_warmup");
    wrong["ops"][3]["wait_us"] = Value::from(wrong["ops"][3]["wait_us"].as_u64().unwrap() + 1);
    assert!(!replay(&wrong, &mut limiter(&wrong), Check::Exact).is_empty());
}

/// A line-by-line port of Guava 31.1's `RateLimiter` /
/// `SmoothRateLimiter` / `SmoothBursty` / `SmoothWarmingUp` arithmetic
/// (Java's `long` as `i64`, `double` as `f64`, `(long)` as `as i64`),
/// written independently of `SmoothState`, to replay what the recorded
/// vectors do not cover.
///
/// The unit is a parameter: Guava's microsecond, or the picosecond that
/// `SmoothState` uses above 10⁶/s (the same formulas, with `1e12` for
/// `SECONDS.toMicros(1L)`); waits are rounded up to the nanosecond.
mod guava {
    use std::time::Duration;

    /// Guava's unit, in ps.
    pub(super) const MICROS: u64 = 1_000_000;
    /// The unit above 10⁶/s, in ps.
    pub(super) const PICOS: u64 = 1;

    pub(super) struct Model {
        /// The unit, in ps.
        unit: u64,
        stored_permits: f64,
        max_permits: f64,
        stable_interval_micros: f64,
        next_free_ticket_micros: i64,
        /// `None`: `SmoothBursty`.
        warm: Option<Warm>,
    }

    struct Warm {
        warmup_period_micros: i64,
        slope: f64,
        threshold_permits: f64,
        cold_factor: f64,
    }

    impl Model {
        /// `RateLimiter.create(permitsPerSecond)`: `SmoothBursty` with
        /// `maxBurstSeconds = 1.0`, then `setRate`.
        pub(super) fn bursty(permits_per_second: f64, unit: u64) -> Model {
            let mut m = Model::new(unit, None);
            m.set_rate(Duration::ZERO, permits_per_second);
            m
        }

        /// `RateLimiter.create(permitsPerSecond, warmupPeriod, unit,
        /// coldFactor, stopwatch)`, the warm-up in units.
        pub(super) fn warming_up(
            permits_per_second: f64,
            warmup_period: u64,
            cold_factor: f64,
            unit: u64,
        ) -> Model {
            let warm = Warm {
                warmup_period_micros: i64::try_from(warmup_period).unwrap(),
                slope: 0.0,
                threshold_permits: 0.0,
                cold_factor,
            };
            let mut m = Model::new(unit, Some(warm));
            m.set_rate(Duration::ZERO, permits_per_second);
            m
        }

        fn new(unit: u64, warm: Option<Warm>) -> Model {
            Model {
                unit,
                stored_permits: 0.0,
                max_permits: 0.0,
                stable_interval_micros: 0.0,
                next_free_ticket_micros: 0,
                warm,
            }
        }

        /// The stopwatch's `readMicros()`: truncated to the unit.
        fn read_micros(&self, now: Duration) -> i64 {
            i64::try_from(now.as_nanos() * 1000 / u128::from(self.unit)).unwrap()
        }

        fn to_duration(&self, micros: i64) -> Duration {
            let ps = u128::try_from(micros).unwrap() * u128::from(self.unit);
            let ns = ps.div_ceil(1000);
            Duration::new(
                u64::try_from(ns / 1_000_000_000).unwrap(),
                u32::try_from(ns % 1_000_000_000).unwrap(),
            )
        }

        /// `setRate(permitsPerSecond)`.
        pub(super) fn set_rate(&mut self, now: Duration, permits_per_second: f64) {
            assert!(permits_per_second > 0.0 && !permits_per_second.is_nan());
            let now_micros = self.read_micros(now);
            // SmoothRateLimiter.doSetRate(double, long)
            self.resync(now_micros);
            let seconds_to_micros = if self.unit == MICROS { 1e6 } else { 1e12 };
            let stable_interval_micros = seconds_to_micros / permits_per_second;
            self.stable_interval_micros = stable_interval_micros;
            self.do_set_rate(permits_per_second, stable_interval_micros);
        }

        /// The subclasses' `doSetRate(double, double)`.
        #[expect(clippy::cast_precision_loss, reason = "test values far below 2^53")]
        fn do_set_rate(&mut self, permits_per_second: f64, stable_interval_micros: f64) {
            let old_max_permits = self.max_permits;
            match &mut self.warm {
                None => {
                    let max_burst_seconds = 1.0;
                    self.max_permits = max_burst_seconds * permits_per_second;
                    self.stored_permits = if old_max_permits == f64::INFINITY {
                        self.max_permits
                    } else if old_max_permits == 0.0 {
                        0.0
                    } else {
                        self.stored_permits * self.max_permits / old_max_permits
                    };
                }
                Some(w) => {
                    let cold_interval_micros = stable_interval_micros * w.cold_factor;
                    w.threshold_permits =
                        0.5 * w.warmup_period_micros as f64 / stable_interval_micros;
                    self.max_permits = w.threshold_permits
                        + 2.0 * w.warmup_period_micros as f64
                            / (stable_interval_micros + cold_interval_micros);
                    w.slope = (cold_interval_micros - stable_interval_micros)
                        / (self.max_permits - w.threshold_permits);
                    self.stored_permits = if old_max_permits == f64::INFINITY {
                        0.0
                    } else if old_max_permits == 0.0 {
                        self.max_permits
                    } else {
                        self.stored_permits * self.max_permits / old_max_permits
                    };
                }
            }
        }

        #[expect(clippy::cast_precision_loss, reason = "test values far below 2^53")]
        fn cool_down_interval_micros(&self) -> f64 {
            match &self.warm {
                None => self.stable_interval_micros,
                Some(w) => w.warmup_period_micros as f64 / self.max_permits,
            }
        }

        #[expect(clippy::cast_precision_loss, reason = "test values far below 2^53")]
        fn resync(&mut self, now_micros: i64) {
            if now_micros > self.next_free_ticket_micros {
                let new_permits = (now_micros - self.next_free_ticket_micros) as f64
                    / self.cool_down_interval_micros();
                self.stored_permits = self.max_permits.min(self.stored_permits + new_permits);
                self.next_free_ticket_micros = now_micros;
            }
        }

        #[expect(clippy::cast_possible_truncation, reason = "test values that fit")]
        fn stored_permits_to_wait_time(
            &self,
            stored_permits: f64,
            mut permits_to_take: f64,
        ) -> i64 {
            let Some(w) = &self.warm else { return 0 };
            let permits_to_time = |permits: f64| self.stable_interval_micros + permits * w.slope;
            let available_permits_above_threshold = stored_permits - w.threshold_permits;
            let mut micros: i64 = 0;
            if available_permits_above_threshold > 0.0 {
                let permits_above_threshold_to_take =
                    available_permits_above_threshold.min(permits_to_take);
                let length = permits_to_time(available_permits_above_threshold)
                    + permits_to_time(
                        available_permits_above_threshold - permits_above_threshold_to_take,
                    );
                micros = (permits_above_threshold_to_take * length / 2.0) as i64;
                permits_to_take -= permits_above_threshold_to_take;
            }
            // Java's `long +=` wraps (never reached here).
            micros.wrapping_add((self.stable_interval_micros * permits_to_take) as i64)
        }

        #[expect(clippy::cast_possible_truncation, reason = "test values that fit")]
        fn reserve_earliest_available(&mut self, required_permits: u32, now_micros: i64) -> i64 {
            self.resync(now_micros);
            let return_value = self.next_free_ticket_micros;
            let stored_permits_to_spend = f64::from(required_permits).min(self.stored_permits);
            let fresh_permits = f64::from(required_permits) - stored_permits_to_spend;
            let wait_micros = self
                .stored_permits_to_wait_time(self.stored_permits, stored_permits_to_spend)
                .wrapping_add((fresh_permits * self.stable_interval_micros) as i64);
            // LongMath.saturatedAdd
            self.next_free_ticket_micros = self.next_free_ticket_micros.saturating_add(wait_micros);
            self.stored_permits -= stored_permits_to_spend;
            return_value
        }

        fn reserve_and_get_wait_length(&mut self, permits: u32, now_micros: i64) -> Duration {
            let moment_available = self.reserve_earliest_available(permits, now_micros);
            self.to_duration((moment_available - now_micros).max(0))
        }

        /// `acquire(permits)`: the wait.
        pub(super) fn acquire(&mut self, now: Duration, permits: u32) -> Duration {
            assert!(permits > 0);
            let now_micros = self.read_micros(now);
            self.reserve_and_get_wait_length(permits, now_micros)
        }

        /// `tryAcquire(permits, timeout, unit)`: the wait, if granted.
        pub(super) fn try_acquire(
            &mut self,
            now: Duration,
            permits: u32,
            timeout: Duration,
        ) -> Option<Duration> {
            let timeout_micros = i64::try_from(timeout.as_nanos() * 1000 / u128::from(self.unit))
                .unwrap_or(i64::MAX)
                .max(0);
            let now_micros = self.read_micros(now);
            // canAcquire
            if self.next_free_ticket_micros - timeout_micros <= now_micros {
                Some(self.reserve_and_get_wait_length(permits, now_micros))
            } else {
                None
            }
        }
    }
}

/// One operation of a scenario; times in µs (in ns above 10⁶/s).
#[derive(Debug, Clone, Copy)]
enum Op {
    Sleep(u64),
    Acquire(u32),
    TryAcquire(u32, u64),
    SetRate(f64),
}

/// The warm-up (in units) and cold factor of a warm-up limiter; `None` for
/// a bursty one.
type Warm = Option<(u64, f64)>;

/// `n` µs (`unit` = [`guava::MICROS`]) or `n` ns (above 10⁶/s).
fn units(n: u64, unit: u64) -> Duration {
    if unit == guava::MICROS {
        Duration::from_micros(n)
    } else {
        Duration::from_nanos(n)
    }
}

/// Replays `ops` on both, from time zero; the first disagreement, if any.
fn disagreement(ours: &mut SmoothState, port: &mut Model, ops: &[Op], unit: u64) -> Option<String> {
    let units = |n: u64| units(n, unit);
    let mut now = Duration::ZERO;
    for (i, &op) in ops.iter().enumerate() {
        match op {
            Op::Sleep(n) => now += units(n),
            Op::Acquire(n) => {
                let expected = port.acquire(now, n);
                let actual = ours.reserve(now, n);
                if actual != expected {
                    return Some(format!(
                        "op {i} {op:?} at {now:?}: Guava waits {expected:?}, we {actual:?}"
                    ));
                }
                now += expected;
            }
            Op::TryAcquire(n, timeout) => {
                let expected = port.try_acquire(now, n, units(timeout));
                let actual = ours.try_reserve(now, n, units(timeout));
                if actual != expected {
                    return Some(format!(
                        "op {i} {op:?} at {now:?}: Guava says {expected:?}, we {actual:?}"
                    ));
                }
                now += expected.unwrap_or_default();
            }
            Op::SetRate(r) => {
                port.set_rate(now, r);
                ours.set_rate(now, r).unwrap();
            }
        }
    }
    None
}

#[test]
fn edge_cases_agree_with_guava() {
    use Op::{Acquire, SetRate, Sleep, TryAcquire};
    let max = i32::MAX.unsigned_abs();
    let forever = i64::MAX.unsigned_abs();
    let cases: Vec<(&str, f64, Warm, Vec<Op>)> = vec![
        (
            // Beyond 2⁵³ µs of debt, Guava's doubles round.
            "i32::MAX permits at 0.1/s",
            0.1,
            None,
            vec![
                Acquire(max),
                Acquire(max),
                Acquire(3),
                TryAcquire(1, forever),
                Acquire(1),
            ],
        ),
        (
            "a cold i32::MAX at cold factor 20",
            0.1,
            Some((100_000_000, 20.0)),
            vec![Acquire(max), Sleep(50_000_000), Acquire(7), Acquire(1)],
        ),
        (
            "warm-up of 1 ms at 100 000/s, cold factor 20",
            100_000.0,
            Some((1000, 20.0)),
            vec![
                Acquire(1),
                Acquire(1),
                Sleep(3),
                Acquire(2),
                Sleep(700),
                Acquire(1),
                Acquire(5),
                TryAcquire(1, 0),
                TryAcquire(1, 9),
                TryAcquire(1, 10_000),
                Sleep(10_000),
                Acquire(200),
            ],
        ),
        (
            "set_rate up and down while cooling",
            3.0,
            Some((7_000_000, 13.0)),
            vec![
                Acquire(4),
                SetRate(0.7),
                Acquire(1),
                Sleep(1_234_567),
                SetRate(99_999.0),
                Acquire(3),
                Sleep(2),
                SetRate(0.1),
                Acquire(1),
                Sleep(900_000_000),
                SetRate(17.0),
                Acquire(1),
                Acquire(1),
                SetRate(100_000.0),
                Acquire(1),
            ],
        ),
        (
            "bursty set_rate while full and while in debt",
            7.0,
            None,
            vec![
                Sleep(3_000_000),
                SetRate(0.3),
                Acquire(1),
                SetRate(70_000.0),
                Acquire(2),
                Acquire(3),
                SetRate(7.0),
                TryAcquire(1, 0),
                TryAcquire(5, forever),
                Acquire(1),
            ],
        ),
    ];
    for (name, rate, warm, ops) in cases {
        let (mut ours, mut port) = match warm {
            None => (
                SmoothState::bursty(rate, Duration::from_secs(1)).unwrap(),
                Model::bursty(rate, guava::MICROS),
            ),
            Some((warmup, c)) => (
                SmoothState::warming_up(rate, Duration::from_micros(warmup), c).unwrap(),
                Model::warming_up(rate, warmup, c, guava::MICROS),
            ),
        };
        let d = disagreement(&mut ours, &mut port, &ops, guava::MICROS);
        assert!(d.is_none(), "{name}: {}", d.unwrap_or_default());
    }
}

/// Random mixes, as the acceptance suite's: rates 0.1/s to 100 000/s,
/// weights up to `i32::MAX`, `set_rate` up and down, warm-ups from 1 ms to
/// 100 s, cold factors 1 to 20; and the same above 10⁶/s, in nanoseconds.
mod random_mixes {
    use std::time::Duration;

    use proptest::prelude::*;
    use tokio_ratelimit::algorithm::SmoothState;

    use super::guava::{self, Model};
    use super::{Op, Warm, disagreement};

    /// 0.1/s to 100 000/s: round and awkward values, and log-uniform ones.
    fn rate() -> impl Strategy<Value = f64> {
        prop_oneof![
            prop::sample::select(vec![
                0.1, 0.3, 0.5, 1.0, 2.0, 3.0, 5.0, 7.0, 10.0, 100.0, 1000.0, 100_000.0
            ]),
            (-1.0f64..5.0).prop_map(|e| 10f64.powf(e)),
        ]
    }

    /// Above 10⁶/s, to 10⁹/s.
    fn fast_rate() -> impl Strategy<Value = f64> {
        prop_oneof![
            prop::sample::select(vec![1.5e6, 2e6, 3e6, 7e6, 1e8, 3e8, 1e9]),
            (6.001f64..9.0).prop_map(|e| 10f64.powf(e)),
        ]
    }

    fn weight() -> impl Strategy<Value = u32> {
        prop_oneof![
            8 => 1u32..=3,
            2 => 4u32..=100,
            1 => Just(i32::MAX.unsigned_abs()),
            1 => 1u32..=i32::MAX.unsigned_abs(),
        ]
    }

    fn ops(rate: impl Strategy<Value = f64>) -> impl Strategy<Value = Vec<Op>> {
        let op = prop_oneof![
            3 => (0u64..3_000_000).prop_map(Op::Sleep),
            1 => (0u64..200_000_000).prop_map(Op::Sleep),
            4 => weight().prop_map(Op::Acquire),
            2 => (weight(), prop_oneof![Just(0u64), 0u64..5_000_000, Just(i64::MAX.unsigned_abs())])
                .prop_map(|(w, t)| Op::TryAcquire(w, t)),
            1 => rate.prop_map(Op::SetRate),
        ];
        prop::collection::vec(op, 1..60)
    }

    /// In units: 1 ms to 100 s in microseconds.
    fn warmup() -> impl Strategy<Value = u64> {
        prop_oneof![Just(1000u64), Just(100_000_000), 1000u64..=100_000_000]
    }

    fn cold_factor() -> impl Strategy<Value = f64> {
        prop_oneof![Just(1.0), Just(3.0), Just(20.0), 1.0f64..=20.0]
    }

    fn check(rate: f64, warm: Warm, ops: &[Op], unit: u64) -> Option<String> {
        let (mut ours, mut port) = match warm {
            None => (
                SmoothState::bursty(rate, Duration::from_secs(1)).unwrap(),
                Model::bursty(rate, unit),
            ),
            Some((warmup, c)) => (
                SmoothState::warming_up(rate, super::units(warmup, unit), c).unwrap(),
                // The model counts the warm-up in its own unit.
                Model::warming_up(
                    rate,
                    if unit == guava::MICROS {
                        warmup
                    } else {
                        warmup * 1000
                    },
                    c,
                    unit,
                ),
            ),
        };
        disagreement(&mut ours, &mut port, ops, unit)
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

        #[test]
        fn bursty_mixes_agree_with_guava(rate in rate(), ops in ops(rate())) {
            let d = check(rate, None, &ops, guava::MICROS);
            prop_assert!(d.is_none(), "{}", d.unwrap_or_default());
        }

        #[test]
        fn warm_up_mixes_agree_with_guava(
            rate in rate(),
            warmup in warmup(),
            cold_factor in cold_factor(),
            ops in ops(rate()),
        ) {
            let d = check(rate, Some((warmup, cold_factor)), &ops, guava::MICROS);
            prop_assert!(d.is_none(), "{}", d.unwrap_or_default());
        }

        /// Above 10⁶/s, the same arithmetic in picoseconds (sleeps,
        /// timeouts and warm-ups in ns: 1 µs to 100 ms).
        #[test]
        fn fast_mixes_agree_with_guava_in_picoseconds(
            rate in fast_rate(),
            warm in prop::option::of((warmup(), cold_factor())),
            ops in ops(fast_rate()),
        ) {
            let d = check(rate, warm, &ops, guava::PICOS);
            prop_assert!(d.is_none(), "{}", d.unwrap_or_default());
        }
    }
}
