//! The tool's replay: the traffic through every spec, in virtual time,
//! counted as it goes ([`Tally`]), never stored.
//!
//! Two passes over the traffic, each on its own paused current-thread
//! runtime:
//!
//! * **Meters** (try modes) in one pass together: for each arrival the
//!   paused clock is moved to its instant and every meter is asked,
//!   directly, in the order of the specs. Nothing waits, so no task runs per
//!   request and no timer fires; the clock is moved by polling
//!   `tokio::time::advance` once by hand (it moves the clock, then yields
//!   once), outside the runtime's scheduler. The actors of the token and
//!   leaky buckets (which serve only waiters) are let run every virtual
//!   second, so that a per-key map's dropped buckets end.
//! * **Waiters** (waiting modes) in one pass together: the demo's replay,
//!   a task per request per limiter issued at its exact instant, so that
//!   waits overlap and end on tokio's 1 ms ticks as in a service.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_ratelimit::{AcquireError, ConfigError, TryAcquireError};

use super::spec::{Built, Meter, Spec, Waiter};
use super::traffic::{Arrival, Keys, Source, TraceError, Traffic};

/// Why a request was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// Over the limit (`Limited`).
    Limited,
    /// A leaky bucket's shaper was full (`Overflow`).
    Overflow,
    /// More permits than the limiter ever holds (`InsufficientCapacity`).
    TooLarge,
    /// A waiting request gave up (`timeout=`).
    Timeout,
    /// A keyed map had no room for a new key (`max-keys=`).
    Unavailable,
    /// Any other error (none is expected).
    Failed,
}

impl Refusal {
    pub(crate) const ALL: [Refusal; 6] = [
        Refusal::Limited,
        Refusal::Overflow,
        Refusal::TooLarge,
        Refusal::Timeout,
        Refusal::Unavailable,
        Refusal::Failed,
    ];

    pub(crate) fn name(self) -> &'static str {
        match self {
            Refusal::Limited => "limited",
            Refusal::Overflow => "overflow",
            Refusal::TooLarge => "too_large",
            Refusal::Timeout => "timeout",
            Refusal::Unavailable => "unavailable",
            Refusal::Failed => "failed",
        }
    }

    fn of_try(error: &TryAcquireError) -> Refusal {
        match error {
            TryAcquireError::Limited { .. } => Refusal::Limited,
            TryAcquireError::InsufficientCapacity => Refusal::TooLarge,
            TryAcquireError::Unavailable => Refusal::Unavailable,
            _ => Refusal::Failed,
        }
    }

    fn of_wait(error: AcquireError) -> Refusal {
        match error {
            AcquireError::Overflow => Refusal::Overflow,
            AcquireError::InsufficientCapacity => Refusal::TooLarge,
            AcquireError::Timeout => Refusal::Timeout,
            _ => Refusal::Failed,
        }
    }
}

/// One bucket of time (`--bucket` long) of one limiter's replay.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Bucket {
    /// Requests that arrived in it.
    pub(crate) offered: u64,
    /// Requests granted in it, whenever they arrived.
    pub(crate) admitted: u64,
    /// Requests that arrived in it and were refused.
    pub(crate) refused: u64,
    /// The longest wait of a request granted in it, in nanoseconds.
    pub(crate) max_wait: u64,
}

/// One key's requests through one limiter.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct KeyCount {
    pub(crate) requests: u64,
    /// Granted at once.
    pub(crate) passed: u64,
    /// Granted after a wait.
    pub(crate) waited: u64,
    pub(crate) refused: u64,
}

/// What one limiter did with the traffic, counted as it went.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Tally {
    pub(crate) spec: Spec,
    pub(crate) requests: u64,
    /// Granted at once.
    pub(crate) passed: u64,
    /// Granted after a wait.
    pub(crate) waited: u64,
    /// Refused, by cause (in [`Refusal::ALL`]'s order).
    pub(crate) refused: [u64; 6],
    pub(crate) permits_offered: u64,
    pub(crate) permits_granted: u64,
    /// Every wait of a waited request, in nanoseconds (only waiting modes
    /// wait; kept for exact percentiles).
    pub(crate) waits: Vec<u64>,
    pub(crate) buckets: Vec<Bucket>,
    /// By key id.
    pub(crate) keys: Vec<KeyCount>,
    bucket_ns: u64,
}

impl Tally {
    fn new(spec: Spec, bucket: Duration) -> Tally {
        Tally {
            spec,
            requests: 0,
            passed: 0,
            waited: 0,
            refused: [0; 6],
            permits_offered: 0,
            permits_granted: 0,
            waits: Vec::new(),
            buckets: Vec::new(),
            keys: Vec::new(),
            bucket_ns: u64::try_from(bucket.as_nanos()).unwrap_or(u64::MAX).max(1),
        }
    }

    fn bucket(&mut self, at: u64) -> &mut Bucket {
        // Arrivals are checked against the limit (see `next`); a grant after
        // a wait that ends past it is counted in the last bucket.
        let index = usize::try_from(at / self.bucket_ns)
            .unwrap_or(usize::MAX)
            .min(MAX_BUCKETS - 1);
        if index >= self.buckets.len() {
            self.buckets.resize(index + 1, Bucket::default());
        }
        &mut self.buckets[index]
    }

    /// Counts one request: granted after `wait` nanoseconds, or refused.
    pub(crate) fn record(&mut self, arrival: Arrival, outcome: Result<u64, Refusal>) {
        self.requests += 1;
        self.permits_offered += u64::from(arrival.weight);
        self.bucket(arrival.at).offered += 1;
        let key = arrival.key as usize;
        if key >= self.keys.len() {
            self.keys.resize(key + 1, KeyCount::default());
        }
        self.keys[key].requests += 1;
        match outcome {
            Ok(wait) => {
                self.permits_granted += u64::from(arrival.weight);
                if wait == 0 {
                    self.passed += 1;
                    self.keys[key].passed += 1;
                } else {
                    self.waited += 1;
                    self.keys[key].waited += 1;
                    self.waits.push(wait);
                }
                let bucket = self.bucket(arrival.at.saturating_add(wait));
                bucket.admitted += 1;
                bucket.max_wait = bucket.max_wait.max(wait);
            }
            Err(refusal) => {
                self.refused[refusal as usize] += 1;
                self.keys[key].refused += 1;
                self.bucket(arrival.at).refused += 1;
            }
        }
    }

    /// Refused requests, all causes.
    pub(crate) fn refused_total(&self) -> u64 {
        self.refused.iter().sum()
    }

    /// The bucket width.
    pub(crate) fn bucket_width(&self) -> Duration {
        Duration::from_nanos(self.bucket_ns)
    }
}

/// The most buckets a tally keeps (32 bytes each): 23 days of 1 s.
pub(crate) const MAX_BUCKETS: usize = 2_000_000;

/// The most requests the waiting modes hold waiting at once (each a task of
/// about a kilobyte).
pub(crate) const MAX_WAITING: usize = 1_000_000;

/// How many bad lines are kept, to show.
const SKIPPED_KEPT: usize = 20;

/// The traffic as the replay saw it.
#[derive(Debug, Clone, Default)]
pub(crate) struct Seen {
    pub(crate) requests: u64,
    /// The last arrival, in nanoseconds since the start.
    pub(crate) last: u64,
    pub(crate) keys: Keys,
    /// Bad lines left out (`--on-error skip`).
    pub(crate) skipped: u64,
    /// The first of them.
    pub(crate) skipped_first: Vec<TraceError>,
}

/// Why a replay stopped.
#[derive(Debug)]
pub(crate) enum ReplayError {
    /// A limiter that cannot be built: its label and the builder's error.
    Build(String, ConfigError),
    Trace(TraceError),
    /// Traffic longer than [`MAX_BUCKETS`] buckets: the arrival's instant,
    /// in nanoseconds.
    TooLong {
        at: u64,
        bucket: Duration,
    },
    /// More than [`MAX_WAITING`] requests waiting at once in the waiting
    /// modes, at this instant (nanoseconds).
    Backlog {
        at: u64,
    },
}

impl ReplayError {
    /// The exit code of the process that stops on this error: 2 for a
    /// limiter that cannot be built (a bad `--limiter`, as clap's 2 for a
    /// bad flag), 3 for a trace that cannot be read, is empty or has a bad
    /// line, 4 for traffic the replay cannot hold (too long for its
    /// buckets, too many waiting at once).
    pub(crate) fn exit_code(&self) -> u8 {
        match self {
            ReplayError::Build(..) => 2,
            ReplayError::Trace(_) => 3,
            ReplayError::TooLong { .. } | ReplayError::Backlog { .. } => 4,
        }
    }
}

impl std::fmt::Display for ReplayError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReplayError::Build(label, error) => {
                write!(f, "cannot build the limiter '{label}': {error}")
            }
            ReplayError::Trace(error) => write!(f, "{error}"),
            ReplayError::Backlog { at } => write!(
                f,
                "at {}, {MAX_WAITING} requests are waiting at once in the waiting modes: \
                 the traffic is far over their limit; give them timeout=, or a shorter --duration",
                super::traffic::show_span(Duration::from_nanos(*at)),
            ),
            ReplayError::TooLong { at, bucket } => write!(
                f,
                "a request at {} is past {MAX_BUCKETS} buckets of {} (--bucket): \
                 give a longer --bucket",
                super::traffic::show_span(Duration::from_nanos(*at)),
                super::traffic::show_span(*bucket),
            ),
        }
    }
}

/// The result of a replay: one tally per spec, in the specs' order.
#[derive(Debug)]
pub(crate) struct Replay {
    pub(crate) seen: Seen,
    pub(crate) tallies: Vec<Tally>,
}

/// Replays the traffic through every spec. `on_skip` hears each bad line
/// left out (once, in the first pass).
pub(crate) fn replay(
    traffic: &Traffic,
    specs: &[Spec],
    bucket: Duration,
    on_skip: &mut dyn FnMut(&TraceError),
) -> Result<Replay, ReplayError> {
    let mut tallies: Vec<Option<Tally>> = vec![None; specs.len()];
    let (meters, waiters): (Vec<usize>, Vec<usize>) =
        (0..specs.len()).partition(|&i| specs[i].mode == super::spec::Mode::Try);
    let mut seen = None;
    if !meters.is_empty() || waiters.is_empty() {
        let chosen: Vec<&Spec> = meters.iter().map(|&i| &specs[i]).collect();
        let (pass, counted) = replay_meters(traffic, &chosen, bucket, on_skip)?;
        for (&i, tally) in meters.iter().zip(counted) {
            tallies[i] = Some(tally);
        }
        seen = Some(pass);
    }
    if !waiters.is_empty() {
        let chosen: Vec<&Spec> = waiters.iter().map(|&i| &specs[i]).collect();
        let mut quiet = |_: &TraceError| {};
        let on_skip: &mut dyn FnMut(&TraceError) =
            if seen.is_some() { &mut quiet } else { on_skip };
        let (pass, counted) = replay_waiters(traffic, &chosen, bucket, on_skip)?;
        for (&i, tally) in waiters.iter().zip(counted) {
            tallies[i] = Some(tally);
        }
        seen.get_or_insert(pass);
    }
    Ok(Replay {
        seen: seen.unwrap_or_default(),
        tallies: tallies
            .into_iter()
            .map(|t| t.expect("every spec replayed"))
            .collect(),
    })
}

fn paused_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("a current-thread tokio runtime")
}

/// Reads the next arrival, keeping the skipped lines.
fn next(
    source: &mut Source,
    seen: &mut Seen,
    bucket: Duration,
    on_skip: &mut dyn FnMut(&TraceError),
) -> Result<Option<Arrival>, ReplayError> {
    let mut skipped = |error: TraceError| {
        on_skip(&error);
        seen.skipped += 1;
        if seen.skipped_first.len() < SKIPPED_KEPT {
            seen.skipped_first.push(error);
        }
    };
    match source.next(&mut skipped) {
        None => Ok(None),
        Some(Err(error)) => Err(ReplayError::Trace(error)),
        Some(Ok(arrival))
            if u128::from(arrival.at) / bucket.as_nanos().max(1) >= MAX_BUCKETS as u128 =>
        {
            Err(ReplayError::TooLong {
                at: arrival.at,
                bucket,
            })
        }
        Some(Ok(arrival)) => {
            seen.requests += 1;
            seen.last = arrival.at;
            Ok(Some(arrival))
        }
    }
}

/// The meters' pass: see the module's docs.
fn replay_meters(
    traffic: &Traffic,
    specs: &[&Spec],
    bucket: Duration,
    on_skip: &mut dyn FnMut(&TraceError),
) -> Result<(Seen, Vec<Tally>), ReplayError> {
    let runtime = paused_runtime();
    let entered = runtime.enter();
    let meters: Vec<Meter> = specs
        .iter()
        .map(|spec| match spec.build() {
            Ok(Built::Meter(meter)) => Ok(meter),
            Ok(Built::Waiter(_)) => unreachable!("a try mode builds a meter"),
            Err(error) => Err(ReplayError::Build(spec.label.clone(), error)),
        })
        .collect::<Result<_, _>>()?;
    let mut tallies: Vec<Tally> = specs
        .iter()
        .map(|&spec| Tally::new(spec.clone(), bucket))
        .collect();
    let mut source = traffic.open().map_err(ReplayError::Trace)?;
    let mut seen = Seen::default();
    let start = Instant::now();
    let mut now = 0u64;
    let mut next_settle = SECOND;
    while let Some(arrival) = next(&mut source, &mut seen, bucket, on_skip)? {
        if arrival.at > now {
            if arrival.at >= next_settle {
                settle(&runtime, &entered);
                next_settle = arrival.at - arrival.at % SECOND + SECOND;
            }
            advance(Duration::from_nanos(arrival.at - now));
            now = arrival.at;
        }
        debug_assert_eq!(Instant::now() - start, Duration::from_nanos(now));
        for (meter, tally) in meters.iter().zip(&mut tallies) {
            let outcome = meter(arrival.key, arrival.weight)
                .map(|()| 0)
                .map_err(|e| Refusal::of_try(&e));
            tally.record(arrival, outcome);
        }
    }
    seen.keys = source.keys().clone();
    drop(meters);
    settle(&runtime, &entered);
    Ok((seen, tallies))
}

const SECOND: u64 = 1_000_000_000;

/// Moves the paused clock by `by`, from outside the scheduler (see the
/// module's docs): `advance` moves the clock on its first poll and then
/// yields once, which outside a scheduler wakes itself at once.
fn advance(by: Duration) {
    let mut advance = std::pin::pin!(tokio::time::advance(by));
    let mut cx = Context::from_waker(Waker::noop());
    while advance.as_mut().poll(&mut cx) == Poll::Pending {}
}

/// Lets every spawned task (the buckets' actors) run until none is queued.
fn settle(runtime: &tokio::runtime::Runtime, _entered: &tokio::runtime::EnterGuard<'_>) {
    let handle = runtime.handle().clone();
    runtime.block_on(async move {
        for _ in 0..1000 {
            tokio::task::yield_now().await;
            if handle.metrics().global_queue_depth() == 0 {
                tokio::task::yield_now().await;
                if handle.metrics().global_queue_depth() == 0 {
                    break;
                }
            }
        }
    });
}

/// The waiters' pass: see the module's docs.
fn replay_waiters(
    traffic: &Traffic,
    specs: &[&Spec],
    bucket: Duration,
    on_skip: &mut dyn FnMut(&TraceError),
) -> Result<(Seen, Vec<Tally>), ReplayError> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .expect("a current-thread tokio runtime");
    let result = runtime.block_on(async {
        let waiters: Vec<Waiter> = specs
            .iter()
            .map(|spec| match spec.build() {
                Ok(Built::Waiter(waiter)) => Ok(waiter),
                Ok(Built::Meter(_)) => unreachable!("a waiting mode builds a waiter"),
                Err(error) => Err(ReplayError::Build(spec.label.clone(), error)),
            })
            .collect::<Result<_, _>>()?;
        let tallies: Vec<Arc<Mutex<Tally>>> = specs
            .iter()
            .map(|&spec| Arc::new(Mutex::new(Tally::new(spec.clone(), bucket))))
            .collect();
        let mut source = traffic.open().map_err(ReplayError::Trace)?;
        let mut seen = Seen::default();
        let clock = super::Clock::new();
        let pending = Arc::new((AtomicUsize::new(0), Notify::new()));
        let stopped = loop {
            let arrival = match next(&mut source, &mut seen, bucket, on_skip) {
                Ok(Some(arrival)) => arrival,
                Ok(None) => break None,
                Err(error) => break Some(error),
            };
            clock.advance_to(Duration::from_nanos(arrival.at)).await;
            if pending.0.load(Ordering::Relaxed) >= MAX_WAITING {
                break Some(ReplayError::Backlog { at: arrival.at });
            }
            for (waiter, tally) in waiters.iter().zip(&tallies) {
                pending.0.fetch_add(1, Ordering::Relaxed);
                let (progress, pending) = (Arc::clone(&clock.progress), Arc::clone(&pending));
                let (wait, tally) = (waiter(arrival.key, arrival.weight), Arc::clone(tally));
                tokio::spawn(async move {
                    progress.fetch_add(1, Ordering::Relaxed);
                    let issued = Instant::now();
                    let result = wait.await;
                    let waited = u64::try_from(issued.elapsed().as_nanos()).unwrap_or(u64::MAX);
                    progress.fetch_add(1, Ordering::Relaxed);
                    let outcome = result.map(|()| waited).map_err(Refusal::of_wait);
                    tally
                        .lock()
                        .expect("a tally's lock")
                        .record(arrival, outcome);
                    drop(tally);
                    if pending.0.fetch_sub(1, Ordering::AcqRel) == 1 {
                        pending.1.notify_one();
                    }
                });
            }
        };
        if let Some(error) = stopped {
            return Err(error);
        }
        seen.keys = source.keys().clone();
        // Back onto the millisecond grid (see `Clock::advance_to`), then let
        // the paused clock jump from timer to timer until every wait ended.
        clock.advance_to(clock.next_tick()).await;
        while pending.0.load(Ordering::Acquire) > 0 {
            pending.1.notified().await;
        }
        drop(waiters);
        let tallies = tallies
            .into_iter()
            .map(|t| {
                Arc::try_unwrap(t)
                    .expect("every request task ended")
                    .into_inner()
                    .expect("a tally")
            })
            .collect();
        Ok((seen, tallies))
    });
    if result.is_err() {
        // The run stops here, perhaps with a million requests still waiting:
        // dropping the runtime would cancel them one by one, and cancelling
        // a queued waiter costs the length of its queue (minutes for a
        // million). Their memory goes back when the process exits.
        std::mem::forget(runtime);
    }
    result
}
