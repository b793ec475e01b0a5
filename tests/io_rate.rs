//! Bandwidth (`io`): the long-run rate of a reader and a writer is the
//! configured one, to well within 0.01 %, at rates from 1 KiB/s to
//! 10 GiB/s, in paused time.
//!
//! Each run moves many seconds' worth of bytes (20 to 100 s of virtual
//! time) through a token bucket that starts full, from a reader that
//! makes bytes without writing them, or into a sink, and asserts the exact
//! time: the burst (the bucket's capacity) goes at once, the rest at the
//! rate, and the last payment is woken on the timer's next 1 ms tick. So
//! `elapsed = ceil_ms((bytes - burst) / rate)`, exactly: the error against
//! the ideal is below 1 ms however long the run (the runs end between two
//! ticks on purpose), less than 10⁻⁴ of any run above 10 s, and does not
//! grow with the run. Nothing else is rounded: a wait that oversleeps its
//! tick is credited to the next payment (the limiter's late-wake credit),
//! which the runs of many payments per tick (every rate from 1 MiB/s up)
//! depend on.
//!
//! A [`Rate`] is at most one permit per nanosecond (10⁹ a second, 0.93
//! GiB/s in bytes), so 1 GiB/s and 10 GiB/s count in permits of 1 KiB
//! (`bytes_per_permit(1024)`).

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWriteExt, ReadBuf};
use tokio::time::Instant;
use tokio_ratelimit::io::{RateLimitedRead, RateLimitedWrite};
use tokio_ratelimit::{Rate, TokenBucket};

const KIB: u64 = 1024;
const MIB: u64 = 1024 * KIB;
const GIB: u64 = 1024 * MIB;

/// A reader of `left` bytes that writes none of them: it hands back the
/// buffer it is given as it is (zeros, in the wrappers' buffers, which
/// start zeroed and are only ever filled by this), so that terabytes cost
/// no memory traffic.
struct Phantom {
    left: u64,
}

impl AsyncRead for Phantom {
    fn poll_read(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let n = usize::try_from(self.left)
            .unwrap_or(usize::MAX)
            .min(buf.remaining());
        buf.initialize_unfilled_to(n); // free when it is initialized already
        buf.advance(n);
        self.left -= n as u64;
        Poll::Ready(Ok(()))
    }
}

/// One configuration: `rate` bytes a second, counted in permits of `unit`
/// bytes, bursts of `burst` bytes, then `secs` seconds' worth of bytes and
/// `tail` bytes more (so that the end falls between two ticks); the
/// wrapper pays `chunk` bytes at a time and its caller moves `buffer`
/// bytes per call.
struct Run {
    rate: u64,
    unit: u64,
    burst: u64,
    secs: u64,
    tail: u64,
    chunk: u64,
    buffer: u64,
}

impl Run {
    fn limiter(&self) -> TokenBucket {
        let permits = u32::try_from(self.rate / self.unit).unwrap();
        let capacity = u32::try_from(self.burst / self.unit).unwrap();
        TokenBucket::builder()
            .rate(Rate::per_second(permits))
            .capacity(capacity)
            .build()
            .unwrap()
    }

    fn bytes(&self) -> u64 {
        self.burst + self.rate * self.secs + self.tail
    }

    /// The time to move `bytes()` is exactly the ideal, `bytes - burst`
    /// at the rate, rounded up to the timer's 1 ms tick; and that rounding
    /// is below 10⁻⁴ of the run.
    fn check(&self, what: &str, elapsed: Duration, limiter: &TokenBucket) {
        let ideal_ns = u128::from(self.bytes() - self.burst) * 1_000_000_000;
        let ideal_ns = ideal_ns.div_ceil(u128::from(self.rate));
        let expected_ms = ideal_ns.div_ceil(1_000_000);
        let expected = Duration::from_millis(u64::try_from(expected_ms).unwrap());
        assert_eq!(elapsed, expected, "{what} at {} B/s", self.rate);
        #[expect(clippy::cast_precision_loss, reason = "a ratio of nanoseconds")]
        let error = (expected_ms * 1_000_000 - ideal_ns) as f64 / ideal_ns as f64;
        assert!(error < 1e-4, "{what} at {} B/s: error {error}", self.rate);
        // Charged exactly the bytes moved, in whole permits.
        assert_eq!(
            limiter.stats().granted * self.unit,
            self.bytes(),
            "{what} at {} B/s",
            self.rate
        );
        assert_eq!(limiter.stats().refused, 0);
    }

    async fn read(&self) {
        let limiter = self.limiter();
        let mut reader = RateLimitedRead::with_max_chunk(
            u32::try_from(self.chunk).unwrap(),
            Phantom { left: self.bytes() },
            limiter.clone(),
        )
        .bytes_per_permit(u32::try_from(self.unit).unwrap());
        assert_eq!(u64::from(reader.chunk()), self.chunk);
        let start = Instant::now();
        let mut moved = 0;
        loop {
            // A caller reading `buffer` bytes at a time, without copying
            // them (`fill_buf` + `consume`, as `copy_buf` does).
            let n = reader.fill_buf().await.unwrap().len();
            if n == 0 {
                break;
            }
            let n = n.min(usize::try_from(self.buffer).unwrap());
            Pin::new(&mut reader).consume(n);
            moved += n as u64;
        }
        assert_eq!(moved, self.bytes());
        self.check("read", start.elapsed(), &limiter);
    }

    async fn write(&self) {
        let limiter = self.limiter();
        let mut writer = RateLimitedWrite::with_max_chunk(
            u32::try_from(self.chunk).unwrap(),
            tokio::io::sink(),
            limiter.clone(),
        )
        .bytes_per_permit(u32::try_from(self.unit).unwrap());
        let buffer = vec![0; usize::try_from(self.buffer).unwrap()];
        let start = Instant::now();
        let mut left = self.bytes();
        while left > 0 {
            let n = usize::try_from(left.min(self.buffer)).unwrap();
            writer.write_all(&buffer[..n]).await.unwrap();
            left -= n as u64;
        }
        assert_eq!(writer.credit(), 0);
        self.check("write", start.elapsed(), &limiter);
    }
}

#[tokio::test(start_paused = true)]
async fn one_kib_per_second() {
    // The bucket holds 1 KiB: chunks of 1 KiB, one a second.
    let run = Run {
        rate: KIB,
        unit: 1,
        burst: KIB,
        secs: 100,
        tail: 100,
        chunk: KIB,
        buffer: 8 * KIB,
    };
    run.read().await;
    run.write().await;
}

#[tokio::test(start_paused = true)]
async fn sixty_four_kib_per_second() {
    let run = Run {
        rate: 64 * KIB,
        unit: 1,
        burst: 16 * KIB,
        secs: 100,
        tail: 1000,
        chunk: 16 * KIB,
        buffer: 8 * KIB,
    };
    run.read().await;
    run.write().await;
}

#[tokio::test(start_paused = true)]
async fn one_mib_per_second() {
    // 64 chunks a second: several payments fall due in one tick.
    let run = Run {
        rate: MIB,
        unit: 1,
        burst: 64 * KIB,
        secs: 100,
        tail: 12_345,
        chunk: 16 * KIB,
        buffer: 64 * KIB,
    };
    run.read().await;
    run.write().await;
}

#[tokio::test(start_paused = true)]
async fn one_hundred_mib_per_second() {
    let run = Run {
        rate: 100 * MIB,
        unit: 1,
        burst: MIB,
        secs: 20,
        tail: 777_777,
        chunk: 64 * KIB,
        buffer: 64 * KIB,
    };
    run.read().await;
    run.write().await;
}

#[tokio::test(start_paused = true)]
async fn one_gib_per_second() {
    // Above 10⁹ B/s: permits of 1 KiB.
    let run = Run {
        rate: GIB,
        unit: KIB,
        burst: 16 * MIB,
        secs: 20,
        tail: 5 * KIB,
        chunk: MIB,
        buffer: 64 * KIB,
    };
    run.read().await;
    run.write().await;
}

#[tokio::test(start_paused = true)]
async fn ten_gib_per_second() {
    // 200 GiB in 20 virtual seconds, none of it in memory.
    let run = Run {
        rate: 10 * GIB,
        unit: KIB,
        burst: 64 * MIB,
        secs: 20,
        tail: 3 * KIB,
        chunk: MIB,
        buffer: MIB,
    };
    run.read().await;
    run.write().await;
}
