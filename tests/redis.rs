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

use std::process::{Command, Stdio};
use std::time::{Duration, SystemTime};

use redis_server::RedisServer;
use tokio::time::{Instant, sleep};
use tokio_ratelimit::algorithm::FunnelState;
use tokio_ratelimit::redis::{
    Decision, FailurePolicy, RedisBuildError, RedisFunnel, RedisLimitError,
};
use tokio_ratelimit::{ConfigError, Rate, TryAcquireError};

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

/// A small deterministic generator.
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

fn as_try(d: &Decision) -> Result<(), TryAcquireError> {
    match d.retry_after {
        None => Ok(()),
        Some(retry_after) => Err(TryAcquireError::Limited { retry_after }),
    }
}

/// Random requests at random instants, decided by Redis, then replayed
/// through `FunnelState` at the server times the script used: the same
/// answers and the same `retry_after`, to the nanosecond.
async fn replay(
    server: &RedisServer,
    rate: Rate,
    capacity: u32,
    max_n: u32,
    max_sleep_us: u64,
    steps: usize,
    seed: u64,
) {
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
    assert!(
        granted > 0 && refused > 0,
        "{rate}: {granted} granted, {refused} refused: a replay that tests nothing"
    );
    let stats = limiter.stats();
    assert_eq!(
        (stats.decisions, stats.granted, stats.limited),
        (steps as u64, granted, refused)
    );
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
    tens.try_acquire_many("k", 2).await.unwrap();
    thirds.try_acquire_many("k", 2).await.unwrap();
    let pttl: i64 = cmd(&mut con, &["PTTL", "e:k"]).await;
    assert!(pttl > 150 && pttl <= 201, "PTTL {pttl}");
    let pttl: i64 = cmd(&mut con, &["PTTL", "t:k"]).await;
    assert!(pttl > 20 && pttl <= 68, "PTTL {pttl}");
    // The state: "<µs> <remainder> <units per µs>", exact integers.
    let state: String = cmd(&mut con, &["GET", "t:k"]).await;
    let parts: Vec<u64> = state.split(' ').map(|p| p.parse().unwrap()).collect();
    assert_eq!(parts.len(), 3, "{state}");
    assert_eq!(parts[2], 3000); // den 3 → 3000 units per µs
    assert_eq!(parts[1], 2000); // 66 666⅔ µs past a whole microsecond
    sleep(ms(250)).await;
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
    // Six decisions, all by Redis; four of them found the connection
    // closed and went again.
    for l in [&open, &closed] {
        assert_eq!(counts(l), (6, 2, 4, 0, 0, 0, 4));
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
        assert_eq!(counts(l), (2, 1, 1, 0, 0, 0, 1));
    }
    for l in &limiters[2..] {
        let (answers, _) =
            within(l.timeout(), l.try_acquire_many_keys(&[("k", 1), ("j", 2)])).await;
        assert!(is_limited(&answers[0]), "{answers:?}");
        assert!(answers[1].is_ok(), "{answers:?}");
        // Its first request found "k" exhausted by its twin.
        assert_eq!(counts(l), (3, 1, 2, 0, 0, 0, 1));
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
        assert_eq!(counts(l), (6, 4, 2, 0, 0, 0, 2));
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
    // three decisions each. The first request of the second stall found
    // its connection closed and went again, once.
    assert_eq!(counts(&open), (9, 3, 0, 6, 6, 6, 1));
    assert_eq!(counts(&closed), (9, 3, 0, 6, 6, 0, 1));
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
    // Each limiter's first decision found the connection closed and
    // reconnected (to the silent listener) within its deadline.
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
    assert_eq!((o.retries, c.retries), (1, 1));
}

/// A loopback proxy to `upstream` that loses one reply: the first client
/// chunk that carries an `EVALSHA` is passed on, and then that connection
/// is closed without passing back what Redis answered. Every other byte,
/// and every later connection, goes through unchanged.
fn reply_losing_proxy(
    listener: tokio::net::TcpListener,
    upstream: u16,
) -> tokio::task::JoinHandle<()> {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let lost = Arc::new(AtomicBool::new(false));
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let server = tokio::net::TcpStream::connect(("127.0.0.1", upstream))
                .await
                .unwrap();
            let lost = lost.clone();
            tokio::spawn(async move {
                let (mut cr, mut cw) = client.into_split();
                let (mut sr, mut sw) = server.into_split();
                let back = tokio::spawn(async move {
                    let _ = tokio::io::copy(&mut sr, &mut cw).await;
                });
                let mut buf = vec![0u8; 64 * 1024];
                while let Ok(n @ 1..) = cr.read(&mut buf).await {
                    let chunk = &buf[..n];
                    if sw.write_all(chunk).await.is_err() {
                        break;
                    }
                    let evalsha = chunk.windows(7).any(|w| w == b"EVALSHA");
                    if evalsha && !lost.swap(true, Ordering::SeqCst) {
                        // Redis runs it; the client never hears.
                        back.abort();
                        sleep(ms(20)).await;
                        return;
                    }
                }
                let _ = back.await;
            });
        }
    })
}

#[tokio::test]
async fn a_request_that_may_have_run_is_not_sent_again() {
    let Some(server) = RedisServer::start("a_request_that_may_have_run_is_not_sent_again") else {
        return;
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let proxy = reply_losing_proxy(listener, server.port());
    let through_proxy = RedisFunnel::builder(format!("redis://127.0.0.1:{port}/"))
        .rate(slow())
        .capacity(2)
        .prefix("p:")
        .failure_policy(FailurePolicy::Closed)
        .build()
        .await
        .unwrap();
    let direct = funnel(&server, slow(), 2, "p:", FailurePolicy::Closed).await;
    // Sent, run by Redis, its reply lost with the connection: a failure
    // by the policy, not a second pour.
    let (r, _) = within(through_proxy.timeout(), through_proxy.try_acquire("k")).await;
    assert!(matches!(r, Err(RedisLimitError::Backend(_))), "{r:?}");
    assert_eq!(counts(&through_proxy), (1, 0, 0, 1, 0, 0, 0));
    // Redis ran it once: one of the two units is left.
    direct.try_acquire("k").await.unwrap();
    assert!(is_limited(&direct.try_acquire("k").await));
    // The proxy passes everything from now on: the limiter reconnected.
    assert!(is_limited(&through_proxy.try_acquire("k").await));
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
