//! The machinery shared by the token bucket, the leaky bucket and the
//! funnel: a lock-free [`Cell`] for decisions that need not wait, a
//! [`Queue`] of waiters behind a mutex for those that do, and something to
//! wake the waiters on time — a background actor (one timer for the whole
//! queue) or, for the task-less funnel, each waiter's own timer.
//!
//! The three limiters differ only in their [`Release`] rule (tokens: a
//! waiter proceeds once the bucket is back within capacity; water: once the
//! water ahead of it has drained, and a request that does not fit
//! overflows) and in whether they spawn an actor.
//!
//! # Words
//!
//! * A request's **turn** is the instant its permits are due (`ready`, in
//!   the cell's scaled units; an `Instant` once converted for a timer).
//! * A **reservation** is what a request takes from the cell when it
//!   arrives: its permits' place in the bucket's time line (`Reserve` is the
//!   cell's answer). A reservation that must wait becomes an **entry** in the
//!   [`Queue`], named by its id; its **waiter** is the future polling it.
//! * An entry is **granted** when its turn comes; [`Grant`] says whether
//!   its permits are then spent (`acquire`) or held until a
//!   [`Reservation`] commits or drops them (`reserve`).
//! * **Cancelling** an entry gives back its undrained part (a **refund**)
//!   and moves every later entry forward.
//! * The **actor** is the background task that grants entries on one timer;
//!   without one, each waiter arms its own.
//!
//! Lock order: the queue lock, then the cell (which is lock-free). The
//! uncontended fast paths never take the lock.
//!
//! Files: this one holds [`Engine`] (deciding, queueing, cancelling,
//! closing); `actor.rs` the background actor and how it is started again
//! when its runtime is gone; `waiter.rs` the future of a queued `acquire`.

mod actor;
mod waiter;

use std::fmt;
use std::sync::atomic::AtomicU8;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::Waker;
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use crate::algorithm::{Params, Release};
use crate::cell::{Cell, Reserve, Wait};
use crate::queue::{Grant, Queue, State};
use crate::reservation::{Hold, Reservation};
use crate::stats::{Counters, Stats};
use crate::{AcquireError, ConfigError, Rate, TryAcquireError, clock};
use actor::Actor;
use waiter::Waiter;

/// Which limiter an engine serves (for tracing and `Debug`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    TokenBucket,
    LeakyBucket,
    Funnel,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::TokenBucket => "token_bucket",
            Kind::LeakyBucket => "leaky_bucket",
            Kind::Funnel => "funnel",
        }
    }
}

/// One bucket: decisions, waiters, and the link to its actor.
pub(crate) struct Engine {
    cell: Cell,
    queue: Mutex<Queue>,
    release: Release,
    kind: Kind,
    /// Tokens a newly built bucket lacks (capacity − initial).
    fresh_deficit: u32,
    /// The background actor; `None` when waiters arm their own timers.
    actor: Option<Arc<Actor>>,
    counters: Counters,
}

/// How an engine's first `tat` is set.
pub(crate) struct Setup {
    pub(crate) kind: Kind,
    pub(crate) rate: Rate,
    pub(crate) params: Params,
    /// Tokens the bucket lacks when built (0: empty of water / full of
    /// tokens).
    pub(crate) deficit: u32,
    pub(crate) release: Release,
    pub(crate) spawn_actor: bool,
}

impl Engine {
    /// Builds the engine and, if asked, spawns its actor on the current
    /// runtime.
    pub(crate) fn start(setup: &Setup) -> Result<Arc<Engine>, ConfigError> {
        let runtime = if setup.spawn_actor {
            Some(tokio::runtime::Handle::try_current().map_err(|_| ConfigError::NoRuntime)?)
        } else {
            None
        };
        let engine = Arc::new_cyclic(|this| Engine {
            cell: Cell::new(setup.params, setup.params.cost(setup.deficit), clock::now()),
            queue: Mutex::new(Queue::new(setup.rate)),
            release: setup.release,
            kind: setup.kind,
            fresh_deficit: setup.deficit,
            actor: runtime.as_ref().map(|_| {
                Arc::new(Actor {
                    notify: Notify::new(),
                    state: AtomicU8::new(Actor::RUNNING),
                    engine: this.clone(),
                })
            }),
            counters: Counters::default(),
        });
        if let (Some(runtime), Some(actor)) = (runtime, &engine.actor) {
            engine.spawn_actor(actor, &runtime, setup.rate);
        }
        Ok(engine)
    }

    fn lock(&self) -> MutexGuard<'_, Queue> {
        // A panic under the lock leaves the queue consistent (every update
        // is a single step), so a poisoned lock is still usable.
        self.queue.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(crate) fn capacity(&self) -> u32 {
        self.cell.capacity()
    }

    pub(crate) fn rate(&self) -> Rate {
        self.lock().rate
    }

    pub(crate) fn is_closed(&self) -> bool {
        self.cell.is_closed()
    }

    /// Whole tokens / units of free room at this instant.
    pub(crate) fn available(&self) -> u32 {
        let now = self.cell.now_nanos();
        let s = self.cell.snapshot();
        s.params.available(s.tat(), s.params.scale_nanos(now))
    }

    /// Units of water (poured and reserved, not yet drained), rounded up.
    pub(crate) fn level(&self) -> u32 {
        let now = self.cell.now_nanos();
        let s = self.cell.snapshot();
        s.params.level(s.tat(), s.params.scale_nanos(now))
    }

    /// Waiters that have not proceeded yet.
    pub(crate) fn waiting(&self) -> usize {
        self.lock().pending()
    }

    /// Counters and the state now.
    pub(crate) fn stats(&self) -> Stats {
        let (granted, refused) = self.counters.totals();
        Stats {
            granted,
            refused,
            waiting: self.waiting(),
            available: Some(self.available()),
        }
    }

    /// Whether the bucket is in exactly the state of a newly built one: open,
    /// nobody in the queue, no timer credit running, and the same tokens
    /// (water) a new one would have now.
    pub(crate) fn is_fresh(&self) -> bool {
        let queue = self.lock();
        if queue.closed || !queue.is_empty() {
            return false;
        }
        let now_nanos = self.cell.now_nanos();
        let s = self.cell.snapshot();
        let now = s.params.scale_nanos(now_nanos);
        !self.cell.has_credit(now_nanos)
            && s.tat().max(now) == now + s.params.cost(self.fresh_deficit)
    }

    /// The meter: `n` permits now or a refusal with the exact wait.
    pub(crate) fn try_acquire(&self, n: u32) -> Result<(), TryAcquireError> {
        if n > self.capacity() {
            if self.is_closed() {
                return Err(TryAcquireError::Closed);
            }
            self.counters.refused();
            return Err(TryAcquireError::InsufficientCapacity);
        }
        if n == 0 {
            return if self.is_closed() {
                Err(TryAcquireError::Closed)
            } else {
                Ok(())
            };
        }
        match self.cell.try_pour(self.cell.now_nanos(), n) {
            Ok(()) => {
                self.counters.granted(n);
                tracing::trace!(limiter = self.kind.name(), n, "granted");
                Ok(())
            }
            Err(Some(retry_after)) => {
                self.counters.refused();
                tracing::trace!(limiter = self.kind.name(), n, ?retry_after, "limited");
                Err(TryAcquireError::Limited { retry_after })
            }
            Err(None) => Err(TryAcquireError::Closed),
        }
    }

    /// Waits for `n` permits, in turn; `max_wait` bounds the wait (`None`:
    /// no bound). Fails at once when the turn would come too late.
    pub(crate) async fn acquire(
        &self,
        n: u32,
        max_wait: Option<Duration>,
    ) -> Result<(), AcquireError> {
        match self.enqueue(n, max_wait, Grant::Spend)? {
            Queued::Ready(_) => Ok(()),
            Queued::Waiting(id) => self.wait(id, max_wait, Grant::Spend).await,
        }
    }

    /// Waits for `n` permits like [`acquire`](Self::acquire), but holds them
    /// in the queue until the reservation is committed or dropped.
    pub(crate) async fn reserve(self: &Arc<Self>, n: u32) -> Result<Reservation, AcquireError> {
        let id = match self.enqueue(n, None, Grant::Hold)? {
            Queued::Ready(None) => return Ok(Reservation::spent()), // n = 0
            Queued::Ready(Some(id)) | Queued::Waiting(id) => id,
        };
        // Until the waiter hands it over, a drop cancels through it.
        self.wait(id, None, Grant::Hold).await?;
        Ok(Reservation::held(Arc::clone(self) as Arc<dyn Hold>, id))
    }

    async fn wait(
        &self,
        id: u64,
        max_wait: Option<Duration>,
        grant: Grant,
    ) -> Result<(), AcquireError> {
        let waiter = Waiter {
            engine: self,
            id,
            grant,
            done: false,
            sleep: None,
            timer: clock::TwoStep::default(),
        };
        // The turn was within `max_wait` when it was reserved; a later
        // `set_rate` may push it out, so the deadline still stands.
        match max_wait.and_then(|wait| clock::now().checked_add(wait)) {
            Some(deadline) => clock::timeout_at(deadline, waiter)
                .await
                .unwrap_or_else(|_| {
                    self.counters.refused();
                    Err(AcquireError::Timeout)
                }),
            None => waiter.await,
        }
    }

    /// Reserves `n` permits. A caller that may proceed at once gets
    /// `Ready` (with the id of its queue entry when it holds the permits);
    /// one that must wait gets the id of its place in the queue.
    fn enqueue(
        &self,
        n: u32,
        max_wait: Option<Duration>,
        grant: Grant,
    ) -> Result<Queued, AcquireError> {
        if self.is_closed() {
            return Err(AcquireError::Closed);
        }
        if n > self.capacity() {
            self.counters.refused();
            return Err(AcquireError::InsufficientCapacity);
        }
        if n == 0 {
            return Ok(Queued::Ready(None));
        }
        let max_wait = max_wait.map(|d| d.as_nanos());
        if grant == Grant::Spend {
            // Fast path, lock-free: proceed at once or fail at once.
            let now = self.cell.now_nanos();
            match self
                .cell
                .reserve(now, n, self.release, max_wait, Wait::Refuse)
            {
                Reserve::WouldWait => {}
                outcome => return self.settle(n, &outcome).map(|()| Queued::Ready(None)),
            }
        }
        // Slow path: reserve under the lock, so that queue order is
        // reservation order. Held permits always take a place in the queue,
        // so that giving them back moves the right reservations forward.
        let mut queue = self.lock();
        // Read the clock under the lock: time may have passed while waiting
        // for it, and a stale `now` overstates the water (a shaper would
        // overflow wrongly).
        let now = self.cell.now_nanos();
        let outcome = self
            .cell
            .reserve(now, n, self.release, max_wait, Wait::Queue);
        match outcome {
            Reserve::Queued(r) => {
                let (id, first) = queue.push(n, r.end, grant);
                drop(queue);
                tracing::trace!(limiter = self.kind.name(), n, id, "queued");
                if first {
                    self.wake_actor();
                }
                Ok(Queued::Waiting(id))
            }
            Reserve::Ready(r) if grant == Grant::Hold => {
                let id = queue.push_granted(n, r.end);
                drop(queue);
                tracing::trace!(limiter = self.kind.name(), n, id, "reserved");
                Ok(Queued::Ready(Some(id)))
            }
            outcome => {
                drop(queue);
                self.settle(n, &outcome).map(|()| Queued::Ready(None))
            }
        }
    }

    /// A held reservation is spent: it leaves the queue for good.
    pub(crate) fn commit(&self, id: u64) {
        let n = self.lock().commit(id);
        self.counters.granted(n);
        tracing::trace!(limiter = self.kind.name(), id, n, "reservation committed");
    }

    /// Turns a decision that needs no queue into the caller's answer.
    fn settle(&self, n: u32, outcome: &Reserve) -> Result<(), AcquireError> {
        match outcome {
            Reserve::Ready(_) => {
                self.counters.granted(n);
                tracing::trace!(limiter = self.kind.name(), n, "granted");
                Ok(())
            }
            Reserve::Overflow => {
                self.counters.refused();
                tracing::debug!(limiter = self.kind.name(), n, "overflow: request discarded");
                Err(AcquireError::Overflow)
            }
            Reserve::TooLong => {
                self.counters.refused();
                Err(AcquireError::Timeout)
            }
            Reserve::Closed => Err(AcquireError::Closed),
            Reserve::WouldWait | Reserve::Queued(_) => {
                unreachable!("queued reservations are handled by the caller")
            }
        }
    }

    /// Polls waiter `id`: its answer, or (still pending) the instant of its
    /// turn, for waiters that keep their own timer. A waiter that holds its
    /// permits is counted as granted when committed, not here.
    fn poll_waiter(
        &self,
        id: u64,
        grant: Grant,
        waker: &Waker,
    ) -> Result<Result<(), AcquireError>, Instant> {
        let mut wakers = Vec::new();
        let outcome = {
            let mut queue = self.lock();
            let s = self.cell.snapshot();
            match queue.observe(id, &s.params, self.release, waker) {
                Ok(state) => Ok(state),
                Err(ready) => {
                    let now = s.params.scale_nanos(self.cell.now_nanos());
                    if ready <= now {
                        // Its turn has come, whether or not the actor has run.
                        queue.grant_due(&s.params, self.release, now, &self.cell, &mut wakers);
                        Ok(queue
                            .observe(id, &s.params, self.release, waker)
                            .unwrap_or((State::Pending, 0)))
                    } else {
                        Err(self.cell.instant_at(&s.params, ready))
                    }
                }
            }
        };
        wake_all(wakers);
        match outcome {
            Ok((State::Granted, n)) => {
                if grant == Grant::Spend {
                    self.counters.granted(n);
                }
                tracing::trace!(limiter = self.kind.name(), id, "granted after waiting");
                Ok(Ok(()))
            }
            Ok((State::Closed, _)) => Ok(Err(AcquireError::Closed)),
            Ok((State::Pending, _)) => Err(clock::now()),
            Err(at) => Err(at),
        }
    }

    /// Waiter `id` gave up (or its reservation was dropped): give back what
    /// it had reserved.
    pub(crate) fn cancel(&self, id: u64) {
        let mut wakers = Vec::new();
        {
            let mut queue = self.lock();
            let s = self.cell.snapshot();
            let now = s.params.scale_nanos(self.cell.now_nanos());
            let refund = queue.cancel(id, &s.params, now);
            if refund == 0 {
                return;
            }
            self.cell.refund(refund);
            tracing::trace!(
                limiter = self.kind.name(),
                id,
                "cancelled, reservation returned"
            );
            // Everyone behind moved forward: some may be due now, and the
            // timer (the actor's, or each waiter's own) must be re-armed.
            queue.grant_due(&s.params, self.release, now, &self.cell, &mut wakers);
            if !self.actor_running() {
                queue.wake_pending(&mut wakers);
            }
        }
        wake_all(wakers);
        self.wake_actor();
    }

    /// Fails every waiter and every later call with `Closed`.
    pub(crate) fn close(&self) {
        let mut wakers = Vec::new();
        {
            let mut queue = self.lock();
            if queue.closed {
                return;
            }
            self.cell.close();
            queue.close(&mut wakers);
        }
        tracing::debug!(limiter = self.kind.name(), waiters = wakers.len(), "closed");
        wake_all(wakers);
        self.wake_actor();
    }

    /// Changes the rate from now on; water already in the bucket (and the
    /// reservations of waiters) drains at the new rate.
    pub(crate) fn set_rate(&self, rate: Rate) -> Result<(), ConfigError> {
        let params = Params::new(rate, self.capacity())?;
        let mut wakers = Vec::new();
        {
            let mut queue = self.lock();
            let now = self.cell.now_nanos();
            self.cell
                .set_params(params, now, |old, new| queue.rescale(old, new, now));
            queue.rate = rate;
            let scaled = params.scale_nanos(now);
            queue.grant_due(&params, self.release, scaled, &self.cell, &mut wakers);
            if !self.actor_running() {
                queue.wake_pending(&mut wakers);
            }
        }
        tracing::debug!(limiter = self.kind.name(), %rate, "rate changed");
        wake_all(wakers);
        self.wake_actor();
        Ok(())
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        // The actor holds only a `Weak`; this wakes it to find it gone.
        self.wake_actor();
    }
}

impl Hold for Engine {
    fn commit(&self, id: u64) {
        Engine::commit(self, id);
    }

    fn cancel(&self, id: u64) {
        Engine::cancel(self, id);
    }
}

impl fmt::Debug for Engine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let queue = self.lock();
        f.debug_struct(self.kind.name())
            .field("rate", &queue.rate)
            .field("capacity", &self.capacity())
            .field("waiting", &queue.pending())
            .field("closed", &queue.closed)
            .finish_non_exhaustive()
    }
}

fn wake_all(wakers: Vec<Waker>) {
    for waker in wakers {
        waker.wake();
    }
}

/// Where [`Engine::enqueue`] left a request.
enum Queued {
    /// It may proceed now; `Some(id)` when it holds its permits in the
    /// queue.
    Ready(Option<u64>),
    /// It waits at this place in the queue.
    Waiting(u64),
}
