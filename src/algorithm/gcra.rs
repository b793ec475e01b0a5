//! The generic cell rate algorithm (GCRA) in exact rational time.
//!
//! The funnel, the leaky bucket (as a meter and as a shaper) and the token
//! bucket are one algorithm seen from different sides. The state is a single
//! instant, the *theoretical arrival time* `tat`: the moment the bucket would
//! be empty of water (for a token bucket: full of tokens) if nothing else
//! were poured in. At time `now` the bucket holds `max(0, tat - now) / I`
//! units of water, where `I` is the time one permit takes to drain (the
//! emission interval), and `capacity - water` tokens.
//!
//! # Exact time
//!
//! `I = period / permits` is rarely a whole number of nanoseconds (a third
//! of a second, 1/7 µs). To stay exact, time is counted in *scaled units* of
//! `1/den` ns, where `num / den` is `I` in lowest terms: one permit costs
//! exactly `num` units, `now` in nanoseconds becomes `now * den` units, and
//! every comparison is an integer comparison. `den` is at most `u32::MAX`
//! and times are capped at [`MAX_TIME`] (2¹⁰⁰ − 1 units, more than nine
//! thousand years at the finest scale), so all arithmetic fits in `u128`
//! and saturates rather than wraps.
//!
//! Durations handed back to callers are rounded *up* to the next
//! nanosecond: a permit due at 333 333 333⅓ ns is available at
//! 333 333 334 ns, never before its time.
//!
//! # Decisions
//!
//! * [`Params::try_pour`] — the meter (`try_acquire`): pour `n` units if the
//!   bucket has room for them now, else say exactly when it will.
//! * [`Params::reserve`] — a waiter (`acquire`): pour now, on credit, and be
//!   told when the permits are the caller's. For a token bucket that is when
//!   the bucket is back within its capacity ([`Release::Tokens`]); for the
//!   leaky-bucket shaper it is when the water ahead has drained
//!   ([`Release::Water`]). Reservations are made in arrival order, which is
//!   what makes waiters FIFO and lets a later `try_acquire` see them.
//! * [`Params::refund`] — a reservation given up before it was used.

use std::time::Duration;

use crate::{ConfigError, Rate};

/// The largest time (in scaled units) the algorithm represents; later times
/// saturate here.
pub(crate) const MAX_TIME: u128 = (1 << 100) - 1;

/// The exact parameters of one bucket: the emission interval `num / den` ns
/// and the capacity.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Params {
    /// The emission interval in scaled units (always a whole number of them).
    num: u64,
    /// Scaled units per nanosecond.
    den: u64,
    capacity: u32,
}

/// When a reservation is granted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Release {
    /// Token bucket / funnel: once the bucket, with this request poured in,
    /// is back within its capacity (`end - capacity * I`).
    Tokens,
    /// Leaky-bucket shaper: once the water poured before this request has
    /// drained (`end - n * I`), and only if the request fits at all.
    Water,
}

/// A reservation's place on the time line: the request's water ends at
/// `end`; the caller may proceed at `ready`. Both in scaled units.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Place {
    pub(crate) end: u128,
    pub(crate) ready: u128,
}

/// A shaper request that does not fit in the bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Overflow;

impl Params {
    /// Checks the rate and capacity and reduces the interval to lowest terms.
    pub(crate) fn new(rate: Rate, capacity: u32) -> Result<Params, ConfigError> {
        rate.validate()?;
        if capacity == 0 {
            return Err(ConfigError::ZeroCapacity);
        }
        let period = rate.period_nanos();
        let permits = u64::from(rate.permits());
        let g = gcd(period, permits);
        Ok(Params {
            num: period / g,
            den: permits / g,
            capacity,
        })
    }

    /// The bucket's capacity (its burst).
    pub(crate) fn capacity(&self) -> u32 {
        self.capacity
    }

    /// The emission interval in scaled units.
    pub(crate) fn num(&self) -> u64 {
        self.num
    }

    /// Scaled units per nanosecond.
    pub(crate) fn den(&self) -> u64 {
        self.den
    }

    /// Rebuilds parameters from their raw parts (as stored by a lock-free
    /// cell).
    pub(crate) fn from_parts(num: u64, den: u64, capacity: u32) -> Params {
        Params { num, den, capacity }
    }

    /// The same bucket counted in units of `1/den` ns, for a `den` that is a
    /// multiple of this one's (several quotas of one keyed map share a unit
    /// per band, so a key's stored instants mean the same under each);
    /// `None` when the interval in those units would not fit.
    pub(crate) fn in_units_of(&self, den: u64) -> Option<Params> {
        if den % self.den != 0 || den > u64::from(u32::MAX) {
            return None;
        }
        Some(Params {
            num: self.num.checked_mul(den / self.den)?,
            den,
            capacity: self.capacity,
        })
    }

    /// The drain time of `n` units.
    pub(crate) fn cost(&self, n: u32) -> u128 {
        u128::from(self.num) * u128::from(n)
    }

    /// The drain time of a full bucket (the GCRA's tolerance, τ).
    pub(crate) fn tau(&self) -> u128 {
        self.cost(self.capacity)
    }

    /// A time since the origin, in scaled units.
    pub(crate) fn scale(&self, t: Duration) -> u128 {
        self.scale_nanos(t.as_nanos())
    }

    /// Nanoseconds in scaled units.
    #[inline]
    pub(crate) fn scale_nanos(&self, nanos: u128) -> u128 {
        // Below 2⁶⁴ ns (584 years) the product is below 2⁹⁶: one 64-bit
        // multiplication, no overflow check.
        match u64::try_from(nanos) {
            Ok(small) => u128::from(small) * u128::from(self.den),
            Err(_) => nanos.saturating_mul(u128::from(self.den)).min(MAX_TIME),
        }
    }

    /// Scaled units as a duration, rounded up to the next nanosecond.
    pub(crate) fn duration_ceil(&self, scaled: u128) -> Duration {
        // The common cases divide in 64 bits (or not at all): a 128-bit
        // division is a library call.
        if let Ok(small) = u64::try_from(scaled) {
            return self.duration_ceil_narrow(small);
        }
        nanos_to_duration(scaled.div_ceil(u128::from(self.den)))
    }

    /// [`duration_ceil`](Self::duration_ceil) of a 64-bit quantity: inline,
    /// so that a refusal on the meter's 64-bit path makes no call.
    #[inline]
    pub(crate) fn duration_ceil_narrow(&self, scaled: u64) -> Duration {
        // Whole-nanosecond rates need no division at all.
        if self.den == 1 {
            return Duration::from_nanos(scaled);
        }
        Duration::from_nanos(scaled.div_ceil(self.den))
    }

    /// Scaled units in whole nanoseconds, rounded up.
    pub(crate) fn nanos_ceil(&self, scaled: u128) -> u128 {
        match u64::try_from(scaled) {
            Ok(small) => u128::from(small.div_ceil(self.den)),
            Err(_) => scaled.div_ceil(u128::from(self.den)),
        }
    }

    /// Scaled units in whole nanoseconds, rounded down.
    pub(crate) fn nanos_floor(&self, scaled: u128) -> u128 {
        match u64::try_from(scaled) {
            Ok(small) => u128::from(small / self.den),
            Err(_) => scaled / u128::from(self.den),
        }
    }

    /// The meter: pours `n` units at `now` if they fit.
    ///
    /// Returns the new `tat`, or how long (scaled) until they would fit.
    /// The caller has checked `1 <= n <= capacity`.
    ///
    /// When every quantity fits in 64 bits — `tat`, `now`, the cost, τ and
    /// the new `tat` (at a rate of whole nanoseconds, `den` = 1, for the
    /// first 584 years) — it computes in 64-bit arithmetic, where nothing
    /// saturates (2⁶⁴ is far below [`MAX_TIME`]), so the result is the same
    /// as in 128 bits; otherwise in 128 bits.
    #[inline]
    pub(crate) fn try_pour(&self, tat: u128, now: u128, n: u32) -> Result<u128, u128> {
        if let (Ok(tat), Ok(now)) = (u64::try_from(tat), u64::try_from(now)) {
            if let Some(result) = self.try_pour_narrow(tat, now, n) {
                return result.map(u128::from).map_err(u128::from);
            }
        }
        self.try_pour_wide(tat, now, n)
    }

    /// [`try_pour`](Self::try_pour) in 64 bits; `None` when a quantity
    /// does not fit.
    #[inline]
    pub(crate) fn try_pour_narrow(&self, tat: u64, now: u64, n: u32) -> Option<Result<u64, u64>> {
        let cost = self.num.checked_mul(u64::from(n))?;
        let tau = self.num.checked_mul(u64::from(self.capacity))?;
        let end = tat.max(now).checked_add(cost)?;
        let water = end - now;
        Some(if water <= tau {
            Ok(end)
        } else {
            Err(water - tau)
        })
    }

    /// [`try_pour`](Self::try_pour) in 128 bits.
    fn try_pour_wide(&self, tat: u128, now: u128, n: u32) -> Result<u128, u128> {
        let end = add(tat.max(now), self.cost(n));
        let water = end - now;
        if water <= self.tau() {
            Ok(end)
        } else {
            Err(water - self.tau())
        }
    }

    /// A waiter's reservation: pours `n` units now, on credit, as if the
    /// request had arrived at `arrival` (`<= now`; later than `now` only
    /// with the timer credit described in the crate's `queue` module).
    ///
    /// [`Release::Water`] refuses a request that does not fit with
    /// [`Overflow`]; [`Release::Tokens`] always reserves (the caller has
    /// checked `n <= capacity`).
    pub(crate) fn reserve(
        &self,
        tat: u128,
        now: u128,
        arrival: u128,
        n: u32,
        release: Release,
    ) -> Result<Place, Overflow> {
        let end = add(tat.max(arrival), self.cost(n));
        if release == Release::Water && end.saturating_sub(now) > self.tau() {
            return Err(Overflow);
        }
        Ok(Place {
            end,
            ready: self.ready(end, n, release),
        })
    }

    /// When a reservation ending at `end` may proceed.
    pub(crate) fn ready(&self, end: u128, n: u32, release: Release) -> u128 {
        match release {
            Release::Tokens => end.saturating_sub(self.tau()),
            Release::Water => end.saturating_sub(self.cost(n)),
        }
    }

    /// How much of a reservation of `n` units ending at `end` can be given
    /// back at `now`: the part that has not drained yet. Giving back more
    /// would let the freed room be used twice.
    ///
    /// Why this never over-admits: let `tat` be the state with the request
    /// and `tat'` the state had it never come. GCRA's `tat` is the largest,
    /// over the requests so far, of (arrival + water poured from then on).
    /// Terms for requests before it lose exactly `n·I`, so are at most
    /// `tat − n·I`; terms for requests after it arrived at or before `now`
    /// and carry at most the water behind it, `tat − end`, so are at most
    /// `now + tat − end`. Hence `tat' ≤ max(tat − n·I, tat − (end − now))
    /// = tat − refund`: after the refund the state is never below the one
    /// without the request, and the reservations behind it, shifted by the
    /// same amount, never start before they would have.
    pub(crate) fn refund(&self, end: u128, n: u32, now: u128) -> u128 {
        self.cost(n).min(end.saturating_sub(now))
    }

    /// Whole tokens available at `now` (0 while waiters have reserved more
    /// than the bucket holds).
    pub(crate) fn available(&self, tat: u128, now: u128) -> u32 {
        let water = tat.saturating_sub(now);
        let tau = self.tau();
        if water >= tau {
            0
        } else {
            // ≤ capacity, so the cast cannot truncate.
            u32::try_from((tau - water) / u128::from(self.num)).unwrap_or(u32::MAX)
        }
    }

    /// Units of water in the bucket at `now`, rounded up.
    pub(crate) fn level(&self, tat: u128, now: u128) -> u32 {
        let water = tat.saturating_sub(now);
        u32::try_from(water.div_ceil(u128::from(self.num))).unwrap_or(u32::MAX)
    }

    /// Converts an instant `t` of this bucket into the time scale of `to`
    /// (same origin), keeping the water still undrained at `now_nanos`: that
    /// water drains at the new rate from now on. Rounds up, so a change of
    /// rate never frees a fraction of a permit.
    pub(crate) fn rescale(&self, to: &Params, t: u128, now_nanos: u128) -> u128 {
        let now_from = self.scale_nanos(now_nanos);
        let now_to = to.scale_nanos(now_nanos);
        if t <= now_from {
            return now_to;
        }
        add(now_to, mul_div_ceil(t - now_from, to.num, self.num))
    }
}

#[inline]
fn add(a: u128, b: u128) -> u128 {
    a.saturating_add(b).min(MAX_TIME)
}

/// The least common multiple of two positive numbers, if it fits.
pub(crate) fn lcm(a: u64, b: u64) -> Option<u64> {
    (a / gcd(a, b)).checked_mul(b)
}

fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

/// Nanoseconds as a `Duration`, saturating at `Duration::MAX`.
pub(crate) fn nanos_to_duration(nanos: u128) -> Duration {
    const NANOS_PER_SEC: u128 = 1_000_000_000;
    if let Ok(small) = u64::try_from(nanos) {
        return Duration::from_nanos(small);
    }
    match u64::try_from(nanos / NANOS_PER_SEC) {
        // The remainder is below 10⁹, so it fits in a u32.
        Ok(secs) => Duration::new(secs, (nanos % NANOS_PER_SEC) as u32),
        Err(_) => Duration::MAX,
    }
}

/// `ceil(a * b / c)` without overflow, saturating at [`MAX_TIME`].
#[expect(
    clippy::cast_possible_truncation,
    reason = "limbs are split on purpose"
)]
pub(crate) fn mul_div_ceil(a: u128, b: u64, c: u64) -> u128 {
    // The product as three 64-bit limbs, most significant first.
    let lo = (a & u128::from(u64::MAX)) * u128::from(b);
    let hi = (a >> 64) * u128::from(b) + (lo >> 64);
    let limbs = [(hi >> 64) as u64, hi as u64, lo as u64];
    // Schoolbook division by a single limb.
    let c = u128::from(c);
    let mut rem = 0u128;
    let mut quotient = [0u64; 3];
    for (q, limb) in quotient.iter_mut().zip(limbs) {
        let cur = (rem << 64) | u128::from(limb);
        *q = (cur / c) as u64;
        rem = cur % c;
    }
    if quotient[0] != 0 {
        return MAX_TIME;
    }
    let q = (u128::from(quotient[1]) << 64) | u128::from(quotient[2]);
    add(q, u128::from(rem != 0))
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn p(rate: Rate, capacity: u32) -> Params {
        Params::new(rate, capacity).unwrap()
    }

    const MS: u128 = 1_000_000;

    #[test]
    fn lowest_terms() {
        let third = p(Rate::per_second(3), 1);
        assert_eq!((third.num, third.den), (1_000_000_000, 3));
        let seven_m = p(Rate::per_second(7_000_000), 1);
        assert_eq!((seven_m.num, seven_m.den), (1000, 7));
        let every = p(Rate::every(Duration::from_millis(100)), 1);
        assert_eq!((every.num, every.den), (100_000_000, 1));
    }

    #[test]
    fn exact_at_thirds() {
        // 3/s, capacity 1: permits fall due at 0, ⅓ s, ⅔ s, 1 s — exactly,
        // and are handed out at the first whole nanosecond not before that.
        let q = p(Rate::per_second(3), 1);
        let mut tat = 0;
        let mut ready = vec![];
        for _ in 0..4 {
            let r = q.reserve(tat, 0, 0, 1, Release::Tokens).unwrap();
            tat = r.end;
            ready.push(q.duration_ceil(r.ready).as_nanos());
        }
        assert_eq!(ready, [0, 333_333_334, 666_666_667, 1_000_000_000]);
        // The meter agrees to the nanosecond.
        let tat = q.try_pour(0, 0, 1).unwrap();
        let wait = q.try_pour(tat, q.scale_nanos(333_333_333), 1).unwrap_err();
        assert_eq!(q.duration_ceil(wait), Duration::from_nanos(1));
        assert!(q.try_pour(tat, q.scale_nanos(333_333_334), 1).is_ok());
    }

    #[test]
    fn no_drift_over_a_long_run() {
        // 7 M/s polled every 1 µs for 10 s delivers exactly 7·10⁷ + capacity.
        let q = p(Rate::per_second(7_000_000), 10);
        let mut tat = 0;
        let mut granted = 0u64;
        for us in 0..=10_000_000u128 {
            let now = q.scale_nanos(us * 1000);
            while let Ok(t) = q.try_pour(tat, now, 1) {
                tat = t;
                granted += 1;
            }
        }
        assert_eq!(granted, 70_000_000 + 10);
    }

    #[test]
    fn demo_pattern() {
        // The source's demo: capacity 2, 2/s, a request every 200 ms.
        let q = p(Rate::per_second(2), 2);
        let mut tat = 0;
        let mut pattern = String::new();
        for i in 0..10u128 {
            let now = q.scale_nanos(i * 200 * MS);
            match q.try_pour(tat, now, 1) {
                Ok(t) => {
                    tat = t;
                    pattern.push('+');
                }
                Err(_) => pattern.push('-'),
            }
        }
        assert_eq!(pattern, "++-+-+--+-");
    }

    #[test]
    fn reservations_token_and_water() {
        let q = p(Rate::every(Duration::from_millis(100)), 2);
        // Token release: a full bucket grants 2 at once, then one per 100 ms.
        let mut tat = 0;
        let mut ready = vec![];
        for _ in 0..4 {
            let r = q.reserve(tat, 0, 0, 1, Release::Tokens).unwrap();
            tat = r.end;
            ready.push(r.ready / MS);
        }
        assert_eq!(ready, [0, 0, 100, 200]);
        // Water release: no burst, one per 100 ms, overflow past capacity.
        let mut tat = 0;
        let mut ready = vec![];
        for _ in 0..2 {
            let r = q.reserve(tat, 0, 0, 1, Release::Water).unwrap();
            tat = r.end;
            ready.push(r.ready / MS);
        }
        assert_eq!(ready, [0, 100]);
        assert_eq!(q.reserve(tat, 0, 0, 1, Release::Water), Err(Overflow));
        assert!(
            q.reserve(tat, 100 * MS, 100 * MS, 1, Release::Water)
                .is_ok()
        );
    }

    #[test]
    fn refund_only_what_has_not_drained() {
        let q = p(Rate::every(Duration::from_millis(100)), 5);
        assert_eq!(q.refund(500 * MS, 2, 0), 200 * MS);
        assert_eq!(q.refund(500 * MS, 2, 450 * MS), 50 * MS);
        assert_eq!(q.refund(500 * MS, 2, 600 * MS), 0);
    }

    #[test]
    fn available_and_level() {
        let q = p(Rate::every(Duration::from_millis(100)), 4);
        assert_eq!(q.available(0, 0), 4);
        assert_eq!(q.available(250 * MS, 0), 1); // 2.5 units of water
        assert_eq!(q.level(250 * MS, 0), 3);
        assert_eq!(q.available(900 * MS, 0), 0); // reserved beyond capacity
        assert_eq!(q.level(900 * MS, 0), 9);
    }

    #[test]
    fn rescale_keeps_water() {
        let slow = p(Rate::every(Duration::from_millis(100)), 4);
        let fast = p(Rate::per_second(30), 4); // 33⅓ ms
        // 3 units of water at t = 1 s.
        let t = slow.scale_nanos(1300 * MS);
        let converted = slow.rescale(&fast, t, 1000 * MS);
        assert_eq!(
            converted,
            fast.scale_nanos(1000 * MS) + 3 * u128::from(fast.num)
        );
        // An empty bucket stays empty; an idle past is forgotten.
        assert_eq!(
            slow.rescale(&fast, 0, 1000 * MS),
            fast.scale_nanos(1000 * MS)
        );
    }

    #[test]
    fn mul_div_is_exact_and_saturates() {
        assert_eq!(mul_div_ceil(10, 3, 4), 8);
        assert_eq!(mul_div_ceil(12, 3, 4), 9);
        assert_eq!(
            mul_div_ceil(u128::from(u64::MAX) << 30, u64::MAX, u64::MAX),
            u128::from(u64::MAX) << 30
        );
        assert_eq!(mul_div_ceil(MAX_TIME, u64::MAX, 1), MAX_TIME);
    }

    /// A 64-bit quantity, mostly near the edges where the 64-bit meter
    /// hands over to the 128-bit one.
    fn edgy_u64() -> impl Strategy<Value = u64> {
        prop_oneof![
            any::<u64>(),
            0..1_000u64,
            u64::MAX - 1_000..=u64::MAX,
            (1u32..64).prop_flat_map(|bits| {
                let edge = 1u64 << bits;
                edge - 1_000.min(edge)..=edge.saturating_add(1_000)
            }),
        ]
    }

    /// A `tat` or `now` in scaled units: mostly 64-bit ones near the edges,
    /// some just past 2⁶⁴, some anywhere up to [`MAX_TIME`].
    fn edgy_time() -> impl Strategy<Value = u128> {
        prop_oneof![
            4 => edgy_u64().prop_map(u128::from),
            1 => (0..1_000u128).prop_map(|d| (1u128 << 64) + d),
            1 => 0..=MAX_TIME,
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(20_000))]

        /// The meter's 64-bit path decides exactly as the 128-bit one,
        /// including where a quantity stops fitting.
        #[test]
        fn narrow_meter_agrees_with_wide(
            num in edgy_u64().prop_map(|n| n.max(1)),
            den in edgy_u64().prop_map(|d| d.clamp(1, u64::from(u32::MAX))),
            capacity in any::<u32>().prop_map(|c| c.max(1)),
            n_frac in 0.0..=1.0f64,
            tat in edgy_time(),
            now in edgy_time(),
            near in any::<bool>(),
        ) {
            let q = Params::from_parts(num, den, capacity);
            // Half the time, `tat` close to `now`, where decisions flip.
            let tat = if near { now.saturating_add(tat % (q.tau() + 2)).min(MAX_TIME) } else { tat };
            #[expect(clippy::cast_possible_truncation, clippy::cast_sign_loss, reason = "a fraction of the capacity, clamped")]
            let n = ((f64::from(capacity) * n_frac) as u32).clamp(1, capacity);
            prop_assert_eq!(q.try_pour(tat, now, n), q.try_pour_wide(tat, now, n));
        }
    }

    #[test]
    fn narrow_meter_hands_over_at_the_edges() {
        let max = u128::from(u64::MAX);
        // τ = num × capacity: exactly 2⁶⁴ − 1, and one over (num 2⁶³ + 1,
        // capacity 2: 2⁶⁴ + 2 overflows).
        for (num, capacity) in [(u64::MAX, 1), (1 << 63 | 1, 2), (u64::MAX / 3, 3)] {
            let q = Params::from_parts(num, 1, capacity);
            for tat in [0, 1, max - 2, max - 1, max, max + 1] {
                for now in [0, 1, max - 2, max - 1, max, max + 1] {
                    for n in [1, capacity] {
                        assert_eq!(
                            q.try_pour(tat, now, n),
                            q.try_pour_wide(tat, now, n),
                            "num {num} capacity {capacity} tat {tat} now {now} n {n}"
                        );
                    }
                }
            }
        }
        // The new `tat` landing exactly on 2⁶⁴ − 1 stays narrow; one more
        // unit goes wide, with the same answers.
        let q = Params::from_parts(10, 1, 4);
        assert_eq!(q.try_pour(max - 10, max - 40, 1), Ok(max));
        assert_eq!(q.try_pour(max - 9, max - 40, 1), Err(1));
        assert_eq!(
            q.try_pour(max - 9, max - 40, 1),
            q.try_pour_wide(max - 9, max - 40, 1)
        );
        assert_eq!(q.try_pour(max - 9, max - 39, 1), Ok(max + 1));
        assert_eq!(q.try_pour(max - 9, max - 41, 1), Err(2));
    }

    #[test]
    fn extremes_saturate_instead_of_overflowing() {
        let q = p(
            Rate::per(u32::MAX, Duration::from_nanos(u64::MAX)),
            u32::MAX,
        );
        let century = Duration::from_secs(100 * 365 * 24 * 3600);
        let now = q.scale(century);
        assert!(now < MAX_TIME);
        let tat = q.try_pour(0, now, u32::MAX).unwrap();
        assert!(tat > now);
        assert!(q.try_pour(tat, now, 1).is_err());
        assert_eq!(
            p(Rate::per_second(999_983), 1).scale(Duration::MAX),
            MAX_TIME
        );
        assert_eq!(nanos_to_duration(u128::MAX), Duration::MAX);
        let slowest = p(Rate::every(Duration::from_nanos(u64::MAX)), u32::MAX);
        let end = slowest.try_pour(MAX_TIME, MAX_TIME, u32::MAX).unwrap();
        assert_eq!(end, MAX_TIME);
    }
}
