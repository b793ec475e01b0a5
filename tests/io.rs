//! Bandwidth (`io`): the reader and writer wrappers in paused time, at
//! exact instants: throughput, bursts, what is charged (short writes,
//! zero-length calls, end of file, errors), cancellation, sharing, quotas,
//! a keyed limiter's key, funnels and smooth limiters, closing, and
//! limiters that cannot grant a chunk.

use std::collections::VecDeque;
use std::io::{self, ErrorKind};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use async_trait::async_trait;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::time::{self, Instant};
use tokio_ratelimit::io::{self as rio, RateLimitIoExt, RateLimitedRead, RateLimitedWrite};
use tokio_ratelimit::keyed::Keyed;
use tokio_ratelimit::{
    AcquireError, ConfigError, Funnel, LeakyBucket, Limiter, Quota, Rate, Reservation,
    SmoothBursty, TokenBucket, TryAcquireError,
};
use tokio_test::{assert_pending, assert_ready, task};

const KIB: u32 = 1024;
const MIB: u32 = 1024 * 1024;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// `rate` bytes a second, bursts of `capacity`; starts full.
fn bytes(rate: u32, capacity: u32) -> TokenBucket {
    TokenBucket::builder()
        .rate(Rate::per_second(rate))
        .capacity(capacity)
        .build()
        .unwrap()
}

/// What a [`Script`] reader does at each read.
enum Step {
    Data(Vec<u8>),
    Error(ErrorKind),
}

/// A reader that plays its steps, then reports the end of file; counts the
/// reads it was asked for.
struct Script {
    steps: VecDeque<Step>,
    polls: usize,
}

impl Script {
    fn new(steps: impl IntoIterator<Item = Step>) -> Script {
        Script {
            steps: steps.into_iter().collect(),
            polls: 0,
        }
    }
}

impl AsyncRead for Script {
    fn poll_read(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        self.polls += 1;
        match self.steps.pop_front() {
            None => Poll::Ready(Ok(())),
            Some(Step::Error(kind)) => Poll::Ready(Err(kind.into())),
            Some(Step::Data(mut data)) => {
                let n = data.len().min(buf.remaining());
                buf.put_slice(&data[..n]);
                if n < data.len() {
                    self.steps.push_front(Step::Data(data.split_off(n)));
                }
                Poll::Ready(Ok(()))
            }
        }
    }
}

/// A writer that takes at most `max` bytes per write.
struct Trickle {
    max: usize,
    written: Vec<u8>,
    writes: usize,
}

impl AsyncWrite for Trickle {
    fn poll_write(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let n = buf.len().min(self.max);
        self.written.extend_from_slice(&buf[..n]);
        self.writes += 1;
        Poll::Ready(Ok(n))
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

#[tokio::test(start_paused = true)]
async fn one_mib_is_read_at_64_kib_per_second_exactly() {
    // No burst to speak of: the first chunk (16 KiB) is free, the other
    // 1008 KiB take 1008/64 s = 15.75 s.
    let limiter = bytes(64 * KIB, 16 * KIB);
    let mut reader = tokio::io::repeat(7)
        .take(MIB.into())
        .limited_read(limiter.clone());
    assert_eq!(reader.chunk(), 16 * KIB);
    let start = Instant::now();
    let mut out = Vec::new();
    assert_eq!(reader.read_to_end(&mut out).await.unwrap(), MIB as usize);
    assert_eq!(start.elapsed(), ms(15_750));
    // Charged exactly the bytes read: the end of file cost nothing; and
    // never asked for more than fits (no refusal to learn from).
    assert_eq!(limiter.stats().granted, u64::from(MIB));
    assert_eq!(limiter.stats().refused, 0);
}

#[tokio::test(start_paused = true)]
async fn one_mib_is_written_at_64_kib_per_second_exactly() {
    let limiter = bytes(64 * KIB, 16 * KIB);
    let mut writer = tokio::io::sink().limited_write(limiter.clone());
    let start = Instant::now();
    writer.write_all(&vec![7; MIB as usize]).await.unwrap();
    assert_eq!(start.elapsed(), ms(15_750));
    assert_eq!(limiter.stats().granted, u64::from(MIB));
    assert_eq!(limiter.stats().refused, 0);
    assert_eq!(writer.credit(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_burst_goes_through_at_once_then_the_rate() {
    // 64 KiB of burst, in chunks of 16 KiB: four chunks at once, then one
    // every 250 ms.
    let limiter = bytes(64 * KIB, 64 * KIB);
    let mut reader = tokio::io::repeat(1).limited_read(limiter);
    assert_eq!(reader.chunk(), 16 * KIB);
    let start = Instant::now();
    let mut buf = vec![0; 16 * KIB as usize];
    let mut at = Vec::new();
    for _ in 0..7 {
        reader.read_exact(&mut buf).await.unwrap();
        at.push(start.elapsed());
    }
    assert_eq!(at, [ms(0), ms(0), ms(0), ms(0), ms(250), ms(500), ms(750)]);
}

#[tokio::test(start_paused = true)]
async fn io_copy_takes_the_computed_time() {
    let limiter = bytes(64 * KIB, 64 * KIB);
    let start = Instant::now();
    let mut source = tokio::io::repeat(3).take(MIB.into());
    let copied = rio::copy(&mut source, &mut tokio::io::sink(), limiter.clone())
        .await
        .unwrap();
    assert_eq!(copied, u64::from(MIB));
    // 64 KiB at once, 960 KiB at 64 KiB/s.
    assert_eq!(start.elapsed(), ms(15_000));
    assert_eq!(limiter.stats().granted, u64::from(MIB));
}

#[tokio::test(start_paused = true)]
async fn a_short_write_charges_only_what_was_written() {
    // The writer takes 100 bytes at a time; the wrapper pays 1000 (one
    // chunk) and spends it over ten writes.
    let limiter = bytes(1000, 1000);
    let trickle = Trickle {
        max: 100,
        written: Vec::new(),
        writes: 0,
    };
    let mut writer = trickle.limited_write(limiter.clone());
    assert_eq!(writer.write(&[1; 1000]).await.unwrap(), 100);
    assert_eq!((writer.credit(), limiter.available()), (900, 0));
    // The credit is spent before anything more is paid: no wait.
    let start = Instant::now();
    assert_eq!(writer.write(&[2; 50]).await.unwrap(), 50);
    assert_eq!(writer.credit(), 850);
    writer.write_all(&[3; 2350]).await.unwrap();
    // 2500 bytes in all: 1000 at once, 1500 at 1000/s.
    assert_eq!(start.elapsed(), ms(1500));
    assert_eq!(limiter.stats().granted, 2500);
    assert_eq!(writer.credit(), 0);
    let trickle = writer.into_inner();
    assert_eq!(trickle.written.len(), 2500);
    assert_eq!(trickle.writes, 26); // 10, 1, then 24
}

#[tokio::test(start_paused = true)]
async fn zero_length_reads_and_writes_cost_nothing() {
    let limiter = bytes(1000, 1000);
    limiter.try_acquire_many(1000).unwrap(); // empty: anything paid would wait
    let mut reader = Script::new([Step::Data(vec![1; 10])]).limited_read(limiter.clone());
    let mut read = task::spawn(reader.read(&mut []));
    assert_eq!(assert_ready!(read.poll()).unwrap(), 0);
    drop(read);
    assert_eq!(reader.get_ref().polls, 0); // the reader underneath was not asked
    let mut writer = tokio::io::sink().limited_write(limiter.clone());
    let mut write = task::spawn(writer.write(&[]));
    assert_eq!(assert_ready!(write.poll()).unwrap(), 0);
    drop(write);
    assert_eq!(limiter.stats().granted, 1000);
    assert_eq!(limiter.stats().waiting, 0);
    // An empty reader: the end of file is free too.
    let mut empty = Script::new([]).limited_read(limiter.clone());
    let mut out = Vec::new();
    let mut read = task::spawn(empty.read_to_end(&mut out));
    assert_eq!(assert_ready!(read.poll()).unwrap(), 0);
    drop(read);
    assert_eq!(limiter.stats().granted, 1000);
}

#[tokio::test(start_paused = true)]
async fn the_end_of_file_while_bytes_wait_costs_nothing() {
    // The other end sends 1500 bytes and hangs up at once; the reader gets
    // them as they are paid (500 at once, then 500/s), and the end right
    // after the last, for nothing.
    let limiter = bytes(500, 500);
    let (mut far, near) = tokio::io::duplex(4096);
    far.write_all(&[9; 1500]).await.unwrap();
    drop(far);
    let mut reader = near.limited_read(limiter.clone());
    let start = Instant::now();
    let mut buf = [0; 4096];
    let mut got = Vec::new();
    loop {
        let n = reader.read(&mut buf).await.unwrap();
        got.push((n, start.elapsed()));
        if n == 0 {
            break;
        }
    }
    assert_eq!(
        got,
        [
            (500, ms(0)),
            (500, ms(1000)),
            (500, ms(2000)),
            (0, ms(2000))
        ]
    );
    assert_eq!(limiter.stats().granted, 1500);
    assert_eq!(limiter.stats().waiting, 0);
}

#[tokio::test(start_paused = true)]
async fn an_error_of_the_reader_underneath_is_passed_on_after_the_bytes_before_it() {
    let limiter = bytes(1000, 1000);
    let script = Script::new([
        Step::Data(vec![1; 1500]),
        Step::Error(ErrorKind::ConnectionReset),
        Step::Data(vec![2; 10]),
    ]);
    let mut reader = RateLimitedRead::new(script, limiter.clone());
    let start = Instant::now();
    let mut buf = [0; 1500];
    assert_eq!(reader.read(&mut buf).await.unwrap(), 1000);
    assert_eq!(reader.read(&mut buf).await.unwrap(), 500);
    assert_eq!(start.elapsed(), ms(500));
    let error = reader.read(&mut buf).await.unwrap_err();
    assert_eq!(error.kind(), ErrorKind::ConnectionReset);
    assert_eq!(start.elapsed(), ms(500)); // the error waits for nothing
    assert_eq!(limiter.stats().granted, 1500); // and costs nothing
    // The reader goes on after it, if the reader underneath does.
    assert_eq!(reader.read(&mut buf).await.unwrap(), 10);
    assert_eq!(start.elapsed(), ms(510));
}

#[tokio::test(start_paused = true)]
async fn an_error_of_the_writer_underneath_keeps_the_credit() {
    struct Failing(bool);
    impl AsyncWrite for Failing {
        fn poll_write(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<io::Result<usize>> {
            if std::mem::take(&mut self.0) {
                return Poll::Ready(Err(ErrorKind::BrokenPipe.into()));
            }
            Poll::Ready(Ok(buf.len()))
        }
        fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }
        fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }
    }
    let limiter = bytes(1000, 1000);
    let mut writer = Failing(true).limited_write(limiter.clone());
    let error = writer.write(&[0; 600]).await.unwrap_err();
    assert_eq!(error.kind(), ErrorKind::BrokenPipe);
    assert_eq!(writer.credit(), 600); // paid, not written: kept
    assert_eq!(writer.write(&[0; 600]).await.unwrap(), 600);
    assert_eq!(limiter.stats().granted, 600);
}

#[tokio::test(start_paused = true)]
async fn a_cancelled_read_loses_nothing_and_a_dropped_reader_gives_its_payment_back() {
    let limiter: Arc<dyn Limiter> = Arc::new(bytes(1000, 1000));
    limiter.try_acquire_many(1000).unwrap();
    let start = Instant::now();

    // A reads 1000 bytes and waits for them (due at 1 s).
    let mut a = Script::new([Step::Data(vec![1; 1000])]).limited_read(Arc::clone(&limiter));
    let mut buf = [0; 1000];
    let mut read = task::spawn(a.read(&mut buf));
    assert_pending!(read.poll());
    // The read is dropped (a timeout, a `select!`): the bytes and the
    // payment stay in the wrapper; the next read gets them on time.
    time::advance(ms(500)).await;
    drop(read);
    let mut read = task::spawn(a.read(&mut buf));
    assert_pending!(read.poll());
    time::advance(ms(500)).await;
    assert_eq!(assert_ready!(read.poll()).unwrap(), 1000);
    drop(read);
    assert_eq!(start.elapsed(), ms(1000));
    assert_eq!(a.get_ref().polls, 1);

    // Now A waits again (due at 2 s), B behind it (due at 3 s).
    let mut a = Script::new([Step::Data(vec![2; 1000])]).limited_read(Arc::clone(&limiter));
    let mut b = Script::new([Step::Data(vec![3; 1000])]).limited_read(Arc::clone(&limiter));
    let mut read_a = task::spawn(async move {
        let mut buf = [0; 1000];
        a.read(&mut buf).await
    });
    let mut read_b = task::spawn(async move {
        let mut buf = [0; 1000];
        b.read(&mut buf).await
    });
    assert_pending!(read_a.poll());
    assert_pending!(read_b.poll());
    time::advance(ms(500)).await;
    // A's task ends, wrapper and all: its permits go back, B moves up.
    drop(read_a);
    time::advance(ms(499)).await;
    assert_pending!(read_b.poll());
    time::advance(ms(1)).await;
    assert!(read_b.is_woken());
    assert_eq!(assert_ready!(read_b.poll()).unwrap(), 1000);
    assert_eq!(start.elapsed(), ms(2000));
    assert_eq!(limiter.stats().granted, 3000);
}

#[tokio::test(start_paused = true)]
async fn a_dropped_writer_gives_its_payment_back() {
    let limiter = bytes(1000, 1000);
    limiter.try_acquire_many(1000).unwrap();
    let mut writer = tokio::io::sink().limited_write(limiter.clone());
    let mut write = task::spawn(async move { writer.write(&[0; 800]).await });
    assert_pending!(write.poll());
    assert_eq!(limiter.stats().waiting, 1);
    time::advance(ms(300)).await;
    drop(write);
    assert_eq!(limiter.stats().waiting, 0);
    // 300 ms of refill, none of it reserved any more.
    assert_eq!(limiter.available(), 300);
}

#[tokio::test(start_paused = true)]
async fn wrappers_sharing_a_limiter_take_turns() {
    // Two downloads on one budget of 1000 B/s in chunks of 100: FIFO, so
    // they alternate chunks. A takes the burst and queues first (due at
    // 100 ms), B queues behind it (200 ms), and so on.
    let limiter: Arc<dyn Limiter> = Arc::new(bytes(1000, 100));
    let start = Instant::now();
    let download = |limiter: Arc<dyn Limiter>| async move {
        let mut reader = tokio::io::repeat(0).limited_read(limiter);
        let mut buf = [0; 100];
        let mut at = Vec::new();
        for _ in 0..5 {
            reader.read_exact(&mut buf).await.unwrap();
            at.push(start.elapsed());
        }
        at
    };
    let (a, b) = tokio::join!(
        download(Arc::clone(&limiter)),
        download(Arc::clone(&limiter))
    );
    assert_eq!(a, [ms(0), ms(100), ms(300), ms(500), ms(700)]);
    assert_eq!(b, [ms(200), ms(400), ms(600), ms(800), ms(900)]);
}

#[tokio::test(start_paused = true)]
async fn a_quota_of_two_bands_holds_both() {
    // 1000 B/s with bursts of 1000, and 5000 B a day.
    let quota = Quota::new(Rate::per_second(1000), 1000).and(Rate::per_day(5000), 5000);
    let limiter = TokenBucket::builder().quota(quota).build().unwrap();
    let mut reader = tokio::io::repeat(0).limited_read(limiter.clone());
    assert_eq!(reader.chunk(), 1000); // the smallest band's capacity
    let start = Instant::now();
    let mut buf = [0; 1000];
    let mut at = Vec::new();
    for _ in 0..6 {
        reader.read_exact(&mut buf).await.unwrap();
        at.push(start.elapsed());
    }
    // Per second until the day's 5000 are spent; the 6000th byte is due
    // when the day band has refilled 1000: 1000 / (5000 per 86 400 s).
    let s = Duration::from_secs;
    assert_eq!(at, [s(0), s(1), s(2), s(3), s(4), s(17_280)]);
}

#[tokio::test(start_paused = true)]
async fn a_leaky_bucket_shapes_without_overflowing() {
    // The shaper refuses a chunk that does not fit (Overflow); the wrapper
    // then waits for the exact instant it fits, instead of failing.
    let limiter = LeakyBucket::builder()
        .rate(Rate::per_second(1000))
        .capacity(1000)
        .build()
        .unwrap();
    let mut writer = tokio::io::sink().limited_write(limiter.clone());
    let start = Instant::now();
    writer.write_all(&[0; 5000]).await.unwrap();
    assert_eq!(start.elapsed(), ms(4000));
}

#[tokio::test(start_paused = true)]
async fn closing_the_limiter_fails_a_waiting_read_and_write() {
    let limiter = bytes(1000, 1000);
    limiter.try_acquire_many(1000).unwrap();
    let mut reader = Script::new([Step::Data(vec![1; 500])]).limited_read(limiter.clone());
    let mut writer = tokio::io::sink().limited_write(limiter.clone());
    let mut buf = [0; 500];
    let mut read = task::spawn(reader.read(&mut buf));
    let mut write = task::spawn(writer.write(&[0; 500]));
    assert_pending!(read.poll());
    assert_pending!(write.poll());
    time::advance(ms(100)).await;
    limiter.close();
    for error in [
        assert_ready!(read.poll()).unwrap_err(),
        assert_ready!(write.poll()).map(|_| ()).unwrap_err(),
    ] {
        assert_eq!(error.kind(), ErrorKind::ConnectionAborted);
        let cause = error
            .get_ref()
            .and_then(|e| e.downcast_ref::<AcquireError>());
        assert_eq!(cause, Some(&AcquireError::Closed));
    }
    // And every later call, at once.
    drop((read, write));
    let error = writer.write(&[0; 10]).await.unwrap_err();
    assert_eq!(error.kind(), ErrorKind::ConnectionAborted);
}

/// A limiter of capacity `capacity` that does not say so: forwards
/// everything but `peek` to a token bucket.
struct Silent {
    bucket: TokenBucket,
    capacity: u32,
}

#[async_trait]
impl Limiter for Silent {
    async fn acquire_many(&self, n: u32) -> Result<(), AcquireError> {
        if n > self.capacity {
            return Err(AcquireError::InsufficientCapacity);
        }
        self.bucket.acquire_many(n).await
    }
    fn try_acquire_many(&self, n: u32) -> Result<(), TryAcquireError> {
        if n > self.capacity {
            return Err(TryAcquireError::InsufficientCapacity);
        }
        self.bucket.try_acquire_many(n)
    }
    async fn acquire_timeout(&self, n: u32, timeout: Duration) -> Result<(), AcquireError> {
        self.bucket.acquire_timeout(n, timeout).await
    }
    async fn reserve(&self, n: u32) -> Result<Reservation, AcquireError> {
        self.bucket.reserve(n).await
    }
}

#[tokio::test(start_paused = true)]
async fn a_chunk_larger_than_the_capacity_is_split_to_fit() {
    // Asked for 1 MiB chunks; the bucket holds 1000: chunks of 1000.
    let limiter = bytes(1000, 1000);
    let mut writer = RateLimitedWrite::with_max_chunk(MIB, tokio::io::sink(), limiter.clone());
    assert_eq!(writer.chunk(), 1000);
    let start = Instant::now();
    writer.write_all(&[0; 3000]).await.unwrap();
    assert_eq!(start.elapsed(), ms(2000));

    // A limiter that does not report its capacity (600) is learnt from its
    // refusals: the first request (3048, all that was offered) halved to
    // 1524, 762, then 381, which fits.
    let silent = Silent {
        bucket: bytes(1000, 1000),
        capacity: 600,
    };
    let mut writer = tokio::io::sink().limited_write(silent);
    assert_eq!(writer.chunk(), 16 * KIB);
    let start = Instant::now();
    writer.write_all(&[0; 3048]).await.unwrap();
    assert_eq!(writer.chunk(), 381);
    assert_eq!(start.elapsed(), ms(2048));
    assert_eq!(writer.limiter().bucket.stats().granted, 3048);
}

#[tokio::test(start_paused = true)]
async fn a_limiter_that_grants_nothing_is_invalid_input() {
    let zero = Silent {
        bucket: bytes(1000, 1000),
        capacity: 0,
    };
    let mut reader = Script::new([Step::Data(vec![1; 10])]).limited_read(zero);
    let error = reader.read(&mut [0; 10]).await.unwrap_err();
    assert_eq!(error.kind(), ErrorKind::InvalidInput);
    assert_eq!(
        error
            .get_ref()
            .and_then(|e| e.downcast_ref::<AcquireError>()),
        Some(&AcquireError::InsufficientCapacity)
    );
    // The crate's limiters refuse a zero capacity and a zero rate when built.
    let built = TokenBucket::builder()
        .rate(Rate::per_second(1000))
        .capacity(0)
        .build();
    assert_eq!(built.err(), Some(ConfigError::ZeroCapacity));
    let built = TokenBucket::builder()
        .rate(Rate::per_second(0))
        .capacity(1)
        .build();
    assert!(matches!(built, Err(ConfigError::InvalidRate { .. })));
}

#[tokio::test(start_paused = true)]
async fn copy_bidirectional_limits_each_direction_by_its_own_limiter() {
    let up = bytes(1000, 1000);
    let down = bytes(500, 500);
    let (mut client, mut proxy_client) = tokio::io::duplex(8192);
    let (mut proxy_server, mut server) = tokio::io::duplex(8192);
    let proxy = tokio::spawn({
        let (up, down) = (up.clone(), down.clone());
        async move { rio::copy_bidirectional(&mut proxy_client, &mut proxy_server, up, down).await }
    });
    let start = Instant::now();
    let client_side = async {
        client.write_all(&[1; 3000]).await.unwrap();
        client.shutdown().await.unwrap();
        let mut got = Vec::new();
        client.read_to_end(&mut got).await.unwrap();
        (got.len(), start.elapsed())
    };
    let server_side = async {
        server.write_all(&[2; 1500]).await.unwrap();
        server.shutdown().await.unwrap();
        let mut got = Vec::new();
        server.read_to_end(&mut got).await.unwrap();
        (got.len(), start.elapsed())
    };
    let (at_client, at_server) = tokio::join!(client_side, server_side);
    // Up: 1000 at once, 2000 at 1000/s; down: 500 at once, 1000 at 500/s.
    assert_eq!(at_server, (3000, ms(2000)));
    assert_eq!(at_client, (1500, ms(2000)));
    assert_eq!(proxy.await.unwrap().unwrap(), (3000, 1500));
    assert_eq!((up.stats().granted, down.stats().granted), (3000, 1500));
}

#[tokio::test(start_paused = true)]
async fn a_keyed_limiters_key_is_a_budget_of_its_own() {
    // 1000 B/s per user: user 1's two downloads share user 1's budget (in
    // turns), user 2's is untouched by them.
    let per_user: Keyed<u64, TokenBucket> = Keyed::builder()
        .limiter(|| {
            TokenBucket::builder()
                .rate(Rate::per_second(1000))
                .capacity(1000)
                .build()
        })
        .build()
        .unwrap();
    let start = Instant::now();
    let download = |budget: TokenBucket| async move {
        let mut reader = tokio::io::repeat(0).take(1500).limited_read(budget);
        let mut out = Vec::new();
        reader.read_to_end(&mut out).await.unwrap();
        (out.len(), start.elapsed())
    };
    let (a, b, c) = tokio::join!(
        download(per_user.get(&1)),
        download(per_user.get(&1)),
        download(per_user.get(&2)),
    );
    // User 1: A's 1000 at once, and A queues its other 500 before B is
    // first polled (due at 0.5 s), B's 1000 behind it (1.5 s), then B's
    // 500 (2 s). User 2: 1000 at once, 500 at 0.5 s.
    assert_eq!(
        (a, b, c),
        ((1500, ms(500)), (1500, ms(2000)), (1500, ms(500)))
    );
    // User 1's bucket is still in the map (empty, so not fresh) and was
    // charged both downloads; user 2's, full again and unheld, may be gone.
    assert_eq!(per_user.get(&1).stats().granted, 3000);
}

#[tokio::test(start_paused = true)]
async fn a_funnel_and_a_smooth_limiter_meter_bytes_too() {
    // A funnel (no task) starts empty of water: 1000 at once, then 1000/s.
    let funnel = Funnel::builder()
        .rate(Rate::per_second(1000))
        .capacity(1000)
        .build()
        .unwrap();
    let start = Instant::now();
    let copied = rio::copy(
        &mut tokio::io::repeat(0).take(3000),
        &mut tokio::io::sink(),
        funnel,
    )
    .await
    .unwrap();
    assert_eq!((copied, start.elapsed()), (3000, ms(2000)));

    // Guava's SmoothBursty reports no bands and has no capacity: the chunk
    // stays 16 KiB, and each chunk pays for the one before it (the first
    // is free), so three chunks at 1024 B/s end when the second is paid.
    let smooth = SmoothBursty::builder()
        .permits_per_second(1024.0)
        .build()
        .unwrap();
    let mut reader = tokio::io::repeat(0)
        .take(3 * 16 * 1024)
        .limited_read(smooth);
    assert_eq!(reader.chunk(), 16 * KIB);
    let start = Instant::now();
    let copied = tokio::io::copy_buf(&mut reader, &mut tokio::io::sink())
        .await
        .unwrap();
    assert_eq!((copied, start.elapsed()), (3 * 16 * 1024, ms(32_000)));
}

#[tokio::test(start_paused = true)]
async fn zero_bytes_per_permit_is_one_and_zero_max_chunk_is_one() {
    let limiter = bytes(1000, 1000);
    let mut reader =
        RateLimitedRead::with_max_chunk(0, tokio::io::repeat(0).take(2000), limiter.clone())
            .bytes_per_permit(0);
    assert_eq!(reader.chunk(), 1);
    let start = Instant::now();
    let mut out = Vec::new();
    reader.read_to_end(&mut out).await.unwrap();
    assert_eq!((out.len(), start.elapsed()), (2000, ms(1000)));
    assert_eq!(limiter.stats().granted, 2000);
}

/// A reader that records how many bytes each read was offered and fills
/// at most `per_read` of them.
struct Offered {
    per_read: usize,
    offered: Arc<std::sync::Mutex<Vec<usize>>>,
}

impl AsyncRead for Offered {
    fn poll_read(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        self.offered.lock().unwrap().push(buf.remaining());
        let n = buf.remaining().min(self.per_read);
        buf.put_slice(&vec![0; n]);
        Poll::Ready(Ok(()))
    }
}

#[tokio::test(start_paused = true)]
async fn the_read_buffer_grows_with_what_the_reader_delivers_not_with_max_chunk() {
    // A smooth limiter has no capacity to hold the chunk to: the chunk is
    // the `max_chunk` asked for, here 4 GiB, and the buffer must not be.
    let limiter = || {
        SmoothBursty::builder()
            .permits_per_second(1e9)
            .build()
            .unwrap()
    };
    let read = |per_read: usize, reads: usize| async move {
        let offered = Arc::new(std::sync::Mutex::new(Vec::new()));
        let inner = Offered {
            per_read,
            offered: offered.clone(),
        };
        let mut reader = RateLimitedRead::with_max_chunk(u32::MAX, inner, limiter());
        assert_eq!(reader.chunk(), u32::MAX);
        let mut out = vec![0; 1 << 20];
        for _ in 0..reads {
            assert!(reader.read(&mut out).await.unwrap() > 0);
        }
        offered.lock().unwrap().clone()
    };
    // A reader that delivers 100 bytes at a time is offered 16 KiB, always.
    assert_eq!(read(100, 4).await, [16 * 1024; 4]);
    // One that fills whatever it is offered gets twice as much each time
    // (each read is handed out whole before the next: `out` is 1 MiB).
    assert_eq!(
        read(usize::MAX, 5).await,
        [16 * 1024, 32 * 1024, 64 * 1024, 128 * 1024, 256 * 1024]
    );
    // A chunk under 16 KiB is the buffer from the start.
    let offered = Arc::new(std::sync::Mutex::new(Vec::new()));
    let inner = Offered {
        per_read: usize::MAX,
        offered: offered.clone(),
    };
    let mut reader = RateLimitedRead::with_max_chunk(1000, inner, limiter());
    let mut out = [0; 4096];
    assert_eq!(reader.read(&mut out).await.unwrap(), 1000);
    assert_eq!(reader.read(&mut out).await.unwrap(), 1000);
    assert_eq!(*offered.lock().unwrap(), [1000, 1000]);
}

#[tokio::test(start_paused = true)]
async fn a_closed_limiter_fails_a_copy_at_once() {
    let limiter = bytes(1000, 1000);
    limiter.close();
    let start = Instant::now();
    let error = rio::copy(
        &mut tokio::io::repeat(0).take(10),
        &mut tokio::io::sink(),
        limiter,
    )
    .await
    .unwrap_err();
    assert_eq!(error.kind(), ErrorKind::ConnectionAborted);
    assert_eq!(start.elapsed(), Duration::ZERO);
}

#[test]
fn a_rate_above_one_byte_per_nanosecond_needs_larger_permits() {
    // 10⁹ bytes a second is the most a `Rate` counts; 1 GiB/s is counted
    // in kibibytes instead (`bytes_per_permit(1024)`, tests/io_rate.rs).
    assert!(Rate::per_second(1_000_000_000).validate().is_ok());
    assert!(Rate::per_second(1 << 30).validate().is_err());
    assert!(Rate::per_second(1 << 20).validate().is_ok());
}

/// A token bucket that counts the payments asked of it.
struct Counting {
    bucket: TokenBucket,
    calls: std::sync::atomic::AtomicU32,
}

#[async_trait]
impl Limiter for Counting {
    async fn acquire_many(&self, n: u32) -> Result<(), AcquireError> {
        self.calls
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.bucket.acquire_many(n).await
    }
    fn try_acquire_many(&self, n: u32) -> Result<(), TryAcquireError> {
        self.bucket.try_acquire_many(n)
    }
    async fn acquire_timeout(&self, n: u32, timeout: Duration) -> Result<(), AcquireError> {
        self.bucket.acquire_timeout(n, timeout).await
    }
    fn peek(&self, n: u32) -> Option<tokio_ratelimit::Peek> {
        Some(self.bucket.peek(n))
    }
}

#[tokio::test(start_paused = true)]
async fn small_reads_and_writes_do_not_pay_a_round_each() {
    // A caller reading one byte at a time: the wrapper reads a chunk (1000)
    // from the reader underneath and pays for it once.
    let counting = Arc::new(Counting {
        bucket: bytes(1000, 1000),
        calls: 0.into(),
    });
    let mut reader = tokio::io::repeat(0)
        .take(4000)
        .limited_read(Arc::clone(&counting));
    let start = Instant::now();
    let mut byte = [0; 1];
    for _ in 0..4000 {
        assert_eq!(reader.read(&mut byte).await.unwrap(), 1);
    }
    assert_eq!(start.elapsed(), ms(3000));
    let calls = || counting.calls.load(std::sync::atomic::Ordering::Relaxed);
    assert_eq!(calls(), 4);

    // A writer of 100-byte writes, each permit worth 1000 bytes: one
    // payment per ten writes.
    let counting = Arc::new(Counting {
        bucket: bytes(1000, 1000),
        calls: 0.into(),
    });
    let mut writer = tokio::io::sink()
        .limited_write(Arc::clone(&counting))
        .bytes_per_permit(1000);
    for _ in 0..100 {
        writer.write_all(&[0; 100]).await.unwrap();
    }
    assert_eq!(
        counting.calls.load(std::sync::atomic::Ordering::Relaxed),
        10
    );
    assert_eq!(counting.bucket.stats().granted, 10);
}

/// A writer that records the slices of each vectored write and takes at
/// most `max` bytes of them.
struct SliceWriter {
    max: usize,
    is_vectored: bool,
    calls: Vec<Vec<usize>>,
    written: Vec<u8>,
}

impl AsyncWrite for SliceWriter {
    fn poll_write(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let n = buf.len().min(self.max);
        self.calls.push(vec![buf.len()]);
        self.written.extend_from_slice(&buf[..n]);
        Poll::Ready(Ok(n))
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.calls.push(bufs.iter().map(|b| b.len()).collect());
        let mut left = self.max;
        for buf in bufs {
            let n = buf.len().min(left);
            self.written.extend_from_slice(&buf[..n]);
            left -= n;
        }
        Poll::Ready(Ok(self.max - left))
    }

    fn is_write_vectored(&self) -> bool {
        self.is_vectored
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

#[tokio::test(start_paused = true)]
async fn vectored_writes_are_forwarded_held_to_what_was_paid() {
    let vectored = |is_vectored| SliceWriter {
        max: usize::MAX,
        is_vectored,
        calls: Vec::new(),
        written: Vec::new(),
    };
    assert!(RateLimitedWrite::new(vectored(true), bytes(1000, 1000)).is_write_vectored());
    assert!(!RateLimitedWrite::new(vectored(false), bytes(1000, 1000)).is_write_vectored());

    // Chunks of 1 000 (the capacity): of 600 + 700 + 800 bytes, the first
    // write offers 600 and 400, one vectored call.
    let limiter = bytes(1000, 1000);
    let mut writer = RateLimitedWrite::new(vectored(true), limiter.clone());
    let (a, b, c) = ([1u8; 600], [2u8; 700], [3u8; 800]);
    let slices = [
        io::IoSlice::new(&a),
        io::IoSlice::new(&[]),
        io::IoSlice::new(&b),
        io::IoSlice::new(&c),
    ];
    let start = Instant::now();
    assert_eq!(writer.write_vectored(&slices).await.unwrap(), 1000);
    assert_eq!(writer.get_ref().calls, vec![vec![600, 400]]);
    // The rest: 300 of the second slice and the third, a second later.
    let slices = [io::IoSlice::new(&b[400..]), io::IoSlice::new(&c)];
    assert_eq!(writer.write_vectored(&slices).await.unwrap(), 1000);
    assert_eq!(start.elapsed(), Duration::from_secs(1));
    assert_eq!(writer.get_ref().calls[1], vec![300, 700]);
    let mut want = vec![1u8; 600];
    want.extend([2u8; 700]);
    want.extend([3u8; 700]);
    assert_eq!(writer.get_ref().written, want);
    assert_eq!(limiter.stats().granted, 2000);

    // A short vectored write keeps the rest as credit, as a plain one does.
    let limiter = bytes(1000, 1000);
    let mut short = vectored(true);
    short.max = 150;
    let mut writer = RateLimitedWrite::new(short, limiter.clone());
    assert_eq!(
        writer
            .write_vectored(&[io::IoSlice::new(&a), io::IoSlice::new(&b)])
            .await
            .unwrap(),
        150
    );
    assert_eq!((writer.credit(), limiter.stats().granted), (850, 1000));
    // Empty slices cost nothing.
    assert_eq!(
        writer
            .write_vectored(&[io::IoSlice::new(&[])])
            .await
            .unwrap(),
        0
    );
    assert_eq!(writer.credit(), 850);
}
