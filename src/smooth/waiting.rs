//! The waiting machinery both smooth handles share (to move onto the
//! bucket engine).

use std::collections::VecDeque;
use std::fmt;
use std::future::{Future, poll_fn};
use std::pin::Pin;
use std::pin::pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Poll, Waker};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::sync::futures::Notified;

use crate::algorithm::{SmoothState, Span};
use crate::cell::{CREDIT_GRACE, CREDIT_REACH};
use crate::reservation::{Hold, Reservation};
use crate::stats::{Counters, Stats};
use crate::{AcquireError, ConfigError, TryAcquireError, clock};

/// The state both handles share.
pub(super) struct Core {
    /// `smooth_bursty` or `smooth_warming_up` (tracing, `Debug`).
    kind: &'static str,
    /// Time zero of the state machine.
    origin: clock::Origin,
    inner: Mutex<Inner>,
    /// Set under the lock; read without it on the fast checks.
    closed: AtomicBool,
    /// The state's next free ticket, in nanoseconds since the origin
    /// (rounded up), published under the lock after every change: a
    /// `try_acquire` that comes before it owes, and is refused without the
    /// lock (see [`Core::try_acquire`]).
    next_free: AtomicU64,
    /// Wakes sleeping waiters on close.
    closing: Notify,
    counters: Counters,
}

struct Inner {
    state: SmoothState,
    /// The version of `state`: the number of the change that produced it.
    version: u64,
    /// The last version number handed out (versions are never reused).
    versions: u64,
    /// After a waiter woke late, arrivals before this time (since the
    /// origin) are taken as on time (see the module notes).
    credit_until: Duration,
    /// The reservations that can still be given back — sleeping waiters and
    /// held [`Reservation`]s — in reservation order (by version).
    live: VecDeque<Live>,
}

/// A reservation that can still be given back.
struct Live {
    /// The version its reservation produced: its key, in reservation order.
    version: u64,
    /// Where it lies on the time line (moved back when an earlier one is
    /// given back).
    span: Span,
    /// When its caller may go, since the origin (`None`: never).
    due: Option<Duration>,
    /// The sleeping waiter's task, woken when `due` moves.
    waker: Option<Waker>,
    /// `due` moved since the waiter last looked.
    moved: bool,
    /// A waiter sleeps on it (else it is a granted, held reservation).
    sleeping: bool,
}

impl Inner {
    /// The time to present to the state machine for an arrival at `now`:
    /// within the credit window, the next free ticket if it is earlier, but
    /// never more than [`CREDIT_REACH`] before `now`.
    fn arrival(&self, now: Duration) -> Duration {
        if now < self.credit_until {
            now.min(self.state.next_free())
                .max(now.saturating_sub(CREDIT_REACH))
        } else {
            now
        }
    }

    /// Records a change of state; returns the previous and the new version.
    fn changed(&mut self) -> (u64, u64) {
        let previous = self.version;
        self.versions += 1;
        self.version = self.versions;
        (previous, self.version)
    }

    /// The live reservation made with `version`.
    fn live(&mut self, version: u64) -> Option<&mut Live> {
        let i = self.find(version)?;
        self.live.get_mut(i)
    }

    fn find(&self, version: u64) -> Option<usize> {
        self.live
            .binary_search_by_key(&version, |live| live.version)
            .ok()
    }

    /// Forgets the live reservation made with `version` (spent, or closed).
    fn forget(&mut self, version: u64) -> Option<Live> {
        let i = self.find(version)?;
        self.live.remove(i)
    }
}

impl Core {
    pub(super) fn new(kind: &'static str, state: SmoothState) -> Core {
        Core {
            kind,
            origin: clock::Origin::now(),
            inner: Mutex::new(Inner {
                state,
                version: 0,
                versions: 0,
                credit_until: Duration::ZERO,
                live: VecDeque::new(),
            }),
            closed: AtomicBool::new(false),
            next_free: AtomicU64::new(0),
            closing: Notify::new(),
            counters: Counters::default(),
        }
    }

    /// The stable rate, in permits per second.
    pub(super) fn rate(&self) -> f64 {
        self.lock().state.rate()
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // Every update under the lock is a single assignment of a state
        // computed first, so a poisoned lock still holds a consistent state.
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Time since the origin on tokio's clock.
    fn now(&self) -> Duration {
        Duration::from_nanos(self.origin.elapsed_nanos())
    }

    pub(super) fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    pub(super) async fn acquire(
        &self,
        n: u32,
        timeout: Option<Duration>,
    ) -> Result<(), AcquireError> {
        // A plain acquire spends its claim once granted.
        if self.acquire_claim(n, timeout, false).await?.is_some() {
            self.counters.granted(n);
        }
        Ok(())
    }

    /// Waits for `n` permits and keeps them returnable: a dropped
    /// `Reservation` gives back the part of its cost not yet elapsed.
    pub(super) async fn reserve(self: &Arc<Core>, n: u32) -> Result<Reservation, AcquireError> {
        Ok(match self.acquire_claim(n, None, true).await? {
            Some(claim) => Reservation::held(
                Arc::new(Withdrawal {
                    core: Arc::clone(self),
                    n,
                    claim: Mutex::new(Some(claim)),
                }),
                0,
            ),
            None => Reservation::spent(),
        })
    }

    /// Reserves `n` permits and waits for them; returns the claim to give
    /// them back (`None` for `n = 0`). With `hold`, the reservation stays
    /// live after its turn, until the claim is spent or withdrawn.
    async fn acquire_claim(
        &self,
        n: u32,
        timeout: Option<Duration>,
        hold: bool,
    ) -> Result<Option<Claim>, AcquireError> {
        if self.is_closed() {
            return Err(AcquireError::Closed);
        }
        if n == 0 {
            return Ok(None);
        }
        // Created before the closed check under the lock: a `close()` after
        // that check wakes it (`notify_waiters` reaches every `Notified`
        // created before it, polled or not).
        let closing = pin!(self.closing.notified());
        let mut withdraw = {
            let mut inner = self.lock();
            if self.is_closed() {
                return Err(AcquireError::Closed);
            }
            let now = self.now();
            let at = inner.arrival(now);
            let before = inner.state.clone();
            let (wait, span) = match timeout {
                None => inner.state.reserve_span(at, n),
                Some(timeout) => {
                    // The timeout counts from `now`, not from `at`.
                    let slack = timeout.saturating_add(now.saturating_sub(at));
                    let Some(reserved) = inner.state.try_reserve_span(at, n, slack) else {
                        drop(inner);
                        self.counters.refused();
                        tracing::trace!(limiter = self.kind, n, ?timeout, "timed out at once");
                        return Err(AcquireError::Timeout);
                    };
                    reserved
                }
            };
            let (previous, version) = inner.changed();
            self.publish(&inner);
            let claim = Claim {
                version,
                previous,
                before,
            };
            // `None`: beyond `Duration::MAX`, never due.
            let due = at.checked_add(wait);
            let ready = due.is_some_and(|due| due <= now);
            if !ready || hold {
                inner.live.push_back(Live {
                    version,
                    span,
                    due,
                    waker: None,
                    moved: false,
                    sleeping: !ready,
                });
            }
            if ready {
                tracing::trace!(limiter = self.kind, n, "granted");
                return Ok(Some(claim));
            }
            tracing::trace!(limiter = self.kind, n, ?wait, "reserved, waiting");
            Withdraw {
                core: self,
                claim: Some(claim),
            }
        };
        let version = withdraw.version();
        let woke = self.sleep(version, closing).await;
        let claim = withdraw.claim.take();
        let mut inner = self.lock();
        let due = if woke && hold {
            inner.live(version).and_then(|live| {
                live.sleeping = false;
                live.waker = None;
                live.due
            })
        } else {
            inner.forget(version).and_then(|live| live.due)
        };
        if !woke || self.is_closed() {
            return Err(AcquireError::Closed);
        }
        let now = self.now();
        if let Some(due) = due.filter(|&due| now > due) {
            // Late on the timer: see the module notes.
            inner.credit_until = inner.credit_until.max(now.saturating_add(CREDIT_GRACE));
            drop(inner);
            tracing::trace!(limiter = self.kind, n, late = ?now.saturating_sub(due), "granted after waiting");
        } else {
            drop(inner);
            tracing::trace!(limiter = self.kind, n, "granted after waiting");
        }
        Ok(claim)
    }

    /// Sleeps until the live reservation `version` is due, following its
    /// turn as earlier reservations are given back. `false` when the
    /// limiter was closed.
    async fn sleep(&self, version: u64, mut closing: Pin<&mut Notified<'_>>) -> bool {
        enum Woke {
            Due,
            Moved,
            Closed,
        }
        let mut timer = pin!(clock::sleep_until(self.origin.instant()));
        let mut two_step = clock::TwoStep::default();
        loop {
            let due = {
                let mut inner = self.lock();
                let Some(live) = inner.live(version) else {
                    return false; // closed
                };
                live.moved = false;
                live.due
            };
            if due.is_some_and(|due| due <= self.now()) {
                return true;
            }
            // `None`: never due; only a close or a move ends the wait. Armed
            // in two steps, as the bucket limiters' timers ([`clock::TwoStep`]).
            let turn = due.and_then(|due| self.origin.instant().checked_add(due));
            let (deadline, early) = match turn {
                Some(turn) => {
                    let (deadline, early) = two_step.deadline(turn);
                    timer.as_mut().reset(deadline);
                    (Some(deadline), early)
                }
                None => (None, false),
            };
            let woke = poll_fn(|cx| {
                if closing.as_mut().poll(cx).is_ready() {
                    return Poll::Ready(Woke::Closed);
                }
                if deadline.is_some() && timer.as_mut().poll(cx).is_ready() {
                    return Poll::Ready(Woke::Due);
                }
                let mut inner = self.lock();
                match inner.live(version) {
                    None => Poll::Ready(Woke::Closed),
                    Some(live) if live.moved => Poll::Ready(Woke::Moved),
                    Some(live) => {
                        if !live.waker.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
                            live.waker = Some(cx.waker().clone());
                        }
                        Poll::Pending
                    }
                }
            })
            .await;
            match woke {
                Woke::Due => match turn {
                    Some(turn) if early => two_step.fired(turn, early),
                    _ => return true,
                },
                Woke::Closed => return false,
                Woke::Moved => {}
            }
        }
    }

    pub(super) fn try_acquire(&self, n: u32) -> Result<(), TryAcquireError> {
        if self.is_closed() {
            return Err(TryAcquireError::Closed);
        }
        if n == 0 {
            return Ok(());
        }
        let now = self.now();
        // A caller that comes before the next free ticket owes: refused
        // without the lock, with what the locked path would say (the ticket
        // is after `now`, so after the arrival time too, which is never
        // later). A ticket published a moment ago or about to move back
        // reads as a refusal just before or after that change.
        let owed = Duration::from_nanos(self.next_free.load(Ordering::Acquire));
        if owed > now {
            return self.refuse(n, owed.saturating_sub(now));
        }
        let mut inner = self.lock();
        if self.is_closed() {
            return Err(TryAcquireError::Closed);
        }
        let at = inner.arrival(now);
        if inner
            .state
            .try_reserve(at, n, now.saturating_sub(at))
            .is_some()
        {
            inner.changed();
            self.publish(&inner);
            drop(inner);
            self.counters.granted(n);
            tracing::trace!(limiter = self.kind, n, "granted");
            Ok(())
        } else {
            let retry_after = inner.state.next_free().saturating_sub(now);
            drop(inner);
            self.refuse(n, retry_after)
        }
    }

    fn refuse(&self, n: u32, retry_after: Duration) -> Result<(), TryAcquireError> {
        self.counters.refused();
        tracing::trace!(limiter = self.kind, n, ?retry_after, "limited");
        Err(TryAcquireError::Limited { retry_after })
    }

    /// Publishes the state's next free ticket for the lock-free refusals;
    /// called under the lock after every change of the state.
    fn publish(&self, inner: &Inner) {
        self.next_free
            .store(inner.state.next_free_nanos(), Ordering::Release);
    }

    pub(super) fn set_rate(&self, permits_per_second: f64) -> Result<(), ConfigError> {
        let mut inner = self.lock();
        let now = self.now();
        let at = inner.arrival(now);
        inner.state.set_rate(at, permits_per_second)?;
        inner.changed();
        self.publish(&inner);
        drop(inner);
        tracing::debug!(limiter = self.kind, permits_per_second, "rate changed");
        Ok(())
    }

    pub(super) fn close(&self) {
        {
            let mut inner = self.lock();
            if self.closed.swap(true, Ordering::AcqRel) {
                return;
            }
            // Nothing is given back any more.
            inner.live.clear();
        }
        self.closing.notify_waiters();
        tracing::debug!(limiter = self.kind, "closed");
    }

    pub(super) fn is_fresh(&self) -> bool {
        let inner = self.lock();
        let now = self.now();
        if self.is_closed() || now < inner.credit_until || inner.state.next_free() > now {
            return false;
        }
        // A new limiter starts cold (warm-up) or empty (bursty).
        let fresh = if inner.state.warmup().is_some() {
            inner.state.max_permits()
        } else {
            0.0
        };
        // Exact on purpose: resync caps at `max_permits` itself.
        #[expect(
            clippy::float_cmp,
            reason = "exact on purpose: resync caps at `max_permits` itself"
        )]
        let same = inner.state.stored_permits(now) == fresh;
        same
    }

    pub(super) fn stored_permits(&self) -> f64 {
        let inner = self.lock();
        inner.state.stored_permits(inner.arrival(self.now()))
    }

    /// Counters and the state now.
    pub(super) fn stats(&self) -> Stats {
        let (granted, refused) = self.counters.totals();
        Stats {
            granted,
            refused,
            waiting: self.lock().live.iter().filter(|live| live.sleeping).count(),
            available: None,
        }
    }

    /// A reservation given up (its waiter dropped, or its `Reservation`
    /// dropped uncommitted). If it is still the latest change to the
    /// limiter, the state before it is put back, exactly as if it had never
    /// arrived. Otherwise the part of its cost not yet elapsed is given back
    /// (`SmoothState::give_back`) and every reservation after it moves
    /// forward by as much (see the module notes).
    fn withdraw(&self, claim: Claim) {
        let mut wakers = Vec::new();
        {
            let mut inner = self.lock();
            // Gone: the limiter was closed.
            let Some(live) = inner.forget(claim.version) else {
                return;
            };
            if inner.version == claim.version {
                inner.state = claim.before;
                inner.version = claim.previous;
                self.publish(&inner);
                drop(inner);
                tracing::trace!(limiter = self.kind, "cancelled: reservation withdrawn");
                return;
            }
            let now = self.now();
            let given = inner.state.give_back(now, live.span);
            self.publish(&inner);
            // Picoseconds; whole nanoseconds off the waiters' due times
            // (never earlier than their turn).
            let shift = Duration::from_nanos(u64::try_from(given / 1000).unwrap_or(u64::MAX));
            if given > 0 {
                inner.changed();
                let after = inner.live.partition_point(|l| l.version < claim.version);
                for later in inner.live.range_mut(after..) {
                    later.span = later.span.shift(given);
                    later.due = later.due.map(|due| due.saturating_sub(shift));
                    later.moved = true;
                    wakers.extend(later.waker.take());
                }
            }
            drop(inner);
            tracing::trace!(limiter = self.kind, given_back = ?shift, "cancelled: unused cost given back");
        }
        for waker in wakers {
            waker.wake();
        }
    }

    /// A held reservation spent: it can no longer be given back.
    fn spend(&self, claim: &Claim) {
        self.lock().forget(claim.version);
    }
}

impl fmt::Debug for Core {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let inner = self.lock();
        let now = inner.arrival(self.now());
        f.debug_struct(self.kind)
            .field("rate", &inner.state.rate())
            .field("stored_permits", &inner.state.stored_permits(now))
            .field("max_permits", &inner.state.max_permits())
            .field("next_free", &inner.state.next_free())
            .field("closed", &self.is_closed())
            .finish_non_exhaustive()
    }
}

/// What it takes to withdraw a reservation: the state before it, valid
/// while the limiter is still at the version the reservation produced.
struct Claim {
    /// The version its reservation produced.
    version: u64,
    /// The version before it.
    previous: u64,
    /// The state before it.
    before: SmoothState,
}

/// A sleeping waiter's claim, withdrawn if the waiter is dropped.
struct Withdraw<'a> {
    core: &'a Core,
    /// `None` once the waiter is done.
    claim: Option<Claim>,
}

impl Withdraw<'_> {
    fn version(&self) -> u64 {
        self.claim.as_ref().map_or(0, |claim| claim.version)
    }
}

impl Drop for Withdraw<'_> {
    fn drop(&mut self) {
        if let Some(claim) = self.claim.take() {
            self.core.withdraw(claim);
        }
    }
}

/// A granted reservation held by a [`Reservation`]: given back when
/// dropped uncommitted (see [`Core::withdraw`]). Its claim is not an entry
/// in a queue that an id could name, so each reservation is a holder of
/// its own, and the id is unused.
struct Withdrawal {
    core: Arc<Core>,
    n: u32,
    /// Taken by the one `commit` or `cancel` a reservation makes.
    claim: Mutex<Option<Claim>>,
}

impl Withdrawal {
    fn take(&self) -> Option<Claim> {
        self.claim
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
    }
}

impl Hold for Withdrawal {
    fn commit(&self, _: u64) {
        if let Some(claim) = self.take() {
            self.core.spend(&claim);
        }
        self.core.counters.granted(self.n);
    }

    fn cancel(&self, _: u64) {
        if let Some(claim) = self.take() {
            self.core.withdraw(claim);
        }
    }
}
