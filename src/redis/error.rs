//! The errors of a [`RedisFunnel`]: a decision that did
//! not grant, and a builder that could not build.

use std::fmt;
use std::time::Duration;

use ::redis::RedisError;

#[cfg(doc)]
use super::{FailurePolicy, RedisFunnel};
use crate::ConfigError;

/// A `RedisFunnel` decision that did not grant.
///
/// `Limited` and `InsufficientCapacity` mean what they mean for
/// [`TryAcquireError`](crate::TryAcquireError); `Timeout` and `Backend`
/// (only under [`FailurePolicy::Closed`], or from
/// [`RedisFunnel::decide`]) say that Redis could not decide.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use tokio_ratelimit::redis::RedisLimitError;
///
/// let e = RedisLimitError::Limited { retry_after: Duration::from_millis(5) };
/// assert_eq!(e.retry_after(), Some(Duration::from_millis(5)));
/// assert!(!e.is_backend_failure());
/// let t = RedisLimitError::Timeout { timeout: Duration::from_millis(200) };
/// assert!(t.is_backend_failure());
/// assert_eq!(t.to_string(), "redis did not decide within 200ms");
/// ```
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum RedisLimitError {
    /// Not now. The same request would succeed after `retry_after`, exactly
    /// (to the nanosecond, on the server's clock), if nothing else is
    /// granted on this key in between.
    Limited {
        /// How long until the request could succeed.
        retry_after: Duration,
    },
    /// More permits were asked for than the limiter can ever grant at once
    /// (`n >` the quota's capacity, its smallest band's). Decided locally,
    /// without asking Redis.
    InsufficientCapacity,
    /// The quota passed with the call (`try_acquire_with` and the other
    /// `_with` methods) is invalid: what a builder given it would refuse
    /// (a zero capacity, an invalid rate, more than
    /// [`Quota::MAX_BANDS`](crate::Quota::MAX_BANDS) bands, a band deeper
    /// than the script represents exactly). Decided locally, without asking
    /// Redis, and never granted by [`FailurePolicy::Open`]: it is the
    /// caller's error, not the backend's.
    InvalidQuota(ConfigError),
    /// Redis did not answer within the limiter's decision timeout.
    Timeout {
        /// The timeout that passed.
        timeout: Duration,
    },
    /// Redis answered with an error, or could not be reached.
    Backend(RedisError),
}

impl RedisLimitError {
    /// The wait before a retry can succeed, for `Limited`; `None` otherwise.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            Self::Limited { retry_after } => Some(*retry_after),
            _ => None,
        }
    }

    /// Whether Redis failed to decide (`Timeout` or `Backend`), as opposed
    /// to deciding no.
    pub fn is_backend_failure(&self) -> bool {
        matches!(self, Self::Timeout { .. } | Self::Backend(_))
    }
}

impl fmt::Display for RedisLimitError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Limited { retry_after } => {
                write!(f, "rate limited, retry after {retry_after:?}")
            }
            Self::InsufficientCapacity => {
                f.write_str("more permits requested than the limiter's capacity")
            }
            Self::InvalidQuota(e) => write!(f, "invalid quota: {e}"),
            Self::Timeout { timeout } => write!(f, "redis did not decide within {timeout:?}"),
            Self::Backend(e) => write!(f, "redis failed to decide: {e}"),
        }
    }
}

impl std::error::Error for RedisLimitError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Backend(e) => Some(e),
            Self::InvalidQuota(e) => Some(e),
            _ => None,
        }
    }
}

/// [`RedisFunnel`]'s builder could not build it.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum RedisBuildError {
    /// The rate, capacity, quota or another option is invalid, or beyond
    /// what the script represents exactly.
    Config(ConfigError),
    /// The URL is invalid, or Redis refused the connection or the script.
    Redis(RedisError),
    /// Redis did not load the script within the connect timeout.
    Timeout {
        /// The connect timeout that passed.
        timeout: Duration,
    },
    /// The server's clock, as its scripts see it (`TIME`), is not a sane
    /// time (zero, or before 2020): every decision is made on that clock,
    /// and on a broken one keys would expire at once and grant everything.
    /// Some Redis-compatible servers return zero for `TIME` in scripts.
    Clock {
        /// What `TIME` said, in microseconds since the Unix epoch.
        server_time_us: u64,
    },
}

impl fmt::Display for RedisBuildError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Config(e) => e.fmt(f),
            Self::Redis(e) => write!(f, "redis: {e}"),
            Self::Timeout { timeout } => {
                write!(f, "redis did not load the script within {timeout:?}")
            }
            Self::Clock { server_time_us } => write!(
                f,
                "the server's clock in scripts reads {server_time_us} µs since 1970, not a sane time"
            ),
        }
    }
}

impl std::error::Error for RedisBuildError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Config(e) => Some(e),
            Self::Redis(e) => Some(e),
            Self::Timeout { .. } | Self::Clock { .. } => None,
        }
    }
}

impl From<ConfigError> for RedisBuildError {
    fn from(e: ConfigError) -> Self {
        Self::Config(e)
    }
}
