//! tower middleware (feature `tower`): a shared rate limit with backpressure,
//! and a per-key limit that refuses at once.
//!
//! * [`RateLimitLayer`] wraps a service in [`RateLimit`], which waits in
//!   `poll_ready` for a permit of any [`Limiter`](crate::Limiter) — a
//!   [`TokenBucket`](crate::TokenBucket) in front of an expensive backend,
//!   say. Requests queue FIFO behind the limiter: this is backpressure, not
//!   rejection.
//! * [`KeyedRateLimitLayer`] wraps a service in [`KeyedRateLimit`], which
//!   takes a key from each request (a client id, a peer address) and asks a
//!   [`KeyedFunnel`](crate::keyed::KeyedFunnel) or
//!   [`Keyed`](crate::keyed::Keyed) limiter; a request over its key's limit
//!   fails at once with [`RateLimited`], which carries `retry_after` — an
//!   HTTP service answers `429 Too Many Requests` with it.
//!
//! # One budget for every clone
//!
//! Servers clone a service per connection (axum, hyper, tonic all do). Every
//! clone of a [`RateLimit`] or [`KeyedRateLimit`] draws from the *same*
//! limiter, shared through an `Arc`: the limit holds for the whole server.
//! (tower's own `tower::limit::RateLimit` keeps its state per clone, so
//! behind a per-connection clone it limits each connection separately.)
//!
//! # Errors
//!
//! Both services answer with tower's [`BoxError`]: the inner service's error
//! (converted with `Into<BoxError>`), or the limiter's —
//! [`AcquireError`](crate::AcquireError) from [`RateLimit`] (a closed
//! limiter, a leaky bucket that overflowed), [`RateLimited<K>`] or
//! [`TryAcquireError`](crate::TryAcquireError) from [`KeyedRateLimit`].
//! Get them back with `downcast_ref`. Limiter errors belong to the request,
//! not the service: `poll_ready` fails only when the inner service's
//! `poll_ready` does, so a `tower::buffer::Buffer` in front keeps working.
//!
//! # Examples
//!
//! A shared budget, with backpressure, and a per-client limit that refuses:
//!
//! ```
//! use std::time::Duration;
//! use tokio::time::Instant;
//! use tower::{Layer, Service, ServiceExt, service_fn};
//! use tokio_ratelimit::tower::{BoxError, KeyedRateLimitLayer, RateLimitLayer, RateLimited};
//! use tokio_ratelimit::{Rate, TokenBucket, keyed::KeyedFunnel};
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() -> Result<(), BoxError> {
//! #[derive(Clone)]
//! struct Request { client: String }
//! let backend = service_fn(|_: Request| async { Ok::<_, BoxError>("done") });
//!
//! // 10/s for the whole server, bursts of 2; 1/s per client.
//! let global = TokenBucket::builder().rate(Rate::per_second(10)).capacity(2).build()?;
//! let per_client: KeyedFunnel<String> =
//!     KeyedFunnel::builder().rate(Rate::per_second(1)).capacity(1).build()?;
//! let service = KeyedRateLimitLayer::new(per_client, |req: &Request| req.client.clone())
//!     .layer(RateLimitLayer::new(global).layer(backend));
//! let from = |client: &str| Request { client: client.into() };
//!
//! let start = Instant::now();
//! assert_eq!(service.clone().oneshot(from("ann")).await?, "done");
//! let error = service.clone().oneshot(from("ann")).await.unwrap_err(); // at once
//! let limited = error.downcast_ref::<RateLimited<String>>().unwrap();
//! assert_eq!((limited.key.as_str(), limited.retry_after), ("ann", Duration::from_secs(1)));
//! assert_eq!(service.clone().oneshot(from("bob")).await?, "done");
//! assert_eq!(start.elapsed(), Duration::ZERO);
//! assert_eq!(service.clone().oneshot(from("cat")).await?, "done"); // waited for the budget
//! assert_eq!(start.elapsed(), Duration::from_millis(100));
//! # Ok(())
//! # }
//! ```

mod future;
mod keyed;
mod layer;
mod service;

pub use crate::error::RateLimited;
pub use future::ResponseFuture;
pub use keyed::{KeyedRateLimit, KeyedRateLimitLayer};
pub use layer::RateLimitLayer;
pub use service::RateLimit;

/// The boxed error both services answer with; the same type as tower's
/// `tower::BoxError`.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;
