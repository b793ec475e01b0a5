//! Scenario 9 (`resources`): a bucket per resource, by the hundred
//! thousand — what an idle one costs in memory and tasks.
//!
//! Each subject holds `set.idle` resources (100 000; 10 000 quick), each
//! used once (one permit taken, at a rate slow enough that none is swept
//! while measured), then idle. Bytes each: the resident-memory growth over
//! the count, the heap trimmed before and after filling. Tasks: the
//! runtime's alive tasks once they are idle.

use std::sync::Arc;
use std::time::{Duration, Instant};

use governor::{DefaultKeyedRateLimiter, Quota};
use tokio::runtime::Runtime;
use tokio_ratelimit::keyed::{Keyed, KeyedFunnel};
use tokio_ratelimit::{ConfigError, Funnel, LeakyBucket, Limiter, Rate, TokenBucket};
use tokio_ratelimit_benches::{Table, cpu_time, quantile, ratio_line, rss_bytes, trim_heap};

use crate::peers::nz;
use crate::settings::Settings;

/// A rate at which a key used once stays un-fresh for the whole run.
fn slow() -> Rate {
    Rate::per_hour(10)
}

/// Resident bytes per item of what `fill` builds (and holds until the
/// figure is taken), and the tasks alive with them.
fn measure<T>(rt: &Runtime, count: usize, fill: impl FnOnce() -> T) -> (f64, usize) {
    trim_heap();
    let before = rss_bytes();
    let held = {
        let _guard = rt.enter();
        fill()
    };
    // Let anything spawned run and park.
    rt.block_on(async { tokio::time::sleep(Duration::from_millis(100)).await });
    trim_heap();
    let after = rss_bytes();
    let tasks = rt.metrics().num_alive_tasks();
    drop(held);
    rt.block_on(async { tokio::time::sleep(Duration::from_millis(100)).await });
    #[expect(
        clippy::cast_precision_loss,
        reason = "bytes and counts far below 2^53"
    )]
    let bytes = after.saturating_sub(before) as f64 / count as f64;
    (bytes, tasks)
}

/// `Keyed<u64, L>` with `keys` keys, each used once.
fn keyed<L>(rt: &Runtime, keys: u64, make: fn() -> Result<L, ConfigError>) -> (f64, usize)
where
    L: Limiter + Clone + Send + Sync + 'static,
{
    let count = usize::try_from(keys).unwrap();
    measure(rt, count, || {
        let map: Keyed<u64, L> = Keyed::builder().limiter(make).build().unwrap();
        for k in 0..keys {
            assert!(map.try_acquire(&k).is_ok());
        }
        map
    })
}

/// `n` standalone limiters, each used once.
fn standalone<L: Limiter>(
    rt: &Runtime,
    n: usize,
    make: fn() -> Result<L, ConfigError>,
) -> (f64, usize) {
    measure(rt, n, || {
        (0..n)
            .map(|_| {
                let l = make().unwrap();
                assert!(l.try_acquire().is_ok());
                l
            })
            .collect::<Vec<_>>()
    })
}

fn token() -> Result<TokenBucket, ConfigError> {
    TokenBucket::builder().rate(slow()).capacity(10).build()
}

fn leaky() -> Result<LeakyBucket, ConfigError> {
    LeakyBucket::builder().rate(slow()).capacity(10).build()
}

fn funnel() -> Result<Funnel, ConfigError> {
    Funnel::builder().rate(slow()).capacity(10).build()
}

pub(crate) fn resources(rt: &Runtime, set: &Settings) {
    let n = set.idle;
    let keys = n as u64;
    let mut t = Table::new(
        format!("9. A bucket per resource: {n} resources, each used once, then idle"),
        &["subject", "bytes each", "tasks alive"],
    );
    let mut row = |name: &str, (bytes, tasks): (f64, usize)| {
        t.row(vec![name.into(), format!("{bytes:.1}"), tasks.to_string()]);
        bytes
    };
    row(
        "KeyedFunnel<u64>",
        measure(rt, n, || {
            let map: KeyedFunnel<u64> = KeyedFunnel::builder()
                .rate(slow())
                .capacity(10)
                .build()
                .unwrap();
            for k in 0..keys {
                assert!(map.try_acquire(&k).is_ok());
            }
            map
        }),
    );
    let token_keyed = row("Keyed<u64, TokenBucket>", keyed(rt, keys, token));
    let leaky_keyed = row("Keyed<u64, LeakyBucket>", keyed(rt, keys, leaky));
    row(
        "governor keyed (dashmap)",
        measure(rt, n, || {
            let map: DefaultKeyedRateLimiter<u64> =
                governor::RateLimiter::keyed(Quota::per_hour(nz(10)).allow_burst(nz(10)));
            for k in 0..keys {
                assert!(map.check_key(&k).is_ok());
            }
            map
        }),
    );
    let token = row("TokenBucket (standalone)", standalone(rt, n, token));
    let leaky = row("LeakyBucket (standalone)", standalone(rt, n, leaky));
    row("Funnel (standalone)", standalone(rt, n, funnel));
    row(
        "governor direct (standalone)",
        measure(rt, n, || {
            (0..n)
                .map(|_| {
                    let g = governor::RateLimiter::direct(Quota::per_hour(nz(10)));
                    assert!(g.check().is_ok());
                    g
                })
                .collect::<Vec<_>>()
        }),
    );
    t.note(
        "bytes: resident-memory delta (/proc/self/statm) over the count, heap trimmed before and after filling; \
         standalone limiters held in a Vec (their handles counted). Rate 10/h, capacity 10, one permit taken: \
         no key is fresh again, so none is swept while measured. Tasks: the runtime's alive tasks once idle \
         (an actor per bucket would show here).",
    );
    t.note(ratio_line(
        "Keyed<u64, TokenBucket> bytes per idle key (target ≤ 256)",
        token_keyed,
        "≤",
        256.0,
    ));
    t.note(ratio_line(
        "Keyed<u64, LeakyBucket> bytes per idle key (target ≤ 256)",
        leaky_keyed,
        "≤",
        256.0,
    ));
    t.note(ratio_line(
        "standalone idle TokenBucket bytes (target ≤ 200)",
        token,
        "≤",
        200.0,
    ));
    t.note(ratio_line(
        "standalone idle LeakyBucket bytes",
        leaky,
        "≤",
        200.0,
    ));
    t.print();
    actor_start(rt);
}

/// A bucket's actor is a task only while someone waits: what starting it
/// costs. The first waiter at an idle bucket (rate 1 000/s, capacity 1,
/// emptied, then one `acquire`, then 5 ms idle; 1 000 times): how late it is
/// served against its due time. A burst of 10 000 waiters arriving at once
/// at an emptied bucket of 100 000/s: when the last is served against the
/// ideal 100 ms, and the CPU it took.
fn actor_start(rt: &Runtime) {
    let mut t = Table::new(
        "9b. Starting the actor: the first waiter at an idle bucket, and a burst".to_string(),
        &["case", "p50", "p99", "max", "CPU"],
    );
    let bucket = rt.block_on(async {
        TokenBucket::builder()
            .rate(Rate::per_second(1_000))
            .capacity(1)
            .build()
            .unwrap()
    });
    let mut late: Vec<Duration> = rt.block_on(async {
        let mut late = Vec::new();
        for _ in 0..1_000 {
            while bucket.try_acquire().is_ok() {}
            let due = match bucket.try_acquire() {
                Err(e) => e.retry_after().unwrap_or_default(),
                Ok(()) => Duration::ZERO,
            };
            let asked = Instant::now();
            bucket.acquire().await.unwrap();
            late.push(asked.elapsed().saturating_sub(due));
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        late
    });
    late.sort();
    let ms = |d: Duration| format!("{:.3} ms", d.as_secs_f64() * 1e3);
    t.row(vec![
        "first waiter at an idle bucket, lateness".into(),
        ms(quantile(&late, 0.5)),
        ms(quantile(&late, 0.99)),
        ms(*late.last().unwrap()),
        "—".into(),
    ]);
    let burst = Arc::new(rt.block_on(async {
        TokenBucket::builder()
            .rate(Rate::per_second(100_000))
            .capacity(1)
            .build()
            .unwrap()
    }));
    let mut lasts = Vec::new();
    let mut cpus = Vec::new();
    for _ in 0..5 {
        let (cpu0, start) = (cpu_time(), Instant::now());
        let last = rt.block_on(async {
            while burst.try_acquire().is_ok() {}
            let tasks: Vec<_> = (0..10_000)
                .map(|_| {
                    let b = Arc::clone(&burst);
                    tokio::spawn(async move {
                        b.acquire().await.unwrap();
                        Instant::now()
                    })
                })
                .collect();
            let mut last = start;
            for task in tasks {
                last = last.max(task.await.unwrap());
            }
            last
        });
        lasts.push(last - start);
        cpus.push(cpu_time() - cpu0);
        rt.block_on(async { tokio::time::sleep(Duration::from_millis(20)).await });
    }
    lasts.sort();
    cpus.sort();
    t.row(vec![
        "10 000 waiters at once, last served (ideal 100 ms)".into(),
        ms(quantile(&lasts, 0.5)),
        "—".into(),
        ms(*lasts.last().unwrap()),
        ms(quantile(&cpus, 0.5)),
    ]);
    t.note("lateness: served − asked − the wait `try_acquire` gave just before; tokio's timer ticks every 1 ms. Burst: 5 runs, median and max; CPU: process CPU time per run (median).");
    t.print();
}
