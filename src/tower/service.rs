//! `RateLimit`: backpressure from a shared limiter, through `poll_ready`.
//!
//! `poll_ready` drives a `'static` future of `limiter.reserve(1)` (it owns
//! a clone of the `Arc`), keeps the [`Reservation`] it yields, then polls
//! the inner service; `call` commits the reservation and calls the inner
//! service. The permit is held, not spent, until `call`: a service dropped
//! in between drops its reservation, which gives the permit back, and one
//! dropped while still waiting drops the `reserve` future, which gives back
//! its place in the queue. So readiness that is never used costs nothing
//! (on the smooth limiters, nothing but the stored permits it spent once
//! another caller reserved after it: see [`Reservation`]).
//!
//! The state sits in a `Mutex` only to make the service `Sync` (axum wants
//! its services `Sync`; the boxed future is only `Send`). It is reached
//! through `Mutex::get_mut`, which takes no lock.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};

use tower_service::Service;

use super::{BoxError, ResponseFuture};
use crate::{AcquireError, Limiter, Reservation};

type Reserving = Pin<Box<dyn Future<Output = Result<Reservation, AcquireError>> + Send>>;

/// A service that takes a permit of a shared limiter before each request:
/// made by [`RateLimitLayer`](super::RateLimitLayer) or [`RateLimit::new`].
///
/// `poll_ready` waits for the permit (requests queue FIFO behind the
/// limiter), then for the inner service; `call` spends the permit. Every
/// clone draws from the same limiter; each clone has its own readiness, as
/// tower requires.
///
/// # Panics
///
/// `call` panics if `poll_ready` has not returned `Poll::Ready(Ok(()))`
/// since the last `call` (tower's contract: use `ServiceExt::ready` or
/// `oneshot`).
///
/// # Errors
///
/// The response future fails with the limiter's [`AcquireError`] (boxed),
/// without calling the inner service, when the limiter refuses the permit
/// (it was closed; a leaky bucket overflowed); with the inner service's
/// error otherwise. `poll_ready` fails only with the inner service's error.
///
/// # Cancel safety
///
/// A service dropped after `poll_ready` and before `call` gives its permit
/// back; one dropped while `poll_ready` waits gives back its place in the
/// queue. On the buckets (`TokenBucket`, `LeakyBucket`, `Funnel`) no permit
/// is lost to readiness that is never used. On `SmoothBursty` and
/// `SmoothWarmingUp` the same holds while nobody got ready after it; once
/// someone did, the dropped readiness gives back the part of its cost not
/// yet elapsed, but the stored permits it spent stay spent, as for any
/// dropped [`Reservation`] of theirs: a `SmoothBursty` has one stored
/// permit fewer, and a `SmoothWarmingUp` is that much warmer, so the calls
/// after it are priced as for a limiter that served one more. (A
/// [`Limiter`] of your own that keeps the trait's default `reserve` spends
/// the permit in `poll_ready`.)
///
/// # Counting
///
/// A grant counts in the limiter's [`stats`](crate::Stats) and metrics
/// when `call` spends it; a refusal (a leaky bucket's overflow) when
/// `poll_ready` receives it, since the limiter decided it then, and `call`
/// answers it without counting it again. So a service dropped between a
/// refused readiness and its `call` leaves a refusal counted that no
/// request received.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use tokio::time::Instant;
/// use tower::{Service, ServiceExt, service_fn};
/// use tokio_ratelimit::{AcquireError, Rate, TokenBucket, tower::{BoxError, RateLimit}};
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() -> Result<(), BoxError> {
/// let bucket = TokenBucket::builder().rate(Rate::per_second(2)).capacity(1).build()?;
/// let echo = service_fn(|s: &'static str| async move { Ok::<_, BoxError>(s) });
/// let mut service = RateLimit::new(echo, bucket.clone());
///
/// let start = Instant::now();
/// service.ready().await?;          // holds the bucket's only token...
/// assert_eq!(bucket.available(), 0);
/// drop(service);                   // ...and gives it back unused
/// assert_eq!(bucket.available(), 1);
///
/// let mut service = RateLimit::new(echo, bucket.clone());
/// assert_eq!(service.ready().await?.call("a").await?, "a");
/// assert_eq!(service.ready().await?.call("b").await?, "b");
/// assert_eq!(start.elapsed(), Duration::from_millis(500));
///
/// bucket.close();
/// let error = service.ready().await?.call("c").await.unwrap_err();
/// assert_eq!(error.downcast_ref::<AcquireError>(), Some(&AcquireError::Closed));
/// # Ok(())
/// # }
/// ```
pub struct RateLimit<S> {
    inner: S,
    limiter: Arc<dyn Limiter>,
    state: Mutex<State>,
}

enum State {
    /// No permit asked for yet.
    Idle,
    /// Waiting for the permit.
    Reserving(Reserving),
    /// Holding the permit (given back if dropped).
    Reserved(Reservation),
    /// The limiter refused: `call` answers with this error.
    Refused(AcquireError),
}

impl<S> RateLimit<S> {
    /// Wraps `inner` in a limit drawn from `limiter` (any [`Limiter`],
    /// shared through an `Arc`; clone the handle first to keep using it).
    pub fn new<L: Limiter + 'static>(inner: S, limiter: L) -> RateLimit<S> {
        RateLimit::from_shared(inner, Arc::new(limiter))
    }

    pub(crate) fn from_shared(inner: S, limiter: Arc<dyn Limiter>) -> RateLimit<S> {
        RateLimit {
            inner,
            limiter,
            state: Mutex::new(State::Idle),
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

    /// The inner service; a permit held for it is given back.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S: Clone> Clone for RateLimit<S> {
    /// A service drawing from the same limiter, not ready yet (readiness is
    /// not cloned).
    fn clone(&self) -> Self {
        RateLimit::from_shared(self.inner.clone(), Arc::clone(&self.limiter))
    }
}

impl<S, Req> Service<Req> for RateLimit<S>
where
    S: Service<Req>,
    S::Error: Into<BoxError>,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future = ResponseFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        let state = self.state.get_mut().unwrap_or_else(PoisonError::into_inner);
        loop {
            match state {
                State::Idle => {
                    let limiter = Arc::clone(&self.limiter);
                    // `L`'s own method (through `Arc<L>`'s impl it would box
                    // a second future).
                    *state = State::Reserving(Box::pin(async move { (*limiter).reserve(1).await }));
                }
                State::Reserving(reserving) => match reserving.as_mut().poll(cx) {
                    Poll::Pending => return Poll::Pending,
                    Poll::Ready(Ok(reservation)) => *state = State::Reserved(reservation),
                    Poll::Ready(Err(error)) => {
                        tracing::debug!(%error, "rate limit layer: permit refused");
                        *state = State::Refused(error);
                    }
                },
                State::Reserved(_) => {
                    return match self.inner.poll_ready(cx) {
                        Poll::Ready(Err(error)) => {
                            *state = State::Idle; // gives the permit back
                            Poll::Ready(Err(error.into()))
                        }
                        other => other.map_err(Into::into),
                    };
                }
                // `call` answers without the inner service: its readiness
                // does not matter.
                State::Refused(_) => return Poll::Ready(Ok(())),
            }
        }
    }

    fn call(&mut self, request: Req) -> Self::Future {
        let state = self.state.get_mut().unwrap_or_else(PoisonError::into_inner);
        match std::mem::replace(state, State::Idle) {
            State::Reserved(reservation) => {
                reservation.commit();
                ResponseFuture::called(self.inner.call(request))
            }
            State::Refused(error) => ResponseFuture::refused(Box::new(error)),
            State::Idle | State::Reserving(_) => panic!(
                "RateLimit::call without readiness: poll_ready must return Ready(Ok(())) \
                 before each call (use ServiceExt::ready or oneshot)"
            ),
        }
    }
}

impl<S: fmt::Debug> fmt::Debug for RateLimit<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match &*self.state.lock().unwrap_or_else(PoisonError::into_inner) {
            State::Idle => "idle",
            State::Reserving(_) => "reserving",
            State::Reserved(_) => "reserved",
            State::Refused(_) => "refused",
        };
        f.debug_struct("RateLimit")
            .field("inner", &self.inner)
            .field("state", &state)
            .field("limiter", &self.limiter.stats())
            .finish()
    }
}
