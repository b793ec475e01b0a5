//! A closed connection never costs a decision, and a resent decision never
//! pours twice (feature `redis`), against a real `redis-server` on a
//! multi-thread runtime: connections killed between decisions (200 times,
//! with no pause for the close to arrive), killed while decisions are in
//! flight (the resend path, under real threads), and a server whose idle
//! `timeout` closes every connection between uses. Each run counts every
//! decision and compares the key's state with the grants: exactly one pour
//! per grant. Real time (Redis's clock), as in `tests/redis.rs`.

#[path = "support/redis_server.rs"]
mod redis_server;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis_server::RedisServer;
use tokio::time::{Instant, sleep};
use tokio_ratelimit::Rate;
use tokio_ratelimit::redis::{FailurePolicy, RedisFunnel, RedisStats};

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// Deep enough for every grant of a test, and draining one permit a minute:
/// a key's permits left are its capacity less what it was poured.
const CAPACITY: u32 = 1_000_000;

async fn funnel(server: &RedisServer, prefix: &str, policy: FailurePolicy) -> RedisFunnel {
    RedisFunnel::builder(server.url())
        .rate(Rate::per_minute(1))
        .capacity(CAPACITY)
        .prefix(prefix)
        .failure_policy(policy)
        .timeout(ms(500))
        .build()
        .await
        .unwrap()
}

async fn admin(server: &RedisServer) -> MultiplexedConnection {
    redis::Client::open(server.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap()
}

/// Kills every normal connection but the admin's; how many.
async fn kill_clients(con: &mut MultiplexedConnection) -> i64 {
    redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("normal")
        .query_async(con)
        .await
        .unwrap()
}

/// What a key was poured, read through `l` (which pours nothing to look).
async fn poured(l: &RedisFunnel, key: &str) -> u32 {
    CAPACITY - redis_server::available(l, key).await
}

/// No decision failed: every one asked of Redis was decided by Redis.
fn none_failed(s: &RedisStats) {
    assert_eq!(s.backend_errors, 0, "{s:?}");
    assert_eq!(s.fail_open_grants, 0, "{s:?}");
    assert_eq!(s.decisions, s.granted + s.limited, "{s:?}");
}

/// The bar: 200 idle-connection closes, a decision right after
/// each (no pause: the close may not have reached this process yet, so the
/// request may be written to a dead socket and resent), single calls and
/// batches, both policies: no decision fails, none is granted by a policy,
/// and each key holds exactly the permits granted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hundred_closed_connections_cost_no_decision() {
    let Some(server) = RedisServer::start("two_hundred_closed_connections_cost_no_decision") else {
        return;
    };
    let mut con = admin(&server).await;
    let closed = funnel(&server, "c:", FailurePolicy::Closed).await;
    let open = funnel(&server, "o:", FailurePolicy::Open).await;
    let mut granted = 0;
    for round in 0..200u32 {
        assert!(kill_clients(&mut con).await >= 1, "round {round}");
        for l in [&closed, &open] {
            if round % 2 == 0 {
                l.try_acquire_many("single", 1 + round % 3).await.unwrap();
            } else {
                let answers = l
                    .try_acquire_many_keys(&[("a", 1), ("b", 2), ("a", 3)])
                    .await;
                assert!(
                    answers.iter().all(Result::is_ok),
                    "round {round}: {answers:?}"
                );
            }
        }
        if round % 2 == 0 {
            granted += 1 + round % 3;
        }
    }
    for l in [&closed, &open] {
        let s = l.stats();
        none_failed(&s);
        assert_eq!(s.granted, 100 + 100 * 3, "{s:?}");
        assert_eq!(poured(l, "single").await, granted);
        assert_eq!(poured(l, "a").await, 100 * 4);
        assert_eq!(poured(l, "b").await, 100 * 2);
        eprintln!(
            "{:?}: 200 closes, {} decisions, {} resent, {} answered from their first grant",
            l.failure_policy(),
            s.decisions,
            s.retries,
            s.resends_granted_before
        );
    }
}

/// Connections killed every few milliseconds while four tasks on two
/// threads decide as fast as they can, single calls and batches, for a
/// second: some requests are in flight when their connection dies, so
/// their replies are lost after Redis ran them, or they never reached
/// Redis; each is resent once. Nothing fails, and each key holds exactly
/// the permits granted: no resend poured twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_killed_mid_flight_never_pour_twice() {
    let Some(server) = RedisServer::start("connections_killed_mid_flight_never_pour_twice") else {
        return;
    };
    let mut con = admin(&server).await;
    let l = funnel(&server, "m:", FailurePolicy::Closed).await;
    let stop = Arc::new(AtomicBool::new(false));
    let killer = tokio::spawn({
        let stop = stop.clone();
        async move {
            let mut kills = 0;
            while !stop.load(Ordering::Relaxed) {
                kills += kill_clients(&mut con).await;
                sleep(ms(3)).await;
            }
            kills
        }
    });
    let start = Instant::now();
    let tasks: Vec<_> = (0..4)
        .map(|t| {
            let l = l.clone();
            tokio::spawn(async move {
                let mut granted = [0u32; 3];
                let mut failed = Vec::new();
                while start.elapsed() < ms(1000) {
                    if t % 2 == 0 {
                        match l.try_acquire_many(&format!("t{t}"), 2).await {
                            Ok(()) => granted[0] += 2,
                            Err(e) => failed.push(e),
                        }
                    } else {
                        let answers = l
                            .try_acquire_many_keys(&[("shared", 1), (&format!("t{t}"), 3)])
                            .await;
                        for (i, a) in answers.into_iter().enumerate() {
                            match a {
                                Ok(()) => granted[1 + i] += [1, 3][i],
                                Err(e) => failed.push(e),
                            }
                        }
                    }
                }
                (granted, failed)
            })
        })
        .collect();
    let mut shared = 0;
    let mut own = Vec::new();
    for (t, task) in tasks.into_iter().enumerate() {
        let (granted, failed) = task.await.unwrap();
        assert!(failed.is_empty(), "task {t}: {failed:?}");
        shared += granted[1];
        own.push(granted[0] + granted[2]);
    }
    stop.store(true, Ordering::Relaxed);
    let kills = killer.await.unwrap();
    let s = l.stats();
    none_failed(&s);
    assert_eq!(poured(&l, "shared").await, shared);
    for (t, own) in own.into_iter().enumerate() {
        assert_eq!(poured(&l, &format!("t{t}")).await, own, "t{t}");
    }
    eprintln!(
        "{kills} connections killed over {} decisions: {} resent, {} answered from their first grant",
        s.decisions, s.retries, s.resends_granted_before
    );
    assert!(kills > 50, "{kills} kills");
    assert!(s.retries > 0, "no request was in flight at a kill: {s:?}");
}

/// A server that closes connections idle for a second (`timeout 1`), used
/// every 1.5 s: every use finds its connections closed. Four uses, single
/// calls and batches, both policies: no decision fails, and each key holds
/// exactly the permits granted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_idle_timeout_costs_no_decision() {
    let Some(server) = RedisServer::start_with(
        "a_server_idle_timeout_costs_no_decision",
        &["--timeout", "1"],
    ) else {
        return;
    };
    let closed = funnel(&server, "c:", FailurePolicy::Closed).await;
    let open = funnel(&server, "o:", FailurePolicy::Open).await;
    for round in 0..4u32 {
        sleep(ms(1500)).await;
        for l in [&closed, &open] {
            l.try_acquire_many("single", 2).await.unwrap();
            let answers = l.try_acquire_many_keys(&[("a", 1), ("b", 2)]).await;
            assert!(
                answers.iter().all(Result::is_ok),
                "round {round}: {answers:?}"
            );
        }
    }
    for l in [&closed, &open] {
        let s = l.stats();
        none_failed(&s);
        assert_eq!(s.granted, 4 * 3, "{s:?}");
        assert_eq!(poured(l, "single").await, 8);
        assert_eq!(poured(l, "a").await, 4);
        assert_eq!(poured(l, "b").await, 8);
    }
}
