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

use std::borrow::Borrow;
use std::hash::{BuildHasher, Hash};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::Duration;

use hashbrown::HashTable;
use tokio::time::Instant;

use crate::clock;

/// Counters of a keyed limiter.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct KeyedStats {
    /// Keys held now (including fresh ones not swept yet).
    pub keys: usize,
    /// Keys dropped because their state was indistinguishable from fresh.
    pub evicted: u64,
    /// New keys refused because `max_keys` were all active.
    pub refused: u64,
    /// Permits granted, over all keys.
    pub granted: u64,
    /// Requests refused by a key's limit (rate limited, or more than its
    /// capacity), over all keys.
    pub limited: u64,
}

#[repr(align(128))]
struct Shard<K, V> {
    table: RwLock<HashTable<(K, V)>>,
    /// When this shard was last swept (ns since the map's origin + 1; 0 =
    /// never).
    last_sweep: AtomicU64,
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
    origin: Instant,
    /// The least time between two amortized sweeps of one shard.
    sweep_gap: Duration,
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
    pub(crate) fn new(hasher: S, max_keys: usize, sweep_gap: Duration) -> Self {
        // Four shards per core keeps writers on different keys apart.
        let cores = std::thread::available_parallelism().map_or(4, usize::from);
        let shards = (cores * 4).next_power_of_two().clamp(4, 1024);
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
            origin: clock::now(),
            sweep_gap,
        }
    }

    fn hash<Q: Hash + ?Sized>(&self, key: &Q) -> u64 {
        self.hasher.hash_one(key)
    }

    fn shard(&self, hash: u64) -> &Shard<K, V> {
        // `shift` is at least 54, so the index fits any usize.
        #[allow(clippy::cast_possible_truncation)]
        &self.shards[(hash >> self.shift) as usize]
    }

    /// Runs `f` on the value of an existing key, under the shard's read
    /// lock.
    pub(crate) fn get<Q, R>(&self, key: &Q, f: impl FnOnce(&V) -> R) -> Option<R>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let hash = self.hash(key);
        let table = read(&self.shard(hash).table);
        table
            .find(hash, |(k, _)| k.borrow() == key)
            .map(|(_, v)| f(v))
    }

    /// Runs `f` on the value of `key`, inserting `make()` first if the key is
    /// new (`true` in the answer when that made the map non-empty). A new key
    /// past `max_keys` is refused unless `force`.
    ///
    /// `is_fresh` judges whether an entry may be evicted (when a sweep is
    /// due); `on_first` is called when the map goes from empty to not.
    pub(crate) fn get_or_insert<Q, R>(
        &self,
        key: &Q,
        make: impl FnOnce() -> Option<V>,
        is_fresh: impl FnMut(&V) -> bool,
        force: bool,
        f: impl FnOnce(&V) -> R,
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
            if let Some((_, v)) = table.find(hash, |(k, _)| k.borrow() == key) {
                return Ok(((f.take().expect("once"))(v), false));
            }
        }
        let mut table = write(&shard.table);
        if let Some((_, v)) = table.find(hash, |(k, _)| k.borrow() == key) {
            return Ok(((f.take().expect("once"))(v), false));
        }
        let full = self.len() >= self.max_keys;
        if full || table.len() == table.capacity() {
            // Make room from fresh keys before growing or refusing.
            self.sweep_locked(shard, &mut table, is_fresh, false);
        }
        if !force && self.len() >= self.max_keys {
            self.refused.fetch_add(1, Ordering::Relaxed);
            let since = self.since_sweep(shard);
            return Err(Unavailable::Refused {
                retry_after: self.sweep_gap.saturating_sub(since).max(clock::TICK),
            });
        }
        let value = make().ok_or(Unavailable::Failed)?;
        let first = self.count.fetch_add(1, Ordering::Relaxed) == 0;
        let hasher = &self.hasher;
        let entry = table.insert_unique(hash, (key.to_owned().into(), value), |(k, _)| {
            hasher.hash_one(k)
        });
        let (_, v) = entry.get();
        Ok(((f.take().expect("once"))(v), first))
    }

    fn now_nanos(&self) -> u64 {
        u64::try_from(
            clock::now()
                .saturating_duration_since(self.origin)
                .as_nanos(),
        )
        .unwrap_or(u64::MAX - 1)
    }

    fn since_sweep(&self, shard: &Shard<K, V>) -> Duration {
        match shard.last_sweep.load(Ordering::Relaxed) {
            0 => Duration::MAX,
            last => Duration::from_nanos(self.now_nanos().saturating_sub(last - 1)),
        }
    }

    /// Evicts the fresh entries of a locked shard, unless it was swept less
    /// than `sweep_gap` ago (and not `forced`). Returns how many went.
    fn sweep_locked(
        &self,
        shard: &Shard<K, V>,
        table: &mut HashTable<(K, V)>,
        mut is_fresh: impl FnMut(&V) -> bool,
        forced: bool,
    ) -> usize {
        if !forced && self.since_sweep(shard) < self.sweep_gap {
            return 0;
        }
        shard
            .last_sweep
            .store(self.now_nanos() + 1, Ordering::Relaxed);
        let before = table.len();
        table.retain(|(_, v)| !is_fresh(v));
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

    /// Sweeps every shard now; returns the keys left.
    pub(crate) fn sweep_all(&self, mut is_fresh: impl FnMut(&V) -> bool) -> usize {
        for shard in &self.shards {
            let mut table = write(&shard.table);
            self.sweep_locked(shard, &mut table, &mut is_fresh, true);
        }
        self.len()
    }
}

#[cfg(test)]
mod tests {
    use std::collections::hash_map::RandomState;

    use super::*;

    #[test]
    fn insert_find_sweep_refuse() {
        let map: ShardMap<String, u32, _> = ShardMap::new(RandomState::new(), 3, Duration::ZERO);
        let never = |_: &u32| false;
        let get =
            |key: &str, v: u32, force| map.get_or_insert(key, || Some(v), never, force, |v| *v);
        assert_eq!(get("a", 1, false), Ok((1, true)));
        assert_eq!(get("a", 9, false), Ok((1, false)));
        assert_eq!(map.get("a", |v| *v), Some(1));
        assert_eq!(map.get("zz", |v| *v), None);
        get("b", 2, false).unwrap();
        get("c", 3, false).unwrap();
        // Full of active keys: refused, unless forced.
        assert!(matches!(
            get("d", 4, false),
            Err(Unavailable::Refused { .. })
        ));
        assert_eq!(map.stats().refused, 1);
        get("d", 4, true).unwrap();
        assert_eq!(
            map.get_or_insert("e", || None, never, true, |v| *v),
            Err(Unavailable::Failed)
        );
        assert_eq!(map.len(), 4);
        // Sweeping drops the fresh keys (here: odd values).
        let odd = |v: &u32| v % 2 == 1;
        assert_eq!(map.sweep_all(odd), 2);
        assert_eq!(map.stats().evicted, 2);
        assert_eq!(map.get("a", |v| *v), None);
        assert_eq!(map.get("b", |v| *v), Some(2));
    }
}
