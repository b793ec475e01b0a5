//! tokio-ratelimit side by side with its peers: one table per
//! scenario, with the targets printed beside the measured ratios.
//!
//! Run with `cargo bench -p tokio-ratelimit-benches` (add scenario names
//! after `--` to run only some: `calibration try threads pacing herd memory
//! resources cancel bands`). `BENCH_QUICK=1` shortens every scenario, for a smoke test.
//!
//! One module per scenario, each with its table and its targets
//! (`calibration`, `try_acquire`, `threads`, `pacing`, `herd`, `memory`,
//! `cancel`, `bands`); the limiters they compare are built in `peers`, the timed
//! loops are in `harness`, the durations and counts in `settings`.

mod bands;
mod calibration;
mod cancel;
mod harness;
mod herd;
mod memory;
mod pacing;
mod peers;
mod resources;
mod settings;
mod threads;
mod try_acquire;

use std::time::Instant;

use tokio_ratelimit_benches::{load_average, machine, today_utc};

use settings::Settings;

fn main() {
    let set = Settings::from_env();
    let filters: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    let wanted =
        |name: &str| filters.is_empty() || filters.iter().any(|f| name.contains(f.as_str()));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let began = Instant::now();
    println!("## tokio-ratelimit benchmarks\n");
    println!("- date: {} (UTC)", today_utc());
    println!("- machine: {}", machine());
    println!("- command: `cargo bench -p tokio-ratelimit-benches`");
    println!(
        "- settings: {} repetitions of {} calls per timed loop; pacing: {} runs of {:.0} s per cell; \
         other real-time runs: one of {:.0} s; tokio without test-util",
        set.reps,
        set.calls,
        set.rt_reps,
        set.pace.as_secs_f64(),
        set.run.as_secs_f64()
    );
    println!("- load average (1 min) at start: {}", load_average());
    if wanted("calibration") {
        calibration::calibration(&set);
    }
    if wanted("try") {
        try_acquire::try_one_thread(&rt, &set);
    }
    if wanted("threads") {
        threads::try_two_threads(&rt, &set);
    }
    if wanted("pacing") {
        pacing::pacing(&rt, &set);
    }
    if wanted("herd") {
        herd::waiters(&rt, &set);
    }
    if wanted("memory") {
        memory::memory(&rt, &set);
    }
    if wanted("resources") {
        resources::resources(&rt, &set);
    }
    if wanted("cancel") {
        cancel::cancellation(&rt, &set);
    }
    if wanted("bands") {
        bands::bands(&rt, &set);
    }
    println!(
        "\n- finished in {:.0} s; load average (1 min) at end: {}",
        began.elapsed().as_secs_f64(),
        load_average()
    );
}
