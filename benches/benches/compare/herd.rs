//! Scenario 4 (`herd`): 10 000 waiters on one limiter.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tokio::runtime::Runtime;
use tokio::task::JoinHandle;
use tokio_ratelimit_benches::{Table, cpu_time, ratio_line};

use crate::peers::{Kind, Spec, Subject, WAIT_KINDS, build_wait};
use crate::settings::Settings;

struct Herd {
    cpu_per_sec: f64,
    spread: u64,
    achieved: f64,
}

/// `tasks` tasks loop on `acquire()`; after a settling half second, CPU
/// time and per-task grants are measured over `run`.
async fn herd(subject: Option<Subject>, tasks: usize, rate: f64, run: Duration) -> Herd {
    let subject = subject.map(Arc::new);
    let counts: Arc<Vec<AtomicU64>> = Arc::new((0..tasks).map(|_| AtomicU64::new(0)).collect());
    let handles: Vec<JoinHandle<()>> = match &subject {
        None => Vec::new(),
        Some(subject) => (0..tasks)
            .map(|i| {
                let subject = Arc::clone(subject);
                let counts = Arc::clone(&counts);
                tokio::spawn(async move {
                    loop {
                        if subject.acquire().await {
                            counts[i].fetch_add(1, Ordering::Relaxed);
                        } else {
                            tokio::time::sleep(Duration::from_millis(1)).await;
                        }
                    }
                })
            })
            .collect(),
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    let snap = || -> Vec<u64> { counts.iter().map(|c| c.load(Ordering::Relaxed)).collect() };
    let (c0, cpu0, t0) = (snap(), cpu_time(), Instant::now());
    tokio::time::sleep(run).await;
    let (c1, cpu1, t1) = (snap(), cpu_time(), Instant::now());
    for h in &handles {
        h.abort();
    }
    for h in handles {
        let _ = h.await;
    }
    drop(subject);
    tokio::time::sleep(Duration::from_millis(100)).await;
    let wall = (t1 - t0).as_secs_f64();
    let deltas: Vec<u64> = c1.iter().zip(&c0).map(|(a, b)| a - b).collect();
    let spread = deltas.iter().max().unwrap_or(&0) - deltas.iter().min().unwrap_or(&0);
    #[expect(
        clippy::cast_precision_loss,
        reason = "counts and nanoseconds, far below 2^53"
    )]
    let achieved = deltas.iter().sum::<u64>() as f64 / wall / rate;
    Herd {
        cpu_per_sec: (cpu1 - cpu0).as_secs_f64() / wall,
        spread,
        achieved,
    }
}

pub(crate) fn waiters(rt: &Runtime, set: &Settings) {
    let tasks = set.herd;
    let rate = 1_000;
    let mut t = Table::new(
        format!(
            "4. {tasks} tasks waiting on one limiter at {rate}/s, capacity 1 ({:.0} s after 0.5 s settling, one run each)",
            set.run.as_secs_f64()
        ),
        &[
            "limiter",
            "CPU s per s",
            "max − min grants/task",
            "achieved/configured",
        ],
    );
    let base = rt.block_on(herd(None, 0, 1.0, set.run));
    t.row(vec![
        "(idle runtime, no limiter)".into(),
        format!("{:.4}", base.cpu_per_sec),
        "—".into(),
        "—".into(),
    ]);
    let mut cpu = Vec::new();
    let mut spreads = Vec::new();
    for kind in WAIT_KINDS.into_iter().filter(|k| k.selected(set)) {
        let cap = if kind == Kind::Shaper {
            u32::try_from(tasks).unwrap() + 1
        } else {
            1
        };
        let spec = Spec::per_second(rate, cap);
        let h = rt.block_on(async {
            herd(Some(build_wait(kind, spec)), tasks, spec.per_sec(), set.run).await
        });
        t.row(vec![
            kind.name().to_string(),
            format!("{:.4}", h.cpu_per_sec),
            h.spread.to_string(),
            format!("{:.4}", h.achieved),
        ]);
        cpu.push((kind, h.cpu_per_sec));
        spreads.push((kind, h.spread));
    }
    t.note(format!(
        "The shaper gets capacity {} so that every waiter fits in its queue. CPU: getrusage, whole process.",
        tasks + 1
    ));
    let gov_cpu = cpu
        .iter()
        .find(|(k, _)| *k == Kind::Governor)
        .map_or(f64::NAN, |c| c.1);
    for (&(k, c), &(_, spread)) in cpu.iter().zip(&spreads) {
        if !k.is_crate_waiter() {
            continue;
        }
        t.note(ratio_line(
            &format!("{} CPU s per s", k.name()),
            c,
            "≤",
            0.05,
        ));
        t.note(ratio_line(
            &format!("governor CPU / {} CPU", k.name()),
            gov_cpu / c.max(1e-6),
            "≥",
            30.0,
        ));
        #[expect(
            clippy::cast_precision_loss,
            reason = "counts and nanoseconds, far below 2^53"
        )]
        t.note(ratio_line(
            &format!("{} max − min grants per task", k.name()),
            spread as f64,
            "≤",
            1.0,
        ));
    }
    t.print();
}
