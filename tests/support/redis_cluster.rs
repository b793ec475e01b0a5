//! A throwaway Redis Cluster for tests and benches: six `redis-server
//! --cluster-enabled yes` on free loopback ports (three masters, one replica
//! each), joined by `redis-cli --cluster create`, killed on drop.
//!
//! Include it after `redis_server.rs` (`mod redis_server;` at the crate
//! root). Without `redis-server` or `redis-cli`, [`RedisCluster::start`] says
//! so loudly and returns `None`, unless `REQUIRE_REDIS=1`, which makes it
//! panic. Set `REDIS_CLI` to use another `redis-cli`.
//!
//! Nodes time each other out after [`NODE_TIMEOUT`] (Redis's default is
//! 15 s), so a killed master is replaced within a few seconds, and a
//! replica fails over however long it last heard from its master
//! (`cluster-replica-validity-factor 0`).

#![allow(
    dead_code,
    reason = "each includer uses a part (an expect would fail for the one that uses all)"
)]

use std::io::Write;
use std::net::TcpListener;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::redis_server::RedisServer;

/// `cluster-node-timeout`.
pub(crate) const NODE_TIMEOUT: Duration = Duration::from_secs(1);

/// A running cluster: `nodes[0..3]` were created masters, `nodes[3..6]`
/// replicas (which of them replicates which: [`RedisCluster::replica_of`]).
pub(crate) struct RedisCluster {
    pub(crate) nodes: Vec<RedisServer>,
}

fn cli() -> String {
    std::env::var("REDIS_CLI").unwrap_or_else(|_| "redis-cli".to_owned())
}

fn required() -> bool {
    std::env::var("REQUIRE_REDIS").is_ok_and(|v| v == "1")
}

/// A free port for a node's cluster bus.
fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
    listener.local_addr().unwrap().port()
}

/// `redis-cli -p port args…`'s output.
pub(crate) fn cli_at(port: u16, args: &[&str]) -> String {
    let out = Command::new(cli())
        .args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args(args)
        .output()
        .expect("run redis-cli");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

impl RedisCluster {
    /// Starts a cluster for the test `name`, or returns `None` after saying
    /// on stderr that the test was skipped and why.
    ///
    /// # Panics
    ///
    /// When a binary is missing and `REQUIRE_REDIS=1`, or when the cluster
    /// does not come up within 30 s.
    pub(crate) fn start(name: &str) -> Option<RedisCluster> {
        let cli_ok = Command::new(cli())
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success());
        if !cli_ok {
            let msg = format!(
                "`{}` not found: install it (Debian/Ubuntu: `apt-get install redis-server`, which brings redis-tools)",
                cli()
            );
            assert!(!required(), "REQUIRE_REDIS=1 but {msg}");
            let line = format!(
                "\n*** SKIPPED Redis Cluster test `{name}`: {msg}; set REQUIRE_REDIS=1 to make this a failure ***\n"
            );
            let _ = std::io::stderr().write_all(line.as_bytes());
            return None;
        }
        let timeout = NODE_TIMEOUT.as_millis().to_string();
        let mut nodes = vec![];
        for i in 0..6 {
            let bus = free_port().to_string();
            let config = [
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                "nodes.conf",
                "--cluster-port",
                &bus,
                "--cluster-node-timeout",
                &timeout,
                "--cluster-replica-validity-factor",
                "0",
            ];
            // `None`: redis-server is missing (already said, or panicked).
            nodes.push(RedisServer::start_with(&format!("{name}-{i}"), &config)?);
        }
        let addrs: Vec<String> = nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port()))
            .collect();
        let out = Command::new(cli())
            .args(["--cluster", "create"])
            .args(&addrs)
            .args(["--cluster-replicas", "1", "--cluster-yes"])
            .output()
            .expect("run redis-cli --cluster create");
        assert!(
            out.status.success(),
            "redis-cli --cluster create failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let cluster = RedisCluster { nodes };
        cluster.wait_until_ok(Duration::from_secs(30));
        Some(cluster)
    }

    /// Waits until every running node says `cluster_state:ok` with every
    /// slot served, and every replica's link to its master is up.
    ///
    /// # Panics
    ///
    /// When that takes longer than `within`.
    pub(crate) fn wait_until_ok(&self, within: Duration) {
        let deadline = Instant::now() + within;
        loop {
            let ok = self.running().all(|n| {
                let info = cli_at(n.port(), &["CLUSTER", "INFO"]);
                let replication = cli_at(n.port(), &["INFO", "replication"]);
                info.contains("cluster_state:ok")
                    && info.contains("cluster_slots_ok:16384")
                    && (replication.contains("role:master")
                        || replication.contains("master_link_status:up"))
            });
            if ok {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the cluster was not ok within {within:?}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn running(&self) -> impl Iterator<Item = &RedisServer> {
        self.nodes.iter().filter(|n| n.is_running())
    }

    /// `redis://127.0.0.1:<port>/` of every node.
    pub(crate) fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }

    /// The node's index in `nodes` whose port is `port`.
    fn index_of(&self, port: u16) -> usize {
        self.nodes
            .iter()
            .position(|n| n.port() == port)
            .expect("a node of this cluster")
    }

    /// The slot of `key` (`CLUSTER KEYSLOT`, asked of a running node).
    pub(crate) fn slot(&self, key: &str) -> u16 {
        let port = self.running().next().expect("a running node").port();
        cli_at(port, &["CLUSTER", "KEYSLOT", key])
            .trim()
            .parse()
            .expect("CLUSTER KEYSLOT")
    }

    /// The master serving `slot` now (an index into `nodes`).
    pub(crate) fn master_of_slot(&self, slot: u16) -> usize {
        self.owners()[usize::from(slot)]
    }

    /// Per slot, the master serving it now as the first running node says
    /// (an index into `nodes`; `usize::MAX` for none).
    pub(crate) fn owners(&self) -> Vec<usize> {
        let n = self.running().next().expect("a running node");
        let mut owners = vec![usize::MAX; 16_384];
        // "<id> <ip:port@bus> <flags> <master> <ping> <pong> <epoch> <link> <slots…>".
        for line in cli_at(n.port(), &["CLUSTER", "NODES"]).lines() {
            let f: Vec<&str> = line.split(' ').collect();
            if f.len() < 9 || !f[2].contains("master") || f[2].contains("fail") {
                continue;
            }
            let port = f[1].split(['@', ':']).nth(1).unwrap().parse().unwrap();
            let node = self.index_of(port);
            for range in &f[8..] {
                let (a, b) = range.split_once('-').unwrap_or((range, range));
                if let (Ok(a), Ok(b)) = (a.parse::<usize>(), b.parse::<usize>()) {
                    owners[a..=b].fill(node);
                }
            }
        }
        owners
    }

    /// The replica of the master `nodes[master]` (an index into `nodes`).
    pub(crate) fn replica_of(&self, master: usize) -> usize {
        let id = cli_at(self.nodes[master].port(), &["CLUSTER", "MYID"])
            .trim()
            .to_owned();
        let replicas = cli_at(self.nodes[master].port(), &["CLUSTER", "REPLICAS", &id]);
        let line = replicas.lines().next().expect("a replica");
        let port = line
            .split(' ')
            .nth(1)
            .unwrap()
            .split(['@', ':'])
            .nth(1)
            .unwrap()
            .parse()
            .unwrap();
        self.index_of(port)
    }

    /// The indices of the current masters, in `nodes` order.
    pub(crate) fn masters(&self) -> Vec<usize> {
        (0..self.nodes.len())
            .filter(|&i| {
                self.nodes[i].is_running()
                    && cli_at(self.nodes[i].port(), &["INFO", "replication"])
                        .contains("role:master")
            })
            .collect()
    }
}

/// `keys` that the master `nodes[master]` serves now, `count` of them,
/// named `<stem><i>` for increasing `i` (their Redis keys are
/// `prefix + name`).
pub(crate) fn keys_on(
    cluster: &RedisCluster,
    master: usize,
    prefix: &str,
    stem: &str,
    count: usize,
) -> Vec<String> {
    let owners = cluster.owners();
    (0..)
        .map(|i| format!("{stem}{i}"))
        .filter(|k| owners[usize::from(slot(&format!("{prefix}{k}")))] == master)
        .take(count)
        .collect()
}

/// The slot of a key, computed here (CRC16/XMODEM of the key or its hash
/// tag, mod 16 384), and checked against the server in
/// `tests/redis_cluster.rs`, `slots_and_hash_tags_are_the_servers`.
pub(crate) fn slot(key: &str) -> u16 {
    let key = key.as_bytes();
    let hashed = key
        .iter()
        .position(|&b| b == b'{')
        .and_then(|open| {
            let len = key[open + 1..].iter().position(|&b| b == b'}')?;
            (len > 0).then(|| &key[open + 1..open + 1 + len])
        })
        .unwrap_or(key);
    let mut crc: u16 = 0;
    for &b in hashed {
        crc ^= u16::from(b) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 == 0 {
                crc << 1
            } else {
                (crc << 1) ^ 0x1021
            };
        }
    }
    crc % 16_384
}
