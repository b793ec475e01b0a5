//! `RateLimitedWrite`: an `AsyncWrite` that pays for the bytes it writes.

use std::fmt;
use std::io::{self, IoSlice};
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use pin_project_lite::pin_project;
use tokio::io::{AsyncBufRead, AsyncRead, AsyncWrite, ReadBuf};

use super::DEFAULT_MAX_CHUNK;
use super::meter::Meter;
use crate::Limiter;

/// The most slices one vectored write offers the writer underneath (the
/// rest wait for the next write, as they would after a short write).
const MAX_SLICES: usize = 64;

pin_project! {
    /// A writer whose bytes are paid for with a [`Limiter`]'s permits, one
    /// permit per byte: the writes go no faster than the limiter allows.
    ///
    /// A write pays *before* it writes (once bytes are handed to the writer
    /// underneath they are gone): for the smaller of the bytes offered and
    /// one chunk (see [the module docs](super#chunks)), and then offers
    /// the writer underneath at most what it paid for. When that writer
    /// takes fewer (a short write), the rest stays paid, as **credit** the
    /// next write spends first; so every byte paid for is written, except
    /// the credit left when the wrapper is dropped (less than one chunk plus
    /// one permit's bytes, as for a reader: see
    /// [the module docs](super#accounting)). A zero-length write passes
    /// through and costs nothing. Vectored writes are forwarded as such
    /// (what the writer underneath does with them, `is_write_vectored`
    /// says), held to the bytes paid for. Reads, if the writer underneath is also a reader,
    /// pass through unlimited.
    ///
    /// # Cancel safety
    ///
    /// A write that is dropped while it waits loses nothing: its payment
    /// goes on in the wrapper, and the next write spends it (any surplus
    /// over what that write offers is kept as credit). Dropping the wrapper
    /// (or [`into_inner`](Self::into_inner)) while it waits gives the
    /// permits of the payment in progress back to the limiter at once.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use tokio::io::AsyncWriteExt;
    /// use tokio::time::Instant;
    /// use tokio_ratelimit::{Rate, TokenBucket, io::RateLimitIoExt};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() -> std::io::Result<()> {
    /// // 1 KiB/s with bursts of 1 KiB.
    /// let bytes = TokenBucket::builder().rate(Rate::per_second(1024)).capacity(1024).build().unwrap();
    /// let mut writer = Vec::new().limited_write(bytes);
    /// let start = Instant::now();
    /// writer.write_all(&[7u8; 4096]).await?;
    /// assert_eq!(start.elapsed(), Duration::from_secs(3)); // the first KiB at once
    /// assert_eq!(writer.into_inner().len(), 4096);
    /// # Ok(())
    /// # }
    /// ```
    pub struct RateLimitedWrite<W, L> {
        #[pin]
        inner: W,
        meter: Meter<L>,
    }
}

impl<W, L: Limiter + 'static> RateLimitedWrite<W, L> {
    /// Limits `inner` by `limiter`, paying for at most
    /// [`DEFAULT_MAX_CHUNK`] bytes at a time (and at most the limiter's
    /// capacity).
    ///
    /// # Examples
    ///
    /// ```
    /// use tokio_ratelimit::{Rate, TokenBucket, io::RateLimitedWrite};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// let bytes = TokenBucket::builder().rate(Rate::per_second(1000)).capacity(100).build().unwrap();
    /// let writer = RateLimitedWrite::new(Vec::<u8>::new(), bytes);
    /// assert_eq!(writer.chunk(), 100); // held to the bucket's capacity
    /// # }
    /// ```
    pub fn new(inner: W, limiter: L) -> RateLimitedWrite<W, L> {
        RateLimitedWrite::with_max_chunk(DEFAULT_MAX_CHUNK, inner, limiter)
    }

    /// Limits `inner` by `limiter`, paying for at most `max_chunk` bytes at
    /// a time (and at most the limiter's capacity); `0` is taken as `1`.
    ///
    /// # Examples
    ///
    /// ```
    /// use tokio_ratelimit::{Rate, TokenBucket, io::RateLimitedWrite};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// let bytes = TokenBucket::builder().rate(Rate::per_second(1000)).capacity(1000).build().unwrap();
    /// let writer = RateLimitedWrite::with_max_chunk(256, Vec::<u8>::new(), bytes);
    /// assert_eq!(writer.chunk(), 256);
    /// # }
    /// ```
    pub fn with_max_chunk(max_chunk: u32, inner: W, limiter: L) -> RateLimitedWrite<W, L> {
        RateLimitedWrite {
            inner,
            meter: Meter::new(limiter, max_chunk),
        }
    }
}

impl<W, L> RateLimitedWrite<W, L> {
    /// The writer underneath.
    pub fn get_ref(&self) -> &W {
        &self.inner
    }

    /// The writer underneath. Writing to it directly bypasses the limit.
    pub fn get_mut(&mut self) -> &mut W {
        &mut self.inner
    }

    /// The writer underneath, pinned.
    pub fn get_pin_mut(self: Pin<&mut Self>) -> Pin<&mut W> {
        self.project().inner
    }

    /// The limiter.
    pub fn limiter(&self) -> &L {
        self.meter.limiter()
    }

    /// The most bytes paid for at a time: the `max_chunk` asked for, held
    /// to the limiter's capacity (times
    /// [`bytes_per_permit`](Self::bytes_per_permit)).
    pub fn chunk(&self) -> u32 {
        self.meter.chunk()
    }

    /// Makes each of the limiter's permits pay for `bytes` bytes (one by
    /// default; `0` is taken as `1`), for links faster than a
    /// [`Rate`](crate::Rate) can count in bytes (see
    /// [`RateLimitedRead::bytes_per_permit`](super::RateLimitedRead::bytes_per_permit)).
    /// A payment is rounded up to whole permits; what it paid for beyond
    /// the bytes written is [`credit`](Self::credit).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use tokio::io::AsyncWriteExt;
    /// use tokio::time::Instant;
    /// use tokio_ratelimit::{Rate, TokenBucket, io::RateLimitIoExt};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() -> std::io::Result<()> {
    /// // 1000 permits of 1 KiB a second, bursts of one.
    /// let kib = TokenBucket::builder().rate(Rate::per_second(1000)).capacity(1).build().unwrap();
    /// let mut writer = tokio::io::sink().limited_write(kib).bytes_per_permit(1024);
    /// let start = Instant::now();
    /// writer.write_all(&[0; 100]).await?; // one permit: 1024 bytes paid
    /// assert_eq!(writer.credit(), 924);
    /// writer.write_all(&[0; 2000]).await?; // 924 from the credit, then two permits
    /// assert_eq!(writer.credit(), 972);
    /// assert_eq!(start.elapsed(), Duration::from_millis(2));
    /// # Ok(())
    /// # }
    /// ```
    #[must_use]
    pub fn bytes_per_permit(mut self, bytes: u32) -> Self {
        self.meter.set_unit(bytes);
        self
    }

    /// Bytes paid for and not yet written (after a short write, or from a
    /// payment rounded up to whole permits); the next write spends them
    /// first.
    pub fn credit(&self) -> u64 {
        self.meter.credit()
    }

    /// The writer underneath. The permits of a payment in progress go back
    /// to the limiter; the [`credit`](Self::credit) is lost.
    pub fn into_inner(self) -> W {
        self.inner
    }
}

impl<W: AsyncWrite, L: Limiter + 'static> AsyncWrite for RateLimitedWrite<W, L> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.project();
        if buf.is_empty() {
            return this.inner.poll_write(cx, buf); // costs nothing
        }
        let credit = ready!(this.meter.poll_credit(cx, buf.len()))?;
        let offered = buf.len().min(usize::try_from(credit).unwrap_or(usize::MAX));
        let written = ready!(this.inner.poll_write(cx, &buf[..offered]))?;
        // `written <= offered <= credit` from any writer that keeps
        // `poll_write`'s contract; one that claims more is charged no more.
        this.meter.spend(written.min(offered));
        Poll::Ready(Ok(written))
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.project();
        let total = bufs.iter().fold(0usize, |n, b| n.saturating_add(b.len()));
        if total == 0 {
            return this.inner.poll_write_vectored(cx, bufs); // costs nothing
        }
        let credit = ready!(this.meter.poll_credit(cx, total))?;
        let offered = total.min(usize::try_from(credit).unwrap_or(usize::MAX));
        // The slices held to `offered` bytes: the whole ones that fit, then
        // the start of the next (at most `MAX_SLICES`, as a vectored write
        // may take fewer anyway).
        let mut held = [IoSlice::new(&[]); MAX_SLICES];
        let (mut count, mut left) = (0, offered);
        for buf in bufs.iter().filter(|b| !b.is_empty()).take(MAX_SLICES) {
            if left == 0 {
                break;
            }
            let take = buf.len().min(left);
            held[count] = IoSlice::new(&buf[..take]);
            count += 1;
            left -= take;
        }
        let offered = offered - left;
        let written = ready!(this.inner.poll_write_vectored(cx, &held[..count]))?;
        this.meter.spend(written.min(offered));
        Poll::Ready(Ok(written))
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.project().inner.poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.project().inner.poll_shutdown(cx)
    }
}

/// Reads pass through, unlimited.
impl<W: AsyncRead, L> AsyncRead for RateLimitedWrite<W, L> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        self.project().inner.poll_read(cx, buf)
    }
}

/// Reads pass through, unlimited.
impl<W: AsyncBufRead, L> AsyncBufRead for RateLimitedWrite<W, L> {
    fn poll_fill_buf(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<&[u8]>> {
        self.project().inner.poll_fill_buf(cx)
    }

    fn consume(self: Pin<&mut Self>, amt: usize) {
        self.project().inner.consume(amt);
    }
}

impl<W: fmt::Debug, L> fmt::Debug for RateLimitedWrite<W, L> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimitedWrite")
            .field("inner", &self.inner)
            .field("meter", &self.meter)
            .finish_non_exhaustive()
    }
}
