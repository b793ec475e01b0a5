//! The scripts' I/O: their text, the arguments of one decision, the single
//! call and the batch's pipeline, the parsing of the reply, and the
//! read-only look a peek makes.
//!
//! A decision is `EVALSHA <sha> 1 <prefix + key> <id> <horizon> <since>`
//! and then, for each band of the quota, `unit cost_us cost_rem tau_us
//! tau_rem` (the order `gcra.lua` reads `ARGV` in): one call whatever the
//! number of bands. [`RedisFunnel::invocation`] is the one place that
//! builds it.
//!
//! # Resending
//!
//! A connection can fail after Redis ran a script and before its reply
//! came back, and the `redis` crate cannot tell that from a connection
//! that failed before the request left (both are a dropped connection). So
//! a resend is made harmless instead: every decision carries a random
//! 64-bit id, the same in every attempt, and a grant keeps its id beside
//! the key's state (the `MAX_IDS` = 16 latest grants', for a horizon of
//! twice the decision's deadline). A decision that fails on the connection
//! is sent once more, within its deadline, on a new connection, as a
//! resend: if Redis finds its id among the key's latest grants it answers
//! that grant again and pours nothing; if the id is not there, the first
//! attempt granted nothing (a refusal writes nothing, and one that never
//! ran did not either), so deciding it now is its only decision.
//!
//! Unless the id was evicted, by 16 later grants of the key. So the key
//! keeps when it last evicted one, and a resend says the earliest server
//! time its first attempt could have run at (`since`): a resend whose id is
//! absent while an eviction came at or after `since` cannot be told, and
//! fails by the policy rather than risk a second pour. `since` is a lower
//! bound taken from the server itself (see [`ServerClock`]): the server
//! time of the latest reply this limiter had from that server before the
//! first attempt was sent, plus the local time since, less 0.1 % (a clock
//! may run that much slower than the other); with no reply yet from that
//! server (on a cluster, a slot not heard from), one look at its clock
//! before the resend, taken back by the time since the first attempt was
//! sent, and 0.1 % more (see `since_by_look`). So only a key granted 16
//! times between its first attempt and the resend — in about one round
//! trip — is ever refused a resend. (What remains: a resend delayed in the
//! network by more than a whole deadline may find its id dropped with the
//! horizon, and pour again, for a decision its caller had already
//! answered by the policy.)

use std::sync::atomic::Ordering;
use std::time::Duration;

use ::redis::{
    ErrorKind, FromRedisValue, RedisError, RedisResult, ScriptInvocation, ServerErrorKind,
};

use super::conn::Conn;

use super::repr::{Encoded, Split};
use super::state::{self, Stored};
use super::{RedisFunnel, RedisLimitError};
use crate::algorithm::MAX_BANDS;
use crate::clock;

/// The decision script (see `gcra.lua` beside this file).
pub(super) const SCRIPT: &str = include_str!("gcra.lua");

/// The peek's read-only script (see `peek.lua` beside this file).
pub(super) const PEEK_SCRIPT: &str = include_str!("peek.lua");

/// The decision script on a cluster: the same, declared a script that may
/// write (a shebang without `no-writes`; Redis 7 and later). A replica then
/// answers it `MOVED` to its master instead of running it: the cluster
/// client opens every connection `READONLY`, and a script without flags is
/// run by a replica that client still takes for the master (after a
/// manual failover, say) until its write fails.
pub(super) const CLUSTER_SCRIPT: &str = concat!("#!lua\n", include_str!("gcra.lua"));

/// The peek's script on a cluster, declared as the decision's is, so that a
/// peek reads the master too (never a lagging replica).
pub(super) const CLUSTER_PEEK_SCRIPT: &str = concat!("#!lua\n", include_str!("peek.lua"));

/// The texts of the decision script and the peek's for `conn`.
pub(super) fn texts(conn: &Conn) -> (&'static str, &'static str) {
    match conn {
        Conn::Node(_) => (SCRIPT, PEEK_SCRIPT),
        Conn::Cluster { .. } => (CLUSTER_SCRIPT, CLUSTER_PEEK_SCRIPT),
    }
}

/// What the decision script answered.
#[derive(Debug, Clone, Copy)]
pub(super) struct Answer {
    pub(super) granted: bool,
    /// Granted by an earlier attempt of the same decision, whose reply was
    /// lost: nothing was poured this time.
    pub(super) again: bool,
    pub(super) now_us: u64,
    /// When refused, each band's wait in its own units (zero where it
    /// grants), in the quota's order.
    pub(super) waits: [Split; MAX_BANDS],
    /// Each band's instant after the decision (granted: the new one;
    /// refused: as it was read), in its own units; `None` for a read
    /// (`n = 0`).
    pub(super) instants: Option<[Split; MAX_BANDS]>,
}

impl Answer {
    /// The reply to a decision over `bands` bands: `[1, now]` (a read),
    /// `[1, now]` and two numbers per band (the new instants), `[2, now]`
    /// and two numbers per band (granted by an earlier attempt: the
    /// instants as read), or `[0, now]` and four numbers per band (the
    /// waits, then the instants).
    pub(super) fn parse(reply: &[i64], bands: usize) -> RedisResult<Answer> {
        let unexpected = || {
            RedisError::from((
                ErrorKind::UnexpectedReturnType,
                "unexpected reply from the rate limiter script",
            ))
        };
        let Some((&[granted, now], rest)) = reply.split_first_chunk::<2>() else {
            return Err(unexpected());
        };
        let now_us = u64::try_from(now).map_err(|_| unexpected())?;
        let splits = |numbers: &[i64]| -> RedisResult<[Split; MAX_BANDS]> {
            let mut out = [Split { us: 0, rem: 0 }; MAX_BANDS];
            for (o, pair) in out.iter_mut().zip(numbers.chunks_exact(2)) {
                let (Ok(us), Ok(rem)) = (u64::try_from(pair[0]), u64::try_from(pair[1])) else {
                    return Err(unexpected());
                };
                *o = Split { us, rem };
            }
            Ok(out)
        };
        if bands > MAX_BANDS {
            return Err(unexpected());
        }
        let (waits, instants) = match (granted, rest.len()) {
            (1, 0) => ([Split { us: 0, rem: 0 }; MAX_BANDS], None),
            (1 | 2, len) if len == 2 * bands => {
                ([Split { us: 0, rem: 0 }; MAX_BANDS], Some(splits(rest)?))
            }
            (0, len) if len == 4 * bands => {
                let (waits, instants) = rest.split_at(2 * bands);
                (splits(waits)?, Some(splits(instants)?))
            }
            _ => return Err(unexpected()),
        };
        Ok(Answer {
            granted: granted != 0,
            again: granted == 2,
            now_us,
            waits,
            instants,
        })
    }
}

/// The decision script's reply, as the `redis` crate parses it.
pub(super) type Reply = Vec<i64>;

/// The peek script's reply: the server time and the state.
type Look = (i64, Option<String>);

/// Sends one call of the script whose text is `text`, and reads its reply.
///
/// `EVALSHA`; after `NOSCRIPT` (a `SCRIPT FLUSH`, a restart, a promoted
/// replica that never loaded it) `SCRIPT LOAD` and the `EVALSHA` again, in
/// one pipeline, so to the same node. On a cluster, a call answered `MOVED`
/// goes to the node it names, and one answered `ASK` to the node named
/// after `ASKING` (at most four redirects in all). Each of these
/// answers proves that the node did not run the script, so sending again
/// cannot pour twice; anything else is the caller's (see `cluster.rs` on
/// why the cluster client itself retries nothing).
async fn invoke<T: FromRedisValue>(
    conn: &mut Conn,
    text: &str,
    call: &ScriptInvocation<'_>,
) -> RedisResult<T> {
    /// Redirects followed at most: a failover can bounce a slot between
    /// nodes for a moment, and each redirect proves the call did not run.
    const REDIRECTS: usize = 4;
    let mut load = false;
    // The node a redirect named, and whether it was an `ASK`.
    let mut target: Option<(String, bool)> = None;
    let mut redirects = 0;
    loop {
        let mut pipe = ::redis::Pipeline::with_capacity(3);
        if matches!(target, Some((_, true))) {
            pipe.cmd("ASKING").ignore();
        }
        if load {
            pipe.cmd("SCRIPT").arg("LOAD").arg(text).ignore();
        }
        pipe.invoke_script(call);
        let reply = match &target {
            None => pipe.query_async::<(T,)>(conn).await.map(|(t,)| t),
            Some((node, _)) => match conn.last_reply_at(node, &pipe).await {
                Ok(v) => ::redis::from_redis_value(v).map_err(RedisError::from),
                Err(e) => Err(e),
            },
        };
        let e = match reply {
            Ok(t) => return Ok(t),
            Err(e) => e,
        };
        match e.kind() {
            ErrorKind::Server(ServerErrorKind::NoScript) if !load => load = true,
            // Sent to the node the redirect names (for `MOVED` the client
            // also refreshes its slot map, but may not have yet).
            ErrorKind::Server(kind @ (ServerErrorKind::Moved | ServerErrorKind::Ask))
                if redirects < REDIRECTS =>
            {
                let Some((node, _slot)) = e.redirect_node() else {
                    return Err(e);
                };
                // The slot moved: refusals cached from its old master may
                // not hold on the new one.
                conn.may_have_moved();
                target = Some((node.to_owned(), kind == ServerErrorKind::Ask));
                redirects += 1;
            }
            _ => return Err(e),
        }
    }
}

/// The longest a grant's id is kept: a day (a deadline of half a day or
/// more keeps its ids a day).
const MAX_ID_HORIZON: Duration = Duration::from_secs(86_400);

/// How many times a decision that failed on the connection is sent again,
/// each on a new connection, within its deadline: a connection can be
/// lost again while the first resend is in flight (a proxy or a server
/// closing connections in a burst).
pub(super) const RESENDS: usize = 2;

/// Whether a resend counts in the stats: a decision's does, a peek's not.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Resends {
    Counted,
    Uncounted,
}

/// Whether `e` is a failure of the connection (dropped, reset, refused,
/// or any other I/O error), as opposed to an answer from Redis or our own
/// deadline.
pub(super) fn connection_failed(e: &RedisError) -> bool {
    !e.is_timeout() && (e.is_io_error() || e.is_connection_dropped() || e.is_unrecoverable_error())
}

/// A decision's id: random, the same in every attempt of the decision, so
/// that the script can tell a resend from a new request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct RequestId(u64);

impl RequestId {
    /// Sixteen hex digits, as the script keeps them.
    fn hex(self) -> String {
        format!("{:016x}", self.0)
    }
}

/// Where a limiter's request ids come from: a counter through `SipHash`
/// keyed at random (std's `RandomState`, keyed from the OS's randomness),
/// so ids are unpredictable, distinct within a limiter, and independent
/// between processes. Two decisions of one key share an id with
/// probability about 2⁻⁶⁴ per pair.
pub(super) struct Ids {
    hasher: std::collections::hash_map::RandomState,
    next: std::sync::atomic::AtomicU64,
}

impl Ids {
    pub(super) fn new() -> Ids {
        Ids {
            hasher: std::collections::hash_map::RandomState::new(),
            next: std::sync::atomic::AtomicU64::new(0),
        }
    }

    pub(super) fn next(&self) -> RequestId {
        use std::hash::BuildHasher;
        RequestId(
            self.hasher
                .hash_one(self.next.fetch_add(1, Ordering::Relaxed)),
        )
    }
}

/// What a limiter has seen of its servers' clocks, to say how early a
/// resend's first attempt could have run (`since`, in the script).
///
/// Every reply carries the server's `TIME` (`now_us`), read before the
/// reply left, so before it arrived here: at the local instant `at` it was
/// received, the server's clock read at least `now_us`. Clocks run at the
/// same rate within 0.1 %, so at a later local instant `at + d` the server's
/// reads at least `now_us + d − d/1000`; a request sent then runs no
/// earlier, and at least a microsecond after the script that read
/// `now_us` (a round trip lies between them). Kept per server: per slot on a cluster (each node has its own
/// clock; a slot's requests go to one node, the slot's master), one entry
/// on a single node. Only the latest reply per server is kept (a lower
/// bound from long ago would carry more drift).
pub(super) struct ServerClock {
    cluster: bool,
    seen: std::sync::Mutex<std::collections::HashMap<u16, (u64, tokio::time::Instant)>>,
}

impl ServerClock {
    pub(super) fn new(cluster: bool) -> ServerClock {
        ServerClock {
            cluster,
            seen: std::sync::Mutex::default(),
        }
    }

    fn server(&self, key: &[u8]) -> u16 {
        if self.cluster {
            super::cluster::slot(key)
        } else {
            0
        }
    }

    /// A reply about `key` (a Redis key) came back by `at`, read on the
    /// server at `now_us`.
    pub(super) fn saw(&self, key: &[u8], now_us: u64, at: tokio::time::Instant) {
        let mut seen = self
            .seen
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let server = self.server(key);
        match seen.get(&server) {
            Some(&(_, held)) if held > at => {}
            _ => {
                seen.insert(server, (now_us, at));
            }
        }
    }

    /// The earliest server time (µs) at which a request about `key` sent
    /// at `sent` (no earlier than every reply seen) can run; 0 when nothing
    /// is known.
    pub(super) fn since(&self, key: &[u8], sent: tokio::time::Instant) -> u64 {
        let seen = self
            .seen
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let Some(&(now_us, at)) = seen.get(&self.server(key)) else {
            return 0;
        };
        // Sent after the reply arrived: the server's clock has gone on at
        // least `later − later/1000` since it read `now_us`, and at least a
        // microsecond (the reply crossed to here and the request back), so
        // the request runs later than the script that read `now_us` —
        // later than anything that script evicted.
        let later = u64::try_from(sent.saturating_duration_since(at).as_micros()).unwrap_or(0);
        now_us + 1 + (later - later / 1000)
    }
}

/// Whether a batch's answer is a redirect (`MOVED`, `ASK`): the whole
/// pipeline was sent to a node that does not serve one of its keys.
fn redirected(answer: &Result<Reply, RedisLimitError>) -> bool {
    matches!(answer, Err(RedisLimitError::Backend(e))
        if matches!(e.kind(), ErrorKind::Server(ServerErrorKind::Moved | ServerErrorKind::Ask)))
}

/// A reply Redis did not send (fewer replies than commands).
pub(super) fn missing_reply() -> RedisLimitError {
    RedisLimitError::Backend(RedisError::from((
        ErrorKind::Parse,
        "missing pipeline reply",
    )))
}

impl RedisFunnel {
    /// The decision's deadline for a call that starts at `now`: the
    /// limiter's timeout later. (A timeout too far to add, `Duration::MAX`,
    /// is thirty years away, as tokio's own timeouts make it.)
    pub(super) fn deadline_from(&self, now: tokio::time::Instant) -> tokio::time::Instant {
        now.checked_add(self.inner.timeout)
            .unwrap_or_else(|| now + Duration::from_secs(30 * 365 * 86_400))
    }

    /// One script call, within `deadline` (a resend included, see
    /// [`resend_after_connection_error`](Self::resend_after_connection_error)).
    pub(super) async fn eval(
        &self,
        key: &str,
        quota: &Encoded,
        n: u32,
        deadline: tokio::time::Instant,
    ) -> Result<Answer, RedisLimitError> {
        let started = self.inner.counters.started();
        let answer = self.eval_untimed(key, quota, n, deadline).await;
        self.inner.counters.round_trip(started);
        answer
    }

    async fn eval_untimed(
        &self,
        key: &str,
        quota: &Encoded,
        n: u32,
        deadline: tokio::time::Instant,
    ) -> Result<Answer, RedisLimitError> {
        let id = self.inner.ids.next();
        let redis_key = self.redis_key(key);
        let attempt = |since| {
            let mut conn = self.inner.conn.clone();
            let call = self.invocation(key, quota, n, id, since);
            // Boxed: the call's state (its pipelines, a redirect's) would
            // otherwise weigh on every caller's future, twice.
            let text = texts(&conn).0;
            async move { Box::pin(invoke::<Reply>(&mut conn, text, &call)).await }
        };
        match clock::timeout_at(
            deadline,
            self.resend_after_connection_error(redis_key.as_bytes(), attempt),
        )
        .await
        {
            Err(_) => Err(self.timed_out()),
            Ok(Err(e)) => Err(self.backend(e)),
            Ok(Ok(reply)) => {
                let answer =
                    Answer::parse(&reply, quota.bands().len()).map_err(RedisLimitError::Backend)?;
                self.inner
                    .server_clock
                    .saw(redis_key.as_bytes(), answer.now_us, clock::now());
                Ok(answer)
            }
        }
    }

    /// The server's time (whole microseconds) and `key`'s stored bands, in
    /// one round trip that changes nothing, within the deadline. The look
    /// is read-only, so sending it again is always safe; it goes through
    /// the same [`resend_after_connection_error`](Self::resend_after_connection_error)
    /// as a decision.
    pub(super) async fn look(&self, key: &str) -> Result<(u64, Vec<Stored>), RedisLimitError> {
        let redis_key = self.redis_key(key);
        let attempt = |_since| {
            let mut conn = self.inner.conn.clone();
            let mut call = self.inner.peek_script.prepare_invoke();
            call.key(&redis_key);
            let text = texts(&conn).1;
            async move { Box::pin(invoke::<Look>(&mut conn, text, &call)).await }
        };
        let (now, state) = match clock::timeout(
            self.inner.timeout,
            self.resend(redis_key.as_bytes(), attempt, Resends::Uncounted),
        )
        .await
        {
            Err(_) => return Err(self.timed_out()),
            Ok(Err(e)) => return Err(self.backend(e)),
            Ok(Ok(look)) => look,
        };
        let now_us = u64::try_from(now).map_err(|_| {
            RedisLimitError::Backend(RedisError::from((
                ErrorKind::UnexpectedReturnType,
                "unexpected reply from the rate limiter's peek script",
            )))
        })?;
        self.inner
            .server_clock
            .saw(redis_key.as_bytes(), now_us, clock::now());
        let stored = match state {
            None => vec![],
            Some(state) => state::parse(&state).ok_or_else(|| {
                RedisLimitError::Backend(RedisError::from((
                    ErrorKind::Parse,
                    "tokio-ratelimit: malformed state",
                    format!("at {}", self.redis_key(key)),
                )))
            })?,
        };
        Ok((now_us, stored))
    }

    /// Runs `attempt(None)`, and while it fails on the connection, runs
    /// `attempt(Some(since))` (a resend), at most [`RESENDS`] times, each
    /// on a new connection; the caller's deadline covers them all. `since`
    /// is the earliest server time (µs) at which the first attempt could
    /// have run on the server of `key` (a Redis key), from
    /// [`ServerClock::since`].
    ///
    /// Any connection-level failure is resent — before the request was
    /// written or after, which the `redis` crate cannot tell apart — since
    /// the resend is harmless: the script answers a resent decision that
    /// had granted from the grant's id, without pouring again (see the
    /// [module docs](self)). A refused connection is not resent (nothing
    /// was sent, and the server is down: the policy answers at once), nor
    /// are errors Redis answered (a script error, `NOSCRIPT` after a
    /// reload, a redirect after the ones followed) or timeouts.
    pub(super) async fn resend_after_connection_error<T, F, Fut>(
        &self,
        key: &[u8],
        attempt: F,
    ) -> RedisResult<T>
    where
        F: FnMut(Option<u64>) -> Fut,
        Fut: Future<Output = RedisResult<T>>,
    {
        self.resend(key, attempt, Resends::Counted).await
    }

    /// [`resend_after_connection_error`](Self::resend_after_connection_error),
    /// the resends counted in [`RedisStats::retries`](super::RedisStats::retries)
    /// or not (a peek's, which the stats do not count).
    async fn resend<T, F, Fut>(
        &self,
        key: &[u8],
        mut attempt: F,
        resends: Resends,
    ) -> RedisResult<T>
    where
        F: FnMut(Option<u64>) -> Fut,
        Fut: Future<Output = RedisResult<T>>,
    {
        let sent = clock::now();
        let mut since = self.inner.server_clock.since(key, sent);
        let mut result = attempt(None).await;
        for _ in 0..RESENDS {
            match &result {
                Err(e) if connection_failed(e) && !e.is_connection_refusal() => {
                    // On a cluster the client reconnects on its own, maybe
                    // to another server (a promoted replica, a restarted
                    // master): the refusal cache's epoch moves here, not
                    // only when a failure reaches the caller.
                    self.inner.conn.may_have_moved();
                    if resends == Resends::Counted {
                        self.inner.counters.retries.add(1);
                    }
                    tracing::debug!(
                        prefix = %self.inner.prefix,
                        error = %e,
                        "redis rate limiter: the connection failed, sending the decision again",
                    );
                    if since == 0 {
                        since = self.since_by_look(key, sent).await;
                    }
                    result = attempt(Some(since)).await;
                }
                _ => break,
            }
        }
        result
    }

    /// A lower bound of the server time (µs) at which a request about
    /// `key` (a Redis key) sent at `sent` ran, when no reply from its
    /// server was seen before it (on a cluster, a slot this limiter has
    /// not heard from yet): one look at the server's clock, taken back by
    /// the time since `sent` (and the 0.1 % the clocks may differ in
    /// rate, as [`ServerClock`] allows). The server read `now_us` before
    /// its reply arrived, so at `sent` it read at least `now_us` less that
    /// much, and the request ran no earlier. 0 if the look fails (every
    /// eviction then counts against the resend, as before).
    async fn since_by_look(&self, key: &[u8], sent: tokio::time::Instant) -> u64 {
        let mut conn = self.inner.conn.clone();
        let mut call = self.inner.peek_script.prepare_invoke();
        call.key(key);
        let text = texts(&conn).1;
        let Ok(Ok((now_us, _))) = clock::timeout(
            self.inner.timeout,
            Box::pin(invoke::<Look>(&mut conn, text, &call)),
        )
        .await
        else {
            return 0;
        };
        let back = clock::now();
        let Ok(now_us) = u64::try_from(now_us) else {
            return 0;
        };
        self.inner.server_clock.saw(key, now_us, back);
        let d = u64::try_from(back.saturating_duration_since(sent).as_micros()).unwrap_or(u64::MAX);
        now_us.saturating_sub(d.saturating_add(d / 1000 + 1))
    }

    /// The script call that pours `n` units into every band of `key`'s
    /// funnel under `quota`: its key, the request's id, the horizon its id
    /// is kept for and, for a resend, the earliest server time its first
    /// attempt could have run at (`f` for a first attempt), then five
    /// arguments per band, in the order `gcra.lua` reads them. The single call
    /// ([`eval`](Self::eval)) and the batch ([`pipeline`](Self::pipeline))
    /// both send what this builds, so they cannot disagree.
    fn invocation(
        &self,
        key: &str,
        quota: &Encoded,
        n: u32,
        id: RequestId,
        since: Option<u64>,
    ) -> ScriptInvocation<'_> {
        let mut call = self.inner.script.prepare_invoke();
        call.key(self.redis_key(key))
            .arg(id.hex())
            .arg(self.id_horizon_us());
        match since {
            None => call.arg("f"),
            Some(since) => call.arg(since),
        };
        for e in quota.bands() {
            let (cost, tau) = (e.cost(n), e.tau());
            call.arg(e.unit())
                .arg(cost.us)
                .arg(cost.rem)
                .arg(tau.us)
                .arg(tau.rem);
        }
        call
    }

    /// How long a grant's id is kept beside the key's state, in
    /// microseconds: twice the decision's deadline, so that a resend that
    /// reaches Redis as late as a whole deadline after its first attempt
    /// still finds it; at most [`MAX_ID_HORIZON`] (the script adds it to
    /// the server's time, which must stay an exact Lua integer).
    fn id_horizon_us(&self) -> u64 {
        let horizon = self.inner.timeout.saturating_mul(2).min(MAX_ID_HORIZON);
        u64::try_from(horizon.as_micros()).unwrap_or(u64::MAX)
    }

    /// Script calls for many keys, each under the limiter's own quota,
    /// within one deadline: one pipeline on a single node; on a cluster
    /// one pipeline per master, sent concurrently, each with its own
    /// outcome (a node that fails or is too slow fails its requests only).
    /// `replies[i]` answers `asked[i]`.
    pub(super) async fn eval_many(
        &self,
        asked: &[(&str, u32)],
        quota: &Encoded,
        deadline: tokio::time::Instant,
    ) -> Vec<Result<Reply, RedisLimitError>> {
        let started = self.inner.counters.started();
        let replies = self.eval_many_untimed(asked, quota, deadline).await;
        self.inner.counters.round_trip(started);
        replies
    }

    async fn eval_many_untimed(
        &self,
        asked: &[(&str, u32)],
        quota: &Encoded,
        deadline: tokio::time::Instant,
    ) -> Vec<Result<Reply, RedisLimitError>> {
        let ids: Vec<RequestId> = asked.iter().map(|_| self.inner.ids.next()).collect();
        let Conn::Cluster { conn, slots, .. } = &self.inner.conn else {
            return self.eval_on_one_node(asked, quota, &ids, deadline).await;
        };
        let mut conn = conn.clone();
        let table = match clock::timeout_at(deadline, slots.table(&mut conn, deadline)).await {
            Ok(Ok(table)) => table,
            Ok(Err(e)) => return vec![Err(self.backend(e)); asked.len()],
            Err(_) => return vec![Err(self.timed_out()); asked.len()],
        };
        let keys: Vec<String> = asked.iter().map(|(key, _)| self.redis_key(key)).collect();
        let groups = table.group(keys.iter().map(String::as_bytes));
        let sent = groups.iter().map(|group| {
            let mine: Vec<(&str, u32)> = group.iter().map(|&i| asked[i]).collect();
            let my_ids: Vec<RequestId> = group.iter().map(|&i| ids[i]).collect();
            async move { self.eval_on_one_node(&mine, quota, &my_ids, deadline).await }
        });
        let started = clock::now();
        let mut replies: Vec<Option<Result<Reply, RedisLimitError>>> = vec![None; asked.len()];
        for (group, mut answers) in groups.iter().zip(futures::future::join_all(sent).await) {
            if answers
                .iter()
                .any(|r| matches!(r, Err(e) if e.is_backend_failure()))
            {
                // The topology may have changed: ask for it again.
                slots.forget();
            }
            if answers.iter().all(redirected) {
                // Sent to a node that no longer serves (some of) these
                // slots, on a stale topology: the node may have run some
                // of them, so each goes again alone, as a resend (its own
                // id: harmless), following its own redirect.
                self.inner.conn.may_have_moved();
                let again = group.iter().map(|&i| {
                    let (key, n) = asked[i];
                    let (redis_key, id) = (keys[i].as_bytes(), ids[i]);
                    async move {
                        let mut since = self.inner.server_clock.since(redis_key, started);
                        if since == 0 {
                            since = self.since_by_look(redis_key, started).await;
                        }
                        self.resend_alone(key, quota, n, id, since, deadline).await
                    }
                });
                answers = futures::future::join_all(again).await;
            }
            for (&i, answer) in group.iter().zip(answers) {
                replies[i] = Some(answer);
            }
        }
        replies
            .into_iter()
            .map(|r| r.unwrap_or_else(|| Err(missing_reply())))
            .collect()
    }

    /// One request of a batch sent again on its own, as a resend (see
    /// [`eval_many`](Self::eval_many)), within `deadline`.
    async fn resend_alone(
        &self,
        key: &str,
        quota: &Encoded,
        n: u32,
        id: RequestId,
        since: u64,
        deadline: tokio::time::Instant,
    ) -> Result<Reply, RedisLimitError> {
        self.inner.counters.retries.add(1);
        let mut conn = self.inner.conn.clone();
        let call = self.invocation(key, quota, n, id, Some(since));
        let text = texts(&conn).0;
        match clock::timeout_at(deadline, Box::pin(invoke::<Reply>(&mut conn, text, &call))).await {
            Err(_) => Err(self.timed_out()),
            Ok(Err(e)) => Err(self.backend(e)),
            Ok(Ok(reply)) => Ok(reply),
        }
    }

    /// Script calls for keys of one node in one pipeline, within
    /// `deadline`; the ones that find the script flushed go again in one
    /// more pipeline that loads it first (to the same node). A pipeline
    /// that fails on the connection is resent whole, marked as a resend:
    /// each request carries its own id (`ids[i]` is `asked[i]`'s), so the
    /// ones that had run answer their first grant again.
    async fn eval_on_one_node(
        &self,
        asked: &[(&str, u32)],
        quota: &Encoded,
        ids: &[RequestId],
        deadline: tokio::time::Instant,
    ) -> Vec<Result<Reply, RedisLimitError>> {
        // Boxed, as a single call's (see `eval`). The batch's first key
        // names the node, and so the server clock of `since`.
        let first = self.redis_key(asked[0].0);
        let attempt = |since| {
            let first = &first;
            Box::pin(async move {
                let mut conn = self.inner.conn.clone();
                let mut replies: Vec<RedisResult<Reply>> = conn
                    .replies(
                        self.pipeline(asked, quota, ids, false, since),
                        0,
                        first.as_bytes(),
                    )
                    .await?;
                let missing: Vec<usize> = (0..replies.len())
                .filter(|&i| {
                    matches!(&replies[i], Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript))
                })
                .collect();
                if !missing.is_empty() {
                    let again: Vec<(&str, u32)> = missing.iter().map(|&i| asked[i]).collect();
                    let again_ids: Vec<RequestId> = missing.iter().map(|&i| ids[i]).collect();
                    let retried: Vec<RedisResult<Reply>> = conn
                        .replies(
                            self.pipeline(&again, quota, &again_ids, true, since),
                            1,
                            first.as_bytes(),
                        )
                        .await?;
                    for (i, r) in missing.into_iter().zip(retried) {
                        replies[i] = r;
                    }
                }
                Ok::<_, RedisError>(replies)
            })
        };
        let mut replies: Vec<Result<Reply, RedisLimitError>> = match clock::timeout_at(
            deadline,
            self.resend_after_connection_error(first.as_bytes(), attempt),
        )
        .await
        {
            Ok(Ok(replies)) => replies
                .into_iter()
                .map(|r| r.map_err(|e| self.backend(e)))
                .collect(),
            Ok(Err(e)) => vec![Err(self.backend(e)); asked.len()],
            Err(_) => vec![Err(self.timed_out()); asked.len()],
        };
        // Only if Redis answered fewer replies than commands.
        replies.resize_with(asked.len(), || Err(missing_reply()));
        replies
    }

    /// One `EVALSHA` per request, each [`invocation`](Self::invocation)'s,
    /// with each reply kept apart (one key's error does not fail the
    /// others); after a `SCRIPT LOAD` (whose reply is not kept) when
    /// `load`. Unlike the single call, a pipeline does not reload the
    /// script itself: [`eval_on_one_node`](Self::eval_on_one_node) does.
    fn pipeline(
        &self,
        asked: &[(&str, u32)],
        quota: &Encoded,
        ids: &[RequestId],
        load: bool,
        since: Option<u64>,
    ) -> ::redis::Pipeline {
        let mut pipe = ::redis::Pipeline::with_capacity(asked.len() + 1);
        pipe.ignore_errors();
        if load {
            pipe.cmd("SCRIPT")
                .arg("LOAD")
                .arg(texts(&self.inner.conn).0)
                .ignore();
        }
        for (&(key, n), &id) in asked.iter().zip(ids) {
            pipe.invoke_script(&self.invocation(key, quota, n, id, since));
        }
        pipe
    }

    /// A Redis error; its own timeouts count as ours.
    pub(super) fn backend(&self, e: RedisError) -> RedisLimitError {
        if connection_failed(&e) {
            // The client reconnects on its own, maybe to another server.
            self.inner.conn.may_have_moved();
        }
        if e.is_timeout() {
            self.timed_out()
        } else {
            RedisLimitError::Backend(e)
        }
    }

    pub(super) fn timed_out(&self) -> RedisLimitError {
        RedisLimitError::Timeout {
            timeout: self.inner.timeout,
        }
    }
}
