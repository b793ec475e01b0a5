//! Guava's smooth limiters, async: [`SmoothBursty`] and [`SmoothWarmingUp`].
//!
//! Both are cheap handles over the crate's waiting engine, whose schedule
//! (`schedule.rs`) is one [`SmoothState`](crate::algorithm::SmoothState) behind the engine's lock; nothing
//! is spawned. A caller reserves under the lock — Guava's `reserve`: it is
//! told how long to wait, and its own cost is paid by the next caller —
//! then waits in the engine's queue on its own tokio timer. Reservations
//! are made in call order, so callers are served in that order; an idle
//! limiter has no timer armed and costs nothing.
//!
//! # Design notes
//!
//! * **Time.** The limiter's origin is the instant `build()` ran; `now` is
//!   tokio's clock minus the origin, so a paused clock drives it exactly.
//! * **Close.** As for every limiter on the engine: the queue's waiters are
//!   failed and woken under its lock.
//! * **Cancellation.** Each state change (reservation, rate change,
//!   give-back) gets a fresh version number; a waiter remembers the state
//!   before its reservation and the version its reservation produced. If it
//!   is dropped while the limiter is still at that version — nothing was
//!   reserved and `set_rate` was not called after it (even with the same
//!   rate: it resyncs the state), or everything after
//!   it was withdrawn in turn — the old state is put back, exactly as if it
//!   had never arrived. Otherwise later reservations were priced on top of
//!   its debt (Guava's pay-later model: each caller's wait is the previous
//!   callers' cost), and re-pricing them is beyond Guava's model; instead
//!   the part of its cost not yet elapsed is given back
//!   ([`SmoothState`](crate::algorithm::SmoothState)'s `give_back`): the next free ticket moves back by it
//!   and every reservation after it moves up by as much, keeping its own
//!   price. The stored permits it spent stay spent (which only ever slows
//!   the limiter). So a service whose callers time out keeps its rate: the
//!   survivors inherit the turns of those who gave up. The reservations
//!   that can still be given back (waiters, held [`Reservation`](crate::Reservation)s) are the
//!   engine's queue entries, so a give-back re-arms the timers of those
//!   after it.
//! * **Timer ticks.** tokio's timer fires on 1 ms ticks, so a waiter due at
//!   10 µs wakes at 1 ms. If its caller then asks again at once, Guava's
//!   model would count the time it overslept as *idle* time: stored permits
//!   (bursty) or cooling (warm-up), and at rates above 1 000/s a warm-up
//!   limiter driven by one task's `acquire` loop would deliver two permits
//!   per tick. So when a waiter wakes late, requests arriving within one
//!   tick after that do not turn the time since the next free ticket into
//!   idle time: they are taken as arriving on time (at the next free
//!   ticket, if that is at most one tick ago). This never lets a request
//!   through before the next free ticket, it moves a grant's virtual time
//!   back by less than a tick (so window bounds hold with one tick of
//!   slack, like every waiter's grant), and it only applies after a late
//!   wake (never in paused-clock tests whose deadlines fall on ticks).

mod bursty;
mod schedule;
mod warming_up;

pub use bursty::{SmoothBursty, SmoothBurstyBuilder};
#[cfg(test)]
pub(crate) use schedule::Smooth as SmoothSchedule;
pub use warming_up::{SmoothWarmingUp, SmoothWarmingUpBuilder};
