//! `TokenBucket`: tokens refill at a rate up to a capacity; callers take
//! them, waiting in line when there are too few.

use std::fmt;
use std::time::Duration;

use crate::algorithm::Release;
use crate::engine::{BucketEngine, Kind};
use crate::limiter::impl_limiter;
use crate::{AcquireError, ConfigError, Peek, Quota, Rate, Reservation, Stats, TryAcquireError};

/// A token bucket: `capacity` tokens, refilled continuously at `rate`.
///
/// A cheap handle (one `Arc`; clones share the bucket). `try_acquire` takes
/// tokens lock-free in one compare-and-swap; `acquire` waits in a FIFO
/// queue, and a background actor wakes each waiter when the refill covers
/// it — one timer for the whole queue. The actor is a task only while
/// someone waits: the first waiter starts it, on its own runtime, and it
/// ends when the queue is empty. An idle bucket is 176 bytes behind its
/// `Arc` (no task, no timer, no queue), so a bucket per resource is cheap.
///
/// How many tokens are due is computed from the time elapsed, exactly (see
/// [`crate::algorithm`]), never counted in timer ticks: 100 000/s with a
/// capacity of 10 delivers 100 000/s even though tokio's timer only ticks
/// every millisecond.
///
/// [`close`](Self::close) fails every waiter and every later call with
/// `Closed`.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use tokio::time::Instant;
/// use tokio_ratelimit::{Rate, TokenBucket, TryAcquireError};
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let bucket = TokenBucket::builder().rate(Rate::per_second(10)).capacity(2).build()?;
/// let start = Instant::now();
/// bucket.acquire_many(2).await?; // the bucket starts full
/// bucket.acquire().await?; // the next token comes 100 ms later
/// assert_eq!(start.elapsed(), Duration::from_millis(100));
/// assert_eq!(
///     bucket.try_acquire(),
///     Err(TryAcquireError::Limited { retry_after: Duration::from_millis(100) })
/// );
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct TokenBucket {
    engine: BucketEngine,
}

/// Configures a [`TokenBucket`]; made by [`TokenBucket::builder`].
#[derive(Debug, Clone, Default)]
pub struct TokenBucketBuilder {
    rate: Option<Rate>,
    capacity: Option<u32>,
    quota: Option<Quota>,
    initial: Option<u32>,
    name: crate::meter::Name,
}

impl TokenBucketBuilder {
    /// The refill rate (required).
    pub fn rate(&mut self, rate: Rate) -> &mut Self {
        self.rate = Some(rate);
        self
    }

    /// The most tokens the bucket holds: the largest burst and the largest
    /// single request. Defaults to the rate's permits per period (100 for
    /// `Rate::per_second(100)`).
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

    /// Tokens in the bucket when it is built. Defaults to the capacity (the
    /// bucket starts full); 0 makes the first token arrive one interval
    /// after building.
    pub fn initial(&mut self, tokens: u32) -> &mut Self {
        self.initial = Some(tokens);
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

    /// Builds the bucket. It must be built inside a tokio runtime (its
    /// actor will be started by its first waiter, on that waiter's
    /// runtime); nothing is spawned now.
    ///
    /// # Errors
    ///
    /// [`ConfigError::MissingRate`], [`ConfigError::InvalidRate`],
    /// [`ConfigError::ZeroCapacity`],
    /// [`ConfigError::InitialExceedsCapacity`], and
    /// [`ConfigError::NoRuntime`] outside a tokio runtime.
    pub fn build(&self) -> Result<TokenBucket, ConfigError> {
        self.name.check()?;
        let quota = Quota::configured(self.rate, self.capacity, self.quota)?;
        let capacity = quota.capacity();
        let initial = self.initial.unwrap_or(capacity);
        if initial > capacity {
            return Err(ConfigError::InitialExceedsCapacity { initial, capacity });
        }
        let engine = BucketEngine::start(
            Kind::TokenBucket,
            quota,
            capacity - initial,
            Release::Tokens,
            true,
            self.name.slot(false),
        )?;
        Ok(TokenBucket { engine })
    }
}

impl TokenBucket {
    /// A builder; [`rate`](TokenBucketBuilder::rate) is required.
    pub fn builder() -> TokenBucketBuilder {
        TokenBucketBuilder::default()
    }

    /// Waits for one token. See [`acquire_many`](Self::acquire_many).
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

    /// Waits until `n` tokens are the caller's, in arrival order: a large
    /// request at the head of the line is served before smaller ones behind
    /// it. Takes them at once when the bucket has them and nobody waits.
    /// `n = 0` succeeds at once.
    ///
    /// # Errors
    ///
    /// [`AcquireError::InsufficientCapacity`] at once when `n` exceeds the
    /// capacity (it could never be granted); [`AcquireError::Closed`] when
    /// the bucket is closed, before or while waiting.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future before it resolves loses its place in line and
    /// spends nothing: the tokens it had reserved go back to the bucket and
    /// every waiter behind it moves up.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use tokio::time::Instant;
    /// use tokio_ratelimit::{Rate, TokenBucket};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// let bucket = TokenBucket::builder().rate(Rate::per_second(100)).capacity(50).initial(0).build().unwrap();
    /// let start = Instant::now();
    /// bucket.acquire_many(50).await.unwrap();
    /// assert_eq!(start.elapsed(), Duration::from_millis(500));
    /// # }
    /// ```
    pub async fn acquire_many(&self, n: u32) -> Result<(), AcquireError> {
        self.engine.acquire(n, None).await
    }

    /// Waits for `n` tokens, but no longer than `timeout`. Fails at once
    /// when the tokens (after every waiter ahead) cannot arrive within the
    /// timeout; otherwise waits for them. `Duration::MAX` never times out.
    ///
    /// # Errors
    ///
    /// As [`acquire_many`](Self::acquire_many), and
    /// [`AcquireError::Timeout`].
    ///
    /// # Cancel safety
    ///
    /// As [`acquire_many`](Self::acquire_many).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use tokio_ratelimit::{AcquireError, Rate, TokenBucket};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// let bucket = TokenBucket::builder().rate(Rate::per_second(10)).capacity(1).initial(0).build().unwrap();
    /// let ms = Duration::from_millis;
    /// assert_eq!(bucket.acquire_timeout(1, ms(99)).await, Err(AcquireError::Timeout));
    /// assert_eq!(bucket.acquire_timeout(1, ms(100)).await, Ok(()));
    /// # }
    /// ```
    pub async fn acquire_timeout(&self, n: u32, timeout: Duration) -> Result<(), AcquireError> {
        self.engine.acquire(n, Some(timeout)).await
    }

    /// Takes one token if one is available now.
    ///
    /// # Errors
    ///
    /// As [`try_acquire_many`](Self::try_acquire_many).
    #[inline]
    pub fn try_acquire(&self) -> Result<(), TryAcquireError> {
        self.engine.try_acquire(1)
    }

    /// Takes `n` tokens if they are available now, lock-free. Tokens
    /// reserved by waiters are not available: `try_acquire` never jumps the
    /// line.
    ///
    /// # Errors
    ///
    /// [`TryAcquireError::Limited`] with the exact time until `n` tokens
    /// would be there; [`TryAcquireError::InsufficientCapacity`] when `n`
    /// exceeds the capacity; [`TryAcquireError::Closed`].
    #[inline]
    pub fn try_acquire_many(&self, n: u32) -> Result<(), TryAcquireError> {
        self.engine.try_acquire(n)
    }

    /// Changes the refill rate from now on. Tokens in the bucket stay; the
    /// shortfall, including what waiters have reserved, refills at the new
    /// rate.
    ///
    /// # Errors
    ///
    /// [`ConfigError::InvalidRate`]; the bucket is unchanged. A bucket built
    /// from a [`Quota`] of several bands has no single rate to change:
    /// [`ConfigError::InvalidParameter`].
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use tokio::time::Instant;
    /// use tokio_ratelimit::{Rate, TokenBucket};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// let bucket = TokenBucket::builder().rate(Rate::per_second(1)).capacity(1).initial(0).build().unwrap();
    /// bucket.set_rate(Rate::per_second(10)).unwrap();
    /// let start = Instant::now();
    /// bucket.acquire().await.unwrap();
    /// assert_eq!(start.elapsed(), Duration::from_millis(100));
    /// # }
    /// ```
    pub fn set_rate(&self, rate: Rate) -> Result<(), ConfigError> {
        self.engine.set_rate(rate)
    }

    /// The current refill rate.
    pub fn rate(&self) -> Rate {
        self.engine.rate()
    }

    /// Whole tokens available now (0 while waiters have reserved them).
    pub fn available(&self) -> u32 {
        self.engine.available()
    }

    /// Callers waiting in `acquire` now (whose turn has not come).
    pub fn waiting(&self) -> usize {
        self.engine.waiting()
    }

    /// The most tokens the bucket holds: its largest burst and its largest
    /// single request.
    pub fn capacity(&self) -> u32 {
        self.engine.capacity()
    }

    /// The quota the bucket was built with: every band (one for a rate and
    /// a capacity).
    pub fn quota(&self) -> Quota {
        self.engine.quota()
    }

    /// What `try_acquire_many(n)` would answer now, and each band's
    /// tokens and time until full of tokens, without taking or counting
    /// anything: what the `RateLimit` response headers need.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use tokio_ratelimit::{Quota, Rate, TokenBucket};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// let quota = Quota::new(Rate::per_second(10), 10).and(Rate::per_hour(100), 100);
    /// let bucket = TokenBucket::builder().quota(quota).build().unwrap();
    /// bucket.try_acquire_many(10).unwrap();
    /// let peek = bucket.peek(1);
    /// assert_eq!(peek.retry_after(), Some(Duration::from_millis(100)));
    /// let [second, hour]: [_; 2] = peek.bands().collect::<Vec<_>>().try_into().unwrap();
    /// assert_eq!((second.available, second.full_in), (0, Duration::from_secs(1)));
    /// assert_eq!((hour.available, hour.full_in), (90, Duration::from_secs(360)));
    /// assert_eq!(bucket.stats().refused, 0); // a look takes nothing
    /// # }
    /// ```
    pub fn peek(&self, n: u32) -> Peek {
        self.engine.peek(n)
    }

    /// Closes the bucket: every waiter and every later call fails with
    /// `Closed`, and the refill actor ends. Closing twice does nothing more.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use tokio::time::Instant;
    /// use tokio_ratelimit::{AcquireError, Rate, TokenBucket, TryAcquireError};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// let bucket = TokenBucket::builder().rate(Rate::per_second(1)).capacity(1).initial(0).build().unwrap();
    /// let start = Instant::now();
    /// let waiter = tokio::spawn({
    ///     let bucket = bucket.clone();
    ///     async move { bucket.acquire().await }
    /// });
    /// tokio::task::yield_now().await; // the waiter queues for a token 1 s away
    /// bucket.close();
    /// assert!(bucket.is_closed());
    /// assert_eq!(waiter.await.unwrap(), Err(AcquireError::Closed));
    /// assert_eq!(start.elapsed(), Duration::ZERO); // failed at once, not after 1 s
    /// assert_eq!(bucket.try_acquire(), Err(TryAcquireError::Closed));
    /// # }
    /// ```
    pub fn close(&self) {
        self.engine.close();
    }

    /// Whether [`close`](Self::close) has been called on this bucket (see
    /// its example).
    pub fn is_closed(&self) -> bool {
        self.engine.is_closed()
    }

    /// Waits for `n` tokens like [`acquire_many`](Self::acquire_many) and
    /// holds them: [`Reservation::commit`](crate::Reservation::commit)
    /// spends them; dropping the reservation puts back the tokens not yet
    /// refilled and moves every later reservation forward.
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
    /// use tokio_ratelimit::{Rate, TokenBucket};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// let bucket = TokenBucket::builder().rate(Rate::per_second(10)).capacity(1).build().unwrap();
    /// let start = Instant::now();
    /// let held = bucket.reserve(1).await.unwrap(); // the bucket starts full
    /// drop(held); // the work did not happen: the token goes back
    /// bucket.reserve(1).await.unwrap().commit(); // so this one is at once too
    /// assert_eq!(start.elapsed(), Duration::ZERO);
    /// bucket.acquire().await.unwrap(); // the committed token is gone
    /// assert_eq!(start.elapsed(), Duration::from_millis(100));
    /// # }
    /// ```
    pub async fn reserve(&self, n: u32) -> Result<Reservation, AcquireError> {
        self.engine.reserve(n).await
    }

    /// The bucket's counters (tokens granted, requests refused) and its
    /// state now (callers waiting, whole tokens available).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use tokio_ratelimit::{Rate, TokenBucket};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// let bucket = TokenBucket::builder().rate(Rate::per_second(10)).capacity(2).build().unwrap();
    /// bucket.acquire_many(2).await.unwrap();
    /// assert!(bucket.try_acquire().is_err());
    /// let stats = bucket.stats();
    /// assert_eq!((stats.granted, stats.refused, stats.waiting), (2, 1, 0));
    /// assert_eq!(stats.available, Some(0));
    /// tokio::time::sleep(Duration::from_millis(100)).await;
    /// assert_eq!(bucket.stats().available, Some(1));
    /// # }
    /// ```
    pub fn stats(&self) -> Stats {
        self.engine.stats()
    }

    /// Whether this handle is the only one and the bucket is in the state
    /// of a newly built one (full, nobody waiting): dropping it and
    /// building a new one, now or later, would change nothing.
    /// [`Keyed`](crate::keyed::Keyed) evicts such keys. A bucket built
    /// below its capacity ([`initial`](TokenBucketBuilder::initial)) is
    /// never fresh: kept, it refills, where one built anew later would
    /// start from `initial` again.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use tokio_ratelimit::{Rate, TokenBucket};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// let bucket = TokenBucket::builder().rate(Rate::per_second(10)).capacity(1).build().unwrap();
    /// assert!(bucket.is_fresh());
    /// bucket.try_acquire().unwrap();
    /// assert!(!bucket.is_fresh()); // one token short
    /// tokio::time::sleep(Duration::from_millis(100)).await;
    /// assert!(bucket.is_fresh()); // full again
    /// let other = bucket.clone();
    /// assert!(!bucket.is_fresh()); // `other` shares it
    /// # drop(other);
    /// # }
    /// ```
    pub fn is_fresh(&self) -> bool {
        self.engine.is_fresh()
    }
}

impl fmt::Debug for TokenBucket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.engine.fmt(f)
    }
}

impl_limiter!(TokenBucket, peek);
