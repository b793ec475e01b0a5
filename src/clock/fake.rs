//! A clock a unit test drives: limiters built on a thread inside
//! [`Clock::enter`] read it instead of the fast clock or tokio's, from
//! whichever thread they are used. It may go backwards, and answer each
//! thread differently (cores whose counters disagree).

use std::cell::Cell;
use std::sync::{Mutex, PoisonError};

type Reading = dyn Fn() -> u64 + Send + Sync;

/// Every clock made by this test binary (leaked: tests are few).
static CLOCKS: Mutex<Vec<&'static Reading>> = Mutex::new(Vec::new());

thread_local! {
    static CURRENT: Cell<Option<u64>> = const { Cell::new(None) };
}

/// Bits of an origin's `raw` that hold its reading at the origin.
pub(super) const BASE_BITS: u32 = 40;

/// A fake clock: nanoseconds, below 2⁴⁰ at any limiter's origin.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Clock(u64);

impl Clock {
    /// A clock that reads `reading`.
    pub(crate) fn new(reading: impl Fn() -> u64 + Send + Sync + 'static) -> Clock {
        let reading: &'static Reading = Box::leak(Box::new(reading));
        let mut clocks = CLOCKS.lock().unwrap_or_else(PoisonError::into_inner);
        clocks.push(reading);
        Clock(clocks.len() as u64 - 1)
    }

    /// Until the guard is dropped, limiters built on this thread (and the
    /// limiters of new keys made here) read this clock.
    pub(crate) fn enter(self) -> Entered {
        let before = CURRENT.with(|c| c.replace(Some(self.0)));
        Entered(before)
    }
}

/// The clock entered on this thread, if any.
pub(super) fn current() -> Option<u64> {
    CURRENT.with(Cell::get)
}

/// Clock `index`'s reading now.
pub(super) fn read(index: u64) -> u64 {
    let reading = CLOCKS.lock().unwrap_or_else(PoisonError::into_inner)
        [usize::try_from(index).expect("an index of CLOCKS")];
    reading()
}

/// Leaves the clock when dropped (back to the one entered before).
#[derive(Debug)]
pub(crate) struct Entered(Option<u64>);

impl Drop for Entered {
    fn drop(&mut self) {
        CURRENT.with(|c| c.set(self.0));
    }
}
