//! Scenario 2 (`threads`): `try_acquire` from two threads on one limiter.

use std::sync::Barrier;
use std::time::Duration;

use tokio::runtime::Runtime;
use tokio_ratelimit_benches::{Table, median, ratio_line, thread_cpu_time};

use crate::harness::{ns_per, spread};
use crate::peers::{Case, Kind, Subject, TRY_KINDS, build_try};
use crate::settings::Settings;

/// Two threads, `n` calls each, started together: mean ns per call per
/// thread, total calls per second, calls allowed, and how much of the time
/// the threads were on a CPU (thread CPU time / elapsed, mean of the two:
/// near 1 when each had a core; near 0.5 when they shared one, and then the
/// figure measures time-slicing on a busy machine, not contention).
fn two_threads(s: &Subject, n: u64) -> (f64, f64, u64, f64) {
    let barrier = Barrier::new(2);
    let res: Vec<(Duration, u64, f64)> = std::thread::scope(|scope| {
        let hs: Vec<_> = (0..2)
            .map(|_| {
                scope.spawn(|| {
                    barrier.wait();
                    let cpu = thread_cpu_time();
                    let (d, ok) = s.try_loop(n);
                    let on_cpu = (thread_cpu_time() - cpu).as_secs_f64() / d.as_secs_f64();
                    (d, ok, on_cpu)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let per_call = res.iter().map(|(d, _, _)| ns_per(*d, n)).sum::<f64>() / 2.0;
    let slowest = res.iter().map(|(d, _, _)| *d).max().unwrap();
    #[expect(
        clippy::cast_precision_loss,
        reason = "counts and nanoseconds, far below 2^53"
    )]
    let total = 2.0 * n as f64 / slowest.as_secs_f64();
    let on_cpu = res.iter().map(|(_, _, c)| c).sum::<f64>() / 2.0;
    (
        per_call,
        total,
        res.iter().map(|(_, ok, _)| ok).sum(),
        on_cpu,
    )
}

pub(crate) fn try_two_threads(rt: &Runtime, set: &Settings) {
    let n = set.calls / 2;
    // [case][kind] → (ns per call per thread, calls/s) samples
    let mut per_call: Vec<[Vec<f64>; 2]> = vec![[Vec::new(), Vec::new()]; TRY_KINDS.len()];
    let mut total: Vec<[Vec<f64>; 2]> = vec![[Vec::new(), Vec::new()]; TRY_KINDS.len()];
    let mut on_cpu: Vec<f64> = Vec::new();
    let mut wrong = Vec::new();
    for (c, case) in [Case::Allowed, Case::Denied].into_iter().enumerate() {
        let subjects: Vec<Subject> = {
            let _guard = rt.enter();
            TRY_KINDS.iter().map(|&k| build_try(k, case)).collect()
        };
        for s in &subjects {
            two_threads(s, n / 10);
        }
        for _ in 0..set.reps {
            for (i, s) in subjects.iter().enumerate() {
                let (p, tot, ok, busy) = two_threads(s, n);
                on_cpu.push(busy);
                let expected = if case == Case::Allowed { 2 * n } else { 0 };
                if ok != expected {
                    wrong.push(format!(
                        "{} {case:?}: {ok} of {} allowed",
                        TRY_KINDS[i].name(),
                        2 * n
                    ));
                }
                per_call[i][c].push(p);
                total[i][c].push(tot / 1e6);
            }
        }
    }
    let gov = TRY_KINDS.iter().position(|&k| k == Kind::Governor).unwrap();
    let tok = TRY_KINDS.iter().position(|&k| k == Kind::Token).unwrap();
    let mut t = Table::new(
        format!(
            "2. try_acquire, two threads on one limiter (median (min–max) of {} × 2 threads × {} calls)",
            set.reps, n
        ),
        &[
            "limiter",
            "allowed ns/call/thread",
            "× governor",
            "allowed M calls/s",
            "denied ns/call/thread",
            "× governor",
            "denied M calls/s",
        ],
    );
    for (i, k) in TRY_KINDS.iter().enumerate() {
        t.row(vec![
            k.name().to_string(),
            spread(&per_call[i][0]),
            format!("{:.2}", median(&per_call[i][0]) / median(&per_call[gov][0])),
            format!("{:.1}", median(&total[i][0])),
            spread(&per_call[i][1]),
            format!("{:.2}", median(&per_call[i][1]) / median(&per_call[gov][1])),
            format!("{:.1}", median(&total[i][1])),
        ]);
    }
    t.note("Same limiters as scenario 1. M calls/s: both threads together.");
    t.note(format!(
        "Threads on a CPU (thread CPU time / elapsed, all runs): median {:.2}, min {:.2} \
         (near 1: each thread had a core; near 0.5: they shared one on a busy machine, \
         and the figures show time-slicing, not contention).",
        median(&on_cpu),
        on_cpu.iter().copied().fold(f64::INFINITY, f64::min)
    ));
    t.note(ratio_line(
        "TokenBucket 2-thread allowed / governor",
        median(&per_call[tok][0]) / median(&per_call[gov][0]),
        "≤",
        1.0,
    ));
    t.note(ratio_line(
        "TokenBucket 2-thread denied / governor",
        median(&per_call[tok][1]) / median(&per_call[gov][1]),
        "≤",
        1.0,
    ));
    for w in wrong {
        t.note(format!("WARNING: unexpected outcome: {w}"));
    }
    t.print();
}
