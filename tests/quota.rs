//! Quotas of several bands on `TokenBucket`, `LeakyBucket` and `Funnel`, in
//! paused time: a request is granted only when every band grants it, a
//! refusal debits no band, waiters stay FIFO across bands, and withdrawn
//! waiters never let any band over-admit.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use proptest::prelude::*;
use tokio::time::{self, Instant};
use tokio_ratelimit::keyed::{Keyed, KeyedFunnel};
use tokio_ratelimit::{
    AcquireError, Band, ConfigError, Funnel, LeakyBucket, Limiter, Quota, Rate, TokenBucket,
    TryAcquireError,
};

mod support;
use support::{limited, ms, run};

const SECOND_AND_MINUTE: Quota = Quota::new(Rate::per_second(10), 10).and(Rate::per_minute(20), 20);

#[tokio::test(start_paused = true)]
async fn every_band_must_grant() {
    let bucket = TokenBucket::builder()
        .quota(SECOND_AND_MINUTE)
        .build()
        .unwrap();
    assert_eq!(bucket.capacity(), 10);
    assert_eq!(bucket.quota(), SECOND_AND_MINUTE);
    assert_eq!(bucket.try_acquire_many(10), Ok(()));
    // The second's band refuses; the minute's still holds 10.
    assert_eq!(bucket.try_acquire(), limited(ms(100)));
    time::advance(Duration::from_secs(1)).await;
    assert_eq!(bucket.available(), 10);
    assert_eq!(bucket.try_acquire_many(10), Ok(()));
    // Now the minute's band is empty: one permit per 3 s, 1 s after the
    // first was taken.
    time::advance(Duration::from_secs(1)).await;
    assert_eq!(bucket.available(), 0);
    assert_eq!(bucket.try_acquire(), limited(Duration::from_secs(1)));
    time::advance(Duration::from_secs(1)).await;
    assert_eq!(bucket.try_acquire(), Ok(()));
}

#[tokio::test(start_paused = true)]
async fn a_refusal_debits_no_band() {
    let bucket = Funnel::builder().quota(SECOND_AND_MINUTE).build().unwrap();
    assert_eq!(bucket.try_acquire_many(6), Ok(()));
    // 5 do not fit the second's band: the minute's band must not lose them.
    for _ in 0..100 {
        assert_eq!(bucket.try_acquire_many(5), limited(ms(100)));
    }
    time::advance(Duration::from_secs(1)).await;
    assert_eq!(bucket.try_acquire_many(10), Ok(()));
    // The minute's band holds 16 (less a third drained): 4 more fit, the
    // fifth does not.
    time::advance(Duration::from_secs(1)).await;
    assert_eq!(bucket.try_acquire_many(4), Ok(()));
    assert!(matches!(
        bucket.try_acquire(),
        Err(TryAcquireError::Limited { .. })
    ));
}

#[tokio::test(start_paused = true)]
async fn waiters_go_when_every_band_lets_them() {
    let bucket = TokenBucket::builder()
        .quota(Quota::new(Rate::per_second(10), 2).and(Rate::per_second(1), 3))
        .build()
        .unwrap();
    let start = Instant::now();
    let mut at = vec![];
    for _ in 0..5 {
        bucket.acquire().await.unwrap();
        at.push(start.elapsed());
    }
    // 2 at once (the fast band's burst), the third 100 ms later (the slow
    // band still has room), then one per second (the slow band's rate,
    // after its burst of 3).
    assert_eq!(at, [ms(0), ms(0), ms(100), ms(1000), ms(2000)]);
}

#[tokio::test(start_paused = true)]
async fn a_dropped_waiter_gives_its_turn_to_the_ones_behind() {
    use tokio_test::{assert_pending, assert_ready_eq, task};
    // 10/s and 1/s, bursts of 1: waiters go once a second.
    let bucket = Funnel::builder()
        .quota(Quota::new(Rate::per_second(10), 1).and(Rate::per_second(1), 1))
        .build()
        .unwrap();
    bucket.try_acquire().unwrap();
    let mut second = task::spawn(bucket.acquire());
    let mut third = task::spawn(bucket.acquire());
    assert_pending!(second.poll());
    assert_pending!(third.poll());
    time::advance(ms(500)).await;
    // Dropped half way to its turn (1 s): the third takes it.
    drop(second);
    assert_pending!(third.poll());
    time::advance(ms(499)).await;
    assert_pending!(third.poll());
    time::advance(ms(1)).await;
    assert_ready_eq!(third.poll(), Ok(()));
    // Nothing was lost or given twice: the next permit is due at 2 s.
    assert_eq!(bucket.try_acquire(), limited(ms(1000)));
}

#[tokio::test(start_paused = true)]
async fn a_request_above_the_smallest_capacity_is_refused_at_once() {
    let bucket = LeakyBucket::builder()
        .quota(SECOND_AND_MINUTE)
        .build()
        .unwrap();
    assert_eq!(
        bucket.try_acquire_many(11),
        Err(TryAcquireError::InsufficientCapacity)
    );
    assert_eq!(
        bucket.acquire_many(11).await,
        Err(AcquireError::InsufficientCapacity)
    );
}

#[tokio::test(start_paused = true)]
async fn bad_quotas_are_config_errors() {
    let zero_rate = Quota::new(Rate::per_second(1), 1).and(Rate::per_second(0), 1);
    assert!(matches!(
        TokenBucket::builder().quota(zero_rate).build(),
        Err(ConfigError::InvalidRate { .. })
    ));
    let zero_capacity = Quota::new(Rate::per_second(1), 1).and(Rate::per_day(1), 0);
    assert!(matches!(
        Funnel::builder().quota(zero_capacity).build(),
        Err(ConfigError::ZeroCapacity)
    ));
    let five = Quota::new(Rate::per_second(1), 1)
        .and(Rate::per_minute(1), 1)
        .and(Rate::per_hour(1), 1)
        .and(Rate::per_day(1), 1)
        .and(Rate::per_day(2), 2);
    assert_eq!(five.bands().len(), Quota::MAX_BANDS);
    assert!(matches!(
        LeakyBucket::builder().quota(five).build(),
        Err(ConfigError::InvalidParameter { name: "quota", .. })
    ));
    assert!(matches!(
        TokenBucket::builder()
            .quota(SECOND_AND_MINUTE)
            .rate(Rate::per_second(1))
            .build(),
        Err(ConfigError::InvalidParameter { name: "quota", .. })
    ));
    // More initial tokens than the smallest band holds.
    assert_eq!(
        TokenBucket::builder()
            .quota(SECOND_AND_MINUTE)
            .initial(11)
            .build()
            .unwrap_err(),
        ConfigError::InitialExceedsCapacity {
            initial: 11,
            capacity: 10
        }
    );
    // A set_rate has no single band to change.
    let bucket = TokenBucket::builder()
        .quota(SECOND_AND_MINUTE)
        .build()
        .unwrap();
    assert!(matches!(
        bucket.set_rate(Rate::per_second(1)),
        Err(ConfigError::InvalidParameter { name: "rate", .. })
    ));
}

#[tokio::test(start_paused = true)]
async fn a_one_band_quota_is_a_rate_and_a_capacity() {
    let quota = Quota::from(Band::new(Rate::per_second(5), 2));
    let bucket = TokenBucket::builder().quota(quota).build().unwrap();
    let plain = TokenBucket::builder()
        .rate(Rate::per_second(5))
        .capacity(2)
        .build()
        .unwrap();
    assert_eq!(format!("{bucket:?}"), format!("{plain:?}"));
    assert_eq!(bucket.quota(), plain.quota());
}

#[tokio::test(start_paused = true)]
async fn a_peek_at_the_edges() {
    let bucket = TokenBucket::builder()
        .quota(SECOND_AND_MINUTE)
        .build()
        .unwrap();
    assert_eq!(bucket.peek(0).answer(), Ok(()));
    assert_eq!(
        bucket.peek(u32::MAX).answer(),
        Err(TryAcquireError::InsufficientCapacity)
    );
    assert_eq!(bucket.peek(u32::MAX).retry_after(), None);
    bucket.close();
    assert_eq!(bucket.peek(1).answer(), Err(TryAcquireError::Closed));
    // A closed bucket still reports its bands.
    assert_eq!(bucket.peek(1).bands().count(), 2);
}

#[tokio::test(start_paused = true)]
async fn a_nanosecond_band_beside_a_day_band() {
    // The finest rate there is, with the largest burst, and one a day.
    let quota = Quota::new(Rate::per_second(1_000_000_000), u32::MAX).and(Rate::per_day(1), 1);
    let bucket = Funnel::builder().quota(quota).build().unwrap();
    assert_eq!(bucket.capacity(), 1);
    assert_eq!(bucket.try_acquire(), Ok(()));
    assert_eq!(bucket.try_acquire(), limited(Duration::from_secs(86_400)));
    time::advance(Duration::from_secs(86_400)).await;
    assert_eq!(bucket.try_acquire(), Ok(()));
}

#[tokio::test(start_paused = true)]
async fn a_tier_that_cannot_be_built_closes_only_its_key() {
    let keyed: Keyed<String, Funnel> = Keyed::builder()
        .limiter_for(|key: &String| {
            let capacity = u32::from(key != "broken"); // 0: a ConfigError
            Funnel::builder()
                .rate(Rate::per_second(1))
                .capacity(capacity)
                .build()
        })
        .build()
        .unwrap();
    assert_eq!(keyed.try_acquire("broken"), Err(TryAcquireError::Closed));
    assert_eq!(keyed.try_acquire("fine"), Ok(()));
}

/// The tier of a key: free keys 2 per second (bursts of 2) and 5 per
/// minute; paid keys ten times that.
fn tier(key: &str, paid: &Mutex<Vec<String>>) -> Quota {
    let scale = if paid.lock().unwrap().iter().any(|k| k == key) {
        10
    } else {
        1
    };
    Quota::new(Rate::per_second(2 * scale), 2 * scale).and(Rate::per_minute(5 * scale), 5 * scale)
}

#[tokio::test(start_paused = true)]
async fn each_key_is_held_to_its_own_tier() {
    let paid = Arc::new(Mutex::new(vec!["paid".to_string()]));
    let tiers = Arc::clone(&paid);
    let keyed: Keyed<String, TokenBucket> = Keyed::builder()
        .limiter_for(move |key: &String| TokenBucket::builder().quota(tier(key, &tiers)).build())
        .build()
        .unwrap();
    let take_all = |key: &str| {
        let mut granted = 0;
        while keyed.try_acquire(key).is_ok() {
            granted += 1;
        }
        granted
    };
    assert_eq!((take_all("free"), take_all("paid")), (2, 20));
    // Over the next minute: the minute's band holds each to 5 and 50.
    let (mut free, mut paid_n) = (2, 20);
    for _ in 0..60 {
        time::advance(Duration::from_secs(1)).await;
        free += take_all("free");
        paid_n += take_all("paid");
    }
    // 5 (+ 5 refilled over the minute, one each 12 s) and 50 (+ 50).
    assert_eq!((free, paid_n), (10, 100));

    // "free" becomes paid: its bucket keeps its tier until it is fresh
    // (full again) and swept; then its next request builds the new one.
    paid.lock().unwrap().push("free".to_string());
    assert!(keyed.try_acquire("free").is_err());
    time::advance(Duration::from_secs(60)).await;
    assert_eq!(keyed.sweep(), 0); // both fresh: no key left
    assert!(keyed.is_empty());
    assert_eq!(take_all("free"), 20);
}

/// How a request arrives.
#[derive(Debug, Clone, Copy)]
enum Ask {
    /// `try_acquire_many`.
    Try,
    /// `acquire_many`, given up after this long (never if `None`).
    Wait(Option<u64>),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Token,
    Leaky,
    Funnel,
}

fn ask() -> impl Strategy<Value = Ask> {
    prop_oneof![
        Just(Ask::Try),
        Just(Ask::Wait(None)),
        (1u64..3_000).prop_map(|ms| Ask::Wait(Some(ms))),
    ]
}

fn band() -> impl Strategy<Value = (u32, u64, u32)> {
    // permits per period (1 ms, 1 s, 1 min), capacity.
    (
        1u32..=20,
        prop_oneof![Just(1u64), Just(1_000), Just(60_000)],
        1u32..=8,
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Random bands, arrivals, weights and withdrawals: in every band, any
    /// window of length T holds at most capacity + rate × (T + 1 tick)
    /// permits, and the waiters that were not withdrawn are granted in
    /// arrival order.
    #[test]
    fn no_band_over_admits(
        kind in prop_oneof![Just(Kind::Token), Just(Kind::Leaky), Just(Kind::Funnel)],
        bands in proptest::collection::vec(band(), 1..=3),
        arrivals in proptest::collection::vec((0u64..300, 1u32..=8, ask()), 1..60),
    ) {
        let mut quota = Quota::new(Rate::per(bands[0].0, ms(bands[0].1)), bands[0].2);
        for &(permits, period, capacity) in &bands[1..] {
            quota = quota.and(Rate::per(permits, ms(period)), capacity);
        }
        let (grants, waiters) = run(async move {
            let limiter: Arc<dyn Limiter> = match kind {
                Kind::Token => Arc::new(TokenBucket::builder().quota(quota).build().unwrap()),
                Kind::Leaky => Arc::new(LeakyBucket::builder().quota(quota).build().unwrap()),
                Kind::Funnel => Arc::new(Funnel::builder().quota(quota).build().unwrap()),
            };
            let start = Instant::now();
            let grants = Arc::new(Mutex::new(Vec::<(Duration, u32)>::new()));
            let waiters = Arc::new(Mutex::new(Vec::<usize>::new()));
            let mut tasks = vec![];
            for (i, (gap, n, ask)) in arrivals.into_iter().enumerate() {
                // Sleep (not `advance`): the timers due on the way fire on
                // time, so the grants are recorded when they happen.
                time::sleep(ms(gap)).await;
                let n = n.min(quota.capacity());
                match ask {
                    Ask::Try => {
                        if limiter.try_acquire_many(n).is_ok() {
                            grants.lock().unwrap().push((start.elapsed(), n));
                        }
                    }
                    Ask::Wait(give_up) => {
                        let (limiter, grants, waiters) = (limiter.clone(), grants.clone(), waiters.clone());
                        tasks.push(tokio::spawn(async move {
                            let acquired = match give_up {
                                None => limiter.acquire_many(n).await,
                                Some(after) => time::timeout(ms(after), limiter.acquire_many(n))
                                    .await
                                    .unwrap_or(Err(AcquireError::Timeout)),
                            };
                            if acquired.is_ok() {
                                grants.lock().unwrap().push((start.elapsed(), n));
                                if give_up.is_none() {
                                    waiters.lock().unwrap().push(i);
                                }
                            }
                        }));
                        // Let it reserve its turn now, in arrival order.
                        tokio::task::yield_now().await;
                    }
                }
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
        for &(permits, period, capacity) in &bands {
            for (i, &(from, _)) in sorted.iter().enumerate() {
                let mut sum = 0u128;
                for &(to, n) in &sorted[i..] {
                    sum += u128::from(n);
                    let span = (to.saturating_sub(from) + ms(1)).as_nanos();
                    let allowed = u128::from(capacity)
                        + span * u128::from(permits) / ms(period).as_nanos();
                    prop_assert!(sum <= allowed, "{sum} in [{from:?}, {to:?}] for {permits} per {period} ms, burst {capacity}");
                }
            }
        }
        let mut in_order = waiters.clone();
        in_order.sort_unstable();
        prop_assert_eq!(waiters, in_order, "waiters granted out of order");
    }
}

/// A limiter's `peek`.
type PeekFn = Box<dyn Fn(u32) -> tokio_ratelimit::Peek>;

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// `peek(n)` answers exactly what `try_acquire_many(n)` then does, and
    /// takes and counts nothing.
    #[test]
    fn a_peek_answers_what_try_acquire_does(
        kind in prop_oneof![Just(Kind::Token), Just(Kind::Leaky), Just(Kind::Funnel)],
        bands in proptest::collection::vec(band(), 1..=3),
        arrivals in proptest::collection::vec((0u64..300, 0u32..=9, any::<bool>()), 1..60),
    ) {
        let mut quota = Quota::new(Rate::per(bands[0].0, ms(bands[0].1)), bands[0].2);
        for &(permits, period, capacity) in &bands[1..] {
            quota = quota.and(Rate::per(permits, ms(period)), capacity);
        }
        run(async move {
            let build = || -> (Arc<dyn Limiter>, PeekFn) {
                match kind {
                    Kind::Token => {
                        let b = TokenBucket::builder().quota(quota).build().unwrap();
                        (Arc::new(b.clone()), Box::new(move |n| b.peek(n)))
                    }
                    Kind::Leaky => {
                        let b = LeakyBucket::builder().quota(quota).build().unwrap();
                        (Arc::new(b.clone()), Box::new(move |n| b.peek(n)))
                    }
                    Kind::Funnel => {
                        let b = Funnel::builder().quota(quota).build().unwrap();
                        (Arc::new(b.clone()), Box::new(move |n| b.peek(n)))
                    }
                }
            };
            let (limiter, peek) = build();
            for (gap, n, twice) in arrivals {
                time::sleep(ms(gap)).await;
                let stats = limiter.stats();
                let looked = peek(n);
                if twice {
                    prop_assert_eq!(peek(n), looked);
                }
                prop_assert_eq!((limiter.stats().granted, limiter.stats().refused), (stats.granted, stats.refused));
                prop_assert_eq!(looked.bands().count(), quota.bands().len());
                let available = looked.bands().map(|b| b.available).min().unwrap();
                prop_assert_eq!(available, limiter.stats().available.unwrap());
                prop_assert_eq!(looked.answer(), limiter.try_acquire_many(n));
            }
            Ok(())
        })?;
    }
}

#[tokio::test(start_paused = true)]
async fn a_keyed_funnel_peek_answers_what_try_acquire_does() {
    let per_key: KeyedFunnel<u64> = KeyedFunnel::builder()
        .rate(Rate::per(3, ms(100)))
        .capacity(5)
        .build()
        .unwrap();
    // A fixed pseudo-random walk over 3 keys, weights 0..=6, gaps 0..40 ms.
    let mut x = 0x2545_f491_4f6c_dd1d_u64;
    for _ in 0..2_000 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        time::advance(ms(x % 40)).await;
        let (key, n) = ((x >> 8) % 3, u32::try_from((x >> 16) % 7).unwrap());
        let keys = per_key.len();
        let looked = per_key.peek(&key, n);
        assert_eq!(per_key.len(), keys, "a peek added a key");
        assert_eq!(looked.bands().next().unwrap().available, per_key.free(&key));
        assert_eq!(looked.answer(), per_key.try_acquire_many(&key, n));
    }
}

#[tokio::test(start_paused = true)]
async fn the_limiter_trait_peeks_where_it_can() {
    let bucket = TokenBucket::builder()
        .quota(SECOND_AND_MINUTE)
        .build()
        .unwrap();
    let limiter: Arc<dyn Limiter> = Arc::new(bucket.clone());
    limiter.try_acquire_many(10).unwrap();
    assert_eq!(limiter.peek(3), Some(bucket.peek(3)));
    assert_eq!(limiter.peek(3).unwrap().retry_after(), Some(ms(300)));
    let boxed: Box<dyn Limiter> =
        Box::new(Funnel::builder().rate(Rate::per_second(1)).build().unwrap());
    assert!(boxed.peek(1).unwrap().is_granted());
    let leaky = LeakyBucket::builder()
        .rate(Rate::per_second(1))
        .build()
        .unwrap();
    assert_eq!(Limiter::peek(&leaky, 2), Some(leaky.peek(2)));
    // The smooth limiters have no bands to show.
    let smooth = tokio_ratelimit::SmoothBursty::builder()
        .permits_per_second(1.0)
        .build()
        .unwrap();
    assert_eq!(Limiter::peek(&smooth, 1), None);
}

#[tokio::test(start_paused = true)]
async fn a_keyed_peek_looks_at_the_keys_own_tier() {
    let paid = Arc::new(Mutex::new(vec!["paid".to_string()]));
    let tiers = Arc::clone(&paid);
    let keyed: Keyed<String, TokenBucket> = Keyed::builder()
        .limiter_for(move |key: &String| TokenBucket::builder().quota(tier(key, &tiers)).build())
        .build()
        .unwrap();
    // Keys not held: a new limiter of the key's tier, and no key added.
    let available = |key: &str, n| {
        keyed
            .peek(key, n)
            .unwrap()
            .bands()
            .map(|b| b.available)
            .collect::<Vec<_>>()
    };
    assert_eq!(available("free", 1), [2, 5]);
    assert_eq!(available("paid", 1), [20, 50]);
    assert!(keyed.is_empty());
    // Held keys: what try_acquire then answers, at every step.
    let (mut granted, mut refused) = (0, 0);
    for step in 0..40 {
        for (key, n) in [("free", 1), ("paid", 3)] {
            let looked = keyed.peek(key, n).unwrap();
            let answer = keyed.try_acquire_many(key, n);
            assert_eq!(looked.answer(), answer, "{key} at step {step}");
            if answer.is_ok() {
                granted += u64::from(n);
            } else {
                refused += 1;
            }
        }
        time::advance(ms(150)).await;
    }
    assert!(
        granted > 0 && refused > 0,
        "{granted} granted, {refused} refused"
    );
    assert_eq!(
        (keyed.stats().granted, keyed.stats().limited),
        (granted, refused)
    );
    // A key whose limiter cannot be built reads as closed.
    let broken: Keyed<String, Funnel> = Keyed::builder()
        .limiter_for(|key: &String| {
            Funnel::builder()
                .rate(Rate::per_second(1))
                .capacity(u32::from(key != "broken"))
                .build()
        })
        .build()
        .unwrap();
    assert_eq!(
        broken.peek("broken", 1).unwrap().answer(),
        Err(TryAcquireError::Closed)
    );
}

#[tokio::test(start_paused = true)]
async fn a_band_says_when_its_next_permit_comes() {
    // 2 per second, bursts of 4; and 3 per minute.
    let quota = Quota::new(Rate::per_second(2), 4).and(Rate::per_minute(3), 3);
    let bucket = TokenBucket::builder().quota(quota).build().unwrap();
    let next = |b: &TokenBucket| -> Vec<(u32, Duration, Duration)> {
        b.peek(1)
            .bands()
            .map(|s| (s.available, s.next_in, s.full_in))
            .collect()
    };
    assert_eq!(next(&bucket), [(4, ms(0), ms(0)), (3, ms(0), ms(0))]);
    bucket.try_acquire_many(3).unwrap();
    assert_eq!(
        next(&bucket),
        [(1, ms(500), ms(1_500)), (0, ms(20_000), ms(60_000))]
    );
    time::advance(ms(300)).await;
    assert_eq!(
        next(&bucket),
        [(1, ms(200), ms(1_200)), (0, ms(19_700), ms(59_700))]
    );
    time::advance(ms(1_200)).await;
    assert_eq!(
        next(&bucket),
        [(4, ms(0), ms(0)), (0, ms(18_500), ms(58_500))]
    );
}

/// `set_limiter_for` replaces a per-key factory while the map serves: keys
/// made afterwards are the new factory's, keys held keep their limiter
/// (and its state) until `for_each` reaches them; a key made between the
/// two calls is the new factory's and is reached too (`set_rate` on it is
/// then a no-op).
#[tokio::test(start_paused = true)]
async fn set_limiter_for_changes_new_keys_and_for_each_the_held_ones() {
    let per_key = |per_second: u32| {
        move |key: &String| {
            // "vip" keys get ten times the rate of the others.
            let scale = if key.starts_with("vip") { 10 } else { 1 };
            TokenBucket::builder()
                .rate(Rate::per_second(per_second * scale))
                .capacity(1)
                .build()
        }
    };
    let keyed: Keyed<String, TokenBucket> =
        Keyed::builder().limiter_for(per_key(1)).build().unwrap();
    let wait = |key: &str| match keyed.try_acquire(key) {
        Err(TryAcquireError::Limited { retry_after }) => retry_after,
        other => panic!("{key}: {other:?}"),
    };
    for key in ["a", "vip-a"] {
        keyed.try_acquire(key).unwrap();
    }
    assert_eq!(
        (wait("a"), wait("vip-a")),
        (Duration::from_secs(1), Duration::from_millis(100))
    );

    // Four times the rates, for keys made from now on.
    keyed.set_limiter_for(per_key(4));
    for key in ["b", "vip-b"] {
        keyed.try_acquire(key).unwrap();
    }
    assert_eq!(
        (wait("b"), wait("vip-b")),
        (Duration::from_millis(250), Duration::from_millis(25))
    );
    // Held keys keep their rate (and their state) until reached.
    assert_eq!(wait("a"), Duration::from_secs(1));

    let mut reached = Vec::new();
    keyed.for_each(|key, bucket| {
        reached.push(key.clone());
        let scale = if key.starts_with("vip") { 10 } else { 1 };
        bucket.set_rate(Rate::per_second(4 * scale)).unwrap();
    });
    reached.sort();
    assert_eq!(reached, ["a", "b", "vip-a", "vip-b"]);
    // The token "a" lacks now refills at the new rate.
    assert_eq!(
        (wait("a"), wait("vip-a")),
        (Duration::from_millis(250), Duration::from_millis(25))
    );
    time::advance(Duration::from_millis(250)).await;
    keyed.try_acquire("a").unwrap();
}

/// A factory that fails when `set_limiter` checks it is refused with its
/// error, and the map keeps its factory: new keys still get the old limiter.
#[tokio::test(start_paused = true)]
async fn set_limiter_refuses_a_failing_factory_and_keeps_its_own() {
    let keyed: Keyed<u64, Funnel> = Keyed::builder()
        .limiter(|| {
            Funnel::builder()
                .rate(Rate::per_second(1))
                .capacity(2)
                .build()
        })
        .build()
        .unwrap();
    let refused = keyed.set_limiter(|| {
        Funnel::builder()
            .rate(Rate::per_second(1))
            .capacity(0)
            .build()
    });
    assert!(
        matches!(refused, Err(ConfigError::ZeroCapacity)),
        "{refused:?}"
    );
    // Key 7 is new: the old factory's funnel, capacity 2.
    keyed.try_acquire_many(&7, 2).unwrap();
    assert!(keyed.try_acquire(&7).is_err());
}
