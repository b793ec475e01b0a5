//! The pure, clock-free state machines behind every limiter.
//!
//! Nothing here reads a clock, spawns a task or allocates: time comes in as
//! `now`, a [`Duration`] since the limiter's origin (any origin you like, as
//! long as it does not go backwards), and each call returns a decision. The
//! async limiters of this crate call exactly this arithmetic, so a state
//! machine driven by your own clock gives the same numbers as they do.
//!
//! * [`FunnelState`] — the leaky bucket as a meter (and its shaper schedule):
//!   water poured in drains at the rate; a pour that would overflow is
//!   refused with the exact time until it fits.
//! * [`TokenState`] — the token bucket: tokens refill at the rate up to the
//!   capacity; a take that finds too few is refused with the exact time until
//!   enough have refilled.
//! * [`SmoothState`] — Guava's `SmoothRateLimiter`, bursty or warming up:
//!   requests pay later (each waits for the debt of the ones before it), and
//!   idle time becomes stored permits, free (bursty) or cold (warm-up).
//!
//! The first two are the generic cell rate algorithm (GCRA) on one number,
//! kept in exact rational time: no float drift, no truncation, at 3/s as at
//! 7 M/s. They agree with each other: a funnel of capacity `c` admits exactly
//! what a token bucket of capacity `c` that starts full admits.
//! [`SmoothState`] is Guava's own arithmetic, bit for bit: doubles, and
//! whole microseconds (nanoseconds above 10⁶/s, where Guava's truncation
//! makes every permit free).
//!
//! # Examples
//!
//! ```
//! use std::time::Duration;
//! use tokio_ratelimit::{Rate, TryAcquireError, algorithm::TokenState};
//!
//! let ms = Duration::from_millis;
//! let mut bucket = TokenState::new(Rate::per_second(3), 1).unwrap();
//! assert!(bucket.try_take(ms(0), 1).is_ok());
//! // The next token is due at exactly ⅓ s, i.e. the 333 333 334th nanosecond.
//! assert_eq!(
//!     bucket.try_take(ms(0), 1),
//!     Err(TryAcquireError::Limited { retry_after: Duration::from_nanos(333_333_334) })
//! );
//! assert!(bucket.try_take(Duration::from_nanos(333_333_334), 1).is_ok());
//! ```

mod bands;
mod gcra;
mod smooth;

use std::time::Duration;

pub(crate) use bands::{Bands, MAX_BANDS, PerBand, Placed, in_common_units};
pub(crate) use gcra::{MAX_TIME, Params, Place, Release, lcm, nanos_to_duration};
pub use smooth::SmoothState;
pub(crate) use smooth::{Span, Undo};

use crate::{AcquireError, ConfigError, Rate, TryAcquireError};

/// What a limiter's schedule decided about a request that may not wait
/// (`try_acquire`).
///
/// Its tag is a byte of its own (`repr(u8)`): in a `Result<(), Option<
/// Duration>>` the tag is a niche in the wait's nanoseconds, so the
/// caller's branch on it waited for the wait's conversion to a `Duration`,
/// a multiply and a subtraction on every refusal's critical path.
#[repr(u8)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Taken {
    /// Granted.
    Granted,
    /// Refused: the exact wait until it would be granted.
    Limited(Duration),
    /// Closed.
    Closed,
}

impl From<Result<(), Option<Duration>>> for Taken {
    fn from(decided: Result<(), Option<Duration>>) -> Taken {
        match decided {
            Ok(()) => Taken::Granted,
            Err(Some(wait)) => Taken::Limited(wait),
            Err(None) => Taken::Closed,
        }
    }
}

/// What a limiter's schedule decided about a request that may wait (`T`:
/// where the reservation lies on the schedule's time line).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Reserve<T> {
    /// Reserved; the caller may proceed now.
    Ready(T),
    /// Reserved; the caller waits for its turn.
    Queued(T),
    /// Not reserved: the caller would have to wait (and asked not to).
    WouldWait,
    /// Not reserved: the wait would exceed the caller's limit.
    TooLong,
    /// Not reserved: the shaper's bucket has no room.
    Overflow,
    /// Not reserved: closed.
    Closed,
}

impl<T> Reserve<T> {
    pub(crate) fn map<U>(self, f: impl FnOnce(T) -> U) -> Reserve<U> {
        match self {
            Reserve::Ready(t) => Reserve::Ready(f(t)),
            Reserve::Queued(t) => Reserve::Queued(f(t)),
            Reserve::WouldWait => Reserve::WouldWait,
            Reserve::TooLong => Reserve::TooLong,
            Reserve::Overflow => Reserve::Overflow,
            Reserve::Closed => Reserve::Closed,
        }
    }
}

/// The leaky bucket as a meter: the classic funnel (which adds back
/// `gap × rate` leaked units, truncated, at each call), without its
/// truncation bug.
///
/// Water poured in drains continuously at the rate; the bucket holds at most
/// `capacity` units. [`try_pour`](Self::try_pour) is the meter: pour `n`
/// units if they fit, else say exactly when they will.
/// [`pour`](Self::pour) is the shaper's schedule: pour `n` units if they
/// fit, and say when the water ahead of them will have drained (when the
/// request may proceed).
///
/// Fractional progress is kept exactly, so a funnel polled every nanosecond
/// leaks exactly as fast as one polled once an hour.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use tokio_ratelimit::{Rate, algorithm::FunnelState};
///
/// let ms = Duration::from_millis;
/// // Capacity 2, leaking 2 per second.
/// let mut funnel = FunnelState::new(Rate::per_second(2), 2).unwrap();
/// assert!(funnel.try_pour(ms(0), 1).is_ok());
/// assert!(funnel.try_pour(ms(200), 1).is_ok());
/// let err = funnel.try_pour(ms(400), 1).unwrap_err();
/// assert_eq!(err.retry_after(), Some(ms(100)));
/// assert_eq!(funnel.level(ms(400)), 2); // 1.2 units, rounded up
/// assert!(funnel.try_pour(ms(500), 1).is_ok());
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FunnelState {
    params: Params,
    rate: Rate,
    tat: u128,
}

impl FunnelState {
    /// An empty funnel draining at `rate`, holding at most `capacity` units.
    ///
    /// # Errors
    ///
    /// [`ConfigError::InvalidRate`] or [`ConfigError::ZeroCapacity`].
    pub fn new(rate: Rate, capacity: u32) -> Result<FunnelState, ConfigError> {
        Ok(FunnelState {
            params: Params::new(rate, capacity)?,
            rate,
            tat: 0,
        })
    }

    /// The capacity, in units.
    pub fn capacity(&self) -> u32 {
        self.params.capacity()
    }

    /// The leak rate.
    pub fn rate(&self) -> Rate {
        self.rate
    }

    /// The meter: pours `n` units at `now` if the funnel has room for them.
    ///
    /// `n = 0` always succeeds and changes nothing.
    ///
    /// # Errors
    ///
    /// [`TryAcquireError::Limited`] with the exact time until `n` units fit
    /// (rounded up to a nanosecond); [`TryAcquireError::InsufficientCapacity`]
    /// when `n > capacity`.
    pub fn try_pour(&mut self, now: Duration, n: u32) -> Result<(), TryAcquireError> {
        strict(&self.params, &mut self.tat, now, n)
    }

    /// The shaper: pours `n` units at `now` if they fit, and returns the
    /// time (since the origin) at which the request may proceed — when the
    /// water poured before it has drained. A request into an empty funnel
    /// proceeds at `now`, the next one `n / rate` later, and so on.
    ///
    /// # Errors
    ///
    /// [`AcquireError::Overflow`] when the units do not fit now (nothing is
    /// poured); [`AcquireError::InsufficientCapacity`] when `n > capacity`.
    pub fn pour(&mut self, now: Duration, n: u32) -> Result<Duration, AcquireError> {
        reserve(&self.params, &mut self.tat, now, n, Release::Water)
    }

    /// Units of water in the funnel at `now`, rounded up.
    pub fn level(&self, now: Duration) -> u32 {
        self.params.level(self.tat, self.params.scale(now))
    }

    /// Whole units that can be poured at `now` without overflowing.
    pub fn free(&self, now: Duration) -> u32 {
        self.params.available(self.tat, self.params.scale(now))
    }

    /// When the funnel will be empty if nothing more is poured (rounded up
    /// to a nanosecond).
    pub fn empty_at(&self) -> Duration {
        self.params.duration_ceil(self.tat)
    }
}

/// The token bucket: tokens refill continuously at the rate, up to the
/// capacity.
///
/// [`try_take`](Self::try_take) takes `n` tokens if there are that many,
/// else says exactly when there will be. [`reserve`](Self::reserve) takes
/// them on credit and says when they are the caller's: reservations queue
/// up in call order, so a later `try_take` does not jump ahead of them.
///
/// Refill is computed from elapsed time, never counted in ticks, so no rate
/// is lost to a coarse clock.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use tokio_ratelimit::{Rate, algorithm::TokenState};
///
/// let ms = Duration::from_millis;
/// let mut bucket = TokenState::new(Rate::per_second(10), 2).unwrap();
/// assert_eq!(bucket.available(ms(0)), 2);
/// assert_eq!(bucket.reserve(ms(0), 2), Ok(ms(0)));
/// assert_eq!(bucket.reserve(ms(0), 1), Ok(ms(100)));
/// assert_eq!(bucket.reserve(ms(0), 2), Ok(ms(300)));
/// assert_eq!(bucket.available(ms(300)), 0);
/// assert_eq!(bucket.available(ms(500)), 2);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenState {
    params: Params,
    rate: Rate,
    tat: u128,
}

impl TokenState {
    /// A full bucket refilling at `rate`, holding at most `capacity` tokens.
    ///
    /// # Errors
    ///
    /// [`ConfigError::InvalidRate`] or [`ConfigError::ZeroCapacity`].
    pub fn new(rate: Rate, capacity: u32) -> Result<TokenState, ConfigError> {
        TokenState::with_tokens(rate, capacity, capacity)
    }

    /// A bucket that starts with `initial` tokens at time zero.
    ///
    /// # Errors
    ///
    /// As [`new`](Self::new), and [`ConfigError::InitialExceedsCapacity`].
    pub fn with_tokens(rate: Rate, capacity: u32, initial: u32) -> Result<TokenState, ConfigError> {
        let params = Params::new(rate, capacity)?;
        if initial > capacity {
            return Err(ConfigError::InitialExceedsCapacity { initial, capacity });
        }
        Ok(TokenState {
            params,
            rate,
            tat: params.cost(capacity - initial),
        })
    }

    /// The capacity, in tokens.
    pub fn capacity(&self) -> u32 {
        self.params.capacity()
    }

    /// The refill rate.
    pub fn rate(&self) -> Rate {
        self.rate
    }

    /// Takes `n` tokens at `now` if the bucket has that many.
    ///
    /// `n = 0` always succeeds and changes nothing.
    ///
    /// # Errors
    ///
    /// [`TryAcquireError::Limited`] with the exact time until `n` tokens are
    /// there; [`TryAcquireError::InsufficientCapacity`] when `n > capacity`.
    pub fn try_take(&mut self, now: Duration, n: u32) -> Result<(), TryAcquireError> {
        strict(&self.params, &mut self.tat, now, n)
    }

    /// Takes `n` tokens on credit at `now` and returns when they are the
    /// caller's: `now` if the bucket has them, else the instant the refill
    /// covers them and every reservation made before this one.
    ///
    /// # Errors
    ///
    /// [`AcquireError::InsufficientCapacity`] when `n > capacity`.
    pub fn reserve(&mut self, now: Duration, n: u32) -> Result<Duration, AcquireError> {
        reserve(&self.params, &mut self.tat, now, n, Release::Tokens)
    }

    /// Whole tokens available at `now` (0 while reservations exceed them).
    pub fn available(&self, now: Duration) -> u32 {
        self.params.available(self.tat, self.params.scale(now))
    }

    /// When the bucket will be full if nothing more is taken (rounded up to
    /// a nanosecond).
    pub fn full_at(&self) -> Duration {
        self.params.duration_ceil(self.tat)
    }

    /// Changes the refill rate at `now`. Tokens present stay; the shortfall
    /// (including reservations not yet covered) refills at the new rate.
    ///
    /// # Errors
    ///
    /// [`ConfigError::InvalidRate`]; the bucket is unchanged.
    pub fn set_rate(&mut self, now: Duration, rate: Rate) -> Result<(), ConfigError> {
        let new = Params::new(rate, self.params.capacity())?;
        self.tat = self.params.rescale(&new, self.tat, now.as_nanos());
        self.params = new;
        self.rate = rate;
        Ok(())
    }
}

/// The strict (meter) decision shared by both state machines.
fn strict(params: &Params, tat: &mut u128, now: Duration, n: u32) -> Result<(), TryAcquireError> {
    if n > params.capacity() {
        return Err(TryAcquireError::InsufficientCapacity);
    }
    if n == 0 {
        return Ok(());
    }
    match params.try_pour(*tat, params.scale(now), n) {
        Ok(end) => {
            *tat = end;
            Ok(())
        }
        Err(wait) => Err(TryAcquireError::Limited {
            retry_after: params.duration_ceil(wait),
        }),
    }
}

/// A reservation decision shared by both state machines, as a time since
/// the origin.
fn reserve(
    params: &Params,
    tat: &mut u128,
    now: Duration,
    n: u32,
    release: Release,
) -> Result<Duration, AcquireError> {
    if n > params.capacity() {
        return Err(AcquireError::InsufficientCapacity);
    }
    let now_scaled = params.scale(now);
    if n == 0 {
        return Ok(now);
    }
    let r = params
        .reserve(*tat, now_scaled, now_scaled, n, release)
        .map_err(|_| AcquireError::Overflow)?;
    *tat = r.end;
    Ok(params.duration_ceil(r.ready.max(now_scaled)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn funnel_and_token_bucket_agree() {
        let rate = Rate::per_second(7);
        let mut funnel = FunnelState::new(rate, 3).unwrap();
        let mut bucket = TokenState::new(rate, 3).unwrap();
        let mut t = Duration::ZERO;
        for step in 0..2000u64 {
            t += Duration::from_micros((step * 7919) % 150_000);
            let n = u32::try_from(step % 4).unwrap();
            assert_eq!(funnel.try_pour(t, n), bucket.try_take(t, n), "at {t:?}");
            assert_eq!(funnel.free(t), bucket.available(t));
        }
    }

    #[test]
    fn shaper_schedule() {
        let mut funnel = FunnelState::new(Rate::per_second(10), 3).unwrap();
        assert_eq!(funnel.pour(ms(0), 1), Ok(ms(0)));
        assert_eq!(funnel.pour(ms(0), 1), Ok(ms(100)));
        assert_eq!(funnel.pour(ms(0), 1), Ok(ms(200)));
        assert_eq!(funnel.pour(ms(0), 1), Err(AcquireError::Overflow));
        assert_eq!(
            funnel.pour(ms(0), 4),
            Err(AcquireError::InsufficientCapacity)
        );
        assert_eq!(funnel.pour(ms(150), 1), Ok(ms(300)));
        assert_eq!(funnel.empty_at(), ms(400));
        // A request into an idle funnel proceeds at once.
        assert_eq!(funnel.pour(ms(1000), 2), Ok(ms(1000)));
        assert_eq!(funnel.pour(ms(1000), 1), Ok(ms(1200)));
    }

    #[test]
    fn initial_tokens() {
        let mut bucket = TokenState::with_tokens(Rate::per_second(10), 5, 0).unwrap();
        assert_eq!(bucket.available(ms(0)), 0);
        assert_eq!(
            bucket.try_take(ms(0), 1),
            Err(TryAcquireError::Limited {
                retry_after: ms(100)
            })
        );
        assert_eq!(bucket.available(ms(250)), 2);
        assert_eq!(
            TokenState::with_tokens(Rate::per_second(10), 5, 6),
            Err(ConfigError::InitialExceedsCapacity {
                initial: 6,
                capacity: 5
            })
        );
    }

    #[test]
    fn zero_and_oversized_requests() {
        let mut bucket = TokenState::with_tokens(Rate::per_second(1), 5, 0).unwrap();
        assert_eq!(bucket.try_take(ms(0), 0), Ok(()));
        assert_eq!(bucket.reserve(ms(7), 0), Ok(ms(7)));
        assert_eq!(
            bucket.try_take(ms(0), 6),
            Err(TryAcquireError::InsufficientCapacity)
        );
        assert_eq!(
            bucket.reserve(ms(0), u32::MAX),
            Err(AcquireError::InsufficientCapacity)
        );
        let mut huge = TokenState::new(Rate::per_second(1), u32::MAX).unwrap();
        assert_eq!(huge.try_take(ms(0), u32::MAX), Ok(()));
        assert_eq!(huge.available(ms(0)), 0);
    }

    #[test]
    fn set_rate_keeps_tokens_and_rescales_the_shortfall() {
        let mut bucket = TokenState::new(Rate::per_second(10), 4).unwrap();
        bucket.try_take(ms(0), 4).unwrap();
        // 100 ms later: one token back; 3 short.
        bucket.set_rate(ms(100), Rate::per_second(100)).unwrap();
        assert_eq!(bucket.available(ms(100)), 1);
        assert_eq!(bucket.available(ms(130)), 4);
        assert!(bucket.set_rate(ms(130), Rate::per_second(0)).is_err());
        assert_eq!(bucket.rate(), Rate::per_second(100));
    }

    #[test]
    fn a_century_of_uptime() {
        let century = Duration::from_secs(100 * 365 * 24 * 3600);
        let mut bucket = TokenState::new(Rate::per_second(999_983), 10).unwrap();
        for i in 0..10 {
            assert_eq!(bucket.try_take(century, 1), Ok(()), "{i}");
        }
        let err = bucket.try_take(century, 1).unwrap_err();
        // 1/999 983 s = 1000.017… ns, rounded up.
        assert_eq!(err.retry_after(), Some(Duration::from_nanos(1001)));
    }
}
