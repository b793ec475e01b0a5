//! The timer credit (see [`Credit`]).

use std::time::Duration;

use crate::sync::{AtomicU128, Ordering};

/// How soon after a late release a waiter's request is credited for the
/// lateness. Under a tick, so that with the paused clock only requests at
/// the release instant are.
pub(crate) const CREDIT_GRACE: Duration = Duration::from_micros(500);
/// The furthest back a credit reaches.
pub(crate) const CREDIT_REACH: Duration = Duration::from_millis(4);

/// The latest waiter a limiter's timer released after its due time: its
/// due time and the time it was released, in ns since the limiter's
/// origin.
///
/// tokio wakes a waiter only on a millisecond tick, and in real time often
/// a tick or two later still, so a waiter released by the timer is late;
/// if the limiter emptied meanwhile and the caller comes straight back for
/// more, scheduling it from `now` would throw away the permits that fell
/// due while it overslept (at 100 000/s with a capacity of 10, nine in
/// ten). So a waiter's request that comes within [`CREDIT_GRACE`] of such a
/// late release counts as having arrived at the released one's due time:
/// the permits are credited, and the long-run rate is exact.
///
/// The credit reaches back by the release's lateness plus the grace, at
/// most [`CREDIT_REACH`], so grants to waiters stay within `capacity +
/// rate × (window + that reach)`. With the paused clock a release is at
/// most one tick late and the caller comes back at the same instant, so
/// the bound is `capacity + rate × (window + 1 tick)`. `try_acquire` never
/// takes credit and stays within `capacity + rate × window`.
#[derive(Debug)]
pub(crate) struct Credit(
    /// The due time in the high 64 bits, the release in the low 64; 0 for
    /// none.
    AtomicU128,
);

impl Credit {
    pub(crate) fn new() -> Credit {
        Credit(AtomicU128::new(0))
    }

    /// The due time of the late release whose credit runs at `now_nanos`.
    pub(crate) fn due(&self, now_nanos: u128) -> Option<u128> {
        let credit = self.0.load(Ordering::Relaxed);
        if credit == 0 {
            return None;
        }
        let (due, released) = (credit >> 64, credit & u128::from(u64::MAX));
        let in_grace = released <= now_nanos && now_nanos - released <= CREDIT_GRACE.as_nanos();
        let in_reach = due <= now_nanos && now_nanos - due <= CREDIT_REACH.as_nanos();
        (in_grace && in_reach).then_some(due)
    }

    /// Records that a waiter due at `due` ns (rounded down) was released
    /// at `released` ns, later than due; the latest due time is kept.
    pub(crate) fn note(&self, due: u128, released: u128) {
        if due > released {
            return;
        }
        let due = due.min(u128::from(u64::MAX));
        let released = released.min(u128::from(u64::MAX));
        let new = due << 64 | released;
        let mut old = self.0.load(Ordering::Relaxed);
        while old >> 64 <= due && old != new {
            match self
                .0
                .compare_exchange_weak(old, new, Ordering::Relaxed, Ordering::Relaxed)
            {
                Ok(_) => break,
                Err(actual) => old = actual,
            }
        }
    }

    /// Forgets the credit (the units it was measured in changed).
    pub(crate) fn clear(&self) {
        self.0.store(0, Ordering::Relaxed);
    }
}
