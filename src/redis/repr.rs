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
//! * a key's state is its theoretical arrival time as an absolute pair.
//!
//! The one bound: τ must be at most [`MAX_TAU_US`] microseconds (2⁵⁰ µs,
//! about 35.7 years of drain time), which keeps `now + 2τ` below 2⁵³ for
//! two centuries. Configurations beyond it are refused at build with a
//! [`ConfigError`], never rounded.

use std::time::Duration;

use crate::ConfigError;
use crate::algorithm::Params;

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

    #[expect(clippy::cast_possible_truncation, reason = "checked by `new`: ≤ τ")]
    fn split(&self, scaled: u128) -> Split {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Rate;

    fn enc(rate: Rate, capacity: u32) -> Encoding {
        Encoding::new(Params::new(rate, capacity).unwrap()).unwrap()
    }

    /// The script's arithmetic, as Lua runs it: in doubles. Returns the new
    /// state (granted) or the wait (refused), both as pairs.
    #[expect(
        clippy::cast_precision_loss,
        clippy::float_cmp,
        reason = "Lua computes in doubles; the values are whole and below 2^53"
    )]
    fn script(
        e: &Encoding,
        state: Option<(f64, f64)>,
        now_us: u64,
        n: u32,
    ) -> Result<(f64, f64), (f64, f64)> {
        let unit = e.unit() as f64;
        let cost = e.cost(n);
        let (cost_us, cost_rem) = (cost.us as f64, cost.rem as f64);
        let (tau_us, tau_rem) = (e.tau().us as f64, e.tau().rem as f64);
        let now = now_us as f64;
        let (mut b_us, mut b_rem) = (now, 0.0);
        if let Some((s_us, s_rem)) = state {
            if s_us > now || (s_us == now && s_rem > 0.0) {
                (b_us, b_rem) = (s_us, s_rem);
            }
        }
        let (mut e_us, mut e_rem) = (b_us + cost_us, b_rem + cost_rem);
        if e_rem >= unit {
            (e_us, e_rem) = (e_us + 1.0, e_rem - unit);
        }
        let w_us = e_us - now;
        if w_us < tau_us || (w_us == tau_us && e_rem <= tau_rem) {
            return Ok((e_us, e_rem));
        }
        let (mut r_us, mut r_rem) = (w_us - tau_us, e_rem - tau_rem);
        if r_rem < 0.0 {
            (r_us, r_rem) = (r_us - 1.0, r_rem + unit);
        }
        Err((r_us, r_rem))
    }

    #[expect(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        reason = "asserted whole, non-negative and below 2^53 first"
    )]
    fn back(x: (f64, f64)) -> Split {
        assert!(x.0 >= 0.0 && x.0 < 2f64.powi(53) && x.0.fract() == 0.0);
        assert!(x.1 >= 0.0 && x.1 < 2f64.powi(53) && x.1.fract() == 0.0);
        Split {
            us: x.0 as u64,
            rem: x.1 as u64,
        }
    }

    /// Replays random arrivals through the double-precision script and the
    /// crate's exact `u128` GCRA from an epoch-sized origin: identical
    /// decisions, states and waits.
    fn agree(rate: Rate, capacity: u32, step_us: u64, seed: u64) {
        let encoding = enc(rate, capacity);
        let params = *encoding.params();
        let epoch_us: u64 = 1_712_345_678_901_234; // a 2024 server clock
        let mut seed = seed;
        let mut next = move || {
            seed = seed
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            seed >> 33
        };
        let mut state: Option<(f64, f64)> = None;
        let mut tat: u128 = 0; // the crate's state, relative to the epoch
        let mut now_us = epoch_us;
        for _ in 0..5000 {
            now_us += next() % (step_us + 1);
            let units = u32::try_from(next() % u64::from(capacity.min(5)) + 1).unwrap();
            let rel = params.scale_nanos(u128::from(now_us - epoch_us) * 1000);
            let exact = params.try_pour(tat, rel, units);
            match (script(&encoding, state, now_us, units), exact) {
                (Ok(s), Ok(end)) => {
                    // Same instant: the script's is absolute, the crate's
                    // relative to the epoch.
                    let abs = encoding.join(back(s));
                    assert_eq!(abs - params.scale_nanos(u128::from(epoch_us) * 1000), end);
                    state = Some(s);
                    tat = end;
                }
                (Err(w), Err(wait)) => {
                    assert_eq!(encoding.join(back(w)), wait);
                    assert_eq!(encoding.retry_after(back(w)), params.duration_ceil(wait));
                }
                (a, b) => panic!("script {a:?} vs exact {b:?} at {now_us} µs, n = {units}"),
            }
        }
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
