//! The schedule of a bucket limiter built from a quota of several bands:
//! every band's `tat` under the engine's lock ([`Bands`] decides).
//!
//! One band stays on the lock-free [`Bucket`](super::Bucket); several
//! cannot be changed by one compare-and-swap, and a refusal must leave all
//! of them as they were, so they are decided under the lock (which the
//! meter then takes too). A waiter woken late is credited for the
//! lateness as on one band ([`Credit`]).

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::time::Instant;

use super::published::Published;
use super::{Engine, Kind, Reserve, Schedule, Waits};
use crate::algorithm::{Bands, PerBand, Placed, Release, Taken};
use crate::cell::Credit;
use crate::{ConfigError, Peek, Quota, clock};

/// The schedule over several bands.
///
/// Aligned to a cache line, so the engine's first counter stripe, which
/// follows it, never shares a line its refusals read (see [`Engine`]).
#[repr(align(64))]
pub(crate) struct Banded {
    bands: Bands,
    quota: Quota,
    release: Release,
    /// Tokens a newly built bucket lacks in every band.
    fresh_deficit: u32,
    origin: clock::Origin,
    closed: AtomicBool,
    /// The bands' states after every change, for refusals without the lock.
    published: Published,
    /// The latest waiter released after its turn (written and read under
    /// the engine's lock).
    credit: Credit,
}

impl Banded {
    fn now(&self) -> u128 {
        u128::from(self.origin.elapsed_nanos())
    }

    /// [`Schedule::try_take`], as a `Result` (`Err(None)`: closed).
    fn try_take_result(engine: &Engine<Self>, n: u32) -> Result<(), Option<Duration>> {
        let banded = engine.schedule();
        if banded.is_closed() {
            return Err(None);
        }
        // Refused on the published states: the answer at the instant they
        // were read, without the lock. The clock is read after them: read
        // before, it may predate a grant they include, which would then
        // read as a fuller band than it is. (The counter is not ordered
        // with the loads: a reading a hair early refuses at worst a request
        // due within that hair; see ARCHITECTURE.md, "Readings out of
        // order".)
        let published = banded.published.read();
        let now = banded.now();
        if let Some(mut tats) = published {
            banded.bands.try_pour(&mut tats, now, n).map_err(Some)?;
        }
        let mut queue = engine.lock();
        if banded.is_closed() {
            return Err(None);
        }
        // Others may have been granted while this caller waited for the
        // lock: a refusal looks again with the clock read now, after the
        // lock (an ordered read: a counter read early could be earlier
        // than a grant the lock has just shown).
        if banded.bands.try_pour(&mut queue.books, now, n).is_err() {
            let now = u128::from(banded.origin.elapsed_nanos_ordered());
            banded
                .bands
                .try_pour(&mut queue.books, now, n)
                .map_err(Some)?;
        }
        banded.published.publish(&queue.books);
        Ok(())
    }
}

impl Schedule for Banded {
    /// The turn, and where the entry's water ends in every band.
    type Turn = Placed;
    /// Every band's `tat`.
    type Books = PerBand;
    /// Nanoseconds since the origin.
    type View = u128;
    type Gap = ();

    fn capacity(&self) -> u32 {
        self.bands.capacity()
    }

    fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    fn close(&self) {
        self.closed.store(true, Ordering::Release);
    }

    fn try_take(engine: &Engine<Self>, n: u32) -> Taken {
        Banded::try_take_result(engine, n).into()
    }

    fn reserve_unlocked(&self, _: u32, _: Option<Duration>, _: Waits) -> Option<Reserve<()>> {
        None
    }

    fn reserve(
        &self,
        tats: &mut PerBand,
        n: u32,
        max_wait: Option<Duration>,
        waits: Waits,
    ) -> Reserve<Placed> {
        if self.is_closed() {
            return Reserve::Closed;
        }
        let now = self.now();
        let arrival = self.credit.due(now).unwrap_or(now);
        let Ok(placed) = self
            .bands
            .reserve(tats, now, arrival, n, waits.rule(self.release))
        else {
            return Reserve::Overflow;
        };
        let wait = placed.turn - now;
        if max_wait.is_some_and(|max| wait > max.as_nanos()) {
            return Reserve::TooLong;
        }
        *tats = placed.ends;
        self.published.publish(tats);
        if wait == 0 {
            Reserve::Ready(placed)
        } else {
            Reserve::Queued(placed)
        }
    }

    fn follow(&self, _: &mut Placed, _: &Placed) {
        // Each turn is at least the turn of the band that set the one
        // before it: always in order.
    }

    fn view(&self, _: &PerBand) -> u128 {
        self.now()
    }

    fn is_due(&self, now: &u128, turn: &Placed, _: u32) -> bool {
        turn.turn <= *now
    }

    fn instant(&self, _: &u128, turn: &Placed, _: u32) -> Option<Instant> {
        Some(
            self.origin
                .instant_after(crate::algorithm::nanos_to_duration(turn.turn)),
        )
    }

    fn granted(&self, _: &mut PerBand, now: &u128, turn: &Placed, _: u32) {
        if turn.due < *now {
            self.credit.note(turn.due, *now);
        }
    }

    fn withdraw<'a>(
        &self,
        tats: &mut PerBand,
        now: &u128,
        placed: Placed,
        _: u32,
        behind: impl Iterator<Item = &'a mut Placed>,
    ) -> bool {
        let moved = self.bands.withdraw(tats, &placed, *now, behind);
        self.published.publish(tats);
        moved
    }

    fn is_fresh(&self, tats: &PerBand) -> bool {
        // Built below capacity: never fresh (see the one-band bucket's).
        if self.fresh_deficit != 0 {
            return false;
        }
        let now = self.now();
        if self.credit.due(now).is_some() {
            return false;
        }
        let fresh = self.bands.start(now, self.fresh_deficit);
        tats.iter()
            .zip(fresh)
            .zip(self.bands.params())
            .all(|((&tat, fresh), p)| tat.max(p.scale_nanos(now)) == fresh)
    }

    fn available(&self, tats: &PerBand) -> Option<u32> {
        Some(self.bands.available(tats, self.now()))
    }

    fn debug_fields(&self, _: &PerBand, f: &mut fmt::DebugStruct<'_, '_>) {
        f.field("quota", &self.quota)
            .field("capacity", &self.capacity());
    }
}

impl Engine<Banded> {
    /// Builds a bucket of several bands; with `spawn_actor`, one whose
    /// waiters an actor wakes (built inside a runtime).
    pub(crate) fn start_bands(
        kind: Kind,
        quota: Quota,
        deficit: u32,
        release: Release,
        spawn_actor: bool,
        meter: crate::meter::Slot,
    ) -> Result<Arc<Engine<Banded>>, ConfigError> {
        let bands = Bands::new(&quota.params()?);
        let waking = Engine::<Banded>::waking(spawn_actor)?;
        let origin = clock::Origin::now();
        let banded = Banded {
            bands,
            quota,
            release,
            fresh_deficit: deficit,
            origin,
            closed: AtomicBool::new(false),
            published: Published::new(&bands.start(0, deficit)),
            credit: Credit::new(),
        };
        let tats = bands.start(0, deficit);
        Ok(Engine::new(kind, banded, tats, waking, meter))
    }

    pub(crate) fn quota(&self) -> Quota {
        self.schedule().quota
    }

    /// Whole tokens / units of free room now: the fewest of any band.
    pub(crate) fn available(&self) -> u32 {
        let queue = self.lock();
        self.schedule().available(&queue.books).unwrap_or(0)
    }

    /// What a request of `n` would get now, and every band's state,
    /// without taking anything.
    pub(crate) fn peek(&self, n: u32) -> Peek {
        let banded = self.schedule();
        let tats = self.lock().books;
        let now = banded.now();
        let answer = self.answer(n, || banded.bands.try_pour(&mut tats.clone(), now, n));
        Peek::of_bands(answer, &banded.quota, &banded.bands, &tats, now)
    }

    /// Units of water now, rounded up: the most of any band.
    pub(crate) fn level(&self) -> u32 {
        let queue = self.lock();
        let banded = self.schedule();
        banded.bands.level(&queue.books, banded.now())
    }
}
