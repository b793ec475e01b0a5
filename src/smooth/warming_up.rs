//! `SmoothWarmingUp`: the handle and its builder.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use super::schedule::Smooth;
use crate::algorithm::SmoothState;
use crate::engine::{Engine, Kind};
use crate::limiter::impl_limiter;
use crate::reservation::Reservation;
use crate::stats::Stats;
use crate::{AcquireError, ConfigError, TryAcquireError};

/// Guava's `SmoothWarmingUp`, async: a limiter that starts cold, where
/// permits cost up to `cold_factor` stable intervals, and warms up to
/// `permits_per_second` as it is used; idle time cools it down again.
///
/// The costs follow Guava's trapezoid: cold permits (stored above the
/// threshold) cost from `cold_factor / permits_per_second` down to
/// `1 / permits_per_second`, and spending all of them takes exactly the
/// `warmup` period; going from warm to cold by idling takes the warm-up
/// period too. Requests pay later, as in [`SmoothBursty`](crate::SmoothBursty): the first is
/// free, and each waits for the cost of the one before it. The exact
/// semantics and the deliberate differences from Guava are those of
/// [`SmoothState::warming_up`]; in particular a zero warm-up gives a limiter
/// that paces at the stable rate (Guava's stops limiting), and a cold factor
/// of 1 turns the warm-up off.
///
/// Stored permits are never free here, so in any window of length `T` at
/// most `permits_per_second × T` permits are granted, plus one request (one
/// tick of slack for waiters, and `T` lengthened by up to 3 µs per request
/// for Guava's truncation: 1 µs per cost term). Everything else — cheap
/// handle, no task, FIFO, no capacity, `try_acquire` and `acquire_timeout`
/// as Guava's `tryAcquire`, cancellation, close — is as for
/// [`SmoothBursty`](crate::SmoothBursty).
///
/// # Examples
///
/// At 10/s with a warm-up of one second (cold factor 3): the waits shrink
/// from nearly 300 ms to the stable 100 ms, and stay there.
///
/// ```
/// use std::time::Duration;
/// use tokio::time::Instant;
/// use tokio_ratelimit::SmoothWarmingUp;
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let limiter = SmoothWarmingUp::builder()
///     .permits_per_second(10.0)
///     .warmup(Duration::from_secs(1))
///     .build()?;
/// let mut waits = vec![];
/// for _ in 0..8 {
///     let start = Instant::now();
///     limiter.acquire().await?;
///     waits.push(start.elapsed().as_millis());
/// }
/// assert_eq!(waits, [0, 280, 240, 200, 160, 120, 100, 100]);
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct SmoothWarmingUp {
    core: Arc<Engine<Smooth>>,
}

/// Configures a [`SmoothWarmingUp`]; made by [`SmoothWarmingUp::builder`].
#[derive(Debug, Clone)]
pub struct SmoothWarmingUpBuilder {
    permits_per_second: Option<f64>,
    warmup: Option<Duration>,
    cold_factor: f64,
    name: crate::meter::Name,
}

impl Default for SmoothWarmingUpBuilder {
    fn default() -> SmoothWarmingUpBuilder {
        SmoothWarmingUpBuilder {
            permits_per_second: None,
            warmup: None,
            cold_factor: 3.0,
            name: crate::meter::Name::default(),
        }
    }
}

impl SmoothWarmingUpBuilder {
    /// The stable rate, once warm, in permits per second (required).
    pub fn permits_per_second(&mut self, permits_per_second: f64) -> &mut Self {
        self.permits_per_second = Some(permits_per_second);
        self
    }

    /// The warm-up period (required): spending all the cold permits takes
    /// this long, and so does cooling down again from warm. Zero gives a
    /// limiter with no stored permits that paces at the stable rate.
    pub fn warmup(&mut self, warmup: Duration) -> &mut Self {
        self.warmup = Some(warmup);
        self
    }

    /// How much slower than the stable rate a cold limiter is: the coldest
    /// permit costs `cold_factor / permits_per_second`. At least 1; 1 turns
    /// the warm-up off. Defaults to 3 (Guava's hard-coded value).
    pub fn cold_factor(&mut self, cold_factor: f64) -> &mut Self {
        self.cold_factor = cold_factor;
        self
    }

    /// Names the limiter for its metrics: the `limiter` label of every
    /// series it records (see [`crate::metrics`]). Unnamed, it records
    /// none.
    /// An empty name is refused by `build`
    /// ([`ConfigError::InvalidParameter`]).
    #[cfg(feature = "metrics")]
    #[cfg_attr(docsrs, doc(cfg(feature = "metrics")))]
    pub fn name(&mut self, name: impl Into<String>) -> &mut Self {
        self.name.set(name.into());
        self
    }

    /// Builds the limiter, cold. Needs no runtime.
    ///
    /// # Errors
    ///
    /// [`ConfigError::MissingRate`] without
    /// [`permits_per_second`](Self::permits_per_second);
    /// [`ConfigError::InvalidRate`] for a rate that is NaN, infinite, not
    /// positive, or above 10⁹/s; [`ConfigError::InvalidParameter`] without a
    /// [`warmup`](Self::warmup) (`name: "warmup"`) or for a cold factor below
    /// 1 or not finite (`name: "cold_factor"`).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use tokio_ratelimit::{ConfigError, SmoothWarmingUp};
    ///
    /// let mut builder = SmoothWarmingUp::builder();
    /// builder.permits_per_second(50.0);
    /// assert!(matches!(
    ///     builder.build(),
    ///     Err(ConfigError::InvalidParameter { name: "warmup", .. })
    /// ));
    /// let limiter = builder.warmup(Duration::from_secs(3)).cold_factor(5.0).build().unwrap();
    /// assert_eq!(limiter.rate(), 50.0);
    /// ```
    pub fn build(&self) -> Result<SmoothWarmingUp, ConfigError> {
        self.name.check()?;
        let rate = self.permits_per_second.ok_or(ConfigError::MissingRate)?;
        let warmup = self.warmup.ok_or(ConfigError::InvalidParameter {
            name: "warmup",
            reason: "required: the warm-up period",
        })?;
        let state = SmoothState::warming_up(rate, warmup, self.cold_factor)?;
        Ok(SmoothWarmingUp {
            core: Engine::smooth(Kind::SmoothWarmingUp, state, self.name.slot(false)),
        })
    }
}

impl SmoothWarmingUp {
    /// A builder; [`permits_per_second`](SmoothWarmingUpBuilder::permits_per_second)
    /// and [`warmup`](SmoothWarmingUpBuilder::warmup) are required.
    pub fn builder() -> SmoothWarmingUpBuilder {
        SmoothWarmingUpBuilder::default()
    }
    /// Waits for one permit from the warm-up limiter. See
    /// [`acquire_many`](Self::acquire_many).
    ///
    /// # Errors
    ///
    /// As [`acquire_many`](Self::acquire_many).
    ///
    /// # Cancel safety
    ///
    /// As [`acquire_many`](Self::acquire_many).
    pub async fn acquire(&self) -> Result<(), AcquireError> {
        self.core.acquire(1, None).await
    }

    /// Guava's `acquire(n)` on the warm-up limiter: reserves `n` permits and
    /// waits until the debt of the requests before it is paid; this request's
    /// own cost is paid by the next one. `n = 0` succeeds at once.
    ///
    /// # Errors
    ///
    /// [`AcquireError::Closed`], before or while waiting. Never
    /// `InsufficientCapacity`: any `n` is granted, and paid later.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future before it resolves gives up its turn. If its
    /// reservation is still the latest change to the limiter (nothing was
    /// reserved and `set_rate` was not called after it), the reservation is
    /// withdrawn and the limiter is exactly as if the call had never been
    /// made. Otherwise the calls after it were already priced on top of its
    /// debt: the part of its cost not yet elapsed is given back, and every
    /// waiter after it moves up by as much (the stored permits it spent
    /// stay spent).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use tokio::time::Instant;
    /// use tokio_ratelimit::SmoothWarmingUp;
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let limiter = SmoothWarmingUp::builder().permits_per_second(10.0).warmup(Duration::from_secs(1)).build().unwrap();
    /// let start = Instant::now();
    /// limiter.acquire_many(1).await?; // the first request is free
    /// limiter.acquire_many(3).await?; // waits for the first one's cost
    /// assert_eq!(start.elapsed(), Duration::from_millis(280));
    /// # Ok(())
    /// # }
    /// ```
    pub async fn acquire_many(&self, n: u32) -> Result<(), AcquireError> {
        self.core.acquire(n, None).await
    }

    /// Guava's `tryAcquire(n, timeout)` on the warm-up limiter: reserves `n`
    /// permits if the debt of the requests before it is paid within `timeout`
    /// (inclusive), and waits for it; otherwise fails at once, changing
    /// nothing. `Duration::MAX` waits as long as it takes.
    ///
    /// # Errors
    ///
    /// [`AcquireError::Timeout`] at once when the wait would be longer than
    /// `timeout`; [`AcquireError::Closed`], before or while waiting.
    ///
    /// # Cancel safety
    ///
    /// As [`acquire_many`](Self::acquire_many).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use tokio_ratelimit::{AcquireError, SmoothWarmingUp};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// let ms = Duration::from_millis;
    /// let limiter = SmoothWarmingUp::builder().permits_per_second(10.0).warmup(Duration::from_secs(1)).build().unwrap();
    /// limiter.acquire().await.unwrap();
    /// let debt = ms(280);
    /// assert_eq!(limiter.acquire_timeout(1, debt - ms(1)).await, Err(AcquireError::Timeout));
    /// assert_eq!(limiter.acquire_timeout(1, debt).await, Ok(()));
    /// # }
    /// ```
    pub async fn acquire_timeout(&self, n: u32, timeout: Duration) -> Result<(), AcquireError> {
        self.core.acquire(n, Some(timeout)).await
    }

    /// Takes one permit from the warm-up limiter if there is no debt now. See
    /// [`try_acquire_many`](Self::try_acquire_many).
    ///
    /// # Errors
    ///
    /// As [`try_acquire_many`](Self::try_acquire_many).
    pub fn try_acquire(&self) -> Result<(), TryAcquireError> {
        self.core.try_acquire(1)
    }

    /// Guava's `tryAcquire(n)` (no timeout) on the warm-up limiter: takes `n`
    /// permits if the debt of earlier requests is paid now, whatever `n` is
    /// (the next request pays for them). `n = 0` succeeds at once.
    ///
    /// # Errors
    ///
    /// [`TryAcquireError::Limited`] with the exact time until the debt is
    /// paid (nothing changes); [`TryAcquireError::Closed`]. Never
    /// `InsufficientCapacity`.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use tokio_ratelimit::{SmoothWarmingUp, TryAcquireError};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// let limiter = SmoothWarmingUp::builder().permits_per_second(10.0).warmup(Duration::from_secs(1)).build().unwrap();
    /// assert_eq!(limiter.try_acquire_many(1), Ok(()));
    /// assert_eq!(
    ///     limiter.try_acquire_many(1),
    ///     Err(TryAcquireError::Limited { retry_after: Duration::from_millis(280) })
    /// );
    /// # }
    /// ```
    pub fn try_acquire_many(&self, n: u32) -> Result<(), TryAcquireError> {
        self.core.try_acquire(n)
    }

    /// Guava's `setRate` on the warm-up limiter: changes the stable rate from
    /// now on.
    ///
    /// Idle time up to now is credited at the old rate; the debt already
    /// incurred (and so the wait of every current waiter) is unchanged;
    /// stored permits are rescaled in proportion, so a full limiter stays
    /// full and a cold one stays as cold.
    ///
    /// # Errors
    ///
    /// [`ConfigError::InvalidRate`] for a rate that is NaN, infinite, not
    /// positive or above 10⁹/s; the limiter is then unchanged.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use tokio_ratelimit::SmoothWarmingUp;
    ///
    /// let limiter = SmoothWarmingUp::builder().permits_per_second(10.0).warmup(Duration::from_secs(1)).build().unwrap();
    /// limiter.set_rate(1000.0).unwrap();
    /// assert_eq!(limiter.rate(), 1000.0);
    /// assert!(limiter.set_rate(f64::NAN).is_err());
    /// ```
    pub fn set_rate(&self, permits_per_second: f64) -> Result<(), ConfigError> {
        self.core.set_rate(permits_per_second)
    }

    /// Closes the warm-up limiter: sleeping waiters and later calls fail with
    /// `Closed`.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use tokio_ratelimit::{SmoothWarmingUp, TryAcquireError};
    ///
    /// let limiter = SmoothWarmingUp::builder().permits_per_second(10.0).warmup(Duration::from_secs(1)).build().unwrap();
    /// limiter.close();
    /// assert!(limiter.is_closed());
    /// assert_eq!(limiter.try_acquire(), Err(TryAcquireError::Closed));
    /// ```
    pub fn close(&self) {
        self.core.close();
    }

    /// Whether [`close`](Self::close) has been called on the warm-up limiter
    /// (see its example).
    pub fn is_closed(&self) -> bool {
        self.core.is_closed()
    }

    /// The stable rate of the warm-up limiter, in permits per second (see
    /// [`set_rate`](Self::set_rate)).
    pub fn rate(&self) -> f64 {
        self.core.rate()
    }

    /// The cold permits stored now: a newly built limiter holds all of
    /// them, using it spends them (each costing more than the stable
    /// interval), idling stores them again (see
    /// [`SmoothState::stored_permits`]).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use tokio_ratelimit::SmoothWarmingUp;
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// let limiter = SmoothWarmingUp::builder().permits_per_second(10.0).warmup(Duration::from_secs(1)).build().unwrap();
    /// let before = limiter.stored_permits();
    /// limiter.acquire().await.unwrap();
    /// tokio::time::sleep(Duration::from_secs(100)).await;
    /// assert!(limiter.stored_permits() >= before);
    /// # }
    /// ```
    pub fn stored_permits(&self) -> f64 {
        self.core.stored_permits()
    }

    /// Waits for `n` permits from the warm-up limiter like
    /// [`acquire_many`](Self::acquire_many) and holds them:
    /// [`Reservation::commit`] spends them; dropping the reservation
    /// withdraws it entirely if nothing was reserved after it, and otherwise
    /// gives back the part of its cost not yet elapsed, moving the waiters
    /// after it up by as much.
    ///
    /// # Errors
    ///
    /// As [`acquire_many`](Self::acquire_many).
    ///
    /// # Cancel safety
    ///
    /// As [`acquire_many`](Self::acquire_many).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use tokio::time::Instant;
    /// use tokio_ratelimit::SmoothWarmingUp;
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// let limiter = SmoothWarmingUp::builder().permits_per_second(10.0).warmup(Duration::from_secs(1)).build().unwrap();
    /// let start = Instant::now();
    /// let held = limiter.reserve(1).await.unwrap(); // the first request is free
    /// drop(held); // nothing reserved after it: withdrawn, as if never made
    /// limiter.reserve(1).await.unwrap().commit(); // so this one is the free first
    /// assert_eq!(start.elapsed(), Duration::ZERO);
    /// limiter.acquire().await.unwrap(); // pays for the committed one
    /// assert_eq!(start.elapsed(), Duration::from_millis(280));
    /// # }
    /// ```
    pub async fn reserve(&self, n: u32) -> Result<Reservation, AcquireError> {
        self.core.reserve(n).await
    }

    /// The counters of the warm-up limiter (permits granted, requests refused)
    /// and the callers waiting now; no `available` figure: a smooth limiter
    /// lets any request through and makes the next one pay.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use tokio_ratelimit::SmoothWarmingUp;
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// let limiter = SmoothWarmingUp::builder().permits_per_second(10.0).warmup(Duration::from_secs(1)).build().unwrap();
    /// limiter.acquire_many(2).await.unwrap(); // free; the next request pays for it
    /// assert!(limiter.try_acquire().is_err());
    /// let stats = limiter.stats();
    /// assert_eq!((stats.granted, stats.refused, stats.waiting), (2, 1, 0));
    /// assert_eq!(stats.available, None);
    /// # }
    /// ```
    pub fn stats(&self) -> Stats {
        self.core.stats()
    }

    /// Whether this handle is the only one and the limiter is in the
    /// state of a newly built one, so that dropping it and building a new
    /// one would change nothing; [`Keyed`](crate::keyed::Keyed) evicts such
    /// keys. A warm-up limiter is fresh once it has cooled down completely
    /// and owes nothing.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use tokio_ratelimit::SmoothWarmingUp;
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// let limiter = SmoothWarmingUp::builder()
    ///     .permits_per_second(10.0)
    ///     .warmup(Duration::from_secs(1))
    ///     .build()
    ///     .unwrap();
    /// assert!(limiter.is_fresh()); // built cold
    /// limiter.acquire().await.unwrap();
    /// assert!(!limiter.is_fresh()); // owes the first request's cost
    /// tokio::time::sleep(Duration::from_millis(280)).await;
    /// assert!(!limiter.is_fresh()); // owes nothing, but one cold permit is spent
    /// tokio::time::sleep(Duration::from_millis(100)).await; // warm-up / max permits
    /// assert!(limiter.is_fresh()); // cold again
    /// let other = limiter.clone();
    /// assert!(!limiter.is_fresh()); // `other` shares it
    /// # drop(other);
    /// # }
    /// ```
    pub fn is_fresh(&self) -> bool {
        Arc::strong_count(&self.core) == 1 && self.core.is_fresh()
    }
}

impl fmt::Debug for SmoothWarmingUp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.core.fmt(f)
    }
}

impl_limiter!(SmoothWarmingUp);
