//! The schedule of the smooth limiters: Guava's [`SmoothState`] behind the
//! engine's lock, with a lock-free refusal in front of it.
//!
//! An entry's turn is the instant Guava's `reserve` told it to wait until.
//! Each change of the state (a reservation, a rate change, a give-back)
//! gets a fresh version number, and an entry remembers what it changed in
//! the state (the stored permits and the next free ticket, as they were)
//! and the version it produced. Withdrawn while the limiter is still at
//! that version, the old state is put back, exactly as if it had never
//! arrived; otherwise the part of its cost not yet elapsed is given back
//! (`SmoothState::give_back`) and every entry after it moves forward by as
//! much (see the module notes of `smooth`).

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::time::Instant;

use crate::algorithm::{Reserve, SmoothState, Span, Taken, Undo};
use crate::cell::{CREDIT_GRACE, CREDIT_REACH};
use crate::engine::{Engine, Kind, Schedule, Waits, Waking};
use crate::{ConfigError, clock};

/// The lock-free part of a smooth limiter.
///
/// Aligned to a cache line, so the engine's first counter stripe, which
/// follows it, never shares the line its fast checks read (see
/// `engine::Engine`).
#[repr(align(64))]
pub(crate) struct Smooth {
    /// Time zero of the state machine.
    origin: clock::Origin,
    /// Set under the lock; read without it on the fast checks.
    closed: AtomicBool,
    /// The state's next free ticket when it is a debt, for the refusals
    /// without the lock (see [`Smooth::try_take`]).
    debt: Debt,
}

/// The state's next free ticket, published under the lock for the
/// refusals without it: a `try_acquire` that comes before it owes.
///
/// Two words on one line: the ticket (ns since the origin, rounded up; 0
/// for no debt) and the time of the change that published it (the clock
/// reading it was made at), stored before it, so that a caller that loads
/// the ticket sees that time or a later one (`loom_tests` checks it): a
/// refusal without the lock needs a reading at least as late. Through
/// `crate::sync`, for that model.
struct Debt {
    owed: crate::sync::AtomicU64,
    changed_at: crate::sync::AtomicU64,
}

impl Debt {
    fn new() -> Debt {
        Debt {
            owed: crate::sync::AtomicU64::new(0),
            changed_at: crate::sync::AtomicU64::new(0),
        }
    }

    /// Publishes `owed` (0: none), left by a change made at `now`; under
    /// the engine's lock. No debt after none writes nothing: the line the
    /// lock-free checks read then stays in every core's cache.
    #[inline]
    fn publish(&self, owed: u64, now: u64) {
        use crate::sync::Ordering::{Relaxed, Release};
        if owed == 0 && self.owed.load(Relaxed) == 0 {
            return;
        }
        self.changed_at.store(now, Relaxed);
        self.owed.store(owed, Release);
    }

    /// The debt published last (0: none).
    #[inline]
    fn owed(&self) -> u64 {
        self.owed.load(crate::sync::Ordering::Acquire)
    }

    /// The time of the change that left the debt [`owed`](Self::owed)
    /// returned (or of a later one), read after it.
    #[inline]
    fn changed_at(&self) -> u64 {
        self.changed_at.load(crate::sync::Ordering::Relaxed)
    }
}

/// What the engine puts between its first counter stripe and its lock: the
/// rest of the stripe's line, so that the lock word and the books a grant
/// writes start a line of their own (see `engine::Engine`).
#[derive(Default)]
pub(crate) struct Gap(#[expect(dead_code, reason = "padding: never read")] [u64; 6]);

/// The state machine and its versions, under the engine's lock.
///
/// What a grant touches first (`repr(C)`): the versions, the credit
/// window, then the state (its own hot fields first), so that they share
/// as few cache lines as they can with the engine's lock word before them
/// (see `engine::Engine`).
#[repr(C)]
pub(crate) struct Books {
    /// The version of `state`: the number of the change that produced it.
    version: u64,
    /// The last version number handed out (versions are never reused).
    versions: u64,
    /// After a waiter woke late, arrivals before this time (ns since the
    /// origin) are taken as on time (see the module notes of `smooth`).
    credit_until: u64,
    state: SmoothState,
}

/// Where an entry lies, and what it takes to withdraw it.
pub(crate) struct Turn {
    /// Its place on the time line (moved back when an earlier entry is
    /// given back).
    span: Span,
    /// When its caller may go, since the origin (`None`: never).
    due: Option<Duration>,
    /// The version its reservation produced.
    version: u64,
    /// The version before it.
    previous: u64,
    /// What it changed in the state, as it was before.
    before: Undo,
}

impl Books {
    /// The time to present to the state machine for an arrival at `now`:
    /// within the credit window, the next free ticket if it is earlier, but
    /// never more than [`CREDIT_REACH`] before `now`.
    fn arrival(&self, now: Duration) -> Duration {
        if nanos(now) < self.credit_until {
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
}

/// A lock-free refusal due within this much reads the clock again, in
/// order, before it refuses (see [`Smooth::try_take`]): a read out of order
/// runs ahead of the load it follows by at most a cache miss or so, far
/// less than this; the ordered read costs some tens of nanoseconds, paid
/// only by refusals this close to their turn.
const NEAR_NANOS: u64 = 1_000;

impl Smooth {
    /// Time since the origin on the limiter's clock.
    #[inline]
    fn now(&self) -> Duration {
        Duration::from_nanos(self.origin.elapsed_nanos())
    }

    /// Publishes the state's next free ticket for the lock-free refusals;
    /// called under the lock after every change of the state, made at
    /// `now` (ns since the origin).
    ///
    /// Only a debt is published: a ticket after `now`. A ticket at or
    /// before it (a grant that spent stored permits leaves it at the time
    /// of the grant) owes nothing to anyone who comes after the change.
    /// `now` is published too: a caller whose reading is earlier (stale)
    /// reads again before it refuses.
    fn publish(&self, books: &Books, now: u64) {
        let ticket = books.state.next_free_nanos();
        // A debt due within `NEAR_NANOS` is not worth publishing: the
        // lock-free check would read the clock again before refusing it
        // anyway; the callers it would refuse take the lock instead.
        let owed = if ticket > now.saturating_add(NEAR_NANOS) {
            ticket
        } else {
            0
        };
        // A limiter that is never exhausted leaves none (a `SmoothBursty`
        // granting from stored permits no debt at all, a cold
        // `SmoothWarmingUp` one of a few intervals): it never writes the
        // line.
        self.debt.publish(owed, now);
    }
}

impl Schedule for Smooth {
    type Turn = Turn;
    type Books = Books;
    /// Time since the origin.
    type View = Duration;
    type Gap = Gap;

    fn capacity(&self) -> u32 {
        // Guava pays any weight later.
        u32::MAX
    }

    fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    fn close(&self) {
        self.closed.store(true, Ordering::Release);
    }

    #[inline]
    fn try_take(engine: &Engine<Self>, n: u32) -> Taken {
        let smooth = engine.schedule();
        if smooth.is_closed() {
            return Taken::Closed;
        }
        // A caller that comes before the next free ticket owes: refused
        // without the lock, with what the locked path would say (the ticket
        // is after `now`, so after the arrival time too, which is never
        // later). Only a debt is published (see `publish`). A ticket about
        // to move back reads as a refusal just before that change.
        let owed = smooth.debt.owed();
        let mut now_nanos = smooth.origin.elapsed_nanos();
        if owed > now_nanos {
            // The debt holds for a reading at or after the change that left
            // it. One before it is stale (the thread was preempted between
            // its read and here, or the counter was read out of order,
            // before a grant this call has already seen); one just after
            // it may be too, as the counter is read while the load waits
            // for the line the change was written to. Then read again, in
            // order (after the load), and refuse only if still owed: that
            // reading is this call's time as much as the first was.
            if now_nanos < smooth.debt.changed_at() || owed - now_nanos <= NEAR_NANOS {
                now_nanos = smooth.origin.elapsed_nanos_ordered();
            }
            if owed > now_nanos {
                return Taken::Limited(Duration::from_nanos(owed - now_nanos));
            }
        }
        let mut queue = engine.lock();
        if smooth.is_closed() {
            return Taken::Closed;
        }
        let books = &mut queue.books;
        // Others may have been granted while this caller waited for the
        // lock: if it now looks owed, look again with the clock read now,
        // after the lock. A plain read first: one at or after the ticket
        // is owed nothing (a counter read early reads earlier, never
        // later), and it is what two threads on one limiter meet on nearly
        // every call, inside the lock (the ordered read's fences cost 2–4 ns
        // there, `compare --bench threads`). Else an ordered read: a
        // counter read early could be earlier than the grant the lock has
        // just shown, which would read as a debt. (In nanoseconds
        // throughout: a `Duration` is made only for a refusal, or inside
        // the rare credit window.)
        let now_nanos = if books.state.next_free_nanos() > now_nanos {
            let again = smooth.origin.elapsed_nanos();
            if books.state.next_free_nanos() > again {
                smooth.origin.elapsed_nanos_ordered()
            } else {
                again
            }
        } else {
            now_nanos
        };
        let at = if now_nanos < books.credit_until {
            let at = books.arrival(Duration::from_nanos(now_nanos));
            // Never later than `now_nanos`, so it fits.
            u64::try_from(at.as_nanos()).unwrap_or(now_nanos)
        } else {
            now_nanos
        };
        if books.state.try_take(at, n, now_nanos - at) {
            books.changed();
            smooth.publish(books, now_nanos);
            Taken::Granted
        } else {
            Taken::Limited(
                books
                    .state
                    .next_free()
                    .saturating_sub(Duration::from_nanos(now_nanos)),
            )
        }
    }

    fn reserve_unlocked(&self, _: u32, _: Option<Duration>, _: Waits) -> Option<Reserve<()>> {
        None
    }

    /// Every request waits by Guava's rule: in turn, never overflowing (a
    /// request for room is one like any other).
    fn reserve(
        &self,
        books: &mut Books,
        n: u32,
        max_wait: Option<Duration>,
        _: Waits,
    ) -> Reserve<Turn> {
        if self.is_closed() {
            return Reserve::Closed;
        }
        let now = self.now();
        let at = books.arrival(now);
        let before = books.state.undo_point();
        let (wait, span) = match max_wait {
            None => books.state.reserve_span(at, n),
            Some(timeout) => {
                // The timeout counts from `now`, not from `at`.
                let slack = timeout.saturating_add(now.saturating_sub(at));
                match books.state.try_reserve_span(at, n, slack) {
                    Some(reserved) => reserved,
                    None => return Reserve::TooLong,
                }
            }
        };
        let (previous, version) = books.changed();
        self.publish(books, nanos(now));
        // `None`: beyond `Duration::MAX`, never due.
        let due = at.checked_add(wait);
        let turn = Turn {
            span,
            due,
            version,
            previous,
            before,
        };
        if due.is_some_and(|due| due <= now) {
            Reserve::Ready(turn)
        } else {
            Reserve::Queued(turn)
        }
    }

    fn follow(&self, turn: &mut Turn, ahead: &Turn) {
        // Guava's truncation to whole microseconds can put a reservation
        // made a moment later a fraction of a microsecond earlier.
        turn.due = match (turn.due, ahead.due) {
            (Some(due), Some(ahead)) => Some(due.max(ahead)),
            _ => None,
        };
    }

    fn view(&self, _: &Books) -> Duration {
        self.now()
    }

    fn is_due(&self, now: &Duration, turn: &Turn, _: u32) -> bool {
        turn.due.is_some_and(|due| due <= *now)
    }

    fn instant(&self, _: &Duration, turn: &Turn, _: u32) -> Option<Instant> {
        turn.due.map(|due| self.origin.instant_after(due))
    }

    fn granted(&self, books: &mut Books, now: &Duration, turn: &Turn, _: u32) {
        if turn.due.is_some_and(|due| *now > due) {
            // Late on the timer: see the module notes of `smooth`.
            books.credit_until = books
                .credit_until
                .max(nanos(now.saturating_add(CREDIT_GRACE)));
        }
    }

    fn withdraw<'a>(
        &self,
        books: &mut Books,
        now: &Duration,
        turn: Turn,
        _: u32,
        behind: impl Iterator<Item = &'a mut Turn>,
    ) -> bool {
        if self.is_closed() {
            return false; // nothing is given back any more
        }
        if books.version == turn.version {
            books.state.undo(turn.before);
            books.version = turn.previous;
            self.publish(books, nanos(*now));
            return false;
        }
        let given = books.state.give_back(*now, turn.span);
        self.publish(books, nanos(*now));
        if given == 0 {
            return false;
        }
        books.changed();
        // Picoseconds; whole nanoseconds off the waiters' due times (never
        // earlier than their turn).
        let shift = Duration::from_nanos(u64::try_from(given / 1000).unwrap_or(u64::MAX));
        for later in behind {
            later.span = later.span.shift(given);
            later.due = later.due.map(|due| due.saturating_sub(shift));
        }
        true
    }

    fn is_fresh(&self, books: &Books) -> bool {
        let now = self.now();
        if nanos(now) < books.credit_until || books.state.next_free() > now {
            return false;
        }
        // A new limiter starts cold (warm-up), which a kept one at its
        // coldest stays; or with no permits stored (bursty), which a kept
        // one that can store some does not stay: it gathers them while a
        // new one built at its next use would have none. So a bursty
        // limiter is fresh only if it stores nothing (`max_burst` zero).
        let fresh = if books.state.warmup().is_some() {
            books.state.max_permits()
        } else if books.state.max_permits() == 0.0 {
            0.0
        } else {
            return false;
        };
        #[expect(
            clippy::float_cmp,
            reason = "exact on purpose: resync caps at `max_permits` itself"
        )]
        let same = books.state.stored_permits(now) == fresh;
        same
    }

    fn available(&self, _: &Books) -> Option<u32> {
        None
    }

    fn debug_fields(&self, books: &Books, f: &mut fmt::DebugStruct<'_, '_>) {
        let now = books.arrival(self.now());
        f.field("rate", &books.state.rate())
            .field("stored_permits", &books.state.stored_permits(now))
            .field("max_permits", &books.state.max_permits())
            .field("next_free", &books.state.next_free());
    }
}

impl Engine<Smooth> {
    /// A smooth limiter over `state`; nothing is spawned.
    pub(super) fn smooth(
        kind: Kind,
        state: SmoothState,
        meter: crate::meter::Slot,
    ) -> Arc<Engine<Smooth>> {
        let smooth = Smooth {
            origin: clock::Origin::now(),
            closed: AtomicBool::new(false),
            debt: Debt::new(),
        };
        let books = Books {
            state,
            version: 0,
            versions: 0,
            credit_until: 0,
        };
        Engine::new(kind, smooth, books, Waking::OwnTimers, meter)
    }

    /// The stable rate, in permits per second.
    pub(super) fn rate(&self) -> f64 {
        self.lock().books.state.rate()
    }

    pub(super) fn stored_permits(&self) -> f64 {
        let queue = self.lock();
        let now = queue.books.arrival(self.schedule().now());
        queue.books.state.stored_permits(now)
    }

    /// Changes the stable rate from now on; the turns of waiters stay as
    /// they were (Guava's `setRate`).
    pub(super) fn set_rate(&self, permits_per_second: f64) -> Result<(), ConfigError> {
        self.change(|smooth, queue| {
            let books = &mut queue.books;
            let now = smooth.now();
            let at = books.arrival(now);
            let changed = books.state.set_rate(at, permits_per_second);
            if changed.is_ok() {
                books.changed();
                smooth.publish(books, nanos(now));
            }
            (changed, false)
        })?;
        tracing::debug!(
            limiter = self.kind().name(),
            permits_per_second,
            "rate changed"
        );
        Ok(())
    }
}

/// A time since the origin in nanoseconds, `u64::MAX` beyond (584 years).
fn nanos(t: Duration) -> u64 {
    u64::try_from(t.as_nanos()).unwrap_or(u64::MAX)
}

/// The lock-free refusal reads the clock again, in order, when its first
/// reading is stale (before the change that left the debt) or the debt is
/// nearly paid; on a fake clock whose next reading can be made stale.
#[cfg(test)]
mod stale_tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::time::Duration;

    use crate::clock::fake;
    use crate::{SmoothBursty, TryAcquireError};

    const START: u64 = 1_000_000_000;
    const SECOND: u64 = 1_000_000_000;

    /// A runtime to build limiters in (their waiters' timers).
    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap()
    }

    /// A `SmoothBursty` of `rate` on a fake clock at `START`; the clock's
    /// time, and the stale reading its next read returns (once) if set.
    fn on_fake_clock(rate: f64) -> (SmoothBursty, Arc<AtomicU64>, Arc<AtomicU64>) {
        let now = Arc::new(AtomicU64::new(START));
        let stale = Arc::new(AtomicU64::new(0));
        let (read_now, read_stale) = (Arc::clone(&now), Arc::clone(&stale));
        let clock = fake::Clock::new(move || match read_stale.swap(0, Ordering::SeqCst) {
            0 => read_now.load(Ordering::SeqCst),
            stale => stale,
        });
        let _clock = clock.enter();
        let limiter = SmoothBursty::builder()
            .permits_per_second(rate)
            .build()
            .unwrap();
        (limiter, now, stale)
    }

    /// A 1/s limiter (see [`on_fake_clock`]) owing from 2 s to 3 s (two
    /// permits taken at 2 s: the one stored and one more).
    fn owing() -> (SmoothBursty, Arc<AtomicU64>, Arc<AtomicU64>) {
        let (limiter, now, stale) = on_fake_clock(1.0);
        now.store(START + 2 * SECOND, Ordering::SeqCst);
        limiter.try_acquire_many(2).unwrap();
        (limiter, now, stale)
    }

    fn limited(after: Duration) -> Result<(), TryAcquireError> {
        Err(TryAcquireError::Limited { retry_after: after })
    }

    #[test]
    fn a_reading_from_before_the_change_is_read_again() {
        let rt = runtime();
        let _rt = rt.enter();
        // A fresh reading at 2.5 s owes half a second.
        let (limiter, now, stale) = owing();
        now.store(START + 2 * SECOND + SECOND / 2, Ordering::SeqCst);
        assert_eq!(limiter.try_acquire(), limited(Duration::from_millis(500)));
        // A caller that read 1.5 s (preempted since) decides at 3.5 s:
        // its own time then owes nothing.
        now.store(START + 3 * SECOND + SECOND / 2, Ordering::SeqCst);
        stale.store(START + SECOND + SECOND / 2, Ordering::SeqCst);
        assert_eq!(limiter.try_acquire(), Ok(()));

        // Read again and still owed: refused for what the second reading
        // owes.
        let (limiter, now, stale) = owing();
        now.store(START + 2 * SECOND + SECOND / 4, Ordering::SeqCst);
        stale.store(START + SECOND + SECOND / 2, Ordering::SeqCst);
        assert_eq!(limiter.try_acquire(), limited(Duration::from_millis(750)));
    }

    /// A grant that leaves no debt publishes nothing, so a caller whose
    /// reading is older than it meets it only under the lock, and reads
    /// again there. (Deciding on its first reading, it would be refused
    /// for the half second between them.)
    #[test]
    fn a_reading_older_than_the_last_grant_is_read_again_under_the_lock() {
        let rt = runtime();
        let _rt = rt.enter();
        // 1/s, one permit stored by 2 s; another caller spends it at 2 s,
        // which leaves the next free ticket at 2 s and no debt.
        let (limiter, now, stale) = on_fake_clock(1.0);
        now.store(START + 2 * SECOND, Ordering::SeqCst);
        limiter.try_acquire().unwrap();
        // This caller read 1.5 s, before that grant: at 2 s, its time
        // under the lock, a fresh permit is its own.
        stale.store(START + SECOND + SECOND / 2, Ordering::SeqCst);
        assert_eq!(limiter.try_acquire(), Ok(()));
        assert_eq!(limiter.try_acquire(), limited(Duration::from_secs(1)));
    }

    /// A published debt that a change takes back is unpublished: a held
    /// reservation dropped gives back its permit, and the next caller is
    /// the free first again, without the lock-free check in the way.
    #[test]
    fn a_debt_given_back_is_no_longer_published() {
        let rt = runtime();
        let _rt = rt.enter();
        let (limiter, _, _) = on_fake_clock(1.0);
        let held = rt.block_on(limiter.reserve(1)).unwrap();
        assert_eq!(limiter.try_acquire(), limited(Duration::from_secs(1)));
        drop(held);
        assert_eq!(limiter.try_acquire(), Ok(()));
        assert_eq!(limiter.try_acquire(), limited(Duration::from_secs(1)));
    }

    /// A debt within `NEAR_NANOS` is not published (so a limiter that is
    /// never exhausted never writes the line its lock-free checks read;
    /// `compare --bench try threads` measures that), and is refused under
    /// the lock, exactly.
    #[test]
    fn a_small_debt_is_refused_under_the_lock() {
        let rt = runtime();
        let _rt = rt.enter();
        let (limiter, now, _) = on_fake_clock(2e6);
        limiter.try_acquire().unwrap();
        assert_eq!(limiter.try_acquire(), limited(Duration::from_nanos(500)));
        now.store(START + 499, Ordering::SeqCst);
        assert_eq!(limiter.try_acquire(), limited(Duration::from_nanos(1)));
        now.store(START + 500, Ordering::SeqCst);
        assert_eq!(limiter.try_acquire(), Ok(()));
        // Three permits at once owe 1.5 µs: published, refused without
        // the lock.
        now.store(START + 1_000, Ordering::SeqCst);
        limiter.try_acquire_many(3).unwrap();
        assert_eq!(limiter.try_acquire(), limited(Duration::from_nanos(1_500)));
    }

    #[test]
    fn a_debt_nearly_paid_is_read_again() {
        let rt = runtime();
        let _rt = rt.enter();
        // Read 500 ns before the turn (after the change: not stale), at
        // the turn by the time of the decision.
        let (limiter, now, stale) = owing();
        now.store(START + 3 * SECOND, Ordering::SeqCst);
        stale.store(START + 3 * SECOND - 500, Ordering::SeqCst);
        assert_eq!(limiter.try_acquire(), Ok(()));
        // 2 µs before it: refused at once, on the first reading.
        let (limiter, now, stale) = owing();
        now.store(START + 3 * SECOND, Ordering::SeqCst);
        stale.store(START + 3 * SECOND - 2_000, Ordering::SeqCst);
        assert_eq!(limiter.try_acquire(), limited(Duration::from_micros(2)));
    }
}

/// A caller that loads a debt sees the time of the change that left it, or
/// a later one, however the publishing thread's stores land.
#[cfg(all(test, tokio_ratelimit_loom))]
mod loom_tests {
    use loom::sync::Arc;

    use super::Debt;

    #[test]
    fn loom_a_debt_is_seen_with_its_time() {
        loom::model(|| {
            let debt = Arc::new(Debt::new());
            let publisher = {
                let debt = Arc::clone(&debt);
                loom::thread::spawn(move || {
                    debt.publish(500, 100);
                    debt.publish(0, 200);
                    debt.publish(700, 300);
                })
            };
            let owed = debt.owed();
            let at = debt.changed_at();
            match owed {
                0 => {}
                500 => assert!(at >= 100, "500 owed with time {at}"),
                700 => assert_eq!(at, 300),
                other => panic!("{other} was never published"),
            }
            publisher.join().unwrap();
            assert_eq!((debt.owed(), debt.changed_at()), (700, 300));
        });
    }
}

#[cfg(test)]
mod layout_tests {
    use std::mem::{offset_of, size_of};

    use super::*;
    use crate::algorithm::SmoothState;

    /// A smooth limiter's engine, 64-byte aligned (so its `Arc` puts it at
    /// the start of a line): the schedule's lock-free fields on line 0,
    /// the first counter stripe alone on line 1 (the [`Gap`] after it),
    /// the lock word and everything a grant reads under the lock on lines
    /// 2 and 3, and the second stripe on line 4 with only what a grant
    /// leaves alone — in 320 bytes, as before the stripes were kept off
    /// the lock's lines. (Two threads sharing a `SmoothBursty`: 2.5× →
    /// 1.8× governor, benches/RESULTS.md, "The smooth limiters on two
    /// threads".)
    #[test]
    fn a_smooth_engine_keeps_its_lock_and_books_off_the_stripes() {
        assert_eq!(size_of::<Engine<Smooth>>(), 320);
        assert_eq!(std::mem::align_of::<Engine<Smooth>>(), 64);
        let states = [
            SmoothState::bursty(10.0, Duration::from_secs(1)).unwrap(),
            SmoothState::warming_up(10.0, Duration::from_secs(1), 3.0).unwrap(),
        ];
        for state in states {
            let engine = Engine::smooth(Kind::SmoothBursty, state, crate::meter::Slot::default());
            let at = engine.offsets();
            assert_eq!(size_of::<Smooth>(), 64);
            assert_eq!((at.stripe_a, at.lock), (64, 128));
            // The lock's word is in the 8 bytes before the books (std's
            // mutex puts its data after it here).
            assert_eq!(at.books, at.lock + 8);
            let hot_end = at.books + offset_of!(Books, state) + SmoothState::HOT_END;
            assert!(hot_end <= 256, "{hot_end}");
            assert!(at.stripe_b >= 256, "{}", at.stripe_b);
        }
    }
}
