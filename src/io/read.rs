//! `RateLimitedRead`: an `AsyncRead` (and `AsyncBufRead`) that pays for
//! the bytes it reads.

use std::fmt;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use pin_project_lite::pin_project;
use tokio::io::{AsyncBufRead, AsyncRead, AsyncWrite, ReadBuf};

use super::DEFAULT_MAX_CHUNK;
use super::meter::Meter;
use crate::Limiter;

/// The reader's first buffer, at most: grown by doubling after reads that
/// fill it, up to the chunk.
const INITIAL_BUFFER: usize = DEFAULT_MAX_CHUNK as usize;

pin_project! {
    /// A reader whose bytes are paid for with a [`Limiter`]'s permits, one
    /// permit per byte: the reads come no faster than the limiter allows.
    ///
    /// Each read from the reader underneath goes into the wrapper's buffer
    /// (at most one chunk, see [the module docs](super#chunks); the buffer
    /// starts at [`DEFAULT_MAX_CHUNK`](super::DEFAULT_MAX_CHUNK) bytes or
    /// one chunk, whichever is less, and doubles after each read that
    /// fills it, up to one chunk, so a large `max_chunk` costs memory only
    /// when the reader underneath delivers that much at once); the bytes
    /// it returned are then paid for, exactly as many as it returned, and
    /// handed out once paid. So an end of file, an error or a reader that
    /// never sends costs nothing, and a connection waits only for bytes it
    /// has actually received. Writes, if the reader underneath is also a
    /// writer, pass through unlimited (wrap it in a
    /// [`RateLimitedWrite`](super::RateLimitedWrite) too to limit them).
    ///
    /// Also an [`AsyncBufRead`]: `fill_buf` returns the paid part of the
    /// buffer.
    ///
    /// # Cancel safety
    ///
    /// A read that is dropped while it waits loses nothing: the bytes and
    /// the payment in progress stay in the wrapper and the next read goes
    /// on with them. Dropping the wrapper (or [`into_inner`](Self::into_inner))
    /// while it waits gives the permits of the payment in progress back to
    /// the limiter at once, and drops the bytes read and not yet handed out
    /// (at most one chunk; as tokio's `BufReader` does).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use tokio::io::AsyncReadExt;
    /// use tokio::time::Instant;
    /// use tokio_ratelimit::{Rate, TokenBucket, io::RateLimitIoExt};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() -> std::io::Result<()> {
    /// // 1 KiB/s with bursts of 1 KiB.
    /// let bytes = TokenBucket::builder().rate(Rate::per_second(1024)).capacity(1024).build().unwrap();
    /// let data = vec![7u8; 4096];
    /// let mut reader = data.as_slice().limited_read(bytes);
    /// let start = Instant::now();
    /// let mut out = Vec::new();
    /// reader.read_to_end(&mut out).await?;
    /// assert_eq!(out, data);
    /// assert_eq!(start.elapsed(), Duration::from_secs(3)); // the first KiB at once
    /// # Ok(())
    /// # }
    /// ```
    pub struct RateLimitedRead<R, L> {
        #[pin]
        inner: R,
        meter: Meter<L>,
        // Bytes read from `inner`: `buf[pos..paid]` paid and not yet handed
        // out, `buf[paid..filled]` not yet paid. `pos <= paid <= filled`.
        buf: Vec<u8>,
        pos: usize,
        paid: usize,
        filled: usize,
    }
}

impl<R, L: Limiter + 'static> RateLimitedRead<R, L> {
    /// Limits `inner` by `limiter`, in chunks of at most
    /// [`DEFAULT_MAX_CHUNK`] bytes (and at most the limiter's capacity).
    ///
    /// # Examples
    ///
    /// ```
    /// use tokio_ratelimit::{Rate, TokenBucket, io::RateLimitedRead};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// let bytes = TokenBucket::builder().rate(Rate::per_second(1000)).capacity(100).build().unwrap();
    /// let reader = RateLimitedRead::new(&b"hello"[..], bytes);
    /// assert_eq!(reader.chunk(), 100); // held to the bucket's capacity
    /// # }
    /// ```
    pub fn new(inner: R, limiter: L) -> RateLimitedRead<R, L> {
        RateLimitedRead::with_max_chunk(DEFAULT_MAX_CHUNK, inner, limiter)
    }

    /// Limits `inner` by `limiter`, reading and paying at most `max_chunk`
    /// bytes at a time (and at most the limiter's capacity); `0` is taken
    /// as `1`.
    ///
    /// # Examples
    ///
    /// ```
    /// use tokio_ratelimit::{Rate, TokenBucket, io::RateLimitedRead};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// let bytes = TokenBucket::builder().rate(Rate::per_second(1000)).capacity(1000).build().unwrap();
    /// let reader = RateLimitedRead::with_max_chunk(256, &b"hello"[..], bytes);
    /// assert_eq!(reader.chunk(), 256);
    /// # }
    /// ```
    pub fn with_max_chunk(max_chunk: u32, inner: R, limiter: L) -> RateLimitedRead<R, L> {
        RateLimitedRead {
            inner,
            meter: Meter::new(limiter, max_chunk),
            buf: Vec::new(),
            pos: 0,
            paid: 0,
            filled: 0,
        }
    }
}

impl<R, L> RateLimitedRead<R, L> {
    /// The reader underneath.
    pub fn get_ref(&self) -> &R {
        &self.inner
    }

    /// The reader underneath. Reading from it directly bypasses the limit
    /// and the bytes buffered here.
    pub fn get_mut(&mut self) -> &mut R {
        &mut self.inner
    }

    /// The reader underneath, pinned.
    pub fn get_pin_mut(self: Pin<&mut Self>) -> Pin<&mut R> {
        self.project().inner
    }

    /// The limiter.
    pub fn limiter(&self) -> &L {
        self.meter.limiter()
    }

    /// The most bytes read and paid for at a time: the `max_chunk` asked
    /// for, held to the limiter's capacity (times
    /// [`bytes_per_permit`](Self::bytes_per_permit)).
    pub fn chunk(&self) -> u32 {
        self.meter.chunk()
    }

    /// Makes each of the limiter's permits pay for `bytes` bytes (one by
    /// default; `0` is taken as `1`). A [`Rate`](crate::Rate) is at most one
    /// permit per nanosecond, 10⁹ a second (0.93 GiB/s at a byte a permit):
    /// a faster link counts in larger permits, kibibytes for instance. The
    /// bytes read are still charged exactly: a payment is rounded up to
    /// whole permits, and the bytes it paid for beyond those read are
    /// [`credit`](Self::credit) the next read spends first.
    ///
    /// # Examples
    ///
    /// 2 GiB/s, in permits of 1 KiB, with bursts of 1 MiB:
    ///
    /// ```
    /// use std::time::Duration;
    /// use tokio::io::AsyncReadExt;
    /// use tokio::time::Instant;
    /// use tokio_ratelimit::{Rate, TokenBucket, io::RateLimitIoExt};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() -> std::io::Result<()> {
    /// let kib = TokenBucket::builder().rate(Rate::per_second(2 << 20)).capacity(1024).build().unwrap();
    /// let mut reader = tokio::io::repeat(0).take(65 << 20).limited_read(kib).bytes_per_permit(1024);
    /// let start = Instant::now();
    /// let copied = tokio::io::copy_buf(&mut reader, &mut tokio::io::sink()).await?;
    /// assert_eq!(copied, 65 << 20);
    /// // 1 MiB at once, 64 MiB at 2 GiB/s.
    /// assert_eq!(start.elapsed(), Duration::from_millis(32));
    /// # Ok(())
    /// # }
    /// ```
    #[must_use]
    pub fn bytes_per_permit(mut self, bytes: u32) -> Self {
        self.meter.set_unit(bytes);
        self
    }

    /// Bytes paid for and not yet read, which the next read spends first:
    /// less than [`chunk`](Self::chunk) plus one permit's bytes, as for a
    /// writer (see [the module docs](super#accounting)); after a read,
    /// less than one permit's bytes (the payment for the bytes read,
    /// rounded up to whole permits).
    pub fn credit(&self) -> u64 {
        self.meter.credit()
    }

    /// The bytes read from the reader underneath and not yet handed out
    /// (paid for or not).
    pub fn buffered(&self) -> &[u8] {
        &self.buf[self.pos..self.filled]
    }

    /// The reader underneath. The permits of a payment in progress go back
    /// to the limiter; bytes still [`buffered`](Self::buffered) are dropped.
    pub fn into_inner(self) -> R {
        self.inner
    }
}

impl<R: AsyncRead, L: Limiter + 'static> AsyncBufRead for RateLimitedRead<R, L> {
    fn poll_fill_buf(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<&[u8]>> {
        let mut this = self.project();
        while *this.pos == *this.paid {
            if *this.paid < *this.filled {
                let unpaid = *this.filled - *this.paid;
                let credit = ready!(this.meter.poll_credit(cx, unpaid))?;
                let n = usize::try_from(credit).unwrap_or(usize::MAX).min(unpaid);
                this.meter.spend(n);
                *this.paid += n;
                continue;
            }
            // Everything read is handed out: read the next chunk. (The
            // buffer is empty here, so it can be made larger at no cost.)
            // It starts at `DEFAULT_MAX_CHUNK` at most and doubles, up to
            // the chunk, only after a read that filled it: its size follows
            // what the reader underneath delivers, not a `max_chunk` of
            // gigabytes that no read will ever fill.
            let chunk = this.meter.chunk() as usize;
            if this.buf.len() < chunk && *this.filled == this.buf.len() {
                // Grown in place (a large buffer is remapped, not copied):
                // only the new part is written, so the memory touched is
                // the final size, not the sum of every size on the way.
                let grown = (this.buf.len() * 2).max(INITIAL_BUFFER).min(chunk);
                this.buf.resize(grown, 0);
            }
            let len = chunk.min(this.buf.len());
            let mut read = ReadBuf::new(&mut this.buf[..len]);
            ready!(this.inner.as_mut().poll_read(cx, &mut read))?;
            let n = read.filled().len();
            (*this.pos, *this.paid, *this.filled) = (0, 0, n);
            if n == 0 {
                break; // end of file: nothing to pay
            }
        }
        Poll::Ready(Ok(&this.buf[*this.pos..*this.paid]))
    }

    fn consume(self: Pin<&mut Self>, amt: usize) {
        let this = self.project();
        *this.pos = (*this.pos + amt).min(*this.paid);
    }
}

impl<R: AsyncRead, L: Limiter + 'static> AsyncRead for RateLimitedRead<R, L> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if buf.remaining() == 0 {
            return Poll::Ready(Ok(())); // nothing asked, nothing paid
        }
        let paid = ready!(self.as_mut().poll_fill_buf(cx))?;
        let n = paid.len().min(buf.remaining());
        buf.put_slice(&paid[..n]);
        self.consume(n);
        Poll::Ready(Ok(()))
    }
}

/// Writes pass through, unlimited.
impl<R: AsyncWrite, L> AsyncWrite for RateLimitedRead<R, L> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.project().inner.poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.project().inner.poll_write_vectored(cx, bufs)
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

impl<R: fmt::Debug, L> fmt::Debug for RateLimitedRead<R, L> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimitedRead")
            .field("inner", &self.inner)
            .field("meter", &self.meter)
            .field("buffered", &(self.filled - self.pos))
            .field("paid", &(self.paid - self.pos))
            .field("bytes_per_permit", &self.meter.unit())
            .finish_non_exhaustive()
    }
}
