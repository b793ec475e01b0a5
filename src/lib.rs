//! Exact, fair, tokio-native rate limiters.
//!
//! `tokio-ratelimit` implements the classic algorithms — the token bucket,
//! the leaky bucket (as a meter and as a shaper), the funnel, and Guava's
//! smooth limiters — as limiters that async services `.await`, exact to the
//! nanosecond at any rate, FIFO-fair, cancel-safe, and testable in virtual
//! time with tokio's paused clock.
//!
//! ```
//! use std::time::Duration;
//! use tokio_ratelimit::{Rate, TokenBucket, TryAcquireError};
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let limiter = TokenBucket::builder().rate(Rate::per_second(100)).capacity(20).build()?;
//! limiter.acquire().await?; // waits its turn, FIFO
//! match limiter.try_acquire() {
//!     Ok(()) => { /* serve the request */ }
//!     Err(TryAcquireError::Limited { retry_after }) => { /* 429, Retry-After */ }
//!     Err(e) => return Err(e.into()),
//! }
//! # Ok(())
//! # }
//! ```
//!
//! # Which limiter?
//!
//! | limiter | what it does | background task | use it for |
//! |---|---|---|---|
//! | [`TokenBucket`] | bursts up to `capacity`, then `rate`; waiters queue FIFO | one actor, idle when nobody waits | calls to a metered API, outbound request budgets |
//! | [`LeakyBucket`] | `acquire`: smooths output to `rate`, no burst, overflow rejected; `try_acquire`: the meter | one actor | shaping traffic to a fixed pace, bounded queues |
//! | [`Funnel`] | the leaky-bucket meter, computed lazily | none | admission control in request handlers (429 + `Retry-After`) |
//! | [`SmoothBursty`] | Guava's `SmoothBursty`: steady pacing, each request pays for the one before; idle time stored as free permits (up to `max_burst`) | none | porting Guava code; pacing with a bounded catch-up burst |
//! | [`SmoothWarmingUp`] | Guava's `SmoothWarmingUp`: starts cold (`cold_factor` × slower), ramps up to `rate` over `warmup`, cools down when idle | none | backends that need warming up (caches, connection pools) |
//! | [`keyed::KeyedFunnel`] | a funnel per key, one word of state each; drained keys dropped automatically | a sweeper, idle when empty | per user / per IP limits, millions of keys |
//! | [`keyed::Keyed`] | any limiter per key, built on first use; fresh keys dropped automatically | a sweeper, plus each key's own | per host / per tenant budgets with FIFO waiting |
//! | `redis::RedisFunnel` (feature `redis`) | a funnel per key with its state in Redis: one atomic script per decision on the server's clock; keys expire once drained; fail open or closed | none (the Redis connection's own) | one limit shared by every replica of a service |
//!
//! The first three are the same exact arithmetic ([`algorithm`]): a funnel,
//! a leaky bucket's meter and a token bucket that starts full admit exactly
//! the same requests. The smooth limiters follow Guava's reservation model
//! and reproduce its arithmetic bit for bit, in whole microseconds
//! ([`algorithm::SmoothState`]).
//! Every limiter implements [`Limiter`], so a service can choose one from
//! configuration and hold an `Arc<dyn Limiter>`.
//!
//! # Names
//!
//! Every public type has one path. The limiters of one resource, their
//! builders, the errors and [`Limiter`] are at the crate root; [`keyed`],
//! [`stream`], `tower`, `redis` and `test_util` are namespaces for the rest.
//! A limiter `X` is configured by an `XBuilder` made by `X::builder()`
//! ([`TokenBucketBuilder`], [`SmoothBurstyBuilder`],
//! [`keyed::KeyedFunnelBuilder`], …), whose setters take `&mut self` and
//! whose `build(&self)` returns a `Result`. Public enums are
//! `#[non_exhaustive]`. Which types are `Send`, `Sync`, `Unpin`, `Clone` and
//! `Debug`, and which futures are `Send`, is checked at compile time by
//! `tests/auto_traits.rs`.
//!
//! # Guarantees
//!
//! * **Never over-admits.** Through `try_acquire`, in any window of length
//!   `T`, at most `capacity + rate × T` permits are granted, exactly.
//!   Waiters can only be woken on tokio's 1 ms timer ticks, so grants to
//!   waiters come in per-tick batches and the bound holds with one tick of
//!   slack: `capacity + rate × (T + 1 ms)`.
//! * **Never under-delivers.** The refill is computed from elapsed time in
//!   exact rationals, so under saturating demand the long-run rate is the
//!   configured one at any rate. Permits that fall due while a waiter
//!   oversleeps the timer are credited to the requests right after it, not
//!   lost to the capacity (100 000/s with a capacity of 10 delivers
//!   100 000/s).
//! * **Exact at the boundary.** A permit due at `t` is available at `t`
//!   (rounded up to the nanosecond), whether or not a background task has
//!   run; `retry_after` is exact.
//! * **FIFO.** Waiters are served in arrival order: each reserves its turn
//!   when it arrives, so a large request at the head is not starved by
//!   small ones, and `try_acquire` does not jump the queue.
//! * **Cancellation loses nothing.** Dropping an `acquire` future before it
//!   resolves gives back what it reserved, at once; the waiters behind it
//!   move up. (The smooth limiters, where later requests are priced on top
//!   of earlier ones in Guava's pay-later model, give back the part of the
//!   dropped request's cost not yet elapsed and keep the stored permits it
//!   spent spent; see [`SmoothBursty`].)
//! * **Idle costs nothing.** A limiter nobody waits on has no task and no
//!   timer: its actor runs only while someone waits.
//! * **Clean shutdown.** An actor ends when its queue is empty (or the
//!   limiter is closed); `close()` fails all waiters and later calls with
//!   `Closed`.
//!
//! # Runtime
//!
//! [`TokenBucket`] and [`LeakyBucket`] are built inside a tokio runtime
//! (building outside one is [`ConfigError::NoRuntime`], not a panic); their
//! actor is spawned by the first waiter, on that waiter's runtime, and ends
//! when nobody waits. They need tokio's `rt` and `time`. [`Funnel`], [`SmoothBursty`] and [`SmoothWarmingUp`] spawn
//! nothing and their `try_acquire` works anywhere; their `acquire` needs
//! tokio's timer when it has to wait.
//!
//! # Testing with a paused clock
//!
//! A limiter built in a runtime whose clock is paused reads that clock, and
//! every limiter waits on `tokio::time`'s timers, so tests run in virtual
//! time and finish in milliseconds. Use a current-thread runtime with a
//! paused clock and build the limiters in it; an `.await` that waits lets
//! tokio jump the clock to the next timer:
//!
//! ```
//! use std::time::Duration;
//! use tokio::time::Instant;
//! use tokio_ratelimit::{Rate, TokenBucket};
//!
//! // In a test: #[tokio::test(start_paused = true)]
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() {
//! let bucket = TokenBucket::builder().rate(Rate::per_second(2)).capacity(1).build().unwrap();
//! let start = Instant::now();
//! for _ in 0..5 {
//!     bucket.acquire().await.unwrap();
//! }
//! assert_eq!(start.elapsed(), Duration::from_secs(2)); // no real time passed
//! # }
//! ```
//!
//! To step through states, poll futures by hand with `tokio-test`
//! (`task::spawn`, `assert_pending!`, `assert_ready!`) and move the clock
//! with `tokio::time::advance`. The `test-util` feature adds
//! [`test_util`]: a grant log with window assertions.
//!
//! # In a service
//!
//! * [`tower`] (feature `tower`): `RateLimitLayer` puts any limiter in
//!   front of a service, with backpressure through `poll_ready`, one budget
//!   for every clone of the service, and no permit lost to a service dropped
//!   before `call`; `KeyedRateLimitLayer` limits per key (client, address)
//!   and refuses at once with `RateLimited { key, retry_after }`.
//! * [`http`] (feature `http`): `HttpRateLimitLayer` limits an HTTP
//!   service per client — who the client is (an API key, the address
//!   behind trusted proxies, IPv6 by /64), `429` or `503` with
//!   `Retry-After`, and the IETF draft's `RateLimit-Policy` / `RateLimit`
//!   fields, one item per band — on a local map or on Redis.
//!   `examples/axum_service.rs` is an HTTP service built on it, with free
//!   and paid tiers.
//! * [`stream`]: `stream.rate_limited(limiter)` and
//!   `stream.rate_limited_by(limiter, |item| weight)` pace any `Stream`.
//!
//! # Observing limiters
//!
//! Every limiter has `stats()` (also through [`Limiter::stats`]): a
//! [`Stats`] snapshot of the permits `granted` and requests `refused` so
//! far, the callers `waiting` now, and the permits `available` now (`None`
//! for the smooth limiters, which have no such number). The keyed maps
//! report [`keyed::KeyedStats`]: keys held, keys evicted, new keys refused
//! by `max_keys`, and permits granted and requests limited over all keys.
//! The counters are relaxed atomics striped over cache lines: cheap to bump,
//! and cheap to read for a metrics exporter.
//!
//! ```
//! use tokio_ratelimit::{Rate, TokenBucket};
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() {
//! let bucket = TokenBucket::builder().rate(Rate::per_second(10)).capacity(2).build().unwrap();
//! bucket.acquire_many(2).await.unwrap();
//! assert!(bucket.try_acquire().is_err());
//! let stats = bucket.stats();
//! assert_eq!((stats.granted, stats.refused, stats.waiting, stats.available), (2, 1, 0, Some(0)));
//! # }
//! ```
//!
//! The crate also emits [`tracing`](https://docs.rs/tracing) spans and
//! events, under the target `tokio_ratelimit` (and its modules). Each
//! actor runs in a `debug` span named `actor` (fields `limiter`, `rate`,
//! `capacity`) for its lifetime, and each keyed map's sweeper in a `debug`
//! span named `sweeper` (fields `map`, `interval`). Decisions are `trace`
//! events with a `limiter` field: `granted`, `limited` (with
//! `retry_after`), `queued`, `reserved`, `granted after waiting`,
//! `reservation committed`, `cancelled, …`; the sweeper's `swept` (keys left).
//! Rarer things are `debug` events: overflow, close, rate changes, an actor
//! or sweeper starting and stopping, a new key refused by `max_keys`, a
//! `tower` layer refusing a request (`trace` for the keyed layer's
//! refusals, with the key). With no subscriber interested, nothing is
//! formatted. To see them, install a subscriber, e.g. `tracing-subscriber`
//! with `RUST_LOG=tokio_ratelimit=trace` (`examples/observe.rs`):
//!
//! ```no_run
//! use tracing_subscriber::EnvFilter;
//!
//! let filter = EnvFilter::try_from_default_env()
//!     .unwrap_or_else(|_| EnvFilter::new("tokio_ratelimit=trace"));
//! tracing_subscriber::fmt().with_env_filter(filter).init();
//! ```
//!
//! # Features
//!
//! * `fast-clock` (default) — limiters built outside a paused runtime read
//!   the CPU's counter (`rdtsc` on x86-64, the crate's `unsafe` code;
//!   `quanta` elsewhere and for its first calibration), kept on the OS
//!   monotonic clock, instead of `clock_gettime`: about 10 ns a call less
//!   on x86-64. Used
//!   on Linux only where the kernel's own clocksource is that counter (`tsc`,
//!   `arch_sys_counter`); elsewhere, without the feature, or with
//!   `TOKIO_RATELIMIT_CLOCK=system` in the environment, limiters read
//!   tokio's clock. A limiter built inside a paused runtime always follows
//!   that runtime's clock, so tests are unchanged — but one built outside
//!   it (a `static`) and then used in a paused test reads real time, and
//!   its waiters do not work there (see the README, "Testing code that uses
//!   it").
//! * `tower` — the [`tower`] middleware (`tower-service`, `tower-layer`).
//! * `test-util` — helpers for paused-clock tests of code that uses the
//!   limiters.
//! * `io` — `io::RateLimitedRead` and `io::RateLimitedWrite`: bandwidth
//!   limits for any tokio reader or writer, one permit per byte, and
//!   `io::copy` / `io::copy_bidirectional` under a limit.
//! * `redis` — `redis::RedisFunnel`: the funnel per key with its state in
//!   Redis, one limit shared by many processes (server time, one atomic
//!   script per decision over every band, fail open or closed, a refusal
//!   cache), on one server or a Redis Cluster.
//! * `http` — `http::HttpRateLimitLayer` and the key extractors (implies
//!   `tower`); `axum` — the peer address from axum's `ConnectInfo` too.

#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod algorithm;
mod cell;
mod clock;
mod engine;
mod error;
mod funnel;
#[cfg(feature = "http")]
#[cfg_attr(docsrs, doc(cfg(feature = "http")))]
pub mod http;
#[cfg(feature = "io")]
#[cfg_attr(docsrs, doc(cfg(feature = "io")))]
pub mod io;
pub mod keyed;
mod leaky;
mod limiter;
mod meter;
#[cfg(feature = "metrics")]
#[cfg_attr(docsrs, doc(cfg(feature = "metrics")))]
pub mod metrics;
mod quota;
mod rate;
#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub mod redis;
mod reservation;
mod smooth;
mod stats;
pub mod stream;
mod sync;
#[cfg(feature = "test-util")]
#[cfg_attr(docsrs, doc(cfg(feature = "test-util")))]
pub mod test_util;
mod token;
#[cfg(feature = "tower")]
#[cfg_attr(docsrs, doc(cfg(feature = "tower")))]
pub mod tower;

pub use error::{AcquireError, ConfigError, Refused, TryAcquireError};
pub use funnel::{Funnel, FunnelBuilder};
pub use leaky::{LeakyBucket, LeakyBucketBuilder};
pub use limiter::Limiter;
pub use quota::{Band, BandState, Peek, Quota};
pub use rate::Rate;
pub use reservation::Reservation;
pub use smooth::{SmoothBursty, SmoothBurstyBuilder, SmoothWarmingUp, SmoothWarmingUpBuilder};
pub use stats::Stats;
pub use token::{TokenBucket, TokenBucketBuilder};
