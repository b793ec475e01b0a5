//! The counters of a [`RedisFunnel`], shared by its
//! clones, and the snapshot users read.

use std::sync::atomic::{AtomicU64, Ordering};

#[cfg(doc)]
use super::{FailurePolicy, RedisFunnel};

/// Counters of a [`RedisFunnel`] (shared by its clones), from
/// [`RedisFunnel::stats`].
///
/// `decisions = granted + limited + backend_errors`: every decision that
/// was asked of Redis (each key of a batch counts once). Requests decided
/// locally (`n = 0`, `n > capacity`, an invalid quota passed with the call,
/// and the refusal cache's, counted in `cached_refusals`) and peeks are not
/// counted in `decisions`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RedisStats {
    /// Decisions asked of Redis.
    pub decisions: u64,
    /// Granted by Redis.
    pub granted: u64,
    /// Refused by Redis (`Limited`).
    pub limited: u64,
    /// Redis could not decide: an error, a lost connection or a timeout.
    pub backend_errors: u64,
    /// Of the backend errors, how many were timeouts.
    pub timeouts: u64,
    /// Of the backend errors, how many were granted by
    /// [`FailurePolicy::Open`].
    pub fail_open_grants: u64,
    /// Attempts sent again because the one before failed on the
    /// connection (closed while idle, reset, or lost with the request in
    /// flight), at most two per decision: counted once in `decisions`,
    /// whatever the resend answered. A batch's pipeline to one node counts
    /// once per resend. On a cluster, a batch's pipeline whose every reply
    /// is a redirect (a slot moved since the topology was read; the node
    /// may have run some of them before) sends each of its requests again
    /// alone: each counts once. (A single call's redirect is followed
    /// without a resend, and counts nothing.)
    pub retries: u64,
    /// Of the retries, the decisions Redis had granted already on their
    /// first attempt, whose reply was lost (or came back redirected):
    /// answered from that grant, without pouring again (each key of a
    /// batch counts once).
    pub resends_granted_before: u64,
    /// Requests refused by the refusal cache, without asking Redis (see
    /// [`RedisFunnelBuilder::refusal_cache`](super::RedisFunnelBuilder::refusal_cache)).
    pub cached_refusals: u64,
}

/// The live counters behind [`RedisStats`], one per field; relaxed
/// atomics, since each counts on its own and none orders anything else.
/// A named limiter mirrors each into the `metrics` facade too (see
/// [`crate::metrics`]), with its decisions' latency.
#[derive(Default)]
pub(super) struct Counters {
    pub(super) decisions: Count,
    pub(super) granted: Count,
    pub(super) limited: Count,
    pub(super) backend_errors: Count,
    pub(super) timeouts: Count,
    pub(super) fail_open_grants: Count,
    pub(super) retries: Count,
    pub(super) resends_granted_before: Count,
    pub(super) cached_refusals: Count,
    /// Seconds per round trip to Redis (one call, or one batch).
    #[cfg(feature = "metrics")]
    latency: Option<metrics::Histogram>,
}

/// One counter, and its series for a named limiter.
#[derive(Default)]
pub(super) struct Count {
    n: AtomicU64,
    #[cfg(feature = "metrics")]
    series: Option<metrics::Counter>,
}

impl Count {
    /// Adds `n`.
    pub(super) fn add(&self, n: u64) {
        self.n.fetch_add(n, Ordering::Relaxed);
        #[cfg(feature = "metrics")]
        if let Some(series) = &self.series {
            series.increment(n);
        }
    }

    fn get(&self) -> u64 {
        self.n.load(Ordering::Relaxed)
    }
}

impl Counters {
    /// The counters of a limiter named `name` (recorded in the `metrics`
    /// facade too) or unnamed.
    pub(super) fn named(name: &crate::meter::Name) -> Counters {
        #[cfg(feature = "metrics")]
        if let Some(name) = name.get() {
            use crate::metrics::{REDIS, REDIS_SECONDS};
            let count = |what: &'static str| Count {
                n: AtomicU64::new(0),
                series: Some(
                    metrics::counter!(REDIS, "limiter" => name.to_owned(), "counter" => what),
                ),
            };
            metrics::describe_counter!(
                REDIS,
                "A Redis rate limiter's counters (RedisStats), by counter"
            );
            metrics::describe_histogram!(
                REDIS_SECONDS,
                metrics::Unit::Seconds,
                "Seconds per round trip of a Redis rate limiter's decision (one call or one batch)"
            );
            return Counters {
                decisions: count("decisions"),
                granted: count("granted"),
                limited: count("limited"),
                backend_errors: count("backend_errors"),
                timeouts: count("timeouts"),
                fail_open_grants: count("fail_open_grants"),
                retries: count("retries"),
                resends_granted_before: count("resends_granted_before"),
                cached_refusals: count("cached_refusals"),
                latency: Some(metrics::histogram!(REDIS_SECONDS, "limiter" => name.to_owned())),
            };
        }
        let _ = name;
        Counters::default()
    }

    /// When a round trip started, for a named limiter.
    #[cfg_attr(
        not(feature = "metrics"),
        expect(clippy::unused_self, reason = "nothing is timed without the feature")
    )]
    pub(super) fn started(&self) -> Option<tokio::time::Instant> {
        #[cfg(feature = "metrics")]
        if self.latency.is_some() {
            return Some(crate::clock::now());
        }
        None
    }

    /// A round trip that began at `started` ended.
    #[cfg_attr(
        not(feature = "metrics"),
        expect(clippy::unused_self, reason = "nothing is timed without the feature")
    )]
    pub(super) fn round_trip(&self, started: Option<tokio::time::Instant>) {
        #[cfg(feature = "metrics")]
        if let (Some(latency), Some(started)) = (&self.latency, started) {
            latency.record(
                crate::clock::now()
                    .saturating_duration_since(started)
                    .as_secs_f64(),
            );
        }
        let _ = started;
    }

    /// What the counters read now.
    pub(super) fn snapshot(&self) -> RedisStats {
        RedisStats {
            decisions: self.decisions.get(),
            granted: self.granted.get(),
            limited: self.limited.get(),
            backend_errors: self.backend_errors.get(),
            timeouts: self.timeouts.get(),
            fail_open_grants: self.fail_open_grants.get(),
            retries: self.retries.get(),
            resends_granted_before: self.resends_granted_before.get(),
            cached_refusals: self.cached_refusals.get(),
        }
    }
}
