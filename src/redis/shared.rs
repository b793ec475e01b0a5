//! [`RedisFunnel`] as an [`AsyncKeyedLimiter`]: the same middleware on a
//! local map or on a limit shared through Redis.

use super::{RedisFunnel, RedisLimitError};
use crate::keyed::AsyncKeyedLimiter;
use crate::{Peek, Quota, TryAcquireError};

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
            .map_err(|e| refusal(&e))
    }

    async fn peek(&self, key: &String, n: u32) -> Result<Option<Peek>, TryAcquireError> {
        RedisFunnel::peek(self, key, n)
            .await
            .map(Some)
            .map_err(|_| TryAcquireError::Unavailable)
    }

    /// Any quota (a tier) is taken with the call; the decision and the
    /// state it left come back in one round trip.
    async fn try_acquire_and_peek(&self, key: &String, quota: Option<&Quota>, n: u32) -> Peek {
        match RedisFunnel::try_acquire_and_peek(self, key, quota, n).await {
            Ok(peek) => peek,
            Err(e) => Peek::new(Err(refusal(&e)), &[]),
        }
    }
}

/// A Redis refusal as the keyed trait's.
fn refusal(e: &RedisLimitError) -> TryAcquireError {
    match e {
        &RedisLimitError::Limited { retry_after } => TryAcquireError::Limited { retry_after },
        RedisLimitError::InsufficientCapacity => TryAcquireError::InsufficientCapacity,
        // A quota the script cannot represent: this limit cannot serve it.
        RedisLimitError::InvalidQuota(_) => TryAcquireError::Closed,
        // Timeout, Backend, and what may be added: the store failed.
        _ => TryAcquireError::Unavailable,
    }
}
