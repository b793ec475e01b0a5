//! Scenario 1 (`try`): `try_acquire` on one thread.

use tokio::runtime::Runtime;
use tokio_ratelimit_benches::{Table, median, ratio_line};

use crate::harness::{ns_per, spread};
use crate::peers::{Case, Kind, Subject, TRY_KINDS, build_try};
use crate::settings::Settings;

pub(crate) fn try_one_thread(rt: &Runtime, set: &Settings) {
    let mut results: Vec<[Vec<f64>; 2]> = vec![[Vec::new(), Vec::new()]; TRY_KINDS.len()];
    let mut wrong = Vec::new();
    for (c, case) in [Case::Allowed, Case::Denied].into_iter().enumerate() {
        let subjects: Vec<Subject> = {
            let _guard = rt.enter();
            TRY_KINDS.iter().map(|&k| build_try(k, case)).collect()
        };
        for s in &subjects {
            s.try_loop(set.calls / 10); // warm up
        }
        // Repetitions interleave the limiters, so that a noisy moment on
        // the machine is spread over all of them.
        for _ in 0..set.reps {
            for (i, s) in subjects.iter().enumerate() {
                let (d, ok) = s.try_loop(set.calls);
                let expected = if case == Case::Allowed { set.calls } else { 0 };
                if ok != expected {
                    wrong.push(format!(
                        "{} {case:?}: {ok} of {} allowed",
                        TRY_KINDS[i].name(),
                        set.calls
                    ));
                }
                results[i][c].push(ns_per(d, set.calls));
            }
        }
    }
    let gov = TRY_KINDS.iter().position(|&k| k == Kind::Governor).unwrap();
    let tok = TRY_KINDS.iter().position(|&k| k == Kind::Token).unwrap();
    let mut t = Table::new(
        format!(
            "1. try_acquire, one thread (ns per call: median (min–max) of {} × {} calls)",
            set.reps, set.calls
        ),
        &[
            "limiter",
            "allowed ns",
            "× governor",
            "denied ns",
            "× governor",
        ],
    );
    for (i, k) in TRY_KINDS.iter().enumerate() {
        t.row(vec![
            k.name().to_string(),
            spread(&results[i][0]),
            format!("{:.2}", median(&results[i][0]) / median(&results[gov][0])),
            spread(&results[i][1]),
            format!("{:.2}", median(&results[i][1]) / median(&results[gov][1])),
        ]);
    }
    t.note(
        "Allowed: 10⁹/s, capacity 10⁹ (never exhausted; Semaphore: MAX_PERMITS, no refill task). \
         Denied: 1/hour, capacity 1, exhausted.",
    );
    t.note(ratio_line(
        "TokenBucket allowed / governor allowed",
        median(&results[tok][0]) / median(&results[gov][0]),
        "≤",
        1.0,
    ));
    t.note(ratio_line(
        "TokenBucket denied / governor denied",
        median(&results[tok][1]) / median(&results[gov][1]),
        "≤",
        1.0,
    ));
    for w in wrong {
        t.note(format!("WARNING: unexpected outcome: {w}"));
    }
    t.print();
}
