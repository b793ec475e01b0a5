//! `SmoothBursty`: the handle and its builder.

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

/// Guava's `SmoothBursty`, async: steady pacing at `permits_per_second`,
/// and up to `max_burst` worth of permits stored while idle, spent for free.
///
/// A request waits for the debt left by the requests before it, then
/// pushes the debt forward by its own cost: it *pays later*. So the first
/// request is free whatever its size, a large request goes at once and the
/// next one pays for it, and after an idle period of at least `max_burst`,
/// `permits_per_second × max_burst` permits are free, and one more request
/// after them. The exact semantics — Guava's arithmetic, bit for bit, in
/// whole microseconds — and where they deliberately differ from Guava
/// (errors instead of limiters that stop limiting, rates above 10⁶/s that
/// keep limiting) are those of [`SmoothState::bursty`], which this handle
/// calls.
///
/// A cheap handle (one `Arc`; clones share the limiter). Nothing is
/// spawned: a caller reserves its turn under a short lock and sleeps its
/// wait on its own tokio timer, so an idle limiter costs nothing and
/// `build()` works outside a runtime (waiting needs tokio's timer).
///
/// * **FIFO.** Reservations are made in call order, so waiters are served
///   in call order (those due within the same 1 ms timer tick wake on that
///   tick together).
/// * **No capacity.** Any number of permits can be asked for at once (Guava
///   pays any weight later), so `InsufficientCapacity` is never returned.
/// * **Window bound.** In any window of length `T`, at most
///   `permits_per_second × (max_burst + T)` permits are granted, plus one
///   request (the last, which pays later), with `T` lengthened by 1 µs per
///   request in the window for Guava's truncation (a request can cost up to
///   1 µs less than its weight / rate); grants to waiters come on tokio's
///   1 ms ticks, so for them the bound holds with one tick of slack.
/// * **`try_acquire`** is Guava's `tryAcquire()`: it succeeds when there is
///   no debt now, and otherwise answers
///   [`Limited { retry_after }`](TryAcquireError::Limited) with the exact
///   debt. **`acquire_timeout`** is `tryAcquire(n, timeout)`: it fails at
///   once with [`AcquireError::Timeout`] when the debt is longer than the
///   timeout, and otherwise waits it and succeeds.
/// * **Cancellation.** Guava cannot take back a reservation; this limiter
///   does. A dropped `acquire` whose reservation is still the latest change
///   to the limiter (nothing reserved and no `set_rate` after it) is
///   withdrawn entirely, as if it had never arrived. Otherwise the part of
///   its cost that has not yet elapsed is given back, and every waiter
///   after it moves up by as much, keeping its own price (the stored
///   permits it spent stay spent). Callers that time out never slow down
///   the ones that wait.
/// * **Close.** [`close`](Self::close) fails sleeping waiters (promptly) and
///   later calls with `Closed`.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use tokio::time::Instant;
/// use tokio_ratelimit::SmoothBursty;
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let ms = Duration::from_millis;
/// let limiter = SmoothBursty::builder().permits_per_second(5.0).build()?;
/// let start = Instant::now();
/// limiter.acquire().await?; // free
/// limiter.acquire().await?; // 200 ms later
/// assert_eq!(start.elapsed(), ms(200));
///
/// // After a long idle, a one-second burst is stored: 5 free permits, plus
/// // one more request that pays later.
/// tokio::time::sleep(Duration::from_secs(10)).await;
/// let start = Instant::now();
/// limiter.acquire_many(5).await?;
/// limiter.acquire().await?;
/// assert_eq!(start.elapsed(), ms(0));
/// limiter.acquire().await?;
/// assert_eq!(start.elapsed(), ms(200));
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct SmoothBursty {
    core: Arc<Engine<Smooth>>,
}

/// Configures a [`SmoothBursty`]; made by [`SmoothBursty::builder`].
#[derive(Debug, Clone)]
pub struct SmoothBurstyBuilder {
    permits_per_second: Option<f64>,
    max_burst: Duration,
    name: crate::meter::Name,
}

impl Default for SmoothBurstyBuilder {
    fn default() -> SmoothBurstyBuilder {
        SmoothBurstyBuilder {
            permits_per_second: None,
            max_burst: Duration::from_secs(1),
            name: crate::meter::Name::default(),
        }
    }
}

impl SmoothBurstyBuilder {
    /// The stable rate, in permits per second (required).
    pub fn permits_per_second(&mut self, permits_per_second: f64) -> &mut Self {
        self.permits_per_second = Some(permits_per_second);
        self
    }

    /// How much idle time is stored as free permits: up to
    /// `permits_per_second × max_burst` of them. Defaults to one second
    /// (Guava's hard-coded value); zero stores nothing (pure pacing).
    pub fn max_burst(&mut self, max_burst: Duration) -> &mut Self {
        self.max_burst = max_burst;
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

    /// Builds the limiter, with no stored permits. Needs no runtime.
    ///
    /// # Errors
    ///
    /// [`ConfigError::MissingRate`] without
    /// [`permits_per_second`](Self::permits_per_second);
    /// [`ConfigError::InvalidRate`] for a rate that is NaN, infinite, not
    /// positive, or above 10⁹/s.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use tokio_ratelimit::{ConfigError, SmoothBursty};
    ///
    /// let limiter = SmoothBursty::builder()
    ///     .permits_per_second(100.0)
    ///     .max_burst(Duration::from_millis(50))
    ///     .build()
    ///     .unwrap();
    /// assert_eq!(limiter.rate(), 100.0);
    /// assert_eq!(SmoothBursty::builder().build().unwrap_err(), ConfigError::MissingRate);
    /// ```
    pub fn build(&self) -> Result<SmoothBursty, ConfigError> {
        self.name.check()?;
        let rate = self.permits_per_second.ok_or(ConfigError::MissingRate)?;
        let state = SmoothState::bursty(rate, self.max_burst)?;
        Ok(SmoothBursty {
            core: Engine::smooth(Kind::SmoothBursty, state, self.name.slot(false)),
        })
    }
}

impl SmoothBursty {
    /// A builder; [`permits_per_second`](SmoothBurstyBuilder::permits_per_second)
    /// is required.
    pub fn builder() -> SmoothBurstyBuilder {
        SmoothBurstyBuilder::default()
    }
    /// Waits for one permit from the bursty limiter. See
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

    /// Guava's `acquire(n)` on the bursty limiter: reserves `n` permits and
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
    /// use tokio_ratelimit::SmoothBursty;
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let limiter = SmoothBursty::builder().permits_per_second(10.0).build().unwrap();
    /// let start = Instant::now();
    /// limiter.acquire_many(1).await?; // the first request is free
    /// limiter.acquire_many(3).await?; // waits for the first one's cost
    /// assert_eq!(start.elapsed(), Duration::from_millis(100));
    /// # Ok(())
    /// # }
    /// ```
    pub async fn acquire_many(&self, n: u32) -> Result<(), AcquireError> {
        self.core.acquire(n, None).await
    }

    /// Guava's `tryAcquire(n, timeout)` on the bursty limiter: reserves `n`
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
    /// use tokio_ratelimit::{AcquireError, SmoothBursty};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// let ms = Duration::from_millis;
    /// let limiter = SmoothBursty::builder().permits_per_second(10.0).build().unwrap();
    /// limiter.acquire().await.unwrap();
    /// let debt = ms(100);
    /// assert_eq!(limiter.acquire_timeout(1, debt - ms(1)).await, Err(AcquireError::Timeout));
    /// assert_eq!(limiter.acquire_timeout(1, debt).await, Ok(()));
    /// # }
    /// ```
    pub async fn acquire_timeout(&self, n: u32, timeout: Duration) -> Result<(), AcquireError> {
        self.core.acquire(n, Some(timeout)).await
    }

    /// Takes one permit from the bursty limiter if there is no debt now. See
    /// [`try_acquire_many`](Self::try_acquire_many).
    ///
    /// # Errors
    ///
    /// As [`try_acquire_many`](Self::try_acquire_many).
    pub fn try_acquire(&self) -> Result<(), TryAcquireError> {
        self.core.try_acquire(1)
    }

    /// Guava's `tryAcquire(n)` (no timeout) on the bursty limiter: takes `n`
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
    /// use tokio_ratelimit::{SmoothBursty, TryAcquireError};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// let limiter = SmoothBursty::builder().permits_per_second(10.0).build().unwrap();
    /// assert_eq!(limiter.try_acquire_many(1), Ok(()));
    /// assert_eq!(
    ///     limiter.try_acquire_many(1),
    ///     Err(TryAcquireError::Limited { retry_after: Duration::from_millis(100) })
    /// );
    /// # }
    /// ```
    pub fn try_acquire_many(&self, n: u32) -> Result<(), TryAcquireError> {
        self.core.try_acquire(n)
    }

    /// Guava's `setRate` on the bursty limiter: changes the stable rate from
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
    /// use tokio_ratelimit::SmoothBursty;
    ///
    /// let limiter = SmoothBursty::builder().permits_per_second(10.0).build().unwrap();
    /// limiter.set_rate(1000.0).unwrap();
    /// assert_eq!(limiter.rate(), 1000.0);
    /// assert!(limiter.set_rate(f64::NAN).is_err());
    /// ```
    pub fn set_rate(&self, permits_per_second: f64) -> Result<(), ConfigError> {
        self.core.set_rate(permits_per_second)
    }

    /// Closes the bursty limiter: sleeping waiters and later calls fail with
    /// `Closed`.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use tokio_ratelimit::{SmoothBursty, TryAcquireError};
    ///
    /// let limiter = SmoothBursty::builder().permits_per_second(10.0).build().unwrap();
    /// limiter.close();
    /// assert!(limiter.is_closed());
    /// assert_eq!(limiter.try_acquire(), Err(TryAcquireError::Closed));
    /// ```
    pub fn close(&self) {
        self.core.close();
    }

    /// Whether [`close`](Self::close) has been called on the bursty limiter
    /// (see its example).
    pub fn is_closed(&self) -> bool {
        self.core.is_closed()
    }

    /// The stable rate of the bursty limiter, in permits per second (see
    /// [`set_rate`](Self::set_rate)).
    pub fn rate(&self) -> f64 {
        self.core.rate()
    }

    /// The free permits stored now: idle time banked at the stable rate,
    /// up to `permits_per_second × max_burst`, and spent before anyone
    /// waits (see [`SmoothState::stored_permits`]).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use tokio_ratelimit::SmoothBursty;
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// let limiter = SmoothBursty::builder().permits_per_second(10.0).build().unwrap();
    /// let before = limiter.stored_permits();
    /// limiter.acquire().await.unwrap();
    /// tokio::time::sleep(Duration::from_secs(100)).await;
    /// assert!(limiter.stored_permits() >= before);
    /// # }
    /// ```
    pub fn stored_permits(&self) -> f64 {
        self.core.stored_permits()
    }

    /// Waits for `n` permits from the bursty limiter like
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
    /// use tokio_ratelimit::SmoothBursty;
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// let limiter = SmoothBursty::builder().permits_per_second(10.0).build().unwrap();
    /// let start = Instant::now();
    /// let held = limiter.reserve(1).await.unwrap(); // the first request is free
    /// drop(held); // nothing reserved after it: withdrawn, as if never made
    /// limiter.reserve(1).await.unwrap().commit(); // so this one is the free first
    /// assert_eq!(start.elapsed(), Duration::ZERO);
    /// limiter.acquire().await.unwrap(); // pays for the committed one
    /// assert_eq!(start.elapsed(), Duration::from_millis(100));
    /// # }
    /// ```
    pub async fn reserve(&self, n: u32) -> Result<Reservation, AcquireError> {
        self.core.reserve(n).await
    }

    /// The counters of the bursty limiter (permits granted, requests refused)
    /// and the callers waiting now; no `available` figure: a smooth limiter
    /// lets any request through and makes the next one pay.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use tokio_ratelimit::SmoothBursty;
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// let limiter = SmoothBursty::builder().permits_per_second(10.0).build().unwrap();
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
    /// keys. A bursty limiter starts with no stored permits but stores them
    /// while idle, so it is fresh only with a zero `max_burst` (and nothing
    /// owed).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use tokio_ratelimit::SmoothBursty;
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// let limiter = SmoothBursty::builder()
    ///     .permits_per_second(10.0)
    ///     .max_burst(Duration::ZERO)
    ///     .build()
    ///     .unwrap();
    /// assert!(limiter.is_fresh());
    /// limiter.acquire().await.unwrap();
    /// assert!(!limiter.is_fresh()); // the next request owes 100 ms
    /// tokio::time::sleep(Duration::from_millis(100)).await;
    /// assert!(limiter.is_fresh());
    /// let other = limiter.clone();
    /// assert!(!limiter.is_fresh()); // `other` shares it
    /// # drop(other);
    /// # }
    /// ```
    pub fn is_fresh(&self) -> bool {
        Arc::strong_count(&self.core) == 1 && self.core.is_fresh()
    }
}

impl fmt::Debug for SmoothBursty {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.core.fmt(f)
    }
}

impl_limiter!(SmoothBursty);
