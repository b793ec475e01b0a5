//! One key's word: the stored `tat` of each band (64 bits read relative to
//! the shard's epoch, or 128 bits absolute), and the decision on it.
//!
//! One band is one word ([`Word`]: `AtomicU64`, or `AtomicU128` for fine
//! scales). Two bands of the 64-bit kind share one 128-bit word ([`Pair`]),
//! decided with one compare-and-swap, so no thread ever sees one band
//! debited without the other. Three or four bands, or two fine ones, are
//! kept under a small lock of their own ([`Locked`]).

use std::hash::{BuildHasher, Hash};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use super::Tier;
use crate::algorithm::{Bands, MAX_BANDS, Params, PerBand};
use crate::keyed::map::ShardMap;
use crate::sync::{AtomicU64, AtomicU128, Ordering};
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
        (u128::from(raw), narrow_read(raw, epoch))
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

/// A key's whole state, whatever it is stored in, and the decisions on it.
/// Times are in ns since the map's origin; `units` gives each stored
/// band's scale (see [`in_common_units`](crate::algorithm::in_common_units)).
pub(super) trait Stored: Send + Sync + 'static {
    /// The horizon of the map (see the module docs), in scaled units.
    const HORIZON: u128;
    /// Bands held.
    const BANDS: usize;
    /// A key whose every band is empty at `now_ns`.
    fn fresh(units: &Bands, now_ns: u64) -> Self;
    /// Pours `n` units into every band of `tier` if all have room, else
    /// changes nothing; in a shard whose epoch is `epoch_ns`, at the time
    /// `now` reads (ns since the origin). `now` is called after the key's
    /// state is loaded, for every attempt: a caller preempted before it
    /// decides on the state as it is then (see `cell::Cell::take`); it
    /// answers `None` past the map's horizon, and then nothing is decided.
    /// The caller has checked `1 <= n <= tier.capacity`.
    /// Whether a decision grants on `early`, a reading made before the
    /// key was looked up, and reads `now` only to refuse (see [`Pair`]);
    /// otherwise `early` is `None`.
    const READS_EARLY: bool = false;
    #[inline]
    fn decide(
        &self,
        tier: &Tier,
        epoch_ns: u64,
        early: Option<u64>,
        now: impl Fn() -> Option<u64>,
        n: u32,
    ) -> Option<Result<(), TryAcquireError>> {
        self.decide_and_read(tier, epoch_ns, early, now, n)
            .map(|(answer, _, _)| answer)
    }
    /// As [`decide`](Self::decide), and each band's `tat` after it (the
    /// new one when granted, the one it refused on otherwise), from the same
    /// read, and the reading it was decided at: what a report of the
    /// decision shows.
    fn decide_and_read(
        &self,
        tier: &Tier,
        epoch_ns: u64,
        early: Option<u64>,
        now: impl Fn() -> Option<u64>,
        n: u32,
    ) -> Option<(Result<(), TryAcquireError>, PerBand, u64)>;
    /// Each band's `tat`.
    fn tats(&self, units: &Bands, epoch_ns: u64) -> PerBand;
    /// Whether every band is empty at `now_ns`.
    fn is_drained(&self, units: &Bands, epoch_ns: u64, now_ns: u64) -> bool {
        let tats = self.tats(units, epoch_ns);
        let now = units.scaled(u128::from(now_ns));
        (0..Self::BANDS).all(|b| tats[b] <= now[b])
    }
    /// Whether a sweep at `now_ns` evicts the key (every band empty), in a
    /// shard whose epoch is `epoch_ns` until the sweep moves it to
    /// `now_ns`. Called under the shard's write lock. A key it keeps must
    /// stay readable against that epoch and the ones after: see [`Pair`].
    fn swept(&self, units: &Bands, epoch_ns: u64, now_ns: u64) -> bool {
        self.is_drained(units, epoch_ns, now_ns)
    }
}

impl<W: Word> Stored for W {
    const HORIZON: u128 = W::HORIZON;
    const BANDS: usize = 1;

    fn fresh(units: &Bands, now_ns: u64) -> Self {
        W::new(units.params()[0].scale_nanos(u128::from(now_ns)))
    }

    #[inline]
    fn decide(
        &self,
        tier: &Tier,
        epoch_ns: u64,
        _: Option<u64>,
        now: impl Fn() -> Option<u64>,
        n: u32,
    ) -> Option<Result<(), TryAcquireError>> {
        let p = &tier.first;
        let epoch = p.scale_nanos(u128::from(epoch_ns));
        decide(
            p,
            self,
            epoch,
            || Some(p.scale_nanos(u128::from(now()?))),
            n,
        )
    }

    fn decide_and_read(
        &self,
        tier: &Tier,
        epoch_ns: u64,
        _: Option<u64>,
        now: impl Fn() -> Option<u64>,
        n: u32,
    ) -> Option<(Result<(), TryAcquireError>, PerBand, u64)> {
        let p = &tier.first;
        let epoch = p.scale_nanos(u128::from(epoch_ns));
        let reading = std::cell::Cell::new(0);
        let read = || {
            let ns = now()?;
            reading.set(ns);
            Some(p.scale_nanos(u128::from(ns)))
        };
        let (answer, tat) = pour(p, self, epoch, read, n)?;
        let mut tats = [0; MAX_BANDS];
        tats[0] = tat;
        Some((answer, tats, reading.get()))
    }

    fn tats(&self, units: &Bands, epoch_ns: u64) -> PerBand {
        let mut tats = [0; MAX_BANDS];
        tats[0] = self
            .read(units.params()[0].scale_nanos(u128::from(epoch_ns)))
            .1;
        tats
    }

    fn is_drained(&self, units: &Bands, epoch_ns: u64, now_ns: u64) -> bool {
        let p = &units.params()[0];
        is_drained(
            self,
            p.scale_nanos(u128::from(epoch_ns)),
            p.scale_nanos(u128::from(now_ns)),
        )
    }
}

/// Two bands in one 128-bit word: band 0's `tat` in the low 64 bits and
/// band 1's in the high, each read relative to the epoch as a narrow
/// [`Word`] is.
pub(super) struct Pair(AtomicU128);

impl Pair {
    /// [`Stored::decide_and_read`] with the clock read after the state,
    /// for every attempt.
    #[cold]
    #[inline(never)]
    fn decide_late(
        &self,
        quota: &Bands,
        epochs: &PerBand,
        now: impl Fn() -> Option<u64>,
        n: u32,
    ) -> Option<(Result<(), TryAcquireError>, PerBand, u64)> {
        loop {
            let raw = self.0.load(Ordering::Acquire);
            let mut tats = Pair::decode(raw, epochs);
            let now_ns = now()?;
            if let Err(retry_after) = quota.try_pour(&mut tats, u128::from(now_ns), n) {
                return Some((Err(TryAcquireError::Limited { retry_after }), tats, now_ns));
            }
            if self.swap(raw, &tats) {
                return Some((Ok(()), tats, now_ns));
            }
        }
    }

    /// Replaces `raw` with `tats` if nothing changed meanwhile.
    #[inline]
    fn swap(&self, raw: u128, tats: &PerBand) -> bool {
        self.0
            .compare_exchange_weak(raw, Pair::encode(tats), Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }

    #[inline]
    fn decode(raw: u128, epochs: &PerBand) -> PerBand {
        let mut tats = [0; MAX_BANDS];
        #[expect(
            clippy::cast_possible_truncation,
            reason = "the two 64-bit halves of the word"
        )]
        for (b, half) in [raw as u64, (raw >> 64) as u64].into_iter().enumerate() {
            tats[b] = narrow_read(half, epochs[b]);
        }
        tats
    }

    #[inline]
    fn encode(tats: &PerBand) -> u128 {
        // The low 64 bits of each (read relative to an epoch).
        (tats[0] & u128::from(u64::MAX)) | (tats[1] << 64)
    }
}

/// A pair grants on a reading made before the key was looked up, and
/// reads the clock after its state only to refuse. Read after the state
/// for every decision (the 128-bit load, then the counter), the counter's
/// latency was no longer hidden behind the lookup: a hot key's check took
/// 51 ns instead of 43 (`compare --bench memory`). A grant on an earlier
/// reading is never more lenient (ARCHITECTURE.md, "Readings out of
/// order"); a refusal stands only on a reading made after the state.
impl Stored for Pair {
    const HORIZON: u128 = <AtomicU64 as Word>::HORIZON;
    const BANDS: usize = 2;
    const READS_EARLY: bool = true;

    fn fresh(units: &Bands, now_ns: u64) -> Self {
        Pair(AtomicU128::new(Pair::encode(
            &units.scaled(u128::from(now_ns)),
        )))
    }

    #[inline]
    fn decide_and_read(
        &self,
        tier: &Tier,
        epoch_ns: u64,
        early: Option<u64>,
        now: impl Fn() -> Option<u64>,
        n: u32,
    ) -> Option<(Result<(), TryAcquireError>, PerBand, u64)> {
        let quota = &tier.bands;
        // Both halves read in the map's units, whatever the tier: a tier
        // of one band pours band 0 alone, and band 1 encodes back to the
        // same 64 bits. (Read in the tier's, band 1's epoch was 0, and a
        // half past 2⁶³ units saturated to 0 and was written back so.)
        let epochs = tier.stored.scaled(u128::from(epoch_ns));
        let Some(early) = early else {
            return self.decide_late(quota, &epochs, now, n);
        };
        loop {
            let raw = self.0.load(Ordering::Acquire);
            let mut tats = Pair::decode(raw, &epochs);
            if quota.try_pour(&mut tats, u128::from(early), n).is_err() {
                return self.decide_late(quota, &epochs, now, n);
            }
            if self.swap(raw, &tats) {
                return Some((Ok(()), tats, early));
            }
        }
    }
    fn tats(&self, units: &Bands, epoch_ns: u64) -> PerBand {
        Pair::decode(
            self.0.load(Ordering::Acquire),
            &units.scaled(u128::from(epoch_ns)),
        )
    }

    /// A key the sweep keeps has a band with water; its empty bands are
    /// moved up to `now` (empty still: the same state). Otherwise a band
    /// nobody pours (one a tier of one band leaves alone, or a short band
    /// while a long one keeps the key) would fall behind the epochs the
    /// sweeps move on, and past 2⁶³ of its units behind, its half would
    /// read as far in the future (the module docs, "below").
    fn swept(&self, units: &Bands, epoch_ns: u64, now_ns: u64) -> bool {
        let raw = self.0.load(Ordering::Acquire);
        let mut tats = Pair::decode(raw, &units.scaled(u128::from(epoch_ns)));
        let now = units.scaled(u128::from(now_ns));
        let mut drained = true;
        for (tat, now) in tats.iter_mut().zip(now).take(Self::BANDS) {
            if *tat > now {
                drained = false;
            } else {
                *tat = now;
            }
        }
        if !drained {
            // Under the shard's write lock: no decision is under way.
            self.0.store(Pair::encode(&tats), Ordering::Release);
        }
        drained
    }
}

/// Three or four bands (or two whose scale is too fine for 64 bits), kept
/// absolute under a lock held only for the arithmetic.
pub(super) struct Locked(Mutex<PerBand>);

impl Locked {
    fn lock(&self) -> std::sync::MutexGuard<'_, PerBand> {
        // The arithmetic under the lock cannot panic; a poisoned lock still
        // holds a consistent state.
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Stored for Locked {
    const HORIZON: u128 = u128::MAX;
    const BANDS: usize = MAX_BANDS;

    fn fresh(units: &Bands, now_ns: u64) -> Self {
        Locked(Mutex::new(units.scaled(u128::from(now_ns))))
    }

    fn decide_and_read(
        &self,
        tier: &Tier,
        _: u64,
        _: Option<u64>,
        now: impl Fn() -> Option<u64>,
        n: u32,
    ) -> Option<(Result<(), TryAcquireError>, PerBand, u64)> {
        let mut tats = self.lock();
        let now_ns = now()?;
        let answer = tier
            .bands
            .try_pour(&mut tats, u128::from(now_ns), n)
            .map_err(|retry_after| TryAcquireError::Limited { retry_after });
        Some((answer, *tats, now_ns))
    }

    fn tats(&self, _: &Bands, _: u64) -> PerBand {
        *self.lock()
    }
}

/// A narrow word's `tat`: `raw`, the low 64 bits of an instant within 2⁶³
/// units of `epoch`.
#[inline]
fn narrow_read(raw: u64, epoch: u128) -> u128 {
    #[expect(
        clippy::cast_possible_truncation,
        clippy::cast_possible_wrap,
        reason = "the signed distance from the epoch, modulo 2⁶⁴"
    )]
    let ahead = raw.wrapping_sub(epoch as u64) as i64;
    epoch.saturating_add_signed(i128::from(ahead))
}

/// The map of `W` states for bands in `units`: its horizon in ns, the
/// nearest of any band's.
pub(super) fn map<K, W: Stored, S>(
    units: &Bands,
    hasher: S,
    max_keys: usize,
    sweep_gap: Duration,
    origin: clock::Origin,
) -> ShardMap<K, W, S>
where
    K: Hash + Eq,
    S: BuildHasher,
{
    let den = units.params().iter().map(Params::den).max().unwrap_or(1);
    let horizon = u64::try_from(W::HORIZON / u128::from(den)).unwrap_or(u64::MAX);
    ShardMap::new(hasher, max_keys, sweep_gap, origin, horizon)
}

/// The meter's decision on one key's word, at the time `now` reads
/// (scaled; read after the word, for every attempt; `None`: nothing
/// decided), in a shard whose epoch is `epoch` (scaled).
#[inline]
pub(super) fn decide<W: Word>(
    params: &Params,
    w: &W,
    epoch: u128,
    now: impl Fn() -> Option<u128>,
    n: u32,
) -> Option<Result<(), TryAcquireError>> {
    pour(params, w, epoch, now, n).map(|(answer, _)| answer)
}

/// [`decide`], and the word's `tat` after it (the new one when granted,
/// the one it refused on otherwise).
#[inline]
fn pour<W: Word>(
    params: &Params,
    w: &W,
    epoch: u128,
    now: impl Fn() -> Option<u128>,
    n: u32,
) -> Option<(Result<(), TryAcquireError>, u128)> {
    loop {
        let (raw, tat) = w.read(epoch);
        let now = now()?;
        match params.try_pour(tat, now, n) {
            Ok(end) => {
                if w.replace(raw, end) {
                    return Some((Ok(()), end));
                }
            }
            Err(wait) => {
                let retry_after = params.duration_ceil(wait);
                return Some((Err(TryAcquireError::Limited { retry_after }), tat));
            }
        }
    }
}

/// What a pour into one key's funnel came to.
#[derive(Debug, Clone, Copy)]
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
