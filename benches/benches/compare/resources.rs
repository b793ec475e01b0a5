//! Scenario 9 (`resources`): a bucket per resource, by the hundred
//! thousand — what an idle one costs in memory and tasks.
//!
//! Each subject holds `set.idle` resources (100 000; 10 000 quick), each
//! used once (one permit taken, at a rate slow enough that none is swept
//! while measured), then idle. Bytes each: the resident-memory growth over
//! the count, the heap trimmed before and after filling. Tasks: the
//! runtime's alive tasks once they are idle.

use std::time::Duration;

use governor::{DefaultKeyedRateLimiter, Quota};
use tokio::runtime::Runtime;
use tokio_ratelimit::keyed::{Keyed, KeyedFunnel};
use tokio_ratelimit::{Funnel, LeakyBucket, Rate, TokenBucket};
use tokio_ratelimit_benches::{Table, ratio_line, rss_bytes, trim_heap};

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
    let token_keyed = row(
        "Keyed<u64, TokenBucket>",
        measure(rt, n, || {
            let map: Keyed<u64, TokenBucket> = Keyed::builder()
                .limiter(|| TokenBucket::builder().rate(slow()).capacity(10).build())
                .build()
                .unwrap();
            for k in 0..keys {
                assert!(map.try_acquire(&k).is_ok());
            }
            map
        }),
    );
    let leaky_keyed = row(
        "Keyed<u64, LeakyBucket>",
        measure(rt, n, || {
            let map: Keyed<u64, LeakyBucket> = Keyed::builder()
                .limiter(|| LeakyBucket::builder().rate(slow()).capacity(10).build())
                .build()
                .unwrap();
            for k in 0..keys {
                assert!(map.try_acquire(&k).is_ok());
            }
            map
        }),
    );
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
    let token = row(
        "TokenBucket (standalone)",
        measure(rt, n, || {
            (0..n)
                .map(|_| {
                    let b = TokenBucket::builder()
                        .rate(slow())
                        .capacity(10)
                        .build()
                        .unwrap();
                    assert!(b.try_acquire().is_ok());
                    b
                })
                .collect::<Vec<_>>()
        }),
    );
    let leaky = row(
        "LeakyBucket (standalone)",
        measure(rt, n, || {
            (0..n)
                .map(|_| {
                    let b = LeakyBucket::builder()
                        .rate(slow())
                        .capacity(10)
                        .build()
                        .unwrap();
                    assert!(b.try_acquire().is_ok());
                    b
                })
                .collect::<Vec<_>>()
        }),
    );
    row(
        "Funnel (standalone)",
        measure(rt, n, || {
            (0..n)
                .map(|_| {
                    let f = Funnel::builder().rate(slow()).capacity(10).build().unwrap();
                    assert!(f.try_acquire().is_ok());
                    f
                })
                .collect::<Vec<_>>()
        }),
    );
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
}
