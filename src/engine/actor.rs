//! The background actor of a bucket: one timer for the whole queue, and a
//! task only while someone waits.
//!
//! An idle bucket has no task, no timer and no actor state beyond its
//! [`ActorSlot`] in the queue: the first waiter to find the slot idle
//! claims it (under the queue lock) and spawns the task on its own runtime;
//! the task ends, giving the slot back under the same lock, once no entry
//! is pending. Claiming and giving back under one lock is what makes it
//! safe: a waiter either sees the task's slot, and the task sees its entry
//! before it ends, or sees the slot idle and spawns a new one. So a bucket
//! built on one runtime serves waiters on any other, and a runtime shut
//! down under the task only ends it: its waiters are woken, and the next of
//! them to be polled spawns the task again on its own runtime.

use std::future::poll_fn;
use std::pin::{Pin, pin};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use tokio::time::{Instant, Sleep};
use tracing::Instrument;

use super::queue::Queue;
use super::{Engine, Schedule, Waking, wake_all};
use crate::{AcquireError, clock};

/// The actor's slot in the queue, read and written under the lock.
#[derive(Debug, Default)]
pub(crate) enum ActorSlot {
    /// No task: the next waiter spawns one.
    #[default]
    Idle,
    /// Task `run` is spawned (or being spawned): it looks at the queue
    /// again before it ends. `waker` wakes it (`None` until its first
    /// poll, which looks at the queue anyway).
    Running { run: u32, waker: Option<Waker> },
    /// A task panicked: it is not spawned again (it would panic again), and
    /// waiters keep their own timers from then on.
    Failed,
}

/// What a pending waiter relies on to be woken at its turn.
pub(super) enum Watch {
    /// The actor's timer.
    Actor,
    /// Nobody yet: the waiter claimed the slot for task `run` and must
    /// spawn it once the lock is released.
    Spawn(u32),
    /// Its own timer.
    OwnTimer,
}

impl<S: Schedule> Queue<S> {
    /// Who wakes a pending waiter, claiming the idle slot for a new task.
    pub(super) fn watch(&mut self, waking: Waking) -> Watch {
        let Some(w) = self.waiting().filter(|_| waking == Waking::Actor) else {
            return Watch::OwnTimer;
        };
        match w.actor {
            ActorSlot::Running { .. } => Watch::Actor,
            ActorSlot::Failed => Watch::OwnTimer,
            ActorSlot::Idle => {
                w.runs = w.runs.wrapping_add(1);
                w.actor = ActorSlot::Running {
                    run: w.runs,
                    waker: None,
                };
                Watch::Spawn(w.runs)
            }
        }
    }

    /// Whether a task keeps the timer for the whole queue (else waiters
    /// must be woken to re-arm their own, or to spawn one).
    pub(super) fn actor_running(&mut self) -> bool {
        self.waiting()
            .is_some_and(|w| matches!(w.actor, ActorSlot::Running { .. }))
    }

    /// Collects the actor's waker: the queue changed.
    pub(super) fn wake_actor(&mut self, wakers: &mut Vec<Waker>) {
        if let Some(ActorSlot::Running { waker, .. }) = self.waiting().map(|w| &mut w.actor) {
            wakers.extend(waker.take());
        }
    }

    /// Gives task `run`'s slot back (`Failed`: it panicked); returns whether
    /// it was still that task's.
    fn end_run(&mut self, run: u32, then: ActorSlot) -> bool {
        let Some(w) = self.waiting() else {
            return false;
        };
        let ours = matches!(w.actor, ActorSlot::Running { run: r, .. } if r == run);
        if ours {
            w.actor = then;
        }
        self.tidy();
        ours
    }
}

impl<S: Schedule> Engine<S> {
    /// Spawns task `run`, whose slot the caller claimed, on the caller's
    /// runtime. Fails where there is none (or it is shutting down, which
    /// drops the task at once): the slot is then given back, and the other
    /// waiters woken to spawn it themselves. Never called under the queue
    /// lock: a dropped task takes it.
    pub(super) fn spawn_actor(self: &Arc<Self>, run: u32) -> Result<(), AcquireError> {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            self.actor_gone(run, false);
            return Err(AcquireError::NoRuntime);
        };
        let span = tracing::debug_span!(
            "actor",
            limiter = self.kind.name(),
            capacity = self.capacity(),
        );
        let link = ActorLink {
            engine: Arc::clone(self),
            run,
            stopped: false,
        };
        drop(runtime.spawn(run_actor(link).instrument(span)));
        // The caller's entry keeps the waiting part alive.
        if self
            .lock()
            .waiting()
            .is_some_and(|w| w.dropped == Some(run))
        {
            return Err(AcquireError::NoRuntime);
        }
        Ok(())
    }

    /// Task `run` ended without giving its slot back: its future was
    /// dropped (its runtime shut down, or never took it) or it panicked.
    /// Wakes every pending waiter to take over: spawn a new task, or arm
    /// its own timer.
    fn actor_gone(&self, run: u32, panicked: bool) {
        let mut wakers = Vec::new();
        {
            let mut queue = self.lock();
            if let Some(w) = queue.waiting() {
                w.dropped = Some(run);
            }
            let then = if panicked {
                ActorSlot::Failed
            } else {
                ActorSlot::Idle
            };
            queue.end_run(run, then);
            queue.wake_pending(0, &mut wakers);
        }
        wake_all(wakers);
    }

    /// One round of task `run`: grants what is due, and says when to look
    /// again (storing `waker` to be woken sooner should the queue change).
    fn drive(&self, run: u32, waker: &Waker) -> Drive {
        let mut wakers = Vec::new();
        let next = {
            let mut queue = self.lock();
            let view = self.schedule.view(&queue.books);
            if !queue.closed {
                let granted = queue.grant_due(&self.schedule, &view, &mut wakers, None);
                if granted > 0 {
                    tracing::trace!(granted, "released waiters");
                }
            }
            if queue.closed || !queue.has_pending() {
                // Under the lock: a waiter queued from now on finds the
                // slot idle and spawns a new task.
                queue.end_run(run, ActorSlot::Idle);
                Drive::Stop
            } else {
                if let Some(ActorSlot::Running { waker: slot, .. }) =
                    queue.waiting().map(|w| &mut w.actor)
                {
                    if !slot.as_ref().is_some_and(|w| w.will_wake(waker)) {
                        *slot = Some(waker.clone());
                    }
                }
                queue
                    .next_turn(&self.schedule, &view)
                    .map_or(Drive::Idle, Drive::Until)
            }
        };
        wake_all(wakers);
        next
    }

    /// Polls task `run`: rounds until its timer is armed for a turn not
    /// yet come, or nobody waits.
    fn poll_actor(
        &self,
        run: u32,
        cx: &mut Context<'_>,
        mut sleep: Pin<&mut Option<Sleep>>,
        timer: &mut clock::TwoStep,
    ) -> Poll<()> {
        loop {
            let turn = match self.drive(run, cx.waker()) {
                Drive::Stop => return Poll::Ready(()),
                // Pending entries none of which is ever due: a withdrawal
                // or a close wakes the task.
                Drive::Idle => return Poll::Pending,
                Drive::Until(turn) => turn,
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
    }
}

/// What the actor does next.
enum Drive {
    /// Sleep until the first waiter's turn (or until woken).
    Until(Instant),
    /// Waiters wait, none has a turn yet: wait to be woken.
    Idle,
    /// Nobody waits, or the limiter is closed: the task ends.
    Stop,
}

/// The background task of an actor-backed limiter: one timer for the whole
/// queue, while someone waits.
///
/// Its timer is armed in two steps, a tick before the first waiter's turn
/// and then at the turn ([`clock::TwoStep`]): each round releases every
/// waiter due by the time it runs, which may include one due after the
/// tick but before the round; armed only at the turns, the timer for the
/// waiter after it would then skip a tick, and at 1 000/s releases came in
/// pairs with an empty tick between them (p99 lateness ~1.8 ms instead of
/// ~1.1).
async fn run_actor<S: Schedule>(mut link: ActorLink<S>) {
    tracing::debug!("started");
    let engine = Arc::clone(&link.engine);
    let mut sleep = pin!(None::<Sleep>);
    let mut timer = clock::TwoStep::default();
    poll_fn(|cx| engine.poll_actor(link.run, cx, sleep.as_mut(), &mut timer)).await;
    link.stopped = true;
    tracing::debug!("stopped");
}

/// Owned by the actor's future: its `Drop` tells a task that ended (it gave
/// its slot back) from one whose future was dropped (runtime shutdown, or a
/// spawn onto a runtime already shut down) or that panicked.
///
/// It holds the engine strongly: the task lives only while entries are
/// pending, and those belong to waiters that borrow a handle, so it never
/// keeps an engine alive that nobody can reach.
struct ActorLink<S: Schedule> {
    engine: Arc<Engine<S>>,
    run: u32,
    /// The task ended normally.
    stopped: bool,
}

impl<S: Schedule> Drop for ActorLink<S> {
    fn drop(&mut self) {
        if !self.stopped {
            // Wake them even if the task was never polled: a runtime that
            // is not driven (a `block_on` that returned) never runs its
            // tasks, and its waiters elsewhere have relied on this one since
            // it was spawned.
            self.engine.actor_gone(self.run, std::thread::panicking());
        }
    }
}
