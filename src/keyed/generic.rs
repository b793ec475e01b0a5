//! `Keyed<K, L>`: any limiter per key, built on first use.

use std::borrow::Borrow;
use std::collections::hash_map::RandomState;
use std::fmt;
use std::hash::{BuildHasher, Hash};
use std::sync::{Arc, PoisonError, RwLock, Weak};
use std::time::Duration;

use tokio::sync::Notify;

use super::map::{ShardMap, Unavailable};
use super::{KeyedStats, Sweep, spawn_sweeper};
use crate::meter::Refusal;
use crate::stats::Counters;
use crate::{AcquireError, ConfigError, Limiter, Peek, TryAcquireError, clock};

type Factory<K, L> = dyn Fn(&K) -> Result<L, ConfigError> + Send + Sync;

/// How a builder makes the limiter of a new key.
enum Make<K, L> {
    /// The same for every key: checked once when the map is built.
    Any(Arc<dyn Fn() -> Result<L, ConfigError> + Send + Sync>),
    /// From the key (its tier, say).
    PerKey(Arc<Factory<K, L>>),
}

impl<K, L: 'static> Make<K, L> {
    /// The factory of a map: an `Any` factory is called once, to check it.
    fn into_factory(self) -> Result<Arc<Factory<K, L>>, ConfigError> {
        Ok(match self {
            Make::Any(make) => {
                drop(make()?);
                Arc::new(move |_: &K| make())
            }
            Make::PerKey(make) => make,
        })
    }
}

impl<K, L> Clone for Make<K, L> {
    fn clone(&self) -> Self {
        match self {
            Make::Any(f) => Make::Any(Arc::clone(f)),
            Make::PerKey(f) => Make::PerKey(Arc::clone(f)),
        }
    }
}

/// A limiter per key, built on first use from a factory.
///
/// For any `L: Limiter + Clone` — typically a [`TokenBucket`](crate::TokenBucket)
/// per downstream host or tenant, with FIFO waiting per key. An idle key
/// holds no task (a bucket's actor runs only while someone waits on it)
/// and costs about 240 bytes with a `TokenBucket` or a `LeakyBucket`; for
/// millions of keys (per user, per IP) that only need the meter, the
/// one-word-per-key [`KeyedFunnel`](super::KeyedFunnel) costs about 30.
///
/// A key's limiter is dropped when it reports itself
/// [fresh](crate::Limiter::is_fresh) (indistinguishable from a newly built
/// one, and not held outside the map) — checked when a shard would grow and
/// by a background sweeper — and is built again on its next use. Limiters
/// that never report fresh (the default for user types; a token bucket
/// that starts below capacity; a `SmoothBursty` that stores permits, since
/// a new one starts with none stored while a kept one gathers them) are
/// kept until the map is dropped.
///
/// The factory is called inside the runtime the map was built in, so keys
/// can be added from any thread.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use tokio::time::Instant;
/// use tokio_ratelimit::{Rate, TokenBucket, keyed::Keyed};
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let per_host: Keyed<String, TokenBucket> = Keyed::builder()
///     .limiter(|| TokenBucket::builder().rate(Rate::per_second(10)).capacity(1).build())
///     .build()?;
/// let start = Instant::now();
/// per_host.acquire("a.example").await?;
/// per_host.acquire("b.example").await?; // another key, another bucket
/// per_host.acquire("a.example").await?; // waits for a.example's refill
/// assert_eq!(start.elapsed(), Duration::from_millis(100));
/// assert_eq!(per_host.len(), 2);
/// # Ok(())
/// # }
/// ```
pub struct Keyed<K, L, S = RandomState> {
    inner: Arc<Inner<K, L, S>>,
}

impl<K, L, S> Clone for Keyed<K, L, S> {
    fn clone(&self) -> Self {
        Keyed {
            inner: Arc::clone(&self.inner),
        }
    }
}

struct Inner<K, L, S> {
    map: ShardMap<K, L, S>,
    /// Read when a key is made (under its shard's write lock), replaced by
    /// [`Keyed::set_limiter`].
    factory: RwLock<Arc<Factory<K, L>>>,
    runtime: Option<tokio::runtime::Handle>,
    sweeper: Option<Arc<Notify>>,
    counters: Counters,
    meter: crate::meter::Slot,
}

/// A named map's grants reach the recorder from its permit counter (see
/// `crate::meter`).
impl<K: Send + Sync, L: Send + Sync, S: Send + Sync> crate::meter::Publish for Inner<K, L, S> {
    fn publish(&self) {
        self.meter.publish(self.counters.totals());
    }
}

/// Configures a [`Keyed`]; made by [`Keyed::builder`].
pub struct KeyedBuilder<K, L, S = RandomState> {
    factory: Option<Make<K, L>>,
    max_keys: usize,
    sweep_interval: Duration,
    background_sweep: bool,
    hasher: S,
    name: crate::meter::Name,
    keys: std::marker::PhantomData<fn() -> K>,
}

impl<K, L, S: fmt::Debug> fmt::Debug for KeyedBuilder<K, L, S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyedBuilder")
            .field("limiter", &self.factory.as_ref().map(|_| "…"))
            .field("max_keys", &self.max_keys)
            .field("sweep_interval", &self.sweep_interval)
            .field("background_sweep", &self.background_sweep)
            .field("hasher", &self.hasher)
            .field("name", &self.name)
            .finish()
    }
}

impl<K, L> Default for KeyedBuilder<K, L> {
    fn default() -> Self {
        KeyedBuilder {
            factory: None,
            max_keys: usize::MAX,
            sweep_interval: Duration::from_secs(1),
            background_sweep: true,
            hasher: RandomState::new(),
            name: crate::meter::Name::default(),
            keys: std::marker::PhantomData,
        }
    }
}

impl<K, L, S> KeyedBuilder<K, L, S>
where
    K: Hash + Eq + Send + Sync + 'static,
    L: Limiter + Clone + 'static,
    S: BuildHasher + Clone + Send + Sync + 'static,
{
    /// How to build the limiter of a new key (required), e.g.
    /// `|| TokenBucket::builder().rate(rate).capacity(10).build()`.
    pub fn limiter<F>(&mut self, factory: F) -> &mut Self
    where
        F: Fn() -> Result<L, ConfigError> + Send + Sync + 'static,
    {
        self.factory = Some(Make::Any(Arc::new(factory)));
        self
    }

    /// How to build the limiter of a new key from the key, instead of
    /// [`limiter`](Self::limiter): for tiers, e.g. a quota ten times
    /// larger for paid keys. The key's limiter is built on its first use
    /// and kept while it is in use, so a key whose tier changes gets its new
    /// tier once its limiter is fresh again and dropped (a funnel or a
    /// leaky bucket drained, a token bucket refilled). Not called when the
    /// map is built: a factory that fails for a key makes that key's calls
    /// fail (`Closed`).
    pub fn limiter_for<F>(&mut self, factory: F) -> &mut Self
    where
        F: Fn(&K) -> Result<L, ConfigError> + Send + Sync + 'static,
    {
        self.factory = Some(Make::PerKey(Arc::new(factory)));
        self
    }

    /// The most keys held at once (default: unbounded). When all are active
    /// (not fresh), new keys are refused: `try_acquire` answers
    /// `Unavailable`, `acquire` waits and retries (but for requests the
    /// key's limiter would answer at once whatever the map: `n` = 0 passes,
    /// `n` over its capacity is `InsufficientCapacity` — the capacity read
    /// from [`Limiter::peek`](crate::Limiter::peek) of the limiter the
    /// factory would build, so a limiter of your own that keeps the trait's
    /// default `peek` gets `Unavailable` there too).
    ///
    /// A full map looks for fresh keys to drop (in the new key's shard,
    /// then the others) at most once per an eighth of the
    /// [`sweep_interval`](Self::sweep_interval): a key that turns fresh
    /// just after a look gives its slot at the next one, up to that long
    /// later (125 ms by default), so that a flood of new keys against a
    /// full map costs one look, not one per request.
    pub fn max_keys(&mut self, max_keys: usize) -> &mut Self {
        self.max_keys = max_keys;
        self
    }

    /// How often the background sweeper drops fresh keys (default 1 s).
    pub fn sweep_interval(&mut self, interval: Duration) -> &mut Self {
        self.sweep_interval = interval;
        self
    }

    /// Whether to spawn the background sweeper (default: yes, when built
    /// inside a tokio runtime). Without it fresh keys are still dropped when
    /// a shard would otherwise grow, and by [`sweep`](Keyed::sweep); the map then
    /// never arms a timer — which a server tested on tokio's paused clock
    /// needs, since a pending timer lets the clock jump ahead while the
    /// server waits on its sockets.
    pub fn background_sweep(&mut self, enabled: bool) -> &mut Self {
        self.background_sweep = enabled;
        self
    }

    /// Replaces the hasher (by default std's randomly keyed `SipHash`, which
    /// resists hash flooding).
    pub fn hasher<S2>(&self, hasher: S2) -> KeyedBuilder<K, L, S2> {
        KeyedBuilder {
            factory: self.factory.clone(),
            max_keys: self.max_keys,
            sweep_interval: self.sweep_interval,
            background_sweep: self.background_sweep,
            hasher,
            name: self.name.clone(),
            keys: std::marker::PhantomData,
        }
    }

    /// Names the map for its metrics: the `limiter` label of every series
    /// it records, its key count included (see [`crate::metrics`]).
    /// Unnamed, it records none.
    /// An empty name is refused by `build`
    /// ([`ConfigError::InvalidParameter`]).
    #[cfg(feature = "metrics")]
    #[cfg_attr(docsrs, doc(cfg(feature = "metrics")))]
    pub fn name(&mut self, name: impl Into<String>) -> &mut Self {
        self.name.set(name.into());
        self
    }

    /// Builds the map. A [`limiter`](Self::limiter) factory is called once
    /// here, to report a bad configuration now rather than on the first
    /// key. Inside a tokio
    /// runtime, the sweeper is spawned on it.
    ///
    /// # Errors
    ///
    /// [`ConfigError::InvalidParameter`] without a factory or with a zero
    /// `max_keys` or `sweep_interval`; whatever the factory returns.
    pub fn build(&self) -> Result<Keyed<K, L, S>, ConfigError> {
        self.name.check()?;
        let Some(factory) = self.factory.clone() else {
            return Err(ConfigError::InvalidParameter {
                name: "limiter",
                reason: "a factory for the per-key limiters is required",
            });
        };
        if self.max_keys == 0 {
            return Err(ConfigError::InvalidParameter {
                name: "max_keys",
                reason: "must be at least 1",
            });
        }
        if self.sweep_interval.is_zero() {
            return Err(ConfigError::InvalidParameter {
                name: "sweep_interval",
                reason: "must be positive",
            });
        }
        let factory = RwLock::new(factory.into_factory()?);
        let runtime = tokio::runtime::Handle::try_current().ok();
        let notify = runtime
            .as_ref()
            .filter(|_| self.background_sweep)
            .map(|_| Arc::new(Notify::new()));
        let inner = Arc::new(Inner {
            map: ShardMap::new(
                self.hasher.clone(),
                self.max_keys,
                self.sweep_interval / 8,
                clock::Origin::now(),
                u64::MAX,
            ),
            factory,
            runtime: runtime.clone(),
            sweeper: notify.clone(),
            counters: Counters::default(),
            meter: self.name.slot(true),
        });
        if let (Some(runtime), Some(notify)) = (runtime, notify) {
            let weak: Weak<dyn Sweep> = Arc::downgrade(&inner) as Weak<dyn Sweep>;
            spawn_sweeper(&runtime, weak, notify, self.sweep_interval, "keyed");
        }
        let owner: Weak<dyn crate::meter::Publish> =
            Arc::downgrade(&inner) as Weak<dyn crate::meter::Publish>;
        inner.meter.register(owner);
        Ok(Keyed { inner })
    }
}

impl<K, L, S> Inner<K, L, S>
where
    K: Hash + Eq,
    L: Limiter + Clone,
    S: BuildHasher,
{
    /// Counts a key's answer: granted, or refused by `why` (a closed key's
    /// refusal, `why` none, is not the key's limit and counts nowhere, as
    /// [`KeyedStats::limited`] says).
    fn count(&self, n: u32, granted: bool, why: Option<Refusal>) {
        if granted {
            self.meter.granted(n, |n| self.counters.granted(n));
        } else if let Some(why) = why {
            self.meter.refused(why, || self.counters.refused());
        }
    }

    fn make(&self, key: &K) -> Option<L> {
        let _entered = self.runtime.as_ref().map(tokio::runtime::Handle::enter);
        let factory = Arc::clone(&self.factory.read().unwrap_or_else(PoisonError::into_inner));
        match factory(key) {
            Ok(limiter) => Some(limiter),
            Err(error) => {
                tracing::error!(%error, "keyed: the limiter factory failed");
                None
            }
        }
    }

    /// Runs `f` on `key`'s limiter (built if new) under its shard's read
    /// lock.
    fn with<Q, R>(&self, key: &Q, force: bool, f: impl FnOnce(&L) -> R) -> Result<R, Unavailable>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned + ?Sized,
        Q::Owned: Into<K>,
    {
        let outcome = self.map.get_or_insert(
            key,
            || self.map.now_nanos(),
            || self.make(&key.to_owned().into()),
            |limiter, _| limiter.is_fresh(),
            force,
            |limiter, _| f(limiter),
        );
        // Whatever the outcome: a new key refused or whose limiter could
        // not be made may still have swept others away to make room.
        if self.meter.is_on() {
            self.meter.keys(self.map.len());
        }
        let (out, first) = outcome?;
        if first {
            if let Some(notify) = &self.sweeper {
                notify.notify_one();
            }
        }
        Ok(out)
    }
}

impl<K, L, S> Sweep for Inner<K, L, S>
where
    K: Hash + Eq + Send + Sync + 'static,
    L: Limiter + Clone + 'static,
    S: BuildHasher + Send + Sync + 'static,
{
    fn sweep(&self) -> usize {
        let left = self
            .map
            .sweep_all(self.map.now_nanos(), |limiter, _| limiter.is_fresh());
        self.meter.keys(left);
        left
    }
}

impl<K, L, S> Drop for Inner<K, L, S> {
    fn drop(&mut self) {
        if let Some(notify) = &self.sweeper {
            notify.notify_one();
        }
        // A named map's last grants are published as it goes, and it holds
        // no keys any more.
        if self.meter.is_on() {
            self.meter.publish(self.counters.totals());
            self.meter.keys(0);
        }
    }
}

impl<K, L> Keyed<K, L>
where
    K: Hash + Eq + Send + Sync + 'static,
    L: Limiter + Clone + 'static,
{
    /// A builder; [`limiter`](KeyedBuilder::limiter) is required.
    pub fn builder() -> KeyedBuilder<K, L> {
        KeyedBuilder::default()
    }
}

impl<K, L, S> Keyed<K, L, S>
where
    K: Hash + Eq + Send + Sync + 'static,
    L: Limiter + Clone + 'static,
    S: BuildHasher + Send + Sync + 'static,
{
    /// Takes one permit from `key`'s limiter if available now.
    ///
    /// # Errors
    ///
    /// As [`try_acquire_many`](Self::try_acquire_many).
    pub fn try_acquire<Q>(&self, key: &Q) -> Result<(), TryAcquireError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned + ?Sized,
        Q::Owned: Into<K>,
    {
        self.try_acquire_many(key, 1)
    }

    /// Takes `n` permits from `key`'s limiter if available now.
    ///
    /// # Errors
    ///
    /// Whatever the limiter answers; `Unavailable` for a new key refused by
    /// `max_keys` (the map's doing, not the key's; but `n` = 0 passes and
    /// `n` over the key's capacity is `InsufficientCapacity`, as the key's
    /// limiter would answer whatever the map); `Closed` if the factory
    /// failed for a new key.
    pub fn try_acquire_many<Q>(&self, key: &Q, n: u32) -> Result<(), TryAcquireError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned + ?Sized,
        Q::Owned: Into<K>,
    {
        match self.inner.with(key, false, |l| l.try_acquire_many(n)) {
            Ok(result) => {
                self.inner
                    .count(n, result.is_ok(), Refusal::of_try(&result));
                result
            }
            Err(Unavailable::Refused { .. }) => {
                if let Some(result) = self.known_without_a_slot(key, n) {
                    self.inner
                        .count(n, result.is_ok(), Refusal::of_try(&result));
                    return result;
                }
                // Not the key's doing: the map is full (a 503, not a 429).
                self.inner.map.count_refused();
                self.inner.meter.refused_uncounted(Refusal::Unavailable);
                Err(TryAcquireError::Unavailable)
            }
            Err(Unavailable::Failed) => Err(TryAcquireError::Closed),
        }
    }

    /// What a new key's limiter would answer `n` whatever the map holds,
    /// for a new key a full map turns away: `n` = 0 passes, and `n` over
    /// the capacity of the limiter the factory would build for the key is
    /// refused as such (a request that could never be granted is neither
    /// the map's refusal to retry nor one to wait out). `None`: the map's
    /// refusal stands. Builds that limiter only for `n` > 1 (every limiter
    /// holds one permit), so a flood of single requests builds none.
    fn known_without_a_slot<Q>(&self, key: &Q, n: u32) -> Option<Result<(), TryAcquireError>>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned + ?Sized,
        Q::Owned: Into<K>,
    {
        match n {
            0 => Some(Ok(())),
            1 => None,
            _ => {
                let fresh = self.inner.make(&key.to_owned().into())?;
                let answer = fresh.peek(n)?.answer();
                (answer == Err(TryAcquireError::InsufficientCapacity)).then_some(answer)
            }
        }
    }

    /// Waits for one permit from `key`'s limiter.
    ///
    /// # Errors
    ///
    /// As [`acquire_many`](Self::acquire_many).
    ///
    /// # Cancel safety
    ///
    /// As [`acquire_many`](Self::acquire_many).
    pub async fn acquire<Q>(&self, key: &Q) -> Result<(), AcquireError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned + Sync + ?Sized,
        Q::Owned: Into<K>,
    {
        self.acquire_many(key, 1).await
    }

    /// Waits for `n` permits from `key`'s limiter (built if new), as that
    /// limiter's `acquire_many` does. A new key refused by `max_keys` waits
    /// until a slot frees up (but for `n` = 0, which passes, and `n` over
    /// the key's capacity, refused at once).
    ///
    /// # Errors
    ///
    /// Whatever the limiter's `acquire_many` answers; `Closed` if the factory
    /// failed for a new key.
    ///
    /// # Cancel safety
    ///
    /// As the limiter's `acquire_many`.
    pub async fn acquire_many<Q>(&self, key: &Q, n: u32) -> Result<(), AcquireError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned + Sync + ?Sized,
        Q::Owned: Into<K>,
    {
        // A wait for a slot is the map's to record (no limiter exists for
        // the key yet); from the slot on, the wait is the key's limiter's.
        let mut for_a_slot = None;
        loop {
            match self.inner.with(key, false, L::clone) {
                // The clone keeps the key from being evicted while we wait.
                Ok(limiter) => {
                    drop(for_a_slot);
                    let result = limiter.acquire_many(n).await;
                    self.inner
                        .count(n, result.is_ok(), Refusal::of_wait(&result));
                    return result;
                }
                Err(Unavailable::Refused { retry_after }) => {
                    if let Some(known) = self.known_without_a_slot(key, n) {
                        let result = known.map_err(|_| AcquireError::InsufficientCapacity);
                        self.inner
                            .count(n, result.is_ok(), Refusal::of_wait(&result));
                        return result;
                    }
                    for_a_slot
                        .get_or_insert_with(|| crate::meter::Waiter::start(&self.inner.meter));
                    clock::sleep(retry_after).await;
                }
                Err(Unavailable::Failed) => return Err(AcquireError::Closed),
            }
        }
    }

    /// The limiter of `key`, built if new. Holding the handle keeps the key
    /// from being evicted. `get` always succeeds: a new key is added even
    /// past `max_keys` (use `try_acquire`/`acquire` for admission control).
    ///
    /// # Panics
    ///
    /// If the factory fails for a new key (it succeeded when the map was
    /// built, so only a factory that changes its mind can).
    pub fn get<Q>(&self, key: &Q) -> L
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned + ?Sized,
        Q::Owned: Into<K>,
    {
        self.inner
            .with(key, true, L::clone)
            .expect("the limiter factory failed for a new key")
    }

    /// What `try_acquire_many(key, n)` would answer now, and the state of
    /// each band of `key`'s limiter, without taking anything or adding the
    /// key ([`Limiter::peek`]; `None` when the limiter type cannot tell). A
    /// key not held is looked at as a new limiter from the factory, built
    /// for the look and dropped; a new key that `max_keys` would turn away
    /// is not foreseen.
    ///
    /// # Examples
    ///
    /// ```
    /// use tokio_ratelimit::{Rate, TokenBucket, keyed::Keyed};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// let per_user: Keyed<u64, TokenBucket> = Keyed::builder()
    ///     .limiter(|| TokenBucket::builder().rate(Rate::per_second(1)).capacity(3).build())
    ///     .build()
    ///     .unwrap();
    /// per_user.try_acquire_many(&7, 2).unwrap();
    /// let peek = per_user.peek(&7, 2).unwrap();
    /// assert_eq!(peek.retry_after(), Some(std::time::Duration::from_secs(1)));
    /// assert_eq!(per_user.peek(&8, 3).unwrap().bands().next().unwrap().available, 3);
    /// assert_eq!(per_user.len(), 1); // peeking added nothing
    /// # }
    /// ```
    pub fn peek<Q>(&self, key: &Q, n: u32) -> Option<Peek>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned + ?Sized,
        Q::Owned: Into<K>,
    {
        if let Some(held) = self.inner.map.get(key, |limiter, _| limiter.peek(n)) {
            return held;
        }
        match self.inner.make(&key.to_owned().into()) {
            Some(fresh) => fresh.peek(n),
            None => Some(Peek::new(Err(TryAcquireError::Closed), &[])),
        }
    }

    /// Keys held now (including fresh ones not swept yet).
    pub fn len(&self) -> usize {
        self.inner.map.len()
    }

    /// Whether no key is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Keys held, evicted and refused so far, and the permits granted and
    /// requests limited through this map.
    pub fn stats(&self) -> KeyedStats {
        let mut stats = self.inner.map.stats();
        (stats.granted, stats.limited) = self.inner.counters.totals();
        stats
    }

    /// Replaces the factory: keys made from now on get its limiter. Keys
    /// already held keep theirs, with their state, until they are dropped
    /// as fresh; to change those too, [`for_each`](Self::for_each) with the
    /// limiter's own setter (`set_rate`), whose rule for a limiter
    /// mid-window applies. Together, the factory first:
    ///
    /// ```
    /// use tokio_ratelimit::{Rate, TokenBucket, TryAcquireError, keyed::Keyed};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// let bucket = |rate| move || TokenBucket::builder().rate(rate).capacity(1).build();
    /// let per_user: Keyed<u64, TokenBucket> =
    ///     Keyed::builder().limiter(bucket(Rate::per_second(1))).build().unwrap();
    /// per_user.try_acquire(&1).unwrap();
    ///
    /// // From configuration: 10 per second from now on.
    /// per_user.set_limiter(bucket(Rate::per_second(10))).unwrap();
    /// per_user.for_each(|_, limiter| limiter.set_rate(Rate::per_second(10)).unwrap());
    ///
    /// // User 1 (held) and user 2 (new) both refill in 100 ms.
    /// per_user.try_acquire(&2).unwrap();
    /// for user in [1, 2] {
    ///     let Err(TryAcquireError::Limited { retry_after }) = per_user.try_acquire(&user) else {
    ///         panic!("user {user} has no permit left");
    ///     };
    ///     assert_eq!(retry_after.as_millis(), 100);
    /// }
    /// # }
    /// ```
    ///
    /// A key made between the two calls gets the new factory's limiter,
    /// and is passed to `f` as well: keys are made under their shard's
    /// lock, which `for_each` takes in turn, so every key is either made by
    /// the new factory or seen by `f`.
    ///
    /// # Errors
    ///
    /// Whatever the factory returns when called once, to check it (as
    /// [`build`](KeyedBuilder::build) does); the map then keeps its factory.
    pub fn set_limiter<F>(&self, factory: F) -> Result<(), ConfigError>
    where
        F: Fn() -> Result<L, ConfigError> + Send + Sync + 'static,
    {
        // Checked inside the map's runtime, as the factory is called for
        // keys (the actor buckets cannot be built outside one).
        let _entered = self
            .inner
            .runtime
            .as_ref()
            .map(tokio::runtime::Handle::enter);
        self.replace_factory(Make::Any(Arc::new(factory)).into_factory()?);
        Ok(())
    }

    /// Replaces a [`limiter_for`](KeyedBuilder::limiter_for) factory (the
    /// limiter from the key: its tier, say): as
    /// [`set_limiter`](Self::set_limiter), without the check (the factory
    /// is not called until a key is made).
    pub fn set_limiter_for<F>(&self, factory: F)
    where
        F: Fn(&K) -> Result<L, ConfigError> + Send + Sync + 'static,
    {
        self.replace_factory(Arc::new(factory));
    }

    fn replace_factory(&self, factory: Arc<Factory<K, L>>) {
        *self
            .inner
            .factory
            .write()
            .unwrap_or_else(PoisonError::into_inner) = factory;
    }

    /// Calls `f` with every key held and its limiter, a shard at a time
    /// under its read lock: to change the limiters of live keys (after
    /// [`set_limiter`](Self::set_limiter), say). Calls on other keys of
    /// the shard `f` is in go on; a new key of that shard waits until `f`
    /// is done with it, so `f` should be quick (a setter, not an `await`).
    pub fn for_each(&self, f: impl FnMut(&K, &L)) {
        self.inner.map.for_each(f);
    }

    /// Drops every fresh key now (the crate also does this on its own).
    /// Returns the keys left.
    pub fn sweep(&self) -> usize {
        self.inner.sweep()
    }
}

impl<K, L, S> fmt::Debug for Keyed<K, L, S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Keyed")
            .field("stats", &self.inner.map.stats())
            .finish_non_exhaustive()
    }
}
