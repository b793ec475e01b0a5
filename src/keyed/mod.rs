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
//! key is refused with `TryAcquireError::Unavailable` (fail closed: not
//! the key's doing, so not `Limited`; `acquire` waits and retries); an active key is never evicted to make room, because
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

use crate::{Limiter, Peek, Quota, TryAcquireError, clock};

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

    /// What `try_acquire_many(key, n)` would answer now, and the state of
    /// each band of `key`'s limit, without taking anything or adding the
    /// key; `None` when the limit cannot tell. The default is `None`.
    fn peek(&self, key: &Self::Key, n: u32) -> Option<Peek> {
        let _ = (key, n);
        None
    }

    /// As [`AsyncKeyedLimiter::try_acquire_and_peek`], at once.
    fn try_acquire_and_peek(&self, key: &Self::Key, quota: Option<&Quota>, n: u32) -> Peek {
        if quota.is_some() {
            tracing::error!("keyed limiter: this limit takes no quota per call");
            return Peek::new(Err(TryAcquireError::Closed), &[]);
        }
        let answer = self.try_acquire_many(key, n);
        match self.peek(key, 0) {
            Some(peek) => peek.with_answer(answer),
            None => Peek::new(answer, &[]),
        }
    }
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

    fn peek(&self, key: &K, n: u32) -> Option<Peek> {
        Some(KeyedFunnel::peek(self, key, n))
    }

    fn try_acquire_and_peek(&self, key: &K, quota: Option<&Quota>, n: u32) -> Peek {
        KeyedFunnel::try_acquire_and_peek(self, key, quota, n)
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

    fn peek(&self, key: &K, n: u32) -> Option<Peek> {
        Keyed::peek(self, key, n)
    }
}

/// A limit per key that may have to ask a shared store: implemented by
/// [`KeyedFunnel`] and [`Keyed`] (every [`KeyedLimiter`], answering at
/// once) and by `redis::RedisFunnel` (one round trip). Code generic over
/// it — the `tower` feature's `KeyedRateLimitLayer` — runs unchanged on a
/// local map or on a limit shared by a fleet: moving a service from one
/// process to many is a change of the value it is given.
///
/// # Examples
///
/// ```
/// use tokio_ratelimit::{Rate, keyed::{AsyncKeyedLimiter, KeyedFunnel}};
///
/// async fn admit<L: AsyncKeyedLimiter<Key = String>>(limiter: &L, user: &str) -> bool {
///     limiter.try_acquire_many(&user.to_owned(), 1).await.is_ok()
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let per_user: KeyedFunnel<String> =
///     KeyedFunnel::builder().rate(Rate::per_second(1)).capacity(1).build().unwrap();
/// assert!(admit(&per_user, "ann").await);
/// assert!(!admit(&per_user, "ann").await);
/// # }
/// ```
#[async_trait::async_trait]
pub trait AsyncKeyedLimiter: Send + Sync {
    /// The key type.
    type Key: Send + Sync;

    /// Takes `n` permits from `key`'s limit if it has them now (waiting
    /// only for the store's answer, never for permits).
    ///
    /// # Errors
    ///
    /// As [`KeyedLimiter::try_acquire_many`], and
    /// [`TryAcquireError::Unavailable`] when a shared store could not
    /// decide and the limiter fails closed (failing open, the request is
    /// granted and counted in the limiter's stats).
    async fn try_acquire_many(&self, key: &Self::Key, n: u32) -> Result<(), TryAcquireError>;

    /// The answer of [`try_acquire_many`](Self::try_acquire_many) when it
    /// can be had without waiting for I/O (a local map), else `None`
    /// without taking anything. Middleware uses it to skip boxing a future
    /// for local limiters.
    fn try_acquire_now(&self, key: &Self::Key, n: u32) -> Option<Result<(), TryAcquireError>> {
        let _ = (key, n);
        None
    }

    /// What `try_acquire_many(key, n)` would answer now, and the state of
    /// each band of `key`'s limit, without taking anything (for a shared
    /// store: one round trip that changes nothing); `None` when the limit
    /// cannot tell. The default is `None`.
    ///
    /// # Errors
    ///
    /// [`TryAcquireError::Unavailable`] when a shared store could not be
    /// asked.
    async fn peek(&self, key: &Self::Key, n: u32) -> Result<Option<Peek>, TryAcquireError> {
        let _ = (key, n);
        Ok(None)
    }

    /// Takes `n` permits like [`try_acquire_many`](Self::try_acquire_many)
    /// — under `quota` when one is given (a tier), else the limit's own —
    /// and reports each band's state after it: the decision is the
    /// report's [`answer`](Peek::answer), and its bands are what the
    /// `RateLimit` response headers show. No bands when the limit cannot
    /// tell.
    ///
    /// The default takes, then peeks (for a shared store, two round trips);
    /// the crate's limiters do it in one step. A quota the limit cannot
    /// hold a key to (one a `KeyedFunnel` was not built with, or any for a
    /// limit that has no tiers) is refused as `Closed`, and logged.
    async fn try_acquire_and_peek(&self, key: &Self::Key, quota: Option<&Quota>, n: u32) -> Peek {
        if quota.is_some() {
            tracing::error!("keyed limiter: this limit takes no quota per call");
            return Peek::new(Err(TryAcquireError::Closed), &[]);
        }
        let answer = self.try_acquire_many(key, n).await;
        let bands = match self.peek(key, 0).await {
            Ok(Some(peek)) => peek,
            _ => Peek::new(Ok(()), &[]),
        };
        bands.with_answer(answer)
    }

    /// [`try_acquire_and_peek`](Self::try_acquire_and_peek) when it can be
    /// had without waiting for I/O (a local map), else `None` without
    /// taking anything: middleware then needs no boxed future.
    fn try_acquire_and_peek_now(
        &self,
        key: &Self::Key,
        quota: Option<&Quota>,
        n: u32,
    ) -> Option<Peek> {
        let _ = (key, quota, n);
        None
    }
}

#[async_trait::async_trait]
impl<L: KeyedLimiter> AsyncKeyedLimiter for L
where
    L::Key: Send + Sync,
{
    type Key = L::Key;

    async fn try_acquire_many(&self, key: &Self::Key, n: u32) -> Result<(), TryAcquireError> {
        KeyedLimiter::try_acquire_many(self, key, n)
    }

    fn try_acquire_now(&self, key: &Self::Key, n: u32) -> Option<Result<(), TryAcquireError>> {
        Some(KeyedLimiter::try_acquire_many(self, key, n))
    }

    async fn peek(&self, key: &Self::Key, n: u32) -> Result<Option<Peek>, TryAcquireError> {
        Ok(KeyedLimiter::peek(self, key, n))
    }

    async fn try_acquire_and_peek(&self, key: &Self::Key, quota: Option<&Quota>, n: u32) -> Peek {
        KeyedLimiter::try_acquire_and_peek(self, key, quota, n)
    }

    fn try_acquire_and_peek_now(
        &self,
        key: &Self::Key,
        quota: Option<&Quota>,
        n: u32,
    ) -> Option<Peek> {
        Some(KeyedLimiter::try_acquire_and_peek(self, key, quota, n))
    }
}

/// A shared handle (`Arc<dyn AsyncKeyedLimiter<Key = K>>` picked from
/// configuration: a local map or a shared store).
#[async_trait::async_trait]
impl<L: AsyncKeyedLimiter + ?Sized> AsyncKeyedLimiter for Arc<L> {
    type Key = L::Key;

    async fn try_acquire_many(&self, key: &Self::Key, n: u32) -> Result<(), TryAcquireError> {
        (**self).try_acquire_many(key, n).await
    }

    fn try_acquire_now(&self, key: &Self::Key, n: u32) -> Option<Result<(), TryAcquireError>> {
        (**self).try_acquire_now(key, n)
    }

    async fn peek(&self, key: &Self::Key, n: u32) -> Result<Option<Peek>, TryAcquireError> {
        (**self).peek(key, n).await
    }

    async fn try_acquire_and_peek(&self, key: &Self::Key, quota: Option<&Quota>, n: u32) -> Peek {
        (**self).try_acquire_and_peek(key, quota, n).await
    }

    fn try_acquire_and_peek_now(
        &self,
        key: &Self::Key,
        quota: Option<&Quota>,
        n: u32,
    ) -> Option<Peek> {
        (**self).try_acquire_and_peek_now(key, quota, n)
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
                    // (`sleep`, not `now + interval`: an interval past
                    // the clock's range sleeps as long as tokio can.)
                    let sleep = std::pin::pin!(clock::sleep(interval));
                    let woken = std::pin::pin!(wake.notified());
                    futures::future::select(sleep, woken).await;
                }
            }
            tracing::debug!("stopped");
        }
        .instrument(span),
    );
}
