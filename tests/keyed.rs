//! Per-resource limiters: `KeyedFunnel` (one word per key) and `Keyed<K, L>`
//! (any limiter per key), in paused time: per-key independence, exact
//! `retry_after`, eviction of fresh-equivalent keys only (an evicted and
//! rebuilt key behaves exactly as a kept one), `max_keys` refusal, borrowed
//! lookups, concurrency, and a property test of the per-key window bound
//! under any interleaving of evictions.

use std::collections::HashMap;
use std::time::Duration;

use proptest::prelude::*;
use tokio::time::{self, Instant};
use tokio_ratelimit::algorithm::FunnelState;
use tokio_ratelimit::keyed::{Keyed, KeyedFunnel};
use tokio_ratelimit::test_util::GrantLog;
use tokio_ratelimit::{Funnel, LeakyBucket, Limiter, Rate, TokenBucket, TryAcquireError};

mod support;
use support::{limited, ms};

fn funnels(rate: Rate, capacity: u32) -> KeyedFunnel<String> {
    KeyedFunnel::builder()
        .rate(rate)
        .capacity(capacity)
        .build()
        .unwrap()
}

#[tokio::test(start_paused = true)]
async fn keys_are_independent_and_retry_after_is_exact() {
    let map = funnels(Rate::per_second(2), 2);

    assert_eq!(map.try_acquire("a"), Ok(()));
    assert_eq!(map.try_acquire("a"), Ok(()));
    assert_eq!(map.try_acquire("a"), limited(ms(500)));
    assert_eq!(map.try_acquire_many("b", 2), Ok(()));
    assert_eq!(map.try_acquire("b"), limited(ms(500)));
    assert_eq!(map.try_acquire("c"), Ok(()));
    time::advance(ms(200)).await;
    assert_eq!(map.try_acquire("a"), limited(ms(300)));
    assert_eq!(map.try_acquire_many("c", 2), limited(ms(300)));
    assert_eq!(map.try_acquire("c"), Ok(()));
    assert_eq!(map.len(), 3);
}

#[tokio::test(start_paused = true)]
async fn same_numbers_as_a_funnel_at_awkward_rates() {
    // 7/s: an interval of 142 857 142.857… ns, kept exactly per key.
    let rate = Rate::per_second(7);
    let map: KeyedFunnel<u64> = KeyedFunnel::builder()
        .rate(rate)
        .capacity(3)
        .build()
        .unwrap();
    let mut models: HashMap<u64, FunnelState> = HashMap::new();
    let start = Instant::now();
    for step in 0..3000u64 {
        time::advance(Duration::from_micros((step * 7919) % 90_000)).await;
        let key = step % 5;
        let n = u32::try_from(step % 4).unwrap();
        let model = models
            .entry(key)
            .or_insert_with(|| FunnelState::new(rate, 3).unwrap());
        let expected = model.try_pour(start.elapsed(), n);
        assert_eq!(map.try_acquire_many(&key, n), expected, "step {step}");
    }
}

#[tokio::test(start_paused = true)]
async fn borrowed_lookups() {
    let map = funnels(Rate::per_second(1), 1);
    let owned = String::from("user-42");
    assert!(map.try_acquire(owned.as_str()).is_ok());
    assert!(map.try_acquire("user-42").is_err());
    assert!(map.try_acquire(&owned).is_err());
    let ids: KeyedFunnel<u64> = KeyedFunnel::builder()
        .rate(Rate::per_second(1))
        .capacity(1)
        .build()
        .unwrap();
    assert!(ids.try_acquire(&7).is_ok());
    assert!(ids.try_acquire(&7).is_err());
}

#[tokio::test(start_paused = true)]
async fn bad_requests_and_config() {
    let map = funnels(Rate::per_second(10), 3);
    assert_eq!(
        map.try_acquire_many("a", 4),
        Err(TryAcquireError::InsufficientCapacity)
    );
    assert_eq!(map.try_acquire_many("a", 0), Ok(()));
    assert_eq!(map.len(), 0, "refused requests add no key");
    assert_eq!(
        map.acquire_many("a", 4).await,
        Err(tokio_ratelimit::AcquireError::InsufficientCapacity)
    );
    assert!(KeyedFunnel::<u64>::builder().capacity(1).build().is_err());
    assert!(
        KeyedFunnel::<u64>::builder()
            .rate(Rate::per_second(0))
            .build()
            .is_err()
    );
    assert!(
        KeyedFunnel::<u64>::builder()
            .rate(Rate::per_second(1))
            .max_keys(0)
            .build()
            .is_err()
    );
    let no_factory = Keyed::<u64, Funnel>::builder().build();
    assert!(no_factory.is_err());
    let bad_factory = Keyed::<u64, Funnel>::builder()
        .limiter(|| Funnel::builder().rate(Rate::per_second(0)).build())
        .build();
    assert!(bad_factory.is_err());
}

#[tokio::test(start_paused = true)]
async fn acquire_waits_exactly_retry_after() {
    let map = funnels(Rate::per_second(4), 1);
    let start = Instant::now();
    map.acquire("k").await.unwrap();
    map.acquire("k").await.unwrap();
    map.acquire_many("k", 1).await.unwrap();
    assert_eq!(start.elapsed(), ms(500));
    // Another key is not held up.
    map.acquire("other").await.unwrap();
    assert_eq!(start.elapsed(), ms(500));
}

#[tokio::test(start_paused = true)]
async fn only_drained_keys_are_evicted_and_rebuilt_keys_behave_as_kept() {
    let map = funnels(Rate::per_second(10), 5);
    map.try_acquire_many("busy", 5).unwrap();
    map.try_acquire("light").unwrap();
    time::advance(ms(100)).await;
    // "light" has drained, "busy" holds 4 units.
    assert_eq!(map.sweep(), 1);
    assert_eq!(map.stats().evicted, 1);
    assert_eq!(map.try_acquire_many("busy", 2), limited(ms(100)));
    // A rebuilt key is a fresh funnel, which is what a kept one would be.
    assert_eq!(map.try_acquire_many("light", 5), Ok(()));
    time::advance(ms(400)).await;
    assert_eq!(map.sweep(), 1, "busy drains at 500 ms, light at 600 ms");
    time::advance(ms(100)).await;
    assert_eq!(map.sweep(), 0);
    assert!(map.is_empty());
    assert_eq!(map.stats().evicted, 3);
}

#[tokio::test(start_paused = true)]
async fn the_sweeper_drops_drained_keys_and_parks_when_empty() {
    let map: KeyedFunnel<u64> = KeyedFunnel::builder()
        .rate(Rate::per_second(100))
        .capacity(10)
        .sweep_interval(ms(250))
        .build()
        .unwrap();
    for key in 0..1000u64 {
        map.try_acquire_many(&key, 1 + u32::try_from(key % 10).unwrap())
            .unwrap();
    }
    assert_eq!(map.len(), 1000);
    // Every funnel has drained after 100 ms; the sweeper runs at 250 ms.
    time::sleep(ms(251)).await;
    assert_eq!(map.len(), 0);
    assert_eq!(map.stats().evicted, 1000);
}

#[tokio::test(start_paused = true)]
async fn max_keys_refuses_new_keys_while_all_are_active() {
    let map: KeyedFunnel<u64> = KeyedFunnel::builder()
        .rate(Rate::per_second(10))
        .capacity(2)
        .max_keys(100)
        .build()
        .unwrap();
    for key in 0..100u64 {
        map.try_acquire(&key).unwrap();
    }
    // Every slot holds an active key: a new one is refused, fail closed,
    // as the map's doing (Unavailable), not the key's (Limited).
    let refused = map.try_acquire(&1000);
    assert_eq!(refused, Err(TryAcquireError::Unavailable));
    assert_eq!(map.stats().refused, 1);
    assert_eq!(map.len(), 100);
    // The keys present keep their exact limits.
    assert_eq!(map.try_acquire(&7), Ok(()));
    assert_eq!(map.try_acquire(&7), limited(ms(100)));
    // Once keys drain, new keys get slots.
    time::sleep(ms(300)).await;
    assert_eq!(map.try_acquire(&1000), Ok(()));
    assert!(map.len() <= 100);
}

#[tokio::test(start_paused = true)]
async fn a_flood_of_one_shot_keys_stays_bounded_and_spares_active_keys() {
    let rate = Rate::per_second(10);
    let map: KeyedFunnel<u64> = KeyedFunnel::builder()
        .rate(rate)
        .capacity(3)
        .max_keys(1000)
        .build()
        .unwrap();
    // A legitimate client keeps using its key through the flood; its answers
    // must be exactly a never-evicted funnel's.
    let legit = u64::MAX;
    let mut model = FunnelState::new(rate, 3).unwrap();
    let start = Instant::now();
    assert_eq!(map.try_acquire(&legit), model.try_pour(Duration::ZERO, 1));
    let mut admitted = 0u64;
    for (i, key) in (0..100_000u64).enumerate() {
        if map.try_acquire(&key).is_ok() {
            admitted += 1;
        }
        if i % 1000 == 999 {
            time::advance(ms(10)).await;
            assert_eq!(
                map.try_acquire(&legit),
                model.try_pour(start.elapsed(), 1),
                "at {:?}",
                start.elapsed()
            );
        }
        assert!(map.len() <= 1000);
    }
    // One-shot keys drain in 100 ms, so about 1000 per 100 ms get in.
    assert!(admitted >= 1000, "{admitted}");
    assert!(map.stats().refused > 0);
}

#[tokio::test(start_paused = true)]
async fn keyed_token_buckets_per_key_with_fifo_waiting() {
    let per_host: Keyed<String, TokenBucket> = Keyed::builder()
        .limiter(|| {
            TokenBucket::builder()
                .rate(Rate::per_second(10))
                .capacity(2)
                .build()
        })
        .build()
        .unwrap();
    let start = Instant::now();
    let log = GrantLog::new();
    let mut tasks = vec![];
    for who in 0..6usize {
        let per_host = per_host.clone();
        let log = log.clone();
        tasks.push(tokio::spawn(async move {
            let host = if who % 2 == 0 { "even" } else { "odd" };
            per_host.acquire(host).await.unwrap();
            log.record_for(who, 1);
        }));
        tokio::task::yield_now().await;
    }
    for task in tasks {
        task.await.unwrap();
    }
    // Each host: 2 at once, then one per 100 ms, in arrival order.
    assert_eq!(log.order(), [0, 1, 2, 3, 4, 5]);
    assert_eq!(
        log.offsets(),
        [ms(0), ms(0), ms(0), ms(0), ms(100), ms(100)]
    );
    assert_eq!(start.elapsed(), ms(100));
    assert_eq!(per_host.try_acquire("even"), limited(ms(100)));
    assert_eq!(per_host.len(), 2);
}

#[tokio::test(start_paused = true)]
async fn ten_thousand_idle_token_buckets_are_evicted_without_waking() {
    let runtime = tokio::runtime::Handle::current();
    let before = runtime.metrics().num_alive_tasks();
    let map: Keyed<u64, TokenBucket> = Keyed::builder()
        .limiter(|| {
            TokenBucket::builder()
                .rate(Rate::per_second(10))
                .capacity(5)
                .build()
        })
        .sweep_interval(Duration::from_secs(60))
        .build()
        .unwrap();
    for key in 0..10_000u64 {
        map.try_acquire_many(&key, 3).unwrap();
    }
    assert_eq!(map.len(), 10_000);
    // Each key has an actor, parked: an hour of idle paused time costs
    // nothing, and the sweeper drops every key once it has refilled.
    let wall = std::time::Instant::now();
    time::sleep(Duration::from_secs(3600)).await;
    assert!(
        wall.elapsed() < Duration::from_secs(2),
        "{:?}",
        wall.elapsed()
    );
    assert_eq!(map.len(), 0);
    assert_eq!(map.stats().evicted, 10_000);
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
    // The evicted buckets' actors have ended; the sweeper remains.
    assert_eq!(runtime.metrics().num_alive_tasks(), before + 1);
}

#[tokio::test(start_paused = true)]
async fn a_held_handle_or_a_waiter_keeps_its_key() {
    let map: Keyed<&'static str, TokenBucket> = Keyed::builder()
        .limiter(|| {
            TokenBucket::builder()
                .rate(Rate::per_second(10))
                .capacity(1)
                .build()
        })
        .build()
        .unwrap();
    let handle = map.get(&"held");
    assert_eq!(map.sweep(), 1, "a full bucket with an outside handle stays");
    drop(handle);
    assert_eq!(map.sweep(), 0, "without it, a full bucket is fresh");
    map.try_acquire(&"waited").unwrap();
    let waiter = tokio::spawn({
        let map = map.clone();
        async move { map.acquire(&"waited").await }
    });
    tokio::task::yield_now().await;
    assert_eq!(map.sweep(), 1, "a bucket with a waiter stays");
    waiter.await.unwrap().unwrap();
    time::advance(ms(100)).await;
    assert_eq!(map.sweep(), 0);
}

#[tokio::test(start_paused = true)]
async fn buckets_that_start_below_capacity_are_never_fresh() {
    let map: Keyed<u32, TokenBucket> = Keyed::builder()
        .limiter(|| {
            TokenBucket::builder()
                .rate(Rate::per_second(10))
                .capacity(2)
                .initial(0)
                .build()
        })
        .build()
        .unwrap();
    map.get(&1);
    time::advance(Duration::from_secs(10)).await;
    // Full now, but a new one would start empty: evicting would change
    // what the key gets.
    assert_eq!(map.sweep(), 1);
}

#[tokio::test(start_paused = true)]
async fn keyed_leaky_buckets_and_funnels_are_fresh_when_empty() {
    let shapers: Keyed<u8, LeakyBucket> = Keyed::builder()
        .limiter(|| {
            LeakyBucket::builder()
                .rate(Rate::per_second(10))
                .capacity(2)
                .build()
        })
        .build()
        .unwrap();
    shapers.acquire(&1).await.unwrap();
    assert_eq!(shapers.sweep(), 1);
    time::advance(ms(100)).await;
    assert_eq!(shapers.sweep(), 0);
    let meters: Keyed<u8, Funnel> = Keyed::builder()
        .limiter(|| {
            Funnel::builder()
                .rate(Rate::per_second(10))
                .capacity(2)
                .build()
        })
        .max_keys(1)
        .build()
        .unwrap();
    meters.try_acquire(&1).unwrap();
    assert!(meters.try_acquire(&2).is_err(), "max_keys: key 1 is active");
    time::advance(ms(100)).await;
    // Key 1 drained: the sweep on insert makes room for key 2.
    time::advance(Duration::from_secs(1)).await;
    assert_eq!(meters.try_acquire(&2), Ok(()));
}

#[tokio::test(start_paused = true)]
async fn concurrent_use_from_many_tasks_respects_each_key() {
    let map: KeyedFunnel<u64> = KeyedFunnel::builder()
        .rate(Rate::per_second(100))
        .capacity(5)
        .build()
        .unwrap();
    let logs: Vec<GrantLog> = (0..4).map(|_| GrantLog::new()).collect();
    let mut tasks = vec![];
    for t in 0..32u64 {
        let map = map.clone();
        let logs = logs.clone();
        tasks.push(tokio::spawn(async move {
            for _ in 0..50 {
                let key = t % 4;
                map.acquire(&key).await.unwrap();
                logs[usize::try_from(key).unwrap()].record(1);
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    for log in &logs {
        assert_eq!(log.total(), 400);
        log.assert_rate(Rate::per_second(100), 5, Duration::ZERO);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// Per key, the funnel's window bound holds exactly — and the answers
    /// equal a never-evicted `FunnelState` — however sweeps (explicit,
    /// on insert under `max_keys`, and the background sweeper) interleave.
    #[test]
    fn per_key_bound_holds_under_any_eviction(
        permits in 1u32..50,
        period_ms in 1u64..2000,
        capacity in 1u32..6,
        max_keys in 1usize..6,
        ops in proptest::collection::vec((0u64..30_000, 0u64..6, 1u32..6, any::<bool>()), 1..120),
    ) {
        let rate = Rate::per(permits, ms(period_ms));
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .start_paused(true)
            .build()
            .unwrap()
            .block_on(async {
                let map: KeyedFunnel<u64> = KeyedFunnel::builder()
                    .rate(rate)
                    .capacity(capacity)
                    .max_keys(max_keys)
                    .sweep_interval(ms(7))
                    .build()
                    .unwrap();
                let start = Instant::now();
                let mut models: HashMap<u64, FunnelState> = HashMap::new();
                let mut logs: HashMap<u64, GrantLog> = HashMap::new();
                for (gap_us, key, n, sweep) in ops {
                    time::sleep(Duration::from_micros(gap_us)).await;
                    if sweep {
                        map.sweep();
                    }
                    let n = n.min(capacity);
                    let now = start.elapsed();
                    let got = map.try_acquire_many(&key, n);
                    let model = models.entry(key).or_insert_with(|| FunnelState::new(rate, capacity).unwrap());
                    let mut trial = model.clone();
                    let expected = trial.try_pour(now, n);
                    match got {
                        Ok(()) => {
                            prop_assert_eq!(expected, Ok(()));
                            *model = trial;
                            logs.entry(key).or_default().record(n);
                        }
                        Err(TryAcquireError::Limited { retry_after }) => {
                            // The funnel's own exact refusal.
                            prop_assert_eq!(expected, Err(TryAcquireError::Limited { retry_after }));
                        }
                        Err(TryAcquireError::Unavailable) => {
                            // A new key refused by max_keys (all slots active).
                            prop_assert!(map.len() >= max_keys);
                            prop_assert!(model.level(now) == 0);
                        }
                        other => prop_assert!(false, "unexpected {:?}", other),
                    }
                    prop_assert!(map.len() <= max_keys);
                }
                for log in logs.values() {
                    prop_assert!(log.rate_violation(rate, capacity, Duration::ZERO).is_none());
                }
                Ok(())
            })?;
    }
}

#[test]
fn trait_objects_and_auto_traits() {
    fn is_send_sync<T: Send + Sync + Clone + std::fmt::Debug + 'static>() {}
    is_send_sync::<KeyedFunnel<String>>();
    is_send_sync::<Keyed<String, TokenBucket>>();
    is_send_sync::<Keyed<u64, std::sync::Arc<dyn Limiter>>>();
}

#[tokio::test(start_paused = true)]
async fn keyed_warm_up_limiters_are_fresh_once_cold_again() {
    use tokio_ratelimit::{SmoothBursty, SmoothWarmingUp};
    let warm: Keyed<u8, SmoothWarmingUp> = Keyed::builder()
        .limiter(|| {
            SmoothWarmingUp::builder()
                .permits_per_second(10.0)
                .warmup(Duration::from_secs(2))
                .build()
        })
        .build()
        .unwrap();
    warm.acquire(&1).await.unwrap();
    warm.acquire(&1).await.unwrap();
    assert_eq!(warm.sweep(), 1, "warmed up a little: not fresh");
    // Cooling from warm to cold takes the warm-up period.
    time::advance(Duration::from_secs(3)).await;
    assert_eq!(warm.sweep(), 0);
    // A bursty limiter stores permits while idle: never like a new one.
    let bursty: Keyed<u8, SmoothBursty> = Keyed::builder()
        .limiter(|| SmoothBursty::builder().permits_per_second(10.0).build())
        .build()
        .unwrap();
    bursty.try_acquire(&1).unwrap();
    time::advance(Duration::from_secs(10)).await;
    assert_eq!(bursty.sweep(), 1);
}

#[tokio::test(start_paused = true)]
async fn keyed_stats_count_grants_limits_and_keys() {
    let map = funnels(Rate::per_second(1), 2);
    map.try_acquire_many("a", 2).unwrap();
    map.try_acquire("a").unwrap_err();
    map.try_acquire("b").unwrap();
    map.try_acquire_many("b", 3).unwrap_err();
    let s = map.stats();
    assert_eq!((s.keys, s.granted, s.limited, s.refused), (2, 3, 2, 0));
    let per_host: Keyed<u8, TokenBucket> = Keyed::builder()
        .limiter(|| {
            TokenBucket::builder()
                .rate(Rate::per_second(1))
                .capacity(1)
                .build()
        })
        .build()
        .unwrap();
    per_host.acquire(&1).await.unwrap();
    per_host.try_acquire(&1).unwrap_err();
    let s = per_host.stats();
    assert_eq!((s.keys, s.granted, s.limited), (1, 1, 1));
}

#[tokio::test(start_paused = true)]
async fn without_the_background_sweeper_no_timer_is_armed() {
    let map: KeyedFunnel<u64> = KeyedFunnel::builder()
        .rate(Rate::per_second(10))
        .capacity(1)
        .background_sweep(false)
        .build()
        .unwrap();
    map.try_acquire(&1).unwrap();
    // With no timer pending, an idle runtime's paused clock stays put.
    let start = Instant::now();
    tokio::task::yield_now().await;
    assert_eq!(start.elapsed(), Duration::ZERO);
    let runtime = tokio::runtime::Handle::current();
    assert_eq!(runtime.metrics().num_alive_tasks(), 0);
    // Drained keys still go, on demand.
    time::advance(ms(100)).await;
    assert_eq!(map.sweep(), 0);
    // Keyed builds its limiters in the runtime all the same.
    let per_host: Keyed<u8, TokenBucket> = Keyed::builder()
        .limiter(|| {
            TokenBucket::builder()
                .rate(Rate::per_second(10))
                .capacity(1)
                .build()
        })
        .background_sweep(false)
        .build()
        .unwrap();
    per_host.acquire(&1).await.unwrap();
    // An idle bucket holds no task: its actor runs only while someone waits.
    assert_eq!(runtime.metrics().num_alive_tasks(), 0);
    per_host.acquire(&1).await.unwrap();
    assert_eq!(
        runtime.metrics().num_alive_tasks(),
        0,
        "the waiter's actor ended"
    );
}

/// A `KeyedFunnel::acquire` that waits its turn is one grant, not a
/// refusal per try on the way; one that can never fit is one refusal.
#[tokio::test(start_paused = true)]
async fn keyed_funnel_acquire_counts_only_its_answer() {
    let map = funnels(Rate::per_second(10), 1);
    map.try_acquire("a").unwrap();
    let start = Instant::now();
    map.acquire("a").await.unwrap();
    map.acquire("a").await.unwrap();
    assert_eq!(start.elapsed(), ms(200));
    assert_eq!(
        map.acquire_many("a", 2).await,
        Err(tokio_ratelimit::AcquireError::InsufficientCapacity)
    );
    let stats = map.stats();
    assert_eq!((stats.granted, stats.limited), (3, 1));
}
