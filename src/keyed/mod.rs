//! One limit per resource: per user, per client IP, per downstream host,
//! per API key.
//!
//! Two shapes, for two scales:
//!
//! * [`KeyedFunnel`] — the lazy meter for millions of keys: one small word
//!   of state per key in a sharded concurrent map, no task and no timer per
//!   key, the same numbers as [`Funnel`](crate::Funnel).
//! * [`Keyed`] — any [`Limiter`] per key, built on first use
//!   from a factory: a [`TokenBucket`](crate::TokenBucket) per downstream
//!   host or tenant, with FIFO waiting per key. Each key's actor parks when
//!   idle; meant for thousands of keys.
//!
//! # Bounded memory, with no change in what is granted
//!
//! A key whose state is indistinguishable from a fresh one (its funnel has
//! drained, its bucket has refilled, nobody waits on it and no handle to it
//! is held outside the map) is dropped by the crate itself: when a shard of
//! the map would otherwise grow, and by a background sweeper (spawned when
//! the map is built inside a tokio runtime; it runs only while the map holds
//! keys). The next use of the key builds it anew, exactly as it would have
//! been — so memory follows the number of *active* keys and nobody has to
//! schedule a cleanup.
//!
//! One thing to know in tests: while the map holds keys, the sweeper keeps a
//! timer armed, so on a paused clock tokio jumps ahead by the sweep interval
//! whenever the runtime has nothing else to do — including while it waits on
//! a socket. A test that serves real connections on a paused clock should
//! build the map with `background_sweep(false)` (no sweeper, no timer; see
//! `tests/axum_service.rs`).
//!
//! `max_keys(n)` caps the map. When every slot holds an active key, a new
//! key is refused with `TryAcquireError::Limited` (fail closed, `acquire`
//! waits and retries); an active key is never evicted to make room, because
//! that would hand its owner (perhaps an attacker flooding new keys) a fresh
//! burst. Counters of keys, evictions and refusals are in [`KeyedStats`].
//!
//! # Keys and hashing
//!
//! Keys are any `K: Hash + Eq + Clone + Send + Sync + 'static`, looked up by
//! `&Q` where `K: Borrow<Q>` (so a `KeyedFunnel<String>` takes `&str`). The
//! default hasher is std's randomly keyed `SipHash`, which resists hash
//! flooding from untrusted keys (client addresses, user ids); the builders
//! take another `BuildHasher` for trusted keys.

mod funnel;
mod generic;
mod map;

use std::hash::{BuildHasher, Hash};
use std::sync::{Arc, Weak};
use std::time::Duration;

use tokio::sync::Notify;
use tracing::Instrument;

pub use funnel::{KeyedFunnel, KeyedFunnelBuilder};
pub use generic::{Keyed, KeyedBuilder};
pub use map::KeyedStats;

use crate::{Limiter, TryAcquireError, clock};

/// What [`KeyedFunnel`] and [`Keyed`] have in common: a limit per key,
/// asked without waiting. Code that should work with either — like the
/// `tower` feature's `KeyedRateLimitLayer` — is generic over this trait.
///
/// # Examples
///
/// ```
/// use tokio_ratelimit::{Rate, TryAcquireError, keyed::{KeyedFunnel, KeyedLimiter}};
///
/// fn admit<L: KeyedLimiter<Key = String>>(limiter: &L, user: &str) -> bool {
///     limiter.try_acquire(&user.to_owned()).is_ok()
/// }
///
/// let per_user: KeyedFunnel<String> =
///     KeyedFunnel::builder().rate(Rate::per_second(1)).capacity(1).build().unwrap();
/// assert!(admit(&per_user, "ann"));
/// assert!(!admit(&per_user, "ann"));
/// assert!(admit(&per_user, "bob"));
/// ```
pub trait KeyedLimiter: Send + Sync {
    /// The key type.
    type Key;

    /// Takes one permit from `key`'s limit if available now.
    ///
    /// # Errors
    ///
    /// As [`try_acquire_many`](Self::try_acquire_many).
    fn try_acquire(&self, key: &Self::Key) -> Result<(), TryAcquireError> {
        self.try_acquire_many(key, 1)
    }

    /// Takes `n` permits from `key`'s limit if available now.
    ///
    /// # Errors
    ///
    /// [`TryAcquireError::Limited`] with the time until they could be
    /// granted; [`TryAcquireError::InsufficientCapacity`] when `n` exceeds
    /// the capacity; [`TryAcquireError::Closed`] when the key's limiter
    /// cannot be had.
    fn try_acquire_many(&self, key: &Self::Key, n: u32) -> Result<(), TryAcquireError>;
}

impl<K, S> KeyedLimiter for KeyedFunnel<K, S>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    S: BuildHasher + Send + Sync + 'static,
{
    type Key = K;

    fn try_acquire_many(&self, key: &K, n: u32) -> Result<(), TryAcquireError> {
        KeyedFunnel::try_acquire_many(self, key, n)
    }
}

impl<K, L, S> KeyedLimiter for Keyed<K, L, S>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    L: Limiter + Clone + 'static,
    S: BuildHasher + Send + Sync + 'static,
{
    type Key = K;

    fn try_acquire_many(&self, key: &K, n: u32) -> Result<(), TryAcquireError> {
        Keyed::try_acquire_many(self, key, n)
    }
}

/// A map the sweeper can sweep.
pub(crate) trait Sweep: Send + Sync + 'static {
    /// Drops every key that is fresh now; returns the keys left.
    fn sweep(&self) -> usize;
}

/// Spawns the background sweeper of a keyed map: every `interval` while the
/// map holds keys, parked (no timer) while it is empty. It ends when the map
/// is dropped.
pub(crate) fn spawn_sweeper(
    runtime: &tokio::runtime::Handle,
    map: Weak<dyn Sweep>,
    wake: Arc<Notify>,
    interval: Duration,
    name: &'static str,
) {
    let span = tracing::debug_span!("sweeper", map = name, ?interval);
    runtime.spawn(
        async move {
            loop {
                let Some(map) = map.upgrade() else { break };
                let left = map.sweep();
                drop(map);
                tracing::trace!(left, "swept");
                if left == 0 {
                    wake.notified().await;
                } else {
                    let sleep = std::pin::pin!(clock::sleep_until(clock::now() + interval));
                    let woken = std::pin::pin!(wake.notified());
                    futures::future::select(sleep, woken).await;
                }
            }
            tracing::debug!("stopped");
        }
        .instrument(span),
    );
}
