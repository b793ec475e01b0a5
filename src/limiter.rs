//! The one trait every limiter implements.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use crate::{AcquireError, Peek, Reservation, Stats, TryAcquireError};

/// A rate limiter, whatever its algorithm.
///
/// The trait is dyn-compatible, so a service can pick its limiter from
/// configuration and hold it as `Arc<dyn Limiter>` or `Box<dyn Limiter>`.
/// Each limiter type also has the same methods inherently, returning
/// unboxed futures; the trait's `async fn`s box theirs (`async-trait`).
///
/// # Examples
///
/// ```
/// use std::sync::Arc;
/// use std::time::Duration;
/// use tokio::time::Instant;
/// use tokio_ratelimit::{Funnel, Limiter, Rate, TokenBucket};
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// let from_config = "token";
/// let limiter: Arc<dyn Limiter> = match from_config {
///     "token" => Arc::new(TokenBucket::builder().rate(Rate::per_second(10)).capacity(1).build().unwrap()),
///     _ => Arc::new(Funnel::builder().rate(Rate::per_second(10)).capacity(1).build().unwrap()),
/// };
/// let start = Instant::now();
/// limiter.acquire().await.unwrap();
/// limiter.acquire().await.unwrap();
/// assert_eq!(start.elapsed(), Duration::from_millis(100));
/// assert!(limiter.try_acquire().is_err());
/// # }
/// ```
#[async_trait]
pub trait Limiter: Send + Sync {
    /// Waits for one permit. See [`acquire_many`](Self::acquire_many).
    ///
    /// # Errors
    ///
    /// As [`acquire_many`](Self::acquire_many).
    async fn acquire(&self) -> Result<(), AcquireError> {
        self.acquire_many(1).await
    }

    /// Waits until `n` permits are granted, in arrival order.
    ///
    /// `n = 0` succeeds at once.
    ///
    /// # Errors
    ///
    /// [`AcquireError::InsufficientCapacity`] at once when `n` exceeds the
    /// capacity; [`AcquireError::Closed`] when the limiter is closed (also
    /// while waiting); [`AcquireError::Overflow`] from a leaky bucket that
    /// is full.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future before it resolves gives back everything it had
    /// reserved: nothing is consumed, and the waiters behind it move up.
    async fn acquire_many(&self, n: u32) -> Result<(), AcquireError>;

    /// Takes one permit if it is available now.
    ///
    /// # Errors
    ///
    /// As [`try_acquire_many`](Self::try_acquire_many).
    fn try_acquire(&self) -> Result<(), TryAcquireError> {
        self.try_acquire_many(1)
    }

    /// Takes `n` permits if they are available now, without jumping ahead
    /// of waiters.
    ///
    /// # Errors
    ///
    /// [`TryAcquireError::Limited`] with the exact time until the request
    /// could succeed; [`TryAcquireError::InsufficientCapacity`] when `n`
    /// exceeds the capacity; [`TryAcquireError::Closed`].
    fn try_acquire_many(&self, n: u32) -> Result<(), TryAcquireError>;

    /// Waits for `n` permits, but no longer than `timeout`: fails at once
    /// with [`AcquireError::Timeout`] when they cannot be had within it.
    /// `Duration::MAX` waits as long as it takes.
    ///
    /// # Errors
    ///
    /// As [`acquire_many`](Self::acquire_many), and
    /// [`AcquireError::Timeout`].
    ///
    /// # Cancel safety
    ///
    /// As [`acquire_many`](Self::acquire_many).
    async fn acquire_timeout(&self, n: u32, timeout: Duration) -> Result<(), AcquireError>;

    /// Waits for `n` permits like [`acquire_many`](Self::acquire_many), but
    /// holds them: [`Reservation::commit`] spends them, dropping the
    /// reservation gives them back. This is how a tower service takes a
    /// permit in `poll_ready` without losing it if it is dropped before
    /// `call`. The default (for limiters that cannot give permits back)
    /// acquires them and returns a reservation that is already spent.
    ///
    /// # Errors
    ///
    /// As [`acquire_many`](Self::acquire_many).
    ///
    /// # Cancel safety
    ///
    /// As [`acquire_many`](Self::acquire_many).
    async fn reserve(&self, n: u32) -> Result<Reservation, AcquireError> {
        self.acquire_many(n).await?;
        Ok(Reservation::spent())
    }

    /// Waits in the limiter's FIFO queue until `n` permits fit, then takes
    /// them: never `Overflow`, and no later request overtakes it. The same
    /// as [`acquire_many`](Self::acquire_many) for every limiter but the
    /// [`LeakyBucket`](crate::LeakyBucket), whose `acquire_many` is its
    /// shaper (a request that does not fit overflows) and whose
    /// [`acquire_room`](crate::LeakyBucket::acquire_room) this is. The
    /// [`io`](crate::io) wrappers pay with it, so that connections sharing a
    /// leaky bucket get their turns in arrival order whatever their chunk
    /// sizes.
    ///
    /// # Errors
    ///
    /// As [`acquire_many`](Self::acquire_many), but never
    /// [`AcquireError::Overflow`] from the crate's limiters.
    ///
    /// # Cancel safety
    ///
    /// As [`acquire_many`](Self::acquire_many).
    async fn acquire_room(&self, n: u32) -> Result<(), AcquireError> {
        self.acquire_many(n).await
    }

    /// What [`try_acquire_many(n)`](Self::try_acquire_many) would answer
    /// now, and the state of each band (permits available, time until
    /// full), without taking anything: what the `RateLimit` response
    /// headers need. `None` from limiters that cannot tell without taking
    /// (the default, and the smooth limiters, which have no bands).
    fn peek(&self, n: u32) -> Option<Peek> {
        let _ = n;
        None
    }

    /// Counters (permits granted, requests refused) and the state now
    /// (callers waiting, permits available). The default reports zeros.
    fn stats(&self) -> Stats {
        Stats::default()
    }

    /// Whether this handle could be dropped and the limiter built anew from
    /// the same configuration without anyone being able to tell: no other
    /// handle to it exists, nobody waits on it, and its state equals that of
    /// a newly built one (a full token bucket, an empty funnel).
    ///
    /// [`Keyed`](crate::keyed::Keyed) uses it to evict idle keys, so that
    /// memory follows the active keys with no change in what is granted. The
    /// default, `false`, keeps a limiter forever.
    fn is_fresh(&self) -> bool {
        false
    }
}

macro_rules! forward_limiter {
    ($($ty:ty),*) => {$(
        #[async_trait]
        impl<L: Limiter + ?Sized> Limiter for $ty {
            async fn acquire(&self) -> Result<(), AcquireError> {
                (**self).acquire().await
            }
            async fn acquire_many(&self, n: u32) -> Result<(), AcquireError> {
                (**self).acquire_many(n).await
            }
            fn try_acquire(&self) -> Result<(), TryAcquireError> {
                (**self).try_acquire()
            }
            fn try_acquire_many(&self, n: u32) -> Result<(), TryAcquireError> {
                (**self).try_acquire_many(n)
            }
            async fn acquire_timeout(&self, n: u32, timeout: Duration) -> Result<(), AcquireError> {
                (**self).acquire_timeout(n, timeout).await
            }
            async fn reserve(&self, n: u32) -> Result<Reservation, AcquireError> {
                (**self).reserve(n).await
            }
            async fn acquire_room(&self, n: u32) -> Result<(), AcquireError> {
                (**self).acquire_room(n).await
            }
            fn peek(&self, n: u32) -> Option<Peek> {
                (**self).peek(n)
            }
            fn stats(&self) -> Stats {
                (**self).stats()
            }
            fn is_fresh(&self) -> bool {
                $crate::limiter::Unshared::is_unshared(self) && (**self).is_fresh()
            }
        }
    )*};
}

/// Whether a pointer is the only way to reach what it points to.
pub(crate) trait Unshared {
    fn is_unshared(&self) -> bool;
}

impl<L: ?Sized> Unshared for Arc<L> {
    fn is_unshared(&self) -> bool {
        Arc::strong_count(self) == 1 && Arc::weak_count(self) == 0
    }
}

impl<L: ?Sized> Unshared for Box<L> {
    fn is_unshared(&self) -> bool {
        true
    }
}

impl<L: ?Sized> Unshared for &L {
    fn is_unshared(&self) -> bool {
        false // someone else owns it
    }
}

forward_limiter!(Arc<L>, Box<L>, &L);

/// Implements [`Limiter`] for a handle by forwarding to its inherent
/// methods of the same names (`peek` too, when asked).
macro_rules! impl_limiter {
    ($ty:ty, peek) => {
        $crate::limiter::impl_limiter!($ty, {
            fn peek(&self, n: u32) -> Option<$crate::Peek> {
                Some(<$ty>::peek(self, n))
            }
        });
    };
    ($ty:ty) => {
        $crate::limiter::impl_limiter!($ty, {});
    };
    ($ty:ty, { $($extra:item)* }) => {
        #[async_trait::async_trait]
        impl $crate::Limiter for $ty {
            async fn acquire(&self) -> Result<(), $crate::AcquireError> {
                <$ty>::acquire(self).await
            }
            async fn acquire_many(&self, n: u32) -> Result<(), $crate::AcquireError> {
                <$ty>::acquire_many(self, n).await
            }
            fn try_acquire(&self) -> Result<(), $crate::TryAcquireError> {
                <$ty>::try_acquire(self)
            }
            fn try_acquire_many(&self, n: u32) -> Result<(), $crate::TryAcquireError> {
                <$ty>::try_acquire_many(self, n)
            }
            async fn acquire_timeout(
                &self,
                n: u32,
                timeout: std::time::Duration,
            ) -> Result<(), $crate::AcquireError> {
                <$ty>::acquire_timeout(self, n, timeout).await
            }
            async fn reserve(&self, n: u32) -> Result<$crate::Reservation, $crate::AcquireError> {
                <$ty>::reserve(self, n).await
            }
            fn stats(&self) -> $crate::Stats {
                <$ty>::stats(self)
            }
            fn is_fresh(&self) -> bool {
                <$ty>::is_fresh(self)
            }
            $($extra)*
        }
    };
}

pub(crate) use impl_limiter;
