//! What a fleet sharing `redis::RedisFunnel` needs beyond one decision
//! (feature `redis`), against a real `redis-server`: the refusal cache
//! never refuses what the script would grant, saves the round trips of a
//! client hammering a key over its limit, and stays bounded under a flood
//! of keys; a server whose scripts see no sane clock is refused at build;
//! waiters on one key do not retry at the same instant. Real time (Redis's
//! clock), as in `tests/redis.rs`.

#[path = "support/redis_server.rs"]
mod redis_server;
mod support;
use support::Lcg;

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

/// Random requests from two processes' limiters on one prefix — one with
/// a refusal cache of a single slot (so that every key's hash collides
/// with every other's), one without — over four keys and two tiers (one
/// band and two), single calls, batches (a key may appear twice in one),
/// `decide`s and peeks mixed, and now and then a restart of the server
/// that loses every key: every refusal the limiter with the cache answers,
/// from the cache or from Redis, the script gives too. Each is checked at
/// once with a `peek` of the cacheless limiter (one round trip that
/// changes nothing; a refusal only ever holds longer as others pour); a
/// refusal whose wait ran out during that round trip proves nothing and is
/// not counted.
#[tokio::test]
async fn the_cache_only_refuses_what_the_script_refuses() {
    let Some(mut server) = RedisServer::start("the_cache_only_refuses_what_the_script_refuses")
    else {
        return;
    };
    let free = Quota::new(Rate::per_second(20), 3).and(Rate::per_second(5), 5);
    let paid = Quota::new(Rate::per_second(40), 6);
    // Batches are under the limiter's own quota: one limiter per tier, one
    // cache each, on the same keys.
    let cached = [
        funnel(&server, free, "prop:", 1).await,
        funnel(&server, paid, "prop:", 1).await,
    ];
    let other = funnel(&server, free, "prop:", 0).await;
    let mut rng = Lcg(7);
    let (mut checked, mut from_cache, mut granted, mut restarts) = (0, 0, 0, 0);
    let keys: Vec<String> = (0..4).map(|k| format!("k{k}")).collect();
    for step in 0..3_000 {
        if step % 600 == 300 {
            // Down and up again without its data, between two requests:
            // every key is empty on the new server.
            server.kill();
            server.restart();
            restarts += 1;
        }
        if rng.below(4) == 0 {
            // Let the keys drain a little (a request takes ~0.1 ms).
            tokio::time::sleep(Duration::from_millis(rng.below(4))).await;
        }
        let tier = usize::from(rng.below(4) == 0);
        let quota = [free, paid][tier];
        let l = &cached[tier];
        let mut requests: Vec<(&str, u32)> = Vec::new();
        match rng.below(20) {
            0 => {
                let key = &keys[usize::try_from(rng.below(4)).unwrap()];
                let n = u32::try_from(rng.below(3) + 1).unwrap();
                let _ = other.try_acquire_with(key, &quota, n).await;
                continue;
            }
            1 => {
                let key = &keys[usize::try_from(rng.below(4)).unwrap()];
                let _ = l.peek(key, 1).await.unwrap();
                continue;
            }
            3 | 4 => {
                for _ in 0..=rng.below(4) {
                    let key = &keys[usize::try_from(rng.below(4)).unwrap()];
                    requests.push((key, u32::try_from(rng.below(3) + 1).unwrap()));
                }
            }
            _ => {
                let key = &keys[usize::try_from(rng.below(4)).unwrap()];
                requests.push((key, u32::try_from(rng.below(3) + 1).unwrap()));
            }
        }
        let before = l.stats().cached_refusals;
        let asked = Instant::now();
        let answers = if requests.len() == 1 && rng.below(5) == 0 {
            // `decide` never answers from the cache, but teaches it.
            let d = l.decide(requests[0].0, requests[0].1).await.unwrap();
            vec![d.retry_after.map_or(Ok(()), |retry_after| {
                Err(RedisLimitError::Limited { retry_after })
            })]
        } else if requests.len() == 1 {
            vec![l.try_acquire_many(requests[0].0, requests[0].1).await]
        } else {
            l.try_acquire_many_keys(&requests).await
        };
        from_cache += l.stats().cached_refusals - before;
        for (&(key, n), answer) in requests.iter().zip(&answers) {
            let retry_after = match answer {
                Ok(()) => {
                    granted += 1;
                    continue;
                }
                Err(RedisLimitError::Limited { retry_after }) => *retry_after,
                Err(e) => panic!("{key}: {e:?}"),
            };
            let truth = other.peek_with(key, &quota, n).await.unwrap();
            if asked.elapsed() + Duration::from_millis(1) < retry_after {
                assert!(
                    !truth.is_granted(),
                    "step {step}: refused {n} of {key} under {quota:?} for {retry_after:?}, \
                     the script grants ({truth:?})"
                );
                checked += 1;
            }
        }
    }
    eprintln!(
        "{checked} refusals checked ({from_cache} from the cache), {granted} grants, {restarts} restarts"
    );
    // Grants come to ~300 on an idle machine (the quotas refill on real
    // time between steps), fewer under load: the bound asks for plenty,
    // with room for a busy CI machine.
    assert!(
        checked > 300 && from_cache > 100 && granted > 150 && restarts == 5,
        "{checked} checked, {from_cache} from the cache, {granted} granted, {restarts} restarts"
    );
}

/// The first reproduction: 100 keys, key `i` first filled with
/// `i % 6` of its 5, then asking `1 + 7i mod 5`, one by one and as one
/// batch, with the default cache (1 024 slots) and with one slot (every
/// key collides): every request that fits is granted, every other
/// refused, exactly as without a cache.
#[tokio::test]
async fn one_keys_refusal_never_answers_another_key() {
    let Some(server) = RedisServer::start("one_keys_refusal_never_answers_another_key") else {
        return;
    };
    let quota = Quota::new(Rate::per_minute(1), 5);
    for slots in [1024, 1, 0] {
        for batch in [false, true] {
            let prefix = format!("r{slots}{batch}:");
            let l = funnel(&server, quota, &prefix, slots).await;
            let keys: Vec<String> = (0..100).map(|i| format!("key-{i}")).collect();
            for (i, key) in (0u32..).zip(&keys) {
                l.try_acquire_many(key, i % 6).await.unwrap();
            }
            let requests: Vec<(&str, u32)> = (0u32..)
                .zip(&keys)
                .map(|(i, key)| (key.as_str(), 1 + (7 * i) % 5))
                .collect();
            let answers = if batch {
                l.try_acquire_many_keys(&requests).await
            } else {
                let mut answers = Vec::new();
                for &(key, n) in &requests {
                    answers.push(l.try_acquire_many(key, n).await);
                }
                answers
            };
            for ((i, (key, n)), answer) in (0u32..).zip(&requests).zip(&answers) {
                let fits = i % 6 + n <= 5;
                match answer {
                    Ok(()) => assert!(fits, "{slots} slots, batch {batch}: {key} +{n}"),
                    Err(RedisLimitError::Limited { retry_after }) => {
                        assert!(
                            !fits,
                            "{slots} slots, batch {batch}: {key} holds {} and asks {n}: {answer:?}",
                            i % 6
                        );
                        // The exact excess, in whole minutes (less the
                        // milliseconds since the fill).
                        let excess = u64::from(i % 6 + n - 5);
                        let exact = Duration::from_secs(60 * excess);
                        assert!(
                            *retry_after <= exact && *retry_after + Duration::from_secs(1) > exact
                        );
                    }
                    Err(e) => panic!("{e:?}"),
                }
            }
            // And asked again, now from the cache where it can: the same.
            let again = l.try_acquire_many_keys(&requests).await;
            for ((i, (key, n)), answer) in (0u32..).zip(&requests).zip(&again) {
                let left = 5 - i % 6 - if answers[i as usize].is_ok() { n } else { &0 };
                assert_eq!(
                    answer.is_ok(),
                    *n <= left,
                    "{slots} slots: {key} again: {answer:?}"
                );
            }
        }
    }
}

/// The restart reproduction: a key refused and cached, then the
/// server restarted without its data. The first decision after it is made
/// on a new connection (a new epoch: the cached refusal is not answered),
/// and a grant by Redis — here through `decide`, which the cache does not
/// answer — removes the key's refusal too.
#[tokio::test]
async fn a_restart_or_a_grant_ends_a_cached_refusal() {
    let Some(mut server) = RedisServer::start("a_restart_or_a_grant_ends_a_cached_refusal") else {
        return;
    };
    let quota = Quota::new(Rate::per_second(1), 2);
    let l = funnel(&server, quota, "restart:", 1024).await;
    for key in ["k", "j"] {
        l.try_acquire_many(key, 2).await.unwrap();
        assert!(matches!(
            l.try_acquire(key).await,
            Err(RedisLimitError::Limited { .. })
        ));
    }
    // Cached: answered without Redis.
    assert!(matches!(
        l.try_acquire("k").await,
        Err(RedisLimitError::Limited { .. })
    ));
    assert_eq!(l.stats().cached_refusals, 1);
    server.kill();
    server.restart();
    // `decide` reaches the new server (empty) and is granted; the next
    // request is Redis's too, and the fresh server has one more.
    assert!(l.decide("k", 1).await.unwrap().is_granted());
    l.try_acquire("k").await.unwrap();
    assert!(matches!(
        l.try_acquire("k").await,
        Err(RedisLimitError::Limited { .. })
    ));
    // "j" was cached before the restart, in the old epoch: asked again.
    l.try_acquire("j").await.unwrap();
    assert_eq!(l.stats().cached_refusals, 1);

    // A grant by Redis in the same epoch removes a refusal too: a key
    // deleted by hand (the one thing the epoch cannot see) is refused no
    // longer than until the next grant any request of it gets.
    let mut con = redis::Client::open(server.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    assert!(matches!(
        l.try_acquire_many("j", 2).await,
        Err(RedisLimitError::Limited { .. })
    ));
    let _: () = redis::cmd("DEL")
        .arg("restart:j")
        .query_async(&mut con)
        .await
        .unwrap();
    assert!(matches!(
        l.try_acquire_many("j", 2).await,
        Err(RedisLimitError::Limited { .. })
    ));
    assert_eq!(
        l.stats().cached_refusals,
        2,
        "cached: the deletion is not seen"
    );
    l.try_acquire("j").await.unwrap();
    l.try_acquire("j").await.unwrap();
    assert!(matches!(
        l.try_acquire("j").await,
        Err(RedisLimitError::Limited { .. })
    ));
    assert_eq!(l.stats().cached_refusals, 2);
    // And a peek that shows the refused request would fit removes it.
    // ("k" was refused one permit after the restart; two are refused by
    // Redis, then from the cache: a refusal answers only its own number
    // of permits, whose wait is its own.)
    for _ in 0..2 {
        assert!(matches!(
            l.try_acquire_many("k", 2).await,
            Err(RedisLimitError::Limited { .. })
        ));
    }
    assert_eq!(l.stats().cached_refusals, 3);
    let _: () = redis::cmd("DEL")
        .arg("restart:k")
        .query_async(&mut con)
        .await
        .unwrap();
    assert!(l.peek("k", 2).await.unwrap().is_granted());
    l.try_acquire_many("k", 2).await.unwrap();
    assert_eq!(l.stats().cached_refusals, 3);
}

/// While Redis is down, a refusal the cache holds still refuses (Redis
/// would: its state only moves later), whatever the policy; a limiter that
/// fails open grants every request the cache does not refuse. Once Redis
/// is back (a new connection, a new epoch), Redis decides again.
#[tokio::test]
async fn while_redis_is_down_cached_refusals_stand_and_fail_open_grants_the_rest() {
    let Some(mut server) = RedisServer::start(
        "while_redis_is_down_cached_refusals_stand_and_fail_open_grants_the_rest",
    ) else {
        return;
    };
    let quota = Quota::new(Rate::per_minute(1), 2);
    let open = RedisFunnel::builder(server.url())
        .quota(quota)
        .prefix("down:")
        .failure_policy(FailurePolicy::Open)
        .timeout(Duration::from_millis(500))
        // Slots are chosen by a random hash: with 2^20 of them, three keys
        // share one about once in 350 000 runs.
        .refusal_cache(1 << 20)
        .build()
        .await
        .unwrap();
    let keys: Vec<String> = (0..20).map(|i| format!("k{i}")).collect();
    // Keys 0..3 exhausted and refused once (cached); the others untouched
    // (a grant caches nothing, so they cannot take a slot).
    for key in &keys[..3] {
        open.try_acquire_many(key, 2).await.unwrap();
        assert!(open.try_acquire(key).await.is_err());
    }
    server.kill();
    let before = open.stats();
    for key in &keys {
        let answer = open.try_acquire(key).await;
        let refused = keys[..3].contains(key);
        assert_eq!(
            matches!(answer, Err(RedisLimitError::Limited { .. })),
            refused,
            "{key}: {answer:?}"
        );
        assert_eq!(answer.is_ok(), !refused, "{key}: {answer:?}");
    }
    let batch: Vec<(&str, u32)> = keys.iter().map(|k| (k.as_str(), 1)).collect();
    let answers = open.try_acquire_many_keys(&batch).await;
    for (key, answer) in keys.iter().zip(&answers) {
        assert_eq!(
            answer.is_ok(),
            !keys[..3].contains(key),
            "{key}: {answer:?}"
        );
    }
    let after = open.stats();
    assert_eq!(after.cached_refusals - before.cached_refusals, 6);
    assert_eq!(after.fail_open_grants - before.fail_open_grants, 34);
    // Back, without the data: every key is Redis's to decide, and granted.
    server.restart();
    for key in &keys {
        open.try_acquire(key).await.unwrap();
    }
    assert_eq!(open.stats().cached_refusals, after.cached_refusals);
    assert_eq!(open.stats().fail_open_grants, after.fail_open_grants);
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
