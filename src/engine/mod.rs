//! The waiting engine every waiting limiter sits on.
//!
//! A limiter family supplies a [`Schedule`]: the arithmetic that decides
//! when each request's permits are due and what a withdrawn request gives
//! back. The engine supplies everything about waiting, once: the FIFO
//! [`Queue`] of entries behind a mutex, the future of a queued `acquire`,
//! cancellation (give back, move the ones behind forward), close, holding
//! permits for a [`Reservation`], and the timers. tokio's `batch_semaphore`
//! under its `Semaphore`, `Mutex` and `mpsc` is the model.
//!
//! Two schedules exist: [`Bucket`] over the lock-free GCRA cell (the token
//! bucket, the leaky bucket, the funnel) and `smooth::Smooth` over Guava's
//! `SmoothState` (`SmoothBursty`, `SmoothWarmingUp`).
//!
//! # Words
//!
//! * A request's **turn** is the instant its permits are due; the schedule
//!   keeps, per request, where it lies on its time line ([`Schedule::Turn`]).
//! * A **reservation** is what a request takes from the schedule when it
//!   arrives: its place on that time line ([`Reserve`] is the schedule's
//!   answer). A reservation that must wait, or whose permits are held,
//!   becomes an **entry** in the [`Queue`], named by its id; its **waiter**
//!   is the future polling it.
//! * An entry is **granted** when its turn comes; [`Grant`] says whether
//!   its permits are then spent (`acquire`) or held until a
//!   [`Reservation`] commits or drops them (`reserve`).
//! * **Withdrawing** an entry (its waiter dropped, its reservation dropped)
//!   gives back what it had not used and moves every later entry forward
//!   by as much.
//! * **Waking** is how waiters learn their turn came ([`Waking`]): the
//!   bucket's background **actor** (one timer for the whole queue), or each
//!   waiter's own timer.
//!
//! Lock order: the queue lock, then whatever the schedule keeps outside it
//! (the cell is lock-free). The uncontended fast paths never take the lock.
//!
//! Files: this one holds [`Engine`] (deciding, queueing, withdrawing,
//! closing) and the [`Schedule`] seam; `queue.rs` the entries; `waiter.rs`
//! the future of a queued `acquire`; `actor.rs` the background actor;
//! `bucket.rs` the schedule over the GCRA cell.

mod actor;
mod bands;
mod bucket;
mod buckets;
mod published;
mod queue;
mod waiter;

use std::fmt;
use std::future::poll_fn;
use std::pin::pin;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::task::{Poll, Waker};
use std::time::Duration;

use tokio::time::Instant;

pub(crate) use crate::algorithm::Reserve;
use crate::algorithm::{Release, Taken};
use crate::meter::{Publish, Refusal};
use crate::reservation::{Hold, Reservation};
use crate::stats::{self, Stats, Stripe};
use crate::{AcquireError, TryAcquireError, clock};
pub(crate) use bands::Banded;
#[cfg(test)]
pub(crate) use bucket::Configured;
#[cfg(test)]
pub(crate) use bucket::Turn;
pub(crate) use bucket::{Bucket, Setup};
pub(crate) use buckets::BucketEngine;
pub(crate) use queue::{Grant, Queue};

/// Which limiter an engine serves (for tracing and `Debug`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    TokenBucket,
    LeakyBucket,
    Funnel,
    SmoothBursty,
    SmoothWarmingUp,
}

impl Kind {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Kind::TokenBucket => "token_bucket",
            Kind::LeakyBucket => "leaky_bucket",
            Kind::Funnel => "funnel",
            Kind::SmoothBursty => "smooth_bursty",
            Kind::SmoothWarmingUp => "smooth_warming_up",
        }
    }
}

/// The arithmetic of one family of limiters, as the engine needs it. Every
/// method but [`try_take`](Schedule::try_take) and
/// [`reserve_unlocked`](Schedule::reserve_unlocked) runs under the engine's
/// lock.
///
/// The engine grants entries in queue order and stops at the first one not
/// due, so the turns of the entries must never decrease along the queue;
/// [`follow`](Schedule::follow) is where a schedule whose rounding could
/// break that keeps it.
pub(crate) trait Schedule: Sized + Send + Sync + 'static {
    /// Where one entry lies on the schedule's time line.
    type Turn: Send;
    /// The part of the schedule kept under the engine's lock.
    type Books: Send;
    /// The schedule and the clock read once, for one pass under the lock.
    type View;
    /// Padding the engine puts between its first counter stripe and its
    /// lock (`()` for none): room a schedule's layout wants there (see
    /// [`Engine`]'s layout).
    type Gap: Default + Send + Sync;

    /// The most permits one request may take (`u32::MAX`: no limit).
    fn capacity(&self) -> u32;
    fn is_closed(&self) -> bool;
    /// Refuses every later reservation (under the lock).
    fn close(&self);

    /// The meter (`try_acquire` with `1 <= n <= capacity`): takes `n` now,
    /// or says how long until it could, or that the limiter is closed.
    fn try_take(engine: &Engine<Self>, n: u32) -> Taken;
    /// [`try_take`](Schedule::try_take) when it can answer without a
    /// call; `None`: ask `try_take`.
    #[inline]
    fn try_take_leaf(engine: &Engine<Self>, n: u32) -> Option<Taken> {
        Some(Self::try_take(engine, n))
    }
    /// The lock-free decision of an `acquire` that need not wait: `None`
    /// when it would have to (or the schedule decides only under the lock).
    fn reserve_unlocked(
        &self,
        n: u32,
        max_wait: Option<Duration>,
        waits: Waits,
    ) -> Option<Reserve<()>>;
    /// Reserves `n` permits (`1 <= n <= capacity`) at the current time.
    fn reserve(
        &self,
        books: &mut Self::Books,
        n: u32,
        max_wait: Option<Duration>,
        waits: Waits,
    ) -> Reserve<Self::Turn>;
    /// Keeps a new entry's turn no earlier than the turn of the entry ahead
    /// of it.
    fn follow(&self, turn: &mut Self::Turn, ahead: &Self::Turn);

    fn view(&self, books: &Self::Books) -> Self::View;
    /// Whether the turn of an entry of `n` permits has come.
    fn is_due(&self, view: &Self::View, turn: &Self::Turn, n: u32) -> bool;
    /// The instant of that turn, for a timer (`None`: never).
    fn instant(&self, view: &Self::View, turn: &Self::Turn, n: u32) -> Option<Instant>;
    /// A due entry is granted at the view's time (one released late
    /// credits the requests that follow it at once, see the cell's
    /// `arrival`).
    fn granted(&self, books: &mut Self::Books, view: &Self::View, turn: &Self::Turn, n: u32);
    /// Gives back what a withdrawn entry of `n` permits had not used and
    /// moves the entries `behind` it forward by as much; returns whether
    /// they moved.
    fn withdraw<'a>(
        &self,
        books: &mut Self::Books,
        view: &Self::View,
        turn: Self::Turn,
        n: u32,
        behind: impl Iterator<Item = &'a mut Self::Turn>,
    ) -> bool;

    /// Whether nothing distinguishes the schedule from a newly built one
    /// (the queue is empty and open).
    fn is_fresh(&self, books: &Self::Books) -> bool;
    /// Whole permits available now, for [`Stats`] (`None`: not a bucket).
    fn available(&self, books: &Self::Books) -> Option<u32>;
    /// The schedule's fields of the limiter's `Debug`.
    fn debug_fields(&self, books: &Self::Books, f: &mut fmt::DebugStruct<'_, '_>);
}

/// How a request waits for its permits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Waits {
    /// By the limiter's own rule: for a leaky bucket's shaper, behind the
    /// water ahead of it, and not at all (`Overflow`) if it does not fit.
    AsBuilt,
    /// In the queue until it fits in the bucket (the token rule), whatever
    /// the limiter's own rule: a leaky bucket's request for room, which
    /// never overflows and which later requests cannot overtake.
    ForRoom,
}

impl Waits {
    /// The release rule of a request on a bucket whose own rule is `own`.
    pub(crate) fn rule(self, own: Release) -> Release {
        match self {
            Waits::AsBuilt => own,
            Waits::ForRoom => Release::Tokens,
        }
    }
}

/// How the waiters of an engine learn that their turn came.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Waking {
    /// A background actor keeps one timer for the whole queue while someone
    /// waits (and each waiter keeps its own should the actor panic).
    Actor,
    /// Each waiter keeps its own timer: nothing is spawned.
    OwnTimers,
}

/// One limiter: its schedule, its waiters, and how they are woken.
///
/// # Layout
///
/// An idle bucket is this and nothing else (no task, no queue), so it is
/// laid out by hand (`repr(C)`), for size and for two threads: what every
/// `try_acquire` reads (the cell's word and interval, at the start of the
/// schedule) and the two counter stripes (one written by each thread) must
/// sit on three different cache lines, or a thread that is refused would
/// make the other miss on every call. Padding each to a line would cost
/// 256 bytes and an over-aligned allocation; instead the cold fields (the
/// rest of the schedule, the queue's lock) are placed between them, far
/// enough apart that no 16-byte-aligned allocation puts two of the three
/// on one line. `layout_tests` checks the offsets.
///
/// The other schedules (the bands, the smooth limiters) are over-aligned to
/// a line, so their engines start on one. A smooth limiter's every grant
/// takes the lock and writes the books behind it, so on two threads that
/// line moves between the cores on every call; the [`Schedule::Gap`]
/// keeps the first stripe alone on its line, ahead of the lock, so that
/// the lock word and the books a grant touches take the next two lines and
/// nothing else (the second stripe shares the last line with the books'
/// cold end). `smooth::schedule::layout_tests` checks that.
#[repr(C)]
pub(crate) struct Engine<S: Schedule> {
    schedule: S,
    /// The counters of the threads on the first stripe.
    stripe_a: Stripe,
    /// The schedule's room between the stripe and the lock.
    gap: S::Gap,
    queue: Mutex<Queue<S>>,
    kind: Kind,
    waking: Waking,
    /// What a named limiter records through the `metrics` facade (nothing
    /// and no bytes without the feature).
    meter: crate::meter::Slot,
    /// The counters of the threads on the second stripe.
    stripe_b: Stripe,
}

/// A named limiter's grants reach the recorder from its permit counter
/// (see `crate::meter`).
impl<S: Schedule> Publish for Engine<S> {
    fn publish(&self) {
        self.meter
            .publish(stats::totals(&self.stripe_a, &self.stripe_b));
    }
}

/// A named limiter's last grants are published as it goes.
impl<S: Schedule> Drop for Engine<S> {
    fn drop(&mut self) {
        if self.meter.is_on() {
            self.publish();
        }
    }
}

impl<S: Schedule> Engine<S> {
    /// Builds the engine. Nothing is spawned: an actor, if `waking` says
    /// so, is started by the first waiter (see `actor.rs`).
    pub(crate) fn new(
        kind: Kind,
        schedule: S,
        books: S::Books,
        waking: Waking,
        meter: crate::meter::Slot,
    ) -> Arc<Engine<S>> {
        let engine = Arc::new(Engine {
            schedule,
            queue: Mutex::new(Queue::new(books)),
            kind,
            waking,
            meter,
            stripe_a: Stripe::default(),
            gap: S::Gap::default(),
            stripe_b: Stripe::default(),
        });
        let owner: Weak<dyn Publish> = Arc::downgrade(&engine) as Weak<dyn Publish>;
        engine.meter.register(owner);
        engine
    }

    /// The waking of an engine that asks for an actor: its builder must be
    /// inside a runtime (the documented contract, though the actor starts
    /// only with the first waiter, on that waiter's runtime).
    pub(crate) fn waking(actor: bool) -> Result<Waking, crate::ConfigError> {
        if !actor {
            return Ok(Waking::OwnTimers);
        }
        tokio::runtime::Handle::try_current()
            .map(|_| Waking::Actor)
            .map_err(|_| crate::ConfigError::NoRuntime)
    }

    /// Where the stripes, the lock and the books lie: byte offsets from
    /// the engine's start (for the schedules' layout tests).
    #[cfg(test)]
    pub(crate) fn offsets(&self) -> layout_tests::Offsets {
        let at = |field: usize| field - std::ptr::from_ref(self) as usize;
        layout_tests::Offsets {
            stripe_a: std::mem::offset_of!(Engine<S>, stripe_a),
            stripe_b: std::mem::offset_of!(Engine<S>, stripe_b),
            lock: std::mem::offset_of!(Engine<S>, queue),
            books: at(std::ptr::from_ref(&self.lock().books) as usize),
        }
    }

    /// The calling thread's counters.
    #[inline]
    fn counts(&self) -> &Stripe {
        stats::pick(&self.stripe_a, &self.stripe_b)
    }

    pub(crate) fn kind(&self) -> Kind {
        self.kind
    }

    pub(crate) fn schedule(&self) -> &S {
        &self.schedule
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, Queue<S>> {
        // A panic under the lock leaves the queue consistent (every update
        // is a single step), so a poisoned lock is still usable.
        self.queue.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(crate) fn capacity(&self) -> u32 {
        self.schedule.capacity()
    }

    pub(crate) fn is_closed(&self) -> bool {
        self.schedule.is_closed()
    }

    /// Waiters whose turn has not come.
    pub(crate) fn waiting(&self) -> usize {
        let queue = self.lock();
        let view = self.schedule.view(&queue.books);
        queue.not_due(&self.schedule, &view)
    }

    /// Counters and the state now.
    pub(crate) fn stats(&self) -> Stats {
        let (granted, refused) = stats::totals(&self.stripe_a, &self.stripe_b);
        let queue = self.lock();
        let view = self.schedule.view(&queue.books);
        Stats {
            granted,
            refused,
            waiting: queue.not_due(&self.schedule, &view),
            available: self.schedule.available(&queue.books),
        }
    }

    /// Whether the limiter is in exactly the state of a newly built one:
    /// open, nobody in the queue, and a schedule as new.
    pub(crate) fn is_fresh(&self) -> bool {
        let queue = self.lock();
        !queue.closed && queue.is_empty() && self.schedule.is_fresh(&queue.books)
    }

    /// The meter: `n` permits now or a refusal with the exact wait.
    ///
    /// The hot path of every limiter, kept small: one range check for `n`,
    /// the schedule's decision, a counter, and the traces out of line
    /// behind their level check (the `trace!` calls' frames and spills
    /// would otherwise be paid on every call). A schedule that can decide
    /// without a call (the buckets, on the fast clock: see
    /// [`Schedule::try_take_leaf`]) does; anything else goes out of line,
    /// so that the common path saves no registers for a call it does not
    /// make.
    #[inline]
    pub(crate) fn try_acquire(&self, n: u32) -> Result<(), TryAcquireError> {
        // 1..=capacity in one comparison (0 wraps above any capacity).
        if n.wrapping_sub(1) >= self.capacity() {
            return self.try_acquire_edge(n);
        }
        match S::try_take_leaf(self, n) {
            Some(taken) => self.answer_taken(n, taken),
            None => self.try_acquire_slow(n),
        }
    }

    /// [`try_acquire`](Self::try_acquire) when the schedule's leaf path
    /// did not answer: out of line, so that the leaf path keeps nothing
    /// live across a call.
    #[inline(never)]
    fn try_acquire_slow(&self, n: u32) -> Result<(), TryAcquireError> {
        self.answer_taken(n, S::try_take(self, n))
    }

    /// Counts and traces what the schedule answered. The trace of a
    /// refusal returns the answer itself, so that nothing is live across
    /// its call.
    #[inline]
    fn answer_taken(&self, n: u32, taken: Taken) -> Result<(), TryAcquireError> {
        match taken {
            Taken::Granted => {
                self.meter.granted(n, |n| self.counts().granted(n));
                if tracing::enabled!(tracing::Level::TRACE) {
                    self.trace_granted(n);
                }
                Ok(())
            }
            Taken::Limited(retry_after) => {
                self.meter
                    .refused(Refusal::Limited, || self.counts().refused());
                if tracing::enabled!(tracing::Level::TRACE) {
                    return self.trace_limited(n, retry_after);
                }
                Err(TryAcquireError::Limited { retry_after })
            }
            Taken::Closed => Err(TryAcquireError::Closed),
        }
    }

    /// [`try_acquire`](Self::try_acquire) for 0 permits or more than the
    /// capacity.
    #[cold]
    #[inline(never)]
    fn try_acquire_edge(&self, n: u32) -> Result<(), TryAcquireError> {
        if self.is_closed() {
            Err(TryAcquireError::Closed)
        } else if n == 0 {
            Ok(())
        } else {
            self.meter
                .refused(Refusal::TooLarge, || self.counts().refused());
            Err(TryAcquireError::InsufficientCapacity)
        }
    }

    #[cold]
    #[inline(never)]
    fn trace_granted(&self, n: u32) {
        tracing::trace!(limiter = self.kind.name(), n, "granted");
    }

    #[cold]
    #[inline(never)]
    fn trace_limited(&self, n: u32, retry_after: Duration) -> Result<(), TryAcquireError> {
        tracing::trace!(limiter = self.kind.name(), n, ?retry_after, "limited");
        Err(TryAcquireError::Limited { retry_after })
    }

    /// What [`try_acquire`](Self::try_acquire) would answer now for `n`,
    /// given whether it fits (`Err`: the wait until it would), without
    /// taking or counting anything.
    pub(crate) fn answer(
        &self,
        n: u32,
        fits: impl FnOnce() -> Result<(), Duration>,
    ) -> Result<(), TryAcquireError> {
        if self.is_closed() {
            Err(TryAcquireError::Closed)
        } else if n > self.capacity() {
            Err(TryAcquireError::InsufficientCapacity)
        } else if n == 0 {
            Ok(())
        } else {
            fits().map_err(|retry_after| TryAcquireError::Limited { retry_after })
        }
    }

    /// Waits for `n` permits, in turn; `max_wait` bounds the wait (`None`:
    /// no bound). Fails at once when the turn would come too late.
    pub(crate) async fn acquire(
        self: &Arc<Self>,
        n: u32,
        max_wait: Option<Duration>,
    ) -> Result<(), AcquireError> {
        self.acquire_waiting(n, max_wait, Waits::AsBuilt).await
    }

    /// Waits for `n` permits, in turn, as `waits` says.
    pub(crate) async fn acquire_waiting(
        self: &Arc<Self>,
        n: u32,
        max_wait: Option<Duration>,
        waits: Waits,
    ) -> Result<(), AcquireError> {
        // `Duration::MAX` never times out, however far the turn (a wait
        // can exceed it: 2⁹⁶ ns at the slowest rate and the largest
        // capacity).
        let max_wait = max_wait.filter(|&wait| wait != Duration::MAX);
        match self.enqueue(n, max_wait, Grant::Spend, waits)? {
            Queued::Ready(_) => Ok(()),
            Queued::Waiting(id) => {
                let _metered = crate::meter::Waiter::start(&self.meter);
                self.wait(id, max_wait, Grant::Spend).await
            }
        }
    }

    /// Waits for `n` permits like [`acquire`](Self::acquire), but holds them
    /// in the queue until the reservation is committed or dropped.
    pub(crate) async fn reserve(self: &Arc<Self>, n: u32) -> Result<Reservation, AcquireError> {
        let (id, queued) = match self.enqueue(n, None, Grant::Hold, Waits::AsBuilt)? {
            Queued::Ready(None) => return Ok(Reservation::spent()), // n = 0
            Queued::Ready(Some(id)) => (id, false),
            Queued::Waiting(id) => (id, true),
        };
        let _metered = queued.then(|| crate::meter::Waiter::start(&self.meter));
        // Until the waiter hands it over, a drop withdraws through it.
        self.wait(id, None, Grant::Hold).await?;
        Ok(Reservation::held(Arc::clone(self) as Arc<dyn Hold>, id))
    }

    async fn wait(
        self: &Arc<Self>,
        id: u64,
        max_wait: Option<Duration>,
        grant: Grant,
    ) -> Result<(), AcquireError> {
        let waiter = self.wait_turn(id, grant);
        // The turn was within `max_wait` when it was reserved; a later
        // `set_rate` may push it out, so the deadline still stands.
        let Some(deadline) = max_wait.and_then(|wait| clock::now().checked_add(wait)) else {
            return waiter.await;
        };
        // Once the deadline's timer has fired, the turn decides: a waiter
        // whose turn is after the deadline times out, even when that turn
        // had also come by the timer's tick (a rate change moved it past the
        // deadline by less than a tick); one whose turn came by the
        // deadline goes. (Dropped, the waiter withdraws its entry.)
        let mut waiter = pin!(waiter);
        let mut timer = pin!(clock::sleep_until(deadline));
        poll_fn(|cx| {
            if timer.as_mut().poll(cx).is_ready() && self.turn_after(id, deadline) {
                self.meter
                    .refused(Refusal::Timeout, || self.counts().refused());
                return Poll::Ready(Err(AcquireError::Timeout));
            }
            waiter.as_mut().poll(cx)
        })
        .await
    }

    /// Whether entry `id`'s turn is after `deadline` (or never comes); not
    /// when the entry has left the queue (its answer is the waiter's).
    fn turn_after(&self, id: u64, deadline: Instant) -> bool {
        let queue = self.lock();
        let Some((turn, n)) = queue.turn_of(id) else {
            return false;
        };
        let view = self.schedule.view(&queue.books);
        self.schedule
            .instant(&view, turn, n)
            .is_none_or(|at| at > deadline)
    }

    /// Reserves `n` permits. A caller that may proceed at once gets
    /// `Ready` (with the id of its queue entry when it holds the permits);
    /// one that must wait gets the id of its place in the queue.
    fn enqueue(
        &self,
        n: u32,
        max_wait: Option<Duration>,
        grant: Grant,
        waits: Waits,
    ) -> Result<Queued, AcquireError> {
        if self.is_closed() {
            return Err(AcquireError::Closed);
        }
        if n > self.capacity() {
            self.meter
                .refused(Refusal::TooLarge, || self.counts().refused());
            return Err(AcquireError::InsufficientCapacity);
        }
        if n == 0 {
            return Ok(Queued::Ready(None));
        }
        // A request for room takes the lock: it must see the queue.
        if grant == Grant::Spend && waits == Waits::AsBuilt {
            // Fast path, lock-free: proceed at once or fail at once.
            if let Some(outcome) = self.schedule.reserve_unlocked(n, max_wait, waits) {
                return self.settle(n, &outcome).map(|()| Queued::Ready(None));
            }
        }
        // Slow path: reserve under the lock, so that queue order is
        // reservation order. Held permits always take a place in the queue,
        // so that giving them back moves the right reservations forward.
        let mut queue = self.lock();
        let reserved = match self.schedule.reserve(&mut queue.books, n, max_wait, waits) {
            // A request for room that fits now still waits behind the
            // waiters ahead (a leaky bucket's shaped waiters wait for the
            // water ahead of them to drain, not for room).
            Reserve::Ready(turn) if waits == Waits::ForRoom && queue.has_pending() => {
                Reserve::Queued(turn)
            }
            reserved => reserved,
        };
        match reserved {
            Reserve::Queued(mut turn) => {
                if let Some(ahead) = queue.last() {
                    self.schedule.follow(&mut turn, ahead);
                }
                let (id, first) = queue.push(n, turn, grant);
                let mut wakers = Vec::new();
                if first {
                    // Its timer must be re-armed for the new head.
                    queue.wake_actor(&mut wakers);
                }
                drop(queue);
                wake_all(wakers);
                tracing::trace!(limiter = self.kind.name(), n, id, "queued");
                Ok(Queued::Waiting(id))
            }
            Reserve::Ready(turn) if grant == Grant::Hold => {
                let id = queue.push_granted(n, turn);
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
        self.meter.granted(n, |n| self.counts().granted(n));
        tracing::trace!(limiter = self.kind.name(), id, n, "reservation committed");
    }

    /// Turns a decision that needs no queue into the caller's answer.
    fn settle<T>(&self, n: u32, outcome: &Reserve<T>) -> Result<(), AcquireError> {
        match outcome {
            Reserve::Ready(_) => {
                self.meter.granted(n, |n| self.counts().granted(n));
                tracing::trace!(limiter = self.kind.name(), n, "granted");
                Ok(())
            }
            Reserve::Overflow => {
                self.meter
                    .refused(Refusal::Overflow, || self.counts().refused());
                tracing::debug!(limiter = self.kind.name(), n, "overflow: request discarded");
                Err(AcquireError::Overflow)
            }
            Reserve::TooLong => {
                self.meter
                    .refused(Refusal::Timeout, || self.counts().refused());
                Err(AcquireError::Timeout)
            }
            Reserve::Closed => Err(AcquireError::Closed),
            Reserve::WouldWait | Reserve::Queued(_) => {
                unreachable!("queued reservations are handled by the caller")
            }
        }
    }

    /// Waiter `id` gave up (or its reservation was dropped): give back what
    /// it had reserved.
    pub(crate) fn cancel(&self, id: u64) {
        let mut wakers = Vec::new();
        {
            let mut queue = self.lock();
            let view = self.schedule.view(&queue.books);
            let Some(behind) = queue.withdraw(id, &self.schedule, &view) else {
                return;
            };
            tracing::trace!(
                limiter = self.kind.name(),
                id,
                "cancelled, reservation returned"
            );
            // Everyone behind moved forward: some may be due now, and the
            // timer (the actor's, or each waiter's own) must be re-armed.
            queue.grant_due(&self.schedule, &view, &mut wakers, None);
            if queue.actor_running() {
                queue.wake_actor(&mut wakers);
            } else {
                queue.wake_pending(behind, &mut wakers);
            }
        }
        wake_all(wakers);
    }

    /// Fails every waiter and every later call with `Closed`.
    pub(crate) fn close(&self) {
        let mut wakers = Vec::new();
        let waiters;
        {
            let mut queue = self.lock();
            if queue.closed {
                return;
            }
            self.schedule.close();
            queue.close(&mut wakers);
            waiters = wakers.len();
            queue.wake_actor(&mut wakers);
        }
        tracing::debug!(limiter = self.kind.name(), waiters, "closed");
        wake_all(wakers);
    }

    /// Runs `change` on the schedule under the lock; if it says the turns
    /// of the entries moved, grants those now due and re-arms the timers.
    pub(crate) fn change<R>(&self, change: impl FnOnce(&S, &mut Queue<S>) -> (R, bool)) -> R {
        let mut wakers = Vec::new();
        let result = {
            let mut queue = self.lock();
            let (result, moved) = change(&self.schedule, &mut queue);
            if moved {
                let view = self.schedule.view(&queue.books);
                queue.grant_due(&self.schedule, &view, &mut wakers, None);
                if queue.actor_running() {
                    queue.wake_actor(&mut wakers);
                } else {
                    queue.wake_pending(0, &mut wakers);
                }
            }
            result
        };
        wake_all(wakers);
        result
    }
}

impl<S: Schedule> Hold for Engine<S> {
    fn commit(&self, id: u64) {
        Engine::commit(self, id);
    }

    fn cancel(&self, id: u64) {
        Engine::cancel(self, id);
    }
}

impl<S: Schedule> fmt::Debug for Engine<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let queue = self.lock();
        let mut d = f.debug_struct(self.kind.name());
        self.schedule.debug_fields(&queue.books, &mut d);
        d.field("waiting", &queue.pending())
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

#[cfg(test)]
mod layout_tests {
    use std::mem::{offset_of, size_of};

    use super::*;

    /// The cache lines bytes `[start, start + len)` of an allocation fall
    /// on, for an allocation `phase` bytes past a line boundary.
    fn lines(phase: usize, start: usize, len: usize) -> std::ops::RangeInclusive<usize> {
        (phase + start) / 64..=(phase + start + len - 1) / 64
    }

    fn apart(a: &std::ops::RangeInclusive<usize>, b: &std::ops::RangeInclusive<usize>) -> bool {
        a.end() < b.start() || b.end() < a.start()
    }

    /// An idle bucket's engine: 176 bytes, 192 with the `Arc`'s counts (a
    /// 208-byte chunk from glibc's malloc); what every `try_acquire`
    /// reads and each counter stripe on three different cache lines,
    /// wherever a 16-byte-aligned allocator puts it. (192 was the least
    /// that could when every call read 44 bytes, the 128-bit word's: trying
    /// every placement of a 44-byte region and two 16-byte ones behind the
    /// 16 bytes of counts, none that fits in less than 192 bytes kept the
    /// three apart at all four alignments. The narrow word's 40 bytes sit
    /// where those did.)
    #[test]
    fn a_bucket_engine_is_small_and_its_hot_fields_are_on_three_lines() {
        // `ArcInner`: two counts, then the engine.
        const COUNTS: usize = 16;
        // With the `metrics` feature, 8 bytes more for the meter's pointer
        // (a 224-byte chunk).
        let size = if cfg!(feature = "metrics") { 192 } else { 176 };
        assert_eq!(size_of::<Engine<Bucket>>(), size);
        assert_eq!(std::mem::align_of::<Engine<Bucket>>(), 16);
        // The cell's narrow word, interval, capacity and decoded origin.
        let hot = COUNTS + offset_of!(Engine<Bucket>, schedule);
        let hot_len = 40;
        let a = COUNTS + offset_of!(Engine<Bucket>, stripe_a);
        let b = COUNTS + offset_of!(Engine<Bucket>, stripe_b);
        let stripe = size_of::<Stripe>();
        for phase in [0, 16, 32, 48] {
            let (h, a, b) = (
                lines(phase, hot, hot_len),
                lines(phase, a, stripe),
                lines(phase, b, stripe),
            );
            assert!(
                apart(&h, &a) && apart(&h, &b) && apart(&a, &b),
                "{phase}: {h:?} {a:?} {b:?}"
            );
        }
    }

    /// Byte offsets in an engine, from [`Engine::offsets`].
    pub(crate) struct Offsets {
        pub(crate) stripe_a: usize,
        pub(crate) stripe_b: usize,
        /// The lock (its word, then the queue).
        pub(crate) lock: usize,
        pub(crate) books: usize,
    }

    /// The other schedules are aligned to a line: the first stripe starts
    /// one, and the second is on the next.
    #[test]
    fn the_other_engines_keep_their_stripes_off_the_schedule() {
        fn check<S: Schedule>() {
            let a = offset_of!(Engine<S>, stripe_a);
            let b = offset_of!(Engine<S>, stripe_b);
            assert_eq!(a % 64, 0);
            assert!(b / 64 > a / 64);
        }
        check::<Banded>();
        check::<crate::smooth::SmoothSchedule>();
    }
}
