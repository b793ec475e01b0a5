//! What the `metrics` feature adds to `try_acquire`: a `TokenBucket` named
//! for its metrics, recording into metrics-exporter-prometheus's recorder
//! (installed globally, as a service installs it), against the same bucket
//! unnamed, in one run; allowed (10⁹/s, never exhausted) and denied
//! (1/hour, exhausted), on one thread and on two sharing the bucket.
//! Repetitions interleave the two.
//!
//! ```sh
//! cargo run --release -p tokio-ratelimit-benches --features metrics --example metrics_cost
//! ```

use std::hint::black_box;
use std::time::{Duration, Instant};

use metrics_exporter_prometheus::PrometheusBuilder;
use tokio_ratelimit::{Rate, TokenBucket};
use tokio_ratelimit_benches::median;

const CALLS: u32 = 2_000_000;
const REPS: usize = 9;

fn bucket(allowed: bool, name: Option<&str>) -> TokenBucket {
    let mut builder = TokenBucket::builder();
    if allowed {
        builder
            .rate(Rate::per_second(1_000_000_000))
            .capacity(1_000_000_000);
    } else {
        builder.rate(Rate::per_hour(1)).capacity(1);
    }
    if let Some(name) = name {
        builder.name(name);
    }
    let bucket = builder.build().unwrap();
    if !allowed {
        bucket.try_acquire().unwrap();
    }
    bucket
}

/// Nanoseconds per call, each of `threads` threads making `CALLS` calls
/// on the same bucket at once (wall time over one thread's calls).
fn ns_per_call(bucket: &TokenBucket, threads: usize) -> f64 {
    let start = Instant::now();
    std::thread::scope(|scope| {
        for _ in 0..threads {
            scope.spawn(|| {
                for _ in 0..CALLS {
                    let _ = black_box(bucket.try_acquire());
                }
            });
        }
    });
    let elapsed: Duration = start.elapsed();
    elapsed.as_secs_f64() * 1e9 / f64::from(CALLS)
}

fn main() {
    let handle = PrometheusBuilder::new()
        .install_recorder()
        .expect("the only recorder");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let _entered = runtime.enter();
    println!("| case | threads | unnamed ns | named ns | added ns |");
    println!("|---|---:|---:|---:|---:|");
    for threads in [1, 2] {
        for (case, allowed) in [("allowed", true), ("denied", false)] {
            let plain = bucket(allowed, None);
            let named = bucket(allowed, Some(case));
            let (mut a, mut b) = (Vec::new(), Vec::new());
            ns_per_call(&plain, threads);
            ns_per_call(&named, threads);
            for _ in 0..REPS {
                a.push(ns_per_call(&plain, threads));
                b.push(ns_per_call(&named, threads));
            }
            let (a, b) = (median(&a), median(&b));
            println!("| {case} | {threads} | {a:.1} | {b:.1} | {:.1} |", b - a);
        }
    }
    // What the named buckets granted reaches the recorder every second
    // from the background publisher; a scrape handler flushes first.
    tokio_ratelimit::metrics::flush();
    // The series are there: the named buckets' answers were recorded.
    let rendered = handle.render();
    assert!(
        rendered
            .contains("tokio_ratelimit_requests_total{limiter=\"allowed\",outcome=\"granted\"}")
    );
    assert!(
        rendered.contains("tokio_ratelimit_requests_total{limiter=\"denied\",outcome=\"limited\"}")
    );
}
