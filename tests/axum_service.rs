//! End to end over real HTTP: `examples/axum_service.rs` (included as a
//! module, so the example is what is tested) serves on a loopback port, and
//! a real HTTP client drives it through scripted request sequences.
//!
//! # Exact, without waiting
//!
//! The server runs on its own OS thread, on a current-thread runtime whose
//! clock is paused; the client runs on the test's ordinary runtime. The
//! paused clock only moves when the test says so — a control channel whose
//! handler calls `tokio::time::advance` inside the server's runtime — or
//! when the server has nothing to do but a timer to wait for (tokio then
//! jumps to it: that is how a request waiting on `/expensive`'s token bucket
//! gets its turn at once). So the counts of 200 and 429 are exact, and
//! "honour `Retry-After`" is: advance the server's clock by it, retry.
//!
//! For that, nothing on the server may arm a timer while it waits for the
//! client: the per-client `KeyedFunnel` is built with
//! `background_sweep(false)`, so it spawns no sweeper (the sweeper's
//! periodic timer would let the paused clock jump ahead whenever the server
//! is idle).

#[path = "../examples/axum_service.rs"]
#[expect(dead_code, reason = "`main` is for the example only")]
mod service;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use service::{Config, Limits, PerClient};
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;
use tokio_ratelimit::Rate;
use tokio_ratelimit::keyed::KeyedFunnel;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

enum Control {
    /// Move the server's clock forward.
    Advance(Duration, oneshot::Sender<()>),
    /// How far the server's clock has moved since it started.
    Elapsed(oneshot::Sender<Duration>),
}

/// The example's service, on 127.0.0.1:0, on a runtime of its own.
struct Server {
    addr: SocketAddr,
    control: Option<mpsc::UnboundedSender<Control>>,
    thread: Option<JoinHandle<()>>,
    limits: Limits,
    /// The per-client map the service is given, to read its stats (a local
    /// one only).
    per_client: Option<KeyedFunnel<String>>,
}

/// Where the per-client limit lives.
#[derive(Clone)]
enum Backend {
    /// A `KeyedFunnel` in the server, on a paused clock.
    Local,
    /// A `RedisFunnel` on this server (real time: Redis's clock).
    #[cfg(feature = "redis")]
    Redis {
        url: String,
        prefix: String,
        policy: tokio_ratelimit::redis::FailurePolicy,
    },
}

impl Server {
    fn start(config: Config) -> Server {
        Server::start_on(config, Backend::Local)
    }

    fn start_on(config: Config, backend: Backend) -> Server {
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let (control, mut commands) = mpsc::unbounded_channel();
        let paused = matches!(backend, Backend::Local);
        let thread = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .start_paused(paused)
                .build()
                .unwrap();
            runtime.block_on(async move {
                let (per_client, local): (PerClient, _) = match backend {
                    Backend::Local => {
                        // No sweeper task, no timer (see above).
                        let map = KeyedFunnel::builder()
                            .rate(config.per_client_rate)
                            .capacity(config.per_client_burst)
                            .background_sweep(false)
                            .build()
                            .unwrap();
                        (Arc::new(map.clone()), Some(map))
                    }
                    #[cfg(feature = "redis")]
                    Backend::Redis {
                        url,
                        prefix,
                        policy,
                    } => {
                        let shared = tokio_ratelimit::redis::RedisFunnel::builder(url)
                            .rate(config.per_client_rate)
                            .capacity(config.per_client_burst)
                            .prefix(prefix)
                            .failure_policy(policy)
                            .build()
                            .await
                            .unwrap();
                        (Arc::new(shared), None)
                    }
                };
                let limits = Limits::with(per_client, &config).unwrap();
                let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
                let start = Instant::now();
                ready_tx
                    .send((listener.local_addr().unwrap(), limits.clone(), local))
                    .unwrap();
                let server = tokio::spawn(service::serve(listener, limits));
                while let Some(command) = commands.recv().await {
                    match command {
                        Control::Advance(by, done) => {
                            tokio::time::advance(by).await;
                            let _ = done.send(());
                        }
                        Control::Elapsed(reply) => {
                            let _ = reply.send(start.elapsed());
                        }
                    }
                }
                server.abort();
            });
        });
        let (addr, limits, per_client) = ready_rx.recv().unwrap();
        Server {
            addr,
            control: Some(control),
            thread: Some(thread),
            limits,
            per_client,
        }
    }

    fn local_stats(&self) -> tokio_ratelimit::keyed::KeyedStats {
        self.per_client.as_ref().expect("a local map").stats()
    }

    fn control(&self) -> &mpsc::UnboundedSender<Control> {
        self.control.as_ref().expect("running")
    }

    async fn advance(&self, by: Duration) {
        let (done, ack) = oneshot::channel();
        self.control().send(Control::Advance(by, done)).unwrap();
        ack.await.unwrap();
    }

    async fn elapsed(&self) -> Duration {
        let (reply, answer) = oneshot::channel();
        self.control().send(Control::Elapsed(reply)).unwrap();
        answer.await.unwrap()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        drop(self.control.take()); // ends the control loop, then the server
        if let Some(thread) = self.thread.take() {
            let panicked = thread.join().is_err();
            assert!(
                !panicked || std::thread::panicking(),
                "server thread panicked"
            );
        }
    }
}

/// What the test looks at in a response.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Answer {
    status: u16,
    headers: BTreeMap<&'static str, String>,
}

impl Answer {
    fn header(&self, name: &str) -> &str {
        self.headers.get(name).map_or("-", String::as_str)
    }

    /// `(status, RateLimit-Remaining, RateLimit-Reset, Retry-After)`.
    fn summary(&self) -> (u16, &str, &str, &str) {
        (
            self.status,
            self.header("ratelimit-remaining"),
            self.header("ratelimit-reset"),
            self.header("retry-after"),
        )
    }
}

struct HttpClient {
    client: Client<HttpConnector, Empty<Bytes>>,
    base: String,
}

impl HttpClient {
    fn new(server: &Server) -> HttpClient {
        HttpClient {
            client: Client::builder(TokioExecutor::new()).build_http(),
            base: format!("http://{}", server.addr),
        }
    }

    /// GET `path`, as `client` (an `x-client-id`) or, with `None`, as
    /// whoever the peer address says.
    async fn get(&self, path: &str, client: Option<&str>) -> Answer {
        let mut request = hyper::Request::get(format!("{}{path}", self.base));
        if let Some(id) = client {
            request = request.header("x-client-id", id);
        }
        let response = self
            .client
            .request(request.body(Empty::new()).unwrap())
            .await
            .unwrap();
        let status = response.status().as_u16();
        let mut headers = BTreeMap::new();
        for name in [
            "ratelimit-limit",
            "ratelimit-remaining",
            "ratelimit-reset",
            "retry-after",
        ] {
            if let Some(value) = response.headers().get(name) {
                headers.insert(name, value.to_str().unwrap().to_owned());
            }
        }
        response.into_body().collect().await.unwrap();
        Answer { status, headers }
    }
}

fn config() -> Config {
    Config {
        // 2 per 3 s: one every 1.5 s, so Retry-After has to round up.
        per_client_rate: Rate::per(2, Duration::from_secs(3)),
        per_client_burst: 3,
        expensive_rate: Rate::per_second(2),
        expensive_burst: 1,
    }
}

fn count(answers: &[Answer], status: u16) -> usize {
    answers.iter().filter(|a| a.status == status).count()
}

#[tokio::test]
async fn per_client_limits_are_exact_and_retry_after_is_honoured() {
    let server = Server::start(config());
    let http = HttpClient::new(&server);
    let mut all = Vec::new();

    // At 0 s: each client has a burst of 3, then 429s.
    let mut ann = Vec::new();
    for _ in 0..5 {
        ann.push(http.get("/", Some("ann")).await);
    }
    let summaries: Vec<_> = ann.iter().map(Answer::summary).collect();
    assert_eq!(
        summaries,
        [
            (200, "2", "2", "-"), // 1.5 s of water: resets in 2 s
            (200, "1", "3", "-"), // 3 s
            (200, "0", "5", "-"), // 4.5 s
            (429, "0", "5", "2"), // retry in 1.5 s: 2
            (429, "0", "5", "2"),
        ]
    );
    assert!(ann.iter().all(|a| a.header("ratelimit-limit") == "3"));
    all.extend(ann);
    for client in [Some("bob"), None] {
        // `None`: no id, so the peer address is the key.
        let mut answers = Vec::new();
        for _ in 0..4 {
            answers.push(http.get("/", client).await);
        }
        let statuses: Vec<_> = answers.iter().map(|a| a.status).collect();
        assert_eq!(statuses, [200, 200, 200, 429], "{client:?}");
        all.extend(answers);
    }
    assert_eq!((count(&all, 200), count(&all, 429)), (9, 4));

    // Just before ann's retry_after (1.5 s): still limited, and Retry-After
    // is 1 (rounded up), not 0.
    server
        .advance(ms(1499) + Duration::from_nanos(999_999))
        .await;
    let early = http.get("/", Some("ann")).await;
    assert_eq!(early.summary(), (429, "0", "4", "1")); // 3 s + 1 ns of water
    server.advance(Duration::from_nanos(1)).await;
    assert_eq!(
        http.get("/", Some("ann")).await.summary(),
        (200, "0", "5", "-")
    );
    let limited = http.get("/", Some("ann")).await;
    assert_eq!(limited.summary(), (429, "0", "5", "2"));

    // Honour Retry-After to the letter: wait it, retry, admitted.
    let retry_after: u64 = limited.header("retry-after").parse().unwrap();
    server.advance(Duration::from_secs(retry_after)).await;
    assert_eq!(
        http.get("/", Some("ann")).await.summary(),
        (200, "0", "4", "-")
    );
    assert_eq!(
        http.get("/", Some("ann")).await.summary(),
        (429, "0", "4", "1")
    );

    // The limiter's own account agrees with what the client saw.
    let stats = server.local_stats();
    assert_eq!((stats.keys, stats.granted, stats.limited), (3, 11, 7));
    assert_eq!(server.elapsed().await, Duration::from_millis(3500));
}

#[tokio::test]
async fn the_expensive_route_waits_for_the_global_budget() {
    let server = Server::start(config());
    let http = HttpClient::new(&server);
    // Three clients at once: a burst of 1, then 2/s for everyone. None is
    // refused; the last waits for two refills.
    let (a, b, c) = tokio::join!(
        http.get("/expensive", Some("a")),
        http.get("/expensive", Some("b")),
        http.get("/expensive", Some("c")),
    );
    assert_eq!([a.status, b.status, c.status], [200, 200, 200]);
    // The server's clock moved only to let the waiters through: 0.5 s, 1 s.
    assert_eq!(server.elapsed().await, ms(1000));
    let stats = server.limits.expensive.stats();
    assert_eq!((stats.granted, stats.waiting), (3, 0));
    assert_eq!(a.header("ratelimit-limit"), "3");
    assert_eq!(server.local_stats().granted, 3);
}

#[tokio::test]
async fn the_per_client_limit_answers_before_the_global_wait() {
    let server = Server::start(Config {
        per_client_burst: 1,
        ..config()
    });
    let http = HttpClient::new(&server);
    assert_eq!(http.get("/expensive", Some("ann")).await.status, 200);
    // ann is over her own limit: refused at once, without taking (or
    // waiting for) the global token.
    let refused = http.get("/expensive", Some("ann")).await;
    assert_eq!(refused.summary(), (429, "0", "2", "2"));
    assert_eq!(server.elapsed().await, Duration::ZERO);
    // bob waits his turn for the global budget: 0.5 s.
    assert_eq!(http.get("/expensive", Some("bob")).await.status, 200);
    assert_eq!(server.elapsed().await, ms(500));
    assert_eq!(server.limits.expensive.stats().granted, 2);
}

/// One client's limit: 1 per 20 s with bursts of 3. Slow enough that the
/// milliseconds real time moves during a test cannot change an answer, so
/// one script runs on a paused local map and on Redis alike.
fn slow_config() -> Config {
    Config {
        per_client_rate: Rate::per(1, Duration::from_secs(20)),
        per_client_burst: 3,
        ..config()
    }
}

/// The same requests, the same answers, whichever backend `servers` share
/// (each request goes to the next server, as behind a load balancer).
async fn burst_then_refused(servers: &[&Server]) {
    let http: Vec<HttpClient> = servers.iter().map(|s| HttpClient::new(s)).collect();
    let mut answers = Vec::new();
    for i in 0..5 {
        answers.push(http[i % http.len()].get("/", Some("ann")).await);
    }
    let statuses: Vec<u16> = answers.iter().map(|a| a.status).collect();
    assert_eq!(statuses, [200, 200, 200, 429, 429]);
    let remaining: Vec<&str> = answers
        .iter()
        .map(|a| a.header("ratelimit-remaining"))
        .collect();
    assert_eq!(remaining, ["2", "1", "0", "0", "0"]);
    assert!(answers.iter().all(|a| a.header("ratelimit-limit") == "3"));
    // 20 s until one unit drains (less the milliseconds real time took).
    assert_eq!(answers[3].header("retry-after"), "20");
    assert_eq!(answers[2].header("ratelimit-reset"), "60");
    // Another client has its own limit, on every server.
    for h in &http {
        assert_eq!(h.get("/", Some("bob")).await.status, 200);
    }
}

#[tokio::test]
async fn a_local_map_behind_the_layer() {
    let server = Server::start(slow_config());
    burst_then_refused(&[&server]).await;
    assert_eq!(server.local_stats().granted, 4);
}

#[cfg(feature = "redis")]
#[path = "support/redis_server.rs"]
mod redis_server;

#[cfg(feature = "redis")]
fn shared(
    redis: &redis_server::RedisServer,
    prefix: &str,
    policy: tokio_ratelimit::redis::FailurePolicy,
) -> Backend {
    Backend::Redis {
        url: redis.url(),
        prefix: prefix.to_owned(),
        policy,
    }
}

/// Two replicas of the service share each client's limit through Redis:
/// the same answers as one process with a local map.
#[cfg(feature = "redis")]
#[tokio::test]
async fn two_replicas_share_a_limit_through_redis() {
    use tokio_ratelimit::redis::FailurePolicy;
    let Some(redis) = redis_server::RedisServer::start("two_replicas_share_a_limit_through_redis")
    else {
        return;
    };
    let backend = shared(&redis, "replicas:", FailurePolicy::Closed);
    let (a, b) = (
        Server::start_on(slow_config(), backend.clone()),
        Server::start_on(slow_config(), backend),
    );
    burst_then_refused(&[&a, &b]).await;
}

/// Redis gone: failing closed, a 503 with `Retry-After` (never a 429, which
/// would blame the client); failing open, the request passes.
#[cfg(feature = "redis")]
#[tokio::test]
async fn a_shared_limit_that_cannot_decide_answers_by_its_policy() {
    use tokio_ratelimit::redis::FailurePolicy;
    let Some(mut redis) =
        redis_server::RedisServer::start("a_shared_limit_that_cannot_decide_answers_by_its_policy")
    else {
        return;
    };
    let closed = Server::start_on(
        slow_config(),
        shared(&redis, "policy:", FailurePolicy::Closed),
    );
    let open = Server::start_on(
        slow_config(),
        shared(&redis, "policy:", FailurePolicy::Open),
    );
    let (closed_http, open_http) = (HttpClient::new(&closed), HttpClient::new(&open));
    assert_eq!(closed_http.get("/", Some("ann")).await.status, 200);
    redis.kill();
    let refused = closed_http.get("/", Some("ann")).await;
    assert_eq!((refused.status, refused.header("retry-after")), (503, "1"));
    assert_eq!(open_http.get("/", Some("ann")).await.status, 200);
}
