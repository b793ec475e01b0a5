//! The background actor of a bucket: one timer for the whole queue, armed
//! only while someone waits, and started again on another runtime when its
//! own is gone.

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Weak};

use tokio::sync::Notify;
use tokio::time::Instant;
use tracing::Instrument;

use super::{Engine, Schedule, Waking, wake_all};
use crate::{AcquireError, clock};

impl<S: Schedule> Engine<S> {
    /// Spawns the actor's task on `runtime`; its state is already `RUNNING`.
    pub(super) fn spawn_actor(&self, actor: &Arc<Actor<S>>, runtime: &tokio::runtime::Handle) {
        let span = tracing::debug_span!(
            "actor",
            limiter = self.kind.name(),
            capacity = self.capacity(),
        );
        let link = ActorLink {
            actor: Arc::clone(actor),
            stopped: false,
        };
        // A runtime that is shutting down drops the task at once: the link
        // then sets the state back to `DEAD` (see `actor_serves`).
        drop(runtime.spawn(run_actor(link).instrument(span)));
    }

    /// Whether the actor wakes this engine's waiters (`false`: each waiter
    /// keeps its own timer). An actor whose runtime is gone is re-spawned
    /// on the runtime of the caller, once (the state's compare-and-swap),
    /// so the queue keeps a single timer; outside any runtime that cannot
    /// be done, and the caller must fail rather than wait for nothing.
    /// Never called under the queue lock: a failed spawn runs the link's
    /// `Drop`, which takes it.
    pub(super) fn actor_serves(&self) -> Result<bool, AcquireError> {
        let Waking::Actor(actor) = &self.waking else {
            return Ok(false);
        };
        match actor.state.load(Ordering::Acquire) {
            RUNNING => return Ok(true),
            FAILED => return Ok(false),
            _ => {}
        }
        let runtime = tokio::runtime::Handle::try_current().map_err(|_| AcquireError::NoRuntime)?;
        if actor
            .state
            .compare_exchange(DEAD, RUNNING, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            tracing::debug!(
                limiter = self.kind.name(),
                "actor gone with its runtime: re-spawned"
            );
            self.spawn_actor(actor, &runtime);
        }
        match actor.state.load(Ordering::Acquire) {
            RUNNING => Ok(true),
            FAILED => Ok(false),
            _ => Err(AcquireError::NoRuntime),
        }
    }

    /// Whether a running actor keeps the timer for the whole queue (else
    /// waiters must be woken to re-arm their own, or to re-spawn it).
    pub(super) fn actor_running(&self) -> bool {
        match &self.waking {
            Waking::Actor(actor) => actor.state.load(Ordering::Acquire) == RUNNING,
            Waking::OwnTimers => false,
        }
    }

    pub(super) fn wake_actor(&self) {
        if let Waking::Actor(actor) = &self.waking {
            actor.notify.notify_one();
        }
    }

    /// Wakes every pending waiter: the actor is gone, and they must take
    /// over (re-spawn it, or arm their own timers).
    pub(super) fn wake_waiters(&self) {
        let mut wakers = Vec::new();
        self.lock().wake_pending(0, &mut wakers);
        wake_all(wakers);
    }

    /// One round of the actor: grant what is due, and say when to look
    /// again.
    pub(super) fn drive(&self) -> Drive {
        let mut wakers = Vec::new();
        let next = {
            let mut queue = self.lock();
            if queue.closed {
                return Drive::Stop;
            }
            let view = self.schedule.view(&queue.books);
            let granted = queue.grant_due(&self.schedule, &view, &mut wakers, None);
            if granted > 0 {
                tracing::trace!(granted, "released waiters");
            }
            queue.next_turn(&self.schedule, &view)
        };
        wake_all(wakers);
        next.map_or(Drive::Idle, Drive::Until)
    }
}

/// What the actor does next.
pub(super) enum Drive {
    /// Sleep until the first waiter's turn (or until woken).
    Until(Instant),
    /// Nobody waits: no timer, just wait to be woken.
    Idle,
    /// The limiter is closed or gone.
    Stop,
}

/// The background task of an actor-backed limiter: one timer for the whole
/// queue, armed only while someone waits. It ends when the last handle is
/// dropped (the engine is gone) or the limiter is closed.
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
    let actor = Arc::clone(&link.actor);
    let (engine, notify) = (&actor.engine, &actor.notify);
    let mut timer = clock::TwoStep::default();
    loop {
        let next = match engine.upgrade() {
            Some(engine) => engine.drive(),
            None => Drive::Stop,
        };
        match next {
            Drive::Stop => break,
            Drive::Idle => {
                timer = clock::TwoStep::default();
                notify.notified().await;
            }
            Drive::Until(turn) => {
                let (deadline, early) = timer.deadline(turn);
                let sleep = std::pin::pin!(clock::sleep_until(deadline));
                let woken = std::pin::pin!(notify.notified());
                match futures::future::select(sleep, woken).await {
                    futures::future::Either::Left(_) => timer.fired(turn, early),
                    futures::future::Either::Right(_) => timer = clock::TwoStep::default(),
                }
            }
        }
    }
    link.stopped = true;
    tracing::debug!("stopped");
}

/// An actor-backed engine's link to its background task, and whether that
/// task is alive.
pub(crate) struct Actor<S: Schedule> {
    /// Wakes the actor.
    pub(super) notify: Notify,
    /// `RUNNING`, `DEAD` or `FAILED`.
    pub(super) state: AtomicU8,
    /// The engine it serves: a waiter (which borrows the engine) re-spawns
    /// the actor with it.
    pub(super) engine: Weak<Engine<S>>,
}

impl<S: Schedule> Actor<S> {
    /// An actor about to be spawned for `engine`.
    pub(super) fn new(engine: Weak<Engine<S>>) -> Actor<S> {
        Actor {
            notify: Notify::new(),
            state: AtomicU8::new(RUNNING),
            engine,
        }
    }
}

/// A task is spawned (or being spawned) and will wake the waiters.
const RUNNING: u8 = 0;
/// The task's future was dropped before it ended: its runtime shut
/// down. The next waiter re-spawns it.
const DEAD: u8 = 1;
/// The task panicked: it is not re-spawned (it would panic again), and
/// waiters keep their own timers from then on.
const FAILED: u8 = 2;

/// Owned by the actor's future: its `Drop` tells a task that ended (the
/// limiter closed or dropped) from one whose future was dropped (runtime
/// shutdown, or a spawn onto a runtime already shut down) or that panicked.
struct ActorLink<S: Schedule> {
    actor: Arc<Actor<S>>,
    /// The task ended normally.
    stopped: bool,
}

impl<S: Schedule> Drop for ActorLink<S> {
    fn drop(&mut self) {
        if self.stopped {
            return;
        }
        let state = if std::thread::panicking() {
            FAILED
        } else {
            DEAD
        };
        self.actor.state.store(state, Ordering::Release);
        // Stored before the waiters' lock is taken: a waiter that registers
        // its waker after this wake sees the new state when it checks. Wake
        // them even if the task was never polled: a runtime that is not
        // driven (a `block_on` that returned) never runs its tasks, and its
        // waiters elsewhere have relied on this one since it was spawned.
        if let Some(engine) = self.actor.engine.upgrade() {
            engine.wake_waiters();
        }
    }
}
