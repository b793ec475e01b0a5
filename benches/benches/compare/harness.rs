//! Timed loops and the formatting of their figures, shared by the scenarios.

use std::hint::black_box;
use std::sync::Barrier;
use std::time::{Duration, Instant};

use tokio_ratelimit_benches::median;

/// `n` calls to `f` in a tight loop: elapsed time and how many returned
/// `true`.
pub(crate) fn time_loop(n: u64, mut f: impl FnMut() -> bool) -> (Duration, u64) {
    let start = Instant::now();
    let mut ok = 0u64;
    for _ in 0..n {
        ok += u64::from(f());
    }
    (start.elapsed(), black_box(ok))
}

/// Nanoseconds per call of `n` calls that took `d`.
#[expect(
    clippy::cast_precision_loss,
    reason = "counts and nanoseconds, far below 2^53"
)]
pub(crate) fn ns_per(d: Duration, n: u64) -> f64 {
    d.as_secs_f64() * 1e9 / n as f64
}

/// "median (min–max)" of some nanosecond samples.
pub(crate) fn spread(samples: &[f64]) -> String {
    let lo = samples.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = samples.iter().copied().fold(0.0, f64::max);
    format!("{:.1} ({:.0}–{:.0})", median(samples), lo, hi)
}

/// Seconds as milliseconds, three decimals.
pub(crate) fn ms(d: f64) -> String {
    format!("{:.3}", d * 1e3)
}

/// Two threads run `f` `n` times each, started together: the mean time a
/// thread took.
pub(crate) fn two_thread_loop(n: u64, f: impl Fn() + Sync) -> Duration {
    let barrier = Barrier::new(2);
    let times: Vec<Duration> = std::thread::scope(|scope| {
        let hs: Vec<_> = (0..2)
            .map(|_| {
                scope.spawn(|| {
                    barrier.wait();
                    let t = Instant::now();
                    for _ in 0..n {
                        f();
                    }
                    t.elapsed()
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    times.iter().sum::<Duration>() / 2
}
