//! Conformance with Guava: replays the scenarios recorded from Guava 31.1's
//! real `RateLimiter` (`tests/data/guava_vectors.json`, see the README
//! there) through `algorithm::SmoothState`, with exact virtual time.
//!
//! Guava truncates every cost to a whole microsecond and this crate does
//! not, so waits are compared with a tolerance of 1 µs plus 1 µs per
//! reservation made so far in the scenario. For `try_acquire`, that
//! tolerance is given in the direction of Guava's answer (timeout + tol when
//! Guava said yes, timeout − tol when it said no), and the answers must
//! agree.

use std::fmt::Write as _;
use std::time::Duration;

use serde_json::Value;
use tokio_ratelimit::algorithm::SmoothState;

const VECTORS: &str = include_str!("data/guava_vectors.json");

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

fn us(n: u64) -> Duration {
    Duration::from_micros(n)
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

/// Replays one scenario; returns a description of each mismatch.
fn replay(scenario: &Value) -> Vec<String> {
    let name = field(scenario, "name").as_str().unwrap_or("?");
    let mut state = limiter(scenario);
    let mut now = Duration::ZERO;
    let mut reservations = 0u64;
    let mut failures = Vec::new();
    let ops = field(scenario, "ops").as_array().expect("ops is an array");
    for (i, op) in ops.iter().enumerate() {
        let tol = us(1 + reservations);
        match field(op, "op").as_str() {
            Some("sleep") => now += us(u64_of(op, "us")),
            Some("acquire") => {
                let expected = us(u64_of(op, "wait_us"));
                let actual = state.reserve(now, u32_of(op, "permits"));
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
                    match state.try_reserve(now, permits, timeout.saturating_add(tol)) {
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
                    state.try_reserve(now, permits, timeout.saturating_sub(tol))
                {
                    failures.push(format!(
                        "{name} op {i} {op}: expected None, got Some({actual:?}) (timeout − {tol:?})"
                    ));
                    // Keep the timeline Guava's: its state did not change.
                    break;
                }
            }
            Some("set_rate") => {
                if let Err(e) = state.set_rate(now, f64_of(op, "rate")) {
                    failures.push(format!("{name} op {i} {op}: set_rate failed: {e}"));
                }
            }
            other => panic!("{name} op {i}: unknown op {other:?}"),
        }
    }
    failures
}

#[test]
fn guava_vectors_replay() {
    let vectors: Value = serde_json::from_str(VECTORS).expect("valid JSON");
    let scenarios = field(&vectors, "scenarios")
        .as_array()
        .expect("scenarios is an array");
    assert_eq!(scenarios.len(), 31, "the recorded set has 31 scenarios");
    let ops: usize = scenarios
        .iter()
        .map(|s| field(s, "ops").as_array().map_or(0, Vec::len))
        .sum();
    assert_eq!(ops, 360, "the recorded set has 360 operations");
    let failures: Vec<String> = scenarios.iter().flat_map(replay).collect();
    if !failures.is_empty() {
        let mut report = format!("{} mismatches with Guava:\n", failures.len());
        for f in &failures {
            let _ = writeln!(report, "  {f}");
        }
        panic!("{report}");
    }
}

#[test]
fn the_tolerance_is_needed_and_sufficient() {
    // A sanity check of the harness itself: a wrong semantics (no pay-later)
    // is caught.
    let vectors: Value = serde_json::from_str(VECTORS).unwrap();
    let simple = field(&vectors, "scenarios")
        .as_array()
        .unwrap()
        .iter()
        .find(|s| field(s, "name").as_str() == Some("guava_simple"))
        .expect("guava_simple is recorded")
        .clone();
    assert!(replay(&simple).is_empty());
    let mut wrong = simple;
    wrong["ops"][1]["wait_us"] = Value::from(199_990);
    let failures = replay(&wrong);
    assert!(
        failures
            .first()
            .is_some_and(|f| f.contains("guava_simple op 1")),
        "{failures:?}"
    );
    // And so is a try_acquire answer that Guava did not give.
    let mut wrong = field(&vectors, "scenarios")
        .as_array()
        .unwrap()
        .iter()
        .find(|s| field(s, "name").as_str() == Some("guava_try_acquire_some_wait_allowed"))
        .expect("guava_try_acquire_some_wait_allowed is recorded")
        .clone();
    assert!(replay(&wrong).is_empty());
    let ops = wrong["ops"].as_array_mut().unwrap();
    let (i, op) = ops
        .iter_mut()
        .enumerate()
        .find(|(_, op)| op["op"] == "try_acquire" && op["ok"] == true && op["wait_us"] != 0)
        .expect("a try_acquire that waits");
    op["timeout_us"] = Value::from(op["wait_us"].as_u64().unwrap() - 10);
    let failures = replay(&wrong);
    assert!(
        failures
            .first()
            .is_some_and(|f| f.contains(&format!("op {i} "))),
        "{failures:?}"
    );
}
