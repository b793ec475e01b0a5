//! [`RedisFunnelBuilder`]: a [`RedisFunnel`]'s configuration, checked, connected and
//! its script loaded by [`RedisFunnelBuilder::build`]; and [`IntoClient`], what the
//! builder connects to.

use std::sync::atomic::AtomicBool;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use ::redis::{Client, ConnectionInfo, RedisResult, Script};

use super::cache::RefusalCache;
use super::cluster::{self, Slots};
use super::conn::{Conn, Node};
use super::limiter::Inner;
use super::repr::Encoded;
use super::script::{Ids, ServerClock, texts};
use super::stats::Counters;
use super::{FailurePolicy, RedisBuildError, RedisFunnel, RedisLimitError};
use crate::{ConfigError, Quota, Rate, clock};

/// Where a [`RedisFunnel`] connects: a [`redis::Client`],
/// or anything the `redis` crate opens one from (a URL as `&str` or
/// `String`, a [`ConnectionInfo`](::redis::ConnectionInfo)).
pub trait IntoClient {
    /// Opens (or passes on) the client. An invalid URL is reported by
    /// [`RedisFunnelBuilder::build`].
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

/// Configures a [`RedisFunnel`]; made by [`RedisFunnel::builder`] (one
/// server) or [`RedisFunnel::cluster_builder`] (a Redis Cluster).
#[derive(Debug, Clone)]
pub struct RedisFunnelBuilder {
    target: Target,
    rate: Option<Rate>,
    capacity: Option<u32>,
    quota: Option<Quota>,
    prefix: String,
    policy: FailurePolicy,
    timeout: Duration,
    connect_timeout: Duration,
    refusal_cache: usize,
    name: crate::meter::Name,
}

/// What a builder connects to.
#[derive(Debug, Clone)]
enum Target {
    Node(RedisResult<Client>),
    /// The nodes the cluster client starts from (any of the cluster's).
    Cluster(RedisResult<Vec<ConnectionInfo>>),
}

/// The refusal cache's default size: enough for every key a few abusive
/// clients hammer at once, about 150 KB.
const REFUSAL_CACHE: usize = 1024;

/// The refusal cache's largest size: its slots are allocated at build.
const MAX_REFUSAL_CACHE: usize = 1 << 24;

impl RedisFunnelBuilder {
    /// The defaults, connecting to `client`.
    pub(super) fn new(client: RedisResult<Client>) -> RedisFunnelBuilder {
        Self::to(Target::Node(client))
    }

    /// The defaults, connecting to the cluster of `nodes`.
    pub(super) fn cluster(nodes: RedisResult<Vec<ConnectionInfo>>) -> RedisFunnelBuilder {
        Self::to(Target::Cluster(nodes))
    }

    fn to(target: Target) -> RedisFunnelBuilder {
        RedisFunnelBuilder {
            target,
            rate: None,
            capacity: None,
            quota: None,
            prefix: "rl:".to_owned(),
            policy: FailurePolicy::default(),
            timeout: Duration::from_millis(200),
            connect_timeout: Duration::from_secs(1),
            refusal_cache: REFUSAL_CACHE,
            name: crate::meter::Name::default(),
        }
    }

    /// The leak rate of every key's funnel: a one-band quota (this, or a
    /// [`quota`](Self::quota), is required).
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

    /// Every key's quota, all its bands (instead of a
    /// [`rate`](Self::rate) and a [`capacity`](Self::capacity)): a request
    /// is granted only if every band grants it. All the bands of a key live
    /// in its one Redis key and are decided by one script call, in one
    /// round trip. Calls that pass a quota of their own
    /// ([`try_acquire_with`](RedisFunnel::try_acquire_with) and the other
    /// `_with` methods) use theirs instead.
    ///
    /// ```no_run
    /// use tokio_ratelimit::{Quota, Rate};
    /// use tokio_ratelimit::redis::RedisFunnel;
    ///
    /// # #[tokio::main]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// // 20 per second with bursts of 40, and 10 000 per day.
    /// let free = Quota::new(Rate::per_second(20), 40).and(Rate::per_day(10_000), 10_000);
    /// let limiter = RedisFunnel::builder("redis://127.0.0.1:6379/")
    ///     .quota(free)
    ///     .build()
    ///     .await?;
    /// assert_eq!(limiter.quota(), free);
    /// assert_eq!(limiter.capacity(), 40);
    /// # Ok(())
    /// # }
    /// ```
    pub fn quota(&mut self, quota: Quota) -> &mut Self {
        self.quota = Some(quota);
        self
    }

    /// Prepended to every key to make its Redis key (default `"rl:"`).
    /// Limiters that share a prefix share their keys' budgets: give each
    /// limit its own prefix.
    ///
    /// On a cluster, a prefix with a hash tag in it (`{`, then at least one
    /// byte, then `}`, such as `"rl:{api}:"`) would put every key in one
    /// slot, so on one node: [`build`](Self::build) refuses it. Put a tag in
    /// the key instead (`"{user42}"`) to choose which keys share a slot.
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

    /// How long `build()` waits for Redis to load the scripts, and each
    /// connection attempt may take (default 1 s).
    pub fn connect_timeout(&mut self, timeout: Duration) -> &mut Self {
        self.connect_timeout = timeout;
        self
    }

    /// How many recent refusals to keep in this process (default 1 024; 0
    /// turns the cache off). A key Redis refused `n` permits until `t` is
    /// refused `n` or more here, under the same quota, until then, without
    /// a round trip: a client hammering a key over its limit costs Redis
    /// one decision per `retry_after`, not one per request. It never
    /// grants, and it only refuses what Redis would: the script only ever
    /// moves a key's instants later, so a refusal holds until its
    /// `retry_after` has passed, whatever other processes ask meanwhile
    /// (see the module docs for what can break that: a key deleted by
    /// hand, a failover that lost writes). One slot per key hash, so a
    /// flood of distinct keys overwrites slots instead of growing the cache.
    /// Counted in [`RedisStats::cached_refusals`](super::RedisStats::cached_refusals).
    /// More than 2²⁴ slots is refused at build (they are allocated then).
    pub fn refusal_cache(&mut self, slots: usize) -> &mut Self {
        self.refusal_cache = slots;
        self
    }

    /// Names the limiter for its metrics: the `limiter` label of its
    /// series, its [`RedisStats`](super::RedisStats) counters and its
    /// decisions' latency (see [`crate::metrics`]). Unnamed, it records
    /// none.
    /// An empty name is refused by `build`
    /// ([`ConfigError::InvalidParameter`]).
    #[cfg(feature = "metrics")]
    #[cfg_attr(docsrs, doc(cfg(feature = "metrics")))]
    pub fn name(&mut self, name: impl Into<String>) -> &mut Self {
        self.name.set(name.into());
        self
    }

    /// Connects, loads the scripts (`SCRIPT LOAD`: the decision's and the
    /// peek's), and returns the limiter.
    ///
    /// # Errors
    ///
    /// [`RedisBuildError::Config`]: [`ConfigError::MissingRate`] (neither a
    /// rate nor a quota), [`ConfigError::InvalidRate`],
    /// [`ConfigError::ZeroCapacity`] (of any band),
    /// [`ConfigError::InvalidParameter`] for a quota given with a rate or a
    /// capacity, a quota of more than [`Quota::MAX_BANDS`] bands, a zero
    /// timeout, or a band deeper than 2⁵⁰ µs (`capacity × interval`).
    /// [`RedisBuildError::Redis`]
    /// for an invalid URL or a Redis that refuses the connection or the
    /// script; [`RedisBuildError::Timeout`] when it does not answer within
    /// the connect timeout.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future leaves nothing behind but the loaded script.
    pub async fn build(&self) -> Result<RedisFunnel, RedisBuildError> {
        self.name.check()?;
        let quota = Quota::configured(self.rate, self.capacity, self.quota)?;
        let encoded = Encoded::new(&quota)?;
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
        if self.refusal_cache > MAX_REFUSAL_CACHE {
            return Err(ConfigError::InvalidParameter {
                name: "refusal_cache",
                reason: "at most 2^24 slots (each is allocated at build)",
            }
            .into());
        }
        // Our own deadline (per decision) fires first; the clients' only
        // clears requests a stalled server never answers.
        let response_timeout = self.timeout.saturating_mul(2);
        // Connected (a cluster: its topology read) and both scripts loaded
        // now, so that a first decision or peek is one round trip too; on a
        // cluster `SCRIPT LOAD` goes to every node, replicas included.
        let connect = async {
            let mut conn = match &self.target {
                Target::Node(client) => {
                    let config = ::redis::AsyncConnectionConfig::new()
                        .set_connection_timeout(Some(self.connect_timeout))
                        .set_response_timeout(Some(response_timeout));
                    // One connection attempt per request that finds none,
                    // no backoff: while Redis refuses connections a
                    // decision fails at once instead of waiting out its
                    // deadline behind a backoff sleep, and the first
                    // decision after Redis is back reconnects.
                    let info = client.clone()?.get_connection_info().clone();
                    Conn::Node(Arc::new(Node::new(info, config, self.connect_timeout)))
                }
                Target::Cluster(nodes) => {
                    let client =
                        cluster::client(nodes.clone()?, self.connect_timeout, response_timeout)?;
                    let mut conn = client.get_async_connection().await?;
                    let slots = Slots::default();
                    slots.fetch(&mut conn).await?;
                    Conn::Cluster {
                        conn,
                        slots,
                        epoch: Arc::default(),
                    }
                }
            };
            let (text, peek_text) = texts(&conn);
            let (script, peek_script) = (Script::new(text), Script::new(peek_text));
            script.load_async(&mut conn).await?;
            peek_script.load_async(&mut conn).await?;
            Ok::<_, ::redis::RedisError>((conn, script, peek_script))
        };
        if let Target::Cluster(_) = self.target {
            check_prefix(&self.prefix)?;
        }
        let (conn, script, peek_script) = match clock::timeout(self.connect_timeout, connect).await
        {
            Ok(Ok(connected)) => connected,
            Ok(Err(e)) if !e.is_timeout() => return Err(RedisBuildError::Redis(e)),
            // The connection attempt has the same timeout as ours, and
            // either may fire first: both are this one failure.
            Err(_) | Ok(Err(_)) => {
                return Err(RedisBuildError::Timeout {
                    timeout: self.connect_timeout,
                });
            }
        };
        let funnel = RedisFunnel {
            inner: Arc::new(Inner {
                conn,
                script,
                peek_script,
                encoded: RwLock::new(encoded),
                prefix: self.prefix.clone(),
                policy: self.policy,
                timeout: self.timeout,
                counters: Counters::named(&self.name),
                healthy: AtomicBool::new(true),
                ids: Ids::new(),
                server_clock: ServerClock::new(matches!(self.target, Target::Cluster(_))),
                refusals: (self.refusal_cache > 0).then(|| RefusalCache::new(self.refusal_cache)),
            }),
        };
        self.check_clock(&funnel).await?;
        Ok(funnel)
    }

    /// Checks that the server's scripts see a sane clock: one look (a
    /// read-only script reading `TIME`, and `GET` of a key no caller names,
    /// which changes nothing), within the connect timeout.
    async fn check_clock(&self, funnel: &RedisFunnel) -> Result<(), RedisBuildError> {
        /// 2020-01-01T00:00:00Z.
        const SANE_US: u64 = 1_577_836_800_000_000;
        let look = clock::timeout(self.connect_timeout, funnel.look("\u{0}clock")).await;
        let server_time_us = match look {
            Ok(Ok((now_us, _))) => now_us,
            Ok(Err(RedisLimitError::Backend(e))) => return Err(RedisBuildError::Redis(e)),
            Ok(Err(_)) | Err(_) => {
                return Err(RedisBuildError::Timeout {
                    timeout: self.connect_timeout,
                });
            }
        };
        // Below 2⁵² µs (the year 2112) the script's arithmetic is exact.
        if !(SANE_US..1 << 52).contains(&server_time_us) {
            return Err(RedisBuildError::Clock { server_time_us });
        }
        Ok(())
    }
}

/// Refuses a cluster prefix with a hash tag: every key would hash to the
/// tag, so to one slot and one node (see
/// [`RedisFunnelBuilder::prefix`]).
fn check_prefix(prefix: &str) -> Result<(), ConfigError> {
    // A tag in the prefix is a tag of every key: a `{` there, and a `}`
    // after it there, with something between. (A `{` whose `}` is in the
    // key leaves the choice to the key.)
    match cluster::hash_tag(prefix.as_bytes()) {
        Some(_) => Err(ConfigError::InvalidParameter {
            name: "prefix",
            reason: "a hash tag ({...}) in the prefix puts every key in one cluster slot",
        }),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::super::{FailurePolicy, RedisFunnel};

    /// The defaults the setters' docs promise (no Redis needed: opening a
    /// client from a URL does not connect).
    #[test]
    fn defaults_are_the_documented_ones() {
        let b = RedisFunnel::builder("redis://127.0.0.1:6379/");
        assert!(matches!(b.target, super::Target::Node(Ok(_))));
        assert!(b.rate.is_none());
        assert!(b.capacity.is_none());
        assert!(b.quota.is_none());
        assert_eq!(b.prefix, "rl:");
        assert_eq!(b.policy, FailurePolicy::Open);
        assert_eq!(b.timeout, Duration::from_millis(200));
        assert_eq!(b.connect_timeout, Duration::from_secs(1));
    }
}
