//! The lock-free GCRA cell every bucket is built on.
//!
//! One word holds the whole decision state, so the hot paths
//! (`try_acquire`, and an `acquire` that need not wait) are one atomic load,
//! a little integer arithmetic from [`crate::algorithm`], and one
//! compare-and-swap — no lock, no allocation.
//!
//! A cell starts *narrow*: the state is the `tat` alone, in one 64-bit
//! word, while it is below 2⁶² scaled units (146 years at a rate of whole
//! nanoseconds, `den` = 1) and nobody has closed the cell or changed its
//! rate. A 64-bit load and compare-and-swap cost a third of 128-bit ones
//! (and half under contention, `benches` section 0). The first time one
//! of those happens the cell *widens*, once and for good: the thread that
//! moves the narrow word to `MOVING` copies the `tat` into the wide word
//! below and then marks the narrow one `WIDE`; a thread that finds it
//! moving waits the two stores out; every later decision reads the wide
//! word. A narrow state is the wide one with generation 0, open: the
//! `tat`'s units do not change.
//!
//! ```text
//! bit 127     closed
//! bits 100-126 generation of the rate (odd while `set_rate` rewrites it)
//! bits 0-99   tat: the theoretical arrival time, in scaled units
//! ```
//!
//! The rate itself (the emission interval `num / den`) sits in two plain
//! atomics beside the word. A change of rate is rare and runs as a seqlock
//! around them: the writer makes the generation odd, stores the new
//! interval, then stores the converted `tat` with the next even generation.
//! A reader that saw an even generation and then wins its compare-and-swap
//! on the very same word knows the interval it read belongs to that word;
//! a reader that only looks (a refusal's `retry_after`) re-checks the
//! generation after reading.
//!
//! The cell also keeps the *timer credit*: the due time of the latest waiter
//! that the timer released late. See [`Cell::arrival`].

use std::time::Duration;

use tokio::time::Instant;

use crate::algorithm::{MAX_TIME, Params, Place, Release, Reserve, Taken};
use crate::clock;
use crate::sync::{AtomicU64, AtomicU128, Ordering, fence, spin_loop};

mod credit;

pub(crate) use credit::{CREDIT_GRACE, CREDIT_REACH, Credit};

const TAT_MASK: u128 = MAX_TIME;
const GEN_SHIFT: u32 = 100;
const GEN_MASK: u128 = (1 << 27) - 1;
const CLOSED: u128 = 1 << 127;

/// The narrow word holds a `tat` below this.
const NARROW_LIMIT: u64 = 1 << 62;
/// The narrow word once the state lives in the wide one.
const WIDE: u64 = 1 << 63;
/// The narrow word while one thread copies it into the wide one.
const MOVING: u64 = WIDE | NARROW_LIMIT;

/// The lock-free state of one bucket.
///
/// `repr(C)`: what every call reads comes first, in 40 bytes (the narrow
/// word, the interval, the capacity, the decoded origin), so the engine
/// can keep the counters off its cache line (see `engine::Engine`). The
/// bucket's two constant fields fill the gaps the alignment leaves, so a
/// cell is 96 bytes, as before it had a narrow word. The word shares
/// that line with the read-only fields: a thread that finds the word
/// changed by another's pour misses on the line once, which it would on a
/// word of its own line too. (It had a line of its own, and a bucket took
/// 512 bytes.)
#[repr(C)]
pub(crate) struct Cell {
    /// The `tat` while below [`NARROW_LIMIT`]; [`MOVING`] or [`WIDE`]
    /// once the state is in `word`.
    narrow: AtomicU64,
    num: AtomicU64,
    den: AtomicU64,
    capacity: u32,
    /// The bucket's: tokens a newly built bucket lacks (capacity − initial).
    pub(crate) fresh_deficit: u32,
    origin: clock::Origin,
    /// The bucket's: when a waiter may go.
    pub(crate) release: Release,
    /// The state once the cell has widened (see the module docs).
    word: AtomicU128,
    /// The latest waiter released after its due time (see [`Credit`]).
    credit: Credit,
}

/// A consistent view of the word and the interval it is expressed in.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Snapshot {
    /// The wide word; from a narrow cell, its `tat` (generation 0, open).
    word: u128,
    /// Read from the narrow word (which the swap must then replace).
    narrow: bool,
    pub(crate) params: Params,
}

impl Snapshot {
    pub(crate) fn tat(&self) -> u128 {
        self.word & TAT_MASK
    }

    pub(crate) fn is_closed(&self) -> bool {
        self.word & CLOSED != 0
    }
}

/// How one lock-free attempt on the narrow word ended.
enum Once {
    Done(Taken),
    /// Another thread's pour changed the word first: try again.
    Lost,
    /// Not decided in 64 bits here: take the general way.
    Wide,
}

/// What [`Cell::reserve`] does with a request that would have to wait.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Wait {
    /// Pour nothing and answer `WouldWait` (the lock-free fast path).
    Refuse,
    /// Pour and answer `Queued`: the caller takes its place in the queue.
    Queue,
}

impl Cell {
    /// A cell of its own (the tests').
    #[cfg(test)]
    pub(crate) fn new(params: Params, tat: u128, origin: clock::Origin) -> Cell {
        Cell::for_bucket(params, tat, origin, 0, Release::Tokens)
    }

    /// A cell that also keeps its bucket's constants (see [`Cell`]).
    pub(crate) fn for_bucket(
        params: Params,
        tat: u128,
        origin: clock::Origin,
        fresh_deficit: u32,
        release: Release,
    ) -> Cell {
        let tat = tat & TAT_MASK;
        let (narrow, word) = match u64::try_from(tat) {
            Ok(narrow) if narrow < NARROW_LIMIT => (narrow, 0),
            _ => (WIDE, tat),
        };
        Cell {
            narrow: AtomicU64::new(narrow),
            num: AtomicU64::new(params.num()),
            den: AtomicU64::new(params.den()),
            capacity: params.capacity(),
            fresh_deficit,
            origin,
            release,
            word: AtomicU128::new(word),
            credit: Credit::new(),
        }
    }

    pub(crate) fn capacity(&self) -> u32 {
        self.capacity
    }

    /// Nanoseconds since the origin on tokio's clock.
    #[inline]
    pub(crate) fn now_nanos(&self) -> u128 {
        u128::from(self.origin.elapsed_nanos())
    }

    /// The instant `scaled` units after the origin, rounded up to a
    /// nanosecond (saturating far in the future).
    pub(crate) fn instant_at(&self, params: &Params, scaled: u128) -> Instant {
        self.origin.instant_after(params.duration_ceil(scaled))
    }

    /// The word and the interval that goes with it.
    ///
    /// The interval is read after the word, so a rate change can slip in
    /// between (even the two halves of the interval may come from different
    /// rates); the generation is read again to rule that out.
    pub(crate) fn snapshot(&self) -> Snapshot {
        loop {
            let s = self.read();
            if self.still_valid(&s) {
                return s;
            }
        }
    }

    /// The word and an interval that goes with it only if the generation
    /// has not moved since: for callers that check that themselves, with
    /// their compare-and-swap on the same word or with [`Cell::still_valid`].
    fn read(&self) -> Snapshot {
        loop {
            let narrow = self.narrow.load(Ordering::Acquire);
            if narrow < NARROW_LIMIT {
                // The interval cannot change before the cell widens.
                let params = self.params_loaded(Ordering::Relaxed);
                // Order the interval loads before whatever validates them.
                fence(Ordering::Acquire);
                return Snapshot {
                    word: u128::from(narrow),
                    narrow: true,
                    params,
                };
            }
            if narrow == MOVING {
                spin_loop();
                continue;
            }
            let word = self.word.load(Ordering::Acquire);
            if generation(word) & 1 == 1 {
                // A rate change is being written; it takes a few instructions.
                spin_loop();
                continue;
            }
            let params = self.params_loaded(Ordering::Relaxed);
            // Order the interval loads before whatever validates them.
            fence(Ordering::Acquire);
            return Snapshot {
                word,
                narrow: false,
                params,
            };
        }
    }

    /// The interval as stored, unvalidated, loaded with `order` (`Acquire`
    /// before a narrow word: see [`take_once`](Self::take_once)).
    #[inline]
    fn params_loaded(&self, order: Ordering) -> Params {
        Params::from_parts(self.num.load(order), self.den.load(order), self.capacity)
    }

    /// Whether a snapshot that was only read (not swapped) is still
    /// consistent: its generation has not moved on. (If the interval it
    /// read was stored by a rate change, the fences in `read` and
    /// `set_params` make that change's odd generation visible here.)
    fn still_valid(&self, s: &Snapshot) -> bool {
        if s.narrow {
            // The interval changes only after the cell has widened.
            return self.narrow.load(Ordering::Relaxed) < NARROW_LIMIT;
        }
        generation(self.word.load(Ordering::Relaxed)) == generation(s.word)
    }

    /// Replaces the snapshot's tat with `tat` if nothing changed meanwhile.
    ///
    /// A narrow snapshot whose new `tat` does not fit the narrow word
    /// widens the cell and fails: the caller reads again, wide.
    fn swap(&self, s: &Snapshot, tat: u128) -> bool {
        if s.narrow {
            return match u64::try_from(tat) {
                Ok(tat) if tat < NARROW_LIMIT => self.swap_narrow(s.word, tat),
                _ => {
                    self.widen();
                    false
                }
            };
        }
        let new = (s.word & !TAT_MASK) | (tat & TAT_MASK);
        self.word
            .compare_exchange_weak(s.word, new, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }

    /// The narrow half of [`swap`](Self::swap).
    #[inline]
    fn swap_narrow(&self, old: u128, tat: u64) -> bool {
        // `old` came from the narrow word, so it fits.
        let old = u64::try_from(old).unwrap_or(MOVING);
        self.narrow
            .compare_exchange_weak(old, tat, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }

    /// Moves the state into the wide word, if it is not there yet (see the
    /// module docs). Every caller of this goes on to read the wide word.
    #[cold]
    fn widen(&self) {
        let mut narrow = self.narrow.load(Ordering::Acquire);
        loop {
            match narrow {
                WIDE => return,
                MOVING => {
                    spin_loop();
                    narrow = self.narrow.load(Ordering::Acquire);
                }
                tat => match self.narrow.compare_exchange_weak(
                    tat,
                    MOVING,
                    Ordering::AcqRel,
                    Ordering::Acquire,
                ) {
                    Ok(_) => {
                        // Nobody reads or writes the wide word before it is
                        // marked wide; the release below publishes it.
                        self.word.store(u128::from(tat), Ordering::Relaxed);
                        self.narrow.store(WIDE, Ordering::Release);
                        return;
                    }
                    Err(actual) => narrow = actual,
                },
            }
        }
    }

    /// Whether the state is still in the narrow word.
    #[cfg(test)]
    pub(crate) fn is_narrow(&self) -> bool {
        self.narrow.load(Ordering::Relaxed) < NARROW_LIMIT
    }

    /// [`take_at`](Self::take_at) as a `Result`: `Err(Some(wait))` is a
    /// refusal with the exact wait, `Err(None)` means closed.
    #[cfg(test)]
    pub(crate) fn try_pour(&self, now_nanos: u128, n: u32) -> Result<(), Option<Duration>> {
        match self.take_at(now_nanos, n) {
            Taken::Granted => Ok(()),
            Taken::Limited(wait) => Err(Some(wait)),
            Taken::Closed => Err(None),
        }
    }

    /// [`take`](Self::take) at `now_nanos` (every reading of the clock
    /// reads that).
    #[cfg(test)]
    pub(crate) fn take_at(&self, now_nanos: u128, n: u32) -> Taken {
        self.take_reading(n, || now_nanos)
    }

    /// The meter (`try_acquire`): pours `n` units if they fit now, else
    /// the exact wait, or closed. The caller has checked `1 <= n <=
    /// capacity`.
    ///
    /// Each decision reads the clock after the state it decides on (see
    /// [`take_reading`](Self::take_reading)).
    #[inline]
    pub(crate) fn take(&self, n: u32) -> Taken {
        self.take_reading(n, || self.now_nanos())
    }

    /// [`take`](Self::take)'s first attempt, when it needs no call: the
    /// narrow word and the fast clock's segment answer it (a lost swap
    /// tries again). `None`: take the whole way ([`take`](Self::take)),
    /// which a caller does out of line, so that this path saves no
    /// registers for it.
    #[inline]
    pub(crate) fn take_leaf(&self, n: u32) -> Option<Taken> {
        loop {
            match self.take_once(n, || self.origin.elapsed_nanos_leaf()) {
                Once::Done(taken) => return Some(taken),
                // As in `take_reading`: two threads on one bucket lose
                // swaps often, and each retry here costs no call.
                Once::Lost => spin_loop(),
                Once::Wide => return None,
            }
        }
    }

    /// [`take`](Self::take) with `clock` for the readings.
    ///
    /// The clock is read after the state, in program order, for every
    /// decision (a lost swap loads the state and reads the clock again):
    /// a thread preempted between the two reads the later time, so the
    /// state it decides on is never newer than its reading. Read the other
    /// way round, a reading could be older than a grant another thread
    /// made while this one was preempted, and refuse a request that fits
    /// at the time it is decided, by as much as the preemption lasted.
    /// (What is left is the processor's: the counter read may run ahead of
    /// the load before it by about a cache miss; see ARCHITECTURE.md,
    /// "Readings out of order".)
    #[inline]
    fn take_reading(&self, n: u32, clock: impl Fn() -> u128) -> Taken {
        // The narrow cell in 64-bit arithmetic; anything that does not fit
        // goes the general way, which widens the cell.
        loop {
            match self.take_once(n, || u64::try_from(clock()).ok()) {
                Once::Done(taken) => return taken,
                // Another thread's pour won: let it finish with the line.
                Once::Lost => spin_loop(),
                Once::Wide => break,
            }
        }
        self.take_wide(n, clock).into()
    }

    /// One attempt of [`take_reading`](Self::take_reading) on the narrow
    /// word, `clock` reading nanoseconds (`None`: not in 64 bits, or not
    /// without a call).
    ///
    /// The interval is loaded before the word, and nothing is checked
    /// again after the decision: the interval changes only once the cell
    /// has widened, and a rate change stores it after a release fence that
    /// follows the widening, so an interval that is not the first one
    /// read here (with `Acquire`) means the word loaded after it reads
    /// wide. A narrow word therefore goes with the interval read before it.
    #[inline]
    fn take_once(&self, n: u32, clock: impl FnOnce() -> Option<u64>) -> Once {
        let params = self.params_loaded(Ordering::Acquire);
        let tat = self.narrow.load(Ordering::Acquire);
        if tat >= NARROW_LIMIT {
            return Once::Wide;
        }
        let Some(nanos) = clock() else {
            return Once::Wide;
        };
        // Whole-nanosecond intervals (`den` 1, most rates) skip the
        // multiply: it would sit between the clock and the swap.
        let now = if params.den() == 1 {
            nanos
        } else if let Some(now) = nanos.checked_mul(params.den()) {
            now
        } else {
            return Once::Wide;
        };
        if now >= NARROW_LIMIT {
            return Once::Wide;
        }
        match params.try_pour_narrow(tat, now, n) {
            Some(Ok(end)) if end < NARROW_LIMIT => {
                if self
                    .narrow
                    .compare_exchange_weak(tat, end, Ordering::AcqRel, Ordering::Acquire)
                    .is_ok()
                {
                    Once::Done(Taken::Granted)
                } else {
                    Once::Lost
                }
            }
            Some(Err(wait)) => Once::Done(Taken::Limited(params.duration_ceil_narrow(wait))),
            _ => Once::Wide,
        }
    }

    /// [`take_reading`](Self::take_reading) through the general snapshot.
    #[cold]
    fn take_wide(&self, n: u32, clock: impl Fn() -> u128) -> Result<(), Option<Duration>> {
        loop {
            let s = self.read();
            if s.is_closed() {
                return Err(None);
            }
            let now = s.params.scale_nanos(clock());
            match s.params.try_pour(s.tat(), now, n) {
                Ok(end) => {
                    if self.swap(&s, end) {
                        return Ok(());
                    }
                    // Another thread's pour won: let it finish with the line.
                    spin_loop();
                }
                Err(wait) => {
                    if self.still_valid(&s) {
                        return Err(Some(s.params.duration_ceil(wait)));
                    }
                }
            }
        }
    }

    /// A waiter's reservation of `n` units now.
    ///
    /// Pours if the caller may proceed at once; otherwise as `wait` says.
    /// Refuses with `TooLong` when the wait would exceed `max_wait_nanos`.
    ///
    /// As [`take`](Self::take), the clock is read after the state each
    /// attempt decides on: a request that does not fit (an overflow, a
    /// wait too long) is never refused for a grant made after its reading.
    pub(crate) fn reserve(
        &self,
        n: u32,
        release: Release,
        max_wait_nanos: Option<u128>,
        wait: Wait,
    ) -> Reserve<Place> {
        self.reserve_reading(|| self.now_nanos(), n, release, max_wait_nanos, wait)
    }

    /// [`reserve`](Self::reserve) at `now_nanos`.
    #[cfg(test)]
    pub(crate) fn reserve_at(
        &self,
        now_nanos: u128,
        n: u32,
        release: Release,
        max_wait_nanos: Option<u128>,
        wait: Wait,
    ) -> Reserve<Place> {
        self.reserve_reading(|| now_nanos, n, release, max_wait_nanos, wait)
    }

    /// [`reserve`](Self::reserve) with `clock` for the readings.
    fn reserve_reading(
        &self,
        clock: impl Fn() -> u128,
        n: u32,
        release: Release,
        max_wait_nanos: Option<u128>,
        wait: Wait,
    ) -> Reserve<Place> {
        loop {
            let s = self.read();
            if s.is_closed() {
                return Reserve::Closed;
            }
            let now_nanos = clock();
            let now = s.params.scale_nanos(now_nanos);
            let arrival = self.arrival(&s, now_nanos, now);
            let Ok(r) = s.params.reserve(s.tat(), now, arrival, n, release) else {
                if self.still_valid(&s) {
                    return Reserve::Overflow;
                }
                continue;
            };
            let outcome = if r.ready <= now {
                Reserve::Ready(r)
            } else if max_wait_nanos
                .is_some_and(|max| (r.ready - now).div_ceil(u128::from(s.params.den())) > max)
            {
                Reserve::TooLong
            } else if wait == Wait::Refuse {
                Reserve::WouldWait
            } else {
                Reserve::Queued(r)
            };
            match outcome {
                Reserve::Ready(_) | Reserve::Queued(_) => {
                    if self.swap(&s, r.end) {
                        return outcome;
                    }
                }
                _ => {
                    if self.still_valid(&s) {
                        return outcome;
                    }
                }
            }
        }
    }

    /// When a waiter's request counts as having arrived: `now`, or the due
    /// time of a late release whose credit runs (see [`Credit`]).
    fn arrival(&self, s: &Snapshot, now_nanos: u128, now: u128) -> u128 {
        if s.tat() >= now {
            return now; // the bucket is busy: no clamping happens anyway
        }
        match self.credit.due(now_nanos) {
            Some(due) => s.params.scale_nanos(due),
            None => now,
        }
    }

    /// Whether a timer credit is still running at `now_nanos` (a bucket
    /// with one is not in a fresh state).
    pub(crate) fn has_credit(&self, now_nanos: u128) -> bool {
        self.credit.due(now_nanos).is_some()
    }

    /// Records that a waiter due at `ready` (scaled) was released at
    /// `now` (scaled), later than due.
    pub(crate) fn note_late_release(&self, params: &Params, ready: u128, now: u128) {
        if ready < now {
            self.credit
                .note(params.nanos_floor(ready), params.nanos_floor(now));
        }
    }

    /// Gives back `amount` scaled units of a cancelled reservation.
    pub(crate) fn refund(&self, amount: u128) {
        if amount == 0 {
            return;
        }
        let mut narrow = self.narrow.load(Ordering::Acquire);
        loop {
            match narrow {
                WIDE => break,
                MOVING => {
                    spin_loop();
                    narrow = self.narrow.load(Ordering::Acquire);
                }
                tat => {
                    let new = u64::try_from(u128::from(tat).saturating_sub(amount)).unwrap_or(0);
                    match self.narrow.compare_exchange_weak(
                        tat,
                        new,
                        Ordering::AcqRel,
                        Ordering::Acquire,
                    ) {
                        Ok(_) => return,
                        Err(actual) => narrow = actual,
                    }
                }
            }
        }
        let mut word = self.word.load(Ordering::Acquire);
        loop {
            let tat = (word & TAT_MASK).saturating_sub(amount);
            let new = (word & !TAT_MASK) | tat;
            match self
                .word
                .compare_exchange_weak(word, new, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return,
                Err(actual) => word = actual,
            }
        }
    }

    /// Marks the cell closed; every later decision answers `Closed`.
    /// Returns whether it was open.
    pub(crate) fn close(&self) -> bool {
        self.widen();
        self.word.fetch_or(CLOSED, Ordering::AcqRel) & CLOSED == 0
    }

    pub(crate) fn is_closed(&self) -> bool {
        // Closing widens first, so a narrow (or moving) cell is open.
        self.narrow.load(Ordering::Acquire) == WIDE
            && self.word.load(Ordering::Acquire) & CLOSED != 0
    }

    /// Switches to new parameters at `now_nanos`, converting `tat` (and,
    /// through `convert`, any reservations the caller keeps) so that the
    /// water in the bucket drains at the new rate from now on.
    ///
    /// The caller serialises rate changes (it holds the queue lock).
    pub(crate) fn set_params(
        &self,
        new: Params,
        now_nanos: u128,
        convert: impl FnOnce(&Params, &Params),
    ) {
        // The interval changes only in the wide word.
        self.widen();
        // Make the generation odd: readers wait, swaps based on older
        // snapshots fail.
        let mut word = self.word.load(Ordering::Acquire);
        loop {
            let odd = with_generation(word, generation(word) + 1);
            match self
                .word
                .compare_exchange_weak(word, odd, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => {
                    word = odd;
                    break;
                }
                Err(actual) => word = actual,
            }
        }
        fence(Ordering::Release);
        let old = Params::from_parts(
            self.num.load(Ordering::Relaxed),
            self.den.load(Ordering::Relaxed),
            self.capacity,
        );
        let tat = if new == old {
            // The same interval: nothing to convert, and an idle state and
            // a running timer credit stay as they are (moved up to now,
            // and forgotten, they would lose the permits the credit gives).
            word & TAT_MASK
        } else {
            let tat = old.rescale(&new, word & TAT_MASK, now_nanos);
            convert(&old, &new);
            self.num.store(new.num(), Ordering::Relaxed);
            self.den.store(new.den(), Ordering::Relaxed);
            // A credit reaching back before the change would count that
            // time at the new rate.
            self.credit.clear();
            tat
        };
        // Nobody else can change the word while the generation is odd
        // (closing and refunds also hold the queue lock).
        let even = with_generation((word & !TAT_MASK) | tat, generation(word) + 1);
        self.word.store(even, Ordering::Release);
    }
}

fn generation(word: u128) -> u128 {
    (word >> GEN_SHIFT) & GEN_MASK
}

fn with_generation(word: u128, generation: u128) -> u128 {
    (word & !(GEN_MASK << GEN_SHIFT)) | ((generation & GEN_MASK) << GEN_SHIFT)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Rate;

    fn cell(rate: Rate, capacity: u32) -> Cell {
        let params = Params::new(rate, capacity).unwrap();
        Cell::new(params, 0, clock::Origin::now())
    }

    const MS: u128 = 1_000_000;

    #[test]
    fn meter_and_refusal() {
        let c = cell(Rate::per_second(10), 2);
        assert_eq!(c.try_pour(0, 2), Ok(()));
        assert_eq!(c.try_pour(0, 1), Err(Some(Duration::from_millis(100))));
        assert_eq!(c.try_pour(150 * MS, 1), Ok(()));
        assert!(c.close());
        assert!(!c.close());
        assert_eq!(c.try_pour(10_000 * MS, 1), Err(None));
    }

    #[test]
    fn reserve_outcomes() {
        let c = cell(Rate::per_second(10), 1);
        assert!(matches!(
            c.reserve_at(0, 1, Release::Tokens, None, Wait::Refuse),
            Reserve::Ready(_)
        ));
        assert_eq!(
            c.reserve_at(0, 1, Release::Tokens, None, Wait::Refuse),
            Reserve::WouldWait
        );
        assert_eq!(
            c.reserve_at(0, 1, Release::Tokens, Some(99 * MS), Wait::Queue),
            Reserve::TooLong
        );
        let Reserve::Queued(r) = c.reserve_at(0, 1, Release::Tokens, Some(100 * MS), Wait::Queue)
        else {
            panic!()
        };
        let params = c.snapshot().params;
        assert_eq!(params.duration_ceil(r.ready), Duration::from_millis(100));
        // The shaper overflows instead of queueing past the capacity.
        let s = cell(Rate::per_second(10), 1);
        assert!(matches!(
            s.reserve_at(0, 1, Release::Water, None, Wait::Queue),
            Reserve::Ready(_)
        ));
        assert_eq!(
            s.reserve_at(0, 1, Release::Water, None, Wait::Queue),
            Reserve::Overflow
        );
    }

    #[test]
    fn set_params_converts_water_and_bumps_generation() {
        let c = cell(Rate::per_second(10), 4);
        assert_eq!(c.try_pour(0, 4), Ok(()));
        let before = c.snapshot();
        let fast = Params::new(Rate::per_second(100), 4).unwrap();
        c.set_params(fast, 100 * MS, |_, _| {});
        let after = c.snapshot();
        assert_eq!(generation(after.word), generation(before.word) + 2);
        assert_eq!(after.params, fast);
        // 3 units of water left at 100 ms drain by 130 ms at the new rate.
        assert_eq!(
            c.try_pour(100 * MS, 2),
            Err(Some(Duration::from_millis(10)))
        );
        assert_eq!(c.try_pour(130 * MS, 4), Ok(()));
    }

    #[test]
    fn refund_and_credit() {
        let c = cell(Rate::per_second(1000), 1);
        let params = c.snapshot().params;
        assert_eq!(c.try_pour(0, 1), Ok(()));
        c.refund(params.cost(1));
        assert_eq!(c.try_pour(0, 1), Ok(()));
        // No credit: a request after the bucket drained is scheduled from now.
        let s = c.snapshot();
        assert_eq!(
            c.arrival(&s, 5 * MS, params.scale_nanos(5 * MS)),
            params.scale_nanos(5 * MS)
        );
        c.note_late_release(
            &params,
            params.scale_nanos(4 * MS + 300_000),
            params.scale_nanos(5 * MS),
        );
        assert_eq!(
            c.arrival(&s, 5 * MS, params.scale_nanos(5 * MS)),
            params.scale_nanos(4 * MS + 300_000)
        );
        // Within the grace after the release it still runs, reaching back
        // 1.1 ms; past the grace it has lapsed.
        assert_eq!(
            c.arrival(&s, 5 * MS + 400_000, params.scale_nanos(5 * MS + 400_000)),
            params.scale_nanos(4 * MS + 300_000)
        );
        assert_eq!(
            c.arrival(&s, 5 * MS + 600_000, params.scale_nanos(5 * MS + 600_000)),
            params.scale_nanos(5 * MS + 600_000)
        );
        // An earlier late release does not replace a later one; no credit
        // reaches back more than CREDIT_REACH.
        c.note_late_release(&params, params.scale_nanos(MS), params.scale_nanos(5 * MS));
        assert!(c.has_credit(5 * MS));
        c.note_late_release(
            &params,
            params.scale_nanos(10 * MS),
            params.scale_nanos(20 * MS),
        );
        assert!(!c.has_credit(20 * MS));
    }

    /// A cell starts narrow and widens for good when it is closed, when
    /// its rate changes, or when a time or `tat` outgrows the narrow word;
    /// the answers are the same either side.
    #[test]
    fn widens_once_on_close_rate_change_and_overflow() {
        let c = cell(Rate::per_second(10), 2);
        assert!(c.is_narrow());
        assert_eq!(c.try_pour(0, 2), Ok(()));
        c.refund(c.snapshot().params.cost(1));
        assert!(c.is_narrow());
        assert!(!c.is_closed());
        assert!(c.close());
        assert!(!c.is_narrow());
        assert!(c.is_closed());
        assert_eq!(c.try_pour(0, 1), Err(None));
        assert_eq!(
            c.reserve_at(0, 1, Release::Tokens, None, Wait::Queue),
            Reserve::Closed
        );

        let c = cell(Rate::per_second(10), 2);
        assert_eq!(c.try_pour(0, 2), Ok(()));
        c.set_params(Params::new(Rate::per_second(10), 2).unwrap(), 0, |_, _| {});
        assert!(!c.is_narrow());
        assert_eq!(generation(c.snapshot().word), 2);
        assert_eq!(c.try_pour(0, 1), Err(Some(Duration::from_millis(100))));
        assert_eq!(c.try_pour(100 * MS, 1), Ok(()));

        // den = 4 294 967 291 (a prime, 5 s the period): 2⁶² scaled units
        // are 1.07 s.
        let rate = Rate::per(4_294_967_291, Duration::from_secs(5));
        let c = cell(rate, 1);
        let limit = u128::from(NARROW_LIMIT) / u128::from(c.snapshot().params.den());
        assert_eq!(c.try_pour(limit - 1, 1), Ok(()));
        assert!(c.is_narrow());
        assert_eq!(c.try_pour(limit + 1, 1), Ok(()));
        assert!(!c.is_narrow());
        assert_eq!(c.try_pour(limit + 1, 1), Err(Some(Duration::from_nanos(2))));
        // A tat past the limit, from a request that starts below it.
        let c = cell(rate, 1);
        let just_below = (u128::from(NARROW_LIMIT) - 1) / u128::from(c.snapshot().params.den());
        assert!(matches!(
            c.reserve_at(just_below, 1, Release::Tokens, None, Wait::Queue),
            Reserve::Ready(_)
        ));
        assert!(!c.is_narrow());
        // A cell made with a tat the narrow word cannot hold starts wide.
        let p = Params::new(rate, 1).unwrap();
        let c = Cell::new(p, u128::from(NARROW_LIMIT), clock::Origin::now());
        assert!(!c.is_narrow());
        assert_eq!(c.snapshot().tat(), u128::from(NARROW_LIMIT));
    }

    mod narrow_and_wide {
        use proptest::prelude::*;

        use super::*;

        #[derive(Debug, Clone, Copy)]
        enum Op {
            Pour(u32),
            Reserve(u32, bool),
            Refund(u64),
            Advance(u64),
        }

        fn op() -> impl Strategy<Value = Op> {
            prop_oneof![
                4 => (1..=4u32).prop_map(Op::Pour),
                2 => (1..=4u32, any::<bool>()).prop_map(|(n, water)| Op::Reserve(n, water)),
                1 => (0..200_000_000u64).prop_map(Op::Refund),
                4 => prop_oneof![0..1_000u64, 0..300_000_000u64].prop_map(Op::Advance),
            ]
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(2_000))]
            /// The same operations on a narrow cell and on one widened
            /// from the start give the same answers and the same `tat`;
            /// at a rate whose units outgrow the narrow word within the
            /// run, the narrow one widens on the way.
            #[test]
            fn give_the_same_answers(
                permits in prop_oneof![Just(10u32), Just(3), Just(999_999_937), Just(0)],
                start in prop_oneof![Just(0u64), 0..2_000_000_000u64],
                ops in proptest::collection::vec(op(), 1..60),
            ) {
                // 0: 4 294 967 291 per 5 s, a `den` just under 2³².
                let rate = if permits == 0 {
                    Rate::per(4_294_967_291, Duration::from_secs(5))
                } else {
                    Rate::per_second(permits)
                };
                let params = Params::new(rate, 4).unwrap();
                let narrow = Cell::new(params, 0, clock::Origin::now());
                let wide = Cell::new(params, 0, clock::Origin::now());
                wide.widen();
                prop_assert!(narrow.is_narrow() && !wide.is_narrow());
                let mut now = u128::from(start);
                for op in ops {
                    match op {
                        Op::Pour(n) => prop_assert_eq!(narrow.try_pour(now, n), wide.try_pour(now, n)),
                        Op::Reserve(n, water) => {
                            let release = if water { Release::Water } else { Release::Tokens };
                            prop_assert_eq!(
                                narrow.reserve_at(now, n, release, Some(150 * MS), Wait::Queue),
                                wide.reserve_at(now, n, release, Some(150 * MS), Wait::Queue)
                            );
                        }
                        Op::Refund(amount) => {
                            narrow.refund(u128::from(amount));
                            wide.refund(u128::from(amount));
                        }
                        Op::Advance(d) => now += u128::from(d),
                    }
                    prop_assert_eq!(narrow.snapshot().tat(), wide.snapshot().tat());
                }
            }
        }
    }

    #[test]
    fn generation_wraps_without_touching_closed() {
        let word = with_generation(CLOSED | 5, GEN_MASK);
        assert_eq!(generation(word), GEN_MASK);
        let wrapped = with_generation(word, generation(word) + 1);
        assert_eq!(generation(wrapped), 0);
        assert_eq!(wrapped & CLOSED, CLOSED);
        assert_eq!(wrapped & TAT_MASK, 5);
    }
}

#[cfg(all(test, tokio_ratelimit_loom))]
mod loom_tests;
