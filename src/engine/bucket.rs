//! The schedule of the token bucket, the leaky bucket and the funnel: the
//! lock-free GCRA [`Cell`], read in exact scaled time.
//!
//! The three differ only in their [`Release`] rule (tokens: a waiter
//! proceeds once the bucket is back within capacity; water: once the water
//! ahead of it has drained, and a request that does not fit overflows) and
//! in whether they spawn an actor. An entry's turn is the end of its
//! reservation; a withdrawn one refunds its undrained part to the cell and
//! moves every later reservation forward by as much.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::{Engine, Kind, Reserve, Schedule, Waits};
use crate::algorithm::{Params, Release, Taken};
use crate::cell::{Cell, Wait};
use crate::{Band, BandState, ConfigError, Peek, Rate};

/// The schedule over one GCRA cell. Its constants (the release rule and
/// the deficit of a fresh bucket) are kept in the cell, in the room its
/// alignment leaves.
pub(crate) struct Bucket {
    pub(crate) cell: Cell,
}

/// The rate as configured (the cell keeps it reduced), in 16 bytes: a
/// [`Rate`] also has room for why a float rate is invalid, which the rate
/// of a built bucket never is.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Configured {
    permits: u32,
    period_nanos: u64,
}

impl Configured {
    /// A validated rate.
    pub(crate) fn new(rate: Rate) -> Configured {
        Configured {
            permits: rate.permits(),
            period_nanos: rate.period_nanos(),
        }
    }

    pub(crate) fn rate(self) -> Rate {
        Rate::per(self.permits, Duration::from_nanos(self.period_nanos))
    }
}

/// How a bucket engine is built.
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

/// The interval of the cell and the time, in its scaled units.
pub(crate) struct View {
    params: Params,
    now: u128,
}

impl Bucket {
    pub(crate) fn new(params: Params, deficit: u32, release: Release) -> Bucket {
        Bucket {
            cell: Cell::for_bucket(
                params,
                params.cost(deficit),
                crate::clock::Origin::now(),
                deficit,
                release,
            ),
        }
    }

    /// A view at `now` scaled units after the origin.
    #[cfg(test)]
    pub(crate) fn view_at(&self, now: u128) -> View {
        View {
            params: self.cell.snapshot().params,
            now,
        }
    }

    /// Whole tokens / units of free room now.
    fn free(&self) -> u32 {
        // The clock after the state, as every decision reads it.
        let s = self.cell.snapshot();
        let now = self.cell.now_nanos();
        s.params.available(s.tat(), s.params.scale_nanos(now))
    }
}

/// An entry's place: the end of its reservation, in scaled units, and the
/// rule it waits by (the bucket's own, or the token rule for a request for
/// room, see [`Waits`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Turn {
    end: u128,
    release: Release,
}

impl Turn {
    /// When the entry of `n` may go, in the view's scaled units.
    fn ready(&self, view: &View, n: u32) -> u128 {
        view.params.ready(self.end, n, self.release)
    }
}

#[cfg(test)]
impl Turn {
    /// A turn ending at `end`, waiting by the token rule.
    pub(crate) fn tokens(end: u128) -> Turn {
        Turn {
            end,
            release: Release::Tokens,
        }
    }
}

impl Schedule for Bucket {
    type Turn = Turn;
    /// The rate as configured.
    type Books = Configured;
    type View = View;
    type Gap = ();

    fn capacity(&self) -> u32 {
        self.cell.capacity()
    }

    fn is_closed(&self) -> bool {
        self.cell.is_closed()
    }

    fn close(&self) {
        self.cell.close();
    }

    #[inline]
    fn try_take(engine: &Engine<Self>, n: u32) -> Taken {
        engine.schedule().cell.take(n)
    }

    #[inline]
    fn try_take_leaf(engine: &Engine<Self>, n: u32) -> Option<Taken> {
        engine.schedule().cell.take_leaf(n)
    }

    fn reserve_unlocked(
        &self,
        n: u32,
        max_wait: Option<Duration>,
        waits: Waits,
    ) -> Option<Reserve<()>> {
        let max_wait = max_wait.map(|d| d.as_nanos());
        let release = waits.rule(self.cell.release);
        match self.cell.reserve(n, release, max_wait, Wait::Refuse) {
            Reserve::WouldWait => None,
            outcome => Some(outcome.map(|_| ())),
        }
    }

    fn reserve(
        &self,
        _: &mut Configured,
        n: u32,
        max_wait: Option<Duration>,
        waits: Waits,
    ) -> Reserve<Turn> {
        // The clock is read under the lock (by `reserve`, after the state):
        // time may have passed while waiting for it, and a stale `now`
        // overstates the water (a shaper would overflow wrongly).
        let max_wait = max_wait.map(|d| d.as_nanos());
        let release = waits.rule(self.cell.release);
        self.cell
            .reserve(n, release, max_wait, Wait::Queue)
            .map(|place| Turn {
                end: place.end,
                release,
            })
    }

    fn follow(&self, _: &mut Turn, _: &Turn) {
        // Each reservation ends after the one before it, and the queue
        // releases its entries in order (a request for room behind a
        // shaper's waits for it, though it may fit sooner).
    }

    fn view(&self, _: &Configured) -> View {
        let s = self.cell.snapshot();
        View {
            params: s.params,
            now: s.params.scale_nanos(self.cell.now_nanos()),
        }
    }

    fn is_due(&self, view: &View, turn: &Turn, n: u32) -> bool {
        turn.ready(view, n) <= view.now
    }

    fn instant(&self, view: &View, turn: &Turn, n: u32) -> Option<Instant> {
        Some(self.cell.instant_at(&view.params, turn.ready(view, n)))
    }

    fn granted(&self, _: &mut Configured, view: &View, turn: &Turn, n: u32) {
        self.cell
            .note_late_release(&view.params, turn.ready(view, n), view.now);
    }

    fn withdraw<'a>(
        &self,
        _: &mut Configured,
        view: &View,
        turn: Turn,
        n: u32,
        behind: impl Iterator<Item = &'a mut Turn>,
    ) -> bool {
        let refund = view.params.refund(turn.end, n, view.now);
        if refund == 0 {
            return false;
        }
        for later in behind {
            later.end -= refund;
        }
        self.cell.refund(refund);
        true
    }

    fn is_fresh(&self, _: &Configured) -> bool {
        // A bucket built below its capacity is never fresh: one kept at its
        // starting level goes on refilling, and one built anew at its next
        // use would start from that level again.
        if self.cell.fresh_deficit != 0 {
            return false;
        }
        let now_nanos = self.cell.now_nanos();
        let s = self.cell.snapshot();
        let now = s.params.scale_nanos(now_nanos);
        !self.cell.has_credit(now_nanos) && s.tat() <= now
    }

    fn available(&self, _: &Configured) -> Option<u32> {
        Some(self.free())
    }

    fn debug_fields(&self, rate: &Configured, f: &mut fmt::DebugStruct<'_, '_>) {
        f.field("rate", &rate.rate())
            .field("capacity", &self.capacity());
    }
}

impl Engine<Bucket> {
    /// Builds a bucket; with `spawn_actor`, one whose waiters an actor
    /// wakes (built inside a runtime).
    pub(crate) fn start(
        setup: &Setup,
        meter: crate::meter::Slot,
    ) -> Result<Arc<Engine<Bucket>>, ConfigError> {
        let waking = Engine::<Bucket>::waking(setup.spawn_actor)?;
        let bucket = Bucket::new(setup.params, setup.deficit, setup.release);
        Ok(Engine::new(
            setup.kind,
            bucket,
            Configured::new(setup.rate),
            waking,
            meter,
        ))
    }

    pub(crate) fn rate(&self) -> Rate {
        self.lock().books.rate()
    }

    /// Whole tokens / units of free room at this instant.
    pub(crate) fn available(&self) -> u32 {
        self.schedule().free()
    }

    /// What a request of `n` would get now, and the band's state, without
    /// taking anything.
    pub(crate) fn peek(&self, n: u32) -> Peek {
        let rate = self.rate();
        let cell = &self.schedule().cell;
        // The clock after the state, as every decision reads it.
        let s = cell.snapshot();
        let now_nanos = cell.now_nanos();
        let (p, tat) = (s.params, s.tat());
        let now = p.scale_nanos(now_nanos);
        let answer = self.answer(n, || {
            p.try_pour(tat, now, n)
                .map(|_| ())
                .map_err(|short| p.duration_ceil(short))
        });
        let state = BandState::of(Band::new(rate, p.capacity()), &p, tat, now);
        Peek::new(answer, &[state])
    }

    /// Units of water (poured and reserved, not yet drained), rounded up.
    pub(crate) fn level(&self) -> u32 {
        let cell = &self.schedule().cell;
        let s = cell.snapshot();
        let now = cell.now_nanos();
        s.params.level(s.tat(), s.params.scale_nanos(now))
    }

    /// Changes the rate from now on; water already in the bucket (and the
    /// reservations of waiters) drains at the new rate.
    pub(crate) fn set_rate(&self, rate: Rate) -> Result<(), ConfigError> {
        let params = Params::new(rate, self.capacity())?;
        self.change(|bucket, queue| {
            let now = bucket.cell.now_nanos();
            bucket.cell.set_params(params, now, |old, new| {
                for turn in queue.turns_mut() {
                    turn.end = old.rescale(new, turn.end, now);
                }
            });
            queue.books = Configured::new(rate);
            ((), true)
        });
        tracing::debug!(limiter = self.kind.name(), %rate, "rate changed");
        Ok(())
    }
}
