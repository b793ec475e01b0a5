//! A fixed workload for `valgrind --tool=callgrind`, which counts
//! instructions — reproducible on a noisy machine, unlike timings:
//!
//! ```text
//! cargo build --release -p tokio-ratelimit-benches --example callgrind_try
//! valgrind --tool=callgrind --callgrind-out-file=cg.out \
//!     target/release/examples/callgrind_try token allowed 1000000
//! callgrind_annotate cg.out | head -40
//! ```
//!
//! Arguments: `token|token2|funnel|bursty|governor|keyed|keyed2|governor_keyed|semaphore|clock`,
//! `allowed|denied`, and a call count. `keyed` and `governor_keyed` check one
//! hot `u64` key of a map that holds 1 000 keys (the default hashers; the
//! quota of the `memory` benchmark: 1/s, burst 10⁷). Subtract a run with a
//! count of 0 to remove the set-up, then divide by the count for
//! instructions per call.

use std::hint::black_box;
use std::num::NonZeroU32;
use std::time::{Duration, Instant};

use governor::{Quota, RateLimiter};
use tokio::sync::Semaphore;
use tokio_ratelimit::keyed::KeyedFunnel;
use tokio_ratelimit::{Funnel, Rate, SmoothBursty, TokenBucket};

fn main() {
    let mut args = std::env::args().skip(1);
    let which = args.next().unwrap_or_else(|| "token".into());
    let case = args.next().unwrap_or_else(|| "allowed".into());
    let n: u64 = args
        .next()
        .map_or(1_000_000, |s| s.parse().expect("a count"));
    let allowed = case == "allowed";
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let _guard = rt.enter();
    let (rate, capacity) = if allowed {
        (Rate::per_second(1_000_000_000), 1_000_000)
    } else {
        (Rate::per_hour(1), 1)
    };
    let mut ok = 0u64;
    match which.as_str() {
        "token" => {
            let b = TokenBucket::builder()
                .rate(rate)
                .capacity(capacity)
                .build()
                .unwrap();
            if !allowed {
                b.try_acquire().unwrap();
            }
            for _ in 0..n {
                ok += u64::from(b.try_acquire().is_ok());
            }
        }
        "token2" => {
            // Two bands: the one of `token`, and a day's band that always has
            // room.
            let quota = tokio_ratelimit::Quota::new(rate, capacity)
                .and(Rate::per_day(4_000_000_000), 4_000_000_000);
            let b = TokenBucket::builder().quota(quota).build().unwrap();
            if !allowed {
                b.try_acquire().unwrap();
            }
            for _ in 0..n {
                ok += u64::from(b.try_acquire().is_ok());
            }
        }
        "funnel" => {
            let f = Funnel::builder()
                .rate(rate)
                .capacity(capacity)
                .build()
                .unwrap();
            if !allowed {
                f.try_acquire().unwrap();
            }
            for _ in 0..n {
                ok += u64::from(f.try_acquire().is_ok());
            }
        }
        "bursty" => {
            // As the `try` scenario: 10⁹/s (denied: 1/hour), one permit a call.
            let rate = if allowed { 1e9 } else { 1.0 / 3600.0 };
            let b = SmoothBursty::builder()
                .permits_per_second(rate)
                .build()
                .unwrap();
            if !allowed {
                b.try_acquire().unwrap();
            }
            for _ in 0..n {
                ok += u64::from(b.try_acquire().is_ok());
            }
        }
        "governor" => {
            let quota = if allowed {
                Quota::with_period(Duration::from_nanos(1))
                    .unwrap()
                    .allow_burst(NonZeroU32::new(1_000_000).unwrap())
            } else {
                Quota::per_hour(NonZeroU32::new(1).unwrap())
            };
            let g = RateLimiter::direct(quota);
            if !allowed {
                g.check().unwrap();
            }
            for _ in 0..n {
                ok += u64::from(g.check().is_ok());
            }
        }
        "keyed" => {
            let k: KeyedFunnel<u64> = KeyedFunnel::builder()
                .rate(if allowed {
                    Rate::per_second(1)
                } else {
                    Rate::per_hour(1)
                })
                .capacity(if allowed { 10_000_000 } else { 1 })
                .build()
                .unwrap();
            for key in 0..1000u64 {
                k.try_acquire(&key).unwrap();
            }
            for _ in 0..n {
                ok += u64::from(k.try_acquire(black_box(&42)).is_ok());
            }
        }
        "keyed2" => {
            // `keyed` with a second band that never binds (a pair word).
            let quota = if allowed {
                tokio_ratelimit::Quota::new(Rate::per_second(1), 10_000_000)
                    .and(Rate::per_second(2), 20_000_000)
            } else {
                tokio_ratelimit::Quota::new(Rate::per_hour(1), 1).and(Rate::per_second(2), 2)
            };
            let k: KeyedFunnel<u64> = KeyedFunnel::builder().quota(quota).build().unwrap();
            for key in 0..1000u64 {
                k.try_acquire(&key).unwrap();
            }
            for _ in 0..n {
                ok += u64::from(k.try_acquire(black_box(&42)).is_ok());
            }
        }
        "governor_keyed" => {
            let quota = if allowed {
                Quota::per_second(NonZeroU32::new(1).unwrap())
                    .allow_burst(NonZeroU32::new(10_000_000).unwrap())
            } else {
                Quota::per_hour(NonZeroU32::new(1).unwrap())
            };
            let g = RateLimiter::keyed(quota);
            for key in 0..1000u64 {
                g.check_key(&key).unwrap();
            }
            for _ in 0..n {
                ok += u64::from(g.check_key(black_box(&42)).is_ok());
            }
        }
        "semaphore" => {
            let s = Semaphore::new(if allowed { Semaphore::MAX_PERMITS } else { 0 });
            for _ in 0..n {
                ok += u64::from(s.try_acquire().map(|p| p.forget()).is_ok());
            }
        }
        "clock" => {
            for _ in 0..n {
                black_box(Instant::now());
                ok += 1;
            }
        }
        other => panic!("unknown limiter {other}"),
    }
    println!("{which} {case}: {ok} of {n} allowed");
}
