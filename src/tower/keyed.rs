//! `KeyedRateLimitLayer`: a per-key limit that refuses at once.
//!
//! Readiness is the inner service's alone: the key is only known in `call`,
//! so that is where the limit is asked (`try_acquire`, which never waits).

use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};

use tower_layer::Layer;
use tower_service::Service;

use super::{BoxError, RateLimited, ResponseFuture};
use crate::TryAcquireError;
use crate::keyed::AsyncKeyedLimiter;

/// Wraps services in [`KeyedRateLimit`]: one permit per request from the
/// request's key, refused at once with [`RateLimited`] when over the limit.
///
/// `key` is a closure over the request (`Fn(&Req) -> K`): a client id
/// header, the peer address, an API key. `limiter` is a
/// [`KeyedFunnel`](crate::keyed::KeyedFunnel), a
/// [`Keyed`](crate::keyed::Keyed), a `redis::RedisFunnel` shared by a
/// fleet, or anything else that implements [`AsyncKeyedLimiter`] (local
/// maps answer at once, with no future boxed). Cheap to clone; every
/// service made shares the limiter. For HTTP services,
/// `http::HttpRateLimitLayer` adds client identity, answers and headers.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use tower::{Layer, ServiceExt, service_fn};
/// use tokio_ratelimit::tower::{BoxError, KeyedRateLimitLayer, RateLimited};
/// use tokio_ratelimit::{Rate, keyed::KeyedFunnel};
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() -> Result<(), BoxError> {
/// // Requests are (client, payload) pairs here; in HTTP the key comes from a header.
/// let per_client: KeyedFunnel<u32> =
///     KeyedFunnel::builder().rate(Rate::per_second(4)).capacity(2).build()?;
/// let layer = KeyedRateLimitLayer::new(per_client, |req: &(u32, char)| req.0);
/// let service = layer.layer(service_fn(|req: (u32, char)| async move { Ok::<_, BoxError>(req.1) }));
///
/// assert_eq!(service.clone().oneshot((1, 'a')).await?, 'a');
/// assert_eq!(service.clone().oneshot((1, 'b')).await?, 'b');
/// let error = service.clone().oneshot((1, 'c')).await.unwrap_err();
/// let limited = error.downcast_ref::<RateLimited<u32>>().unwrap();
/// assert_eq!((limited.key, limited.retry_after), (1, Duration::from_millis(250)));
/// assert_eq!(service.clone().oneshot((2, 'd')).await?, 'd'); // another client
/// # Ok(())
/// # }
/// ```
pub struct KeyedRateLimitLayer<L, F> {
    limiter: L,
    key: Arc<F>,
}

impl<L, F> KeyedRateLimitLayer<L, F> {
    /// A layer that limits each request by `key(&request)` in `limiter`.
    pub fn new(limiter: L, key: F) -> Self {
        KeyedRateLimitLayer {
            limiter,
            key: Arc::new(key),
        }
    }
}

impl<L: Clone, F> Clone for KeyedRateLimitLayer<L, F> {
    fn clone(&self) -> Self {
        KeyedRateLimitLayer {
            limiter: self.limiter.clone(),
            key: Arc::clone(&self.key),
        }
    }
}

impl<S, L: Clone, F> Layer<S> for KeyedRateLimitLayer<L, F> {
    type Service = KeyedRateLimit<S, L, F>;

    fn layer(&self, inner: S) -> Self::Service {
        KeyedRateLimit {
            inner,
            limiter: self.limiter.clone(),
            key: Arc::clone(&self.key),
        }
    }
}

impl<L: fmt::Debug, F> fmt::Debug for KeyedRateLimitLayer<L, F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyedRateLimitLayer")
            .field("limiter", &self.limiter)
            .finish_non_exhaustive()
    }
}

/// A service that limits each request by its key, refusing at once when
/// the key is over its limit: made by [`KeyedRateLimitLayer`].
///
/// `poll_ready` is the inner service's; `call` extracts the key, takes one
/// permit from the key's limit (never waiting), and calls the inner service
/// — or, over the limit, answers at once without calling it.
///
/// Since the key is only known in `call`, the limit is asked after the
/// inner service is ready. Over a [`RateLimit`](super::RateLimit), a
/// request that will be refused first waits for its global permit, and
/// gives it back unspent when the service is dropped (as `oneshot` does).
/// In axum, add this layer with `Router::layer`: axum's routes are always
/// ready and poll their own layers inside `call`, so the key is checked on
/// arrival, before a route's `RateLimit` is waited for (see
/// `examples/axum_service.rs`).
///
/// # Errors
///
/// The response future fails, without calling the inner service, with
/// [`RateLimited<K>`] (boxed) when the key is over its limit, and with the
/// limiter's other [`TryAcquireError`]: `Unavailable` for a new key refused
/// by the limiter's `max_keys` or a shared store failing closed (a 503, not
/// a 429), `Closed` from a [`Keyed`](crate::keyed::Keyed) whose factory
/// failed. Otherwise with the inner service's error.
///
/// # Examples
///
/// See [`KeyedRateLimitLayer`].
pub struct KeyedRateLimit<S, L, F> {
    inner: S,
    limiter: L,
    key: Arc<F>,
}

impl<S, L, F> KeyedRateLimit<S, L, F> {
    /// Wraps `inner` in a limit per `key(&request)` from `limiter`.
    pub fn new(inner: S, limiter: L, key: F) -> Self {
        KeyedRateLimit {
            inner,
            limiter,
            key: Arc::new(key),
        }
    }

    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// The inner service.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S: Clone, L: Clone, F> Clone for KeyedRateLimit<S, L, F> {
    fn clone(&self) -> Self {
        KeyedRateLimit {
            inner: self.inner.clone(),
            limiter: self.limiter.clone(),
            key: Arc::clone(&self.key),
        }
    }
}

impl<S, L, F, Req> Service<Req> for KeyedRateLimit<S, L, F>
where
    S: Service<Req> + Clone + Send + 'static,
    S::Future: Send,
    S::Error: Into<BoxError>,
    Req: Send + 'static,
    L: AsyncKeyedLimiter + Clone + 'static,
    L::Key: fmt::Debug + Send + Sync + 'static,
    F: Fn(&Req) -> L::Key,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future = ResponseFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, request: Req) -> Self::Future {
        let key = (self.key)(&request);
        // A local map answers at once: no future to box.
        if let Some(answer) = self.limiter.try_acquire_now(&key, 1) {
            return match refusal(answer, key) {
                None => ResponseFuture::called(self.inner.call(request)),
                Some(error) => ResponseFuture::refused(error),
            };
        }
        // A shared store: the inner service that was made ready goes with
        // the decision, and is called once the store has granted.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let limiter = self.limiter.clone();
        ResponseFuture::deciding(Box::pin(async move {
            let answer = limiter.try_acquire_many(&key, 1).await;
            match refusal(answer, key) {
                None => Ok(inner.call(request)),
                Some(error) => Err(error),
            }
        }))
    }
}

/// The layer's error for a refused request (`None`: granted).
fn refusal<K>(answer: Result<(), TryAcquireError>, key: K) -> Option<BoxError>
where
    K: fmt::Debug + Send + Sync + 'static,
{
    match answer {
        Ok(()) => None,
        Err(TryAcquireError::Limited { retry_after }) => {
            tracing::trace!(?key, ?retry_after, "keyed rate limit layer: refused");
            Some(Box::new(RateLimited { retry_after, key }))
        }
        Err(error) => {
            tracing::debug!(?key, %error, "keyed rate limit layer: refused");
            Some(Box::new(error))
        }
    }
}

impl<S: fmt::Debug, L: fmt::Debug, F> fmt::Debug for KeyedRateLimit<S, L, F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyedRateLimit")
            .field("inner", &self.inner)
            .field("limiter", &self.limiter)
            .finish_non_exhaustive()
    }
}
