//! One limit shared by many processes: the funnel per key, its state in
//! Redis (feature `redis`).
//!
//! When a service runs as several replicas, a limiter in each replica lets
//! the fleet through N times over. [`RedisFunnel`] keeps each key's state in
//! Redis, so every replica that points at the same server and prefix draws
//! from one budget per key. It is the same meter as [`Funnel`](crate::Funnel)
//! and [`KeyedFunnel`](crate::keyed::KeyedFunnel) — the same exact numbers
//! for the same arrivals — with `try_acquire` answering
//! `Limited { retry_after }` for a 429.
//!
//! ```no_run
//! use std::time::Duration;
//! use tokio_ratelimit::Rate;
//! use tokio_ratelimit::redis::{FailurePolicy, RedisFunnel, RedisLimitError};
//!
//! # #[tokio::main]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let per_user = RedisFunnel::builder("redis://127.0.0.1:6379/")
//!     .rate(Rate::per_second(10))
//!     .capacity(20)
//!     .prefix("rl:api:")
//!     .failure_policy(FailurePolicy::Open) // Redis down: let requests through
//!     .timeout(Duration::from_millis(200)) // ... after at most 200 ms
//!     .build()
//!     .await?;
//! match per_user.try_acquire("user:42").await {
//!     Ok(()) => { /* serve the request */ }
//!     Err(RedisLimitError::Limited { retry_after }) => { /* 429, Retry-After */ }
//!     Err(e) => { /* fail closed only: Redis failed or was too slow */ }
//! }
//! // Several decisions in one round trip.
//! let answers = per_user.try_acquire_many_keys(&[("user:1", 1), ("user:2", 3)]).await;
//! assert_eq!(answers.len(), 2);
//! println!("{:?}", per_user.stats()); // decisions, limited, backend errors, ...
//! # Ok(())
//! # }
//! ```
//!
//! # The model
//!
//! * **GCRA per key.** A key's whole state is one instant, its theoretical
//!   arrival time (when its funnel will be empty), stored under
//!   `prefix + key` as a short string. A request for `n` permits fits when
//!   `max(tat, now) + n × interval − now ≤ capacity × interval`; if it does
//!   not, the excess is exactly `retry_after`. This is
//!   [`algorithm::FunnelState::try_pour`](crate::algorithm::FunnelState::try_pour),
//!   instant for instant.
//! * **One round trip, atomic.** Each decision is one Lua script, loaded once
//!   (`SCRIPT LOAD`, at build) and run by its hash (`EVALSHA`); after a
//!   `SCRIPT FLUSH` or a server restart the `NOSCRIPT` answer makes the
//!   client load it again and retry, transparently. Redis runs a script
//!   alone, so concurrent replicas never interleave within a decision.
//!   [`try_acquire_many_keys`](RedisFunnel::try_acquire_many_keys) pipelines
//!   one script call per key in a single round trip.
//! * **Server time.** `now` is the Redis server's `TIME`, read inside the
//!   script, never a replica's clock: skew between replicas cannot widen
//!   the limit. (Allowed since Redis 5, where scripts replicate their
//!   effects; Redis 5 or later is required.)
//! * **Memory follows active keys.** Each write sets the key to expire just
//!   after its theoretical arrival time, at the next whole millisecond: once
//!   the funnel has drained, its state is indistinguishable from no state,
//!   and Redis drops it.
//! * **Exact arithmetic.** Lua numbers are doubles, exact for integers below
//!   2⁵³, and `TIME` has microseconds. The script keeps every instant as
//!   whole microseconds plus a remainder in the crate's scaled units (`1/den`
//!   ns, where `num/den` ns is the interval in lowest terms), and only adds,
//!   subtracts and compares such pairs, so every value stays an exact
//!   integer. The one limit this imposes: `capacity × interval` at most
//!   2⁵⁰ µs (35.7 years of drain time); `build()` refuses deeper buckets
//!   with a [`ConfigError`] rather than round. The state string is
//!   `"<µs> <remainder> <units per µs>"`; a limiter with another rate that
//!   finds a key written by this one reads its instant rounded up to the
//!   next microsecond.
//!
//! # When Redis fails
//!
//! Every decision has a deadline ([`timeout`](Builder::timeout), 200 ms by
//! default) covering the connection, the script and a reload: no request
//! hangs on a dead or stalled Redis. A decision that fails or times out is
//! decided by the limiter's [`FailurePolicy`]: `Open` grants it (counted in
//! [`RedisStats::fail_open_grants`]), `Closed` refuses it with
//! [`RedisLimitError::Backend`] or [`RedisLimitError::Timeout`], never with
//! `Limited`. Either way it is counted in [`RedisStats::backend_errors`],
//! and the first failure after a success (and the recovery) is logged at
//! `warn` (`info`) level through `tracing`. The connection is a
//! [`redis::aio::ConnectionManager`], which reconnects on its own; it is set
//! to make one connection attempt per reconnection, without backoff, so
//! while Redis refuses connections a decision fails at once (in about a
//! tenth of a millisecond on loopback) instead of waiting out its deadline,
//! and the first decision after Redis is back reconnects.
//!
//! A connection the server closed while it was idle (`CLIENT KILL`, the
//! server's idle `timeout`, a restart) is found closed by the next
//! decision before its request is sent: that decision reconnects and sends
//! its request once more, within the same deadline, so Redis decides it
//! (counted in [`RedisStats::retries`]). A request that may have been sent
//! is never sent again — the script pours, and Redis may have run it — so
//! a connection lost while a request is in flight fails that decision by
//! the policy. A Redis that accepts connections but does not answer
//! (stalled, or a host that drops packets) costs each decision its full
//! deadline.
//!
//! Waiting (`acquire`) is a loop of decisions: sleep `retry_after`, ask
//! again. There is no queue shared between replicas, so waiters are not
//! served in arrival order; a waiter that loses a race waits again.
//!
//! # Real time only
//!
//! Unlike the in-process limiters, a `RedisFunnel` cannot run under tokio's
//! paused clock: while the runtime waits for Redis, a paused clock jumps to
//! the next timer (a connection or decision deadline), so `build()` and
//! every decision time out. Test code that uses it against a real `redis-server` in
//! real time (as this crate's own tests do), or put it behind an interface
//! that tests replace with [`KeyedFunnel`](crate::keyed::KeyedFunnel).

mod repr;

use std::fmt;
use std::future::poll_fn;
use std::pin::pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::task::Poll;
use std::time::{Duration, SystemTime};

use ::redis::aio::{ConnectionManager, ConnectionManagerConfig};
use ::redis::{Client, ErrorKind, RedisError, RedisResult, Script, ServerErrorKind};

use self::repr::{Encoding, Split};
use crate::algorithm::Params;
use crate::{ConfigError, Rate, clock};

/// The builder's name beside the other limiters' (`TokenBucketBuilder`, …).
pub use self::Builder as RedisFunnelBuilder;

/// The funnel per key, its state in Redis: one limit shared by every
/// process that uses the same server and prefix.
///
/// Cheap to clone (one `Arc`); clones share the connection and the
/// counters. See the [module docs](self) for the model, the failure policy
/// and the exact arithmetic.
#[derive(Clone)]
pub struct RedisFunnel {
    inner: Arc<Inner>,
}

struct Inner {
    conn: ConnectionManager,
    script: Script,
    encoding: Encoding,
    rate: Rate,
    prefix: String,
    policy: FailurePolicy,
    timeout: Duration,
    counters: Counters,
    /// Whether the last decision reached Redis (for logging transitions).
    healthy: AtomicBool,
}

/// What a [`RedisFunnel`] does with a decision Redis could not make (an
/// error, a lost connection, or no answer within the timeout).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum FailurePolicy {
    /// Grant the request (and count it in
    /// [`RedisStats::fail_open_grants`]): an outage of the limiter's store
    /// does not become an outage of the service. The default.
    #[default]
    Open,
    /// Refuse the request with [`RedisLimitError::Backend`] or
    /// [`RedisLimitError::Timeout`].
    Closed,
}

/// A `RedisFunnel` decision that did not grant.
///
/// `Limited` and `InsufficientCapacity` mean what they mean for
/// [`TryAcquireError`](crate::TryAcquireError); `Timeout` and `Backend`
/// (only under [`FailurePolicy::Closed`], or from
/// [`RedisFunnel::decide`]) say that Redis could not decide.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use tokio_ratelimit::redis::RedisLimitError;
///
/// let e = RedisLimitError::Limited { retry_after: Duration::from_millis(5) };
/// assert_eq!(e.retry_after(), Some(Duration::from_millis(5)));
/// assert!(!e.is_backend_failure());
/// let t = RedisLimitError::Timeout { timeout: Duration::from_millis(200) };
/// assert!(t.is_backend_failure());
/// assert_eq!(t.to_string(), "redis did not decide within 200ms");
/// ```
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum RedisLimitError {
    /// Not now. The same request would succeed after `retry_after`, exactly
    /// (to the nanosecond, on the server's clock), if nothing else is
    /// granted on this key in between.
    Limited {
        /// How long until the request could succeed.
        retry_after: Duration,
    },
    /// More permits were asked for than the limiter can ever grant at once
    /// (`n > capacity`). Decided locally, without asking Redis.
    InsufficientCapacity,
    /// Redis did not answer within the limiter's decision timeout.
    Timeout {
        /// The timeout that passed.
        timeout: Duration,
    },
    /// Redis answered with an error, or could not be reached.
    Backend(RedisError),
}

impl RedisLimitError {
    /// The wait before a retry can succeed, for `Limited`; `None` otherwise.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            Self::Limited { retry_after } => Some(*retry_after),
            _ => None,
        }
    }

    /// Whether Redis failed to decide (`Timeout` or `Backend`), as opposed
    /// to deciding no.
    pub fn is_backend_failure(&self) -> bool {
        matches!(self, Self::Timeout { .. } | Self::Backend(_))
    }
}

impl fmt::Display for RedisLimitError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Limited { retry_after } => {
                write!(f, "rate limited, retry after {retry_after:?}")
            }
            Self::InsufficientCapacity => {
                f.write_str("more permits requested than the limiter's capacity")
            }
            Self::Timeout { timeout } => write!(f, "redis did not decide within {timeout:?}"),
            Self::Backend(e) => write!(f, "redis failed to decide: {e}"),
        }
    }
}

impl std::error::Error for RedisLimitError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Backend(e) => Some(e),
            _ => None,
        }
    }
}

/// [`RedisFunnel`]'s builder could not build it.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum RedisBuildError {
    /// The rate, capacity or another option is invalid, or beyond what the
    /// script represents exactly.
    Config(ConfigError),
    /// The URL is invalid, or Redis refused the connection or the script.
    Redis(RedisError),
    /// Redis did not load the script within the connect timeout.
    Timeout {
        /// The connect timeout that passed.
        timeout: Duration,
    },
}

impl fmt::Display for RedisBuildError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Config(e) => e.fmt(f),
            Self::Redis(e) => write!(f, "redis: {e}"),
            Self::Timeout { timeout } => {
                write!(f, "redis did not load the script within {timeout:?}")
            }
        }
    }
}

impl std::error::Error for RedisBuildError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Config(e) => Some(e),
            Self::Redis(e) => Some(e),
            Self::Timeout { .. } => None,
        }
    }
}

impl From<ConfigError> for RedisBuildError {
    fn from(e: ConfigError) -> Self {
        Self::Config(e)
    }
}

/// Counters of a [`RedisFunnel`] (shared by its clones), from
/// [`RedisFunnel::stats`].
///
/// `decisions = granted + limited + backend_errors`: every decision that
/// was asked of Redis (each key of a batch counts once). Requests decided
/// locally (`n = 0`, `n > capacity`) are not counted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RedisStats {
    /// Decisions asked of Redis.
    pub decisions: u64,
    /// Granted by Redis.
    pub granted: u64,
    /// Refused by Redis (`Limited`).
    pub limited: u64,
    /// Redis could not decide: an error, a lost connection or a timeout.
    pub backend_errors: u64,
    /// Of the backend errors, how many were timeouts.
    pub timeouts: u64,
    /// Of the backend errors, how many were granted by
    /// [`FailurePolicy::Open`].
    pub fail_open_grants: u64,
    /// Decisions sent a second time because the first attempt found the
    /// connection already closed, before anything was sent (counted once
    /// in `decisions`, whatever the second attempt answered).
    pub retries: u64,
}

#[derive(Default)]
struct Counters {
    decisions: AtomicU64,
    granted: AtomicU64,
    limited: AtomicU64,
    backend_errors: AtomicU64,
    timeouts: AtomicU64,
    fail_open_grants: AtomicU64,
    retries: AtomicU64,
}

/// One decision as Redis made it, from [`RedisFunnel::decide`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Decision {
    /// `None` when granted; otherwise exactly how long until the request
    /// could succeed.
    pub retry_after: Option<Duration>,
    /// The server's clock (`TIME`, microseconds) when the script decided.
    pub server_time: SystemTime,
}

impl Decision {
    /// Whether the permits were granted.
    pub fn is_granted(&self) -> bool {
        self.retry_after.is_none()
    }
}

/// Where a [`RedisFunnel`] connects: a [`redis::Client`],
/// or anything the `redis` crate opens one from (a URL as `&str` or
/// `String`, a [`ConnectionInfo`](::redis::ConnectionInfo)).
pub trait IntoClient {
    /// Opens (or passes on) the client. An invalid URL is reported by
    /// [`Builder::build`].
    ///
    /// # Errors
    ///
    /// The `redis` crate's error for an invalid URL or connection info.
    fn into_client(self) -> RedisResult<Client>;
}

impl IntoClient for Client {
    fn into_client(self) -> RedisResult<Client> {
        Ok(self)
    }
}

impl IntoClient for &str {
    fn into_client(self) -> RedisResult<Client> {
        Client::open(self)
    }
}

impl IntoClient for String {
    fn into_client(self) -> RedisResult<Client> {
        Client::open(self)
    }
}

impl IntoClient for &String {
    fn into_client(self) -> RedisResult<Client> {
        Client::open(self.as_str())
    }
}

impl IntoClient for ::redis::ConnectionInfo {
    fn into_client(self) -> RedisResult<Client> {
        Client::open(self)
    }
}

/// Configures a [`RedisFunnel`]; made by [`RedisFunnel::builder`].
#[derive(Debug, Clone)]
pub struct Builder {
    client: RedisResult<Client>,
    rate: Option<Rate>,
    capacity: Option<u32>,
    prefix: String,
    policy: FailurePolicy,
    timeout: Duration,
    connect_timeout: Duration,
}

impl Builder {
    /// The leak rate of every key's funnel (required).
    pub fn rate(&mut self, rate: Rate) -> &mut Self {
        self.rate = Some(rate);
        self
    }

    /// How many units each key's funnel holds (its burst). Defaults to the
    /// rate's permits per period.
    pub fn capacity(&mut self, capacity: u32) -> &mut Self {
        self.capacity = Some(capacity);
        self
    }

    /// Prepended to every key to make its Redis key (default `"rl:"`).
    /// Limiters that share a prefix share their keys' budgets: give each
    /// limit its own prefix.
    pub fn prefix(&mut self, prefix: impl Into<String>) -> &mut Self {
        self.prefix = prefix.into();
        self
    }

    /// What to do when Redis cannot decide (default
    /// [`FailurePolicy::Open`]).
    pub fn failure_policy(&mut self, policy: FailurePolicy) -> &mut Self {
        self.policy = policy;
        self
    }

    /// The deadline of each decision, connection and script reload
    /// included (default 200 ms). Past it the failure policy decides.
    pub fn timeout(&mut self, timeout: Duration) -> &mut Self {
        self.timeout = timeout;
        self
    }

    /// How long `build()` waits for Redis to load the script, and each
    /// connection attempt may take (default 1 s).
    pub fn connect_timeout(&mut self, timeout: Duration) -> &mut Self {
        self.connect_timeout = timeout;
        self
    }

    /// Connects, loads the script (`SCRIPT LOAD`), and returns the limiter.
    ///
    /// # Errors
    ///
    /// [`RedisBuildError::Config`]: [`ConfigError::MissingRate`],
    /// [`ConfigError::InvalidRate`], [`ConfigError::ZeroCapacity`],
    /// [`ConfigError::InvalidParameter`] for a zero timeout or a bucket
    /// deeper than 2⁵⁰ µs (`capacity × interval`). [`RedisBuildError::Redis`]
    /// for an invalid URL or a Redis that refuses the connection or the
    /// script; [`RedisBuildError::Timeout`] when it does not answer within
    /// the connect timeout.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future leaves nothing behind but the loaded script.
    pub async fn build(&self) -> Result<RedisFunnel, RedisBuildError> {
        let rate = self.rate.ok_or(ConfigError::MissingRate)?;
        let params = Params::new(rate, self.capacity.unwrap_or(rate.permits()))?;
        let encoding = Encoding::new(params)?;
        for (name, t) in [
            ("timeout", self.timeout),
            ("connect_timeout", self.connect_timeout),
        ] {
            if t.is_zero() {
                return Err(ConfigError::InvalidParameter {
                    name,
                    reason: "must be positive",
                }
                .into());
            }
        }
        let client = self.client.clone().map_err(RedisBuildError::Redis)?;
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(self.connect_timeout))
            // Our own deadline (per decision) fires first; this one only
            // clears requests a stalled server never answers.
            .set_response_timeout(Some(self.timeout.saturating_mul(2)))
            // One connection attempt per reconnection, no backoff: while
            // Redis refuses connections a decision fails at once instead of
            // waiting out its deadline behind a backoff sleep, and the
            // first decision after Redis is back reconnects.
            .set_number_of_retries(0);
        let mut conn = ConnectionManager::new_lazy_with_config(client, config)
            .map_err(RedisBuildError::Redis)?;
        let script = Script::new(SCRIPT);
        match clock::timeout(self.connect_timeout, script.load_async(&mut conn)).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) if !e.is_timeout() => return Err(RedisBuildError::Redis(e)),
            // The connection attempt has the same timeout as ours, and
            // either may fire first: both are this one failure.
            Err(_) | Ok(Err(_)) => {
                return Err(RedisBuildError::Timeout {
                    timeout: self.connect_timeout,
                });
            }
        }
        Ok(RedisFunnel {
            inner: Arc::new(Inner {
                conn,
                script,
                encoding,
                rate,
                prefix: self.prefix.clone(),
                policy: self.policy,
                timeout: self.timeout,
                counters: Counters::default(),
                healthy: AtomicBool::new(true),
            }),
        })
    }
}

/// The decision script (see `gcra.lua` beside this file).
const SCRIPT: &str = include_str!("gcra.lua");

/// What the script answered.
#[derive(Debug, Clone, Copy)]
struct Answer {
    granted: bool,
    now_us: u64,
    wait: Split,
}

impl Answer {
    fn parse(reply: (i64, i64, i64, i64)) -> RedisResult<Answer> {
        let (granted, now, wait_us, wait_rem) = reply;
        match (
            granted,
            u64::try_from(now),
            u64::try_from(wait_us),
            u64::try_from(wait_rem),
        ) {
            (0 | 1, Ok(now_us), Ok(us), Ok(rem)) => Ok(Answer {
                granted: granted == 1,
                now_us,
                wait: Split { us, rem },
            }),
            _ => Err(RedisError::from((
                ErrorKind::UnexpectedReturnType,
                "unexpected reply from the rate limiter script",
            ))),
        }
    }
}

/// The script's reply, as the `redis` crate parses it.
type Reply = (i64, i64, i64, i64);

impl RedisFunnel {
    /// A builder that will connect to `client` (a
    /// [`redis::Client`] or a URL such as
    /// `"redis://127.0.0.1:6379/"`); [`rate`](Builder::rate) is required.
    pub fn builder(client: impl IntoClient) -> Builder {
        Builder {
            client: client.into_client(),
            rate: None,
            capacity: None,
            prefix: "rl:".to_owned(),
            policy: FailurePolicy::default(),
            timeout: Duration::from_millis(200),
            connect_timeout: Duration::from_secs(1),
        }
    }

    /// Takes one permit for `key` if it has one now.
    ///
    /// # Errors
    ///
    /// As [`try_acquire_many`](Self::try_acquire_many).
    ///
    /// # Cancel safety
    ///
    /// As [`try_acquire_many`](Self::try_acquire_many).
    pub async fn try_acquire(&self, key: &str) -> Result<(), RedisLimitError> {
        self.try_acquire_many(key, 1).await
    }

    /// Pours `n` units into `key`'s funnel if they fit now, in one round
    /// trip. `n = 0` succeeds without asking Redis.
    ///
    /// # Errors
    ///
    /// [`RedisLimitError::Limited`] with the exact time until they would
    /// fit; [`RedisLimitError::InsufficientCapacity`] when `n` exceeds the
    /// capacity (without asking Redis). Under [`FailurePolicy::Closed`],
    /// [`RedisLimitError::Timeout`] or [`RedisLimitError::Backend`] when
    /// Redis could not decide.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future while its script is in flight may spend the
    /// permits without using them (Redis may already have decided).
    pub async fn try_acquire_many(&self, key: &str, n: u32) -> Result<(), RedisLimitError> {
        if let Some(local) = self.local(n) {
            return local;
        }
        match self.eval(key, n).await {
            Ok(answer) => self.answered(answer),
            Err(e) => self.failed(e, 1),
        }
    }

    /// Waits until `key` has one permit, and takes it.
    ///
    /// # Errors
    ///
    /// As [`acquire_many`](Self::acquire_many).
    ///
    /// # Cancel safety
    ///
    /// As [`acquire_many`](Self::acquire_many).
    pub async fn acquire(&self, key: &str) -> Result<(), RedisLimitError> {
        self.acquire_many(key, 1).await
    }

    /// Waits until `n` units fit in `key`'s funnel, and pours them: asks,
    /// sleeps the `retry_after` Redis answered, asks again. Waiters are not
    /// queued (there is no queue shared by the replicas): one that loses a
    /// race sleeps again.
    ///
    /// # Errors
    ///
    /// [`RedisLimitError::InsufficientCapacity`] at once when `n` exceeds
    /// the capacity. Under [`FailurePolicy::Closed`], the first
    /// [`RedisLimitError::Timeout`] or [`RedisLimitError::Backend`]; it
    /// never returns `Limited`.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future while it sleeps spends nothing; while a script
    /// is in flight, as [`try_acquire_many`](Self::try_acquire_many).
    pub async fn acquire_many(&self, key: &str, n: u32) -> Result<(), RedisLimitError> {
        loop {
            match self.try_acquire_many(key, n).await {
                Err(RedisLimitError::Limited { retry_after }) => {
                    clock::sleep(retry_after).await;
                }
                other => return other,
            }
        }
    }

    /// Decides many requests, each on its own key's funnel, in one
    /// pipelined round trip: `requests[i] = (key, n)` gets `answers[i]`,
    /// what [`try_acquire_many`](Self::try_acquire_many)`(key, n)` would
    /// have answered. The same key may appear more than once; its requests
    /// are decided in order.
    ///
    /// The whole batch shares one deadline; when Redis cannot decide it,
    /// the failure policy applies to every request that needed Redis.
    ///
    /// # Cancel safety
    ///
    /// As [`try_acquire_many`](Self::try_acquire_many), for every request.
    pub async fn try_acquire_many_keys(
        &self,
        requests: &[(&str, u32)],
    ) -> Vec<Result<(), RedisLimitError>> {
        let mut answers: Vec<Option<Result<(), RedisLimitError>>> =
            requests.iter().map(|&(_, n)| self.local(n)).collect();
        let asked: Vec<(&str, u32)> = requests
            .iter()
            .zip(&answers)
            .filter(|(_, local)| local.is_none())
            .map(|(&r, _)| r)
            .collect();
        if !asked.is_empty() {
            let batch = self.resend_if_unsent(|| self.eval_many(&asked));
            let mut decided = match clock::timeout(self.inner.timeout, batch).await {
                Ok(Ok(replies)) => replies
                    .into_iter()
                    .map(|r| match r.and_then(Answer::parse) {
                        Ok(answer) => self.answered(answer),
                        Err(e) => self.failed(self.backend(e), 1),
                    })
                    .collect(),
                Ok(Err(e)) => self.failed_all(&self.backend(e), asked.len()),
                Err(_) => self.failed_all(&self.timed_out(), asked.len()),
            }
            .into_iter();
            for slot in answers.iter_mut().filter(|a| a.is_none()) {
                *slot = decided.next();
                if slot.is_none() {
                    break;
                }
            }
        }
        answers
            .into_iter()
            .map(|a| {
                a.unwrap_or_else(|| {
                    // Only if Redis answered fewer replies than commands.
                    let e = RedisError::from((ErrorKind::Parse, "missing pipeline reply"));
                    self.failed(RedisLimitError::Backend(e), 1)
                })
            })
            .collect()
    }

    /// One decision exactly as Redis made it, with the server time it was
    /// made at, and no failure policy: Redis failures come back as errors
    /// (and are counted in the stats, but never granted). For logging, for
    /// tests, and for callers that apply their own policy.
    ///
    /// `n = 0` asks Redis too (for its time) and changes nothing.
    ///
    /// # Errors
    ///
    /// [`RedisLimitError::InsufficientCapacity`] when `n` exceeds the
    /// capacity; [`RedisLimitError::Timeout`] or [`RedisLimitError::Backend`]
    /// when Redis could not decide. Never `Limited`: a refusal is a
    /// [`Decision`] with a `retry_after`.
    ///
    /// # Cancel safety
    ///
    /// As [`try_acquire_many`](Self::try_acquire_many).
    pub async fn decide(&self, key: &str, n: u32) -> Result<Decision, RedisLimitError> {
        if n > self.capacity() {
            return Err(RedisLimitError::InsufficientCapacity);
        }
        match self.eval(key, n).await {
            Ok(answer) => {
                // Counted (and logged) like any decision; a refusal is a
                // value here, not an error.
                let retry_after = self.answered(answer).err().and_then(|e| e.retry_after());
                Ok(Decision {
                    retry_after,
                    server_time: SystemTime::UNIX_EPOCH + Duration::from_micros(answer.now_us),
                })
            }
            Err(e) => {
                self.count_failure(&e, 1);
                Err(e)
            }
        }
    }

    /// The counters of this limiter and its clones.
    pub fn stats(&self) -> RedisStats {
        let c = &self.inner.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        RedisStats {
            decisions: get(&c.decisions),
            granted: get(&c.granted),
            limited: get(&c.limited),
            backend_errors: get(&c.backend_errors),
            timeouts: get(&c.timeouts),
            fail_open_grants: get(&c.fail_open_grants),
            retries: get(&c.retries),
        }
    }

    /// The leak rate.
    pub fn rate(&self) -> Rate {
        self.inner.rate
    }

    /// Each key's capacity, in units.
    pub fn capacity(&self) -> u32 {
        self.inner.encoding.params().capacity()
    }

    /// The prefix of every Redis key.
    pub fn prefix(&self) -> &str {
        &self.inner.prefix
    }

    /// The Redis key that holds `key`'s state: the prefix, then the key.
    pub fn redis_key(&self, key: &str) -> String {
        let mut k = String::with_capacity(self.inner.prefix.len() + key.len());
        k.push_str(&self.inner.prefix);
        k.push_str(key);
        k
    }

    /// The failure policy.
    pub fn failure_policy(&self) -> FailurePolicy {
        self.inner.policy
    }

    /// The deadline of each decision.
    pub fn timeout(&self) -> Duration {
        self.inner.timeout
    }

    /// A request decided without Redis.
    fn local(&self, n: u32) -> Option<Result<(), RedisLimitError>> {
        if n > self.capacity() {
            Some(Err(RedisLimitError::InsufficientCapacity))
        } else if n == 0 {
            Some(Ok(()))
        } else {
            None
        }
    }

    /// One script call, within the deadline (a second attempt included,
    /// see [`resend_if_unsent`](Self::resend_if_unsent)).
    async fn eval(&self, key: &str, n: u32) -> Result<Answer, RedisLimitError> {
        let attempt = || {
            let mut conn = self.inner.conn.clone();
            let mut call = self.inner.script.prepare_invoke();
            self.script_args(&mut call, key, n);
            // `invoke_async` sends EVALSHA, and on NOSCRIPT loads the
            // script and sends it again.
            async move { call.invoke_async::<Reply>(&mut conn).await }
        };
        match clock::timeout(self.inner.timeout, self.resend_if_unsent(attempt)).await {
            Err(_) => Err(self.timed_out()),
            Ok(Err(e)) => Err(self.backend(e)),
            Ok(Ok(reply)) => Answer::parse(reply).map_err(RedisLimitError::Backend),
        }
    }

    /// Runs `attempt`, and runs it once more if it failed before its
    /// request could leave this process; the caller's deadline covers
    /// both.
    ///
    /// The script pours, so a request Redis may have run must not be sent
    /// again. The `redis` crate reports a connection closed before the send
    /// and one closed after it with the same error (`BrokenPipe`, from its
    /// connection task having ended), so the error alone proves nothing.
    /// What proves it is *when* it came: the connection manager hands a
    /// request to its connection task through a channel, and only that
    /// task writes to the socket. An attempt that fails on its first poll
    /// with a dropped connection failed in that hand-over — the task had
    /// already ended (the server closed the idle connection: `CLIENT KILL`,
    /// its idle `timeout`, a restart) or the reconnection had already
    /// failed — so nothing was written, and the manager is now
    /// reconnecting. (On a multi-thread runtime that task runs alongside;
    /// for a request it wrote to fail within our one poll, Redis would have
    /// to receive and run it and the close come back between two steps of
    /// that poll, well under one loopback round trip.) Any later failure
    /// may follow a write, and stands. The
    /// first poll runs unconstrained so that a caller's spent cooperative
    /// budget cannot turn that hand-over into `Pending` (tokio 1.54 reports
    /// a closed channel before it checks the budget, but does not promise
    /// to).
    async fn resend_if_unsent<T, F, Fut>(&self, mut attempt: F) -> RedisResult<T>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = RedisResult<T>>,
    {
        let mut first = pin!(tokio::task::unconstrained(attempt()));
        match poll_fn(|cx| Poll::Ready(first.as_mut().poll(cx))).await {
            Poll::Ready(Err(e)) if e.is_connection_dropped() => {
                self.inner.counters.retries.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(
                    prefix = %self.inner.prefix,
                    error = %e,
                    "redis rate limiter: connection closed before the request was sent, sending again",
                );
                attempt().await
            }
            Poll::Ready(result) => result,
            Poll::Pending => first.await,
        }
    }

    fn script_args(&self, call: &mut ::redis::ScriptInvocation<'_>, key: &str, n: u32) {
        let e = &self.inner.encoding;
        let (cost, tau) = (e.cost(n), e.tau());
        call.key(self.redis_key(key))
            .arg(e.unit())
            .arg(cost.us)
            .arg(cost.rem)
            .arg(tau.us)
            .arg(tau.rem);
    }

    /// Script calls for many keys in one pipeline; the ones that find the
    /// script flushed go again after a `SCRIPT LOAD`.
    async fn eval_many(&self, asked: &[(&str, u32)]) -> RedisResult<Vec<RedisResult<Reply>>> {
        let mut conn = self.inner.conn.clone();
        let mut replies: Vec<RedisResult<Reply>> =
            self.pipeline(asked).query_async(&mut conn).await?;
        let missing: Vec<usize> = (0..replies.len())
            .filter(|&i| {
                matches!(&replies[i], Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript))
            })
            .collect();
        if !missing.is_empty() {
            self.inner.script.load_async(&mut conn).await?;
            let again: Vec<(&str, u32)> = missing.iter().map(|&i| asked[i]).collect();
            let retried: Vec<RedisResult<Reply>> =
                self.pipeline(&again).query_async(&mut conn).await?;
            for (i, r) in missing.into_iter().zip(retried) {
                replies[i] = r;
            }
        }
        Ok(replies)
    }

    fn pipeline(&self, asked: &[(&str, u32)]) -> ::redis::Pipeline {
        let e = &self.inner.encoding;
        let tau = e.tau();
        let mut pipe = ::redis::Pipeline::with_capacity(asked.len());
        pipe.ignore_errors();
        for &(key, n) in asked {
            let cost = e.cost(n);
            pipe.cmd("EVALSHA")
                .arg(self.inner.script.get_hash())
                .arg(1)
                .arg(self.redis_key(key))
                .arg(e.unit())
                .arg(cost.us)
                .arg(cost.rem)
                .arg(tau.us)
                .arg(tau.rem);
        }
        pipe
    }

    /// A Redis error; its own timeouts count as ours.
    fn backend(&self, e: RedisError) -> RedisLimitError {
        if e.is_timeout() {
            self.timed_out()
        } else {
            RedisLimitError::Backend(e)
        }
    }

    fn timed_out(&self) -> RedisLimitError {
        RedisLimitError::Timeout {
            timeout: self.inner.timeout,
        }
    }

    /// Counts Redis's answer and turns it into the caller's.
    fn answered(&self, answer: Answer) -> Result<(), RedisLimitError> {
        let c = &self.inner.counters;
        c.decisions.fetch_add(1, Ordering::Relaxed);
        if !self.inner.healthy.load(Ordering::Relaxed)
            && !self.inner.healthy.swap(true, Ordering::Relaxed)
        {
            tracing::info!(prefix = %self.inner.prefix, "redis rate limiter: backend recovered");
        }
        if answer.granted {
            c.granted.fetch_add(1, Ordering::Relaxed);
            Ok(())
        } else {
            c.limited.fetch_add(1, Ordering::Relaxed);
            Err(RedisLimitError::Limited {
                retry_after: self.inner.encoding.retry_after(answer.wait),
            })
        }
    }

    fn count_failure(&self, e: &RedisLimitError, decisions: u64) {
        let c = &self.inner.counters;
        c.decisions.fetch_add(decisions, Ordering::Relaxed);
        c.backend_errors.fetch_add(decisions, Ordering::Relaxed);
        if matches!(e, RedisLimitError::Timeout { .. }) {
            c.timeouts.fetch_add(decisions, Ordering::Relaxed);
        }
        if self.inner.healthy.swap(false, Ordering::Relaxed) {
            tracing::warn!(
                prefix = %self.inner.prefix,
                policy = ?self.inner.policy,
                error = %e,
                "redis rate limiter: backend failed, applying the failure policy",
            );
        } else {
            tracing::debug!(prefix = %self.inner.prefix, error = %e, "redis rate limiter: backend failed");
        }
    }

    /// Applies the failure policy to `decisions` decisions Redis could not
    /// make.
    fn failed(&self, e: RedisLimitError, decisions: u64) -> Result<(), RedisLimitError> {
        self.count_failure(&e, decisions);
        match self.inner.policy {
            FailurePolicy::Open => {
                self.inner
                    .counters
                    .fail_open_grants
                    .fetch_add(decisions, Ordering::Relaxed);
                Ok(())
            }
            FailurePolicy::Closed => Err(e),
        }
    }

    fn failed_all(&self, e: &RedisLimitError, count: usize) -> Vec<Result<(), RedisLimitError>> {
        let outcome = self.failed(e.clone(), count as u64);
        vec![outcome; count]
    }
}

impl fmt::Debug for RedisFunnel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisFunnel")
            .field("rate", &self.inner.rate)
            .field("capacity", &self.capacity())
            .field("prefix", &self.inner.prefix)
            .field("policy", &self.inner.policy)
            .field("timeout", &self.inner.timeout)
            .finish_non_exhaustive()
    }
}
