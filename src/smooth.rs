//! Guava's smooth limiters, async: [`SmoothBursty`] and [`SmoothWarmingUp`].
//!
//! Both are cheap handles over one shared [`SmoothState`] behind a mutex;
//! nothing is spawned. A caller reserves under the lock — Guava's
//! `reserve`: it is told how long to wait, and its own cost is paid by the
//! next caller — then sleeps its wait on its own tokio timer. Reservations
//! are made in call order, so callers are served in that order; an idle
//! limiter has no timer armed and costs nothing.
//!
//! # Design notes
//!
//! * **Time.** The limiter's origin is the instant `build()` ran; `now` is
//!   tokio's clock minus the origin, so a paused clock drives it exactly.
//! * **Close.** Sleeping waiters race their timer with a [`Notify`]: the
//!   `Notified` future is created before the reservation checks the closed
//!   flag (set under the lock), so a `close()` after that check always
//!   wakes it.
//! * **Cancellation.** Each state change (reservation, rate change,
//!   give-back) gets a fresh version number; a waiter remembers the state
//!   before its reservation and the version its reservation produced. If it
//!   is dropped while the limiter is still at that version — nothing was
//!   reserved and the rate was not changed after it, or everything after
//!   it was withdrawn in turn — the old state is put back, exactly as if it
//!   had never arrived. Otherwise later reservations were priced on top of
//!   its debt (Guava's pay-later model: each caller's wait is the previous
//!   callers' cost), and re-pricing them is beyond Guava's model; instead
//!   the part of its cost not yet elapsed is given back
//!   ([`SmoothState`]'s `give_back`): the next free ticket moves back by it
//!   and every reservation after it moves up by as much, keeping its own
//!   price. The stored permits it spent stay spent (which only ever slows
//!   the limiter). So a service whose callers time out keeps its rate: the
//!   survivors inherit the turns of those who gave up. The live
//!   reservations (sleeping waiters, held [`Reservation`]s) sit in a queue
//!   in reservation order with their wakers, so that a give-back can re-arm
//!   the timers of those after it.
//! * **Timer ticks.** tokio's timer fires on 1 ms ticks, so a waiter due at
//!   10 µs wakes at 1 ms. If its caller then asks again at once, Guava's
//!   model would count the time it overslept as *idle* time: stored permits
//!   (bursty) or cooling (warm-up), and at rates above 1 000/s a warm-up
//!   limiter driven by one task's `acquire` loop would deliver two permits
//!   per tick. So when a waiter wakes late, requests arriving within one
//!   tick after that do not turn the time since the next free ticket into
//!   idle time: they are taken as arriving on time (at the next free
//!   ticket, if that is at most one tick ago). This never lets a request
//!   through before the next free ticket, it moves a grant's virtual time
//!   back by less than a tick (so window bounds hold with one tick of
//!   slack, like every waiter's grant), and it only applies after a late
//!   wake (never in paused-clock tests whose deadlines fall on ticks).

use std::collections::VecDeque;
use std::fmt;
use std::future::{Future, poll_fn};
use std::pin::Pin;
use std::pin::pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Poll, Waker};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::sync::futures::Notified;

use crate::algorithm::{SmoothState, Span};
use crate::cell::{CREDIT_GRACE, CREDIT_REACH};
use crate::limiter::impl_limiter;
use crate::reservation::{Hold, Reservation};
use crate::stats::{Counters, Stats};
use crate::{AcquireError, ConfigError, TryAcquireError, clock};

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
    core: Arc<Core>,
}

/// Guava's `SmoothWarmingUp`, async: a limiter that starts cold, where
/// permits cost up to `cold_factor` stable intervals, and warms up to
/// `permits_per_second` as it is used; idle time cools it down again.
///
/// The costs follow Guava's trapezoid: cold permits (stored above the
/// threshold) cost from `cold_factor / permits_per_second` down to
/// `1 / permits_per_second`, and spending all of them takes exactly the
/// `warmup` period; going from warm to cold by idling takes the warm-up
/// period too. Requests pay later, as in [`SmoothBursty`]: the first is
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
/// [`SmoothBursty`].
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
    core: Arc<Core>,
}

/// Configures a [`SmoothBursty`]; made by [`SmoothBursty::builder`].
#[derive(Debug, Clone)]
pub struct SmoothBurstyBuilder {
    permits_per_second: Option<f64>,
    max_burst: Duration,
}

impl Default for SmoothBurstyBuilder {
    fn default() -> SmoothBurstyBuilder {
        SmoothBurstyBuilder {
            permits_per_second: None,
            max_burst: Duration::from_secs(1),
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
        let rate = self.permits_per_second.ok_or(ConfigError::MissingRate)?;
        let state = SmoothState::bursty(rate, self.max_burst)?;
        Ok(SmoothBursty {
            core: Arc::new(Core::new("smooth_bursty", state)),
        })
    }
}

/// Configures a [`SmoothWarmingUp`]; made by [`SmoothWarmingUp::builder`].
#[derive(Debug, Clone)]
pub struct SmoothWarmingUpBuilder {
    permits_per_second: Option<f64>,
    warmup: Option<Duration>,
    cold_factor: f64,
}

impl Default for SmoothWarmingUpBuilder {
    fn default() -> SmoothWarmingUpBuilder {
        SmoothWarmingUpBuilder {
            permits_per_second: None,
            warmup: None,
            cold_factor: 3.0,
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
        let rate = self.permits_per_second.ok_or(ConfigError::MissingRate)?;
        let warmup = self.warmup.ok_or(ConfigError::InvalidParameter {
            name: "warmup",
            reason: "required: the warm-up period",
        })?;
        let state = SmoothState::warming_up(rate, warmup, self.cold_factor)?;
        Ok(SmoothWarmingUp {
            core: Arc::new(Core::new("smooth_warming_up", state)),
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
    /// reserved and the rate was not changed after it), the reservation is
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
        self.core.lock().state.rate()
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
    /// reserved and the rate was not changed after it), the reservation is
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
        self.core.lock().state.rate()
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

/// The state both handles share.
struct Core {
    /// `smooth_bursty` or `smooth_warming_up` (tracing, `Debug`).
    kind: &'static str,
    /// Time zero of the state machine.
    origin: clock::Origin,
    inner: Mutex<Inner>,
    /// Set under the lock; read without it on the fast checks.
    closed: AtomicBool,
    /// The state's next free ticket, in nanoseconds since the origin
    /// (rounded up), published under the lock after every change: a
    /// `try_acquire` that comes before it owes, and is refused without the
    /// lock (see [`Core::try_acquire`]).
    next_free: AtomicU64,
    /// Wakes sleeping waiters on close.
    closing: Notify,
    counters: Counters,
}

struct Inner {
    state: SmoothState,
    /// The version of `state`: the number of the change that produced it.
    version: u64,
    /// The last version number handed out (versions are never reused).
    versions: u64,
    /// After a waiter woke late, arrivals before this time (since the
    /// origin) are taken as on time (see the module notes).
    credit_until: Duration,
    /// The reservations that can still be given back — sleeping waiters and
    /// held [`Reservation`]s — in reservation order (by version).
    live: VecDeque<Live>,
}

/// A reservation that can still be given back.
struct Live {
    /// The version its reservation produced: its key, in reservation order.
    version: u64,
    /// Where it lies on the time line (moved back when an earlier one is
    /// given back).
    span: Span,
    /// When its caller may go, since the origin (`None`: never).
    due: Option<Duration>,
    /// The sleeping waiter's task, woken when `due` moves.
    waker: Option<Waker>,
    /// `due` moved since the waiter last looked.
    moved: bool,
    /// A waiter sleeps on it (else it is a granted, held reservation).
    sleeping: bool,
}

impl Inner {
    /// The time to present to the state machine for an arrival at `now`:
    /// within the credit window, the next free ticket if it is earlier, but
    /// never more than [`CREDIT_REACH`] before `now`.
    fn arrival(&self, now: Duration) -> Duration {
        if now < self.credit_until {
            now.min(self.state.next_free())
                .max(now.saturating_sub(CREDIT_REACH))
        } else {
            now
        }
    }

    /// Records a change of state; returns the previous and the new version.
    fn changed(&mut self) -> (u64, u64) {
        let previous = self.version;
        self.versions += 1;
        self.version = self.versions;
        (previous, self.version)
    }

    /// The live reservation made with `version`.
    fn live(&mut self, version: u64) -> Option<&mut Live> {
        let i = self.find(version)?;
        self.live.get_mut(i)
    }

    fn find(&self, version: u64) -> Option<usize> {
        self.live
            .binary_search_by_key(&version, |live| live.version)
            .ok()
    }

    /// Forgets the live reservation made with `version` (spent, or closed).
    fn forget(&mut self, version: u64) -> Option<Live> {
        let i = self.find(version)?;
        self.live.remove(i)
    }
}

impl Core {
    fn new(kind: &'static str, state: SmoothState) -> Core {
        Core {
            kind,
            origin: clock::Origin::now(),
            inner: Mutex::new(Inner {
                state,
                version: 0,
                versions: 0,
                credit_until: Duration::ZERO,
                live: VecDeque::new(),
            }),
            closed: AtomicBool::new(false),
            next_free: AtomicU64::new(0),
            closing: Notify::new(),
            counters: Counters::default(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // Every update under the lock is a single assignment of a state
        // computed first, so a poisoned lock still holds a consistent state.
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Time since the origin on tokio's clock.
    fn now(&self) -> Duration {
        Duration::from_nanos(self.origin.elapsed_nanos())
    }

    fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    async fn acquire(&self, n: u32, timeout: Option<Duration>) -> Result<(), AcquireError> {
        // A plain acquire spends its claim once granted.
        if self.acquire_claim(n, timeout, false).await?.is_some() {
            self.counters.granted(n);
        }
        Ok(())
    }

    /// Waits for `n` permits and keeps them returnable: a dropped
    /// `Reservation` gives back the part of its cost not yet elapsed.
    async fn reserve(self: &Arc<Core>, n: u32) -> Result<Reservation, AcquireError> {
        Ok(match self.acquire_claim(n, None, true).await? {
            Some(claim) => Reservation::held(
                Arc::new(Withdrawal {
                    core: Arc::clone(self),
                    n,
                    claim: Mutex::new(Some(claim)),
                }),
                0,
            ),
            None => Reservation::spent(),
        })
    }

    /// Reserves `n` permits and waits for them; returns the claim to give
    /// them back (`None` for `n = 0`). With `hold`, the reservation stays
    /// live after its turn, until the claim is spent or withdrawn.
    async fn acquire_claim(
        &self,
        n: u32,
        timeout: Option<Duration>,
        hold: bool,
    ) -> Result<Option<Claim>, AcquireError> {
        if self.is_closed() {
            return Err(AcquireError::Closed);
        }
        if n == 0 {
            return Ok(None);
        }
        // Created before the closed check under the lock: a `close()` after
        // that check wakes it (`notify_waiters` reaches every `Notified`
        // created before it, polled or not).
        let closing = pin!(self.closing.notified());
        let mut withdraw = {
            let mut inner = self.lock();
            if self.is_closed() {
                return Err(AcquireError::Closed);
            }
            let now = self.now();
            let at = inner.arrival(now);
            let before = inner.state.clone();
            let (wait, span) = match timeout {
                None => inner.state.reserve_span(at, n),
                Some(timeout) => {
                    // The timeout counts from `now`, not from `at`.
                    let slack = timeout.saturating_add(now.saturating_sub(at));
                    let Some(reserved) = inner.state.try_reserve_span(at, n, slack) else {
                        drop(inner);
                        self.counters.refused();
                        tracing::trace!(limiter = self.kind, n, ?timeout, "timed out at once");
                        return Err(AcquireError::Timeout);
                    };
                    reserved
                }
            };
            let (previous, version) = inner.changed();
            self.publish(&inner);
            let claim = Claim {
                version,
                previous,
                before,
            };
            // `None`: beyond `Duration::MAX`, never due.
            let due = at.checked_add(wait);
            let ready = due.is_some_and(|due| due <= now);
            if !ready || hold {
                inner.live.push_back(Live {
                    version,
                    span,
                    due,
                    waker: None,
                    moved: false,
                    sleeping: !ready,
                });
            }
            if ready {
                tracing::trace!(limiter = self.kind, n, "granted");
                return Ok(Some(claim));
            }
            tracing::trace!(limiter = self.kind, n, ?wait, "reserved, waiting");
            Withdraw {
                core: self,
                claim: Some(claim),
            }
        };
        let version = withdraw.version();
        let woke = self.sleep(version, closing).await;
        let claim = withdraw.claim.take();
        let mut inner = self.lock();
        let due = if woke && hold {
            inner.live(version).and_then(|live| {
                live.sleeping = false;
                live.waker = None;
                live.due
            })
        } else {
            inner.forget(version).and_then(|live| live.due)
        };
        if !woke || self.is_closed() {
            return Err(AcquireError::Closed);
        }
        let now = self.now();
        if let Some(due) = due.filter(|&due| now > due) {
            // Late on the timer: see the module notes.
            inner.credit_until = inner.credit_until.max(now.saturating_add(CREDIT_GRACE));
            drop(inner);
            tracing::trace!(limiter = self.kind, n, late = ?now.saturating_sub(due), "granted after waiting");
        } else {
            drop(inner);
            tracing::trace!(limiter = self.kind, n, "granted after waiting");
        }
        Ok(claim)
    }

    /// Sleeps until the live reservation `version` is due, following its
    /// turn as earlier reservations are given back. `false` when the
    /// limiter was closed.
    async fn sleep(&self, version: u64, mut closing: Pin<&mut Notified<'_>>) -> bool {
        enum Woke {
            Due,
            Moved,
            Closed,
        }
        let mut timer = pin!(clock::sleep_until(self.origin.instant()));
        let mut two_step = clock::TwoStep::default();
        loop {
            let due = {
                let mut inner = self.lock();
                let Some(live) = inner.live(version) else {
                    return false; // closed
                };
                live.moved = false;
                live.due
            };
            if due.is_some_and(|due| due <= self.now()) {
                return true;
            }
            // `None`: never due; only a close or a move ends the wait. Armed
            // in two steps, as the bucket limiters' timers ([`clock::TwoStep`]).
            let turn = due.and_then(|due| self.origin.instant().checked_add(due));
            let (deadline, early) = match turn {
                Some(turn) => {
                    let (deadline, early) = two_step.deadline(turn);
                    timer.as_mut().reset(deadline);
                    (Some(deadline), early)
                }
                None => (None, false),
            };
            let woke = poll_fn(|cx| {
                if closing.as_mut().poll(cx).is_ready() {
                    return Poll::Ready(Woke::Closed);
                }
                if deadline.is_some() && timer.as_mut().poll(cx).is_ready() {
                    return Poll::Ready(Woke::Due);
                }
                let mut inner = self.lock();
                match inner.live(version) {
                    None => Poll::Ready(Woke::Closed),
                    Some(live) if live.moved => Poll::Ready(Woke::Moved),
                    Some(live) => {
                        if !live.waker.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
                            live.waker = Some(cx.waker().clone());
                        }
                        Poll::Pending
                    }
                }
            })
            .await;
            match woke {
                Woke::Due => match turn {
                    Some(turn) if early => two_step.fired(turn, early),
                    _ => return true,
                },
                Woke::Closed => return false,
                Woke::Moved => {}
            }
        }
    }

    fn try_acquire(&self, n: u32) -> Result<(), TryAcquireError> {
        if self.is_closed() {
            return Err(TryAcquireError::Closed);
        }
        if n == 0 {
            return Ok(());
        }
        let now = self.now();
        // A caller that comes before the next free ticket owes: refused
        // without the lock, with what the locked path would say (the ticket
        // is after `now`, so after the arrival time too, which is never
        // later). A ticket published a moment ago or about to move back
        // reads as a refusal just before or after that change.
        let owed = Duration::from_nanos(self.next_free.load(Ordering::Acquire));
        if owed > now {
            return self.refuse(n, owed.saturating_sub(now));
        }
        let mut inner = self.lock();
        if self.is_closed() {
            return Err(TryAcquireError::Closed);
        }
        let at = inner.arrival(now);
        if inner
            .state
            .try_reserve(at, n, now.saturating_sub(at))
            .is_some()
        {
            inner.changed();
            self.publish(&inner);
            drop(inner);
            self.counters.granted(n);
            tracing::trace!(limiter = self.kind, n, "granted");
            Ok(())
        } else {
            let retry_after = inner.state.next_free().saturating_sub(now);
            drop(inner);
            self.refuse(n, retry_after)
        }
    }

    fn refuse(&self, n: u32, retry_after: Duration) -> Result<(), TryAcquireError> {
        self.counters.refused();
        tracing::trace!(limiter = self.kind, n, ?retry_after, "limited");
        Err(TryAcquireError::Limited { retry_after })
    }

    /// Publishes the state's next free ticket for the lock-free refusals;
    /// called under the lock after every change of the state.
    fn publish(&self, inner: &Inner) {
        self.next_free
            .store(inner.state.next_free_nanos(), Ordering::Release);
    }

    fn set_rate(&self, permits_per_second: f64) -> Result<(), ConfigError> {
        let mut inner = self.lock();
        let now = self.now();
        let at = inner.arrival(now);
        inner.state.set_rate(at, permits_per_second)?;
        inner.changed();
        self.publish(&inner);
        drop(inner);
        tracing::debug!(limiter = self.kind, permits_per_second, "rate changed");
        Ok(())
    }

    fn close(&self) {
        {
            let mut inner = self.lock();
            if self.closed.swap(true, Ordering::AcqRel) {
                return;
            }
            // Nothing is given back any more.
            inner.live.clear();
        }
        self.closing.notify_waiters();
        tracing::debug!(limiter = self.kind, "closed");
    }

    fn is_fresh(&self) -> bool {
        let inner = self.lock();
        let now = self.now();
        if self.is_closed() || now < inner.credit_until || inner.state.next_free() > now {
            return false;
        }
        // A new limiter starts cold (warm-up) or empty (bursty).
        let fresh = if inner.state.warmup().is_some() {
            inner.state.max_permits()
        } else {
            0.0
        };
        // Exact on purpose: resync caps at `max_permits` itself.
        #[expect(
            clippy::float_cmp,
            reason = "exact on purpose: resync caps at `max_permits` itself"
        )]
        let same = inner.state.stored_permits(now) == fresh;
        same
    }

    fn stored_permits(&self) -> f64 {
        let inner = self.lock();
        inner.state.stored_permits(inner.arrival(self.now()))
    }

    /// A dropped waiter's reservation: put back the state before it if
    /// nothing has changed since (see the module notes).
    /// Counters and the state now.
    fn stats(&self) -> Stats {
        let (granted, refused) = self.counters.totals();
        Stats {
            granted,
            refused,
            waiting: self.lock().live.iter().filter(|live| live.sleeping).count(),
            available: None,
        }
    }

    /// A reservation given up (its waiter dropped, or its `Reservation`
    /// dropped uncommitted). If it is still the latest change to the
    /// limiter, the state before it is put back, exactly as if it had never
    /// arrived. Otherwise the part of its cost not yet elapsed is given back
    /// (`SmoothState::give_back`) and every reservation after it moves
    /// forward by as much (see the module notes).
    fn withdraw(&self, claim: Claim) {
        let mut wakers = Vec::new();
        {
            let mut inner = self.lock();
            // Gone: the limiter was closed.
            let Some(live) = inner.forget(claim.version) else {
                return;
            };
            if inner.version == claim.version {
                inner.state = claim.before;
                inner.version = claim.previous;
                self.publish(&inner);
                drop(inner);
                tracing::trace!(limiter = self.kind, "cancelled: reservation withdrawn");
                return;
            }
            let now = self.now();
            let given = inner.state.give_back(now, live.span);
            self.publish(&inner);
            // Picoseconds; whole nanoseconds off the waiters' due times
            // (never earlier than their turn).
            let shift = Duration::from_nanos(u64::try_from(given / 1000).unwrap_or(u64::MAX));
            if given > 0 {
                inner.changed();
                let after = inner.live.partition_point(|l| l.version < claim.version);
                for later in inner.live.range_mut(after..) {
                    later.span = later.span.shift(given);
                    later.due = later.due.map(|due| due.saturating_sub(shift));
                    later.moved = true;
                    wakers.extend(later.waker.take());
                }
            }
            drop(inner);
            tracing::trace!(limiter = self.kind, given_back = ?shift, "cancelled: unused cost given back");
        }
        for waker in wakers {
            waker.wake();
        }
    }

    /// A held reservation spent: it can no longer be given back.
    fn spend(&self, claim: &Claim) {
        self.lock().forget(claim.version);
    }
}

impl fmt::Debug for Core {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let inner = self.lock();
        let now = inner.arrival(self.now());
        f.debug_struct(self.kind)
            .field("rate", &inner.state.rate())
            .field("stored_permits", &inner.state.stored_permits(now))
            .field("max_permits", &inner.state.max_permits())
            .field("next_free", &inner.state.next_free())
            .field("closed", &self.is_closed())
            .finish_non_exhaustive()
    }
}

/// What it takes to withdraw a reservation: the state before it, valid
/// while the limiter is still at the version the reservation produced.
struct Claim {
    /// The version its reservation produced.
    version: u64,
    /// The version before it.
    previous: u64,
    /// The state before it.
    before: SmoothState,
}

/// A sleeping waiter's claim, withdrawn if the waiter is dropped.
struct Withdraw<'a> {
    core: &'a Core,
    /// `None` once the waiter is done.
    claim: Option<Claim>,
}

impl Withdraw<'_> {
    fn version(&self) -> u64 {
        self.claim.as_ref().map_or(0, |claim| claim.version)
    }
}

impl Drop for Withdraw<'_> {
    fn drop(&mut self) {
        if let Some(claim) = self.claim.take() {
            self.core.withdraw(claim);
        }
    }
}

/// A granted reservation held by a [`Reservation`]: given back when
/// dropped uncommitted (see [`Core::withdraw`]). Its claim is not an entry
/// in a queue that an id could name, so each reservation is a holder of
/// its own, and the id is unused.
struct Withdrawal {
    core: Arc<Core>,
    n: u32,
    /// Taken by the one `commit` or `cancel` a reservation makes.
    claim: Mutex<Option<Claim>>,
}

impl Withdrawal {
    fn take(&self) -> Option<Claim> {
        self.claim
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
    }
}

impl Hold for Withdrawal {
    fn commit(&self, _: u64) {
        if let Some(claim) = self.take() {
            self.core.spend(&claim);
        }
        self.core.counters.granted(self.n);
    }

    fn cancel(&self, _: u64) {
        if let Some(claim) = self.take() {
            self.core.withdraw(claim);
        }
    }
}
