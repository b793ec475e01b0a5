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
//!
//! Quotas: `try_acquire` of a two-band quota next to the one-band row, in
//! the same run (one script call either way, five more arguments and one
//! more band of Lua arithmetic), and `try_acquire_with` passing another
//! two-band quota with each call (converted to the script's encoding per
//! call); then the ratios, and the cost of that conversion alone, measured
//! without Redis (a request above the quota's capacity is refused after
//! the conversion, before any I/O).
//!
//! Resends: the decision script as it was before request ids
//! (`gcra_before_ids.lua` beside this file, the same arguments less the
//! id, the horizon and `since`) run by `EVALSHA` at 1 and 64 in flight
//! beside `try_acquire`, so that what the ids cost Redis per decision is
//! read in one run; both are one round trip per decision (each row's
//! `EVALSHA` calls are counted against its decisions). Then the bytes a key
//! stores (`STRLEN` of its state, `MEMORY USAGE` of the key) after one
//! grant and after 20 (16 ids kept), before and now.

#[path = "../tests/support/redis_server.rs"]
mod redis_server;

use std::sync::Arc;
use std::time::Duration;

use redis::aio::ConnectionManager;
use tokio::time::Instant;
use tokio_ratelimit::redis::{FailurePolicy, RedisFunnel, RedisLimitError};
use tokio_ratelimit::{Quota, Rate};

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
    let build = |quota: Quota, prefix: &str| {
        let mut b = RedisFunnel::builder(url.as_str());
        b.quota(quota)
            .prefix(prefix)
            .failure_policy(FailurePolicy::Closed)
            .timeout(Duration::from_secs(1));
        async move { b.build().await.unwrap() }
    };
    let limiter = build(ONE_BAND, "bench:").await;
    let two = build(TWO_BANDS, "bench2:").await;
    let mut rows = vec![];
    let mut ratios = vec![];
    for (tasks, label) in [(1, "1"), (IN_FLIGHT, "64")] {
        reset(&conn).await;
        rows.push(with_server(set(&conn, tasks, label, secs).await, &conn, "set").await);
        reset(&conn).await;
        let row = empty_script(&conn, tasks, label, secs).await;
        rows.push(with_server(row, &conn, "evalsha").await);
        reset(&conn).await;
        let row = decide(&limiter, tasks, label, secs, None, "`try_acquire`, 1 band").await;
        let one_band = row.per_second;
        rows.push(with_server(row, &conn, "evalsha").await);
        reset(&conn).await;
        let row = decide(&two, tasks, label, secs, None, "`try_acquire`, 2 bands").await;
        let two_bands = row.per_second;
        rows.push(with_server(row, &conn, "evalsha").await);
        reset(&conn).await;
        let what = "`try_acquire_with`, 2 bands (another quota per call)";
        let row = decide(&two, tasks, label, secs, Some(OTHER_TWO_BANDS), what).await;
        let with = row.per_second;
        rows.push(with_server(row, &conn, "evalsha").await);
        ratios.push((label, two_bands / one_band, with / one_band));
        reset(&conn).await;
        let row = before_ids(&conn, tasks, label, secs).await;
        let before = row.per_second;
        let mut row = with_server(row, &conn, "evalsha").await;
        row.what = format!("{} ({:.2}× `try_acquire`)", row.what, before / one_band);
        rows.push(row);
    }
    reset(&conn).await;
    rows.push(with_server(set_batch(&conn, secs).await, &conn, "set").await);
    reset(&conn).await;
    let row = decide_batch(&limiter, secs).await;
    rows.push(with_server(row, &conn, "evalsha").await);

    let conversion = conversion_ns(&two).await;
    let sizes = key_sizes(&conn, &limiter).await;
    let stats = limiter.stats();
    assert_eq!(stats.backend_errors, 0);
    assert_eq!(two.stats().backend_errors, 0);
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
    print_ratios(&ratios);
    println!(
        "\nConverting a two-band quota per call (`try_acquire_with`, no Redis): \
         {conversion:.0} ns"
    );
    print_sizes(&sizes);
}

fn print_ratios(ratios: &[(&str, f64, f64)]) {
    println!("\n| in flight | 2 bands ÷ 1 band | `try_acquire_with` 2 bands ÷ 1 band |");
    println!("|---|---:|---:|");
    for (label, two, with) in ratios {
        println!("| {label} | {two:.2} | {with:.2} |");
    }
}

fn print_sizes(sizes: &[(String, i64, i64)]) {
    println!("\n| a key's state (one band) | `STRLEN` | `MEMORY USAGE` |");
    println!("|---|---:|---:|");
    for (what, len, usage) in sizes {
        println!("| {what} | {len} B | {usage} B |");
    }
}

/// The decision script from before request ids (one band only here).
const BEFORE_IDS: &str = include_str!("gcra_before_ids.lua");

/// `ONE_BAND`'s arguments as both scripts read them per band: unit (scaled
/// units per µs: the 1 ms interval is whole nanoseconds, so 1 000), the
/// cost of one permit (1 000 µs, no remainder), the band's depth (100 ms).
const ONE_BAND_ARGS: [u64; 5] = [1000, 1000, 0, 100_000, 0];

/// `EVALSHA` of the script from before request ids, on the same keys and
/// quota as `try_acquire`.
async fn before_ids(conn: &ConnectionManager, tasks: usize, label: &str, secs: Duration) -> Row {
    let conn = conn.clone();
    let script = Arc::new(redis::Script::new(BEFORE_IDS));
    let (ops, took, lat) = run(tasks, secs, 1, move |i| {
        let mut conn = conn.clone();
        let script = Arc::clone(&script);
        async move {
            let mut call = script.key(format!("before:{}", key(i)));
            for a in ONE_BAND_ARGS {
                call.arg(a);
            }
            let reply: Vec<i64> = call.invoke_async(&mut conn).await.unwrap();
            assert!(reply[0] == 0 || reply[0] == 1);
        }
    })
    .await;
    row("`EVALSHA` of the script before ids", label, ops, took, lat)
}

/// What a key stores, before request ids and now: after one grant, and
/// after 20 (a key granted more often than its 16 ids).
async fn key_sizes(conn: &ConnectionManager, limiter: &RedisFunnel) -> Vec<(String, i64, i64)> {
    let mut conn = conn.clone();
    let script = redis::Script::new(BEFORE_IDS);
    let mut sizes = Vec::new();
    for grants in [1, 20] {
        let old = format!("before:size{grants}");
        let new = format!("size{grants}");
        for _ in 0..grants {
            let mut call = script.key(&old);
            for a in ONE_BAND_ARGS {
                call.arg(a);
            }
            let reply: Vec<i64> = call.invoke_async(&mut conn).await.unwrap();
            assert_eq!(reply[0], 1);
            limiter.try_acquire(&new).await.unwrap();
        }
        for (what, key) in [("before ids", old), ("now", limiter.redis_key(&new))] {
            let len: i64 = redis::cmd("STRLEN")
                .arg(&key)
                .query_async(&mut conn)
                .await
                .unwrap();
            let usage: i64 = redis::cmd("MEMORY")
                .arg("USAGE")
                .arg(&key)
                .query_async(&mut conn)
                .await
                .unwrap();
            let what = format!(
                "{what}, after {grants} grant{}",
                if grants == 1 { "" } else { "s" }
            );
            sizes.push((what, len, usage));
        }
    }
    sizes
}

/// The one-band limiter of the first rows.
const ONE_BAND: Quota = Quota::new(Rate::per_second(1000), 100);
/// The same, and an hourly band that also grants every request here: the
/// script computes and writes both.
const TWO_BANDS: Quota =
    Quota::new(Rate::per_second(1000), 100).and(Rate::per_hour(3_600_000), 100_000);
/// Another two-band quota, passed with each call (not the limiter's own,
/// so it is converted every time).
const OTHER_TWO_BANDS: Quota =
    Quota::new(Rate::per_second(999), 100).and(Rate::per_hour(3_600_001), 100_000);

/// The time a `try_acquire_with` of another quota spends before any I/O,
/// less that of `try_acquire_many` (which converts nothing): both refuse
/// a request above the capacity at once.
async fn conversion_ns(limiter: &RedisFunnel) -> f64 {
    let calls = 1_000_000u32;
    let mut per_call = [0.0; 2];
    for (with, slot) in [false, true].into_iter().zip(&mut per_call) {
        let start = std::time::Instant::now();
        for _ in 0..calls {
            // Both complete without awaiting anything.
            let r = if with {
                limiter
                    .try_acquire_with("k", std::hint::black_box(&OTHER_TWO_BANDS), 101)
                    .await
            } else {
                limiter
                    .try_acquire_many("k", std::hint::black_box(101))
                    .await
            };
            assert!(matches!(r, Err(RedisLimitError::InsufficientCapacity)));
        }
        *slot = start.elapsed().as_secs_f64() * 1e9 / f64::from(calls);
    }
    per_call[1] - per_call[0]
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

/// `try_acquire` on the limiter's quota, or `try_acquire_with(quota)`.
async fn decide(
    limiter: &RedisFunnel,
    tasks: usize,
    label: &str,
    secs: Duration,
    quota: Option<Quota>,
    what: &str,
) -> Row {
    let limiter = limiter.clone();
    let (ops, took, lat) = run(tasks, secs, 1, move |i| {
        let limiter = limiter.clone();
        async move {
            let answer = match quota {
                None => limiter.try_acquire(&key(i)).await,
                Some(quota) => limiter.try_acquire_with(&key(i), &quota, 1).await,
            };
            assert!(answer.is_ok() || answer.unwrap_err().retry_after().is_some());
        }
    })
    .await;
    row(what, label, ops, took, lat)
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
