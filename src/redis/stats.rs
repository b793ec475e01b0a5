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
    /// once per resend.
    pub retries: u64,
    /// Of the retries, the decisions Redis had granted already on their
    /// first attempt, whose reply was lost: answered from that grant,
    /// without pouring again (each key of a batch counts once).
    pub resends_granted_before: u64,
    /// Requests refused by the refusal cache, without asking Redis (see
    /// [`RedisFunnelBuilder::refusal_cache`](super::RedisFunnelBuilder::refusal_cache)).
    pub cached_refusals: u64,
}

/// The live counters behind [`RedisStats`], one per field; relaxed
/// atomics, since each counts on its own and none orders anything else.
#[derive(Default)]
pub(super) struct Counters {
    pub(super) decisions: AtomicU64,
    pub(super) granted: AtomicU64,
    pub(super) limited: AtomicU64,
    pub(super) backend_errors: AtomicU64,
    pub(super) timeouts: AtomicU64,
    pub(super) fail_open_grants: AtomicU64,
    pub(super) retries: AtomicU64,
    pub(super) resends_granted_before: AtomicU64,
    pub(super) cached_refusals: AtomicU64,
}

impl Counters {
    /// What the counters read now.
    pub(super) fn snapshot(&self) -> RedisStats {
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        RedisStats {
            decisions: get(&self.decisions),
            granted: get(&self.granted),
            limited: get(&self.limited),
            backend_errors: get(&self.backend_errors),
            timeouts: get(&self.timeouts),
            fail_open_grants: get(&self.fail_open_grants),
            retries: get(&self.retries),
            resends_granted_before: get(&self.resends_granted_before),
            cached_refusals: get(&self.cached_refusals),
        }
    }
}
