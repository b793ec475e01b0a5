//! The cost of a `RedisFunnel` decision over loopback, against a plain
//! `SET` as the floor.
//!
//! ```sh
//! cargo bench --features redis --bench redis            # starts its own redis-server
//! REDIS_URL=redis://127.0.0.1:6379/ cargo bench --features redis --bench redis
//! BENCH_SECS=5 cargo bench --features redis --bench redis
//! ```
//!
//! Prints a Markdown table: decisions (or `SET`s) per second and the p50 /
//! p99 latency of one call (one batch for the pipelined rows), sequentially,
//! with 64 calls in flight on the one multiplexed connection, and in
//! pipelined batches of 100 keys. `EVALSHA` of an empty script is a second
//! floor: what any Lua script costs the server. The last column is Redis's
//! own CPU time per command, from `INFO commandstats` (the bench resets
//! those statistics with `CONFIG RESETSTAT`, so point `REDIS_URL` at a
//! server of your own).

#[path = "../tests/support/redis_server.rs"]
mod redis_server;

use std::sync::Arc;
use std::time::Duration;

use redis::aio::ConnectionManager;
use tokio::time::Instant;
use tokio_ratelimit::Rate;
use tokio_ratelimit::redis::{FailurePolicy, RedisFunnel};

const KEYS: usize = 10_000;
const IN_FLIGHT: usize = 64;
const BATCH: usize = 100;

struct Row {
    what: String,
    in_flight: String,
    per_second: f64,
    p50: Duration,
    p99: Duration,
    /// Redis's own CPU time per command (`INFO commandstats`).
    server_us: f64,
}

fn row(what: &str, in_flight: &str, ops: usize, elapsed: Duration, mut lat: Vec<Duration>) -> Row {
    lat.sort_unstable();
    let at = |q: f64| {
        #[expect(
            clippy::cast_possible_truncation,
            clippy::cast_sign_loss,
            clippy::cast_precision_loss,
            reason = "measured figures that fit"
        )]
        let i = ((lat.len() as f64 - 1.0) * q).round() as usize;
        lat[i]
    };
    #[expect(
        clippy::cast_precision_loss,
        reason = "counts and nanoseconds, far below 2^53"
    )]
    let per_second = ops as f64 / elapsed.as_secs_f64();
    Row {
        what: what.to_owned(),
        in_flight: in_flight.to_owned(),
        per_second,
        p50: at(0.50),
        p99: at(0.99),
        server_us: 0.0,
    }
}

/// Runs `tasks` loops of `op` for `secs`; each call of `op(i)` does `per`
/// operations. Returns operations done, the time taken, and each call's
/// latency.
async fn run<F, Fut>(
    tasks: usize,
    secs: Duration,
    per: usize,
    op: F,
) -> (usize, Duration, Vec<Duration>)
where
    F: Fn(usize) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    let op = Arc::new(op);
    // Warm up (connections, script cache, allocator).
    for i in 0..200 {
        op(i).await;
    }
    let start = Instant::now();
    let deadline = start + secs;
    let handles: Vec<_> = (0..tasks)
        .map(|t| {
            let op = Arc::clone(&op);
            tokio::spawn(async move {
                let mut lat = Vec::with_capacity(1 << 16);
                let mut i = t * 7919;
                while Instant::now() < deadline {
                    let s = Instant::now();
                    op(i).await;
                    lat.push(s.elapsed());
                    i += 1;
                }
                lat
            })
        })
        .collect();
    let mut all = vec![];
    for h in handles {
        all.extend(h.await.unwrap());
    }
    let elapsed = start.elapsed();
    (all.len() * per, elapsed, all)
}

fn key(i: usize) -> String {
    format!("user:{}", i % KEYS)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let secs = Duration::from_secs_f64(
        std::env::var("BENCH_SECS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(2.0),
    );
    let server;
    let url = if let Ok(url) = std::env::var("REDIS_URL") {
        url
    } else {
        server = redis_server::RedisServer::start("bench");
        match &server {
            Some(running) => running.url(),
            None => return,
        }
    };
    let client = redis::Client::open(url.as_str()).unwrap();
    let conn = ConnectionManager::new(client).await.unwrap();
    let limiter = RedisFunnel::builder(url.as_str())
        .rate(Rate::per_second(1000))
        .capacity(100)
        .prefix("bench:")
        .failure_policy(FailurePolicy::Closed)
        .timeout(Duration::from_secs(1))
        .build()
        .await
        .unwrap();
    let mut rows = vec![];
    for (tasks, label) in [(1, "1"), (IN_FLIGHT, "64")] {
        reset(&conn).await;
        rows.push(with_server(set(&conn, tasks, label, secs).await, &conn, "set").await);
        reset(&conn).await;
        let row = empty_script(&conn, tasks, label, secs).await;
        rows.push(with_server(row, &conn, "evalsha").await);
        reset(&conn).await;
        let row = decide(&limiter, tasks, label, secs).await;
        rows.push(with_server(row, &conn, "evalsha").await);
    }
    reset(&conn).await;
    rows.push(with_server(set_batch(&conn, secs).await, &conn, "set").await);
    reset(&conn).await;
    let row = decide_batch(&limiter, secs).await;
    rows.push(with_server(row, &conn, "evalsha").await);

    let stats = limiter.stats();
    assert_eq!(stats.backend_errors, 0);
    println!(
        "\nRedisFunnel over loopback (redis-server on the same machine), {} s per row\n",
        secs.as_secs_f64()
    );
    println!("| operation | in flight | ops/s | p50 | p99 | Redis CPU per op |");
    println!("|---|---|---:|---:|---:|---:|");
    for r in rows {
        println!(
            "| {} | {} | {:.0} | {:.0} µs | {:.0} µs | {:.2} µs |",
            r.what,
            r.in_flight,
            r.per_second,
            r.p50.as_secs_f64() * 1e6,
            r.p99.as_secs_f64() * 1e6,
            r.server_us,
        );
    }
    println!(
        "\n(p50/p99: one call, or one batch of {BATCH} for the pipelined rows; \
         {} decisions, {} limited)",
        stats.decisions, stats.limited
    );
}

/// Clears Redis's per-command statistics (`CONFIG RESETSTAT`).
async fn reset(conn: &ConnectionManager) {
    let mut conn = conn.clone();
    let () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query_async(&mut conn)
        .await
        .unwrap();
}

/// Adds Redis's CPU time per call of `command` since the last reset.
async fn with_server(mut row: Row, conn: &ConnectionManager, command: &str) -> Row {
    let mut conn = conn.clone();
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut conn)
        .await
        .unwrap();
    let prefix = format!("cmdstat_{command}:");
    row.server_us = info
        .lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .and_then(|fields| {
            fields
                .split(',')
                .find_map(|f| f.strip_prefix("usec_per_call="))
        })
        .and_then(|v| v.parse().ok())
        .unwrap_or(f64::NAN);
    row
}

async fn set(conn: &ConnectionManager, tasks: usize, label: &str, secs: Duration) -> Row {
    let conn = conn.clone();
    let (ops, took, lat) = run(tasks, secs, 1, move |i| {
        let mut conn = conn.clone();
        async move {
            let () = redis::cmd("SET")
                .arg(key(i))
                .arg("x")
                .query_async(&mut conn)
                .await
                .unwrap();
        }
    })
    .await;
    row("`SET` (floor)", label, ops, took, lat)
}

async fn empty_script(conn: &ConnectionManager, tasks: usize, label: &str, secs: Duration) -> Row {
    let conn = conn.clone();
    let script = Arc::new(redis::Script::new("return 1"));
    let (ops, took, lat) = run(tasks, secs, 1, move |i| {
        let mut conn = conn.clone();
        let script = Arc::clone(&script);
        async move {
            let one: i64 = script.key(key(i)).invoke_async(&mut conn).await.unwrap();
            assert_eq!(one, 1);
        }
    })
    .await;
    row("`EVALSHA` of `return 1`", label, ops, took, lat)
}

async fn decide(limiter: &RedisFunnel, tasks: usize, label: &str, secs: Duration) -> Row {
    let limiter = limiter.clone();
    let (ops, took, lat) = run(tasks, secs, 1, move |i| {
        let limiter = limiter.clone();
        async move {
            let answer = limiter.try_acquire(&key(i)).await;
            assert!(answer.is_ok() || answer.unwrap_err().retry_after().is_some());
        }
    })
    .await;
    row("`try_acquire`", label, ops, took, lat)
}

async fn set_batch(conn: &ConnectionManager, secs: Duration) -> Row {
    let conn = conn.clone();
    let (ops, took, lat) = run(1, secs, BATCH, move |i| {
        let mut conn = conn.clone();
        async move {
            let mut pipe = redis::pipe();
            for j in 0..BATCH {
                pipe.cmd("SET").arg(key(i * BATCH + j)).arg("x").ignore();
            }
            let () = pipe.query_async(&mut conn).await.unwrap();
        }
    })
    .await;
    row("pipelined `SET` × 100 (floor)", "1 batch", ops, took, lat)
}

async fn decide_batch(limiter: &RedisFunnel, secs: Duration) -> Row {
    let limiter = limiter.clone();
    let (ops, took, lat) = run(1, secs, BATCH, move |i| {
        let limiter = limiter.clone();
        async move {
            let keys: Vec<String> = (0..BATCH).map(|j| key(i * BATCH + j)).collect();
            let requests: Vec<(&str, u32)> = keys.iter().map(|k| (k.as_str(), 1)).collect();
            let answers = limiter.try_acquire_many_keys(&requests).await;
            assert!(answers.iter().all(|a| {
                a.as_ref()
                    .map_or_else(|e| e.retry_after().is_some(), |()| true)
            }));
        }
    })
    .await;
    row("`try_acquire_many_keys` × 100", "1 batch", ops, took, lat)
}
