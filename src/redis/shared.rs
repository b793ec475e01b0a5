//! [`RedisFunnel`] as an [`AsyncKeyedLimiter`]: the same middleware on a
//! local map or on a limit shared through Redis.

use super::{RedisFunnel, RedisLimitError};
use crate::keyed::AsyncKeyedLimiter;
use crate::{Peek, TryAcquireError};

/// Keys are the strings after the limiter's prefix. Redis failures follow
/// the [`FailurePolicy`](super::FailurePolicy): failing open the request is
/// granted (and counted in [`RedisStats::fail_open_grants`](super::RedisStats));
/// failing closed it is [`TryAcquireError::Unavailable`], which an HTTP
/// service answers with `503`, never `429`.
#[async_trait::async_trait]
impl AsyncKeyedLimiter for RedisFunnel {
    type Key = String;

    async fn try_acquire_many(&self, key: &String, n: u32) -> Result<(), TryAcquireError> {
        RedisFunnel::try_acquire_many(self, key, n)
            .await
            .map_err(|e| match e {
                RedisLimitError::Limited { retry_after } => {
                    TryAcquireError::Limited { retry_after }
                }
                RedisLimitError::InsufficientCapacity => TryAcquireError::InsufficientCapacity,
                // Timeout, Backend, and what may be added: the store failed.
                _ => TryAcquireError::Unavailable,
            })
    }

    async fn peek(&self, key: &String, n: u32) -> Result<Option<Peek>, TryAcquireError> {
        RedisFunnel::peek(self, key, n)
            .await
            .map(Some)
            .map_err(|_| TryAcquireError::Unavailable)
    }
}
