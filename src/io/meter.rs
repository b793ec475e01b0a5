//! `Meter`: how a wrapper pays for its bytes, one chunk at a time.
//!
//! Words used here: a **permit** is the limiter's unit, worth `unit` bytes
//! (one by default); a **chunk** is the most bytes one payment covers; the
//! **credit** is bytes paid for and not yet spent on bytes read or
//! written.

use std::fmt;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use crate::{AcquireError, Limiter, TryAcquireError, clock};

/// A payment in progress: the permits of one chunk, being waited for.
type Paying = Pin<Box<dyn Future<Output = Result<(), AcquireError>> + Send>>;

/// The limiter of one wrapper, the size of its chunks, its credit, and the
/// chunk it is paying for.
///
/// Invariants: `unit >= 1`; `1 <= capacity`, the most permits one payment
/// asks for: the limiter's capacity as far as the meter knows it (its
/// bands' smallest capacity when [`Limiter::peek`] reports bands; else
/// learnt from `InsufficientCapacity`, halving); every byte spent was paid
/// for (`spent <= permits granted × unit`), and the credit is topped up
/// only once it is spent, so it stays below `chunk + unit`.
pub(crate) struct Meter<L> {
    limiter: Arc<L>,
    max_chunk: u32,
    unit: u32,
    capacity: u32,
    credit: u64,
    /// The permits being paid for and the wait for them. Dropping it (with
    /// the wrapper) gives the permits back.
    paying: Option<(u32, Paying)>,
}

impl<L: Limiter + 'static> Meter<L> {
    pub(crate) fn new(limiter: L, max_chunk: u32) -> Meter<L> {
        let capacity = limiter
            .peek(0)
            .and_then(|peek| peek.bands().map(|state| state.band.capacity()).min())
            .unwrap_or(u32::MAX);
        Meter {
            limiter: Arc::new(limiter),
            max_chunk: max_chunk.max(1),
            unit: 1,
            capacity: capacity.max(1),
            credit: 0,
            paying: None,
        }
    }

    /// Has bytes paid for, for up to `want` bytes (`want >= 1`):
    /// `Ready(Ok(credit))`, `credit >= 1`, at once while credit is left;
    /// else pays for the permits of `min(want, chunk)` bytes (rounded up to
    /// whole permits), `Pending` while they are waited for. The credit may
    /// exceed `want` (a permit of many bytes, or a payment started for a
    /// larger `want` that was cancelled and retried with less): the caller
    /// [`spend`](Self::spend)s what it uses, the rest stays.
    pub(crate) fn poll_credit(
        &mut self,
        cx: &mut Context<'_>,
        want: usize,
    ) -> Poll<io::Result<u64>> {
        debug_assert!(want >= 1);
        while self.credit == 0 {
            if let Some((permits, paying)) = &mut self.paying {
                let permits = *permits;
                let result = ready!(paying.as_mut().poll(cx));
                self.paying = None;
                match result {
                    Ok(()) => self.credit = u64::from(permits) * u64::from(self.unit),
                    Err(AcquireError::InsufficientCapacity) => self.shrink(permits)?,
                    Err(error) => return Poll::Ready(Err(io_error(error))),
                }
            } else {
                let bytes = u64::try_from(want)
                    .unwrap_or(u64::MAX)
                    .min(self.chunk().into());
                let permits = bytes.div_ceil(self.unit.into());
                let permits = u32::try_from(permits)
                    .unwrap_or(u32::MAX)
                    .clamp(1, self.capacity);
                let limiter = Arc::clone(&self.limiter);
                self.paying = Some((permits, Box::pin(pay(limiter, permits))));
            }
        }
        Poll::Ready(Ok(self.credit))
    }

    /// `permits` exceed the limiter's capacity: pay in halves from now on.
    fn shrink(&mut self, permits: u32) -> io::Result<()> {
        if permits <= 1 {
            return Err(io_error(AcquireError::InsufficientCapacity));
        }
        self.capacity = (permits / 2).min(self.capacity);
        Ok(())
    }
}

impl<L> Meter<L> {
    pub(crate) fn limiter(&self) -> &L {
        &self.limiter
    }

    /// Spends `bytes` of the credit (`bytes <= credit`, as
    /// [`poll_credit`](Self::poll_credit) returned it).
    pub(crate) fn spend(&mut self, bytes: usize) {
        let bytes = u64::try_from(bytes).unwrap_or(u64::MAX);
        debug_assert!(bytes <= self.credit, "spent more than was paid for");
        self.credit -= bytes.min(self.credit);
    }

    /// Bytes paid for and not yet spent.
    pub(crate) fn credit(&self) -> u64 {
        self.credit
    }

    /// The most bytes one payment covers now: `max_chunk`, held to the
    /// capacity's worth of bytes.
    pub(crate) fn chunk(&self) -> u32 {
        let capacity_bytes = u64::from(self.capacity) * u64::from(self.unit);
        u32::try_from(capacity_bytes.min(self.max_chunk.into())).unwrap_or(u32::MAX)
    }

    /// Bytes per permit.
    pub(crate) fn unit(&self) -> u32 {
        self.unit
    }

    /// Makes each permit worth `bytes` bytes (`0` is taken as `1`).
    pub(crate) fn set_unit(&mut self, bytes: u32) {
        self.unit = bytes.max(1);
    }
}

/// Spends `n` permits of `limiter`, waiting in its FIFO queue until they
/// fit ([`Limiter::acquire_room`]: for a leaky bucket, its queue rather
/// than its shaper, which would overflow).
///
/// A limiter of the caller's own whose `acquire_room` still answers
/// `Overflow` is asked again when its meter says the chunk will fit
/// (`Limited { retry_after }`), sleeping in between: that wait is outside
/// any queue, so such a limiter does not keep the arrival order. Nothing is
/// held while it sleeps, so dropping it is free.
async fn pay<L: Limiter + ?Sized>(limiter: Arc<L>, n: u32) -> Result<(), AcquireError> {
    // `L`'s own method: through `Arc<L>`'s forwarding impl it would box a
    // second future per payment.
    match (*limiter).acquire_room(n).await {
        Err(AcquireError::Overflow) => loop {
            match (*limiter).try_acquire_many(n) {
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
/// [`io_error_kind`](super::io_error_kind) gives.
pub(crate) fn io_error(error: AcquireError) -> io::Error {
    io::Error::new(super::io_error_kind(error), error)
}

impl<L> fmt::Debug for Meter<L> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Meter")
            .field("chunk", &self.chunk())
            .field("max_chunk", &self.max_chunk)
            .field("bytes_per_permit", &self.unit)
            .field("credit", &self.credit)
            .field("paying", &self.paying.as_ref().map(|(n, _)| *n))
            .finish_non_exhaustive()
    }
}
