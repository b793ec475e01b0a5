//! Bandwidth: limit the bytes of any tokio [`AsyncRead`] or [`AsyncWrite`]
//! with any [`Limiter`], one permit per byte.
//!
//! * [`RateLimitedRead`] (also an [`AsyncBufRead`](tokio::io::AsyncBufRead))
//!   and [`RateLimitedWrite`] wrap a reader or a writer;
//!   [`RateLimitIoExt`] makes them (`reader.limited_read(limiter)`,
//!   `writer.limited_write(limiter)`).
//! * [`copy`] and [`copy_bidirectional`] are tokio's, under a limit (per
//!   direction).
//!
//! The limiter is any of the crate's: a [`TokenBucket`](crate::TokenBucket)
//! (bursts up to its capacity), a [`LeakyBucket`](crate::LeakyBucket) (no
//! burst), a [`Quota`](crate::Quota) of several bands (bytes per second
//! *and* per day), the limiter of one key of a
//! [`Keyed`](crate::keyed::Keyed) map, or an `Arc<dyn Limiter>` that
//! several connections share. Connections sharing a limiter wait in its one
//! FIFO queue, so each gets its turn in arrival order whatever the size of
//! its chunks: a payment is [`Limiter::acquire_room`], which for a leaky
//! bucket waits in the queue for room rather than overflowing its shaper.
//! (A [`Limiter`] of your own whose `acquire_room` answers `Overflow` is
//! asked again when its `try_acquire_many` says the chunk fits: outside any
//! queue, so smaller payments may overtake a larger one there.) A wrapper keeps the limiter in an `Arc` of
//! its own, so pass a handle (the crate's handles are cheap clones) or an
//! `Arc`, not a borrow.
//!
//! # Exact
//!
//! No refill period: a read or write waits exactly as long as its bytes
//! need (to the timer's 1 ms tick), and the long-run rate is the limiter's,
//! exactly, since the limiter credits a wait that oversleeps its tick to
//! the next one: moving `n` bytes through a bucket that starts full takes
//! `(n - capacity) / rate`, rounded up to the next tick, however long the
//! transfer (checked from 1 KiB/s to 10 GiB/s).
//!
//! # Faster than 10⁹ bytes a second
//!
//! A [`Rate`](crate::Rate) is at most one permit per nanosecond, 10⁹ a
//! second: at one permit per byte, 0.93 GiB/s. For a faster link, count in
//! larger permits: `bytes_per_permit(1024)` on either wrapper makes each
//! permit a kibibyte (up to 0.93 TiB/s), and the limiter's rate and
//! capacity are then in kibibytes. The bytes are still charged exactly: a
//! payment is rounded up to whole permits, and what it paid for beyond the
//! bytes moved is **credit** that the next read or write spends first.
//!
//! # Chunks
//!
//! Bytes are paid for in **chunks** of at most `max_chunk` bytes
//! ([`DEFAULT_MAX_CHUNK`], 16 KiB, unless set by `with_max_chunk`) and at
//! most the limiter's capacity (its smallest band's, read from
//! [`Limiter::peek`]; a limiter that does not report bands is learnt from
//! its `InsufficientCapacity` refusals, halving the chunk each time). So a
//! 1 MiB write into a bucket of 64 KiB is paid in pieces that fit, never
//! refused; and a stream of small reads does not cost a permit round per
//! read, since each read from the reader underneath takes up to one chunk.
//! Why 16 KiB: it is the largest TLS record and twice tokio's copy buffer,
//! so a chunk rarely splits one read or write of the layers around it,
//! while one payment per 16 KiB is cheap next to moving them. A chunk is
//! also the grain of the output: at 64 KiB/s, bytes come in pieces of up
//! to 16 KiB every 250 ms. For a smoother flow at low rates, choose a
//! smaller `max_chunk` (or a smaller capacity). The other way round, each
//! chunk that has to wait costs a timer wake (tens of microseconds of CPU
//! on a small VM): a transfer of many megabytes a second that need not be
//! smooth to the millisecond spends less CPU with a larger `max_chunk`.
//!
//! # Accounting
//!
//! * A read pays for the bytes the reader underneath returned, after it
//!   returned them and before they are handed out: an end of file, an
//!   error, or a connection that stays silent costs nothing.
//! * A write pays for one chunk before it writes (bytes handed to a writer
//!   are gone); a short write keeps the rest as credit for the next write,
//!   so a writer that takes 100 bytes at a time is charged 100 bytes at a
//!   time. Credit is lost with the wrapper.
//! * **Credit**, the bytes paid for and not yet read or written, is always
//!   less than one chunk plus one permit's bytes: `credit() < chunk() +
//!   bytes_per_permit()`, for both wrappers. (A payment covers at most one
//!   chunk, rounded up to whole permits, and is made only once the credit
//!   is spent.) A reader pays for bytes it already holds, so its credit
//!   after a read is below one permit's bytes; a writer's, after a short
//!   write, may be nearly a chunk.
//! * So, at any moment, the bytes handed out (read) or to the writer
//!   underneath (written) are at most the permits granted times the bytes
//!   per permit; the difference is the credit (and, for a reader, bytes
//!   paid for in its buffer that the caller has not taken yet).
//! * A zero-length read or write costs nothing.
//! * Backpressure is `Poll::Pending`: a wrapper waiting for permits is
//!   woken by the limiter when they come, never polled in a loop.
//!
//! # Errors
//!
//! A limiter's refusal is an [`io::Error`] with the [`AcquireError`]
//! inside (`error.get_ref()` and `downcast_ref::<AcquireError>()`), of the
//! kind [`io_error_kind`] gives: a limiter closed before or while a read or
//! write waits is [`ConnectionAborted`](io::ErrorKind::ConnectionAborted),
//! a limiter that cannot grant even one byte (capacity zero) is
//! [`InvalidInput`](io::ErrorKind::InvalidInput). Errors of the reader or
//! writer underneath pass through as they are.
//!
//! A limiter closed mid-transfer stops the payments, not the bytes already
//! paid for: a reader still hands out what it holds, a writer still writes
//! its credit (under a chunk), and only the next payment fails. [`copy`]
//! then returns the error, and the chunk its reader had read but not paid
//! for is lost with it (as on cancellation).
//!
//! # Streams of bytes
//!
//! A stream of byte chunks (`Vec<u8>`, `Bytes`, anything with a length)
//! needs no type of its own:
//! [`rate_limited_by`](crate::stream::RateLimitStreamExt::rate_limited_by)
//! pays for each chunk by its length, after pulling it and before yielding
//! it, in the limiter's FIFO queue:
//!
//! ```
//! use std::time::Duration;
//! use futures::{StreamExt, stream};
//! use tokio::time::Instant;
//! use tokio_ratelimit::{Rate, TokenBucket, stream::RateLimitStreamExt};
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() {
//! let bytes = TokenBucket::builder().rate(Rate::per_second(64 * 1024)).capacity(16 * 1024).build().unwrap();
//! let chunks = stream::iter((0..8).map(|_| vec![0u8; 16 * 1024]));
//! let start = Instant::now();
//! let paced: Vec<_> = chunks.rate_limited_by(bytes, |chunk| chunk.len() as u32).collect().await;
//! assert!(paced.iter().all(Result::is_ok));
//! assert_eq!(start.elapsed(), Duration::from_millis(1750)); // the first chunk at once
//! # }
//! ```
//!
//! It does not split a chunk: one larger than the limiter's capacity is
//! handed back refused (`InsufficientCapacity`), so give the bucket room
//! for the largest chunk. To split chunks, or to count in larger permits,
//! go through a reader: `tokio_util::io::StreamReader` turns the stream
//! into an `AsyncRead` for a [`RateLimitedRead`], and `ReaderStream` turns
//! that back into a stream.
//!
//! # Examples
//!
//! Two downloads sharing one budget of 64 KiB/s:
//!
//! ```
//! use std::sync::Arc;
//! use std::time::Duration;
//! use tokio::io::AsyncReadExt;
//! use tokio::time::Instant;
//! use tokio_ratelimit::{Limiter, Rate, TokenBucket, io::RateLimitIoExt};
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() -> std::io::Result<()> {
//! let kib = 1024;
//! let budget: Arc<dyn Limiter> = Arc::new(
//!     TokenBucket::builder().rate(Rate::per_second(64 * kib)).capacity(16 * kib).build().unwrap(),
//! );
//! let start = Instant::now();
//! let download = |budget: Arc<dyn Limiter>| async move {
//!     let body = vec![0u8; 128 * 1024];
//!     let mut out = Vec::new();
//!     body.as_slice().limited_read(budget).read_to_end(&mut out).await.map(|_| out.len())
//! };
//! let (a, b) = tokio::join!(download(budget.clone()), download(budget.clone()));
//! assert_eq!((a?, b?), (128 * 1024, 128 * 1024));
//! // 256 KiB: 16 KiB at once, then 240 KiB at 64 KiB/s.
//! assert_eq!(start.elapsed(), Duration::from_millis(3750));
//! # Ok(())
//! # }
//! ```

mod meter;
mod read;
mod write;

use std::io;

use tokio::io::{AsyncRead, AsyncWrite};

use crate::{AcquireError, Limiter};
pub use read::RateLimitedRead;
pub use write::RateLimitedWrite;

/// The chunk size when none is given: 16 KiB (see [Chunks](self#chunks)).
pub const DEFAULT_MAX_CHUNK: u32 = 16 * 1024;

/// The [`io::ErrorKind`] of the error a wrapper returns for a limiter's
/// refusal: `Closed` is [`ConnectionAborted`](io::ErrorKind::ConnectionAborted)
/// (no more can be paid for), `InsufficientCapacity` is
/// [`InvalidInput`](io::ErrorKind::InvalidInput) (the limiter cannot grant
/// one byte), anything else [`Other`](io::ErrorKind::Other).
///
/// # Examples
///
/// ```
/// use std::io::ErrorKind;
/// use tokio_ratelimit::{AcquireError, io::io_error_kind};
///
/// assert_eq!(io_error_kind(AcquireError::Closed), ErrorKind::ConnectionAborted);
/// ```
pub fn io_error_kind(error: AcquireError) -> io::ErrorKind {
    match error {
        AcquireError::Closed => io::ErrorKind::ConnectionAborted,
        AcquireError::InsufficientCapacity => io::ErrorKind::InvalidInput,
        _ => io::ErrorKind::Other,
    }
}

/// Rate limits for every tokio reader and writer:
/// `use tokio_ratelimit::io::RateLimitIoExt`.
///
/// Two names, not one `limited`: a socket is both a reader and a writer,
/// and each direction has its own limit.
///
/// # Examples
///
/// ```
/// use tokio::io::{AsyncReadExt, AsyncWriteExt};
/// use tokio_ratelimit::{Rate, TokenBucket, io::RateLimitIoExt};
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() -> std::io::Result<()> {
/// let down = TokenBucket::builder().rate(Rate::per_second(1 << 20)).capacity(1 << 16).build().unwrap();
/// let up = TokenBucket::builder().rate(Rate::per_second(1 << 16)).capacity(1 << 14).build().unwrap();
/// let (client, mut server) = tokio::io::duplex(1 << 16);
/// // Both directions of one connection, each with its own limit.
/// let mut client = client.limited_read(down).limited_write(up);
/// client.write_all(b"ping").await?;
/// let mut ping = [0; 4];
/// server.read_exact(&mut ping).await?;
/// server.write_all(b"pong").await?;
/// let mut pong = [0; 4];
/// client.read_exact(&mut pong).await?;
/// assert_eq!(&pong, b"pong");
/// # Ok(())
/// # }
/// ```
pub trait RateLimitIoExt {
    /// Limits the reads of `self` by `limiter`: see [`RateLimitedRead`].
    fn limited_read<L>(self, limiter: L) -> RateLimitedRead<Self, L>
    where
        Self: AsyncRead + Sized,
        L: Limiter + 'static,
    {
        RateLimitedRead::new(self, limiter)
    }

    /// Limits the writes of `self` by `limiter`: see [`RateLimitedWrite`].
    fn limited_write<L>(self, limiter: L) -> RateLimitedWrite<Self, L>
    where
        Self: AsyncWrite + Sized,
        L: Limiter + 'static,
    {
        RateLimitedWrite::new(self, limiter)
    }
}

impl<T: ?Sized> RateLimitIoExt for T {}

/// [`tokio::io::copy`] under a limit: copies `reader` to the end into
/// `writer`, the bytes paid for with `limiter`'s permits as they are read
/// (through a [`RateLimitedRead`] and tokio's `copy_buf`: no buffer beyond
/// the wrapper's chunk). Returns the bytes copied.
///
/// # Errors
///
/// The reader's or writer's errors, and the limiter's refusals (see [the
/// module docs](self#errors)).
///
/// # Cancel safety
///
/// Dropping the future gives the permits of the payment in progress back;
/// bytes read and not yet written are lost, as with tokio's `copy`.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use tokio::time::Instant;
/// use tokio_ratelimit::{Rate, TokenBucket, io};
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() -> std::io::Result<()> {
/// let bytes = TokenBucket::builder().rate(Rate::per_second(1000)).capacity(500).build().unwrap();
/// let start = Instant::now();
/// let mut out = Vec::new();
/// assert_eq!(io::copy(&mut &[1u8; 2500][..], &mut out, bytes).await?, 2500);
/// assert_eq!(start.elapsed(), Duration::from_secs(2)); // 500 at once, then 1000/s
/// # Ok(())
/// # }
/// ```
pub async fn copy<R, W, L>(reader: &mut R, writer: &mut W, limiter: L) -> io::Result<u64>
where
    R: AsyncRead + Unpin + ?Sized,
    W: AsyncWrite + Unpin + ?Sized,
    L: Limiter + 'static,
{
    let mut paced = RateLimitedRead::new(reader, limiter);
    tokio::io::copy_buf(&mut paced, writer).await
}

/// [`tokio::io::copy_bidirectional`] under a limit per direction: the
/// bytes read from `a` (and written to `b`) are paid for with
/// `a_to_b`'s permits, those from `b` to `a` with `b_to_a`'s. Returns the
/// bytes copied each way, `(a to b, b to a)`.
///
/// # Errors
///
/// As [`tokio::io::copy_bidirectional`], and the limiters' refusals (see
/// [the module docs](self#errors)).
///
/// # Cancel safety
///
/// As [`copy`].
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use tokio::io::{AsyncReadExt, AsyncWriteExt};
/// use tokio::time::Instant;
/// use tokio_ratelimit::{Rate, TokenBucket, io};
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() -> std::io::Result<()> {
/// let up = TokenBucket::builder().rate(Rate::per_second(1000)).capacity(1000).build().unwrap();
/// let down = TokenBucket::builder().rate(Rate::per_second(500)).capacity(500).build().unwrap();
/// let (mut client, mut proxy_client) = tokio::io::duplex(4096);
/// let (mut proxy_server, mut server) = tokio::io::duplex(4096);
/// let start = Instant::now();
/// let proxy = tokio::spawn(async move {
///     io::copy_bidirectional(&mut proxy_client, &mut proxy_server, up, down).await
/// });
/// client.write_all(&[1; 2000]).await?;
/// client.shutdown().await?;
/// server.write_all(&[2; 1000]).await?;
/// server.shutdown().await?;
/// let (mut at_server, mut at_client) = (Vec::new(), Vec::new());
/// server.read_to_end(&mut at_server).await?;
/// client.read_to_end(&mut at_client).await?;
/// assert_eq!(proxy.await.unwrap()?, (2000, 1000));
/// assert_eq!(start.elapsed(), Duration::from_secs(1)); // each way: one burst, then 1 s
/// # Ok(())
/// # }
/// ```
pub async fn copy_bidirectional<A, B, L1, L2>(
    a: &mut A,
    b: &mut B,
    a_to_b: L1,
    b_to_a: L2,
) -> io::Result<(u64, u64)>
where
    A: AsyncRead + AsyncWrite + Unpin + ?Sized,
    B: AsyncRead + AsyncWrite + Unpin + ?Sized,
    L1: Limiter + 'static,
    L2: Limiter + 'static,
{
    // Each side's reads are limited, its writes pass through.
    let mut a = RateLimitedRead::new(a, a_to_b);
    let mut b = RateLimitedRead::new(b, b_to_a);
    tokio::io::copy_bidirectional(&mut a, &mut b).await
}
