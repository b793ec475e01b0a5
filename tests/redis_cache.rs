//! The refusal cache of `redis::RedisFunnel` against a real `redis-server`
//! (feature `redis`): it never refuses what the script would grant, it
//! saves the round trips of a client hammering a key over its limit, and
//! it stays bounded under a flood of keys. Real time (Redis's clock), as in
//! `tests/redis.rs`; no sleep checks a rate.

#[path = "support/redis_server.rs"]
mod redis_server;

use std::time::Duration;

use redis_server::RedisServer;
use tokio::time::Instant;
use tokio_ratelimit::redis::{FailurePolicy, RedisFunnel, RedisLimitError};
use tokio_ratelimit::{Quota, Rate};

async fn funnel(server: &RedisServer, quota: Quota, prefix: &str, cache: usize) -> RedisFunnel {
    RedisFunnel::builder(server.url())
        .quota(quota)
        .prefix(prefix)
        .failure_policy(FailurePolicy::Closed)
        .timeout(Duration::from_millis(500))
        .refusal_cache(cache)
        .build()
        .await
        .unwrap()
}

/// A seeded generator (the runs are reproducible).
struct Lcg(u64);

impl Lcg {
    fn below(&mut self, n: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (self.0 >> 33) % n
    }
}

/// Random requests from two processes' limiters on one prefix — one with
/// the cache, one without — over three keys and two tiers: every refusal
/// the cache answers, the script gives too. Each is checked at once with a
/// `peek` of the cacheless limiter (one round trip that changes nothing);
/// a refusal whose wait ran out during that round trip proves nothing and
/// is not counted.
#[tokio::test]
async fn the_cache_only_refuses_what_the_script_refuses() {
    let Some(server) = RedisServer::start("the_cache_only_refuses_what_the_script_refuses") else {
        return;
    };
    let free = Quota::new(Rate::per_second(20), 3).and(Rate::per_second(5), 5);
    let paid = Quota::new(Rate::per_second(40), 6);
    let cached = funnel(&server, free, "prop:", 2).await;
    let other = funnel(&server, free, "prop:", 0).await;
    let mut rng = Lcg(7);
    let (mut checked, mut granted) = (0, 0);
    for _ in 0..3_000 {
        let key = format!("k{}", rng.below(3));
        let quota = if rng.below(4) == 0 { paid } else { free };
        let n = u32::try_from(rng.below(3) + 1).unwrap();
        if rng.below(10) == 0 {
            let _ = other.try_acquire_with(&key, &quota, n).await;
            continue;
        }
        let before = cached.stats().cached_refusals;
        let asked = Instant::now();
        let answer = cached.try_acquire_with(&key, &quota, n).await;
        if cached.stats().cached_refusals == before {
            granted += u32::from(answer.is_ok());
            continue;
        }
        let Err(RedisLimitError::Limited { retry_after }) = answer else {
            panic!("the cache answered {answer:?}");
        };
        let truth = other.peek_with(&key, &quota, n).await.unwrap();
        if asked.elapsed() + Duration::from_millis(1) < retry_after {
            assert!(
                !truth.is_granted(),
                "cache refused {n} of {key} under {quota:?} for {retry_after:?}, the script grants"
            );
            checked += 1;
        }
    }
    assert!(
        checked > 100 && granted > 20,
        "{checked} checked, {granted} granted"
    );
}

/// A client offered 100 × its rate: the cache answers nearly all of its
/// refusals, the grants are exactly what Redis gives without it, and the
/// script's calls on the server are the decisions the stats count.
#[tokio::test]
async fn a_hammered_key_costs_a_round_trip_per_retry_after() {
    let Some(server) = RedisServer::start("a_hammered_key_costs_a_round_trip_per_retry_after")
    else {
        return;
    };
    let quota = Quota::new(Rate::per_second(50), 5);
    let with = funnel(&server, quota, "hammer:", 64).await;
    let start = Instant::now();
    let mut granted = 0u64;
    let mut asked = 0u64;
    // 5 000 requests per second of real time for 0.4 s (100 × 50/s).
    while start.elapsed() < Duration::from_millis(400) {
        asked += 1;
        granted += u64::from(with.try_acquire("k").await.is_ok());
        let next = start + Duration::from_micros(200 * asked);
        tokio::time::sleep_until(next).await;
    }
    let elapsed = start.elapsed();
    let stats = with.stats();
    let due = 5 + u64::try_from(50 * elapsed.as_millis() / 1000).unwrap();
    assert!(granted <= due + 1, "{granted} granted of {due}");
    // (A loaded machine may pause this task past a burst's worth: 90 %.)
    assert!(
        10 * granted >= 9 * due,
        "{granted} granted of {due}: the cache held back grants"
    );
    assert_eq!(stats.granted, granted);
    assert_eq!(stats.decisions + stats.cached_refusals, asked);
    // About one decision per 20 ms retry_after, not one per request.
    assert!(
        stats.decisions <= 2 * due + 2,
        "{} decisions for {asked} requests",
        stats.decisions
    );
    eprintln!(
        "offered {asked} in {elapsed:?}: {} decisions asked of Redis, {} refused by the cache \
         ({} per mille of requests saved a round trip)",
        stats.decisions,
        stats.cached_refusals,
        1000 * stats.cached_refusals / asked
    );
}

/// A flood of one-shot keys, each refused once: the cache keeps at most
/// its slots, and a key it forgot is simply asked again.
#[tokio::test]
async fn a_flood_of_keys_keeps_the_cache_bounded() {
    let Some(server) = RedisServer::start("a_flood_of_keys_keeps_the_cache_bounded") else {
        return;
    };
    let quota = Quota::new(Rate::per_minute(1), 1);
    let l = funnel(&server, quota, "flood:", 8).await;
    let keys: Vec<String> = (0..500).map(|k| format!("f{k}")).collect();
    let batch: Vec<(&str, u32)> = keys.iter().map(|k| (k.as_str(), 1)).collect();
    assert!(
        l.try_acquire_many_keys(&batch)
            .await
            .iter()
            .all(Result::is_ok)
    );
    // Every key refused by Redis once, remembered in one of 8 slots.
    assert!(
        l.try_acquire_many_keys(&batch)
            .await
            .iter()
            .all(Result::is_err)
    );
    assert_eq!(l.stats().cached_refusals, 0);
    // Asked again: at most 8 are answered by the cache, the rest by Redis,
    // all refused.
    assert!(
        l.try_acquire_many_keys(&batch)
            .await
            .iter()
            .all(Result::is_err)
    );
    let stats = l.stats();
    assert!((1..=8).contains(&stats.cached_refusals), "{stats:?}");
    assert_eq!(stats.decisions + stats.cached_refusals, 1_500);
}
