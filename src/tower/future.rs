//! The response future both services return: the inner service's future,
//! or a refusal decided before the inner service was called.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use pin_project_lite::pin_project;

use super::BoxError;

pin_project! {
    /// The response future of [`RateLimit`](super::RateLimit) and
    /// [`KeyedRateLimit`](super::KeyedRateLimit): the inner service's
    /// response, or the limiter's refusal (ready at once).
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
}

impl<F, T, E> Future for ResponseFuture<F>
where
    F: Future<Output = Result<T, E>>,
    E: Into<BoxError>,
{
    type Output = Result<T, BoxError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().kind.project() {
            KindProj::Called { future } => future.poll(cx).map_err(Into::into),
            KindProj::Refused { error } => Poll::Ready(Err(error
                .take()
                .expect("ResponseFuture polled after completion"))),
        }
    }
}

impl<F> fmt::Debug for ResponseFuture<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match &self.kind {
            Kind::Called { .. } => "called",
            Kind::Refused { .. } => "refused",
        };
        f.debug_struct("ResponseFuture")
            .field("kind", &kind)
            .finish()
    }
}
