//! Scenario 5 (`memory`): many keys, many idle limiters.

use std::hint::black_box;
use std::time::{Duration, Instant};

use governor::{DefaultKeyedRateLimiter, Quota};
use tokio::runtime::Runtime;
use tokio_ratelimit::keyed::KeyedFunnel;
use tokio_ratelimit::{Funnel, Rate, SmoothBursty, TokenBucket};
use tokio_ratelimit_benches::{Table, cpu_time, median, ratio_line, rss_bytes, trim_heap};

use crate::harness::{ns_per, time_loop, two_thread_loop};
use crate::peers::{Spec, nz};
use crate::settings::Settings;

/// ns per call for a hot key and for a random key among `keys`: medians.
/// Keyed checks: ns per call for a hot key and a random key, on one thread
/// and per thread with two.
struct KeyedTimes {
    hot: f64,
    random: f64,
    hot2: f64,
    random2: f64,
}

fn keyed_checks(check: impl Fn(u64) -> bool + Sync, keys: u64, set: &Settings) -> KeyedTimes {
    const HOT: u64 = 42;
    let mut hot = Vec::new();
    let mut random = Vec::new();
    let mut hot2 = Vec::new();
    let mut random2 = Vec::new();
    let n = set.calls / 2;
    for _ in 0..set.reps {
        hot2.push(ns_per(
            two_thread_loop(n / 2, || {
                black_box(check(HOT));
            }),
            n / 2,
        ));
        random2.push(ns_per(
            two_thread_loop(n / 2, || {
                // Each thread its own xorshift64 sequence.
                thread_local! {
                    static RNG: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
                }
                let x = RNG.with(|rng| {
                    let mut x = rng.get();
                    if x == 0 {
                        x = (std::ptr::addr_of!(rng) as u64) | 1;
                    }
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    rng.set(x);
                    x
                });
                black_box(check(x % keys));
            }),
            n / 2,
        ));
        hot.push(ns_per(time_loop(n, || check(HOT)).0, n));
        let rng = std::cell::Cell::new(0x9E37_79B9_7F4A_7C15u64);
        let d = time_loop(n, || {
            // xorshift64: a couple of ns, counted in the figure.
            let mut x = rng.get();
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            rng.set(x);
            check(x % keys)
        })
        .0;
        random.push(ns_per(d, n));
    }
    KeyedTimes {
        hot: median(&hot),
        random: median(&random),
        hot2: median(&hot2),
        random2: median(&random2),
    }
}

pub(crate) fn memory(rt: &Runtime, set: &Settings) {
    let mut t = Table::new(
        format!(
            "5. Many keys and many idle limiters (ns: median of {} × {} checks)",
            set.reps,
            set.calls / 2
        ),
        &[
            "subject",
            "bytes each",
            "ns/check hot key (1 / 2 threads)",
            "ns/check random key (1 / 2 threads)",
            "idle CPU s per s",
        ],
    );
    // KeyedFunnel: 1 M distinct u64 keys, the same quota as governor's: a
    // slow rate, so that every key keeps water (KeyedFunnel drops drained
    // keys, which would make its memory figure meaningless). Then the same
    // with a second band (as slow, as deep: one 128-bit word per key).
    let mut keyed_funnel = |name: &str, quota: tokio_ratelimit::Quota| {
        trim_heap();
        let before = rss_bytes();
        let limiter: KeyedFunnel<u64> = KeyedFunnel::builder().quota(quota).build().unwrap();
        for k in 0..set.keys {
            assert!(limiter.try_acquire(&k).is_ok());
        }
        // Live memory: the tables freed while the map grew go back first.
        trim_heap();
        let after = rss_bytes();
        #[expect(
            clippy::cast_precision_loss,
            reason = "counts and nanoseconds, far below 2^53"
        )]
        let bytes = (after.saturating_sub(before)) as f64 / set.keys as f64;
        let times = keyed_checks(|k| limiter.try_acquire(&k).is_ok(), set.keys, set);
        t.row(vec![
            format!("{name}, {} keys", set.keys),
            format!("{bytes:.1}"),
            format!("{:.1} / {:.1}", times.hot, times.hot2),
            format!("{:.1} / {:.1}", times.random, times.random2),
            "—".into(),
        ]);
        drop(limiter);
        (bytes, times)
    };
    let one_band = tokio_ratelimit::Quota::new(Rate::per_second(1), 10_000_000);
    let ours = keyed_funnel("KeyedFunnel", one_band);
    let two = keyed_funnel(
        "KeyedFunnel, 2 bands",
        one_band.and(Rate::per_hour(1_800), 10_000_000),
    );
    // governor keyed: 1 M distinct u64 keys.
    let theirs = {
        trim_heap();
        let before = rss_bytes();
        let limiter: DefaultKeyedRateLimiter<u64> =
            governor::RateLimiter::keyed(Quota::per_second(nz(1)).allow_burst(nz(10_000_000)));
        for k in 0..set.keys {
            assert!(limiter.check_key(&k).is_ok());
        }
        trim_heap();
        let after = rss_bytes();
        #[expect(
            clippy::cast_precision_loss,
            reason = "counts and nanoseconds, far below 2^53"
        )]
        let bytes = (after.saturating_sub(before)) as f64 / set.keys as f64;
        let times = keyed_checks(|k| limiter.check_key(&k).is_ok(), set.keys, set);
        t.row(vec![
            format!("governor keyed (dashmap), {} keys", set.keys),
            format!("{bytes:.1}"),
            format!("{:.1} / {:.1}", times.hot, times.hot2),
            format!("{:.1} / {:.1}", times.random, times.random2),
            "—".into(),
        ]);
        drop(limiter);
        (bytes, times)
    };
    // A flood of one-shot keys against max_keys, with a legitimate client
    // using its own key throughout: memory stays bounded, and the client
    // keeps its exact limit (it never gets more than capacity + rate × T).
    let flood_note = {
        let flood = set.keys * 10;
        let max_keys = usize::try_from(set.keys / 10).unwrap_or(usize::MAX);
        let rate = Rate::per_second(10);
        trim_heap();
        let before = rss_bytes();
        let limiter: KeyedFunnel<u64> = KeyedFunnel::builder()
            .rate(rate)
            .capacity(3)
            .max_keys(max_keys)
            .build()
            .unwrap();
        let legit = u64::MAX;
        let start = Instant::now();
        let (mut admitted, mut legit_granted) = (0u64, 0u64);
        for k in 0..flood {
            admitted += u64::from(limiter.try_acquire(&k).is_ok());
            if k % 1000 == 0 {
                legit_granted += u64::from(limiter.try_acquire(&legit).is_ok());
            }
        }
        let elapsed = start.elapsed().as_secs_f64();
        let peak = rss_bytes();
        let stats = limiter.stats();
        // The client asks every 1000 flood keys, far more often than its
        // 10/s: it should get its whole allowance, and never more.
        let allowance = 3.0 + 10.0 * elapsed;
        drop(limiter);
        #[expect(
            clippy::cast_precision_loss,
            reason = "counts and nanoseconds, far below 2^53"
        )]
        let mb = peak.saturating_sub(before) as f64 / 1e6;
        t.row(vec![
            format!("KeyedFunnel flood: {flood} one-shot keys, max_keys {max_keys}"),
            format!("{mb:.1} MB in all"),
            "—".into(),
            "—".into(),
            "—".into(),
        ]);
        #[expect(
            clippy::cast_precision_loss,
            reason = "counts and nanoseconds, far below 2^53"
        )]
        let ok =
            (legit_granted as f64) <= allowance + 1e-9 && (legit_granted as f64) >= allowance - 2.0;
        format!(
            "- flood: {admitted} flood keys admitted, {} refused, {} keys held at the end (≤ {max_keys}); \
             the legitimate key got {legit_granted} of its allowance 3 + 10/s × {elapsed:.2} s = {allowance:.1}: {}",
            stats.refused,
            stats.keys,
            if ok { "exact" } else { "MISSED" }
        )
    };
    let keyed_notes = [
        ratio_line(
            "KeyedFunnel bytes per key / governor keyed",
            ours.0 / theirs.0,
            "≤",
            1.0,
        ),
        ratio_line(
            "KeyedFunnel 2 bands bytes per key / 1 band",
            two.0 / ours.0,
            "≤",
            2.0,
        ),
        ratio_line(
            "KeyedFunnel 2 bands hot key / 1 band",
            two.1.hot / ours.1.hot,
            "≤",
            2.0,
        ),
        ratio_line(
            "KeyedFunnel 2 bands random key / 1 band",
            two.1.random / ours.1.random,
            "≤",
            2.0,
        ),
        ratio_line(
            "KeyedFunnel hot key / governor keyed",
            ours.1.hot / theirs.1.hot,
            "≤",
            1.0,
        ),
        ratio_line(
            "KeyedFunnel random key / governor keyed",
            ours.1.random / theirs.1.random,
            "≤",
            1.0,
        ),
        ratio_line(
            "KeyedFunnel hot key, 2 threads / governor keyed",
            ours.1.hot2 / theirs.1.hot2,
            "≤",
            1.0,
        ),
        ratio_line(
            "KeyedFunnel random key, 2 threads / governor keyed",
            ours.1.random2 / theirs.1.random2,
            "≤",
            1.0,
        ),
    ];
    // Idle limiters: built, used once (one permit taken), then left alone.
    let idle = set.idle;
    let mut idle_row = |name: &str, make: &dyn Fn() -> Box<dyn std::any::Any + Send>| {
        trim_heap();
        let before = rss_bytes();
        let all: Vec<Box<dyn std::any::Any + Send>> = {
            let _guard = rt.enter();
            (0..idle).map(|_| make()).collect()
        };
        // Let any actors park.
        rt.block_on(async { tokio::time::sleep(Duration::from_millis(200)).await });
        let after = rss_bytes();
        let (cpu0, t0) = (cpu_time(), Instant::now());
        rt.block_on(async { tokio::time::sleep(Duration::from_secs(2)).await });
        let cpu = (cpu_time() - cpu0).as_secs_f64() / t0.elapsed().as_secs_f64();
        drop(all);
        rt.block_on(async { tokio::time::sleep(Duration::from_millis(200)).await });
        #[expect(
            clippy::cast_precision_loss,
            reason = "counts and nanoseconds, far below 2^53"
        )]
        let bytes = after.saturating_sub(before) as f64 / idle as f64;
        t.row(vec![
            format!("{idle} idle {name}"),
            format!("{bytes:.0}"),
            "—".into(),
            "—".into(),
            format!("{cpu:.4}"),
        ]);
        cpu
    };
    let spec = Spec::per_second(100, 10);
    let token_cpu = idle_row("TokenBucket", &|| {
        let b = TokenBucket::builder()
            .rate(spec.rate())
            .capacity(spec.capacity)
            .build()
            .unwrap();
        assert!(b.try_acquire().is_ok());
        Box::new(b)
    });
    idle_row("Funnel", &|| {
        let f = Funnel::builder()
            .rate(spec.rate())
            .capacity(spec.capacity)
            .build()
            .unwrap();
        assert!(f.try_acquire().is_ok());
        Box::new(f)
    });
    idle_row("SmoothBursty", &|| {
        let l = SmoothBursty::builder()
            .permits_per_second(spec.per_sec())
            .build()
            .unwrap();
        assert!(l.try_acquire().is_ok());
        Box::new(l)
    });
    idle_row("governor direct", &|| {
        let g = governor::RateLimiter::direct(spec.quota());
        assert!(g.check().is_ok());
        Box::new(g)
    });
    t.note(
        "bytes: resident-memory delta (/proc/self/statm, heap trimmed before and, for the keyed maps, after filling) over the count. \
         Keyed: 1/s, burst 10⁷ (every check allowed, and every key stays active, so nothing is evicted); random keys by xorshift64 (included). \
         Idle limiters: 100/s, capacity 10, one permit taken, then 2 s idle, each boxed as `dyn Any` \
         (a bucket holds no task while nobody waits; see scenario 9 for the per-resource figures).",
    );
    for note in keyed_notes {
        t.note(note);
    }
    t.note(flood_note);
    t.note(ratio_line(
        "idle TokenBuckets, CPU s per s (an idle limiter costs no CPU)",
        token_cpu,
        "≤",
        0.001,
    ));
    t.print();
}
