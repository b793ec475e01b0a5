//! The future of a queued `acquire`: polls the engine for its turn, keeps
//! its own timer where no actor runs, and gives its reservation back when
//! dropped before its turn.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::time::Sleep;

use super::Engine;
use crate::queue::Grant;
use crate::{AcquireError, clock};

/// A queued `acquire`: resolves when its turn comes (or the limiter
/// closes); gives its reservation back if dropped before.
pub(super) struct Waiter<'a> {
    pub(super) engine: &'a Engine,
    pub(super) id: u64,
    /// Whether the permits stay held in the queue once granted.
    pub(super) grant: Grant,
    pub(super) done: bool,
    /// Waiters of a limiter without a (live) actor keep their own timer.
    pub(super) sleep: Option<Pin<Box<Sleep>>>,
    /// How its own timer is armed (as the actor's, see `actor::run_actor`).
    pub(super) timer: clock::TwoStep,
}

impl Future for Waiter<'_> {
    type Output = Result<(), AcquireError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = &mut *self;
        // Three times at most: the early timer may have fired, and a timer
        // armed for the turn that has fired means the turn has come.
        for _ in 0..3 {
            match this.engine.poll_waiter(this.id, this.grant, cx.waker()) {
                Ok(result) => {
                    this.done = true;
                    return Poll::Ready(result);
                }
                Err(turn) => {
                    match this.engine.actor_serves() {
                        Ok(true) => return Poll::Pending,
                        Ok(false) => {}
                        Err(error) => {
                            this.engine.cancel(this.id);
                            this.done = true;
                            return Poll::Ready(Err(error));
                        }
                    }
                    let (deadline, early) = this.timer.deadline(turn);
                    let sleep = this
                        .sleep
                        .get_or_insert_with(|| Box::pin(clock::sleep_until(deadline)));
                    if sleep.deadline() != deadline {
                        sleep.as_mut().reset(deadline);
                    }
                    if sleep.as_mut().poll(cx).is_pending() {
                        return Poll::Pending;
                    }
                    this.timer.fired(turn, early);
                }
            }
        }
        // Timers that fired while the turn kept moving later (a rate change
        // in between): look again rather than wait for a wake that may not
        // come.
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}

impl Drop for Waiter<'_> {
    fn drop(&mut self) {
        // A held waiter that completed hands its entry to a `Reservation`.
        if !self.done {
            self.engine.cancel(self.id);
        }
    }
}
