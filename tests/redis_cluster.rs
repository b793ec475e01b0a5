//! `redis::RedisFunnel` on a real Redis Cluster (feature `redis`): three
//! masters and three replicas on loopback, started by each test and killed
//! at its end (`support/redis_cluster.rs`).
//!
//! Without `redis-server` or `redis-cli` the tests say loudly that they were
//! skipped and pass, unless `REQUIRE_REDIS=1` (set by `.ci/run`). The tests
//! of this file run one at a time (six servers each, on a machine of two
//! cores: the failover's timing and the hammering's throughput must not
//! compete with another cluster).

#[path = "support/redis_server.rs"]
mod redis_server;
mod support;
use support::Lcg;

#[path = "support/redis_cluster.rs"]
mod redis_cluster;

use std::collections::HashMap;
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use redis::aio::MultiplexedConnection;
use redis_cluster::{NODE_TIMEOUT, RedisCluster, keys_on, slot};
use tokio::time::{Instant, sleep};
use tokio_ratelimit::algorithm::FunnelState;
use tokio_ratelimit::redis::{Decision, FailurePolicy, RedisFunnel, RedisLimitError};
use tokio_ratelimit::{ConfigError, Quota, Rate, TryAcquireError};

/// One cluster at a time (see the module docs).
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn micros(t: SystemTime) -> u64 {
    u64::try_from(
        t.duration_since(SystemTime::UNIX_EPOCH)
            .unwrap()
            .as_micros(),
    )
    .unwrap()
}

async fn funnel(
    cluster: &RedisCluster,
    quota: Quota,
    prefix: &str,
    policy: FailurePolicy,
) -> RedisFunnel {
    RedisFunnel::cluster_builder(cluster.urls())
        .quota(quota)
        .prefix(prefix)
        .failure_policy(policy)
        .timeout(ms(200))
        // Every request to Redis: these tests count what Redis decides.
        .refusal_cache(0)
        .build()
        .await
        .unwrap()
}

/// A plain connection to one node (not through the cluster client).
async fn admin(cluster: &RedisCluster, node: usize) -> MultiplexedConnection {
    redis::Client::open(cluster.nodes[node].url())
        .unwrap()
        .get_multiplexed_async_connection_with_config(
            &redis::AsyncConnectionConfig::new().set_response_timeout(None),
        )
        .await
        .unwrap()
}

async fn cmd<T: redis::FromRedisValue>(con: &mut MultiplexedConnection, args: &[&str]) -> T {
    let mut c = redis::cmd(args[0]);
    for a in &args[1..] {
        c.arg(*a);
    }
    c.query_async(con).await.unwrap()
}

/// A node's socket reads so far (`total_reads_processed`) and its calls of
/// each command since the last `CONFIG RESETSTAT`, from one `INFO`.
async fn reads_and_calls(con: &mut MultiplexedConnection) -> (u64, HashMap<String, u64>) {
    let info: String = cmd(con, &["INFO", "stats", "commandstats"]).await;
    let reads = info
        .lines()
        .find_map(|l| l.strip_prefix("total_reads_processed:"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let calls = info
        .lines()
        .filter_map(|l| l.strip_prefix("cmdstat_"))
        .filter_map(|l| {
            let (name, fields) = l.split_once(':')?;
            let calls = fields.split(',').find_map(|f| f.strip_prefix("calls="))?;
            Some((name.to_owned(), calls.parse().ok()?))
        })
        .collect();
    (reads, calls)
}

/// A field of `INFO <section>` on a node.
async fn info_field(con: &mut MultiplexedConnection, section: &str, field: &str) -> String {
    let info: String = cmd(con, &["INFO", section]).await;
    info.lines()
        .find_map(|l| l.strip_prefix(&format!("{field}:")))
        .unwrap_or_else(|| panic!("no {field} in INFO {section}"))
        .trim()
        .to_owned()
}

fn as_try(d: &Decision) -> Result<(), TryAcquireError> {
    match d.retry_after {
        None => Ok(()),
        Some(retry_after) => Err(TryAcquireError::Limited { retry_after }),
    }
}

/// The local reference for a quota, as in `tests/redis.rs`: one
/// `FunnelState` per band, poured all or none, the wait the latest band's.
#[derive(Clone)]
struct Reference {
    bands: Vec<FunnelState>,
}

impl Reference {
    fn new(quota: &Quota) -> Reference {
        Reference {
            bands: quota
                .bands()
                .iter()
                .map(|b| FunnelState::new(b.rate(), b.capacity()).unwrap())
                .collect(),
        }
    }

    fn try_pour(&mut self, now: Duration, n: u32) -> Result<(), TryAcquireError> {
        let mut poured = self.bands.clone();
        let mut wait = None;
        for band in &mut poured {
            if let Err(e) = band.try_pour(now, n) {
                wait = wait.max(e.retry_after());
            }
        }
        match wait {
            None => {
                self.bands = poured;
                Ok(())
            }
            Some(retry_after) => Err(TryAcquireError::Limited { retry_after }),
        }
    }
}

#[test]
fn slots_and_hash_tags_are_the_servers() {
    let _serial = serial();
    let Some(cluster) = RedisCluster::start("slots_and_hash_tags") else {
        return;
    };
    for key in [
        "",
        "foo",
        "rl:user:42",
        "rl:{user42}:day",
        "{user42}",
        "a{}{b}",
        "x{{y}}",
        "{",
    ] {
        assert_eq!(slot(key), cluster.slot(key), "{key:?}");
    }
    // Every master serves keys of its own.
    for m in cluster.masters() {
        assert_eq!(keys_on(&cluster, m, "rl:", "k", 3).len(), 3);
    }
}

/// Random requests at random instants on keys spread over every master,
/// each decided by the cluster, then replayed per key through a local
/// reference at the server times its master used: the same answers and the
/// same `retry_after`, to the nanosecond, for one band and for two, under
/// the limiter's quota and under each call's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[expect(
    clippy::await_holding_lock,
    reason = "one cluster at a time: the lock is held across the test on purpose (each test has its own runtime)"
)]
async fn same_numbers_as_funnel_states_on_every_master() {
    let _serial = serial();
    let Some(cluster) = RedisCluster::start("same_numbers") else {
        return;
    };
    let one = Quota::new(Rate::per(3, ms(100)), 3);
    let two = Quota::new(Rate::per_second(70), 8).and(Rate::per(10, ms(300)), 12);
    let limiter = funnel(&cluster, one, "x:", FailurePolicy::Closed).await;
    let mut lanes: Vec<(String, Quota)> = vec![];
    let masters = cluster.masters();
    assert_eq!(masters.len(), 3);
    for &m in &masters {
        for (i, key) in keys_on(&cluster, m, "x:", &format!("m{m}-"), 2)
            .into_iter()
            .enumerate()
        {
            lanes.push((key, if i == 0 { one } else { two }));
        }
    }
    let mut refs: Vec<Reference> = lanes.iter().map(|(_, q)| Reference::new(q)).collect();
    let mut origin: Vec<Option<SystemTime>> = vec![None; lanes.len()];
    let mut seen = vec![(0u32, 0u32); lanes.len()];
    let mut rng = Lcg(7);
    for step in 0..1_200 {
        let lane = usize::try_from(rng.below(lanes.len() as u64)).unwrap();
        let (key, quota) = (&lanes[lane].0, lanes[lane].1);
        let n = u32::try_from(rng.below(u64::from(quota.capacity().min(4))) + 1).unwrap();
        // A lane's first decision is its origin (its key is new, so empty
        // there, as a new reference is); a lane of the limiter's own quota
        // is asked through both calls.
        let d = if quota == one && step % 2 == 0 {
            limiter.decide(key, n).await.unwrap()
        } else {
            limiter.decide_with(key, &quota, n).await.unwrap()
        };
        let at = *origin[lane].get_or_insert(d.server_time);
        let now = d.server_time.duration_since(at).unwrap();
        let expected = refs[lane].try_pour(now, n);
        assert_eq!(
            as_try(&d),
            expected,
            "{key} {quota:?}: step {step}, n = {n}, at {now:?}"
        );
        if d.is_granted() {
            seen[lane].0 += 1;
        } else {
            seen[lane].1 += 1;
        }
        let pause = rng.below(3_000);
        if pause > 2_000 {
            sleep(Duration::from_micros(pause * 4)).await;
        }
    }
    for ((key, _), (granted, refused)) in lanes.iter().zip(&seen) {
        assert!(
            *granted > 0 && *refused > 0,
            "{key}: {granted} granted, {refused} refused"
        );
    }
    // Peeks agree with the next decision on every master: a granted peek
    // is followed by a grant; a refused one by a refusal, unless its wait
    // ran out in between (real time passes between the two round trips).
    for (key, quota) in &lanes {
        let asked = std::time::Instant::now();
        let peek = limiter.peek_with(key, quota, 1).await.unwrap();
        let d = limiter.decide_with(key, quota, 1).await.unwrap();
        match peek.answer().map_err(|e| e.retry_after()) {
            Ok(()) => assert!(d.is_granted(), "{key}: peeked granted, then refused"),
            Err(None) => assert!(!d.is_granted(), "{key}: peeked never, then granted"),
            Err(Some(wait)) => assert!(
                !d.is_granted() || asked.elapsed() >= wait,
                "{key}: peeked a wait of {wait:?}, granted after {:?}",
                asked.elapsed()
            ),
        }
    }
    // Each key's state lives on its master, under prefix + key.
    let owners = cluster.owners();
    for (key, _) in &lanes {
        let redis_key = limiter.redis_key(key);
        let mut con = admin(&cluster, owners[usize::from(slot(&redis_key))]).await;
        assert_eq!(
            cmd::<i64>(&mut con, &["EXISTS", &redis_key]).await,
            1,
            "{redis_key}"
        );
    }
}

/// The commands a batch test's masters may see: the script's, the
/// admin's, and the replica's acknowledgements.
const EXPECTED: [&str; 10] = [
    "evalsha",
    "time",
    "get",
    "set",
    "pexpireat",
    "script|load",
    "script|flush",
    "info",
    "config|resetstat",
    "replconf",
];

/// 100 keys spread over the three masters in one batch: one pipeline per
/// master (one read of the node's socket, its keys' `EVALSHA`s and nothing
/// else), the answers in the caller's order; and again after one master's
/// scripts were flushed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[expect(
    clippy::await_holding_lock,
    reason = "one cluster at a time: the lock is held across the test on purpose (each test has its own runtime)"
)]
async fn a_batch_takes_one_round_trip_per_master() {
    let _serial = serial();
    let Some(cluster) = RedisCluster::start("batch") else {
        return;
    };
    let slow = Rate::per_hour(1);
    let limiter = funnel(&cluster, Quota::new(slow, 2), "b:", FailurePolicy::Closed).await;
    // Ten of them hashed by their tags (`b:{tag3}:minute` is in `tag3`'s
    // slot).
    let keys: Vec<String> = (0..90)
        .map(|i| format!("user:{i}"))
        .chain((0..10).map(|i| format!("{{tag{i}}}:minute")))
        .collect();
    let owners = cluster.owners();
    let masters = cluster.masters();
    let mut per_master: HashMap<usize, u64> = HashMap::new();
    for k in &keys {
        *per_master
            .entry(owners[usize::from(slot(&format!("b:{k}")))])
            .or_default() += 1;
    }
    assert_eq!(per_master.len(), 3, "{per_master:?}");
    let mut admins = vec![];
    for &m in &masters {
        admins.push((m, admin(&cluster, m).await));
    }
    // Round r asks every key for one unit: two rounds granted, the third
    // refused, in the caller's order; n = 0 and n > 2 are decided here.
    let mut requests: Vec<(&str, u32)> = vec![];
    for (i, k) in keys.iter().enumerate() {
        requests.push((k, 1));
        if i % 10 == 0 {
            requests.push((k, 0));
            requests.push((k, 3));
        }
    }
    for round in 0..3 {
        let mut before = vec![];
        for (_, con) in &mut admins {
            let () = cmd(con, &["CONFIG", "RESETSTAT"]).await;
            before.push(reads_and_calls(con).await);
        }
        if round == 2 {
            // A master that lost its scripts: its keys' pipeline reloads
            // them (one more round trip, on that node only).
            let () = cmd(&mut admins[0].1, &["SCRIPT", "FLUSH"]).await;
        }
        let answers = limiter.try_acquire_many_keys(&requests).await;
        assert_eq!(answers.len(), requests.len());
        for ((k, n), a) in requests.iter().zip(&answers) {
            match (n, round) {
                (0, _) => assert!(a.is_ok(), "{k}"),
                (3, _) => assert!(
                    matches!(a, Err(RedisLimitError::InsufficientCapacity)),
                    "{k}"
                ),
                (_, 0 | 1) => assert!(a.is_ok(), "{k} round {round}: {a:?}"),
                _ => {
                    let wait = a.as_ref().unwrap_err().retry_after().unwrap();
                    assert!(wait > Duration::from_secs(3_500), "{k}: {wait:?}");
                }
            }
        }
        for ((m, con), (reads_before, calls_before)) in admins.iter_mut().zip(&before) {
            let (reads, calls) = reads_and_calls(con).await;
            let since = |c: &str| {
                calls.get(c).copied().unwrap_or(0) - calls_before.get(c).copied().unwrap_or(0)
            };
            let flushed = round == 2 && *m == masters[0];
            assert_eq!(
                since("evalsha"),
                per_master[m] * if flushed { 2 } else { 1 },
                "master {m} round {round}"
            );
            let others: Vec<_> = calls
                .keys()
                .filter(|c| !EXPECTED.contains(&c.as_str()))
                .collect();
            assert!(others.is_empty(), "master {m}: {others:?}");
            // Reads of the node's sockets since the INFO that read
            // `reads_before`: that INFO's own, the SCRIPT FLUSH's, the
            // replica's acknowledgements (REPLCONF ACK, one a second), and
            // the batch's: one (two when it reloaded the script). This
            // INFO is not counted in its own answer.
            let batch = reads - reads_before - 1 - u64::from(flushed) - since("replconf");
            assert_eq!(
                batch,
                if flushed { 2 } else { 1 },
                "master {m} round {round}: {reads} reads after {reads_before}"
            );
        }
    }
    let stats = limiter.stats();
    assert_eq!(
        (
            stats.decisions,
            stats.granted,
            stats.limited,
            stats.backend_errors
        ),
        (300, 200, 100, 0)
    );
}

/// Rate and capacity of the two-process test, per key.
const HAMMER_RATE: u32 = 500;
const HAMMER_CAPACITY: u32 = 50;

/// One replica process of `two_processes_share_each_key`: two limiters
/// (two cluster connections), each hammering every key, reporting per key
/// its grants, decisions, and the server times of its first and last
/// decisions and grants.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a child process of two_processes_share_each_key"]
async fn cluster_replica_child() {
    let (Ok(urls), Ok(keys), Ok(run_ms)) = (
        std::env::var("RL_CLUSTER_URLS"),
        std::env::var("RL_CLUSTER_KEYS"),
        std::env::var("RL_HAMMER_MS"),
    ) else {
        eprintln!("cluster_replica_child runs only as a child of two_processes_share_each_key");
        return;
    };
    let run = ms(run_ms.parse().unwrap());
    let keys: Vec<String> = keys.split(',').map(str::to_owned).collect();
    let mut tasks = vec![];
    for _ in 0..2 {
        let limiter = RedisFunnel::cluster_builder(urls.split(','))
            .rate(Rate::per_second(HAMMER_RATE))
            .capacity(HAMMER_CAPACITY)
            .prefix("hammer:")
            .failure_policy(FailurePolicy::Closed)
            .refusal_cache(0)
            .build()
            .await
            .unwrap();
        for key in &keys {
            let (limiter, key) = (limiter.clone(), key.clone());
            tasks.push(tokio::spawn(async move {
                let deadline = Instant::now() + run;
                let (mut granted, mut decisions) = (0u64, 0u64);
                let (mut first, mut last) = (u64::MAX, 0);
                let (mut first_grant, mut last_grant) = (u64::MAX, 0);
                while Instant::now() < deadline {
                    let d = limiter.decide(&key, 1).await.unwrap();
                    let t = micros(d.server_time);
                    decisions += 1;
                    (first, last) = (first.min(t), last.max(t));
                    if d.is_granted() {
                        granted += 1;
                        (first_grant, last_grant) = (first_grant.min(t), last_grant.max(t));
                    }
                }
                format!(
                    "REPLICA {key} {granted} {decisions} {first} {last} {first_grant} {last_grant}"
                )
            }));
        }
    }
    for t in tasks {
        println!("{}", t.await.unwrap());
    }
}

/// Two OS processes, two limiters each, hammering one key on every master:
/// per key, granted ≤ capacity + rate × T over the server times of its
/// grants, and ≥ 99 % of rate × T over the run.
#[test]
fn two_processes_share_each_key() {
    let _serial = serial();
    let Some(cluster) = RedisCluster::start("two_processes") else {
        return;
    };
    let keys: Vec<String> = cluster
        .masters()
        .into_iter()
        .map(|m| keys_on(&cluster, m, "hammer:", &format!("m{m}-"), 1).remove(0))
        .collect();
    let exe = std::env::current_exe().unwrap();
    let children: Vec<_> = (0..2)
        .map(|_| {
            Command::new(&exe)
                .args([
                    "cluster_replica_child",
                    "--exact",
                    "--ignored",
                    "--nocapture",
                ])
                .args(["--test-threads", "1"])
                .env("RL_CLUSTER_URLS", cluster.urls().join(","))
                .env("RL_CLUSTER_KEYS", keys.join(","))
                .env("RL_HAMMER_MS", "3000")
                .stdout(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let mut rows: HashMap<String, Vec<Vec<u64>>> = HashMap::new();
    for child in children {
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success(), "a replica process failed");
        for line in String::from_utf8(out.stdout).unwrap().lines() {
            if let Some((_, row)) = line.split_once("REPLICA ") {
                let mut f = row.split(' ');
                let key = f.next().unwrap().to_owned();
                rows.entry(key)
                    .or_default()
                    .push(f.map(|x| x.parse().unwrap()).collect());
            }
        }
    }
    let interval_us = 1_000_000 / u64::from(HAMMER_RATE);
    for key in &keys {
        let rows = &rows[key];
        assert_eq!(rows.len(), 4, "{key}: two processes × two limiters");
        let granted: u64 = rows.iter().map(|r| r[0]).sum();
        let decisions: u64 = rows.iter().map(|r| r[1]).sum();
        let first = rows.iter().map(|r| r[2]).min().unwrap();
        let last = rows.iter().map(|r| r[3]).max().unwrap();
        let first_grant = rows.iter().map(|r| r[4]).min().unwrap();
        let last_grant = rows.iter().map(|r| r[5]).max().unwrap();
        let bound = u64::from(HAMMER_CAPACITY) + (last_grant - first_grant) / interval_us;
        let t = last - first;
        let floor = 99 * u64::from(HAMMER_RATE) * t / 100 / 1_000_000;
        eprintln!(
            "{key}: {granted} granted of {decisions} decisions over {t} µs (server time); bound {bound}, floor {floor}"
        );
        assert!(t >= 2_500_000, "{key}: the replicas ran for {t} µs");
        assert!(granted <= bound, "{key}: {granted} > {bound}");
        assert!(granted >= floor, "{key}: {granted} < {floor}");
        assert!(
            decisions > 2 * granted,
            "{key}: demand did not exceed the limit"
        );
    }
}

/// `count` grants on `key`, and then a refusal if that fills it.
async fn grant(limiter: &RedisFunnel, key: &str, count: u32) {
    for _ in 0..count {
        limiter.try_acquire(key).await.unwrap();
    }
    let stats = limiter.stats();
    if stats.granted == u64::from(limiter.capacity()) {
        assert!(matches!(
            limiter.try_acquire(key).await,
            Err(RedisLimitError::Limited { .. })
        ));
    }
}

/// A master killed mid-run, after two grants it had not replicated yet:
/// while its slots have no master every decision fails by the policy
/// (closed: an error, never `Limited`; open: granted and counted); once the
/// replica is promoted the limiter recovers on its own, within a bound
/// measured here; and the two grants the replica never heard of are
/// granted again — the cost of asynchronous replication, exactly the grants
/// of the lost writes. The replica had lost its scripts too (`SCRIPT
/// FLUSH`): the first decision after the promotion loads them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[expect(
    clippy::await_holding_lock,
    reason = "one cluster at a time: the lock is held across the test on purpose (each test has its own runtime)"
)]
async fn a_master_killed_mid_run_fails_by_policy_and_recovers() {
    const CAPACITY: u32 = 5;
    let _serial = serial();
    let Some(mut cluster) = RedisCluster::start("failover") else {
        return;
    };
    let slow = Quota::new(Rate::per_hour(1), CAPACITY);
    let closed = funnel(&cluster, slow, "c:", FailurePolicy::Closed).await;
    let open = funnel(&cluster, slow, "o:", FailurePolicy::Open).await;
    // The same prefix, its own counters: for the key on another master.
    let probe = funnel(&cluster, slow, "c:", FailurePolicy::Closed).await;
    let master = cluster.masters()[0];
    let replica = cluster.replica_of(master);
    let key = keys_on(&cluster, master, "c:", "k", 1).remove(0);
    let open_key = keys_on(&cluster, master, "o:", "k", 1).remove(0);
    // Another master's key: with the default `cluster-require-full-coverage
    // yes`, the whole cluster refuses while a slot has no master.
    let elsewhere = keys_on(&cluster, cluster.masters()[1], "c:", "e", 1).remove(0);
    let mut m = admin(&cluster, master).await;
    let mut r = admin(&cluster, replica).await;
    // Three grants, replicated (WAIT: the replica has acknowledged them).
    grant(&closed, &key, 3).await;
    assert_eq!(cmd::<i64>(&mut m, &["WAIT", "1", "1000"]).await, 1);
    let () = cmd(&mut r, &["SCRIPT", "FLUSH"]).await;
    assert_eq!(
        info_field(&mut r, "memory", "number_of_cached_scripts").await,
        "0"
    );
    // The replica stops hearing from its master: stalled, and its link
    // closed by the master. Two more grants reach the master only.
    cluster.nodes[replica].stop();
    assert_eq!(
        cmd::<i64>(&mut m, &["CLIENT", "KILL", "TYPE", "replica"]).await,
        1
    );
    grant(&closed, &key, 2).await;
    drop(m);
    cluster.nodes[master].kill();
    let killed = Instant::now();
    cluster.nodes[replica].cont();
    // Until the replica is promoted: fail by the policy, every time.
    let (mut failed, mut open_grants) = (0u32, 0u32);
    let mut elsewhere_failed = 0u32;
    let recovered = loop {
        let (decision, took) = {
            let start = Instant::now();
            (closed.decide(&key, 1).await, start.elapsed())
        };
        assert!(
            took <= closed.timeout() + ms(50),
            "a decision took {took:?}"
        );
        match decision {
            Ok(d) => break (killed.elapsed(), d),
            Err(e) => {
                assert!(e.is_backend_failure(), "{e:?}");
                failed += 1;
            }
        }
        if open.try_acquire(&open_key).await.is_ok() {
            open_grants += 1;
        }
        if probe.decide(&elsewhere, 0).await.is_err() {
            elsewhere_failed += 1;
        }
        assert!(
            killed.elapsed() < Duration::from_secs(30),
            "no recovery within 30 s"
        );
        sleep(ms(20)).await;
    };
    let (recovery, first) = recovered;
    eprintln!(
        "failover: recovered {recovery:?} after the kill; {failed} decisions failed closed, \
         {open_grants} granted open, {elsewhere_failed} failed on another master's key"
    );
    assert!(failed > 0, "the test killed nothing");
    // Failure detection (the node timeout, then a majority's agreement),
    // the replica's election (0.5–1 s delay, then the votes), and the
    // client's next slot refresh.
    let bound = NODE_TIMEOUT * 4 + Duration::from_secs(2);
    assert!(
        recovery <= bound,
        "recovered after {recovery:?} > {bound:?}"
    );
    let open_stats = open.stats();
    assert_eq!(open_stats.fail_open_grants, open_stats.backend_errors);
    assert!(open_stats.fail_open_grants > 0);
    // The promoted replica had the three replicated grants only: the two
    // lost ones are granted again (the first recovered decision is one).
    assert!(first.is_granted(), "{first:?}");
    // Right after its promotion the new master may still flap between a
    // state of ok and down for a moment (CLUSTERDOWN: refused before
    // running, so nothing poured): wait until every node says ok.
    cluster.wait_until_ok(Duration::from_secs(10));
    closed.try_acquire(&key).await.unwrap();
    assert!(matches!(
        closed.try_acquire(&key).await,
        Err(RedisLimitError::Limited { .. })
    ));
    let stats = closed.stats();
    // 3 + 2 before, 2 after: capacity + the grants of the lost writes.
    assert_eq!(stats.granted, u64::from(CAPACITY) + 2);
    assert_eq!(cluster.master_of_slot(slot(&format!("c:{key}"))), replica);
    // The replica never had the scripts: the decision loaded them.
    assert_ne!(
        info_field(&mut r, "memory", "number_of_cached_scripts").await,
        "0"
    );
    // Every master serves again, through the same limiter.
    assert!(probe.decide(&elsewhere, 1).await.unwrap().is_granted());
    let all: Vec<(&str, u32)> = vec![(&key, 0), (&elsewhere, 1)];
    let answers = probe.try_acquire_many_keys(&all).await;
    assert!(answers.iter().all(Result::is_ok), "{answers:?}");
}

/// A hash tag in a cluster prefix would pin every key to one slot: the
/// build refuses it. Tags in keys are the caller's choice; a `{` whose `}`
/// is in the key is fine too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[expect(
    clippy::await_holding_lock,
    reason = "one cluster at a time: the lock is held across the test on purpose (each test has its own runtime)"
)]
async fn a_prefix_with_a_hash_tag_is_refused_on_a_cluster() {
    let _serial = serial();
    let Some(cluster) = RedisCluster::start("prefix") else {
        return;
    };
    let build = |prefix: &str| {
        RedisFunnel::cluster_builder(cluster.urls())
            .rate(Rate::per_second(10))
            .prefix(prefix)
            .clone()
    };
    for bad in ["{api}:", "rl:{a}", "x{{y}}"] {
        let e = build(bad).build().await.unwrap_err();
        assert!(
            matches!(
                e,
                tokio_ratelimit::redis::RedisBuildError::Config(ConfigError::InvalidParameter {
                    name: "prefix",
                    ..
                })
            ),
            "{bad}: {e:?}"
        );
    }
    for fine in ["rl:", "rl:{", "a{}b", "rl:}{"] {
        build(fine).build().await.unwrap();
    }
    // Keys sharing a tag share a slot, so a master.
    let l = build("rl:").build().await.unwrap();
    l.try_acquire("{user42}:minute").await.unwrap();
    l.try_acquire("{user42}:day").await.unwrap();
    assert_eq!(slot("rl:{user42}:minute"), slot("rl:{user42}:day"));
    assert_eq!(slot("rl:{user42}:minute"), slot("user42"));
}

/// A manual failover (`CLUSTER FAILOVER` on the replica: it catches up,
/// then takes over) in the middle of a run costs no decision and loses no
/// grant: a decision sent to the old master is answered `MOVED` (it did
/// not run) and goes once more, to the new one. Exactly the capacity is
/// granted, and every other request refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[expect(
    clippy::await_holding_lock,
    reason = "one cluster at a time: the lock is held across the test on purpose (each test has its own runtime)"
)]
async fn a_manual_failover_costs_no_decision() {
    const CAPACITY: u32 = 50;
    let _serial = serial();
    let Some(cluster) = RedisCluster::start("manual_failover") else {
        return;
    };
    let limiter = funnel(
        &cluster,
        Quota::new(Rate::per_hour(1), CAPACITY),
        "m:",
        FailurePolicy::Closed,
    )
    .await;
    let master = cluster.masters()[0];
    let replica = cluster.replica_of(master);
    let key = keys_on(&cluster, master, "m:", "k", 1).remove(0);
    let mut r = admin(&cluster, replica).await;
    let (mut granted, mut refused) = (0, 0);
    for i in 0..2 * CAPACITY {
        if i == CAPACITY / 2 {
            let () = cmd(&mut r, &["CLUSTER", "FAILOVER"]).await;
        }
        match limiter.try_acquire(&key).await {
            Ok(()) => granted += 1,
            Err(RedisLimitError::Limited { .. }) => refused += 1,
            Err(e) => panic!("decision {i}: {e:?}"),
        }
        sleep(ms(5)).await;
    }
    assert_eq!((granted, refused), (CAPACITY, CAPACITY));
    assert_eq!(cluster.master_of_slot(slot(&format!("m:{key}"))), replica);
    let stats = limiter.stats();
    assert_eq!(
        (stats.decisions, stats.backend_errors),
        (u64::from(2 * CAPACITY), 0)
    );
}

/// What a key was poured, for a limiter of this capacity whose rate is too
/// slow to drain a permit during the test.
async fn poured(l: &RedisFunnel, key: &str, capacity: u32) -> u32 {
    capacity - redis_server::available(l, key).await
}

/// The bar on a cluster: 200 rounds of every master closing every
/// client connection (`CLIENT KILL`), a single call and a batch over all
/// three masters right after each, no pause: no decision fails, and each
/// key holds exactly the permits granted (a resend that had run is
/// answered from its grant, not poured again).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[expect(
    clippy::await_holding_lock,
    reason = "one cluster at a time: the lock is held across the test on purpose (each test has its own runtime)"
)]
async fn closed_connections_on_a_cluster_cost_no_decision() {
    const CAPACITY: u32 = 100_000;
    let _serial = serial();
    let Some(cluster) = RedisCluster::start("closed_connections") else {
        return;
    };
    let quota = Quota::new(Rate::per_minute(1), CAPACITY);
    let l = RedisFunnel::cluster_builder(cluster.urls())
        .quota(quota)
        .prefix("k:")
        .failure_policy(FailurePolicy::Closed)
        .timeout(ms(500))
        .build()
        .await
        .unwrap();
    let masters = cluster.masters();
    let mut admins = Vec::new();
    for &m in &masters {
        admins.push(admin(&cluster, m).await);
    }
    let keys: Vec<String> = masters
        .iter()
        .map(|&m| keys_on(&cluster, m, "k:", "on", 1).remove(0))
        .collect();
    let mut single = [0u32; 3];
    for round in 0..200usize {
        for con in &mut admins {
            let _: i64 = cmd(con, &["CLIENT", "KILL", "TYPE", "normal"]).await;
        }
        let i = round % 3;
        l.try_acquire_many(&keys[i], 2).await.unwrap();
        single[i] += 2;
        let batch: Vec<(&str, u32)> = keys.iter().map(|k| (k.as_str(), 1)).collect();
        let answers = l.try_acquire_many_keys(&batch).await;
        assert!(
            answers.iter().all(Result::is_ok),
            "round {round}: {answers:?}"
        );
    }
    let s = l.stats();
    assert_eq!(s.backend_errors, 0, "{s:?}");
    assert_eq!(s.granted, 200 * 4, "{s:?}");
    for (i, key) in keys.iter().enumerate() {
        assert_eq!(poured(&l, key, CAPACITY).await, single[i] + 200, "{key}");
    }
    eprintln!(
        "cluster: 200 x 3 closes, {} decisions, {} resent, {} answered from their first grant",
        s.decisions, s.retries, s.resends_granted_before
    );
}

/// Kills every normal connection on each of `admins`' nodes every 10 ms
/// until `stop`.
fn kill_connections_until(
    mut admins: Vec<MultiplexedConnection>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        while !stop.load(std::sync::atomic::Ordering::Relaxed) {
            for con in &mut admins {
                let _: redis::RedisResult<i64> = redis::cmd("CLIENT")
                    .arg("KILL")
                    .arg("TYPE")
                    .arg("normal")
                    .query_async(con)
                    .await;
            }
            sleep(ms(10)).await;
        }
    })
}

/// The most a key under `quota` may be granted over a run of `elapsed`:
/// its tightest band's capacity plus what that band's rate adds over the
/// run; for a key whose master was killed (`moved`), plus one capacity
/// more, the grants its lost writes may have taken (the writes of the
/// last milliseconds before the kill, which a key can fill only once).
fn run_bound(quota: &Quota, elapsed: Duration, moved: bool) -> u64 {
    quota
        .bands()
        .iter()
        .map(|b| {
            let rate = b.rate();
            let per_run = (u128::from(rate.permits()) * elapsed.as_nanos())
                .div_ceil(rate.period().as_nanos());
            let capacity = u64::from(b.capacity());
            capacity * (1 + u64::from(moved)) + u64::try_from(per_run).unwrap()
        })
        .min()
        .unwrap()
}

/// Every fleet feature at once on a cluster, under every fault in turn:
/// two tiers on one prefix (the free tier's limiter also decides paid keys
/// with the paid quota per call), refusal caches of one slot (every key's
/// hash collides), single calls and batches over all three masters; then
/// connections killed every few milliseconds mid-traffic, `SCRIPT FLUSH`
/// on every node mid-traffic, and a master killed and its replica
/// promoted. Throughout: every decision is answered by its deadline; a
/// refusal (from Redis or from a cache) is one the script gives too (a
/// cacheless peek right after refuses it); only the failover's window
/// fails decisions (the policy is closed); and no key is granted more
/// than its bands allow over the run, plus, for keys of the master that
/// was killed, the grants of the writes the promoted replica never had.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[expect(
    clippy::too_many_lines,
    reason = "one run through four phases of faults, its checks inline"
)]
#[expect(
    clippy::await_holding_lock,
    reason = "one cluster at a time: the lock is held across the test on purpose (each test has its own runtime)"
)]
async fn cache_batches_and_tiers_under_faults() {
    let _serial = serial();
    let Some(mut cluster) = RedisCluster::start("features_under_faults") else {
        return;
    };
    let free = Quota::new(Rate::per_second(20), 4).and(Rate::per_second(4), 8);
    let paid = Quota::new(Rate::per_second(50), 10);
    let build = |quota: Quota, cache: usize| {
        RedisFunnel::cluster_builder(cluster.urls())
            .quota(quota)
            .prefix("f:")
            .failure_policy(FailurePolicy::Closed)
            .timeout(ms(200))
            .refusal_cache(cache)
            .clone()
    };
    let free_l = build(free, 1).build().await.unwrap();
    let paid_l = build(paid, 1).build().await.unwrap();
    let checker = build(free, 0).build().await.unwrap();
    let masters = cluster.masters();
    // Two free and two paid keys on each master.
    let mut keys: Vec<(String, bool)> = Vec::new();
    for &m in &masters {
        for k in keys_on(&cluster, m, "f:", &format!("m{m}-"), 4)
            .into_iter()
            .enumerate()
        {
            keys.push((k.1, k.0 % 2 == 1));
        }
    }
    let victim = masters[0];
    let on_victim = |key: &str| cluster.master_of_slot(slot(&format!("f:{key}"))) == victim;
    let moved: Vec<bool> = keys.iter().map(|(k, _)| on_victim(k)).collect();
    let mut granted = vec![0u64; keys.len()];
    let mut rng = Lcg(11);
    let start = Instant::now();
    let mut failed_in_failover = 0;
    let mut confirmed = 0;
    // The phases: calm, killed connections, flushed scripts, failover.
    let mut killer: Option<tokio::task::JoinHandle<()>> = None;
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut failover_at: Option<Instant> = None;
    let mut healed = false;
    for step in 0..4_000u32 {
        match step {
            800 => {
                let mut admins = Vec::new();
                for &m in &masters {
                    admins.push(admin(&cluster, m).await);
                }
                killer = Some(kill_connections_until(admins, stop.clone()));
            }
            1600 => {
                stop.store(true, std::sync::atomic::Ordering::Relaxed);
                killer.take().unwrap().await.unwrap();
                for node in 0..cluster.nodes.len() {
                    let mut con = admin(&cluster, node).await;
                    let () = cmd(&mut con, &["SCRIPT", "FLUSH"]).await;
                }
            }
            2400 => {
                cluster.nodes[victim].kill();
                failover_at = Some(Instant::now());
            }
            _ => {}
        }
        if rng.below(3) == 0 {
            sleep(ms(rng.below(4))).await;
        }
        let tier_paid = rng.below(3) == 0;
        let pick = |rng: &mut Lcg| loop {
            let i = usize::try_from(rng.below(keys.len() as u64)).unwrap();
            if keys[i].1 == tier_paid {
                return i;
            }
        };
        let mut asked: Vec<(usize, u32)> = Vec::new();
        let batch = rng.below(3) == 0;
        for _ in 0..if batch { 1 + rng.below(4) } else { 1 } {
            asked.push((pick(&mut rng), u32::try_from(1 + rng.below(3)).unwrap()));
        }
        let quota = if tier_paid { paid } else { free };
        let sent = Instant::now();
        let answers = if batch {
            let l = if tier_paid { &paid_l } else { &free_l };
            let requests: Vec<(&str, u32)> = asked
                .iter()
                .map(|&(i, n)| (keys[i].0.as_str(), n))
                .collect();
            l.try_acquire_many_keys(&requests).await
        } else {
            // Single calls all through the free limiter, each with its
            // key's quota: both tiers in one cache.
            let (i, n) = asked[0];
            vec![free_l.try_acquire_with(&keys[i].0, &quota, n).await]
        };
        let took = sent.elapsed();
        assert!(
            took <= ms(200) + ms(100),
            "step {step}: answered after {took:?}"
        );
        for (&(i, n), answer) in asked.iter().zip(&answers) {
            match answer {
                Ok(()) => granted[i] += u64::from(n),
                Err(RedisLimitError::Limited { retry_after }) => {
                    let Ok(truth) = checker.peek_with(&keys[i].0, &quota, n).await else {
                        continue;
                    };
                    if sent.elapsed() + ms(1) < *retry_after {
                        assert!(
                            !truth.is_granted(),
                            "step {step}: {} refused {n} for {retry_after:?}, the script grants",
                            keys[i].0
                        );
                        confirmed += 1;
                    }
                }
                Err(e) => {
                    assert!(
                        failover_at.is_some() && !healed,
                        "step {step}: {e:?} outside the failover"
                    );
                    failed_in_failover += 1;
                }
            }
        }
        if let Some(at) = failover_at
            && !healed
            && answers
                .iter()
                .all(|a| !a.as_ref().is_err_and(RedisLimitError::is_backend_failure))
            && at.elapsed() > NODE_TIMEOUT
        {
            cluster.wait_until_ok(Duration::from_secs(10));
            healed = true;
        }
    }
    assert!(healed, "the cluster never recovered");
    let elapsed = start.elapsed();
    for (i, (key, paid_key)) in keys.iter().enumerate() {
        let quota = if *paid_key { paid } else { free };
        let bound = run_bound(&quota, elapsed, moved[i]);
        assert!(
            granted[i] <= bound,
            "{key}: {} granted, bound {bound}",
            granted[i]
        );
    }
    let (f, p) = (free_l.stats(), paid_l.stats());
    eprintln!(
        "features under faults over {elapsed:?}: {} refusals checked, {} from caches, \
         {failed_in_failover} failed in the failover, {} resent ({} answered from their grant)",
        confirmed,
        f.cached_refusals + p.cached_refusals,
        f.retries + p.retries,
        f.resends_granted_before + p.resends_granted_before,
    );
    assert!(confirmed > 200 && f.cached_refusals + p.cached_refusals > 20);
    assert!(
        f.retries + p.retries > 0,
        "no request was in flight at a kill"
    );
}

/// Every node closing connections idle for a second (`CONFIG SET timeout
/// 1`), the limiter used every 1.5 s: each use finds the connections to
/// the masters closed. Four uses, a single call on each master's key and a
/// batch over all three: no decision fails, and each key holds exactly the
/// permits granted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[expect(
    clippy::await_holding_lock,
    reason = "one cluster at a time: the lock is held across the test on purpose (each test has its own runtime)"
)]
async fn an_idle_timeout_on_a_cluster_costs_no_decision() {
    const CAPACITY: u32 = 1_000;
    let _serial = serial();
    let Some(cluster) = RedisCluster::start("idle_timeout") else {
        return;
    };
    let l = RedisFunnel::cluster_builder(cluster.urls())
        .quota(Quota::new(Rate::per_minute(1), CAPACITY))
        .prefix("i:")
        .failure_policy(FailurePolicy::Closed)
        .timeout(ms(500))
        .build()
        .await
        .unwrap();
    for node in 0..cluster.nodes.len() {
        let mut con = admin(&cluster, node).await;
        let () = cmd(&mut con, &["CONFIG", "SET", "timeout", "1"]).await;
    }
    let keys: Vec<String> = cluster
        .masters()
        .iter()
        .map(|&m| keys_on(&cluster, m, "i:", "idle", 1).remove(0))
        .collect();
    for round in 0..4 {
        sleep(ms(1500)).await;
        for key in &keys {
            l.try_acquire_many(key, 2).await.unwrap();
        }
        let batch: Vec<(&str, u32)> = keys.iter().map(|k| (k.as_str(), 1)).collect();
        let answers = l.try_acquire_many_keys(&batch).await;
        assert!(
            answers.iter().all(Result::is_ok),
            "round {round}: {answers:?}"
        );
    }
    let s = l.stats();
    assert_eq!(s.backend_errors, 0, "{s:?}");
    for key in &keys {
        assert_eq!(poured(&l, key, CAPACITY).await, 4 * 3, "{key}");
    }
    eprintln!(
        "cluster idle timeout: {} decisions, {} resent, {} answered from their first grant",
        s.decisions, s.retries, s.resends_granted_before
    );
}
