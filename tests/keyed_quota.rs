//! Quotas of several bands, and tiers, on `keyed::KeyedFunnel`, in paused
//! time: every key is held to every band of its quota exactly (the same
//! answers, to the nanosecond, as a reference that pours into one
//! `FunnelState` per band and keeps the pour only when all granted), a
//! refusal changes no band, and a key that changes tier keeps its bands'
//! instants as documented.

use std::time::Duration;

use proptest::prelude::*;
use tokio::time::{self, Instant};
use tokio_ratelimit::algorithm::FunnelState;
use tokio_ratelimit::keyed::KeyedFunnel;
use tokio_ratelimit::{ConfigError, Quota, Rate, TryAcquireError};

mod support;
use support::{limited, ms, run};

const DAY: Duration = Duration::from_secs(86_400);

/// One key under a quota, as the reference sees it: a funnel per band.
#[derive(Clone)]
struct Reference(Vec<FunnelState>);

impl Reference {
    fn new(quota: &Quota) -> Reference {
        Reference(
            quota
                .bands()
                .iter()
                .map(|b| FunnelState::new(b.rate(), b.capacity()).unwrap())
                .collect(),
        )
    }

    /// Pours into every band, and keeps it only if every band granted; the
    /// wait is the latest band's.
    fn try_pour(&mut self, now: Duration, n: u32) -> Result<(), TryAcquireError> {
        let mut trial = self.0.clone();
        let mut wait: Option<Duration> = None;
        for band in &mut trial {
            match band.try_pour(now, n) {
                Ok(()) => {}
                Err(TryAcquireError::Limited { retry_after }) => {
                    wait = wait.max(Some(retry_after));
                }
                Err(other) => return Err(other),
            }
        }
        if let Some(retry_after) = wait {
            return limited(retry_after);
        }
        self.0 = trial;
        Ok(())
    }

    /// Each band's (free units, time until empty) at `now`.
    fn bands(&self, now: Duration) -> Vec<(u32, Duration)> {
        self.0
            .iter()
            .map(|b| (b.free(now), b.empty_at().saturating_sub(now)))
            .collect()
    }
}

fn peeked(map: &KeyedFunnel<usize>, key: usize, quota: &Quota, n: u32) -> Vec<(u32, Duration)> {
    map.peek_with(&key, quota, n)
        .bands()
        .map(|b| (b.available, b.full_in))
        .collect()
}

fn quota_of(bands: &[(u32, Duration, u32)]) -> Quota {
    let mut quota = Quota::new(Rate::per(bands[0].0, bands[0].1), bands[0].2);
    for &(permits, period, capacity) in &bands[1..] {
        quota = quota.and(Rate::per(permits, period), capacity);
    }
    quota
}

/// A band: permits per period, capacity. Periods from a microsecond (up to
/// 2·10⁷/s) to a day (down to 1/day), and a rate whose interval is too fine
/// for a 64-bit word (the key is then kept absolute).
fn band() -> impl Strategy<Value = (u32, Duration, u32)> {
    prop_oneof![
        4 => (
            1u32..=20,
            prop_oneof![
                Just(Duration::from_micros(1)),
                Just(ms(1)),
                Just(ms(1_000)),
                Just(ms(60_000)),
                Just(DAY),
            ],
            1u32..=8,
        ),
        1 => (Just(1_048_583u32), Just(DAY), 1u32..=8),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    /// Random band sets (one to four bands), two tiers, random arrivals
    /// over three keys (each key held to one tier), weights 0 to 9, gaps up
    /// to hours: every answer and every band's state is the reference's,
    /// and a refused request leaves every band of its key as it was.
    #[test]
    fn every_key_gets_exactly_its_quota(
        free in proptest::collection::vec(band(), 1..=4),
        paid in proptest::collection::vec(band(), 1..=4),
        arrivals in proptest::collection::vec(
            (prop_oneof![8 => 0u64..300, 1 => 0u64..10_000_000], 0usize..3, 0u32..=9),
            1..80,
        ),
    ) {
        let (free, paid) = (quota_of(&free), quota_of(&paid));
        run(async move {
            // A day-long band beside one of 1 048 583 a day has no common
            // unit (the day's interval in it exceeds 2⁶⁴): refused at build.
            let Ok(map) = KeyedFunnel::<usize>::builder().quota(free).tier(paid).build() else {
                return Ok(());
            };
            let tier = |key: usize| if key == 2 { paid } else { free };
            let mut reference: Vec<Reference> = (0..3).map(|k| Reference::new(&tier(k))).collect();
            let start = Instant::now();
            for (gap, key, n) in arrivals {
                time::advance(ms(gap)).await;
                let now = start.elapsed();
                let quota = tier(key);
                let before = peeked(&map, key, &quota, n);
                prop_assert_eq!(&before, &reference[key].bands(now));
                let expected = if n > quota.capacity() {
                    Err(TryAcquireError::InsufficientCapacity)
                } else {
                    reference[key].try_pour(now, n)
                };
                prop_assert_eq!(map.peek_with(&key, &quota, n).answer(), expected);
                let answer = match key {
                    2 => map.try_acquire_with(&key, &paid, n),
                    // The decision with the state it left, read with it.
                    1 => {
                        let report = map.try_acquire_and_peek(&key, None, n);
                        let after: Vec<_> = report.bands().map(|b| (b.available, b.full_in)).collect();
                        prop_assert_eq!(&after, &reference[key].bands(now), "report of key 1");
                        report.answer()
                    }
                    _ => map.try_acquire_many(&key, n),
                };
                prop_assert_eq!(answer, expected, "key {} n {} at {:?}", key, n, now);
                if answer.is_err() {
                    prop_assert_eq!(peeked(&map, key, &quota, n), before, "a refusal moved a band");
                }
            }
            Ok(())
        })?;
    }
}

#[tokio::test(start_paused = true)]
async fn two_bands_are_one_decision() {
    // 2 per second with bursts of 4, and 5 per day.
    let quota = Quota::new(Rate::per_second(2), 4).and(Rate::per_day(5), 5);
    let map: KeyedFunnel<String> = KeyedFunnel::builder().quota(quota).build().unwrap();
    assert_eq!(map.quota(), quota);
    assert_eq!((map.rate(), map.capacity()), (Rate::per_second(2), 4));
    assert_eq!(map.try_acquire_many("a", 4), Ok(()));
    // The first band refuses: 500 ms until it has room for one.
    assert_eq!(map.try_acquire("a"), limited(ms(500)));
    time::advance(ms(500)).await;
    assert_eq!(map.try_acquire("a"), Ok(()));
    // The day is spent: a fifth of a day after the first.
    assert_eq!(map.try_acquire("a"), limited(ms(17_280_000 - 500)));
    time::advance(ms(1_500)).await;
    assert_eq!(map.try_acquire("a"), limited(ms(17_280_000 - 2_000)));
    // The first band has room for 3: the refusals took none of it.
    let bands: Vec<_> = map.peek("a", 1).bands().map(|b| b.available).collect();
    assert_eq!(bands, [3, 0]);
    assert_eq!(map.free("a"), 0);
    assert_eq!(map.empty_in("a"), ms(86_400_000 - 2_000));
    assert_eq!(
        map.try_acquire("b"),
        Ok(()),
        "another key has its own bands"
    );
}

#[tokio::test(start_paused = true)]
async fn a_tier_change_keeps_each_bands_instant() {
    // The same windows: 1 s for the first band, a day for the second.
    let free = Quota::new(Rate::per_second(2), 2).and(Rate::per_day(100), 100);
    let paid = Quota::new(Rate::per_second(20), 20).and(Rate::per_day(1_000), 1_000);
    let map: KeyedFunnel<u64> = KeyedFunnel::builder()
        .quota(free)
        .tier(paid)
        .build()
        .unwrap();
    assert_eq!(map.try_acquire_many(&1, 2), Ok(()));
    // Upgraded: the first band is as full (1 s until empty: all 20 of the
    // paid band), the day band holds 2 × 864 s of water, 20 paid units.
    let bands: Vec<_> = map
        .peek_with(&1, &paid, 1)
        .bands()
        .map(|b| (b.available, b.full_in))
        .collect();
    assert_eq!(bands, [(0, ms(1_000)), (980, Duration::from_secs(2 * 864))]);
    assert_eq!(map.try_acquire_with(&1, &paid, 1), limited(ms(50)));
    time::advance(ms(500)).await;
    assert_eq!(map.try_acquire_with(&1, &paid, 10), Ok(()));
    // Back to free: the first band holds 1 s of water again, its whole
    // capacity: 500 ms until one more.
    assert_eq!(map.try_acquire(&1), limited(ms(500)));
    // A key moved to a band of a shorter window (100 ms) with a second of
    // water in it waits for the excess to drain.
    let long = Quota::new(Rate::per_second(2), 2);
    let short = Quota::new(Rate::per_second(20), 2);
    let map: KeyedFunnel<u64> = KeyedFunnel::builder()
        .quota(long)
        .tier(short)
        .build()
        .unwrap();
    assert_eq!(map.try_acquire_many(&1, 2), Ok(()));
    assert_eq!(map.try_acquire_with(&1, &short, 1), limited(ms(950)));
}

#[tokio::test(start_paused = true)]
async fn tiers_with_different_band_counts() {
    // A one-band tier leaves the second band of a two-band key alone.
    let two = Quota::new(Rate::per_second(10), 10).and(Rate::per_minute(12), 12);
    let one = Quota::new(Rate::per_second(10), 10);
    let map: KeyedFunnel<u64> = KeyedFunnel::builder().quota(two).tier(one).build().unwrap();
    assert_eq!(map.try_acquire_many(&1, 10), Ok(()));
    time::advance(ms(1_000)).await;
    assert_eq!(map.try_acquire_with(&1, &one, 10), Ok(()));
    // The minute band still holds the first 10 (less what drained), not
    // the second.
    let bands: Vec<_> = map.peek(&1, 1).bands().map(|b| b.available).collect();
    assert_eq!(bands, [0, 2]);
    assert_eq!(map.try_acquire_many(&1, 4), limited(ms(9_000)));
}

#[tokio::test(start_paused = true)]
async fn bad_tiers_and_requests() {
    let quota = Quota::new(Rate::per_second(100), 100).and(Rate::per_day(10), 10);
    // A burst larger than the day's total: held to the day's.
    let map: KeyedFunnel<u64> = KeyedFunnel::builder().quota(quota).build().unwrap();
    assert_eq!(map.capacity(), 10);
    assert_eq!(
        map.try_acquire_many(&1, 11),
        Err(TryAcquireError::InsufficientCapacity)
    );
    assert!(!map.peek(&1, 11).is_granted());
    assert_eq!(map.peek(&1, 11).retry_after(), None);
    assert_eq!(map.len(), 0, "refused before any key was made");
    // Tiers whose rates share no unit finer than 2^32 per ns.
    let a = Quota::new(Rate::per_second(100_003), 1);
    let b = Quota::new(Rate::per_second(100_019), 1);
    let error = KeyedFunnel::<u64>::builder().quota(a).tier(b).build();
    assert!(
        matches!(
            error,
            Err(ConfigError::InvalidParameter { name: "tier", .. })
        ),
        "{error:?}"
    );
    // An empty band, and a tier declared twice (once is enough).
    let zero = KeyedFunnel::<u64>::builder()
        .quota(quota)
        .tier(Quota::new(Rate::per_second(1), 0))
        .build();
    assert!(matches!(zero, Err(ConfigError::ZeroCapacity)), "{zero:?}");
    let twice: KeyedFunnel<u64> = KeyedFunnel::builder()
        .quota(quota)
        .tier(quota)
        .tier(a)
        .tier(a)
        .build()
        .unwrap();
    assert_eq!(twice.try_acquire_with(&1, &a, 1), Ok(()));
    // A quota and a rate together.
    let both = KeyedFunnel::<u64>::builder()
        .quota(quota)
        .rate(Rate::per_second(1))
        .build();
    assert!(matches!(
        both,
        Err(ConfigError::InvalidParameter { name: "quota", .. })
    ));
}

#[test]
#[should_panic(expected = "not one of the map's")]
fn a_quota_the_map_was_not_built_with_panics() {
    let map: KeyedFunnel<u64> = KeyedFunnel::builder()
        .quota(Quota::new(Rate::per_second(1), 1))
        .build()
        .unwrap();
    let _ = map.try_acquire_with(&1, &Quota::new(Rate::per_second(2), 1), 1);
}

#[tokio::test(start_paused = true)]
async fn a_waiter_under_a_tier_gets_its_bands() {
    let free = Quota::new(Rate::per_second(1), 1);
    let paid = Quota::new(Rate::per_second(10), 2).and(Rate::per_minute(3), 3);
    let map: KeyedFunnel<u64> = KeyedFunnel::builder()
        .quota(free)
        .tier(paid)
        .build()
        .unwrap();
    let start = Instant::now();
    for _ in 0..3 {
        map.acquire_with(&1, &paid, 1).await.unwrap();
    }
    assert_eq!(start.elapsed(), ms(100), "a burst of 2, then 100 ms");
    map.acquire_with(&1, &paid, 1).await.unwrap();
    assert_eq!(
        start.elapsed(),
        ms(20_000),
        "a third of a minute for the fourth"
    );
    assert_eq!(
        map.acquire_with(&1, &paid, 3).await,
        Err(tokio_ratelimit::AcquireError::InsufficientCapacity)
    );
    assert_eq!(map.stats().granted, 4);
}

/// A waiter of the map's own quota tries each time under the quota then
/// in use: `set_quota` while it waits applies from its next try, as to a
/// new call. A = 1/s with a burst of 2, B = 1/s with a burst of 1; a key
/// drained under A at 0 is empty again at 2 s (an instant B keeps). One
/// permit fits under A at 1 s, under B at 2 s; two permits never fit
/// under B.
#[tokio::test(start_paused = true)]
async fn a_waiter_tries_under_the_quota_set_while_it_waits() {
    let a = Quota::new(Rate::per_second(1), 2);
    let b = Quota::new(Rate::per_second(1), 1);
    let map: KeyedFunnel<u64> = KeyedFunnel::builder().quota(a).tier(b).build().unwrap();
    let start = Instant::now();
    map.try_acquire_many(&1, 2).unwrap();
    map.try_acquire_many(&2, 2).unwrap();
    let one = tokio_test::task::spawn(map.acquire(&1));
    let two = tokio_test::task::spawn(map.acquire_many(&2, 2));
    let (mut one, mut two) = (one, two);
    tokio_test::assert_pending!(one.poll());
    tokio_test::assert_pending!(two.poll());
    time::advance(ms(200)).await;
    map.set_quota(b).unwrap();
    // Key 2's waiter tries again at 2 s (its wait under A): under B, two
    // permits are more than the capacity.
    time::sleep_until(start + ms(1500)).await;
    tokio_test::assert_pending!(one.poll(), "under A it would have gone at 1 s");
    assert_eq!(one.await, Ok(()));
    assert_eq!(start.elapsed(), ms(2000));
    assert_eq!(
        two.await,
        Err(tokio_ratelimit::AcquireError::InsufficientCapacity)
    );
}

/// The tier-change rule keeps the time until each band is empty, not its
/// count: a band of the same window keeps the fraction in use, one of a
/// shorter window is as full or fuller, and one of a longer window holds
/// that time's water, a smaller fraction of it. A key drained under 10/s
/// with a burst of 10 (1 s of water) holds 1 s of water under 1/s with a
/// burst of 10 (one permit's worth): 9 permits at once. Under 20/s with a
/// burst of 20 (the same window) it holds the whole window: none.
#[tokio::test(start_paused = true)]
async fn a_tier_change_keeps_the_time_of_water_not_the_count() {
    let a = Quota::new(Rate::per_second(10), 10);
    let longer = Quota::new(Rate::per_second(1), 10);
    let same = Quota::new(Rate::per_second(20), 20);
    let map: KeyedFunnel<u64> = KeyedFunnel::builder()
        .quota(a)
        .tier(longer)
        .tier(same)
        .build()
        .unwrap();
    for key in [1, 2] {
        map.try_acquire_many(&key, 10).unwrap();
    }
    let taken = |quota: &Quota, key: u64| {
        (0..20)
            .take_while(|_| map.try_acquire_with(&key, quota, 1).is_ok())
            .count()
    };
    assert_eq!(taken(&longer, 1), 9);
    assert_eq!(taken(&same, 2), 0);
    // The map's own quota switched to the longer window: the same rule.
    map.try_acquire_many(&3, 10).unwrap();
    map.set_quota(longer).unwrap();
    assert_eq!(
        (0..20).take_while(|_| map.try_acquire(&3).is_ok()).count(),
        9
    );
}
