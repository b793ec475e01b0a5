//! `RateLimitLayer`: builds `RateLimit` services that share one limiter.

use std::fmt;
use std::sync::Arc;

use tower_layer::Layer;

use super::RateLimit;
use crate::Limiter;

/// Wraps services in [`RateLimit`]: each request waits (in `poll_ready`)
/// for a permit of one shared limiter.
///
/// Cheap to clone; every service it makes, and every clone of those,
/// draws from the same limiter.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use tokio::time::Instant;
/// use tower::{Layer, Service, ServiceExt, service_fn};
/// use tokio_ratelimit::{Rate, TokenBucket, tower::{BoxError, RateLimitLayer}};
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() -> Result<(), BoxError> {
/// let bucket = TokenBucket::builder().rate(Rate::per_second(10)).capacity(1).build()?;
/// let layer = RateLimitLayer::new(bucket);
/// let mut service = layer.layer(service_fn(|x: u32| async move { Ok::<_, BoxError>(x * 2) }));
/// let mut clone = service.clone(); // the same budget
///
/// let start = Instant::now();
/// assert_eq!(service.ready().await?.call(1).await?, 2);
/// assert_eq!(clone.ready().await?.call(2).await?, 4); // waited for the refill
/// assert_eq!(start.elapsed(), Duration::from_millis(100));
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct RateLimitLayer {
    limiter: Arc<dyn Limiter>,
}

impl RateLimitLayer {
    /// A layer over `limiter`: any [`Limiter`], including an
    /// `Arc<dyn Limiter>` chosen from configuration. It is shared through
    /// an `Arc`; keep a clone of the handle (they are cheap) to observe or
    /// close it.
    pub fn new<L: Limiter + 'static>(limiter: L) -> RateLimitLayer {
        RateLimitLayer {
            limiter: Arc::new(limiter),
        }
    }
}

impl<S> Layer<S> for RateLimitLayer {
    type Service = RateLimit<S>;

    fn layer(&self, inner: S) -> RateLimit<S> {
        RateLimit::from_shared(inner, Arc::clone(&self.limiter))
    }
}

impl fmt::Debug for RateLimitLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimitLayer")
            .field("limiter", &self.limiter.stats())
            .finish()
    }
}
