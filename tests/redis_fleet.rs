//! What a fleet sharing `redis::RedisFunnel` needs beyond one decision
//! (feature `redis`), against a real `redis-server`: the refusal cache
//! never refuses what the script would grant, saves the round trips of a
//! client hammering a key over its limit, and stays bounded under a flood
//! of keys; a server whose scripts see no sane clock is refused at build;
//! waiters on one key do not retry at the same instant. Real time (Redis's
//! clock), as in `tests/redis.rs`.

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

/// A stand-in for a Redis-compatible server whose scripts read `TIME` as
/// zero: it answers `SCRIPT LOAD` with a hash, every script call with a
/// time of 0 and no state, and anything else with `+OK`. (No real server
/// does this on purpose; some compatible ones do it by accident.)
async fn a_server_whose_scripts_see_time_zero() -> (String, tokio::task::JoinHandle<()>) {
    use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("redis://{}/", listener.local_addr().unwrap());
    let task = tokio::spawn(async move {
        loop {
            let Ok((socket, _)) = listener.accept().await else {
                return;
            };
            tokio::spawn(async move {
                let (read, mut write) = socket.into_split();
                let mut read = BufReader::new(read);
                loop {
                    // One command: *<argc>, then $<len> and the bytes of each.
                    let mut line = String::new();
                    if read.read_line(&mut line).await.unwrap_or(0) == 0 {
                        return;
                    }
                    let count: usize = line.trim_start_matches('*').trim().parse().unwrap();
                    let mut args = Vec::with_capacity(count);
                    for _ in 0..count {
                        line.clear();
                        read.read_line(&mut line).await.unwrap();
                        let len: usize = line.trim_start_matches('$').trim().parse().unwrap();
                        let mut arg = vec![0; len + 2];
                        read.read_exact(&mut arg).await.unwrap();
                        arg.truncate(len);
                        args.push(String::from_utf8_lossy(&arg).into_owned());
                    }
                    let command = args.first().map(|c| c.to_uppercase());
                    let reply = match command.as_deref() {
                        // The client checks that the hash is its script's.
                        Some("SCRIPT") => {
                            let sha = redis::Script::new(&args[2]).get_hash().to_owned();
                            format!("$40\r\n{sha}\r\n")
                        }
                        Some("EVALSHA" | "EVAL") => "*2\r\n:0\r\n$-1\r\n".to_owned(),
                        _ => "+OK\r\n".to_owned(),
                    };
                    if write.write_all(reply.as_bytes()).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    (url, task)
}

#[tokio::test]
async fn a_server_whose_scripts_see_no_clock_is_refused_at_build() {
    let (url, server) = a_server_whose_scripts_see_time_zero().await;
    let built = RedisFunnel::builder(url.as_str())
        .rate(Rate::per_second(10))
        .build()
        .await;
    assert!(
        matches!(
            built,
            Err(tokio_ratelimit::redis::RedisBuildError::Clock { server_time_us: 0 })
        ),
        "{built:?}"
    );
    server.abort();
}

/// The decision and the state it left, in one round trip: the same bands
/// a peek then reads, and one `EVALSHA` on the server per decision.
#[tokio::test]
async fn a_decision_reports_its_bands_in_the_same_round_trip() {
    let Some(server) = RedisServer::start("a_decision_reports_its_bands_in_the_same_round_trip")
    else {
        return;
    };
    let quota = Quota::new(Rate::per(1, Duration::from_secs(20)), 3)
        .and(Rate::per(1, Duration::from_secs(3_600)), 10);
    let l = funnel(&server, quota, "report:", 0).await;
    let mut con = redis::Client::open(server.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query_async(&mut con)
        .await
        .unwrap();
    let mut reports = Vec::new();
    for _ in 0..4 {
        reports.push(l.try_acquire_and_peek("k", None, 1).await.unwrap());
    }
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut con)
        .await
        .unwrap();
    let evalsha = info
        .lines()
        .find(|l| l.starts_with("cmdstat_evalsha:"))
        .and_then(|l| l.split("calls=").nth(1))
        .and_then(|c| c.split(',').next())
        .unwrap();
    assert_eq!(evalsha, "4", "{info}");
    let available: Vec<Vec<u32>> = reports
        .iter()
        .map(|r| r.bands().map(|b| b.available).collect())
        .collect();
    assert_eq!(available, [vec![2, 9], vec![1, 8], vec![0, 7], vec![0, 7]]);
    assert!(reports[..3].iter().all(tokio_ratelimit::Peek::is_granted));
    let refused = reports[3].retry_after().unwrap();
    assert!(refused > Duration::from_millis(19_900) && refused <= Duration::from_secs(20));
    // The bands agree with a look right after (to the millisecond of real
    // time between them).
    let look = l.peek("k", 1).await.unwrap();
    for (after, looked) in reports[3].bands().zip(look.bands()) {
        assert_eq!(after.available, looked.available);
        assert!(after.full_in.checked_sub(looked.full_in).unwrap() < Duration::from_millis(50));
    }
}

#[tokio::test]
async fn a_refusal_cache_too_large_to_allocate_is_refused_at_build() {
    // No server needed: the size is checked before connecting.
    let built = RedisFunnel::builder("redis://127.0.0.1:1/")
        .rate(Rate::per_second(1))
        .refusal_cache(usize::MAX)
        .build()
        .await;
    assert!(
        matches!(
            built,
            Err(tokio_ratelimit::redis::RedisBuildError::Config(
                tokio_ratelimit::ConfigError::InvalidParameter {
                    name: "refusal_cache",
                    ..
                }
            ))
        ),
        "{built:?}"
    );
}
