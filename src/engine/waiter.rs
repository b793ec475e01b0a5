//! The waiter: the future of a queued request. It polls the engine for its
//! turn, keeps its own timer where no actor wakes it, and withdraws its
//! entry when dropped before its turn.

use std::future::poll_fn;
use std::pin::{Pin, pin};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use tokio::time::{Instant, Sleep};

use super::actor::Watch;
use super::queue::{Grant, State};
use super::{Engine, Schedule, wake_all};
use crate::{AcquireError, clock};

impl<S: Schedule> Engine<S> {
    /// Waits for entry `id`'s turn (or the limiter's close). Dropped
    /// before that, it withdraws the entry.
    pub(super) async fn wait_turn(
        self: &Arc<Self>,
        id: u64,
        grant: Grant,
    ) -> Result<(), AcquireError> {
        let mut entry = Withdraw {
            engine: self,
            id: Some(id),
        };
        let mut sleep = pin!(None::<Sleep>);
        let mut timer = clock::TwoStep::default();
        let result = poll_fn(|cx| self.poll_turn(id, grant, cx, sleep.as_mut(), &mut timer)).await;
        // Done: a held entry now belongs to its `Reservation`.
        entry.id = None;
        result
    }

    fn poll_turn(
        self: &Arc<Self>,
        id: u64,
        grant: Grant,
        cx: &mut Context<'_>,
        mut sleep: Pin<&mut Option<Sleep>>,
        timer: &mut clock::TwoStep,
    ) -> Poll<Result<(), AcquireError>> {
        // Three times at most: the early timer may have fired, and a timer
        // armed for the turn that has fired means the turn has come.
        for _ in 0..3 {
            let (turn, watch) = match self.poll_entry(id, grant, cx.waker()) {
                Ok(result) => return Poll::Ready(result),
                Err(pending) => pending,
            };
            match watch {
                Watch::Actor => return Poll::Pending,
                Watch::Spawn(run) => match self.spawn_actor(run) {
                    Ok(()) => return Poll::Pending,
                    Err(error) => {
                        self.cancel(id);
                        return Poll::Ready(Err(error));
                    }
                },
                Watch::OwnTimer => {}
            }
            // `None`: never due; only a withdrawal ahead or a close ends
            // the wait, and both wake it.
            let Some(turn) = turn else {
                return Poll::Pending;
            };
            let (deadline, early) = timer.deadline(turn);
            match sleep.as_mut().as_pin_mut() {
                Some(armed) if armed.deadline() == deadline => {}
                Some(armed) => armed.reset(deadline),
                None => sleep.set(Some(clock::sleep_until(deadline))),
            }
            let Some(armed) = sleep.as_mut().as_pin_mut() else {
                unreachable!("armed just above")
            };
            if armed.poll(cx).is_pending() {
                return Poll::Pending;
            }
            timer.fired(turn, early);
        }
        // Timers that fired while the turn kept moving later (a rate change
        // in between): look again rather than wait for a wake that may not
        // come.
        cx.waker().wake_by_ref();
        Poll::Pending
    }

    /// Polls entry `id`: its answer, or (still pending) the instant of its
    /// turn, for waiters that keep their own timer, and who wakes it. An
    /// entry that holds its permits is counted as granted when committed,
    /// not here.
    fn poll_entry(
        &self,
        id: u64,
        grant: Grant,
        waker: &Waker,
    ) -> Result<Result<(), AcquireError>, (Option<Instant>, Watch)> {
        let mut wakers = Vec::new();
        let outcome = {
            let mut queue = self.lock();
            match queue.observe(id, waker) {
                Ok(state) => Ok(state),
                Err(idx) => {
                    let view = self.schedule.view(&queue.books);
                    let (turn, n) = queue.turn(idx);
                    if self.schedule.is_due(&view, turn, n) {
                        // Its turn has come, whether or not the actor has run.
                        queue.grant_due(&self.schedule, &view, &mut wakers, Some(waker));
                        queue
                            .observe(id, waker)
                            .map_err(|_| (Some(clock::now()), queue.watch(self.waking)))
                    } else {
                        let at = self.schedule.instant(&view, turn, n);
                        Err((at, queue.watch(self.waking)))
                    }
                }
            }
        };
        wake_all(wakers);
        match outcome {
            Ok((State::Granted, n)) => {
                if grant == Grant::Spend {
                    self.meter.granted(n, |n| self.counts().granted(n));
                }
                tracing::trace!(limiter = self.kind.name(), id, "granted after waiting");
                Ok(Ok(()))
            }
            Ok((State::Closed, _)) => Ok(Err(AcquireError::Closed)),
            Ok((State::Pending, _)) => unreachable!("a pending entry is observed by its index"),
            Err(pending) => Err(pending),
        }
    }
}

/// Withdraws a waiter's entry if the waiter is dropped before it is done.
struct Withdraw<'a, S: Schedule> {
    engine: &'a Engine<S>,
    /// `None` once the waiter is done.
    id: Option<u64>,
}

impl<S: Schedule> Drop for Withdraw<'_, S> {
    fn drop(&mut self) {
        if let Some(id) = self.id {
            self.engine.cancel(id);
        }
    }
}
