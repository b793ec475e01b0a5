//! Property tests (proptest) of the bandwidth wrappers (`io`), over random
//! read and write sizes, short writes and pending writers, chunk sizes,
//! bytes per permit, capacities and rates, and random cancellations:
//!
//! * never over-admits: at every instant a read or write returns, the bytes
//!   handed out (or taken by the writer underneath) are at most
//!   `(capacity + ⌊rate·t⌋) · bytes_per_permit` for a token bucket that
//!   starts full, exactly (no tick of slack: grants from the start are
//!   bounded by the bucket's schedule);
//! * never under-delivers: a caller that always wants more is done exactly
//!   when the last permit falls due, rounded up to the 1 ms tick;
//! * nothing lost: the permits granted are exactly the bytes moved rounded
//!   up to whole permits, the surplus is the wrapper's credit; after a
//!   wrapper is dropped while it waits, its payment in progress is gone
//!   with it, nobody waits, only the payments that went through were
//!   counted, and the bucket refills to full (nothing still reserved);
//! * the bytes come out in order and intact.
//!
//! Each case runs on a fresh current-thread runtime with a paused clock.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use async_trait::async_trait;
use proptest::prelude::*;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::time::{self, Instant};
use tokio_ratelimit::io::{RateLimitedRead, RateLimitedWrite};
use tokio_ratelimit::{
    AcquireError, Limiter, Peek, Rate, Reservation, Stats, TokenBucket, TryAcquireError,
};
use tokio_test::task;

mod support;
use support::run;

const NS: u128 = 1_000_000_000;

/// Runs `f` on a fresh current-thread runtime with a paused clock.
/// The bytes of a case: not all alike, so that a byte out of place shows.
fn data(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| i.to_le_bytes()[0].wrapping_mul(31).wrapping_add(seed))
        .collect()
}

/// A token bucket of `rate` permits a second and `capacity` permits,
/// starting full, and what its schedule allows.
#[derive(Debug, Clone, Copy)]
struct Budget {
    rate: u32,
    capacity: u32,
    unit: u32,
}

impl Budget {
    fn bucket(self) -> TokenBucket {
        TokenBucket::builder()
            .rate(Rate::per_second(self.rate))
            .capacity(self.capacity)
            .build()
            .unwrap()
    }

    /// Permits granted by `t` after the start, at most: the burst and
    /// `⌊rate · t⌋`.
    fn permits_by(self, t: Duration) -> u128 {
        u128::from(self.capacity) + t.as_nanos() * u128::from(self.rate) / NS
    }

    /// The most bytes that may have been moved by `t`.
    fn bytes_by(self, t: Duration) -> u128 {
        self.permits_by(t) * u128::from(self.unit)
    }

    /// Permits for `bytes`, whole.
    fn permits_for(self, bytes: usize) -> u64 {
        (bytes as u64).div_ceil(u64::from(self.unit))
    }

    /// When a caller that always wants more is done with `permits`: the
    /// last one falls due `(permits − capacity) / rate` after the start,
    /// and is woken on the next 1 ms tick.
    fn done_at(self, permits: u64) -> Duration {
        let owed = u128::from(permits.saturating_sub(u64::from(self.capacity)));
        let due_ns = (owed * NS).div_ceil(u128::from(self.rate));
        Duration::from_millis(u64::try_from(due_ns.div_ceil(1_000_000)).unwrap())
    }
}

fn budget() -> impl Strategy<Value = Budget> {
    (
        prop_oneof![100u32..2_000, 2_000u32..200_000],
        1u32..3_000,
        prop_oneof![Just(1u32), 1u32..100],
    )
        .prop_map(|(rate, capacity, unit)| Budget {
            rate,
            capacity,
            unit,
        })
}

/// A reader that hands out `data` in pieces of the sizes given (in turn),
/// never pending.
struct Pieces {
    data: Vec<u8>,
    pos: usize,
    sizes: Vec<usize>,
    turn: usize,
}

impl AsyncRead for Pieces {
    fn poll_read(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        let size = this.sizes[this.turn % this.sizes.len()];
        this.turn += 1;
        let n = size.min(buf.remaining()).min(this.data.len() - this.pos);
        buf.put_slice(&this.data[this.pos..this.pos + n]);
        this.pos += n;
        Poll::Ready(Ok(()))
    }
}

/// What the writer underneath does at a write: take at most so many bytes,
/// or first say `Pending` (and wake itself at once).
#[derive(Debug, Clone, Copy)]
enum Take {
    AtMost(usize),
    Pending,
}

/// A writer that follows its script (in turn), keeping what it takes.
struct Script {
    takes: Vec<Take>,
    turn: usize,
    written: Vec<u8>,
}

impl AsyncWrite for Script {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        let take = this.takes[this.turn % this.takes.len()];
        this.turn += 1;
        match take {
            Take::Pending => {
                cx.waker().wake_by_ref();
                Poll::Pending
            }
            Take::AtMost(max) => {
                let n = buf.len().min(max);
                this.written.extend_from_slice(&buf[..n]);
                Poll::Ready(Ok(n))
            }
        }
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

fn take() -> impl Strategy<Value = Take> {
    prop_oneof![
        6 => (1usize..5_000).prop_map(Take::AtMost),
        1 => Just(Take::Pending),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    /// A reader: bytes intact, never ahead of the bucket, done exactly on
    /// time, charged exactly.
    #[test]
    fn a_reader_is_exact(
        budget in budget(),
        len in 0usize..40_000,
        seed in any::<u8>(),
        max_chunk in prop_oneof![1u32..64, 64u32..20_000],
        pieces in prop::collection::vec(1usize..8_000, 1..6),
        reads in prop::collection::vec(1usize..10_000, 1..6),
    ) {
        let data = data(len, seed);
        let (out, moved_at, end, granted, credit) = run(async {
            let bucket = budget.bucket();
            let source = Pieces { data: data.clone(), pos: 0, sizes: pieces, turn: 0 };
            let mut reader = RateLimitedRead::with_max_chunk(max_chunk, source, bucket.clone())
                .bytes_per_permit(budget.unit);
            let start = Instant::now();
            let mut out = Vec::new();
            let mut moved_at = Vec::new();
            for turn in 0.. {
                let mut buf = vec![0; reads[turn % reads.len()]];
                let n = reader.read(&mut buf).await.unwrap();
                if n == 0 {
                    break;
                }
                out.extend_from_slice(&buf[..n]);
                moved_at.push((out.len(), start.elapsed()));
            }
            let granted = bucket.stats().granted;
            (out, moved_at, start.elapsed(), granted, reader.credit())
        });
        prop_assert!(out == data, "bytes out of order or lost");
        for &(moved, at) in &moved_at {
            prop_assert!(moved as u128 <= budget.bytes_by(at), "{moved} B by {at:?}");
        }
        let permits = budget.permits_for(len);
        prop_assert_eq!(granted, permits);
        prop_assert_eq!(credit, permits * u64::from(budget.unit) - len as u64);
        prop_assert_eq!(end, budget.done_at(permits));
    }

    /// A writer over short and pending writes: bytes intact, never ahead
    /// of the bucket, done exactly on time, charged exactly.
    #[test]
    fn a_writer_is_exact(
        budget in budget(),
        len in 0usize..40_000,
        seed in any::<u8>(),
        max_chunk in prop_oneof![1u32..64, 64u32..20_000],
        takes in prop::collection::vec(take(), 1..6),
        writes in prop::collection::vec(1usize..10_000, 1..6),
    ) {
        // A script of nothing but `Pending` would never write.
        prop_assume!(takes.iter().any(|t| matches!(t, Take::AtMost(_))));
        let data = data(len, seed);
        let (written, moved_at, end, granted, credit) = run(async {
            let bucket = budget.bucket();
            let sink = Script { takes, turn: 0, written: Vec::new() };
            let mut writer = RateLimitedWrite::with_max_chunk(max_chunk, sink, bucket.clone())
                .bytes_per_permit(budget.unit);
            let start = Instant::now();
            let mut pos = 0;
            let mut moved_at = Vec::new();
            for turn in 0.. {
                if pos == data.len() {
                    break;
                }
                let end = data.len().min(pos + writes[turn % writes.len()]);
                let n = writer.write(&data[pos..end]).await.unwrap();
                assert!(n >= 1 && n <= end - pos);
                pos += n;
                moved_at.push((pos, start.elapsed()));
            }
            writer.flush().await.unwrap();
            let granted = bucket.stats().granted;
            let credit = writer.credit();
            (writer.into_inner().written, moved_at, start.elapsed(), granted, credit)
        });
        prop_assert!(written == data, "bytes out of order or lost");
        for &(moved, at) in &moved_at {
            prop_assert!(moved as u128 <= budget.bytes_by(at), "{moved} B by {at:?}");
        }
        let permits = budget.permits_for(len);
        prop_assert_eq!(granted, permits);
        prop_assert_eq!(credit, permits * u64::from(budget.unit) - len as u64);
        prop_assert_eq!(end, budget.done_at(permits));
    }
}

/// What the test does next to a wrapper: poll its pending call, let time
/// pass, drop the call (a timeout, a `select!`), or drop the wrapper.
#[derive(Debug, Clone, Copy)]
enum Op {
    Poll,
    Advance(u64),
    DropCall,
    DropWrapper,
}

fn ops() -> impl Strategy<Value = Vec<Op>> {
    prop::collection::vec(
        prop_oneof![
            4 => Just(Op::Poll),
            4 => (0u64..400).prop_map(Op::Advance),
            2 => Just(Op::DropCall),
            1 => Just(Op::DropWrapper),
        ],
        1..40,
    )
}

/// The sizes a read or write asks for, in turn, one more each time a call
/// is dropped.
const SIZES: [usize; 3] = [3_000, 700, 1];

/// A token bucket that counts the payments made of it: those in progress
/// (a future alive) and the permits of those that went through.
#[derive(Clone)]
struct Probe {
    bucket: TokenBucket,
    live: Arc<AtomicU64>,
    paid: Arc<AtomicU64>,
}

/// Counts a payment in progress while it lives.
struct Alive(Arc<AtomicU64>);

impl Drop for Alive {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

#[async_trait]
impl Limiter for Probe {
    async fn acquire_many(&self, n: u32) -> Result<(), AcquireError> {
        self.live.fetch_add(1, Ordering::SeqCst);
        let _alive = Alive(Arc::clone(&self.live));
        self.bucket.acquire_many(n).await?;
        self.paid.fetch_add(u64::from(n), Ordering::SeqCst);
        Ok(())
    }
    fn try_acquire_many(&self, n: u32) -> Result<(), TryAcquireError> {
        self.bucket.try_acquire_many(n)?;
        self.paid.fetch_add(u64::from(n), Ordering::SeqCst);
        Ok(())
    }
    async fn acquire_timeout(&self, n: u32, timeout: Duration) -> Result<(), AcquireError> {
        self.bucket.acquire_timeout(n, timeout).await
    }
    async fn reserve(&self, n: u32) -> Result<Reservation, AcquireError> {
        self.bucket.reserve(n).await
    }
    fn peek(&self, n: u32) -> Option<Peek> {
        Some(self.bucket.peek(n))
    }
    fn stats(&self) -> Stats {
        self.bucket.stats()
    }
}

impl Probe {
    fn new(budget: Budget) -> Probe {
        Probe {
            bucket: budget.bucket(),
            live: Arc::default(),
            paid: Arc::default(),
        }
    }

    /// Checks, right after a wrapper was dropped (possibly while it
    /// waited), that its payment in progress went with it: no payment
    /// future is left, nobody waits, the bucket counts granted exactly the
    /// payments that went through, and once it has had the time to refill
    /// it is full (a reservation still held would keep some of it).
    async fn assert_given_back(&self, budget: Budget) {
        assert_eq!(
            self.live.load(Ordering::SeqCst),
            0,
            "a payment outlived its wrapper"
        );
        let stats = self.bucket.stats();
        assert_eq!(stats.waiting, 0);
        assert_eq!(stats.granted, self.paid.load(Ordering::SeqCst));
        let refill_ns = u128::from(budget.capacity) * NS / u128::from(budget.rate) + 1;
        time::advance(Duration::from_nanos(u64::try_from(refill_ns).unwrap())).await;
        assert_eq!(self.bucket.available(), budget.capacity);
    }
}

/// Drives reads of `data` through `ops`, then to the end (or drops the
/// wrapper where `ops` say): the bytes read and whether the wrapper was
/// dropped.
async fn cancelled_reads(budget: Budget, data: &[u8], chunk: u32, ops: &[Op]) -> Vec<u8> {
    let probe = Probe::new(budget);
    let source = Pieces {
        data: data.to_vec(),
        pos: 0,
        sizes: vec![usize::MAX],
        turn: 0,
    };
    let mut reader =
        RateLimitedRead::with_max_chunk(chunk, source, probe.clone()).bytes_per_permit(budget.unit);
    let start = Instant::now();
    let mut out = Vec::new();
    let mut buf = vec![0; 3_000];
    let mut drops = 0;
    let mut ops = ops
        .iter()
        .copied()
        .chain(std::iter::repeat(Op::Advance(50)));
    'reads: loop {
        // A call retried after a drop may ask for less (or more).
        let mut call = task::spawn(reader.read(&mut buf[..SIZES[drops % SIZES.len()]]));
        let n = loop {
            if let Poll::Ready(n) = call.poll() {
                break n.unwrap();
            }
            match ops.next().unwrap() {
                Op::Poll => {}
                Op::Advance(ms) => time::advance(Duration::from_millis(ms)).await,
                Op::DropCall => {
                    drops += 1;
                    continue 'reads;
                }
                Op::DropWrapper => {
                    drop(call);
                    drop(reader);
                    probe.assert_given_back(budget).await;
                    return out;
                }
            }
        };
        drop(call);
        if n == 0 {
            break;
        }
        out.extend_from_slice(&buf[..n]);
        let moved = out.len() as u128;
        assert!(moved <= budget.bytes_by(start.elapsed()), "{moved} B early");
        // The module's one statement of credit, and a reader's after a read.
        assert!(reader.credit() < u64::from(reader.chunk()) + u64::from(budget.unit));
        assert!(
            reader.credit() < u64::from(budget.unit),
            "{}",
            reader.credit()
        );
    }
    let permits = budget.permits_for(data.len());
    assert_eq!(probe.bucket.stats().granted, permits);
    assert_eq!(
        reader.credit(),
        permits * u64::from(budget.unit) - data.len() as u64
    );
    drop(reader);
    probe.assert_given_back(budget).await;
    out
}

/// As [`cancelled_reads`], for writes.
async fn cancelled_writes(budget: Budget, data: &[u8], chunk: u32, ops: &[Op]) -> Vec<u8> {
    let probe = Probe::new(budget);
    let sink = Script {
        takes: vec![Take::AtMost(1_500)],
        turn: 0,
        written: Vec::new(),
    };
    let mut writer =
        RateLimitedWrite::with_max_chunk(chunk, sink, probe.clone()).bytes_per_permit(budget.unit);
    let start = Instant::now();
    let mut pos = 0;
    let mut drops = 0;
    let mut ops = ops
        .iter()
        .copied()
        .chain(std::iter::repeat(Op::Advance(50)));
    'writes: while pos < data.len() {
        // A write retried after a drop may offer less (or more): a payment
        // started for more is kept as credit.
        let end = data.len().min(pos + SIZES[drops % SIZES.len()]);
        let mut call = task::spawn(writer.write(&data[pos..end]));
        let n = loop {
            if let Poll::Ready(n) = call.poll() {
                break n.unwrap();
            }
            match ops.next().unwrap() {
                Op::Poll => {}
                Op::Advance(ms) => time::advance(Duration::from_millis(ms)).await,
                Op::DropCall => {
                    drops += 1;
                    continue 'writes;
                }
                Op::DropWrapper => {
                    drop(call);
                    let written = writer.into_inner().written;
                    probe.assert_given_back(budget).await;
                    return written;
                }
            }
        };
        drop(call);
        pos += n;
        let moved = writer.get_ref().written.len();
        assert_eq!(moved, pos);
        // The module's one statement of credit.
        assert!(
            writer.credit() < u64::from(writer.chunk()) + u64::from(budget.unit),
            "{} with chunks of {}",
            writer.credit(),
            writer.chunk()
        );
        assert!(
            moved as u128 <= budget.bytes_by(start.elapsed()),
            "{moved} B early"
        );
    }
    let permits = budget.permits_for(data.len());
    assert_eq!(probe.bucket.stats().granted, permits);
    assert_eq!(
        writer.credit(),
        permits * u64::from(budget.unit) - data.len() as u64
    );
    let written = writer.into_inner().written;
    probe.assert_given_back(budget).await;
    written
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Reads dropped at random points lose nothing and pay nothing twice;
    /// a reader dropped while it waits gives its payment back.
    #[test]
    fn cancelled_reads_lose_nothing(
        budget in budget(),
        len in 0usize..20_000,
        seed in any::<u8>(),
        chunk in 1u32..5_000,
        ops in ops(),
    ) {
        let data = data(len, seed);
        let out = run(cancelled_reads(budget, &data, chunk, &ops));
        prop_assert!(data.starts_with(&out), "bytes out of order");
        if !ops.iter().any(|op| matches!(op, Op::DropWrapper)) {
            prop_assert_eq!(out.len(), data.len());
        }
    }

    /// Writes dropped at random points lose nothing and pay nothing twice;
    /// a writer dropped while it waits gives its payment back.
    #[test]
    fn cancelled_writes_lose_nothing(
        budget in budget(),
        len in 0usize..20_000,
        seed in any::<u8>(),
        chunk in 1u32..5_000,
        ops in ops(),
    ) {
        let data = data(len, seed);
        let written = run(cancelled_writes(budget, &data, chunk, &ops));
        prop_assert!(data.starts_with(&written), "bytes out of order");
        if !ops.iter().any(|op| matches!(op, Op::DropWrapper)) {
            prop_assert_eq!(written.len(), data.len());
        }
    }
}
