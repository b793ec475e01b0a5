//! Real-thread stress tests: every limiter, raced by OS threads and by the
//! tasks of a multi-thread runtime, in real time (not paused).
//!
//! The paused-clock tests check the arithmetic on one thread; these check
//! that it survives contention. Each test makes saturating demand for a
//! few hundred milliseconds — threads calling `try_acquire` and
//! `try_acquire_many` in a tight loop ([`hammer`]), or tasks mixing
//! `acquire`, `acquire_many`, `try_acquire` and `acquire_timeout` and
//! dropping waits at random ([`storm`]) — and asserts, with every grant
//! counted exactly:
//!
//! * **no over-admission**: per limiter (per key), granted ≤ burst +
//!   rate × T, with `T` from before the limiter was built to after the last
//!   grant: exactly for `try_acquire`, with [`WAITER_SLACK`] for waiters;
//! * **no under-delivery**: granted ≥ 99 % of rate × T', with `T'` up to
//!   the last instant the limiter was seen empty (each run ends by draining
//!   it) — less, for `SmoothWarmingUp`, what Guava's warm-up gives up;
//! * **exact counters**: `stats()` equals what the callers saw.
//!
//! The tests take [`SERIAL`] so that they never compete with each other
//! for the machine's cores (the lower bound needs the callers to run),
//! whatever `--test-threads` says.

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use futures::FutureExt;
use tokio_ratelimit::keyed::{Keyed, KeyedFunnel, KeyedLimiter, KeyedStats};
use tokio_ratelimit::tower::{BoxError, KeyedRateLimitLayer, RateLimitLayer, RateLimited};
use tokio_ratelimit::{
    AcquireError, Funnel, LeakyBucket, Limiter, Peek, Quota, Rate, SmoothBursty, SmoothWarmingUp,
    Stats, TokenBucket, TryAcquireError,
};
use tower::{Layer, ServiceExt, service_fn};

/// One stress test at a time.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(PoisonError::into_inner)
}

/// How long each test makes demand.
const RUN: Duration = Duration::from_millis(400);

/// The rate of the bucket family (token, leaky, funnel, keyed) in permits
/// per second, and its capacity: 50 ms of the rate, so that callers all
/// descheduled at once (on a loaded machine, for a few timeslices) lose
/// nothing to the cap. The upper bound is exact whatever the capacity.
const RATE: u64 = 20_000;
const CAPACITY: u32 = 1_000;

/// The smooth limiters' rate: 31 250/s is a stable interval of exactly
/// 32 µs, a power of two, so Guava's microsecond arithmetic (fresh permits
/// × interval, stored permits = idle µs / interval) is exact in doubles and
/// no request is cheaper than its weight: the crate's per-request
/// truncation term is zero here.
const SMOOTH_RATE: u64 = 31_250;

/// Grants to waiters come on tokio's 1 ms timer ticks, and a waiter woken
/// late may take a credit for its lateness: one tick for each.
const WAITER_SLACK: Duration = Duration::from_millis(2);

/// Longer than any limiter here takes to hand out what it holds at the
/// end of a run.
const DRAIN_LIMIT: Duration = Duration::from_millis(200);

/// The share of rate × T that saturating demand must get.
const LOWER: f64 = 0.99;

/// A small deterministic generator (xorshift64*), one per caller.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform in `0..n`.
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    /// A request size: 1 half the time, else 2 to `max_n`.
    fn weight(&mut self, max_n: u32) -> u32 {
        if max_n == 1 || self.below(2) == 0 {
            1
        } else {
            2 + u32::try_from(self.below(u64::from(max_n - 1))).unwrap()
        }
    }
}

/// The demand of a run: how many callers, for how long, asking for up to
/// `max_n` permits at a time from one of `slots` limiters (keys).
#[derive(Debug, Clone, Copy)]
struct Load {
    callers: usize,
    run: Duration,
    max_n: u32,
    slots: usize,
    /// Made before the limiter is built: for a limiter that stores idle
    /// time, the upper bound's window starts here.
    origin: Instant,
}

impl Load {
    /// Make it before building the limiter.
    fn new(callers: usize, max_n: u32, slots: usize) -> Load {
        Load {
            callers,
            run: RUN,
            max_n,
            slots,
            origin: Instant::now(),
        }
    }
}

/// What the callers of a run saw.
#[derive(Debug, Default)]
struct Tally {
    /// Permits granted, per slot.
    granted: Vec<u64>,
    /// Requests refused (limited, timed out, overflowed).
    refused: u64,
    /// Waits given up by dropping the future.
    cancelled: u64,
    /// From before the first call to after the last grant.
    upper: Duration,
    /// From before the limiter was built to before the first call.
    built: Duration,
    /// Over grants by threads, from the start of the attempt before (by
    /// any thread) to the end of the granted one: at most that long, the
    /// limiter had a permit and nobody asked for it. (Not measured for
    /// tasks.)
    lag: Duration,
    /// Per slot, from before the first call to the last instant the slot
    /// was seen drained (each run ends by draining every slot).
    lower: Vec<Duration>,
    /// Per slot, the whole permits its deepest band still held then: a
    /// quota's short band refuses the drain while the long one may still
    /// hold what it gathered while every thread was descheduled (the short
    /// band limits how fast the callers catch up); 0 for one band.
    left: Vec<u32>,
}

impl Tally {
    fn granted(&self) -> u64 {
        self.granted.iter().sum()
    }
}

/// Counters shared by the callers of a run.
struct Shared {
    granted: Vec<AtomicU64>,
    refused: AtomicU64,
    cancelled: AtomicU64,
    /// Nanoseconds since the start, maxima over callers.
    last_grant: AtomicU64,
    last_attempt: AtomicU64,
    /// Over grants, nanoseconds since the attempt before (by any caller).
    lag: AtomicU64,
    /// Per slot: when the latest drain's refusal was asked for, and what
    /// the slot's deepest band held right after it.
    drained: Vec<Mutex<(u64, u32)>>,
    stop: AtomicBool,
}

impl Shared {
    fn new(slots: usize) -> Shared {
        Shared {
            granted: (0..slots).map(|_| AtomicU64::new(0)).collect(),
            refused: AtomicU64::new(0),
            cancelled: AtomicU64::new(0),
            last_grant: AtomicU64::new(0),
            last_attempt: AtomicU64::new(0),
            lag: AtomicU64::new(0),
            drained: (0..slots).map(|_| Mutex::new((0, 0))).collect(),
            stop: AtomicBool::new(false),
        }
    }

    fn since(start: Instant) -> u64 {
        u64::try_from(start.elapsed().as_nanos()).unwrap()
    }

    /// Notes an attempt starting `at` ns after the start; returns when the
    /// latest attempt before it started.
    fn attempt(&self, at: u64) -> u64 {
        self.last_attempt.fetch_max(at, Ordering::Relaxed).min(at)
    }

    fn grant(&self, start: Instant, slot: usize, n: u32) {
        self.granted[slot].fetch_add(u64::from(n), Ordering::Relaxed);
        self.last_grant
            .fetch_max(Shared::since(start), Ordering::Relaxed);
    }

    /// Takes single permits from `slot` until refused, and notes when
    /// that refusal was asked for (the slot was empty then, in the band that
    /// refused) and what `left()` says its deepest band held. A limiter
    /// that does not run dry within [`DRAIN_LIMIT`] fails the test rather
    /// than hanging it.
    fn drain(
        &self,
        start: Instant,
        slot: usize,
        attempt: impl Fn() -> bool,
        left: impl Fn() -> u32,
    ) {
        let limit = Instant::now() + DRAIN_LIMIT;
        loop {
            let at = Shared::since(start);
            if attempt() {
                self.grant(start, slot, 1);
                assert!(
                    Instant::now() < limit,
                    "slot {slot} never runs dry: it over-admits"
                );
            } else {
                self.refused.fetch_add(1, Ordering::Relaxed);
                let left = left();
                let mut drained = self.drained[slot].lock().unwrap();
                if at >= drained.0 {
                    *drained = (at, left);
                }
                return;
            }
        }
    }

    /// The tally of a run that started at `start`, for a limiter built
    /// after `origin`.
    fn tally(&self, origin: Instant, start: Instant) -> Tally {
        let drained: Vec<(u64, u32)> = self.drained.iter().map(|d| *d.lock().unwrap()).collect();
        Tally {
            granted: self
                .granted
                .iter()
                .map(|g| g.load(Ordering::Relaxed))
                .collect(),
            refused: self.refused.load(Ordering::Relaxed),
            cancelled: self.cancelled.load(Ordering::Relaxed),
            upper: Duration::from_nanos(self.last_grant.load(Ordering::Relaxed)),
            built: start - origin,
            lag: Duration::from_nanos(self.lag.load(Ordering::Relaxed)),
            lower: drained
                .iter()
                .map(|&(at, _)| Duration::from_nanos(at))
                .collect(),
            left: drained.iter().map(|&(_, left)| left).collect(),
        }
    }
}

/// Races `load.callers` OS threads calling `attempt(slot, n)` ("try once to
/// take `n` permits of limiter `slot`; granted?") in a tight loop for
/// `load.run`. Then each thread drains every slot (tries single permits
/// until refused), so that each slot is known to have been empty at an
/// instant near the end: its lower bound runs to the last such instant.
fn hammer(load: Load, attempt: impl Fn(usize, u32) -> bool + Sync) -> Tally {
    hammer_bands(load, attempt, |_| 0)
}

/// [`hammer`], `left(slot)` what the slot's deepest band holds (see
/// [`Tally::left`]).
fn hammer_bands(
    load: Load,
    attempt: impl Fn(usize, u32) -> bool + Sync,
    left: impl Fn(usize) -> u32 + Sync,
) -> Tally {
    let shared = Shared::new(load.slots);
    // Every thread is spawned when the first barrier opens; the clock is
    // read, and the second one lets them go: so the start is before the
    // first call, and barely (a bucket is full then, and what would fall
    // due before the first call is lost to the cap).
    let (spawned, go) = (
        Barrier::new(load.callers + 1),
        Barrier::new(load.callers + 1),
    );
    let start = std::sync::OnceLock::new();
    std::thread::scope(|scope| {
        for caller in 0..load.callers {
            let (shared, spawned, go, start, attempt, left) =
                (&shared, &spawned, &go, &start, &attempt, &left);
            scope.spawn(move || {
                let mut rng = Rng::new(caller as u64 + 1);
                spawned.wait();
                go.wait();
                let start = *start.get().expect("set before the second barrier");
                while !shared.stop.load(Ordering::Relaxed) {
                    let slot = usize::try_from(rng.below(load.slots as u64)).unwrap();
                    let n = rng.weight(load.max_n);
                    let before = shared.attempt(Shared::since(start));
                    if attempt(slot, n) {
                        let gap = Shared::since(start).saturating_sub(before);
                        shared.lag.fetch_add(gap, Ordering::Relaxed);
                        shared.grant(start, slot, n);
                    } else {
                        shared.refused.fetch_add(1, Ordering::Relaxed);
                    }
                }
                for slot in 0..load.slots {
                    shared.drain(start, slot, || attempt(slot, 1), || left(slot));
                }
            });
        }
        spawned.wait();
        start.set(Instant::now()).unwrap();
        go.wait();
        std::thread::sleep(load.run);
        shared.stop.store(true, Ordering::Relaxed);
    });
    let start = start.into_inner().unwrap();
    shared.tally(load.origin, start)
}

/// What a task of [`storm`] does next.
#[derive(Debug, Clone, Copy)]
enum Op {
    /// `try_acquire` (one permit) or `try_acquire_many`.
    Try,
    /// `acquire` or `acquire_many`, waited out.
    Acquire,
    /// `acquire_many`, dropped after a random 0–2 ms if still waiting.
    Cancel,
    /// `acquire_timeout` with a random 0–3 ms timeout.
    Timeout,
}

/// Every operation.
const ALL: &[Op] = &[Op::Try, Op::Acquire, Op::Cancel, Op::Timeout];
/// The keyed maps have no `acquire_timeout`.
const NO_TIMEOUT: &[Op] = &[Op::Try, Op::Acquire, Op::Cancel];

/// Whether a limiter's error is a refusal (counted in `stats()`), as
/// opposed to a bug of this test or the limiter.
fn refusal_try(error: TryAcquireError) {
    assert!(
        matches!(error, TryAcquireError::Limited { .. }),
        "unexpected {error:?}"
    );
}

fn refusal(error: AcquireError) {
    assert!(
        matches!(error, AcquireError::Timeout | AcquireError::Overflow),
        "unexpected {error:?}"
    );
}

/// Runs `load.callers` tasks on the current (multi-thread) runtime for
/// `load.run`, each picking an operation from `ops` at random, on limiter
/// `slots[i]` for a random `i`. A refused task yields before its next try,
/// so that busy refusals do not starve the waiters on the two workers.
/// When demand stops, every task finishes what it is waiting for, and
/// the limiters are drained as in [`hammer`].
async fn storm(load: Load, ops: &'static [Op], slots: Vec<Arc<dyn Limiter>>) -> Tally {
    assert_eq!(slots.len(), load.slots);
    let shared = Arc::new(Shared::new(load.slots));
    let slots = Arc::new(slots);
    let start = Instant::now();
    let tasks: Vec<_> = (0..load.callers)
        .map(|task| {
            let (shared, slots) = (Arc::clone(&shared), Arc::clone(&slots));
            tokio::spawn(async move {
                let mut rng = Rng::new(task as u64 + 1);
                while !shared.stop.load(Ordering::Relaxed) {
                    let slot = usize::try_from(rng.below(load.slots as u64)).unwrap();
                    let limiter = &slots[slot];
                    let n = rng.weight(load.max_n);
                    let op = ops[usize::try_from(rng.below(ops.len() as u64)).unwrap()];

                    let granted = match op {
                        Op::Try => Some(
                            if n == 1 {
                                limiter.try_acquire()
                            } else {
                                limiter.try_acquire_many(n)
                            }
                            .map_err(refusal_try),
                        ),
                        Op::Acquire => Some(
                            if n == 1 {
                                limiter.acquire().await
                            } else {
                                limiter.acquire_many(n).await
                            }
                            .map_err(refusal),
                        ),
                        Op::Cancel => {
                            let patience = Duration::from_micros(rng.below(2_000));
                            tokio::time::timeout(patience, limiter.acquire_many(n))
                                .await
                                .ok()
                                .map(|result| result.map_err(refusal))
                        }
                        Op::Timeout => {
                            let timeout = Duration::from_micros(rng.below(3_000));
                            Some(limiter.acquire_timeout(n, timeout).await.map_err(refusal))
                        }
                    };
                    match granted {
                        Some(Ok(())) => shared.grant(start, slot, n),
                        Some(Err(())) => {
                            shared.refused.fetch_add(1, Ordering::Relaxed);
                            tokio::task::yield_now().await;
                        }
                        None => {
                            shared.cancelled.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
            })
        })
        .collect();
    tokio::time::sleep(load.run).await;
    shared.stop.store(true, Ordering::Relaxed);
    for task in tasks {
        task.await.unwrap();
    }
    // What the tasks left (tokens, stored permits) is taken, so that the
    // lower bound can run to when each limiter was empty.
    for (slot, limiter) in slots.iter().enumerate() {
        shared.drain(
            start,
            slot,
            || try_once(limiter.as_ref(), 1),
            || deepest_band_left(limiter.peek(1).as_ref()),
        );
    }
    shared.tally(load.origin, start)
}

/// What a run must stay within, per slot.
#[derive(Debug, Clone, Copy)]
struct Bound {
    /// Permits per second.
    rate: u64,
    /// Permits that may go on top of rate × T (the capacity; for the
    /// smooth limiters, stored permits and the request that pays later).
    burst: u64,
    /// Added to T in the upper bound: zero for `try_acquire`, the timer's
    /// ticks for waiters.
    slack: Duration,
    /// Whether the upper bound's window starts when the limiter was built
    /// (it stores idle time, from empty) rather than at the first call (a
    /// bucket is full then, whenever it was built).
    from_build: bool,
    /// Permits the lower bound expects on top of rate × T': the capacity
    /// of a bucket, which starts full and is drained at the end.
    floor_burst: u64,
    /// Taken off T' in the lower bound (a warm-up limiter's slow start).
    deficit: Duration,
    /// The lower bound's rate: `rate`, or less for a limiter that may be
    /// cold.
    floor: u64,
    /// Whether [`Tally::lag`] is taken off T' in the lower bound: a warm-up
    /// limiter never catches up the time a permit waited for a caller (it
    /// cools instead).
    lag: bool,
}

impl Bound {
    fn exact(rate: u64, burst: u64) -> Bound {
        Bound {
            rate,
            burst,
            slack: Duration::ZERO,
            from_build: false,
            floor_burst: 0,
            deficit: Duration::ZERO,
            floor: rate,
            lag: false,
        }
    }

    fn waiters(self) -> Bound {
        Bound {
            slack: WAITER_SLACK,
            ..self
        }
    }

    /// rate × `span`, rounded down.
    fn over(&self, span: Duration) -> u64 {
        per(self.rate, span)
    }
}

/// `rate` per second × `span`, rounded down.
fn per(rate: u64, span: Duration) -> u64 {
    u64::try_from(u128::from(rate) * span.as_nanos() / 1_000_000_000).unwrap()
}

impl Bound {
    /// The lower bound's span: `span` less what the limiter may lose.
    fn due_span(&self, span: Duration, lag: Duration) -> Duration {
        let lag = if self.lag { lag } else { Duration::ZERO };
        span.saturating_sub(self.deficit + lag)
    }
}

/// Asserts the upper bound per slot and the lower bound over all slots.
fn check(what: &str, tally: &Tally, bound: Bound) {
    let window = tally.upper
        + bound.slack
        + if bound.from_build {
            tally.built
        } else {
            Duration::ZERO
        };
    let allowed = bound.burst + bound.over(window);
    let due: u64 = tally
        .lower
        .iter()
        .zip(&tally.left)
        .map(|(&span, &left)| {
            (bound.floor_burst + per(bound.floor, bound.due_span(span, tally.lag)))
                .saturating_sub(u64::from(left))
        })
        .sum();
    #[expect(clippy::cast_precision_loss, reason = "counts far below 2^52")]
    let (granted, due_f) = (tally.granted() as f64, due as f64);
    eprintln!(
        "{what}: granted {:?} (total {}) in {:?}, allowed {allowed} per slot; due {due} (lower \
         spans {:?}, left {:?}, lag {:?}); {:.3} % of due; refused {}, cancelled {}",
        tally.granted,
        tally.granted(),
        tally.upper,
        tally.lower,
        tally.left,
        tally.lag,
        100.0 * granted / due_f,
        tally.refused,
        tally.cancelled,
    );
    for (slot, &granted) in tally.granted.iter().enumerate() {
        assert!(
            granted <= allowed,
            "{what}: over-admitted on slot {slot}: granted {granted} > {} + {} × {window:?} = {allowed}",
            bound.burst,
            bound.rate,
        );
    }
    assert!(
        granted >= LOWER * due_f,
        "{what}: under-delivered: granted {granted} < {LOWER} × {due}"
    );
}

/// Asserts a limiter's counters against the tally.
fn check_stats(what: &str, stats: Stats, tally: &Tally) {
    assert_eq!(
        (stats.granted, stats.refused),
        (tally.granted(), tally.refused),
        "{what}: stats (granted, refused)"
    );
}

/// A multi-thread runtime with two workers: the actors' home, and
/// [`storm`]'s.
fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// One call of `try_acquire` (`n` = 1) or `try_acquire_many`; granted?
/// The whole permits a peek shows in the band of the largest capacity
/// (the one `bucket_bound` counts on); 0 for a limiter that reports no
/// bands.
fn deepest_band_left(peek: Option<&Peek>) -> u32 {
    peek.and_then(|peek| peek.bands().max_by_key(|state| state.band.capacity()))
        .map_or(0, |state| state.available)
}

fn try_once(limiter: &dyn Limiter, n: u32) -> bool {
    let result = if n == 1 {
        limiter.try_acquire()
    } else {
        limiter.try_acquire_many(n)
    };
    result.map_err(refusal_try).is_ok()
}

/// Threads, callers of the thread tests.
const THREADS: usize = 4;
/// Tasks, callers of the runtime tests: enough that the waiters queued
/// when demand stops reach several ticks ahead (64 × 2.5 permits is 8 ms
/// at 20 000/s), so that a waiter granted before its turn shows.
const TASKS: usize = 64;

/// The thread test of one limiter: `build` runs inside a runtime (the
/// actors' home, idle here) after the load is made.
fn threads<L: Limiter + 'static>(what: &str, max_n: u32, bound: Bound, build: impl FnOnce() -> L) {
    let rt = runtime();
    let load = Load::new(THREADS, max_n, 1);
    let limiter = rt.block_on(async { build() });
    let tally = hammer(load, |_, n| try_once(&limiter, n));
    check(what, &tally, bound);
    check_stats(what, limiter.stats(), &tally);
}

/// The runtime test of one limiter, with `tasks` tasks.
fn tasks<L: Limiter + 'static>(
    what: &str,
    tasks: usize,
    max_n: u32,
    bound: Bound,
    build: impl FnOnce() -> L,
) {
    let rt = runtime();
    let load = Load::new(tasks, max_n, 1);
    let limiter: Arc<dyn Limiter> = Arc::new(rt.block_on(async { build() }));
    let tally = rt.block_on(storm(load, ALL, vec![Arc::clone(&limiter)]));
    check(what, &tally, bound.waiters());
    check_stats(what, limiter.stats(), &tally);
}

/// The bucket family's bound: exact, `CAPACITY + RATE × T`; and drained,
/// at least 99 % of `CAPACITY + RATE × T'`.
fn bucket_bound() -> Bound {
    Bound {
        floor_burst: u64::from(CAPACITY),
        ..Bound::exact(RATE, u64::from(CAPACITY))
    }
}

fn rate() -> Rate {
    Rate::per_second(RATE.try_into().unwrap())
}

// ---- TokenBucket -------------------------------------------------------

fn token_bucket() -> TokenBucket {
    TokenBucket::builder()
        .rate(rate())
        .capacity(CAPACITY)
        .build()
        .unwrap()
}

#[test]
fn token_bucket_threads() {
    let _serial = serial();
    threads("TokenBucket threads", 4, bucket_bound(), token_bucket);
}

/// The same, with the rate set again (to itself) by one caller partway:
/// the change widens the bucket's lock-free word (the state moves from a
/// 64-bit word to a 128-bit one) while the other threads pour, and the
/// bound holds across it.
#[test]
fn token_bucket_threads_widened_midway() {
    let _serial = serial();
    let rt = runtime();
    let load = Load::new(THREADS, 4, 1);
    let limiter = rt.block_on(async { token_bucket() });
    let calls = std::sync::atomic::AtomicU64::new(0);
    let tally = hammer(load, |_, n| {
        if calls.fetch_add(1, Ordering::Relaxed) == 20_000 {
            limiter.set_rate(rate()).unwrap();
        }
        try_once(&limiter, n)
    });
    assert!(
        calls.load(Ordering::Relaxed) > 20_000,
        "the change happened"
    );
    check("TokenBucket threads, widened", &tally, bucket_bound());
    check_stats("TokenBucket threads, widened", limiter.stats(), &tally);
}

#[test]
fn token_bucket_tasks() {
    let _serial = serial();
    tasks("TokenBucket tasks", TASKS, 4, bucket_bound(), token_bucket);
}

// ---- LeakyBucket: the meter (threads) and the shaper (tasks) -----------

fn leaky_bucket() -> LeakyBucket {
    LeakyBucket::builder()
        .rate(rate())
        .capacity(CAPACITY)
        .build()
        .unwrap()
}

#[test]
fn leaky_bucket_meter_threads() {
    let _serial = serial();
    threads("LeakyBucket meter threads", 4, bucket_bound(), leaky_bucket);
}

/// The shaper only delivers its rate while water is queued: the tasks'
/// requests (8 ms of water) outlast a timer tick and a late wake.
#[test]
fn leaky_bucket_shaper_tasks() {
    let _serial = serial();
    tasks(
        "LeakyBucket shaper tasks",
        TASKS,
        4,
        bucket_bound(),
        leaky_bucket,
    );
}

// ---- Funnel --------------------------------------------------------------

fn funnel() -> Funnel {
    Funnel::builder()
        .rate(rate())
        .capacity(CAPACITY)
        .build()
        .unwrap()
}

#[test]
fn funnel_threads() {
    let _serial = serial();
    threads("Funnel threads", 4, bucket_bound(), funnel);
}

#[test]
fn funnel_tasks() {
    let _serial = serial();
    tasks("Funnel tasks", TASKS, 4, bucket_bound(), funnel);
}

// ---- SmoothBursty, SmoothWarmingUp ----------------------------------------

/// How much idle time the bursty limiter stores: Guava's second, so that
/// callers all descheduled for a while lose nothing. The stored permits
/// cannot raise the upper bound, whose window starts when the limiter is
/// built, empty: every permit stored is idle time within the window.
const MAX_BURST: Duration = Duration::from_secs(1);
/// The warm-up period. A cold limiter under saturating demand spends its
/// `rate × WARMUP` stored permits in 1.5 × `WARMUP` (the trapezoid above
/// the threshold takes `WARMUP`, the half below it `WARMUP / 2`), so it
/// delivers `rate × (T − WARMUP / 2)`.
const WARMUP: Duration = Duration::from_millis(10);
/// The largest request: the window bound adds one request (the one that
/// pays later).
const SMOOTH_MAX_N: u32 = 4;

#[expect(clippy::cast_precision_loss, reason = "a small integer")]
fn bursty() -> SmoothBursty {
    SmoothBursty::builder()
        .permits_per_second(SMOOTH_RATE as f64)
        .max_burst(MAX_BURST)
        .build()
        .unwrap()
}

#[expect(clippy::cast_precision_loss, reason = "a small integer")]
fn warming_up() -> SmoothWarmingUp {
    SmoothWarmingUp::builder()
        .permits_per_second(SMOOTH_RATE as f64)
        .warmup(WARMUP)
        .build()
        .unwrap()
}

/// Guava's bound for `SmoothBursty`: rate × (stored time + T) plus one
/// request, with no truncation term at [`SMOOTH_RATE`].
fn bursty_bound() -> Bound {
    Bound {
        from_build: true,
        ..Bound::exact(SMOOTH_RATE, u64::from(SMOOTH_MAX_N))
    }
}

/// `SmoothWarmingUp`'s bound: stored permits are never free, so rate × T
/// plus one request. Waiters reserve ahead, so nothing waits for a caller
/// while they run: the lower bound loses the slow start, and the time no
/// task has reserved yet (tasks starting, one tick; the drain coming after
/// the last waiter's wake, one tick), where a bucket or a bursty limiter
/// would store what falls due.
fn warming_up_bound() -> Bound {
    Bound {
        deficit: WARMUP / 2 + WAITER_SLACK,
        ..Bound::exact(SMOOTH_RATE, u64::from(SMOOTH_MAX_N))
    }
}

/// `SmoothWarmingUp` under `try_acquire` from threads: the same upper
/// bound. Every moment a permit waits for a caller (a thread descheduled,
/// or holding the lock while descheduled) cools the limiter, as Guava's
/// does, and a loaded machine can keep it cold; so the lower bound is its
/// coldest rate (rate / `cold_factor`) over the time callers were there.
fn warming_up_threads_bound() -> Bound {
    Bound {
        floor: SMOOTH_RATE / 3,
        lag: true,
        ..Bound::exact(SMOOTH_RATE, u64::from(SMOOTH_MAX_N))
    }
}

#[test]
fn smooth_bursty_threads() {
    let _serial = serial();
    threads("SmoothBursty threads", SMOOTH_MAX_N, bursty_bound(), bursty);
}

#[test]
fn smooth_bursty_tasks() {
    let _serial = serial();
    tasks(
        "SmoothBursty tasks",
        TASKS,
        SMOOTH_MAX_N,
        bursty_bound(),
        bursty,
    );
}

#[test]
fn smooth_warming_up_threads() {
    let _serial = serial();
    threads(
        "SmoothWarmingUp threads",
        SMOOTH_MAX_N,
        warming_up_threads_bound(),
        warming_up,
    );
}

#[test]
fn smooth_warming_up_tasks() {
    let _serial = serial();
    tasks(
        "SmoothWarmingUp tasks",
        TASKS,
        SMOOTH_MAX_N,
        warming_up_bound(),
        warming_up,
    );
}

// ---- keyed::KeyedFunnel, keyed::Keyed ------------------------------------

/// Keys of the many-key tests, each its own limit at [`KEY_RATE`] and
/// [`KEY_CAPACITY`] (50 ms again), so that all keys together ask no more of
/// the two cores than one key at [`RATE`] does.
const KEYS: usize = 8;
const KEY_RATE: u64 = RATE / 4;
const KEY_CAPACITY: u32 = CAPACITY / 4;

/// A keyed map's limit: one key at [`RATE`], or many at [`KEY_RATE`].
fn key_limit(keys: usize) -> (Rate, u32, Bound) {
    let (rate, capacity) = if keys == 1 {
        (RATE, CAPACITY)
    } else {
        (KEY_RATE, KEY_CAPACITY)
    };
    let bound = Bound {
        floor_burst: u64::from(capacity),
        ..Bound::exact(rate, u64::from(capacity))
    };
    (Rate::per_second(rate.try_into().unwrap()), capacity, bound)
}

/// One key of a keyed map, as a [`Limiter`] for [`storm`]. The maps have
/// no `acquire_timeout`: the runtime tests use [`NO_TIMEOUT`].
struct KeyOf<M> {
    map: M,
    key: u64,
}

#[async_trait::async_trait]
impl Limiter for KeyOf<KeyedFunnel<u64>> {
    async fn acquire_many(&self, n: u32) -> Result<(), AcquireError> {
        self.map.acquire_many(&self.key, n).await
    }

    fn try_acquire_many(&self, n: u32) -> Result<(), TryAcquireError> {
        if n == 1 {
            self.map.try_acquire(&self.key)
        } else {
            self.map.try_acquire_many(&self.key, n)
        }
    }

    async fn acquire_timeout(&self, _: u32, _: Duration) -> Result<(), AcquireError> {
        unreachable!("not among the operations of a keyed map's run")
    }
}

#[async_trait::async_trait]
impl Limiter for KeyOf<Keyed<u64, TokenBucket>> {
    async fn acquire_many(&self, n: u32) -> Result<(), AcquireError> {
        self.map.acquire_many(&self.key, n).await
    }

    fn try_acquire_many(&self, n: u32) -> Result<(), TryAcquireError> {
        if n == 1 {
            self.map.try_acquire(&self.key)
        } else {
            self.map.try_acquire_many(&self.key, n)
        }
    }

    async fn acquire_timeout(&self, _: u32, _: Duration) -> Result<(), AcquireError> {
        unreachable!("not among the operations of a keyed map's run")
    }
}

fn keyed_funnel(rate: Rate, capacity: u32) -> KeyedFunnel<u64> {
    KeyedFunnel::builder()
        .rate(rate)
        .capacity(capacity)
        .build()
        .unwrap()
}

fn keyed_bucket(rate: Rate, capacity: u32) -> Keyed<u64, TokenBucket> {
    Keyed::builder()
        .limiter(move || TokenBucket::builder().rate(rate).capacity(capacity).build())
        .build()
        .unwrap()
}

/// Asserts a keyed map's counters against the tally.
fn check_keyed_stats(what: &str, stats: KeyedStats, tally: &Tally) {
    assert_eq!(stats.granted, tally.granted(), "{what}: stats.granted");
    assert_eq!(stats.limited, tally.refused, "{what}: stats.limited");
}

/// A keyed map the tests can drive: `KeyedFunnel<u64>` or `Keyed<u64, TokenBucket>`.
trait Map: Clone + Send + Sync + 'static {
    fn try_key(&self, key: u64, n: u32) -> Result<(), TryAcquireError>;
    fn stats(&self) -> KeyedStats;
}

impl Map for KeyedFunnel<u64> {
    fn try_key(&self, key: u64, n: u32) -> Result<(), TryAcquireError> {
        KeyOf {
            map: self.clone(),
            key,
        }
        .try_acquire_many(n)
    }

    fn stats(&self) -> KeyedStats {
        KeyedFunnel::stats(self)
    }
}

impl Map for Keyed<u64, TokenBucket> {
    fn try_key(&self, key: u64, n: u32) -> Result<(), TryAcquireError> {
        KeyOf {
            map: self.clone(),
            key,
        }
        .try_acquire_many(n)
    }

    fn stats(&self) -> KeyedStats {
        Keyed::stats(self)
    }
}

/// The thread test of a keyed map over `keys` keys (0, 1, …).
fn keyed_threads<M: Map>(what: &str, keys: usize, build: impl FnOnce(Rate, u32) -> M) {
    let rt = runtime();
    let (rate, capacity, bound) = key_limit(keys);
    let load = Load::new(THREADS, 4, keys);
    let map = rt.block_on(async { build(rate, capacity) });
    let tally = hammer(load, |slot, n| {
        map.try_key(slot as u64, n).map_err(refusal_try).is_ok()
    });
    check(what, &tally, bound);
    check_keyed_stats(what, map.stats(), &tally);
}

/// The runtime test of a keyed map over `keys` keys (0, 1, …).
fn keyed_tasks<M: Map>(what: &str, keys: usize, build: impl FnOnce(Rate, u32) -> M)
where
    KeyOf<M>: Limiter,
{
    let rt = runtime();
    let (rate, capacity, bound) = key_limit(keys);
    let load = Load::new(TASKS, 4, keys);
    let map = rt.block_on(async { build(rate, capacity) });
    let slots = (0..keys as u64)
        .map(|key| {
            Arc::new(KeyOf {
                map: map.clone(),
                key,
            }) as Arc<dyn Limiter>
        })
        .collect();
    let tally = rt.block_on(storm(load, NO_TIMEOUT, slots));
    check(what, &tally, bound.waiters());
    check_keyed_stats(what, map.stats(), &tally);
}

#[test]
fn keyed_funnel_one_key_threads() {
    let _serial = serial();
    keyed_threads("KeyedFunnel one key threads", 1, keyed_funnel);
}

#[test]
fn keyed_funnel_many_keys_threads() {
    let _serial = serial();
    keyed_threads("KeyedFunnel many keys threads", KEYS, keyed_funnel);
}

#[test]
fn keyed_funnel_one_key_tasks() {
    let _serial = serial();
    keyed_tasks("KeyedFunnel one key tasks", 1, keyed_funnel);
}

#[test]
fn keyed_funnel_many_keys_tasks() {
    let _serial = serial();
    keyed_tasks("KeyedFunnel many keys tasks", KEYS, keyed_funnel);
}

#[test]
fn keyed_token_bucket_one_key_threads() {
    let _serial = serial();
    keyed_threads("Keyed<TokenBucket> one key threads", 1, keyed_bucket);
}

#[test]
fn keyed_token_bucket_many_keys_threads() {
    let _serial = serial();
    keyed_threads("Keyed<TokenBucket> many keys threads", KEYS, keyed_bucket);
}

#[test]
fn keyed_token_bucket_one_key_tasks() {
    let _serial = serial();
    keyed_tasks("Keyed<TokenBucket> one key tasks", 1, keyed_bucket);
}

#[test]
fn keyed_token_bucket_many_keys_tasks() {
    let _serial = serial();
    keyed_tasks("Keyed<TokenBucket> many keys tasks", KEYS, keyed_bucket);
}

// ---- tower ---------------------------------------------------------------

/// A service that counts its calls.
fn counting(
    calls: &Arc<AtomicU64>,
) -> impl tower::Service<
    u64,
    Response = (),
    Error = BoxError,
    Future = std::future::Ready<Result<(), BoxError>>,
> + Clone
+ Send
+ Sync
+ 'static {
    let calls = Arc::clone(calls);
    service_fn(move |_: u64| {
        calls.fetch_add(1, Ordering::Relaxed);
        std::future::ready(Ok(()))
    })
}

/// A tower service as a [`Limiter`] for [`storm`]: `acquire` is one
/// request through it (`oneshot`: `poll_ready`, then `call`), granted when
/// it answers `Ok`. The tasks only wait ([`THROUGH`]); `try_acquire` goes
/// to the bucket behind the service directly, for the drain at the end,
/// and counts in `direct`.
struct Through<S> {
    service: S,
    bucket: TokenBucket,
    direct: AtomicU64,
}

/// The operations of a run through a service: waiting, and giving up.
const THROUGH: &[Op] = &[Op::Acquire, Op::Cancel];

#[async_trait::async_trait]
impl<S> Limiter for Through<S>
where
    S: tower::Service<u64, Response = (), Error = BoxError> + Clone + Send + Sync + 'static,
    S::Future: Send,
{
    async fn acquire_many(&self, n: u32) -> Result<(), AcquireError> {
        assert_eq!(n, 1, "a request takes one permit");
        self.service
            .clone()
            .oneshot(0)
            .await
            .map_err(|error| panic!("a token bucket behind a RateLimit never refuses: {error}"))
    }

    fn try_acquire_many(&self, n: u32) -> Result<(), TryAcquireError> {
        let result = self.bucket.try_acquire_many(n);
        if result.is_ok() {
            self.direct.fetch_add(u64::from(n), Ordering::Relaxed);
        }
        result
    }

    async fn acquire_timeout(&self, _: u32, _: Duration) -> Result<(), AcquireError> {
        unreachable!("not among the operations of a run through a service")
    }
}

/// `RateLimitLayer` over a token bucket: tasks wait in `poll_ready` and
/// give up at random; every permit granted is one call of the inner
/// service, and one permit in the bucket's stats (a permit held by a
/// service dropped before `call` is given back, not counted).
#[test]
fn tower_rate_limit_tasks() {
    let _serial = serial();
    let rt = runtime();
    let load = Load::new(TASKS, 1, 1);
    let bucket = rt.block_on(async { token_bucket() });
    let calls = Arc::new(AtomicU64::new(0));
    let through = Arc::new(Through {
        service: RateLimitLayer::new(bucket.clone()).layer(counting(&calls)),
        bucket: bucket.clone(),
        direct: AtomicU64::new(0),
    });
    let slots = vec![Arc::clone(&through) as Arc<dyn Limiter>];
    let tally = rt.block_on(storm(load, THROUGH, slots));
    let what = "RateLimitLayer tasks";
    check(what, &tally, bucket_bound().waiters());
    let calls = calls.load(Ordering::Relaxed);
    let direct = through.direct.load(Ordering::Relaxed);
    assert_eq!(
        calls + direct,
        tally.granted(),
        "{what}: inner calls + drained"
    );
    check_stats(what, bucket.stats(), &tally);
}

/// `KeyedRateLimitLayer` over a keyed map, from threads: each request is
/// answered at once (the keyed layer never waits), so it is one attempt.
fn tower_keyed_threads<M: Map + KeyedLimiterU64>(
    what: &str,
    keys: usize,
    build: impl FnOnce(Rate, u32) -> M,
) {
    let rt = runtime();
    let (rate, capacity, bound) = key_limit(keys);
    let load = Load::new(THREADS, 1, keys);
    let map = rt.block_on(async { build(rate, capacity) });
    let calls = Arc::new(AtomicU64::new(0));
    let service = KeyedRateLimitLayer::new(map.clone(), |key: &u64| *key).layer(counting(&calls));
    let tally = hammer(load, |slot, n| {
        debug_assert_eq!(n, 1);
        let answer = service.clone().oneshot(slot as u64).now_or_never();
        match answer.expect("the keyed layer answers at once") {
            Ok(()) => true,
            Err(error) => {
                let limited = error.downcast_ref::<RateLimited<u64>>();
                assert!(
                    limited.is_some_and(|l| l.key == slot as u64),
                    "unexpected {error}"
                );
                false
            }
        }
    });
    check(what, &tally, bound);
    assert_eq!(
        calls.load(Ordering::Relaxed),
        tally.granted(),
        "{what}: inner calls"
    );
    check_keyed_stats(what, map.stats(), &tally);
}

/// The keyed maps as tower's `KeyedRateLimitLayer` needs them.
trait KeyedLimiterU64: KeyedLimiter<Key = u64> + fmt::Debug {}
impl<T: KeyedLimiter<Key = u64> + fmt::Debug> KeyedLimiterU64 for T {}

#[test]
fn tower_keyed_funnel_threads() {
    let _serial = serial();
    tower_keyed_threads(
        "KeyedRateLimitLayer(KeyedFunnel) threads",
        KEYS,
        keyed_funnel,
    );
}

#[test]
fn tower_keyed_token_bucket_threads() {
    let _serial = serial();
    tower_keyed_threads(
        "KeyedRateLimitLayer(Keyed<TokenBucket>) threads",
        1,
        keyed_bucket,
    );
}

// ---- Quotas of two bands ------------------------------------------------

/// Two bands: a short one (twice the rate, a burst of 100) and the bucket
/// family's (the rate, `CAPACITY`). The short band refuses most requests
/// while the other still holds its burst, so a refusal that debited the
/// other band anyway would show as under-delivery against it.
fn two_bands() -> Quota {
    Quota::new(Rate::per_second((2 * RATE).try_into().unwrap()), 100).and(rate(), CAPACITY)
}

/// Each band's bound: the short band's upper bound only; the other binds
/// over the run, both ways.
fn two_band_bounds() -> [Bound; 2] {
    [
        Bound {
            floor_burst: 0,
            floor: 0,
            ..Bound::exact(2 * RATE, 100)
        },
        bucket_bound(),
    ]
}

#[test]
fn two_band_token_bucket_threads() {
    let _serial = serial();
    let what = "TokenBucket of two bands, threads";
    let rt = runtime();
    let load = Load::new(THREADS, 4, 1);
    let limiter = rt.block_on(async { TokenBucket::builder().quota(two_bands()).build().unwrap() });
    let tally = hammer_bands(
        load,
        |_, n| try_once(&limiter, n),
        |_| deepest_band_left(Some(&limiter.peek(1))),
    );
    for bound in two_band_bounds() {
        check(what, &tally, bound);
    }
    check_stats(what, limiter.stats(), &tally);
}

#[test]
fn two_band_funnel_tasks() {
    let _serial = serial();
    let what = "Funnel of two bands, tasks";
    let rt = runtime();
    let load = Load::new(TASKS, 4, 1);
    let limiter: Arc<dyn Limiter> =
        Arc::new(rt.block_on(async { Funnel::builder().quota(two_bands()).build().unwrap() }));
    let tally = rt.block_on(storm(load, ALL, vec![Arc::clone(&limiter)]));
    for bound in two_band_bounds() {
        check(what, &tally, bound.waiters());
    }
    check_stats(what, limiter.stats(), &tally);
}

/// A `KeyedFunnel` of `quota`'s bands, one key hammered from threads:
/// two bands share one word per key (one compare-and-swap), three or more
/// a lock per key.
fn banded_keyed_funnel_threads(what: &str, quota: Quota) {
    let rt = runtime();
    let load = Load::new(THREADS, 4, 1);
    let map = rt.block_on(async { KeyedFunnel::<u64>::builder().quota(quota).build().unwrap() });
    let tally = hammer_bands(
        load,
        |slot, n| map.try_key(slot as u64, n).map_err(refusal_try).is_ok(),
        |slot| deepest_band_left(Some(&map.peek(&(slot as u64), 1))),
    );
    for bound in two_band_bounds() {
        check(what, &tally, bound);
    }
    check_keyed_stats(what, map.stats(), &tally);
}

#[test]
fn two_band_keyed_funnel_threads() {
    let _serial = serial();
    banded_keyed_funnel_threads("KeyedFunnel of two bands, threads", two_bands());
}

#[test]
fn three_band_keyed_funnel_threads() {
    let _serial = serial();
    // A third band that never binds: the key is kept under its own lock.
    let quota = two_bands().and(Rate::per_second(1_000_000_000), u32::MAX);
    banded_keyed_funnel_threads("KeyedFunnel of three bands, threads", quota);
}

// ---- Stale clocks -----------------------------------------------------------

/// A smooth limiter that is never exhausted (10⁹/s: two threads take a
/// small fraction of that) refuses nobody, however two threads interleave: a caller whose
/// clock was read before another's grant must not see that grant as debt.
/// `SmoothBursty`'s grants from stored permits leave no debt at all;
/// `SmoothWarmingUp`'s, cold, a few nanoseconds (a stored permit costs up
/// to three intervals), which a reading taken out of order before the
/// grant would see.
#[test]
fn smooth_limiters_never_exhausted_refuse_nobody_on_two_threads() {
    let _serial = serial();
    let bursty = SmoothBursty::builder()
        .permits_per_second(1e9)
        .max_burst(Duration::from_secs(1))
        .build()
        .unwrap();
    let warming_up = SmoothWarmingUp::builder()
        .permits_per_second(1e9)
        .warmup(Duration::from_secs(1))
        .build()
        .unwrap();
    let limiters: [(&str, &(dyn Fn() -> bool + Sync)); 2] = [
        ("SmoothBursty", &|| bursty.try_acquire().is_ok()),
        ("SmoothWarmingUp", &|| warming_up.try_acquire().is_ok()),
    ];
    for (name, try_acquire) in limiters {
        let refused = AtomicU64::new(0);
        let start = Barrier::new(2);
        std::thread::scope(|scope| {
            for _ in 0..2 {
                scope.spawn(|| {
                    start.wait();
                    for _ in 0..1_000_000 {
                        if !try_acquire() {
                            refused.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                });
            }
        });
        assert_eq!(
            refused.load(Ordering::Relaxed),
            0,
            "{name} refused while never exhausted"
        );
    }
}

// ---- The actor, started and ended as the queue fills and empties --------

/// Waiters on two runtimes, each pausing between its grants so that the
/// queue keeps emptying and filling again: the actor ends on an empty
/// queue and the next waiter starts it again, on its own runtime, over and
/// over, with waiters arriving just as it ends. Halfway through, one
/// runtime is shut down (with the actor, if it was there): the other's
/// waiters go on. No waiter hangs (a lost start would leave one waiting
/// for nobody), none is served early, and the counters are exact.
#[test]
fn token_bucket_actor_starts_and_stops_across_two_runtimes() {
    const PER_RUNTIME: usize = 2;
    let _serial = serial();
    let one_worker = || {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap()
    };
    let (rt_a, rt_b) = (one_worker(), one_worker());
    let origin = Instant::now();
    let limiter = Arc::new(rt_a.block_on(async {
        TokenBucket::builder()
            .rate(Rate::per_second(2_000))
            .capacity(1)
            .build()
            .unwrap()
    }));
    let stop = Arc::new(AtomicBool::new(false));
    let (granted, hung) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let last = Arc::new(Mutex::new(origin));
    let waiter = |seed: u64| {
        let (limiter, stop) = (Arc::clone(&limiter), Arc::clone(&stop));
        let (granted, hung, last) = (Arc::clone(&granted), Arc::clone(&hung), Arc::clone(&last));
        async move {
            let mut rng = Rng::new(seed);
            while !stop.load(Ordering::Relaxed) {
                // Served within 2 ms at this rate and demand, on an idle
                // machine: half a second is a hang.
                match tokio::time::timeout(Duration::from_millis(500), limiter.acquire()).await {
                    Ok(Ok(())) => {
                        granted.fetch_add(1, Ordering::Relaxed);
                        let mut last = last.lock().unwrap();
                        *last = (*last).max(Instant::now());
                    }
                    Ok(Err(error)) => panic!("refused: {error}"),
                    Err(_) => {
                        hung.fetch_add(1, Ordering::Relaxed);
                    }
                }
                // 0 to 2 ms (on the 1 ms timer): about the rate's 0.5 ms
                // per grant times the waiters, so the queue often empties.
                let pause = Duration::from_micros(rng.below(2_000));
                tokio::time::sleep(pause).await;
            }
        }
    };
    let on_a: Vec<_> = (0..PER_RUNTIME)
        .map(|i| rt_a.spawn(waiter(i as u64 + 1)))
        .collect();
    let on_b: Vec<_> = (0..PER_RUNTIME)
        .map(|i| rt_b.spawn(waiter(i as u64 + 101)))
        .collect();
    std::thread::sleep(RUN / 2);
    // Runtime A goes, its waiters dropped mid-wait (they give back their
    // places) and perhaps the actor with them.
    drop(on_a);
    rt_a.shutdown_timeout(Duration::from_secs(1));
    let before_b_alone = granted.load(Ordering::Relaxed);
    std::thread::sleep(RUN / 2);
    stop.store(true, Ordering::Relaxed);
    rt_b.block_on(async {
        for task in on_b {
            task.await.unwrap();
        }
    });
    let (granted, hung) = (
        granted.load(Ordering::Relaxed),
        hung.load(Ordering::Relaxed),
    );
    assert_eq!(hung, 0, "waiters left waiting for an actor");
    assert!(
        granted > before_b_alone + 50,
        "runtime B's waiters stalled once A was gone: {granted} after {before_b_alone}"
    );
    let span = *last.lock().unwrap() - origin + WAITER_SLACK;
    let bound = 1 + per(2_000, span);
    assert!(granted <= bound, "granted {granted} > {bound} in {span:?}");
    assert_eq!(limiter.stats().granted, granted, "counters");
}

/// `KeyedFunnel::set_quota` while `THREADS` threads pour into four keys as
/// fast as they can: per key and per band, the calls made before the
/// switch are granted within the old quota's bound, and those made after
/// it within the new one's (its capacity and rate since the switch: the
/// change gives no fresh burst), shrinking and then growing. Both quotas
/// have two bands of the same windows, so a key keeps the fraction of
/// each band it had used.
#[test]
fn keyed_funnel_quota_switched_while_serving() {
    const KEYS: usize = 4;
    let _serial = serial();
    let normal = Quota::new(Rate::per_second(20_000), 200).and(Rate::per_second(5_000), 2_000);
    let degraded = Quota::new(Rate::per_second(2_000), 20).and(Rate::per_second(500), 200);
    #[expect(clippy::cast_precision_loss, reason = "a handful of threads")]
    for (from, to) in [(normal, degraded), (degraded, normal)] {
        let map: KeyedFunnel<u64> = KeyedFunnel::builder().quota(from).tier(to).build().unwrap();
        // 0: before the switch; 1: while it is made; 2: after.
        let phase = AtomicU64::new(0);
        let start = Instant::now();
        let stop = start + Duration::from_millis(400);
        let (mut switch_start, mut switch_end) = (start, start);
        let per_thread: Vec<([[u64; 3]; KEYS], Instant)> = std::thread::scope(|scope| {
            let workers: Vec<_> = (0..THREADS)
                .map(|t| {
                    let (map, phase) = (&map, &phase);
                    scope.spawn(move || {
                        let mut granted = [[0u64; 3]; KEYS];
                        let mut old_end = start;
                        let mut key = t;
                        while Instant::now() < stop {
                            key = (key + 1) % KEYS;
                            let seen = usize::try_from(phase.load(Ordering::Acquire)).unwrap();
                            let ok = map.try_acquire(&(key as u64)).is_ok();
                            if seen == 0 {
                                old_end = Instant::now();
                            }
                            granted[key][seen] += u64::from(ok);
                        }
                        (granted, old_end)
                    })
                })
                .collect();
            std::thread::sleep(Duration::from_millis(200));
            switch_start = Instant::now();
            phase.store(1, Ordering::Release);
            map.set_quota(to).unwrap();
            phase.store(2, Ordering::Release);
            switch_end = Instant::now();
            workers.into_iter().map(|w| w.join().unwrap()).collect()
        });
        assert_eq!(map.quota(), to);
        let end = Instant::now();
        let old_end = per_thread.iter().map(|p| p.1).max().unwrap();
        let bound = |quota: Quota, band: usize, span: Duration| {
            let b = quota.bands()[band];
            // A reading of the map's clock and of this test's may differ by
            // a few microseconds: one permit, and 100 µs of the rate.
            f64::from(b.capacity())
                + b.rate().permits_per_second() * (span.as_secs_f64() + 1e-4)
                + 1.0
        };
        for key in 0..KEYS {
            let sum = |phase: usize| per_thread.iter().map(|p| p.0[key][phase]).sum::<u64>();
            #[expect(clippy::cast_precision_loss, reason = "counts of thousands")]
            let (before, during, after) = (sum(0) as f64, sum(1) as f64, sum(2) as f64);
            for band in 0..2 {
                // A call that read "before" may be decided after the switch
                // began (and one "during" under either quota): both count
                // on both sides.
                let old = bound(from, band, old_end.max(switch_end) - start);
                // And each thread may have one call in flight across it.
                let in_flight = THREADS as f64;
                assert!(
                    before <= old + during + in_flight,
                    "{from:?} → {to:?}, key {key}, band {band}: {before} before the switch > {old}"
                );
                let new = bound(to, band, end - switch_start);
                assert!(
                    after <= new + during + in_flight,
                    "{from:?} → {to:?}, key {key}, band {band}: {after} after the switch > {new}"
                );
            }
            if from == normal {
                // Hammered, every key's bands are full at the switch, and
                // the windows match: full they stay. Only the new rates
                // since the switch come out, no capacity (a fresh burst
                // would add 200 to band 1's).
                for band in 0..2 {
                    let rate = to.bands()[band].rate().permits_per_second();
                    let span = (end - switch_start).as_secs_f64() + 1e-4;
                    let tight = rate * span + 1.0 + during + THREADS as f64;
                    assert!(
                        after <= tight,
                        "key {key}, band {band}: {after} after the switch > {tight}"
                    );
                }
            }
            assert!(before > 0.0 && after > 0.0, "{key}: the check is not empty");
        }
    }
}

/// `Keyed::set_limiter` and `for_each` while 4 OS threads hammer 4 keys
/// of a `Keyed<u64, TokenBucket>`, shrinking the rate tenfold and growing
/// it back: per key, the calls decided before the change stay within the
/// old rate's bound, and those after within what the rule allows — a key
/// held keeps its tokens and its capacity, refilling at the new rate from
/// the change (`TokenBucket::set_rate`); a key first used after the change
/// is the new factory's. Shrinking from saturated keys, only the new rate
/// comes out after the change (no fresh burst); a map that kept the old
/// rate for its held keys gives out ten times that.
#[test]
fn keyed_rate_changed_while_serving() {
    const KEYS: usize = 4;
    let _serial = serial();
    let rt = runtime();
    let _entered = rt.enter();
    let (fast, slow) = (
        (Rate::per_second(20_000), 200),
        (Rate::per_second(2_000), 20),
    );
    let bucket = |(rate, capacity): (Rate, u32)| {
        move || TokenBucket::builder().rate(rate).capacity(capacity).build()
    };
    for (from, to) in [(fast, slow), (slow, fast)] {
        let map: Keyed<u64, TokenBucket> = Keyed::builder().limiter(bucket(from)).build().unwrap();
        // 0: before the change; 1: while it is made; 2: after.
        let phase = AtomicU64::new(0);
        let start = Instant::now();
        let stop = start + Duration::from_millis(400);
        let (mut change_start, mut change_end) = (start, start);
        // Per thread: per key (the last one new after the change) and
        // phase, the permits granted; and the last call that saw phase 0.
        let per_thread: Vec<([[u64; 3]; KEYS + 1], Instant)> = std::thread::scope(|scope| {
            let workers: Vec<_> = (0..THREADS)
                .map(|t| {
                    let (map, phase) = (&map, &phase);
                    scope.spawn(move || {
                        let mut granted = [[0u64; 3]; KEYS + 1];
                        let mut old_end = start;
                        let mut key = t;
                        while Instant::now() < stop {
                            let seen = usize::try_from(phase.load(Ordering::Acquire)).unwrap();
                            // The new key only after the change.
                            key = (key + 1) % if seen == 2 { KEYS + 1 } else { KEYS };
                            let ok = map.try_acquire(&(key as u64)).is_ok();
                            if seen == 0 {
                                old_end = Instant::now();
                            }
                            granted[key][seen] += u64::from(ok);
                        }
                        (granted, old_end)
                    })
                })
                .collect();
            std::thread::sleep(Duration::from_millis(200));
            change_start = Instant::now();
            phase.store(1, Ordering::Release);
            map.set_limiter(bucket(to)).unwrap();
            map.for_each(|_, limiter| limiter.set_rate(to.0).unwrap());
            phase.store(2, Ordering::Release);
            change_end = Instant::now();
            workers.into_iter().map(|w| w.join().unwrap()).collect()
        });
        let end = Instant::now();
        let old_end = per_thread.iter().map(|p| p.1).max().unwrap();
        // A permit and 100 µs of the rate for readings of two clocks.
        let bound = |capacity: u32, rate: Rate, span: Duration| {
            f64::from(capacity) + rate.permits_per_second() * (span.as_secs_f64() + 1e-4) + 1.0
        };
        #[expect(clippy::cast_precision_loss, reason = "a handful of threads")]
        let in_flight = THREADS as f64;
        for key in 0..=KEYS {
            let sum = |phase: usize| per_thread.iter().map(|p| p.0[key][phase]).sum::<u64>();
            #[expect(clippy::cast_precision_loss, reason = "counts of thousands")]
            let (before, during, after) = (sum(0) as f64, sum(1) as f64, sum(2) as f64);
            let old = bound(from.1, from.0, old_end.max(change_end) - start);
            assert!(
                before <= old + during + in_flight,
                "{from:?} → {to:?}, key {key}: {before} before the change > {old}"
            );
            // A held key keeps its capacity (and the tokens it had); a new
            // one has the new factory's.
            let capacity = if key < KEYS { from.1 } else { to.1 };
            let new = bound(capacity, to.0, end - change_start);
            assert!(
                after <= new + during + in_flight,
                "{from:?} → {to:?}, key {key}: {after} after the change > {new}"
            );
            if from == fast && key < KEYS {
                // Hammered, the held keys are empty at the change: only the
                // new rate refills them.
                let tight = bound(0, to.0, end - change_start) + during + in_flight;
                assert!(
                    after <= tight,
                    "key {key}: {after} after the change > {tight}"
                );
            }
            assert!(after > 0.0, "{key}: the check is not empty");
            if key < KEYS {
                assert!(before > 0.0, "{key}: the check is not empty");
            }
        }
    }
}

/// `max_keys` at its boundary, on two threads: each thread brings new keys
/// (its own, never repeated) to a map whose keys stay active for an hour,
/// so that no sweep frees a slot. "The most keys held at once": exactly
/// `MAX` keys are ever granted, whichever thread gets the last slot, and
/// the map holds `MAX`; every other new key is refused. Many small fills,
/// so that the two threads meet at the last slot often: a `KeyedFunnel`,
/// and a `Keyed` map of token buckets (whose new key builds its bucket
/// between the look at the count and the insert, a wider window).
#[test]
fn keyed_max_keys_is_exact_when_two_threads_take_the_last_slots() {
    const MAX: usize = 4;
    const FILLS: usize = 10_000;
    let _serial = serial();
    // The buckets are built in a runtime (a waiter's actor would run there).
    let runtime = runtime();
    let _entered = runtime.enter();
    let funnels = || {
        let map: KeyedFunnel<u64> = KeyedFunnel::builder()
            .rate(Rate::per_hour(1))
            .capacity(1)
            .max_keys(MAX)
            .background_sweep(false)
            .build()
            .unwrap();
        (map.clone(), move |key: u64| map.try_acquire(&key).is_ok())
    };
    let buckets = || {
        let map: Keyed<u64, TokenBucket> = Keyed::builder()
            .limiter(|| {
                TokenBucket::builder()
                    .rate(Rate::per_hour(1))
                    .capacity(1)
                    .build()
            })
            .max_keys(MAX)
            .background_sweep(false)
            .build()
            .unwrap();
        let held = map.clone();
        (held, move |key: u64| map.try_acquire(&key).is_ok())
    };
    max_keys_fills("KeyedFunnel", FILLS, MAX, funnels, KeyedFunnel::len);
    max_keys_fills("Keyed<TokenBucket>", FILLS, MAX, buckets, Keyed::len);
}

/// `fills` times: a new map from `build` (and its `try_acquire` as a
/// grant), two threads each asking `3 × max` keys of their own; checks
/// that `max` were granted in all and `len` is `max`.
fn max_keys_fills<M, F: Fn(u64) -> bool + Sync>(
    what: &str,
    fills: usize,
    max: usize,
    build: impl Fn() -> (M, F),
    len: impl Fn(&M) -> usize,
) {
    let mut wrong = vec![];
    for fill in 0..fills {
        let (map, grant) = build();
        let barrier = Barrier::new(2);
        let granted: Vec<usize> = std::thread::scope(|scope| {
            let threads: Vec<_> = (0..2u64)
                .map(|t| {
                    let (grant, barrier) = (&grant, &barrier);
                    scope.spawn(move || {
                        barrier.wait();
                        (0..3 * max as u64).filter(|i| grant(i * 2 + t)).count()
                    })
                })
                .collect();
            threads.into_iter().map(|t| t.join().unwrap()).collect()
        });
        let total: usize = granted.iter().sum();
        if total != max || len(&map) != max {
            wrong.push((fill, granted, len(&map)));
        }
    }
    assert!(
        wrong.is_empty(),
        "{what}: {} of {fills} fills granted other than {max} new keys or held other than {max} \
         (fill, grants per thread, held): {:?}",
        wrong.len(),
        &wrong[..wrong.len().min(5)]
    );
}
