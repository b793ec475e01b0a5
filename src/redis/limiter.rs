//! [`RedisFunnel`], the handle users hold: its decisions, waiting as a loop
//! of decisions, and what it does when Redis cannot decide
//! ([`FailurePolicy`]).

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, PoisonError, RwLock};
use std::time::{Duration, SystemTime};

use ::redis::{IntoConnectionInfo, Script};

use super::cache::RefusalCache;
use super::conn::Conn;
use super::repr::Encoded;
use super::script::{Answer, Ids, ServerClock};
use super::state;
use super::stats::Counters;
use super::{IntoClient, RedisFunnelBuilder, RedisLimitError, RedisStats};
use crate::{Peek, Quota, Rate, clock};

/// The funnel per key, its state in Redis: one limit shared by every
/// process that uses the same server and prefix.
///
/// Cheap to clone (one `Arc`); clones share the connection and the
/// counters. See the [module docs](super) for the model, the failure policy
/// and the exact arithmetic.
#[derive(Clone)]
pub struct RedisFunnel {
    pub(super) inner: Arc<Inner>,
}

/// What a `RedisFunnel` and its clones share. Made by
/// [`RedisFunnelBuilder::build`]; `script.rs` does its I/O.
pub(super) struct Inner {
    pub(super) conn: Conn,
    pub(super) script: Script,
    pub(super) peek_script: Script,
    /// The quota of every call that does not pass its own.
    /// The quota of the calls that name none ([`RedisFunnel::set_quota`]
    /// replaces it); read once per call.
    pub(super) encoded: RwLock<Encoded>,
    pub(super) prefix: String,
    pub(super) policy: FailurePolicy,
    pub(super) timeout: Duration,
    pub(super) counters: Counters,
    /// Whether the last decision reached Redis (for logging transitions).
    pub(super) healthy: AtomicBool,
    /// Recent refusals, answered without a round trip (`None`: off).
    pub(super) refusals: Option<RefusalCache>,
    /// Each decision's id (see `script.rs` on resends).
    pub(super) ids: Ids,
    /// The servers' clocks as replies showed them (for resends).
    pub(super) server_clock: ServerClock,
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

impl RedisFunnel {
    /// A builder that will connect to `client` (a
    /// [`redis::Client`] or a URL such as
    /// `"redis://127.0.0.1:6379/"`); a [`rate`](RedisFunnelBuilder::rate) or a
    /// [`quota`](RedisFunnelBuilder::quota) is required.
    pub fn builder(client: impl IntoClient) -> RedisFunnelBuilder {
        RedisFunnelBuilder::new(client.into_client())
    }

    /// A builder that will connect to the Redis Cluster that `nodes` belong
    /// to (URLs such as `"redis://10.0.0.1:6379/"`, or any
    /// [`IntoConnectionInfo`]; one reachable node is enough, the others are
    /// found through it); a [`rate`](RedisFunnelBuilder::rate) or a
    /// [`quota`](RedisFunnelBuilder::quota) is required. The same API and
    /// the same answers as on one server; see the [module docs](super#redis-cluster)
    /// for slots, hash tags, batches and failovers.
    ///
    /// The cluster client is built here, not taken ready-made: it must not
    /// retry on its own (a request resent after a dropped connection may
    /// pour twice), and a [`ClusterClient`](::redis::cluster::ClusterClient)'s
    /// retries cannot be changed once built. Credentials and TLS go in the
    /// URLs (`rediss://user:password@host:port/`).
    ///
    /// ```no_run
    /// use tokio_ratelimit::Rate;
    /// use tokio_ratelimit::redis::RedisFunnel;
    ///
    /// # #[tokio::main]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let limiter = RedisFunnel::cluster_builder(["redis://10.0.0.1:6379/", "redis://10.0.0.2:6379/"])
    ///     .rate(Rate::per_second(10))
    ///     .capacity(20)
    ///     .build()
    ///     .await?;
    /// limiter.try_acquire("user:42").await?;
    /// // One pipeline per master involved, sent concurrently.
    /// let answers = limiter.try_acquire_many_keys(&[("user:1", 1), ("user:2", 1)]).await;
    /// # Ok(())
    /// # }
    /// ```
    pub fn cluster_builder<T: IntoConnectionInfo>(
        nodes: impl IntoIterator<Item = T>,
    ) -> RedisFunnelBuilder {
        let nodes = nodes
            .into_iter()
            .map(IntoConnectionInfo::into_connection_info)
            .collect();
        RedisFunnelBuilder::cluster(nodes)
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

    /// Pours `n` units into every band of `key`'s funnel if they fit in
    /// every band now, in one round trip (one script call, whatever the
    /// number of bands); a request some band refuses changes no band.
    /// `n = 0` succeeds without asking Redis.
    ///
    /// # Errors
    ///
    /// [`RedisLimitError::Limited`] with the exact time until every band
    /// would let them in (the latest of the bands' waits);
    /// [`RedisLimitError::InsufficientCapacity`] when `n` exceeds the
    /// capacity, the smallest band's (without asking Redis). Under
    /// [`FailurePolicy::Closed`], [`RedisLimitError::Timeout`] or
    /// [`RedisLimitError::Backend`] when Redis could not decide.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future while its script is in flight may spend the
    /// permits without using them (Redis may already have decided).
    pub async fn try_acquire_many(&self, key: &str, n: u32) -> Result<(), RedisLimitError> {
        self.try_acquire_encoded(key, &self.own(), n).await
    }

    /// As [`try_acquire_many`](Self::try_acquire_many), under `quota`
    /// instead of the limiter's own: a quota per call, so that keys of
    /// different tiers (free and paid) share one prefix. Nothing of the
    /// quota is stored in Redis — a key's state holds only its bands'
    /// instants — so a key costs the same whatever the number of tiers in
    /// use: 3 numbers per band, about 25 bytes of string each.
    ///
    /// # Tier changes
    ///
    /// A key decided under one quota and then another (its tier changed)
    /// keeps, band by band, the instant at which its band is full again:
    /// the new quota's band `i` starts from the stored band `i`'s instant.
    /// So the *time until the band is full again* carries over, not its
    /// count of permits; for two tiers whose band has the same window
    /// (capacity ÷ rate, say 10/s with a burst of 10 and 100/s with a burst
    /// of 100) that is the fraction of the band in use, Bucket4j's
    /// `PROPORTIONALLY`. A band whose time left exceeds the new band's
    /// depth is over-full: it grants again once enough has drained. An
    /// instant written under a rate of other units (another reduced
    /// denominator) is rounded up to the next whole microsecond. Stored
    /// bands beyond the new quota's are kept as they are — written back
    /// unchanged and counted in the key's expiry — so a key moved to a
    /// quota of fewer bands and back finds them as it left them (drained
    /// meanwhile); bands the state lacks read as full (empty of water).
    ///
    /// # Errors
    ///
    /// As [`try_acquire_many`](Self::try_acquire_many), with the capacity
    /// `quota`'s; and [`RedisLimitError::InvalidQuota`] when `quota` is one
    /// a builder would refuse, decided without asking Redis (and never
    /// granted by [`FailurePolicy::Open`]).
    ///
    /// # Cancel safety
    ///
    /// As [`try_acquire_many`](Self::try_acquire_many).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use tokio_ratelimit::{Quota, Rate};
    /// use tokio_ratelimit::redis::RedisFunnel;
    ///
    /// # #[tokio::main]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let free = Quota::new(Rate::per_second(20), 40).and(Rate::per_day(10_000), 10_000);
    /// let paid = Quota::new(Rate::per_second(200), 400).and(Rate::per_day(100_000), 100_000);
    /// let limiter = RedisFunnel::builder("redis://127.0.0.1:6379/")
    ///     .quota(free)
    ///     .prefix("rl:api:")
    ///     .build()
    ///     .await?;
    /// # let is_paid = |_: &str| false;
    /// let key = "user:42";
    /// let quota = if is_paid(key) { &paid } else { &free };
    /// limiter.try_acquire_with(key, quota, 1).await?;
    /// # Ok(())
    /// # }
    /// ```
    pub async fn try_acquire_with(
        &self,
        key: &str,
        quota: &Quota,
        n: u32,
    ) -> Result<(), RedisLimitError> {
        let quota = self.encode(quota)?;
        self.try_acquire_encoded(key, &quota, n).await
    }

    async fn try_acquire_encoded(
        &self,
        key: &str,
        quota: &Encoded,
        n: u32,
    ) -> Result<(), RedisLimitError> {
        if let Some(local) = local(quota, n) {
            return local;
        }
        let sent = clock::now();
        // One deadline for the call: a reconnect for the refusal cache, then
        // the decision.
        let deadline = self.deadline_from(sent);
        if let Some(refused) = self.cached(key, quota, n, sent, deadline).await {
            return refused;
        }
        let epoch = self.inner.conn.epoch();
        match self.eval(key, quota, n, deadline).await {
            Ok(raw) => {
                let answer = self.answered(raw, quota);
                self.remember(key, quota, n, (sent, epoch), (&answer, &raw));
                answer
            }
            Err(e) => self.failed(e, 1),
        }
    }

    /// A refusal the [refusal cache](super::cache) still holds in the
    /// connection's epoch, counted.
    ///
    /// On one server, only while the connection the refusal was learned
    /// through is open (no round trip tells that: see `conn.rs`). If it was
    /// closed, the server may have restarted without its data, so this
    /// first tries to connect again (or waits for another request's
    /// attempt), within the deadline: if Redis is back, the epoch has moved
    /// and Redis decides; if it cannot be reached, the refusal stands while
    /// it lasts — Redis, once back with its data, would give it too — with
    /// its wait from the time the attempt ended. A refusal that ran out
    /// meanwhile is not answered: Redis would grant now and cannot be
    /// asked, so the failure policy answers, with why Redis could not be
    /// reached.
    async fn cached(
        &self,
        key: &str,
        quota: &Encoded,
        n: u32,
        now: tokio::time::Instant,
        deadline: tokio::time::Instant,
    ) -> Option<Result<(), RedisLimitError>> {
        self.cached_seen(key, quota, n, now, deadline)
            .await
            .map(|(answer, _)| answer)
    }

    /// [`cached`](Self::cached), and for a refusal what it showed of the
    /// key's bands, moved on to now (see [`RefusalCache::refused_seen`](super::cache::RefusalCache::refused_seen)).
    async fn cached_seen(
        &self,
        key: &str,
        quota: &Encoded,
        n: u32,
        now: tokio::time::Instant,
        deadline: tokio::time::Instant,
    ) -> Option<(Result<(), RedisLimitError>, Option<super::cache::Seen>)> {
        let cache = self.inner.refusals.as_ref()?;
        let epoch = self.inner.conn.epoch();
        let (mut retry_after, mut seen) = cache.refused_seen(key, quota.quota(), n, now, epoch)?;
        if let Conn::Node(node) = &self.inner.conn
            && !node.open()
        {
            let timeout = self.inner.timeout;
            // Boxed: a connection's handshake is a large future, and
            // this is the rare path of every call's.
            let reconnect = Box::pin(node.reconnect());
            let unreachable = match clock::timeout_at(deadline, reconnect).await {
                Ok(Ok(())) if self.inner.conn.epoch() != epoch => return None,
                Ok(Ok(())) => None,
                Ok(Err(e)) => Some(RedisLimitError::Backend(e)),
                Err(_) => Some(RedisLimitError::Timeout { timeout }),
            };
            match (
                cache.refused_seen(key, quota.quota(), n, clock::now(), epoch),
                unreachable,
            ) {
                (Some(left), _) => (retry_after, seen) = left,
                (None, Some(error)) => return Some((self.failed(error, 1), None)),
                // Open again (in the same epoch): Redis decides.
                (None, None) => return None,
            }
        }
        self.inner.counters.cached_refusals.add(1);
        Some((Err(RedisLimitError::Limited { retry_after }), seen))
    }

    /// What the refusal cache learns from Redis's `answer` (as
    /// [`answered`](Self::answered) made it) to a request sent at
    /// `sent.0` in the connection's epoch `sent.1`: a refusal is kept, a
    /// grant removes the key's entry. Only for answers Redis gave, never
    /// for a failure policy's.
    fn remember(
        &self,
        key: &str,
        quota: &Encoded,
        n: u32,
        sent: (tokio::time::Instant, u64),
        (answer, raw): (&Result<(), RedisLimitError>, &Answer),
    ) {
        let Some(cache) = &self.inner.refusals else {
            return;
        };
        match answer {
            Err(RedisLimitError::Limited { retry_after }) => {
                let seen = raw.instants.map(|instants| super::cache::Seen {
                    instants,
                    now_us: raw.now_us,
                });
                cache.remember(key, quota.quota(), n, sent.0, *retry_after, sent.1, seen);
            }
            Ok(()) => cache.forget(key),
            Err(_) => {}
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

    /// Waits until `n` units fit in every band of `key`'s funnel, and
    /// pours them: asks, sleeps the `retry_after` Redis answered, asks
    /// again. Waiters are not queued (there is no queue shared by the
    /// replicas): one that loses a race sleeps again.
    ///
    /// Waiters on one key in many replicas are refused together and would
    /// all ask again at the same instant, a thundering herd on one key. So
    /// each sleeps `retry_after` and a random part of a tenth more (at most
    /// 50 ms more): never longer than needed by more than 10 %.
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
        self.acquire_encoded(key, || self.own(), n).await
    }

    /// As [`acquire_many`](Self::acquire_many), under `quota` instead of
    /// the limiter's own (the quota is checked once, before the first
    /// ask); see [`try_acquire_with`](Self::try_acquire_with) for tiers.
    ///
    /// # Errors
    ///
    /// As [`acquire_many`](Self::acquire_many), with the capacity
    /// `quota`'s; and [`RedisLimitError::InvalidQuota`] at once for a quota
    /// a builder would refuse.
    ///
    /// # Cancel safety
    ///
    /// As [`acquire_many`](Self::acquire_many).
    pub async fn acquire_with(
        &self,
        key: &str,
        quota: &Quota,
        n: u32,
    ) -> Result<(), RedisLimitError> {
        let quota = self.encode(quota)?;
        self.acquire_encoded(key, || quota, n).await
    }

    /// Asks until granted, each ask under `quota()`: for the calls that
    /// pass no quota, the limiter's at that ask (a `set_quota` while it
    /// waits applies from its next ask on, as to any new call).
    async fn acquire_encoded(
        &self,
        key: &str,
        quota: impl Fn() -> Encoded,
        n: u32,
    ) -> Result<(), RedisLimitError> {
        loop {
            match self.try_acquire_encoded(key, &quota(), n).await {
                Err(RedisLimitError::Limited { retry_after }) => {
                    clock::sleep(spread(retry_after)).await;
                }
                other => return other,
            }
        }
    }

    /// Decides many requests, each on its own key's funnel under the
    /// limiter's quota, in one pipelined round trip: `requests[i] = (key, n)` gets `answers[i]`,
    /// what [`try_acquire_many`](Self::try_acquire_many)`(key, n)` would
    /// have answered. The same key may appear more than once; its requests
    /// are decided in order.
    ///
    /// The whole batch shares one deadline; when Redis cannot decide it,
    /// the failure policy applies to every request that needed Redis. On a
    /// cluster the requests go as one pipeline per master, concurrently
    /// (one round trip per node involved), and a node that fails or misses
    /// the deadline fails only its own requests by the policy.
    ///
    /// # Cancel safety
    ///
    /// As [`try_acquire_many`](Self::try_acquire_many), for every request.
    pub async fn try_acquire_many_keys(
        &self,
        requests: &[(&str, u32)],
    ) -> Vec<Result<(), RedisLimitError>> {
        // Read once: the batch is sent and answered under one quota, within
        // one deadline (the refusal cache's reconnect, at most one however
        // many cached keys, and the decisions).
        let quota = &self.own();
        let sent = clock::now();
        let deadline = self.deadline_from(sent);
        let mut answers: Vec<Option<Result<(), RedisLimitError>>> =
            Vec::with_capacity(requests.len());
        for &(key, n) in requests {
            answers.push(match local(quota, n) {
                Some(answer) => Some(answer),
                None => self.cached(key, quota, n, sent, deadline).await,
            });
        }
        let epoch = self.inner.conn.epoch();
        let asked: Vec<(&str, u32)> = requests
            .iter()
            .zip(&answers)
            .filter(|(_, local)| local.is_none())
            .map(|(&r, _)| r)
            .collect();
        if !asked.is_empty() {
            let mut decided = self.eval_many(&asked, quota, deadline).await.into_iter();
            let back = clock::now();
            // In the requests' order, so that the cache learns each key's
            // answers in the order Redis gave them.
            for ((key, n), slot) in requests
                .iter()
                .zip(&mut answers)
                .filter(|(_, a)| a.is_none())
            {
                let Some(reply) = decided.next() else { break };
                let answer = reply.and_then(|r| {
                    Answer::parse(&r, quota.bands().len()).map_err(RedisLimitError::Backend)
                });
                *slot = Some(match answer {
                    Ok(answer) => {
                        self.inner.server_clock.saw(
                            self.redis_key(key).as_bytes(),
                            answer.now_us,
                            back,
                        );
                        let raw = answer;
                        let answer = self.answered(raw, quota);
                        self.remember(key, quota, *n, (sent, epoch), (&answer, &raw));
                        answer
                    }
                    Err(e) => self.failed(e, 1),
                });
            }
        }
        answers
            .into_iter()
            .map(|a| {
                // `eval_many` answers every request it was asked.
                a.unwrap_or_else(|| self.failed(super::script::missing_reply(), 1))
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
        self.decide_encoded(key, &self.own(), n).await
    }

    /// As [`decide`](Self::decide), under `quota` instead of the limiter's
    /// own; see [`try_acquire_with`](Self::try_acquire_with) for tiers.
    ///
    /// # Errors
    ///
    /// As [`decide`](Self::decide), with the capacity `quota`'s; and
    /// [`RedisLimitError::InvalidQuota`] for a quota a builder would refuse
    /// (without asking Redis).
    ///
    /// # Cancel safety
    ///
    /// As [`try_acquire_many`](Self::try_acquire_many).
    pub async fn decide_with(
        &self,
        key: &str,
        quota: &Quota,
        n: u32,
    ) -> Result<Decision, RedisLimitError> {
        let quota = self.encode(quota)?;
        self.decide_encoded(key, &quota, n).await
    }

    async fn decide_encoded(
        &self,
        key: &str,
        quota: &Encoded,
        n: u32,
    ) -> Result<Decision, RedisLimitError> {
        if n > quota.capacity() {
            return Err(RedisLimitError::InsufficientCapacity);
        }
        let now = clock::now();
        let sent = (now, self.inner.conn.epoch());
        match self.eval(key, quota, n, self.deadline_from(now)).await {
            Ok(answer) => {
                // Counted (and logged) like any decision, and taught to
                // the refusal cache; a refusal is a value here, not an
                // error. (`n = 0` reads, and teaches nothing.)
                let decided = self.answered(answer, quota);
                if n > 0 {
                    self.remember(key, quota, n, sent, (&decided, &answer));
                }
                let retry_after = decided.err().and_then(|e| e.retry_after());
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

    /// What [`try_acquire_many`](Self::try_acquire_many)`(key, n)` would
    /// answer now, and each band's permits available and time until full
    /// again, without taking anything: what the `RateLimit` response
    /// headers and dashboards need.
    ///
    /// One round trip that changes nothing in Redis, not even the key's
    /// expiry: a read-only script returns the server's `TIME` and the key's
    /// state, and the answer is computed here, exactly as the decision
    /// script would compute it at that server time (the same parsing, the
    /// same instants, the same rounding up of an instant in other units).
    /// The answer is only a forecast: another replica may take the permits
    /// before this one asks for them.
    ///
    /// `n = 0` is granted, and `n` above the capacity answers
    /// [`InsufficientCapacity`](crate::TryAcquireError::InsufficientCapacity),
    /// both after reading the bands (the look is what a peek is for). A
    /// peek is not a decision: it is not counted in [`stats`](Self::stats),
    /// and the failure policy does not apply to it (a look cannot be
    /// granted).
    ///
    /// # Errors
    ///
    /// [`RedisLimitError::Timeout`] or [`RedisLimitError::Backend`] (for a
    /// malformed state too) when Redis could not be read, whatever the
    /// failure policy.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future changes nothing.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use tokio_ratelimit::{Quota, Rate};
    /// use tokio_ratelimit::redis::RedisFunnel;
    ///
    /// # #[tokio::main]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let limiter = RedisFunnel::builder("redis://127.0.0.1:6379/")
    ///     .quota(Quota::new(Rate::per_second(20), 40).and(Rate::per_day(10_000), 10_000))
    ///     .build()
    ///     .await?;
    /// let peek = limiter.peek("user:42", 1).await?;
    /// for band in peek.bands() {
    ///     // RateLimit: limit=…, remaining=…, reset=…
    ///     println!("{} of {} left, full in {:?}", band.available, band.band.capacity(), band.full_in);
    /// }
    /// if let Some(wait) = peek.retry_after() {
    ///     println!("the next request would wait {wait:?}");
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub async fn peek(&self, key: &str, n: u32) -> Result<Peek, RedisLimitError> {
        self.peek_encoded(key, &self.own(), n).await
    }

    /// As [`peek`](Self::peek), under `quota` instead of the limiter's own
    /// (the stored bands read as [`try_acquire_with`](Self::try_acquire_with)
    /// reads them under a new tier).
    ///
    /// # Errors
    ///
    /// As [`peek`](Self::peek); and [`RedisLimitError::InvalidQuota`] for a
    /// quota a builder would refuse (without asking Redis).
    ///
    /// # Cancel safety
    ///
    /// Dropping the future changes nothing.
    pub async fn peek_with(
        &self,
        key: &str,
        quota: &Quota,
        n: u32,
    ) -> Result<Peek, RedisLimitError> {
        let quota = self.encode(quota)?;
        self.peek_encoded(key, &quota, n).await
    }

    async fn peek_encoded(
        &self,
        key: &str,
        quota: &Encoded,
        n: u32,
    ) -> Result<Peek, RedisLimitError> {
        let (now_us, stored) = self.look(key).await?;
        if let Some(cache) = &self.inner.refusals {
            // What the state says now overrules a cached refusal it would
            // grant.
            cache.forget_if(key, |quota, n| {
                Encoded::new(quota)
                    .is_ok_and(|q| state::peek(&q, &stored, now_us, n).answer().is_ok())
            });
        }
        Ok(state::peek(quota, &stored, now_us, n))
    }

    /// Takes `n` permits of `key` like [`try_acquire_with`](Self::try_acquire_with)
    /// (under `quota`, or the limiter's own for `None`) and reports each
    /// band's state after the decision, from the same round trip: the
    /// report's [`answer`](Peek::answer) is the decision (`Limited` with the
    /// exact wait, or `InsufficientCapacity`), its bands what the
    /// `RateLimit` response headers show. A refusal from the refusal cache
    /// has the bands the refusal Redis gave showed, moved on by the time
    /// since (Redis's state only moves later, so they read at most as full
    /// as they are); a grant by
    /// [`FailurePolicy::Open`] has no bands; `n = 0` is a
    /// [`peek`](Self::peek).
    ///
    /// # Errors
    ///
    /// Under [`FailurePolicy::Closed`], [`RedisLimitError::Timeout`] or
    /// [`RedisLimitError::Backend`] when Redis could not decide;
    /// [`RedisLimitError::InvalidQuota`] for a quota a builder would refuse.
    ///
    /// # Cancel safety
    ///
    /// As [`try_acquire_many`](Self::try_acquire_many).
    pub async fn try_acquire_and_peek(
        &self,
        key: &str,
        quota: Option<&Quota>,
        n: u32,
    ) -> Result<Peek, RedisLimitError> {
        let given = match quota {
            None => self.own(),
            Some(q) => self.encode(q)?,
        };
        let quota = &given;
        if n == 0 {
            return self.peek_encoded(key, quota, 0).await;
        }
        if n > quota.capacity() {
            return Ok(Peek::new(
                Err(crate::TryAcquireError::InsufficientCapacity),
                &[],
            ));
        }
        let now = clock::now();
        let deadline = self.deadline_from(now);
        match self.cached_seen(key, quota, n, now, deadline).await {
            // The bands as the refusal showed them, moved on to now.
            Some((Err(RedisLimitError::Limited { retry_after }), seen)) => {
                let refused = Err(crate::TryAcquireError::Limited { retry_after });
                let Some(seen) = seen else {
                    return Ok(Peek::new(refused, &[]));
                };
                let stored = stored_of(quota, &seen.instants);
                return Ok(state::peek(quota, &stored, seen.now_us, 0).with_answer(refused));
            }
            // The failure policy's answer (a cached refusal that ran out
            // while Redis could not be reached), counted already.
            Some((Ok(()), _)) => return Ok(Peek::new(Ok(()), &[])),
            Some((Err(e), _)) => return Err(e),
            None => {}
        }
        let sent = (now, self.inner.conn.epoch());
        let answer = match self.eval(key, quota, n, deadline).await {
            Ok(answer) => answer,
            Err(e) => {
                self.failed(e, 1)?;
                return Ok(Peek::new(Ok(()), &[]));
            }
        };
        let decided = self.answered(answer, quota);
        self.remember(key, quota, n, sent, (&decided, &answer));
        let decided = match decided {
            Ok(()) => Ok(()),
            Err(RedisLimitError::Limited { retry_after }) => {
                Err(crate::TryAcquireError::Limited { retry_after })
            }
            Err(e) => return Err(e),
        };
        let stored = answer
            .instants
            .map_or_else(Vec::new, |instants| stored_of(quota, &instants));
        Ok(state::peek(quota, &stored, answer.now_us, 0).with_answer(decided))
    }

    /// The counters of this limiter and its clones.
    pub fn stats(&self) -> RedisStats {
        self.inner.counters.snapshot()
    }

    /// The leak rate: the first band's, for a quota of several.
    pub fn rate(&self) -> Rate {
        self.own().quota().bands()[0].rate()
    }

    /// Each key's capacity, in units: the largest request, which is the
    /// smallest band's capacity for a quota of several.
    pub fn capacity(&self) -> u32 {
        self.own().capacity()
    }

    /// Replaces the quota of every call that does not pass its own, while
    /// the limiter serves: every clone of this limiter uses `quota` from
    /// its next call on (a decision already under way finishes under the
    /// quota it read; a batch is sent and answered under one; an `acquire`
    /// that waits asks each time under the quota then in use, so it may
    /// end with `InsufficientCapacity` if the new capacity is less than
    /// it asks for). Nothing in Redis changes: the keys keep their state.
    ///
    /// **Keys mid-window** follow the tier-change rule of
    /// [`try_acquire_with`](Self::try_acquire_with) ("Tier changes"): each
    /// band's instant (when it is full again) carries over to the new
    /// quota's band of the same index, so the time until each band is full
    /// is kept, not its count — for bands of the same window (capacity ÷
    /// rate), the fraction in use. So a change to bands of the same or
    /// shorter windows gives no key a fresh burst; a band of a longer
    /// window holds that time of water, a smaller fraction (a key drained
    /// under 10/s with a burst of 10 holds one permit's water under 1/s with
    /// a burst of 10, and may take 9 at once). Across the change a band
    /// admits at most what it had left under the old quota before the
    /// change, and what the new quota allows after it (its capacity at
    /// most, and its rate).
    ///
    /// Other processes sharing the prefix keep their own quota until they
    /// are told: a fleet changes its quota by calling this in each process.
    ///
    /// # Errors
    ///
    /// [`ConfigError`](crate::ConfigError) for a quota a builder would
    /// refuse; the quota in use is then unchanged.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use tokio_ratelimit::{Quota, Rate};
    /// use tokio_ratelimit::redis::RedisFunnel;
    ///
    /// # #[tokio::main]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let limiter = RedisFunnel::builder("redis://127.0.0.1:6379/")
    ///     .rate(Rate::per_second(100))
    ///     .capacity(100)
    ///     .build()
    ///     .await?;
    /// // Later, from configuration:
    /// limiter.set_quota(Quota::new(Rate::per_second(50), 50))?;
    /// assert_eq!(limiter.capacity(), 50);
    /// # Ok(())
    /// # }
    /// ```
    pub fn set_quota(&self, quota: Quota) -> Result<(), crate::ConfigError> {
        let encoded = Encoded::new(&quota)?;
        *self
            .inner
            .encoded
            .write()
            .unwrap_or_else(PoisonError::into_inner) = encoded;
        tracing::debug!(prefix = %self.inner.prefix, ?quota, "redis rate limiter: quota changed");
        Ok(())
    }

    /// The quota of the calls that name none, as it is now.
    pub(super) fn own(&self) -> Encoded {
        *self
            .inner
            .encoded
            .read()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// The quota of every call that does not pass its own: every band (one
    /// for a rate and a capacity).
    pub fn quota(&self) -> Quota {
        *self.own().quota()
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

    /// `quota` as the script sees it, checked. The limiter's own is
    /// encoded already; another costs a few hundred nanoseconds at most,
    /// next to a round trip's tens of microseconds, so nothing is cached.
    fn encode(&self, quota: &Quota) -> Result<Encoded, RedisLimitError> {
        let own = self.own();
        if quota == own.quota() {
            Ok(own)
        } else {
            Encoded::new(quota).map_err(RedisLimitError::InvalidQuota)
        }
    }

    /// Counts Redis's answer to a decision under `quota` and turns it into
    /// the caller's.
    fn answered(&self, answer: Answer, quota: &Encoded) -> Result<(), RedisLimitError> {
        let c = &self.inner.counters;
        c.decisions.add(1);
        if !self.inner.healthy.load(Ordering::Relaxed)
            && !self.inner.healthy.swap(true, Ordering::Relaxed)
        {
            tracing::info!(prefix = %self.inner.prefix, "redis rate limiter: backend recovered");
        }
        if answer.again {
            c.resends_granted_before.add(1);
        }
        if answer.granted {
            c.granted.add(1);
            Ok(())
        } else {
            c.limited.add(1);
            Err(RedisLimitError::Limited {
                retry_after: quota.retry_after(&answer.waits),
            })
        }
    }

    fn count_failure(&self, e: &RedisLimitError, decisions: u64) {
        let c = &self.inner.counters;
        c.decisions.add(decisions);
        c.backend_errors.add(decisions);
        if matches!(e, RedisLimitError::Timeout { .. }) {
            c.timeouts.add(decisions);
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
                self.inner.counters.fail_open_grants.add(decisions);
                Ok(())
            }
            FailurePolicy::Closed => Err(e),
        }
    }
}

impl fmt::Debug for RedisFunnel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisFunnel")
            .field("quota", &self.quota())
            .field("prefix", &self.inner.prefix)
            .field("policy", &self.inner.policy)
            .field("timeout", &self.inner.timeout)
            .finish_non_exhaustive()
    }
}

/// The bands of `quota` as the script's instants say, in their units.
fn stored_of(quota: &Encoded, instants: &[super::repr::Split]) -> Vec<state::Stored> {
    instants
        .iter()
        .zip(quota.bands())
        .map(|(s, band)| state::Stored {
            us: s.us,
            rem: s.rem,
            unit: band.unit(),
        })
        .collect()
}

/// A request decided without Redis: `n = 0`, or more than `quota`'s
/// capacity.
fn local(quota: &Encoded, n: u32) -> Option<Result<(), RedisLimitError>> {
    if n > quota.capacity() {
        Some(Err(RedisLimitError::InsufficientCapacity))
    } else if n == 0 {
        Some(Ok(()))
    } else {
        None
    }
}

/// `retry_after` and a random part of a tenth more, at most 50 ms more:
/// waiters refused at one instant ask again spread over that span.
fn spread(retry_after: Duration) -> Duration {
    use std::hash::BuildHasher;
    let most = (retry_after / 10).min(Duration::from_millis(50));
    let Ok(most) = u64::try_from(most.as_nanos()) else {
        return retry_after;
    };
    if most == 0 {
        return retry_after;
    }
    // A fresh std `RandomState` is keyed anew each time (per thread, from
    // the OS's randomness): enough to tell replicas and tasks apart.
    let random = std::collections::hash_map::RandomState::new().hash_one(most);
    retry_after + Duration::from_nanos(random % (most + 1))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::spread;

    #[test]
    fn retries_are_spread_over_a_tenth_more_at_most_50_ms() {
        for (wait, most) in [
            (Duration::from_millis(100), Duration::from_millis(10)),
            (Duration::from_secs(10), Duration::from_millis(50)),
            (Duration::from_micros(7), Duration::from_nanos(700)),
        ] {
            let waits: Vec<Duration> = (0..1_000).map(|_| spread(wait)).collect();
            assert!(
                waits.iter().all(|&w| w >= wait && w <= wait + most),
                "{wait:?}"
            );
            let mut distinct = waits.clone();
            distinct.sort();
            distinct.dedup();
            assert!(
                distinct.len() > 500,
                "{wait:?}: {} distinct",
                distinct.len()
            );
            // Spread over the span, not bunched at one end.
            let late = waits.iter().filter(|&&w| w > wait + most / 2).count();
            assert!(
                (300..=700).contains(&late),
                "{wait:?}: {late} in the later half"
            );
        }
        assert_eq!(spread(Duration::from_nanos(9)), Duration::from_nanos(9));
        assert_eq!(spread(Duration::ZERO), Duration::ZERO);
    }
}
