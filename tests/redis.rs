//! `redis::RedisFunnel` against a real `redis-server` (feature `redis`).
//!
//! Each test starts its own server on a free loopback port, in a temporary
//! directory, without persistence, and kills it at the end. Without
//! `redis-server` on the machine the tests print loudly which of them were
//! skipped and pass, unless `REQUIRE_REDIS=1` (set by `.ci/run`), which
//! makes them fail. These tests use real time (Redis's clock cannot be
//! paused); each takes a few seconds at most.

#[path = "support/redis_server.rs"]
mod redis_server;
mod support;
use support::Lcg;

use std::process::{Command, Stdio};
use std::time::{Duration, SystemTime};

use redis_server::{RedisServer, available};
use tokio::time::{Instant, sleep};
use tokio_ratelimit::algorithm::FunnelState;
use tokio_ratelimit::redis::{
    Decision, FailurePolicy, RedisBuildError, RedisFunnel, RedisLimitError,
};
use tokio_ratelimit::{Band, ConfigError, Peek, Quota, Rate, TryAcquireError};

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn micros(t: SystemTime) -> u64 {
    u64::try_from(
        t.duration_since(SystemTime::UNIX_EPOCH)
            .unwrap()
            .as_micros(),
    )
    .unwrap()
}

async fn funnel(
    server: &RedisServer,
    rate: Rate,
    capacity: u32,
    prefix: &str,
    policy: FailurePolicy,
) -> RedisFunnel {
    RedisFunnel::builder(server.url())
        .rate(rate)
        .capacity(capacity)
        .prefix(prefix)
        .failure_policy(policy)
        .timeout(ms(200))
        // Every request to Redis: these tests count what Redis decides.
        .refusal_cache(0)
        .build()
        .await
        .unwrap()
}

async fn admin(server: &RedisServer) -> redis::aio::MultiplexedConnection {
    redis::Client::open(server.url())
        .unwrap()
        // No response timeout: `DEBUG SLEEP` takes a second.
        .get_multiplexed_async_connection_with_config(
            &redis::AsyncConnectionConfig::new().set_response_timeout(None),
        )
        .await
        .unwrap()
}

async fn cmd<T: redis::FromRedisValue>(
    con: &mut redis::aio::MultiplexedConnection,
    args: &[&str],
) -> T {
    let mut c = redis::cmd(args[0]);
    for a in &args[1..] {
        c.arg(*a);
    }
    c.query_async(con).await.unwrap()
}

fn as_try(d: &Decision) -> Result<(), TryAcquireError> {
    match d.retry_after {
        None => Ok(()),
        Some(retry_after) => Err(TryAcquireError::Limited { retry_after }),
    }
}

/// Random requests at random instants, decided by Redis, then replayed
/// through `FunnelState` at the server times the script used: the same
/// answers and the same `retry_after`, to the nanosecond. Each replay must
/// see grants and refusals both; a funnel less than a millisecond deep
/// asked back to back sees no refusal when every round trip takes longer
/// than it takes to drain (a machine busy with other tests), so up to three
/// seeds are tried, each replay checked in full.
async fn replay(
    server: &RedisServer,
    rate: Rate,
    capacity: u32,
    max_n: u32,
    max_sleep_us: u64,
    steps: usize,
    seed: u64,
) {
    let mut attempts = Vec::new();
    for attempt in 0..3 {
        let (granted, refused) = replay_once(
            server,
            rate,
            capacity,
            max_n,
            max_sleep_us,
            steps,
            seed + 100 * attempt,
        )
        .await;
        if granted > 0 && refused > 0 {
            return;
        }
        attempts.push((granted, refused));
    }
    panic!("{rate}: (granted, refused) {attempts:?}: replays that test nothing");
}

/// One [`replay`]: its counts of grants and refusals.
async fn replay_once(
    server: &RedisServer,
    rate: Rate,
    capacity: u32,
    max_n: u32,
    max_sleep_us: u64,
    steps: usize,
    seed: u64,
) -> (u64, u64) {
    let limiter = funnel(
        server,
        rate,
        capacity,
        &format!("replay{seed}:"),
        FailurePolicy::Closed,
    )
    .await;
    let mut rng = Lcg(seed);
    let mut log = Vec::with_capacity(steps);
    for _ in 0..steps {
        let n = u32::try_from(rng.below(u64::from(max_n)) + 1).unwrap();
        log.push((n, limiter.decide("k", n).await.unwrap()));
        let pause = rng.below(max_sleep_us + 1);
        if pause > 0 {
            sleep(Duration::from_micros(pause)).await;
        }
    }
    let origin = log[0].1.server_time;
    let mut meter = FunnelState::new(rate, capacity).unwrap();
    let mut last = origin;
    let (mut granted, mut refused) = (0, 0);
    for (i, (n, d)) in log.iter().enumerate() {
        assert!(d.server_time >= last, "server time went backwards");
        last = d.server_time;
        let now = d.server_time.duration_since(origin).unwrap();
        let expected = meter.try_pour(now, *n);
        assert_eq!(
            as_try(d),
            expected,
            "{rate} cap {capacity}: step {i}, n = {n}, at {now:?}"
        );
        if d.is_granted() {
            granted += 1;
        } else {
            refused += 1;
        }
    }
    let stats = limiter.stats();
    assert_eq!(
        (stats.decisions, stats.granted, stats.limited),
        (steps as u64, granted, refused)
    );
    (granted, refused)
}

#[tokio::test]
async fn same_numbers_as_funnel_state() {
    let Some(server) = RedisServer::start("same_numbers_as_funnel_state") else {
        return;
    };
    // Intervals that are not whole nanoseconds (⅓ of 100 ms, 1/7 s,
    // 1000/7 ns, 10⁹/999 983 ns), weights up to the capacity.
    replay(&server, Rate::per(3, ms(100)), 2, 2, 40_000, 60, 1).await;
    replay(&server, Rate::per_second(7), 3, 3, 150_000, 25, 2).await;
    // Funnels 1 ms and 0.5 ms deep, asked back to back.
    replay(&server, Rate::per_second(7_000_000), 7000, 7000, 0, 300, 3).await;
    replay(&server, Rate::per_second(999_983), 500, 500, 0, 300, 4).await;
}

#[tokio::test]
async fn retry_after_is_exact() {
    let Some(server) = RedisServer::start("retry_after_is_exact") else {
        return;
    };
    let limiter = funnel(&server, Rate::per_second(3), 1, "x:", FailurePolicy::Closed).await;
    let first = limiter.decide("k", 1).await.unwrap();
    assert!(first.is_granted());
    let second = limiter.decide("k", 1).await.unwrap();
    // The permit is due ⅓ s after the first, at 333 333 333⅓ ns: the wait
    // plus the server time between the two decisions is 333 333 334 ns.
    let between = second
        .server_time
        .duration_since(first.server_time)
        .unwrap();
    assert_eq!(
        second.retry_after.unwrap() + between,
        Duration::from_nanos(333_333_334)
    );
    // try_acquire says the same (a little later), and acquire waits it out.
    let wait = limiter.try_acquire("k").await.unwrap_err().retry_after();
    assert!(wait.unwrap() <= second.retry_after.unwrap());
    let start = Instant::now();
    limiter.acquire("k").await.unwrap();
    let waited = start.elapsed();
    assert!(waited >= ms(250) && waited < ms(500), "{waited:?}");
    assert!(matches!(
        limiter.try_acquire("k").await,
        Err(RedisLimitError::Limited { .. })
    ));
}

#[tokio::test]
async fn weights_and_oversized_requests() {
    let Some(server) = RedisServer::start("weights_and_oversized_requests") else {
        return;
    };
    // 10/s, capacity 5: 3 units fill the funnel to 300 ms of water.
    let limiter = funnel(
        &server,
        Rate::per_second(10),
        5,
        "w:",
        FailurePolicy::Closed,
    )
    .await;
    let a = limiter.decide("k", 3).await.unwrap();
    assert!(a.is_granted());
    let b = limiter.decide("k", 3).await.unwrap();
    let between = b.server_time.duration_since(a.server_time).unwrap();
    // 600 ms of water in a 500 ms funnel: 100 ms too much, less what drained.
    assert_eq!(b.retry_after.unwrap() + between, ms(100));
    assert!(limiter.decide("k", 2).await.unwrap().is_granted());
    let before = limiter.stats();
    // n = 0 and n > capacity are decided without Redis.
    assert!(limiter.try_acquire_many("k", 0).await.is_ok());
    assert!(matches!(
        limiter.try_acquire_many("k", 6).await,
        Err(RedisLimitError::InsufficientCapacity)
    ));
    assert!(matches!(
        limiter.acquire_many("k", 6).await,
        Err(RedisLimitError::InsufficientCapacity)
    ));
    assert!(matches!(
        limiter.decide("k", 6).await,
        Err(RedisLimitError::InsufficientCapacity)
    ));
    assert_eq!(limiter.stats(), before);
    // decide(key, 0) asks Redis for its time and changes nothing.
    let probe = limiter.decide("fresh", 0).await.unwrap();
    assert!(probe.is_granted());
    let mut con = admin(&server).await;
    assert_eq!(cmd::<i64>(&mut con, &["EXISTS", "w:fresh"]).await, 0);
}

#[tokio::test]
async fn batch_in_one_round_trip() {
    let Some(server) = RedisServer::start("batch_in_one_round_trip") else {
        return;
    };
    let limiter = funnel(
        &server,
        Rate::per_second(10),
        2,
        "b:",
        FailurePolicy::Closed,
    )
    .await;
    let answers = limiter
        .try_acquire_many_keys(&[
            ("a", 1),
            ("a", 1),
            ("a", 1),
            ("b", 2),
            ("c", 0),
            ("d", 9),
            ("b", 1),
        ])
        .await;
    assert_eq!(answers.len(), 7);
    assert!(answers[0].is_ok() && answers[1].is_ok());
    let wait = answers[2].as_ref().unwrap_err().retry_after().unwrap();
    assert!(wait > Duration::ZERO && wait <= ms(100), "{wait:?}");
    assert!(answers[3].is_ok());
    assert!(answers[4].is_ok());
    assert!(matches!(
        answers[5],
        Err(RedisLimitError::InsufficientCapacity)
    ));
    assert!(matches!(answers[6], Err(RedisLimitError::Limited { .. })));
    let stats = limiter.stats();
    assert_eq!((stats.decisions, stats.granted, stats.limited), (5, 3, 2));
    assert!(limiter.try_acquire_many_keys(&[]).await.is_empty());
}

/// Rate and capacity of the two-process test.
const HAMMER_RATE: u32 = 2000;
const HAMMER_CAPACITY: u32 = 100;

/// One replica process of `two_processes_share_one_limit`: two independent
/// limiters (two connection managers) hammering one key, reporting their
/// grants and the server times of their first and last decisions.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a child process of two_processes_share_one_limit"]
async fn replica_child() {
    let (Ok(url), Ok(run_ms)) = (
        std::env::var("RL_HAMMER_URL"),
        std::env::var("RL_HAMMER_MS"),
    ) else {
        eprintln!("replica_child runs only as a child of two_processes_share_one_limit");
        return;
    };
    let run = ms(run_ms.parse().unwrap());
    let mut replicas = vec![];
    for _ in 0..2 {
        let limiter = RedisFunnel::builder(url.as_str())
            .rate(Rate::per_second(HAMMER_RATE))
            .capacity(HAMMER_CAPACITY)
            .prefix("hammer:")
            .failure_policy(FailurePolicy::Closed)
            .build()
            .await
            .unwrap();
        replicas.push(tokio::spawn(async move {
            let deadline = Instant::now() + run;
            let (mut granted, mut decisions) = (0u64, 0u64);
            let (mut first, mut last) = (u64::MAX, 0);
            let (mut first_grant, mut last_grant) = (u64::MAX, 0);
            while Instant::now() < deadline {
                let d = limiter.decide("one-key", 1).await.unwrap();
                let t = micros(d.server_time);
                decisions += 1;
                (first, last) = (first.min(t), last.max(t));
                if d.is_granted() {
                    granted += 1;
                    (first_grant, last_grant) = (first_grant.min(t), last_grant.max(t));
                }
            }
            format!("REPLICA {granted} {decisions} {first} {last} {first_grant} {last_grant}")
        }));
    }
    for r in replicas {
        println!("{}", r.await.unwrap());
    }
}

#[tokio::test]
async fn two_processes_share_one_limit() {
    let Some(server) = RedisServer::start("two_processes_share_one_limit") else {
        return;
    };
    let exe = std::env::current_exe().unwrap();
    // Both processes start now and run side by side.
    let children: Vec<_> = (0..2)
        .map(|_| {
            Command::new(&exe)
                .args(["replica_child", "--exact", "--ignored", "--nocapture"])
                .args(["--test-threads", "1"])
                .env("RL_HAMMER_URL", server.url())
                .env("RL_HAMMER_MS", "3000")
                .stdout(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let mut rows = vec![];
    for child in children {
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success(), "a replica process failed");
        let stdout = String::from_utf8(out.stdout).unwrap();
        for line in stdout.lines() {
            // libtest may print "test replica_child ... " on the same line.
            if let Some((_, numbers)) = line.split_once("REPLICA ") {
                rows.push(
                    numbers
                        .split(' ')
                        .map(|x| x.parse().unwrap())
                        .collect::<Vec<u64>>(),
                );
            }
        }
    }
    assert_eq!(rows.len(), 4, "two processes × two replicas");
    let granted: u64 = rows.iter().map(|r| r[0]).sum();
    let decisions: u64 = rows.iter().map(|r| r[1]).sum();
    let first = rows.iter().map(|r| r[2]).min().unwrap();
    let last = rows.iter().map(|r| r[3]).max().unwrap();
    let first_grant = rows.iter().map(|r| r[4]).min().unwrap();
    let last_grant = rows.iter().map(|r| r[5]).max().unwrap();
    let interval_us = 1_000_000 / u64::from(HAMMER_RATE);
    // Never over-admits: N grants within [a, b] of the server's clock are
    // at most capacity + (b − a) / interval.
    let bound = u64::from(HAMMER_CAPACITY) + (last_grant - first_grant) / interval_us;
    // Never under-delivers under saturating demand: at least 99 % of
    // rate × T.
    let t = last - first;
    let floor = 99 * u64::from(HAMMER_RATE) * t / 100 / 1_000_000;
    eprintln!(
        "two processes: {granted} granted of {decisions} decisions over {t} µs \
         (server time); bound {bound}, floor {floor}"
    );
    assert!(t >= 2_500_000, "the replicas ran for {t} µs");
    assert!(granted <= bound, "{granted} > {bound}");
    assert!(granted >= floor, "{granted} < {floor}");
    assert!(decisions > granted, "demand did not exceed the limit");
}

#[tokio::test]
async fn killed_server_fail_open_and_fail_closed() {
    let Some(mut server) = RedisServer::start("killed_server_fail_open_and_fail_closed") else {
        return;
    };
    let rate = Rate::per_second(1);
    let open = funnel(&server, rate, 2, "o:", FailurePolicy::Open).await;
    let closed = funnel(&server, rate, 2, "c:", FailurePolicy::Closed).await;
    assert!(open.try_acquire("k").await.is_ok());
    assert!(closed.try_acquire("k").await.is_ok());
    server.kill();
    for _ in 0..3 {
        let start = Instant::now();
        // Fail open: granted, even past the capacity.
        open.try_acquire_many("k", 2).await.unwrap();
        open.acquire("k").await.unwrap();
        // Fail closed: refused with a backend failure, never `Limited`.
        let e = closed.try_acquire("k").await.unwrap_err();
        assert!(e.is_backend_failure(), "{e:?}");
        let e = closed.acquire("k").await.unwrap_err();
        assert!(e.is_backend_failure(), "{e:?}");
        // Four decisions, each within its 200 ms deadline.
        let took = start.elapsed();
        eprintln!("four decisions with Redis down: {took:?}");
        assert!(took < ms(1000), "{took:?}");
    }
    let batch = [("k", 1), ("j", 2), ("big", 3)];
    let answers = open.try_acquire_many_keys(&batch).await;
    assert!(answers[0].is_ok() && answers[1].is_ok());
    assert!(matches!(
        answers[2],
        Err(RedisLimitError::InsufficientCapacity)
    ));
    let answers = closed.try_acquire_many_keys(&batch).await;
    assert!(answers[0].as_ref().unwrap_err().is_backend_failure());
    assert!(answers[1].as_ref().unwrap_err().is_backend_failure());
    assert!(matches!(
        answers[2],
        Err(RedisLimitError::InsufficientCapacity)
    ));
    let (o, c) = (open.stats(), closed.stats());
    assert_eq!((o.granted, o.backend_errors, o.fail_open_grants), (1, 8, 8));
    assert_eq!((c.granted, c.backend_errors, c.fail_open_grants), (1, 8, 0));
    assert_eq!(o.decisions, o.granted + o.limited + o.backend_errors);
    // `decide` applies no policy: the failure is visible whatever it is.
    assert!(open.decide("k", 1).await.unwrap_err().is_backend_failure());
}

#[tokio::test]
async fn server_restart_mid_run() {
    let Some(mut server) = RedisServer::start("server_restart_mid_run") else {
        return;
    };
    let rate = Rate::per_second(1);
    let open = funnel(&server, rate, 2, "o:", FailurePolicy::Open).await;
    let closed = funnel(&server, rate, 2, "c:", FailurePolicy::Closed).await;
    for l in [&open, &closed] {
        l.try_acquire_many("k", 2).await.unwrap();
        assert!(
            l.try_acquire("k")
                .await
                .unwrap_err()
                .retry_after()
                .is_some()
        );
    }
    server.kill();
    assert!(open.try_acquire("k").await.is_ok());
    assert!(
        closed
            .try_acquire("k")
            .await
            .unwrap_err()
            .is_backend_failure()
    );
    server.restart();
    // The connection managers reconnect by themselves, and the new server
    // (no scripts loaded, no state kept) gets the script on NOSCRIPT.
    let back = Instant::now();
    for l in [&closed, &open] {
        loop {
            match l.decide("k", 1).await {
                Ok(d) => {
                    assert!(d.is_granted());
                    break;
                }
                Err(e) if e.is_backend_failure() && back.elapsed() < ms(3000) => {
                    sleep(ms(20)).await;
                }
                Err(e) => panic!("not back {:?} after the restart: {e}", back.elapsed()),
            }
        }
    }
    eprintln!("decisions back {:?} after the restart", back.elapsed());
    for l in [&open, &closed] {
        l.try_acquire("k").await.unwrap();
        assert!(matches!(
            l.try_acquire("k").await,
            Err(RedisLimitError::Limited { .. })
        ));
    }
    assert_eq!(open.stats().fail_open_grants, open.stats().backend_errors);
    assert_eq!(closed.stats().fail_open_grants, 0);
}

#[tokio::test]
async fn script_flush_is_transparent() {
    let Some(server) = RedisServer::start("script_flush_is_transparent") else {
        return;
    };
    let limiter = funnel(&server, Rate::per_second(1), 2, "f:", FailurePolicy::Closed).await;
    let mut con = admin(&server).await;
    let cached = async |con: &mut redis::aio::MultiplexedConnection| {
        let info: String = cmd(con, &["INFO", "memory"]).await;
        info.lines()
            .find_map(|l| l.strip_prefix("number_of_cached_scripts:"))
            .unwrap()
            .trim()
            .parse::<u32>()
            .unwrap()
    };
    // The decision's script and the peek's.
    assert_eq!(cached(&mut con).await, 2, "loaded once each, at build");
    limiter.try_acquire_many("k", 2).await.unwrap();
    let () = cmd(&mut con, &["SCRIPT", "FLUSH"]).await;
    assert_eq!(cached(&mut con).await, 0);
    // The state survived; the script comes back on NOSCRIPT.
    assert!(matches!(
        limiter.try_acquire("k").await,
        Err(RedisLimitError::Limited { .. })
    ));
    assert_eq!(cached(&mut con).await, 1);
    // And the peek's.
    let peek = limiter.peek("k", 1).await.unwrap();
    assert!(!peek.is_granted());
    assert_eq!(cached(&mut con).await, 2);
    // And for a pipelined batch.
    let () = cmd(&mut con, &["SCRIPT", "FLUSH"]).await;
    let answers = limiter.try_acquire_many_keys(&[("k", 1), ("j", 2)]).await;
    assert!(matches!(answers[0], Err(RedisLimitError::Limited { .. })));
    assert!(answers[1].is_ok());
    assert_eq!(cached(&mut con).await, 1);
    assert_eq!(limiter.stats().backend_errors, 0);
}

#[tokio::test]
async fn decision_timeout_on_a_stalled_server() {
    let Some(server) = RedisServer::start("decision_timeout_on_a_stalled_server") else {
        return;
    };
    let build = |prefix: &'static str, policy| {
        RedisFunnel::builder(server.url())
            .rate(Rate::per_second(100))
            .capacity(10)
            .prefix(prefix)
            .failure_policy(policy)
            .timeout(ms(100))
            .clone()
    };
    let open = build("o:", FailurePolicy::Open).build().await.unwrap();
    let closed = build("c:", FailurePolicy::Closed).build().await.unwrap();
    assert!(open.try_acquire("k").await.is_ok());
    assert!(closed.try_acquire("k").await.is_ok());
    // Stall the server for a second from another connection.
    let mut con = admin(&server).await;
    let stall = tokio::spawn(async move {
        let () = cmd(&mut con, &["DEBUG", "SLEEP", "1"]).await;
    });
    sleep(ms(100)).await;
    let start = Instant::now();
    let (o, c) = tokio::join!(open.try_acquire("k"), closed.try_acquire("k"));
    let took = start.elapsed();
    assert!(o.is_ok(), "{o:?}");
    assert!(
        matches!(c, Err(RedisLimitError::Timeout { timeout }) if timeout == ms(100)),
        "{c:?}"
    );
    assert!(took >= ms(100) && took < ms(400), "answered after {took:?}");
    let (os, cs) = (open.stats(), closed.stats());
    assert_eq!((os.timeouts, os.fail_open_grants), (1, 1));
    assert_eq!(
        (cs.timeouts, cs.backend_errors, cs.fail_open_grants),
        (1, 1, 0)
    );
    stall.await.unwrap();
    // Once the server answers again, so do the limiters.
    assert!(closed.decide("k", 1).await.unwrap().is_granted());
}

#[tokio::test]
async fn keys_expire_once_drained() {
    let Some(server) = RedisServer::start("keys_expire_once_drained") else {
        return;
    };
    let mut con = admin(&server).await;
    // 10/s, capacity 2: two units are 200 ms of water.
    let tens = funnel(
        &server,
        Rate::per_second(10),
        2,
        "e:",
        FailurePolicy::Closed,
    )
    .await;
    // 30/s: two units are 66⅔ ms.
    let thirds = funnel(
        &server,
        Rate::per(3, ms(100)),
        2,
        "t:",
        FailurePolicy::Closed,
    )
    .await;
    // 1/s, capacity 2: two units are two seconds.
    let ones = funnel(&server, Rate::per_second(1), 2, "o:", FailurePolicy::Closed).await;
    tens.try_acquire_many("k", 2).await.unwrap();
    thirds.try_acquire_many("k", 2).await.unwrap();
    ones.try_acquire_many("k", 2).await.unwrap();
    // A key lives until it has drained, or until its grants' ids are past
    // the horizon a resend may come within (twice the 200 ms deadline),
    // whichever is later.
    let pttl: i64 = cmd(&mut con, &["PTTL", "o:k"]).await;
    assert!(pttl > 1950 && pttl <= 2001, "PTTL {pttl}");
    for key in ["e:k", "t:k"] {
        let pttl: i64 = cmd(&mut con, &["PTTL", key]).await;
        assert!(pttl > 350 && pttl <= 401, "{key}: PTTL {pttl}");
    }
    // The state: "<µs> <remainder> <units per µs>", exact integers.
    let state: String = cmd(&mut con, &["GET", "t:k"]).await;
    let parts: Vec<u64> = bands_of(&state)
        .into_iter()
        .flat_map(|(a, b, c)| [a, b, c])
        .collect();
    assert_eq!(parts.len(), 3, "{state}");
    assert_eq!(parts[2], 3000); // den 3 → 3000 units per µs
    assert_eq!(parts[1], 2000); // 66 666⅔ µs past a whole microsecond
    sleep(ms(450)).await;
    assert_eq!(cmd::<i64>(&mut con, &["EXISTS", "e:k", "t:k"]).await, 0);
    // An expired key is a full funnel again.
    tens.try_acquire_many("k", 2).await.unwrap();
}

#[tokio::test]
async fn a_key_written_at_another_rate_reads_rounded_up() {
    let Some(server) = RedisServer::start("a_key_written_at_another_rate_reads_rounded_up") else {
        return;
    };
    let thirds = funnel(&server, Rate::per_second(3), 1, "s:", FailurePolicy::Closed).await;
    let sevenths = funnel(&server, Rate::per_second(7), 1, "s:", FailurePolicy::Closed).await;
    let a = thirds.decide("k", 1).await.unwrap();
    let b = sevenths.decide("k", 1).await.unwrap();
    // The funnel is empty ⅓ s (333 333⅓ µs) after `a`; read in sevenths it
    // is empty at the next whole microsecond, 333 334 µs after `a`.
    let between = b.server_time.duration_since(a.server_time).unwrap();
    assert_eq!(
        b.retry_after.unwrap() + between,
        Duration::from_micros(333_334)
    );
}

#[tokio::test]
async fn malformed_state_is_a_backend_failure() {
    let Some(server) = RedisServer::start("malformed_state_is_a_backend_failure") else {
        return;
    };
    let open = funnel(&server, Rate::per_second(1), 1, "m:", FailurePolicy::Open).await;
    let closed = funnel(&server, Rate::per_second(1), 1, "m:", FailurePolicy::Closed).await;
    let mut con = admin(&server).await;
    let () = cmd(&mut con, &["SET", "m:garbage", "not a state"]).await;
    let _: i64 = cmd(&mut con, &["HSET", "m:hash", "f", "v"]).await;
    for key in ["garbage", "hash"] {
        let e = closed.try_acquire(key).await.unwrap_err();
        assert!(matches!(e, RedisLimitError::Backend(_)), "{e:?}");
        assert!(std::error::Error::source(&e).is_some());
        assert!(open.try_acquire(key).await.is_ok());
    }
    assert!(
        e_string(&closed, "garbage")
            .await
            .contains("malformed state")
    );
    assert_eq!(open.stats().fail_open_grants, 2);
}

async fn e_string(l: &RedisFunnel, key: &str) -> String {
    l.try_acquire(key).await.unwrap_err().to_string()
}

#[tokio::test]
async fn build_errors() {
    let rate = Rate::per_second(10);
    let b = |url: &str| RedisFunnel::builder(url).rate(rate).clone();
    let url = "redis://127.0.0.1:1/"; // no connection is made for these
    assert!(matches!(
        RedisFunnel::builder(url).build().await,
        Err(RedisBuildError::Config(ConfigError::MissingRate))
    ));
    assert!(matches!(
        b(url).capacity(0).build().await,
        Err(RedisBuildError::Config(ConfigError::ZeroCapacity))
    ));
    assert!(matches!(
        b(url).timeout(Duration::ZERO).build().await,
        Err(RedisBuildError::Config(ConfigError::InvalidParameter {
            name: "timeout",
            ..
        }))
    ));
    // A bucket that takes 100 years to drain does not fit the script's
    // exact arithmetic: refused, not rounded.
    let yearly = Rate::every(Duration::from_secs(365 * 86_400));
    assert!(matches!(
        RedisFunnel::builder(url)
            .rate(yearly)
            .capacity(100)
            .build()
            .await,
        Err(RedisBuildError::Config(ConfigError::InvalidParameter {
            name: "capacity",
            ..
        }))
    ));
    // An empty metrics name, before any connection.
    assert!(matches!(
        b(url).capacity(1).name("").build().await,
        Err(RedisBuildError::Config(ConfigError::InvalidParameter {
            name: "name",
            ..
        }))
    ));
    assert!(matches!(
        b("not a url").build().await,
        Err(RedisBuildError::Redis(_))
    ));
    // Nothing listens there: an error within the connect timeout.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let start = Instant::now();
    let e = b(&format!("redis://127.0.0.1:{port}/"))
        .connect_timeout(ms(300))
        .build()
        .await
        .unwrap_err();
    assert!(
        matches!(
            e,
            RedisBuildError::Redis(_) | RedisBuildError::Timeout { .. }
        ),
        "{e:?}"
    );
    assert!(start.elapsed() < ms(1000));
}

#[test]
fn handles_and_futures_are_send() {
    fn send<T: Send>(_: &T) {}
    fn send_sync<T: Send + Sync + Clone + Unpin + 'static>() {}
    fn futures(l: &RedisFunnel) {
        send(&l.try_acquire("k"));
        send(&l.acquire_many("k", 2));
        send(&l.try_acquire_many_keys(&[]));
        send(&l.decide("k", 1));
        let q = Quota::new(Rate::per_second(1), 1);
        send(&l.try_acquire_with("k", &q, 1));
        send(&l.acquire_with("k", &q, 1));
        send(&l.decide_with("k", &q, 1));
        send(&l.peek("k", 1));
        send(&l.peek_with("k", &q, 1));
        send(&RedisFunnel::builder("redis://127.0.0.1/").build());
    }
    send_sync::<RedisFunnel>();
    send_sync::<RedisLimitError>();
    let _ = futures;
}

// Fault tests: the connection dropped by the server, a stalled server, a
// server that never answers. Each decision must answer within its deadline,
// by the policy, and the first decision after the server closed an idle
// connection must be decided by Redis (not by the policy).

/// The slack allowed past a decision's deadline (timer ticks, two shared
/// cores under parallel tests).
const SLACK: Duration = Duration::from_millis(150);

/// How long a closed socket takes to reach the client's connection task
/// (loopback: well under a millisecond), with room for a loaded machine.
const CLOSE_PROPAGATION: Duration = Duration::from_millis(50);

/// Slow enough that no key refills during a test (one unit a minute).
fn slow() -> Rate {
    Rate::per_minute(1)
}

/// The counters as one tuple: (decisions, granted, limited, backend errors,
/// timeouts, fail-open grants, retries).
fn counts(l: &RedisFunnel) -> (u64, u64, u64, u64, u64, u64, u64) {
    let s = l.stats();
    (
        s.decisions,
        s.granted,
        s.limited,
        s.backend_errors,
        s.timeouts,
        s.fail_open_grants,
        s.retries,
    )
}

fn is_limited<T: std::fmt::Debug>(r: &Result<T, RedisLimitError>) -> bool {
    matches!(r, Err(RedisLimitError::Limited { .. }))
}

/// Kills every normal client connection but the admin's own; returns how
/// many were killed, once their sockets have had time to close.
async fn client_kill(con: &mut redis::aio::MultiplexedConnection) -> i64 {
    let killed = cmd(con, &["CLIENT", "KILL", "TYPE", "normal"]).await;
    sleep(CLOSE_PROPAGATION).await;
    killed
}

/// Times `f`, asserting it answered within `deadline` plus the slack.
async fn within<T>(deadline: Duration, f: impl Future<Output = T>) -> (T, Duration) {
    let start = Instant::now();
    let out = f.await;
    let took = start.elapsed();
    assert!(took < deadline + SLACK, "answered after {took:?}");
    (out, took)
}

#[tokio::test]
async fn client_kill_next_decision_is_decided_by_redis() {
    let Some(server) = RedisServer::start("client_kill_next_decision_is_decided_by_redis") else {
        return;
    };
    let mut con = admin(&server).await;
    let open = funnel(&server, slow(), 2, "o:", FailurePolicy::Open).await;
    let closed = funnel(&server, slow(), 2, "c:", FailurePolicy::Closed).await;
    for l in [&open, &closed] {
        l.try_acquire_many("k", 2).await.unwrap();
    }
    // An exhausted key: fail-open would grant it, fail-closed would answer
    // `Backend`; only Redis answers `Limited`.
    assert_eq!(client_kill(&mut con).await, 2);
    for l in [&open, &closed] {
        let (r, _) = within(l.timeout(), l.try_acquire("k")).await;
        assert!(is_limited(&r), "{:?}: {r:?}", l.failure_policy());
    }
    assert_eq!(client_kill(&mut con).await, 2);
    for l in [&open, &closed] {
        let (answers, _) =
            within(l.timeout(), l.try_acquire_many_keys(&[("k", 1), ("j", 2)])).await;
        assert!(is_limited(&answers[0]), "{answers:?}");
        assert!(answers[1].is_ok(), "{answers:?}");
    }
    assert_eq!(client_kill(&mut con).await, 2);
    for l in [&open, &closed] {
        let (d, _) = within(l.timeout(), l.decide("j", 1)).await;
        assert!(!d.unwrap().is_granted());
    }
    // The same when the calling task has spent its cooperative budget
    // (tokio's channels then answer `Pending` even when closed).
    assert_eq!(client_kill(&mut con).await, 2);
    for l in [&open, &closed] {
        tokio::task::yield_now().await;
        while tokio::task::coop::has_budget_remaining() {
            tokio::task::consume_budget().await;
        }
        let (r, _) = within(l.timeout(), l.try_acquire("k")).await;
        assert!(is_limited(&r), "{:?}: {r:?}", l.failure_policy());
    }
    // Six decisions, all by Redis; the four that came after a kill saw
    // their connection closed before sending (its socket had ended) and
    // made a new one: nothing needed sending twice.
    for l in [&open, &closed] {
        assert_eq!(counts(l), (6, 2, 4, 0, 0, 0, 0));
    }
}

#[tokio::test]
async fn idle_timeout_next_decision_is_decided_by_redis() {
    let Some(server) = RedisServer::start_with(
        "idle_timeout_next_decision_is_decided_by_redis",
        &["--timeout", "1"],
    ) else {
        return;
    };
    let mut con = admin(&server).await;
    let clients = async |con: &mut redis::aio::MultiplexedConnection| {
        let info: String = cmd(con, &["INFO", "clients"]).await;
        info.lines()
            .find_map(|l| l.strip_prefix("connected_clients:"))
            .unwrap()
            .trim()
            .parse::<u32>()
            .unwrap()
    };
    // One limiter per policy for a single decision, one for a batch, so
    // that one idle period serves all four.
    let mut limiters = Vec::new();
    for (prefix, policy) in [
        ("o:", FailurePolicy::Open),
        ("c:", FailurePolicy::Closed),
        ("o:", FailurePolicy::Open),
        ("c:", FailurePolicy::Closed),
    ] {
        let l = funnel(&server, slow(), 2, prefix, policy).await;
        // The first of each prefix exhausts "k"; its twin finds it so.
        let _ = l.try_acquire_many("k", 2).await;
        limiters.push(l);
    }
    assert_eq!(clients(&mut con).await, 5);
    // The server closes connections idle for more than a second (checked
    // on its cron, a few times a second). The admin connection asks every
    // 100 ms, so it is never idle that long.
    let idle = Instant::now();
    while clients(&mut con).await > 1 {
        assert!(
            idle.elapsed() < ms(3000),
            "the idle connections were not closed"
        );
        sleep(ms(100)).await;
    }
    eprintln!("idle connections closed after {:?}", idle.elapsed());
    sleep(CLOSE_PROPAGATION).await;
    for l in &limiters[..2] {
        let (r, _) = within(l.timeout(), l.try_acquire("k")).await;
        assert!(is_limited(&r), "{:?}: {r:?}", l.failure_policy());
        // Seen closed before sending: connected again, sent once.
        assert_eq!(counts(l), (2, 1, 1, 0, 0, 0, 0));
    }
    for l in &limiters[2..] {
        let (answers, _) =
            within(l.timeout(), l.try_acquire_many_keys(&[("k", 1), ("j", 2)])).await;
        assert!(is_limited(&answers[0]), "{answers:?}");
        assert!(answers[1].is_ok(), "{answers:?}");
        // Its first request found "k" exhausted by its twin.
        assert_eq!(counts(l), (3, 1, 2, 0, 0, 0, 0));
    }
}

#[tokio::test]
async fn restart_first_decision_is_decided_by_redis() {
    let Some(mut server) = RedisServer::start("restart_first_decision_is_decided_by_redis") else {
        return;
    };
    let open = funnel(&server, slow(), 2, "o:", FailurePolicy::Open).await;
    let closed = funnel(&server, slow(), 2, "c:", FailurePolicy::Closed).await;
    for l in [&open, &closed] {
        l.try_acquire_many("k", 2).await.unwrap();
    }
    // Down and up again, no request in between: the new server has no
    // state and no script; the limiters' connections are closed.
    server.kill();
    sleep(CLOSE_PROPAGATION).await;
    server.restart();
    for l in [&open, &closed] {
        // Granted: the state went with the old server. By Redis, as the
        // refusal right after shows (and the counters).
        let (r, _) = within(l.timeout(), l.try_acquire("k")).await;
        r.unwrap();
        assert!(is_limited(&l.try_acquire_many("k", 2).await));
    }
    server.kill();
    sleep(CLOSE_PROPAGATION).await;
    server.restart();
    for l in [&open, &closed] {
        let (answers, _) =
            within(l.timeout(), l.try_acquire_many_keys(&[("k", 1), ("j", 2)])).await;
        assert!(answers.iter().all(Result::is_ok), "{answers:?}");
        assert!(is_limited(&l.try_acquire("j").await));
    }
    for l in [&open, &closed] {
        assert_eq!(counts(l), (6, 4, 2, 0, 0, 0, 0));
    }
}

#[tokio::test]
async fn stalled_server_answers_by_policy_within_the_deadline() {
    let Some(server) = RedisServer::start("stalled_server_answers_by_policy_within_the_deadline")
    else {
        return;
    };
    let mut con = admin(&server).await;
    let timeout = ms(100);
    let build = |prefix: &'static str, policy| {
        RedisFunnel::builder(server.url())
            .rate(Rate::per_second(100))
            .capacity(100)
            .prefix(prefix)
            .failure_policy(policy)
            .timeout(timeout)
            .clone()
    };
    let open = build("o:", FailurePolicy::Open).build().await.unwrap();
    let closed = build("c:", FailurePolicy::Closed).build().await.unwrap();
    let stalled = async || {
        let ((o, c, ob, cb), took) = within(timeout, async {
            tokio::join!(
                open.try_acquire("k"),
                closed.try_acquire("k"),
                open.try_acquire_many_keys(&[("k", 1), ("j", 1)]),
                closed.try_acquire_many_keys(&[("k", 1), ("j", 1)]),
            )
        })
        .await;
        assert!(
            took >= timeout,
            "answered after {took:?}, before the deadline"
        );
        let timed_out = |r: &Result<(), RedisLimitError>| matches!(r, Err(RedisLimitError::Timeout { timeout: t }) if *t == timeout);
        assert!(o.is_ok() && ob.iter().all(Result::is_ok), "{o:?} {ob:?}");
        assert!(timed_out(&c) && cb.iter().all(timed_out), "{c:?} {cb:?}");
    };
    for l in [&open, &closed] {
        l.try_acquire("k").await.unwrap();
    }
    // Stalled with the connections open: each decision waits out its
    // deadline, then the policy answers.
    server.stop();
    stalled().await;
    server.cont();
    for l in [&open, &closed] {
        let (d, _) = within(timeout, l.decide("k", 1)).await;
        assert!(d.unwrap().is_granted());
    }
    // Connections closed, then the server stalled: the decision that finds
    // its connection closed reconnects (the kernel accepts for the stopped
    // server), and both attempts share the one deadline.
    assert_eq!(client_kill(&mut con).await, 2);
    server.stop();
    stalled().await;
    server.cont();
    for l in [&open, &closed] {
        let (d, _) = within(timeout, l.decide("k", 1)).await;
        assert!(d.unwrap().is_granted());
    }
    // Per limiter: the warm-up and two recoveries by Redis; two stalls of
    // three decisions each. The first request of the second stall saw its
    // connection closed and connected again before sending.
    assert_eq!(counts(&open), (9, 3, 0, 6, 6, 6, 0));
    assert_eq!(counts(&closed), (9, 3, 0, 6, 6, 0, 0));
}

/// Accepts connections on a free loopback port and holds them, never
/// reading or writing: a server that never answers.
fn silent_listener(listener: tokio::net::TcpListener) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = listener.accept().await {
            held.push(socket);
        }
    })
}

#[tokio::test]
async fn a_server_that_never_answers() {
    // `build()` loads the script, so it fails within the connect timeout.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let silent = silent_listener(listener);
    let connect_timeout = ms(300);
    let (e, took) = within(
        connect_timeout,
        RedisFunnel::builder(format!("redis://127.0.0.1:{port}/"))
            .rate(slow())
            .connect_timeout(connect_timeout)
            .build(),
    )
    .await;
    assert!(took >= connect_timeout, "gave up after {took:?}");
    assert!(
        matches!(e, Err(RedisBuildError::Timeout { timeout }) if timeout == connect_timeout),
        "{e:?}"
    );
    silent.abort();

    // A limiter built against a server that is replaced by a silent one:
    // each decision answers within its deadline, by the policy.
    let Some(mut server) = RedisServer::start("a_server_that_never_answers") else {
        return;
    };
    let timeout = ms(100);
    let build = |policy| {
        RedisFunnel::builder(server.url())
            .rate(slow())
            .capacity(2)
            .failure_policy(policy)
            .timeout(timeout)
            .connect_timeout(ms(1000))
            .clone()
    };
    let open = build(FailurePolicy::Open).build().await.unwrap();
    let closed = build(FailurePolicy::Closed).build().await.unwrap();
    let port = server.port();
    server.kill();
    let silent = silent_listener(
        tokio::net::TcpListener::bind(("127.0.0.1", port))
            .await
            .unwrap(),
    );
    sleep(CLOSE_PROPAGATION).await;
    for _ in 0..3 {
        let (r, _) = within(timeout, open.try_acquire_many("k", 2)).await;
        r.unwrap();
        let (r, _) = within(timeout, closed.try_acquire_many("k", 2)).await;
        assert!(
            matches!(r, Err(RedisLimitError::Timeout { timeout: t }) if t == timeout),
            "{r:?}"
        );
    }
    let (answers, _) = within(timeout, closed.try_acquire_many_keys(&[("k", 1), ("j", 1)])).await;
    assert!(
        answers
            .iter()
            .all(|a| a.as_ref().is_err_and(RedisLimitError::is_backend_failure)),
        "{answers:?}"
    );
    silent.abort();
    // Each limiter's first decision saw the connection closed (its socket
    // had ended) and connected again (to the silent listener) within its
    // deadline, before sending anything: no resend.
    let (o, c) = (open.stats(), closed.stats());
    assert_eq!(
        (
            o.decisions,
            o.backend_errors,
            o.timeouts,
            o.fail_open_grants
        ),
        (3, 3, 3, 3)
    );
    assert_eq!(
        (
            c.decisions,
            c.backend_errors,
            c.timeouts,
            c.fail_open_grants
        ),
        (5, 5, 5, 0)
    );
    assert_eq!((o.retries, c.retries), (0, 0));
}

/// A loopback proxy to `upstream` that loses replies: while `lose` is
/// above zero, the next client chunk that carries an `EVALSHA` takes one
/// from it, is passed on to Redis, and then that connection is closed
/// without passing back anything Redis answered (it stopped passing
/// replies before it passed the chunk). Every other byte, and every other
/// connection, goes through unchanged. (Armed by the test after the build,
/// whose clock check is an `EVALSHA` too.)
fn reply_losing_proxy(
    listener: tokio::net::TcpListener,
    upstream: u16,
    to_lose: std::sync::Arc<std::sync::atomic::AtomicU32>,
) -> tokio::task::JoinHandle<()> {
    use std::sync::atomic::Ordering;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let server = tokio::net::TcpStream::connect(("127.0.0.1", upstream))
                .await
                .unwrap();
            let to_lose = to_lose.clone();
            tokio::spawn(async move {
                let (mut cr, mut cw) = client.into_split();
                let (mut sr, mut sw) = server.into_split();
                let mut back = tokio::spawn(async move {
                    let _ = tokio::io::copy(&mut sr, &mut cw).await;
                });
                let mut buf = vec![0u8; 64 * 1024];
                while let Ok(n @ 1..) = cr.read(&mut buf).await {
                    let chunk = &buf[..n];
                    let evalsha = chunk.windows(7).any(|w| w == b"EVALSHA");
                    let lost = evalsha
                        && to_lose
                            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |l| l.checked_sub(1))
                            .is_ok();
                    if lost {
                        // No reply goes back from here on; Redis runs it.
                        back.abort();
                        let _ = (&mut back).await;
                    }
                    if sw.write_all(chunk).await.is_err() {
                        break;
                    }
                    if lost {
                        sleep(ms(20)).await;
                        return;
                    }
                }
                let _ = back.await;
            });
        }
    })
}

/// The second reproduction, from the other side: a connection lost
/// after Redis ran the script and before its reply came back. The decision
/// is sent again on a new connection, and Redis answers the resend from
/// the first attempt's grant (its request id is kept beside the key's
/// state): the caller gets the grant, and the key holds one pour, not two.
/// For a single call, a batch (whose pipeline is resent whole), a
/// `decide`, a refused first attempt (decided again: a refusal wrote
/// nothing), two losses in a row (the second resend answered from the
/// grant), and three (every attempt lost: the decision fails by the
/// policy, having poured once).
#[tokio::test]
async fn a_reply_lost_after_the_script_ran_is_answered_from_its_grant() {
    let Some(server) =
        RedisServer::start("a_reply_lost_after_the_script_ran_is_answered_from_its_grant")
    else {
        return;
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let to_lose = std::sync::Arc::new(std::sync::atomic::AtomicU32::new(0));
    let proxy = reply_losing_proxy(listener, server.port(), to_lose.clone());
    let through_proxy = RedisFunnel::builder(format!("redis://127.0.0.1:{port}/"))
        .rate(slow())
        .capacity(3)
        .prefix("p:")
        .failure_policy(FailurePolicy::Closed)
        .timeout(ms(500))
        .refusal_cache(0)
        .build()
        .await
        .unwrap();
    let direct = funnel(&server, slow(), 3, "p:", FailurePolicy::Closed).await;
    let lose = |n| to_lose.store(n, std::sync::atomic::Ordering::SeqCst);
    let again = |l: &RedisFunnel| l.stats().resends_granted_before;

    // One call: granted, its reply lost, resent, answered from the grant.
    lose(1);
    let (r, _) = within(ms(500), through_proxy.try_acquire_many("k", 2)).await;
    r.unwrap();
    assert_eq!(counts(&through_proxy), (1, 1, 0, 0, 0, 0, 1));
    assert_eq!(again(&through_proxy), 1);
    assert_eq!(available(&direct, "k").await, 1, "poured once");

    // A batch: the pipeline's replies lost, the pipeline resent whole;
    // every request answered from its own grant ("a" twice, in order).
    lose(1);
    let (answers, _) = within(
        ms(500),
        through_proxy.try_acquire_many_keys(&[("a", 1), ("b", 3), ("a", 2)]),
    )
    .await;
    assert!(answers.iter().all(Result::is_ok), "{answers:?}");
    assert_eq!(again(&through_proxy), 4);
    assert_eq!(available(&direct, "a").await, 0, "poured once each");
    assert_eq!(available(&direct, "b").await, 0, "poured once");

    // `decide`: the same.
    lose(1);
    let (d, _) = within(ms(500), through_proxy.decide("c", 1)).await;
    assert!(d.unwrap().is_granted());
    assert_eq!(again(&through_proxy), 5);
    assert_eq!(available(&direct, "c").await, 2);

    // A refused first attempt wrote nothing: the resend is decided again
    // (refused again), not answered from anything.
    lose(1);
    let (r, _) = within(ms(500), through_proxy.try_acquire_many("k", 2)).await;
    assert!(is_limited(&r), "{r:?}");
    assert_eq!(again(&through_proxy), 5);
    assert_eq!(available(&direct, "k").await, 1);

    // The first resend's reply lost too: the second resend is answered
    // from the grant.
    lose(2);
    let (r, _) = within(ms(500), through_proxy.try_acquire("d")).await;
    r.unwrap();
    assert_eq!(again(&through_proxy), 6);
    assert_eq!(available(&direct, "d").await, 2, "poured once");

    // Every attempt's reply lost (the first and both resends): the
    // decision fails by the policy, and Redis poured once (each resend
    // found the first attempt's id).
    lose(3);
    let (r, _) = within(ms(500), through_proxy.try_acquire("e")).await;
    assert!(matches!(r, Err(RedisLimitError::Backend(_))), "{r:?}");
    assert_eq!(available(&direct, "e").await, 2, "poured once");
    // Resent: once each for the first four decisions, twice each for the
    // last two.
    assert_eq!(through_proxy.stats().retries, 4 + 2 + 2);
    proxy.abort();
}

#[test]
fn threads_hammering_one_key_get_the_rate() {
    const RATE: u32 = 1000;
    const CAPACITY: u32 = 100;
    let Some(server) = RedisServer::start("threads_hammering_one_key_get_the_rate") else {
        return;
    };
    let url = server.url();
    // Three OS threads, each with its own runtime and its own limiter (as
    // three replicas would), ask for one unit as fast as Redis answers.
    let threads: Vec<_> = (0..3)
        .map(|_| {
            let url = url.clone();
            std::thread::spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap();
                rt.block_on(async move {
                    let limiter = RedisFunnel::builder(url)
                        .rate(Rate::per_second(RATE))
                        .capacity(CAPACITY)
                        .prefix("threads:")
                        .failure_policy(FailurePolicy::Closed)
                        .build()
                        .await
                        .unwrap();
                    let deadline = Instant::now() + ms(1000);
                    let mut times = Vec::new();
                    let mut granted = 0u64;
                    while Instant::now() < deadline {
                        let d = limiter.decide("one-key", 1).await.unwrap();
                        times.push(micros(d.server_time));
                        granted += u64::from(d.is_granted());
                    }
                    assert_eq!(limiter.stats().backend_errors, 0);
                    (granted, times)
                })
            })
        })
        .collect();
    let (mut granted, mut times) = (0, Vec::new());
    for t in threads {
        let (g, ts) = t.join().unwrap();
        granted += g;
        times.extend(ts);
    }
    let (first, last) = (*times.iter().min().unwrap(), *times.iter().max().unwrap());
    let t = last - first;
    // Over [first, last] of the server's clock, a full funnel grants its
    // capacity plus one unit per interval: never more, and under this
    // demand (capacity 100 = 100 ms of stall absorbed) at least 99 % of it.
    let bound = u64::from(CAPACITY) + u64::from(RATE) * t / 1_000_000;
    let floor = bound * 99 / 100;
    eprintln!(
        "three threads: {granted} granted of {} decisions over {t} µs (server time); \
         bound {bound}, floor {floor}",
        times.len()
    );
    assert!(t >= 900_000, "the threads ran for {t} µs");
    assert!(granted <= bound, "{granted} > {bound}");
    assert!(granted >= floor, "{granted} < {floor}");
    assert!(
        times.len() as u64 > granted,
        "demand did not exceed the limit"
    );
}

// Quotas (issue 13): several bands in one key, a quota per call, peek.

/// A limiter of `quota` under `prefix`, failing closed.
async fn quota_funnel(server: &RedisServer, quota: Quota, prefix: &str) -> RedisFunnel {
    RedisFunnel::builder(server.url())
        .quota(quota)
        .prefix(prefix)
        .failure_policy(FailurePolicy::Closed)
        .timeout(ms(500))
        .refusal_cache(0)
        .build()
        .await
        .unwrap()
}

/// The local reference for a quota: one `FunnelState` per band, poured all
/// or none (clone every band, pour each, commit only if every band
/// granted; the wait is the latest band's), as `algorithm::Bands` does.
#[derive(Clone)]
struct Reference {
    quota: Quota,
    bands: Vec<FunnelState>,
}

impl Reference {
    fn new(quota: Quota) -> Reference {
        let bands = quota
            .bands()
            .iter()
            .map(|b| FunnelState::new(b.rate(), b.capacity()).unwrap())
            .collect();
        Reference { quota, bands }
    }

    /// The answer at `now`, and which bands refused.
    fn try_pour(&mut self, now: Duration, n: u32) -> (Result<(), TryAcquireError>, Vec<bool>) {
        let mut poured = self.bands.clone();
        let mut wait = None;
        let mut refused = vec![];
        for band in &mut poured {
            match band.try_pour(now, n) {
                Ok(()) => refused.push(false),
                Err(e) => {
                    wait = wait.max(e.retry_after());
                    refused.push(true);
                }
            }
        }
        match wait {
            None => {
                self.bands = poured;
                (Ok(()), refused)
            }
            Some(retry_after) => (Err(TryAcquireError::Limited { retry_after }), refused),
        }
    }

    /// What a peek at `now` must say: the answer and every band's state.
    fn peek(&self, now: Duration, n: u32) -> (Result<(), TryAcquireError>, Vec<BandTuple>) {
        let answer = if n == 0 {
            Ok(())
        } else {
            self.clone().try_pour(now, n).0
        };
        let states = self
            .bands
            .iter()
            .zip(self.quota.bands())
            .map(|(b, band)| (*band, b.free(now), b.empty_at().saturating_sub(now)))
            .collect();
        (answer, states)
    }
}

/// A band's state as a tuple (`BandState` is non-exhaustive):
/// `(band, available, full_in)`.
type BandTuple = (Band, u32, Duration);

fn tuples(peek: &Peek) -> Vec<BandTuple> {
    peek.bands()
        .map(|s| (s.band, s.available, s.full_in))
        .collect()
}

/// Where a replay's quota comes from: the limiter's own, or each call's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Via {
    Own,
    Call,
}

/// What a replay saw on one key.
#[derive(Debug, Clone, Default)]
struct Replayed {
    granted: u32,
    refused: u32,
    /// Refusals each band took part in.
    refused_by: Vec<u32>,
    /// Peeks checked at a server time recovered from a band not full.
    peeks_timed: u32,
}

async fn peek_via(l: &RedisFunnel, via: Via, key: &str, quota: &Quota, n: u32) -> Peek {
    match via {
        Via::Own => l.peek(key, n).await.unwrap(),
        Via::Call => l.peek_with(key, quota, n).await.unwrap(),
    }
}

async fn decide_via(l: &RedisFunnel, via: Via, key: &str, quota: &Quota, n: u32) -> Decision {
    match via {
        Via::Own => l.decide(key, n).await.unwrap(),
        Via::Call => l.decide_with(key, quota, n).await.unwrap(),
    }
}

/// Random requests at random instants on several keys ("lanes", each with
/// its quota), each request preceded by a peek, decided by Redis and
/// checked against each key's [`Reference`] at the server times: the same
/// answers and `retry_after`, to the nanosecond. Each peek is checked at
/// the server time it was made, recovered from a band that is not full
/// (its `full_in` is its instant less the peek's time), or, when every
/// band is full, against the reference's full state.
async fn replay_lanes(
    limiter: &RedisFunnel,
    lanes: &[(&str, Quota)],
    via: Via,
    max_n: u32,
    mut pause_us: impl FnMut(&mut Lcg) -> u64,
    steps: usize,
    seed: u64,
) -> Vec<Replayed> {
    // n = 0 asks Redis for its time and changes nothing: the origin.
    let origin = limiter.decide("origin", 0).await.unwrap().server_time;
    let mut refs: Vec<Reference> = lanes.iter().map(|&(_, q)| Reference::new(q)).collect();
    let mut replayed: Vec<Replayed> = lanes
        .iter()
        .map(|(_, q)| Replayed {
            refused_by: vec![0; q.bands().len()],
            ..Replayed::default()
        })
        .collect();
    let mut rng = Lcg(seed);
    let mut last = Duration::ZERO;
    for step in 0..steps {
        let at_lane = usize::try_from(rng.below(lanes.len() as u64)).unwrap();
        let (key, quota) = lanes[at_lane];
        let n = u32::try_from(rng.below(u64::from(max_n.min(quota.capacity()))) + 1).unwrap();
        let peek = peek_via(limiter, via, key, &quota, n).await;
        let d = decide_via(limiter, via, key, &quota, n).await;
        let now = d.server_time.duration_since(origin).unwrap();
        assert!(now >= last, "server time went backwards");
        let (r, lane) = (&mut refs[at_lane], &mut replayed[at_lane]);
        let ctx = format!("{key} {quota:?}: step {step}, n = {n}, decided at {now:?}");
        let timed = r
            .bands
            .iter()
            .zip(peek.bands())
            .find(|(_, s)| !s.full_in.is_zero())
            .map(|(b, s)| b.empty_at().checked_sub(s.full_in).unwrap());
        if let Some(at) = timed {
            assert!(last <= at && at <= now, "{ctx}: peek at {at:?}");
            assert_eq!(
                r.peek(at, n),
                (peek.answer(), tuples(&peek)),
                "{ctx}: peek at {at:?}"
            );
            lane.peeks_timed += 1;
        } else {
            let full = r.bands.iter().map(FunnelState::empty_at).max().unwrap();
            assert_eq!(r.peek(full, n), (peek.answer(), tuples(&peek)), "{ctx}");
            assert!(peek.is_granted(), "{ctx}");
        }
        last = now;
        let (expected, refused) = r.try_pour(now, n);
        assert_eq!(as_try(&d), expected, "{ctx}");
        if d.is_granted() {
            lane.granted += 1;
        } else {
            lane.refused += 1;
        }
        for (count, refused) in lane.refused_by.iter_mut().zip(refused) {
            *count += u32::from(refused);
        }
        let pause = pause_us(&mut rng);
        if pause > 0 {
            sleep(Duration::from_micros(pause)).await;
        }
    }
    replayed
}

/// Pauses of up to `short` µs, and one in `one_in` up to `long` µs.
fn pauses(short: u64, one_in: u64, long: u64) -> impl FnMut(&mut Lcg) -> u64 {
    move |rng| {
        if rng.below(one_in) == 0 {
            rng.below(long + 1)
        } else {
            rng.below(short + 1)
        }
    }
}

/// Half the steps back to back (a sleep lasts at least a 1 ms timer tick,
/// too long for the fast bands), a quarter up to 3 ms, a quarter up to
/// `long` µs.
fn bursty(long: u64) -> impl FnMut(&mut Lcg) -> u64 {
    move |rng| match rng.below(4) {
        0 | 1 => 0,
        2 => rng.below(3_001),
        _ => rng.below(long + 1),
    }
}

fn assert_every_band_refused(seen: &Replayed, what: &str) {
    assert!(
        seen.granted > 0 && seen.refused > 0 && seen.refused_by.iter().all(|&c| c > 0),
        "{what}: a replay that tests too little: {seen:?}"
    );
}

#[tokio::test]
async fn bands_same_numbers_as_funnel_states() {
    let Some(server) = RedisServer::start("bands_same_numbers_as_funnel_states") else {
        return;
    };
    // Two bands: thirds of 100 ms (30/s, 2 deep) and sevenths of a second
    // (7/s, 5 deep), neither a whole number of nanoseconds.
    let two = Quota::new(Rate::per(3, ms(100)), 2).and(Rate::per_second(7), 5);
    let l = quota_funnel(&server, two, "b2:").await;
    let seen = replay_lanes(
        &l,
        &[("k", two)],
        Via::Own,
        2,
        pauses(40_000, 6, 300_000),
        90,
        1,
    )
    .await;
    assert_every_band_refused(&seen[0], "two bands");
    assert!(seen[0].peeks_timed > 40, "{seen:?}");
    // Three bands: 7 per 10 ms (20 ms deep), 300/s and 150/s.
    let three = Quota::new(Rate::per(7, ms(10)), 14)
        .and(Rate::per(3, ms(10)), 30)
        .and(Rate::per_second(150), 60);
    let l = quota_funnel(&server, three, "b3:").await;
    let seen = replay_lanes(&l, &[("k", three)], Via::Own, 7, bursty(30_000), 150, 2).await;
    assert_every_band_refused(&seen[0], "three bands");
    let stats = l.stats();
    assert_eq!(
        (stats.decisions, stats.granted, stats.limited),
        (
            151,
            u64::from(seen[0].granted) + 1,
            u64::from(seen[0].refused)
        )
    );
}

/// A small seeded quota of one to four bands: rates from 2 per minute to
/// 20 000 per second, capacities 1 to 40, in random order.
fn random_quota(rng: &mut Lcg) -> Quota {
    let band = |rng: &mut Lcg| {
        let rate = match rng.below(4) {
            0 => Rate::per_minute(u32::try_from(rng.below(30) + 2).unwrap()),
            1 => Rate::per_second(u32::try_from(rng.below(50) + 1).unwrap()),
            2 => Rate::per(
                u32::try_from(rng.below(20) + 1).unwrap(),
                ms(rng.below(7) + 1),
            ),
            _ => Rate::per(u32::try_from(rng.below(999) + 2).unwrap(), ms(100)),
        };
        (rate, u32::try_from(rng.below(40) + 1).unwrap())
    };
    let (rate, capacity) = band(rng);
    let mut quota = Quota::new(rate, capacity);
    for _ in 0..rng.below(4) {
        let (rate, capacity) = band(rng);
        quota = quota.and(rate, capacity);
    }
    quota
}

#[tokio::test]
async fn random_quotas_same_numbers_as_funnel_states() {
    let Some(server) = RedisServer::start("random_quotas_same_numbers_as_funnel_states") else {
        return;
    };
    let mut rng = Lcg(13);
    let (mut granted, mut refused, mut bands) = (0, 0, 0);
    for round in 0..6 {
        let quotas = [random_quota(&mut rng), random_quota(&mut rng)];
        bands += quotas.iter().map(|q| q.bands().len()).sum::<usize>();
        // The limiter's own quota is neither: every call passes its own.
        let l = funnel(
            &server,
            Rate::per_second(1),
            1,
            &format!("rq{round}:"),
            FailurePolicy::Closed,
        )
        .await;
        let lanes = [("a", quotas[0]), ("b", quotas[1])];
        let seen = replay_lanes(
            &l,
            &lanes,
            Via::Call,
            8,
            pauses(3_000, 10, 60_000),
            50,
            round,
        )
        .await;
        for s in &seen {
            granted += s.granted;
            refused += s.refused;
        }
    }
    eprintln!("random quotas: {bands} bands, {granted} granted, {refused} refused");
    assert!(granted > 50 && refused > 50 && bands > 18);
}

/// Calls of each command since the last `CONFIG RESETSTAT` (commands a
/// script runs are counted too), without the admin's own.
async fn commandstats(con: &mut redis::aio::MultiplexedConnection) -> Vec<(String, u64)> {
    let info: String = cmd(con, &["INFO", "commandstats"]).await;
    let mut calls: Vec<(String, u64)> = info
        .lines()
        .filter_map(|l| l.strip_prefix("cmdstat_"))
        .filter_map(|l| {
            let (name, fields) = l.split_once(':')?;
            let calls = fields.split(',').find_map(|f| f.strip_prefix("calls="))?;
            Some((name.to_owned(), calls.parse().ok()?))
        })
        .filter(|(name, _)| !name.starts_with("config") && name != "info")
        .collect();
    calls.sort();
    calls
}

fn stat(calls: &[(&str, u64)]) -> Vec<(String, u64)> {
    let mut v: Vec<(String, u64)> = calls
        .iter()
        .filter(|&&(_, n)| n > 0)
        .map(|&(c, n)| (c.to_owned(), n))
        .collect();
    v.sort();
    v
}

#[tokio::test]
async fn one_round_trip_per_decision_whatever_the_bands() {
    let Some(server) = RedisServer::start("one_round_trip_per_decision_whatever_the_bands") else {
        return;
    };
    let mut con = admin(&server).await;
    let s = Rate::per_second;
    let quotas = [
        Quota::new(s(10), 3),
        Quota::new(s(10), 3).and(Rate::per_minute(20), 20),
        Quota::new(s(10), 3)
            .and(Rate::per_minute(20), 20)
            .and(Rate::per_hour(100), 100)
            .and(Rate::per_day(1000), 1000),
    ];
    for (i, quota) in quotas.iter().enumerate() {
        let l = quota_funnel(&server, *quota, &format!("rt{i}:")).await;
        let _: () = cmd(&mut con, &["CONFIG", "RESETSTAT"]).await;
        // Three granted, two refused, each one EVALSHA of one GET, and
        // for a grant one SET and one PEXPIREAT; nothing else.
        for _ in 0..5 {
            let _ = l.try_acquire("k").await;
        }
        assert_eq!(
            (l.stats().granted, l.stats().limited),
            (3, 2),
            "{} bands",
            quota.bands().len()
        );
        assert_eq!(
            commandstats(&mut con).await,
            stat(&[
                ("evalsha", 5),
                ("time", 5),
                ("get", 5),
                ("set", 3),
                ("pexpireat", 3)
            ]),
            "{} bands",
            quota.bands().len()
        );
        // A peek is one EVALSHA too, of a TIME and a GET only; a call's
        // own quota the same.
        let _: () = cmd(&mut con, &["CONFIG", "RESETSTAT"]).await;
        l.peek("k", 1).await.unwrap();
        l.peek_with("k", &quotas[0], 1).await.unwrap();
        let _ = l.try_acquire_with("j", &quotas[2], 1).await;
        assert_eq!(
            commandstats(&mut con).await,
            stat(&[
                ("evalsha", 3),
                ("time", 3),
                ("get", 3),
                ("set", 1),
                ("pexpireat", 1)
            ])
        );
        // The state holds three numbers per band, then when the grants'
        // ids are kept until, the last eviction (none), and the three
        // grants' ids (16 hex digits each) with their server times (14).
        let state: String = cmd(&mut con, &["GET", &format!("rt{i}:k")]).await;
        assert_eq!(bands_of(&state).len(), quota.bands().len(), "{state}");
        let ids: Vec<&str> = state.split_once(" | ").unwrap().1.split(' ').collect();
        assert_eq!(ids.len(), 2 + 2 * 3, "{state}");
        assert_eq!(ids[1], "0", "{state}");
        for grant in ids[2..].chunks(2) {
            assert_eq!((grant[0].len(), grant[1].len()), (16, 14), "{state}");
        }
    }
}

/// Each band's instant in a state: (whole µs, remainder, units per µs).
/// The grants' ids that follow the bands (`" | <keep> <evicted> <id>..."`)
/// are not bands.
fn bands_of(state: &str) -> Vec<(u64, u64, u64)> {
    let bands = state.split_once(" | ").map_or(state, |(bands, _)| bands);
    let n: Vec<u64> = bands.split(' ').map(|p| p.parse().unwrap()).collect();
    assert_eq!(n.len() % 3, 0, "{state}");
    n.chunks(3).map(|c| (c[0], c[1], c[2])).collect()
}

/// The instant (µs) until which a state keeps its grants' ids, if it has
/// any.
fn ids_kept_until(state: &str) -> Option<u64> {
    let (_, ids) = state.split_once(" | ")?;
    ids.split(' ').next()?.parse().ok()
}

/// The expiry the script sets for a state: the next whole millisecond
/// after its latest band's whole microseconds, or after the instant its
/// grants' ids are kept until, if later.
fn expiry_ms(state: &str) -> i64 {
    let latest = bands_of(state).iter().map(|b| b.0).max().unwrap();
    let latest = latest.max(ids_kept_until(state).unwrap_or(0));
    i64::try_from(latest / 1000 + 1).unwrap()
}

#[tokio::test]
async fn ttl_is_when_every_band_has_drained() {
    let Some(server) = RedisServer::start("ttl_is_when_every_band_has_drained") else {
        return;
    };
    let mut con = admin(&server).await;
    // The second band drains last (5 s against 500 ms); then the first
    // (20 s against 20 ms).
    for (prefix, quota, n, drained) in [
        (
            "t1:",
            Quota::new(Rate::per_second(10), 10).and(Rate::per_minute(60), 60),
            5,
            ms(5000),
        ),
        (
            "t2:",
            Quota::new(Rate::per_minute(6), 2).and(Rate::per_second(100), 100),
            2,
            ms(20_000),
        ),
    ] {
        let l = quota_funnel(&server, quota, prefix).await;
        let d = l.decide("k", n).await.unwrap();
        assert!(d.is_granted());
        let key = format!("{prefix}k");
        let state: String = cmd(&mut con, &["GET", &key]).await;
        let at: i64 = cmd(&mut con, &["PEXPIRETIME", &key]).await;
        assert_eq!(at, expiry_ms(&state), "{state}");
        // That is the latest band's end, from the server time of the
        // decision: whole microseconds (these rates), to the next ms.
        let end = micros(d.server_time + drained);
        assert_eq!(at, i64::try_from(end / 1000 + 1).unwrap(), "{state}");
        let ends: Vec<u64> = bands_of(&state).iter().map(|b| b.0).collect();
        assert_eq!(ends.iter().max(), Some(&end));
    }
}

#[tokio::test]
async fn two_tiers_in_one_prefix() {
    let Some(server) = RedisServer::start("two_tiers_in_one_prefix") else {
        return;
    };
    let free = Quota::new(Rate::per_second(10), 3).and(Rate::per_second(2), 6);
    let paid = Quota::new(Rate::per_second(100), 6).and(Rate::per_second(20), 30);
    // The limiter's own quota is the free one: `decide` and `decide_with`
    // under it are one.
    let l = quota_funnel(&server, free, "tier:").await;
    let lanes = [
        ("free:1", free),
        ("paid:1", paid),
        ("free:2", free),
        ("paid:2", paid),
    ];
    let seen = replay_lanes(&l, &lanes, Via::Call, 5, bursty(60_000), 320, 7).await;
    for ((key, _), s) in lanes.iter().zip(&seen) {
        assert_every_band_refused(s, key);
    }
    // The paid keys got more.
    assert!(seen[1].granted > seen[0].granted * 2, "{seen:?}");
    // And the keys are in the one prefix, three numbers per band each.
    let mut con = admin(&server).await;
    for (key, quota) in lanes {
        let state: String = cmd(&mut con, &["GET", &format!("tier:{key}")]).await;
        assert_eq!(bands_of(&state).len(), quota.bands().len());
    }
}

/// The exact server time, in ns since the epoch, of a peek whose band
/// `band` of the state is not full: that band's instant (rounded up to a
/// ns, as `full_in` is) less its `full_in`.
fn peek_time_ns(state: &str, band: usize, peek: &Peek) -> u128 {
    let (us, rem, unit) = bands_of(state)[band];
    let den = u128::from(unit / 1000);
    let instant = u128::from(us) * 1000 + u128::from(rem).div_ceil(den);
    let full_in = peek.bands().nth(band).unwrap().full_in;
    assert!(!full_in.is_zero());
    instant - full_in.as_nanos()
}

fn ns(t: SystemTime) -> u128 {
    t.duration_since(SystemTime::UNIX_EPOCH).unwrap().as_nanos()
}

#[tokio::test]
async fn a_tier_change_keeps_each_bands_time_until_full() {
    let Some(server) = RedisServer::start("a_tier_change_keeps_each_bands_time_until_full") else {
        return;
    };
    let mut con = admin(&server).await;
    let l = funnel(
        &server,
        Rate::per_second(1),
        1,
        "tc:",
        FailurePolicy::Closed,
    )
    .await;

    // Same window (1 s), same units: the fraction in use carries over.
    let free = Quota::new(Rate::per_second(10), 10);
    let paid = Quota::new(Rate::per_second(100), 100);
    let a = l.decide_with("same", &free, 10).await.unwrap();
    assert!(a.is_granted());
    // The free band is empty until a + 1 s; under paid, 50 permits (500
    // ms of its water) fit once 500 ms of that second has passed.
    let b = l.decide_with("same", &paid, 50).await.unwrap();
    let between = b.server_time.duration_since(a.server_time).unwrap();
    assert_eq!(b.retry_after.unwrap() + between, ms(500));
    // A peek under paid: as many permits as 10 ms have passed since `a`.
    let state: String = cmd(&mut con, &["GET", "tc:same"]).await;
    let peek = l.peek_with("same", &paid, 1).await.unwrap();
    let at = peek_time_ns(&state, 0, &peek);
    let since = at - ns(a.server_time);
    let [paid_band] = tuples(&peek)[..] else {
        panic!()
    };
    assert_eq!(paid_band.1, u32::try_from(since / 10_000_000).unwrap());
    assert_eq!(
        paid_band.2,
        Duration::from_nanos(u64::try_from(1_000_000_000 - since).unwrap())
    );

    // Other units: thirds of a second read in sevenths, the instant
    // rounded up to a whole microsecond.
    let thirds = Quota::new(Rate::per_second(3), 3);
    let sevenths = Quota::new(Rate::per_second(7), 7);
    let a = l.decide_with("units", &thirds, 1).await.unwrap();
    let b = l.decide_with("units", &sevenths, 7).await.unwrap();
    let between = b.server_time.duration_since(a.server_time).unwrap();
    // Empty at a + 333 333⅓ µs, read as a + 333 334 µs; 7 sevenths are a
    // full second: they fit once it is empty.
    assert_eq!(
        b.retry_after.unwrap() + between,
        Duration::from_micros(333_334)
    );

    // Fewer bands: the stored ones beyond the new quota are kept as they
    // are, and still count in the expiry.
    let daily = Quota::new(Rate::per_second(10), 10).and(Rate::per_day(100), 100);
    let one = Quota::new(Rate::per_second(100), 100);
    let a = l.decide_with("fewer", &daily, 10).await.unwrap();
    assert!(a.is_granted());
    let before: String = cmd(&mut con, &["GET", "tc:fewer"]).await;
    let day_band = bands_of(&before)[1];
    assert_eq!(day_band.0, micros(a.server_time) + 8_640_000_000); // 10 × 864 s
    sleep(ms(20)).await;
    let b = l.decide_with("fewer", &one, 1).await.unwrap();
    assert!(b.is_granted());
    let after: String = cmd(&mut con, &["GET", "tc:fewer"]).await;
    assert_eq!(bands_of(&after).len(), 2);
    assert_eq!(bands_of(&after)[1], day_band, "{before} → {after}");
    let at: i64 = cmd(&mut con, &["PEXPIRETIME", "tc:fewer"]).await;
    assert_eq!(at, i64::try_from(day_band.0 / 1000 + 1).unwrap());
    // Back to the daily quota: the day band is as it was left, less what
    // drained: 90 of 100.
    let peek = l.peek_with("fewer", &daily, 1).await.unwrap();
    let t = tuples(&peek);
    assert_eq!(t[1].1, 90, "{t:?}");
    let at = peek_time_ns(&after, 1, &peek);
    assert_eq!(t[1].2.as_nanos(), u128::from(day_band.0) * 1000 - at);

    // More bands: the missing ones read as empty (full of permits).
    let peek = l
        .peek_with("same", &paid.and(Rate::per_minute(30), 30), 1)
        .await
        .unwrap();
    let t = tuples(&peek);
    assert_eq!((t[1].1, t[1].2), (30, Duration::ZERO));
}

#[tokio::test]
async fn peek_changes_nothing_and_agrees_with_the_next_decision() {
    let Some(server) = RedisServer::start("peek_changes_nothing_and_agrees_with_the_next_decision")
    else {
        return;
    };
    let mut con = admin(&server).await;
    let quota = Quota::new(Rate::per_second(3), 3).and(Rate::per_minute(10), 10);
    let l = quota_funnel(&server, quota, "p:").await;
    // An absent key: all full, and still absent.
    let peek = l.peek("k", 3).await.unwrap();
    assert!(peek.is_granted());
    assert_eq!(
        tuples(&peek),
        vec![
            (quota.bands()[0], 3, Duration::ZERO),
            (quota.bands()[1], 10, Duration::ZERO)
        ]
    );
    assert_eq!(cmd::<i64>(&mut con, &["EXISTS", "p:k"]).await, 0);
    l.try_acquire_many("k", 3).await.unwrap();
    let state: String = cmd(&mut con, &["GET", "p:k"]).await;
    let expiry: i64 = cmd(&mut con, &["PEXPIRETIME", "p:k"]).await;
    let counted = l.stats();
    for n in [0, 1, 3, 4] {
        let peek = l.peek("k", n).await.unwrap();
        assert_eq!(cmd::<String>(&mut con, &["GET", "p:k"]).await, state);
        assert_eq!(cmd::<i64>(&mut con, &["PEXPIRETIME", "p:k"]).await, expiry);
        match n {
            0 => assert!(peek.is_granted()),
            4 => assert_eq!(peek.answer(), Err(TryAcquireError::InsufficientCapacity)),
            _ => assert!(peek.retry_after().is_some()),
        }
    }
    // Not counted as decisions.
    assert_eq!(l.stats(), counted);
    // The next decision answers what the peek said, less the server time
    // between them, to the nanosecond.
    let peek = l.peek("k", 1).await.unwrap();
    let d = l.decide("k", 1).await.unwrap();
    let at = peek_time_ns(&state, 0, &peek);
    let between = ns(d.server_time) - at;
    assert_eq!(
        peek.retry_after().unwrap().as_nanos(),
        d.retry_after.unwrap().as_nanos() + between
    );
    // ⅓ s per permit after the third, from the decision that took them.
    let p = peek.retry_after().unwrap().as_nanos() + at;
    let first = bands_of(&state)[0];
    assert_eq!(p, u128::from(first.0) * 1000 - 666_666_666, "{state}");
    // Granted in the peek, granted in the decision.
    sleep(ms(400)).await;
    assert!(l.peek("k", 1).await.unwrap().is_granted());
    assert!(l.decide("k", 1).await.unwrap().is_granted());
}

/// The one-band script from before quotas (`tests/support/gcra_one_band.lua`).
const ONE_BAND_SCRIPT: &str = include_str!("support/gcra_one_band.lua");

#[tokio::test]
async fn an_old_one_band_state_reads_under_two_bands() {
    let Some(server) = RedisServer::start("an_old_one_band_state_reads_under_two_bands") else {
        return;
    };
    let mut con = admin(&server).await;
    // The old script pours one permit at 3/s, capacity 3: unit 3000, a
    // permit 333 333 µs + 1000 units, τ 1 000 000 µs.
    let old: (i64, i64, i64, i64) = redis::Script::new(ONE_BAND_SCRIPT)
        .key("old:k")
        .arg(3000)
        .arg(333_333)
        .arg(1000)
        .arg(1_000_000)
        .arg(0)
        .invoke_async(&mut con)
        .await
        .unwrap();
    assert_eq!(old.0, 1);
    let t0 = u64::try_from(old.1).unwrap();
    let state: String = cmd(&mut con, &["GET", "old:k"]).await;
    assert_eq!(state, format!("{} 1000 3000", t0 + 333_333));
    // Read by a two-band quota whose first band is the same: the second
    // reads as empty. Three do not fit the first band until ⅓ s after t0;
    // refused, nothing written.
    let quota = Quota::new(Rate::per_second(3), 3).and(Rate::per_minute(10), 10);
    let l = quota_funnel(&server, quota, "old:").await;
    let d = l.decide("k", 3).await.unwrap();
    let since = ns(d.server_time) - u128::from(t0) * 1000;
    assert_eq!(d.retry_after.unwrap().as_nanos() + since, 333_333_334);
    assert_eq!(cmd::<String>(&mut con, &["GET", "old:k"]).await, state);
    // Two fit: both bands written, the old instant carried on.
    let d = l.decide("k", 2).await.unwrap();
    assert!(d.is_granted());
    let after = bands_of(&cmd::<String>(&mut con, &["GET", "old:k"]).await);
    assert_eq!(after[0], (t0 + 1_000_000, 0, 3000)); // ⅓ s + ⅔ s
    assert_eq!(after[1], (micros(d.server_time) + 12_000_000, 0, 1000)); // 2 × 6 s
    // What a one-band limiter writes now carries its grants' ids after the
    // band, which the old script does not know: it reads such a state as
    // malformed (a refusal, never a wrong grant), so versions before the
    // ids and after must not share a prefix (CHANGELOG).
    let l1 = funnel(
        &server,
        Rate::per_second(3),
        3,
        "new:",
        FailurePolicy::Closed,
    )
    .await;
    l1.try_acquire_many("k", 3).await.unwrap();
    let old: redis::RedisResult<(i64, i64, i64, i64)> = redis::Script::new(ONE_BAND_SCRIPT)
        .key("new:k")
        .arg(3000)
        .arg(333_333)
        .arg(1000)
        .arg(1_000_000)
        .arg(0)
        .invoke_async(&mut con)
        .await;
    let e = old.unwrap_err();
    assert!(e.to_string().contains("malformed state"), "{e}");
}

/// A wait that must end at once: one that would loop (a request the
/// limiter wrongly sent to Redis, refused forever) fails the test instead.
async fn at_once<T>(f: impl Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(1), f)
        .await
        .expect("should have answered at once")
}

#[tokio::test]
async fn quota_bad_input() {
    let Some(server) = RedisServer::start("quota_bad_input") else {
        return;
    };
    let mut con = admin(&server).await;
    let url = server.url();
    let per_s = Rate::per_second;
    let with = |q: Quota| RedisFunnel::builder(url.as_str()).quota(q).clone();
    let config = |r: Result<RedisFunnel, RedisBuildError>| match r {
        Err(RedisBuildError::Config(e)) => e,
        other => panic!("{other:?}"),
    };
    // A quota and a rate or capacity; too many bands; a zero capacity in
    // any band; a band too deep for the script's exact arithmetic.
    let two = Quota::new(per_s(10), 10).and(Rate::per_day(1000), 1000);
    assert!(matches!(
        config(with(two).rate(per_s(1)).build().await),
        ConfigError::InvalidParameter { name: "quota", .. }
    ));
    assert!(matches!(
        config(with(two).capacity(3).build().await),
        ConfigError::InvalidParameter { name: "quota", .. }
    ));
    let five = two.and(per_s(1), 1).and(per_s(2), 2).and(per_s(3), 3);
    assert!(matches!(
        config(with(five).build().await),
        ConfigError::InvalidParameter { name: "quota", .. }
    ));
    assert_eq!(
        config(with(two.and(per_s(5), 0)).build().await),
        ConfigError::ZeroCapacity
    );
    let yearly = Rate::every(Duration::from_secs(365 * 86_400));
    let deep = two.and(yearly, 100);
    assert!(matches!(
        config(with(deep).build().await),
        ConfigError::InvalidParameter {
            name: "capacity",
            ..
        }
    ));
    // The same quotas passed with a call: `InvalidQuota`, without asking
    // Redis, and never granted by the open policy.
    let l = RedisFunnel::builder(url.as_str())
        .quota(two)
        .prefix("bad:")
        .failure_policy(FailurePolicy::Open)
        .build()
        .await
        .unwrap();
    let _: () = cmd(&mut con, &["CONFIG", "RESETSTAT"]).await;
    for (q, expected) in [
        (five, None),
        (two.and(per_s(5), 0), Some(ConfigError::ZeroCapacity)),
        (deep, None),
    ] {
        let e = l.try_acquire_with("k", &q, 1).await.unwrap_err();
        let RedisLimitError::InvalidQuota(config) = e else {
            panic!("{e:?}")
        };
        if let Some(expected) = expected {
            assert_eq!(config, expected);
        }
        assert!(!e.is_backend_failure());
        assert!(e.to_string().starts_with("invalid quota: "), "{e}");
        assert!(std::error::Error::source(&e).is_some());
        assert!(matches!(
            at_once(l.acquire_with("k", &q, 1)).await,
            Err(RedisLimitError::InvalidQuota(_))
        ));
        assert!(matches!(
            l.decide_with("k", &q, 1).await,
            Err(RedisLimitError::InvalidQuota(_))
        ));
        assert!(matches!(
            l.peek_with("k", &q, 1).await,
            Err(RedisLimitError::InvalidQuota(_))
        ));
    }
    // n above the smallest capacity: at once, whatever the larger bands.
    let wide = Quota::new(per_s(10), 5).and(Rate::per_day(1000), 1000);
    for r in [
        l.try_acquire_with("k", &wide, 6).await,
        at_once(l.acquire_with("k", &wide, 6)).await,
        l.decide_with("k", &wide, 6).await.map(|_| ()),
        l.try_acquire_many("k", 11).await,
        l.decide("k", 11).await.map(|_| ()),
    ] {
        assert!(
            matches!(r, Err(RedisLimitError::InsufficientCapacity)),
            "{r:?}"
        );
    }
    assert_eq!(
        commandstats(&mut con).await,
        vec![],
        "nothing asked of Redis"
    );
    assert_eq!(l.stats(), tokio_ratelimit::redis::RedisStats::default());
    // A peek of more than the capacity still reads the bands.
    let peek = l.peek_with("k", &wide, 6).await.unwrap();
    assert_eq!(peek.answer(), Err(TryAcquireError::InsufficientCapacity));
    assert_eq!(peek.bands().count(), 2);
}

#[tokio::test]
async fn a_day_long_band_next_to_a_nanosecond_band() {
    let Some(server) = RedisServer::start("a_day_long_band_next_to_a_nanosecond_band") else {
        return;
    };
    let mut con = admin(&server).await;
    // The finest scale there is (a prime count per 7 s, 1.6 ns per permit)
    // next to a day-long band: exact, each in its own units.
    let finest = Rate::per(4_294_967_291, Duration::from_secs(7));
    let mixed = Quota::new(finest, 7).and(Rate::every(Duration::from_secs(86_400)), 2);
    let l = quota_funnel(&server, mixed, "mixed:").await;
    let seen = replay_lanes(&l, &[("k", mixed)], Via::Own, 2, |_| 0, 12, 5).await;
    assert!(seen[0].granted >= 1 && seen[0].refused > 0, "{seen:?}");
    let first = l.decide("j", 2).await.unwrap();
    let next = l.decide("j", 1).await.unwrap();
    let between = next.server_time.duration_since(first.server_time).unwrap();
    assert_eq!(
        next.retry_after.unwrap() + between,
        Duration::from_secs(86_400)
    );
    let state: String = cmd(&mut con, &["GET", "mixed:j"]).await;
    let stored = bands_of(&state);
    assert_eq!(stored[0].2, 4_294_967_291_000, "{state}");
    assert_eq!(
        stored[1],
        (micros(first.server_time) + 2 * 86_400_000_000, 0, 1000)
    );
}

#[tokio::test]
async fn killed_server_peek_and_bands_by_policy() {
    let Some(mut server) = RedisServer::start("killed_server_peek_and_bands_by_policy") else {
        return;
    };
    let quota = Quota::new(Rate::per_second(1), 2).and(Rate::per_minute(3), 3);
    let mut builder = RedisFunnel::builder(server.url());
    builder.quota(quota).prefix("kq:").timeout(ms(200));
    let open = builder
        .failure_policy(FailurePolicy::Open)
        .build()
        .await
        .unwrap();
    let closed = builder
        .failure_policy(FailurePolicy::Closed)
        .build()
        .await
        .unwrap();
    assert!(open.try_acquire("k").await.is_ok());
    assert!(open.peek("k", 1).await.unwrap().is_granted());
    server.kill();
    let start = Instant::now();
    for l in [&open, &closed] {
        // A look cannot be granted: an error whatever the policy.
        let e = l.peek("k", 1).await.unwrap_err();
        assert!(e.is_backend_failure(), "{e:?}");
        let e = l
            .peek_with("k", &Quota::new(Rate::per_second(5), 5), 1)
            .await
            .unwrap_err();
        assert!(e.is_backend_failure(), "{e:?}");
        // A call's invalid quota is still the caller's error.
        let bad = Quota::new(Rate::per_second(5), 0);
        assert!(matches!(
            l.try_acquire_with("k", &bad, 1).await,
            Err(RedisLimitError::InvalidQuota(_))
        ));
    }
    // Two-band decisions: granted by the open policy (even past the
    // capacity of every band), refused by the closed one.
    for _ in 0..3 {
        open.try_acquire_many("k", 2).await.unwrap();
        open.try_acquire_with("k", &quota, 2).await.unwrap();
        let e = closed.try_acquire_many("k", 2).await.unwrap_err();
        assert!(e.is_backend_failure(), "{e:?}");
        let e = closed.acquire_with("k", &quota, 1).await.unwrap_err();
        assert!(e.is_backend_failure(), "{e:?}");
    }
    assert!(start.elapsed() < ms(3000), "{:?}", start.elapsed());
    let (o, c) = (open.stats(), closed.stats());
    // Peeks are not decisions: only the 6 failed decisions each count.
    assert_eq!((o.granted, o.backend_errors, o.fail_open_grants), (1, 6, 6));
    assert_eq!((c.granted, c.backend_errors, c.fail_open_grants), (0, 6, 0));
    // Back up: a fresh server, empty keys.
    server.restart();
    assert!(closed.decide("k", 2).await.unwrap().is_granted());
    let peek = closed.peek("k", 1).await.unwrap();
    assert_eq!(tuples(&peek)[1].1, 1);
}

/// A limiter whose connection was made on a runtime that has shut down
/// (its driver task gone with it) sees that connection closed without a
/// round trip: used from another runtime, it connects again before
/// sending anything (no resend), and a refusal cached over the old
/// connection is not answered — Redis decides.
#[test]
fn a_connection_whose_runtime_ended_is_seen_closed() {
    let Some(server) = RedisServer::start("a_connection_whose_runtime_ended_is_seen_closed") else {
        return;
    };
    let runtime = || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    };
    let l = runtime().block_on(async {
        let l = RedisFunnel::builder(server.url())
            .rate(slow())
            .capacity(1)
            .prefix("rt:")
            .failure_policy(FailurePolicy::Closed)
            .build()
            .await
            .unwrap();
        l.try_acquire("k").await.unwrap();
        assert!(is_limited(&l.try_acquire("k").await));
        l
    });
    runtime().block_on(async {
        assert!(is_limited(&l.try_acquire("k").await));
        let s = l.stats();
        assert_eq!(
            (s.decisions, s.cached_refusals, s.retries),
            (3, 0, 0),
            "{s:?}"
        );
    });
}

/// A deadline of `Duration::MAX` (never give up): decisions, batches and
/// peeks work, and the grants' ids are kept a day (the horizon's cap), not
/// past the instants the script can write exactly.
#[tokio::test]
async fn an_endless_deadline_keeps_ids_a_day() {
    let Some(server) = RedisServer::start("an_endless_deadline_keeps_ids_a_day") else {
        return;
    };
    let mut con = admin(&server).await;
    let l = RedisFunnel::builder(server.url())
        .rate(Rate::per_second(10))
        .capacity(2)
        .prefix("endless:")
        .failure_policy(FailurePolicy::Closed)
        .timeout(Duration::MAX)
        .build()
        .await
        .unwrap();
    let d = l.decide("k", 1).await.unwrap();
    assert!(d.is_granted());
    let answers = l.try_acquire_many_keys(&[("k", 1), ("j", 1)]).await;
    assert!(answers.iter().all(Result::is_ok), "{answers:?}");
    assert!(is_limited(&l.try_acquire("k").await));
    assert_eq!(available(&l, "k").await, 0);
    let state: String = cmd(&mut con, &["GET", "endless:k"]).await;
    let kept = ids_kept_until(&state).unwrap();
    // Kept from the batch's grant (a little after `d`): a day, no more.
    let day = 86_400_000_000;
    assert!(
        kept >= micros(d.server_time) + day && kept < micros(d.server_time) + day + 1_000_000,
        "{state}"
    );
    let at: i64 = cmd(&mut con, &["PEXPIRETIME", "endless:k"]).await;
    assert_eq!(at, expiry_ms(&state));
}

/// A named limiter mirrors its `RedisStats` into the `metrics` facade, one
/// series per counter, and records each round trip's latency: after two
/// grants, a refusal, a batch of two keys, and a decision the killed
/// server cannot make (granted by the open failure policy), the series
/// read what `stats()` reads.
#[tokio::test]
async fn a_named_limiter_records_its_counters_and_latency() {
    #![expect(
        clippy::float_cmp,
        reason = "counts, and a sum of 500 ms, rendered exactly"
    )]
    let Some(mut server) = RedisServer::start("a_named_limiter_records_its_counters") else {
        return;
    };
    let recorder: &'static metrics_exporter_prometheus::PrometheusRecorder = Box::leak(Box::new(
        metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder(),
    ));
    let _recorder = metrics::set_default_local_recorder(recorder);
    let limiter = RedisFunnel::builder(server.url())
        .rate(Rate::per_second(1))
        .capacity(2)
        .prefix("metrics:")
        .failure_policy(FailurePolicy::Open)
        .timeout(ms(200))
        .refusal_cache(0)
        .name("shared")
        .build()
        .await
        .unwrap();
    limiter.try_acquire("k").await.unwrap();
    limiter.try_acquire("k").await.unwrap();
    limiter.try_acquire("k").await.unwrap_err();
    limiter
        .try_acquire_many_keys(&[("a", 1), ("b", 1)])
        .await
        .into_iter()
        .for_each(|answer| answer.unwrap());
    server.kill();
    limiter.try_acquire("k").await.unwrap();
    let stats = limiter.stats();
    assert_eq!(
        (
            stats.decisions,
            stats.granted,
            stats.limited,
            stats.fail_open_grants
        ),
        (6, 4, 1, 1)
    );
    let text = recorder.handle().render();
    let value = |series: &str| -> f64 {
        text.lines()
            .find_map(|line| line.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
            .unwrap_or_else(|| panic!("no {series} in\n{text}"))
    };
    let counter = |name: &str| {
        value(&format!(
            "tokio_ratelimit_redis_total{{limiter=\"shared\",counter=\"{name}\"}}"
        ))
    };
    let expected = [
        ("decisions", stats.decisions),
        ("granted", stats.granted),
        ("limited", stats.limited),
        ("backend_errors", stats.backend_errors),
        ("timeouts", stats.timeouts),
        ("fail_open_grants", stats.fail_open_grants),
        ("retries", stats.retries),
        ("resends_granted_before", stats.resends_granted_before),
        ("cached_refusals", stats.cached_refusals),
    ];
    for (name, count) in expected {
        #[expect(clippy::cast_precision_loss, reason = "small counts")]
        let count = count as f64;
        assert_eq!(counter(name), count, "{name}");
    }
    // One round trip per call, the batch's included; the last one failed.
    assert_eq!(
        value("tokio_ratelimit_redis_decision_seconds_count{limiter=\"shared\"}"),
        5.0
    );
}

/// `set_quota` while four tasks on two worker threads ask for one key as
/// fast as Redis answers: the calls made before the change are granted
/// within the old quota's bound, those made after within the new one's
/// (capacity + rate × time since the change: the change gives no fresh
/// burst), whether the quota shrinks or grows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn set_quota_while_serving_keeps_each_side_within_its_quota() {
    #![expect(clippy::cast_precision_loss, reason = "counts of a few hundred")]
    let Some(server) = RedisServer::start("set_quota_while_serving") else {
        return;
    };
    let changes = [
        (
            Quota::new(Rate::per_second(200), 20),
            Quota::new(Rate::per_second(50), 5),
        ),
        (
            Quota::new(Rate::per_second(50), 5),
            Quota::new(Rate::per_second(200), 40),
        ),
    ];
    for (i, (old, new)) in changes.into_iter().enumerate() {
        let limiter = RedisFunnel::builder(server.url())
            .quota(old)
            .prefix(format!("live{i}:"))
            .failure_policy(FailurePolicy::Closed)
            .timeout(ms(1000))
            .refusal_cache(0)
            .build()
            .await
            .unwrap();
        let start = Instant::now();
        let stop = start + ms(600);
        let tasks: Vec<_> = (0..4)
            .map(|_| {
                let limiter = limiter.clone();
                tokio::spawn(async move {
                    let mut calls = Vec::new();
                    while Instant::now() < stop {
                        let sent = Instant::now();
                        let granted = match limiter.try_acquire("k").await {
                            Ok(()) => true,
                            Err(RedisLimitError::Limited { .. }) => false,
                            Err(e) => panic!("{e}"),
                        };
                        calls.push((sent, Instant::now(), granted));
                    }
                    calls
                })
            })
            .collect();
        sleep(ms(300)).await;
        let before = Instant::now();
        limiter.set_quota(new).unwrap();
        let after = Instant::now();
        assert_eq!(limiter.quota(), new);
        let mut calls = Vec::new();
        for task in tasks {
            calls.extend(task.await.unwrap());
        }
        let end = calls.iter().map(|c| c.1).max().unwrap();
        let granted = |pick: &dyn Fn(Instant) -> bool| {
            calls.iter().filter(|c| c.2 && pick(c.0)).count() as f64
        };
        let refused =
            |pick: &dyn Fn(Instant) -> bool| calls.iter().filter(|c| !c.2 && pick(c.0)).count();
        // Calls sent while the quota was being replaced read either.
        let either = granted(&|t| t >= before && t < after);
        let bound = |q: Quota, span: Duration| {
            let band = q.bands()[0];
            f64::from(band.capacity()) + band.rate().permits_per_second() * span.as_secs_f64()
        };
        let old_side = granted(&|t| t < before);
        let old_end = calls
            .iter()
            .filter(|c| c.0 < before)
            .map(|c| c.1)
            .max()
            .unwrap();
        assert!(
            old_side <= bound(old, old_end - start) + either,
            "{i}: {old_side} granted under {old:?} in {:?}",
            old_end - start
        );
        let new_side = granted(&|t| t >= after);
        assert!(
            new_side <= bound(new, end - after) + either,
            "{i}: {new_side} granted under {new:?} in {:?} after the change",
            end - after
        );
        // Both sides were pressed past their limit (the check is not empty).
        assert!(
            refused(&|t| t < before) > 0 && refused(&|t| t >= after) > 0,
            "{i}"
        );
        assert!(old_side > 0.0 && new_side > 0.0, "{i}");
    }
}

/// `set_quota` refuses a quota a builder would and keeps the one in use;
/// and the refusal cache, which remembers a refusal under the quota it was
/// made under, does not answer for the new one: after a refusal under 1/s
/// with a burst of 1, the quota grows to a burst of 2 and the next request
/// is asked of Redis, which grants it (the key's instant carries over:
/// 1 s of water in a 2 s deep band).
#[tokio::test]
async fn set_quota_is_checked_and_the_refusal_cache_keeps_to_its_quota() {
    let Some(server) = RedisServer::start("set_quota_and_the_refusal_cache") else {
        return;
    };
    let one = Quota::new(Rate::per_second(1), 1);
    let two = Quota::new(Rate::per_second(1), 2);
    let limiter = RedisFunnel::builder(server.url())
        .quota(one)
        .prefix("live_cache:")
        .failure_policy(FailurePolicy::Closed)
        .timeout(ms(1000))
        .build()
        .await
        .unwrap();
    assert!(matches!(
        limiter.set_quota(Quota::new(Rate::per_second(0), 1)),
        Err(ConfigError::InvalidRate { .. })
    ));
    assert_eq!(limiter.quota(), one);
    limiter.try_acquire("k").await.unwrap();
    // Refused by Redis, then by the cache without asking.
    for _ in 0..2 {
        assert!(matches!(
            limiter.try_acquire("k").await,
            Err(RedisLimitError::Limited { .. })
        ));
    }
    let s = limiter.stats();
    assert_eq!((s.decisions, s.limited, s.cached_refusals), (2, 1, 1));
    limiter.set_quota(two).unwrap();
    limiter.try_acquire("k").await.unwrap();
    let s = limiter.stats();
    assert_eq!((s.decisions, s.granted, s.cached_refusals), (3, 2, 1));
    // And the new quota holds: the band is full now.
    assert!(matches!(
        limiter.try_acquire("k").await,
        Err(RedisLimitError::Limited { .. })
    ));
}
