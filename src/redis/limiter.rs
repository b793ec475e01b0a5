//! [`RedisFunnel`], the handle users hold: its decisions, waiting as a loop
//! of decisions, and what it does when Redis cannot decide
//! ([`FailurePolicy`]).

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime};

use ::redis::aio::ConnectionManager;
use ::redis::{ErrorKind, RedisError, Script};

use super::repr::Encoding;
use super::script::Answer;
use super::stats::Counters;
use super::{IntoClient, RedisFunnelBuilder, RedisLimitError, RedisStats};
use crate::{Rate, clock};

/// The funnel per key, its state in Redis: one limit shared by every
/// process that uses the same server and prefix.
///
/// Cheap to clone (one `Arc`); clones share the connection and the
/// counters. See the [module docs](super) for the model, the failure policy
/// and the exact arithmetic.
#[derive(Clone)]
pub struct RedisFunnel {
    pub(super) inner: Arc<Inner>,
}

/// What a `RedisFunnel` and its clones share. Made by
/// [`RedisFunnelBuilder::build`]; `script.rs` does its I/O.
pub(super) struct Inner {
    pub(super) conn: ConnectionManager,
    pub(super) script: Script,
    pub(super) encoding: Encoding,
    pub(super) rate: Rate,
    pub(super) prefix: String,
    pub(super) policy: FailurePolicy,
    pub(super) timeout: Duration,
    pub(super) counters: Counters,
    /// Whether the last decision reached Redis (for logging transitions).
    pub(super) healthy: AtomicBool,
}

/// What a [`RedisFunnel`] does with a decision Redis could not make (an
/// error, a lost connection, or no answer within the timeout).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum FailurePolicy {
    /// Grant the request (and count it in
    /// [`RedisStats::fail_open_grants`]): an outage of the limiter's store
    /// does not become an outage of the service. The default.
    #[default]
    Open,
    /// Refuse the request with [`RedisLimitError::Backend`] or
    /// [`RedisLimitError::Timeout`].
    Closed,
}
/// One decision as Redis made it, from [`RedisFunnel::decide`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Decision {
    /// `None` when granted; otherwise exactly how long until the request
    /// could succeed.
    pub retry_after: Option<Duration>,
    /// The server's clock (`TIME`, microseconds) when the script decided.
    pub server_time: SystemTime,
}

impl Decision {
    /// Whether the permits were granted.
    pub fn is_granted(&self) -> bool {
        self.retry_after.is_none()
    }
}

impl RedisFunnel {
    /// A builder that will connect to `client` (a
    /// [`redis::Client`] or a URL such as
    /// `"redis://127.0.0.1:6379/"`); [`rate`](RedisFunnelBuilder::rate) is required.
    pub fn builder(client: impl IntoClient) -> RedisFunnelBuilder {
        RedisFunnelBuilder::new(client.into_client())
    }

    /// Takes one permit for `key` if it has one now.
    ///
    /// # Errors
    ///
    /// As [`try_acquire_many`](Self::try_acquire_many).
    ///
    /// # Cancel safety
    ///
    /// As [`try_acquire_many`](Self::try_acquire_many).
    pub async fn try_acquire(&self, key: &str) -> Result<(), RedisLimitError> {
        self.try_acquire_many(key, 1).await
    }

    /// Pours `n` units into `key`'s funnel if they fit now, in one round
    /// trip. `n = 0` succeeds without asking Redis.
    ///
    /// # Errors
    ///
    /// [`RedisLimitError::Limited`] with the exact time until they would
    /// fit; [`RedisLimitError::InsufficientCapacity`] when `n` exceeds the
    /// capacity (without asking Redis). Under [`FailurePolicy::Closed`],
    /// [`RedisLimitError::Timeout`] or [`RedisLimitError::Backend`] when
    /// Redis could not decide.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future while its script is in flight may spend the
    /// permits without using them (Redis may already have decided).
    pub async fn try_acquire_many(&self, key: &str, n: u32) -> Result<(), RedisLimitError> {
        if let Some(local) = self.local(n) {
            return local;
        }
        match self.eval(key, n).await {
            Ok(answer) => self.answered(answer),
            Err(e) => self.failed(e, 1),
        }
    }

    /// Waits until `key` has one permit, and takes it.
    ///
    /// # Errors
    ///
    /// As [`acquire_many`](Self::acquire_many).
    ///
    /// # Cancel safety
    ///
    /// As [`acquire_many`](Self::acquire_many).
    pub async fn acquire(&self, key: &str) -> Result<(), RedisLimitError> {
        self.acquire_many(key, 1).await
    }

    /// Waits until `n` units fit in `key`'s funnel, and pours them: asks,
    /// sleeps the `retry_after` Redis answered, asks again. Waiters are not
    /// queued (there is no queue shared by the replicas): one that loses a
    /// race sleeps again.
    ///
    /// # Errors
    ///
    /// [`RedisLimitError::InsufficientCapacity`] at once when `n` exceeds
    /// the capacity. Under [`FailurePolicy::Closed`], the first
    /// [`RedisLimitError::Timeout`] or [`RedisLimitError::Backend`]; it
    /// never returns `Limited`.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future while it sleeps spends nothing; while a script
    /// is in flight, as [`try_acquire_many`](Self::try_acquire_many).
    pub async fn acquire_many(&self, key: &str, n: u32) -> Result<(), RedisLimitError> {
        loop {
            match self.try_acquire_many(key, n).await {
                Err(RedisLimitError::Limited { retry_after }) => {
                    clock::sleep(retry_after).await;
                }
                other => return other,
            }
        }
    }

    /// Decides many requests, each on its own key's funnel, in one
    /// pipelined round trip: `requests[i] = (key, n)` gets `answers[i]`,
    /// what [`try_acquire_many`](Self::try_acquire_many)`(key, n)` would
    /// have answered. The same key may appear more than once; its requests
    /// are decided in order.
    ///
    /// The whole batch shares one deadline; when Redis cannot decide it,
    /// the failure policy applies to every request that needed Redis.
    ///
    /// # Cancel safety
    ///
    /// As [`try_acquire_many`](Self::try_acquire_many), for every request.
    pub async fn try_acquire_many_keys(
        &self,
        requests: &[(&str, u32)],
    ) -> Vec<Result<(), RedisLimitError>> {
        let mut answers: Vec<Option<Result<(), RedisLimitError>>> =
            requests.iter().map(|&(_, n)| self.local(n)).collect();
        let asked: Vec<(&str, u32)> = requests
            .iter()
            .zip(&answers)
            .filter(|(_, local)| local.is_none())
            .map(|(&r, _)| r)
            .collect();
        if !asked.is_empty() {
            let batch = self.resend_if_unsent(|| self.eval_many(&asked));
            let mut decided = match clock::timeout(self.inner.timeout, batch).await {
                Ok(Ok(replies)) => replies
                    .into_iter()
                    .map(|r| match r.and_then(Answer::parse) {
                        Ok(answer) => self.answered(answer),
                        Err(e) => self.failed(self.backend(e), 1),
                    })
                    .collect(),
                Ok(Err(e)) => self.failed_all(&self.backend(e), asked.len()),
                Err(_) => self.failed_all(&self.timed_out(), asked.len()),
            }
            .into_iter();
            for slot in answers.iter_mut().filter(|a| a.is_none()) {
                *slot = decided.next();
                if slot.is_none() {
                    break;
                }
            }
        }
        answers
            .into_iter()
            .map(|a| {
                a.unwrap_or_else(|| {
                    // Only if Redis answered fewer replies than commands.
                    let e = RedisError::from((ErrorKind::Parse, "missing pipeline reply"));
                    self.failed(RedisLimitError::Backend(e), 1)
                })
            })
            .collect()
    }

    /// One decision exactly as Redis made it, with the server time it was
    /// made at, and no failure policy: Redis failures come back as errors
    /// (and are counted in the stats, but never granted). For logging, for
    /// tests, and for callers that apply their own policy.
    ///
    /// `n = 0` asks Redis too (for its time) and changes nothing.
    ///
    /// # Errors
    ///
    /// [`RedisLimitError::InsufficientCapacity`] when `n` exceeds the
    /// capacity; [`RedisLimitError::Timeout`] or [`RedisLimitError::Backend`]
    /// when Redis could not decide. Never `Limited`: a refusal is a
    /// [`Decision`] with a `retry_after`.
    ///
    /// # Cancel safety
    ///
    /// As [`try_acquire_many`](Self::try_acquire_many).
    pub async fn decide(&self, key: &str, n: u32) -> Result<Decision, RedisLimitError> {
        if n > self.capacity() {
            return Err(RedisLimitError::InsufficientCapacity);
        }
        match self.eval(key, n).await {
            Ok(answer) => {
                // Counted (and logged) like any decision; a refusal is a
                // value here, not an error.
                let retry_after = self.answered(answer).err().and_then(|e| e.retry_after());
                Ok(Decision {
                    retry_after,
                    server_time: SystemTime::UNIX_EPOCH + Duration::from_micros(answer.now_us),
                })
            }
            Err(e) => {
                self.count_failure(&e, 1);
                Err(e)
            }
        }
    }

    /// The counters of this limiter and its clones.
    pub fn stats(&self) -> RedisStats {
        self.inner.counters.snapshot()
    }

    /// The leak rate.
    pub fn rate(&self) -> Rate {
        self.inner.rate
    }

    /// Each key's capacity, in units.
    pub fn capacity(&self) -> u32 {
        self.inner.encoding.params().capacity()
    }

    /// The prefix of every Redis key.
    pub fn prefix(&self) -> &str {
        &self.inner.prefix
    }

    /// The Redis key that holds `key`'s state: the prefix, then the key.
    pub fn redis_key(&self, key: &str) -> String {
        let mut k = String::with_capacity(self.inner.prefix.len() + key.len());
        k.push_str(&self.inner.prefix);
        k.push_str(key);
        k
    }

    /// The failure policy.
    pub fn failure_policy(&self) -> FailurePolicy {
        self.inner.policy
    }

    /// The deadline of each decision.
    pub fn timeout(&self) -> Duration {
        self.inner.timeout
    }

    /// A request decided without Redis.
    fn local(&self, n: u32) -> Option<Result<(), RedisLimitError>> {
        if n > self.capacity() {
            Some(Err(RedisLimitError::InsufficientCapacity))
        } else if n == 0 {
            Some(Ok(()))
        } else {
            None
        }
    }

    /// Counts Redis's answer and turns it into the caller's.
    fn answered(&self, answer: Answer) -> Result<(), RedisLimitError> {
        let c = &self.inner.counters;
        c.decisions.fetch_add(1, Ordering::Relaxed);
        if !self.inner.healthy.load(Ordering::Relaxed)
            && !self.inner.healthy.swap(true, Ordering::Relaxed)
        {
            tracing::info!(prefix = %self.inner.prefix, "redis rate limiter: backend recovered");
        }
        if answer.granted {
            c.granted.fetch_add(1, Ordering::Relaxed);
            Ok(())
        } else {
            c.limited.fetch_add(1, Ordering::Relaxed);
            Err(RedisLimitError::Limited {
                retry_after: self.inner.encoding.retry_after(answer.wait),
            })
        }
    }

    fn count_failure(&self, e: &RedisLimitError, decisions: u64) {
        let c = &self.inner.counters;
        c.decisions.fetch_add(decisions, Ordering::Relaxed);
        c.backend_errors.fetch_add(decisions, Ordering::Relaxed);
        if matches!(e, RedisLimitError::Timeout { .. }) {
            c.timeouts.fetch_add(decisions, Ordering::Relaxed);
        }
        if self.inner.healthy.swap(false, Ordering::Relaxed) {
            tracing::warn!(
                prefix = %self.inner.prefix,
                policy = ?self.inner.policy,
                error = %e,
                "redis rate limiter: backend failed, applying the failure policy",
            );
        } else {
            tracing::debug!(prefix = %self.inner.prefix, error = %e, "redis rate limiter: backend failed");
        }
    }

    /// Applies the failure policy to `decisions` decisions Redis could not
    /// make.
    fn failed(&self, e: RedisLimitError, decisions: u64) -> Result<(), RedisLimitError> {
        self.count_failure(&e, decisions);
        match self.inner.policy {
            FailurePolicy::Open => {
                self.inner
                    .counters
                    .fail_open_grants
                    .fetch_add(decisions, Ordering::Relaxed);
                Ok(())
            }
            FailurePolicy::Closed => Err(e),
        }
    }

    fn failed_all(&self, e: &RedisLimitError, count: usize) -> Vec<Result<(), RedisLimitError>> {
        let outcome = self.failed(e.clone(), count as u64);
        vec![outcome; count]
    }
}

impl fmt::Debug for RedisFunnel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisFunnel")
            .field("rate", &self.inner.rate)
            .field("capacity", &self.capacity())
            .field("prefix", &self.inner.prefix)
            .field("policy", &self.inner.policy)
            .field("timeout", &self.inner.timeout)
            .finish_non_exhaustive()
    }
}
