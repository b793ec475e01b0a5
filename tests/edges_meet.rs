//! Where the crate's layers meet at the edges of time and size: extreme
//! rates and capacities, long idle, the cell's narrow word widening, the
//! keyed maps' compact words across sweeps and epochs, `set_rate` between
//! extremes, and the agreement of `peek`, `retry_after` and the next
//! decision at exact instants (paused clock, advanced to the nanosecond).
//!
//! Expected answers come from a plain integer GCRA model written here
//! (`Model`), or from the documented guarantees.

use std::sync::Arc;
use std::time::Duration;

use proptest::prelude::*;
use tokio::time::{self, Instant};
use tokio_ratelimit::algorithm::SmoothState;
use tokio_ratelimit::keyed::{Keyed, KeyedFunnel};
use tokio_ratelimit::{
    AcquireError, Funnel, LeakyBucket, Limiter, Peek, Quota, Rate, SmoothBursty, SmoothWarmingUp,
    TokenBucket, TryAcquireError,
};

mod support;
use support::{run, settle};

const NS: Duration = Duration::from_nanos(1);
const DAY: Duration = Duration::from_secs(86_400);
const YEAR: Duration = Duration::from_secs(365 * 86_400);

/// The exact GCRA of one band, in units of 1/den ns (the interval is
/// `num / den` ns in lowest terms): a request of `n` fits at `now` when
/// `max(tat, now) + n·num − now ≤ capacity·num`.
#[derive(Debug, Clone, Copy)]
struct Model {
    num: u128,
    den: u128,
    capacity: u128,
    tat: u128,
}

fn gcd(a: u128, b: u128) -> u128 {
    if b == 0 { a } else { gcd(b, a % b) }
}

impl Model {
    fn new(rate: Rate, capacity: u32) -> Model {
        let period = rate.period().as_nanos();
        let permits = u128::from(rate.permits());
        let g = gcd(period, permits);
        Model {
            num: period / g,
            den: permits / g,
            capacity: u128::from(capacity),
            tat: 0,
        }
    }

    fn scaled(&self, now: Duration) -> u128 {
        now.as_nanos() * self.den
    }

    /// (`available`, `full_in`, `next_in`) at `now`, as `BandState` documents
    /// them: whole permits it would grant now; the time until it is full
    /// again (empty of water); the time until one more permit than
    /// `available` (zero when full).
    fn state(&self, now: Duration) -> (u32, Duration, Duration) {
        let water = self.tat.saturating_sub(self.scaled(now));
        let tau = self.capacity * self.num;
        let available = if water >= tau {
            0
        } else {
            (tau - water) / self.num
        };
        let next = if available >= self.capacity {
            0
        } else {
            water - (tau - (available + 1) * self.num)
        };
        (
            u32::try_from(available).unwrap(),
            from_nanos(water.div_ceil(self.den)),
            from_nanos(next.div_ceil(self.den)),
        )
    }

    /// The meter at `now` (since the limiter was built): granted, or the
    /// wait rounded up to a nanosecond.
    fn try_pour(&mut self, now: Duration, n: u32) -> Result<(), Duration> {
        let now = self.scaled(now);
        let end = self.tat.max(now) + u128::from(n) * self.num;
        let tau = self.capacity * self.num;
        if end - now <= tau {
            self.tat = end;
            Ok(())
        } else {
            let wait = (end - now - tau).div_ceil(self.den);
            Err(from_nanos(wait))
        }
    }
}

/// `a − b`, which the test has arranged to be non-negative.
fn minus(a: Duration, b: Duration) -> Duration {
    a.checked_sub(b).expect("a later instant")
}

/// Nanoseconds as a duration; `Duration::MAX` past it (a wait of 2⁹⁶ ns,
/// the slowest rate times the largest capacity, is longer than any).
fn from_nanos(ns: u128) -> Duration {
    match u64::try_from(ns / 1_000_000_000) {
        Ok(secs) => Duration::new(secs, u32::try_from(ns % 1_000_000_000).unwrap()),
        Err(_) => Duration::MAX,
    }
}

fn limited(retry_after: Duration) -> Result<(), TryAcquireError> {
    Err(TryAcquireError::Limited { retry_after })
}

fn retry_after(answer: Result<(), TryAcquireError>) -> Duration {
    match answer {
        Err(TryAcquireError::Limited { retry_after }) => retry_after,
        other => panic!("expected a rate refusal, got {other:?}"),
    }
}

/// The three bucket meters at `rate` and `capacity`.
fn buckets(rate: Rate, capacity: u32) -> Vec<(&'static str, Arc<dyn Limiter>)> {
    vec![
        (
            "token",
            Arc::new(
                TokenBucket::builder()
                    .rate(rate)
                    .capacity(capacity)
                    .build()
                    .unwrap(),
            ),
        ),
        (
            "leaky",
            Arc::new(
                LeakyBucket::builder()
                    .rate(rate)
                    .capacity(capacity)
                    .build()
                    .unwrap(),
            ),
        ),
        (
            "funnel",
            Arc::new(
                Funnel::builder()
                    .rate(rate)
                    .capacity(capacity)
                    .build()
                    .unwrap(),
            ),
        ),
    ]
}

/// The extreme rates a `Rate` allows and some whose interval is not a whole
/// number of nanoseconds.
fn extreme_rates() -> Vec<Rate> {
    vec![
        Rate::every(NS),                                  // the fastest
        Rate::per(1_000_000_000, Duration::from_secs(1)), // the same, as a large k
        Rate::per_second(3),                              // 333 333 333⅓ ns
        Rate::per(7, Duration::from_millis(1)),           // 142 857⅐ ns
        Rate::per_day(1),
        Rate::per(4_294_967_291, Duration::from_secs(5)), // den near 2³²
        Rate::every(Duration::from_nanos(u64::MAX)),      // the slowest
    ]
}

/// For every bucket meter at every extreme rate, capacity 1 and `u32::MAX`:
/// emptied, the refusal's `retry_after` is the exact instant the request
/// fits — refused one nanosecond before (with a 1 ns wait), granted then —
/// and `peek` answers as the next `try_acquire_many` does.
#[tokio::test(start_paused = true)]
async fn retry_after_is_exact_at_extreme_rates_and_capacities() {
    for rate in extreme_rates() {
        for capacity in [1, u32::MAX] {
            for n in [1, capacity] {
                for (name, limiter) in buckets(rate, capacity) {
                    let what = format!("{name} {rate:?} capacity {capacity} n {n}");
                    let start = Instant::now();
                    let mut model = Model::new(rate, capacity);
                    assert_eq!(limiter.try_acquire_many(capacity), Ok(()), "{what}");
                    model.try_pour(start.elapsed(), capacity).unwrap();
                    let peeked = limiter.peek(n).unwrap().answer();
                    let answer = limiter.try_acquire_many(n);
                    assert_eq!(peeked, answer, "{what}: peek");
                    let expected = model
                        .try_pour(start.elapsed(), n)
                        .map_err(|w| TryAcquireError::Limited { retry_after: w });
                    assert_eq!(answer, expected, "{what}");
                    let wait = retry_after(answer);
                    // Past 2⁶⁴ ns the clock stands still (see the finding
                    // on long idle): only waits within it are walked.
                    if wait > YEAR * 580 {
                        continue;
                    }
                    if wait > NS {
                        time::advance(minus(wait, NS)).await;
                        let peeked = limiter.peek(n).unwrap().answer();
                        assert_eq!(peeked, limited(NS), "{what}: peek 1 ns early");
                        assert_eq!(
                            limiter.try_acquire_many(n),
                            limited(NS),
                            "{what}: 1 ns early"
                        );
                        time::advance(NS).await;
                    } else {
                        time::advance(wait).await;
                    }
                    assert_eq!(
                        limiter.peek(n).unwrap().answer(),
                        Ok(()),
                        "{what}: peek due"
                    );
                    assert_eq!(limiter.try_acquire_many(n), Ok(()), "{what}: due");
                    model.try_pour(start.elapsed(), n).unwrap();
                    let again = limiter.try_acquire_many(n);
                    let expected = model
                        .try_pour(start.elapsed(), n)
                        .map_err(|w| TryAcquireError::Limited { retry_after: w });
                    assert_eq!(again, expected, "{what}: after");
                }
            }
        }
    }
}

/// After 500 years of idle, every limiter reads as new — and then refills
/// at its rate as before ("A key or limiter idle for any length of time,
/// up to 584 years after it was built, reads as a new one"; past 2⁶⁴ ns
/// its clock stops, the documented limit: the review found a limiter idle
/// 600 years granted once and then never again). Each kind is asked for a
/// permit right after the idle (granted), again (refused, with a
/// `retry_after`), and again once that `retry_after` has passed.
#[tokio::test(start_paused = true)]
async fn limiters_idle_for_five_centuries_keep_refilling() {
    let rate = Rate::per_second(1);
    let mut limiters = buckets(rate, 1);
    limiters.push((
        "bursty",
        Arc::new(
            SmoothBursty::builder()
                .permits_per_second(1.0)
                .max_burst(Duration::ZERO)
                .build()
                .unwrap(),
        ),
    ));
    limiters.push((
        "warming",
        Arc::new(
            SmoothWarmingUp::builder()
                .permits_per_second(1.0)
                .warmup(Duration::from_secs(1))
                .build()
                .unwrap(),
        ),
    ));
    let keyed: KeyedFunnel<u64> = KeyedFunnel::builder()
        .rate(rate)
        .capacity(1)
        .background_sweep(false)
        .build()
        .unwrap();
    let generic: Keyed<u64, TokenBucket> = Keyed::builder()
        .limiter(move || TokenBucket::builder().rate(rate).capacity(1).build())
        .background_sweep(false)
        .build()
        .unwrap();
    let ask = |name: &str| -> Result<(), TryAcquireError> {
        match name {
            "keyed" => keyed.try_acquire(&1),
            "generic" => generic.try_acquire(&1),
            _ => limiters
                .iter()
                .find(|(n, _)| *n == name)
                .unwrap()
                .1
                .try_acquire(),
        }
    };
    let names = [
        "token", "leaky", "funnel", "bursty", "warming", "keyed", "generic",
    ];
    for name in names {
        assert_eq!(ask(name), Ok(()), "{name} at the start");
    }
    time::advance(YEAR * 500).await;
    settle().await;
    let mut stuck = Vec::new();
    for name in names {
        assert_eq!(ask(name), Ok(()), "{name} after 500 years: like new");
        let wait = retry_after(ask(name));
        time::advance(wait).await;
        let answer = ask(name);
        if answer.is_err() {
            stuck.push(format!(
                "{name}: still refused after waiting out its retry_after of {wait:?}: {answer:?}"
            ));
        }
    }
    assert!(
        stuck.is_empty(),
        "never refilled again:\n{}",
        stuck.join("\n")
    );
}

/// The bucket kinds with `set_rate`, as their own types.
enum Bucket {
    Token(TokenBucket),
    Leaky(LeakyBucket),
    Funnel(Funnel),
}

impl Bucket {
    fn all(rate: Rate, capacity: u32) -> Vec<(&'static str, Bucket)> {
        vec![
            (
                "token",
                Bucket::Token(
                    TokenBucket::builder()
                        .rate(rate)
                        .capacity(capacity)
                        .build()
                        .unwrap(),
                ),
            ),
            (
                "leaky",
                Bucket::Leaky(
                    LeakyBucket::builder()
                        .rate(rate)
                        .capacity(capacity)
                        .build()
                        .unwrap(),
                ),
            ),
            (
                "funnel",
                Bucket::Funnel(
                    Funnel::builder()
                        .rate(rate)
                        .capacity(capacity)
                        .build()
                        .unwrap(),
                ),
            ),
        ]
    }

    fn limiter(&self) -> Arc<dyn Limiter> {
        match self {
            Bucket::Token(b) => Arc::new(b.clone()),
            Bucket::Leaky(b) => Arc::new(b.clone()),
            Bucket::Funnel(b) => Arc::new(b.clone()),
        }
    }

    fn set_rate(&self, rate: Rate) {
        match self {
            Bucket::Token(b) => b.set_rate(rate).unwrap(),
            Bucket::Leaky(b) => b.set_rate(rate).unwrap(),
            Bucket::Funnel(b) => b.set_rate(rate).unwrap(),
        }
    }
}

/// Waiters whose turn is far away (a day) or near (1 ms) when the rate
/// changes between the extremes, on every bucket kind (the funnel's
/// waiters keep their own timers, the others an actor's): the turn moves
/// with the water, both ways — a waiter a day away goes within a tick of
/// a change to 1/ns, and one due in a millisecond is not released then
/// after a change to 1/year, but a year later (its permit's water, and
/// the undrained rest of the one ahead, at the new rate).
#[tokio::test(start_paused = true)]
async fn far_and_near_waiters_follow_a_rate_change_between_extremes() {
    for (name, bucket) in Bucket::all(Rate::per_day(1), 2) {
        let limiter = bucket.limiter();
        // Full (for the shaper: the water a waiter waits behind).
        limiter
            .try_acquire_many(if name == "leaky" { 1 } else { 2 })
            .unwrap();
        let l = Arc::clone(&limiter);
        let far = tokio::spawn(async move { l.acquire().await });
        settle().await;
        time::advance(Duration::from_secs(3600)).await;
        settle().await;
        assert!(!far.is_finished(), "{name}: a day away");
        bucket.set_rate(Rate::every(NS));
        time::advance(Duration::from_millis(1)).await;
        settle().await;
        assert!(far.is_finished(), "{name}: due within a tick of the change");
        assert_eq!(far.await.unwrap(), Ok(()), "{name}");
    }
    for (name, bucket) in Bucket::all(Rate::per_second(1000), 2) {
        let limiter = bucket.limiter();
        limiter
            .try_acquire_many(if name == "leaky" { 1 } else { 2 })
            .unwrap();
        let start = Instant::now();
        let l = Arc::clone(&limiter);
        let near = tokio::spawn(async move {
            l.acquire().await.unwrap();
            Instant::now()
        });
        settle().await;
        // Half a permit of the water ahead of the waiter's turn is left:
        // it drains at 1/year.
        time::advance(Duration::from_micros(500)).await;
        settle().await;
        bucket.set_rate(Rate::every(YEAR));
        time::advance(Duration::from_millis(5)).await;
        settle().await;
        assert!(!near.is_finished(), "{name}: released at the old turn");
        // Half a permit ahead at 1/year: half a year after the change.
        let due = Duration::from_micros(500) + YEAR / 2;
        time::advance(minus(minus(due, start.elapsed()), NS)).await;
        settle().await;
        assert!(!near.is_finished(), "{name}: released before its turn");
        time::advance(Duration::from_millis(1)).await;
        settle().await;
        assert!(
            near.is_finished(),
            "{name}: not released a tick after its turn"
        );
        let released = near.await.unwrap() - start;
        assert!(
            released >= due,
            "{name}: released at {released:?}, due at {due:?}"
        );
    }
}

/// A waiter whose turn is a day away (1/day, capacity 1) keeps its place
/// when the rate changes to the fastest there is: it goes at once (its
/// water drains at the new rate), and one ns later the bucket serves at
/// 1/ns. And the other way: from 1/ns to 1/year mid-window, what was
/// undrained drains at the new rate, rounded up.
#[tokio::test(start_paused = true)]
async fn set_rate_between_extremes_with_a_waiter_a_day_away() {
    let bucket = TokenBucket::builder()
        .rate(Rate::per_day(1))
        .capacity(1)
        .build()
        .unwrap();
    bucket.try_acquire().unwrap();
    let b = bucket.clone();
    let waiter = tokio::spawn(async move { b.acquire().await });
    settle().await;
    assert_eq!(bucket.waiting(), 1);
    time::advance(Duration::from_secs(3600)).await;
    settle().await;
    assert!(!waiter.is_finished());
    // 23 h of one permit's water left, and the waiter's permit: at 1/ns,
    // two nanoseconds' water, of which the waiter's is due when one has
    // drained.
    bucket.set_rate(Rate::every(NS)).unwrap();
    time::advance(Duration::from_millis(1)).await;
    settle().await;
    assert!(waiter.is_finished(), "the waiter goes at the new rate");
    waiter.await.unwrap().unwrap();
    assert_eq!(bucket.try_acquire(), Ok(()));
    assert_eq!(bucket.try_acquire(), limited(NS));

    // From 1/ns, emptied, to 1/year: the one ns of water left is one
    // year's at the new rate.
    bucket.set_rate(Rate::every(YEAR)).unwrap();
    assert_eq!(bucket.try_acquire(), limited(YEAR));
    time::advance(minus(YEAR, NS)).await;
    assert_eq!(bucket.try_acquire(), limited(NS));
    time::advance(NS).await;
    assert_eq!(bucket.try_acquire(), Ok(()));
}

/// `acquire_timeout` with huge timeouts: `Duration::MAX` never times out,
/// a timeout of exactly the wait is granted at the turn, one ns less fails
/// at once — at a wait of 200 years.
#[tokio::test(start_paused = true)]
async fn acquire_timeout_with_huge_timeouts() {
    let wait = YEAR * 200;
    let bucket = TokenBucket::builder()
        .rate(Rate::every(wait))
        .capacity(1)
        .build()
        .unwrap();
    bucket.try_acquire().unwrap();
    assert_eq!(
        bucket.acquire_timeout(1, minus(wait, NS)).await,
        Err(AcquireError::Timeout)
    );
    assert_eq!(bucket.waiting(), 0);
    let start = Instant::now();
    let b = bucket.clone();
    let exact = tokio::spawn(async move { b.acquire_timeout(1, wait).await });
    settle().await;
    let b = bucket.clone();
    let never = tokio::spawn(async move { b.acquire_timeout(1, Duration::MAX).await });
    settle().await;
    assert_eq!(bucket.waiting(), 2);
    time::advance(minus(wait, Duration::from_millis(2))).await;
    settle().await;
    assert!(!exact.is_finished());
    time::advance(Duration::from_millis(3)).await;
    settle().await;
    assert_eq!(exact.await.unwrap(), Ok(()));
    assert!(start.elapsed() >= wait);
    assert!(!never.is_finished());
    time::advance(wait).await;
    settle().await;
    assert_eq!(never.await.unwrap(), Ok(()));
}

/// Several bands decided as one, as the docs of `Quota` say: a request
/// is granted when every band grants it, then every band is debited; a
/// refusal answers the latest band's wait.
#[derive(Debug, Clone)]
struct Bands(Vec<Model>);

impl Bands {
    fn new(quota: &Quota) -> Bands {
        Bands(
            quota
                .bands()
                .iter()
                .map(|b| Model::new(b.rate(), b.capacity()))
                .collect(),
        )
    }

    fn try_pour(&mut self, now: Duration, n: u32) -> Result<(), TryAcquireError> {
        let mut trial = self.0.clone();
        let mut wait = None;
        for band in &mut trial {
            if let Err(w) = band.try_pour(now, n) {
                wait = wait.max(Some(w));
            }
        }
        match wait {
            None => {
                self.0 = trial;
                Ok(())
            }
            Some(retry_after) => Err(TryAcquireError::Limited { retry_after }),
        }
    }

    fn peek(&self, now: Duration, n: u32) -> Result<(), TryAcquireError> {
        self.clone().try_pour(now, n)
    }

    fn states(&self, now: Duration) -> Vec<(u32, Duration, Duration)> {
        self.0.iter().map(|b| b.state(now)).collect()
    }
}

/// Every meter that decides a one-key GCRA: the three buckets, the keyed
/// funnel's key 0, a `Keyed` map of token buckets' key 0 — as `try` (the
/// decision) and `peek` (what it would answer).
struct Meters {
    quota: Quota,
    all: Vec<(&'static str, Arc<dyn Limiter>)>,
    keyed: KeyedFunnel<u64>,
    generic: Keyed<u64, TokenBucket>,
}

impl Meters {
    fn new(quota: Quota) -> Meters {
        let all: Vec<(&'static str, Arc<dyn Limiter>)> = vec![
            (
                "token",
                Arc::new(TokenBucket::builder().quota(quota).build().unwrap()),
            ),
            (
                "leaky",
                Arc::new(LeakyBucket::builder().quota(quota).build().unwrap()),
            ),
            (
                "funnel",
                Arc::new(Funnel::builder().quota(quota).build().unwrap()),
            ),
        ];
        let keyed = KeyedFunnel::builder()
            .quota(quota)
            .background_sweep(false)
            .build()
            .unwrap();
        let generic = Keyed::builder()
            .limiter(move || TokenBucket::builder().quota(quota).build())
            .background_sweep(false)
            .build()
            .unwrap();
        Meters {
            quota,
            all,
            keyed,
            generic,
        }
    }

    /// Every meter's answer to `n` now, the peek before it checked against
    /// the decision, and every band's state (before the decision, and for
    /// the keyed funnel's `try_acquire_and_peek` after it) against the
    /// model's.
    fn try_many(
        &self,
        n: u32,
        model: &Bands,
        now: Duration,
    ) -> Vec<(&'static str, Result<(), TryAcquireError>)> {
        let states = |peek: &Peek| -> Vec<(u32, Duration, Duration)> {
            peek.bands()
                .map(|b| (b.available, b.full_in, b.next_in))
                .collect()
        };
        let before = model.states(now);
        let mut out = Vec::new();
        for (name, l) in &self.all {
            let peek = l.peek(n).unwrap();
            assert_eq!(states(&peek), before, "{name}: band states at {now:?}");
            let answer = l.try_acquire_many(n);
            assert_eq!(peek.answer(), answer, "{name}: peek({n}) then try");
            out.push((*name, answer));
        }
        assert_eq!(
            self.keyed.free(&0),
            before.iter().map(|s| s.0).min().unwrap(),
            "keyed free"
        );
        assert_eq!(
            self.keyed.empty_in(&0),
            before.iter().map(|s| s.1).max().unwrap(),
            "keyed empty_in"
        );
        let peeked = self.keyed.peek(&0, n);
        assert_eq!(states(&peeked), before, "keyed: band states at {now:?}");
        let peek = self.keyed.try_acquire_and_peek(&0, None, n);
        assert_eq!(peeked.answer(), peek.answer(), "keyed: peek({n}) then try");
        let mut after = model.clone();
        let _ = after.try_pour(now, n);
        assert_eq!(states(&peek), after.states(now), "keyed: band states after");
        out.push(("keyed", peek.answer()));
        let peeked = self.generic.peek(&0, n);
        if let Some(peeked) = &peeked {
            assert_eq!(states(peeked), before, "generic: band states at {now:?}");
        }
        let answer = self.generic.try_acquire_many(&0, n);
        if let Some(peeked) = peeked {
            assert_eq!(peeked.answer(), answer, "generic: peek({n}) then try");
        }
        out.push(("generic", answer));
        out
    }
}

/// A walk of requests against the model: each step waits (nothing, 1 ns,
/// the last refusal's `retry_after` or 1 ns less, or a random part of the
/// deepest band), then asks for a fraction of the capacity.
async fn walk(meters: &Meters, model: &mut Bands, start: Instant, steps: &[(u8, u64, u8)]) {
    let capacity = meters.quota.capacity();
    let deepest = meters
        .quota
        .bands()
        .iter()
        .map(|b| b.rate().interval().as_nanos() * u128::from(b.capacity()))
        .max()
        .unwrap();
    let mut last_wait = Duration::ZERO;
    for (i, &(gap, r, frac)) in steps.iter().enumerate() {
        let gap = match gap % 9 {
            0 => Duration::ZERO,
            1 => NS,
            2 => last_wait,
            3 => last_wait.saturating_sub(NS),
            // Sweeps of both maps, then the step's request at once.
            4 => {
                meters.keyed.sweep();
                meters.generic.sweep();
                Duration::ZERO
            }
            // Up to ten years idle.
            5 => Duration::from_nanos(r % (10 * u64::try_from(YEAR.as_nanos()).unwrap())),
            _ => Duration::from_nanos(u64::try_from(u128::from(r) % (deepest + 2)).unwrap()),
        };
        // Past 2⁶⁴ ns the clock stands still (finding 1): stay within it.
        if start.elapsed() + gap > YEAR * 580 {
            break;
        }
        time::advance(gap).await;
        let n = match frac % 4 {
            0 => 1,
            1 => capacity,
            _ => u32::try_from(u64::from(capacity) * u64::from(frac) / 256)
                .unwrap()
                .max(1),
        };
        let now = start.elapsed();
        let expected = model.peek(now, n);
        for (name, answer) in meters.try_many(n, model, now) {
            assert_eq!(answer, expected, "step {i} at {now:?}: {name} n {n}");
        }
        let _ = model.try_pour(now, n);
        if let Err(TryAcquireError::Limited { retry_after }) = expected {
            last_wait = retry_after;
        }
    }
}

/// A rate and how far into a limiter's life its scaled time passes 2⁶²
/// (the narrow cell word's limit, and the keyed maps' horizon) in ns.
fn rate_and_edge() -> impl Strategy<Value = (Rate, u64)> {
    prop_oneof![
        Just(Rate::per_second(999_983)),
        Just(Rate::per(4_294_967_291, Duration::from_secs(5))),
        Just(Rate::per(7, Duration::from_millis(1))),
        Just(Rate::every(NS)),
        Just(Rate::per_second(3)),
    ]
    .prop_map(|rate| {
        let den = Model::new(rate, 1).den;
        (rate, u64::try_from((1u128 << 62) / den).unwrap())
    })
}

fn capacity() -> impl Strategy<Value = u32> {
    prop_oneof![Just(1), Just(2), Just(1000), Just(u32::MAX), 1..100u32]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Every meter agrees with the model (and its own peek) on a walk of
    /// requests that starts just before its scaled time passes 2⁶² units —
    /// where the cell's narrow word widens and the keyed map's horizon ends
    /// — and crosses it, after a first request at its origin.
    #[test]
    fn meters_agree_with_the_model_across_the_narrow_limit(
        (rate, edge) in rate_and_edge(),
        capacity in capacity(),
        before in 0u64..3_000,
        steps in proptest::collection::vec((any::<u8>(), any::<u64>(), any::<u8>()), 1..40),
    ) {
        run(async move {
            let quota = Quota::new(rate, capacity);
            let meters = Meters::new(quota);
            let mut model = Bands::new(&quota);
            let start = Instant::now();
            walk(&meters, &mut model, start, &[(0, 0, 0)]).await;
            time::advance(Duration::from_nanos(edge.saturating_sub(before))).await;
            walk(&meters, &mut model, start, &steps).await;
        });
    }

    /// Two bands of very different depths (a fast one and one per day or
    /// per year), and sometimes a third, across the same edges: every meter
    /// agrees with the model.
    #[test]
    fn two_band_meters_agree_with_the_model_across_the_narrow_limit(
        (rate, edge) in rate_and_edge(),
        capacity in capacity(),
        slow in prop_oneof![
            Just(Band2(Rate::per_day(1), 1)),
            Just(Band2(Rate::every(YEAR), 1)),
            Just(Band2(Rate::per(5, YEAR), 3)),
            Just(Band2(Rate::per_day(1000), 1000)),
        ],
        third in any::<bool>(),
        before in 0u64..3_000,
        steps in proptest::collection::vec((any::<u8>(), any::<u64>(), any::<u8>()), 1..40),
    ) {
        run(async move {
            let mut quota = Quota::new(rate, capacity).and(slow.0, slow.1);
            if third {
                // Three bands: the keyed funnel's locked word.
                quota = quota.and(Rate::per(3, Duration::from_secs(7)), 5);
            }
            let meters = Meters::new(quota);
            let mut model = Bands::new(&quota);
            let start = Instant::now();
            walk(&meters, &mut model, start, &[(0, 0, 0)]).await;
            time::advance(Duration::from_nanos(edge.saturating_sub(before))).await;
            walk(&meters, &mut model, start, &steps).await;
        });
    }
}

/// A smooth limiter's configuration, for the pure state and the limiter.
#[derive(Debug, Clone, Copy)]
enum Smooth {
    Bursty(f64, Duration),
    Warming(f64, Duration),
}

impl Smooth {
    fn state(self) -> SmoothState {
        match self {
            Smooth::Bursty(rate, burst) => SmoothState::bursty(rate, burst).unwrap(),
            Smooth::Warming(rate, warmup) => SmoothState::warming_up(rate, warmup, 3.0).unwrap(),
        }
    }

    fn limiter(self) -> (Arc<dyn Limiter>, SetRate) {
        match self {
            Smooth::Bursty(rate, burst) => {
                let l = SmoothBursty::builder()
                    .permits_per_second(rate)
                    .max_burst(burst)
                    .build()
                    .unwrap();
                let set = l.clone();
                (Arc::new(l), Box::new(move |r| set.set_rate(r).unwrap()))
            }
            Smooth::Warming(rate, warmup) => {
                let l = SmoothWarmingUp::builder()
                    .permits_per_second(rate)
                    .warmup(warmup)
                    .build()
                    .unwrap();
                let set = l.clone();
                (Arc::new(l), Box::new(move |r| set.set_rate(r).unwrap()))
            }
        }
    }
}

/// A smooth limiter's `set_rate`.
type SetRate = Box<dyn Fn(f64)>;

const SMOOTH_RATES: [f64; 6] = [1e9, 1e6, 1_000_003.0, 999_983.0, 3.0, 0.001];

fn smooth() -> impl Strategy<Value = Smooth> {
    let rate = proptest::sample::select(SMOOTH_RATES.to_vec());
    let span = prop_oneof![
        Just(Duration::ZERO),
        Just(Duration::from_secs(1)),
        Just(DAY)
    ];
    (rate, span, any::<bool>()).prop_map(|(rate, span, bursty)| {
        if bursty {
            Smooth::Bursty(rate, span)
        } else {
            Smooth::Warming(rate, span.max(Duration::from_millis(1)))
        }
    })
}

/// 2⁶⁴ ps: where the smooth limiters' grant leaves 64-bit arithmetic.
const PS_EDGE: Duration = Duration::from_nanos(18_446_744_073_709_552);

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// The smooth limiters' `try_acquire_many` answers as Guava's state
    /// machine (`algorithm::SmoothState`, documented as what they call)
    /// driven at the same instants, across 2⁶⁴ ps (213 days) where the
    /// grant's 64-bit path hands over to the general one, at the fastest
    /// rate, across the µs/ps unit switch and at the slowest: granted when
    /// the debt is paid by now, else refused with the exact time to the
    /// next free ticket.
    #[test]
    fn smooth_limiters_agree_with_their_state_across_2_64_picoseconds(
        config in smooth(),
        before in prop_oneof![Just(0u64), 0u64..5_000, 0u64..5_000_000_000],
        steps in proptest::collection::vec((any::<u8>(), any::<u64>(), any::<u8>()), 1..40),
    ) {
        run(async move {
            let mut state = config.state();
            let (limiter, set_rate) = config.limiter();
            let start = Instant::now();
            let interval = Duration::from_secs_f64(1.0 / match config {
                Smooth::Bursty(r, _) | Smooth::Warming(r, _) => r,
            });
            let mut last_wait = Duration::ZERO;
            let mut first = true;
            for (i, &(gap, r, n)) in steps.iter().enumerate() {
                let gap = if first {
                    first = false;
                    PS_EDGE.saturating_sub(Duration::from_nanos(before))
                } else {
                    match gap % 7 {
                        0 => Duration::ZERO,
                        1 => NS,
                        2 => last_wait,
                        3 => last_wait.saturating_sub(NS),
                        // A change of rate between the extremes, then the
                        // step's request at once.
                        4 => {
                            let rate = SMOOTH_RATES[usize::try_from(r % 6).unwrap()];
                            let now = start.elapsed();
                            state.set_rate(now, rate).unwrap();
                            set_rate(rate);
                            Duration::ZERO
                        }
                        _ => Duration::from_nanos(
                            u64::try_from(u128::from(r) % (interval.as_nanos() * 4 + 2)).unwrap(),
                        ),
                    }
                };
                time::advance(gap).await;
                let n = u32::from(n % 5) + 1;
                let now = start.elapsed();
                let ticket = state.next_free();
                let expected = match state.try_reserve(now, n, Duration::ZERO) {
                    Some(_) => Ok(()),
                    None => limited(ticket.saturating_sub(now)),
                };
                let answer = limiter.try_acquire_many(n);
                prop_assert_eq!(answer, expected, "step {} at {:?}: n {}", i, now, n);
                if let Err(TryAcquireError::Limited { retry_after }) = answer {
                    last_wait = retry_after;
                }
            }
            Ok(())
        })?;
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// The smooth limiters' waiters at extreme rates (10⁹/s, either side of
    /// the µs/ps unit switch, 3/s, 0.001/s), arriving in two bursts: each is
    /// released on the first tick at or after the turn Guava's state machine
    /// gives it at its arrival, never a nanosecond before; then the state
    /// is the machine's.
    #[test]
    fn smooth_waiters_at_extreme_rates_go_at_their_turn(
        config in smooth(),
        bursts in proptest::collection::vec(
            (0u64..5_000_000_000, proptest::collection::vec((0u64..400_000, 1u32..5), 1..10)),
            1..3,
        ),
    ) {
        run(async move {
            let mut state = config.state();
            let (limiter, _) = config.limiter();
            let start = Instant::now();
            for (b, (idle, arrivals)) in bursts.iter().enumerate() {
                let idle = if b == 0 { 0 } else { u128::from(*idle) };
                let to = (start.elapsed().as_nanos() + idle).div_ceil(1_000_000) * 1_000_000 + 600_000;
                time::advance(minus(from_nanos(to), start.elapsed())).await;
                let mut pending = std::collections::VecDeque::new();
                let mut at = to;
                for &(offset, n) in arrivals {
                    at = at.max(to + u128::from(offset));
                    time::advance(minus(from_nanos(at), start.elapsed())).await;
                    let now = start.elapsed();
                    let turn = (now + state.reserve(now, n)).as_nanos();
                    let l = Arc::clone(&limiter);
                    let handle = tokio::spawn(async move { l.acquire_many(n).await });
                    settle().await;
                    if turn <= now.as_nanos() {
                        prop_assert!(handle.is_finished(), "{:?}: due at once", config);
                        prop_assert_eq!(handle.await.unwrap(), Ok(()));
                    } else {
                        pending.push_back((turn, handle));
                    }
                }
                while let Some((turn, handle)) = pending.pop_front() {
                    if turn > (YEAR * 580).as_nanos() {
                        return Ok(());
                    }
                    let now = start.elapsed().as_nanos();
                    if now < turn - 1 {
                        time::advance(from_nanos(turn - 1 - now)).await;
                        settle().await;
                        prop_assert!(!handle.is_finished(), "{:?}: released before its turn {}", config, turn);
                    }
                    if !handle.is_finished() {
                        time::advance(Duration::from_millis(1)).await;
                        settle().await;
                    }
                    prop_assert!(handle.is_finished(), "{:?}: not released a tick after its turn {}", config, turn);
                    prop_assert_eq!(handle.await.unwrap(), Ok(()));
                }
            }
            let now = start.elapsed();
            let ticket = state.next_free();
            let expected = match state.try_reserve(now, 1, Duration::ZERO) {
                Some(_) => Ok(()),
                None => limited(ticket.saturating_sub(now)),
            };
            prop_assert_eq!(limiter.try_acquire(), expected, "{:?}: the state after", config);
            Ok(())
        })?;
    }
}

/// One key's stored instants under tiers, as `KeyedFunnelBuilder::tier`
/// documents them: one instant per band index, whichever tier reads it;
/// a tier decides with its own rate and capacity on the bands it has, and
/// leaves the others as they are. Instants are kept in units of 1/`den` ns
/// per band index (the least common multiple of the tiers' units there).
#[derive(Debug, Clone)]
struct Tiered {
    /// Per tier, per band: (interval in the band index's units, capacity).
    tiers: Vec<Vec<(u128, u128)>>,
    den: Vec<u128>,
    tats: Vec<u128>,
}

impl Tiered {
    fn new(quotas: &[Quota]) -> Tiered {
        let most = quotas.iter().map(|q| q.bands().len()).max().unwrap();
        let mut den = vec![1u128; most];
        for q in quotas {
            for (b, band) in q.bands().iter().enumerate() {
                let m = Model::new(band.rate(), 1);
                den[b] = den[b] / gcd(den[b], m.den) * m.den;
            }
        }
        let tiers = quotas
            .iter()
            .map(|q| {
                q.bands()
                    .iter()
                    .enumerate()
                    .map(|(b, band)| {
                        let m = Model::new(band.rate(), 1);
                        (m.num * (den[b] / m.den), u128::from(band.capacity()))
                    })
                    .collect()
            })
            .collect();
        Tiered {
            tiers,
            tats: vec![0; most],
            den,
        }
    }

    fn try_pour(&mut self, tier: usize, now: Duration, n: u32) -> Result<(), TryAcquireError> {
        let mut ends = self.tats.clone();
        let mut wait: Option<Duration> = None;
        for (b, &(num, capacity)) in self.tiers[tier].iter().enumerate() {
            let now = now.as_nanos() * self.den[b];
            let end = self.tats[b].max(now) + u128::from(n) * num;
            if end - now <= capacity * num {
                ends[b] = end;
            } else {
                wait = wait.max(Some(from_nanos(
                    (end - now - capacity * num).div_ceil(self.den[b]),
                )));
            }
        }
        match wait {
            None => {
                self.tats = ends;
                Ok(())
            }
            Some(retry_after) => Err(TryAcquireError::Limited { retry_after }),
        }
    }
}

/// Sets of tiers: keys of one 128-bit word (small units), of the locked
/// word (a unit finer than 2²⁰ per ns, a third band), and of one band.
fn tier_sets() -> Vec<Vec<Quota>> {
    vec![
        vec![
            Quota::new(Rate::per(7, Duration::from_millis(1)), 7).and(Rate::every(YEAR), 2),
            Quota::new(Rate::per_second(3), 5),
            Quota::new(Rate::per_second(1000), 1000).and(Rate::per_day(1000), 1000),
        ],
        vec![
            Quota::new(Rate::per_second(999_983), 1000).and(Rate::per(5, YEAR), 3),
            Quota::new(Rate::per_second(3), 5)
                .and(Rate::per_day(1), 1)
                .and(Rate::per(4_294_967_291, Duration::from_secs(5)), 10),
            Quota::new(Rate::per_second(7), 7),
        ],
        // One band each: the narrow 64-bit word, and the 128-bit one (a
        // common unit of 1/2 999 949 ns).
        vec![
            Quota::new(Rate::per(7, Duration::from_millis(1)), 7),
            Quota::new(Rate::per_second(3), 5),
            Quota::new(Rate::per_day(1000), 1000),
        ],
        vec![
            Quota::new(Rate::per_second(999_983), 1000),
            Quota::new(Rate::per_second(3), 5),
        ],
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// A key used under tiers in turn (and the map's own quota switched
    /// with `set_quota`), across the map's horizon, sweeps and years of
    /// idle: every answer is the documented tier rule's.
    #[test]
    fn a_key_under_tiers_across_epochs_keeps_its_instants(
        set in 0..4usize,
        steps in proptest::collection::vec((any::<u8>(), any::<u64>(), any::<u8>(), 0..3usize), 1..60),
    ) {
        run(async move {
            let quotas = &tier_sets()[set];
            let mut builder = KeyedFunnel::<u64>::builder();
            builder.quota(quotas[0]).background_sweep(false);
            for q in &quotas[1..] {
                builder.tier(*q);
            }
            let map = builder.build().unwrap();
            let mut model = Tiered::new(quotas);
            let start = Instant::now();
            for (i, &(gap, r, frac, tier)) in steps.iter().enumerate() {
                let gap = match gap % 6 {
                    0 => Duration::ZERO,
                    1 => NS,
                    2 => {
                        map.sweep();
                        Duration::ZERO
                    }
                    3 => Duration::from_nanos(r % (10 * u64::try_from(YEAR.as_nanos()).unwrap())),
                    4 => Duration::from_nanos(r % 10_000_000_000),
                    _ => Duration::from_nanos(r % 3_600_000_000_000),
                };
                if start.elapsed() + gap > YEAR * 580 {
                    break;
                }
                time::advance(gap).await;
                let tier = tier % quotas.len();
                let quota = quotas[tier];
                let capacity = quota.capacity();
                let n = u32::try_from(u64::from(capacity) * u64::from(frac) / 255).unwrap().max(1);
                let now = start.elapsed();
                let expected = model.try_pour(tier, now, n);
                let answer = if frac % 5 == 0 {
                    map.set_quota(quota).unwrap();
                    map.try_acquire_many(&0, n)
                } else {
                    map.try_acquire_with(&0, &quota, n)
                };
                prop_assert_eq!(answer, expected, "step {} at {:?}: tier {} n {}", i, now, tier, n);
            }
            Ok(())
        })?;
    }
}

#[derive(Debug, Clone, Copy)]
struct Band2(Rate, u32);

/// "`Duration::MAX` never times out" (`TokenBucket`, `Funnel`,
/// `LeakyBucket::acquire_timeout`; the `Limiter` trait: "`Duration::MAX`
/// waits as long as it takes"). At the slowest rate (one permit per
/// `u64::MAX` ns) and the largest capacity, a request's turn can be
/// further away than `Duration::MAX` itself (2⁹⁶ ns against 2⁶⁴ s): such a
/// request with a `Duration::MAX` timeout must wait (as `acquire_many`
/// does), not fail at once with `Timeout`. The same for a quota.
#[tokio::test(start_paused = true)]
async fn a_duration_max_timeout_never_times_out_even_beyond_duration_max() {
    let slowest = Rate::every(Duration::from_nanos(u64::MAX));
    let one = Quota::new(slowest, u32::MAX);
    let two = one.and(Rate::per_second(1), u32::MAX);
    let mut answers = Vec::new();
    for quota in [one, two] {
        let limiters: Vec<(&str, Arc<dyn Limiter>)> = vec![
            (
                "token",
                Arc::new(TokenBucket::builder().quota(quota).build().unwrap()),
            ),
            (
                "leaky",
                Arc::new(LeakyBucket::builder().quota(quota).build().unwrap()),
            ),
            (
                "funnel",
                Arc::new(Funnel::builder().quota(quota).build().unwrap()),
            ),
        ];
        for (name, limiter) in limiters {
            if name == "leaky" && quota.bands().len() > 1 {
                // A shaper's request that waits longer than another band
                // takes to drain overflows (documented).
                continue;
            }
            // Water ahead of the request: all of it (a shaper's request
            // must fit, so it leaves one unit for the request).
            let (ahead, n) = if name == "leaky" {
                (u32::MAX - 1, 1)
            } else {
                (u32::MAX, u32::MAX)
            };
            limiter.try_acquire_many(ahead).unwrap();
            let l = Arc::clone(&limiter);
            let no_timeout = tokio::spawn(async move { l.acquire_many(n).await });
            settle().await;
            assert!(
                !no_timeout.is_finished(),
                "{name} {quota:?}: acquire_many waits"
            );
            no_timeout.abort();
            settle().await;
            let l = Arc::clone(&limiter);
            let max_timeout =
                tokio::spawn(async move { l.acquire_timeout(n, Duration::MAX).await });
            settle().await;
            if max_timeout.is_finished() {
                answers.push(format!(
                    "{name} {quota:?}: {:?}",
                    max_timeout.await.unwrap()
                ));
            }
        }
    }
    assert!(
        answers.is_empty(),
        "acquire_timeout(n, Duration::MAX) did not wait:\n{}",
        answers.join("\n")
    );
}

/// A map's sweeper at the longest `sweep_interval` (`Duration::MAX`, which
/// the builders accept: only zero is refused) keeps serving the map: when
/// the map stops being empty it sweeps, and drops a fresh key. "Bad input
/// gets a clear error, never a panic."
#[tokio::test(start_paused = true)]
async fn a_sweeper_with_the_longest_interval_keeps_sweeping() {
    let map: Keyed<u64, TokenBucket> = Keyed::builder()
        .limiter(|| {
            TokenBucket::builder()
                .rate(Rate::per_second(1))
                .capacity(1)
                .build()
        })
        .sweep_interval(Duration::MAX)
        .build()
        .unwrap();
    // The first key wakes the sweeper: it sweeps (the key is in use), and
    // then waits for the interval, or to be woken.
    assert_eq!(map.try_acquire(&1), Ok(()));
    settle().await;
    time::advance(Duration::from_secs(2)).await;
    settle().await;
    // Drained, and dropped by hand: the map is empty again.
    assert_eq!(map.sweep(), 0);
    assert_eq!(map.len(), 0);
    // A fresh key (built and let go) makes it non-empty: the sweeper is
    // woken and drops it.
    drop(map.get(&2));
    assert_eq!(map.len(), 1);
    settle().await;
    assert_eq!(map.len(), 0, "the sweeper did not sweep");
}

/// `acquire_timeout` at rates whose interval is not a whole nanosecond,
/// and for a quota whose bands count in different units: a timeout one ns
/// short of the exact wait (rounded up to a nanosecond, as `retry_after`
/// says) fails at once and reserves nothing; the exact one is granted, on
/// the tick of its turn, never before it.
#[tokio::test(start_paused = true)]
async fn acquire_timeout_at_the_exact_wait_for_fractional_intervals() {
    let quotas = [
        Quota::new(Rate::per_second(3), 1),
        Quota::new(Rate::per(7, Duration::from_millis(1)), 7),
        Quota::new(Rate::per(4_294_967_291, Duration::from_secs(5)), 1),
        Quota::new(Rate::per(7, Duration::from_millis(1)), 7).and(Rate::per_second(3), 2),
        Quota::new(Rate::per_second(3), 2).and(Rate::every(YEAR), 3),
    ];
    for quota in quotas {
        let limiters: Vec<(&str, Arc<dyn Limiter>)> = vec![
            (
                "token",
                Arc::new(TokenBucket::builder().quota(quota).build().unwrap()),
            ),
            (
                "funnel",
                Arc::new(Funnel::builder().quota(quota).build().unwrap()),
            ),
        ];
        for (name, limiter) in limiters {
            let what = format!("{name} {quota:?}");
            let capacity = quota.capacity();
            limiter.try_acquire_many(capacity).unwrap();
            let wait = retry_after(limiter.try_acquire());
            let start = Instant::now();
            assert_eq!(
                limiter.acquire_timeout(1, minus(wait, NS)).await,
                Err(AcquireError::Timeout),
                "{what}"
            );
            assert_eq!(start.elapsed(), Duration::ZERO, "{what}: failed at once");
            assert_eq!(
                limiter.peek(1).unwrap().retry_after(),
                Some(wait),
                "{what}: nothing reserved"
            );
            let l = Arc::clone(&limiter);
            let exact = tokio::spawn(async move {
                l.acquire_timeout(1, wait).await?;
                Ok::<_, AcquireError>(Instant::now())
            });
            settle().await;
            time::advance(minus(wait, NS)).await;
            settle().await;
            assert!(!exact.is_finished(), "{what}: released before its turn");
            time::advance(Duration::from_millis(1)).await;
            settle().await;
            assert!(
                exact.is_finished(),
                "{what}: not released on the tick of its turn"
            );
            let at = exact
                .await
                .unwrap()
                .unwrap_or_else(|e| panic!("{what}: {e}"));
            assert!(at - start >= wait, "{what}");
        }
    }
}

/// The model's reservation for a waiter arriving at `now`: the token rule
/// (granted once the bucket is back within its capacity) or, for the
/// leaky bucket's shaper, the water rule (once the water ahead drained;
/// `None`: overflow, nothing poured). The turn in ns, rounded up.
fn reserve(model: &mut Model, now: Duration, n: u32, water: bool) -> Option<u128> {
    let now = model.scaled(now);
    let cost = u128::from(n) * model.num;
    let tau = model.capacity * model.num;
    let end = model.tat.max(now) + cost;
    if water && end - now > tau {
        return None;
    }
    model.tat = end;
    let ready = if water {
        end - cost
    } else {
        end.saturating_sub(tau)
    };
    Some(ready.div_ceil(model.den))
}

/// The documented rule of a quota's waiter: its turn is the earliest
/// instant every band lets it go (the latest of the bands' own turns, and
/// its arrival); it is poured into every band at that turn, in each band's
/// units rounded up there. A shaper's request overflows when some band
/// would hold more than its capacity at `now`. The turn in ns, rounded up.
fn reserve_bands(model: &mut Bands, now: Duration, n: u32, water: bool) -> Option<u128> {
    let readies: Vec<(u128, u128)> = model
        .0
        .iter()
        .map(|m| {
            let end = m.tat.max(m.scaled(now)) + u128::from(n) * m.num;
            let ready = if water {
                end - u128::from(n) * m.num
            } else {
                end.saturating_sub(m.capacity * m.num)
            };
            (ready, m.den)
        })
        .collect();
    let mut turn = now.as_nanos();
    let mut ends = Vec::new();
    for m in &model.0 {
        let mut at = m.scaled(now);
        for &(ready, den) in &readies {
            at = at.max((ready * m.den).div_ceil(den));
        }
        turn = turn.max(at.div_ceil(m.den));
        let end = m.tat.max(at) + u128::from(n) * m.num;
        if water && end - m.scaled(now).min(end) > m.capacity * m.num {
            return None;
        }
        ends.push(end);
    }
    for (m, end) in model.0.iter_mut().zip(ends) {
        m.tat = end;
    }
    Some(turn)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Waiters on quotas of two bands in different units and of very
    /// different depths, on every bucket kind: each goes on the first tick
    /// at or after the turn the documented rule gives it, never before,
    /// and the bucket ends in the model's state.
    #[test]
    fn quota_waiters_go_at_their_exact_turn(
        quota in proptest::sample::select(vec![
            Quota::new(Rate::per(7, Duration::from_millis(1)), 7).and(Rate::per_second(3), 2),
            Quota::new(Rate::per_second(3), 3).and(Rate::per_day(1), 2),
            Quota::new(Rate::per(4_294_967_291, Duration::from_secs(5)), 1000).and(Rate::per_second(999_983), 10),
            Quota::new(Rate::every(NS), u32::MAX).and(Rate::per(7, DAY), 7),
            Quota::new(Rate::per_second(1000), 10).and(Rate::every(YEAR), 3),
        ]),
        kind in 0..3u8,
        bursts in proptest::collection::vec(
            (any::<u64>(), proptest::collection::vec((0u64..400_000, any::<u8>()), 1..10)),
            1..3,
        ),
    ) {
        run(async move {
            let (name, limiter): (&str, Arc<dyn Limiter>) = match kind {
                0 => ("token", Arc::new(TokenBucket::builder().quota(quota).build().unwrap())),
                1 => ("leaky", Arc::new(LeakyBucket::builder().quota(quota).build().unwrap())),
                _ => ("funnel", Arc::new(Funnel::builder().quota(quota).build().unwrap())),
            };
            let water = name == "leaky";
            let capacity = quota.capacity();
            let start = Instant::now();
            let mut model = Bands::new(&quota);
            let deepest = quota
                .bands()
                .iter()
                .map(|b| b.rate().interval().as_nanos() * u128::from(b.capacity()))
                .max()
                .unwrap();
            for (b, (idle, arrivals)) in bursts.iter().enumerate() {
                let idle = if b == 0 { 0 } else { u128::from(*idle) % (deepest.min(1 << 60) + 2) };
                let to = (start.elapsed().as_nanos() + idle).div_ceil(1_000_000) * 1_000_000 + 600_000;
                time::advance(minus(from_nanos(to), start.elapsed())).await;
                let mut pending = std::collections::VecDeque::new();
                let mut at = to;
                for &(offset, frac) in arrivals {
                    at = at.max(to + u128::from(offset));
                    time::advance(minus(from_nanos(at), start.elapsed())).await;
                    let n = match frac % 3 {
                        0 => 1,
                        1 => capacity,
                        _ => u32::try_from(u64::from(capacity) * u64::from(frac) / 256).unwrap().max(1),
                    };
                    let turn = reserve_bands(&mut model, start.elapsed(), n, water);
                    let l = Arc::clone(&limiter);
                    let handle = tokio::spawn(async move { l.acquire_many(n).await });
                    settle().await;
                    let now = start.elapsed();
                    let peek = limiter.peek(1).unwrap();
                    prop_assert_eq!(peek.answer(), model.peek(now, 1), "{} {:?}: peek with waiters", name, quota);
                    let states: Vec<_> = peek.bands().map(|b| (b.available, b.full_in, b.next_in)).collect();
                    prop_assert_eq!(states, model.states(now), "{} {:?}: band states with waiters", name, quota);
                    match turn {
                        None => {
                            prop_assert!(handle.is_finished(), "{} {:?}: overflow at once", name, quota);
                            prop_assert_eq!(handle.await.unwrap(), Err(AcquireError::Overflow));
                        }
                        Some(turn) if turn <= start.elapsed().as_nanos() => {
                            prop_assert!(handle.is_finished(), "{} {:?}: due now, n {}", name, quota, n);
                            prop_assert_eq!(handle.await.unwrap(), Ok(()));
                        }
                        Some(turn) => pending.push_back((turn, handle)),
                    }
                }
                while let Some((turn, handle)) = pending.pop_front() {
                    if turn > (YEAR * 580).as_nanos() {
                        return Ok(());
                    }
                    let now = start.elapsed().as_nanos();
                    if now < turn - 1 {
                        time::advance(from_nanos(turn - 1 - now)).await;
                        settle().await;
                        prop_assert!(!handle.is_finished(), "{} {:?}: released before its turn {}", name, quota, turn);
                    }
                    if !handle.is_finished() {
                        time::advance(Duration::from_millis(1)).await;
                        settle().await;
                    }
                    prop_assert!(handle.is_finished(), "{} {:?}: not released a tick after its turn {}", name, quota, turn);
                    prop_assert_eq!(handle.await.unwrap(), Ok(()));
                }
            }
            let now = start.elapsed();
            prop_assert_eq!(limiter.try_acquire(), model.try_pour(now, 1), "{} {:?}: the state after", name, quota);
            Ok(())
        })?;
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Waiters at the extremes (1/ns, fractional intervals, a unit near
    /// 2⁻³² ns, a day per permit; capacity 1 to u32::MAX), arriving in two
    /// bursts with an idle gap between: each is released on the first tick
    /// at or after its exact turn, in order, never a nanosecond before it
    /// (a shaper's request that does not fit overflows), and afterwards
    /// the bucket's state is the model's: no permit lost or given.
    #[test]
    fn waiters_at_the_extremes_go_at_their_exact_turn(
        rate in prop_oneof![
            Just(Rate::every(NS)),
            Just(Rate::per(7, Duration::from_millis(1))),
            Just(Rate::per_second(3)),
            Just(Rate::per(4_294_967_291, Duration::from_secs(5))),
            Just(Rate::per_day(1)),
            Just(Rate::per_second(999_983)),
        ],
        capacity in capacity(),
        kind in 0..3u8,
        bursts in proptest::collection::vec(
            (any::<u64>(), proptest::collection::vec((0u64..400_000, any::<u8>()), 1..12)),
            1..3,
        ),
    ) {
        run(async move {
            let (name, limiter): (&str, Arc<dyn Limiter>) = match kind {
                0 => ("token", Arc::new(TokenBucket::builder().rate(rate).capacity(capacity).build().unwrap())),
                1 => ("leaky", Arc::new(LeakyBucket::builder().rate(rate).capacity(capacity).build().unwrap())),
                _ => ("funnel", Arc::new(Funnel::builder().rate(rate).capacity(capacity).build().unwrap())),
            };
            let water = name == "leaky";
            let start = Instant::now();
            let mut model = Model::new(rate, capacity);
            let deepest = rate.interval().as_nanos() * u128::from(capacity);
            for (b, (idle, arrivals)) in bursts.iter().enumerate() {
                // Each burst starts on a tick (plus 600 µs): no arrival is
                // within the timer credit's grace of a release.
                let idle = if b == 0 { 0 } else { u128::from(*idle) % (deepest.min(1 << 60) + 2) };
                let to = (start.elapsed().as_nanos() + idle).div_ceil(1_000_000) * 1_000_000 + 600_000;
                time::advance(minus(from_nanos(to), start.elapsed())).await;
                let mut pending = std::collections::VecDeque::new();
                let mut at = to;
                for &(offset, frac) in arrivals {
                    // Within the same millisecond, 600 to 1000 µs into it.
                    let next = to + u128::from(offset).min(399_999);
                    at = at.max(next);
                    time::advance(minus(from_nanos(at), start.elapsed())).await;
                    let n = match frac % 3 {
                        0 => 1,
                        1 => capacity,
                        _ => u32::try_from(u64::from(capacity) * u64::from(frac) / 256).unwrap().max(1),
                    };
                    let turn = reserve(&mut model, start.elapsed(), n, water);
                    let l = Arc::clone(&limiter);
                    let handle = tokio::spawn(async move { l.acquire_many(n).await });
                    settle().await;
                    // With the waiters in place, a look agrees with the
                    // meter's rule on the reserved state.
                    let now = start.elapsed();
                    let peek = limiter.peek(1).unwrap();
                    let expected = model.clone().try_pour(now, 1).map_err(|w| TryAcquireError::Limited { retry_after: w });
                    prop_assert_eq!(peek.answer(), expected, "{} {:?}: peek with waiters", name, rate);
                    let band = peek.bands().next().unwrap();
                    prop_assert_eq!((band.available, band.full_in, band.next_in), model.state(now), "{} {:?}: band state with waiters", name, rate);
                    match turn {
                        None => {
                            prop_assert!(handle.is_finished(), "{} {:?}: overflow at once", name, rate);
                            prop_assert_eq!(handle.await.unwrap(), Err(AcquireError::Overflow));
                        }
                        Some(turn) if turn <= start.elapsed().as_nanos() => {
                            prop_assert!(handle.is_finished(), "{} {:?}: due now, n {}", name, rate, n);
                            prop_assert_eq!(handle.await.unwrap(), Ok(()));
                        }
                        Some(turn) => pending.push_back((turn, handle)),
                    }
                }
                while let Some((turn, handle)) = pending.pop_front() {
                    // Past 2⁶⁴ ns the clock stands still (finding 1).
                    if turn > (YEAR * 580).as_nanos() {
                        return Ok(());
                    }
                    let now = start.elapsed().as_nanos();
                    if now < turn - 1 {
                        time::advance(from_nanos(turn - 1 - now)).await;
                        settle().await;
                        prop_assert!(!handle.is_finished(), "{} {:?}: released before its turn {}", name, rate, turn);
                    }
                    if !handle.is_finished() {
                        time::advance(Duration::from_millis(1)).await;
                        settle().await;
                    }
                    prop_assert!(handle.is_finished(), "{} {:?}: not released a tick after its turn {}", name, rate, turn);
                    prop_assert_eq!(handle.await.unwrap(), Ok(()));
                }
            }
            let now = start.elapsed();
            let expected = model.try_pour(now, 1).map_err(|w| TryAcquireError::Limited { retry_after: w });
            prop_assert_eq!(limiter.try_acquire(), expected, "{} {:?}: the state after", name, rate);
            Ok(())
        })?;
    }
}

/// A key of the keyed funnel's narrow word at its limits — the finest unit
/// it keeps (1/1 048 573 ns) and the deepest bucket (τ = 2⁵⁶ units) — filled
/// at exactly the map's horizon after its shard's epoch (2⁶² units), one
/// nanosecond past it, and then left for years across sweeps, answers as a
/// `Funnel` with the same rate and capacity at every step; so does a key of
/// two bands (one 128-bit word) with a per-year band beside it.
#[tokio::test(start_paused = true)]
async fn narrow_keys_at_exactly_the_horizon_answer_as_a_funnel() {
    let rate = Rate::per_second(1_048_573);
    let capacity = 72_057_594; // 10⁹ × this ≤ 2⁵⁶
    let horizon = Duration::from_nanos(4_398_059_094_052); // ⌊2⁶² / 1 048 573⌋ ns
    for quota in [
        Quota::new(rate, capacity),
        Quota::new(rate, capacity).and(Rate::every(YEAR), 2),
    ] {
        let start = Instant::now();
        let map: KeyedFunnel<u64> = KeyedFunnel::builder()
            .quota(quota)
            .background_sweep(false)
            .build()
            .unwrap();
        let funnel = Funnel::builder().quota(quota).build().unwrap();
        let mut model = Bands::new(&quota);
        let capacity = quota.capacity();
        let check = |what: &str, n: u32, model: &mut Bands| {
            let now = start.elapsed();
            let expected = model.try_pour(now, n);
            let (keyed, alone) = (map.try_acquire_many(&0, n), funnel.try_acquire_many(n));
            assert_eq!(alone, expected, "{quota:?} funnel {what} at {now:?}");
            assert_eq!(keyed, expected, "{quota:?} key {what} at {now:?}");
            let states = model.states(now);
            assert_eq!(
                map.free(&0),
                states.iter().map(|s| s.0).min().unwrap(),
                "{what}: free"
            );
            assert_eq!(
                map.empty_in(&0),
                states.iter().map(|s| s.1).max().unwrap(),
                "{what}: empty_in"
            );
        };
        // The key is made at the origin (the shard's epoch, never swept).
        check("made", 1, &mut model);
        time::advance(minus(horizon, start.elapsed())).await;
        check("at the horizon", capacity - 1, &mut model);
        check("full at the horizon", 1, &mut model);
        time::advance(NS).await;
        check("1 ns past", 1, &mut model);
        for step in [
            Duration::from_secs(1),
            horizon,
            horizon / 3,
            YEAR,
            YEAR * 10,
        ] {
            time::advance(step).await;
            check("after idle", capacity, &mut model);
            check("full", 1, &mut model);
            map.sweep();
            check("after a sweep", 1, &mut model);
        }
    }
}

/// A smooth limiter's waiters a day apart: dropping the first a day
/// before its turn gives its whole cost back (none of it has elapsed), so
/// the one behind moves up to the dropped one's turn; a `set_rate` to 10⁹/s
/// leaves the debt standing (Guava's `setRate`): the waiter keeps its turn,
/// and a request after it pays the new price on top of it.
#[tokio::test(start_paused = true)]
async fn smooth_waiters_a_day_apart_across_cancellation_and_set_rate() {
    let per_day = 1.0 / 86_400.0;
    let limiter = SmoothBursty::builder()
        .permits_per_second(per_day)
        .max_burst(Duration::ZERO)
        .build()
        .unwrap();
    let start = Instant::now();
    limiter.acquire().await.unwrap(); // free: the next pays a day later
    let l = limiter.clone();
    let first = tokio::spawn(async move { l.acquire().await });
    settle().await;
    let l = limiter.clone();
    let second = tokio::spawn(async move { l.acquire().await });
    settle().await;
    time::advance(Duration::from_secs(3600)).await;
    settle().await;
    first.abort();
    settle().await;
    // The second is now due a day after the start, as if the first had
    // never come.
    time::advance(minus(minus(DAY, start.elapsed()), NS)).await;
    settle().await;
    assert!(!second.is_finished(), "released before its turn");
    time::advance(Duration::from_millis(1)).await;
    settle().await;
    assert!(second.is_finished(), "not released on the tick of its turn");
    assert_eq!(second.await.unwrap(), Ok(()));
    // Its cost is the next day's.
    let mut state = SmoothState::bursty(per_day, Duration::ZERO).unwrap();
    state.reserve(Duration::ZERO, 1);
    state.reserve(Duration::ZERO, 1);
    assert_eq!(
        limiter.try_acquire(),
        limited(minus(state.next_free(), start.elapsed())),
        "the state after: as if the dropped waiter never came"
    );

    // A waiter whose turn is two days out; the rate goes to 10⁹/s.
    let l = limiter.clone();
    let third = tokio::spawn(async move { l.acquire().await });
    settle().await;
    let turn = state.reserve(start.elapsed(), 1) + start.elapsed();
    time::advance(Duration::from_secs(3600)).await;
    limiter.set_rate(1e9).unwrap();
    state.set_rate(start.elapsed(), 1e9).unwrap();
    settle().await;
    time::advance(minus(minus(turn, start.elapsed()), NS)).await;
    settle().await;
    assert!(
        !third.is_finished(),
        "the debt stands: not released before its turn"
    );
    time::advance(Duration::from_millis(1)).await;
    settle().await;
    assert!(third.is_finished());
    assert_eq!(third.await.unwrap(), Ok(()));
    let now = start.elapsed();
    let expected = match state.try_reserve(now, 1, Duration::ZERO) {
        Some(_) => Ok(()),
        None => limited(minus(state.next_free(), now)),
    };
    assert_eq!(limiter.try_acquire(), expected);
}

/// Waiters hours apart (7 per day: an interval of 12 342 857 142 857⅐ ns),
/// one of them dropped mid-wait, on every bucket kind: the ones behind move
/// up by its whole cost (none of it drained), to the exact turns of a queue
/// it was never in, and the bucket ends as if it had never come.
#[tokio::test(start_paused = true)]
async fn a_waiter_dropped_hours_before_its_turn_gives_all_of_it_back() {
    let rate = Rate::per(7, DAY);
    for (name, bucket) in Bucket::all(rate, 4) {
        let limiter = bucket.limiter();
        let start = Instant::now();
        // Full (the shaper: room for the three waiters' water).
        let prefill = if name == "leaky" { 1 } else { 4 };
        limiter.try_acquire_many(prefill).unwrap();
        let mut model = Model::new(rate, 4);
        model.try_pour(Duration::ZERO, prefill).unwrap();
        let water = name == "leaky";
        let mut handles = Vec::new();
        for _ in 0..3 {
            let l = Arc::clone(&limiter);
            handles.push(tokio::spawn(async move { l.acquire().await }));
            settle().await;
        }
        time::advance(Duration::from_secs(3600)).await;
        settle().await;
        // The second goes; the model never sees it.
        let dropped = handles.remove(1);
        dropped.abort();
        settle().await;
        let mut turns = Vec::new();
        for _ in 0..2 {
            // As if both had arrived at the start, without the dropped one.
            let mut at_start = model;
            let turn = reserve(&mut at_start, Duration::ZERO, 1, water);
            model = at_start;
            turns.push(turn.unwrap_or_else(|| panic!("{name}: overflow")));
        }
        for (k, (turn, handle)) in turns.into_iter().zip(handles).enumerate() {
            let now = start.elapsed().as_nanos();
            assert!(
                now < turn,
                "{name}: waiter {k} still waits past its turn {turn}"
            );
            time::advance(from_nanos(turn - 1 - now)).await;
            settle().await;
            assert!(
                !handle.is_finished(),
                "{name}: waiter {k} released before its turn {turn}"
            );
            time::advance(Duration::from_millis(1)).await;
            settle().await;
            assert!(
                handle.is_finished(),
                "{name}: waiter {k} not released a tick after its turn {turn}"
            );
            assert_eq!(handle.await.unwrap(), Ok(()), "{name}: waiter {k}");
        }
        let now = start.elapsed();
        let expected = model
            .try_pour(now, 1)
            .map_err(|w| TryAcquireError::Limited { retry_after: w });
        assert_eq!(limiter.try_acquire(), expected, "{name}: the state after");
    }
}

/// Limiters built once the runtime's clock is far from where it started
/// — past 2⁶² and 2⁶³ ns (146 and 292 years, where an origin's decoded
/// nanoseconds reach the bits that tag the clock it reads) and past 2⁶⁴ ns
/// (584 years, where tokio's instants no longer decode into 64 bits at
/// all) — count their own time from their build as before: every meter
/// answers as the model on a fixed walk of several years.
#[tokio::test(start_paused = true)]
async fn limiters_built_late_in_the_clocks_life_count_from_their_build() {
    let steps: Vec<(u8, u64, u8)> = (0..60u64)
        .map(|k| {
            let gap = u8::try_from(k * 7 % 9).unwrap();
            let frac = u8::try_from(k * 37 % 256).unwrap();
            (gap, k.wrapping_mul(0x9E37_79B9_7F4A_7C15), frac)
        })
        .collect();
    let mut since = Duration::ZERO;
    for base in [YEAR * 150, YEAR * 300, YEAR * 590] {
        time::advance(base.saturating_sub(since)).await;
        since = since.max(base);
        for quota in [
            Quota::new(Rate::per_second(3), 4),
            Quota::new(Rate::per_second(999_983), 1000).and(Rate::per_day(2), 2),
        ] {
            let meters = Meters::new(quota);
            let mut model = Bands::new(&quota);
            let start = Instant::now();
            walk(&meters, &mut model, start, &steps).await;
            since += start.elapsed();
        }
    }
}

/// The smooth limiters' `acquire_timeout` at the slowest and fastest
/// rates, with timeouts around the wait and huge ones: it fails at once
/// exactly when Guava's `tryAcquire(permits, timeout)` (the state
/// machine's `try_reserve`) refuses, and otherwise is granted at the turn
/// it gives.
#[tokio::test(start_paused = true)]
async fn smooth_acquire_timeout_agrees_with_try_reserve_at_the_extremes() {
    for config in [
        Smooth::Bursty(0.001, Duration::ZERO),
        Smooth::Warming(0.001, DAY),
        Smooth::Bursty(1e9, Duration::ZERO),
        Smooth::Warming(1_000_003.0, Duration::from_secs(1)),
        Smooth::Bursty(3.0, Duration::ZERO),
    ] {
        let mut probe = config.state();
        probe.reserve(Duration::ZERO, 7);
        let wait = probe.next_free();
        for timeout in [
            Duration::ZERO,
            wait.saturating_sub(Duration::from_micros(1)),
            wait.saturating_sub(NS),
            wait,
            wait + NS,
            Duration::from_secs(u64::MAX / 2),
            Duration::MAX,
        ] {
            let mut state = config.state();
            let (limiter, _) = config.limiter();
            let start = Instant::now();
            state.reserve(Duration::ZERO, 7);
            limiter.acquire_many(7).await.unwrap();
            let expected = state.try_reserve(Duration::ZERO, 1, timeout);
            let l = Arc::clone(&limiter);
            let handle = tokio::spawn(async move {
                l.acquire_timeout(1, timeout).await?;
                Ok::<_, AcquireError>(Instant::now())
            });
            settle().await;
            match expected {
                None => {
                    assert!(
                        handle.is_finished(),
                        "{config:?} timeout {timeout:?}: not refused at once"
                    );
                    assert_eq!(
                        handle.await.unwrap(),
                        Err(AcquireError::Timeout),
                        "{config:?} {timeout:?}"
                    );
                }
                Some(turn) => {
                    if turn > Duration::ZERO {
                        time::advance(minus(turn, NS)).await;
                        settle().await;
                        assert!(
                            !handle.is_finished(),
                            "{config:?} timeout {timeout:?}: released before {turn:?}"
                        );
                    }
                    time::advance(Duration::from_millis(1)).await;
                    settle().await;
                    let at = handle
                        .await
                        .unwrap()
                        .unwrap_or_else(|e| panic!("{config:?} {timeout:?}: {e}"));
                    assert!(at - start >= turn, "{config:?} {timeout:?}");
                }
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Quotas of bands in different units and of very different depths
    /// (1/ns, 7 per ms, 3/s, 7 per day, 1 per year), under random
    /// `try_acquire`s, waiters and waiters that give up (dropped on a
    /// timeout): in every band, any window of length T holds at most
    /// capacity + rate × (T + 1 tick) permits, and the waiters that stayed
    /// are granted in arrival order.
    #[test]
    fn extreme_bands_never_over_admit_under_withdrawals(
        kind in 0..3u8,
        first in 0..5usize,
        second in 0..5usize,
        arrivals in proptest::collection::vec((0u64..400, 1u32..=8, 0u8..4, 1u64..3_000), 1..40),
    ) {
        let bands = [
            (Rate::every(NS), 1_000),
            (Rate::per(7, Duration::from_millis(1)), 7),
            (Rate::per_second(3), 4),
            (Rate::per(7, DAY), 5),
            (Rate::every(YEAR), 6),
        ];
        let quota = Quota::new(bands[first].0, bands[first].1).and(bands[second].0, bands[second].1);
        let (grants, waiters) = run(async move {
            let limiter: Arc<dyn Limiter> = match kind {
                0 => Arc::new(TokenBucket::builder().quota(quota).build().unwrap()),
                1 => Arc::new(LeakyBucket::builder().quota(quota).build().unwrap()),
                _ => Arc::new(Funnel::builder().quota(quota).build().unwrap()),
            };
            let start = Instant::now();
            let grants = Arc::new(std::sync::Mutex::new(Vec::<(Duration, u32)>::new()));
            let waiters = Arc::new(std::sync::Mutex::new(Vec::<usize>::new()));
            let mut tasks = vec![];
            for (i, (gap, n, ask, give_up)) in arrivals.into_iter().enumerate() {
                // Sleep (not `advance`): the timers due on the way fire on
                // time, so the grants are recorded when they happen.
                time::sleep(Duration::from_millis(gap)).await;
                let n = n.min(quota.capacity());
                if ask == 0 {
                    if limiter.try_acquire_many(n).is_ok() {
                        grants.lock().unwrap().push((start.elapsed(), n));
                    }
                    continue;
                }
                let (limiter, grants, waiters) = (limiter.clone(), grants.clone(), waiters.clone());
                tasks.push(tokio::spawn(async move {
                    let acquired = if ask == 1 {
                        time::timeout(Duration::from_millis(give_up), limiter.acquire_many(n))
                            .await
                            .unwrap_or(Err(AcquireError::Timeout))
                    } else {
                        limiter.acquire_many(n).await
                    };
                    if acquired.is_ok() {
                        grants.lock().unwrap().push((start.elapsed(), n));
                        if ask != 1 {
                            waiters.lock().unwrap().push(i);
                        }
                    }
                }));
                // Let it reserve its turn now, in arrival order.
                tokio::task::yield_now().await;
            }
            for task in tasks {
                task.await.unwrap();
            }
            let grants = grants.lock().unwrap().clone();
            let waiters = waiters.lock().unwrap().clone();
            (grants, waiters)
        });
        let mut sorted = grants.clone();
        sorted.sort();
        for band in quota.bands() {
            let (period, permits) = (band.rate().period().as_nanos(), u128::from(band.rate().permits()));
            for (i, &(from, _)) in sorted.iter().enumerate() {
                let mut sum = 0u128;
                for &(to, n) in &sorted[i..] {
                    sum += u128::from(n);
                    let span = (to.saturating_sub(from) + Duration::from_millis(1)).as_nanos();
                    let allowed = u128::from(band.capacity()) + span * permits / period;
                    prop_assert!(sum <= allowed, "{} in [{:?}, {:?}] for {:?}", sum, from, to, band);
                }
            }
        }
        let mut in_order = waiters.clone();
        in_order.sort_unstable();
        prop_assert_eq!(waiters, in_order, "waiters granted out of order");
    }
}
