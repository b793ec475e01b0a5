//! Scenario 0 (`calibration`): what the building blocks cost on this machine.

use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tokio_ratelimit_benches::Table;

use crate::harness::{ns_per, spread, time_loop, two_thread_loop};
use crate::settings::Settings;

fn cas64(a: &AtomicU64) {
    let mut v = a.load(Ordering::Acquire);
    while let Err(actual) = a.compare_exchange_weak(v, v + 1, Ordering::AcqRel, Ordering::Acquire) {
        v = actual;
    }
}

fn cas128(a: &portable_atomic::AtomicU128) {
    let mut v = a.load(Ordering::Acquire);
    while let Err(actual) = a.compare_exchange_weak(v, v + 1, Ordering::AcqRel, Ordering::Acquire) {
        v = actual;
    }
}

pub(crate) fn calibration(set: &Settings) {
    let mut t = Table::new(
        format!(
            "0. Building blocks on this machine (ns per call (per thread), median of {} × {} calls)",
            set.reps, set.calls
        ),
        &["operation", "ns/call (min–max)"],
    );
    let quanta = governor::clock::QuantaClock::default();
    let a64 = AtomicU64::new(0);
    let a128 = portable_atomic::AtomicU128::new(0);
    let den = black_box(3u64);
    let shared64 = AtomicU64::new(0);
    let shared128 = portable_atomic::AtomicU128::new(0);
    /// An operation timed over `n` calls.
    type Op<'a> = Box<dyn Fn(u64) -> Duration + 'a>;
    let ops: Vec<(&str, Op)> = vec![
        (
            "std::time::Instant::now() (= tokio's without test-util)",
            Box::new(|n| {
                time_loop(n, || {
                    black_box(Instant::now());
                    true
                })
                .0
            }),
        ),
        (
            "Instant::now().saturating_duration_since(origin).as_nanos() (the crate's now_nanos)",
            Box::new(|n| {
                let origin = Instant::now();
                time_loop(n, || {
                    black_box(Instant::now().saturating_duration_since(origin).as_nanos());
                    true
                })
                .0
            }),
        ),
        (
            "raw rdtsc (x86_64 _rdtsc)",
            Box::new(|n| {
                time_loop(n, || {
                    #[cfg(target_arch = "x86_64")]
                    // SAFETY: rdtsc is available on every x86_64 CPU.
                    black_box(unsafe { std::arch::x86_64::_rdtsc() });
                    true
                })
                .0
            }),
        ),
        (
            "quanta Clock::now() (governor's default clock)",
            Box::new(|n| {
                use governor::clock::Clock;
                time_loop(n, || {
                    black_box(quanta.now());
                    true
                })
                .0
            }),
        ),
        (
            "clock_gettime(CLOCK_MONOTONIC_COARSE)",
            Box::new(|n| {
                time_loop(n, || {
                    let mut ts = libc::timespec {
                        tv_sec: 0,
                        tv_nsec: 0,
                    };
                    // SAFETY: a valid clock id and a valid out-pointer.
                    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC_COARSE, &raw mut ts) };
                    black_box(ts.tv_nsec);
                    true
                })
                .0
            }),
        ),
        (
            "AtomicU64 load + compare_exchange (uncontended)",
            Box::new(|n| {
                time_loop(n, || {
                    let v = a64.load(Ordering::Acquire);
                    a64.compare_exchange(v, v + 1, Ordering::AcqRel, Ordering::Acquire)
                        .is_ok()
                })
                .0
            }),
        ),
        (
            "portable_atomic AtomicU128 load",
            Box::new(|n| {
                time_loop(n, || {
                    black_box(a128.load(Ordering::Acquire));
                    true
                })
                .0
            }),
        ),
        (
            "portable_atomic AtomicU128 load + compare_exchange_weak",
            Box::new(|n| {
                time_loop(n, || {
                    let v = a128.load(Ordering::Acquire);
                    a128.compare_exchange_weak(v, v + 1, Ordering::AcqRel, Ordering::Acquire)
                        .is_ok()
                })
                .0
            }),
        ),
        (
            "u128 / u64 division (the u128 division routine)",
            Box::new(|n| {
                let mut x: u128 = black_box(1 << 90);
                let d = time_loop(n, || {
                    x = black_box(x / u128::from(den) + (1 << 90));
                    true
                })
                .0;
                black_box(x);
                d
            }),
        ),
        (
            "2 threads: Instant::now() + AtomicU128 CAS loop on one word (the crate's shape)",
            Box::new(|n| {
                two_thread_loop(n, || {
                    black_box(Instant::now());
                    cas128(&shared128);
                })
            }),
        ),
        (
            "2 threads: quanta now() + AtomicU64 CAS loop on one word (governor's shape)",
            Box::new(|n| {
                use governor::clock::Clock;
                two_thread_loop(n, || {
                    black_box(quanta.now());
                    cas64(&shared64);
                })
            }),
        ),
        (
            "2 threads: quanta now() + AtomicU128 CAS loop on one word",
            Box::new(|n| {
                use governor::clock::Clock;
                two_thread_loop(n, || {
                    black_box(quanta.now());
                    cas128(&shared128);
                })
            }),
        ),
        (
            "2 threads: Instant::now() alone",
            Box::new(|n| {
                two_thread_loop(n, || {
                    black_box(Instant::now());
                })
            }),
        ),
    ];
    let mut samples = vec![Vec::new(); ops.len()];
    for (_, op) in &ops {
        op(set.calls / 10); // warm up
    }
    for _ in 0..set.reps {
        for ((_, op), s) in ops.iter().zip(&mut samples) {
            s.push(ns_per(op(set.calls), set.calls));
        }
    }
    for ((name, _), s) in ops.iter().zip(&samples) {
        t.row(vec![(*name).to_string(), spread(s)]);
    }
    let mut res = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid clock id and a valid out-pointer.
    unsafe { libc::clock_getres(libc::CLOCK_MONOTONIC_COARSE, &raw mut res) };
    t.note(format!(
        "CLOCK_MONOTONIC_COARSE resolution: {} ns (too coarse for an exact limiter).",
        res.tv_nsec
    ));
    t.print();
}
