//! The sharded map behind both keyed limiters.
//!
//! A fixed array of shards, each a `hashbrown::HashTable` of `(K, V)`
//! behind an `RwLock`, cache-padded so that two shards never share a line.
//! A key is hashed once: the high bits pick the shard, the table uses the
//! whole hash. Decisions on an existing key take the shard's read lock
//! only; inserting and evicting take the write lock.
//!
//! # Bounded memory
//!
//! A key whose state is indistinguishable from a fresh one may be dropped:
//! the next use builds it again and nobody can tell. The map drops such keys
//!
//! * when a shard's table is full and would grow — it is swept first, so
//!   memory follows the live keys rather than every key ever seen (amortized:
//!   a shard is swept at most once per `sweep_gap`);
//! * when `max_keys` is reached — the key's shard is swept (same throttle),
//!   and if that frees nothing the new key is refused: an active key is never
//!   evicted, because that would hand its owner a fresh burst;
//! * periodically, by the sweeper task (see `sweeper`), when there is one.
//!
//! Eviction runs under the shard's write lock, so no decision on the key is
//! in flight while it is judged fresh.
//!
//! # Epochs
//!
//! Each shard remembers when it was last swept, its *epoch*, and hands it to
//! every callback with the key's value. A sweep at time `t` leaves only keys
//! whose state is still live at `t`, so a value that encodes a time relative
//! to something (the keyed funnel keeps its `tat` modulo 2⁶⁴) can be decoded
//! relative to the epoch, whatever `now` a caller holds and however long the
//! key idled. A map built with a `horizon` keeps every shard's epoch recent:
//! a shard whose epoch is more than `horizon` old is swept before the next
//! update of any of its keys.

use std::borrow::Borrow;
use std::hash::{BuildHasher, Hash};
use std::sync::PoisonError;
use std::time::Duration;

use hashbrown::HashTable;

use crate::clock;
use crate::sync::{AtomicU64, AtomicUsize, Ordering, RwLock, RwLockReadGuard, RwLockWriteGuard};

/// Counters of a keyed limiter.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct KeyedStats {
    /// Keys held now (including fresh ones not swept yet).
    pub keys: usize,
    /// Keys dropped because their state was indistinguishable from fresh.
    pub evicted: u64,
    /// Requests answered `Unavailable` because `max_keys` were all active
    /// (a new key without a slot). An `acquire` that waits for a slot is
    /// not counted (its answer is the key's), nor a request a new key's
    /// limiter answers whatever the map holds (`n` = 0, `n` over its
    /// capacity).
    pub refused: u64,
    /// Permits granted, over all keys.
    pub granted: u64,
    /// Requests refused by a key's limiter (rate limited, more than its
    /// capacity, and for a key's limiter that answers them, a leaky
    /// bucket's overflow or a timed-out wait), over all keys.
    pub limited: u64,
}

#[repr(align(128))]
struct Shard<K, V> {
    table: RwLock<HashTable<(K, V)>>,
    /// When this shard was last swept (ns since the map's origin + 1; 0 =
    /// never). Written under the table's write lock, so a reader holding
    /// the read lock sees the sweep its table reflects.
    last_sweep: AtomicU64,
}

impl<K, V> Shard<K, V> {
    /// When this shard was last swept, in ns since the map's origin; the
    /// origin itself for a shard never swept (no key is older than that).
    fn epoch(&self) -> u64 {
        self.last_sweep.load(Ordering::Relaxed).saturating_sub(1)
    }

    /// How long ago, at `now`, this shard was last swept.
    fn since_sweep(&self, now: u64) -> Duration {
        match self.last_sweep.load(Ordering::Relaxed) {
            0 => Duration::MAX,
            last => Duration::from_nanos(now.saturating_sub(last - 1)),
        }
    }
}

/// Why a new key could not be added.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Unavailable {
    /// Every slot holds an active key; a sweep of the key's shard may free
    /// one after `retry_after`.
    Refused { retry_after: Duration },
    /// The value for the new key could not be made.
    Failed,
}

pub(crate) struct ShardMap<K, V, S> {
    shards: Box<[Shard<K, V>]>,
    hasher: S,
    /// `64 - log2(shards)`: the shard is `hash >> shift`.
    shift: u32,
    count: AtomicUsize,
    max_keys: usize,
    evicted: AtomicU64,
    refused: AtomicU64,
    origin: clock::Origin,
    /// The least time between two amortized sweeps of one shard.
    sweep_gap: Duration,
    /// When a full map last looked for room in the other shards than a new
    /// key's, ns since the origin plus one (0: never): at most once a sweep
    /// gap, so that a flood of new keys against a full map pays one load
    /// each for it, however many shards there are.
    others_swept: AtomicU64,
    /// The oldest a shard's epoch may be when one of its keys is updated, in
    /// ns (`u64::MAX`: any age).
    horizon: u64,
}

fn read<T>(lock: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    lock.read().unwrap_or_else(PoisonError::into_inner)
}

fn write<T>(lock: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    lock.write().unwrap_or_else(PoisonError::into_inner)
}

impl<K, V, S> ShardMap<K, V, S> {
    pub(crate) fn len(&self) -> usize {
        self.count.load(Ordering::Relaxed)
    }

    pub(crate) fn stats(&self) -> KeyedStats {
        KeyedStats {
            keys: self.len(),
            evicted: self.evicted.load(Ordering::Relaxed),
            refused: self.refused.load(Ordering::Relaxed),
            granted: 0,
            limited: 0,
        }
    }
}

impl<K, V, S> ShardMap<K, V, S>
where
    K: Hash + Eq,
    S: BuildHasher,
{
    /// A map whose times are ns since `origin`; see the module docs for
    /// `horizon` (ns, `u64::MAX` for none).
    pub(crate) fn new(
        hasher: S,
        max_keys: usize,
        sweep_gap: Duration,
        origin: clock::Origin,
        horizon: u64,
    ) -> Self {
        // Four shards per core keeps writers on different keys apart.
        #[cfg(not(all(test, tokio_ratelimit_loom)))]
        let shards = {
            let cores = std::thread::available_parallelism().map_or(4, usize::from);
            (cores * 4).next_power_of_two().clamp(4, 1024)
        };
        // The loom models: two, the fewest where two keys' locks differ
        // (each shard is a lock for loom to interleave).
        #[cfg(all(test, tokio_ratelimit_loom))]
        let shards = 2;
        let per_shard = max_keys.div_ceil(shards);
        ShardMap {
            shards: (0..shards)
                .map(|_| Shard {
                    // A small `max_keys` is allocated up front; a large one
                    // grows as keys arrive.
                    table: RwLock::new(if per_shard <= 1024 {
                        HashTable::with_capacity(per_shard)
                    } else {
                        HashTable::new()
                    }),
                    last_sweep: AtomicU64::new(0),
                })
                .collect(),
            hasher,
            shift: 64 - shards.trailing_zeros(),
            count: AtomicUsize::new(0),
            max_keys,
            evicted: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            origin,
            sweep_gap,
            others_swept: AtomicU64::new(0),
            horizon,
        }
    }

    fn hash<Q: Hash + ?Sized>(&self, key: &Q) -> u64 {
        self.hasher.hash_one(key)
    }

    fn shard(&self, hash: u64) -> &Shard<K, V> {
        // `shift` is at least 54, so the index fits any usize.
        #[expect(
            clippy::cast_possible_truncation,
            reason = "`shift` is at least 54, so the index fits any usize"
        )]
        &self.shards[(hash >> self.shift) as usize]
    }

    /// Runs `f` on the value of an existing key and its shard's epoch, under
    /// the shard's read lock, to read it.
    pub(crate) fn get<Q, R>(&self, key: &Q, f: impl FnOnce(&V, u64) -> R) -> Option<R>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let hash = self.hash(key);
        let shard = self.shard(hash);
        let table = read(&shard.table);
        table
            .find(hash, |(k, _)| k.borrow() == key)
            .map(|(_, v)| f(v, shard.epoch()))
    }

    /// Runs `f` on the value of an existing key and its shard's epoch, under
    /// the shard's read lock, to update it: the hot path, kept free of the
    /// insertion machinery. `None` when the key is not held. `f` reads the
    /// clock itself, after the key's state (with [`reading`](Self::reading),
    /// which answers `None` when the shard must be swept first:
    /// [`get_or_insert`](Self::get_or_insert) does that).
    #[inline]
    pub(crate) fn update<Q, R>(&self, key: &Q, f: impl FnOnce(&V, u64) -> R) -> Option<R>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let hash = self.hash(key);
        let shard = self.shard(hash);
        let table = read(&shard.table);
        table
            .find(hash, |(k, _)| k.borrow() == key)
            .map(|(_, v)| f(v, shard.epoch()))
    }

    /// Now (ns since the origin), for a decision in a shard whose epoch is
    /// `epoch`: no earlier than the epoch (see `KeyedFunnel::pour_key`);
    /// `None` past the map's horizon of it (the shard must be swept first).
    #[inline]
    pub(crate) fn reading(&self, epoch: u64) -> Option<u64> {
        self.within_horizon(self.now_nanos(), epoch)
    }

    /// [`reading`](Self::reading) for the reading `now`.
    #[inline]
    pub(crate) fn within_horizon(&self, now: u64, epoch: u64) -> Option<u64> {
        let now = now.max(epoch);
        (now - epoch <= self.horizon).then_some(now)
    }

    /// [`reading`](Self::reading) where the shard has just been swept: past
    /// the horizon (only if this thread was preempted for that long since
    /// the sweep), the horizon's end, an earlier time than it is.
    pub(crate) fn reading_swept(&self, epoch: u64) -> u64 {
        self.reading(epoch)
            .unwrap_or_else(|| epoch.saturating_add(self.horizon))
    }

    /// Runs `f` on the value of `key` and its shard's epoch to update it at
    /// `now()` (ns since the origin, read only when a sweep may be due),
    /// inserting `make()` first if the key is new (`true` in the answer when
    /// that made the map non-empty). A new key past `max_keys` is refused
    /// unless `force`.
    ///
    /// `is_fresh` judges whether an entry may be evicted (when a sweep is
    /// due), given its shard's epoch before the sweep.
    pub(crate) fn get_or_insert<Q, R>(
        &self,
        key: &Q,
        now: impl Fn() -> u64,
        make: impl FnOnce() -> Option<V>,
        is_fresh: impl FnMut(&V, u64) -> bool,
        force: bool,
        f: impl FnOnce(&V, u64) -> R,
    ) -> Result<(R, bool), Unavailable>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned + ?Sized,
        Q::Owned: Into<K>,
    {
        let hash = self.hash(key);
        let shard = self.shard(hash);
        let mut f = Some(f);
        {
            let table = read(&shard.table);
            let epoch = shard.epoch();
            if self.horizon == u64::MAX || now().saturating_sub(epoch) <= self.horizon {
                if let Some((_, v)) = table.find(hash, |(k, _)| k.borrow() == key) {
                    return Ok(((f.take().expect("once"))(v, epoch), false));
                }
            }
        }
        let mut is_fresh = is_fresh;
        let mut table = write(&shard.table);
        let now = now();
        if now.saturating_sub(shard.epoch()) > self.horizon {
            self.sweep_locked(shard, &mut table, now, &mut is_fresh, Sweeping::Now);
        } else if self.len() >= self.max_keys || table.len() == table.capacity() {
            // Make room from fresh keys before growing or refusing.
            self.sweep_locked(shard, &mut table, now, &mut is_fresh, Sweeping::IfDue);
        }
        if table.find(hash, |(k, _)| k.borrow() == key).is_none()
            && !force
            && self.len() >= self.max_keys
        {
            // Still full: the fresh keys holding the slots may be in other
            // shards (a slot is the map's, not the shard's). Sweep those that
            // are due, one at a time (never two shards' locks at once), then
            // look again.
            drop(table);
            self.sweep_others(shard, now, &mut is_fresh);
            table = write(&shard.table);
        }
        let epoch = shard.epoch();
        if let Some((_, v)) = table.find(hash, |(k, _)| k.borrow() == key) {
            return Ok(((f.take().expect("once"))(v, epoch), false));
        }
        // Not counted here: the caller counts the refusals it answers (a
        // waiter's retries are not, nor a request answered without a slot).
        let refuse = || {
            let since = shard.since_sweep(now);
            Unavailable::Refused {
                retry_after: self.sweep_gap.saturating_sub(since).max(clock::TICK),
            }
        };
        if !force && self.len() >= self.max_keys {
            return Err(refuse());
        }
        let value = make().ok_or(Unavailable::Failed)?;
        // The slot is taken with the count itself: another shard's new key
        // may have taken the last one since the look above (each holds
        // only its own shard's lock).
        let before = if force {
            self.count.fetch_add(1, Ordering::Relaxed)
        } else {
            let max = self.max_keys;
            match self
                .count
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |held| {
                    (held < max).then_some(held + 1)
                }) {
                Ok(before) => before,
                Err(_) => return Err(refuse()),
            }
        };
        let first = before == 0;
        let hasher = &self.hasher;
        let entry = table.insert_unique(hash, (key.to_owned().into(), value), |(k, _)| {
            hasher.hash_one(k)
        });
        let (_, v) = entry.get();
        Ok(((f.take().expect("once"))(v, epoch), first))
    }

    /// Counts a new key refused for want of a slot, as answered to a
    /// caller ([`KeyedStats::refused`]).
    pub(crate) fn count_refused(&self) {
        self.refused.fetch_add(1, Ordering::Relaxed);
    }

    /// Sweeps the shards other than `own` that are due (not swept within
    /// the sweep gap), each under its own lock, until one frees a slot; at
    /// most once a sweep gap.
    fn sweep_others(&self, own: &Shard<K, V>, now: u64, mut is_fresh: impl FnMut(&V, u64) -> bool) {
        let last = self.others_swept.load(Ordering::Relaxed);
        if last != 0 && Duration::from_nanos(now.saturating_sub(last - 1)) < self.sweep_gap {
            return;
        }
        self.others_swept
            .store(now.saturating_add(1), Ordering::Relaxed);
        for shard in &self.shards {
            if self.len() < self.max_keys {
                return;
            }
            if std::ptr::eq(shard, own) || shard.since_sweep(now) < self.sweep_gap {
                continue;
            }
            let mut table = write(&shard.table);
            self.sweep_locked(shard, &mut table, now, &mut is_fresh, Sweeping::IfDue);
        }
    }

    /// Now, in ns since the map's origin.
    pub(crate) fn now_nanos(&self) -> u64 {
        self.origin.elapsed_nanos()
    }

    /// Evicts the fresh entries of a locked shard at `now`, unless the sweep
    /// is only `IfDue` and the shard was swept less than `sweep_gap` ago.
    /// Returns how many went.
    fn sweep_locked(
        &self,
        shard: &Shard<K, V>,
        table: &mut HashTable<(K, V)>,
        now: u64,
        mut is_fresh: impl FnMut(&V, u64) -> bool,
        when: Sweeping,
    ) -> usize {
        if when == Sweeping::IfDue && shard.since_sweep(now) < self.sweep_gap {
            return 0;
        }
        // Judge every entry by the epoch it was written under, then move the
        // epoch: what stays is live at `now`.
        let epoch = shard.epoch();
        let before = table.len();
        table.retain(|(_, v)| !is_fresh(v, epoch));
        shard
            .last_sweep
            .store(now.max(epoch).saturating_add(1), Ordering::Relaxed);
        let evicted = before - table.len();
        if evicted > 0 {
            self.count.fetch_sub(evicted, Ordering::Relaxed);
            self.evicted.fetch_add(evicted as u64, Ordering::Relaxed);
            // Give memory back when the table is mostly empty.
            if table.len() < table.capacity() / 4 {
                let hasher = &self.hasher;
                table.shrink_to(table.len() * 2, |(k, _)| hasher.hash_one(k));
            }
        }
        evicted
    }

    /// Calls `f` with every key held and its value, a shard at a time
    /// under that shard's read lock (keys added to a shard already visited
    /// are not seen).
    pub(crate) fn for_each(&self, mut f: impl FnMut(&K, &V)) {
        for shard in &self.shards {
            for (k, v) in read(&shard.table).iter() {
                f(k, v);
            }
        }
    }

    /// Sweeps every shard at `now` (ns since the origin); returns the keys
    /// left.
    pub(crate) fn sweep_all(&self, now: u64, mut is_fresh: impl FnMut(&V, u64) -> bool) -> usize {
        for shard in &self.shards {
            let mut table = write(&shard.table);
            self.sweep_locked(shard, &mut table, now, &mut is_fresh, Sweeping::Now);
        }
        self.len()
    }
}

/// Whether a sweep runs whatever the time since the last one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Sweeping {
    /// Now.
    Now,
    /// Only if the shard was not swept within the sweep gap.
    IfDue,
}

#[cfg(test)]
mod tests {
    use std::collections::hash_map::RandomState;

    use super::*;

    #[test]
    fn insert_find_sweep_refuse() {
        let map: ShardMap<String, u32, _> = ShardMap::new(
            RandomState::new(),
            3,
            Duration::ZERO,
            clock::Origin::now(),
            u64::MAX,
        );
        let never = |_: &u32, _| false;
        let get = |key: &str, v: u32, force| {
            map.get_or_insert(key, || 0, || Some(v), never, force, |v, _| *v)
        };
        assert_eq!(get("a", 1, false), Ok((1, true)));
        assert_eq!(get("a", 9, false), Ok((1, false)));
        assert_eq!(map.get("a", |v, _| *v), Some(1));
        assert_eq!(map.get("zz", |v, _| *v), None);
        get("b", 2, false).unwrap();
        get("c", 3, false).unwrap();
        // Full of active keys: refused, unless forced.
        assert!(matches!(
            get("d", 4, false),
            Err(Unavailable::Refused { .. })
        ));
        // The caller counts what it answers.
        assert_eq!(map.stats().refused, 0);
        map.count_refused();
        assert_eq!(map.stats().refused, 1);
        get("d", 4, true).unwrap();
        assert_eq!(
            map.get_or_insert("e", || 0, || None, never, true, |v, _| *v),
            Err(Unavailable::Failed)
        );
        assert_eq!(map.len(), 4);
        // Sweeping drops the fresh keys (here: odd values).
        let odd = |v: &u32, _| v % 2 == 1;
        assert_eq!(map.sweep_all(0, odd), 2);
        assert_eq!(map.stats().evicted, 2);
        assert_eq!(map.get("a", |v, _| *v), None);
        assert_eq!(map.get("b", |v, _| *v), Some(2));
    }

    #[test]
    fn a_shard_past_its_horizon_is_swept_before_an_update() {
        let map: ShardMap<u8, u32, _> = ShardMap::new(
            RandomState::new(),
            10,
            Duration::MAX,
            clock::Origin::now(),
            100,
        );
        let epoch_of = |key: u8| map.get(&key, |_, epoch| epoch).unwrap();
        let never = |_: &u32, _| false;
        map.get_or_insert(&1, || 50, || Some(1), never, false, |_, _| ())
            .unwrap();
        assert_eq!(epoch_of(1), 0);
        // Within the horizon of the epoch: the hot path takes it.
        assert_eq!(map.update(&1, |v, epoch| (*v, epoch)), Some((1, 0)));
        assert_eq!(map.within_horizon(100, 0), Some(100));
        // Past it: the hot path declines, the slow one sweeps (at 101, an
        // epoch the callbacks then see) even though a sweep is not due.
        assert_eq!(map.within_horizon(101, 0), None);
        let mut judged = Vec::new();
        let seen = map.get_or_insert(
            &1,
            || 101,
            || Some(9),
            |v, epoch| {
                judged.push((*v, epoch));
                false
            },
            false,
            |v, epoch| (*v, epoch),
        );
        assert_eq!(seen, Ok(((1, 101), false)));
        assert_eq!(judged, [(1, 0)]);
        assert_eq!(epoch_of(1), 101);
        // Reads never sweep.
        assert_eq!(map.get(&1, |v, epoch| (*v, epoch)), Some((1, 101)));
    }
}

/// loom models of the key count against the shard locks: two new keys in
/// different shards, each under its own shard's lock only, and a sweep
/// beside a new key. (The count is the map's, the locks are the shards'.)
#[cfg(all(test, tokio_ratelimit_loom))]
mod loom_tests {
    use std::hash::{BuildHasherDefault, DefaultHasher};

    use loom::sync::Arc;
    use loom::thread;

    use super::*;

    type Map = ShardMap<u32, u32, BuildHasherDefault<DefaultHasher>>;

    fn map(max_keys: usize) -> Map {
        ShardMap::new(
            BuildHasherDefault::default(),
            max_keys,
            Duration::ZERO,
            clock::Origin::at(clock::now()),
            u64::MAX,
        )
    }

    /// The first keys from 0 up that fall in `n` different shards (the
    /// hasher is seedless, so the same keys in every execution).
    fn keys_in_different_shards(map: &Map, n: usize) -> Vec<u32> {
        let mut keys: Vec<u32> = Vec::new();
        for key in 0.. {
            let shard = map.shard(map.hash(&key));
            if keys
                .iter()
                .all(|k| !std::ptr::eq(map.shard(map.hash(k)), shard))
            {
                keys.push(key);
                if keys.len() == n {
                    return keys;
                }
            }
        }
        unreachable!()
    }

    /// The entries the shards hold, counted one by one.
    fn held(map: &Map) -> usize {
        let mut n = 0;
        map.for_each(|_, _| n += 1);
        n
    }

    fn insert(
        map: &Map,
        key: u32,
        is_fresh: impl FnMut(&u32, u64) -> bool,
    ) -> Result<bool, Unavailable> {
        map.get_or_insert(&key, || 0, || Some(key), is_fresh, false, |_, _| ())
            .map(|((), first)| first)
    }

    /// Two new keys in different shards race for the last slot: exactly
    /// one gets it, whatever the interleaving (a look at the count under
    /// each shard's own lock, then an add, let both in).
    #[test]
    fn loom_two_new_keys_never_take_more_than_max_keys() {
        loom::model(|| {
            let map = Arc::new(map(1));
            let keys = keys_in_different_shards(&map, 2);
            let threads: Vec<_> = keys
                .iter()
                .map(|&key| {
                    let map = Arc::clone(&map);
                    thread::spawn(move || insert(&map, key, |_, _| false))
                })
                .collect();
            let answers: Vec<_> = threads.into_iter().map(|t| t.join().unwrap()).collect();
            let granted = answers.iter().filter(|a| a.is_ok()).count();
            assert_eq!(granted, 1, "{answers:?}");
            // The winner was the map's first key; the other was refused.
            assert!(answers.contains(&Ok(true)), "{answers:?}");
            assert!(
                answers
                    .iter()
                    .any(|a| matches!(a, Err(Unavailable::Refused { .. }))),
                "{answers:?}"
            );
            assert_eq!((map.len(), held(&map)), (1, 1));
        });
    }

    /// A sweep that evicts a fresh key beside a new key in another shard
    /// that needs its slot: the count always equals the entries held and
    /// never exceeds `max_keys`; the new key gets the slot (its own sweep
    /// of the other shards frees it if the sweep beside has not yet).
    #[test]
    fn loom_a_sweep_beside_a_new_key_keeps_the_count_exact() {
        loom::model(|| {
            let map = Arc::new(map(1));
            let keys = keys_in_different_shards(&map, 2);
            let (old, new) = (keys[0], keys[1]);
            let fresh = move |v: &u32, _| *v == old;
            insert(&map, old, fresh).unwrap();
            let sweeper = {
                let map = Arc::clone(&map);
                thread::spawn(move || map.sweep_all(0, fresh))
            };
            let answer = insert(&map, new, fresh);
            let left = sweeper.join().unwrap();
            assert!(left <= 1);
            // (`first` if the sweep beside emptied the map before.)
            assert!(answer.is_ok(), "{answer:?}");
            assert_eq!((map.len(), held(&map)), (1, 1));
            assert_eq!(map.stats().evicted, 1);
        });
    }
}
