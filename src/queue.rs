//! The FIFO queue of waiters that have reserved permits but may not proceed
//! yet.
//!
//! A waiter pours its request into the bucket when it arrives (a
//! *reservation*, see [`crate::algorithm`]), so its turn — the instant it
//! may proceed — is fixed at once and FIFO order is a property of the
//! schedule, not of who is woken first: a later `try_acquire` sees the
//! reservations ahead of it and cannot jump them, and a large request at the
//! head is never starved by small ones behind it.
//!
//! The queue keeps, per waiter, the end of its reservation. Entries are in
//! arrival order, which is also the order of their ends, and the waiters
//! still pending are always a suffix (grants take a prefix).
//!
//! # Cancellation
//!
//! A waiter dropped before it has proceeded gives its reservation back: the
//! part not yet drained ([`crate::algorithm`]'s refund) comes off the
//! bucket's `tat`, and every reservation behind it moves forward by the same
//! amount — exactly the schedule they would have had if it had never come.
//! This happens synchronously in `Drop`, under the queue lock, so a
//! `try_acquire` right after the drop already sees the room.

use std::collections::VecDeque;
use std::task::Waker;

use crate::algorithm::{Params, Release};
use crate::cell::Cell;
use crate::rate::Rate;

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

/// Where a waiter stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum State {
    /// Waiting for its turn.
    Pending,
    /// Its turn has come; the future has not observed it yet.
    Granted,
    /// The limiter was closed before its turn.
    Closed,
}

#[derive(Debug)]
struct Entry {
    id: u64,
    n: u32,
    /// The end of its reservation, in scaled units.
    end: u128,
    state: State,
    /// Held by a `Reservation`: stays in the queue once granted, until it
    /// is committed (removed) or dropped (given back).
    grant: Grant,
    waker: Option<Waker>,
}

/// The waiters of one bucket. Always used under the engine's lock.
#[derive(Debug)]
pub(crate) struct Queue {
    entries: VecDeque<Entry>,
    next_id: u64,
    pub(crate) closed: bool,
    pub(crate) rate: Rate,
}

impl Queue {
    pub(crate) fn new(rate: Rate) -> Queue {
        Queue {
            entries: VecDeque::new(),
            next_id: 0,
            closed: false,
            rate,
        }
    }

    /// Appends a reservation; returns its id and whether it is the first
    /// pending one (the timer must be re-armed for it).
    pub(crate) fn push(&mut self, n: u32, end: u128, grant: Grant) -> (u64, bool) {
        let first = self.first_pending().is_none();
        (self.append(n, end, State::Pending, grant), first)
    }

    /// Appends a held reservation that may proceed at once.
    pub(crate) fn push_granted(&mut self, n: u32, end: u128) -> u64 {
        self.append(n, end, State::Granted, Grant::Hold)
    }

    fn append(&mut self, n: u32, end: u128, state: State, grant: Grant) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        self.entries.push_back(Entry {
            id,
            n,
            end,
            state,
            grant,
            waker: None,
        });
        id
    }

    /// Removes a held reservation that is being spent; returns its permits.
    pub(crate) fn commit(&mut self, id: u64) -> u32 {
        match self.find(id) {
            Some(idx) => self.entries.remove(idx).map_or(0, |e| e.n),
            None => 0,
        }
    }

    /// Whether no waiter at all (pending or granted, not yet observed) is
    /// in the queue.
    pub(crate) fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Waiters that have not proceeded yet.
    pub(crate) fn pending(&self) -> usize {
        self.entries
            .iter()
            .filter(|e| e.state == State::Pending)
            .count()
    }

    fn find(&self, id: u64) -> Option<usize> {
        self.entries.binary_search_by_key(&id, |e| e.id).ok()
    }

    fn first_pending(&self) -> Option<&Entry> {
        self.entries.iter().find(|e| e.state == State::Pending)
    }

    /// When the first pending waiter may proceed (scaled).
    pub(crate) fn next_ready(&self, params: &Params, release: Release) -> Option<u128> {
        self.first_pending()
            .map(|e| params.ready(e.end, e.n, release))
    }

    /// Grants every pending waiter whose turn has come at `now` (a prefix),
    /// collecting their wakers. Late releases are reported to the cell for
    /// its timer credit.
    pub(crate) fn grant_due(
        &mut self,
        params: &Params,
        release: Release,
        now: u128,
        cell: &Cell,
        wakers: &mut Vec<Waker>,
    ) -> usize {
        let mut granted = 0;
        for e in &mut self.entries {
            if e.state != State::Pending {
                continue;
            }
            let ready = params.ready(e.end, e.n, release);
            if ready > now {
                break;
            }
            e.state = State::Granted;
            granted += 1;
            cell.note_late_release(params, ready, now);
            wakers.extend(e.waker.take());
        }
        granted
    }

    /// The state of waiter `id` and its permits; a granted or closed entry
    /// is removed (the future has observed it), unless it is held. For a
    /// pending one, stores `waker` and returns its turn (scaled).
    pub(crate) fn observe(
        &mut self,
        id: u64,
        params: &Params,
        release: Release,
        waker: &Waker,
    ) -> Result<(State, u32), u128> {
        let Some(idx) = self.find(id) else {
            // Entries leave only when observed or cancelled, by their owner.
            return Ok((State::Closed, 0));
        };
        let e = &mut self.entries[idx];
        match e.state {
            State::Pending => {
                if !e.waker.as_ref().is_some_and(|w| w.will_wake(waker)) {
                    e.waker = Some(waker.clone());
                }
                Err(params.ready(e.end, e.n, release))
            }
            State::Granted if e.grant == Grant::Hold => Ok((State::Granted, e.n)),
            state => {
                let n = e.n;
                self.entries.remove(idx);
                Ok((state, n))
            }
        }
    }

    /// Removes waiter `id`, which gave up, and gives back what it had not
    /// used: returns the refund (scaled) already applied to the entries
    /// behind it; the caller applies it to the cell.
    pub(crate) fn cancel(&mut self, id: u64, params: &Params, now: u128) -> u128 {
        let Some(idx) = self.find(id) else {
            return 0;
        };
        let Some(e) = self.entries.remove(idx) else {
            return 0;
        };
        if e.state == State::Closed {
            return 0;
        }
        let refund = params.refund(e.end, e.n, now);
        if refund > 0 {
            for behind in self.entries.range_mut(idx..) {
                behind.end -= refund;
            }
        }
        refund
    }

    /// Marks every pending waiter closed, collecting their wakers.
    pub(crate) fn close(&mut self, wakers: &mut Vec<Waker>) {
        self.closed = true;
        for e in &mut self.entries {
            if e.state == State::Pending {
                e.state = State::Closed;
                wakers.extend(e.waker.take());
            }
        }
    }

    /// Wakers of every pending waiter (their turn moved).
    pub(crate) fn wake_pending(&mut self, wakers: &mut Vec<Waker>) {
        for e in &mut self.entries {
            if e.state == State::Pending {
                wakers.extend(e.waker.clone());
            }
        }
    }

    /// Converts every reservation to a new rate (see `Params::rescale`).
    pub(crate) fn rescale(&mut self, old: &Params, new: &Params, now_nanos: u128) {
        for e in &mut self.entries {
            e.end = old.rescale(new, e.end, now_nanos);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::task::Waker;
    use std::time::Duration;

    use super::*;

    const MS: u128 = 1_000_000;

    fn setup(capacity: u32) -> (Params, Cell, Queue) {
        let rate = Rate::every(Duration::from_millis(100));
        let params = Params::new(rate, capacity).unwrap();
        let cell = Cell::new(params, 0, crate::clock::now());
        (params, cell, Queue::new(rate))
    }

    #[test]
    fn cancel_shifts_everyone_behind() {
        let (params, cell, mut q) = setup(1);
        // Reservations ending at 100, 300 (n = 2), 400 ms: ready at 0, 200, 300.
        let (a, first) = q.push(1, 100 * MS, Grant::Spend);
        assert!(first);
        let (b, first) = q.push(2, 300 * MS, Grant::Spend);
        assert!(!first);
        let (c, _) = q.push(1, 400 * MS, Grant::Spend);
        let mut wakers = vec![];
        assert_eq!(
            q.grant_due(&params, Release::Tokens, 0, &cell, &mut wakers),
            1
        );
        assert_eq!(q.next_ready(&params, Release::Tokens), Some(200 * MS));
        // b gives up at 50 ms: all 200 ms of it is refunded.
        assert_eq!(q.cancel(b, &params, 50 * MS), 200 * MS);
        assert_eq!(q.next_ready(&params, Release::Tokens), Some(100 * MS));
        assert_eq!(q.pending(), 1);
        let waker = Waker::noop();
        assert_eq!(
            q.observe(a, &params, Release::Tokens, waker),
            Ok((State::Granted, 1))
        );
        assert_eq!(q.observe(c, &params, Release::Tokens, waker), Err(100 * MS));
    }

    #[test]
    fn refund_is_only_the_undrained_part() {
        let (params, _cell, mut q) = setup(1);
        let (a, _) = q.push(2, 200 * MS, Grant::Spend);
        let (b, _) = q.push(1, 300 * MS, Grant::Spend);
        // a was due at 100 ms; cancelled at 150 ms, half of it has drained.
        assert_eq!(q.cancel(a, &params, 150 * MS), 50 * MS);
        assert_eq!(q.cancel(b, &params, 150 * MS), 100 * MS);
    }

    #[test]
    fn close_marks_pending_only() {
        let (params, cell, mut q) = setup(1);
        let (a, _) = q.push(1, 100 * MS, Grant::Spend);
        let (b, _) = q.push(1, 200 * MS, Grant::Spend);
        let mut wakers = vec![];
        q.grant_due(&params, Release::Tokens, 0, &cell, &mut wakers);
        q.close(&mut wakers);
        let waker = Waker::noop();
        assert_eq!(
            q.observe(a, &params, Release::Tokens, waker),
            Ok((State::Granted, 1))
        );
        assert_eq!(
            q.observe(b, &params, Release::Tokens, waker),
            Ok((State::Closed, 1))
        );
        assert_eq!(q.cancel(b, &params, 0), 0);
    }
}
