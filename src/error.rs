//! Every public error type of the crate.
//!
//! A request that can never succeed (`InsufficientCapacity`) is kept apart
//! from one that has to wait (`Limited`, which says for how long), and both
//! from a limiter that has been shut down (`Closed`).

use std::fmt;
use std::time::Duration;

/// A limiter could not be built from the given configuration.
///
/// Returned by every `build()`; setters and constructors never panic, they
/// leave the checking to `build()`.
///
/// # Examples
///
/// ```
/// use tokio_ratelimit::{ConfigError, Funnel, Rate};
///
/// let err = Funnel::builder().rate(Rate::per_second(0)).capacity(1).build().unwrap_err();
/// assert!(matches!(err, ConfigError::InvalidRate { .. }));
/// assert_eq!(err.to_string(), "invalid rate: zero permits per period");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ConfigError {
    /// The builder was not given a rate.
    MissingRate,
    /// The rate cannot limit anything: zero, negative, NaN, infinite, faster
    /// than one permit per nanosecond, or slower than one per 584 years.
    InvalidRate {
        /// What is wrong with it.
        reason: &'static str,
    },
    /// The capacity (burst) is zero: nothing could ever be granted.
    ZeroCapacity,
    /// A token bucket was asked to start with more tokens than it can hold.
    InitialExceedsCapacity {
        /// The requested initial tokens.
        initial: u32,
        /// The bucket's capacity.
        capacity: u32,
    },
    /// Another parameter is out of range (for example a negative warm-up).
    InvalidParameter {
        /// The builder option at fault.
        name: &'static str,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// The limiter needs a background task, and there is no tokio runtime
    /// to spawn it on. Build it inside a runtime (or a `#[tokio::main]` /
    /// `#[tokio::test]` function).
    NoRuntime,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::MissingRate => f.write_str("no rate was configured"),
            Self::InvalidRate { reason } => write!(f, "invalid rate: {reason}"),
            Self::ZeroCapacity => f.write_str("capacity must be at least 1"),
            Self::InitialExceedsCapacity { initial, capacity } => write!(
                f,
                "initial tokens ({initial}) exceed the capacity ({capacity})"
            ),
            Self::InvalidParameter { name, reason } => write!(f, "invalid {name}: {reason}"),
            Self::NoRuntime => f.write_str(
                "no tokio runtime: this limiter spawns a background task, build it inside a runtime",
            ),
        }
    }
}

impl std::error::Error for ConfigError {}

/// An `acquire` call (one that waits) failed.
///
/// # Examples
///
/// ```
/// use tokio_ratelimit::{AcquireError, LeakyBucket, Rate};
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// let bucket = LeakyBucket::builder().rate(Rate::per_second(1)).capacity(1).build().unwrap();
/// bucket.acquire().await.unwrap(); // the bucket now holds one unit of water
/// assert_eq!(bucket.acquire().await, Err(AcquireError::Overflow));
/// assert_eq!(bucket.acquire_many(2).await, Err(AcquireError::InsufficientCapacity));
/// # }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum AcquireError {
    /// The limiter was closed (see `close()`), before or while waiting.
    Closed,
    /// More permits were asked for than the limiter can ever grant at once
    /// (`n > capacity`). Waiting would never help, so this fails at once.
    InsufficientCapacity,
    /// A leaky bucket is full: the request does not fit and was discarded
    /// (never parked).
    Overflow,
    /// The permits could not be had within the timeout of
    /// `acquire_timeout`.
    Timeout,
    /// The limiter's background task is gone (the runtime it ran on was
    /// shut down) and this call waits outside any tokio runtime, where it
    /// cannot be started again. Fails at once rather than hang.
    NoRuntime,
}

impl fmt::Display for AcquireError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Closed => "rate limiter closed",
            Self::InsufficientCapacity => "more permits requested than the limiter's capacity",
            Self::Overflow => "leaky bucket overflow: request discarded",
            Self::Timeout => "permits not available within the timeout",
            Self::NoRuntime => {
                "no tokio runtime to wait in: the limiter's background task is gone and this call is not in a runtime"
            }
        })
    }
}

impl std::error::Error for AcquireError {}

/// A `try_acquire` call (one that never waits) was refused.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use tokio_ratelimit::{Funnel, Rate, TryAcquireError};
///
/// let funnel = Funnel::builder().rate(Rate::per_second(2)).capacity(1).build().unwrap();
/// funnel.try_acquire().unwrap();
/// match funnel.try_acquire() {
///     Err(TryAcquireError::Limited { retry_after }) => assert!(retry_after <= Duration::from_millis(500)),
///     other => panic!("unexpected {other:?}"),
/// }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum TryAcquireError {
    /// The limiter was closed.
    Closed,
    /// More permits were asked for than the limiter can ever grant at once
    /// (`n > capacity`): no amount of waiting helps.
    InsufficientCapacity,
    /// Not now. The same request would succeed after `retry_after`, exactly
    /// (to the nanosecond), if nothing else is granted in between.
    Limited {
        /// How long until the request could succeed.
        retry_after: Duration,
    },
    /// The limit could not be decided now: a shared store (Redis) failed
    /// and the limiter fails closed. Not the caller's doing — an HTTP
    /// service answers `503 Service Unavailable`, not `429`. (No
    /// `retry_after`: when the store is back is not the limiter's to know.
    /// A payload here would also cost every `try_acquire` a larger result.)
    Unavailable,
}

impl TryAcquireError {
    /// The wait before a retry can succeed, for `Limited`; `None` otherwise.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use tokio_ratelimit::TryAcquireError;
    ///
    /// let e = TryAcquireError::Limited { retry_after: Duration::from_millis(5) };
    /// assert_eq!(e.retry_after(), Some(Duration::from_millis(5)));
    /// assert_eq!(TryAcquireError::Closed.retry_after(), None);
    /// ```
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            Self::Limited { retry_after } => Some(*retry_after),
            _ => None,
        }
    }
}

impl fmt::Display for TryAcquireError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Closed => f.write_str("rate limiter closed"),
            Self::InsufficientCapacity => {
                f.write_str("more permits requested than the limiter's capacity")
            }
            Self::Limited { retry_after } => {
                write!(f, "rate limited, retry after {retry_after:?}")
            }
            Self::Unavailable => f.write_str("rate limit could not be decided"),
        }
    }
}

impl std::error::Error for TryAcquireError {}

/// A request refused by a per-key limit, from
/// [`KeyedRateLimitLayer`](crate::tower::KeyedRateLimitLayer): the service's
/// error, boxed into tower's `BoxError`; `downcast_ref::<RateLimited<K>>()`
/// gets it back (with the layer's key type `K`).
///
/// In an HTTP service this becomes `429 Too Many Requests` with a
/// `Retry-After` header (see `examples/axum_service.rs`).
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use tokio_ratelimit::tower::{BoxError, RateLimited};
///
/// fn status(error: &BoxError) -> (u16, Option<Duration>) {
///     match error.downcast_ref::<RateLimited<String>>() {
///         Some(limited) => (429, Some(limited.retry_after)),
///         None => (500, None),
///     }
/// }
/// # let _ = status;
/// ```
#[cfg(feature = "tower")]
#[cfg_attr(docsrs, doc(cfg(feature = "tower")))]
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RateLimited<K> {
    /// How long until the same request could succeed (exact, to the
    /// nanosecond, if nothing else is granted to the key in between).
    pub retry_after: Duration,
    /// The key the request was counted against.
    pub key: K,
}

#[cfg(feature = "tower")]
impl<K> fmt::Display for RateLimited<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "rate limited, retry after {:?}", self.retry_after)
    }
}

#[cfg(feature = "tower")]
impl<K: fmt::Debug> std::error::Error for RateLimited<K> {}

/// An item of a [weighted rate-limited stream](crate::stream::RateLimitStreamExt::rate_limited_by)
/// whose permits the limiter refused, handed back with the reason.
///
/// # Examples
///
/// ```
/// use futures::{StreamExt, stream};
/// use tokio_ratelimit::{AcquireError, Rate, TokenBucket, stream::RateLimitStreamExt};
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// let bucket = TokenBucket::builder().rate(Rate::per_second(100)).capacity(10).build().unwrap();
/// let chunks = stream::iter([vec![0u8; 4], vec![0u8; 40]]);
/// let mut paced = chunks.rate_limited_by(bucket, |chunk| chunk.len() as u32);
/// assert_eq!(paced.next().await.unwrap().unwrap().len(), 4);
/// let refused = paced.next().await.unwrap().unwrap_err();
/// assert_eq!(refused.error, AcquireError::InsufficientCapacity); // 40 > capacity
/// assert_eq!(refused.item.len(), 40); // nothing is lost
/// # }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Refused<T> {
    /// Why the permits were refused.
    pub error: AcquireError,
    /// The item they were for.
    pub item: T,
}

impl<T> fmt::Display for Refused<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.error, f)
    }
}

// Transparent: it reports its error's message (and so has no `source`).
impl<T: fmt::Debug> std::error::Error for Refused<T> {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_is_lowercase_without_period() {
        let all: Vec<String> = vec![
            ConfigError::MissingRate.to_string(),
            ConfigError::ZeroCapacity.to_string(),
            ConfigError::NoRuntime.to_string(),
            AcquireError::Closed.to_string(),
            AcquireError::Overflow.to_string(),
            AcquireError::Timeout.to_string(),
            AcquireError::InsufficientCapacity.to_string(),
            AcquireError::NoRuntime.to_string(),
            TryAcquireError::Limited {
                retry_after: Duration::from_millis(100),
            }
            .to_string(),
            TryAcquireError::Unavailable.to_string(),
        ];
        for s in all {
            assert!(!s.ends_with('.'), "{s}");
            assert!(s.chars().next().unwrap().is_lowercase(), "{s}");
        }
        assert_eq!(
            TryAcquireError::Limited {
                retry_after: Duration::from_millis(100)
            }
            .to_string(),
            "rate limited, retry after 100ms"
        );
    }
}
