//! Bandwidth (`io`): connections sharing one limiter get their turns in
//! arrival order whatever their chunk sizes, for every kind of limiter the
//! wrappers accept (issue 27: a stream metered by a `LeakyBucket` starved
//! behind a neighbour's smaller chunks).
//!
//! Two readers (or two writers) share one limiter through an
//! `Arc<dyn Limiter>`, one paying in chunks of 1 000 bytes, the other in
//! chunks of 10, both wanting bytes all the time for 10 s of paused time.
//! Every payment the limiter grants is logged (its size and instant). In
//! FIFO order each always has a payment waiting while the other's is
//! served, so the grants alternate between the two sizes; and neither gets
//! fewer than its turns.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::time::Instant;
use tokio_ratelimit::io::{RateLimitedRead, RateLimitedWrite};
use tokio_ratelimit::keyed::Keyed;
use tokio_ratelimit::{
    AcquireError, Funnel, LeakyBucket, Limiter, Peek, Quota, Rate, Reservation, SmoothBursty,
    Stats, TokenBucket, TryAcquireError,
};

const RATE: u32 = 1_000;
const CAPACITY: u32 = 1_000;
const BIG: u32 = 1_000;
const SMALL: u32 = 10;
const RUN: Duration = Duration::from_secs(10);

/// A limiter that logs every payment it grants (through any method).
struct Logged {
    inner: Arc<dyn Limiter>,
    start: Instant,
    log: Mutex<Vec<(u32, Duration)>>,
}

impl Logged {
    fn note(&self, n: u32, result: Result<(), AcquireError>) -> Result<(), AcquireError> {
        if result.is_ok() {
            self.log.lock().unwrap().push((n, self.start.elapsed()));
        }
        result
    }
}

#[async_trait]
impl Limiter for Logged {
    async fn acquire_many(&self, n: u32) -> Result<(), AcquireError> {
        let result = self.inner.acquire_many(n).await;
        self.note(n, result)
    }
    async fn acquire_room(&self, n: u32) -> Result<(), AcquireError> {
        let result = self.inner.acquire_room(n).await;
        self.note(n, result)
    }
    fn try_acquire_many(&self, n: u32) -> Result<(), TryAcquireError> {
        let result = self.inner.try_acquire_many(n);
        if result.is_ok() {
            self.log.lock().unwrap().push((n, self.start.elapsed()));
        }
        result
    }
    async fn acquire_timeout(&self, n: u32, timeout: Duration) -> Result<(), AcquireError> {
        let result = self.inner.acquire_timeout(n, timeout).await;
        self.note(n, result)
    }
    async fn reserve(&self, n: u32) -> Result<Reservation, AcquireError> {
        self.inner.reserve(n).await
    }
    fn peek(&self, n: u32) -> Option<Peek> {
        self.inner.peek(n)
    }
    fn stats(&self) -> Stats {
        self.inner.stats()
    }
}

/// The limiter kinds the wrappers accept, each at 1 000 bytes a second
/// with room for 1 000, and the most bytes it may grant over `RUN`.
fn kinds() -> Vec<(&'static str, Arc<dyn Limiter>, u64)> {
    let rate = Rate::per_second(RATE);
    let bound = u64::from(CAPACITY) + u64::from(RATE) * RUN.as_secs();
    let keyed = Keyed::<String, LeakyBucket>::builder()
        .limiter(move || LeakyBucket::builder().rate(rate).capacity(CAPACITY).build())
        .build()
        .unwrap();
    let two_bands = Quota::new(rate, CAPACITY).and(Rate::per_second(2_000), 4_000);
    vec![
        (
            "TokenBucket",
            Arc::new(
                TokenBucket::builder()
                    .rate(rate)
                    .capacity(CAPACITY)
                    .build()
                    .unwrap(),
            ),
            bound,
        ),
        (
            "LeakyBucket",
            Arc::new(
                LeakyBucket::builder()
                    .rate(rate)
                    .capacity(CAPACITY)
                    .build()
                    .unwrap(),
            ),
            bound,
        ),
        (
            "Funnel",
            Arc::new(
                Funnel::builder()
                    .rate(rate)
                    .capacity(CAPACITY)
                    .build()
                    .unwrap(),
            ),
            bound,
        ),
        (
            // Guava's pay-later model: a request goes at once and the next
            // pays for it, so one chunk more than the stored second.
            "SmoothBursty",
            Arc::new(
                SmoothBursty::builder()
                    .permits_per_second(f64::from(RATE))
                    .build()
                    .unwrap(),
            ),
            bound + u64::from(BIG),
        ),
        ("Keyed<LeakyBucket> key", Arc::new(keyed.get("a")), bound),
        (
            "LeakyBucket, 2 bands",
            Arc::new(LeakyBucket::builder().quota(two_bands).build().unwrap()),
            bound,
        ),
        (
            "TokenBucket, 2 bands",
            Arc::new(TokenBucket::builder().quota(two_bands).build().unwrap()),
            bound,
        ),
    ]
}

/// The grants of a run before its end (at the end, the payment of one
/// side is dropped and given back, and the other may take it at once).
fn turns(log: &[(u32, Duration)]) -> Vec<u32> {
    log.iter()
        .filter(|&&(_, at)| at < RUN)
        .map(|&(n, _)| n)
        .collect()
}

/// Checks the log of one run: once the small chunks have had a first turn
/// (the big reader, spawned first, pays while the small one has not asked
/// yet: twice, or three times on a smooth limiter, which lets two requests
/// go at once), the grants alternate between the two sizes; neither gets fewer than its
/// turns; and the bytes stay within the limiter's bound.
fn check(name: &str, log: &[(u32, Duration)], bound: u64) {
    let sizes = turns(log);
    assert!(
        sizes.iter().all(|&n| n == BIG || n == SMALL),
        "{name}: {sizes:?}"
    );
    let first_small = sizes
        .iter()
        .position(|&n| n == SMALL)
        .expect("a small turn");
    assert!(
        first_small <= 3,
        "{name}: the small chunks waited {first_small} turns: {log:?}"
    );
    for (i, pair) in sizes[first_small..].windows(2).enumerate() {
        assert_ne!(
            pair[0], pair[1],
            "{name}: two turns in a row at grant {i}: {log:?}"
        );
    }
    let count = |size: u32| sizes.iter().filter(|&&n| n == size).count() as u64;
    let (big_turns, small_turns) = (count(BIG), count(SMALL));
    // A turn of the big one takes a second of the rate: about ten in 10 s.
    assert!(
        big_turns >= 9,
        "{name}: the big chunks got {big_turns} turns: {log:?}"
    );
    assert!(
        small_turns >= 8,
        "{name}: the small chunks got {small_turns} turns: {log:?}"
    );
    let paid: u64 = sizes.iter().map(|&n| u64::from(n)).sum();
    assert!(
        paid <= bound,
        "{name}: {paid} bytes paid, more than {bound}"
    );
}

/// Two readers of `repeat(0)` on one limiter, with chunks of `BIG` and
/// `SMALL` (and buffers as large), for `RUN`: the bytes each read.
async fn two_readers(limiter: Arc<Logged>) -> (u64, u64) {
    let reader = |chunk: u32| {
        let limiter = Arc::clone(&limiter);
        tokio::spawn(async move {
            let mut read = RateLimitedRead::with_max_chunk(chunk, tokio::io::repeat(0), limiter);
            let mut buf = vec![0; chunk as usize];
            let mut total = 0u64;
            let deadline = Instant::now() + RUN;
            while let Ok(Ok(n)) = tokio::time::timeout_at(deadline, read.read(&mut buf)).await {
                total += n as u64;
            }
            total
        })
    };
    let (big, small) = (reader(BIG), reader(SMALL));
    (big.await.unwrap(), small.await.unwrap())
}

/// Two writers into `sink()` on one limiter, writing `BIG` and `SMALL`
/// bytes at a time, for `RUN`: the bytes each wrote.
async fn two_writers(limiter: Arc<Logged>) -> (u64, u64) {
    let writer = |chunk: u32| {
        let limiter = Arc::clone(&limiter);
        tokio::spawn(async move {
            let mut write = RateLimitedWrite::with_max_chunk(chunk, tokio::io::sink(), limiter);
            let buf = vec![0; chunk as usize];
            let mut total = 0u64;
            let deadline = Instant::now() + RUN;
            while let Ok(Ok(n)) = tokio::time::timeout_at(deadline, write.write(&buf)).await {
                total += n as u64;
            }
            total
        })
    };
    let (big, small) = (writer(BIG), writer(SMALL));
    (big.await.unwrap(), small.await.unwrap())
}

fn logged(inner: Arc<dyn Limiter>) -> Arc<Logged> {
    Arc::new(Logged {
        inner,
        start: Instant::now(),
        log: Mutex::new(Vec::new()),
    })
}

#[tokio::test(start_paused = true)]
async fn readers_with_different_chunks_take_turns_on_every_limiter() {
    for (name, limiter, bound) in kinds() {
        let limiter = logged(limiter);
        two_readers(Arc::clone(&limiter)).await;
        check(name, &limiter.log.lock().unwrap(), bound);
    }
}

#[tokio::test(start_paused = true)]
async fn writers_with_different_chunks_take_turns_on_every_limiter() {
    for (name, limiter, bound) in kinds() {
        let limiter = logged(limiter);
        two_writers(Arc::clone(&limiter)).await;
        check(name, &limiter.log.lock().unwrap(), bound);
    }
}

/// The reproduction, exactly: on a `LeakyBucket` the 1 000-byte
/// reader got its first chunk only (1 000 bytes) and the 10-byte reader
/// 9 990. Now both get their turns, as on a `TokenBucket`.
#[tokio::test(start_paused = true)]
async fn a_leaky_bucket_no_longer_starves_the_big_reader() {
    let leaky = LeakyBucket::builder()
        .rate(Rate::per_second(RATE))
        .capacity(CAPACITY)
        .build()
        .unwrap();
    let limiter = logged(Arc::new(leaky));
    two_readers(Arc::clone(&limiter)).await;
    let log = limiter.log.lock().unwrap().clone();
    let sizes = turns(&log);
    let bytes = |size: u32| {
        sizes
            .iter()
            .filter(|&&n| n == size)
            .map(|&n| u64::from(n))
            .sum::<u64>()
    };
    // The big one at 0 and 1 s, then every 1.01 s (after each, a turn of
    // 10 ms for the small one) to 9.08 s; the small one at 1.01 s, …, 9.09 s.
    assert_eq!((bytes(BIG), bytes(SMALL)), (10_000, 90), "{log:?}");
}
