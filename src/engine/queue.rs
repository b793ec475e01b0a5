//! The FIFO queue of entries: requests that have reserved permits but may
//! not proceed yet, and granted requests whose permits are held.
//!
//! A request reserves its place in the schedule when it arrives, so its
//! turn — the instant it may proceed — is fixed at once and FIFO order is a
//! property of the schedule, not of who is woken first: a later
//! `try_acquire` sees the reservations ahead of it and cannot jump them, and
//! a large request at the head is never starved by small ones behind it.
//!
//! Entries are in arrival order, which is also the order of their turns,
//! and the ones still pending are always a suffix (grants take a prefix).
//!
//! # Withdrawal
//!
//! An entry dropped before it is spent gives its reservation back: the
//! schedule takes back the part not yet used, and every entry behind it
//! moves forward by the same amount — for the buckets exactly the schedule
//! they would have had if it had never come. This happens synchronously in
//! `Drop`, under the engine's lock, so a `try_acquire` right after the drop
//! already sees the room.

use std::collections::VecDeque;
use std::task::Waker;

use super::Schedule;
use super::actor::ActorSlot;

/// What a request does with its permits once its turn comes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Grant {
    /// Spends them: the entry leaves the queue when its waiter sees it
    /// granted (`acquire`).
    Spend,
    /// Holds them: the entry stays in the queue until a `Reservation`
    /// commits or drops it (`reserve`).
    Hold,
}

/// Where an entry stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum State {
    /// Waiting for its turn.
    Pending,
    /// Its turn has come; the waiter has not observed it yet (or a
    /// `Reservation` holds it).
    Granted,
    /// The limiter was closed before its turn.
    Closed,
}

struct Entry<T> {
    id: u64,
    n: u32,
    turn: T,
    state: State,
    grant: Grant,
    waker: Option<Waker>,
}

/// The entries of one limiter, and the schedule's books. Always used under
/// the engine's lock.
///
/// An idle queue is sized for the idle case: what only waiting needs (the
/// entries, the actor's slot) is in [`Waiting`], allocated with the first
/// entry and freed once the last has left and no actor runs. A million idle
/// buckets keep a null pointer each, not a million queues.
///
/// The books first (`repr(C)`): a grant reads them right after the lock
/// word, and the rest only a waiter needs (see `engine::Engine`).
#[repr(C)]
pub(crate) struct Queue<S: Schedule> {
    /// The part of the schedule kept under the lock.
    pub(crate) books: S::Books,
    waiting: Option<Box<Waiting<S::Turn>>>,
    pub(crate) closed: bool,
}

/// The part of a queue that exists only while someone waits.
pub(super) struct Waiting<T> {
    entries: VecDeque<Entry<T>>,
    next_id: u64,
    /// The background actor, if the engine has one (see `actor.rs`).
    pub(super) actor: ActorSlot,
    /// Actor tasks spawned since this was allocated (each task's number).
    pub(super) runs: u32,
    /// The last task whose future was dropped before it ended.
    pub(super) dropped: Option<u32>,
}

impl<T> Default for Waiting<T> {
    fn default() -> Self {
        Waiting {
            entries: VecDeque::new(),
            next_id: 0,
            actor: ActorSlot::Idle,
            runs: 0,
            dropped: None,
        }
    }
}

impl<S: Schedule> Queue<S> {
    pub(crate) fn new(books: S::Books) -> Queue<S> {
        Queue {
            closed: false,
            books,
            waiting: None,
        }
    }

    /// The waiting part, if anyone waits (or an actor runs).
    pub(super) fn waiting(&mut self) -> Option<&mut Waiting<S::Turn>> {
        self.waiting.as_deref_mut()
    }

    fn entries(&self) -> impl Iterator<Item = &Entry<S::Turn>> {
        self.waiting.iter().flat_map(|w| w.entries.iter())
    }

    /// Frees the waiting part once nothing in it is needed: no entry, and
    /// no actor (a panicked one is remembered).
    pub(super) fn tidy(&mut self) {
        if self
            .waiting
            .as_ref()
            .is_some_and(|w| w.entries.is_empty() && matches!(w.actor, ActorSlot::Idle))
        {
            self.waiting = None;
        }
    }

    /// Appends a reservation that must wait; returns its id and whether it
    /// is the first pending one (the timer must be re-armed for it).
    pub(crate) fn push(&mut self, n: u32, turn: S::Turn, grant: Grant) -> (u64, bool) {
        let first = self.first_pending().is_none();
        (self.append(n, turn, State::Pending, grant), first)
    }

    /// Appends a held reservation that may proceed at once.
    pub(crate) fn push_granted(&mut self, n: u32, turn: S::Turn) -> u64 {
        self.append(n, turn, State::Granted, Grant::Hold)
    }

    fn append(&mut self, n: u32, turn: S::Turn, state: State, grant: Grant) -> u64 {
        let w = self.waiting.get_or_insert_with(Box::default);
        let id = w.next_id;
        w.next_id += 1;
        w.entries.push_back(Entry {
            id,
            n,
            turn,
            state,
            grant,
            waker: None,
        });
        id
    }

    /// The turn of the last entry.
    pub(crate) fn last(&self) -> Option<&S::Turn> {
        self.waiting
            .as_ref()
            .and_then(|w| w.entries.back())
            .map(|e| &e.turn)
    }

    /// Removes the entry at `idx`.
    fn remove(&mut self, idx: usize) -> Option<Entry<S::Turn>> {
        let e = self.waiting.as_mut()?.entries.remove(idx);
        self.tidy();
        e
    }

    /// Removes a held reservation that is being spent; returns its permits.
    pub(crate) fn commit(&mut self, id: u64) -> u32 {
        match self.find(id) {
            Some(idx) => self.remove(idx).map_or(0, |e| e.n),
            None => 0,
        }
    }

    /// Whether no entry at all (pending, or granted and not yet observed or
    /// still held) is in the queue.
    pub(crate) fn is_empty(&self) -> bool {
        self.entries().next().is_none()
    }

    /// Entries that have not proceeded yet.
    pub(crate) fn pending(&self) -> usize {
        self.entries().filter(|e| e.state == State::Pending).count()
    }

    /// Entries still waiting for their turn at `view`: pending and not
    /// due. (A due entry is the caller's whether or not anyone has marked
    /// it granted yet: an actor does on its tick, a waiter that keeps its
    /// own timer when it is next polled.)
    pub(crate) fn not_due(&self, schedule: &S, view: &S::View) -> usize {
        self.entries()
            .filter(|e| e.state == State::Pending && !schedule.is_due(view, &e.turn, e.n))
            .count()
    }

    /// Whether an entry has not proceeded yet.
    pub(crate) fn has_pending(&self) -> bool {
        self.first_pending().is_some()
    }

    fn find(&self, id: u64) -> Option<usize> {
        let w = self.waiting.as_ref()?;
        w.entries.binary_search_by_key(&id, |e| e.id).ok()
    }

    fn first_pending(&self) -> Option<&Entry<S::Turn>> {
        self.entries().find(|e| e.state == State::Pending)
    }

    /// When the first pending entry may proceed (`None`: nobody waits, or
    /// never).
    pub(crate) fn next_turn(&self, schedule: &S, view: &S::View) -> Option<tokio::time::Instant> {
        self.first_pending()
            .and_then(|e| schedule.instant(view, &e.turn, e.n))
    }

    /// Grants every pending entry whose turn has come (a prefix),
    /// collecting their wakers, except one that would wake `polling` (the
    /// task granting them, which looks at its own entry next); returns how
    /// many.
    pub(crate) fn grant_due(
        &mut self,
        schedule: &S,
        view: &S::View,
        wakers: &mut Vec<Waker>,
        polling: Option<&Waker>,
    ) -> usize {
        let Some(w) = self.waiting.as_mut() else {
            return 0;
        };
        let mut granted = 0;
        for e in &mut w.entries {
            if e.state != State::Pending {
                continue;
            }
            if !schedule.is_due(view, &e.turn, e.n) {
                break;
            }
            schedule.granted(&mut self.books, view, &e.turn, e.n);
            e.state = State::Granted;
            granted += 1;
            match e.waker.take() {
                Some(waker) if !polling.is_some_and(|p| waker.will_wake(p)) => wakers.push(waker),
                _ => {}
            }
        }
        granted
    }

    /// The state of entry `id` and its permits; a granted or closed entry
    /// is removed (the waiter has observed it), unless it is held. For a
    /// pending one, stores `waker` and returns its index (see
    /// [`turn`](Self::turn)).
    pub(crate) fn observe(&mut self, id: u64, waker: &Waker) -> Result<(State, u32), usize> {
        let (Some(idx), Some(w)) = (self.find(id), self.waiting.as_mut()) else {
            // Entries leave only when observed or withdrawn, by their owner.
            return Ok((State::Closed, 0));
        };
        let e = &mut w.entries[idx];
        match e.state {
            State::Pending => {
                if !e.waker.as_ref().is_some_and(|w| w.will_wake(waker)) {
                    e.waker = Some(waker.clone());
                }
                Err(idx)
            }
            State::Granted if e.grant == Grant::Hold => Ok((State::Granted, e.n)),
            state => {
                let n = e.n;
                self.remove(idx);
                Ok((state, n))
            }
        }
    }

    /// The turn and the permits of entry `id`, while it is in the queue
    /// (pending, or granted and not yet observed).
    pub(crate) fn turn_of(&self, id: u64) -> Option<(&S::Turn, u32)> {
        self.find(id).map(|idx| self.turn(idx))
    }

    /// The turn and the permits of the entry at `idx` (an index
    /// [`observe`](Self::observe) gave).
    pub(crate) fn turn(&self, idx: usize) -> (&S::Turn, u32) {
        let Some(w) = self.waiting.as_ref() else {
            unreachable!("an index is only given for an entry in the queue")
        };
        let e = &w.entries[idx];
        (&e.turn, e.n)
    }

    /// Removes entry `id`, which gave up, and has the schedule take back
    /// what it had not used. Returns the index of the entries behind it
    /// when they moved forward.
    pub(crate) fn withdraw(&mut self, id: u64, schedule: &S, view: &S::View) -> Option<usize> {
        let idx = self.find(id)?;
        let w = self.waiting.as_mut()?;
        let e = w.entries.remove(idx)?;
        let moved = e.state != State::Closed && {
            let behind = w.entries.range_mut(idx..).map(|e| &mut e.turn);
            schedule.withdraw(&mut self.books, view, e.turn, e.n, behind)
        };
        self.tidy();
        moved.then_some(idx)
    }

    /// Marks every pending entry closed, collecting their wakers.
    pub(crate) fn close(&mut self, wakers: &mut Vec<Waker>) {
        self.closed = true;
        for e in self.waiting.iter_mut().flat_map(|w| w.entries.iter_mut()) {
            if e.state == State::Pending {
                e.state = State::Closed;
                wakers.extend(e.waker.take());
            }
        }
    }

    /// Takes the wakers of every pending entry from index `from` on (their
    /// turn moved, or the actor is gone); each registers again when polled,
    /// so one that is already woken is not woken again.
    pub(crate) fn wake_pending(&mut self, from: usize, wakers: &mut Vec<Waker>) {
        let Some(w) = self.waiting.as_mut() else {
            return;
        };
        for e in w.entries.range_mut(from..) {
            if e.state == State::Pending {
                wakers.extend(e.waker.take());
            }
        }
    }

    /// Every entry's turn, for a change of rate that moves them all.
    pub(crate) fn turns_mut(&mut self) -> impl Iterator<Item = &mut S::Turn> {
        self.waiting
            .iter_mut()
            .flat_map(|w| w.entries.iter_mut())
            .map(|e| &mut e.turn)
    }
}

#[cfg(test)]
mod tests {
    use std::task::Waker;
    use std::time::Duration;

    use super::*;
    use crate::Rate;
    use crate::algorithm::{Params, Release};
    use crate::engine::Bucket;
    use crate::engine::Turn;

    const MS: u128 = 1_000_000;

    fn setup(capacity: u32) -> (Bucket, Queue<Bucket>) {
        let rate = Rate::every(Duration::from_millis(100));
        let params = Params::new(rate, capacity).unwrap();
        (
            Bucket::new(params, 0, Release::Tokens),
            Queue::new(crate::engine::Configured::new(rate)),
        )
    }

    /// The first pending entry's turn, from the bucket's origin.
    fn next_turn(q: &Queue<Bucket>, b: &Bucket) -> Option<Duration> {
        let view = b.view_at(0);
        let origin = b.instant(&view, &Turn::tokens(0), 0)?;
        Some(q.next_turn(b, &view)? - origin)
    }

    #[test]
    fn withdrawal_shifts_everyone_behind() {
        let (b, mut q) = setup(1);
        // Reservations ending at 100, 300 (n = 2), 400 ms: ready at 0, 200, 300.
        let (first, is_first) = q.push(1, Turn::tokens(100 * MS), Grant::Spend);
        assert!(is_first);
        let (second, is_first) = q.push(2, Turn::tokens(300 * MS), Grant::Spend);
        assert!(!is_first);
        let (third, _) = q.push(1, Turn::tokens(400 * MS), Grant::Spend);
        let mut wakers = vec![];
        assert_eq!(q.grant_due(&b, &b.view_at(0), &mut wakers, None), 1);
        assert_eq!(next_turn(&q, &b), Some(Duration::from_millis(200)));
        // The second gives up at 50 ms: all 200 ms of it is refunded.
        assert_eq!(q.withdraw(second, &b, &b.view_at(50 * MS)), Some(1));
        assert_eq!(next_turn(&q, &b), Some(Duration::from_millis(100)));
        assert_eq!(q.pending(), 1);
        let waker = Waker::noop();
        assert_eq!(q.observe(first, waker), Ok((State::Granted, 1)));
        // The first has left the queue, observed: the third is at its head.
        assert_eq!(q.observe(third, waker), Err(0));
        assert_eq!(q.turn(0), (&Turn::tokens(200 * MS), 1));
    }

    #[test]
    fn refund_is_only_the_undrained_part() {
        let (b, mut q) = setup(1);
        let (first, _) = q.push(2, Turn::tokens(200 * MS), Grant::Spend);
        let (second, _) = q.push(1, Turn::tokens(300 * MS), Grant::Spend);
        let (third, _) = q.push(1, Turn::tokens(400 * MS), Grant::Spend);
        // The first was due at 100 ms; withdrawn at 150 ms, half of it has
        // drained: 50 ms come back.
        let at = b.view_at(150 * MS);
        assert_eq!(q.withdraw(first, &b, &at), Some(0));
        let waker = Waker::noop();
        assert_eq!(q.observe(third, waker), Err(1));
        assert_eq!(q.turn(1), (&Turn::tokens(350 * MS), 1));
        // The second now ends at 250 ms: none of it has drained.
        assert_eq!(q.withdraw(second, &b, &at), Some(0));
        assert_eq!(q.observe(third, waker), Err(0));
        assert_eq!(q.turn(0), (&Turn::tokens(250 * MS), 1));
    }

    #[test]
    fn close_marks_pending_only() {
        let (b, mut q) = setup(1);
        let (first, _) = q.push(1, Turn::tokens(100 * MS), Grant::Spend);
        let (second, _) = q.push(1, Turn::tokens(200 * MS), Grant::Spend);
        let mut wakers = vec![];
        q.grant_due(&b, &b.view_at(0), &mut wakers, None);
        q.close(&mut wakers);
        let waker = Waker::noop();
        assert_eq!(q.observe(first, waker), Ok((State::Granted, 1)));
        assert_eq!(q.observe(second, waker), Ok((State::Closed, 1)));
        assert_eq!(q.withdraw(second, &b, &b.view_at(0)), None);
    }
}
