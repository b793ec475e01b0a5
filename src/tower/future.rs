//! The response future both services return: the inner service's future,
//! a refusal decided before the inner service was called, or (for a keyed
//! limit in a shared store) the decision on its way, then one or the other.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use futures::future::BoxFuture;
use pin_project_lite::pin_project;
use sync_wrapper::SyncFuture;

use super::BoxError;

pin_project! {
    /// The response future of [`RateLimit`](super::RateLimit) and
    /// [`KeyedRateLimit`](super::KeyedRateLimit): the inner service's
    /// response, or the limiter's refusal (ready at once, or, from a limit
    /// in a shared store, once the store has answered).
    pub struct ResponseFuture<F> {
        #[pin]
        kind: Kind<F>,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind<F> {
        Called { #[pin] future: F },
        Refused { error: Option<BoxError> },
        // The limit's answer, then (granted) the inner service called.
        Deciding { decision: SyncFuture<BoxFuture<'static, Result<F, BoxError>>> },
    }
}

impl<F> ResponseFuture<F> {
    pub(crate) fn called(future: F) -> Self {
        ResponseFuture {
            kind: Kind::Called { future },
        }
    }

    pub(crate) fn refused(error: BoxError) -> Self {
        ResponseFuture {
            kind: Kind::Refused { error: Some(error) },
        }
    }

    /// A decision that resolves to the inner service's future (granted) or
    /// the refusal.
    pub(crate) fn deciding(decision: BoxFuture<'static, Result<F, BoxError>>) -> Self {
        ResponseFuture {
            kind: Kind::Deciding {
                decision: SyncFuture::new(decision),
            },
        }
    }
}

impl<F, T, E> Future for ResponseFuture<F>
where
    F: Future<Output = Result<T, E>>,
    E: Into<BoxError>,
{
    type Output = Result<T, BoxError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut kind = self.project().kind;
        loop {
            match kind.as_mut().project() {
                KindProj::Called { future } => return future.poll(cx).map_err(Into::into),
                KindProj::Refused { error } => {
                    return Poll::Ready(Err(error
                        .take()
                        .expect("ResponseFuture polled after completion")));
                }
                KindProj::Deciding { decision } => {
                    match std::task::ready!(Pin::new(decision).poll(cx)) {
                        Ok(future) => kind.set(Kind::Called { future }),
                        Err(error) => kind.set(Kind::Refused { error: Some(error) }),
                    }
                }
            }
        }
    }
}

impl<F> fmt::Debug for ResponseFuture<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match &self.kind {
            Kind::Called { .. } => "called",
            Kind::Refused { .. } => "refused",
            Kind::Deciding { .. } => "deciding",
        };
        f.debug_struct("ResponseFuture")
            .field("kind", &kind)
            .finish()
    }
}
