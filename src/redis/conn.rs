//! The connection a [`RedisFunnel`](super::RedisFunnel) decides through: one
//! node's [`Node`] (a multiplexed connection, made again when lost), or a
//! cluster's [`ClusterConnection`] and the slot table its batches are
//! grouped by (`cluster.rs`).
//!
//! Both count an *epoch*, the refusal cache's: it moves whenever the
//! server behind a key may have changed — a new connection to the node (it
//! may have restarted without its data, or be another server behind the
//! same address), and on a cluster any connection failure (the cluster
//! client reconnects on its own, after which a slot may be served by a
//! promoted replica) or redirect. A refusal cached in an older epoch is not
//! answered.
//!
//! Both are a [`ConnectionLike`], so the script calls of `script.rs` are
//! written once: a call is routed by its one key (the cluster client reads
//! the key of an `EVALSHA` and sends it to the master of the key's slot), and
//! a pipeline by its first key.

use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use ::redis::aio::{ConnectionLike, MultiplexedConnection};
use ::redis::cluster_async::ClusterConnection;
use ::redis::cluster_routing::{Route, SingleNodeRoutingInfo, SlotAddr};
use ::redis::{
    AsyncConnectionConfig, Cmd, ConnectionAddr, ConnectionInfo, ErrorKind, FromRedisValue,
    Pipeline, RedisError, RedisFuture, RedisResult, Value,
};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::cluster::{self, Slots};

/// One node or a cluster. Cheap to clone (each variant is a handle on a
/// shared connection task).
#[derive(Clone)]
pub(super) enum Conn {
    /// One server, reconnected when the connection is lost.
    Node(Arc<Node>),
    /// A Redis Cluster: the client routes each call to its key's master and
    /// refreshes its topology on a redirect; `slots` is this crate's own
    /// copy of the topology, for grouping batches by node.
    Cluster {
        conn: ClusterConnection,
        slots: Slots,
        epoch: Arc<AtomicU64>,
    },
}

/// One server's connection: a [`MultiplexedConnection`] shared by every
/// request, and made again (once, by the first request that needs it)
/// after one failed on the connection or was closed. Unlike the `redis`
/// crate's `ConnectionManager`, which reconnects in the background (on its
/// own when the protocol is RESP3), every new connection is made here, so
/// the epoch cannot miss one; and the socket is watched, so that whether
/// the connection is still open is known without a round trip (see
/// [`open`](Node::open)).
pub(super) struct Node {
    info: ConnectionInfo,
    config: AsyncConnectionConfig,
    connect_timeout: Duration,
    /// The connection; `None` before the first and once lost.
    current: Mutex<Option<Current>>,
    /// Held while connecting, so that concurrent requests make one.
    connecting: tokio::sync::Mutex<()>,
    epoch: AtomicU64,
}

/// A connection of a [`Node`]'s, and what tells whether it is still open.
#[derive(Clone)]
struct Current {
    epoch: u64,
    conn: MultiplexedConnection,
    watch: Watch,
}

impl Node {
    /// A node at `info` (TCP or a Unix socket), connected lazily: each
    /// connection within `connect_timeout`, then set up as `config` says.
    pub(super) fn new(
        info: ConnectionInfo,
        config: AsyncConnectionConfig,
        connect_timeout: Duration,
    ) -> Node {
        Node {
            info,
            config,
            connect_timeout,
            current: Mutex::new(None),
            connecting: tokio::sync::Mutex::new(()),
            epoch: AtomicU64::new(0),
        }
    }

    fn current(&self) -> Option<Current> {
        let mut current = self.current.lock().unwrap_or_else(PoisonError::into_inner);
        if current.as_ref().is_some_and(|c| c.watch.closed()) {
            *current = None;
        }
        current.clone()
    }

    /// Whether the connection is open now: made, and neither failed nor
    /// closed by the server (no end of stream or reset seen on its socket).
    /// No round trip.
    pub(super) fn open(&self) -> bool {
        self.current().is_some()
    }

    /// The connection, made first if there is none.
    async fn get(&self) -> RedisResult<(u64, MultiplexedConnection)> {
        if let Some(c) = self.current() {
            return Ok((c.epoch, c.conn));
        }
        let _connecting = self.connecting.lock().await;
        if let Some(c) = self.current() {
            return Ok((c.epoch, c.conn));
        }
        let (conn, watch) = self.connect().await?;
        let epoch = self.epoch.fetch_add(1, Ordering::AcqRel) + 1;
        *self.current.lock().unwrap_or_else(PoisonError::into_inner) = Some(Current {
            epoch,
            conn: conn.clone(),
            watch,
        });
        Ok((epoch, conn))
    }

    /// Connects if the connection is not open: `Ok` if one is open
    /// afterwards, else why not. If another request is connecting, waits
    /// for the outcome of its attempt rather than making another. For the
    /// refusal cache, which answers from a closed connection's epoch only
    /// once it has seen that Redis cannot be reached: another request's
    /// attempt in flight tells nothing yet (Redis may be back, and that
    /// attempt about to move the epoch).
    pub(super) async fn reconnect(&self) -> RedisResult<()> {
        if self.open() {
            return Ok(());
        }
        if let Ok(free) = self.connecting.try_lock() {
            drop(free);
            return self.get().await.map(drop);
        }
        drop(self.connecting.lock().await);
        if self.open() {
            Ok(())
        } else {
            Err(RedisError::from(std::io::Error::new(
                std::io::ErrorKind::NotConnected,
                "redis could not be reached (another request's attempt to connect failed)",
            )))
        }
    }

    /// A new connection: the socket, watched, then the `redis` crate's
    /// handshake (authentication, database, protocol) and its driver task.
    async fn connect(&self) -> RedisResult<(MultiplexedConnection, Watch)> {
        let connect = async {
            let (stream, watch): (Box<dyn Stream>, Watch) = match self.info.addr() {
                ConnectionAddr::Tcp(host, port) => {
                    let tcp = tokio::net::TcpStream::connect((host.as_str(), *port)).await?;
                    tcp.set_nodelay(true)?;
                    // A second handle on the socket, for the watch's peek
                    // (out of tokio's reactor and back in, nonblocking).
                    let tcp = tcp.into_std()?;
                    let watch = Watch::tcp(tcp.try_clone()?);
                    let tcp = tokio::net::TcpStream::from_std(tcp)?;
                    (Box::new(Watched::new(tcp, watch.clone())), watch)
                }
                #[cfg(unix)]
                ConnectionAddr::Unix(path) => {
                    let unix = tokio::net::UnixStream::connect(path).await?;
                    let watch = Watch::default();
                    (Box::new(Watched::new(unix, watch.clone())), watch)
                }
                other => {
                    return Err(RedisError::from((
                        ErrorKind::InvalidClientConfig,
                        "tokio-ratelimit connects to Redis over TCP or a Unix socket only",
                        format!("{other:?}"),
                    )));
                }
            };
            let (conn, driver) = MultiplexedConnection::new_with_config(
                self.info.redis_settings(),
                stream,
                self.config.clone(),
            )
            .await?;
            tokio::spawn(driver);
            Ok((conn, watch))
        };
        match tokio::time::timeout(self.connect_timeout, connect).await {
            Ok(connected) => connected,
            Err(_) => Err(RedisError::from(std::io::Error::from(
                std::io::ErrorKind::TimedOut,
            ))),
        }
    }

    /// Sends through the connection, and forgets it if it failed.
    async fn send<T>(
        &self,
        f: impl AsyncFnOnce(&mut MultiplexedConnection) -> RedisResult<T>,
    ) -> RedisResult<T> {
        let (epoch, mut conn) = self.get().await?;
        let result = f(&mut conn).await;
        if let Err(e) = &result
            && super::script::connection_failed(e)
        {
            let mut current = self.current.lock().unwrap_or_else(PoisonError::into_inner);
            if current.as_ref().is_some_and(|c| c.epoch == epoch) {
                *current = None;
            }
        }
        result
    }
}

/// A socket the `redis` crate reads and writes.
trait Stream: AsyncRead + AsyncWrite + Unpin + Send + 'static {}
impl<S: AsyncRead + AsyncWrite + Unpin + Send + 'static> Stream for S {}

/// What tells whether a connection is still open: the end of stream or an
/// error seen by the connection's driver task (which always reads), and,
/// for TCP, a look at the socket itself (`MSG_PEEK`, nonblocking: no data
/// taken), so that a close is seen even before the driver task has run.
/// (The driver task ends on its own once every handle on its connection
/// has been dropped.)
#[derive(Clone, Default)]
struct Watch {
    closed: Arc<AtomicBool>,
    /// A second handle on the TCP socket, for `peek`.
    socket: Option<Arc<std::net::TcpStream>>,
}

impl Watch {
    fn tcp(socket: std::net::TcpStream) -> Watch {
        Watch {
            closed: Arc::default(),
            socket: Some(Arc::new(socket)),
        }
    }

    fn close(&self) {
        self.closed.store(true, Ordering::Release);
    }

    /// Whether the server closed the connection, or it failed.
    fn closed(&self) -> bool {
        if self.closed.load(Ordering::Acquire) {
            return true;
        }
        let Some(socket) = &self.socket else {
            return false;
        };
        // The socket is nonblocking (tokio made it so, and the flag is the
        // open file's, shared by both handles): no data is `WouldBlock`.
        match socket.peek(&mut [0]) {
            Ok(0) => {
                self.close();
                true
            }
            Ok(_) => false,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => false,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => false,
            Err(_) => {
                self.close();
                true
            }
        }
    }
}

/// A socket whose end of stream and errors are written to its [`Watch`].
struct Watched<S> {
    inner: S,
    watch: Watch,
}

impl<S> Watched<S> {
    fn new(inner: S, watch: Watch) -> Watched<S> {
        Watched { inner, watch }
    }
}

impl<S> Drop for Watched<S> {
    /// The driver task let go of the socket (it ended, or its runtime
    /// did): the connection is over, though the watch's second handle
    /// keeps the socket itself open.
    fn drop(&mut self) {
        self.watch.close();
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Watched<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let (before, room) = (buf.filled().len(), buf.remaining() > 0);
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        match &polled {
            Poll::Ready(Ok(())) if room && buf.filled().len() == before => self.watch.close(),
            Poll::Ready(Err(_)) => self.watch.close(),
            _ => {}
        }
        polled
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Watched<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write(cx, buf);
        if let Poll::Ready(Err(_)) = &polled {
            self.watch.close();
        }
        polled
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

impl Conn {
    /// The refusal cache's epoch: see the module docs.
    pub(super) fn epoch(&self) -> u64 {
        match self {
            Conn::Node(node) => node.epoch.load(Ordering::Acquire),
            Conn::Cluster { epoch, .. } => epoch.load(Ordering::Acquire),
        }
    }

    /// A request failed on the connection or was redirected: on a cluster
    /// the server behind a key may change without a new connection of
    /// ours, so the epoch moves. (A node's moves when it connects again.)
    pub(super) fn may_have_moved(&self) {
        if let Conn::Cluster { epoch, .. } = self {
            epoch.fetch_add(1, Ordering::AcqRel);
        }
    }

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
            Conn::Node(_) => pipe.query_async(self).await,
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
            Conn::Node(node) => Box::pin(node.send(async move |c| c.req_packed_command(cmd).await)),
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
            Conn::Node(node) => {
                Box::pin(node.send(async move |c| c.req_packed_commands(pipe, offset, count).await))
            }
            Conn::Cluster { conn, .. } => conn.req_packed_commands(pipe, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Node(node) => node.info.redis_settings().db(),
            Conn::Cluster { conn, .. } => conn.get_db(),
        }
    }
}
