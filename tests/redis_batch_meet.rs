#![cfg(feature = "redis")]
//! Where the Redis backend's shortcuts — batches
//! (`try_acquire_many_keys`), the refusal cache, resends — meet its other
//! features (repeated keys, a fleet, the HTTP layer and the tower keyed
//! layer over a `RedisFunnel`, Redis Cluster, the counters) under faults
//! (features `redis`, `http`, `tower`), against real `redis-server`s: a
//! batch's reply lost and resent (on one server, and from one master of a
//! cluster through a proxy it announces), cached refusals while Redis is
//! silent, a decision answered from the cache or by the failure policy
//! behind the HTTP layer, a slot moved under a batch, a master dead or
//! silent under a stream of batches. Real time (Redis's clock), as in
//! `tests/redis.rs`; rates are slow (an hour per permit) so that nothing
//! drains during a test and counts are exact.

#[path = "support/redis_server.rs"]
mod redis_server;

#[path = "support/redis_cluster.rs"]
mod redis_cluster;

#[path = "support/redis_proxy.rs"]
mod redis_proxy;

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::Duration;

use http::{Request, Response};
use redis_cluster::slot;
use redis_proxy::{dying_proxy, reply_losing_proxy};
use redis_server::RedisServer;
use tokio::time::{Instant, sleep};
use tokio_ratelimit::http::{Header, HttpRateLimitLayer};
use tokio_ratelimit::redis::{FailurePolicy, RedisFunnel, RedisLimitError, RedisStats};
use tokio_ratelimit::tower::{KeyedRateLimitLayer, RateLimited};
use tokio_ratelimit::{Quota, Rate, TryAcquireError};
use tower::{Layer, ServiceExt, service_fn};

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// One permit an hour: nothing drains within a test.
fn hourly(capacity: u32) -> Quota {
    Quota::new(Rate::per_hour(1), capacity)
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

/// An answer's kind, without its exact wait: `"ok"`, `"limited"`,
/// `"capacity"`, `"timeout"`, `"backend"`.
fn kind(r: &Result<(), RedisLimitError>) -> &'static str {
    match r {
        Ok(()) => "ok",
        Err(RedisLimitError::Limited { .. }) => "limited",
        Err(RedisLimitError::InsufficientCapacity) => "capacity",
        Err(RedisLimitError::Timeout { .. }) => "timeout",
        Err(RedisLimitError::Backend(_)) => "backend",
        Err(e) => panic!("unexpected {e:?}"),
    }
}

/// Permits left in `key`'s first band, looked at through `l`.
async fn available(l: &RedisFunnel, key: &str) -> u32 {
    redis_server::available(l, key).await
}

async fn kill_clients(server: &RedisServer) -> i64 {
    let mut admin = redis::Client::open(server.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("normal")
        .query_async(&mut admin)
        .await
        .unwrap()
}

async fn proxy_listener() -> (tokio::net::TcpListener, String) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    (listener, format!("redis://127.0.0.1:{port}/"))
}

/// An HTTP request from the client whose API key is `who`.
fn request(who: &str) -> Request<()> {
    Request::builder()
        .uri("/")
        .header("x-api-key", who)
        .body(())
        .unwrap()
}

/// What the HTTP layer over `l` answers one request from `who`: the status
/// and the three fields it may add (`"-"` for one absent).
async fn http_get(l: &RedisFunnel, who: &str) -> (u16, String, String, String) {
    let service = HttpRateLimitLayer::new(l.clone(), Header::new("x-api-key")).layer(service_fn(
        |_: Request<()>| async { Ok::<_, Infallible>(Response::new(String::new())) },
    ));
    let response = service.oneshot(request(who)).await.unwrap();
    let field = |name: &str| {
        response
            .headers()
            .get(name)
            .map_or("-".to_owned(), |v| v.to_str().unwrap().to_owned())
    };
    (
        response.status().as_u16(),
        field("ratelimit-policy"),
        field("ratelimit"),
        field("retry-after"),
    )
}

/// The same key several times in one batch, with `n = 0` and an
/// over-capacity request among them: "`answers[i]`, what
/// `try_acquire_many(key, n)` would have answered. The same key may appear
/// more than once; its requests are decided in order" — the same answers,
/// the same pours and the same counters as the single calls in sequence.
/// The cache learns the key's answers in Redis's order: the refusal of 2
/// and then the grant of 1 leave no entry (a grant ends the key's refusal),
/// so the next request of 2 is Redis's to decide, not the cache's.
#[tokio::test]
async fn a_repeated_key_in_a_batch_is_decided_in_order_as_single_calls_would() {
    let Some(server) = RedisServer::start("batch_meet_in_order") else {
        return;
    };
    let quota = hourly(3);
    let batch = limiter(&server.url(), quota, "bo:", 1024, FailurePolicy::Closed).await;
    let single = limiter(&server.url(), quota, "so:", 1024, FailurePolicy::Closed).await;
    let requests = [("k", 2), ("k", 2), ("k", 0), ("k", 1), ("k", 4), ("k", 1)];
    let answers = batch.try_acquire_many_keys(&requests).await;
    let mut one_by_one = Vec::new();
    for &(key, n) in &requests {
        one_by_one.push(single.try_acquire_many(key, n).await);
    }
    let kinds = |a: &[Result<(), RedisLimitError>]| a.iter().map(kind).collect::<Vec<_>>();
    assert_eq!(
        kinds(&answers),
        ["ok", "limited", "ok", "ok", "capacity", "limited"]
    );
    assert_eq!(kinds(&answers), kinds(&one_by_one));
    assert_eq!(available(&batch, "k").await, 0);
    assert_eq!(available(&single, "k").await, 0);
    // The last request (1, refused) is cached by both; the refusal of 2
    // before it was ended by the grant of 1 in between.
    assert_eq!(counts(batch.stats()), [4, 2, 2, 0, 0, 0, 0, 0, 0]);
    assert_eq!(counts(batch.stats()), counts(single.stats()));
    assert!(matches!(
        batch.try_acquire("k").await,
        Err(RedisLimitError::Limited { .. })
    ));
    assert_eq!(batch.stats().cached_refusals, 1, "{:?}", batch.stats());
    // A refusal of 2 then a grant of 1, in one batch: no entry is left, so
    // a request of 2 goes to Redis.
    let fresh = [("m", 2), ("m", 2), ("m", 1)];
    let answers = batch.try_acquire_many_keys(&fresh).await;
    assert_eq!(kinds(&answers), ["ok", "limited", "ok"]);
    let before = batch.stats();
    assert!(matches!(
        batch.try_acquire_many("m", 2).await,
        Err(RedisLimitError::Limited { .. })
    ));
    let after = batch.stats();
    assert_eq!(
        (
            after.decisions - before.decisions,
            after.cached_refusals - before.cached_refusals
        ),
        (1, 0),
        "the grant after the refusal ended it: {after:?}"
    );
}

/// A batch's pipeline runs on Redis and its reply is lost: "A pipeline
/// that fails on the connection is resent whole, marked as a resend: each
/// request carries its own id ..., so the ones that had run answer their
/// first grant again". The batch holds one key four times (three grants
/// and a refusal), `n = 0`, an over-capacity request and a cached refusal.
/// Afterwards each key holds exactly one pour per grant; the counters: one
/// retry for the pipeline, every grant of the first attempt answered from
/// it, the cached refusal counted once and not asked, and the cache has
/// learned the repeated key's last answer (its refusal).
#[tokio::test]
async fn a_batch_whose_reply_is_lost_pours_each_request_once() {
    let Some(server) = RedisServer::start("batch_meet_lost_reply") else {
        return;
    };
    let (listener, url) = proxy_listener().await;
    let to_lose = Arc::new(AtomicU32::new(0));
    let proxy = reply_losing_proxy(listener, server.port(), to_lose.clone(), ms(100));
    let quota = hourly(3);
    let l = limiter(&url, quota, "lr:", 1024, FailurePolicy::Closed).await;
    let plain = limiter(&server.url(), quota, "lr:", 0, FailurePolicy::Closed).await;
    // "d" refused and cached.
    l.try_acquire_many("d", 3).await.unwrap();
    assert!(matches!(
        l.try_acquire("d").await,
        Err(RedisLimitError::Limited { .. })
    ));
    assert_eq!(counts(l.stats()), [2, 1, 1, 0, 0, 0, 0, 0, 0]);
    to_lose.store(1, Ordering::SeqCst);
    let requests = [
        ("a", 1),
        ("a", 1),
        ("b", 0),
        ("a", 1),
        ("c", 5),
        ("d", 1),
        ("a", 1),
        ("b", 2),
    ];
    let answers = l.try_acquire_many_keys(&requests).await;
    assert_eq!(to_lose.load(Ordering::SeqCst), 0, "the reply was lost");
    assert_eq!(
        answers.iter().map(kind).collect::<Vec<_>>(),
        [
            "ok", "ok", "ok", "ok", "capacity", "limited", "limited", "ok"
        ]
    );
    assert_eq!(available(&plain, "a").await, 0, "three pours of 1");
    assert_eq!(available(&plain, "b").await, 1, "one pour of 2");
    assert_eq!(available(&plain, "c").await, 3);
    assert_eq!(available(&plain, "d").await, 0);
    // Five asked: four granted (answered from their first grant), one
    // refused; one resend of the pipeline; "d" from the cache.
    assert_eq!(counts(l.stats()), [7, 5, 2, 0, 0, 0, 1, 4, 1]);
    // "a"'s refusal came back through the resend's new connection, but is
    // kept in the epoch read before the batch was sent: never answered
    // (a round trip more, never a wrong answer). Redis refuses it again,
    // and that refusal (sent on the new connection) is cached.
    for _ in 0..2 {
        assert!(matches!(
            l.try_acquire("a").await,
            Err(RedisLimitError::Limited { .. })
        ));
    }
    assert_eq!(counts(l.stats()), [8, 5, 3, 0, 0, 0, 1, 4, 2]);
    proxy.abort();
}

/// Three refusals cached, then the connection is closed and Redis stops
/// answering new ones (a host gone silent). A batch of the three cached
/// keys and one fresh key: "The whole batch shares one deadline; when
/// Redis cannot decide it, the failure policy applies to every request
/// that needed Redis." The cached refusals hold for an hour, so they stand
/// (Redis, back, would refuse them too); the fresh key times out by the
/// policy (closed). The batch should be answered within about its one
/// deadline (500 ms), as a single call is.
#[tokio::test]
async fn a_batch_of_cached_refusals_while_redis_is_silent_keeps_one_deadline() {
    let Some(server) = RedisServer::start("batch_meet_silent") else {
        return;
    };
    let (listener, url) = proxy_listener().await;
    let dead = Arc::new(AtomicBool::new(false));
    let proxy = dying_proxy(listener, server.port(), dead.clone());
    let l = limiter(&url, hourly(1), "sl:", 1024, FailurePolicy::Closed).await;
    for key in ["a", "b", "c"] {
        l.try_acquire(key).await.unwrap();
        assert!(matches!(
            l.try_acquire(key).await,
            Err(RedisLimitError::Limited { .. })
        ));
    }
    assert_eq!(counts(l.stats()), [6, 3, 3, 0, 0, 0, 0, 0, 0]);
    dead.store(true, Ordering::SeqCst);
    assert!(kill_clients(&server).await >= 1);
    sleep(ms(20)).await;
    let started = Instant::now();
    let answers = l
        .try_acquire_many_keys(&[("a", 1), ("b", 1), ("c", 1), ("fresh", 1)])
        .await;
    let took = started.elapsed();
    proxy.abort();
    assert_eq!(
        answers.iter().map(kind).collect::<Vec<_>>(),
        ["limited", "limited", "limited", "timeout"]
    );
    assert_eq!(counts(l.stats()), [7, 3, 3, 1, 1, 0, 0, 0, 3]);
    assert!(
        took < ms(500) + ms(250),
        "a batch of one deadline (500 ms) answered after {took:?}"
    );
}

/// Behind the HTTP layer (failing open), a refusal is cached with about
/// 300 ms to run; the connection is closed and Redis stops answering new
/// ones. The next request of the key: the limiter tries to reconnect
/// before answering from the cache, which takes its whole deadline, by
/// when the refusal has run out, so "the failure policy answers" — one
/// decision Redis could not make, granted by the policy: a 200, counted as
/// one fail-open grant ("`decisions = granted + limited + backend_errors`:
/// every decision that was asked of Redis"), within about one deadline.
#[tokio::test]
async fn behind_the_http_layer_a_cached_refusal_that_runs_out_while_reconnecting_is_one_decision() {
    let Some(server) = RedisServer::start("batch_meet_http_stale") else {
        return;
    };
    let (listener, url) = proxy_listener().await;
    let dead = Arc::new(AtomicBool::new(false));
    let proxy = dying_proxy(listener, server.port(), dead.clone());
    let l = limiter(
        &url,
        Quota::new(Rate::per(1, ms(300)), 1),
        "hs:",
        1024,
        FailurePolicy::Open,
    )
    .await;
    assert_eq!(http_get(&l, "ann").await.0, 200);
    assert_eq!(http_get(&l, "ann").await.0, 429);
    assert_eq!(counts(l.stats()), [2, 1, 1, 0, 0, 0, 0, 0, 0]);
    dead.store(true, Ordering::SeqCst);
    assert!(kill_clients(&server).await >= 1);
    sleep(ms(20)).await;
    let started = Instant::now();
    let (status, policy, limit, retry) = http_get(&l, "ann").await;
    let took = started.elapsed();
    proxy.abort();
    assert_eq!((status, &*policy, &*limit, &*retry), (200, "-", "-", "-"));
    assert_eq!(
        counts(l.stats()),
        [3, 1, 1, 1, 1, 1, 0, 0, 0],
        "one request, one decision Redis could not make, granted by the policy"
    );
    assert!(took < ms(500) + ms(250), "answered after {took:?}");
}

/// Behind the HTTP layer, the same refusal answered three ways: by Redis
/// (a 429 with `RateLimit-Policy` and `RateLimit`, `r=0`), then by the
/// refusal cache. "On granted and refused responses alike it adds
/// `RateLimit-Policy` and `RateLimit`" (`HttpRateLimitLayer`), "Every
/// answer carries the IETF draft's fields" (README): the cached 429 should
/// carry them as the one from Redis did (the policy is the quota's, known
/// without Redis; the refusal says no permit is left).
#[tokio::test]
async fn behind_the_http_layer_a_cached_refusal_carries_the_ratelimit_fields() {
    let Some(server) = RedisServer::start("batch_meet_http_cached") else {
        return;
    };
    let l = limiter(&server.url(), hourly(1), "hc:", 1024, FailurePolicy::Closed).await;
    let policy = "\"1-per-3600s\";q=1;w=3600";
    assert_eq!(
        http_get(&l, "ann").await,
        (
            200,
            policy.to_owned(),
            "\"1-per-3600s\";r=0;t=3600".to_owned(),
            "-".to_owned()
        )
    );
    assert_eq!(
        http_get(&l, "ann").await,
        (
            429,
            policy.to_owned(),
            "\"1-per-3600s\";r=0;t=3600".to_owned(),
            "3600".to_owned()
        )
    );
    assert_eq!(l.stats().cached_refusals, 0);
    let cached = http_get(&l, "ann").await;
    assert_eq!(l.stats().cached_refusals, 1, "answered from the cache");
    assert_eq!(
        cached,
        (
            429,
            policy.to_owned(),
            "\"1-per-3600s\";r=0;t=3600".to_owned(),
            "3600".to_owned()
        )
    );
}

/// Behind the HTTP layer, a decision whose reply is lost after Redis
/// granted it: resent, answered from its first grant without pouring again
/// — a 200 whose `RateLimit` shows the one pour (`r=2` of 3), counted as
/// one decision, one retry, one resend granted before. Then Redis killed:
/// failing open, the request is served (200) without rate-limit fields
/// (the state is unknown) and counted as one fail-open grant; failing
/// closed, a 503 with `Retry-After: 1` and no fields.
#[tokio::test]
async fn behind_the_http_layer_a_resent_grant_shows_one_pour_and_an_outage_answers_by_policy() {
    let Some(mut server) = RedisServer::start("batch_meet_http_resend") else {
        return;
    };
    let (listener, url) = proxy_listener().await;
    let to_lose = Arc::new(AtomicU32::new(0));
    let proxy = reply_losing_proxy(listener, server.port(), to_lose.clone(), ms(100));
    let quota = hourly(3);
    let open = limiter(&url, quota, "hr:", 1024, FailurePolicy::Open).await;
    let closed = limiter(&server.url(), quota, "hr:", 1024, FailurePolicy::Closed).await;
    let policy = "\"3-per-10800s\";q=3;w=10800";
    to_lose.store(1, Ordering::SeqCst);
    assert_eq!(
        http_get(&open, "ann").await,
        (
            200,
            policy.to_owned(),
            "\"3-per-10800s\";r=2;t=3600".to_owned(),
            "-".to_owned()
        )
    );
    assert_eq!(to_lose.load(Ordering::SeqCst), 0, "the reply was lost");
    assert_eq!(counts(open.stats()), [1, 1, 0, 0, 0, 0, 1, 1, 0]);
    assert_eq!(available(&closed, "key:ann").await, 2, "poured once");
    // Redis gone, and nothing listening on its address (no proxy).
    proxy.abort();
    server.kill();
    // Let the close reach this process (else the request is written to the
    // dead connection and resent once: a retry more).
    sleep(ms(50)).await;
    assert_eq!(
        http_get(&open, "ann").await,
        (200, "-".to_owned(), "-".to_owned(), "-".to_owned())
    );
    assert_eq!(counts(open.stats()), [2, 1, 0, 1, 0, 1, 1, 1, 0]);
    assert_eq!(
        http_get(&closed, "ann").await,
        (503, "-".to_owned(), "-".to_owned(), "1".to_owned())
    );
    let s = closed.stats();
    assert_eq!(
        (s.decisions, s.backend_errors, s.fail_open_grants),
        (1, 1, 0)
    );
}

/// The tower keyed layer over a `RedisFunnel`: a grant calls the service;
/// a refusal from Redis and then one from the refusal cache are both
/// `RateLimited { key, retry_after }` with the same wait (to the
/// millisecond), the service not called; Redis killed, failing closed:
/// `TryAcquireError::Unavailable` (a 503, never a 429), while the cached
/// refusal still refuses ("While Redis cannot be reached a cached refusal
/// still refuses"). Every answer counted once.
#[tokio::test]
async fn the_tower_keyed_layer_answers_as_the_redis_limiter_decided() {
    let Some(mut server) = RedisServer::start("batch_meet_tower") else {
        return;
    };
    let l = limiter(&server.url(), hourly(1), "tk:", 1024, FailurePolicy::Closed).await;
    let called = Arc::new(AtomicU32::new(0));
    let service = {
        let called = called.clone();
        KeyedRateLimitLayer::new(l.clone(), |req: &(String, u32)| req.0.clone()).layer(service_fn(
            move |req: (String, u32)| {
                called.fetch_add(1, Ordering::SeqCst);
                async move { Ok::<_, Infallible>(req.1) }
            },
        ))
    };
    let ask = |who: &str| service.clone().oneshot((who.to_owned(), 7));
    assert_eq!(ask("ann").await.unwrap(), 7);
    let wait = |e: tokio_ratelimit::tower::BoxError| {
        let limited = e
            .downcast_ref::<RateLimited<String>>()
            .unwrap_or_else(|| panic!("not RateLimited: {e:?}"));
        assert_eq!(limited.key, "ann");
        limited.retry_after
    };
    let from_redis = wait(ask("ann").await.unwrap_err());
    let from_cache = wait(ask("ann").await.unwrap_err());
    assert!(
        from_redis.abs_diff(from_cache) < ms(100) && from_redis > Duration::from_secs(3500),
        "{from_redis:?} then {from_cache:?}"
    );
    assert_eq!(counts(l.stats()), [2, 1, 1, 0, 0, 0, 0, 0, 1]);
    server.kill();
    let e = ask("bob").await.unwrap_err();
    assert!(
        matches!(
            e.downcast_ref::<TryAcquireError>(),
            Some(TryAcquireError::Unavailable)
        ),
        "{e:?}"
    );
    wait(ask("ann").await.unwrap_err());
    assert_eq!(called.load(Ordering::SeqCst), 1);
    assert_eq!(counts(l.stats()), [3, 1, 1, 1, 0, 0, 0, 0, 2]);
}

/// On a cluster, a batch of two keys of one master; one key's slot is then
/// moved to another master (empty, so no key to migrate) behind the
/// limiter's back, so that its copy of the topology is stale; then the
/// batch again. The pipeline goes to the old master, which runs the key it
/// still serves (granted) and answers `MOVED` for the other, which fails
/// the whole pipeline: each request then goes again alone, "as a resend
/// (its own id: harmless)". Returns the second batch's answers, each key's
/// permits left (of 3) afterwards, and what the counters moved by.
async fn batch_across_a_moved_slot(
    cluster: &redis_cluster::RedisCluster,
) -> (Vec<&'static str>, [u32; 2], Vec<u64>) {
    let prefix = "mv:";
    let quota = hourly(3);
    let l = RedisFunnel::cluster_builder(cluster.urls())
        .quota(quota)
        .prefix(prefix)
        .failure_policy(FailurePolicy::Closed)
        .timeout(ms(1000))
        .build()
        .await
        .unwrap();
    let masters = cluster.masters();
    let (from, to) = (masters[0], masters[1]);
    let owners = cluster.owners();
    let on_from: Vec<String> = (0..)
        .map(|i| format!("k{i}"))
        .filter(|k| owners[usize::from(slot(&format!("{prefix}{k}")))] == from)
        .take(2)
        .collect();
    let (stays, moves) = (&on_from[0], &on_from[1]);
    let moved_slot = slot(&format!("{prefix}{moves}"));
    assert_ne!(slot(&format!("{prefix}{stays}")), moved_slot);
    // The limiter reads the topology with its first batch.
    let warm = l.try_acquire_many_keys(&[(stays.as_str(), 1)]).await;
    assert!(warm[0].is_ok(), "{warm:?}");
    // Move the slot (no key in it yet): importing, migrating, then the new
    // owner told to every master, the importing one first.
    let id = |node: usize| {
        redis_cluster::cli_at(cluster.nodes[node].port(), &["CLUSTER", "MYID"])
            .trim()
            .to_owned()
    };
    let (from_id, to_id) = (id(from), id(to));
    let s = moved_slot.to_string();
    let set = |node: usize, args: &[&str]| {
        let out = redis_cluster::cli_at(cluster.nodes[node].port(), args);
        assert!(out.trim() == "OK", "{args:?} on {node}: {out}");
    };
    set(to, &["CLUSTER", "SETSLOT", &s, "IMPORTING", &from_id]);
    set(from, &["CLUSTER", "SETSLOT", &s, "MIGRATING", &to_id]);
    set(to, &["CLUSTER", "SETSLOT", &s, "NODE", &to_id]);
    set(from, &["CLUSTER", "SETSLOT", &s, "NODE", &to_id]);
    for &m in &masters {
        if m != from && m != to {
            set(m, &["CLUSTER", "SETSLOT", &s, "NODE", &to_id]);
        }
    }
    cluster.wait_until_ok(Duration::from_secs(30));
    assert_eq!(cluster.master_of_slot(moved_slot), to);

    let before = l.stats();
    let answers = l
        .try_acquire_many_keys(&[(stays.as_str(), 1), (moves.as_str(), 1)])
        .await;
    let after = l.stats();
    let plain = RedisFunnel::cluster_builder(cluster.urls())
        .quota(quota)
        .prefix(prefix)
        .refusal_cache(0)
        .build()
        .await
        .unwrap();
    let left = [
        available(&plain, stays).await,
        available(&plain, moves).await,
    ];
    let delta = counts(after)
        .iter()
        .zip(counts(before))
        .map(|(a, b)| a - b)
        .collect();
    (answers.iter().map(kind).collect(), left, delta)
}

/// A batch across a slot moved behind the limiter's back (see
/// [`batch_across_a_moved_slot`]): both requests granted, each key poured
/// exactly once (the one the old master had run answered from its grant,
/// the moved one decided by its new master), two decisions counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_moved_under_a_batch_pours_each_request_once() {
    let Some(cluster) = redis_cluster::RedisCluster::start("batch_meet_moved") else {
        return;
    };
    let (answers, left, delta) = batch_across_a_moved_slot(&cluster).await;
    assert_eq!(answers, ["ok", "ok"]);
    assert_eq!(left, [1, 2], "two pours of 1, then one pour of 1");
    assert_eq!(&delta[..3], [2, 2, 0], "two decisions, both granted");
}

/// The counters of a batch across a moved slot (see
/// [`batch_across_a_moved_slot`]): the pipeline's replies all come back
/// redirected, so each request is sent again alone — "`retries`: ... On a
/// cluster, a batch's pipeline whose every reply is a redirect ... sends
/// each of its requests again alone: each counts once" — and the one the
/// old master had run is answered from its grant ("`resends_granted_before`
/// ... whose reply was lost (or came back redirected)"). (The review that
/// found this read the older docs, which spoke of connection failures
/// only.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_moved_under_a_batch_counts_each_resend_alone() {
    let Some(cluster) = redis_cluster::RedisCluster::start("batch_meet_moved_counts") else {
        return;
    };
    let (_, _, delta) = batch_across_a_moved_slot(&cluster).await;
    assert_eq!(
        delta,
        [2, 2, 0, 0, 0, 0, 2, 1, 0],
        "two decisions, both granted; each resent alone, one granted before"
    );
}

/// Configures `cluster` so that the masters left serve their slots while
/// one has none (`cluster-require-full-coverage no`), and finds a key of
/// each master (prefix `prefix`), in `masters()` order.
fn partial_coverage_keys(cluster: &redis_cluster::RedisCluster, prefix: &str) -> Vec<String> {
    for node in &cluster.nodes {
        let out = redis_cluster::cli_at(
            node.port(),
            &["CONFIG", "SET", "cluster-require-full-coverage", "no"],
        );
        assert_eq!(out.trim(), "OK");
    }
    let owners = cluster.owners();
    cluster
        .masters()
        .iter()
        .map(|&m| {
            (0..10_000)
                .map(|i| format!("m{m}-{i}"))
                .find(|k| owners[usize::from(slot(&format!("{prefix}{k}")))] == m)
                .unwrap()
        })
        .collect()
}

async fn cluster_limiter(
    cluster: &redis_cluster::RedisCluster,
    prefix: &str,
    cache: usize,
) -> RedisFunnel {
    RedisFunnel::cluster_builder(cluster.urls())
        .quota(hourly(1000))
        .prefix(prefix)
        .failure_policy(FailurePolicy::Closed)
        .timeout(ms(500))
        .refusal_cache(cache)
        .build()
        .await
        .unwrap()
}

/// Kills the first master and its replica: its slots have no master left.
fn kill_first_master(cluster: &mut redis_cluster::RedisCluster) {
    let dead = cluster.masters()[0];
    let replica = cluster.replica_of(dead);
    cluster.nodes[replica].kill();
    cluster.nodes[dead].kill();
}

/// A batch over all three masters of a cluster, 40 times, after the first
/// master and its replica were killed (`cluster-require-full-coverage
/// no`: the other masters keep serving their slots). Every batch, the
/// dead master's key fails by the policy (closed); every grant of a live
/// master's key is exactly one pour; and the live masters' keys are
/// granted in (nearly) every batch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_master_fails_its_own_requests_and_the_others_pour_once() {
    let Some(mut cluster) = redis_cluster::RedisCluster::start("batch_meet_dead_master") else {
        return;
    };
    let prefix = "dm:";
    let keys = partial_coverage_keys(&cluster, prefix);
    let l = cluster_limiter(&cluster, prefix, 1024).await;
    // Built while every master is up: a cluster limiter cannot be built
    // while one is down.
    let plain = cluster_limiter(&cluster, prefix, 0).await;
    let batch: Vec<(&str, u32)> = keys.iter().map(|k| (k.as_str(), 1)).collect();
    let first = l.try_acquire_many_keys(&batch).await;
    assert!(first.iter().all(Result::is_ok), "{first:?}");
    kill_first_master(&mut cluster);
    let mut granted = [1u32, 1, 1];
    let mut both_live = 0;
    for round in 0..40 {
        let answers = l.try_acquire_many_keys(&batch).await;
        assert!(
            answers[0]
                .as_ref()
                .is_err_and(RedisLimitError::is_backend_failure),
            "round {round}: {answers:?}"
        );
        for (i, a) in answers.iter().enumerate().skip(1) {
            if a.is_ok() {
                granted[i] += 1;
            }
        }
        if answers[1..].iter().all(Result::is_ok) {
            both_live += 1;
        }
        sleep(ms(10)).await;
    }
    for i in 1..3 {
        assert_eq!(
            1000 - available(&plain, &keys[i]).await,
            granted[i],
            "{}: one pour per grant",
            keys[i]
        );
    }
    assert!(both_live >= 30, "{both_live} of 40 batches served both");
}

/// A master and its replica stop answering (SIGSTOP: their connections
/// stay open, nothing is answered; `cluster-require-full-coverage no`, so
/// the other masters keep serving). Eight limiters (own connections, own
/// copy of the topology) each send four batches over the three masters.
/// "On a cluster the requests go as one pipeline per master, concurrently
/// ..., and a node that fails or misses the deadline fails only its own
/// requests by the policy": in every batch the silent master's key should
/// time out and the live masters' keys be decided by Redis (granted).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_master_never_fails_the_requests_of_live_masters() {
    let Some(cluster) = redis_cluster::RedisCluster::start("batch_meet_silent_master") else {
        return;
    };
    let prefix = "da:";
    let keys = partial_coverage_keys(&cluster, prefix);
    let batch: Vec<(&str, u32)> = keys.iter().map(|k| (k.as_str(), 1)).collect();
    let mut limiters = Vec::new();
    for _ in 0..8 {
        let l = RedisFunnel::cluster_builder(cluster.urls())
            .quota(hourly(1000))
            .prefix(prefix)
            .failure_policy(FailurePolicy::Closed)
            .timeout(ms(200))
            .build()
            .await
            .unwrap();
        let first = l.try_acquire_many_keys(&batch).await;
        assert!(first.iter().all(Result::is_ok), "{first:?}");
        limiters.push(l);
    }
    let silent = cluster.masters()[0];
    let replica = cluster.replica_of(silent);
    cluster.nodes[silent].stop();
    cluster.nodes[replica].stop();
    let mut wrong = Vec::new();
    for round in 0..4 {
        let all =
            futures::future::join_all(limiters.iter().map(|l| l.try_acquire_many_keys(&batch)))
                .await;
        for (n, answers) in all.iter().enumerate() {
            assert!(
                matches!(answers[0], Err(RedisLimitError::Timeout { .. })),
                "{answers:?}"
            );
            for (i, a) in answers.iter().enumerate().skip(1) {
                if let Err(e) = a {
                    wrong.push(format!("limiter {n}, batch {round}: {} {e}", keys[i]));
                }
            }
        }
    }
    cluster.nodes[silent].cont();
    cluster.nodes[replica].cont();
    assert!(
        wrong.is_empty(),
        "{} of 64 requests to live masters failed: {wrong:#?}",
        wrong.len()
    );
}

/// One key 18 times in a batch (room for 20), the pipeline's reply lost
/// after Redis ran it: the key keeps the ids of its 16 latest grants, so
/// the resend finds the last 16 and answers them from their grants; the
/// first two ids were evicted by grants made after the first attempt could
/// have run, so "whether it ran cannot be told, and it must not pour
/// twice": those two fail by the policy (closed), though Redis had granted
/// them. The key holds exactly 18 pours.
#[tokio::test]
async fn a_lost_batch_of_one_key_granted_18_times_pours_18_and_fails_the_two_it_cannot_tell() {
    let Some(server) = RedisServer::start("batch_meet_ids") else {
        return;
    };
    let (listener, url) = proxy_listener().await;
    let to_lose = Arc::new(AtomicU32::new(0));
    let proxy = reply_losing_proxy(listener, server.port(), to_lose.clone(), ms(100));
    let quota = hourly(20);
    let l = limiter(&url, quota, "id:", 1024, FailurePolicy::Closed).await;
    let plain = limiter(&server.url(), quota, "id:", 0, FailurePolicy::Closed).await;
    // A reply seen first, so that the resend's `since` is known.
    l.try_acquire_many("other", 1).await.unwrap();
    to_lose.store(1, Ordering::SeqCst);
    let requests = [("a", 1); 18];
    let answers = l.try_acquire_many_keys(&requests).await;
    assert_eq!(to_lose.load(Ordering::SeqCst), 0, "the reply was lost");
    let kinds: Vec<&str> = answers.iter().map(kind).collect();
    let mut expected = vec!["backend"; 2];
    expected.extend(["ok"; 16]);
    assert_eq!(kinds, expected);
    assert_eq!(available(&plain, "a").await, 2, "18 pours, each once");
    assert_eq!(counts(l.stats()), [19, 17, 0, 2, 0, 0, 1, 16, 0]);
    proxy.abort();
}

/// On a cluster, one master's replies go through a proxy (the master
/// announces the proxy's port: `cluster-announce-port`), which loses the
/// reply to one batch's pipeline after the master ran it. "A pipeline
/// that fails on the connection is resent whole, marked as a resend",
/// and "a node that fails ... fails only its own requests": the other
/// masters' requests are decided once, the proxied master's resent and
/// answered from their grants. Each key holds exactly one pour per grant.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_cluster_one_masters_lost_reply_is_resent_and_pours_once() {
    let Some(cluster) = redis_cluster::RedisCluster::start("batch_meet_cluster_lost") else {
        return;
    };
    let prefix = "cl:";
    let masters = cluster.masters();
    let proxied = masters[0];
    let owners = cluster.owners();
    let key_of = |m: usize, stem: &str| {
        (0..10_000)
            .map(|i| format!("{stem}{i}"))
            .find(|k| owners[usize::from(slot(&format!("{prefix}{k}")))] == m)
            .unwrap()
    };
    let (p, q) = (key_of(proxied, "p"), key_of(masters[1], "q"));
    let r = key_of(masters[2], "r");
    let (proxy, to_lose) = proxy_a_master(&cluster, proxied).await;
    let quota = hourly(3);
    let l = RedisFunnel::cluster_builder(cluster.urls())
        .quota(quota)
        .prefix(prefix)
        .failure_policy(FailurePolicy::Closed)
        .timeout(ms(1000))
        .build()
        .await
        .unwrap();
    let warm = l
        .try_acquire_many_keys(&[(&p, 0), (&q, 0), (&r, 0), ("w", 1)])
        .await;
    assert!(warm.iter().all(Result::is_ok), "{warm:?}");
    let before = l.stats();
    to_lose.store(1, Ordering::SeqCst);
    let requests = [
        (p.as_str(), 1),
        (q.as_str(), 1),
        (p.as_str(), 1),
        (r.as_str(), 2),
        (p.as_str(), 1),
        (p.as_str(), 1),
    ];
    let answers = l.try_acquire_many_keys(&requests).await;
    assert_eq!(to_lose.load(Ordering::SeqCst), 0, "a reply was lost");
    let after = l.stats();
    assert_eq!(
        answers.iter().map(kind).collect::<Vec<_>>(),
        ["ok", "ok", "ok", "ok", "ok", "limited"],
        "{after:?}"
    );
    // Looked at through the proxy, which now passes everything.
    let plain = RedisFunnel::cluster_builder(cluster.urls())
        .quota(quota)
        .prefix(prefix)
        .refusal_cache(0)
        .build()
        .await
        .unwrap();
    assert_eq!(available(&plain, &p).await, 0, "three pours of 1");
    assert_eq!(available(&plain, &q).await, 2, "one pour of 1");
    assert_eq!(available(&plain, &r).await, 1, "one pour of 2");
    let delta: Vec<u64> = counts(after)
        .iter()
        .zip(counts(before))
        .map(|(a, b)| a - b)
        .collect();
    // Six decided: five granted (three of them answered from their
    // grant), one refused; one resend of the proxied master's pipeline.
    assert_eq!(delta, [6, 5, 1, 0, 0, 0, 1, 3, 0]);
    proxy.abort();
}

/// A fleet: process B took all 17 permits of a key (one per hour) just
/// now, so the key keeps B's 16 latest grant ids and has evicted the
/// first. Process A, just built, sends a batch holding that key; Redis
/// refuses it (full) and the reply is lost; A resends. Returns A's answer
/// and what its counters moved by, and the key's permits left.
async fn a_full_keys_refusal_resent(
    a_url: &str,
    b: &RedisFunnel,
    key: &str,
    to_lose: &AtomicU32,
) -> (Result<(), RedisLimitError>, Vec<u64>, u32) {
    for _ in 0..17 {
        b.try_acquire(key).await.unwrap();
    }
    let a = if a_url.contains(',') {
        RedisFunnel::cluster_builder(a_url.split(','))
    } else {
        RedisFunnel::builder(a_url)
    }
    .quota(b.quota())
    .prefix(b.prefix())
    .failure_policy(FailurePolicy::Open)
    .timeout(ms(500))
    .refusal_cache(0)
    .build()
    .await
    .unwrap();
    to_lose.store(1, Ordering::SeqCst);
    let answer = a.try_acquire_many_keys(&[(key, 1)]).await.pop().unwrap();
    assert_eq!(to_lose.load(Ordering::SeqCst), 0, "the reply was lost");
    (answer, counts(a.stats()).to_vec(), available(b, key).await)
}

/// [`a_full_keys_refusal_resent`] on one server: the resend says how early
/// its first attempt could have run (after the reply A had at its build),
/// after B's evictions, so the id's absence proves the first attempt
/// granted nothing: Redis decides the resend and refuses it (failing open
/// changes nothing: Redis could decide). One decision, one retry.
#[tokio::test]
async fn a_resent_refusal_of_a_key_another_process_filled_is_refused() {
    let Some(server) = RedisServer::start("batch_meet_hot") else {
        return;
    };
    let (listener, url) = proxy_listener().await;
    let to_lose = Arc::new(AtomicU32::new(0));
    let proxy = reply_losing_proxy(listener, server.port(), to_lose.clone(), ms(100));
    let b = limiter(&server.url(), hourly(17), "ho:", 0, FailurePolicy::Closed).await;
    let (answer, counted, left) = a_full_keys_refusal_resent(&url, &b, "hot", &to_lose).await;
    proxy.abort();
    assert!(
        matches!(answer, Err(RedisLimitError::Limited { .. })),
        "{answer:?}"
    );
    assert_eq!(left, 0);
    assert_eq!(
        counted,
        [1, 0, 1, 0, 0, 0, 1, 0, 0],
        "one decision, refused, one retry"
    );
}

/// Points the master `nodes[master]` of `cluster` at a reply-losing proxy
/// (it announces the proxy's port, `cluster-announce-port`, and every
/// node is waited for to say so); the proxy and its counter.
async fn proxy_a_master(
    cluster: &redis_cluster::RedisCluster,
    master: usize,
) -> (tokio::task::JoinHandle<()>, Arc<AtomicU32>) {
    let (listener, _) = proxy_listener().await;
    let port = listener.local_addr().unwrap().port();
    let to_lose = Arc::new(AtomicU32::new(0));
    let proxy = reply_losing_proxy(
        listener,
        cluster.nodes[master].port(),
        to_lose.clone(),
        ms(100),
    );
    let out = redis_cluster::cli_at(
        cluster.nodes[master].port(),
        &["CONFIG", "SET", "cluster-announce-port", &port.to_string()],
    );
    assert_eq!(out.trim(), "OK");
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while !cluster
        .nodes
        .iter()
        .all(|n| redis_cluster::cli_at(n.port(), &["CLUSTER", "SLOTS"]).contains(&port.to_string()))
    {
        assert!(std::time::Instant::now() < deadline, "not announced");
        sleep(ms(50)).await;
    }
    (proxy, to_lose)
}

/// [`a_full_keys_refusal_resent`] on a cluster, A never having had a reply
/// about the key's slot (its build looked at another slot): "only a key
/// granted 16 times between its first attempt and the resend — in about
/// one round trip — is ever refused a resend" (`script.rs`). B's 17 grants
/// came before A's first attempt, so the resend should be decided by
/// Redis — refused, the key being full — as on one server, not failed by
/// the policy (which, failing open, grants a request Redis refused: one
/// permit over the limit).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_cluster_a_resent_refusal_of_a_key_another_process_filled_is_refused() {
    let Some(cluster) = redis_cluster::RedisCluster::start("batch_meet_hot_cluster") else {
        return;
    };
    let prefix = "hc:";
    let master = cluster.masters()[0];
    let owners = cluster.owners();
    let key = (0..10_000)
        .map(|i| format!("hot{i}"))
        .find(|k| {
            let s = slot(&format!("{prefix}{k}"));
            owners[usize::from(s)] == master && s != slot(&format!("{prefix}\u{0}clock"))
        })
        .unwrap();
    let (proxy, to_lose) = proxy_a_master(&cluster, master).await;
    let b = RedisFunnel::cluster_builder(cluster.urls())
        .quota(hourly(17))
        .prefix(prefix)
        .failure_policy(FailurePolicy::Closed)
        .timeout(ms(500))
        .refusal_cache(0)
        .build()
        .await
        .unwrap();
    let (answer, counted, left) =
        a_full_keys_refusal_resent(&cluster.urls().join(","), &b, &key, &to_lose).await;
    proxy.abort();
    assert!(
        matches!(answer, Err(RedisLimitError::Limited { .. })),
        "{answer:?}, counted {counted:?}, {left} left"
    );
    assert_eq!(counted, [1, 0, 1, 0, 0, 0, 1, 0, 0]);
}
