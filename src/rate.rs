//! `Rate`: permits per period, as an exact rational.

use std::fmt;
use std::time::Duration;

use crate::ConfigError;

/// A rate: `permits` per `period`, kept as an exact rational.
///
/// `Rate::per_second(3)` is three permits per second exactly — one every
/// 333 333 333⅓ ns, with the third ⅓ carried rather than rounded away — so a
/// limiter never drifts, whatever the rate.
///
/// Constructors never panic. A rate that cannot limit anything (zero
/// permits, a zero period, faster than one permit per nanosecond, slower
/// than one per `u64::MAX` nanoseconds, or a float that is NaN, infinite or
/// not positive) is accepted here and reported by the limiter's `build()` as
/// [`ConfigError::InvalidRate`]; [`Rate::validate`] checks it up front.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use tokio_ratelimit::Rate;
///
/// assert_eq!(Rate::per_second(10).interval(), Duration::from_millis(100));
/// assert_eq!(Rate::per_minute(120), Rate::per(120, Duration::from_secs(60)));
/// assert_eq!(Rate::every(Duration::from_millis(250)).permits_per_second(), 4.0);
/// assert!(Rate::per_second(0).validate().is_err());
/// assert_eq!(Rate::per_second(3).to_string(), "3 per 1s");
/// ```
/// Two rates are equal when they are the same rational (`per_second(2)` equals
/// `every(500 ms)`).
#[derive(Clone, Copy)]
pub struct Rate {
    permits: u32,
    period: Duration,
    /// Set by the float constructor when its input cannot be a rate (one
    /// byte, not a `&str`: a rate is kept by every limiter).
    invalid: Option<Invalid>,
}

/// Why the float constructor's input cannot be a rate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Invalid {
    NaN,
    Infinite,
    NotPositive,
    TooFast,
    TooSlow,
}

impl Invalid {
    fn reason(self) -> &'static str {
        match self {
            Invalid::NaN => "NaN permits per second",
            Invalid::Infinite => "infinite permits per second",
            Invalid::NotPositive => "permits per second must be positive",
            Invalid::TooFast => "faster than one permit per nanosecond",
            Invalid::TooSlow => "slower than one permit per u64::MAX nanoseconds",
        }
    }
}

impl Rate {
    /// `n` permits per second.
    pub const fn per_second(n: u32) -> Rate {
        Rate::per(n, Duration::from_secs(1))
    }

    /// `n` permits per minute.
    pub const fn per_minute(n: u32) -> Rate {
        Rate::per(n, Duration::from_secs(60))
    }

    /// `n` permits per hour.
    pub const fn per_hour(n: u32) -> Rate {
        Rate::per(n, Duration::from_secs(3600))
    }

    /// `n` permits per day (24 hours).
    pub const fn per_day(n: u32) -> Rate {
        Rate::per(n, Duration::from_secs(86_400))
    }

    /// `n` permits per `period`.
    pub const fn per(n: u32, period: Duration) -> Rate {
        Rate {
            permits: n,
            period,
            invalid: None,
        }
    }

    /// One permit every `interval`.
    pub const fn every(interval: Duration) -> Rate {
        Rate::per(1, interval)
    }

    /// A rate in permits per second as a float, Guava's `permitsPerSecond`.
    ///
    /// The float is turned into the simplest fraction `permits / period`
    /// (period in whole nanoseconds) that equals it to within one part in
    /// 10¹⁵: `0.5` is one per two seconds, `0.1` one per ten seconds,
    /// `3.3` thirty-three per ten seconds. NaN, infinities, zero and
    /// negative values give a rate that `validate()` (and every `build()`)
    /// rejects.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use tokio_ratelimit::Rate;
    ///
    /// assert_eq!(Rate::per_second_f64(0.5), Rate::per(1, Duration::from_secs(2)));
    /// assert_eq!(Rate::per_second_f64(2.0), Rate::per(2, Duration::from_secs(1)));
    /// assert!(Rate::per_second_f64(f64::NAN).validate().is_err());
    /// ```
    pub fn per_second_f64(permits_per_second: f64) -> Rate {
        let r = permits_per_second;
        let invalid = |reason| Rate {
            permits: 0,
            period: Duration::from_secs(1),
            invalid: Some(reason),
        };
        if r.is_nan() {
            return invalid(Invalid::NaN);
        }
        if r.is_infinite() {
            return invalid(Invalid::Infinite);
        }
        if r <= 0.0 {
            return invalid(Invalid::NotPositive);
        }
        if r > 1e9 {
            return invalid(Invalid::TooFast);
        }
        match best_fraction(r / 1e9) {
            Some((permits, nanos)) => Rate::per(permits, Duration::from_nanos(nanos)),
            None => invalid(Invalid::TooSlow),
        }
    }

    /// The permits granted per [`period`](Self::period).
    pub const fn permits(&self) -> u32 {
        self.permits
    }

    /// The period over which [`permits`](Self::permits) are granted.
    pub const fn period(&self) -> Duration {
        self.period
    }

    /// The time between two permits (`period / permits`), rounded down to a
    /// nanosecond. The limiters use the exact rational, not this value.
    /// Zero for an invalid rate.
    pub fn interval(&self) -> Duration {
        if self.permits == 0 {
            return Duration::ZERO;
        }
        let nanos = self.period.as_nanos() / u128::from(self.permits);
        Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX))
    }

    /// The rate in permits per second, as a float (for display and for
    /// Guava-style APIs).
    pub fn permits_per_second(&self) -> f64 {
        if self.period.is_zero() {
            return f64::INFINITY;
        }
        f64::from(self.permits) / self.period.as_secs_f64()
    }

    /// Checks that the rate can limit something.
    ///
    /// # Errors
    ///
    /// [`ConfigError::InvalidRate`] with the reason, as `build()` reports it.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let reason = if let Some(invalid) = self.invalid {
            invalid.reason()
        } else if self.permits == 0 {
            "zero permits per period"
        } else if self.period.is_zero() {
            "zero period"
        } else if self.period.as_nanos() < u128::from(self.permits) {
            "faster than one permit per nanosecond"
        } else if self.period.as_nanos() > u128::from(u64::MAX) {
            "period longer than u64::MAX nanoseconds"
        } else {
            return Ok(());
        };
        Err(ConfigError::InvalidRate { reason })
    }

    /// The period in nanoseconds; only meaningful after `validate()`.
    pub(crate) fn period_nanos(&self) -> u64 {
        u64::try_from(self.period.as_nanos()).unwrap_or(u64::MAX)
    }
}

impl PartialEq for Rate {
    fn eq(&self, other: &Rate) -> bool {
        match (self.invalid, other.invalid) {
            (None, None) => {
                u128::from(self.permits) * other.period.as_nanos()
                    == u128::from(other.permits) * self.period.as_nanos()
            }
            (a, b) => a == b,
        }
    }
}

impl Eq for Rate {}

impl std::hash::Hash for Rate {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        // Hash the fraction in lowest terms, as equality compares values.
        let (p, q) = (u128::from(self.permits), self.period.as_nanos());
        let g = gcd(p, q).max(1);
        (p / g, q / g, self.invalid).hash(state);
    }
}

fn gcd(mut a: u128, mut b: u128) -> u128 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

impl fmt::Debug for Rate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.invalid {
            Some(invalid) => write!(f, "Rate(invalid: {})", invalid.reason()),
            None => write!(f, "Rate({} per {:?})", self.permits, self.period),
        }
    }
}

impl fmt::Display for Rate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.invalid {
            Some(invalid) => write!(f, "invalid rate ({})", invalid.reason()),
            None => write!(f, "{} per {:?}", self.permits, self.period),
        }
    }
}

/// The simplest fraction `p / q` (p ≤ `u32::MAX`, q ≤ `u64::MAX`) within one
/// part in 10¹⁵ of `x` (permits per nanosecond), by continued fractions; the
/// closest convergent that fits when none is that close.
fn best_fraction(x: f64) -> Option<(u32, u64)> {
    // Convergents h/k of the continued fraction of x.
    let (mut h0, mut h1) = (0.0_f64, 1.0_f64);
    let (mut k0, mut k1) = (1.0_f64, 0.0_f64);
    let mut rest = x;
    let mut best: Option<(u32, u64)> = None;
    for _ in 0..64 {
        let a = rest.floor();
        let (h2, k2) = (a.mul_add(h1, h0), a.mul_add(k1, k0));
        #[expect(
            clippy::cast_precision_loss,
            reason = "a bound compared against, not a value kept"
        )]
        if h2 > f64::from(u32::MAX) || k2 > u64::MAX as f64 {
            break;
        }
        if h2 >= 1.0 {
            #[expect(
                clippy::cast_possible_truncation,
                clippy::cast_sign_loss,
                reason = "both below the bounds just checked, and whole"
            )]
            let candidate = (h2 as u32, k2 as u64);
            best = Some(candidate);
            if ((h2 / k2) - x).abs() <= x * 1e-15 {
                break;
            }
        }
        let frac = rest - a;
        if frac <= 0.0 {
            break;
        }
        rest = 1.0 / frac;
        (h0, h1, k0, k1) = (h1, h2, k1, k2);
    }
    best.filter(|&(_, q)| q >= 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units() {
        assert_eq!(Rate::per_second(5).period(), Duration::from_secs(1));
        assert_eq!(Rate::per_minute(5).period(), Duration::from_secs(60));
        assert_eq!(Rate::per_hour(5).period(), Duration::from_secs(3600));
        assert_eq!(Rate::every(Duration::from_millis(7)).permits(), 1);
        assert_eq!(
            Rate::per_second(3).interval(),
            Duration::from_nanos(333_333_333)
        );
    }

    #[test]
    fn equality_is_by_value() {
        use std::collections::HashSet;
        assert_eq!(Rate::per_second(2), Rate::every(Duration::from_millis(500)));
        assert_eq!(Rate::per_minute(60), Rate::per_second(1));
        assert_ne!(Rate::per_second(2), Rate::per_second(3));
        let set: HashSet<Rate> = [Rate::per_second(2), Rate::per(4, Duration::from_secs(2))].into();
        assert_eq!(set.len(), 1);
        assert_ne!(Rate::per_second_f64(f64::NAN), Rate::per_second(0));
    }

    #[test]
    fn validation() {
        assert!(Rate::per_second(1).validate().is_ok());
        assert!(Rate::per_second(u32::MAX).validate().is_err()); // > 1e9/s
        assert!(Rate::per_second(1_000_000_000).validate().is_ok());
        assert!(Rate::per(1, Duration::ZERO).validate().is_err());
        assert!(Rate::per(0, Duration::from_secs(1)).validate().is_err());
        assert!(Rate::per(1, Duration::MAX).validate().is_err());
        assert!(
            Rate::per(1, Duration::from_nanos(u64::MAX))
                .validate()
                .is_ok()
        );
        assert!(Rate::every(Duration::from_nanos(1)).validate().is_ok());
    }

    #[test]
    fn floats() {
        let ok = |r: f64| {
            let rate = Rate::per_second_f64(r);
            rate.validate().unwrap();
            rate
        };
        assert_eq!(ok(0.5), Rate::per(1, Duration::from_secs(2)));
        assert_eq!(ok(0.1), Rate::per(1, Duration::from_secs(10)));
        assert_eq!(ok(3.3), Rate::per(33, Duration::from_secs(10)));
        assert_eq!(ok(0.001), Rate::per(1, Duration::from_secs(1000)));
        assert_eq!(ok(7e6), Rate::per(7, Duration::from_micros(1)));
        assert_eq!(ok(1e9), Rate::per(1, Duration::from_nanos(1)));
        assert_eq!(ok(100_000.0), Rate::per(1, Duration::from_micros(10)));
        let third = ok(1.0 / 3.0);
        assert!((third.permits_per_second() - 1.0 / 3.0).abs() < 1e-15);
        for bad in [
            f64::NAN,
            f64::INFINITY,
            f64::NEG_INFINITY,
            0.0,
            -1.0,
            2e9,
            1e-12,
        ] {
            assert!(
                matches!(
                    Rate::per_second_f64(bad).validate(),
                    Err(ConfigError::InvalidRate { .. })
                ),
                "{bad}"
            );
        }
    }

    #[test]
    fn float_round_trip_is_close() {
        let mut r = 0.001_f64;
        while r < 1e9 {
            let rate = Rate::per_second_f64(r);
            rate.validate().unwrap();
            let back = rate.permits_per_second();
            assert!(((back - r) / r).abs() < 1e-9, "{r} -> {rate:?} -> {back}");
            r *= 1.37;
        }
    }
}
