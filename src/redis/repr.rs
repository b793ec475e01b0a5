//! The exact representation of GCRA time inside the Redis script.
//!
//! The crate's GCRA ([`Params`]) counts time in *scaled units* of `1/den`
//! ns, where `num / den` is the emission interval in lowest terms, and does
//! all its arithmetic in `u128`. Lua numbers in Redis are IEEE doubles,
//! exact only for integers up to 2⁵³, and `TIME` gives microseconds. A
//! scaled instant since the Unix epoch (≈ 1.7·10¹⁸ ns × `den`) does not fit.
//!
//! So every time the script handles is a pair `(us, rem)`:
//! `t = us × unit + rem`, where `unit = 1000 × den` is the number of scaled
//! units in one microsecond and `0 ≤ rem < unit`. `us` is whole
//! microseconds since the Unix epoch (≈ 1.7·10¹⁵ today, below 2⁵³ until
//! the year 2255) and `unit ≤ 1000 × u32::MAX < 2⁴²`. The script only adds,
//! subtracts and compares such pairs (with one carry or borrow), never
//! multiplies or divides them, so every intermediate value is an integer
//! below 2⁵³ and the arithmetic is exact:
//!
//! * `now = (TIME seconds × 10⁶ + TIME microseconds, 0)`;
//! * the cost of `n` permits (`n × num`) and the bucket's depth τ
//!   (`capacity × num`) are computed here in `u128` and sent already split;
//! * a key's state is one theoretical arrival time per band, each an
//!   absolute pair in its band's own units.
//!
//! A quota of several bands changes nothing in this argument: the script
//! computes each band on its own, in its own units (its `unit` is sent with
//! it), and never combines two bands' numbers. Only the decision (granted
//! when every band grants) and the expiry (the latest `us` of any band, a
//! comparison of whole microseconds) look across bands; the waits of
//! different bands are compared here, in Rust, after each is turned into
//! exact nanoseconds ([`Encoded::retry_after`]).
//!
//! The one bound: each band's τ must be at most [`MAX_TAU_US`] microseconds
//! (2⁵⁰ µs, about 35.7 years of drain time), which keeps `now + 2τ` below
//! 2⁵³ for two centuries. Configurations beyond it are refused with a
//! [`ConfigError`] (at build, or for a quota passed with a call, before
//! asking Redis), never rounded.

use std::time::Duration;

use crate::algorithm::{MAX_BANDS, Params};
use crate::{ConfigError, Quota};

/// The deepest bucket the script represents exactly, in microseconds of
/// drain time (2⁵⁰ µs ≈ 35.7 years).
pub(crate) const MAX_TAU_US: u64 = 1 << 50;

/// A scaled time split into whole microseconds and a remainder in scaled
/// units (`0 ≤ rem < unit`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Split {
    pub(crate) us: u64,
    pub(crate) rem: u64,
}

/// One limiter's parameters as the script sees them.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Encoding {
    params: Params,
    /// Scaled units per microsecond.
    unit: u64,
    tau: Split,
}

impl Encoding {
    /// Checks that the bucket fits the script's exact arithmetic.
    pub(crate) fn new(params: Params) -> Result<Encoding, ConfigError> {
        // den ≤ u32::MAX (a reduced permit count), so this cannot overflow
        // and stays far below 2⁵² (sums of two remainders stay exact).
        let unit = params.den() * 1000;
        debug_assert!(unit < 1 << 52);
        let tau = params.tau();
        if tau / u128::from(unit) > u128::from(MAX_TAU_US) {
            return Err(ConfigError::InvalidParameter {
                name: "capacity",
                reason: "capacity × interval exceeds 2^50 µs (35.7 years), \
                         beyond what the Redis script represents exactly",
            });
        }
        let mut e = Encoding {
            params,
            unit,
            tau: Split { us: 0, rem: 0 },
        };
        e.tau = e.split(tau);
        Ok(e)
    }

    pub(crate) fn params(&self) -> &Params {
        &self.params
    }

    /// Scaled units per microsecond.
    pub(crate) fn unit(&self) -> u64 {
        self.unit
    }

    /// The bucket's depth τ, split.
    pub(crate) fn tau(&self) -> Split {
        self.tau
    }

    /// The cost of `n` permits, split (`n ≤ capacity`, so it fits).
    pub(crate) fn cost(&self, n: u32) -> Split {
        self.split(self.params.cost(n))
    }

    /// A span or an instant of the script in scaled units, split. The
    /// script's numbers are below 2⁵³ µs, so `us` fits.
    #[expect(
        clippy::cast_possible_truncation,
        reason = "below 2^53 µs: costs and τ checked by `new`, instants and waits the script's"
    )]
    pub(crate) fn split(&self, scaled: u128) -> Split {
        let unit = u128::from(self.unit);
        Split {
            us: (scaled / unit) as u64,
            rem: (scaled % unit) as u64,
        }
    }

    /// A span given by the script back in scaled units.
    pub(crate) fn join(&self, s: Split) -> u128 {
        u128::from(s.us) * u128::from(self.unit) + u128::from(s.rem)
    }

    /// The script's wait as the crate's `retry_after`: rounded up to the
    /// nanosecond, as `Params::duration_ceil` does for every limiter.
    pub(crate) fn retry_after(&self, wait: Split) -> Duration {
        self.params.duration_ceil(self.join(wait))
    }
}

/// A quota as the script sees it: each band's [`Encoding`], in the
/// quota's order, every band's τ checked.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Encoded {
    quota: Quota,
    bands: [Encoding; MAX_BANDS],
    len: usize,
}

impl Encoded {
    /// Checks every band: a valid rate and capacity, at most
    /// [`Quota::MAX_BANDS`] bands, each τ within [`MAX_TAU_US`].
    pub(crate) fn new(quota: &Quota) -> Result<Encoded, ConfigError> {
        let params = quota.params()?;
        let first = Encoding::new(params[0])?;
        let mut bands = [first; MAX_BANDS];
        for (slot, p) in bands.iter_mut().zip(&params).skip(1) {
            *slot = Encoding::new(*p)?;
        }
        Ok(Encoded {
            quota: *quota,
            bands,
            len: params.len(),
        })
    }

    /// The quota encoded.
    pub(crate) fn quota(&self) -> &Quota {
        &self.quota
    }

    /// Each band's encoding, in order.
    pub(crate) fn bands(&self) -> &[Encoding] {
        &self.bands[..self.len]
    }

    /// The most permits one request may take: the smallest capacity.
    pub(crate) fn capacity(&self) -> u32 {
        self.bands()
            .iter()
            .map(|e| e.params().capacity())
            .min()
            .unwrap_or(0)
    }

    /// The script's per-band waits (in band order; zero where the band
    /// grants) as the crate's `retry_after`: the latest of the bands' waits,
    /// each rounded up to the nanosecond — what the local multi-band meter
    /// answers.
    pub(crate) fn retry_after(&self, waits: &[Split]) -> Duration {
        self.bands()
            .iter()
            .zip(waits)
            .map(|(e, &w)| e.retry_after(w))
            .max()
            .unwrap_or(Duration::ZERO)
    }
}

#[cfg(test)]
mod tests {
    use super::super::state::{self, Stored};
    use super::*;
    use crate::Rate;

    fn enc(rate: Rate, capacity: u32) -> Encoding {
        Encoding::new(Params::new(rate, capacity).unwrap()).unwrap()
    }

    /// A stored band as Lua holds it: `(us, rem, unit)` in doubles.
    type LuaBand = (f64, f64, f64);

    /// The script's arithmetic, as Lua runs it: in doubles, band by band
    /// (the loop of `gcra.lua`). Returns every band's new state, the
    /// stored bands beyond the quota kept (granted), or every band's wait
    /// (refused), as pairs.
    #[expect(
        clippy::cast_precision_loss,
        clippy::float_cmp,
        reason = "Lua computes in doubles; the values are whole and below 2^53"
    )]
    fn script(
        q: &Encoded,
        state: &[LuaBand],
        now_us: u64,
        n: u32,
    ) -> Result<Vec<LuaBand>, Vec<(f64, f64)>> {
        let now = now_us as f64;
        let mut ends = vec![];
        let mut waits = vec![];
        let mut refused = false;
        for (i, e) in q.bands().iter().enumerate() {
            let unit = e.unit() as f64;
            let cost = e.cost(n);
            let (cost_us, cost_rem) = (cost.us as f64, cost.rem as f64);
            let (tau_us, tau_rem) = (e.tau().us as f64, e.tau().rem as f64);
            let (mut b_us, mut b_rem) = (now, 0.0);
            if let Some(&(mut u, mut r, s_unit)) = state.get(i) {
                if s_unit != unit && r > 0.0 {
                    (u, r) = (u + 1.0, 0.0);
                }
                if u > now || (u == now && r > 0.0) {
                    (b_us, b_rem) = (u, r);
                }
            }
            let (mut e_us, mut e_rem) = (b_us + cost_us, b_rem + cost_rem);
            if e_rem >= unit {
                (e_us, e_rem) = (e_us + 1.0, e_rem - unit);
            }
            ends.push((e_us, e_rem, unit));
            let w_us = e_us - now;
            if w_us < tau_us || (w_us == tau_us && e_rem <= tau_rem) {
                waits.push((0.0, 0.0));
            } else {
                let (mut r_us, mut r_rem) = (w_us - tau_us, e_rem - tau_rem);
                if r_rem < 0.0 {
                    (r_us, r_rem) = (r_us - 1.0, r_rem + unit);
                }
                waits.push((r_us, r_rem));
                refused = true;
            }
        }
        if refused {
            return Err(waits);
        }
        ends.extend(state.iter().skip(q.bands().len()));
        Ok(ends)
    }

    #[expect(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        reason = "asserted whole, non-negative and below 2^53 first"
    )]
    fn whole(x: f64) -> u64 {
        assert!(x >= 0.0 && x < 2f64.powi(53) && x.fract() == 0.0, "{x}");
        x as u64
    }

    fn back(x: (f64, f64)) -> Split {
        Split {
            us: whole(x.0),
            rem: whole(x.1),
        }
    }

    fn back_band(x: LuaBand) -> Stored {
        Stored {
            us: whole(x.0),
            rem: whole(x.1),
            unit: whole(x.2),
        }
    }

    #[expect(clippy::cast_precision_loss, reason = "whole and below 2^53")]
    fn lua(s: Stored) -> LuaBand {
        (s.us as f64, s.rem as f64, s.unit as f64)
    }

    /// Replays random arrivals from an epoch-sized origin through three
    /// meters: the double-precision script, [`state::pour`] (the exact Rust
    /// model a peek uses), and the crate's exact GCRA band by band, with a
    /// refusal of any band committing none: identical decisions, states
    /// and waits, and `retry_after` that of the local multi-band meter.
    /// Every `switch` steps the quota changes to the next of `quotas` (a
    /// tier change: the stored instants carry over, rounded up to a whole
    /// µs when the units differ; bands beyond the new quota are kept).
    fn agree_tiers(quotas: &[Quota], switch: usize, step_us: u64, seed: u64) -> (u32, u32) {
        let encoded: Vec<Encoded> = quotas.iter().map(|q| Encoded::new(q).unwrap()).collect();
        let epoch_us: u64 = 1_712_345_678_901_234; // a 2024 server clock
        let mut seed = seed;
        let mut next = move || {
            seed = seed
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            seed >> 33
        };
        let mut lua_state: Vec<LuaBand> = vec![];
        let mut state: Vec<Stored> = vec![];
        let mut now_us = epoch_us;
        let (mut granted, mut refused) = (0, 0);
        for step in 0..5000 {
            let q = &encoded[(step / switch) % encoded.len()];
            now_us += next() % (step_us + 1);
            let units = u32::try_from(next() % u64::from(q.capacity().min(5)) + 1).unwrap();
            // The reference: each band's exact GCRA on the stored instants
            // read in its units.
            let mut reference = Ok(vec![]);
            let mut waits = vec![];
            for (i, e) in q.bands().iter().enumerate() {
                let p = e.params();
                let now = u128::from(now_us) * u128::from(e.unit());
                let tat = state.get(i).map_or(0, |s| {
                    if s.unit == e.unit() {
                        u128::from(s.us) * u128::from(e.unit()) + u128::from(s.rem)
                    } else {
                        u128::from(s.us + u64::from(s.rem > 0)) * u128::from(e.unit())
                    }
                });
                match p.try_pour(tat, now, units) {
                    Ok(end) => {
                        waits.push(0);
                        if let Ok(ends) = &mut reference {
                            ends.push(end);
                        }
                    }
                    Err(short) => {
                        waits.push(short);
                        reference = Err(());
                    }
                }
            }
            let model = state::pour(q, &state, now_us, units);
            let peeked = state::peek(q, &state, now_us, units);
            match (script(q, &lua_state, now_us, units), reference) {
                (Ok(lua_after), Ok(ends)) => {
                    let lua_after: Vec<Stored> = lua_after.into_iter().map(back_band).collect();
                    for ((e, &end), s) in q.bands().iter().zip(&ends).zip(&lua_after) {
                        assert_eq!(
                            e.join(Split {
                                us: s.us,
                                rem: s.rem
                            }),
                            end
                        );
                        assert_eq!(s.unit, e.unit());
                    }
                    assert_eq!(
                        lua_after[ends.len()..],
                        state.get(ends.len()..).unwrap_or(&[])[..]
                    );
                    assert_eq!(model.as_ref(), Ok(&lua_after));
                    assert!(peeked.is_granted());
                    lua_state = lua_after.iter().copied().map(lua).collect();
                    state = lua_after;
                    granted += 1;
                }
                (Err(lua_waits), Err(())) => {
                    let lua_waits: Vec<Split> = lua_waits.into_iter().map(back).collect();
                    for ((e, &w), s) in q.bands().iter().zip(&waits).zip(&lua_waits) {
                        assert_eq!(e.join(*s), w);
                    }
                    assert_eq!(model.as_ref(), Err(&lua_waits));
                    // The local meter's wait: the latest band's, each
                    // rounded up to a nanosecond.
                    let local = q
                        .bands()
                        .iter()
                        .zip(&waits)
                        .map(|(e, &w)| e.params().duration_ceil(w))
                        .max()
                        .unwrap();
                    assert_eq!(q.retry_after(&lua_waits), local);
                    assert_eq!(peeked.retry_after(), Some(local));
                    refused += 1;
                }
                (a, b) => panic!("script {a:?} vs exact {b:?} at {now_us} µs, n = {units}"),
            }
        }
        (granted, refused)
    }

    /// [`agree_tiers`], on a replay that both grants and refuses often.
    fn agree_both(quotas: &[Quota], switch: usize, step_us: u64, seed: u64) {
        let (granted, refused) = agree_tiers(quotas, switch, step_us, seed);
        assert!(
            granted >= 50 && refused >= 50,
            "seed {seed}: {granted} granted, {refused} refused"
        );
    }

    fn agree(rate: Rate, capacity: u32, step_us: u64, seed: u64) {
        agree_tiers(&[Quota::new(rate, capacity)], usize::MAX, step_us, seed);
    }

    #[test]
    fn script_arithmetic_is_exact() {
        agree(Rate::per_second(3), 2, 700_000, 1);
        agree(Rate::per_second(7), 5, 300_000, 2);
        agree(Rate::per_second(7_000_000), 1000, 200, 3);
        agree(Rate::per_second(999_983), 10, 20, 4);
        agree(Rate::per(u32::MAX, Duration::from_secs(5)), 100_000, 30, 5);
        // The finest scale there is: a prime permit count near u32::MAX.
        agree(Rate::per(4_294_967_291, Duration::from_secs(7)), 7, 2, 6);
        // The deepest bucket allowed: 2⁵⁰ µs.
        agree(
            Rate::every(Duration::from_micros(1 << 40)),
            1 << 10,
            1 << 39,
            7,
        );
        agree(
            Rate::per(3, Duration::from_micros(1 << 40)),
            3 << 10,
            1 << 39,
            8,
        );
    }

    #[test]
    fn script_arithmetic_is_exact_for_every_band() {
        let s = Duration::from_secs;
        // Thirds of a second and sevenths of a minute.
        let q2 = Quota::new(Rate::per_second(3), 3).and(Rate::per_minute(7), 7);
        agree_both(&[q2], usize::MAX, 400_000, 11);
        // The finest scale next to a day-long band, and next to the
        // deepest bucket allowed.
        let fine = Rate::per(4_294_967_291, s(7));
        let deepest = Rate::per(3, Duration::from_micros(1 << 40));
        let q3 = Quota::new(fine, 7)
            .and(Rate::per_day(10_000), 10_000)
            .and(deepest, 3 << 10);
        agree_both(&[q3], usize::MAX, 2, 12);
        let q3 = Quota::new(fine, 7)
            .and(Rate::every(s(86_400)), 3)
            .and(deepest, 3 << 10);
        agree_both(&[q3], usize::MAX, 40_000_000_000, 13);
        // Four bands.
        let q4 = Quota::new(Rate::per_second(999_983), 10)
            .and(Rate::per_second(7), 20)
            .and(Rate::per_hour(1000), 100)
            .and(Rate::per_day(10_000), 10_000);
        agree_both(&[q4], usize::MAX, 30_000, 14);
    }

    #[test]
    fn script_arithmetic_is_exact_across_tier_changes() {
        // Same windows, same units; then other units (instants rounded up
        // to whole µs); then a quota of fewer bands (the others kept) and
        // of more (the missing ones read as empty).
        let free = Quota::new(Rate::per_second(10), 10).and(Rate::per_minute(100), 100);
        let paid = Quota::new(Rate::per_second(100), 100).and(Rate::per_minute(1000), 1000);
        let thirds = Quota::new(Rate::per_second(3), 3).and(Rate::per_minute(7), 70);
        let one = Quota::new(Rate::per_second(7), 5);
        let three = Quota::new(Rate::per_second(7), 5)
            .and(Rate::per_minute(50), 50)
            .and(Rate::per_hour(90), 90);
        agree_both(&[free, paid], 50, 40_000, 21);
        agree_both(&[free, thirds, one, three, paid], 37, 100_000, 22);
        agree_both(&[three, one], 11, 300_000, 23);
    }

    #[test]
    fn splits_are_normalized() {
        let e = enc(Rate::per_second(3), 2); // I = 10⁹/3 ns, den 3
        assert_eq!(e.unit(), 3000);
        // τ = 2 × 10⁹ scaled units = 666 666 µs + 2000 units (⅔ µs).
        assert_eq!(
            e.tau(),
            Split {
                us: 666_666,
                rem: 2000
            }
        );
        assert_eq!(e.join(e.tau()), 2_000_000_000);
        assert_eq!(
            e.cost(1),
            Split {
                us: 333_333,
                rem: 1000
            }
        );
        assert_eq!(
            e.retry_after(Split {
                us: 333_333,
                rem: 1000
            }),
            Duration::from_nanos(333_333_334)
        );
    }

    #[test]
    fn refuses_what_it_cannot_represent() {
        let ok = Params::new(Rate::every(Duration::from_micros(1 << 40)), 1 << 10).unwrap();
        assert!(Encoding::new(ok).is_ok());
        let deep = Params::new(Rate::every(Duration::from_micros(1 << 40)), (1 << 10) + 1).unwrap();
        assert!(matches!(
            Encoding::new(deep),
            Err(ConfigError::InvalidParameter {
                name: "capacity",
                ..
            })
        ));
        // A year per permit, 36 years of burst.
        let yearly = Params::new(Rate::every(Duration::from_secs(365 * 86_400)), 36).unwrap();
        assert!(Encoding::new(yearly).is_err());
        // Anything finer is fine: the finest scale, u32::MAX burst.
        let fast = Params::new(Rate::per(u32::MAX, Duration::from_secs(5)), u32::MAX).unwrap();
        assert!(Encoding::new(fast).is_ok());
    }
}
