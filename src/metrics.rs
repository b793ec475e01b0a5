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
//! | [`REQUESTS`] | counter | `limiter`, `outcome` | requests answered, by outcome: `granted`, `limited` (`try_acquire` refused for the rate), `overflow` (a leaky bucket's shaper full), `timeout`, `too_large` (`n` over the capacity), `unavailable` (a keyed map full: `max_keys`) |
//! | [`PERMITS`] | counter | `limiter` | permits granted (the sum of `n`) |
//! | [`WAITING`] | gauge | `limiter` | callers waiting in `acquire` now |
//! | [`WAIT_SECONDS`] | histogram | `limiter` | how long each `acquire` that waited waited, granted or not |
//! | [`KEYS`] | gauge | `limiter` | keys held by a keyed map (set as keys come and go) |
//! | [`REDIS`] | counter | `limiter`, `counter` | a `RedisFunnel`'s [`RedisStats`](crate::redis::RedisStats) counters, one series each: `decisions`, `granted`, `limited`, `backend_errors`, `timeouts`, `fail_open_grants`, `retries`, `resends_granted_before`, `cached_refusals` |
//! | [`REDIS_SECONDS`] | histogram | `limiter` | seconds per round trip of a `RedisFunnel`'s decision (one call, or one batch) |
//!
//! Requests refused because the limiter was closed are not counted, as in
//! [`Stats`](crate::Stats). A `Reservation` counts as granted when it is
//! committed. A [`Keyed`](crate::keyed::Keyed) map records its answers and
//! keys; its per-key limiters' waits are theirs to record (name them in the
//! factory: all keys then share one series). A `RedisFunnel` records its
//! own series, below.
//!
//! What it costs: nothing without the feature or a name. A named limiter's
//! engine is 8 bytes larger (a pointer), and each answer is one or two
//! increments through the facade: on the machine of `benches/RESULTS.md`,
//! with metrics-exporter-prometheus's recorder, a `TokenBucket`'s allowed
//! `try_acquire` takes 6.1 ns more (two counters: the request and its
//! permits) and a denied one 2.2 ns more
//! (`cargo run --release -p tokio-ratelimit-benches --features metrics --example metrics_cost`).
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
