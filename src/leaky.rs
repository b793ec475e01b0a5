//! `LeakyBucket`: a bucket of `capacity` units that drains at a fixed rate,
//! as a meter (`try_acquire`) and as a shaper (`acquire`).
//!
//! # Design note: the queue is shared, not an mpsc channel
//!
//! The obvious design has the actor own a bounded mpsc queue of requests.
//! Here the queue is a `VecDeque` behind a mutex that the actor shares with
//! the handles, bounded by the bucket itself (each queued request holds at
//! least one unit of water, so at most `capacity` wait). The reason is
//! cancellation: a request dropped while it waits must give its water back
//! *at once* and move everyone behind it forward, and a request sitting in
//! a channel cannot be reached from its future's `Drop`. With the shared
//! queue a `try_acquire` right after a drop already sees the room, which a
//! channel (where the actor learns of the drop only when it reaches it)
//! cannot offer.

use std::fmt;
use std::time::Duration;

use crate::algorithm::Release;
use crate::engine::{BucketEngine, Kind};
use crate::limiter::impl_limiter;
use crate::{AcquireError, ConfigError, Peek, Quota, Rate, Reservation, Stats, TryAcquireError};

/// A leaky bucket: holds up to `capacity` units of water and drains at
/// `rate`, as a meter and as a shaper over one shared water level.
///
/// * **Meter** — [`try_acquire_many(n)`](Self::try_acquire_many): if the
///   bucket has room for `n` units, pour them and proceed at once; else
///   `Limited { retry_after }`, exactly when they would fit.
/// * **Shaper** — [`acquire_many(n)`](Self::acquire_many): pour `n` units
///   (or fail at once with `Overflow` when they do not fit: overflow is
///   discarded, never parked) and resolve when the water ahead of them has
///   drained. A request into an idle bucket proceeds at once, the next one
///   `1/rate` later, and so on: output is smoothed to the rate, with no
///   burst after idle.
///
/// A cheap handle (one `Arc`). A background actor releases the shaped
/// requests on time; it is a task only while someone waits (started by the
/// first waiter, on its runtime, ended when the queue is empty), so an idle
/// bucket is a few words of state.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use tokio::time::Instant;
/// use tokio_ratelimit::{AcquireError, LeakyBucket, Rate};
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let bucket = LeakyBucket::builder().rate(Rate::per_second(10)).capacity(3).build()?;
/// let start = Instant::now();
/// bucket.acquire().await?; // into an idle bucket: at once
/// bucket.acquire().await?; // then one per 100 ms
/// assert_eq!(start.elapsed(), Duration::from_millis(100));
/// bucket.try_acquire_many(2)?; // the meter fills the rest of the bucket
/// assert_eq!(bucket.acquire().await, Err(AcquireError::Overflow));
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct LeakyBucket {
    engine: BucketEngine,
}

/// Configures a [`LeakyBucket`]; made by [`LeakyBucket::builder`].
#[derive(Debug, Clone, Default)]
pub struct LeakyBucketBuilder {
    rate: Option<Rate>,
    capacity: Option<u32>,
    quota: Option<Quota>,
    name: crate::meter::Name,
}

impl LeakyBucketBuilder {
    /// The leak rate (required).
    pub fn rate(&mut self, rate: Rate) -> &mut Self {
        self.rate = Some(rate);
        self
    }

    /// How many units the bucket holds. Defaults to the rate's permits per
    /// period.
    pub fn capacity(&mut self, capacity: u32) -> &mut Self {
        self.capacity = Some(capacity);
        self
    }

    /// Several bands at once (for example 20 per second with bursts of 40
    /// and 10 000 per day), instead of [`rate`](Self::rate) and
    /// [`capacity`](Self::capacity): a request is granted only when every
    /// band grants it. A quota of one band is the same as that rate and
    /// capacity. See [`Quota`].
    ///
    /// A known limit of the shaper with several bands: a waiter's water is
    /// poured into every band at its turn (which keeps the output smooth
    /// in each), so a band faster than the one that sets the turn reads the
    /// wait before it as water. A shaped request then overflows once its
    /// wait exceeds that band's depth (capacity ÷ rate), even with room
    /// left in the queue, and [`level`](LeakyBucket::level) and the meter
    /// count that wait as water (`tests/leaky_meet.rs`). With one band, or
    /// bands of one depth, there is no such gap.
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

    /// Builds the (empty) bucket. It must be built inside a tokio runtime
    /// (its actor is started by its first waiter, on that waiter's
    /// runtime); nothing is spawned now.
    ///
    /// # Errors
    ///
    /// [`ConfigError::MissingRate`], [`ConfigError::InvalidRate`],
    /// [`ConfigError::ZeroCapacity`], and [`ConfigError::NoRuntime`]
    /// outside a tokio runtime.
    pub fn build(&self) -> Result<LeakyBucket, ConfigError> {
        self.name.check()?;
        let quota = Quota::configured(self.rate, self.capacity, self.quota)?;
        let engine = BucketEngine::start(
            Kind::LeakyBucket,
            quota,
            0,
            Release::Water,
            true,
            self.name.slot(false),
        )?;
        Ok(LeakyBucket { engine })
    }
}

impl LeakyBucket {
    /// A builder; [`rate`](LeakyBucketBuilder::rate) is required.
    pub fn builder() -> LeakyBucketBuilder {
        LeakyBucketBuilder::default()
    }

    /// Pours one unit and waits for it to come out. See
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
        self.engine.acquire(1, None).await
    }

    /// The shaper: pours `n` units and resolves when the water ahead of
    /// them has drained. `n = 0` succeeds at once.
    ///
    /// # Errors
    ///
    /// [`AcquireError::Overflow`] at once when the bucket has no room for
    /// `n` units now (nothing is poured);
    /// [`AcquireError::InsufficientCapacity`] when `n` exceeds the capacity;
    /// [`AcquireError::Closed`], before or while waiting.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future before it resolves takes its water back out of
    /// the bucket: the requests behind it move forward and nothing is
    /// consumed.
    pub async fn acquire_many(&self, n: u32) -> Result<(), AcquireError> {
        self.engine.acquire(n, None).await
    }

    /// Waits in the queue until `n` units fit in the bucket, then pours
    /// them: the meter's rule ([`try_acquire_many`](Self::try_acquire_many))
    /// with a place in the FIFO queue, where the shaper
    /// ([`acquire_many`](Self::acquire_many)) fails with `Overflow`. A
    /// request for room waits behind every request made before it, and
    /// every request made after it waits behind it (a shaped one or one for
    /// room is released after it; a meter's finds its room taken): a large
    /// request is not starved by a stream of small ones that keep the
    /// bucket nearly full. (One that fits at once but waits behind a shaped
    /// request has its room already: a meter's `try_acquire`, decided on
    /// the water alone, may be granted while it waits.) What the [`io`](crate::io)
    /// wrappers pay with.
    ///
    /// While it waits its units are already poured (on credit): the water
    /// may stand above the capacity, and shaped requests overflow until it
    /// has drained below.
    ///
    /// # Errors
    ///
    /// [`AcquireError::InsufficientCapacity`] when `n` exceeds the
    /// capacity; [`AcquireError::Closed`], before or while waiting.
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
    /// use tokio_ratelimit::{AcquireError, LeakyBucket, Rate};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// let bucket = LeakyBucket::builder().rate(Rate::per_second(10)).capacity(10).build().unwrap();
    /// bucket.try_acquire_many(5).unwrap(); // half full
    /// // Ten units do not fit: the shaper overflows, a request for room waits
    /// // until the five have drained (500 ms).
    /// assert_eq!(bucket.acquire_many(10).await, Err(AcquireError::Overflow));
    /// let start = Instant::now();
    /// bucket.acquire_room(10).await.unwrap();
    /// assert_eq!(start.elapsed(), Duration::from_millis(500));
    /// # }
    /// ```
    pub async fn acquire_room(&self, n: u32) -> Result<(), AcquireError> {
        self.engine.acquire_room(n).await
    }

    /// The shaper with a bound on the wait: fails at once with `Timeout`
    /// (pouring nothing) when the water ahead would take longer than
    /// `timeout` to drain. `Duration::MAX` never times out.
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

    /// The meter for one unit. See
    /// [`try_acquire_many`](Self::try_acquire_many).
    ///
    /// # Errors
    ///
    /// As [`try_acquire_many`](Self::try_acquire_many).
    #[inline]
    pub fn try_acquire(&self) -> Result<(), TryAcquireError> {
        self.engine.try_acquire(1)
    }

    /// The meter: if the bucket has room for `n` units now, pours them and
    /// returns; the caller proceeds at once.
    ///
    /// # Errors
    ///
    /// [`TryAcquireError::Limited`] with the exact time until `n` units
    /// would fit; [`TryAcquireError::InsufficientCapacity`] when `n` exceeds
    /// the capacity; [`TryAcquireError::Closed`].
    #[inline]
    pub fn try_acquire_many(&self, n: u32) -> Result<(), TryAcquireError> {
        self.engine.try_acquire(n)
    }

    /// Changes the leak rate from now on; the water in the bucket drains at
    /// the new rate.
    ///
    /// # Errors
    ///
    /// [`ConfigError::InvalidRate`]; the bucket is unchanged. A bucket built
    /// from a [`Quota`] of several bands has no single rate to change:
    /// [`ConfigError::InvalidParameter`].
    pub fn set_rate(&self, rate: Rate) -> Result<(), ConfigError> {
        self.engine.set_rate(rate)
    }

    /// The current leak rate.
    pub fn rate(&self) -> Rate {
        self.engine.rate()
    }

    /// Units of water in the bucket now, rounded up (including the water
    /// of requests still waiting to come out).
    pub fn level(&self) -> u32 {
        self.engine.level()
    }

    /// Shaped requests waiting to come out now (whose turn has not come).
    pub fn waiting(&self) -> usize {
        self.engine.waiting()
    }

    /// How many units of water the bucket holds: the largest request, and
    /// at most this many shaped requests wait at once.
    pub fn capacity(&self) -> u32 {
        self.engine.capacity()
    }

    /// The quota the bucket was built with: every band (one for a rate and
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

    /// Closes the bucket: every shaped request still waiting and every
    /// later call fails with `Closed`, and the actor that releases the
    /// queue ends. Closing twice does nothing more.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use tokio::time::Instant;
    /// use tokio_ratelimit::{AcquireError, LeakyBucket, Rate, TryAcquireError};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// let bucket = LeakyBucket::builder().rate(Rate::per_second(1)).capacity(2).build().unwrap();
    /// let start = Instant::now();
    /// bucket.acquire().await.unwrap(); // into an idle bucket: at once
    /// let waiter = tokio::spawn({
    ///     let bucket = bucket.clone();
    ///     async move { bucket.acquire().await }
    /// });
    /// tokio::task::yield_now().await; // the second request waits 1 s to come out
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

    /// Pours `n` units and waits like [`acquire_many`](Self::acquire_many),
    /// and holds them: [`Reservation::commit`](crate::Reservation::commit)
    /// spends them; dropping the reservation takes back out of the bucket
    /// the part of its water not yet drained and moves every later
    /// reservation forward.
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
    /// use tokio_ratelimit::{LeakyBucket, Rate};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// let bucket = LeakyBucket::builder().rate(Rate::per_second(10)).capacity(2).build().unwrap();
    /// let start = Instant::now();
    /// let held = bucket.reserve(1).await.unwrap(); // into an idle bucket: at once
    /// assert_eq!(bucket.level(), 1);
    /// drop(held); // the work did not happen: its water comes back out
    /// assert_eq!(bucket.level(), 0);
    /// bucket.reserve(1).await.unwrap().commit(); // at once again
    /// bucket.acquire().await.unwrap(); // after the committed unit has drained
    /// assert_eq!(start.elapsed(), Duration::from_millis(100));
    /// # }
    /// ```
    pub async fn reserve(&self, n: u32) -> Result<Reservation, AcquireError> {
        self.engine.reserve(n).await
    }

    /// The bucket's counters (units granted, requests refused, overflows
    /// included) and its state now (shaped requests waiting, free room).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use tokio_ratelimit::{AcquireError, LeakyBucket, Rate};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// let bucket = LeakyBucket::builder().rate(Rate::per_second(10)).capacity(2).build().unwrap();
    /// bucket.try_acquire_many(2).unwrap(); // the meter fills the bucket
    /// assert_eq!(bucket.acquire().await, Err(AcquireError::Overflow));
    /// let stats = bucket.stats();
    /// assert_eq!((stats.granted, stats.refused, stats.waiting), (2, 1, 0));
    /// assert_eq!(stats.available, Some(0));
    /// tokio::time::sleep(Duration::from_millis(100)).await;
    /// assert_eq!(bucket.stats().available, Some(1)); // one unit has drained
    /// # }
    /// ```
    pub fn stats(&self) -> Stats {
        self.engine.stats()
    }

    /// Whether this handle is the only one and the bucket is in the state
    /// of a newly built one (empty, nobody waiting): dropping it and
    /// building a new one would change nothing.
    /// [`Keyed`](crate::keyed::Keyed) evicts such keys.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use tokio_ratelimit::{LeakyBucket, Rate};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// let bucket = LeakyBucket::builder().rate(Rate::per_second(10)).capacity(1).build().unwrap();
    /// assert!(bucket.is_fresh());
    /// bucket.try_acquire().unwrap();
    /// assert!(!bucket.is_fresh()); // one unit of water in it
    /// tokio::time::sleep(Duration::from_millis(100)).await;
    /// assert!(bucket.is_fresh()); // drained
    /// let other = bucket.clone();
    /// assert!(!bucket.is_fresh()); // `other` shares it
    /// # drop(other);
    /// # }
    /// ```
    pub fn is_fresh(&self) -> bool {
        self.engine.is_fresh()
    }
}

impl fmt::Debug for LeakyBucket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.engine.fmt(f)
    }
}

impl_limiter!(LeakyBucket, {
    fn peek(&self, n: u32) -> Option<crate::Peek> {
        Some(LeakyBucket::peek(self, n))
    }
    async fn acquire_room(&self, n: u32) -> Result<(), AcquireError> {
        LeakyBucket::acquire_room(self, n).await
    }
});
