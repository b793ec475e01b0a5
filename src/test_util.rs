//! Helpers for testing code that uses the limiters, in paused time.
//!
//! Run tests on a current-thread runtime with a paused clock; every limiter
//! reads time through `tokio::time`, so waits take no real time and the
//! instants you assert are exact:
//!
//! ```
//! use std::time::Duration;
//! use tokio_ratelimit::{Rate, TokenBucket, test_util::GrantLog};
//!
//! // In a test: #[tokio::test(start_paused = true)]
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() {
//! let bucket = TokenBucket::builder().rate(Rate::per_second(10)).capacity(2).build().unwrap();
//! let log = GrantLog::new();
//! for _ in 0..4 {
//!     bucket.acquire().await.unwrap();
//!     log.record(1);
//! }
//! let ms = Duration::from_millis;
//! assert_eq!(log.offsets(), [ms(0), ms(0), ms(100), ms(200)]);
//! log.assert_rate(Rate::per_second(10), 2, Duration::ZERO);
//! # }
//! ```
//!
//! Tips:
//!
//! * `tokio::time::sleep` moves the clock forward and fires timers in
//!   order, so a limiter's background task runs first when you sleep past
//!   its deadline (sleep one millisecond past the instant you expect, then
//!   check that a waiter `is_woken()`).
//! * To step a single future, poll it with `tokio_test::task::spawn` and
//!   `assert_pending!` / `assert_ready!`; a waiter whose turn has come is
//!   ready when polled, whether or not the background task has run.
//! * tokio's timer has a resolution of one millisecond: a waiter due at
//!   0.4 ms is released on the 1 ms tick.

use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

use crate::{Limiter, Rate};

/// One recorded grant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Grant {
    /// Time since the log's start.
    pub at: Duration,
    /// Permits granted.
    pub permits: u32,
    /// Who was granted (a task index, or 0).
    pub who: usize,
}

/// A log of grants, with their times since a start instant, and checks over
/// it. Clones share the log.
#[derive(Clone)]
pub struct GrantLog {
    start: Instant,
    grants: Arc<Mutex<Vec<Grant>>>,
}

impl Default for GrantLog {
    fn default() -> GrantLog {
        GrantLog::new()
    }
}

impl fmt::Debug for GrantLog {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GrantLog")
            .field("grants", &self.grants().len())
            .field("total", &self.total())
            .finish()
    }
}

impl GrantLog {
    /// An empty log starting now (on tokio's clock).
    pub fn new() -> GrantLog {
        GrantLog {
            start: Instant::now(),
            grants: Arc::default(),
        }
    }

    /// The log's start instant.
    pub fn start(&self) -> Instant {
        self.start
    }

    /// Records `permits` granted now.
    pub fn record(&self, permits: u32) {
        self.record_for(0, permits);
    }

    /// Records `permits` granted now to `who`.
    pub fn record_for(&self, who: usize, permits: u32) {
        let at = Instant::now().saturating_duration_since(self.start);
        self.lock().push(Grant { at, permits, who });
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Grant>> {
        self.grants.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Every grant, in the order recorded.
    pub fn grants(&self) -> Vec<Grant> {
        self.lock().clone()
    }

    /// The time of each grant, in the order recorded.
    pub fn offsets(&self) -> Vec<Duration> {
        self.lock().iter().map(|g| g.at).collect()
    }

    /// The order in which `who`s were granted.
    pub fn order(&self) -> Vec<usize> {
        self.lock().iter().map(|g| g.who).collect()
    }

    /// Total permits granted.
    pub fn total(&self) -> u64 {
        self.lock().iter().map(|g| u64::from(g.permits)).sum()
    }

    /// Total permits granted to each `who` (indexed by `who`).
    pub fn per_who(&self) -> Vec<u64> {
        let grants = self.lock();
        let len = grants.iter().map(|g| g.who + 1).max().unwrap_or(0);
        let mut out = vec![0; len];
        for g in grants.iter() {
            out[g.who] += u64::from(g.permits);
        }
        out
    }

    /// The most permits granted within any closed window `[t, t + window]`.
    pub fn max_in_window(&self, window: Duration) -> u64 {
        let mut grants = self.grants();
        grants.sort_by_key(|g| g.at);
        let (mut best, mut sum, mut lo) = (0u64, 0u64, 0usize);
        for hi in 0..grants.len() {
            sum += u64::from(grants[hi].permits);
            while grants[hi].at.saturating_sub(grants[lo].at) > window {
                sum -= u64::from(grants[lo].permits);
                lo += 1;
            }
            best = best.max(sum);
        }
        best
    }

    /// Checks that no window `[t, t + w]` of any length `w` saw more than
    /// `burst + rate × (w + slack)` permits, exactly (in rationals).
    ///
    /// `slack` is zero for `try_acquire` and one timer tick (1 ms) for
    /// grants to waiters.
    ///
    /// # Panics
    ///
    /// With the offending window when the bound is broken.
    pub fn assert_rate(&self, rate: Rate, burst: u32, slack: Duration) {
        if let Some((from, to, permits)) = self.rate_violation(rate, burst, slack) {
            panic!(
                "{permits} permits granted in [{from:?}, {to:?}], more than {burst} + {rate} × ({:?} + {slack:?})",
                to.saturating_sub(from)
            );
        }
    }

    /// The first window that breaks `burst + rate × (w + slack)`, if any:
    /// `(from, to, permits)`.
    #[expect(
        clippy::missing_panics_doc,
        reason = "the `expect` follows an assignment"
    )]
    pub fn rate_violation(
        &self,
        rate: Rate,
        burst: u32,
        slack: Duration,
    ) -> Option<(Duration, Duration, u64)> {
        let mut grants = self.grants();
        grants.sort_by_key(|g| g.at);
        // Window [t_i, t_j] holds S_j − S_{i−1} permits. The bound, times
        // the period P, with R permits per period:
        //   (S_j − S_{i−1})·P ≤ burst·P + R·(t_j − t_i + slack)
        // ⇔ S_j·P − R·t_j ≤ burst·P + R·slack + min_i (S_{i−1}·P − R·t_i).
        let p = i128::try_from(rate.period().as_nanos()).ok()?;
        let r = i128::from(rate.permits());
        let allowance = i128::from(burst) * p + r * i128::try_from(slack.as_nanos()).ok()?;
        let nanos = |d: Duration| i128::try_from(d.as_nanos()).unwrap_or(i128::MAX / 4);
        let mut prefix = 0i128; // S_{j−1}
        let mut best: Option<(i128, usize)> = None; // min of S_{i−1}·P − R·t_i
        for (j, g) in grants.iter().enumerate() {
            let candidate = prefix * p - r * nanos(g.at);
            if best.is_none_or(|(b, _)| candidate < b) {
                best = Some((candidate, j));
            }
            prefix += i128::from(g.permits);
            let (min, i) = best.expect("set above");
            if prefix * p - r * nanos(g.at) > allowance + min {
                let permits = grants[i..=j].iter().map(|g| u64::from(g.permits)).sum();
                return Some((grants[i].at, g.at, permits));
            }
        }
        None
    }
}

/// Spawns `tasks` tasks that each `acquire()` `per_task` times from
/// `limiter`, logging every grant with the task's index; returns the log
/// once all are done.
///
/// # Panics
///
/// If an `acquire` fails or a task panics.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use tokio_ratelimit::{Rate, TokenBucket, test_util::record_acquires};
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// let bucket = TokenBucket::builder().rate(Rate::per_second(10)).capacity(1).build().unwrap();
/// let log = record_acquires(&bucket, 3, 2).await;
/// assert_eq!(log.total(), 6);
/// assert_eq!(log.offsets().last(), Some(&Duration::from_millis(500)));
/// assert_eq!(log.per_who(), [2, 2, 2]);
/// # }
/// ```
pub async fn record_acquires<L>(limiter: &L, tasks: usize, per_task: usize) -> GrantLog
where
    L: Limiter + Clone + 'static,
{
    let log = GrantLog::new();
    let handles: Vec<_> = (0..tasks)
        .map(|who| {
            let limiter = limiter.clone();
            let log = log.clone();
            tokio::spawn(async move {
                for _ in 0..per_task {
                    limiter.acquire().await.expect("acquire failed");
                    log.record_for(who, 1);
                }
            })
        })
        .collect();
    for handle in handles {
        handle.await.expect("acquiring task panicked");
    }
    log
}

#[cfg(test)]
mod tests {
    use super::*;

    fn log_at(times_ms: &[u64]) -> GrantLog {
        let log = GrantLog::new();
        log.lock().extend(times_ms.iter().map(|&t| Grant {
            at: Duration::from_millis(t),
            permits: 1,
            who: 0,
        }));
        log
    }

    #[test]
    fn window_checks() {
        let log = log_at(&[0, 0, 100, 200, 250]);
        assert_eq!(log.max_in_window(Duration::ZERO), 2);
        assert_eq!(log.max_in_window(Duration::from_millis(100)), 3);
        let ten = Rate::per_second(10);
        assert!(log.rate_violation(ten, 2, Duration::ZERO).is_some()); // 200, 250
        assert!(
            log.rate_violation(ten, 2, Duration::from_millis(50))
                .is_none()
        );
        assert!(
            log.rate_violation(ten, 1, Duration::from_millis(50))
                .is_some()
        );
        let (from, to, n) = log.rate_violation(ten, 2, Duration::ZERO).unwrap();
        assert_eq!(
            (from, to, n),
            (Duration::ZERO, Duration::from_millis(250), 5)
        );
    }
}
