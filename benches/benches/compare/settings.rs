//! Durations and repetition counts of a run, from the environment.

use std::time::Duration;

/// Durations and repetition counts; `BENCH_QUICK=1` shrinks them.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Settings {
    /// Repetitions of each timed loop (scenarios 0, 1, 2, 5); medians are
    /// quoted.
    pub(crate) reps: usize,
    /// Calls per repetition on one thread (per thread with two).
    pub(crate) calls: u64,
    /// Length of each real-time run (scenarios 4 and 6).
    pub(crate) run: Duration,
    /// Length of each pacing run (scenario 3).
    pub(crate) pace: Duration,
    /// Runs of each pacing cell (medians quoted).
    pub(crate) rt_reps: usize,
    /// Keys for governor keyed (and later `KeyedFunnel`).
    pub(crate) keys: u64,
    /// Idle limiters built in scenario 5.
    pub(crate) idle: usize,
    /// Waiters in scenario 4.
    pub(crate) herd: usize,
    /// Only the limiters whose name contains one of these (`BENCH_KINDS`,
    /// comma-separated); all when empty.
    pub(crate) kinds: &'static [String],
}

impl Settings {
    pub(crate) fn from_env() -> Settings {
        let kinds: Vec<String> = std::env::var("BENCH_KINDS")
            .unwrap_or_default()
            .split(',')
            .filter(|k| !k.is_empty())
            .map(str::to_string)
            .collect();
        let mut set = Settings::defaults();
        set.kinds = Vec::leak(kinds);
        if let Some(secs) = std::env::var("BENCH_SECS")
            .ok()
            .and_then(|s| s.parse::<f64>().ok())
        {
            set.run = Duration::from_secs_f64(secs);
            set.pace = set.run;
        }
        set
    }

    fn defaults() -> Settings {
        if std::env::var_os("BENCH_QUICK").is_some_and(|v| v != "0") {
            Settings {
                reps: 3,
                calls: 200_000,
                run: Duration::from_secs(1),
                pace: Duration::from_secs(1),
                rt_reps: 1,
                keys: 100_000,
                idle: 10_000,
                herd: 10_000,
                kinds: &[],
            }
        } else {
            Settings {
                reps: 7,
                calls: 2_000_000,
                run: Duration::from_secs(3),
                pace: Duration::from_secs(2),
                rt_reps: 3,
                keys: 1_000_000,
                idle: 100_000,
                herd: 10_000,
                kinds: &[],
            }
        }
    }
}
