//! The classic demo — capacity 2, 2 per second, one request every
//! 200 ms, 30 requests — through the three meters: `Funnel::try_acquire`,
//! `LeakyBucket::try_acquire` and `TokenBucket::try_acquire` (which starts
//! full). All three are GCRA with the same numbers, so they must agree on
//! every request, and on every `retry_after`.

use std::time::Duration;

use tokio::time::{self, Instant};
use tokio_ratelimit::{Funnel, LeakyBucket, Rate, TokenBucket, TryAcquireError};

/// The pattern, worked out by hand with GCRA. The emission interval is
/// I = 500 ms and the tolerance τ = capacity · I = 1000 ms; `tat` is when
/// the bucket would be empty of water (0 at the start). A request at `t`
/// passes when `max(tat, t) + I − t ≤ τ`, and then `tat = max(tat, t) + I`.
///
/// ```text
///    t    tat before  max(tat,t)+I−t   result   tat after
///    0        0            500           +        500
///  200      500            800           +       1000
///  400     1000           1100           −       1000   (retry after 100 ms)
///  600     1000            900           +       1500
///  800     1500           1200           −       1500   (200 ms)
/// 1000     1500           1000           +       2000
/// 1200     2000           1300           −       2000   (300 ms)
/// 1400     2000           1100           −       2000   (100 ms)
/// 1600     2000            900           +       2500
/// 1800     2500           1200           −       2500   (200 ms)
/// 2000     2500           1000           +       3000
/// ```
///
/// At 2000 ms the state (`tat − t = 500 ms`) is the one at 1000 ms, so from
/// request 6 on (t = 1000 ms) the five-request cycle `+--+-` repeats:
/// the first ten are `++-+-` `+--+-`, and the thirty are `++-+-` followed
/// by five cycles. 13 of 30 pass: the burst of 2, then 2 per second (one
/// cycle of 5 requests spans exactly 1 s) — 2 + 2 · 5.8 s rounds down to 13.
const EXPECTED: &str = "++-+-+--+-+--+-+--+-+--+-+--+-";

/// The `retry_after` of each refused request, in ms, in order (from the
/// table: 100, 200, 300, 100, 200, then 300, 100, 200 per cycle).
const EXPECTED_RETRY_MS: [u64; 17] = [
    100, 200, 300, 100, 200, 300, 100, 200, 300, 100, 200, 300, 100, 200, 300, 100, 200,
];

fn outcome(r: Result<(), TryAcquireError>, pattern: &mut String, retries: &mut Vec<Duration>) {
    match r {
        Ok(()) => pattern.push('+'),
        Err(TryAcquireError::Limited { retry_after }) => {
            pattern.push('-');
            retries.push(retry_after);
        }
        Err(e) => panic!("unexpected {e:?}"),
    }
}

#[tokio::test(start_paused = true)]
async fn demo_same_pattern_for_all_three_meters() {
    let rate = Rate::per_second(2);
    let funnel = Funnel::builder().rate(rate).capacity(2).build().unwrap();
    let leaky = LeakyBucket::builder()
        .rate(rate)
        .capacity(2)
        .build()
        .unwrap();
    let token = TokenBucket::builder()
        .rate(rate)
        .capacity(2)
        .build()
        .unwrap();
    let start = Instant::now();
    let mut patterns = [String::new(), String::new(), String::new()];
    let mut retries = [vec![], vec![], vec![]];
    for i in 0..30 {
        if i > 0 {
            time::sleep(Duration::from_millis(200)).await;
        }
        outcome(funnel.try_acquire(), &mut patterns[0], &mut retries[0]);
        outcome(leaky.try_acquire(), &mut patterns[1], &mut retries[1]);
        outcome(token.try_acquire(), &mut patterns[2], &mut retries[2]);
    }
    assert_eq!(start.elapsed(), Duration::from_millis(29 * 200));
    assert_eq!(patterns[0], patterns[1], "funnel vs leaky bucket");
    assert_eq!(patterns[0], patterns[2], "funnel vs token bucket");
    assert_eq!(retries[0], retries[1]);
    assert_eq!(retries[0], retries[2]);
    assert_eq!(&patterns[0][..10], "++-+-+--+-");
    assert_eq!(patterns[0], EXPECTED);
    assert_eq!(patterns[0].matches('+').count(), 13);
    let expected_retries: Vec<Duration> = EXPECTED_RETRY_MS
        .iter()
        .map(|&ms| Duration::from_millis(ms))
        .collect();
    assert_eq!(retries[0], expected_retries);
}
