//! One key's word: the stored `tat` (64 bits read relative to the shard's
//! epoch, or 128 bits absolute), and the decision on it.

use std::hash::{BuildHasher, Hash};
use std::time::Duration;

use portable_atomic::AtomicU128;

use crate::algorithm::Params;
use crate::keyed::map::ShardMap;
use crate::sync::{AtomicU64, Ordering};
use crate::{TryAcquireError, clock};

/// A stored `tat`, and how to read and swap it.
pub(super) trait Word: Send + Sync + 'static {
    /// The horizon of the map (see the module docs), in scaled units.
    const HORIZON: u128;
    fn new(tat: u128) -> Self;
    /// The raw word and the `tat` it stands for, given its shard's epoch
    /// in scaled units.
    fn read(&self, epoch: u128) -> (u128, u128);
    fn replace(&self, raw: u128, tat: u128) -> bool;
}

impl Word for AtomicU64 {
    const HORIZON: u128 = 1 << 62;

    fn new(tat: u128) -> Self {
        #[expect(
            clippy::cast_possible_truncation,
            reason = "the low 64 bits are kept: the word is read relative to an epoch"
        )]
        AtomicU64::new(tat as u64)
    }

    #[inline]
    fn read(&self, epoch: u128) -> (u128, u128) {
        let raw = self.load(Ordering::Acquire);
        #[expect(
            clippy::cast_possible_truncation,
            clippy::cast_possible_wrap,
            reason = "the signed distance from the epoch, modulo 2⁶⁴"
        )]
        let ahead = raw.wrapping_sub(epoch as u64) as i64;
        (
            u128::from(raw),
            epoch.saturating_add_signed(i128::from(ahead)),
        )
    }

    #[inline]
    fn replace(&self, raw: u128, tat: u128) -> bool {
        #[expect(
            clippy::cast_possible_truncation,
            reason = "raw came from a u64; tat keeps its low 64 bits"
        )]
        self.compare_exchange_weak(raw as u64, tat as u64, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }
}

impl Word for AtomicU128 {
    const HORIZON: u128 = u128::MAX;

    fn new(tat: u128) -> Self {
        AtomicU128::new(tat)
    }

    #[inline]
    fn read(&self, _: u128) -> (u128, u128) {
        let raw = self.load(Ordering::Acquire);
        (raw, raw)
    }

    #[inline]
    fn replace(&self, raw: u128, tat: u128) -> bool {
        self.compare_exchange_weak(raw, tat, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }
}

/// The map of `W` words for `params`: its horizon in ns.
pub(super) fn map<K, W: Word, S>(
    params: &Params,
    hasher: S,
    max_keys: usize,
    sweep_gap: Duration,
    origin: clock::Origin,
) -> ShardMap<K, W, S>
where
    K: Hash + Eq,
    S: BuildHasher,
{
    let horizon = u64::try_from(W::HORIZON / u128::from(params.den())).unwrap_or(u64::MAX);
    ShardMap::new(hasher, max_keys, sweep_gap, origin, horizon)
}

/// The meter's decision on one key's word, at `now` (scaled), in a shard
/// whose epoch is `epoch` (scaled).
#[inline]
pub(super) fn decide<W: Word>(
    params: &Params,
    w: &W,
    epoch: u128,
    now: u128,
    n: u32,
) -> Result<(), TryAcquireError> {
    loop {
        let (raw, tat) = w.read(epoch);
        match params.try_pour(tat, now, n) {
            Ok(end) => {
                if w.replace(raw, end) {
                    return Ok(());
                }
            }
            Err(wait) => {
                return Err(TryAcquireError::Limited {
                    retry_after: params.duration_ceil(wait),
                });
            }
        }
    }
}

/// What a pour into one key's funnel came to.
pub(super) enum Poured {
    Granted,
    /// Refused by the key's own limit (counted as limited).
    Limited(TryAcquireError),
    /// A new key refused because `max_keys` are all active (counted by the
    /// map).
    MapFull {
        retry_after: Duration,
    },
}

impl From<Result<(), TryAcquireError>> for Poured {
    fn from(result: Result<(), TryAcquireError>) -> Poured {
        match result {
            Ok(()) => Poured::Granted,
            Err(refusal) => Poured::Limited(refusal),
        }
    }
}

/// Whether a word stands for an empty funnel at `now` (scaled).
pub(super) fn is_drained<W: Word>(w: &W, epoch: u128, now: u128) -> bool {
    w.read(epoch).1 <= now
}
