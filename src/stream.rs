//! Rate-limited streams: [`RateLimitStreamExt`] paces any
//! [`Stream`] by a [`Limiter`].
//!
//! * [`rate_limited`](RateLimitStreamExt::rate_limited) — one permit per
//!   item. It takes the permit *before* it pulls the next item: the stream
//!   underneath is not polled until the limiter allows another item, so
//!   the work of producing items (requests, queries) is paced too, not just
//!   their delivery. The permit is held (a [`Reservation`]) while the item
//!   is produced and spent when the item is yielded; if the stream ends
//!   instead, or the adapter is dropped, it is given back. One consequence:
//!   the end of the stream is seen only once a permit for a next item has
//!   come (as with `tokio_stream`'s `throttle`), so `collect` on five items
//!   at 10/s takes 500 ms, not 400 ms; `take(n)` does not poll past the
//!   `n`th item.
//! * [`rate_limited_by`](RateLimitStreamExt::rate_limited_by) — a weight
//!   per item (bytes, rows), from a closure. The weight is only known once
//!   the item is there, so it pulls the item *first*, then waits for its
//!   permits, then yields it.
//!
//! Both wait in FIFO order with every other user of the limiter (the
//! limiter is shared through an `Arc`; pass a clone of a handle, or an
//! `Arc<dyn Limiter>`).
//!
//! # Errors
//!
//! Items are `Result`s. `rate_limited` yields `Err(AcquireError)` when the
//! limiter refuses a permit; no item is pulled for it, so nothing is lost.
//! `rate_limited_by` yields `Err(Refused { error, item })`, handing the
//! item back (an item heavier than the limiter's capacity is refused with
//! `InsufficientCapacity` and never waits). After [`AcquireError::Closed`]
//! both streams end; after other errors (a leaky bucket's `Overflow`) they
//! go on with the next item.
//!
//! # Cancel safety
//!
//! Dropping either stream while it waits gives back what it had reserved,
//! at once: nothing is spent for an item that is not yielded. (An item
//! `rate_limited_by` had already pulled is dropped with it. A [`Limiter`]
//! of your own that keeps the trait's default `reserve` cannot give a
//! permit back: `rate_limited` then spends it when it is reserved.)

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures::Stream;
use pin_project_lite::pin_project;

use crate::{AcquireError, Limiter, Refused, Reservation};

type Waiting<T> = Pin<Box<dyn Future<Output = Result<T, AcquireError>> + Send>>;

/// Rate limits for every [`Stream`]: `use tokio_ratelimit::stream::RateLimitStreamExt`.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use futures::{StreamExt, stream};
/// use tokio::time::Instant;
/// use tokio_ratelimit::{Rate, TokenBucket, stream::RateLimitStreamExt};
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// let bucket = TokenBucket::builder().rate(Rate::per_second(10)).capacity(1).build().unwrap();
/// let start = Instant::now();
/// let items: Vec<u32> = stream::iter(1..)
///     .rate_limited(bucket)
///     .map(Result::unwrap)
///     .take(5)
///     .collect()
///     .await;
/// assert_eq!(items, [1, 2, 3, 4, 5]);
/// assert_eq!(start.elapsed(), Duration::from_millis(400)); // one at once, then 10/s
/// # }
/// ```
pub trait RateLimitStreamExt: Stream {
    /// Yields the items no faster than `limiter` allows, one permit per
    /// item, waiting for each permit before pulling the item.
    ///
    /// # Errors
    ///
    /// Yields `Err(AcquireError)` when the limiter refuses a permit (no
    /// item is pulled for it); the stream ends after
    /// [`AcquireError::Closed`].
    ///
    /// # Cancel safety
    ///
    /// Dropping the stream gives back the permit it waits for or holds.
    ///
    /// # Examples
    ///
    /// See [`RateLimitStreamExt`].
    fn rate_limited<L>(self, limiter: L) -> Throttled<Self>
    where
        Self: Sized,
        L: Limiter + 'static,
    {
        Throttled {
            stream: self,
            limiter: Arc::new(limiter),
            waiting: None,
            reservation: None,
            done: false,
        }
    }

    /// Yields the items no faster than `limiter` allows, `weight(&item)`
    /// permits per item: pulls an item, waits for its permits, yields it.
    /// A weight of 0 passes at once.
    ///
    /// # Errors
    ///
    /// Yields `Err(Refused { error, item })` with the item when the limiter
    /// refuses its permits — at once for a weight above the capacity
    /// ([`AcquireError::InsufficientCapacity`]); the stream ends after
    /// [`AcquireError::Closed`].
    ///
    /// # Cancel safety
    ///
    /// Dropping the stream while it waits gives the item's permits back
    /// (the item itself is dropped).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use futures::{StreamExt, stream};
    /// use tokio::time::Instant;
    /// use tokio_ratelimit::{Rate, TokenBucket, stream::RateLimitStreamExt};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// // 1000 bytes a second, bursts of up to 1000.
    /// let bytes = TokenBucket::builder().rate(Rate::per_second(1000)).capacity(1000).build().unwrap();
    /// let chunks = stream::iter([vec![0u8; 1000], vec![0u8; 500], vec![0u8; 250]]);
    /// let mut paced = chunks.rate_limited_by(bytes, |chunk| chunk.len() as u32);
    /// let start = Instant::now();
    /// while let Some(chunk) = paced.next().await {
    ///     let chunk = chunk.unwrap();
    ///     println!("{} bytes at {:?}", chunk.len(), start.elapsed());
    /// }
    /// assert_eq!(start.elapsed(), Duration::from_millis(750));
    /// # }
    /// ```
    fn rate_limited_by<L, F>(self, limiter: L, weight: F) -> ThrottledBy<Self, F>
    where
        Self: Sized,
        L: Limiter + 'static,
        F: FnMut(&Self::Item) -> u32,
    {
        ThrottledBy {
            stream: self,
            limiter: Arc::new(limiter),
            weight,
            waiting: None,
            done: false,
        }
    }
}

impl<St: Stream + ?Sized> RateLimitStreamExt for St {}

pin_project! {
    /// The stream [`rate_limited`](RateLimitStreamExt::rate_limited)
    /// returns: one permit per item.
    #[must_use = "streams do nothing unless polled"]
    pub struct Throttled<St> {
        #[pin]
        stream: St,
        limiter: Arc<dyn Limiter>,
        // The permit being waited for...
        waiting: Option<Waiting<Reservation>>,
        // ...or held while the item is produced.
        reservation: Option<Reservation>,
        done: bool,
    }
}

impl<St> Throttled<St> {
    /// The stream underneath.
    pub fn get_ref(&self) -> &St {
        &self.stream
    }

    /// The stream underneath, pinned.
    pub fn get_pin_mut(self: Pin<&mut Self>) -> Pin<&mut St> {
        self.project().stream
    }

    /// The stream underneath; a permit held for its next item is given
    /// back.
    pub fn into_inner(self) -> St {
        self.stream
    }
}

impl<St: Stream> Stream for Throttled<St> {
    type Item = Result<St::Item, AcquireError>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.project();
        if *this.done {
            return Poll::Ready(None);
        }
        if this.reservation.is_none() {
            let waiting = this.waiting.get_or_insert_with(|| {
                let limiter = Arc::clone(this.limiter);
                // `L`'s own method: through `Arc<L>`'s forwarding impl it
                // would box a second future.
                Box::pin(async move { (*limiter).reserve(1).await })
            });
            let reserved = std::task::ready!(waiting.as_mut().poll(cx));
            *this.waiting = None;
            match reserved {
                Ok(reservation) => *this.reservation = Some(reservation),
                Err(error) => {
                    *this.done = error == AcquireError::Closed;
                    return Poll::Ready(Some(Err(error)));
                }
            }
        }
        let Some(item) = std::task::ready!(this.stream.poll_next(cx)) else {
            *this.reservation = None; // given back: no item to spend it on
            *this.done = true;
            return Poll::Ready(None);
        };
        if let Some(reservation) = this.reservation.take() {
            reservation.commit();
        }
        Poll::Ready(Some(Ok(item)))
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        if self.done {
            return (0, Some(0));
        }
        // Errors are extra items.
        (self.stream.size_hint().0, None)
    }
}

impl<St: fmt::Debug> fmt::Debug for Throttled<St> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Throttled")
            .field("stream", &self.stream)
            .field("waiting", &self.waiting.is_some())
            .field("reservation", &self.reservation)
            .field("done", &self.done)
            .finish_non_exhaustive()
    }
}

pin_project! {
    /// The stream [`rate_limited_by`](RateLimitStreamExt::rate_limited_by)
    /// returns: a weight per item.
    #[must_use = "streams do nothing unless polled"]
    pub struct ThrottledBy<St: Stream, F> {
        #[pin]
        stream: St,
        limiter: Arc<dyn Limiter>,
        weight: F,
        // An item pulled, and the wait for its permits.
        waiting: Option<(St::Item, Waiting<()>)>,
        done: bool,
    }
}

impl<St: Stream, F> ThrottledBy<St, F> {
    /// The stream underneath.
    pub fn get_ref(&self) -> &St {
        &self.stream
    }

    /// The stream underneath, pinned.
    pub fn get_pin_mut(self: Pin<&mut Self>) -> Pin<&mut St> {
        self.project().stream
    }

    /// The stream underneath; an item pulled and waiting for its permits is
    /// dropped, and the permits given back.
    pub fn into_inner(self) -> St {
        self.stream
    }
}

impl<St, F> Stream for ThrottledBy<St, F>
where
    St: Stream,
    F: FnMut(&St::Item) -> u32,
{
    type Item = Result<St::Item, Refused<St::Item>>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.project();
        if *this.done {
            return Poll::Ready(None);
        }
        if this.waiting.is_none() {
            let Some(item) = std::task::ready!(this.stream.poll_next(cx)) else {
                *this.done = true;
                return Poll::Ready(None);
            };
            let n = (this.weight)(&item);
            let limiter = Arc::clone(this.limiter);
            *this.waiting = Some((
                item,
                Box::pin(async move { (*limiter).acquire_many(n).await }),
            ));
        }
        let (_, acquire) = this.waiting.as_mut().expect("set above");
        let granted = std::task::ready!(acquire.as_mut().poll(cx));
        let (item, _) = this.waiting.take().expect("set above");
        Poll::Ready(Some(match granted {
            Ok(()) => Ok(item),
            Err(error) => {
                *this.done = error == AcquireError::Closed;
                Err(Refused { error, item })
            }
        }))
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        if self.done {
            return (0, Some(0));
        }
        let pending = usize::from(self.waiting.is_some());
        let (lower, upper) = self.stream.size_hint();
        (
            lower.saturating_add(pending),
            upper.and_then(|u| u.checked_add(pending)),
        )
    }
}

impl<St, F> fmt::Debug for ThrottledBy<St, F>
where
    St: Stream + fmt::Debug,
    St::Item: fmt::Debug,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ThrottledBy")
            .field("stream", &self.stream)
            .field("waiting", &self.waiting.as_ref().map(|(item, _)| item))
            .field("done", &self.done)
            .finish_non_exhaustive()
    }
}
