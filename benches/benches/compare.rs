//! tokio-ratelimit side by side with its peers (issue 5): one table per
//! scenario, with the targets printed beside the measured ratios.
//!
//! Run with `cargo bench -p tokio-ratelimit-benches` (add scenario names
//! after `--` to run only some: `calibration try threads pacing herd memory
//! cancel`). `BENCH_QUICK=1` shortens every scenario, for a smoke test.
//!
//! The peers, configured the obvious way a user would:
//! * governor 0.10, direct (`check()`, `until_ready()`) and keyed
//!   (`check_key()`), default clock (quanta) and default keyed store
//!   (dashmap);
//! * leaky-bucket 1.x (`try_acquire(1)`, `acquire_one()`), `max` = capacity,
//!   `initial` = capacity, one token per `1/rate` (its interval cannot be
//!   below 1 ms, so above 1 000/s it adds `rate / 1000` per millisecond);
//! * a tokio `Semaphore` of `capacity` permits refilled by a task that adds
//!   one permit per `tokio::time::interval(1/rate)` tick while fewer than
//!   `capacity` are available (default `MissedTickBehavior::Burst`, so missed
//!   ticks are caught up); `try_acquire` + `forget`.

use std::hint::black_box;
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Barrier, Mutex};
use std::time::{Duration, Instant};

use governor::{DefaultDirectRateLimiter, DefaultKeyedRateLimiter, Quota};
use tokio::runtime::Runtime;
use tokio::sync::{Semaphore, watch};
use tokio::task::JoinHandle;
use tokio_ratelimit::keyed::KeyedFunnel;
use tokio_ratelimit::{Funnel, LeakyBucket, Rate, SmoothBursty, SmoothWarmingUp, TokenBucket};
use tokio_ratelimit_benches::{
    Table, cpu_time, load_average, machine, median, quantile, ratio_line, rss_bytes,
    thread_cpu_time, today_utc, trim_heap,
};

// ---------------------------------------------------------------------------
// Settings

/// Durations and repetition counts; `BENCH_QUICK=1` shrinks them.
#[derive(Debug, Clone, Copy)]
struct Settings {
    /// Repetitions of each timed loop (scenarios 0, 1, 2, 5); medians are
    /// quoted.
    reps: usize,
    /// Calls per repetition on one thread (per thread with two).
    calls: u64,
    /// Length of each real-time run (scenarios 4 and 6).
    run: Duration,
    /// Length of each pacing run (scenario 3).
    pace: Duration,
    /// Runs of each pacing cell (medians quoted).
    rt_reps: usize,
    /// Keys for governor keyed (and later `KeyedFunnel`).
    keys: u64,
    /// Idle limiters built in scenario 5.
    idle: usize,
    /// Waiters in scenario 4.
    herd: usize,
    /// Only the limiters whose name contains one of these (`BENCH_KINDS`,
    /// comma-separated); all when empty.
    kinds: &'static [String],
}

impl Settings {
    fn from_env() -> Settings {
        let kinds: Vec<String> = std::env::var("BENCH_KINDS")
            .unwrap_or_default()
            .split(',')
            .filter(|k| !k.is_empty())
            .map(str::to_string)
            .collect();
        let mut set = Settings::defaults();
        set.kinds = Vec::leak(kinds);
        if let Some(secs) = std::env::var("BENCH_SECS")
            .ok()
            .and_then(|s| s.parse::<f64>().ok())
        {
            set.run = Duration::from_secs_f64(secs);
            set.pace = set.run;
        }
        set
    }

    fn defaults() -> Settings {
        if std::env::var_os("BENCH_QUICK").is_some_and(|v| v != "0") {
            Settings {
                reps: 3,
                calls: 200_000,
                run: Duration::from_secs(1),
                pace: Duration::from_secs(1),
                rt_reps: 1,
                keys: 100_000,
                idle: 10_000,
                herd: 10_000,
                kinds: &[],
            }
        } else {
            Settings {
                reps: 7,
                calls: 2_000_000,
                run: Duration::from_secs(3),
                pace: Duration::from_secs(2),
                rt_reps: 3,
                keys: 1_000_000,
                idle: 100_000,
                herd: 10_000,
                kinds: &[],
            }
        }
    }
}

// ---------------------------------------------------------------------------
// The limiters under test

/// Which limiter a row is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Token,
    /// `LeakyBucket::try_acquire`: the meter.
    Meter,
    /// `LeakyBucket::acquire`: the shaper.
    Shaper,
    Funnel,
    SmoothBursty,
    SmoothWarmingUp,
    Governor,
    LeakyCrate,
    Semaphore,
}

impl Kind {
    /// One of this crate's limiters that callers wait on: the issue's
    /// targets for waiters apply to it.
    fn is_crate_waiter(self) -> bool {
        matches!(
            self,
            Kind::Token | Kind::Shaper | Kind::Funnel | Kind::SmoothBursty | Kind::SmoothWarmingUp
        )
    }

    /// Whether `BENCH_KINDS` selects this limiter. Governor is always kept:
    /// the targets are ratios to it.
    fn selected(self, set: &Settings) -> bool {
        set.kinds.is_empty()
            || self == Kind::Governor
            || set.kinds.iter().any(|k| self.name().contains(k.as_str()))
    }

    fn name(self) -> &'static str {
        match self {
            Kind::Token => "TokenBucket",
            Kind::Meter => "LeakyBucket (meter)",
            Kind::Shaper => "LeakyBucket (shaper)",
            Kind::Funnel => "Funnel",
            Kind::SmoothBursty => "SmoothBursty",
            Kind::SmoothWarmingUp => "SmoothWarmingUp",
            Kind::Governor => "governor",
            Kind::LeakyCrate => "leaky-bucket",
            Kind::Semaphore => "Semaphore + refill",
        }
    }
}

/// The limiters compared by `try_acquire` (scenarios 1 and 2).
const TRY_KINDS: [Kind; 8] = [
    Kind::Token,
    Kind::Meter,
    Kind::Funnel,
    Kind::SmoothBursty,
    Kind::SmoothWarmingUp,
    Kind::Governor,
    Kind::LeakyCrate,
    Kind::Semaphore,
];

/// The limiters compared by `acquire` (scenarios 3, 4 and 6).
const WAIT_KINDS: [Kind; 8] = [
    Kind::Token,
    Kind::Shaper,
    Kind::Funnel,
    Kind::SmoothBursty,
    Kind::SmoothWarmingUp,
    Kind::Governor,
    Kind::LeakyCrate,
    Kind::Semaphore,
];

/// A built limiter.
enum Subject {
    Token(TokenBucket),
    Meter(LeakyBucket),
    Shaper(LeakyBucket),
    Funnel(Funnel),
    SmoothBursty(SmoothBursty),
    SmoothWarmingUp(SmoothWarmingUp),
    Governor(DefaultDirectRateLimiter),
    LeakyCrate(leaky_bucket::RateLimiter),
    /// The refill task, held only to be aborted with the Semaphore.
    Semaphore(Arc<Semaphore>, #[allow(dead_code)] Option<AbortOnDrop>),
}

/// Ends the Semaphore's refill task with the Semaphore.
struct AbortOnDrop(JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

fn nz(n: u32) -> NonZeroU32 {
    NonZeroU32::new(n).expect("non-zero")
}

/// `permits` per `period`, burst/capacity `capacity`, starting full.
#[derive(Debug, Clone, Copy)]
struct Spec {
    permits: u32,
    period: Duration,
    capacity: u32,
}

impl Spec {
    fn per_second(permits: u32, capacity: u32) -> Spec {
        Spec {
            permits,
            period: Duration::from_secs(1),
            capacity,
        }
    }

    fn interval(self) -> Duration {
        self.period / self.permits
    }

    fn rate(self) -> Rate {
        Rate::per(self.permits, self.period)
    }

    fn per_sec(self) -> f64 {
        f64::from(self.permits) / self.period.as_secs_f64()
    }

    fn quota(self) -> Quota {
        Quota::with_period(self.interval())
            .expect("non-zero interval")
            .allow_burst(nz(self.capacity))
    }

    fn leaky_crate(self) -> leaky_bucket::RateLimiter {
        // Its interval must be at least 1 ms: above 1 000/s, refill in
        // millisecond batches.
        let (interval, refill) = if self.interval() >= Duration::from_millis(1) {
            (self.interval(), 1)
        } else {
            let per_ms = (self.per_sec() / 1000.0).round();
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
            (Duration::from_millis(1), per_ms as usize)
        };
        leaky_bucket::RateLimiter::builder()
            .max(self.capacity as usize)
            .initial(self.capacity as usize)
            .refill(refill)
            .interval(interval)
            .build()
    }

    /// A Semaphore refilled the obvious way: one permit per `1/rate` tick.
    /// Needs a runtime.
    fn semaphore(self) -> Subject {
        let capacity = self.capacity as usize;
        let sem = Arc::new(Semaphore::new(capacity));
        let refill = {
            let sem = Arc::clone(&sem);
            let period = self.interval();
            tokio::spawn(async move {
                let mut tick = tokio::time::interval(period);
                loop {
                    tick.tick().await;
                    if sem.available_permits() < capacity {
                        sem.add_permits(1);
                    }
                }
            })
        };
        Subject::Semaphore(sem, Some(AbortOnDrop(refill)))
    }
}

/// A limiter for the `acquire` scenarios: `spec`, starting full. Call
/// inside the runtime.
fn build_wait(kind: Kind, spec: Spec) -> Subject {
    match kind {
        Kind::Token => Subject::Token(
            TokenBucket::builder()
                .rate(spec.rate())
                .capacity(spec.capacity)
                .build()
                .unwrap(),
        ),
        Kind::Meter | Kind::Shaper => {
            let b = LeakyBucket::builder()
                .rate(spec.rate())
                .capacity(spec.capacity)
                .build()
                .unwrap();
            if kind == Kind::Meter {
                Subject::Meter(b)
            } else {
                Subject::Shaper(b)
            }
        }
        Kind::Funnel => Subject::Funnel(
            Funnel::builder()
                .rate(spec.rate())
                .capacity(spec.capacity)
                .build()
                .unwrap(),
        ),
        // Guava's limiters take the same limit as a rate and a burst time
        // (bursty), or warm up over 100 ms from 3× slower.
        Kind::SmoothBursty => Subject::SmoothBursty(
            SmoothBursty::builder()
                .permits_per_second(spec.per_sec())
                .max_burst(Duration::from_secs_f64(
                    f64::from(spec.capacity) / spec.per_sec(),
                ))
                .build()
                .unwrap(),
        ),
        Kind::SmoothWarmingUp => Subject::SmoothWarmingUp(
            SmoothWarmingUp::builder()
                .permits_per_second(spec.per_sec())
                .warmup(Duration::from_millis(100))
                .build()
                .unwrap(),
        ),
        Kind::Governor => Subject::Governor(governor::RateLimiter::direct(spec.quota())),
        Kind::LeakyCrate => Subject::LeakyCrate(spec.leaky_crate()),
        Kind::Semaphore => spec.semaphore(),
    }
}

/// Allowed or denied `try_acquire`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Case {
    Allowed,
    Denied,
}

/// A limiter for the `try_acquire` scenarios. Allowed: 10⁹/s with a
/// capacity of 10⁹ (one second of tolerance, so that a thread descheduled
/// between reading the clock and deciding is still allowed), which calls
/// can never exhaust (the Semaphore: the most
/// permits it can hold, no refill task). Denied: one per hour, capacity 1,
/// exhausted by one call. Call inside the runtime.
fn build_try(kind: Kind, case: Case) -> Subject {
    match case {
        Case::Allowed => {
            if kind == Kind::Semaphore {
                Subject::Semaphore(Arc::new(Semaphore::new(Semaphore::MAX_PERMITS)), None)
            } else {
                build_wait(kind, Spec::per_second(1_000_000_000, 1_000_000_000))
            }
        }
        Case::Denied => {
            let spec = Spec {
                permits: 1,
                period: Duration::from_secs(3600),
                capacity: 1,
            };
            let s = if kind == Kind::Semaphore {
                Subject::Semaphore(Arc::new(Semaphore::new(1)), None)
            } else {
                build_wait(kind, spec)
            };
            assert!(
                s.try_acquire(),
                "{}: the first call is allowed",
                kind.name()
            );
            assert!(!s.try_acquire(), "{}: now exhausted", kind.name());
            s
        }
    }
}

impl Subject {
    fn try_acquire(&self) -> bool {
        match self {
            Subject::Token(b) => b.try_acquire().is_ok(),
            Subject::Meter(b) | Subject::Shaper(b) => b.try_acquire().is_ok(),
            Subject::Funnel(f) => f.try_acquire().is_ok(),
            Subject::SmoothBursty(l) => l.try_acquire().is_ok(),
            Subject::SmoothWarmingUp(l) => l.try_acquire().is_ok(),
            Subject::Governor(g) => g.check().is_ok(),
            Subject::LeakyCrate(l) => l.try_acquire(1),
            Subject::Semaphore(s, _) => s.try_acquire().map(|p| p.forget()).is_ok(),
        }
    }

    /// Waits for one permit; `false` when the limiter refused (the shaper's
    /// `Overflow`).
    async fn acquire(&self) -> bool {
        match self {
            Subject::Token(b) => b.acquire().await.is_ok(),
            // The meter has no waiting form of its own; `acquire` shapes.
            Subject::Meter(b) | Subject::Shaper(b) => b.acquire().await.is_ok(),
            Subject::Funnel(f) => f.acquire().await.is_ok(),
            Subject::SmoothBursty(l) => l.acquire().await.is_ok(),
            Subject::SmoothWarmingUp(l) => l.acquire().await.is_ok(),
            Subject::Governor(g) => {
                g.until_ready().await;
                true
            }
            Subject::LeakyCrate(l) => {
                l.acquire_one().await;
                true
            }
            Subject::Semaphore(s, _) => s.acquire().await.map(|p| p.forget()).is_ok(),
        }
    }

    /// `n` calls to `try_acquire` in a tight loop: elapsed time and how many
    /// were allowed. The match is outside the loop, so each arm is its own
    /// monomorphised loop.
    fn try_loop(&self, n: u64) -> (Duration, u64) {
        match self {
            Subject::Token(b) => time_loop(n, || b.try_acquire().is_ok()),
            Subject::Meter(b) | Subject::Shaper(b) => time_loop(n, || b.try_acquire().is_ok()),
            Subject::Funnel(f) => time_loop(n, || f.try_acquire().is_ok()),
            Subject::SmoothBursty(l) => time_loop(n, || l.try_acquire().is_ok()),
            Subject::SmoothWarmingUp(l) => time_loop(n, || l.try_acquire().is_ok()),
            Subject::Governor(g) => time_loop(n, || g.check().is_ok()),
            Subject::LeakyCrate(l) => time_loop(n, || l.try_acquire(1)),
            Subject::Semaphore(s, _) => {
                time_loop(n, || s.try_acquire().map(|p| p.forget()).is_ok())
            }
        }
    }
}

/// The initial burst a full limiter of capacity `capacity` grants at once:
/// the capacity, except for the shaper, which never bursts (one at once,
/// then one per interval).
fn burst(kind: Kind, capacity: u32) -> u32 {
    match kind {
        // The smooth limiters start with nothing stored (bursty) or cold
        // (warm-up): the first request is free, the rest are paced.
        Kind::Shaper | Kind::SmoothBursty | Kind::SmoothWarmingUp => 1,
        _ => capacity,
    }
}

fn time_loop(n: u64, mut f: impl FnMut() -> bool) -> (Duration, u64) {
    let start = Instant::now();
    let mut ok = 0u64;
    for _ in 0..n {
        ok += u64::from(f());
    }
    (start.elapsed(), black_box(ok))
}

#[allow(clippy::cast_precision_loss)]
fn ns_per(d: Duration, n: u64) -> f64 {
    d.as_secs_f64() * 1e9 / n as f64
}

/// "median (min–max)" of some nanosecond samples.
fn spread(samples: &[f64]) -> String {
    let lo = samples.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = samples.iter().copied().fold(0.0, f64::max);
    format!("{:.1} ({:.0}–{:.0})", median(samples), lo, hi)
}

fn ms(d: f64) -> String {
    format!("{:.3}", d * 1e3)
}

// ---------------------------------------------------------------------------
// Scenario 0: what the building blocks cost here

/// Two threads run `f` `n` times each, started together: the mean time a
/// thread took.
fn two_thread_loop(n: u64, f: impl Fn() + Sync) -> Duration {
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

fn calibration(set: &Settings) {
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
                    #[allow(unused_unsafe)]
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

// ---------------------------------------------------------------------------
// Scenario 1: try_acquire on one thread

fn try_one_thread(rt: &Runtime, set: &Settings) {
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
        0.5,
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

// ---------------------------------------------------------------------------
// Scenario 2: try_acquire from two threads on one limiter

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
    #[allow(clippy::cast_precision_loss)]
    let total = 2.0 * n as f64 / slowest.as_secs_f64();
    let on_cpu = res.iter().map(|(_, _, c)| c).sum::<f64>() / 2.0;
    (
        per_call,
        total,
        res.iter().map(|(_, ok, _)| ok).sum(),
        on_cpu,
    )
}

fn try_two_threads(rt: &Runtime, set: &Settings) {
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

// ---------------------------------------------------------------------------
// Scenario 3: pacing in real time

/// One pacing run.
struct Pacing {
    grants: usize,
    achieved: f64,
    /// Steady state: p50, p99, max lateness (s).
    late: [f64; 3],
    /// From the start signal: p99 lateness and the most early grant (s).
    from_start: [f64; 2],
    /// Process CPU seconds per second during the run.
    cpu: f64,
    /// The machine's own scheduling delay meanwhile, p99 and max (s): see
    /// [`NoiseProbe`].
    noise: [f64; 2],
    refused: u64,
    stalled: usize,
}

/// Grants before this offset from the start are warm-up: not scored in the
/// steady state (100 tasks waking up and the initial burst).
fn warm_up(run: Duration) -> Duration {
    (run / 4).min(Duration::from_millis(250))
}

/// Measures how late the OS wakes a plain thread that sleeps 1 ms, while a
/// run goes on: on a shared machine, a delay of several milliseconds means
/// the whole process was not running, whatever the limiter did.
struct NoiseProbe {
    stop: Arc<std::sync::atomic::AtomicBool>,
    thread: std::thread::JoinHandle<Vec<f64>>,
}

impl NoiseProbe {
    fn start() -> NoiseProbe {
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let thread = std::thread::spawn(move || {
            let mut delays = Vec::with_capacity(8192);
            while !flag.load(Ordering::Relaxed) {
                let t = Instant::now();
                std::thread::sleep(Duration::from_millis(1));
                delays.push((t.elapsed() - Duration::from_millis(1)).as_secs_f64());
            }
            delays
        });
        NoiseProbe { stop, thread }
    }

    /// The p99 and the max of the extra delay (s).
    fn finish(self) -> [f64; 2] {
        self.stop.store(true, Ordering::Relaxed);
        let mut d = self.thread.join().unwrap();
        d.sort_by(f64::total_cmp);
        if d.is_empty() {
            [0.0; 2]
        } else {
            [quantile(&d, 0.99), d[d.len() - 1]]
        }
    }
}

/// `tasks` tasks loop on `acquire()` for `run`; every grant is timestamped
/// by its task as soon as `acquire()` returns.
///
/// Steady state (the scored figures): the grants after the warm-up, in time
/// order, are numbered k = 0, 1, …, at times t_k. Grant k's ideal time is
/// s + k / rate, where s = min_k (t_k − k / rate) is the latest start of a
/// schedule at the configured rate that no grant precedes; lateness is
/// t_k − (s + k / rate) ≥ 0. A limiter that delivers exactly the rate,
/// woken on tokio's 1 ms ticks, shows lateness in [0, 1 ms] plus its wake-up
/// latency; one that falls behind shows lateness growing over the run.
/// Achieved rate = M / (run − warm-up) over the M scored grants.
///
/// From the start (reported beside it): grants counted from the start
/// signal, grant k's ideal time is `start` for k < B and
/// `start + (k + 1 − B) / rate` after, B being the initial burst (the
/// capacity; 1 for the shaper). This also charges the limiter with the
/// time the 100 tasks take to arrive, and shows over-admission as early
/// grants.
async fn pace(kind: Kind, spec: Spec, tasks: usize, run: Duration) -> Pacing {
    let subject = Arc::new(build_wait(kind, spec));
    let (tx, rx) = watch::channel(None::<Instant>);
    let handles: Vec<JoinHandle<(Vec<Instant>, u64)>> = (0..tasks)
        .map(|_| {
            let subject = Arc::clone(&subject);
            let mut rx = rx.clone();
            tokio::spawn(async move {
                let start = rx.wait_for(Option::is_some).await.unwrap().unwrap();
                let deadline = start + run;
                let mut times = Vec::with_capacity(8192);
                let mut refused = 0;
                loop {
                    if subject.acquire().await {
                        let now = Instant::now();
                        if now > deadline {
                            break;
                        }
                        times.push(now);
                    } else {
                        refused += 1;
                        tokio::time::sleep(Duration::from_millis(1)).await;
                        if Instant::now() > deadline {
                            break;
                        }
                    }
                }
                (times, refused)
            })
        })
        .collect();
    // Let every task park on the start signal.
    tokio::time::sleep(Duration::from_millis(50)).await;
    let probe = NoiseProbe::start();
    let cpu0 = cpu_time();
    let start = Instant::now();
    tx.send(Some(start)).unwrap();
    let mut times = Vec::new();
    let mut refused = 0;
    let mut stalled = 0;
    let give_up = tokio::time::Instant::from_std(start + run + Duration::from_secs(5));
    for mut h in handles {
        match tokio::time::timeout_at(give_up, &mut h).await {
            Ok(Ok((t, r))) => {
                times.extend(t);
                refused += r;
            }
            _ => {
                h.abort();
                stalled += 1;
            }
        }
    }
    let cpu = (cpu_time() - cpu0).as_secs_f64() / start.elapsed().as_secs_f64();
    let noise = probe.finish();
    drop(subject);
    let mut offsets: Vec<f64> = times
        .iter()
        .map(|t| t.duration_since(start).as_secs_f64())
        .collect();
    offsets.sort_by(f64::total_cmp);
    let rate = spec.per_sec();
    #[allow(clippy::cast_precision_loss)]
    let ideal = |k: usize| k as f64 / rate;

    // From the start signal, with the initial burst.
    let b = burst(kind, spec.capacity) as usize;
    let mut from_start: Vec<f64> = offsets
        .iter()
        .enumerate()
        .map(|(k, &t)| t - ideal((k + 1).saturating_sub(b)))
        .collect();
    from_start.sort_by(f64::total_cmp);

    // Steady state.
    let scored: Vec<f64> = offsets
        .iter()
        .copied()
        .filter(|&t| t >= warm_up(run).as_secs_f64())
        .collect();
    let s = scored
        .iter()
        .enumerate()
        .map(|(k, &t)| t - ideal(k))
        .fold(f64::INFINITY, f64::min);
    let mut late: Vec<f64> = scored
        .iter()
        .enumerate()
        .map(|(k, &t)| t - s - ideal(k))
        .collect();
    late.sort_by(f64::total_cmp);
    // Over the fixed window [warm-up, end]: grants per tick batch cut at
    // either end cancel out on average (counting from the first grant's
    // own time would count its batch, due up to a tick earlier, for free).
    #[allow(clippy::cast_precision_loss)]
    let achieved = scored.len() as f64 / (run - warm_up(run)).as_secs_f64() / rate;
    Pacing {
        grants: offsets.len(),
        achieved,
        late: if late.is_empty() {
            [f64::NAN; 3]
        } else {
            [
                quantile(&late, 0.5),
                quantile(&late, 0.99),
                late[late.len() - 1],
            ]
        },
        from_start: if from_start.is_empty() {
            [f64::NAN; 2]
        } else {
            [quantile(&from_start, 0.99), from_start[0].min(0.0)]
        },
        cpu,
        noise,
        refused,
        stalled,
    }
}

/// The median of one figure over several runs.
fn med(runs: &[Pacing], f: impl Fn(&Pacing) -> f64) -> f64 {
    median(&runs.iter().map(f).collect::<Vec<_>>())
}

fn pacing(rt: &Runtime, set: &Settings) {
    const TASKS: usize = 100;
    let mut t = Table::new(
        format!(
            "3. Pacing: {TASKS} tasks looping on acquire() for {:.0} s, 2 worker threads (median of {} runs)",
            set.pace.as_secs_f64(),
            set.rt_reps
        ),
        &[
            "limiter",
            "rate/s",
            "capacity",
            "grants",
            "achieved/configured",
            "p50 late ms",
            "p99 late ms",
            "max late ms",
            "from start: p99 late ms",
            "from start: most early ms",
            "CPU s per s",
            "machine noise p99 / max ms",
            "refused",
        ],
    );
    let mut misses = Vec::new();
    let mut checked = 0;
    for rate in [1_000u32, 100_000] {
        for capacity in [1u32, 100] {
            // The shaper's capacity bounds its queue and never bursts: give
            // it room for every task (100 waiting + 1 draining).
            let cap_of = |kind: Kind| {
                if kind == Kind::Shaper {
                    (TASKS as u32 + 1).max(capacity)
                } else {
                    capacity
                }
            };
            let kinds: Vec<Kind> = WAIT_KINDS.into_iter().filter(|k| k.selected(set)).collect();
            let mut runs: Vec<Vec<Pacing>> = kinds.iter().map(|_| Vec::new()).collect();
            // Repetitions interleave the limiters, as in scenario 1.
            for _ in 0..set.rt_reps {
                for (kind, r) in kinds.iter().zip(&mut runs) {
                    let spec = Spec::per_second(rate, cap_of(*kind));
                    r.push(rt.block_on(pace(*kind, spec, TASKS, set.pace)));
                }
            }
            for (&kind, r) in kinds.iter().zip(&runs) {
                let cap = cap_of(kind);
                let cap_label = if cap == capacity {
                    capacity.to_string()
                } else {
                    format!("{cap} (for {capacity})")
                };
                let refused: u64 = r.iter().map(|p| p.refused).sum();
                let stalled: usize = r.iter().map(|p| p.stalled).sum();
                #[allow(clippy::cast_precision_loss)]
                let grants = med(r, |p| p.grants as f64);
                let achieved = med(r, |p| p.achieved);
                let p99 = med(r, |p| p.late[1]);
                t.row(vec![
                    kind.name().to_string(),
                    rate.to_string(),
                    cap_label,
                    format!("{grants:.0}"),
                    format!("{achieved:.4}"),
                    ms(med(r, |p| p.late[0])),
                    ms(p99),
                    ms(med(r, |p| p.late[2])),
                    ms(med(r, |p| p.from_start[0])),
                    ms(med(r, |p| p.from_start[1])),
                    format!("{:.3}", med(r, |p| p.cpu)),
                    format!(
                        "{} / {}",
                        ms(med(r, |p| p.noise[0])),
                        ms(med(r, |p| p.noise[1]))
                    ),
                    if stalled > 0 {
                        format!("{refused} ({stalled} tasks stalled)")
                    } else {
                        refused.to_string()
                    },
                ]);
                if kind.is_crate_waiter() {
                    checked += 1;
                    if achieved < 0.999 {
                        misses.push(format!(
                            "{} {rate}/s cap {cap}: achieved {achieved:.4} < 0.999",
                            kind.name(),
                        ));
                    }
                    if p99 > 1.5e-3 {
                        misses.push(format!(
                            "{} {rate}/s cap {cap}: p99 lateness {} ms > 1.5 ms",
                            kind.name(),
                            ms(p99)
                        ));
                    }
                }
            }
        }
    }
    t.note(format!(
        "Steady state (scored): grants after a {:.2} s warm-up, numbered k = 0, 1, … in time order at t_k; \
         ideal time s + k/rate with s = min_k(t_k − k/rate), the latest schedule at the configured rate \
         that no grant precedes; lateness = t_k − ideal ≥ 0. Achieved = M/(run − warm-up)/rate over those M grants.",
        warm_up(set.pace).as_secs_f64()
    ));
    t.note(
        "From start: every grant from the start signal, ideal = start for the first B (B = capacity; \
         1 for the shaper, which never bursts), then start + (k + 1 − B)/rate; it also charges the \
         time the 100 tasks take to arrive, and shows over-admission as early grants.",
    );
    t.note(
        "The shaper's capacity bounds its queue (Overflow beyond it): it gets room for all \
         100 tasks. refused = calls that failed (each then sleeps 1 ms; total over the runs). \
         Machine noise: p99 and max of how late a plain thread wakes from a 1 ms sleep during the run \
         (a few ms: the process was not running, whatever the limiter did).",
    );
    t.note(format!(
        "- targets (crate limiters, {checked} cells): achieved ≥ 0.999 and p99 lateness ≤ 1.5 ms: {}",
        if misses.is_empty() {
            "met".to_string()
        } else {
            format!("MISSED in {} case(s)", misses.len())
        }
    ));
    for m in misses {
        t.note(format!("  - MISSED: {m}"));
    }
    t.print();
}

// ---------------------------------------------------------------------------
// Scenario 4: 10 000 waiters

struct Herd {
    cpu_per_sec: f64,
    spread: u64,
    achieved: f64,
}

/// `tasks` tasks loop on `acquire()`; after a settling half second, CPU
/// time and per-task grants are measured over `run`.
async fn herd(subject: Option<Subject>, tasks: usize, rate: f64, run: Duration) -> Herd {
    let subject = subject.map(Arc::new);
    let counts: Arc<Vec<AtomicU64>> = Arc::new((0..tasks).map(|_| AtomicU64::new(0)).collect());
    let handles: Vec<JoinHandle<()>> = match &subject {
        None => Vec::new(),
        Some(subject) => (0..tasks)
            .map(|i| {
                let subject = Arc::clone(subject);
                let counts = Arc::clone(&counts);
                tokio::spawn(async move {
                    loop {
                        if subject.acquire().await {
                            counts[i].fetch_add(1, Ordering::Relaxed);
                        } else {
                            tokio::time::sleep(Duration::from_millis(1)).await;
                        }
                    }
                })
            })
            .collect(),
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    let snap = || -> Vec<u64> { counts.iter().map(|c| c.load(Ordering::Relaxed)).collect() };
    let (c0, cpu0, t0) = (snap(), cpu_time(), Instant::now());
    tokio::time::sleep(run).await;
    let (c1, cpu1, t1) = (snap(), cpu_time(), Instant::now());
    for h in &handles {
        h.abort();
    }
    for h in handles {
        let _ = h.await;
    }
    drop(subject);
    tokio::time::sleep(Duration::from_millis(100)).await;
    let wall = (t1 - t0).as_secs_f64();
    let deltas: Vec<u64> = c1.iter().zip(&c0).map(|(a, b)| a - b).collect();
    let spread = deltas.iter().max().unwrap_or(&0) - deltas.iter().min().unwrap_or(&0);
    #[allow(clippy::cast_precision_loss)]
    let achieved = deltas.iter().sum::<u64>() as f64 / wall / rate;
    Herd {
        cpu_per_sec: (cpu1 - cpu0).as_secs_f64() / wall,
        spread,
        achieved,
    }
}

fn waiters(rt: &Runtime, set: &Settings) {
    let tasks = set.herd;
    let rate = 1_000;
    let mut t = Table::new(
        format!(
            "4. {tasks} tasks waiting on one limiter at {rate}/s, capacity 1 ({:.0} s after 0.5 s settling, one run each)",
            set.run.as_secs_f64()
        ),
        &[
            "limiter",
            "CPU s per s",
            "max − min grants/task",
            "achieved/configured",
        ],
    );
    let base = rt.block_on(herd(None, 0, 1.0, set.run));
    t.row(vec![
        "(idle runtime, no limiter)".into(),
        format!("{:.4}", base.cpu_per_sec),
        "—".into(),
        "—".into(),
    ]);
    let mut cpu = Vec::new();
    let mut spreads = Vec::new();
    for kind in WAIT_KINDS.into_iter().filter(|k| k.selected(set)) {
        let cap = if kind == Kind::Shaper {
            u32::try_from(tasks).unwrap() + 1
        } else {
            1
        };
        let spec = Spec::per_second(rate, cap);
        let h = rt.block_on(async {
            herd(Some(build_wait(kind, spec)), tasks, spec.per_sec(), set.run).await
        });
        t.row(vec![
            kind.name().to_string(),
            format!("{:.4}", h.cpu_per_sec),
            h.spread.to_string(),
            format!("{:.4}", h.achieved),
        ]);
        cpu.push((kind, h.cpu_per_sec));
        spreads.push((kind, h.spread));
    }
    t.note(format!(
        "The shaper gets capacity {} so that every waiter fits in its queue. CPU: getrusage, whole process.",
        tasks + 1
    ));
    let gov_cpu = cpu
        .iter()
        .find(|(k, _)| *k == Kind::Governor)
        .map_or(f64::NAN, |c| c.1);
    for (&(k, c), &(_, spread)) in cpu.iter().zip(&spreads) {
        if !k.is_crate_waiter() {
            continue;
        }
        t.note(ratio_line(
            &format!("{} CPU s per s", k.name()),
            c,
            "≤",
            0.05,
        ));
        t.note(ratio_line(
            &format!("governor CPU / {} CPU", k.name()),
            gov_cpu / c.max(1e-6),
            "≥",
            30.0,
        ));
        #[allow(clippy::cast_precision_loss)]
        t.note(ratio_line(
            &format!("{} max − min grants per task", k.name()),
            spread as f64,
            "≤",
            1.0,
        ));
    }
    t.print();
}

// ---------------------------------------------------------------------------
// Scenario 5: many keys, many idle limiters

/// ns per call for a hot key and for a random key among `keys`: medians.
/// Keyed checks: ns per call for a hot key and a random key, on one thread
/// and per thread with two.
struct KeyedTimes {
    hot: f64,
    random: f64,
    hot2: f64,
    random2: f64,
}

fn keyed_checks(check: impl Fn(u64) -> bool + Sync, keys: u64, set: &Settings) -> KeyedTimes {
    const HOT: u64 = 42;
    let mut hot = Vec::new();
    let mut random = Vec::new();
    let mut hot2 = Vec::new();
    let mut random2 = Vec::new();
    let n = set.calls / 2;
    for _ in 0..set.reps {
        hot2.push(ns_per(
            two_thread_loop(n / 2, || {
                black_box(check(HOT));
            }),
            n / 2,
        ));
        random2.push(ns_per(
            two_thread_loop(n / 2, || {
                // Each thread its own xorshift64 sequence.
                thread_local! {
                    static RNG: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
                }
                let x = RNG.with(|rng| {
                    let mut x = rng.get();
                    if x == 0 {
                        x = (std::ptr::addr_of!(rng) as u64) | 1;
                    }
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    rng.set(x);
                    x
                });
                black_box(check(x % keys));
            }),
            n / 2,
        ));
        hot.push(ns_per(time_loop(n, || check(HOT)).0, n));
        let rng = std::cell::Cell::new(0x9E37_79B9_7F4A_7C15u64);
        let d = time_loop(n, || {
            // xorshift64: a couple of ns, counted in the figure.
            let mut x = rng.get();
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            rng.set(x);
            check(x % keys)
        })
        .0;
        random.push(ns_per(d, n));
    }
    KeyedTimes {
        hot: median(&hot),
        random: median(&random),
        hot2: median(&hot2),
        random2: median(&random2),
    }
}

fn memory(rt: &Runtime, set: &Settings) {
    let mut t = Table::new(
        format!(
            "5. Many keys and many idle limiters (ns: median of {} × {} checks)",
            set.reps,
            set.calls / 2
        ),
        &[
            "subject",
            "bytes each",
            "ns/check hot key (1 / 2 threads)",
            "ns/check random key (1 / 2 threads)",
            "idle CPU s per s",
        ],
    );
    // KeyedFunnel: 1 M distinct u64 keys, the same quota as governor's: a
    // slow rate, so that every key keeps water (KeyedFunnel drops drained
    // keys, which would make its memory figure meaningless).
    let ours = {
        trim_heap();
        let before = rss_bytes();
        let limiter: KeyedFunnel<u64> = KeyedFunnel::builder()
            .rate(Rate::per_second(1))
            .capacity(10_000_000)
            .build()
            .unwrap();
        for k in 0..set.keys {
            assert!(limiter.try_acquire(&k).is_ok());
        }
        // Live memory: the tables freed while the map grew go back first.
        trim_heap();
        let after = rss_bytes();
        #[allow(clippy::cast_precision_loss)]
        let bytes = (after.saturating_sub(before)) as f64 / set.keys as f64;
        let times = keyed_checks(|k| limiter.try_acquire(&k).is_ok(), set.keys, set);
        t.row(vec![
            format!("KeyedFunnel, {} keys", set.keys),
            format!("{bytes:.1}"),
            format!("{:.1} / {:.1}", times.hot, times.hot2),
            format!("{:.1} / {:.1}", times.random, times.random2),
            "—".into(),
        ]);
        drop(limiter);
        (bytes, times)
    };
    // governor keyed: 1 M distinct u64 keys.
    let theirs = {
        trim_heap();
        let before = rss_bytes();
        let limiter: DefaultKeyedRateLimiter<u64> =
            governor::RateLimiter::keyed(Quota::per_second(nz(1)).allow_burst(nz(10_000_000)));
        for k in 0..set.keys {
            assert!(limiter.check_key(&k).is_ok());
        }
        trim_heap();
        let after = rss_bytes();
        #[allow(clippy::cast_precision_loss)]
        let bytes = (after.saturating_sub(before)) as f64 / set.keys as f64;
        let times = keyed_checks(|k| limiter.check_key(&k).is_ok(), set.keys, set);
        t.row(vec![
            format!("governor keyed (dashmap), {} keys", set.keys),
            format!("{bytes:.1}"),
            format!("{:.1} / {:.1}", times.hot, times.hot2),
            format!("{:.1} / {:.1}", times.random, times.random2),
            "—".into(),
        ]);
        drop(limiter);
        (bytes, times)
    };
    // A flood of one-shot keys against max_keys, with a legitimate client
    // using its own key throughout: memory stays bounded, and the client
    // keeps its exact limit (it never gets more than capacity + rate × T).
    let flood_note = {
        let flood = set.keys * 10;
        let max_keys = usize::try_from(set.keys / 10).unwrap_or(usize::MAX);
        let rate = Rate::per_second(10);
        trim_heap();
        let before = rss_bytes();
        let limiter: KeyedFunnel<u64> = KeyedFunnel::builder()
            .rate(rate)
            .capacity(3)
            .max_keys(max_keys)
            .build()
            .unwrap();
        let legit = u64::MAX;
        let start = Instant::now();
        let (mut admitted, mut legit_granted) = (0u64, 0u64);
        for k in 0..flood {
            admitted += u64::from(limiter.try_acquire(&k).is_ok());
            if k % 1000 == 0 {
                legit_granted += u64::from(limiter.try_acquire(&legit).is_ok());
            }
        }
        let elapsed = start.elapsed().as_secs_f64();
        let peak = rss_bytes();
        let stats = limiter.stats();
        // The client asks every 1000 flood keys, far more often than its
        // 10/s: it should get its whole allowance, and never more.
        #[allow(clippy::cast_precision_loss)]
        let allowance = 3.0 + 10.0 * elapsed;
        drop(limiter);
        #[allow(clippy::cast_precision_loss)]
        let mb = peak.saturating_sub(before) as f64 / 1e6;
        t.row(vec![
            format!("KeyedFunnel flood: {flood} one-shot keys, max_keys {max_keys}"),
            format!("{mb:.1} MB in all"),
            "—".into(),
            "—".into(),
            "—".into(),
        ]);
        #[allow(clippy::cast_precision_loss)]
        let ok =
            (legit_granted as f64) <= allowance + 1e-9 && (legit_granted as f64) >= allowance - 2.0;
        format!(
            "- flood: {admitted} flood keys admitted, {} refused, {} keys held at the end (≤ {max_keys}); \
             the legitimate key got {legit_granted} of its allowance 3 + 10/s × {elapsed:.2} s = {allowance:.1}: {}",
            stats.refused,
            stats.keys,
            if ok { "exact" } else { "MISSED" }
        )
    };
    let keyed_notes = [
        ratio_line(
            "KeyedFunnel bytes per key / governor keyed",
            ours.0 / theirs.0,
            "≤",
            1.0,
        ),
        ratio_line(
            "KeyedFunnel hot key / governor keyed",
            ours.1.hot / theirs.1.hot,
            "≤",
            1.0,
        ),
        ratio_line(
            "KeyedFunnel random key / governor keyed",
            ours.1.random / theirs.1.random,
            "≤",
            1.0,
        ),
        ratio_line(
            "KeyedFunnel hot key, 2 threads / governor keyed",
            ours.1.hot2 / theirs.1.hot2,
            "≤",
            1.0,
        ),
        ratio_line(
            "KeyedFunnel random key, 2 threads / governor keyed",
            ours.1.random2 / theirs.1.random2,
            "≤",
            1.0,
        ),
    ];
    // Idle limiters: built, used once (one permit taken), then left alone.
    let idle = set.idle;
    let mut idle_row = |name: &str, make: &dyn Fn() -> Box<dyn std::any::Any + Send>| {
        trim_heap();
        let before = rss_bytes();
        let all: Vec<Box<dyn std::any::Any + Send>> = {
            let _guard = rt.enter();
            (0..idle).map(|_| make()).collect()
        };
        // Let any actors park.
        rt.block_on(async { tokio::time::sleep(Duration::from_millis(200)).await });
        let after = rss_bytes();
        let (cpu0, t0) = (cpu_time(), Instant::now());
        rt.block_on(async { tokio::time::sleep(Duration::from_secs(2)).await });
        let cpu = (cpu_time() - cpu0).as_secs_f64() / t0.elapsed().as_secs_f64();
        drop(all);
        rt.block_on(async { tokio::time::sleep(Duration::from_millis(200)).await });
        #[allow(clippy::cast_precision_loss)]
        let bytes = after.saturating_sub(before) as f64 / idle as f64;
        t.row(vec![
            format!("{idle} idle {name}"),
            format!("{bytes:.0}"),
            "—".into(),
            "—".into(),
            format!("{cpu:.4}"),
        ]);
        cpu
    };
    let spec = Spec::per_second(100, 10);
    let token_cpu = idle_row("TokenBucket", &|| {
        let b = TokenBucket::builder()
            .rate(spec.rate())
            .capacity(spec.capacity)
            .build()
            .unwrap();
        assert!(b.try_acquire().is_ok());
        Box::new(b)
    });
    idle_row("Funnel", &|| {
        let f = Funnel::builder()
            .rate(spec.rate())
            .capacity(spec.capacity)
            .build()
            .unwrap();
        assert!(f.try_acquire().is_ok());
        Box::new(f)
    });
    idle_row("SmoothBursty", &|| {
        let l = SmoothBursty::builder()
            .permits_per_second(spec.per_sec())
            .build()
            .unwrap();
        assert!(l.try_acquire().is_ok());
        Box::new(l)
    });
    idle_row("governor direct", &|| {
        let g = governor::RateLimiter::direct(spec.quota());
        assert!(g.check().is_ok());
        Box::new(g)
    });
    t.note(
        "bytes: resident-memory delta (/proc/self/statm, heap trimmed before and, for the keyed maps, after filling) over the count. \
         Keyed: 1/s, burst 10⁷ (every check allowed, and every key stays active, so nothing is evicted); random keys by xorshift64 (included). \
         Idle limiters: 100/s, capacity 10, one permit taken, then 2 s idle; \
         TokenBucket includes its parked actor task.",
    );
    for note in keyed_notes {
        t.note(note);
    }
    t.note(flood_note);
    t.note(ratio_line(
        "idle TokenBuckets, CPU s per s (an idle limiter costs no CPU)",
        token_cpu,
        "≤",
        0.001,
    ));
    t.print();
}

// ---------------------------------------------------------------------------
// Scenario 6: cancellation

struct Cancel {
    before: f64,
    after: f64,
    max_gap: f64,
}

/// `tasks` tasks loop on `acquire()`; at 1 s every other one is aborted
/// (dropped while it waits); the survivors run until `1 s + run`.
async fn cancel(kind: Kind, spec: Spec, tasks: usize, run: Duration) -> Cancel {
    let subject = Arc::new(build_wait(kind, spec));
    let log = Arc::new(Mutex::new(Vec::<Instant>::with_capacity(16_384)));
    let start = Instant::now();
    let handles: Vec<JoinHandle<()>> = (0..tasks)
        .map(|_| {
            let subject = Arc::clone(&subject);
            let log = Arc::clone(&log);
            tokio::spawn(async move {
                loop {
                    if subject.acquire().await {
                        log.lock().unwrap().push(Instant::now());
                    } else {
                        tokio::time::sleep(Duration::from_millis(1)).await;
                    }
                }
            })
        })
        .collect();
    let cut = start + Duration::from_secs(1);
    tokio::time::sleep_until(cut.into()).await;
    let cut = Instant::now();
    for h in handles.iter().step_by(2) {
        h.abort();
    }
    let end = cut + run;
    tokio::time::sleep_until(end.into()).await;
    for h in &handles {
        h.abort();
    }
    for h in handles {
        let _ = h.await;
    }
    drop(subject);
    let mut log = std::mem::take(&mut *log.lock().unwrap());
    log.sort();
    let rate = spec.per_sec();
    let window = |a: Instant, b: Instant| {
        let n = log.iter().filter(|&&t| t > a && t <= b).count();
        #[allow(clippy::cast_precision_loss)]
        let r = n as f64 / (b - a).as_secs_f64() / rate;
        r
    };
    let before = window(start + Duration::from_millis(200), cut);
    let after = window(cut, end);
    let mut max_gap = 0.0f64;
    let mut prev = cut;
    for &t in log.iter().filter(|&&t| t > cut && t <= end) {
        max_gap = max_gap.max((t - prev).as_secs_f64());
        prev = t;
    }
    Cancel {
        before,
        after,
        max_gap,
    }
}

fn cancellation(rt: &Runtime, set: &Settings) {
    const TASKS: usize = 1_000;
    let rate = 1_000;
    let mut t = Table::new(
        format!(
            "6. Cancellation: {TASKS} waiters at {rate}/s, capacity 1; every other one dropped mid-wait at 1 s; survivors measured for {:.0} s",
            set.run.as_secs_f64()
        ),
        &[
            "limiter",
            "achieved/configured before",
            "achieved/configured after",
            "longest gap after ms",
        ],
    );
    let mut after = Vec::new();
    for kind in WAIT_KINDS.into_iter().filter(|k| k.selected(set)) {
        let cap = if kind == Kind::Shaper {
            TASKS as u32 + 1
        } else {
            1
        };
        let c = rt.block_on(cancel(kind, Spec::per_second(rate, cap), TASKS, set.run));
        t.row(vec![
            kind.name().to_string(),
            format!("{:.4}", c.before),
            format!("{:.4}", c.after),
            ms(c.max_gap),
        ]);
        after.push((kind, c.after));
    }
    t.note(
        "before: grants in [0.2 s, 1 s]; after: grants from the drop to the end, over that time \
         (the drop's aftermath included). The shaper gets capacity 1001.",
    );
    for (k, a) in after {
        if k.is_crate_waiter() {
            t.note(ratio_line(
                &format!("{} achieved/configured after the drop", k.name()),
                a,
                "≥",
                0.999,
            ));
        }
    }
    t.print();
}

// ---------------------------------------------------------------------------

fn main() {
    let set = Settings::from_env();
    let filters: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    let wanted =
        |name: &str| filters.is_empty() || filters.iter().any(|f| name.contains(f.as_str()));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let began = Instant::now();
    println!("## tokio-ratelimit benchmarks (issue 5)\n");
    println!("- date: {} (UTC)", today_utc());
    println!("- machine: {}", machine());
    println!("- command: `cargo bench -p tokio-ratelimit-benches`");
    println!(
        "- settings: {} repetitions of {} calls per timed loop; pacing: {} runs of {:.0} s per cell; \
         other real-time runs: one of {:.0} s; tokio without test-util",
        set.reps,
        set.calls,
        set.rt_reps,
        set.pace.as_secs_f64(),
        set.run.as_secs_f64()
    );
    println!("- load average (1 min) at start: {}", load_average());
    if wanted("calibration") {
        calibration(&set);
    }
    if wanted("try") {
        try_one_thread(&rt, &set);
    }
    if wanted("threads") {
        try_two_threads(&rt, &set);
    }
    if wanted("pacing") {
        pacing(&rt, &set);
    }
    if wanted("herd") {
        waiters(&rt, &set);
    }
    if wanted("memory") {
        memory(&rt, &set);
    }
    if wanted("cancel") {
        cancellation(&rt, &set);
    }
    println!(
        "\n- finished in {:.0} s; load average (1 min) at end: {}",
        began.elapsed().as_secs_f64(),
        load_average()
    );
}
