//! A Prometheus recorder of a test's own, set as its thread's default
//! (thread-local, so the tests do not share series): limiters built
//! meanwhile record into it. For the test files of the `metrics` feature.
#![allow(
    dead_code,
    reason = "each includer uses a part (an expect would fail for the one that uses all)"
)]

use std::collections::BTreeMap;

use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle, PrometheusRecorder};

/// The recorder, this thread's default until dropped.
pub(crate) struct Recorded {
    handle: PrometheusHandle,
    _guard: metrics::LocalRecorderGuard<'static>,
}

pub(crate) fn recorded() -> Recorded {
    let recorder: &'static PrometheusRecorder =
        Box::leak(Box::new(PrometheusBuilder::new().build_recorder()));
    Recorded {
        handle: recorder.handle(),
        _guard: metrics::set_default_local_recorder(recorder),
    }
}

/// The `outcome` labels of `requests_total`, in the order
/// [`Recorded::outcomes`] gives them.
pub(crate) const OUTCOMES: [&str; 6] = [
    "granted",
    "limited",
    "overflow",
    "timeout",
    "too_large",
    "unavailable",
];

impl Recorded {
    /// Every series rendered after a [`flush`](tokio_ratelimit::metrics::flush)
    /// (as a scrape handler does), its labels sorted, to its value.
    pub(crate) fn series(&self) -> BTreeMap<String, f64> {
        tokio_ratelimit::metrics::flush();
        self.unflushed()
    }

    /// Every series as rendered now, without a flush.
    pub(crate) fn unflushed(&self) -> BTreeMap<String, f64> {
        self.handle
            .render()
            .lines()
            .filter(|line| !line.is_empty() && !line.starts_with('#'))
            .map(|line| {
                let (series, value) = line.rsplit_once(' ').unwrap();
                let series = match series.split_once('{') {
                    Some((name, labels)) => {
                        let mut labels: Vec<&str> =
                            labels.trim_end_matches('}').split(',').collect();
                        labels.sort_unstable();
                        format!("{name}{{{}}}", labels.join(","))
                    }
                    None => series.to_owned(),
                };
                (series, value.parse().unwrap())
            })
            .collect()
    }

    /// A series after a flush; panics if it is not there.
    pub(crate) fn get(&self, series: &str) -> f64 {
        let all = self.series();
        all.get(series)
            .copied()
            .unwrap_or_else(|| panic!("no {series} in {all:#?}"))
    }

    /// A series after a flush, 0 when it is not there (never recorded).
    pub(crate) fn get_or_zero(&self, series: &str) -> f64 {
        self.series().get(series).copied().unwrap_or(0.0)
    }

    /// `requests_total` of `limiter` by outcome, in [`OUTCOMES`]' order
    /// (a named limiter registers every outcome when it is built); panics
    /// if one is not there.
    pub(crate) fn outcomes(&self, limiter: &str) -> [f64; 6] {
        let all = self.series();
        OUTCOMES.map(|outcome| {
            let series = format!(
                "tokio_ratelimit_requests_total{{limiter=\"{limiter}\",outcome=\"{outcome}\"}}"
            );
            all.get(&series)
                .copied()
                .unwrap_or_else(|| panic!("no {series} in {all:#?}"))
        })
    }

    /// The series `name` of `limiter`; panics if it is not there.
    pub(crate) fn of(&self, name: &str, limiter: &str) -> f64 {
        self.get(&format!("{name}{{limiter=\"{limiter}\"}}"))
    }

    /// The series `name` of `limiter`, 0 when it is not there.
    pub(crate) fn of_or_zero(&self, name: &str, limiter: &str) -> f64 {
        self.get_or_zero(&format!("{name}{{limiter=\"{limiter}\"}}"))
    }
}
