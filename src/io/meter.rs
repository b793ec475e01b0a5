//! `Meter`: how a wrapper pays for its bytes, one chunk at a time.

use std::fmt;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use crate::{AcquireError, Limiter, TryAcquireError, clock};

/// A payment in progress: the permits of one chunk, being waited for.
type Paying = Pin<Box<dyn Future<Output = Result<(), AcquireError>> + Send>>;

/// The limiter of one wrapper, the size of its chunks, and the chunk it is
/// paying for.
///
/// Invariant: `1 <= chunk <= max_chunk`, and `chunk` is at most the
/// limiter's capacity as far as the meter knows it (its bands' smallest
/// capacity when [`Limiter::peek`] reports bands; else learnt from
/// `InsufficientCapacity`, halving).
pub(crate) struct Meter<L> {
    limiter: Arc<L>,
    max_chunk: u32,
    chunk: u32,
    /// The chunk being paid for (its size) and the wait for its permits.
    /// Dropping it (with the wrapper) gives the permits back.
    paying: Option<(u32, Paying)>,
}

impl<L: Limiter + 'static> Meter<L> {
    pub(crate) fn new(limiter: L, max_chunk: u32) -> Meter<L> {
        let max_chunk = max_chunk.max(1);
        let capacity = limiter
            .peek(0)
            .and_then(|peek| peek.bands().map(|state| state.band.capacity()).min())
            .unwrap_or(u32::MAX);
        Meter {
            limiter: Arc::new(limiter),
            max_chunk,
            chunk: max_chunk.min(capacity).max(1),
            paying: None,
        }
    }

    /// Pays for up to `want` bytes (`want >= 1`): `Ready(Ok(n))` once `n`
    /// permits (`1 <= n <= chunk`) are spent, `Pending` while they are
    /// waited for. `n` may exceed `want` only when a payment started for a
    /// larger `want` is still under way (a write cancelled and retried with
    /// less); the caller keeps the surplus as credit.
    pub(crate) fn poll_pay(&mut self, cx: &mut Context<'_>, want: usize) -> Poll<io::Result<u32>> {
        debug_assert!(want >= 1);
        loop {
            if let Some((n, paying)) = &mut self.paying {
                let n = *n;
                let result = ready!(paying.as_mut().poll(cx));
                self.paying = None;
                match result {
                    Ok(()) => return Poll::Ready(Ok(n)),
                    Err(AcquireError::InsufficientCapacity) => self.shrink(n)?,
                    Err(error) => return Poll::Ready(Err(io_error(error))),
                }
            } else {
                let n = u32::try_from(want).unwrap_or(u32::MAX).min(self.chunk);
                let limiter = Arc::clone(&self.limiter);
                self.paying = Some((n, Box::pin(pay(limiter, n))));
            }
        }
    }

    /// `n` permits exceed the limiter's capacity: pay in halves from now on.
    fn shrink(&mut self, n: u32) -> io::Result<()> {
        if n <= 1 {
            return Err(io_error(AcquireError::InsufficientCapacity));
        }
        self.chunk = (n / 2).min(self.chunk);
        Ok(())
    }
}

impl<L> Meter<L> {
    pub(crate) fn limiter(&self) -> &L {
        &self.limiter
    }

    /// The most bytes one payment covers now.
    pub(crate) fn chunk(&self) -> u32 {
        self.chunk
    }
}

/// Spends `n` permits of `limiter`, waiting in its FIFO queue.
///
/// A leaky bucket's shaper refuses a chunk that does not fit in the bucket
/// now (`Overflow`, never parked); then the meter says exactly when it
/// will fit (`Limited { retry_after }`), and this sleeps until then and
/// asks again. Nothing is held while it sleeps, so dropping it is free.
async fn pay<L: Limiter + ?Sized>(limiter: Arc<L>, n: u32) -> Result<(), AcquireError> {
    match limiter.acquire_many(n).await {
        Err(AcquireError::Overflow) => loop {
            match limiter.try_acquire_many(n) {
                Ok(()) => return Ok(()),
                Err(TryAcquireError::Limited { retry_after }) => clock::sleep(retry_after).await,
                Err(TryAcquireError::InsufficientCapacity) => {
                    return Err(AcquireError::InsufficientCapacity);
                }
                Err(TryAcquireError::Closed) => return Err(AcquireError::Closed),
                Err(_) => return Err(AcquireError::Overflow),
            }
        },
        result => result,
    }
}

/// The I/O error for a limiter's refusal: the [`AcquireError`] inside
/// (`error.get_ref()` and `downcast_ref` find it), under the kind
/// [`io_error_kind`] gives.
pub(crate) fn io_error(error: AcquireError) -> io::Error {
    io::Error::new(super::io_error_kind(error), error)
}

impl<L> fmt::Debug for Meter<L> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Meter")
            .field("chunk", &self.chunk)
            .field("max_chunk", &self.max_chunk)
            .field("paying", &self.paying.as_ref().map(|(n, _)| *n))
            .finish_non_exhaustive()
    }
}
