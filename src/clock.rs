//! The one place that reads tokio time and arms timers.
//!
//! Everything goes through `tokio::time`, so a runtime started with a paused
//! clock (`#[tokio::test(start_paused = true)]`) drives every limiter in
//! virtual time.

use std::time::Duration;

use tokio::time::{Instant, Sleep};

/// tokio's timer resolution: a sleep ends on the first millisecond tick at
/// or after its deadline, so a waiter can be woken up to this much late.
pub(crate) const TICK: Duration = Duration::from_millis(1);

/// The current instant on tokio's clock (paused or not).
pub(crate) fn now() -> Instant {
    Instant::now()
}

/// A timer that fires at `deadline` (rounded up to the next tick).
pub(crate) fn sleep_until(deadline: Instant) -> Sleep {
    tokio::time::sleep_until(deadline)
}

/// A timer that fires after `duration` (rounded up to the next tick).
#[cfg(feature = "redis")]
pub(crate) fn sleep(duration: Duration) -> Sleep {
    tokio::time::sleep(duration)
}
