//! Redis Cluster: the client a [`RedisFunnel`](super::RedisFunnel) builds,
//! what it may retry, and the slot table that groups a batch by node.
//!
//! # Retries
//!
//! The `redis` crate's cluster client retries a failed request on its own
//! (16 times by default): after the redirects (`MOVED`, `ASK`) and the
//! refusals a node gives *before* running anything (`TRYAGAIN`,
//! `CLUSTERDOWN`, `MASTERDOWN`, `LOADING`), and after a connection dropped
//! or an I/O or parse error — which may come after the node ran the
//! script. The client is built with no retries
//! ([`ClusterClientBuilder::retries`]`(0)`) so that the limiter decides
//! what is sent again, and within its deadline: a single call answered
//! `MOVED` goes to the node the answer names (the client refreshes its slot
//! map too, but may not have yet: a manual failover under load showed a
//! second `MOVED` from the old master), one answered `ASK` to the named
//! node after `ASKING` — at most four redirects in all — and one answered
//! `NOSCRIPT` goes again after a `SCRIPT LOAD` on the same node. A call or
//! a batch's pipeline that failed on the connection is sent once more,
//! marked as a resend (`script.rs`: the script answers it from its grant if
//! it had run, so it cannot pour twice). The other refusals fail the
//! decision by the policy at once: they last until the cluster has a
//! master for the slot again, longer than a decision's deadline.
//!
//! A `MOVED` for one of a batch's keys fails that node's whole pipeline
//! (the client keeps no per-command replies then); the topology is read
//! again for the next batch.
//!
//! # Slots
//!
//! A key's slot is CRC16 (XMODEM) of the key, or of its hash tag (the bytes
//! between the first `{` and the first `}` after it, if any), mod 16 384 —
//! the rule of the Redis Cluster specification. The client routes every
//! call by it; this crate only needs it to group a batch by node, with its
//! own copy of the topology (`CLUSTER SLOTS`), fetched at build and again
//! after any batch to a node failed (the old copy serving while a new one
//! cannot be had: see [`Slots::table`]).

use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use ::redis::cluster::{ClusterClient, ClusterClientBuilder};
use ::redis::cluster_async::ClusterConnection;
use ::redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
use ::redis::{ConnectionInfo, ErrorKind, RedisError, RedisResult, Value};

/// Slots in a Redis Cluster.
const SLOTS: usize = 16_384;

/// Where no master is known for a slot.
const UNKNOWN: u16 = u16::MAX;

/// The cluster client: no retries of its own (see the module docs), each
/// connection attempt within `connect_timeout`, each response within
/// `response_timeout`.
pub(super) fn client(
    nodes: Vec<ConnectionInfo>,
    connect_timeout: Duration,
    response_timeout: Duration,
) -> RedisResult<ClusterClient> {
    ClusterClientBuilder::new(nodes)
        .retries(0)
        .connection_timeout(connect_timeout)
        .response_timeout(response_timeout)
        .build()
}

/// The hash tag of `key`: what its slot is computed from, when it has one.
pub(super) fn hash_tag(key: &[u8]) -> Option<&[u8]> {
    let open = key.iter().position(|&b| b == b'{')?;
    let len = key[open + 1..].iter().position(|&b| b == b'}')?;
    (len > 0).then(|| &key[open + 1..open + 1 + len])
}

/// The slot of `key`.
pub(super) fn slot(key: &[u8]) -> u16 {
    let hashed = hash_tag(key).unwrap_or(key);
    // CRC16/XMODEM: polynomial 0x1021, initial value 0, no reflection.
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

/// Which master serves each slot, as one `CLUSTER SLOTS` said.
#[derive(Debug)]
pub(super) struct Table {
    /// Per slot, the index of its master (`UNKNOWN` for none).
    owner: Vec<u16>,
}

impl Table {
    fn parse(reply: &Value) -> RedisResult<Table> {
        let malformed = || {
            RedisError::from((
                ErrorKind::UnexpectedReturnType,
                "unexpected reply to CLUSTER SLOTS",
            ))
        };
        let Value::Array(ranges) = reply else {
            return Err(malformed());
        };
        let mut owner = vec![UNKNOWN; SLOTS];
        let mut masters: Vec<(Vec<u8>, i64)> = vec![];
        for range in ranges {
            let Value::Array(range) = range else {
                return Err(malformed());
            };
            let [Value::Int(start), Value::Int(end), Value::Array(master), ..] = range.as_slice()
            else {
                return Err(malformed());
            };
            let master = match master.as_slice() {
                [Value::BulkString(host), Value::Int(port), ..] => (host.clone(), *port),
                [Value::SimpleString(host), Value::Int(port), ..] => {
                    (host.clone().into_bytes(), *port)
                }
                _ => return Err(malformed()),
            };
            let (Ok(start), Ok(end)) = (usize::try_from(*start), usize::try_from(*end)) else {
                return Err(malformed());
            };
            if start > end || end >= SLOTS {
                return Err(malformed());
            }
            let index = if let Some(i) = masters.iter().position(|m| *m == master) {
                i
            } else {
                masters.push(master);
                masters.len() - 1
            };
            let index = u16::try_from(index).map_err(|_| malformed())?;
            owner[start..=end].fill(index);
        }
        Ok(Table { owner })
    }

    /// The indices of `keys` grouped by the master of their slots, each
    /// group in the keys' order, the groups in the order of their first
    /// key. Keys of slots with no known master form one more group (the
    /// cluster answers them, or refuses them, as it will).
    pub(super) fn group<'k>(&self, keys: impl Iterator<Item = &'k [u8]>) -> Vec<Vec<usize>> {
        let mut groups: Vec<(u16, Vec<usize>)> = vec![];
        for (i, key) in keys.enumerate() {
            let owner = self.owner[usize::from(slot(key))];
            match groups.iter_mut().find(|(o, _)| *o == owner) {
                Some((_, g)) => g.push(i),
                None => groups.push((owner, vec![i])),
            }
        }
        groups.into_iter().map(|(_, g)| g).collect()
    }
}

/// This crate's copy of the cluster's topology, shared by a limiter's
/// clones: `None` until fetched; marked stale once a batch to a node
/// failed (the topology may have changed), and fetched again then.
#[derive(Clone, Default)]
pub(super) struct Slots(Arc<RwLock<Known>>);

#[derive(Default)]
struct Known {
    table: Option<Arc<Table>>,
    stale: bool,
}

impl Slots {
    /// The table: the one held unless it is stale; else fetched
    /// (`CLUSTER SLOTS`, from a random node). A stale table is fetched
    /// again within a quarter of the time left before `deadline`, and
    /// used as it is if that fails: the node asked may be the one that
    /// went silent, and a batch must not lose its live masters' decisions
    /// to it (a stale table groups some keys by their old master, whose
    /// redirects each request then follows alone). With no table yet, the
    /// fetch has the whole deadline (the caller's).
    pub(super) async fn table(
        &self,
        conn: &mut ClusterConnection,
        deadline: tokio::time::Instant,
    ) -> RedisResult<Arc<Table>> {
        let (held, stale) = {
            let known = self.0.read().unwrap_or_else(PoisonError::into_inner);
            (known.table.clone(), known.stale)
        };
        match held {
            Some(table) if !stale => Ok(table),
            Some(table) => {
                let left = deadline.saturating_duration_since(crate::clock::now());
                match crate::clock::timeout(left / 4, self.fetch(conn)).await {
                    Ok(Ok(fresh)) => Ok(fresh),
                    _ => Ok(table),
                }
            }
            None => self.fetch(conn).await,
        }
    }

    /// Fetches the table (`CLUSTER SLOTS`, from a random node) and holds
    /// it, fresh.
    pub(super) async fn fetch(&self, conn: &mut ClusterConnection) -> RedisResult<Arc<Table>> {
        let mut cmd = ::redis::cmd("CLUSTER");
        cmd.arg("SLOTS");
        let reply = conn
            .route_command(cmd, RoutingInfo::SingleNode(SingleNodeRoutingInfo::Random))
            .await?;
        let table = Arc::new(Table::parse(&reply)?);
        *self.0.write().unwrap_or_else(PoisonError::into_inner) = Known {
            table: Some(table.clone()),
            stale: false,
        };
        Ok(table)
    }

    /// Marks the table stale: the next batch fetches it again (and uses
    /// this one if it cannot).
    pub(super) fn forget(&self) {
        self.0.write().unwrap_or_else(PoisonError::into_inner).stale = true;
    }
}

#[cfg(test)]
mod tests {
    use ::redis::Value;

    use super::{Table, hash_tag, slot};

    #[test]
    fn slots_are_the_specifications() {
        // CRC16/XMODEM's check value, and slots the `redis` crate's and
        // Redis's own tests name.
        assert_eq!(slot(b"123456789"), 0x31C3);
        assert_eq!(slot(b"foo"), 12_182);
        assert_eq!(slot(b"baz"), 4_813);
        assert_eq!(slot(b""), 0);
        // Hash tags: the first `{` and the first `}` after it, not empty.
        assert_eq!(slot(b"{foo}bar"), slot(b"foo"));
        assert_eq!(slot(b"rl:{user42}"), slot(b"user42"));
        assert_eq!(slot(b"{user42}:day"), slot(b"{user42}:minute"));
        assert_eq!(hash_tag(b"foo{}{bar}"), None);
        assert_eq!(hash_tag(b"foo{{bar}}zap"), Some(&b"{bar"[..]));
        assert_eq!(hash_tag(b"foo{bar}{zap}"), Some(&b"bar"[..]));
        assert_eq!(hash_tag(b"{"), None);
        assert_eq!(hash_tag(b"rl:{"), None);
    }

    #[test]
    fn a_batch_is_grouped_by_master_in_order() {
        let node = |port: i64| {
            Value::Array(vec![
                Value::BulkString(b"127.0.0.1".to_vec()),
                Value::Int(port),
                Value::BulkString(b"id".to_vec()),
            ])
        };
        let range = |a: i64, b: i64, port: i64| {
            Value::Array(vec![
                Value::Int(a),
                Value::Int(b),
                node(port),
                node(port + 1),
            ])
        };
        // Two ranges of one master, one of another; slots 12 000.. unknown.
        let reply = Value::Array(vec![
            range(0, 4_999, 7000),
            range(5_000, 9_999, 7002),
            range(10_000, 11_999, 7000),
        ]);
        let table = Table::parse(&reply).unwrap();
        // foo: 12 182 (unknown), baz: 4 813 (7000), 123456789: 12 739
        // (unknown), {a}: slot of "a" = 15 495 (unknown), bar: 5 061 (7002).
        let keys: [&[u8]; 5] = [b"baz", b"foo", b"bar", b"123456789", b"x{baz}"];
        assert_eq!(slot(b"bar"), 5_061);
        assert_eq!(
            table.group(keys.iter().copied()),
            vec![vec![0, 4], vec![1, 3], vec![2]]
        );
        assert!(Table::parse(&Value::Array(vec![range(5, 4, 1)])).is_err());
        assert!(Table::parse(&Value::Array(vec![range(0, 16_384, 1)])).is_err());
        assert!(Table::parse(&Value::Int(3)).is_err());
    }
}
