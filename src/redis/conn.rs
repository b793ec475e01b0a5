//! The connection a [`RedisFunnel`](super::RedisFunnel) decides through: one
//! node's [`ConnectionManager`], or a cluster's [`ClusterConnection`] and the
//! slot table its batches are grouped by (`cluster.rs`).
//!
//! Both are a [`ConnectionLike`], so the script calls of `script.rs` are
//! written once: a call is routed by its one key (the cluster client reads
//! the key of an `EVALSHA` and sends it to the master of the key's slot), and
//! a pipeline by its first key.

use ::redis::aio::{ConnectionLike, ConnectionManager};
use ::redis::cluster_async::ClusterConnection;
use ::redis::cluster_routing::{Route, SingleNodeRoutingInfo, SlotAddr};
use ::redis::{
    Cmd, ErrorKind, FromRedisValue, Pipeline, RedisError, RedisFuture, RedisResult, Value,
};

use super::cluster::{self, Slots};

/// One node or a cluster. Cheap to clone (each variant is a handle on a
/// shared connection task).
#[derive(Clone)]
pub(super) enum Conn {
    /// One server, reconnecting on its own.
    Node(ConnectionManager),
    /// A Redis Cluster: the client routes each call to its key's master and
    /// refreshes its topology on a redirect; `slots` is this crate's own
    /// copy of the topology, for grouping batches by node.
    Cluster {
        conn: ClusterConnection,
        slots: Slots,
    },
}

impl Conn {
    /// The replies to the commands of `pipe` after its first `skip` (which
    /// it marks ignored), each kept apart, as `ignore_errors` keeps them.
    /// On a cluster it goes to the master of `key`'s slot, whatever slots
    /// its other keys are in: the client's own routing of a pipeline
    /// refuses keys of two slots, and a batch puts every key of one node in
    /// one pipeline (the node runs each command for its own key).
    pub(super) async fn replies<T: FromRedisValue>(
        &mut self,
        pipe: Pipeline,
        skip: usize,
        key: &[u8],
    ) -> RedisResult<Vec<RedisResult<T>>> {
        match self {
            Conn::Node(c) => pipe.query_async(c).await,
            Conn::Cluster { conn, .. } => {
                let count = pipe.cmd_iter().count() - skip;
                let route = Route::new(cluster::slot(key), SlotAddr::Master);
                let replies = conn
                    .route_pipeline(
                        pipe,
                        skip,
                        count,
                        SingleNodeRoutingInfo::SpecificNode(route),
                    )
                    .await?;
                Ok(replies
                    .into_iter()
                    .map(|v| match v {
                        Value::ServerError(e) => Err(e.into()),
                        v => ::redis::from_redis_value(v).map_err(RedisError::from),
                    })
                    .collect())
            }
        }
    }

    /// Sends `pipe` to the node at `addr` (`host:port`, as an `ASK`
    /// redirect names it), and returns its last reply.
    pub(super) async fn last_reply_at(
        &mut self,
        addr: &str,
        pipe: &Pipeline,
    ) -> RedisResult<Value> {
        let Conn::Cluster { conn, .. } = self else {
            return Err(RedisError::from((
                ErrorKind::Client,
                "a redirect from a single node",
            )));
        };
        let (host, port) = addr
            .rsplit_once(':')
            .and_then(|(h, p)| Some((h.to_owned(), p.parse().ok()?)))
            .ok_or_else(|| {
                RedisError::from((
                    ErrorKind::Parse,
                    "redirect to a malformed address",
                    addr.to_owned(),
                ))
            })?;
        let count = pipe.cmd_iter().count();
        let mut replies = conn
            .route_pipeline(
                pipe.clone(),
                0,
                count,
                SingleNodeRoutingInfo::ByAddress { host, port },
            )
            .await?;
        match replies.pop() {
            Some(Value::ServerError(e)) => Err(e.into()),
            Some(v) => Ok(v),
            None => Err(RedisError::from((
                ErrorKind::Parse,
                "missing pipeline reply",
            ))),
        }
    }
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Conn::Node(c) => c.req_packed_command(cmd),
            Conn::Cluster { conn, .. } => conn.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipe: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Conn::Node(c) => c.req_packed_commands(pipe, offset, count),
            Conn::Cluster { conn, .. } => conn.req_packed_commands(pipe, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Node(c) => c.get_db(),
            Conn::Cluster { conn, .. } => conn.get_db(),
        }
    }
}
