//! `KeyedFunnel`: the lazy meter per key, one word of state each.
//!
//! # One word per key
//!
//! A funnel's whole state is its theoretical arrival time `tat`, in the
//! exact scaled units of [`crate::algorithm`]. Stored absolutely it needs
//! up to 100 bits; per key that would double the map's memory. So each key
//! keeps just `tat mod 2⁶⁴` and reads it back relative to its shard's
//! *epoch* `e`, the time of the shard's last sweep (see `map.rs`):
//! `tat = e + d`, with `d = (word − e) mod 2⁶⁴` read as a signed number.
//! That is exact while every stored `tat` lies within 2⁶³ units of `e`:
//!
//! * above: a pour leaves `tat ≤ now + τ`, and no key is poured more than
//!   the horizon `H = 2⁶²` units after its shard's epoch (the map sweeps the
//!   shard first, which moves the epoch to that `now`); with `τ ≤ 2⁵⁶`,
//!   `tat − e ≤ H + τ < 2⁶³`, however long the key then idles;
//! * below: a sweep at `e` evicts the keys whose every band is empty and
//!   moves the empty bands of those it keeps up to `e` (the same state:
//!   empty), so it leaves every band's `tat ≥ e` — a band nobody pours
//!   (one a tier of fewer bands leaves alone, or a short band while a long
//!   one keeps the key) would otherwise fall behind the epochs to come;
//!   later pours leave `tat ≥` the pourer's `now`, which is older than `e`
//!   only by how long a thread held a stale `now` — never near 2⁶³ units.
//!
//! The decoding does not depend on the caller's `now`, so a thread whose
//! `now` is older than another's pour reads the water that pour left (it
//! then judges at its own, earlier, `now`, which only overstates the water).
//! The decisions themselves are the same `Params::try_pour` the other
//! limiters use: the same numbers as [`Funnel`](crate::Funnel).
//!
//! For rates whose exact interval needs a very fine scale (a denominator
//! above 2²⁰ in lowest terms, where 2⁶² units would be under 73 minutes) or
//! buckets deeper than 2⁵⁶ units, keys keep the absolute 128-bit `tat`
//! instead (twice the memory, no epoch needed).
//!
//! # Bands and tiers
//!
//! A [`Quota`] of several bands keeps one `tat` per band, each read as
//! above in its band's units. Two bands share one 128-bit word (band 0 in
//! the low half), so one compare-and-swap decides both and no thread ever
//! sees one debited without the other: 8 bytes per band for the state
//! itself. Three or four bands, or two that need the absolute form, are
//! kept absolute under a small lock per key (80 bytes: four `u128`s and the
//! lock), which is held only for the arithmetic.
//!
//! Tiers (quotas declared with [`KeyedFunnelBuilder::tier`]) need no
//! state of their own: band `b` of every tier is counted in one unit, the
//! least common multiple of the tiers' units for that band
//! (`algorithm::in_common_units`), so a stored `tat` is the same
//! instant whichever tier reads it, and a key's word does not grow with
//! the number of tiers. The tier is chosen per call.

use std::borrow::Borrow;
use std::collections::hash_map::RandomState;
use std::fmt;
use std::hash::{BuildHasher, Hash};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;

use super::map::{ShardMap, Unavailable};
use super::{KeyedStats, Sweep};
use crate::algorithm::{Bands, Params, PerBand};
use crate::meter::Refusal;
use crate::stats::Counters;
use crate::sync::{AtomicU64, AtomicU128};
use crate::{AcquireError, Peek, Quota, Rate, TryAcquireError, clock};

mod builder;
mod word;

pub use builder::KeyedFunnelBuilder;
use word::{Locked, Pair, Poured, Stored, map};
#[cfg(test)]
use word::{Word, decide, is_drained};

/// The funnel per key: one leaky-bucket meter for each user, IP address or
/// API key, millions of them, with no task per key.
///
/// Each key costs one small word of state in a sharded concurrent map (16
/// bytes per `u64` key, plus the map's own overhead; 8 more for a second
/// band), and gives exactly the numbers a [`Funnel`](crate::Funnel) with
/// the same rate and capacity, or the same [`Quota`], would. Keys may be
/// held to different quotas in one map (tiers: see
/// [`try_acquire_with`](Self::try_acquire_with)). Keys whose funnel has drained are indistinguishable from new ones
/// and are dropped by the crate itself — when a shard would grow, and by a
/// background sweeper when the map is built inside a tokio runtime — so
/// memory follows the active keys.
///
/// [`max_keys`](KeyedFunnelBuilder::max_keys) caps the map. When every slot holds an
/// active key, a *new* key is refused with `TryAcquireError::Unavailable`
/// (fail closed: the map's doing, not the key's, so an HTTP service answers
/// 503, not 429; `acquire` waits for a sweep to free a slot). An active
/// key is never evicted to make room, since that would hand its owner a
/// fresh burst; keys already present keep their exact limits under any
/// flood of new ones.
///
/// The default hasher is std's `RandomState` (`SipHash`, randomly keyed),
/// which resists hash flooding from untrusted keys;
/// [`hasher`](KeyedFunnelBuilder::hasher) replaces it.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use tokio_ratelimit::{Rate, TryAcquireError, keyed::KeyedFunnel};
///
/// let per_ip: KeyedFunnel<String> =
///     KeyedFunnel::builder().rate(Rate::per_second(2)).capacity(2).build().unwrap();
/// assert!(per_ip.try_acquire("10.0.0.1").is_ok());
/// assert!(per_ip.try_acquire("10.0.0.1").is_ok());
/// assert!(matches!(per_ip.try_acquire("10.0.0.1"), Err(TryAcquireError::Limited { .. })));
/// assert!(per_ip.try_acquire("10.0.0.2").is_ok()); // each key has its own funnel
/// assert_eq!(per_ip.len(), 2);
/// ```
pub struct KeyedFunnel<K, S = RandomState> {
    inner: Arc<Inner<K, S>>,
}

impl<K, S> Clone for KeyedFunnel<K, S> {
    fn clone(&self) -> Self {
        KeyedFunnel {
            inner: Arc::clone(&self.inner),
        }
    }
}

struct Inner<K, S> {
    /// The quota the map was built with (kept apart from the others so
    /// that the hot path reads it without a pointer or a bounds check).
    first: Tier,
    /// The other quotas keys may be held to ([`KeyedFunnelBuilder::tier`]).
    others: Box<[Tier]>,
    /// Which of them the calls that name none use: 0 for `first`, `i` for
    /// `others[i - 1]` ([`KeyedFunnel::set_quota`] moves it).
    default: std::sync::atomic::AtomicUsize,
    /// The unit of each stored band, shared by every tier.
    units: Bands,
    origin: clock::Origin,
    words: Words<K, S>,
    /// Wakes the sweeper when the map stops being empty, and when this is
    /// dropped.
    sweeper: Option<Arc<Notify>>,
    counters: Counters,
    /// What a named map records (see [`crate::metrics`]).
    meter: crate::meter::Slot,
}

/// A quota keys may be held to, and its bands in the map's units.
#[derive(Debug)]
struct Tier {
    /// The first band (all of a one-band quota's: its hot path reads only
    /// this and `capacity`).
    first: Params,
    /// The most units one request may take: the smallest capacity.
    capacity: u32,
    bands: Bands,
    /// The unit of every band a key stores (the map's `units`): a key's
    /// bands beyond this quota's are read in them, and left as they are.
    stored: Bands,
    quota: Quota,
}

impl Tier {
    fn new(quota: Quota, bands: Bands, stored: Bands) -> Tier {
        Tier {
            first: bands.params()[0],
            capacity: bands.capacity(),
            bands,
            stored,
            quota,
        }
    }
}

enum Words<K, S> {
    Narrow(ShardMap<K, AtomicU64, S>),
    Wide(ShardMap<K, AtomicU128, S>),
    Pair(ShardMap<K, Pair, S>),
    Locked(ShardMap<K, Locked, S>),
}

/// `$body` with `$map` bound to the map of words, whichever kind they are:
/// the body is written once and compiled for each [`Stored`] type.
macro_rules! with_map {
    ($words:expr, $map:ident => $body:expr) => {
        match $words {
            Words::Narrow($map) => $body,
            Words::Wide($map) => $body,
            Words::Pair($map) => $body,
            Words::Locked($map) => $body,
        }
    };
}

impl<K, S> Inner<K, S>
where
    K: Hash + Eq,
    S: BuildHasher,
{
    fn now_nanos(&self) -> u64 {
        self.origin.elapsed_nanos()
    }

    /// A reading made before a key of `map` is looked up, for the words
    /// that grant on one (see [`Stored::READS_EARLY`]).
    #[inline]
    fn early_reading<W: Stored>(&self, _: &ShardMap<K, W, S>) -> Option<u64> {
        W::READS_EARLY.then(|| self.now_nanos())
    }

    /// The tier of `quota`.
    ///
    /// # Panics
    ///
    /// When the map was not built with it.
    fn tier(&self, quota: &Quota) -> &Tier {
        self.find_tier(quota).unwrap_or_else(|| {
            panic!(
                "KeyedFunnel: quota {quota:?} is not one of the map's; \
                     declare it with KeyedFunnelBuilder::tier"
            )
        })
    }

    /// The tier of `quota`, if the map was built with it.
    fn find_tier(&self, quota: &Quota) -> Option<&Tier> {
        self.tiers().find(|t| t.quota == *quota)
    }

    /// Pours `n` units into `key`'s funnel under `tier` if they fit now,
    /// and counts the answer.
    fn try_acquire<Q>(&self, key: &Q, tier: &Tier, n: u32) -> Result<(), TryAcquireError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned + ?Sized,
        Q::Owned: Into<K>,
    {
        self.count(n, self.pour_key(key, tier, n))
    }

    /// What a pour of `n` came to, counted.
    fn count(&self, n: u32, poured: Poured) -> Result<(), TryAcquireError> {
        match poured {
            Poured::Granted => {
                self.meter.granted(n, |n| self.counters.granted(n));
                Ok(())
            }
            Poured::Limited(refusal) => {
                let refusal = Err(refusal);
                if let Some(why) = Refusal::of_try(&refusal) {
                    self.meter.refused(why, || self.counters.refused());
                }
                refusal
            }
            // Not the key's doing: the map is full (a 503, not a 429).
            Poured::MapFull { .. } => {
                with_map!(&self.words, map => map.count_refused());
                self.meter.refused_uncounted(Refusal::Unavailable);
                Err(TryAcquireError::Unavailable)
            }
        }
    }

    /// Pours `n` units into `key`'s funnel under `tier` if they fit now,
    /// counting nothing.
    fn pour_key<Q>(&self, key: &Q, tier: &Tier, n: u32) -> Poured
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned + ?Sized,
        Q::Owned: Into<K>,
    {
        if n > tier.capacity {
            return Poured::Limited(TryAcquireError::InsufficientCapacity);
        }
        if n == 0 {
            return Poured::Granted;
        }
        // Every decision reads `now` no earlier than the shard's epoch (a
        // reading the sweep used): on a clock whose readings can come out
        // of order (the fast clock across cores), a key made again after a
        // sweep evicted it must not start behind that sweep, or it would
        // refill from a time the map has already passed. And it reads it
        // after the key's state, for every attempt (see `Stored::decide`).
        // An existing key: a read lock and one compare-and-swap (or, for
        // three bands or more, the key's own lock).
        let known = with_map!(&self.words, map => {
            let early = self.early_reading(map);
            map.update(key, |w, epoch| {
                let early = early.and_then(|early| map.within_horizon(early, epoch));
                w.decide(tier, epoch, early, || map.reading(epoch), n)
            })
        });
        if let Some(Some(result)) = known {
            return Poured::from(result);
        }
        let outcome = with_map!(&self.words, map => self.pour(map, key, tier, n));
        match outcome {
            Ok((result, first)) => {
                if first {
                    self.wake_sweeper();
                }
                self.count_keys();
                Poured::from(result)
            }
            Err(Unavailable::Refused { retry_after }) => {
                tracing::debug!(?retry_after, "keyed funnel full: new key refused");
                // Its look for room may have swept keys away.
                self.count_keys();
                Poured::MapFull { retry_after }
            }
            Err(Unavailable::Failed) => unreachable!("a word can always be made"),
        }
    }

    /// As [`pour_key`](Self::pour_key), and each band's `tat` after the
    /// decision with `now` in ns (for a key that was poured or refused on
    /// its own limit), from the same read of the key.
    fn pour_key_read<Q>(&self, key: &Q, tier: &Tier, n: u32) -> (Poured, Option<(PerBand, u128)>)
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned + ?Sized,
        Q::Owned: Into<K>,
    {
        if n > tier.capacity || n == 0 {
            return (self.pour_key(key, tier, n), None);
        }
        let known = with_map!(&self.words, map => {
            let early = self.early_reading(map);
            map.update(key, |w, epoch| {
                let early = early.and_then(|early| map.within_horizon(early, epoch));
                w.decide_and_read(tier, epoch, early, || map.reading(epoch), n)
            })
        });
        if let Some(Some((result, tats, now))) = known {
            return (Poured::from(result), Some((tats, u128::from(now))));
        }
        let outcome = with_map!(&self.words, map => self.pour_read(map, key, tier, n));
        match outcome {
            Ok(((result, tats, now), first)) => {
                if first {
                    self.wake_sweeper();
                }
                self.count_keys();
                (Poured::from(result), Some((tats, u128::from(now))))
            }
            Err(Unavailable::Refused { retry_after }) => {
                tracing::debug!(?retry_after, "keyed funnel full: new key refused");
                // Its look for room may have swept keys away.
                self.count_keys();
                (Poured::MapFull { retry_after }, None)
            }
            Err(Unavailable::Failed) => unreachable!("a word can always be made"),
        }
    }

    /// [`pour`](Self::pour) with the bands read back.
    #[expect(
        clippy::type_complexity,
        reason = "the map's answer around the decision's"
    )]
    fn pour_read<Q, W: Stored>(
        &self,
        map: &ShardMap<K, W, S>,
        key: &Q,
        tier: &Tier,
        n: u32,
    ) -> Result<((Result<(), TryAcquireError>, PerBand, u64), bool), Unavailable>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned + ?Sized,
        Q::Owned: Into<K>,
    {
        let units = &self.units;
        let now_nanos = self.now_nanos();
        let (decided, first) = map.get_or_insert(
            key,
            || now_nanos,
            || Some(W::fresh(units, now_nanos)),
            |w, epoch| w.swept(units, epoch, now_nanos),
            false,
            |w, epoch| w.decide_and_read(tier, epoch, None, || Some(map.reading_swept(epoch)), n),
        )?;
        Ok((decided.expect("a reading is always given"), first))
    }

    fn pour<Q, W: Stored>(
        &self,
        map: &ShardMap<K, W, S>,
        key: &Q,
        tier: &Tier,
        n: u32,
    ) -> Result<(Result<(), TryAcquireError>, bool), Unavailable>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned + ?Sized,
        Q::Owned: Into<K>,
    {
        let units = &self.units;
        let now_nanos = self.now_nanos();
        // The decision reads the clock again, after the key's state: the
        // sweep or the insertion before it may have taken a while.
        let (decided, first) = map.get_or_insert(
            key,
            || now_nanos,
            || Some(W::fresh(units, now_nanos)),
            |w, epoch| w.swept(units, epoch, now_nanos),
            false,
            |w, epoch| w.decide(tier, epoch, None, || Some(map.reading_swept(epoch)), n),
        )?;
        Ok((decided.expect("a reading is always given"), first))
    }

    /// `key`'s bands now (each empty, at `now`, for a key not held or
    /// drained), and `now` in ns.
    fn tats<Q>(&self, key: &Q) -> (PerBand, u128)
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        // The clock after the key's state, as every decision reads it.
        let tats = with_map!(&self.words, map => {
            map.get(key, |w, epoch| w.tats(&self.units, epoch))
        });
        let now_ns = u128::from(self.now_nanos());
        let now = self.units.scaled(now_ns);
        let mut tats = tats.unwrap_or(now);
        for (tat, now) in tats.iter_mut().zip(now) {
            *tat = (*tat).max(now);
        }
        (tats, now_ns)
    }

    /// What `try_acquire_many(key, n)` under `tier` would answer now, and
    /// the state of each band.
    fn peek<Q>(&self, key: &Q, tier: &Tier, n: u32) -> Peek
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let (tats, now_ns) = self.tats(key);
        let quota = &tier.bands;
        let answer = if n > tier.capacity {
            Err(TryAcquireError::InsufficientCapacity)
        } else if n == 0 {
            Ok(())
        } else {
            let mut trial = tats;
            quota
                .try_pour(&mut trial, now_ns, n)
                .map_err(|retry_after| TryAcquireError::Limited { retry_after })
        };
        Peek::of_bands(answer, &tier.quota, quota, &tats, now_ns)
    }

    /// Sets the key-count gauge, for a named map (after a key came).
    fn count_keys(&self) {
        if self.meter.is_on() {
            self.meter.keys(with_map!(&self.words, map => map.len()));
        }
    }

    fn wake_sweeper(&self) {
        if let Some(notify) = &self.sweeper {
            notify.notify_one();
        }
    }

    fn stats(&self) -> KeyedStats {
        let mut stats = with_map!(&self.words, map => map.stats());
        (stats.granted, stats.limited) = self.counters.totals();
        stats
    }
}

impl<K, S> Sweep for Inner<K, S>
where
    K: Hash + Eq + Send + Sync + 'static,
    S: BuildHasher + Send + Sync + 'static,
{
    fn sweep(&self) -> usize {
        let now_nanos = self.now_nanos();
        let units = &self.units;
        let left = with_map!(&self.words, map => {
            map.sweep_all(now_nanos, |w, epoch| w.swept(units, epoch, now_nanos))
        });
        self.meter.keys(left);
        left
    }
}

impl<K, S> Inner<K, S> {
    /// The quota of the calls that name none, now.
    #[inline]
    fn own(&self) -> &Tier {
        match self.default.load(std::sync::atomic::Ordering::Relaxed) {
            0 => &self.first,
            i => &self.others[i - 1],
        }
    }

    /// Every quota keys may be held to, the map's own first.
    fn tiers(&self) -> impl Iterator<Item = &Tier> {
        std::iter::once(&self.first).chain(&*self.others)
    }
}

impl<K, S> Drop for Inner<K, S> {
    fn drop(&mut self) {
        if let Some(notify) = &self.sweeper {
            notify.notify_one();
        }
        // It holds no keys any more.
        if self.meter.is_on() {
            self.meter.publish(self.counters.totals());
            self.meter.keys(0);
        }
    }
}

/// A named map's grants reach the recorder from its permit counter (see
/// `crate::meter`).
impl<K: Send + Sync, S: Send + Sync> crate::meter::Publish for Inner<K, S> {
    fn publish(&self) {
        self.meter.publish(self.counters.totals());
    }
}

impl<K> KeyedFunnel<K>
where
    K: Hash + Eq + Send + Sync + 'static,
{
    /// A builder; [`rate`](KeyedFunnelBuilder::rate) is required.
    pub fn builder() -> KeyedFunnelBuilder<K> {
        KeyedFunnelBuilder::default()
    }
}

impl<K, S> KeyedFunnel<K, S>
where
    K: Hash + Eq + Send + Sync + 'static,
    S: BuildHasher + Send + Sync + 'static,
{
    /// Pours one unit into `key`'s funnel if it fits now.
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
        self.inner.try_acquire(key, self.inner.own(), 1)
    }

    /// Pours `n` units into `key`'s funnel if they fit now: lock-free on the
    /// key's word, under a shared (read) lock of its shard.
    ///
    /// # Errors
    ///
    /// [`TryAcquireError::Limited`] with the exact time until they would
    /// fit; [`TryAcquireError::Unavailable`] for a new key refused because
    /// `max_keys` are all active (the map's doing, not the key's);
    /// [`TryAcquireError::InsufficientCapacity`] when `n` exceeds the
    /// capacity.
    pub fn try_acquire_many<Q>(&self, key: &Q, n: u32) -> Result<(), TryAcquireError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned + ?Sized,
        Q::Owned: Into<K>,
    {
        self.inner.try_acquire(key, self.inner.own(), n)
    }

    /// Waits until one unit fits in `key`'s funnel, then pours it.
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

    /// Waits until `n` units fit in `key`'s funnel, then pours them: it
    /// sleeps for the `retry_after` that `try_acquire_many` reports and
    /// tries again. There is no queue per key (that is what keeps a key to
    /// one word), so concurrent waiters on one key are not served in FIFO
    /// order and a large request can be overtaken by small ones; use
    /// [`Keyed`](super::Keyed) with a [`TokenBucket`](crate::TokenBucket)
    /// where fairness per key matters.
    ///
    /// # Errors
    ///
    /// [`AcquireError::InsufficientCapacity`] at once when `n` exceeds the
    /// capacity.
    ///
    /// # Cancel safety
    ///
    /// Nothing is reserved while waiting: dropping the future spends
    /// nothing.
    pub async fn acquire_many<Q>(&self, key: &Q, n: u32) -> Result<(), AcquireError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned + Sync + ?Sized,
        Q::Owned: Into<K>,
    {
        self.wait(key, || self.inner.own(), n).await
    }

    /// Pours `n` units into `key`'s funnel under `quota` — one of the
    /// map's tiers — if they fit now: what
    /// [`try_acquire_many`](Self::try_acquire_many) does under the map's
    /// own quota. Free and paid keys so share one map; a key's state does
    /// not depend on its tier (see [`KeyedFunnelBuilder::tier`] for what a
    /// change of tier keeps).
    ///
    /// # Errors
    ///
    /// As [`try_acquire_many`](Self::try_acquire_many), with `quota`'s
    /// bands: `InsufficientCapacity` when `n` exceeds its smallest
    /// capacity.
    ///
    /// # Panics
    ///
    /// When `quota` is neither the map's quota nor one of its tiers: a
    /// tier must be declared when the map is built, so that every tier
    /// counts time in the same units.
    ///
    /// # Examples
    ///
    /// ```
    /// use tokio_ratelimit::{Quota, Rate, TryAcquireError, keyed::KeyedFunnel};
    ///
    /// let free = Quota::new(Rate::per_second(2), 2).and(Rate::per_day(100), 100);
    /// let paid = Quota::new(Rate::per_second(20), 20).and(Rate::per_day(1000), 1000);
    /// let limits: KeyedFunnel<String> =
    ///     KeyedFunnel::builder().quota(free).tier(paid).build().unwrap();
    /// for _ in 0..2 {
    ///     limits.try_acquire_with("free-user", &free, 1).unwrap();
    /// }
    /// assert!(matches!(
    ///     limits.try_acquire_with("free-user", &free, 1),
    ///     Err(TryAcquireError::Limited { .. })
    /// ));
    /// // A paid key in the same map gets its own, larger quota.
    /// assert!(limits.try_acquire_with("paid-user", &paid, 20).is_ok());
    /// ```
    pub fn try_acquire_with<Q>(&self, key: &Q, quota: &Quota, n: u32) -> Result<(), TryAcquireError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned + ?Sized,
        Q::Owned: Into<K>,
    {
        self.inner.try_acquire(key, self.inner.tier(quota), n)
    }

    /// Waits until `n` units fit in `key`'s funnel under `quota`, one of
    /// the map's tiers, then pours them; as
    /// [`acquire_many`](Self::acquire_many) under the map's own quota.
    ///
    /// # Errors
    ///
    /// As [`acquire_many`](Self::acquire_many), with `quota`'s bands.
    ///
    /// # Panics
    ///
    /// As [`try_acquire_with`](Self::try_acquire_with).
    ///
    /// # Cancel safety
    ///
    /// As [`acquire_many`](Self::acquire_many).
    pub async fn acquire_with<Q>(&self, key: &Q, quota: &Quota, n: u32) -> Result<(), AcquireError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned + Sync + ?Sized,
        Q::Owned: Into<K>,
    {
        let tier = self.inner.tier(quota);
        self.wait(key, || tier, n).await
    }

    /// Tries until granted, each try under `tier()`: for the calls that
    /// name no quota, the map's quota at that try (a `set_quota` while it
    /// waits applies from its next try on, as to any new call).
    async fn wait<'a, Q>(
        &'a self,
        key: &Q,
        tier: impl Fn() -> &'a Tier,
        n: u32,
    ) -> Result<(), AcquireError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned + Sync + ?Sized,
        Q::Owned: Into<K>,
    {
        // The tries on the way are not refusals: only the answer is counted.
        // A waiter in the metrics from its first sleep on.
        let mut waiter = None;
        loop {
            match self.inner.pour_key(key, tier(), n) {
                Poured::Granted => {
                    let inner = &self.inner;
                    inner.meter.granted(n, |n| inner.counters.granted(n));
                    return Ok(());
                }
                Poured::Limited(TryAcquireError::Limited { retry_after })
                | Poured::MapFull { retry_after } => {
                    waiter.get_or_insert_with(|| crate::meter::Waiter::start(&self.inner.meter));
                    clock::sleep(retry_after).await;
                }
                Poured::Limited(TryAcquireError::InsufficientCapacity) => {
                    let inner = &self.inner;
                    inner
                        .meter
                        .refused(Refusal::TooLarge, || inner.counters.refused());
                    return Err(AcquireError::InsufficientCapacity);
                }
                Poured::Limited(_) => return Err(AcquireError::Closed),
            }
        }
    }

    /// Whole units that `key`'s funnel could take now: the capacity for a
    /// key that is not held (or has drained). Reads the key without adding
    /// it.
    ///
    /// This and [`empty_in`](Self::empty_in) are what HTTP rate-limit
    /// headers report (`RateLimit-Remaining`, `RateLimit-Reset`); see
    /// `examples/axum_service.rs`.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use tokio_ratelimit::{Rate, keyed::KeyedFunnel};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// let per_user: KeyedFunnel<u64> =
    ///     KeyedFunnel::builder().rate(Rate::per_second(2)).capacity(3).build().unwrap();
    /// assert_eq!(per_user.free(&7), 3);
    /// per_user.try_acquire_many(&7, 2).unwrap();
    /// assert_eq!(per_user.free(&7), 1);
    /// assert_eq!(per_user.empty_in(&7), Duration::from_secs(1)); // 2 units at 2/s
    /// tokio::time::advance(Duration::from_millis(750)).await;
    /// assert_eq!(per_user.free(&7), 2); // 1.5 units drained
    /// assert_eq!(per_user.empty_in(&7), Duration::from_millis(250));
    /// assert_eq!(per_user.free(&8), 3); // another key: untouched
    /// # }
    /// ```
    pub fn free<Q>(&self, key: &Q) -> u32
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let (tats, now) = self.inner.tats(key);
        self.inner.own().bands.available(&tats, now)
    }

    /// How long until `key`'s funnel is empty (its whole capacity free
    /// again) if nothing more is poured, rounded up to a nanosecond; zero
    /// for a key that is not held. Reads the key without adding it.
    ///
    /// # Examples
    ///
    /// See [`free`](Self::free).
    pub fn empty_in<Q>(&self, key: &Q) -> Duration
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let (tats, now) = self.inner.tats(key);
        let bands = &self.inner.own().bands;
        bands
            .params()
            .iter()
            .zip(tats)
            .map(|(p, tat)| p.duration_ceil(tat - p.scale_nanos(now)))
            .max()
            .unwrap_or_default()
    }

    /// What `try_acquire_many(key, n)` would answer now, and the key's
    /// free units and time until empty, without pouring, counting or adding
    /// the key: what the `RateLimit` response headers need. A key not held
    /// reads as a new one (its whole capacity free); a new key that
    /// `max_keys` would turn away is not foreseen.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use tokio_ratelimit::{Rate, keyed::KeyedFunnel};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// let per_user: KeyedFunnel<u64> =
    ///     KeyedFunnel::builder().rate(Rate::per_second(2)).capacity(3).build().unwrap();
    /// per_user.try_acquire_many(&7, 3).unwrap();
    /// let peek = per_user.peek(&7, 1);
    /// assert_eq!(peek.retry_after(), Some(Duration::from_millis(500)));
    /// let band = peek.bands().next().unwrap();
    /// assert_eq!((band.available, band.full_in), (0, Duration::from_millis(1500)));
    /// assert!(per_user.peek(&8, 3).is_granted());
    /// assert_eq!(per_user.len(), 1); // peeking added nothing
    /// # }
    /// ```
    pub fn peek<Q>(&self, key: &Q, n: u32) -> Peek
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.inner.peek(key, self.inner.own(), n)
    }

    /// What `try_acquire_with(key, quota, n)` would answer now, and the
    /// state of each of `quota`'s bands for `key`; as
    /// [`peek`](Self::peek).
    ///
    /// # Panics
    ///
    /// As [`try_acquire_with`](Self::try_acquire_with).
    pub fn peek_with<Q>(&self, key: &Q, quota: &Quota, n: u32) -> Peek
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.inner.peek(key, self.inner.tier(quota), n)
    }

    /// Pours `n` units into `key`'s funnel if they fit now — under
    /// `quota`, one of the map's tiers, when one is given — and reports
    /// each band's state as the decision left it, read with it (one lookup
    /// of the key): the decision is the report's
    /// [`answer`](Peek::answer) (counted as `try_acquire_many`'s), and its
    /// bands are what `RateLimit` response headers show. A quota the map
    /// was not built with is refused as `Closed` (and logged), never a
    /// panic: this is what middleware calls.
    pub fn try_acquire_and_peek<Q>(&self, key: &Q, quota: Option<&Quota>, n: u32) -> Peek
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned + ?Sized,
        Q::Owned: Into<K>,
    {
        let tier = match quota {
            None => self.inner.own(),
            Some(quota) => {
                let Some(tier) = self.inner.find_tier(quota) else {
                    tracing::error!(?quota, "KeyedFunnel: a quota the map was not built with");
                    return Peek::new(Err(TryAcquireError::Closed), &[]);
                };
                tier
            }
        };
        let (poured, read) = self.inner.pour_key_read(key, tier, n);
        let answer = self.inner.count(n, poured);
        match read {
            // The bands as this decision left them, read with it.
            Some((tats, now_ns)) => Peek::of_bands(answer, &tier.quota, &tier.bands, &tats, now_ns),
            None => self.inner.peek(key, tier, 0).with_answer(answer),
        }
    }

    /// Keys held now (including drained ones not swept yet).
    pub fn len(&self) -> usize {
        self.inner.stats().keys
    }

    /// Whether no key is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Keys held, evicted and refused so far, and the permits granted and
    /// requests limited.
    pub fn stats(&self) -> KeyedStats {
        self.inner.stats()
    }

    /// Drops every drained key now (the crate also does this on its own).
    /// Returns the keys left.
    pub fn sweep(&self) -> usize {
        self.inner.sweep()
    }

    /// The map's quota: the one the calls that name none hold keys to.
    pub fn quota(&self) -> Quota {
        self.inner.own().quota
    }

    /// Makes `quota` the one the calls that name none hold keys to, while
    /// the map serves (a tier's quota changed in configuration, say). The
    /// quota must be one the map was built with — its own or a
    /// [`tier`](KeyedFunnelBuilder::tier) — since every key's state is
    /// counted in units those quotas share: declare at build every quota
    /// the map may be switched to. A decision already under way finishes
    /// under the quota it read; an `acquire` that waits tries each time
    /// under the quota then in use (so it may end with
    /// `InsufficientCapacity` if the new capacity is less than it asks
    /// for).
    ///
    /// **Keys mid-window** follow the tier-change rule (see
    /// [`KeyedFunnelBuilder::tier`]): each band's instant (when it is
    /// empty again) carries over to the new quota's band of the same index,
    /// so the time until each band is empty is kept, not its count: a band
    /// of the same window (capacity ÷ rate) keeps the fraction in use and
    /// one of a shorter window is as full or fuller, so the change gives
    /// their keys no fresh burst; a band of a longer window holds that time
    /// of water, a smaller fraction (a key drained under 10/s with a burst
    /// of 10 holds one permit's water under 1/s with a burst of 10, and may
    /// take 9 at once). Across the change a band admits at most what it had
    /// left under the old quota, and then what the new one allows (its
    /// capacity at most, and its rate).
    ///
    /// # Errors
    ///
    /// [`ConfigError::InvalidParameter`](crate::ConfigError::InvalidParameter) for a quota the map was not built
    /// with; the quota in use is then unchanged.
    ///
    /// # Examples
    ///
    /// ```
    /// use tokio_ratelimit::{Quota, Rate, TryAcquireError, keyed::KeyedFunnel};
    ///
    /// let normal = Quota::new(Rate::per_second(10), 10);
    /// let degraded = Quota::new(Rate::per_second(1), 2);
    /// let per_ip: KeyedFunnel<String> =
    ///     KeyedFunnel::builder().quota(normal).tier(degraded).build().unwrap();
    /// for _ in 0..5 {
    ///     per_ip.try_acquire("10.0.0.1").unwrap();
    /// }
    /// // Under load, every client is held to the degraded quota: the key
    /// // has 5 seconds of water at 10/s (0.5 s), over a depth of 2 s at
    /// // 1/s: it has used a quarter, and may take 1 more now.
    /// per_ip.set_quota(degraded).unwrap();
    /// assert_eq!(per_ip.quota(), degraded);
    /// assert!(per_ip.try_acquire("10.0.0.1").is_ok());
    /// assert!(matches!(per_ip.try_acquire("10.0.0.1"), Err(TryAcquireError::Limited { .. })));
    /// assert!(per_ip.set_quota(Quota::new(Rate::per_second(5), 5)).is_err());
    /// ```
    pub fn set_quota(&self, quota: Quota) -> Result<(), crate::ConfigError> {
        let index = self.inner.tiers().position(|t| t.quota == quota).ok_or(
            crate::ConfigError::InvalidParameter {
                name: "quota",
                reason: "not one of the map's quotas: declare it with KeyedFunnelBuilder::tier",
            },
        )?;
        self.inner
            .default
            .store(index, std::sync::atomic::Ordering::Relaxed);
        tracing::debug!(?quota, "keyed funnel: quota changed");
        Ok(())
    }

    /// The leak rate of the map's quota (of its first band).
    pub fn rate(&self) -> Rate {
        self.quota().bands()[0].rate()
    }

    /// The most units one request may take under the map's quota: its
    /// smallest capacity.
    pub fn capacity(&self) -> u32 {
        self.inner.own().capacity
    }
}

impl<K, S> fmt::Debug for KeyedFunnel<K, S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let stats = with_map!(&self.inner.words, map => map.stats());
        f.debug_struct("KeyedFunnel")
            .field("quota", &self.inner.own().quota)
            .field("tiers", &self.inner.others.len())
            .field("stats", &stats)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_narrow_word_reads_relative_to_its_epoch() {
        let epoch = (5u128 << 64) + 12_345; // far past 2⁶⁴: only the low bits are kept
        let horizon = <AtomicU64 as Word>::HORIZON;
        for tat in [
            epoch,
            epoch + 1,
            epoch - 1,
            epoch - (1 << 40),           // poured with a `now` older than the sweep
            epoch + (1 << 40),           // poured long after the sweep
            epoch + horizon + (1 << 56), // poured at the horizon, a full bucket deep
            epoch + (1 << 63) - 6,       // the edges of the signed window
            epoch - (1 << 63),
        ] {
            let w = <AtomicU64 as Word>::new(tat);
            assert_eq!(w.read(epoch).1, tat, "tat {tat}");
            assert!(w.replace(w.read(epoch).0, tat + 5));
            assert_eq!(w.read(epoch).1, tat + 5);
        }
    }

    #[test]
    fn a_stale_now_sees_a_later_pour() {
        // One thread reads the clock, another reads it later and fills the
        // funnel; the first then decides: the funnel is full for it too.
        let params = Params::new(Rate::per_second(10), 3).unwrap(); // τ = 300 ms
        let epoch = 7u128 << 64;
        let later = epoch + 1_000_000_000;
        let w = <AtomicU64 as Word>::new(epoch);
        assert_eq!(decide(&params, &w, epoch, || Some(later), 3), Some(Ok(())));
        for stale in [later - 1, later - 1_000_000, epoch] {
            assert!(
                matches!(
                    decide(&params, &w, epoch, || Some(stale), 1),
                    Some(Err(TryAcquireError::Limited { .. }))
                ),
                "at {stale}"
            );
        }
        assert_eq!(w.read(epoch).1, later + params.tau());
    }

    #[test]
    fn a_key_idle_for_wraps_reads_as_drained() {
        let params = Params::new(Rate::per_second(999_983), 999_983).unwrap();
        let epoch = 0;
        let w = <AtomicU64 as Word>::new(0);
        assert_eq!(
            decide(&params, &w, epoch, || Some(0), 999_983),
            Some(Ok(()))
        );
        for wraps in [1u128, 2, 3, 1000] {
            for now in [(wraps << 64) + 1, (wraps << 64) - params.tau() + 1] {
                assert!(is_drained(&w, epoch, now), "{wraps} wraps");
                assert_eq!(params.available(w.read(epoch).1.max(now), now), 999_983);
            }
        }
    }

    #[test]
    fn narrow_only_when_it_is_safe() {
        let fine = Params::new(Rate::per_second(1_048_583), 10).unwrap();
        assert!(fine.den() > 1 << 20);
        let coarse = Params::new(Rate::per_second(7), u32::MAX).unwrap();
        assert!(coarse.tau() > 1 << 56);
        let keyed = |rate, capacity| {
            let map: KeyedFunnel<u8> = KeyedFunnel::builder()
                .rate(rate)
                .capacity(capacity)
                .build()
                .unwrap();
            matches!(map.inner.words, Words::Narrow(_))
        };
        assert!(keyed(Rate::per_second(100), 10));
        assert!(keyed(Rate::per_second(7), 1000));
        assert!(keyed(Rate::per_second(999_983), 10));
        assert!(!keyed(Rate::per_second(1_048_583), 10));
        assert!(!keyed(Rate::per(1_048_583, Duration::from_secs(86_400)), 2));
        assert!(!keyed(Rate::per_second(7), u32::MAX));
        // The wide encoding gives the same answers.
        let wide: KeyedFunnel<u8> = KeyedFunnel::builder()
            .rate(Rate::per(1_048_583, Duration::from_secs(86_400)))
            .capacity(2)
            .build()
            .unwrap();
        assert!(wide.try_acquire_many(&1, 2).is_ok());
        assert!(wide.try_acquire(&1).is_err());
    }
}

#[cfg(all(test, tokio_ratelimit_loom))]
mod loom_tests;
