//! A fixed waiting workload for `valgrind --tool=callgrind`: 2 000 tasks
//! loop on `acquire()` of one limiter at 1 000/s, in paused time (so the
//! count does not depend on the machine's timers). Instructions counted are
//! reproducible, unlike the `herd` benchmark's CPU time:
//!
//! ```text
//! cargo build --release --example callgrind_wait
//! for s in 1 3; do valgrind --tool=callgrind --callgrind-out-file=cg.$s \
//!     target/release/examples/callgrind_wait token $s; done
//! ```
//!
//! Arguments: `token|shaper|funnel|smooth` and the virtual seconds to run.
//! The difference between the 3 s and the 1 s run, divided by the 2 000
//! grants between them, is the cost of one grant to a waiter (set-up
//! excluded; the process exits without dropping the waiters).
//!
//! With a third argument `first`, one task instead waits at an idle
//! limiter, again and again: it empties it, waits for one permit (1 ms),
//! then leaves it idle for 10 ms. Each second is 90 such waits, each the
//! first at an idle bucket — where the bucket's actor is started and ends.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio_ratelimit::{Funnel, LeakyBucket, Limiter, Rate, SmoothBursty, TokenBucket};

fn main() {
    let mut args = std::env::args().skip(1);
    let kind = args.next().unwrap_or_else(|| "token".into());
    let secs: u64 = args.next().map_or(1, |s| s.parse().expect("seconds"));
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .expect("a runtime");
    runtime.block_on(async move {
        let rate = Rate::per_second(1000);
        let limiter: Arc<dyn Limiter> = match kind.as_str() {
            "token" => Arc::new(
                TokenBucket::builder()
                    .rate(rate)
                    .capacity(1)
                    .build()
                    .unwrap(),
            ),
            "shaper" => Arc::new(
                LeakyBucket::builder()
                    .rate(rate)
                    .capacity(2001)
                    .build()
                    .unwrap(),
            ),
            "funnel" => Arc::new(Funnel::builder().rate(rate).capacity(1).build().unwrap()),
            "smooth" => Arc::new(
                SmoothBursty::builder()
                    .permits_per_second(1000.0)
                    .max_burst(Duration::ZERO)
                    .build()
                    .unwrap(),
            ),
            other => panic!("unknown limiter {other}: token, shaper, funnel or smooth"),
        };
        let grants = Arc::new(AtomicU64::new(0));
        if args.next().as_deref() == Some("first") {
            for _ in 0..secs * 90 {
                while limiter.try_acquire().is_ok() {}
                limiter.acquire().await.unwrap();
                grants.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            println!("{kind}: {} first waits", grants.load(Ordering::Relaxed));
            std::process::exit(0);
        }
        for _ in 0..2000 {
            let (limiter, grants) = (limiter.clone(), grants.clone());
            tokio::spawn(async move {
                loop {
                    limiter.acquire().await.unwrap();
                    grants.fetch_add(1, Ordering::Relaxed);
                }
            });
        }
        tokio::time::sleep(Duration::from_secs(secs)).await;
        println!("{kind}: {} grants", grants.load(Ordering::Relaxed));
        // Exit without dropping 2 000 waiters: their withdrawal is not the
        // figure measured.
        std::process::exit(0);
    });
}
