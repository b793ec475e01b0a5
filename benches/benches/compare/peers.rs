//! The limiters under test, ours and the peers (governor, leaky-bucket, a
//! refilled tokio `Semaphore`): built from one [`Spec`] and driven through
//! one [`Subject`] enum.
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

use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

use governor::{DefaultDirectRateLimiter, Quota};
use tokio::sync::Semaphore;
use tokio::task::JoinHandle;
use tokio_ratelimit::{Funnel, LeakyBucket, Rate, SmoothBursty, SmoothWarmingUp, TokenBucket};

use crate::harness::time_loop;
use crate::settings::Settings;

/// Which limiter a row is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Token,
    /// A `TokenBucket` of two bands: the spec's, and a day's band that
    /// always has room (the cost of a second band).
    Token2,
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
    pub(crate) fn is_crate_waiter(self) -> bool {
        matches!(
            self,
            Kind::Token | Kind::Shaper | Kind::Funnel | Kind::SmoothBursty | Kind::SmoothWarmingUp
        )
    }

    /// Whether `BENCH_KINDS` selects this limiter. Governor is always kept:
    /// the targets are ratios to it.
    pub(crate) fn selected(self, set: &Settings) -> bool {
        set.kinds.is_empty()
            || self == Kind::Governor
            || set.kinds.iter().any(|k| self.name().contains(k.as_str()))
    }

    pub(crate) fn name(self) -> &'static str {
        match self {
            Kind::Token => "TokenBucket",
            Kind::Token2 => "TokenBucket, 2 bands",
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
pub(crate) const TRY_KINDS: [Kind; 9] = [
    Kind::Token,
    Kind::Token2,
    Kind::Meter,
    Kind::Funnel,
    Kind::SmoothBursty,
    Kind::SmoothWarmingUp,
    Kind::Governor,
    Kind::LeakyCrate,
    Kind::Semaphore,
];

/// The limiters compared by `acquire` (scenarios 3, 4 and 6).
pub(crate) const WAIT_KINDS: [Kind; 8] = [
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
pub(crate) enum Subject {
    Token(TokenBucket),
    Meter(LeakyBucket),
    Shaper(LeakyBucket),
    Funnel(Funnel),
    SmoothBursty(SmoothBursty),
    SmoothWarmingUp(SmoothWarmingUp),
    Governor(DefaultDirectRateLimiter),
    LeakyCrate(leaky_bucket::RateLimiter),
    /// The refill task, held only to be aborted with the Semaphore.
    Semaphore(
        Arc<Semaphore>,
        #[expect(dead_code, reason = "held for its Drop, which stops the refill task")]
        Option<AbortOnDrop>,
    ),
}

/// Ends the Semaphore's refill task with the Semaphore.
pub(crate) struct AbortOnDrop(JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

pub(crate) fn nz(n: u32) -> NonZeroU32 {
    NonZeroU32::new(n).expect("non-zero")
}

/// `permits` per `period`, burst/capacity `capacity`, starting full.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Spec {
    pub(crate) permits: u32,
    pub(crate) period: Duration,
    pub(crate) capacity: u32,
}

impl Spec {
    pub(crate) fn per_second(permits: u32, capacity: u32) -> Spec {
        Spec {
            permits,
            period: Duration::from_secs(1),
            capacity,
        }
    }

    fn interval(self) -> Duration {
        self.period / self.permits
    }

    pub(crate) fn rate(self) -> Rate {
        Rate::per(self.permits, self.period)
    }

    pub(crate) fn per_sec(self) -> f64 {
        f64::from(self.permits) / self.period.as_secs_f64()
    }

    pub(crate) fn quota(self) -> Quota {
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
            #[expect(
                clippy::cast_possible_truncation,
                clippy::cast_sign_loss,
                reason = "measured figures that fit"
            )]
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
pub(crate) fn build_wait(kind: Kind, spec: Spec) -> Subject {
    match kind {
        Kind::Token => Subject::Token(
            TokenBucket::builder()
                .rate(spec.rate())
                .capacity(spec.capacity)
                .build()
                .unwrap(),
        ),
        Kind::Token2 => Subject::Token(
            TokenBucket::builder()
                .quota(
                    tokio_ratelimit::Quota::new(spec.rate(), spec.capacity)
                        .and(Rate::per_day(4_000_000_000), 4_000_000_000),
                )
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
pub(crate) enum Case {
    Allowed,
    Denied,
}

/// A limiter for the `try_acquire` scenarios. Allowed: 10⁹/s with a
/// capacity of 10⁹ (one second of tolerance, so that a thread descheduled
/// between reading the clock and deciding is still allowed), which calls
/// can never exhaust (the Semaphore: the most
/// permits it can hold, no refill task). Denied: one per hour, capacity 1,
/// exhausted by one call. Call inside the runtime.
pub(crate) fn build_try(kind: Kind, case: Case) -> Subject {
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
    pub(crate) fn try_acquire(&self) -> bool {
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
    pub(crate) async fn acquire(&self) -> bool {
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
    pub(crate) fn try_loop(&self, n: u64) -> (Duration, u64) {
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
pub(crate) fn burst(kind: Kind, capacity: u32) -> u32 {
    match kind {
        // The smooth limiters start with nothing stored (bursty) or cold
        // (warm-up): the first request is free, the rest are paced.
        Kind::Shaper | Kind::SmoothBursty | Kind::SmoothWarmingUp => 1,
        _ => capacity,
    }
}
