//! The atomics of the lock-free code, swappable for loom's.
//!
//! Normally these are std's atomics and `portable_atomic`'s 128-bit one.
//! Built with `RUSTFLAGS="--cfg tokio_ratelimit_loom"`, the crate's own unit
//! tests get loom's instead, so that the models in `cell.rs` explore every
//! interleaving (and every value a weakly ordered load may return) of the
//! code that goes through this module (the cell, the keyed words, the
//! bands' published states, the smooth limiters' debt, the fast clock's
//! segment, the stats counters and the metrics meter's, the keyed maps'
//! shard locks and key count). Only that code
//! does: the rest of the crate keeps std's atomics, and the loom run
//! filters the tests by name
//! (`cargo test --lib loom`), since a loom atomic used outside
//! `loom::model` panics.

#[cfg(not(all(test, tokio_ratelimit_loom)))]
pub(crate) use std::hint::spin_loop;
#[cfg(not(all(test, tokio_ratelimit_loom)))]
pub(crate) use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering, fence};
#[cfg(not(all(test, tokio_ratelimit_loom)))]
pub(crate) use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};

#[cfg(not(all(test, tokio_ratelimit_loom)))]
pub(crate) use portable_atomic::AtomicU128;

#[cfg(all(test, tokio_ratelimit_loom))]
pub(crate) use loom::hint::spin_loop;
#[cfg(all(test, tokio_ratelimit_loom))]
pub(crate) use loom::sync::atomic::{AtomicU64, AtomicUsize, Ordering, fence};
#[cfg(all(test, tokio_ratelimit_loom))]
pub(crate) use loom::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};

#[cfg(all(test, tokio_ratelimit_loom))]
pub(crate) use self::model::AtomicU128;

#[cfg(all(test, tokio_ratelimit_loom))]
mod model {
    use std::sync::Mutex;

    use loom::sync::atomic::AtomicU64;

    use super::Ordering;

    /// One atomic 128-bit location, for loom (which has no `AtomicU128`).
    ///
    /// loom models atomics of up to 64 bits, so the location is a loom
    /// `AtomicU64` holding the *index* of its value in a table of every
    /// value the location has held (distinct values get distinct indices,
    /// so comparing indices is comparing values). Every operation is one
    /// loom operation on that index with the caller's orderings: a load is
    /// a load, a store a store, a compare-and-swap one read-modify-write
    /// (and `fetch_or` a loop of them). So loom checks the location exactly as a single
    /// 128-bit atomic: its modification order, the stale values a
    /// `Relaxed` or `Acquire` load may still return, and what each ordering
    /// does and does not synchronise. (A loom `Mutex<u128>` would not: its
    /// lock would make every access acquire/release and hide a weakened
    /// ordering.)
    ///
    /// What it does not check: that the hardware's 128-bit operations
    /// (`cmpxchg16b`, `casp`, or `portable_atomic`'s lock-based fallback)
    /// are single-copy atomic — that is `portable_atomic`'s promise;
    /// spurious failures of `compare_exchange_weak` (loom never fails one
    /// spuriously; the callers retry in a loop, which the other failures
    /// already exercise); and what loom itself does not model (load
    /// buffering, the full `SeqCst` order). The table is a std mutex that
    /// loom does not see: it is held only inside one loom operation, so it
    /// adds no synchronisation to the model.
    #[derive(Debug)]
    pub(crate) struct AtomicU128 {
        index: AtomicU64,
        values: Mutex<Vec<u128>>,
    }

    impl AtomicU128 {
        pub(crate) fn new(value: u128) -> AtomicU128 {
            AtomicU128 {
                index: AtomicU64::new(0),
                values: Mutex::new(vec![value]),
            }
        }

        /// The index of `value`, added to the table if new.
        fn intern(&self, value: u128) -> u64 {
            let mut values = self.values.lock().unwrap();
            let i = values.iter().position(|&v| v == value).unwrap_or_else(|| {
                values.push(value);
                values.len() - 1
            });
            u64::try_from(i).unwrap()
        }

        fn value(&self, index: u64) -> u128 {
            self.values.lock().unwrap()[usize::try_from(index).unwrap()]
        }

        pub(crate) fn load(&self, order: Ordering) -> u128 {
            self.value(self.index.load(order))
        }

        pub(crate) fn store(&self, value: u128, order: Ordering) {
            self.index.store(self.intern(value), order);
        }

        pub(crate) fn compare_exchange(
            &self,
            current: u128,
            new: u128,
            success: Ordering,
            failure: Ordering,
        ) -> Result<u128, u128> {
            let (current, new) = (self.intern(current), self.intern(new));
            self.index
                .compare_exchange(current, new, success, failure)
                .map(|i| self.value(i))
                .map_err(|i| self.value(i))
        }

        pub(crate) fn compare_exchange_weak(
            &self,
            current: u128,
            new: u128,
            success: Ordering,
            failure: Ordering,
        ) -> Result<u128, u128> {
            self.compare_exchange(current, new, success, failure)
        }

        /// One read-modify-write: a compare-and-swap loop whose only
        /// synchronising step is the successful swap, with `order` (loom's
        /// own `fetch_or` cannot be applied to an index).
        pub(crate) fn fetch_or(&self, bits: u128, order: Ordering) -> u128 {
            let mut old = self.load(Ordering::Relaxed);
            loop {
                match self.compare_exchange(old, old | bits, order, Ordering::Relaxed) {
                    Ok(old) => return old,
                    Err(actual) => old = actual,
                }
            }
        }
    }
}
