//! Several GCRA bands decided as one request (a [`Quota`](crate::Quota)).
//!
//! Each band keeps its own `tat` in its own scaled units ([`Params`]). A
//! request is granted only when every band grants it, and then every band
//! is debited; a refusal changes no band. Times handed out (when a waiter
//! is released, a wait) are whole nanoseconds, rounded up: never before any
//! band's time. The time a waiter is poured at is exact, in each band's
//! own units (rounded up there), so that a band that never binds changes
//! nothing.
//!
//! # Waiters: poured at their turn
//!
//! A waiter's turn is the earliest instant at which every band, with the
//! reservations before it in place, lets it go: the latest of the bands'
//! own turns. It is then poured into *every* band as if it arrived at that
//! turn. Pouring it into each band at its arrival instead would let a band
//! that is not the one holding it back count its water as draining while
//! it waits; when the holding band let a run of waiters go together, the
//! other band would see them all at once (a per-second band exceeded by a
//! day band's release). Poured at its turn, every band's state is the GCRA
//! state of requests that arrived when they were granted, so each band's
//! window bound holds exactly.
//!
//! A waiter that comes back within the grace of a late release (tokio's
//! 1 ms timer) arrives, for every band, at that release's due time, as on
//! one band (`cell::Credit`): its turn may then be before now, and it goes
//! at once.
//!
//! # Withdrawal
//!
//! A withdrawn reservation gives back, in each band, the part not yet
//! drained ([`Params::refund`]), and the reservations behind it that are
//! not yet due are placed again, in order, by the same rule (see
//! [`Bands::withdraw`] for why no band over-admits).

use std::time::Duration;

use super::gcra::{MAX_TIME, Overflow, Params, Release, mul_div_ceil};

/// The most bands decided together (`Quota::MAX_BANDS`).
pub(crate) const MAX_BANDS: usize = 4;

/// One time per band, each in that band's scaled units.
pub(crate) type PerBand = [u128; MAX_BANDS];

/// The bands of a quota.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Bands {
    params: [Params; MAX_BANDS],
    len: usize,
}

/// A reservation across the bands: what withdrawing it, or one ahead of
/// it, needs to place it again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Placed {
    /// When it may go, in ns since the origin (rounded up).
    pub(crate) turn: u128,
    /// The same, rounded down: when it is due, for a timer credit.
    pub(crate) due: u128,
    /// Where its water ends in each band.
    pub(crate) ends: PerBand,
    /// Each band's state just before it was poured.
    before: PerBand,
    /// Its permits.
    n: u32,
    /// The rule it waits by (a leaky bucket's request for room waits by the
    /// token rule).
    release: Release,
}

impl Bands {
    /// The bands of `params` (one to [`MAX_BANDS`]).
    pub(crate) fn new(params: &[Params]) -> Bands {
        assert!(
            (1..=MAX_BANDS).contains(&params.len()),
            "one to {MAX_BANDS} bands"
        );
        let mut all = [params[0]; MAX_BANDS];
        all[..params.len()].copy_from_slice(params);
        Bands {
            params: all,
            len: params.len(),
        }
    }

    pub(crate) fn params(&self) -> &[Params] {
        &self.params[..self.len]
    }

    /// The most permits one request may take: the smallest capacity.
    pub(crate) fn capacity(&self) -> u32 {
        self.params()
            .iter()
            .map(Params::capacity)
            .min()
            .unwrap_or(0)
    }

    /// The state of bands that each lack `deficit` of their capacity (0:
    /// full of tokens / empty of water) at `now_ns`.
    pub(crate) fn start(&self, now_ns: u128, deficit: u32) -> PerBand {
        let mut tats = [0; MAX_BANDS];
        for (tat, p) in tats.iter_mut().zip(self.params()) {
            *tat = p.scale_nanos(now_ns) + p.cost(deficit);
        }
        tats
    }

    /// The meter: pours `n` units into every band at `now_ns` if every band
    /// has room, else changes nothing and says how long until all would
    /// (the latest of the bands' waits). The caller has checked
    /// `1 <= n <= capacity`.
    pub(crate) fn try_pour(
        &self,
        tats: &mut PerBand,
        now_ns: u128,
        n: u32,
    ) -> Result<(), Duration> {
        let mut ends = *tats;
        let mut wait = None;
        for ((end, &tat), p) in ends.iter_mut().zip(tats.iter()).zip(self.params()) {
            match p.try_pour(tat, p.scale_nanos(now_ns), n) {
                Ok(poured) => *end = poured,
                Err(short) => wait = wait.max(Some(p.duration_ceil(short))),
            }
        }
        match wait {
            None => {
                *tats = ends;
                Ok(())
            }
            Some(wait) => Err(wait),
        }
    }

    /// A waiter's reservation of `n` units at `now_ns`, as if it arrived at
    /// `arrival_ns` (`now_ns`, or earlier by a timer credit), not yet made:
    /// its turn, and its water poured into every band at that turn (see
    /// the module notes). The caller commits it by storing `ends` as the
    /// new state. A shaper's request overflows when, in some band, it would
    /// hold more than the capacity's worth of water at `now_ns`: it would
    /// wait longer than that band takes to drain.
    ///
    /// The turn is exact: the latest of the arrival and every band's own
    /// time, each band pouring at it in its own units (rounded up there).
    /// Only the instant the waiter is released is rounded up to a
    /// nanosecond; poured at that rounded instant, a band whose request
    /// empties it (`n` its capacity) would lose up to a nanosecond's water
    /// per request, and a quota run at that band's capacity would fall a
    /// tick behind the same band alone.
    pub(crate) fn reserve(
        &self,
        tats: &PerBand,
        now_ns: u128,
        arrival_ns: u128,
        n: u32,
        release: Release,
    ) -> Result<Placed, Overflow> {
        // Each band's own time, in its units.
        let mut ready = [0; MAX_BANDS];
        for ((ready, &tat), p) in ready.iter_mut().zip(tats).zip(self.params()) {
            let (now, arrival) = (p.scale_nanos(now_ns), p.scale_nanos(arrival_ns));
            *ready = p.reserve(tat, now, arrival, n, release)?.ready;
        }
        let mut turn = now_ns;
        let mut due = u128::MAX;
        let mut ends = *tats;
        for (b, p) in self.params().iter().enumerate() {
            // The turn in this band's units, rounded up there: never before
            // any band's time.
            let mut at = p.scale_nanos(arrival_ns);
            for (&ready, q) in ready.iter().zip(self.params()) {
                let here = if q.den() == p.den() {
                    ready
                } else {
                    mul_div_ceil(ready, p.den(), q.den())
                };
                at = at.max(here);
            }
            turn = turn.max(p.nanos_ceil(at));
            // Every band's `at` is at or after the exact turn, and the
            // band that set it has it exactly.
            due = due.min(p.nanos_floor(at));
            let end = tats[b].max(at).saturating_add(p.cost(n)).min(MAX_TIME);
            if release == Release::Water && end - p.scale_nanos(now_ns).min(end) > p.tau() {
                return Err(Overflow);
            }
            ends[b] = end;
        }
        Ok(Placed {
            turn,
            due,
            ends,
            before: *tats,
            n,
            release,
        })
    }

    /// Withdraws `gone` at `now_ns`: each band gets back its undrained part
    /// (as [`Params::refund`] says for one band), and every reservation in
    /// `behind` (those after it, in order) that is not yet due is placed
    /// again — for its permits, by its rule, as if asked at `now_ns` — on
    /// the state before it less what moved ahead of it; one already due
    /// keeps its turn, and its place moves with the states around it.
    /// Returns whether any turn moved.
    ///
    /// Why no band over-admits: unrolled, a band's state is the largest,
    /// over the requests poured, of (the time it was poured at + the water
    /// poured from then on). Every pour between two placed reservations (a
    /// meter's grant, a reservation already due) was made at or before
    /// `now`, and added the water between them; so the state before a
    /// reservation, with the one ahead of it moved by Δ, is at most
    /// `max(before − Δ, now + before − end_ahead)` — and for the last state
    /// with nothing behind, exactly the single band's refund rule. Each reservation is placed again on that bound, by the rule
    /// that placed it, so every band keeps the property the window bound
    /// rests on (see the module notes); and the state after the last one is
    /// bounded the same way.
    pub(crate) fn withdraw<'a>(
        &self,
        tats: &mut PerBand,
        gone: &Placed,
        now_ns: u128,
        behind: impl Iterator<Item = &'a mut Placed>,
    ) -> bool {
        let now = self.scaled(now_ns);
        // The end of the reservation ahead, before and after it moved.
        let old_ahead = gone.ends;
        // Without `gone`, each band is as before it, but for the part of its
        // water already drained (a held reservation, granted and dropped
        // later): the single band's refund rule, and also the time between
        // the band's state and the turn it was poured at.
        let mut new_ahead = gone.ends;
        for b in 0..self.len {
            new_ahead[b] = gone.before[b].max(gone.ends[b].min(now[b]));
        }
        let mut old_ahead = old_ahead;
        let mut moved = false;
        for later in behind {
            let before = self.moved(&later.before, &old_ahead, &new_ahead, &now);
            if later.turn <= now_ns {
                // Due: poured like a meter's grant, at or before now, and
                // it stays. Its place moves as the states around it do, so
                // that withdrawing it later gives back only what is there.
                let ends = self.moved(&later.ends, &old_ahead, &new_ahead, &now);
                old_ahead = later.ends;
                new_ahead = ends;
                later.before = before;
                later.ends = ends;
                continue;
            }
            // Placed again, for its permits and by its rule, as if asked
            // now: poured no earlier than now, so that no band counts its
            // water as draining while it waited. (It cannot overflow: the
            // water ahead is less, and as much later as the time since.)
            let Ok(again) = self.reserve(&before, now_ns, now_ns, later.n, later.release) else {
                continue;
            };
            old_ahead = later.ends;
            new_ahead = again.ends;
            moved |= again.turn != later.turn;
            *later = again;
        }
        *tats = self.moved(tats, &old_ahead, &new_ahead, &now);
        moved
    }

    /// A state poured after a reservation that moved from `old_ahead` to
    /// `new_ahead`, bounded as in [`withdraw`](Self::withdraw).
    fn moved(
        &self,
        state: &PerBand,
        old_ahead: &PerBand,
        new_ahead: &PerBand,
        now: &PerBand,
    ) -> PerBand {
        let mut moved = *state;
        for b in 0..self.len {
            let (state, old, new) = (state[b], old_ahead[b], new_ahead[b]);
            let between = state.saturating_sub(old);
            moved[b] = state
                .saturating_sub(old - new)
                .max(now[b].saturating_add(between).min(state));
        }
        moved
    }

    /// `ns` nanoseconds in each band's scaled units.
    #[inline]
    pub(crate) fn scaled(&self, ns: u128) -> PerBand {
        let mut scaled = [0; MAX_BANDS];
        for (s, p) in scaled.iter_mut().zip(self.params()) {
            *s = p.scale_nanos(ns);
        }
        scaled
    }

    /// Whole permits available at `now_ns`: the fewest of any band.
    pub(crate) fn available(&self, tats: &PerBand, now_ns: u128) -> u32 {
        tats.iter()
            .zip(self.params())
            .map(|(&tat, p)| p.available(tat, p.scale_nanos(now_ns)))
            .min()
            .unwrap_or(0)
    }

    /// Units of water at `now_ns`, rounded up: the most of any band.
    pub(crate) fn level(&self, tats: &PerBand, now_ns: u128) -> u32 {
        tats.iter()
            .zip(self.params())
            .map(|(&tat, p)| p.level(tat, p.scale_nanos(now_ns)))
            .max()
            .unwrap_or(0)
    }
}

/// Several quotas' bands counted in one time unit per band index: band `b`
/// of every quota in units of the least common multiple of their `den`s.
/// A keyed map stores one state per key whichever quota the key is held to;
/// in shared units the state is the same instants under each (when each
/// band is empty), so a key that changes quota keeps them exactly. Returns
/// the quotas so rescaled, and the bands that give each index's unit (for
/// a state with more bands than some quota has); `None` when a common unit
/// would be finer than 2³² per ns.
pub(crate) fn in_common_units(quotas: &[Vec<Params>]) -> Option<(Vec<Bands>, Bands)> {
    let most = quotas.iter().map(Vec::len).max()?;
    let mut units = Vec::with_capacity(most);
    for b in 0..most {
        let mut den = 1;
        let mut example = None;
        for p in quotas.iter().filter_map(|q| q.get(b)) {
            den = super::lcm(den, p.den())?;
            example = Some(*p);
        }
        units.push(example?.in_units_of(den)?);
    }
    let rescaled = quotas
        .iter()
        .map(|q| {
            let bands: Option<Vec<Params>> = q
                .iter()
                .zip(&units)
                .map(|(p, unit)| p.in_units_of(unit.den()))
                .collect();
            bands.map(|bands| Bands::new(&bands))
        })
        .collect::<Option<Vec<Bands>>>()?;
    Some((rescaled, Bands::new(&units)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Rate;

    const S: u128 = 1_000_000_000;

    fn bands(spec: &[(Rate, u32)]) -> Bands {
        let params: Vec<Params> = spec
            .iter()
            .map(|&(rate, capacity)| Params::new(rate, capacity).unwrap())
            .collect();
        Bands::new(&params)
    }

    /// A band that never binds changes no turn: requests of the binding
    /// band's whole capacity, each made at the turn of the one before (a
    /// waiter that comes straight back), are due exactly when that band
    /// alone says, though its turns (1/7 s apart) are not whole
    /// nanoseconds. Poured at the turn rounded up, the binding band lost up
    /// to a nanosecond a request: the eighth fell due at 1.000 000 001 s.
    #[test]
    fn a_band_that_never_binds_changes_no_turn() {
        for (rate, capacity) in [(Rate::per_second(7), 1), (Rate::per_second(3_000), 1_000)] {
            let alone = Params::new(rate, capacity).unwrap();
            let b = bands(&[
                (rate, capacity),
                (Rate::per_day(4_000_000_000), 4_000_000_000),
            ]);
            let mut tats = b.start(0, 0);
            let mut tat = alone.scale_nanos(0);
            let mut now = 0;
            for i in 0..50 {
                let placed = b
                    .reserve(&tats, now, now, capacity, Release::Tokens)
                    .unwrap();
                let place = alone
                    .reserve(
                        tat,
                        alone.scale_nanos(now),
                        alone.scale_nanos(now),
                        capacity,
                        Release::Tokens,
                    )
                    .unwrap();
                assert_eq!(
                    placed.turn,
                    alone.nanos_ceil(place.ready).max(now),
                    "{rate:?}: request {i}"
                );
                tats = placed.ends;
                tat = place.end;
                now = placed.turn;
            }
        }
    }

    #[test]
    fn a_refusal_changes_no_band() {
        // 10/s burst 10, and 12 per minute burst 12.
        let b = bands(&[(Rate::per_second(10), 10), (Rate::per_minute(12), 12)]);
        let mut tats = b.start(0, 0);
        assert_eq!(b.try_pour(&mut tats, 0, 10), Ok(()));
        let before = tats;
        // The per-second band refuses 1 (100 ms), the minute band has 2.
        assert_eq!(b.try_pour(&mut tats, 0, 1), Err(Duration::from_millis(100)));
        assert_eq!(tats, before);
        // At 1 s the per-second band is full again; the minute band holds 2.
        assert_eq!(b.try_pour(&mut tats, S, 3), Err(Duration::from_secs(4)));
        assert_eq!(tats, before);
        assert_eq!(b.try_pour(&mut tats, S, 2), Ok(()));
        assert_eq!(b.available(&tats, S), 0);
    }

    #[test]
    fn retry_after_is_the_latest_band() {
        let b = bands(&[(Rate::per_second(1), 1), (Rate::per_second(2), 1)]);
        let mut tats = b.start(0, 0);
        assert_eq!(b.try_pour(&mut tats, 0, 1), Ok(()));
        assert_eq!(b.try_pour(&mut tats, 0, 1), Err(Duration::from_secs(1)));
        assert_eq!(
            b.try_pour(&mut tats, S / 2, 1),
            Err(Duration::from_millis(500))
        );
        assert_eq!(b.try_pour(&mut tats, S, 1), Ok(()));
    }

    #[test]
    fn waiters_are_poured_at_their_turn() {
        // The per-second band (1/s, burst 1) must space waiters released
        // together by the minute band (burst 3, 3 per minute).
        let b = bands(&[(Rate::per_second(1), 1), (Rate::per_minute(3), 3)]);
        let mut tats = b.start(0, 0);
        // Empty the minute band: three permits, one per second.
        for t in 0..3 {
            assert_eq!(b.try_pour(&mut tats, t * S, 1), Ok(()));
        }
        // Three waiters at 2 s: the minute band gives one per 20 s.
        let mut turns = vec![];
        for _ in 0..3 {
            let placed = b.reserve(&tats, 2 * S, 2 * S, 1, Release::Tokens).unwrap();
            tats = placed.ends;
            turns.push(placed.turn / S);
        }
        assert_eq!(turns, [20, 40, 60]);
    }

    #[test]
    fn a_run_released_together_is_still_spaced_by_the_other_band() {
        // A band of 1/s (burst 1), and a fast band (100/s, burst 1000) that
        // is 5 s over its burst: it holds the first waiters until 5 s, then
        // would let them go 10 ms apart. The slow band must space them.
        let b = bands(&[(Rate::per_second(1), 1), (Rate::per_second(100), 1000)]);
        let mut tats = b.start(0, 0);
        tats[1] = b.params()[1].scale_nanos(15 * S);
        let mut turns = vec![];
        for _ in 0..4 {
            let placed = b.reserve(&tats, 0, 0, 1, Release::Tokens).unwrap();
            tats = placed.ends;
            turns.push(placed.turn);
        }
        assert_eq!(
            turns,
            [
                5 * S + S / 100,
                6 * S + S / 100,
                7 * S + S / 100,
                8 * S + S / 100
            ]
        );
    }

    #[test]
    fn a_shaper_overflows_when_any_band_is_full() {
        let b = bands(&[(Rate::per_second(10), 2), (Rate::per_second(1), 5)]);
        let tats = b.start(0, 0);
        let first = b.reserve(&tats, 0, 0, 1, Release::Water).unwrap();
        assert_eq!(first.turn, 0);
        // The second waits 1 s for the slow band: more than the fast band's
        // 200 ms of room.
        assert_eq!(
            b.reserve(&first.ends, 0, 0, 1, Release::Water),
            Err(Overflow)
        );
    }

    #[test]
    fn a_withdrawal_places_the_ones_behind_again() {
        let b = bands(&[(Rate::per_second(10), 1), (Rate::per_second(1), 1)]);
        let tats = b.start(0, 0);
        let first = b.reserve(&tats, 0, 0, 1, Release::Tokens).unwrap();
        let second = b.reserve(&first.ends, 0, 0, 1, Release::Tokens).unwrap();
        let mut third = b.reserve(&second.ends, 0, 0, 1, Release::Tokens).unwrap();
        assert_eq!((first.turn, second.turn, third.turn), (0, S, 2 * S));
        // The second withdrawn at 0: the third takes its turn.
        let mut tats = third.ends;
        assert!(b.withdraw(&mut tats, &second, 0, std::iter::once(&mut third)));
        assert_eq!(third.turn, S);
        assert_eq!(tats, third.ends);
        // And withdrawn in turn, the state is as after the first alone.
        let third = third;
        assert!(!b.withdraw(&mut tats, &third, 0, std::iter::empty()));
        assert_eq!(tats, first.ends);
    }

    /// A band: `permits` per `period_ns`, burst `capacity`.
    #[derive(Debug, Clone, Copy)]
    struct Spec {
        permits: u32,
        period_ns: u64,
        capacity: u32,
    }

    fn spec() -> impl proptest::strategy::Strategy<Value = Spec> {
        use proptest::prelude::*;
        // From 1 per day to a million per second.
        let periods = prop_oneof![
            Just(1_000_000u64),
            Just(1_000_000_000),
            Just(60_000_000_000),
            Just(86_400_000_000_000),
        ];
        (1u32..=1000, periods, 1u32..=40).prop_map(|(permits, period_ns, capacity)| Spec {
            permits,
            period_ns,
            capacity,
        })
    }

    proptest::proptest! {
        /// Over random band sets and arrivals: a refusal leaves every band
        /// bit for bit as it was; `retry_after` is exactly the first
        /// nanosecond at which every band grants; and in every band, any
        /// window of length T holds at most capacity + rate × T permits.
        #[test]
        fn the_meter_across_bands(
            specs in proptest::collection::vec(spec(), 1..=4),
            arrivals in proptest::collection::vec((0u64..50_000_000_000, 1u32..=40), 1..120),
        ) {
            let params: Vec<Params> = specs
                .iter()
                .map(|s| Params::new(Rate::per(s.permits, Duration::from_nanos(s.period_ns)), s.capacity).unwrap())
                .collect();
            let b = Bands::new(&params);
            let mut tats = b.start(0, 0);
            let mut now = 0u128;
            let mut granted: Vec<(u128, u32)> = vec![];
            for (gap, n) in arrivals {
                // Mostly short gaps, sometimes a long idle.
                now += u128::from(if gap % 7 == 0 { gap } else { gap % 20_000_000 });
                let n = n.min(b.capacity());
                let before = tats;
                match b.try_pour(&mut tats, now, n) {
                    Ok(()) => granted.push((now, n)),
                    Err(wait) => {
                        proptest::prop_assert_eq!(tats, before);
                        let at = now + wait.as_nanos();
                        let mut later = before;
                        proptest::prop_assert!(b.try_pour(&mut later, at, n).is_ok(), "not granted after retry_after");
                        let mut earlier = before;
                        proptest::prop_assert!(b.try_pour(&mut earlier, at - 1, n).is_err(), "granted before retry_after");
                    }
                }
            }
            for s in &specs {
                for (i, &(start, _)) in granted.iter().enumerate() {
                    let mut sum = 0u128;
                    for &(t, n) in &granted[i..] {
                        sum += u128::from(n);
                        let allowed = u128::from(s.capacity)
                            + (t - start) * u128::from(s.permits) / u128::from(s.period_ns);
                        proptest::prop_assert!(sum <= allowed, "{sum} in [{start}, {t}] over {s:?}");
                    }
                }
            }
        }
    }
}
