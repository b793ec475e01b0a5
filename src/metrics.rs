//! Metrics through the [`metrics`](https://docs.rs/metrics) facade (feature
//! `metrics`), so that any of its exporters (Prometheus, `StatsD`,
//! OpenTelemetry…) publishes them.
//!
//! A limiter records metrics only if it is given a name when built
//! (`name` on every builder: [`TokenBucketBuilder::name`](crate::TokenBucketBuilder::name),
//! [`KeyedFunnelBuilder::name`](crate::keyed::KeyedFunnelBuilder::name), …);
//! the name is the `limiter` label of each series. Unnamed limiters, and
//! every limiter when the feature is off, record nothing and pay nothing.
//!
//! The series are registered when the limiter is built, with the recorder
//! installed *then*: install the exporter's recorder first (a limiter built
//! before it records into the facade's no-op).
//!
//! | name | kind | labels | what |
//! |---|---|---|---|
//! | [`REQUESTS`] | counter | `limiter`, `outcome` | requests answered, by outcome: `granted`, `limited` (`try_acquire` refused for the rate), `overflow` (a leaky bucket's shaper full), `timeout`, `too_large` (`n` over the capacity), `unavailable` (a keyed map full: `max_keys`); `granted` and `limited` are published each second (see below) |
//! | [`PERMITS`] | counter | `limiter` | permits granted (the sum of `n`), published each second (see below) |
//! | [`WAITING`] | gauge | `limiter` | callers waiting in `acquire` now |
//! | [`WAIT_SECONDS`] | histogram | `limiter` | how long each `acquire` that waited waited, granted or not |
//! | [`KEYS`] | gauge | `limiter` | keys held by a keyed map (set as keys come and go; 0 once the map is dropped) |
//! | [`REDIS`] | counter | `limiter`, `counter` | a `RedisFunnel`'s [`RedisStats`](crate::redis::RedisStats) counters, one series each: `decisions`, `granted`, `limited`, `backend_errors`, `timeouts`, `fail_open_grants`, `retries`, `resends_granted_before`, `cached_refusals` |
//! | [`REDIS_SECONDS`] | histogram | `limiter` | seconds per round trip of a `RedisFunnel`'s decision (one call, or one batch) |
//!
//! Requests refused because the limiter was closed are not counted, as in
//! [`Stats`](crate::Stats). A `Reservation` counts as granted when it is
//! committed. A [`Keyed`](crate::keyed::Keyed) map records its answers,
//! its keys, and the waits of new keys for a slot when it is full
//! (`max_keys`); its per-key limiters' waits are theirs to record (name
//! them in the factory: all keys then share one series). A `RedisFunnel` records its
//! own series, below.
//!
//! # When the answers reach the recorder
//!
//! The `granted` requests, the permits and the `limited` refusals are not
//! pushed one answer at a time: the limiter's own counters (the ones
//! [`Stats`](crate::Stats) reads, kept anyway) are the count, and what
//! they grew by is added to those series by a background thread
//! (`tokio-ratelimit-metrics`, started by the first named limiter) every
//! second, by [`flush`], and once more when the limiter is dropped. So a
//! scrape may miss up to a second of them, unless its handler calls
//! [`flush`] first (as `examples/axum_service.rs` does); the series never
//! run ahead of the answers made and never go down. The other refusals,
//! the waiting gauge, the key count and the histograms are recorded as
//! they happen. (How the series are told apart in counters that hold
//! all grants and all refusals: ARCHITECTURE.md, "Metrics off the hot
//! path".)
//!
//! # What it costs
//!
//! Nothing without the feature or a name. A named limiter's engine is 8
//! bytes larger (a pointer); a grant of one permit and a rate refusal cost
//! nothing more, a grant of more permits one atomic add, the rarer
//! refusals one increment through the facade. Measured with
//! metrics-exporter-prometheus's recorder, a named `TokenBucket`'s
//! `try_acquire` against an unnamed one's (medians of three rounds, ns
//! added per call; `benches/RESULTS.md`, "Metrics off the hot path"):
//!
//! | | 1 thread | 2 threads |
//! |---|---:|---:|
//! | allowed | 0.0 (6.1 when pushed) | −1.9 (64.0 when pushed) |
//! | denied | −0.2 (2.3 when pushed) | −0.1 (62.8 when pushed) |
//!
//! (`cargo run --release -p tokio-ratelimit-benches --features metrics --example metrics_cost`.)
//! The background thread wakes once a second and walks the named
//! limiters alive.
//!
//! # Examples
//!
//! ```
//! use tokio_ratelimit::{Funnel, Rate};
//!
//! // Install the exporter's recorder first, e.g. metrics-exporter-prometheus:
//! // let handle = PrometheusBuilder::new().install_recorder()?;
//! let api = Funnel::builder()
//!     .rate(Rate::per_second(100))
//!     .capacity(10)
//!     .name("api")
//!     .build()
//!     .unwrap();
//! api.try_acquire().unwrap();
//! // Within a second, or at once after `tokio_ratelimit::metrics::flush()`:
//! // tokio_ratelimit_requests_total{limiter="api",outcome="granted"} 1
//! // tokio_ratelimit_permits_granted_total{limiter="api"} 1
//! ```
//!
//! `examples/axum_service.rs` serves them at `/metrics` in Prometheus's
//! text format.

/// Requests answered, by `outcome` (a counter).
pub const REQUESTS: &str = "tokio_ratelimit_requests_total";
/// Permits granted: the sum of `n` over granted requests (a counter).
pub const PERMITS: &str = "tokio_ratelimit_permits_granted_total";
/// Callers waiting now (a gauge).
pub const WAITING: &str = "tokio_ratelimit_waiting";
/// Seconds each waiting `acquire` waited (a histogram).
pub const WAIT_SECONDS: &str = "tokio_ratelimit_wait_seconds";
/// Keys held by a keyed map (a gauge).
pub const KEYS: &str = "tokio_ratelimit_keys";
/// A Redis limiter's counters, by `counter` (a counter).
pub const REDIS: &str = "tokio_ratelimit_redis_total";
/// Seconds per round trip of a Redis limiter's decision (a histogram).
pub const REDIS_SECONDS: &str = "tokio_ratelimit_redis_decision_seconds";

/// Publishes now what every named limiter granted, and refused for the
/// rate, since the last time.
///
/// The `granted` requests, the permits and the `limited` refusals are not
/// pushed to the recorder one answer at a time: a named limiter's own
/// counters (the ones [`Stats`](crate::Stats) reads) are the count, and a
/// background thread (`tokio-ratelimit-metrics`, started by the first
/// named limiter) adds what they grew by to those series every second. A
/// limiter also publishes itself when dropped. Call `flush` where the
/// series must be exact now, for instance in the handler that renders them
/// for a scrape (as `examples/axum_service.rs` does). The other refusals,
/// the waiting gauge, the key count and the histograms are recorded as
/// they happen.
///
/// # Examples
///
/// ```
/// use metrics_exporter_prometheus::PrometheusBuilder;
/// use tokio_ratelimit::{Funnel, Rate};
///
/// // A service installs its recorder globally; this one is this thread's.
/// let recorder = PrometheusBuilder::new().build_recorder();
/// let prometheus = recorder.handle();
/// let _recorder = metrics::set_default_local_recorder(&recorder);
///
/// let api = Funnel::builder().rate(Rate::per_second(100)).capacity(10).name("api").build()?;
/// api.try_acquire_many(3)?;
/// api.try_acquire()?;
/// tokio_ratelimit::metrics::flush();
/// let scraped = prometheus.render();
/// assert!(scraped.contains(r#"tokio_ratelimit_requests_total{limiter="api",outcome="granted"} 2"#));
/// assert!(scraped.contains(r#"tokio_ratelimit_permits_granted_total{limiter="api"} 4"#));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn flush() {
    crate::meter::publish_all();
}
