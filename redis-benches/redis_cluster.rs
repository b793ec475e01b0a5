//! `RedisFunnel` decisions on a three-master Redis Cluster next to one
//! server, in one run, over loopback; and `redis-benchmark` running the
//! same script on one server as the floor.
//!
//! ```sh
//! cargo bench --features redis --bench redis_cluster   # starts its own servers
//! BENCH_SECS=5 cargo bench --features redis --bench redis_cluster
//! ```
//!
//! Prints a Markdown table: decisions per second and the p50 / p99 latency
//! of one call (one batch for the batch rows), with 1 and 64 calls in
//! flight. On a machine of two cores the six cluster nodes, the single
//! server and the client share those cores: a cluster cannot scale here.

#[path = "../tests/support/redis_server.rs"]
mod redis_server;

#[path = "../tests/support/redis_cluster.rs"]
mod redis_cluster;

use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tokio_ratelimit::Rate;
use tokio_ratelimit::redis::{FailurePolicy, RedisFunnel, RedisFunnelBuilder};

const KEYS: usize = 10_000;
const BATCH: usize = 100;

/// Runs `tasks` loops of `op` for `secs`; returns calls done, the time
/// taken and each call's latency.
async fn run<F, Fut>(tasks: usize, secs: Duration, op: F) -> (usize, Duration, Vec<Duration>)
where
    F: Fn(usize) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = ()> + Send,
{
    let op = Arc::new(op);
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
    (all.len(), start.elapsed(), all)
}

#[expect(
    clippy::cast_precision_loss,
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    reason = "measured figures that fit"
)]
fn print_row(
    what: &str,
    in_flight: usize,
    per_call: usize,
    (calls, elapsed, mut lat): (usize, Duration, Vec<Duration>),
) {
    lat.sort_unstable();
    let at = |q: f64| lat[((lat.len() as f64 - 1.0) * q).round() as usize];
    let per_second = (calls * per_call) as f64 / elapsed.as_secs_f64();
    println!(
        "| {what} | {in_flight} | {per_second:.0} | {:.1} | {:.1} |",
        at(0.50).as_secs_f64() * 1e6,
        at(0.99).as_secs_f64() * 1e6
    );
}

fn configured(mut b: RedisFunnelBuilder) -> RedisFunnelBuilder {
    b.rate(Rate::per_second(1000))
        .capacity(10)
        .prefix("bench:")
        .failure_policy(FailurePolicy::Closed)
        .timeout(Duration::from_secs(1))
        .refusal_cache(0);
    b
}

/// `redis-benchmark` sending the decision script (`EVALSHA`, the
/// arguments the limiter sends for 1000/s and capacity 10: units per µs,
/// cost and depth in µs and remainders) on random keys: requests per
/// second, from its CSV output.
fn redis_benchmark(port: u16, clients: usize, requests: usize, sha: &str) -> Option<String> {
    let out = Command::new("redis-benchmark")
        .args([
            "-h",
            "127.0.0.1",
            "-p",
            &port.to_string(),
            "--csv",
            "-r",
            &KEYS.to_string(),
        ])
        .args(["-c", &clients.to_string(), "-n", &requests.to_string()])
        .args([
            "EVALSHA",
            sha,
            "1",
            "bench:user:__rand_int__",
            "1000",
            "1000",
            "0",
            "10000",
            "0",
        ])
        .output()
        .ok()?;
    let csv = String::from_utf8_lossy(&out.stdout).into_owned();
    // "test","rps","avg_latency_ms","min_latency_ms","p50_latency_ms","p95_latency_ms","p99_latency_ms","max_latency_ms"
    let line = csv.lines().find(|l| l.starts_with("\"EVALSHA"))?.to_owned();
    Some(line)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let secs = Duration::from_secs_f64(
        std::env::var("BENCH_SECS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(2.0),
    );
    let Some(server) = redis_server::RedisServer::start("bench-node") else {
        return;
    };
    let Some(cluster) = redis_cluster::RedisCluster::start("bench-cluster") else {
        return;
    };
    let node = configured(RedisFunnel::builder(server.url()))
        .build()
        .await
        .unwrap();
    let clustered = configured(RedisFunnel::cluster_builder(cluster.urls()))
        .build()
        .await
        .unwrap();
    println!("| what | in flight | decisions/s | p50 µs | p99 µs |");
    println!("|---|---:|---:|---:|---:|");
    for (name, limiter) in [("one server", &node), ("cluster, 3 masters", &clustered)] {
        for tasks in [1, 64] {
            let l = limiter.clone();
            let r = run(tasks, secs, move |i| {
                let l = l.clone();
                async move {
                    let _ = l.try_acquire(&format!("user:{}", i % KEYS)).await;
                }
            })
            .await;
            print_row(&format!("try_acquire, {name}"), tasks, 1, r);
        }
        let l = limiter.clone();
        let r = run(1, secs, move |i| {
            let l = l.clone();
            async move {
                let keys: Vec<String> = (0..BATCH)
                    .map(|j| format!("user:{}", (i * BATCH + j) % KEYS))
                    .collect();
                let requests: Vec<(&str, u32)> = keys.iter().map(|k| (k.as_str(), 1)).collect();
                let _ = l.try_acquire_many_keys(&requests).await;
            }
        })
        .await;
        print_row(&format!("batch of {BATCH} keys, {name}"), 1, BATCH, r);
    }
    let sha = redis::Script::new(include_str!("../src/redis/gcra.lua"))
        .get_hash()
        .to_owned();
    for clients in [1, 64] {
        match redis_benchmark(server.port(), clients, 100_000, &sha) {
            Some(line) => {
                println!("\nredis-benchmark -c {clients} (one server, same script): {line}");
            }
            None => println!("\nredis-benchmark not available"),
        }
    }
}
