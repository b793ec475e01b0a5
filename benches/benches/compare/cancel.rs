//! Scenario 6 (`cancel`): cancellation.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::runtime::Runtime;
use tokio::task::JoinHandle;
use tokio_ratelimit_benches::{Table, ratio_line};

use crate::harness::ms;
use crate::peers::{Kind, Spec, WAIT_KINDS, build_wait};
use crate::settings::Settings;

struct Cancel {
    before: f64,
    after: f64,
    max_gap: f64,
}

/// `tasks` tasks loop on `acquire()`; at 1 s every other one is aborted
/// (dropped while it waits); the survivors run until `1 s + run`.
async fn cancel(kind: Kind, spec: Spec, tasks: usize, run: Duration) -> Cancel {
    let subject = Arc::new(build_wait(kind, spec));
    let log = Arc::new(Mutex::new(Vec::<Instant>::with_capacity(16_384)));
    let start = Instant::now();
    let handles: Vec<JoinHandle<()>> = (0..tasks)
        .map(|_| {
            let subject = Arc::clone(&subject);
            let log = Arc::clone(&log);
            tokio::spawn(async move {
                loop {
                    if subject.acquire().await {
                        log.lock().unwrap().push(Instant::now());
                    } else {
                        tokio::time::sleep(Duration::from_millis(1)).await;
                    }
                }
            })
        })
        .collect();
    let cut = start + Duration::from_secs(1);
    tokio::time::sleep_until(cut.into()).await;
    let cut = Instant::now();
    for h in handles.iter().step_by(2) {
        h.abort();
    }
    let end = cut + run;
    tokio::time::sleep_until(end.into()).await;
    for h in &handles {
        h.abort();
    }
    for h in handles {
        let _ = h.await;
    }
    drop(subject);
    let mut log = std::mem::take(&mut *log.lock().unwrap());
    log.sort();
    let rate = spec.per_sec();
    let window = |a: Instant, b: Instant| {
        let n = log.iter().filter(|&&t| t > a && t <= b).count();
        #[expect(
            clippy::cast_precision_loss,
            reason = "counts and nanoseconds, far below 2^53"
        )]
        let r = n as f64 / (b - a).as_secs_f64() / rate;
        r
    };
    let before = window(start + Duration::from_millis(200), cut);
    let after = window(cut, end);
    let mut max_gap = 0.0f64;
    let mut prev = cut;
    for &t in log.iter().filter(|&&t| t > cut && t <= end) {
        max_gap = max_gap.max((t - prev).as_secs_f64());
        prev = t;
    }
    Cancel {
        before,
        after,
        max_gap,
    }
}

pub(crate) fn cancellation(rt: &Runtime, set: &Settings) {
    const TASKS: usize = 1_000;
    let rate = 1_000;
    let mut t = Table::new(
        format!(
            "6. Cancellation: {TASKS} waiters at {rate}/s, capacity 1; every other one dropped mid-wait at 1 s; survivors measured for {:.0} s",
            set.run.as_secs_f64()
        ),
        &[
            "limiter",
            "achieved/configured before",
            "achieved/configured after",
            "longest gap after ms",
        ],
    );
    let mut after = Vec::new();
    for kind in WAIT_KINDS.into_iter().filter(|k| k.selected(set)) {
        let cap = if kind == Kind::Shaper {
            TASKS as u32 + 1
        } else {
            1
        };
        let c = rt.block_on(cancel(kind, Spec::per_second(rate, cap), TASKS, set.run));
        t.row(vec![
            kind.name().to_string(),
            format!("{:.4}", c.before),
            format!("{:.4}", c.after),
            ms(c.max_gap),
        ]);
        after.push((kind, c.after));
    }
    t.note(
        "before: grants in [0.2 s, 1 s]; after: grants from the drop to the end, over that time \
         (the drop's aftermath included). The shaper gets capacity 1001.",
    );
    for (k, a) in after {
        if k.is_crate_waiter() {
            t.note(ratio_line(
                &format!("{} achieved/configured after the drop", k.name()),
                a,
                "≥",
                0.999,
            ));
        }
    }
    t.print();
}
