//! The lock-free GCRA cell every bucket is built on.
//!
//! One 128-bit word holds the whole decision state, so the hot paths
//! (`try_acquire`, and an `acquire` that need not wait) are one atomic load,
//! a little integer arithmetic from [`crate::algorithm`], and one
//! compare-and-swap — no lock, no allocation:
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

use crate::algorithm::{MAX_TIME, Params, Place, Release, Reserve};
use crate::clock;
use crate::sync::{AtomicU64, AtomicU128, Ordering, fence, spin_loop};

const TAT_MASK: u128 = MAX_TIME;
const GEN_SHIFT: u32 = 100;
const GEN_MASK: u128 = (1 << 27) - 1;
const CLOSED: u128 = 1 << 127;

/// How soon after a late release a waiter's request is credited for the
/// lateness (see [`Cell::arrival`]). Under a tick, so that with the paused
/// clock only requests at the release instant are.
pub(crate) const CREDIT_GRACE: Duration = Duration::from_micros(500);
/// The furthest back a credit reaches.
pub(crate) const CREDIT_REACH: Duration = Duration::from_millis(4);

/// The lock-free state of one bucket.
///
/// `repr(C)`: what every call reads comes first, in 48 bytes (the word,
/// the interval, the capacity, the decoded origin), so the engine can keep
/// the counters off its cache line (see `engine::Engine`). The word shares
/// that line with the read-only fields: a thread that finds the word
/// changed by another's pour misses on the line once, which it would on a
/// word of its own line too. (It had a line of its own, and a bucket took
/// 512 bytes.)
#[repr(C)]
pub(crate) struct Cell {
    word: AtomicU128,
    num: AtomicU64,
    den: AtomicU64,
    capacity: u32,
    origin: clock::Origin,
    /// The latest waiter released after its due time: its due time (ns
    /// since the origin, rounded down) in the high 64 bits, the time it was
    /// released in the low 64 bits; 0 for none.
    credit: AtomicU128,
}

/// A consistent view of the word and the interval it is expressed in.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Snapshot {
    word: u128,
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

/// What [`Cell::reserve`] does with a request that would have to wait.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Wait {
    /// Pour nothing and answer `WouldWait` (the lock-free fast path).
    Refuse,
    /// Pour and answer `Queued`: the caller takes its place in the queue.
    Queue,
}

impl Cell {
    pub(crate) fn new(params: Params, tat: u128, origin: clock::Origin) -> Cell {
        Cell {
            word: AtomicU128::new(tat & TAT_MASK),
            num: AtomicU64::new(params.num()),
            den: AtomicU64::new(params.den()),
            capacity: params.capacity(),
            origin,
            credit: AtomicU128::new(0),
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
            let word = self.word.load(Ordering::Acquire);
            if generation(word) & 1 == 1 {
                // A rate change is being written; it takes a few instructions.
                spin_loop();
                continue;
            }
            let params = Params::from_parts(
                self.num.load(Ordering::Relaxed),
                self.den.load(Ordering::Relaxed),
                self.capacity,
            );
            // Order the interval loads before whatever validates them.
            fence(Ordering::Acquire);
            return Snapshot { word, params };
        }
    }

    /// Whether a snapshot that was only read (not swapped) is still
    /// consistent: its generation has not moved on. (If the interval it
    /// read was stored by a rate change, the fences in `read` and
    /// `set_params` make that change's odd generation visible here.)
    fn still_valid(&self, s: &Snapshot) -> bool {
        generation(self.word.load(Ordering::Relaxed)) == generation(s.word)
    }

    /// Replaces the snapshot's tat with `tat` if nothing changed meanwhile.
    fn swap(&self, s: &Snapshot, tat: u128) -> bool {
        let new = (s.word & !TAT_MASK) | (tat & TAT_MASK);
        self.word
            .compare_exchange_weak(s.word, new, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }

    /// The meter (`try_acquire`): pours `n` units if they fit now.
    ///
    /// `Err(Some(wait))` is a refusal with the exact wait, `Err(None)` means
    /// closed. The caller has checked `1 <= n <= capacity`.
    pub(crate) fn try_pour(&self, now_nanos: u128, n: u32) -> Result<(), Option<Duration>> {
        loop {
            let s = self.read();
            if s.is_closed() {
                return Err(None);
            }
            let now = s.params.scale_nanos(now_nanos);
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

    /// A waiter's reservation of `n` units at `now_nanos`.
    ///
    /// Pours if the caller may proceed at once; otherwise as `wait` says.
    /// Refuses with `TooLong` when the wait would exceed `max_wait_nanos`.
    pub(crate) fn reserve(
        &self,
        now_nanos: u128,
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

    /// When a waiter's request counts as having arrived.
    ///
    /// Normally `now`. But tokio wakes a waiter only on a millisecond tick,
    /// and in real time often a tick or two later still, so a waiter released
    /// by the timer is late; if the bucket emptied meanwhile and the caller
    /// comes straight back for more, clamping the schedule to `now` would
    /// throw away the permits that fell due while it overslept (at 100 000/s
    /// with a capacity of 10, nine in ten). So a waiter's request that comes
    /// within [`CREDIT_GRACE`] of such a late release is scheduled from the
    /// released one's due time instead: the permits are credited, and the
    /// long-run rate is exact.
    ///
    /// The credit reaches back by the release's lateness plus the grace, at
    /// most [`CREDIT_REACH`], so grants to waiters stay within `capacity +
    /// rate × (window + that reach)`. With the paused clock a release is at
    /// most one tick late and the caller comes back at the same instant, so
    /// the bound is `capacity + rate × (window + 1 tick)`. `try_acquire`
    /// never takes credit and stays within `capacity + rate × window`.
    fn arrival(&self, s: &Snapshot, now_nanos: u128, now: u128) -> u128 {
        if s.tat() >= now {
            return now; // the bucket is busy: no clamping happens anyway
        }
        match self.credit_due(now_nanos) {
            Some(due) => s.params.scale_nanos(due),
            None => now,
        }
    }

    /// The due time of the late release whose credit runs at `now_nanos`.
    fn credit_due(&self, now_nanos: u128) -> Option<u128> {
        let credit = self.credit.load(Ordering::Relaxed);
        if credit == 0 {
            return None;
        }
        let (due, released) = (credit >> 64, credit & u128::from(u64::MAX));
        let in_grace = released <= now_nanos && now_nanos - released <= CREDIT_GRACE.as_nanos();
        let in_reach = due <= now_nanos && now_nanos - due <= CREDIT_REACH.as_nanos();
        (in_grace && in_reach).then_some(due)
    }

    /// Whether a timer credit is still running at `now_nanos` (a bucket
    /// with one is not in a fresh state).
    pub(crate) fn has_credit(&self, now_nanos: u128) -> bool {
        self.credit_due(now_nanos).is_some()
    }

    /// Records that a waiter due at `ready` (scaled) was released at
    /// `now` (scaled), later than due.
    pub(crate) fn note_late_release(&self, params: &Params, ready: u128, now: u128) {
        if ready >= now {
            return;
        }
        let due = params.nanos_floor(ready).min(u128::from(u64::MAX));
        let released = params.nanos_floor(now).min(u128::from(u64::MAX));
        let new = due << 64 | released;
        let mut old = self.credit.load(Ordering::Relaxed);
        // Keep the latest due time.
        while old >> 64 <= due && old != new {
            match self
                .credit
                .compare_exchange_weak(old, new, Ordering::Relaxed, Ordering::Relaxed)
            {
                Ok(_) => break,
                Err(actual) => old = actual,
            }
        }
    }

    /// Gives back `amount` scaled units of a cancelled reservation.
    pub(crate) fn refund(&self, amount: u128) {
        if amount == 0 {
            return;
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
        self.word.fetch_or(CLOSED, Ordering::AcqRel) & CLOSED == 0
    }

    pub(crate) fn is_closed(&self) -> bool {
        self.word.load(Ordering::Acquire) & CLOSED != 0
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
        let tat = old.rescale(&new, word & TAT_MASK, now_nanos);
        convert(&old, &new);
        self.num.store(new.num(), Ordering::Relaxed);
        self.den.store(new.den(), Ordering::Relaxed);
        self.credit.store(0, Ordering::Relaxed);
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
            c.reserve(0, 1, Release::Tokens, None, Wait::Refuse),
            Reserve::Ready(_)
        ));
        assert_eq!(
            c.reserve(0, 1, Release::Tokens, None, Wait::Refuse),
            Reserve::WouldWait
        );
        assert_eq!(
            c.reserve(0, 1, Release::Tokens, Some(99 * MS), Wait::Queue),
            Reserve::TooLong
        );
        let Reserve::Queued(r) = c.reserve(0, 1, Release::Tokens, Some(100 * MS), Wait::Queue)
        else {
            panic!()
        };
        let params = c.snapshot().params;
        assert_eq!(params.duration_ceil(r.ready), Duration::from_millis(100));
        // The shaper overflows instead of queueing past the capacity.
        let s = cell(Rate::per_second(10), 1);
        assert!(matches!(
            s.reserve(0, 1, Release::Water, None, Wait::Queue),
            Reserve::Ready(_)
        ));
        assert_eq!(
            s.reserve(0, 1, Release::Water, None, Wait::Queue),
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
