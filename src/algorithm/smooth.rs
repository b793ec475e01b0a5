//! Guava's `SmoothRateLimiter` (`SmoothBursty` and `SmoothWarmingUp`) as a
//! pure state machine.
//!
//! # Guava's model
//!
//! The state is the instant of the *next free ticket* and some *stored
//! permits*. A request waits until the next free ticket (the debt left by
//! the requests before it) and then pushes the ticket forward by its own
//! cost: it pays later, so the first request is free whatever its size.
//! Before each decision, idle time since the next free ticket turns into
//! stored permits (up to a maximum), which are spent first: free for
//! `SmoothBursty`, and along a trapezoid from `cold_factor × stable` down to
//! the stable interval for `SmoothWarmingUp`.
//!
//! # Stored permits as time
//!
//! Guava keeps stored permits as a double and rescales them on `setRate`.
//! Here they are kept as *stored time*: the idle time they were made of.
//! Both of Guava's limiters fill at exactly one unit of stored time per unit
//! of idle time (bursty: one permit per stable interval, up to
//! `max_burst × rate` permits, i.e. up to `max_burst`; warm-up: `max / warmup`
//! permits per unit of time, i.e. up to `warmup`), and Guava's proportional
//! rescale on `setRate` (`stored × new max / old max`) leaves the stored
//! time unchanged. So the stored time needs no rescaling, and it converts
//! to permits at the current rate: one permit is worth one stable interval
//! (bursty) or `warmup / max permits` = `2 (1 + c) / (c + 5)` stable
//! intervals (warm-up, cold factor `c`).
//!
//! For the warm-up limiter the threshold sits at the fraction
//! `(1 + c) / (c + 5)` of the warm-up period, whatever the rate. Stored time
//! above it costs the stable interval plus an extra that grows linearly from
//! zero at the threshold to `(c − 1) × stable` per permit at the top: taking
//! stored time `y` from `x` above the threshold (of `l` in all) costs an
//! extra `E × (y / l) × ((2x − y) / l)`, where `E = warmup × (c − 1) / (c + 1)`
//! is the extra of the whole trapezoid (so the whole trapezoid costs exactly
//! the warm-up period, as in Guava).
//!
//! # Exact time
//!
//! Time is fixed point: `2⁻³²` ns units in a `u128` (more than enough for
//! `Duration::MAX`). The stable interval is Guava's own double, `1e6 / rate`
//! µs, taken at its exact value and rounded *down* to a unit: fresh permits
//! cost an exact integer, so nothing drifts (relative error below
//! `2.4 × 10⁻¹⁰` even at 10⁹/s), and the cost of `i32::MAX` permits is
//! Guava's up to its final rounding (Guava rounds the product to a double,
//! then truncates it to a microsecond). Stored time is exact, so a bursty
//! request whose remaining cost is within the interval's rounding (a part
//! in 2⁴⁰) costs nothing: after an idle second, a limiter at 7/s has 7 free
//! permits even though `1e6 / 7` rounds up. The warm-up extra is computed in
//! `f64` (it only applies to stored permits above the threshold, at most
//! one warm-up period per cooling) and rounded to `2⁻¹⁶` ns, so that round
//! numbers come out exact. Waits are returned rounded up to the nanosecond:
//! never before their time.

use std::time::Duration;

use super::gcra::nanos_to_duration;
use crate::{ConfigError, Rate};

/// Fraction bits of the fixed-point time.
const FRAC: u32 = 32;
/// One nanosecond in fixed-point units.
const NANO: u128 = 1 << FRAC;
/// The latest representable instant (`Duration::MAX`); later ones saturate.
const MAX_TIME: u128 = (Duration::MAX.as_nanos()) << FRAC;
/// A bursty request's cost below `2⁻⁴⁰` of its full cost is rounding noise.
const NOISE_BITS: u32 = 40;
/// The warm-up extra is rounded to this many units (2⁻¹⁶ ns).
const EXTRA_GRID: f64 = 65_536.0;

/// Guava's smooth rate limiter — `SmoothBursty` or `SmoothWarmingUp` — as a
/// pure state machine: no clock, no tokio, no allocation.
///
/// Time comes in as `now`, a [`Duration`] since an origin of your choice
/// (the limiter's creation, as Guava's stopwatch). It is meant not to go
/// backwards; if it does, nothing panics; the call just sees more debt. [`reserve`](Self::reserve) is Guava's `acquire(permits)`: it
/// takes the permits and returns how long the caller must wait before
/// using them. [`try_reserve`](Self::try_reserve) is
/// `tryAcquire(permits, timeout)`, and [`set_rate`](Self::set_rate) is
/// `setRate`. The async [`SmoothBursty`](crate::SmoothBursty) and
/// [`SmoothWarmingUp`](crate::SmoothWarmingUp) call exactly this.
///
/// # Semantics (Guava's)
///
/// * **Resync.** Before each decision, if `now` is past the next free
///   ticket, the idle time since then becomes stored permits (one per
///   cool-down interval, up to the maximum) and the next free ticket moves
///   to `now`.
/// * **Pay later.** A request waits until the next free ticket — the debt
///   of the requests before it — and then pushes the ticket forward by its
///   own cost. The first request on a fresh limiter is free, whatever its
///   size; so is the first after the debt is paid.
/// * **Cost.** Stored permits are spent first. Bursty: they are free.
///   Warm-up: those above the threshold cost the area under a line from the
///   stable interval (at the threshold) to `cold_factor × stable` (at the
///   maximum); those below cost the stable interval. Fresh permits cost the
///   stable interval each.
/// * **Bursty** ([`bursty`](Self::bursty)): at most `rate × max_burst`
///   stored permits; starts empty. After a long idle, `rate × max_burst`
///   permits are free, and one more request after them (it pays later).
/// * **Warm-up** ([`warming_up`](Self::warming_up)): threshold
///   `½ × warmup / stable`, maximum `threshold + 2 × warmup / (stable +
///   cold)`. Starts cold (full). Idle time cools it at `max / warmup`
///   permits per unit of time, so cooling from warm to cold takes the warm-up
///   period, and spending the whole trapezoid costs exactly the warm-up
///   period. A cold factor of 1 turns the warm-up off.
/// * **`try_reserve`** succeeds when the *previous* debt fits in the timeout
///   (inclusive), whatever the size of the request; then it reserves like
///   `reserve`. When it fails, nothing changes (not even the resync).
/// * **`set_rate`** resyncs first (idle time is credited at the old rate),
///   leaves the next free ticket alone (the debt already incurred is paid at
///   the old rate) and rescales the stored permits proportionally, so a full
///   bucket stays full and a cold limiter stays as cold.
///
/// # Deliberate differences from Guava
///
/// * **Finer time.** Guava truncates every cost to a whole microsecond;
///   here time is exact to `2⁻³²` ns and waits are rounded *up* to the
///   nanosecond. So waits differ from Guava's by its truncation: under a
///   microsecond per cost term (a warm-up reservation has up to three), and
///   rates above 10⁶/s keep limiting (Guava's truncation makes a permit
///   free there). The stable interval is Guava's own double, `1e6 / rate`
///   µs, at its exact value. A request that arrives after the next free
///   ticket but not after it rounded up to the nanosecond (the instant a
///   wait told its caller) is on time: that sub-nanosecond is not idle
///   time. Rates above 10⁹/s (a permit per less than a nanosecond) are
///   refused.
/// * **Bad input is an error**, never a limiter that stops limiting: a
///   NaN, infinite, zero or negative rate is
///   [`ConfigError::InvalidRate`] (Guava throws, or for an infinite rate
///   lets everything through); a cold factor below 1 or not finite is
///   [`ConfigError::InvalidParameter`] `{ name: "cold_factor", .. }`.
/// * **A zero warm-up** gives a limiter with no stored permits: pure
///   pacing at the stable rate, first request free (Guava's stored permits
///   become NaN there and it stops limiting). A zero `max_burst` does the
///   same for the bursty limiter, as in Guava.
/// * **`max_burst` and `cold_factor` are parameters** (Guava hard-codes 1 s
///   and 3 in its public API).
/// * **Zero permits** is a no-op that waits for nothing (Guava throws).
/// * Arithmetic saturates at `Duration::MAX` instead of overflowing: a
///   century of uptime, `u32::MAX` permits at 0.1/s, or a `Duration::MAX`
///   timeout all have defined results.
///
/// # Examples
///
/// A bursty limiter at 5/s: the first request is free, then one per 200 ms;
/// after an idle second, five stored permits are free, and one request more.
///
/// ```
/// use std::time::Duration;
/// use tokio_ratelimit::algorithm::SmoothState;
///
/// let ms = Duration::from_millis;
/// let mut limiter = SmoothState::bursty(5.0, Duration::from_secs(1)).unwrap();
/// assert_eq!(limiter.reserve(ms(0), 1), ms(0));
/// assert_eq!(limiter.reserve(ms(0), 1), ms(200));
/// assert_eq!(limiter.reserve(ms(0), 1), ms(400));
/// // Idle until 2 s: the debt is paid at 600 ms, then 1.4 s of idle, capped at 1 s.
/// assert_eq!(limiter.stored_permits(ms(2000)), 5.0);
/// for _ in 0..6 {
///     assert_eq!(limiter.reserve(ms(2000), 1), ms(0));
/// }
/// assert_eq!(limiter.reserve(ms(2000), 1), ms(200));
/// ```
///
/// A warm-up limiter at 2/s, warming up over 4 s (Guava's own test): cold
/// permits cost up to three times the stable 500 ms.
///
/// ```
/// use std::time::Duration;
/// use tokio_ratelimit::algorithm::SmoothState;
///
/// let ms = Duration::from_millis;
/// let mut limiter = SmoothState::warming_up(2.0, Duration::from_secs(4), 3.0).unwrap();
/// let mut now = ms(0);
/// let mut waits = vec![];
/// for _ in 0..8 {
///     let wait = limiter.reserve(now, 1);
///     now += wait;
///     waits.push(wait.as_millis());
/// }
/// assert_eq!(waits, [0, 1375, 1125, 875, 625, 500, 500, 500]);
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct SmoothState {
    /// The rate as given, in permits per second.
    rate: f64,
    /// The stable interval, in units, rounded down.
    interval: u128,
    /// The next free ticket, in units since the origin.
    next_free: u128,
    /// Stored time, in units: `0..=max_stored`.
    stored: u128,
    /// The most stored time: `max_burst` (bursty) or `warmup` (warm-up).
    max_stored: u128,
    /// Warm-up parameters; `None` for the bursty limiter.
    warm: Option<Warm>,
}

/// The warm-up limiter's parameters.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Warm {
    warmup: Duration,
    cold_factor: f64,
    /// Stored time per permit over stable interval: `2 (1 + c) / (c + 5)`.
    per_permit_ratio: f64,
    /// Stored time one permit is worth (Guava's cool-down interval), in
    /// units; depends on the rate.
    per_permit: u128,
    /// Stored time at the threshold, in units: `warmup × (1 + c) / (c + 5)`.
    threshold: u128,
    /// The extra cost (over the stable interval) of the whole trapezoid, in
    /// ns: `warmup × (c − 1) / (c + 1)`.
    extra_total: f64,
}

impl SmoothState {
    /// Guava's `SmoothBursty`: `permits_per_second`, and up to
    /// `permits_per_second × max_burst` permits stored while idle (Guava:
    /// `max_burst` = 1 s). Starts with no stored permits at time zero.
    ///
    /// A zero `max_burst` stores nothing: pure pacing.
    ///
    /// # Errors
    ///
    /// [`ConfigError::InvalidRate`] for a rate that is NaN, infinite, not
    /// positive, above 10⁹/s or below one permit per `u64::MAX` ns.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use tokio_ratelimit::{ConfigError, algorithm::SmoothState};
    ///
    /// let limiter = SmoothState::bursty(10.0, Duration::from_secs(2)).unwrap();
    /// assert_eq!(limiter.max_permits(), 20.0);
    /// assert!(matches!(
    ///     SmoothState::bursty(f64::NAN, Duration::from_secs(1)),
    ///     Err(ConfigError::InvalidRate { .. })
    /// ));
    /// ```
    pub fn bursty(
        permits_per_second: f64,
        max_burst: Duration,
    ) -> Result<SmoothState, ConfigError> {
        Ok(SmoothState {
            rate: permits_per_second,
            interval: interval(permits_per_second)?,
            next_free: 0,
            stored: 0,
            max_stored: fixed(max_burst),
            warm: None,
        })
    }

    /// Guava's `SmoothWarmingUp`: `permits_per_second` once warm, starting
    /// cold, where a permit costs up to `cold_factor` stable intervals, and
    /// reaching the stable rate after spending `warmup` worth of permits
    /// (Guava: `cold_factor` = 3).
    ///
    /// A zero `warmup` stores nothing: pure pacing at the stable rate (Guava
    /// stops limiting there). A `cold_factor` of 1 turns the warm-up off.
    ///
    /// # Errors
    ///
    /// [`ConfigError::InvalidRate`] as for [`bursty`](Self::bursty);
    /// [`ConfigError::InvalidParameter`] `{ name: "cold_factor", .. }` for a
    /// cold factor below 1, NaN or infinite.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use tokio_ratelimit::{ConfigError, algorithm::SmoothState};
    ///
    /// let limiter = SmoothState::warming_up(10.0, Duration::from_secs(1), 3.0).unwrap();
    /// // Threshold 5 permits, maximum 5 + 2 × 1 s / (100 ms + 300 ms) = 10.
    /// assert_eq!(limiter.max_permits(), 10.0);
    /// assert_eq!(limiter.stored_permits(Duration::ZERO), 10.0); // cold
    /// assert!(matches!(
    ///     SmoothState::warming_up(10.0, Duration::from_secs(1), 0.5),
    ///     Err(ConfigError::InvalidParameter { name: "cold_factor", .. })
    /// ));
    /// ```
    pub fn warming_up(
        permits_per_second: f64,
        warmup: Duration,
        cold_factor: f64,
    ) -> Result<SmoothState, ConfigError> {
        let interval = interval(permits_per_second)?;
        if !cold_factor.is_finite() || cold_factor < 1.0 {
            return Err(ConfigError::InvalidParameter {
                name: "cold_factor",
                reason: "must be a finite number, at least 1",
            });
        }
        let c = cold_factor;
        let per_permit_ratio = 2.0 * (1.0 + c) / (c + 5.0);
        let max_stored = fixed(warmup);
        #[allow(clippy::cast_precision_loss)] // exact below 104 days, relative beyond
        let warmup_ns = warmup.as_nanos() as f64;
        let warm = Warm {
            warmup,
            cold_factor,
            per_permit_ratio,
            per_permit: mul_ratio(interval, per_permit_ratio),
            threshold: mul_ratio(max_stored, (1.0 + c) / (c + 5.0)).min(max_stored),
            extra_total: warmup_ns * (c - 1.0) / (c + 1.0),
        };
        Ok(SmoothState {
            rate: permits_per_second,
            interval,
            next_free: 0,
            // Starts cold: full.
            stored: max_stored,
            max_stored,
            warm: Some(warm),
        })
    }

    /// Guava's `acquire(permits)`: takes `permits` at `now` and returns how
    /// long the caller must wait before using them — until the debt of
    /// earlier requests is paid. This request's own cost is paid by the next
    /// one.
    ///
    /// `permits = 0` waits for nothing and changes nothing.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use tokio_ratelimit::algorithm::SmoothState;
    ///
    /// let secs = Duration::from_secs;
    /// let mut limiter = SmoothState::bursty(1.0, secs(1)).unwrap();
    /// assert_eq!(limiter.reserve(secs(0), 10), secs(0)); // free: pays later
    /// assert_eq!(limiter.reserve(secs(0), 1), secs(10)); // pays for the ten
    /// ```
    pub fn reserve(&mut self, now: Duration, permits: u32) -> Duration {
        if permits == 0 {
            return Duration::ZERO;
        }
        let now = fixed(now);
        self.resync(now);
        let ready = self.next_free;
        let cost = self.cost(permits);
        self.next_free = ready.saturating_add(cost).min(MAX_TIME);
        duration_ceil(ready.saturating_sub(now))
    }

    /// Guava's `tryAcquire(permits, timeout)`: `None` when the debt of the
    /// earlier requests is not paid within `timeout` from `now` (and then
    /// nothing changes), else reserves like [`reserve`](Self::reserve) and
    /// returns the wait (at most `timeout`).
    ///
    /// Only the earlier debt is checked, never the size of this request: a
    /// huge request succeeds when the limiter is free, and the next one pays
    /// for it. `permits = 0` returns `Some(Duration::ZERO)` and changes
    /// nothing.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use tokio_ratelimit::algorithm::SmoothState;
    ///
    /// let ms = Duration::from_millis;
    /// let mut limiter = SmoothState::bursty(5.0, Duration::from_secs(1)).unwrap();
    /// assert_eq!(limiter.try_reserve(ms(0), 1, ms(0)), Some(ms(0)));
    /// assert_eq!(limiter.try_reserve(ms(0), 1, ms(199)), None); // 200 ms of debt
    /// assert_eq!(limiter.try_reserve(ms(0), 1, ms(200)), Some(ms(200))); // inclusive
    /// ```
    pub fn try_reserve(
        &mut self,
        now: Duration,
        permits: u32,
        timeout: Duration,
    ) -> Option<Duration> {
        if permits == 0 {
            return Some(Duration::ZERO);
        }
        if self.next_free > fixed(now).saturating_add(fixed(timeout)) {
            return None;
        }
        Some(self.reserve(now, permits))
    }

    /// Guava's `setRate`: changes the stable rate at `now`.
    ///
    /// Idle time up to `now` is first credited at the old rate; the debt
    /// already incurred (the next free ticket) stays as it is; stored
    /// permits are rescaled in proportion to the new maximum, so a full
    /// limiter stays full and a cold one stays as cold.
    ///
    /// # Errors
    ///
    /// [`ConfigError::InvalidRate`], as for [`bursty`](Self::bursty); the
    /// state is then unchanged.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use tokio_ratelimit::algorithm::SmoothState;
    ///
    /// let ms = Duration::from_millis;
    /// let mut limiter = SmoothState::bursty(1.0, Duration::from_secs(1)).unwrap();
    /// limiter.reserve(ms(0), 1);
    /// limiter.set_rate(ms(0), 10.0).unwrap();
    /// assert_eq!(limiter.reserve(ms(0), 1), ms(1000)); // the old debt stands
    /// assert_eq!(limiter.reserve(ms(0), 1), ms(1100)); // new requests cost 100 ms
    /// ```
    pub fn set_rate(&mut self, now: Duration, permits_per_second: f64) -> Result<(), ConfigError> {
        let interval = interval(permits_per_second)?;
        self.resync(fixed(now));
        self.interval = interval;
        self.rate = permits_per_second;
        if let Some(warm) = &mut self.warm {
            warm.per_permit = mul_ratio(interval, warm.per_permit_ratio);
        }
        // The stored time is unchanged: that is Guava's proportional
        // rescale of stored permits (see the module notes).
        Ok(())
    }

    /// The stable rate, in permits per second, as given.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use tokio_ratelimit::algorithm::SmoothState;
    ///
    /// let mut limiter = SmoothState::bursty(2.5, Duration::from_secs(1)).unwrap();
    /// assert_eq!(limiter.rate(), 2.5);
    /// limiter.set_rate(Duration::ZERO, 40.0).unwrap();
    /// assert_eq!(limiter.rate(), 40.0);
    /// ```
    pub fn rate(&self) -> f64 {
        self.rate
    }

    /// The stable interval between permits, rounded down to a nanosecond
    /// (the limiter uses it to `2⁻³²` ns).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use tokio_ratelimit::algorithm::SmoothState;
    ///
    /// let limiter = SmoothState::bursty(3.0, Duration::from_secs(1)).unwrap();
    /// assert_eq!(limiter.stable_interval(), Duration::from_nanos(333_333_333));
    /// ```
    pub fn stable_interval(&self) -> Duration {
        nanos_to_duration(self.interval / NANO)
    }

    /// The next free ticket: when the debt of the requests so far is paid,
    /// rounded up to a nanosecond. A request at or after it waits for
    /// nothing.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use tokio_ratelimit::algorithm::SmoothState;
    ///
    /// let ms = Duration::from_millis;
    /// let mut limiter = SmoothState::bursty(4.0, Duration::from_secs(1)).unwrap();
    /// limiter.reserve(ms(0), 2);
    /// assert_eq!(limiter.next_free(), ms(500));
    /// // 100 ms of idle (0.4 stored permits) pays for part of the next two.
    /// limiter.reserve(ms(600), 2);
    /// assert_eq!(limiter.next_free(), ms(1000));
    /// ```
    pub fn next_free(&self) -> Duration {
        duration_ceil(self.next_free)
    }

    /// The permits stored at `now` (idle time counted up to `now`, without
    /// changing the state): free ones for a bursty limiter, the cold ones
    /// for a warm-up limiter.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use tokio_ratelimit::algorithm::SmoothState;
    ///
    /// let ms = Duration::from_millis;
    /// let limiter = SmoothState::bursty(10.0, Duration::from_secs(1)).unwrap();
    /// assert_eq!(limiter.stored_permits(ms(250)), 2.5);
    /// assert_eq!(limiter.stored_permits(ms(5000)), 10.0);
    /// ```
    pub fn stored_permits(&self, now: Duration) -> f64 {
        self.to_permits(self.idle_stored(fixed(now)).unwrap_or(self.stored))
    }

    /// The most permits that can be stored: `rate × max_burst` (bursty), or
    /// `threshold + 2 × warmup / (stable + cold)` (warm-up).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use tokio_ratelimit::algorithm::SmoothState;
    ///
    /// let limiter = SmoothState::bursty(5.0, Duration::from_millis(400)).unwrap();
    /// assert_eq!(limiter.max_permits(), 2.0);
    /// ```
    pub fn max_permits(&self) -> f64 {
        self.to_permits(self.max_stored)
    }

    /// The warm-up period; `None` for a bursty limiter.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use tokio_ratelimit::algorithm::SmoothState;
    ///
    /// let secs = Duration::from_secs;
    /// let warm = SmoothState::warming_up(10.0, secs(2), 4.0).unwrap();
    /// assert_eq!((warm.warmup(), warm.cold_factor()), (Some(secs(2)), Some(4.0)));
    /// let bursty = SmoothState::bursty(10.0, secs(2)).unwrap();
    /// assert_eq!((bursty.warmup(), bursty.cold_factor()), (None, None));
    /// ```
    pub fn warmup(&self) -> Option<Duration> {
        self.warm.map(|w| w.warmup)
    }

    /// The cold factor; `None` for a bursty limiter (see
    /// [`warmup`](Self::warmup)).
    pub fn cold_factor(&self) -> Option<f64> {
        self.warm.map(|w| w.cold_factor)
    }

    /// Turns idle time before `now` into stored time.
    fn resync(&mut self, now: u128) {
        if let Some(stored) = self.idle_stored(now) {
            self.stored = stored;
            self.next_free = now;
        }
    }

    /// The stored time with the idle time up to `now` added, or `None` when
    /// there is no idle time.
    ///
    /// A caller that comes back at the instant it was told to — the next
    /// free ticket rounded up to the nanosecond, as waits are — is on time,
    /// not idle: otherwise the rounding would be stored on every request,
    /// and a warm-up limiter (whose stored permits cost the stable interval
    /// like fresh ones) would drift by up to a nanosecond per request.
    fn idle_stored(&self, now: u128) -> Option<u128> {
        // `next_free` ≤ `MAX_TIME`, a whole number of nanoseconds: no overflow.
        let on_time = self.next_free.div_ceil(NANO) * NANO;
        (now > on_time).then(|| {
            self.stored
                .saturating_add(now - self.next_free)
                .min(self.max_stored)
        })
    }

    /// Spends stored permits first and returns the cost of `n` permits, in
    /// units.
    fn cost(&mut self, n: u32) -> u128 {
        let fresh = self.interval.saturating_mul(u128::from(n));
        let Some(warm) = self.warm else {
            // Bursty: stored permits are free.
            let spent = self.stored.min(fresh);
            self.stored -= spent;
            let cost = fresh - spent;
            // The stored time is exact but the interval is a double's value:
            // a remainder within its rounding is no cost (after an idle
            // second at 7/s, 1e6 / 7 rounds up a hair, and all 7 stored
            // permits must still be free, as in Guava).
            return if cost <= fresh >> NOISE_BITS { 0 } else { cost };
        };
        // Warm-up: every permit costs the stable interval, plus an extra
        // for those taken above the threshold.
        let taken = self
            .stored
            .min(warm.per_permit.saturating_mul(u128::from(n)));
        let above = self.stored.saturating_sub(warm.threshold);
        let from_above = above.min(taken);
        let extra = if from_above == 0 {
            0
        } else {
            warm.extra(from_above, above, self.max_stored - warm.threshold)
        };
        self.stored -= taken;
        fresh.saturating_add(extra)
    }

    /// Stored time in permits at the current rate.
    #[allow(clippy::cast_precision_loss)] // a float answer is wanted
    fn to_permits(&self, stored: u128) -> f64 {
        let per_permit = self.warm.map_or(self.interval, |w| w.per_permit);
        stored as f64 / per_permit as f64
    }
}

impl Warm {
    /// The extra cost, in units, of taking stored time `y` from `x` above
    /// the threshold (`0 < y ≤ x ≤ l`, `l` the stored time above the
    /// threshold when cold): the area between the cost line and the stable
    /// interval, `E × (y / l) × ((2x − y) / l)`.
    #[allow(
        clippy::cast_precision_loss,
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss
    )]
    fn extra(&self, y: u128, x: u128, l: u128) -> u128 {
        let (y, x, l) = (y as f64, x as f64, l as f64);
        let ns = (self.extra_total * (y / l) * ((2.0 * x - y) / l)).clamp(0.0, self.extra_total);
        // To the 2⁻¹⁶ ns grid: round numbers come out exact despite the
        // float's last-bit errors. `as` saturates.
        ((ns * EXTRA_GRID).round() as u128).saturating_mul(NANO / (1 << 16))
    }
}

/// A duration in fixed-point units.
fn fixed(d: Duration) -> u128 {
    // At most 2⁹⁵ ns, so the shift cannot overflow.
    d.as_nanos() << FRAC
}

/// Fixed-point units as a duration, rounded up to a nanosecond.
fn duration_ceil(units: u128) -> Duration {
    nanos_to_duration(units.div_ceil(NANO))
}

/// The stable interval of a rate in permits per second, in units: Guava's
/// own double `1e6 / rate` µs, at its exact value, rounded down to a unit.
fn interval(permits_per_second: f64) -> Result<u128, ConfigError> {
    // The same checks (and messages) as every other limiter's rate.
    Rate::per_second_f64(permits_per_second).validate()?;
    let micros = 1e6 / permits_per_second;
    // At most 10⁹/s: at least one nanosecond (0.001 µs rounds up a hair).
    Ok(mul_ratio(1000 * NANO, micros).max(NANO))
}

/// `floor(value × ratio)` for a finite `ratio ≥ 0`, exactly (the float is
/// taken at its exact binary value), saturating at `u128::MAX`.
#[allow(clippy::cast_possible_truncation, clippy::cast_possible_wrap)]
fn mul_ratio(value: u128, ratio: f64) -> u128 {
    if ratio <= 0.0 || value == 0 {
        return 0;
    }
    // ratio = mantissa × 2^exp exactly.
    let bits = ratio.to_bits();
    let biased = ((bits >> 52) & 0x7ff) as i32;
    let fraction = u128::from(bits & ((1 << 52) - 1));
    let (mantissa, exp) = if biased == 0 {
        (fraction, -1074)
    } else {
        (fraction | (1 << 52), biased - 1075)
    };
    // value × mantissa as a 256-bit number (high, low).
    let p_lo = (value & u128::from(u64::MAX)) * mantissa;
    let p_hi = (value >> 64) * mantissa;
    let low = p_lo.wrapping_add(p_hi << 64);
    let high = (p_hi >> 64) + u128::from(low < p_lo);
    if exp >= 0 {
        let shift = exp.unsigned_abs();
        if high != 0 || shift >= 128 || low.leading_zeros() < shift {
            return u128::MAX;
        }
        return low << shift;
    }
    let shift = exp.unsigned_abs();
    if shift >= 256 {
        0
    } else if shift >= 128 {
        high >> (shift - 128)
    } else if high >> shift != 0 {
        u128::MAX
    } else {
        (low >> shift) | (high << (128 - shift))
    }
}

#[cfg(test)]
#[allow(clippy::float_cmp)] // the stored permits asserted are exact on purpose
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn us(n: u64) -> Duration {
        Duration::from_micros(n)
    }

    /// Waits of `n` back-to-back single-permit requests made at their turn.
    fn ramp(state: &mut SmoothState, start: Duration, n: usize) -> Vec<Duration> {
        let mut now = start;
        (0..n)
            .map(|_| {
                let wait = state.reserve(now, 1);
                now += wait;
                wait
            })
            .collect()
    }

    #[test]
    fn mul_ratio_is_exact() {
        assert_eq!(mul_ratio(10, 0.5), 5);
        assert_eq!(mul_ratio(11, 0.5), 5);
        assert_eq!(mul_ratio(3, 1.0), 3);
        assert_eq!(mul_ratio(1 << 100, 1.0), 1 << 100);
        assert_eq!(mul_ratio(u128::MAX, 1.0), u128::MAX);
        assert_eq!(mul_ratio(u128::MAX, 0.5), u128::MAX >> 1);
        assert_eq!(mul_ratio(u128::MAX, 2.0), u128::MAX);
        assert_eq!(mul_ratio(1 << 127, 2.0), u128::MAX);
        assert_eq!(mul_ratio(1 << 126, 2.0), 1 << 127);
        assert_eq!(mul_ratio(7, 0.0), 0);
        assert_eq!(mul_ratio(1, f64::MIN_POSITIVE), 0);
        // 0.1 is a little above one tenth as a double.
        assert_eq!(
            mul_ratio(1_000_000_000_000_000_000, 0.1),
            100_000_000_000_000_005
        );
        assert_eq!(mul_ratio(NANO * 100, 1.2), 515_396_075_519); // floor(1.2 × 100 × 2³²)
    }

    #[test]
    fn interval_is_guavas_double_at_its_exact_value() {
        assert_eq!(interval(5.0).unwrap(), 200_000_000 * NANO);
        assert_eq!(interval(0.1).unwrap(), 10_000_000_000 * NANO);
        assert_eq!(interval(2e6).unwrap(), 500 * NANO);
        assert_eq!(interval(1e9).unwrap(), NANO);
        // 1e6 / 3 µs is 333 333.333 333 333 313 9… as a double.
        assert_eq!(interval(3.0).unwrap(), mul_ratio(1000 * NANO, 1e6 / 3.0));
        let third = (1_000_000_000 * NANO) / 3;
        assert!(third - interval(3.0).unwrap() < NANO / 10_000_000);
        let seventh = (1000 * NANO) / 7;
        assert!(interval(7e6).unwrap().abs_diff(seventh) < 2);
        for bad in [f64::NAN, f64::INFINITY, -1.0, 0.0, 1.5e9, 1e-12] {
            assert!(
                matches!(interval(bad), Err(ConfigError::InvalidRate { .. })),
                "{bad}"
            );
        }
    }

    #[test]
    fn bursty_pays_later_and_stores_idle_time() {
        let mut s = SmoothState::bursty(5.0, Duration::from_secs(1)).unwrap();
        assert_eq!(s.reserve(ms(0), 1), ms(0));
        assert_eq!(s.reserve(ms(0), 1), ms(200));
        assert_eq!(s.next_free(), ms(400));
        // 400 ms late: 0.4 s of idle, two free permits.
        assert_eq!(s.stored_permits(ms(800)), 2.0);
        assert_eq!(s.reserve(ms(800), 1), ms(0));
        assert_eq!(s.reserve(ms(800), 1), ms(0));
        assert_eq!(s.reserve(ms(800), 1), ms(0)); // fresh, pays later
        assert_eq!(s.reserve(ms(800), 1), ms(200));
    }

    #[test]
    fn bursty_free_permits_after_idle_at_awkward_rates() {
        // k permits never cost more than k / rate: after an idle second, all
        // `rate` stored permits are free and the next request too.
        for rate in [3.0, 7.0, 11.0, 13.0, 17.0, 0.3 * 10.0, 100_000.0, 7e6] {
            let mut s = SmoothState::bursty(rate, Duration::from_secs(1)).unwrap();
            let idle = Duration::from_secs(5);
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
            let n = rate as u32;
            for i in 0..=n {
                assert_eq!(
                    s.reserve(idle, 1),
                    Duration::ZERO,
                    "rate {rate}, request {i}"
                );
            }
            assert!(s.reserve(idle, 1) > Duration::ZERO, "rate {rate}");
        }
        let mut s = SmoothState::bursty(0.3, Duration::from_secs(10)).unwrap();
        for _ in 0..4 {
            assert_eq!(s.reserve(Duration::from_secs(20), 1), Duration::ZERO);
        }
        assert_eq!(
            s.reserve(Duration::from_secs(20), 1),
            Duration::from_nanos(3_333_333_334)
        );
    }

    #[test]
    fn warm_up_trapezoid() {
        // Guava's testWarmUp: 2/s over 4 s, cold factor 3.
        let mut s = SmoothState::warming_up(2.0, Duration::from_secs(4), 3.0).unwrap();
        assert_eq!(s.max_permits(), 8.0);
        let waits = ramp(&mut s, ms(0), 8);
        assert_eq!(waits, [0, 1375, 1125, 875, 625, 500, 500, 500].map(ms));
        // The whole trapezoid (4 permits above the threshold) costs exactly
        // the warm-up period: the first 4 waits after the free one.
        assert_eq!(waits[1..5].iter().sum::<Duration>(), ms(4000));
        // Cooling back takes the warm-up period: after 4 s idle past the
        // debt, the limiter is cold again.
        let then = s.next_free() + Duration::from_secs(4);
        assert_eq!(s.stored_permits(then), 8.0);
        let waits = ramp(&mut s, then, 3);
        assert_eq!(waits, [0, 1375, 1125].map(ms));
    }

    #[test]
    fn warm_up_with_big_requests() {
        let mut s = SmoothState::warming_up(10.0, Duration::from_secs(1), 3.0).unwrap();
        // 10 stored permits: 5 above the threshold cost 1 s in all, 5 below
        // 100 ms each; 5 fresh ones 100 ms each.
        assert_eq!(s.reserve(ms(0), 15), ms(0));
        assert_eq!(s.reserve(ms(0), 1), ms(2000));
        assert_eq!(s.stored_permits(ms(0)), 0.0);
    }

    #[test]
    fn cold_factor_one_turns_warm_up_off() {
        let mut s = SmoothState::warming_up(5.0, Duration::from_secs(4), 1.0).unwrap();
        let waits = ramp(&mut s, ms(0), 5);
        assert_eq!(waits, [0, 200, 200, 200, 200].map(ms));
    }

    #[test]
    fn zero_warm_up_is_pure_pacing() {
        let mut s = SmoothState::warming_up(10.0, Duration::ZERO, 3.0).unwrap();
        assert_eq!(s.max_permits(), 0.0);
        assert_eq!(s.reserve(ms(0), 1), ms(0));
        assert_eq!(s.reserve(ms(0), 1), ms(100));
        // No stored permits after idle: the first request is free, the next
        // one pays.
        assert_eq!(s.reserve(ms(10_000), 1), ms(0));
        assert_eq!(s.reserve(ms(10_000), 1), ms(100));
        assert_eq!(s.stored_permits(ms(99_000)), 0.0);
        let mut b = SmoothState::bursty(10.0, Duration::ZERO).unwrap();
        assert_eq!(b.reserve(ms(10_000), 1), ms(0));
        assert_eq!(b.reserve(ms(10_000), 1), ms(100));
    }

    #[test]
    fn try_reserve_checks_only_the_previous_debt_and_changes_nothing_on_failure() {
        let mut s = SmoothState::bursty(5.0, Duration::from_secs(1)).unwrap();
        assert_eq!(s.try_reserve(ms(0), 100, ms(0)), Some(ms(0))); // 20 s of debt
        let before = s.clone();
        assert_eq!(s.try_reserve(ms(19_999), 1, ms(0)), None);
        assert_eq!(s, before);
        assert_eq!(s.try_reserve(ms(19_999), 1, us(999)), None);
        assert_eq!(s.try_reserve(ms(19_999), 1, ms(1)), Some(ms(1)));
        assert_eq!(s.try_reserve(ms(0), 1, Duration::MAX), Some(ms(20_200)));
        assert_eq!(s.try_reserve(ms(0), 0, ms(0)), Some(ms(0)));
    }

    #[test]
    fn failed_try_reserve_does_not_resync() {
        // A failed try_reserve leaves even the idle time alone.
        let mut s = SmoothState::warming_up(10.0, Duration::from_secs(1), 3.0).unwrap();
        s.reserve(ms(0), 15); // now warm, with 2 s of debt
        let before = s.clone();
        assert_eq!(s.try_reserve(ms(100), 1, ms(0)), None);
        assert_eq!(s, before);
    }

    #[test]
    fn set_rate_keeps_debt_and_rescales_stored_permits() {
        let mut s = SmoothState::bursty(2.0, Duration::from_secs(1)).unwrap();
        s.reserve(ms(0), 1);
        s.reserve(ms(0), 1); // debt until 1 s
        s.set_rate(ms(0), 10.0).unwrap();
        assert_eq!(s.next_free(), ms(1000));
        assert_eq!(s.reserve(ms(0), 1), ms(1000));
        assert_eq!(s.reserve(ms(0), 1), ms(1100));
        // Half full at 2/s → half full at 10/s.
        let mut s = SmoothState::bursty(2.0, Duration::from_secs(1)).unwrap();
        s.set_rate(ms(500), 10.0).unwrap(); // 0.5 s of idle credited at 2/s: 1 permit
        assert_eq!(s.stored_permits(ms(500)), 5.0);
        assert_eq!(s.max_permits(), 10.0);
        // A cold warm-up limiter stays cold.
        let mut w = SmoothState::warming_up(2.0, Duration::from_secs(4), 3.0).unwrap();
        w.set_rate(ms(0), 4.0).unwrap();
        assert_eq!(w.stored_permits(ms(0)), w.max_permits());
        assert_eq!(w.max_permits(), 16.0);
        let waits = ramp(&mut w, ms(0), 3);
        assert_eq!(waits, [us(0), us(718_750), us(656_250)]);
        // Bad rates change nothing.
        let before = w.clone();
        assert!(w.set_rate(ms(1), f64::NAN).is_err());
        assert!(w.set_rate(ms(1), 0.0).is_err());
        assert_eq!(w, before);
    }

    #[test]
    fn high_rates_keep_limiting_without_drift() {
        // 7 M/s: one permit per 142.857… ns, exactly on average.
        let mut s = SmoothState::bursty(7e6, Duration::ZERO).unwrap();
        let mut now = Duration::ZERO;
        for _ in 0..7_000_000 {
            now += s.reserve(now, 1);
        }
        // The 7 000 000th request waits for the debt of 6 999 999 permits.
        assert_eq!(now, Duration::from_nanos(999_999_858)); // ceil(6 999 999 / 7 µs)
        assert_eq!(s.next_free(), ms(1000));
        // 3/s over a day: no drift either.
        let mut s = SmoothState::bursty(3.0, Duration::ZERO).unwrap();
        let mut now = Duration::ZERO;
        for _ in 0..=3 * 86_400 {
            now += s.reserve(now, 1);
        }
        assert_eq!(now, Duration::from_secs(86_400));
        // 2 M/s: Guava's truncation would make every permit free.
        let mut s = SmoothState::bursty(2e6, Duration::ZERO).unwrap();
        s.reserve(ms(0), 1);
        assert_eq!(s.reserve(ms(0), 1), Duration::from_nanos(500));
    }

    #[test]
    fn a_caller_back_at_its_instant_is_on_time() {
        // A caller that retries at the next free ticket (as `retry_after`
        // tells it, rounded up to the nanosecond) is on time. Were the
        // rounding (142.857… ns → 143 ns) idle time, a warm limiter, whose
        // stored permits cost the stable interval like fresh ones, would
        // deliver one permit per 143 ns instead of 7 M/s.
        for mut s in [
            SmoothState::warming_up(7e6, us(10), 3.0).unwrap(),
            SmoothState::warming_up(7e6, Duration::ZERO, 3.0).unwrap(),
            SmoothState::bursty(7e6, Duration::ZERO).unwrap(),
        ] {
            let mut now = Duration::ZERO;
            for _ in 0..1000 {
                now += s.reserve(now, 1); // warm up
            }
            let from = s.next_free();
            let mut granted = 0;
            while granted < 700_000 {
                match s.try_reserve(now, 1, Duration::ZERO) {
                    Some(_) => granted += 1,
                    None => now = s.next_free(),
                }
            }
            let span = s.next_free().saturating_sub(from);
            assert!(
                span.abs_diff(ms(100)) <= Duration::from_nanos(1),
                "{span:?}"
            );
        }
        // Later than that is idle time.
        let mut s = SmoothState::bursty(7e6, Duration::from_secs(1)).unwrap();
        s.reserve(ms(0), 1); // next free at 142.857… ns
        assert_eq!(s.stored_permits(Duration::from_nanos(143)), 0.0);
        assert!(s.stored_permits(Duration::from_nanos(144)) > 0.0);
    }

    #[test]
    fn huge_weights_and_a_century_saturate() {
        let century = Duration::from_secs(100 * 365 * 24 * 3600);
        let mut s = SmoothState::warming_up(0.1, Duration::from_secs(100), 20.0).unwrap();
        assert_eq!(s.reserve(century, u32::MAX), Duration::ZERO);
        let debt = s.reserve(century, u32::MAX);
        // About u32::MAX × 10 s (plus the warm-up's extra).
        assert!(debt > Duration::from_secs(42_949_672_950), "{debt:?}");
        assert!(debt < Duration::from_secs(42_949_673_100), "{debt:?}");
        for _ in 0..1000 {
            s.reserve(Duration::MAX, u32::MAX);
        }
        assert_eq!(s.next_free(), Duration::MAX);
        assert_eq!(s.reserve(Duration::MAX, 1), Duration::ZERO);
        assert_eq!(
            s.try_reserve(Duration::ZERO, 1, Duration::MAX),
            Some(Duration::MAX)
        );
        let mut b = SmoothState::bursty(1e9, Duration::MAX).unwrap();
        assert_eq!(b.reserve(Duration::MAX, u32::MAX), Duration::ZERO);
        assert_eq!(b.reserve(Duration::MAX, u32::MAX), Duration::ZERO);
    }

    #[test]
    fn bad_parameters() {
        for c in [0.5, 0.0, -1.0, f64::NAN, f64::INFINITY] {
            assert!(
                matches!(
                    SmoothState::warming_up(1.0, ms(1), c),
                    Err(ConfigError::InvalidParameter {
                        name: "cold_factor",
                        ..
                    })
                ),
                "{c}"
            );
        }
        assert!(SmoothState::warming_up(1.0, ms(1), 1e300).is_ok());
        for r in [
            f64::NAN,
            0.0,
            -0.0,
            -3.0,
            f64::INFINITY,
            f64::NEG_INFINITY,
            2e9,
        ] {
            assert!(matches!(
                SmoothState::bursty(r, ms(1)),
                Err(ConfigError::InvalidRate { .. })
            ));
            assert!(matches!(
                SmoothState::warming_up(r, ms(1), 3.0),
                Err(ConfigError::InvalidRate { .. })
            ));
        }
    }
}
