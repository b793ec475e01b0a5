//! Review tests that pass: cross-feature answers of the keyed funnel
//! checked against `algorithm::FunnelState` (kept as regression tests).

use std::time::Duration;

use tokio::time::{self, Instant};
use tokio_ratelimit::algorithm::FunnelState;
use tokio_ratelimit::keyed::KeyedFunnel;
use tokio_ratelimit::{Quota, Rate, TryAcquireError};

mod support;
use support::ms;

/// The same arrivals on a one-band key (one word), a two-band key (one
/// 128-bit word) and a three-band key (locked), whose extra bands never
/// bind, give the same answers as one `FunnelState`; `peek` foretells each
/// answer exactly; explicit sweeps between arrivals change nothing; and the
/// counters are exact.
#[tokio::test(start_paused = true)]
async fn one_two_three_bands_peek_and_sweeps_agree() {
    let rate = Rate::per(7, Duration::from_secs(3));
    let cap = 4;
    let loose = (Rate::per_second(1_000), 1_000);
    let q1 = Quota::new(rate, cap);
    let q2 = q1.and(loose.0, loose.1);
    let q3 = q2.and(Rate::per_second(2_000), 2_000);
    let maps: Vec<KeyedFunnel<u64>> = [q1, q2, q3]
        .iter()
        .map(|q| {
            KeyedFunnel::builder()
                .quota(*q)
                .background_sweep(false)
                .build()
                .unwrap()
        })
        .collect();
    let start = Instant::now();
    let mut model = FunnelState::new(rate, cap).unwrap();
    let (mut granted, mut limited) = (0u64, 0u64);
    let mut seed = 12_345u64;
    for i in 0..2_000u32 {
        seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
        let gap = Duration::from_nanos((seed >> 33) % 900_000_000);
        let n = u32::try_from((seed >> 20) % 4).unwrap() + 1;
        time::advance(gap).await;
        if i % 7 == 0 {
            for m in &maps {
                m.sweep();
            }
        }
        let now = start.elapsed();
        let mut trial = model.clone();
        let expected = trial.try_pour(now, n);
        for (b, m) in maps.iter().enumerate() {
            assert_eq!(
                m.peek(&1, n).answer(),
                expected,
                "peek, {} bands, at {now:?}",
                b + 1
            );
            assert_eq!(
                m.try_acquire_many(&1, n),
                expected,
                "{} bands, at {now:?}",
                b + 1
            );
        }
        match expected {
            Ok(()) => {
                model = trial;
                granted += u64::from(n);
            }
            Err(TryAcquireError::Limited { .. }) => limited += 1,
            Err(e) => panic!("{e:?}"),
        }
    }
    for m in &maps {
        let s = m.stats();
        assert_eq!((s.granted, s.limited), (granted, limited));
    }
}

/// `set_quota` while a key holds water: the key's instant carries over
/// (no fresh burst), then the new quota rules; n = 0 and n > capacity.
#[tokio::test(start_paused = true)]
async fn set_quota_keeps_the_instant_and_edges() {
    let normal = Quota::new(Rate::per_second(10), 10);
    let degraded = Quota::new(Rate::per_second(1), 2);
    let map: KeyedFunnel<u64> = KeyedFunnel::builder()
        .quota(normal)
        .tier(degraded)
        .background_sweep(false)
        .build()
        .unwrap();
    assert_eq!(map.try_acquire_many(&1, 10), Ok(()));
    map.set_quota(degraded).unwrap();
    // 1 s of water; depth 2 s at 1/s: room for 1 now, the next 1 s later.
    assert_eq!(map.try_acquire(&1), Ok(()));
    assert_eq!(
        map.try_acquire(&1),
        Err(TryAcquireError::Limited {
            retry_after: ms(1_000)
        })
    );
    assert_eq!(
        map.try_acquire_many(&1, 3),
        Err(TryAcquireError::InsufficientCapacity)
    );
    assert_eq!(map.try_acquire_many(&1, 0), Ok(()));
    assert_eq!(
        map.try_acquire_many(&2, u32::MAX),
        Err(TryAcquireError::InsufficientCapacity)
    );
    assert_eq!(map.len(), 1, "n = 0 and n > capacity make no key");
    map.set_quota(normal).unwrap();
    // 2 s of water now, over normal's 1 s depth: 1 s + 100 ms to one unit.
    assert_eq!(
        map.try_acquire(&1),
        Err(TryAcquireError::Limited {
            retry_after: ms(1_100)
        })
    );
    time::advance(ms(2_000)).await;
    assert_eq!(map.sweep(), 0);
    assert_eq!(
        map.try_acquire_many(&1, 10),
        Ok(()),
        "swept and made again: full"
    );
}
