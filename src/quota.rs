//! `Quota`: several limits a request must all pass, such as 20 per second
//! with bursts of 40 *and* 10 000 per day.

use std::fmt;
use std::time::Duration;

use crate::algorithm::{Bands, Params, PerBand};
use crate::{ConfigError, Rate, TryAcquireError};

/// One limit of a [`Quota`]: up to `capacity` permits at once, refilled at
/// `rate` (a token bucket of its own).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Band {
    rate: Rate,
    capacity: u32,
}

impl Band {
    /// A band of `capacity` permits refilled at `rate`.
    pub const fn new(rate: Rate, capacity: u32) -> Band {
        Band { rate, capacity }
    }

    /// The refill rate.
    pub const fn rate(&self) -> Rate {
        self.rate
    }

    /// The most permits the band holds (its burst).
    pub const fn capacity(&self) -> u32 {
        self.capacity
    }
}

/// Several bands decided as one: a request is granted only when every band
/// grants it, and then every band is debited; a request any band refuses
/// changes no band.
///
/// A quota of one band is exactly a rate and a capacity (and the limiters
/// built from one keep their lock-free fast path). Up to
/// [`MAX_BANDS`](Self::MAX_BANDS) bands; the bands need not be consistent
/// with each other (a burst larger than another band's capacity is simply
/// held to that band), and the long-run rate is that of the tightest band.
///
/// Waiters stay FIFO across bands, and cancelling one gives back what it
/// had not used in every band. A `LeakyBucket` shaper's request overflows
/// when it would wait longer than some band takes to drain. Several bands
/// grant under the limiter's lock (refusals need none). A waiter woken late
/// by the 1 ms timer is credited for its lateness as on one band, so
/// waiters get the rate of the tightest band exactly, as `try_acquire`
/// does, and a band that never binds changes no waiter's turn.
///
/// # Examples
///
/// ```
/// use tokio_ratelimit::{Quota, Rate, TokenBucket, TryAcquireError};
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// // 2 per second with bursts of 4, and 5 per day.
/// let quota = Quota::new(Rate::per_second(2), 4).and(Rate::per_day(5), 5);
/// let bucket = TokenBucket::builder().quota(quota).build().unwrap();
/// assert_eq!(bucket.try_acquire_many(4), Ok(())); // the burst
/// assert!(matches!(bucket.try_acquire(), Err(TryAcquireError::Limited { .. })));
/// tokio::time::sleep(std::time::Duration::from_secs(10)).await;
/// assert_eq!(bucket.try_acquire(), Ok(())); // the day's fifth
/// // The day is spent: the next permit comes 1/5 day after the first.
/// let Err(TryAcquireError::Limited { retry_after }) = bucket.try_acquire() else {
///     panic!("the day's band is empty")
/// };
/// assert_eq!(retry_after.as_secs(), 86_400 / 5 - 10);
/// # }
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Quota {
    bands: [Band; Quota::MAX_BANDS],
    len: u8,
    /// Set by [`and`](Self::and) on a full quota: building fails.
    overfull: bool,
}

impl Quota {
    /// The most bands a quota holds.
    pub const MAX_BANDS: usize = crate::algorithm::MAX_BANDS;

    /// A quota of one band: `capacity` permits refilled at `rate`.
    pub const fn new(rate: Rate, capacity: u32) -> Quota {
        Quota {
            bands: [Band::new(rate, capacity); Quota::MAX_BANDS],
            len: 1,
            overfull: false,
        }
    }

    /// This quota and one more band. A quota already holding
    /// [`MAX_BANDS`](Self::MAX_BANDS) bands makes the limiter's `build()`
    /// fail with [`ConfigError::InvalidParameter`].
    #[must_use]
    pub const fn and(mut self, rate: Rate, capacity: u32) -> Quota {
        if self.len as usize == Quota::MAX_BANDS {
            self.overfull = true;
        } else {
            self.bands[self.len as usize] = Band::new(rate, capacity);
            self.len += 1;
        }
        self
    }

    /// The bands, in the order they were given.
    pub fn bands(&self) -> &[Band] {
        &self.bands[..usize::from(self.len)]
    }

    /// The most permits one request may take: the smallest capacity.
    pub fn capacity(&self) -> u32 {
        self.bands().iter().map(Band::capacity).min().unwrap_or(0)
    }

    /// What a builder was given: a quota, or a rate (required then) and a
    /// capacity (default: the rate's permits per period); checked.
    pub(crate) fn configured(
        rate: Option<Rate>,
        capacity: Option<u32>,
        quota: Option<Quota>,
    ) -> Result<Quota, ConfigError> {
        let quota = match (quota, rate, capacity) {
            (Some(quota), None, None) => quota,
            (Some(_), _, _) => {
                return Err(ConfigError::InvalidParameter {
                    name: "quota",
                    reason: "give either a quota or a rate and a capacity",
                });
            }
            (None, None, _) => return Err(ConfigError::MissingRate),
            (None, Some(rate), capacity) => Quota::new(rate, capacity.unwrap_or(rate.permits())),
        };
        quota.params()?;
        Ok(quota)
    }

    /// Each band's exact parameters, checked.
    pub(crate) fn params(&self) -> Result<Vec<Params>, ConfigError> {
        if self.overfull {
            return Err(ConfigError::InvalidParameter {
                name: "quota",
                reason: "more than Quota::MAX_BANDS bands",
            });
        }
        self.bands()
            .iter()
            .map(|band| Params::new(band.rate, band.capacity))
            .collect()
    }
}

impl fmt::Debug for Quota {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.bands()).finish()
    }
}

impl From<Band> for Quota {
    fn from(band: Band) -> Quota {
        Quota::new(band.rate, band.capacity)
    }
}

/// One band's state at the moment of a [`Peek`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct BandState {
    /// The band.
    pub band: Band,
    /// Whole permits it would grant now (tokens; for a leaky bucket or a
    /// funnel, units of free room).
    pub available: u32,
    /// How long until it is full again (for a leaky bucket or a funnel:
    /// drained) if nothing more is taken; zero when it is.
    pub full_in: Duration,
    /// How long until it grants one more permit than `available` if
    /// nothing more is taken; zero when it is full. (What the `t` of a
    /// `RateLimit` header field says.)
    pub next_in: Duration,
}

impl BandState {
    /// The state of `band`, whose exact parameters are `p`, with `tat` at
    /// `now` (scaled units).
    pub(crate) fn of(band: Band, p: &Params, tat: u128, now: u128) -> BandState {
        let water = tat.saturating_sub(now);
        let available = p.available(tat, now);
        // One more permit once the water is down to τ − (available + 1)·I.
        let next = if available >= p.capacity() {
            0
        } else {
            let room = p.tau().saturating_sub(p.cost(available + 1));
            water.saturating_sub(room)
        };
        BandState {
            band,
            available,
            full_in: p.duration_ceil(water),
            next_in: p.duration_ceil(next),
        }
    }
}

/// What a request would get now, without taking anything: the answer its
/// `try_acquire_many` would give at this instant, and every band's state —
/// what `RateLimit` response headers and dashboards show. Made by the
/// bucket limiters' `peek`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Peek {
    answer: Result<(), TryAcquireError>,
    bands: [Option<BandState>; Quota::MAX_BANDS],
}

impl Peek {
    pub(crate) fn new(answer: Result<(), TryAcquireError>, bands: &[BandState]) -> Peek {
        let mut all = [None; Quota::MAX_BANDS];
        for (slot, band) in all.iter_mut().zip(bands) {
            *slot = Some(*band);
        }
        Peek { answer, bands: all }
    }

    /// `answer`, and the state of each of `quota`'s bands, whose exact
    /// parameters are `bands` and whose `tat`s are `tats`, at `now_ns`.
    pub(crate) fn of_bands(
        answer: Result<(), TryAcquireError>,
        quota: &Quota,
        bands: &Bands,
        tats: &PerBand,
        now_ns: u128,
    ) -> Peek {
        let mut all = [None; Quota::MAX_BANDS];
        for (((slot, band), p), &tat) in all
            .iter_mut()
            .zip(quota.bands())
            .zip(bands.params())
            .zip(tats)
        {
            *slot = Some(BandState::of(*band, p, tat, p.scale_nanos(now_ns)));
        }
        Peek { answer, bands: all }
    }

    /// These bands with another answer: a decision already made, and the
    /// state it left.
    pub(crate) fn with_answer(mut self, answer: Result<(), TryAcquireError>) -> Peek {
        self.answer = answer;
        self
    }

    /// What `try_acquire_many(n)` would answer now.
    ///
    /// # Errors
    ///
    /// The refusal it would get: `Limited` with the exact wait,
    /// `InsufficientCapacity`, or `Closed`.
    pub fn answer(&self) -> Result<(), TryAcquireError> {
        self.answer
    }

    /// Whether it would be granted now.
    pub fn is_granted(&self) -> bool {
        self.answer.is_ok()
    }

    /// When it would be granted, if not now: the exact wait until every
    /// band grants it (`None` when granted now, or when it never can be).
    pub fn retry_after(&self) -> Option<Duration> {
        self.answer.err().and_then(|e| e.retry_after())
    }

    /// Every band's state, in the quota's order.
    pub fn bands(&self) -> impl Iterator<Item = BandState> + '_ {
        self.bands.iter().flatten().copied()
    }
}
