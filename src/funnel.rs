//! `Funnel`: the lazy leaky-bucket meter, with no background task.

use std::fmt;
use std::time::Duration;

use crate::algorithm::Release;
use crate::engine::{BucketEngine, Kind};
use crate::limiter::impl_limiter;
use crate::{AcquireError, ConfigError, Peek, Quota, Rate, Reservation, Stats, TryAcquireError};

/// The funnel: a leaky-bucket meter computed lazily, with no task at all.
///
/// The funnel holds `capacity` units and leaks at `rate`; a request for `n`
/// units passes if it fits. It is the classic funnel without its truncation
/// bug (it added back `gap × rate` units, truncated, at each call):
/// fractional leakage is kept exactly, so calling it every nanosecond leaks
/// exactly as much as calling it once an hour. Its numbers
/// are those of [`LeakyBucket`](crate::LeakyBucket)'s meter and of a
/// [`TokenBucket`](crate::TokenBucket) that starts full.
///
/// Nothing is spawned: a funnel can be built and used outside a runtime
/// (`try_acquire` only reads the clock). `acquire` waits in turn, FIFO
/// like the other limiters, each waiter on its own tokio timer, so it needs
/// a tokio runtime with the time driver when it has to wait.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use tokio_ratelimit::{Funnel, Rate, TryAcquireError};
///
/// // No runtime needed.
/// let funnel = Funnel::builder().rate(Rate::per_second(2)).capacity(2).build().unwrap();
/// assert!(funnel.try_acquire().is_ok());
/// assert!(funnel.try_acquire().is_ok());
/// assert!(matches!(funnel.try_acquire(), Err(TryAcquireError::Limited { .. })));
/// ```
#[derive(Clone)]
pub struct Funnel {
    engine: BucketEngine,
}

/// Configures a [`Funnel`]; made by [`Funnel::builder`].
#[derive(Debug, Clone, Default)]
pub struct FunnelBuilder {
    rate: Option<Rate>,
    capacity: Option<u32>,
    quota: Option<Quota>,
    name: crate::meter::Name,
}

impl FunnelBuilder {
    /// The leak rate (required).
    pub fn rate(&mut self, rate: Rate) -> &mut Self {
        self.rate = Some(rate);
        self
    }

    /// How many units the funnel holds (its burst). Defaults to the rate's
    /// permits per period.
    pub fn capacity(&mut self, capacity: u32) -> &mut Self {
        self.capacity = Some(capacity);
        self
    }

    /// Several bands at once (for example 20 per second with bursts of 40
    /// and 10 000 per day), instead of [`rate`](Self::rate) and
    /// [`capacity`](Self::capacity): a request is granted only when every
    /// band grants it. A quota of one band is the same as that rate and
    /// capacity. See [`Quota`].
    pub fn quota(&mut self, quota: Quota) -> &mut Self {
        self.quota = Some(quota);
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

    /// Builds the (empty) funnel. Needs no runtime.
    ///
    /// # Errors
    ///
    /// [`ConfigError::MissingRate`], [`ConfigError::InvalidRate`],
    /// [`ConfigError::ZeroCapacity`].
    pub fn build(&self) -> Result<Funnel, ConfigError> {
        self.name.check()?;
        let quota = Quota::configured(self.rate, self.capacity, self.quota)?;
        let engine = BucketEngine::start(
            Kind::Funnel,
            quota,
            0,
            Release::Tokens,
            false,
            self.name.slot(false),
        )?;
        Ok(Funnel { engine })
    }
}

impl Funnel {
    /// A builder; [`rate`](FunnelBuilder::rate) is required.
    pub fn builder() -> FunnelBuilder {
        FunnelBuilder::default()
    }

    /// Waits until one unit fits. See [`acquire_many`](Self::acquire_many).
    ///
    /// # Errors
    ///
    /// As [`acquire_many`](Self::acquire_many).
    ///
    /// # Cancel safety
    ///
    /// As [`acquire_many`](Self::acquire_many).
    pub async fn acquire(&self) -> Result<(), AcquireError> {
        self.engine.acquire(1, None).await
    }

    /// Waits until `n` units fit — exactly the `retry_after` that
    /// [`try_acquire_many`](Self::try_acquire_many) would report, after the
    /// callers already waiting — and pours them. `n = 0` succeeds at once.
    ///
    /// # Errors
    ///
    /// [`AcquireError::InsufficientCapacity`] at once when `n` exceeds the
    /// capacity; [`AcquireError::Closed`], before or while waiting.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future before it resolves spends nothing: what it had
    /// reserved is given back and the callers behind it move up.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use tokio::time::Instant;
    /// use tokio_ratelimit::{Funnel, Rate};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// let funnel = Funnel::builder().rate(Rate::per_second(4)).capacity(1).build().unwrap();
    /// let start = Instant::now();
    /// for _ in 0..3 {
    ///     funnel.acquire().await.unwrap();
    /// }
    /// assert_eq!(start.elapsed(), Duration::from_millis(500));
    /// # }
    /// ```
    pub async fn acquire_many(&self, n: u32) -> Result<(), AcquireError> {
        self.engine.acquire(n, None).await
    }

    /// Waits until `n` units fit, but no longer than `timeout`: fails at
    /// once when they cannot fit within it. `Duration::MAX` never times
    /// out.
    ///
    /// # Errors
    ///
    /// As [`acquire_many`](Self::acquire_many), and
    /// [`AcquireError::Timeout`].
    ///
    /// # Cancel safety
    ///
    /// As [`acquire_many`](Self::acquire_many).
    pub async fn acquire_timeout(&self, n: u32, timeout: Duration) -> Result<(), AcquireError> {
        self.engine.acquire(n, Some(timeout)).await
    }

    /// Pours one unit if it fits now.
    ///
    /// # Errors
    ///
    /// As [`try_acquire_many`](Self::try_acquire_many).
    #[inline]
    pub fn try_acquire(&self) -> Result<(), TryAcquireError> {
        self.engine.try_acquire(1)
    }

    /// Pours `n` units if they fit now (lock-free).
    ///
    /// # Errors
    ///
    /// [`TryAcquireError::Limited`] with the exact time until they would
    /// fit; [`TryAcquireError::InsufficientCapacity`] when `n` exceeds the
    /// capacity; [`TryAcquireError::Closed`].
    #[inline]
    pub fn try_acquire_many(&self, n: u32) -> Result<(), TryAcquireError> {
        self.engine.try_acquire(n)
    }

    /// Changes the leak rate from now on: the water in the funnel, and what
    /// waiters in [`acquire`](Self::acquire) have reserved, drains at the
    /// new rate, so a waiter's turn moves (earlier for a faster rate, later
    /// for a slower one) and the order of the waiters stays.
    ///
    /// # Errors
    ///
    /// [`ConfigError::InvalidRate`]; the funnel is unchanged. A funnel built
    /// from a [`Quota`] of several bands has no single rate to change:
    /// [`ConfigError::InvalidParameter`].
    pub fn set_rate(&self, rate: Rate) -> Result<(), ConfigError> {
        self.engine.set_rate(rate)
    }

    /// The current leak rate.
    pub fn rate(&self) -> Rate {
        self.engine.rate()
    }

    /// Units of water in the funnel now, rounded up.
    pub fn level(&self) -> u32 {
        self.engine.level()
    }

    /// Units that could be poured now.
    pub fn free(&self) -> u32 {
        self.engine.available()
    }

    /// How many units the funnel holds: its largest burst and its largest
    /// single request.
    pub fn capacity(&self) -> u32 {
        self.engine.capacity()
    }

    /// The quota the funnel was built with: every band (one for a rate and
    /// a capacity).
    pub fn quota(&self) -> Quota {
        self.engine.quota()
    }

    /// What `try_acquire_many(n)` would answer now, and each band's
    /// units of room and time until drained, without taking or counting
    /// anything: what the `RateLimit` response headers need.
    pub fn peek(&self, n: u32) -> Peek {
        self.engine.peek(n)
    }

    /// Closes the funnel: every waiter and every later call fails with
    /// `Closed` (the funnel has no task to end). Closing twice does nothing
    /// more.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use tokio::time::Instant;
    /// use tokio_ratelimit::{AcquireError, Funnel, Rate, TryAcquireError};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// let funnel = Funnel::builder().rate(Rate::per_second(1)).capacity(1).build().unwrap();
    /// let start = Instant::now();
    /// funnel.try_acquire().unwrap(); // fills it
    /// let waiter = tokio::spawn({
    ///     let funnel = funnel.clone();
    ///     async move { funnel.acquire().await }
    /// });
    /// tokio::task::yield_now().await; // the waiter waits 1 s for room
    /// funnel.close();
    /// assert!(funnel.is_closed());
    /// assert_eq!(waiter.await.unwrap(), Err(AcquireError::Closed));
    /// assert_eq!(start.elapsed(), Duration::ZERO); // failed at once, not after 1 s
    /// assert_eq!(funnel.try_acquire(), Err(TryAcquireError::Closed));
    /// # }
    /// ```
    pub fn close(&self) {
        self.engine.close();
    }

    /// Whether [`close`](Self::close) has been called on this funnel (see
    /// its example).
    pub fn is_closed(&self) -> bool {
        self.engine.is_closed()
    }

    /// Waits until `n` units fit like [`acquire_many`](Self::acquire_many)
    /// and holds them: [`Reservation::commit`](crate::Reservation::commit)
    /// spends them; dropping the reservation takes back out of the funnel
    /// the part not yet leaked and moves every later reservation forward.
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
    /// use tokio_ratelimit::{Funnel, Rate};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// let funnel = Funnel::builder().rate(Rate::per_second(10)).capacity(1).build().unwrap();
    /// let start = Instant::now();
    /// let held = funnel.reserve(1).await.unwrap(); // the funnel starts empty
    /// assert_eq!(funnel.level(), 1);
    /// drop(held); // the work did not happen: the unit comes back out
    /// assert_eq!(funnel.level(), 0);
    /// funnel.reserve(1).await.unwrap().commit(); // at once again
    /// funnel.acquire().await.unwrap(); // once the committed unit has leaked
    /// assert_eq!(start.elapsed(), Duration::from_millis(100));
    /// # }
    /// ```
    pub async fn reserve(&self, n: u32) -> Result<Reservation, AcquireError> {
        self.engine.reserve(n).await
    }

    /// The funnel's counters (units granted, requests refused) and its
    /// state now (callers waiting, units that could be poured).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use tokio_ratelimit::{Funnel, Rate};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// let funnel = Funnel::builder().rate(Rate::per_second(10)).capacity(2).build().unwrap();
    /// funnel.try_acquire_many(2).unwrap();
    /// assert!(funnel.try_acquire().is_err());
    /// let stats = funnel.stats();
    /// assert_eq!((stats.granted, stats.refused, stats.waiting), (2, 1, 0));
    /// assert_eq!(stats.available, Some(0));
    /// tokio::time::sleep(Duration::from_millis(100)).await;
    /// assert_eq!(funnel.stats().available, Some(1)); // one unit has leaked
    /// # }
    /// ```
    pub fn stats(&self) -> Stats {
        self.engine.stats()
    }

    /// Whether this handle is the only one and the funnel is in the state
    /// of a newly built one (empty, nobody waiting): dropping it and
    /// building a new one would change nothing.
    /// [`Keyed`](crate::keyed::Keyed) evicts such keys.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use tokio_ratelimit::{Funnel, Rate};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// let funnel = Funnel::builder().rate(Rate::per_second(10)).capacity(1).build().unwrap();
    /// assert!(funnel.is_fresh());
    /// funnel.try_acquire().unwrap();
    /// assert!(!funnel.is_fresh()); // one unit in it
    /// tokio::time::sleep(Duration::from_millis(100)).await;
    /// assert!(funnel.is_fresh()); // leaked out
    /// let other = funnel.clone();
    /// assert!(!funnel.is_fresh()); // `other` shares it
    /// # drop(other);
    /// # }
    /// ```
    pub fn is_fresh(&self) -> bool {
        self.engine.is_fresh()
    }
}

impl fmt::Debug for Funnel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.engine.fmt(f)
    }
}

impl_limiter!(Funnel, peek);
