#![cfg(feature = "redis")]
//! Where `RedisFunnel::set_quota` (live limit changes) meets the Redis
//! backend's other features under faults (feature `redis`), against a real
//! `redis-server`: the refusal cache across a change and back, during an
//! outage and after a restart; two processes on one prefix of which one
//! changed its quota (exact counts and exact waits); a waiter across a
//! change; a peek's resend and the counters. Real time (Redis's clock), as
//! in `tests/redis.rs`; rates are slow (an hour per permit) so that what
//! drains during a test is below a permit, and exact waits are computed
//! from the server times `decide` reports.

#[path = "support/redis_server.rs"]
mod redis_server;

#[path = "support/redis_cluster.rs"]
mod redis_cluster;

#[path = "support/redis_proxy.rs"]
mod redis_proxy;

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, SystemTime};

use redis_cluster::RedisCluster;
use redis_proxy::{dying_proxy, reply_losing_proxy};
use redis_server::RedisServer;
use tokio::time::sleep;
use tokio_ratelimit::redis::{FailurePolicy, RedisFunnel, RedisLimitError, RedisStats};
use tokio_ratelimit::{Quota, Rate};

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

const HOUR: Duration = Duration::from_secs(3600);

/// One permit an hour: nothing drains within a test.
fn hourly() -> Rate {
    Rate::per_hour(1)
}

async fn limiter(
    url: &str,
    quota: Quota,
    prefix: &str,
    cache: usize,
    policy: FailurePolicy,
) -> RedisFunnel {
    RedisFunnel::builder(url)
        .quota(quota)
        .prefix(prefix)
        .failure_policy(policy)
        .timeout(ms(500))
        .refusal_cache(cache)
        .build()
        .await
        .unwrap()
}

fn is_limited<T: std::fmt::Debug>(r: &Result<T, RedisLimitError>) -> bool {
    matches!(r, Err(RedisLimitError::Limited { .. }))
}

fn wait_of<T: std::fmt::Debug>(r: &Result<T, RedisLimitError>) -> Duration {
    match r {
        Err(RedisLimitError::Limited { retry_after }) => *retry_after,
        other => panic!("expected Limited, got {other:?}"),
    }
}

/// The server time of a decision, as a duration since the epoch.
fn since_epoch(t: SystemTime) -> Duration {
    t.duration_since(SystemTime::UNIX_EPOCH).unwrap()
}

/// The counters that say what was decided and how: (decisions, granted,
/// limited, backend errors, timeouts, fail-open grants, retries, resends
/// granted before, cached refusals).
fn counts(s: RedisStats) -> [u64; 9] {
    [
        s.decisions,
        s.granted,
        s.limited,
        s.backend_errors,
        s.timeouts,
        s.fail_open_grants,
        s.retries,
        s.resends_granted_before,
        s.cached_refusals,
    ]
}

/// The refusal cache answers a refusal only under the quota it was learned
/// under, across `set_quota` and back, while Redis is down and after it
/// restarts without its data:
///
/// * under A, a refusal from Redis is cached;
/// * Redis killed: under A the cached refusal still refuses ("While Redis
///   cannot be reached a cached refusal still refuses");
/// * `set_quota(B)`: B has no cached refusal, so the failure policy
///   (closed) answers `Backend`, never `Limited`;
/// * `set_quota(A)` again: the cached refusal answers again (Redis, back
///   with its data, would refuse it: its state only moves later);
/// * Redis restarted empty: the limiter connects again before answering
///   from the cache, and Redis (with no state) grants.
///
/// Every decision is counted once, refusals apart from errors.
#[tokio::test]
async fn set_quota_and_back_while_redis_is_down_the_cache_keeps_to_its_quota() {
    let Some(mut server) = RedisServer::start("live_meet_cache_outage") else {
        return;
    };
    let a = Quota::new(hourly(), 1);
    let b = Quota::new(hourly(), 2);
    let l = limiter(&server.url(), a, "co:", 1024, FailurePolicy::Closed).await;
    l.try_acquire("k").await.unwrap();
    let first = l.try_acquire("k").await;
    assert!(is_limited(&first), "{first:?}");
    assert_eq!(counts(l.stats()), [2, 1, 1, 0, 0, 0, 0, 0, 0]);

    server.kill();
    let cached = l.try_acquire("k").await;
    assert!(is_limited(&cached), "{cached:?}");
    assert!(wait_of(&cached) <= wait_of(&first));
    assert_eq!(counts(l.stats()), [2, 1, 1, 0, 0, 0, 0, 0, 1]);

    l.set_quota(b).unwrap();
    let under_b = l.try_acquire("k").await;
    assert!(
        matches!(under_b, Err(RedisLimitError::Backend(_))),
        "under the new quota nothing is cached: the policy answers, got {under_b:?}"
    );
    assert_eq!(counts(l.stats()), [3, 1, 1, 1, 0, 0, 0, 0, 1]);

    l.set_quota(a).unwrap();
    let back = l.try_acquire("k").await;
    assert!(is_limited(&back), "{back:?}");
    assert_eq!(counts(l.stats()), [3, 1, 1, 1, 0, 0, 0, 0, 2]);

    server.restart();
    l.try_acquire("k").await.unwrap();
    assert_eq!(counts(l.stats()), [4, 2, 1, 1, 0, 0, 0, 0, 2]);
}

/// Two processes' limiters on one prefix, both built with A = 1/h with a
/// burst of 4; one of them changes its quota to B = 1/h with a burst of 8,
/// the other is not told. A key poured 4 under A (its band full until
/// `t0 + 4 h`):
///
/// * the changed limiter grants exactly 4 more (4 h of water in an 8 h
///   band), then refuses with exactly `t0 + 1 h − now` (the band is full
///   until `t0 + 8 h`, one more permit needs 1 h drained);
/// * the other one, still under A, reads 8 h of water in a 4 h band
///   (over-full) and refuses with exactly `t0 + 5 h − now`;
/// * each one's peek agrees with its own next decision: no permit, and
///   the same band full in `t0 + 8 h − now`.
///
/// "Other processes sharing the prefix keep their own quota until they are
/// told" (`set_quota`), and a tier change keeps each band's instant.
#[tokio::test]
async fn a_fleet_where_one_process_changed_its_quota_admits_exactly_by_each_quota() {
    let Some(server) = RedisServer::start("live_meet_fleet") else {
        return;
    };
    let old = Quota::new(hourly(), 4);
    let new = Quota::new(hourly(), 8);
    let changed = limiter(&server.url(), old, "fl:", 1024, FailurePolicy::Closed).await;
    let other = limiter(&server.url(), old, "fl:", 1024, FailurePolicy::Closed).await;
    let first = changed.decide("k", 4).await.unwrap();
    assert!(first.is_granted());
    let t0 = since_epoch(first.server_time);

    changed.set_quota(new).unwrap();
    assert_eq!(changed.capacity(), 8);
    let mut granted = 0;
    let refused = loop {
        let next = changed.decide("k", 1).await.unwrap();
        if next.is_granted() {
            granted += 1;
            assert!(granted <= 8, "granted past the new burst");
        } else {
            break next;
        }
    };
    assert_eq!(granted, 4, "4 h of water in an 8 h band: 4 permits left");
    assert_eq!(
        refused.retry_after,
        (t0 + HOUR).checked_sub(since_epoch(refused.server_time)),
        "under B: full until t0 + 8 h, a permit after 1 h more"
    );

    let theirs = other.decide("k", 1).await.unwrap();
    assert_eq!(
        theirs.retry_after,
        (t0 + 5 * HOUR).checked_sub(since_epoch(theirs.server_time)),
        "under A: 8 h of water in a 4 h band, a permit once 5 h have drained"
    );
    // `decide` taught its refusal to the cache: answered without Redis,
    // never longer than Redis's own wait.
    let cached = other.try_acquire("k").await;
    assert!(
        wait_of(&cached) <= theirs.retry_after.unwrap(),
        "{cached:?}"
    );
    assert_eq!(other.stats().decisions, 1);
    assert_eq!(other.stats().cached_refusals, 1);

    for (limiter, wait) in [(&changed, HOUR), (&other, 5 * HOUR)] {
        let p = limiter.peek("k", 1).await.unwrap();
        let band = p.bands().next().unwrap();
        assert_eq!(band.available, 0);
        // full_in = t0 + 8 h − now_peek; retry_after = t0 + wait − now_peek.
        assert_eq!(
            p.retry_after().unwrap() + (8 * HOUR).checked_sub(wait).unwrap(),
            band.full_in,
            "{p:?}"
        );
        let next = limiter.decide("k", 1).await.unwrap();
        assert!(next.retry_after.unwrap() <= p.retry_after().unwrap());
    }
}

/// A refusal is cached; Redis restarts without its data. Two requests come
/// together: one for another key (not cached: it connects again) and one
/// for the refused key. The module docs: "A connection the server closed
/// is seen without a round trip; before answering from a refusal learned
/// through it, the limiter tries to connect again: if Redis is back, Redis
/// decides." Redis is back, and empty: it grants the refused key.
#[tokio::test]
async fn after_a_restart_a_cached_refusal_is_not_answered_while_another_request_reconnects() {
    let Some(mut server) = RedisServer::start("live_meet_restart_race") else {
        return;
    };
    let l = limiter(
        &server.url(),
        Quota::new(hourly(), 1),
        "rr:",
        1024,
        FailurePolicy::Closed,
    )
    .await;
    l.try_acquire("k").await.unwrap();
    assert!(is_limited(&l.try_acquire("k").await));
    server.restart();
    let (other, k) = tokio::join!(l.try_acquire("other"), l.try_acquire("k"));
    other.unwrap();
    assert!(
        k.is_ok(),
        "Redis restarted empty would grant `k`, but got {k:?} (stats {:?})",
        l.stats()
    );
}

/// A peek is not a decision: "it is not counted in `stats`". A peek whose
/// reply is lost with its connection is sent again (harmless: it reads),
/// and answers; the counters must still show nothing, `retries` included
/// ("Attempts sent again ..., at most two per decision: counted once in
/// `decisions`"). A decision's lost reply, for contrast, counts one
/// decision and one retry.
#[tokio::test]
async fn a_peeks_resend_is_not_counted_as_a_decisions_retry() {
    let Some(server) = RedisServer::start("live_meet_peek_resend") else {
        return;
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let to_lose = Arc::new(AtomicU32::new(0));
    let proxy = reply_losing_proxy(listener, server.port(), to_lose.clone(), ms(20));
    let l = limiter(
        &format!("redis://127.0.0.1:{port}/"),
        Quota::new(hourly(), 3),
        "pr:",
        0,
        FailurePolicy::Closed,
    )
    .await;
    to_lose.store(1, Ordering::SeqCst);
    let p = l.peek("k", 1).await.unwrap();
    assert_eq!(p.bands().next().unwrap().available, 3);
    assert_eq!(
        to_lose.load(Ordering::SeqCst),
        0,
        "the peek's reply was lost"
    );
    let after_peek = counts(l.stats());
    to_lose.store(1, Ordering::SeqCst);
    l.try_acquire("k").await.unwrap();
    let after_decision = counts(l.stats());
    proxy.abort();
    assert_eq!(
        (after_peek, after_decision),
        ([0, 0, 0, 0, 0, 0, 0, 0, 0], [1, 1, 0, 0, 0, 0, 1, 1, 0]),
        "a peek counts nothing; a decision's resend counts one retry"
    );
}

/// A waiter (`acquire_many`) under A = 1/s with a burst of 2 waits for 2
/// permits of a drained key; meanwhile `set_quota(B)`, B = 1/s with a burst
/// of 1. `set_quota`: "across it, a band admits at most what it had left
/// under the old quota before the change, and what the new quota allows
/// after it (its capacity at most, and its rate)"; `acquire` is "asks,
/// sleeps the `retry_after` Redis answered, asks again". The asks after
/// the change are new decisions: under B, 2 permits exceed the capacity
/// (`InsufficientCapacity`), which the waiter gets. (Before the fix it
/// kept asking under A and was granted 2 permits two seconds after the
/// change, twice B's capacity.)
#[tokio::test]
async fn a_waiter_across_set_quota_asks_under_the_new_quota() {
    let Some(server) = RedisServer::start("live_meet_waiter") else {
        return;
    };
    let old = Quota::new(Rate::per_second(1), 2);
    let new = Quota::new(Rate::per_second(1), 1);
    let l = limiter(&server.url(), old, "wq:", 1024, FailurePolicy::Closed).await;
    let plain = limiter(&server.url(), new, "wq:", 0, FailurePolicy::Closed).await;
    l.try_acquire_many("k", 2).await.unwrap();
    let waiter = {
        let l = l.clone();
        tokio::spawn(async move { l.acquire_many("k", 2).await })
    };
    sleep(ms(200)).await;
    l.set_quota(new).unwrap();
    assert!(
        matches!(
            l.try_acquire_many("k", 2).await,
            Err(RedisLimitError::InsufficientCapacity)
        ),
        "a new call under B"
    );
    let r = waiter.await.unwrap();
    // What the key holds now, read under B (1 s deep): over-full if the
    // waiter poured 2 after the change.
    let p = plain.peek("k", 1).await.unwrap();
    assert!(
        matches!(r, Err(RedisLimitError::InsufficientCapacity)),
        "the waiter, asking after the change, got {r:?}; the key under B now: {p:?}"
    );
}

/// On a cluster, a refusal is cached; the master of its key restarts in
/// place without its data (back before any failover, serving its slots,
/// empty). A request for another key of that master then fails on the
/// connection and is resent (counted in `retries`): a connection failure
/// the limiter saw. The docs: "on a cluster any connection failure or
/// redirect (a promoted replica) each end it" (README), "on a cluster any
/// connection failure ... moves the epoch" (`conn.rs`). So the refused
/// key is decided by Redis next, which (empty) grants it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_cluster_a_resent_connection_failure_ends_cached_refusals() {
    let Some(mut cluster) = RedisCluster::start("live_meet_cluster_restart") else {
        return;
    };
    let prefix = "cr:";
    let quota = Quota::new(hourly(), 1);
    let l = RedisFunnel::cluster_builder(cluster.urls())
        .quota(quota)
        .prefix(prefix)
        .failure_policy(FailurePolicy::Closed)
        .timeout(ms(500))
        .build()
        .await
        .unwrap();
    let master = cluster.masters()[0];
    let keys = redis_cluster::keys_on(&cluster, master, prefix, "x", 2);
    let (refused, other) = (&keys[0], &keys[1]);
    l.try_acquire(refused).await.unwrap();
    assert!(is_limited(&l.try_acquire(refused).await));
    assert!(is_limited(&l.try_acquire(refused).await));
    assert_eq!(l.stats().cached_refusals, 1);

    cluster.nodes[master].restart();
    cluster.wait_until_ok(Duration::from_secs(30));
    assert_eq!(
        cluster.masters()[0],
        master,
        "restarted in place, no failover"
    );
    let plain = RedisFunnel::cluster_builder(cluster.urls())
        .quota(quota)
        .prefix(prefix)
        .failure_policy(FailurePolicy::Closed)
        .timeout(ms(500))
        .refusal_cache(0)
        .build()
        .await
        .unwrap();
    let p = plain.peek(refused, 1).await.unwrap();
    assert!(p.is_granted(), "the master lost its data: {p:?}");

    let retries = l.stats().retries;
    l.try_acquire(other).await.unwrap();
    let s = l.stats();
    assert!(
        s.retries > retries,
        "a connection failure was seen and resent: {s:?}"
    );
    let answer = l.try_acquire(refused).await;
    assert!(
        answer.is_ok(),
        "after a connection failure on the key's master, Redis (empty) decides and grants; got {answer:?}, {:?}",
        l.stats()
    );
}

/// A decision under A (one band: 1/h, a burst of 3) is in flight when its
/// connection is lost after Redis ran it (granted); `set_quota(B)` (A's
/// band and a day band) happens before the loss is seen. "A call already
/// under way finishes under the quota it read": the resend is sent under
/// A, found granted by its id, and answered from that grant without
/// pouring again — the key holds one pour of 2 in its first band and
/// nothing in the day band A does not have. The counters: one decision,
/// granted, one retry, answered from its grant. The next call is under B.
#[tokio::test]
async fn a_resend_across_set_quota_stays_under_the_quota_it_was_sent_with_and_pours_once() {
    let Some(server) = RedisServer::start("live_meet_resend_across_change") else {
        return;
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let to_lose = Arc::new(AtomicU32::new(0));
    let proxy = reply_losing_proxy(listener, server.port(), to_lose.clone(), ms(300));
    let a = Quota::new(hourly(), 3);
    let b = a.and(Rate::per_day(10), 10);
    let l = limiter(
        &format!("redis://127.0.0.1:{port}/"),
        a,
        "ra:",
        1024,
        FailurePolicy::Closed,
    )
    .await;
    let plain = limiter(&server.url(), b, "ra:", 0, FailurePolicy::Closed).await;
    to_lose.store(1, Ordering::SeqCst);
    let call = {
        let l = l.clone();
        tokio::spawn(async move { l.try_acquire_many("k", 2).await })
    };
    sleep(ms(100)).await;
    assert_eq!(
        to_lose.load(Ordering::SeqCst),
        0,
        "the first attempt is in flight"
    );
    l.set_quota(b).unwrap();
    call.await.unwrap().unwrap();
    assert_eq!(counts(l.stats()), [1, 1, 0, 0, 0, 0, 1, 1, 0]);
    let available =
        |p: &tokio_ratelimit::Peek| -> Vec<u32> { p.bands().map(|s| s.available).collect() };
    assert_eq!(
        available(&plain.peek("k", 1).await.unwrap()),
        [1, 10],
        "poured once, under A"
    );
    // The next call is under B: both bands poured.
    l.try_acquire("k").await.unwrap();
    assert_eq!(available(&plain.peek("k", 1).await.unwrap()), [0, 9]);
    assert_eq!(counts(l.stats()), [2, 2, 0, 0, 0, 0, 1, 1, 0]);
    proxy.abort();
}

/// A refusal cached with about 300 ms to run; then the connection it was
/// learned through is closed and Redis stops answering new ones. A request
/// for the key: the limiter tries to connect again before answering from
/// the cache, which takes its whole deadline (500 ms) and fails. By then
/// the refusal has run out: "It only refuses what Redis would: ... until
/// its `retry_after`" (README), so the request is Redis's to decide, and
/// Redis cannot: the failure policy (closed) answers `Timeout`, counted as
/// one (not as a cached refusal). (Before the fix the cache answered
/// `Limited` with the wait it had before the reconnect: about 270 ms, for
/// permits that fell due ~230 ms earlier.)
#[tokio::test]
async fn a_cached_refusal_that_runs_out_while_reconnecting_is_not_answered() {
    let Some(server) = RedisServer::start("live_meet_stale_cached") else {
        return;
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let dead = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let proxy = dying_proxy(listener, server.port(), dead.clone());
    let l = limiter(
        &format!("redis://127.0.0.1:{port}/"),
        Quota::new(Rate::per(1, ms(300)), 1),
        "st:",
        1024,
        FailurePolicy::Closed,
    )
    .await;
    l.try_acquire("k").await.unwrap();
    let refused = l.try_acquire("k").await;
    let learned = tokio::time::Instant::now();
    let until = learned + wait_of(&refused);
    dead.store(true, Ordering::SeqCst);
    let mut admin = redis::Client::open(server.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let killed: i64 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("normal")
        .query_async(&mut admin)
        .await
        .unwrap();
    assert!(killed >= 1);
    sleep(ms(20)).await;
    let r = l.try_acquire("k").await;
    let answered = tokio::time::Instant::now();
    proxy.abort();
    assert!(
        !(is_limited(&r) && answered >= until),
        "answered {:?} after the refusal ran out with {r:?} ({:?})",
        answered - until,
        l.stats()
    );
    // The reconnect takes its whole deadline (500 ms), past the refusal.
    assert!(answered >= until, "{:?}", until - answered);
    assert!(matches!(r, Err(RedisLimitError::Timeout { .. })), "{r:?}");
    let stats = l.stats();
    assert_eq!((stats.timeouts, stats.cached_refusals), (1, 0), "{stats:?}");
}
