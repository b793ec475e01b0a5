//! One limit shared by many processes: the funnel per key, its state in
//! Redis or a Redis Cluster (feature `redis`).
//!
//! When a service runs as several replicas, a limiter in each replica lets
//! the fleet through N times over. [`RedisFunnel`] keeps each key's state in
//! Redis, so every replica that points at the same server and prefix draws
//! from one budget per key. It is the same meter as [`Funnel`](crate::Funnel)
//! and [`KeyedFunnel`](crate::keyed::KeyedFunnel) — the same exact numbers
//! for the same arrivals, for a rate and a capacity or a [`Quota`] of
//! several bands — with `try_acquire` answering `Limited { retry_after }`
//! for a 429, a quota per call for tiers, and a [`peek`](RedisFunnel::peek)
//! for the `RateLimit` headers.
//!
//! ```no_run
//! use std::time::Duration;
//! use tokio_ratelimit::{Quota, Rate};
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
//! // A paid key's own quota, in the same prefix: 100/s and 100 000 a day.
//! let paid = Quota::new(Rate::per_second(100), 200).and(Rate::per_day(100_000), 100_000);
//! per_user.try_acquire_with("user:7", &paid, 1).await?;
//! // What is left, without taking anything.
//! let left = per_user.peek_with("user:7", &paid, 1).await?;
//! assert_eq!(left.bands().count(), 2);
//! println!("{:?}", per_user.stats()); // decisions, limited, backend errors, ...
//! # Ok(())
//! # }
//! ```
//!
//! # The model
//!
//! * **GCRA per key and band.** A key's whole state is one instant per band
//!   of its quota, the band's theoretical arrival time (when that band will
//!   be empty), all stored under `prefix + key` as one short string. A
//!   request for `n` permits fits a band when
//!   `max(tat, now) + n × interval − now ≤ capacity × interval`; if it does
//!   not, the excess is exactly that band's wait. This is
//!   [`algorithm::FunnelState::try_pour`](crate::algorithm::FunnelState::try_pour),
//!   instant for instant, in every band.
//! * **Every band, or none.** A request is granted only if every band
//!   grants it, and then every band is written; a request any band refuses
//!   writes nothing. `retry_after` is the latest of the bands' waits, each
//!   rounded up to a nanosecond: exactly what a local
//!   [`Funnel`](crate::Funnel) built from the same quota answers.
//! * **One round trip, atomic.** Each decision is one Lua script call,
//!   whatever the number of bands (all of a key's bands live in its one
//!   key, so the script touches one key, as Redis Cluster requires). It
//!   is loaded once (`SCRIPT LOAD`, at build) and run by its hash
//!   (`EVALSHA`); after a
//!   `SCRIPT FLUSH` or a server restart the `NOSCRIPT` answer makes the
//!   client load it again and retry, transparently. Redis runs a script
//!   alone, so concurrent replicas never interleave within a decision.
//!   [`try_acquire_many_keys`](RedisFunnel::try_acquire_many_keys) pipelines
//!   one script call per key in a single round trip (on a cluster, one per
//!   master involved: see [Redis Cluster](#redis-cluster)).
//! * **Server time.** `now` is the Redis server's `TIME`, read inside the
//!   script, never a replica's clock: skew between replicas cannot widen
//!   the limit. (Allowed since Redis 5, where scripts replicate their
//!   effects; Redis 5 or later is required.)
//! * **Memory follows active keys.** Each write sets the key to expire just
//!   after its latest band's theoretical arrival time, at the next whole
//!   millisecond: once every band has drained, its state is
//!   indistinguishable from no state, and Redis drops it. A key costs one
//!   Redis string of three numbers per band (about 25 bytes each).
//! * **Tiers: a quota per call.** [`try_acquire_with`](RedisFunnel::try_acquire_with)
//!   and the other `_with` methods take the quota with the call, so free
//!   and paid keys share one prefix. No quota is stored: a key's state is
//!   its instants and their units only, whatever the number of tiers.
//!   When a key's tier changes, each band's instant (when that band is
//!   full again) carries over to the new quota's band of the same index:
//!   the time until the band is full is kept — for bands with the same
//!   window (capacity ÷ rate) the fraction in use, Bucket4j's
//!   `PROPORTIONALLY`. An instant in other units is rounded up to a whole
//!   microsecond; stored bands beyond the new quota's count are kept
//!   unchanged (and still count in the expiry); missing ones read as
//!   empty. See [`try_acquire_with`](RedisFunnel::try_acquire_with).
//! * **A look without taking.** [`peek`](RedisFunnel::peek) is one round
//!   trip of a read-only script (`TIME` and `GET`) that changes nothing,
//!   not even the key's expiry; the answer — what a decision would say at
//!   that server time, and each band's permits available and time until
//!   full — is computed here, exactly as the script would.
//! * **Exact arithmetic.** Lua numbers are doubles, exact for integers below
//!   2⁵³, and `TIME` has microseconds. The script keeps every instant as
//!   whole microseconds plus a remainder in the crate's scaled units (`1/den`
//!   ns, where `num/den` ns is the interval in lowest terms), and only adds,
//!   subtracts and compares such pairs, so every value stays an exact
//!   integer; each band is computed in its own units, and numbers of two
//!   bands are never combined there (their waits are compared here,
//!   exactly). The one limit this imposes: each band's
//!   `capacity × interval` at most 2⁵⁰ µs (35.7 years of drain time);
//!   `build()` refuses deeper bands with a [`ConfigError`] rather than
//!   round (and a call's own quota with
//!   [`RedisLimitError::InvalidQuota`]). The state string is
//!   `"<µs> <remainder> <units per µs>"` per band, space separated — a
//!   one-band state is the format from before quotas, which reads as it
//!   did; a limiter with another rate that finds a key written by this one
//!   reads its instant rounded up to the next microsecond.
//!
//! # When Redis fails
//!
//! Every decision has a deadline ([`timeout`](RedisFunnelBuilder::timeout), 200 ms by
//! default) covering the connection, the script and a reload: no request
//! hangs on a dead or stalled Redis. A decision that fails or times out is
//! decided by the limiter's [`FailurePolicy`]: `Open` grants it (counted in
//! [`RedisStats::fail_open_grants`]), `Closed` refuses it with
//! [`RedisLimitError::Backend`] or [`RedisLimitError::Timeout`], never with
//! `Limited`. Either way it is counted in [`RedisStats::backend_errors`],
//! and the first failure after a success (and the recovery) is logged at
//! `warn` (`info`) level through `tracing`. A [`peek`](RedisFunnel::peek)
//! is not a decision: Redis failing to answer it is an error whatever the
//! policy (a look cannot be granted), and it is not counted.
//!
//! On one server the connection is a multiplexed one that this crate makes
//! again when it is lost, one connection attempt at a time, without
//! backoff: while Redis refuses connections a decision fails at once (in
//! about a tenth of a millisecond on loopback) instead of waiting out its
//! deadline, and the first decision after Redis is back reconnects. Its
//! socket is watched, so a connection the server closed while it was idle
//! (`CLIENT KILL`, the server's idle `timeout`, a proxy's, a restart) is
//! seen closed before the next decision is sent on it: that decision
//! connects again and is sent once.
//!
//! # A resent decision never pours twice
//!
//! A connection can still fail with a decision in flight — after Redis ran
//! the script and before its reply came back, or before the request left —
//! and no client can tell which. So resending is made harmless instead of
//! avoided: every decision carries a random 64-bit request id, the same in
//! each attempt, and a grant keeps its id beside the key's state (the 16
//! latest grants' ids, for twice the decision's deadline, at most a day). A decision that
//! fails on the connection is sent once more, on a new connection, within
//! its deadline (counted in [`RedisStats::retries`]); Redis answers a
//! resend whose id it kept from that grant, without pouring again
//! (counted in [`RedisStats::resends_granted_before`]), and decides any
//! other resend anew — its first attempt granted nothing, since a refusal
//! writes nothing. The one case it cannot tell, a resend whose key had
//! more than 16 grants since its first attempt (over 16 grants of one key
//! within a round trip or two), fails by the policy rather than risk a
//! second pour. This holds for single calls, batches (a batch's pipeline is
//! resent whole; each request has its own id) and clusters alike.
//!
//! The cost: a key's state grows by the ids, about 20 bytes per grant kept
//! (see the README's figures), and a key lives in Redis until its bands
//! have drained or twice the deadline after its last grant, whichever is
//! later (400 ms by default; limits whose window is shorter keep their keys
//! that much longer). Errors Redis answers (a script error, a timeout of
//! ours) are not resent. A Redis that accepts connections but does not
//! answer (stalled, or a host that drops packets) costs each decision its
//! full deadline.
//!
//! # What the refusal cache promises
//!
//! With the [refusal cache](RedisFunnelBuilder::refusal_cache) on (the
//! default), a refusal Redis gave is answered in this process, without a
//! round trip, only to a request of the same key, under the same quota (and
//! so the same prefix: the cache is the limiter's), of as many permits
//! (a refusal of fewer refuses more too, but not for as long, and a
//! `retry_after` is the request's own), until the instant Redis said they
//! could fit — a refusal Redis
//! would give too, since its state of a key only ever moves later. It is
//! dropped as soon as anything says that state may have moved back: a
//! grant Redis gives the key (any decision, any quota), a peek that shows
//! the refused request would fit, a new connection (the server may have
//! restarted without its data, or be another one behind the same address),
//! and on a cluster any connection failure or redirect (the slot may be
//! served by a promoted replica). A connection the server closed is seen
//! without a round trip; before answering from a refusal learned through
//! it, the limiter tries to connect again (or waits for the attempt of
//! another request already connecting), within the decision's timeout: if
//! Redis is back, Redis decides.
//!
//! While Redis cannot be reached, a cached refusal still refuses, whatever
//! the [`FailurePolicy`]: Redis, back with its data, would refuse it too;
//! its `retry_after` counts from the end of that attempt, and one that ran
//! out during it is not answered (the policy decides, as for any request
//! Redis could not).
//! Every other request is decided by the policy — failing open, granted.
//! What no client can see is a key deleted or rewritten by hand while the
//! connection stays up: the cache then refuses for at most the
//! `retry_after` it was told, or until the key's next grant.
//!
//! Waiting (`acquire`) is a loop of decisions: sleep `retry_after`, ask
//! again. There is no queue shared between replicas, so waiters are not
//! served in arrival order; a waiter that loses a race waits again.
//!
//! # Redis Cluster
//!
//! [`RedisFunnel::cluster_builder`] takes the URLs of some of a cluster's
//! nodes (one reachable node is enough) and gives the same API, the same
//! options and the same answers as on one server: every decision is one
//! script call on one key, which the cluster runs on the master of that
//! key's slot. Redis 7 or later is required on a cluster (the scripts
//! declare themselves writers, so that a replica redirects them to its
//! master instead of running them).
//!
//! * **Slots.** A key's slot is CRC16 of its Redis key, `prefix + key`, mod
//!   16 384 — or, when the Redis key has a *hash tag* (the bytes between its
//!   first `{` and the first `}` after it, if there is at least one), CRC16
//!   of the tag only. Keys spread over the masters on their own; keys with
//!   one tag (`"{user42}:api"`, `"{user42}:uploads"` of two limiters) share a
//!   slot, so one master. A prefix with a tag in it (`"rl:{api}:"`) would put
//!   every key of the limiter in one slot, on one master, with the others
//!   idle: [`build`](RedisFunnelBuilder::build) refuses it on a cluster
//!   (a [`ConfigError::InvalidParameter`] naming `prefix`), since such a
//!   mistake only shows as one hot node under load. A `{` whose `}` is in
//!   the key (`"rl:{"` and `"user42}"`) is the key's choice, and allowed.
//! * **Batches by node.** [`try_acquire_many_keys`](RedisFunnel::try_acquire_many_keys)
//!   groups its requests by the master of their slots and sends one
//!   pipeline per master, concurrently: one round trip per node involved.
//!   The answers come back in the caller's order; a node that fails or
//!   misses the deadline fails its own requests by the policy, the others
//!   stand. The grouping uses the limiter's copy of the topology
//!   (`CLUSTER SLOTS`, read at build and again after any node failed a
//!   batch); a batch sent on a stale copy fails by the policy for the node
//!   that moved.
//! * **Retries.** The cluster client is built with no retries of its own
//!   (it would resend a request blindly, up to 16 times). The limiter
//!   sends again what a node refused before running it — a call answered
//!   `MOVED` to the node named (the client reads the new topology too), one
//!   answered `ASK` to the node named, one answered `NOSCRIPT` after
//!   loading the script on that node — and, once, a decision or a batch's
//!   pipeline that failed on the connection, as on one server: harmless,
//!   since a resend is answered from its grant if it had run (see
//!   [above](#a-resent-decision-never-pours-twice)). `CLUSTERDOWN` and
//!   `TRYAGAIN` fail the decision by the policy at once.
//! * **Failover.** While a slot has no master (its master died, its replica
//!   is not promoted yet) every decision on it fails by the policy: with
//!   Redis's default `cluster-require-full-coverage yes`, every slot does.
//!   That lasts the `cluster-node-timeout`, the failure's agreement among
//!   the masters and the replica's election (half a second to a second,
//!   then the votes): about 2.5 s with a 1 s node timeout in this crate's
//!   tests. The limiter needs nothing to recover: the first decision that
//!   reaches the new master (or is redirected to it) decides again, and
//!   loads the script there if that replica never had it.
//! * **What a failover can cost.** Replication is asynchronous: a master
//!   acknowledges a write before its replica has it, so a promoted replica
//!   may miss the last writes of its master. A lost write of a grant is a
//!   grant Redis forgets, and grants again. Over an interval containing a
//!   failover, a key grants at most `capacity + rate × T` **plus the grants
//!   of its lost writes**, and those are at most what the key could grant in
//!   the window whose writes were lost — `capacity + rate × lag` for a
//!   replication lag `lag` (on a crash, typically below a millisecond of
//!   writes; a master cut off from the majority keeps accepting writes for
//!   up to `cluster-node-timeout`, and all of them are lost). Refusals are
//!   never lost in a way that over-admits (a refusal writes nothing), and
//!   the refusal cache only ever refuses. A promoted replica whose clock is
//!   ahead of its master's by `δ` drains every key by `δ` more, at most
//!   `rate × δ` more per key (bounded by the capacity); keep the nodes'
//!   clocks synchronized. If even that must not happen, follow the writes
//!   with `WAIT` on the application side, or use a single primary with
//!   synchronous durability; this crate does not pay that round trip.
//!
//! # Real time only
//!
//! Unlike the in-process limiters, a `RedisFunnel` cannot run under tokio's
//! paused clock: while the runtime waits for Redis, a paused clock jumps to
//! the next timer (a connection or decision deadline), so `build()` and
//! every decision time out. Test code that uses it against a real `redis-server` in
//! real time (as this crate's own tests do), or put it behind an interface
//! that tests replace with [`KeyedFunnel`](crate::keyed::KeyedFunnel).

#[cfg(doc)]
use crate::ConfigError;
#[cfg(doc)]
use crate::Quota;

mod builder;
mod cache;
mod cluster;
mod conn;
mod error;
mod limiter;
mod repr;
mod script;
mod shared;
mod state;
mod stats;

pub use self::builder::{IntoClient, RedisFunnelBuilder};
pub use self::error::{RedisBuildError, RedisLimitError};
pub use self::limiter::{Decision, FailurePolicy, RedisFunnel};
pub use self::stats::RedisStats;
