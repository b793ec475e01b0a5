//! Scenario 3 (`pacing`): pacing in real time.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use tokio::runtime::Runtime;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_ratelimit_benches::{Table, cpu_time, median, quantile};

use crate::harness::ms;
use crate::peers::{Kind, Spec, WAIT_KINDS, build_wait, burst};
use crate::settings::Settings;

/// One pacing run.
struct Pacing {
    grants: usize,
    achieved: f64,
    /// Steady state: p50, p99, max lateness (s).
    late: [f64; 3],
    /// From the start signal: p99 lateness and the most early grant (s).
    from_start: [f64; 2],
    /// Process CPU seconds per second during the run.
    cpu: f64,
    /// The machine's own scheduling delay meanwhile, p99 and max (s): see
    /// [`NoiseProbe`].
    noise: [f64; 2],
    refused: u64,
    stalled: usize,
}

/// Grants before this offset from the start are warm-up: not scored in the
/// steady state (100 tasks waking up and the initial burst).
fn warm_up(run: Duration) -> Duration {
    (run / 4).min(Duration::from_millis(250))
}

/// Measures how late the OS wakes a plain thread that sleeps 1 ms, while a
/// run goes on: on a shared machine, a delay of several milliseconds means
/// the whole process was not running, whatever the limiter did.
struct NoiseProbe {
    stop: Arc<std::sync::atomic::AtomicBool>,
    thread: std::thread::JoinHandle<Vec<f64>>,
}

impl NoiseProbe {
    fn start() -> NoiseProbe {
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let thread = std::thread::spawn(move || {
            let mut delays = Vec::with_capacity(8192);
            while !flag.load(Ordering::Relaxed) {
                let t = Instant::now();
                std::thread::sleep(Duration::from_millis(1));
                delays.push((t.elapsed() - Duration::from_millis(1)).as_secs_f64());
            }
            delays
        });
        NoiseProbe { stop, thread }
    }

    /// The p99 and the max of the extra delay (s).
    fn finish(self) -> [f64; 2] {
        self.stop.store(true, Ordering::Relaxed);
        let mut d = self.thread.join().unwrap();
        d.sort_by(f64::total_cmp);
        if d.is_empty() {
            [0.0; 2]
        } else {
            [quantile(&d, 0.99), d[d.len() - 1]]
        }
    }
}

/// `tasks` tasks loop on `acquire()` for `run`; every grant is timestamped
/// by its task as soon as `acquire()` returns.
///
/// Steady state (the scored figures): the grants after the warm-up, in time
/// order, are numbered k = 0, 1, …, at times t_k. Grant k's ideal time is
/// s + k / rate, where s = min_k (t_k − k / rate) is the latest start of a
/// schedule at the configured rate that no grant precedes; lateness is
/// t_k − (s + k / rate) ≥ 0. A limiter that delivers exactly the rate,
/// woken on tokio's 1 ms ticks, shows lateness in [0, 1 ms] plus its wake-up
/// latency; one that falls behind shows lateness growing over the run.
/// Achieved rate = M / (run − warm-up) over the M scored grants.
///
/// From the start (reported beside it): grants counted from the start
/// signal, grant k's ideal time is `start` for k < B and
/// `start + (k + 1 − B) / rate` after, B being the initial burst (the
/// capacity; 1 for the shaper). This also charges the limiter with the
/// time the 100 tasks take to arrive, and shows over-admission as early
/// grants.
async fn pace(kind: Kind, spec: Spec, tasks: usize, run: Duration) -> Pacing {
    let subject = Arc::new(build_wait(kind, spec));
    let (tx, rx) = watch::channel(None::<Instant>);
    let handles: Vec<JoinHandle<(Vec<Instant>, u64)>> = (0..tasks)
        .map(|_| {
            let subject = Arc::clone(&subject);
            let mut rx = rx.clone();
            tokio::spawn(async move {
                let start = rx.wait_for(Option::is_some).await.unwrap().unwrap();
                let deadline = start + run;
                let mut times = Vec::with_capacity(8192);
                let mut refused = 0;
                loop {
                    if subject.acquire().await {
                        let now = Instant::now();
                        if now > deadline {
                            break;
                        }
                        times.push(now);
                    } else {
                        refused += 1;
                        tokio::time::sleep(Duration::from_millis(1)).await;
                        if Instant::now() > deadline {
                            break;
                        }
                    }
                }
                (times, refused)
            })
        })
        .collect();
    // Let every task park on the start signal.
    tokio::time::sleep(Duration::from_millis(50)).await;
    let probe = NoiseProbe::start();
    let cpu0 = cpu_time();
    let start = Instant::now();
    tx.send(Some(start)).unwrap();
    let mut times = Vec::new();
    let mut refused = 0;
    let mut stalled = 0;
    let give_up = tokio::time::Instant::from_std(start + run + Duration::from_secs(5));
    for mut h in handles {
        match tokio::time::timeout_at(give_up, &mut h).await {
            Ok(Ok((t, r))) => {
                times.extend(t);
                refused += r;
            }
            _ => {
                h.abort();
                stalled += 1;
            }
        }
    }
    let cpu = (cpu_time() - cpu0).as_secs_f64() / start.elapsed().as_secs_f64();
    let noise = probe.finish();
    drop(subject);
    let mut offsets: Vec<f64> = times
        .iter()
        .map(|t| t.duration_since(start).as_secs_f64())
        .collect();
    offsets.sort_by(f64::total_cmp);
    let rate = spec.per_sec();
    #[expect(
        clippy::cast_precision_loss,
        reason = "counts and nanoseconds, far below 2^53"
    )]
    let ideal = |k: usize| k as f64 / rate;

    // From the start signal, with the initial burst.
    let b = burst(kind, spec.capacity) as usize;
    let mut from_start: Vec<f64> = offsets
        .iter()
        .enumerate()
        .map(|(k, &t)| t - ideal((k + 1).saturating_sub(b)))
        .collect();
    from_start.sort_by(f64::total_cmp);

    // Steady state.
    let scored: Vec<f64> = offsets
        .iter()
        .copied()
        .filter(|&t| t >= warm_up(run).as_secs_f64())
        .collect();
    let s = scored
        .iter()
        .enumerate()
        .map(|(k, &t)| t - ideal(k))
        .fold(f64::INFINITY, f64::min);
    let mut late: Vec<f64> = scored
        .iter()
        .enumerate()
        .map(|(k, &t)| t - s - ideal(k))
        .collect();
    late.sort_by(f64::total_cmp);
    // Over the fixed window [warm-up, end]: grants per tick batch cut at
    // either end cancel out on average (counting from the first grant's
    // own time would count its batch, due up to a tick earlier, for free).
    #[expect(
        clippy::cast_precision_loss,
        reason = "counts and nanoseconds, far below 2^53"
    )]
    let achieved = scored.len() as f64 / (run - warm_up(run)).as_secs_f64() / rate;
    Pacing {
        grants: offsets.len(),
        achieved,
        late: if late.is_empty() {
            [f64::NAN; 3]
        } else {
            [
                quantile(&late, 0.5),
                quantile(&late, 0.99),
                late[late.len() - 1],
            ]
        },
        from_start: if from_start.is_empty() {
            [f64::NAN; 2]
        } else {
            [quantile(&from_start, 0.99), from_start[0].min(0.0)]
        },
        cpu,
        noise,
        refused,
        stalled,
    }
}

/// The median of one figure over several runs.
fn med(runs: &[Pacing], f: impl Fn(&Pacing) -> f64) -> f64 {
    median(&runs.iter().map(f).collect::<Vec<_>>())
}

pub(crate) fn pacing(rt: &Runtime, set: &Settings) {
    const TASKS: usize = 100;
    let mut t = Table::new(
        format!(
            "3. Pacing: {TASKS} tasks looping on acquire() for {:.0} s, 2 worker threads (median of {} runs)",
            set.pace.as_secs_f64(),
            set.rt_reps
        ),
        &[
            "limiter",
            "rate/s",
            "capacity",
            "grants",
            "achieved/configured",
            "p50 late ms",
            "p99 late ms",
            "max late ms",
            "from start: p99 late ms",
            "from start: most early ms",
            "CPU s per s",
            "machine noise p99 / max ms",
            "refused",
        ],
    );
    let mut misses = Vec::new();
    let mut checked = 0;
    for rate in [1_000u32, 100_000] {
        for capacity in [1u32, 100] {
            // The shaper's capacity bounds its queue and never bursts: give
            // it room for every task (100 waiting + 1 draining).
            let cap_of = |kind: Kind| {
                if kind == Kind::Shaper {
                    (TASKS as u32 + 1).max(capacity)
                } else {
                    capacity
                }
            };
            let kinds: Vec<Kind> = WAIT_KINDS.into_iter().filter(|k| k.selected(set)).collect();
            let mut runs: Vec<Vec<Pacing>> = kinds.iter().map(|_| Vec::new()).collect();
            // Repetitions interleave the limiters, as in scenario 1.
            for _ in 0..set.rt_reps {
                for (kind, r) in kinds.iter().zip(&mut runs) {
                    let spec = Spec::per_second(rate, cap_of(*kind));
                    r.push(rt.block_on(pace(*kind, spec, TASKS, set.pace)));
                }
            }
            for (&kind, r) in kinds.iter().zip(&runs) {
                let cap = cap_of(kind);
                let cap_label = if cap == capacity {
                    capacity.to_string()
                } else {
                    format!("{cap} (for {capacity})")
                };
                let refused: u64 = r.iter().map(|p| p.refused).sum();
                let stalled: usize = r.iter().map(|p| p.stalled).sum();
                #[expect(
                    clippy::cast_precision_loss,
                    reason = "counts and nanoseconds, far below 2^53"
                )]
                let grants = med(r, |p| p.grants as f64);
                let achieved = med(r, |p| p.achieved);
                let p99 = med(r, |p| p.late[1]);
                t.row(vec![
                    kind.name().to_string(),
                    rate.to_string(),
                    cap_label,
                    format!("{grants:.0}"),
                    format!("{achieved:.4}"),
                    ms(med(r, |p| p.late[0])),
                    ms(p99),
                    ms(med(r, |p| p.late[2])),
                    ms(med(r, |p| p.from_start[0])),
                    ms(med(r, |p| p.from_start[1])),
                    format!("{:.3}", med(r, |p| p.cpu)),
                    format!(
                        "{} / {}",
                        ms(med(r, |p| p.noise[0])),
                        ms(med(r, |p| p.noise[1]))
                    ),
                    if stalled > 0 {
                        format!("{refused} ({stalled} tasks stalled)")
                    } else {
                        refused.to_string()
                    },
                ]);
                if kind.is_crate_waiter() {
                    checked += 1;
                    if achieved < 0.999 {
                        misses.push(format!(
                            "{} {rate}/s cap {cap}: achieved {achieved:.4} < 0.999",
                            kind.name(),
                        ));
                    }
                    if p99 > 1.5e-3 {
                        misses.push(format!(
                            "{} {rate}/s cap {cap}: p99 lateness {} ms > 1.5 ms",
                            kind.name(),
                            ms(p99)
                        ));
                    }
                }
            }
        }
    }
    t.note(format!(
        "Steady state (scored): grants after a {:.2} s warm-up, numbered k = 0, 1, … in time order at t_k; \
         ideal time s + k/rate with s = min_k(t_k − k/rate), the latest schedule at the configured rate \
         that no grant precedes; lateness = t_k − ideal ≥ 0. Achieved = M/(run − warm-up)/rate over those M grants.",
        warm_up(set.pace).as_secs_f64()
    ));
    t.note(
        "From start: every grant from the start signal, ideal = start for the first B (B = capacity; \
         1 for the shaper, which never bursts), then start + (k + 1 − B)/rate; it also charges the \
         time the 100 tasks take to arrive, and shows over-admission as early grants.",
    );
    t.note(
        "The shaper's capacity bounds its queue (Overflow beyond it): it gets room for all \
         100 tasks. refused = calls that failed (each then sleeps 1 ms; total over the runs). \
         Machine noise: p99 and max of how late a plain thread wakes from a 1 ms sleep during the run \
         (a few ms: the process was not running, whatever the limiter did).",
    );
    t.note(format!(
        "- targets (crate limiters, {checked} cells): achieved ≥ 0.999 and p99 lateness ≤ 1.5 ms: {}",
        if misses.is_empty() {
            "met".to_string()
        } else {
            format!("MISSED in {} case(s)", misses.len())
        }
    ));
    for m in misses {
        t.note(format!("  - MISSED: {m}"));
    }
    t.print();
}
