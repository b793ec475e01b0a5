//! Guava's `SmoothRateLimiter` (`SmoothBursty` and `SmoothWarmingUp`) as a
//! pure state machine, with Guava's own arithmetic.
//!
//! This is a line-by-line port of Guava 31.1's `SmoothRateLimiter`,
//! `SmoothBursty` and `SmoothWarmingUp` (and of the parts of `RateLimiter`
//! that call them): the same `double`s (stored and maximum permits, the
//! stable interval, the warm-up threshold and slope), the same order of
//! floating-point operations, the same `(long)` truncation of every cost
//! term (Rust's `as i64`: toward zero, saturating, NaN to 0), a `long`
//! next-free ticket with `LongMath.saturatedAdd`, and `now` read truncated
//! to the unit. So it gives Guava's answers bit for bit, truncation
//! errors included (these are amplified on the warm-up trapezoid, so
//! arithmetic finer than Guava's can differ from it by several
//! microseconds per request).
//!
//! The unit is Guava's microsecond, except where the stable interval is
//! below one microsecond (above 10⁶ permits per second), where Guava's
//! truncation makes every permit free: there the unit is the picosecond,
//! with the same formulas (`1e12 / rate` ps), so that even 10⁹ permits per
//! second cost what they should to within a thousandth.

use std::time::Duration;

use super::gcra::nanos_to_duration;
use crate::{ConfigError, Rate};

/// Picoseconds per nanosecond: time is kept in picoseconds.
const PS_PER_NS: u128 = 1000;
/// Guava's unit, the microsecond, in picoseconds.
const MICROS: u128 = 1_000_000;
/// The latest instant, in picoseconds: Guava's `Long.MAX_VALUE` µs. The
/// next free ticket saturates there (`LongMath.saturatedAdd`), and a later
/// `now` is taken as this instant.
const LATEST: u128 = i64::MAX as u128 * MICROS;

/// Guava's smooth rate limiter — `SmoothBursty` or `SmoothWarmingUp` — as a
/// pure state machine: no clock, no tokio, no allocation.
///
/// Time comes in as `now`, a [`Duration`] since an origin of your choice
/// (the limiter's creation, as Guava's stopwatch). It is meant not to go
/// backwards; if it does, nothing panics; the call just sees more debt.
/// [`reserve`](Self::reserve) is Guava's `acquire(permits)`: it takes the
/// permits and returns how long the caller must wait before using them.
/// [`try_reserve`](Self::try_reserve) is `tryAcquire(permits, timeout)`,
/// and [`set_rate`](Self::set_rate) is `setRate`. The async
/// [`SmoothBursty`](crate::SmoothBursty) and
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
///   period, and spending the whole trapezoid costs the warm-up period. A
///   cold factor of 1 turns the warm-up off.
/// * **`try_reserve`** succeeds when the *previous* debt fits in the timeout
///   (inclusive), whatever the size of the request; then it reserves like
///   `reserve`. When it fails, nothing changes (not even the resync).
/// * **`set_rate`** resyncs first (idle time is credited at the old rate),
///   leaves the next free ticket alone (the debt already incurred is paid at
///   the old rate) and rescales the stored permits proportionally, so a full
///   bucket stays full and a cold limiter stays as cold.
///
/// # Guava's arithmetic
///
/// The arithmetic is Guava's, bit for bit (see the module source): time in
/// whole microseconds, `now` truncated to the microsecond, permits and
/// intervals as doubles, and every cost term truncated to a whole
/// microsecond. So, as in Guava:
///
/// * **A permit can be up to 1 µs cheaper than `1 / rate`**: each cost
///   term of a reservation (its fresh permits; for the warm-up limiter,
///   also its stored permits above and below the threshold) is truncated
///   to a whole microsecond. At 3/s a permit costs 333 333 µs, so three
///   one-permit requests cost 999 999 µs.
/// * **Waits are whole microseconds**, counted from `now` truncated to the
///   microsecond: a caller at 1.5 µs whose turn is at 3 µs is told to wait
///   2 µs (it resumes at 3.5 µs, at most 1 µs late).
///
/// **Above 10⁶ permits per second** (a stable interval below 1 µs, where
/// Guava's truncation makes every permit free), the unit is the picosecond
/// instead, with the same formulas: the stable interval is `1e12 / rate`
/// ps, and a permit can be up to 1 ps cheaper (waits are then rounded up to
/// the nanosecond). A [`set_rate`](Self::set_rate) across 10⁶/s switches
/// the unit; the next free ticket is kept in picoseconds, and a pending debt
/// rounds *up* to the coarser unit, so no debt is lost.
///
/// # Deliberate differences from Guava
///
/// * **Rates above 10⁶/s keep limiting** (see above). Rates above 10⁹/s (a
///   permit per less than a nanosecond) are refused.
/// * **Bad input is an error**, never a limiter that stops limiting: a
///   NaN, infinite, zero or negative rate is
///   [`ConfigError::InvalidRate`] (Guava throws, or for an infinite rate
///   lets everything through); a cold factor below 1 or not finite is
///   [`ConfigError::InvalidParameter`] `{ name: "cold_factor", .. }`.
/// * **A zero warm-up** (or one below the unit) gives a limiter with no
///   stored permits: pure pacing at the stable rate, first request free
///   (Guava's cool-down interval is `0 / 0` there, its stored permits
///   become NaN and it stops limiting). A zero `max_burst` does the same
///   for the bursty limiter, as in Guava.
/// * **`max_burst` and `cold_factor` are parameters** (Guava hard-codes 1 s
///   and 3 in its public API).
/// * **Zero permits** is a no-op that waits for nothing (Guava throws);
///   up to `u32::MAX` permits can be asked for (Guava: `i32::MAX`).
/// * **Arithmetic saturates** where Java's `long` would wrap (the sum of
///   two cost terms); a `now` beyond Guava's `Long.MAX_VALUE` µs (292 000
///   years) is taken as that instant. A century of uptime, `u32::MAX`
///   permits at the slowest rate or a `Duration::MAX` timeout all have
///   defined results.
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
///
/// Guava's truncation: at 3/s a permit costs 333 333 µs.
///
/// ```
/// use std::time::Duration;
/// use tokio_ratelimit::algorithm::SmoothState;
///
/// let mut limiter = SmoothState::bursty(3.0, Duration::ZERO).unwrap();
/// for _ in 0..3 {
///     limiter.reserve(Duration::ZERO, 1);
/// }
/// assert_eq!(limiter.next_free(), Duration::from_micros(999_999));
/// ```
///
/// # Layout
///
/// A grant reads or writes the fields in the order declared (`repr(C)`),
/// the cold ones last, so that a limiter two threads share moves as few
/// cache lines between them as it can (`HOT_END`); and the whole is 8-byte aligned
/// (`packed(8)`: the 128-bit ticket would otherwise align it, and the
/// engine's lock around it, to 16, which costs a smooth limiter's engine
/// the 16 bytes its layout needs; see `engine::Engine`). Nothing takes a
/// reference to a field.
#[derive(Debug, Clone, PartialEq)]
#[repr(C, packed(8))]
pub struct SmoothState {
    /// Guava's `nextFreeTicketMicros`, in picoseconds: a whole number of
    /// units, at most [`LATEST`].
    next_free: u128,
    /// Guava's `storedPermits`.
    stored_permits: f64,
    /// Guava's `maxPermits`.
    max_permits: f64,
    /// Picoseconds per unit of time: [`MICROS`] (Guava's), or 1 when the
    /// stable interval is below a microsecond.
    unit: u64,
    /// Guava's `stableIntervalMicros`, in units.
    stable_interval: f64,
    /// What differs between the two limiters (its variant is read on every
    /// grant).
    kind: Kind,
    /// What one permit costs a full limiter, in units: the next free
    /// ticket's step for the meter's usual grant (see
    /// [`try_take`](Self::try_take)), computed at each rate. (Read only by
    /// a grant after a long idle.)
    full_cost: u64,
    /// The rate as given, in permits per second.
    rate: f64,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Kind {
    /// `SmoothBursty`.
    Bursty {
        /// Guava's `maxBurstSeconds` (1 s in its public API), as given.
        max_burst: Duration,
    },
    /// `SmoothWarmingUp`.
    WarmingUp {
        /// The warm-up period as given.
        warmup: Duration,
        /// Guava's `coldFactor`.
        cold_factor: f64,
        /// Guava's `warmupPeriodMicros` (a `long`), in units.
        warmup_units: f64,
        /// Guava's `thresholdPermits`.
        threshold_permits: f64,
        /// Guava's `slope`.
        slope: f64,
    },
}

impl SmoothState {
    /// Where the fields a grant reads or writes end (bytes from the start;
    /// `kind` is the last of them):
    /// the engine's layout test keeps them off the counter stripes' lines.
    #[cfg(test)]
    pub(crate) const HOT_END: usize =
        std::mem::offset_of!(SmoothState, kind) + std::mem::size_of::<Kind>();

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
        SmoothState::create(permits_per_second, Kind::Bursty { max_burst })
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
        Rate::per_second_f64(permits_per_second).validate()?;
        if !cold_factor.is_finite() || cold_factor < 1.0 {
            return Err(ConfigError::InvalidParameter {
                name: "cold_factor",
                reason: "must be a finite number, at least 1",
            });
        }
        let kind = Kind::WarmingUp {
            warmup,
            cold_factor,
            warmup_units: 0.0,
            threshold_permits: 0.0,
            slope: 0.0,
        };
        SmoothState::create(permits_per_second, kind)
    }

    /// Guava's `RateLimiter.create`: a fresh state (Java's zeroed fields),
    /// then `setRate` at time zero.
    fn create(permits_per_second: f64, kind: Kind) -> Result<SmoothState, ConfigError> {
        let mut state = SmoothState {
            rate: 0.0,
            unit: 1_000_000,
            full_cost: 0,
            stable_interval: 0.0,
            stored_permits: 0.0,
            max_permits: 0.0,
            next_free: 0,
            kind,
        };
        state.set_rate(Duration::ZERO, permits_per_second)?;
        Ok(state)
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
        self.reserve_span(now, permits).0
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
        self.try_reserve_span(now, permits, timeout)
            .map(|(wait, _)| wait)
    }

    /// [`try_reserve`](Self::try_reserve) for a meter, which only needs to
    /// know whether it reserved: the same change of state, without the
    /// wait or the span (the meter's caller goes at once either way), and
    /// `now` and `timeout` in nanoseconds, in 64-bit arithmetic below 2⁶⁴
    /// ps (213 days; the general path beyond).
    ///
    /// A bursty limiter's grant paid entirely from stored permits (the
    /// common case of an allowed call) is decided by a branch: its stored
    /// permits are free, so the ticket stays where the resync left it, and
    /// nothing but the stored permits waits on the floating-point
    /// arithmetic. Computed as `reserve_earliest_available` would (spend
    /// `min(n, stored) = n`, no fresh permits, a zero cost), so bit for
    /// bit the same state, which `try_take_tests` checks. Likewise a
    /// one-permit grant on a limiter the idle time has filled (see
    /// [`fills`](Self::fills)) takes its cost from `full_cost`, which
    /// `set_rate` computes with the same [`cost`](Self::cost).
    #[inline]
    pub(crate) fn try_take(&mut self, now: u64, permits: u32, timeout: u64) -> bool {
        let (Some(now_ps), Some(timeout_ps), Ok(next_free)) = (
            now.checked_mul(1000),
            timeout.checked_mul(1000),
            u64::try_from(self.next_free),
        ) else {
            return self.try_take_wide(now, permits, timeout);
        };
        if permits == 0 {
            return true;
        }
        // `picos / unit`, as `in_units` divides: a microsecond is 1 000 ns.
        let micros = self.unit() == MICROS;
        let (now, timeout, ticket) = if micros {
            (now / 1000, timeout / 1000, next_free / 1_000_000)
        } else {
            (now_ps, timeout_ps, next_free)
        };
        if ticket > now.saturating_add(timeout) {
            return false;
        }
        // `resync`, in 64 bits: `now × unit` is at most `now_ps`.
        if now > ticket {
            self.next_free = u128::from(if micros { now * 1_000_000 } else { now });
            if self.max_permits > 0.0 {
                let idle = to_f64(now - ticket);
                let cool_down = self.cool_down_interval();
                if self.fills(idle, cool_down) {
                    if permits == 1 {
                        // `spend(1)` from the maximum, its cost computed
                        // once per rate.
                        self.stored_permits = self.max_permits - 1f64.min(self.max_permits);
                        self.next_free =
                            (self.next_free + u128::from(self.full_cost) * self.unit()).min(LATEST);
                        return true;
                    }
                    self.stored_permits = self.max_permits;
                } else {
                    self.stored_permits =
                        self.max_permits.min(self.stored_permits + idle / cool_down);
                }
            }
        }
        let required = f64::from(permits);
        if matches!(self.kind, Kind::Bursty { .. }) && self.stored_permits >= required {
            self.stored_permits -= required;
            return true;
        }
        self.spend(permits);
        true
    }

    /// Whether `idle` units fill the limiter, seen without `resync`'s
    /// division: then Guava's `min(max, stored + idle / cool_down)` is the
    /// maximum.
    ///
    /// The check is a product, which takes a third of a division's time on
    /// the path of a grant: `idle ≥ (max − stored) × cool_down × (1 +
    /// 2⁻⁵⁰)`, each operation rounded. The margin covers the three
    /// roundings of the check and the division's own (each at most 2⁻⁵³
    /// relative), so when it holds, `stored + idle / cool_down` as Guava
    /// rounds it is at least the maximum, and its `min` is the maximum, bit
    /// for bit. Stored permits above the maximum make the difference
    /// negative, where both give the maximum; a NaN fails the check. When
    /// it fails, the caller divides, as Guava does.
    ///
    /// It matters beyond the division: a full limiter's stored permits are
    /// the maximum whatever they were before, so the next grant's
    /// arithmetic does not wait on this one's.
    #[inline]
    fn fills(&self, idle: f64, cool_down: f64) -> bool {
        // 1 + 2⁻⁵⁰, exactly.
        const MARGIN: f64 = 1.0 + 4.0 * f64::EPSILON;
        idle >= (self.max_permits - self.stored_permits) * (cool_down * MARGIN)
    }

    /// [`try_take`](Self::try_take) past 2⁶⁴ ps, through `try_reserve`.
    #[cold]
    #[inline(never)]
    fn try_take_wide(&mut self, now: u64, permits: u32, timeout: u64) -> bool {
        self.try_reserve(
            Duration::from_nanos(now),
            permits,
            Duration::from_nanos(timeout),
        )
        .is_some()
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
        Rate::per_second_f64(permits_per_second).validate()?;
        let now = picos(now);
        self.resync(in_units(now, self.unit()));
        // Guava's `SECONDS.toMicros(1L) / permitsPerSecond`; in picoseconds
        // where that is below a microsecond.
        let (unit, stable_interval) = match 1e6 / permits_per_second {
            micros if micros >= 1.0 => (MICROS, micros),
            _ => (1, 1e12 / permits_per_second),
        };
        if unit != self.unit() {
            // A pending debt rounds up to the new unit (none is lost); no
            // debt stays none.
            self.next_free = if self.next_free > now {
                self.next_free.div_ceil(unit) * unit
            } else {
                self.next_free / unit * unit
            };
            self.unit = if unit == MICROS { 1_000_000 } else { 1 };
        }
        self.rate = permits_per_second;
        self.stable_interval = stable_interval;
        self.do_set_rate(permits_per_second);
        self.full_cost = u64::try_from(self.cost(self.max_permits, 1.0).1).unwrap_or(u64::MAX);
        Ok(())
    }

    /// The subclasses' `doSetRate(permitsPerSecond, stableIntervalMicros)`.
    #[expect(clippy::cast_precision_loss, reason = "Java's `long` to `double`")]
    fn do_set_rate(&mut self, permits_per_second: f64) {
        let stable_interval = self.stable_interval;
        let old_max_permits = self.max_permits;
        // Unreachable here (rates are finite and intervals at least one
        // unit), kept as in Guava: an infinite maximum is not rescaled.
        let from_infinite = old_max_permits == f64::INFINITY;
        match &mut self.kind {
            Kind::Bursty { max_burst } => {
                self.max_permits = max_burst.as_secs_f64() * permits_per_second;
                self.stored_permits = if from_infinite {
                    self.max_permits
                } else if old_max_permits == 0.0 {
                    0.0 // initial state
                } else {
                    self.stored_permits * self.max_permits / old_max_permits
                };
            }
            Kind::WarmingUp {
                warmup,
                cold_factor,
                warmup_units,
                threshold_permits,
                slope,
            } => {
                *warmup_units = (picos(*warmup) / u128::from(self.unit)) as f64;
                let cold_interval = stable_interval * *cold_factor;
                *threshold_permits = 0.5 * *warmup_units / stable_interval;
                self.max_permits =
                    *threshold_permits + 2.0 * *warmup_units / (stable_interval + cold_interval);
                // A zero warm-up has no trapezoid (Guava divides by zero).
                *slope = if self.max_permits > *threshold_permits {
                    (cold_interval - stable_interval) / (self.max_permits - *threshold_permits)
                } else {
                    0.0
                };
                self.stored_permits = if from_infinite {
                    0.0
                } else if old_max_permits == 0.0 {
                    self.max_permits // initial state is cold
                } else {
                    self.stored_permits * self.max_permits / old_max_permits
                };
            }
        }
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

    /// The stable interval between permits, Guava's `1e6 / rate` µs (`1e12
    /// / rate` ps above 10⁶/s), rounded down to a nanosecond. A permit
    /// costs it truncated to a whole microsecond (picosecond).
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
    #[expect(
        clippy::cast_precision_loss,
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        reason = "Java's conversions between `long` and `double`, as Guava makes them"
    )]
    pub fn stable_interval(&self) -> Duration {
        nanos_to_duration((self.stable_interval * self.unit as f64) as u128 / PS_PER_NS)
    }

    /// The next free ticket: when the debt of the requests so far is paid.
    /// A request at or after it waits for nothing.
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
        nanos_to_duration(self.next_free.div_ceil(PS_PER_NS))
    }

    /// [`next_free`](Self::next_free) in nanoseconds, `u64::MAX` beyond;
    /// without a 128-bit division for the first 213 days.
    pub(crate) fn next_free_nanos(&self) -> u64 {
        match u64::try_from(self.next_free) {
            Ok(picos) => picos.div_ceil(1000),
            Err(_) => u64::try_from(self.next_free.div_ceil(PS_PER_NS)).unwrap_or(u64::MAX),
        }
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
        let mut state = self.clone();
        let _ = state.resync(state.units(now));
        state.stored_permits
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
        self.max_permits
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
        match self.kind {
            Kind::Bursty { .. } => None,
            Kind::WarmingUp { warmup, .. } => Some(warmup),
        }
    }

    /// The cold factor; `None` for a bursty limiter (see
    /// [`warmup`](Self::warmup)).
    pub fn cold_factor(&self) -> Option<f64> {
        match self.kind {
            Kind::Bursty { .. } => None,
            Kind::WarmingUp { cold_factor, .. } => Some(cold_factor),
        }
    }

    /// Picoseconds per unit: [`MICROS`] or 1.
    fn unit(&self) -> u128 {
        u128::from(self.unit)
    }

    /// `now` in whole units, as Guava's stopwatch reads it.
    fn units(&self, now: Duration) -> u128 {
        in_units(picos(now), self.unit())
    }

    /// [`reserve`](Self::reserve), also returning where the reservation
    /// lies on the time line, for [`give_back`](Self::give_back).
    pub(crate) fn reserve_span(&mut self, now: Duration, permits: u32) -> (Duration, Span) {
        if permits == 0 {
            let at = self.next_free;
            return (
                Duration::ZERO,
                Span {
                    moment: at,
                    end: at,
                },
            );
        }
        let now = self.units(now);
        self.reserve_span_at(permits, now)
    }

    /// [`try_reserve`](Self::try_reserve), also returning the reservation's
    /// span.
    pub(crate) fn try_reserve_span(
        &mut self,
        now: Duration,
        permits: u32,
        timeout: Duration,
    ) -> Option<(Duration, Span)> {
        // `canAcquire`: `nextFreeTicketMicros - timeoutMicros <= nowMicros`.
        let timeout = in_units(timeout.as_nanos().saturating_mul(PS_PER_NS), self.unit());
        let now_units = self.units(now);
        if permits > 0 && in_units(self.next_free, self.unit()) > now_units + timeout {
            return None;
        }
        if permits == 0 {
            return Some(self.reserve_span(now, permits));
        }
        Some(self.reserve_span_at(permits, now_units))
    }

    /// `reserveAndGetWaitLength`: the wait, from `now` in units, and the
    /// reservation's span.
    fn reserve_span_at(&mut self, permits: u32, now: u128) -> (Duration, Span) {
        let moment_available = self.reserve_earliest_available(permits, now);
        let wait = nanos_to_duration(nanos_ceil(
            moment_available.saturating_sub(now) * self.unit(),
        ));
        let span = Span {
            moment: moment_available * self.unit(),
            end: self.next_free,
        };
        (wait, span)
    }

    /// Takes back the part of a reservation's cost that has not elapsed at
    /// `now`: a reservation that was never used (its caller gave up) stops
    /// holding back the requests after it. Returns the time given back, in
    /// picoseconds: the next free ticket moves back by that much, and so
    /// must every reservation made after this one (the caller's queue does
    /// that; see [`Span::shift`]).
    ///
    /// The reservation's cost is the span from its moment to the next free
    /// ticket it left; the part before `now` (or before its moment, if that
    /// is later) is gone either way. The stored permits it spent are *not*
    /// given back: which stored permits the later requests spent, and so
    /// their costs, would change, and re-pricing them is beyond Guava's
    /// model. Keeping them spent only ever slows the limiter down (a bursty
    /// limiter's stored permits are free, a warm-up limiter's cost at least
    /// the stable interval), so no window bound is at risk.
    ///
    /// The next free ticket never moves before `now`, and stays a whole
    /// number of units (rounded up: a debt is never lost to rounding).
    pub(crate) fn give_back(&mut self, now: Duration, span: Span) -> u128 {
        let now = self.units(now) * self.unit();
        let unused = span.end.saturating_sub(now.max(span.moment));
        let floor = now.max(self.next_free.saturating_sub(unused));
        let next_free = floor.div_ceil(self.unit()) * self.unit();
        let given = self.next_free.saturating_sub(next_free);
        self.next_free -= given;
        given
    }

    /// The part of the state a reservation changes (the stored permits and
    /// the next free ticket), to put back with [`undo`](Self::undo).
    pub(crate) fn undo_point(&self) -> Undo {
        Undo {
            stored_permits: self.stored_permits,
            next_free: self.next_free,
        }
    }

    /// Puts back the state of an [`undo_point`](Self::undo_point) taken
    /// before a reservation; valid only if nothing but that reservation (no
    /// rate change) has changed the state since.
    pub(crate) fn undo(&mut self, undo: Undo) {
        self.stored_permits = undo.stored_permits;
        self.next_free = undo.next_free;
    }

    /// `reserveEarliestAvailable`: reserves and returns the moment the
    /// caller may go, in units.
    #[inline]
    fn reserve_earliest_available(&mut self, required_permits: u32, now: u128) -> u128 {
        let return_value = self.resync(now);
        self.spend(required_permits);
        return_value
    }

    /// The rest of `reserveEarliestAvailable`, after the resync: spends
    /// stored permits first, then pushes the next free ticket forward by
    /// the cost.
    #[inline]
    fn spend(&mut self, required_permits: u32) {
        let (stored_permits_to_spend, wait) =
            self.cost(self.stored_permits, f64::from(required_permits));
        self.next_free = (self.next_free + wait * self.unit()).min(LATEST);
        self.stored_permits -= stored_permits_to_spend;
    }

    /// What `reserveEarliestAvailable` computes for `required_permits` with
    /// `stored_permits` stored: the stored permits it spends, and its cost
    /// (the next free ticket's step) in units.
    #[expect(clippy::cast_possible_truncation, reason = "Java's `(long)`")]
    #[inline]
    fn cost(&self, stored_permits: f64, required_permits: f64) -> (f64, u128) {
        let stored_permits_to_spend = required_permits.min(stored_permits);
        let fresh_permits = required_permits - stored_permits_to_spend;
        let wait = self
            .stored_permits_to_wait_time(stored_permits, stored_permits_to_spend)
            .saturating_add((fresh_permits * self.stable_interval) as i64);
        // `LongMath.saturatedAdd`. Costs are never negative.
        (stored_permits_to_spend, u128::try_from(wait).unwrap_or(0))
    }

    /// `storedPermitsToWaitTime`: the cost of taking `permits_to_take`
    /// of the `stored_permits`, in units. Free for the bursty limiter.
    #[expect(clippy::cast_possible_truncation, reason = "Java's `(long)`")]
    fn stored_permits_to_wait_time(&self, stored_permits: f64, mut permits_to_take: f64) -> i64 {
        let Kind::WarmingUp {
            threshold_permits,
            slope,
            ..
        } = self.kind
        else {
            return 0;
        };
        let permits_to_time = |permits: f64| self.stable_interval + permits * slope;
        let available_permits_above_threshold = stored_permits - threshold_permits;
        let mut micros = 0i64;
        // The integral on the right part of the function (the climbing line).
        if available_permits_above_threshold > 0.0 {
            let permits_above_threshold_to_take =
                available_permits_above_threshold.min(permits_to_take);
            let length = permits_to_time(available_permits_above_threshold)
                + permits_to_time(
                    available_permits_above_threshold - permits_above_threshold_to_take,
                );
            micros = (permits_above_threshold_to_take * length / 2.0) as i64;
            permits_to_take -= permits_above_threshold_to_take;
        }
        // The integral on the left part of the function (the horizontal line).
        micros.saturating_add((self.stable_interval * permits_to_take) as i64)
    }

    /// `coolDownIntervalMicros`: the idle time, in units, that stores a
    /// permit.
    fn cool_down_interval(&self) -> f64 {
        match self.kind {
            Kind::Bursty { .. } => self.stable_interval,
            Kind::WarmingUp { warmup_units, .. } => warmup_units / self.max_permits,
        }
    }

    /// `resync`: turns idle time before `now` (in units) into stored
    /// permits.
    #[expect(clippy::cast_precision_loss, reason = "Java's `long` to `double`")]
    /// Returns the next free ticket after it, in units.
    fn resync(&mut self, now: u128) -> u128 {
        let next_free = in_units(self.next_free, self.unit());
        if now > next_free {
            // Without room, nothing is stored: Guava computes the same for
            // the bursty limiter, and `0 / 0` (then NaN permits) for a
            // zero warm-up.
            if self.max_permits > 0.0 {
                // Through 64 bits where it fits: the same rounding (to the
                // nearest double) without a library call.
                let idle = now - next_free;
                let idle = match u64::try_from(idle) {
                    Ok(small) => small as f64,
                    Err(_) => wide_to_f64(idle),
                };
                let new_permits = idle / self.cool_down_interval();
                self.stored_permits = self.max_permits.min(self.stored_permits + new_permits);
            }
            self.next_free = now * self.unit();
            return now;
        }
        next_free
    }
}

/// What a reservation changes in a [`SmoothState`], as it was before: put
/// back with [`SmoothState::undo`] while nothing else has changed since.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Undo {
    stored_permits: f64,
    next_free: u128,
}

/// Where a reservation lies on the time line, in picoseconds: from the
/// moment its caller may go to the next free ticket it left behind (its
/// cost, paid by the request after it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Span {
    pub(crate) moment: u128,
    pub(crate) end: u128,
}

impl Span {
    /// The span after an earlier reservation gave back `picos`.
    pub(crate) fn shift(self, picos: u128) -> Span {
        Span {
            moment: self.moment.saturating_sub(picos),
            end: self.end.saturating_sub(picos),
        }
    }
}

/// A time in picoseconds, capped at [`LATEST`].
fn picos(t: Duration) -> u128 {
    t.as_nanos().saturating_mul(PS_PER_NS).min(LATEST)
}

/// `picos / unit` for a unit of a picosecond or a microsecond (the only
/// two): below 2⁶⁴ ps (213 days) a 64-bit division by a constant, which
/// compiles to a multiplication; a 128-bit division is a library call and
/// a hardware divide, and an allowed `try_acquire` made seven.
#[inline]
fn in_units(picos: u128, unit: u128) -> u128 {
    match (unit, u64::try_from(picos)) {
        (1, _) => picos,
        (MICROS, Ok(small)) => u128::from(small / 1_000_000),
        _ => picos / unit,
    }
}

/// Java's `long` to `double` for a `u64`: through `i64` below 2⁶³ (one
/// instruction; the same rounding).
#[inline]
#[expect(clippy::cast_precision_loss, reason = "Java's `long` to `double`")]
fn to_f64(x: u64) -> f64 {
    match i64::try_from(x) {
        Ok(x) => x as f64,
        Err(_) => x as f64,
    }
}

/// `x as f64` for an `x` past 64 bits, out of line (inline, the compiler
/// computes it on both sides of the branch).
#[cold]
#[inline(never)]
#[expect(clippy::cast_precision_loss, reason = "Java's `long` to `double`")]
fn wide_to_f64(x: u128) -> f64 {
    x as f64
}

/// `picos.div_ceil(PS_PER_NS)`, in 64 bits below 2⁶⁴ (see [`in_units`]).
#[inline]
fn nanos_ceil(picos: u128) -> u128 {
    match u64::try_from(picos) {
        Ok(small) => u128::from(small.div_ceil(1000)),
        Err(_) => picos.div_ceil(PS_PER_NS),
    }
}

#[cfg(test)]
#[expect(
    clippy::float_cmp,
    reason = "the stored permits asserted are exact on purpose"
)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn us(n: u64) -> Duration {
        Duration::from_micros(n)
    }

    fn ns(n: u64) -> Duration {
        Duration::from_nanos(n)
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
    fn stable_interval_is_guavas_double() {
        let interval = |rate| SmoothState::bursty(rate, ms(1)).unwrap().stable_interval();
        assert_eq!(interval(5.0), ms(200));
        assert_eq!(interval(0.1), Duration::from_secs(10));
        assert_eq!(interval(3.0), ns(333_333_333));
        assert_eq!(interval(1e6), us(1));
        // Above 10⁶/s, in nanoseconds.
        assert_eq!(interval(2e6), ns(500));
        assert_eq!(interval(7e6), ns(142));
        assert_eq!(interval(1e9), ns(1));
        let state = SmoothState::bursty(3.0, ms(1)).unwrap();
        assert_eq!(state.stable_interval, 1e6 / 3.0);
        assert_eq!(state.unit(), MICROS);
        let state = SmoothState::bursty(7e6, ms(1)).unwrap();
        assert_eq!(state.stable_interval, 1e12 / 7e6);
        assert_eq!(state.unit(), 1);
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
        // After an idle second, all `rate` stored permits are free and the
        // next request too.
        for rate in [3.0, 7.0, 11.0, 13.0, 17.0, 0.3 * 10.0, 100_000.0, 7e6] {
            let mut s = SmoothState::bursty(rate, Duration::from_secs(1)).unwrap();
            let idle = Duration::from_secs(5);
            #[expect(
                clippy::cast_possible_truncation,
                clippy::cast_sign_loss,
                reason = "whole rates far below u32::MAX"
            )]
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
        // 1e6 / 0.3 = 3 333 333.33… µs, truncated.
        assert_eq!(s.reserve(Duration::from_secs(20), 1), us(3_333_333));
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
    fn cost_terms_are_truncated_to_the_microsecond() {
        // 3/s: a permit costs 333 333 µs; three in one request cost
        // 3 × (1e6 / 3) µs, which the double rounds to 1 000 000.
        let mut s = SmoothState::bursty(3.0, Duration::ZERO).unwrap();
        s.reserve(ms(0), 1);
        assert_eq!(s.next_free(), us(333_333));
        s.reserve(ms(0), 3);
        assert_eq!(s.next_free(), us(333_333 + 1_000_000));
        // Warm-up at 3/s over 1 s, cold factor 3: threshold 1.5 permits,
        // maximum 3. Taking 2 of the 3 cold permits: the 1.5 above the
        // threshold cost 1.5 × (1e6 + 1e6 / 3) / 2 = 1 000 000 µs; the 0.5
        // below 166 666.66… µs, truncated.
        let mut w = SmoothState::warming_up(3.0, Duration::from_secs(1), 3.0).unwrap();
        assert_eq!(w.max_permits(), 3.0);
        w.reserve(ms(0), 2);
        assert_eq!(w.next_free(), us(1_000_000 + 166_666));
        // `now` is read truncated to the microsecond, and the wait is whole
        // microseconds from there.
        let mut s = SmoothState::bursty(1000.0, Duration::ZERO).unwrap();
        s.reserve(ns(1500), 1); // at 1 µs: next free at 1001 µs
        assert_eq!(s.next_free(), us(1001));
        assert_eq!(s.reserve(ns(1999), 1), us(1000));
        assert_eq!(s.try_reserve(ns(2_000_999), 1, Duration::ZERO), None);
        assert_eq!(
            s.try_reserve(ns(2_000_999), 1, ns(999)),
            None,
            "the timeout is truncated too"
        );
        assert_eq!(s.try_reserve(ns(2_001_000), 1, ns(999)), Some(ms(0)));
    }

    #[test]
    fn cold_factor_one_turns_warm_up_off() {
        let mut s = SmoothState::warming_up(5.0, Duration::from_secs(4), 1.0).unwrap();
        let waits = ramp(&mut s, ms(0), 5);
        assert_eq!(waits, [0, 200, 200, 200, 200].map(ms));
    }

    #[test]
    fn zero_warm_up_is_pure_pacing() {
        // Also a warm-up below the unit (Guava's microsecond).
        for warmup in [Duration::ZERO, ns(999)] {
            let mut s = SmoothState::warming_up(10.0, warmup, 3.0).unwrap();
            assert_eq!(s.max_permits(), 0.0);
            assert_eq!(s.reserve(ms(0), 1), ms(0));
            assert_eq!(s.reserve(ms(0), 1), ms(100));
            // No stored permits after idle: the first request is free, the
            // next one pays.
            assert_eq!(s.reserve(ms(10_000), 1), ms(0));
            assert_eq!(s.reserve(ms(10_000), 1), ms(100));
            assert_eq!(s.stored_permits(ms(99_000)), 0.0);
            s.set_rate(ms(99_000), 20.0).unwrap();
            assert_eq!(s.stored_permits(ms(99_000)), 0.0);
            assert_eq!(ramp(&mut s, ms(99_000), 3), [0, 50, 50].map(ms));
            // No NaN anywhere: the state equals itself.
            assert_eq!(s, s.clone());
        }
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
        assert!(w.set_rate(ms(1), 2e9).is_err());
        assert_eq!(w, before);
    }

    #[test]
    fn high_rates_keep_limiting_in_picoseconds() {
        // 2 M/s: Guava's truncation would make every permit free.
        let mut s = SmoothState::bursty(2e6, Duration::ZERO).unwrap();
        s.reserve(ms(0), 1);
        assert_eq!(s.reserve(ms(0), 1), ns(500));
        // 7 M/s: 142 857.14… ps, truncated as Guava truncates microseconds:
        // a permit costs 142 857 ps; a caller back at each turn (rounded up
        // to the nanosecond) is on time, so there is no drift.
        let mut s = SmoothState::bursty(7e6, Duration::ZERO).unwrap();
        let mut now = Duration::ZERO;
        for _ in 0..1000 {
            now += s.reserve(now, 1);
        }
        assert_eq!(now, ns(142_715)); // ⌈999 × 142 857 ps⌉
        s.reserve(now, 7);
        assert_eq!(s.next_free(), ns(143_857)); // ⌈(1000 + 7) × 142 857 ps⌉
        // 600 M/s, where whole nanoseconds would be 67 % fast: 1 666 ps.
        let mut s = SmoothState::bursty(6e8, Duration::ZERO).unwrap();
        s.reserve(ms(0), 1);
        s.reserve(ms(0), 600);
        // 1 666 ps for the first, ⌊600 × 1 666.67⌋ ps for the rest.
        assert_eq!(s.next_free(), ns(1002));
        // Warm-up in picoseconds: 2 M/s over 10 µs, cold factor 3, has the
        // shape of 2000/s over 10 ms in microseconds, finer.
        let mut w = SmoothState::warming_up(2e6, us(10), 3.0).unwrap();
        let mut slow = SmoothState::warming_up(2000.0, ms(10), 3.0).unwrap();
        assert_eq!(w.max_permits(), slow.max_permits());
        let waits: Vec<_> = ramp(&mut w, ms(0), 30)
            .iter()
            .map(Duration::as_nanos)
            .collect();
        let slow: Vec<_> = ramp(&mut slow, ms(0), 30)
            .iter()
            .map(Duration::as_micros)
            .collect();
        for (fine, coarse) in waits.iter().zip(&slow) {
            assert!(fine.abs_diff(*coarse) <= 1, "{waits:?} vs {slow:?}");
        }
        assert_eq!(waits[29], 500);
    }

    #[test]
    fn set_rate_across_a_million_per_second_keeps_the_debt() {
        // From nanoseconds to microseconds: a pending debt of 1.5 µs rounds
        // up to 2 µs.
        let mut s = SmoothState::bursty(2e6, Duration::ZERO).unwrap();
        s.reserve(ns(1000), 3); // next free at 2.5 µs
        assert_eq!(s.next_free(), ns(2500));
        s.set_rate(ns(1000), 1000.0).unwrap();
        assert_eq!(s.next_free(), us(3));
        assert_eq!(s.reserve(ns(1000), 1), us(2));
        assert_eq!(s.reserve(ns(1000), 1), us(1002));
        // No debt stays none: the next free ticket, moved to now (2.5 µs)
        // by the idle time, rounds down.
        let mut s = SmoothState::bursty(2e6, Duration::ZERO).unwrap();
        s.set_rate(ns(2500), 1000.0).unwrap();
        assert_eq!(s.next_free(), us(2));
        assert_eq!(s.reserve(ns(2500), 1), Duration::ZERO); // next free at 1002 µs
        // And back: microseconds are whole nanoseconds.
        s.set_rate(ns(2500), 4e6).unwrap();
        assert_eq!(s.next_free(), us(1002));
        assert_eq!(s.reserve(ns(2500), 1), ns(999_500)); // the debt stands
        assert_eq!(s.reserve(ns(2500), 1), ns(999_750)); // then 250 ns each
        // Stored permits survive the switch, rescaled.
        let mut s = SmoothState::bursty(1e6, Duration::from_secs(1)).unwrap();
        s.set_rate(ms(500), 2e6).unwrap();
        assert_eq!(s.stored_permits(ms(500)), 1e6);
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
        // Guava's `Long.MAX_VALUE` µs is the latest instant.
        let latest = us(i64::MAX.unsigned_abs());
        for _ in 0..1000 {
            s.reserve(Duration::MAX, u32::MAX);
        }
        assert_eq!(s.next_free(), latest);
        assert_eq!(s.reserve(Duration::MAX, 1), Duration::ZERO);
        assert_eq!(
            s.try_reserve(Duration::ZERO, 1, Duration::MAX),
            Some(latest)
        );
        // A cost beyond `Long.MAX_VALUE` µs saturates (Java's `(long)`).
        let mut slow = SmoothState::bursty(1e-10, Duration::ZERO).unwrap();
        assert_eq!(slow.reserve(century, u32::MAX), Duration::ZERO);
        assert_eq!(slow.next_free(), latest);
        let mut b = SmoothState::bursty(1e9, Duration::MAX).unwrap();
        assert_eq!(b.reserve(Duration::MAX, u32::MAX), Duration::ZERO);
        assert_eq!(b.reserve(Duration::MAX, u32::MAX), Duration::ZERO);
        let mut w = SmoothState::warming_up(1e9, Duration::MAX, 20.0).unwrap();
        assert_eq!(w.reserve(century, u32::MAX), Duration::ZERO);
        assert!(w.reserve(century, 1) > Duration::ZERO);
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
        // Huge but finite: no panic, still limiting.
        let mut s = SmoothState::warming_up(1.0, ms(1), 1e300).unwrap();
        assert_eq!(ramp(&mut s, ms(0), 3)[2], Duration::from_secs(1));
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

    #[test]
    fn give_back_returns_the_unelapsed_cost() {
        let mut s = SmoothState::bursty(10.0, Duration::ZERO).unwrap();
        s.reserve(ms(0), 1); // free; the next pays 100 ms
        let (wait, a) = s.reserve_span(ms(0), 3);
        assert_eq!(wait, ms(100));
        assert_eq!(
            (a.moment, a.end),
            (100 * MICROS * 1000, 400 * MICROS * 1000)
        );
        let (_, b) = s.reserve_span(ms(0), 1);
        assert_eq!(s.next_free(), ms(500));
        // Before its turn: all 300 ms of it.
        let mut before = s.clone();
        assert_eq!(before.give_back(ms(50), a), 300 * MICROS * 1000);
        assert_eq!(before.next_free(), ms(200));
        // Halfway through its cost: the other half.
        let mut during = s.clone();
        assert_eq!(during.give_back(ms(250), a), 150 * MICROS * 1000);
        assert_eq!(during.next_free(), ms(350));
        // Once its cost has elapsed: nothing.
        let mut after = s.clone();
        assert_eq!(after.give_back(ms(400), a), 0);
        assert_eq!(after.next_free(), ms(500));
        // The last one, shifted by the first's give-back.
        assert_eq!(
            before.give_back(ms(50), b.shift(300 * MICROS * 1000)),
            100 * MICROS * 1000
        );
        assert_eq!(before.next_free(), ms(100));
    }

    #[test]
    fn give_back_never_moves_the_ticket_before_now_nor_off_the_unit() {
        let mut s = SmoothState::bursty(10.0, Duration::ZERO).unwrap();
        s.reserve(ms(0), 1);
        let (_, a) = s.reserve_span(ms(0), 1); // 100 to 200 ms
        // A span larger than the debt left (it cannot happen with the
        // queue's bookkeeping, but the ticket stays put at `now`).
        let wide = Span {
            moment: 0,
            end: a.end * 10,
        };
        let mut t = s.clone();
        assert_eq!(t.give_back(ms(150), wide), 50 * MICROS * 1000);
        assert_eq!(t.next_free(), ms(150));
        // After a switch to a coarser unit, the ticket rounds up.
        let mut fast = SmoothState::bursty(4e6, Duration::ZERO).unwrap(); // 250 ns
        fast.reserve(ms(0), 1);
        let (_, x) = fast.reserve_span(ms(0), 1); // 250 to 500 ns
        fast.set_rate(ms(0), 1e6 / 3.0).unwrap(); // 3 µs per permit, µs unit
        assert_eq!(fast.next_free(), us(1)); // 500 ns of debt rounds up
        // Its 250 ns would leave the ticket at 750 ns: rounded up, 1 µs.
        assert_eq!(fast.give_back(ms(0), x), 0);
        assert_eq!(fast.next_free(), us(1));
    }

    #[test]
    fn the_state_stays_112_bytes() {
        // The full cost's 8 bytes are what a 64-bit unit left: the idle
        // smooth limiter's memory figure stays where it was.
        assert_eq!(std::mem::size_of::<SmoothState>(), 112);
    }

    #[test]
    fn units_and_nanos_agree_with_128_bit_division() {
        let big = u128::from(u64::MAX);
        for picos in [
            0,
            1,
            999,
            1000,
            1001,
            999_999,
            1_000_000,
            1_000_001,
            big - 1,
            big,
            big + 1,
            big * 3 + 7,
            LATEST,
        ] {
            for unit in [1, MICROS] {
                assert_eq!(in_units(picos, unit), picos / unit, "{picos} / {unit}");
            }
            assert_eq!(nanos_ceil(picos), picos.div_ceil(PS_PER_NS), "{picos}");
        }
    }

    #[test]
    fn next_free_nanos_agrees_with_next_free() {
        let mut s = SmoothState::bursty(10.0, Duration::ZERO).unwrap();
        let max = u128::from(u64::MAX);
        for picos in [
            0,
            1,
            999,
            1000,
            1001,
            max - 1,
            max,
            max + 1,
            max * 1000,
            max * 1000 + 1,
            LATEST,
        ] {
            s.next_free = picos;
            let want = u64::try_from(s.next_free().as_nanos()).unwrap_or(u64::MAX);
            assert_eq!(s.next_free_nanos(), want, "{picos} ps");
        }
    }
}

#[cfg(test)]
#[expect(clippy::float_cmp, reason = "the arithmetic is compared bit for bit")]
mod try_take_tests {
    use std::time::Duration;

    use proptest::prelude::*;

    use super::SmoothState;

    proptest! {
        /// The meter's `try_take` answers as `try_reserve` does and leaves
        /// the same state, for both limiters, rates in microsecond and in
        /// picosecond units (and changed between calls), any history, and
        /// times past the 64-bit path (213 days) too.
        #[test]
        fn try_take_is_try_reserve_without_the_wait(
            warm in any::<bool>(),
            rate in prop_oneof![0.01f64..2.0, 0.5f64..50.0, 1e5f64..1e9],
            history in proptest::collection::vec((0u64..3_000_000_000, 0u32..5, prop_oneof![Just(0u64), 0u64..3_000_000_000]), 0..40),
            far in prop_oneof![Just(0u64), Just(250 * 86_400 * 1_000_000_000u64)],
            changes in proptest::collection::vec(
                (0usize..40, prop_oneof![0.01f64..2.0, 0.5f64..50.0, 1e5f64..1e9]),
                0..3,
            ),
        ) {
            let build = || if warm {
                SmoothState::warming_up(rate, Duration::from_secs(2), 3.0).unwrap()
            } else {
                SmoothState::bursty(rate, Duration::from_secs(1)).unwrap()
            };
            let (mut a, mut b) = (build(), build());
            let mut now = far;
            for (i, (step, permits, timeout)) in history.into_iter().enumerate() {
                now += step;
                // Rate changes between the calls (a unit switch, a new
                // cost for a full limiter), the same on both.
                for &(_, rate) in changes.iter().filter(|(at, _)| *at == i) {
                    a.set_rate(Duration::from_nanos(now), rate).unwrap();
                    b.set_rate(Duration::from_nanos(now), rate).unwrap();
                }
                let reserved = a
                    .try_reserve(Duration::from_nanos(now), permits, Duration::from_nanos(timeout))
                    .is_some();
                prop_assert_eq!(b.try_take(now, permits, timeout), reserved);
                prop_assert_eq!(&a, &b);
            }
        }

        /// When `fills` says that idle time fills the limiter, Guava's
        /// division says so too (its `min` is the maximum), for idle times
        /// within a few units of the boundary, stored permits anywhere
        /// from none to the maximum, and the cool-down intervals of both
        /// units.
        #[test]
        fn what_fills_without_the_division_fills_with_it(
            warm in any::<bool>(),
            rate in prop_oneof![0.01f64..2.0, 0.5f64..50.0, 1e5f64..1e9],
            fraction in 0.0f64..=1.0,
            delta in -3i64..=3,
        ) {
            let mut state = if warm {
                SmoothState::warming_up(rate, Duration::from_secs(2), 3.0).unwrap()
            } else {
                SmoothState::bursty(rate, Duration::from_secs(1)).unwrap()
            };
            state.stored_permits = state.max_permits * fraction;
            let cool_down = state.cool_down_interval();
            #[expect(clippy::cast_possible_truncation, reason = "a test's boundary")]
            let boundary = ((state.max_permits - state.stored_permits) * cool_down) as i64;
            let idle = u64::try_from((boundary + delta).max(0)).unwrap();
            let idle = super::to_f64(idle);
            if state.fills(idle, cool_down) {
                prop_assert_eq!(
                    state.max_permits.min(state.stored_permits + idle / cool_down),
                    state.max_permits
                );
            }
        }
    }
}
