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
use std::thread::JoinHandle;
use std::time::Duration;

use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use service::{Config, Limits};
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;
use tokio_ratelimit::keyed::KeyedFunnel;
use tokio_ratelimit::{Rate, TokenBucket};

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

enum Control {
    /// Move the server's clock forward.
    Advance(Duration, oneshot::Sender<()>),
    /// How far the server's clock has moved since it started.
    Elapsed(oneshot::Sender<Duration>),
}

/// The example's service, on 127.0.0.1:0, on a paused clock of its own.
struct Server {
    addr: SocketAddr,
    control: Option<mpsc::UnboundedSender<Control>>,
    thread: Option<JoinHandle<()>>,
    limits: Limits,
}

impl Server {
    fn start(config: Config) -> Server {
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let (control, mut commands) = mpsc::unbounded_channel();
        let thread = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .start_paused(true)
                .build()
                .unwrap();
            runtime.block_on(async move {
                // No sweeper task, no timer (see above).
                let per_client = KeyedFunnel::builder()
                    .rate(config.per_client_rate)
                    .capacity(config.per_client_burst)
                    .background_sweep(false)
                    .build()
                    .unwrap();
                let expensive = TokenBucket::builder()
                    .rate(config.expensive_rate)
                    .capacity(config.expensive_burst)
                    .build()
                    .unwrap();
                let limits = Limits {
                    per_client,
                    expensive,
                };
                let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
                let start = Instant::now();
                ready_tx
                    .send((listener.local_addr().unwrap(), limits.clone()))
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
        let (addr, limits) = ready_rx.recv().unwrap();
        Server {
            addr,
            control: Some(control),
            thread: Some(thread),
            limits,
        }
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
    let stats = server.limits.per_client.stats();
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
    assert_eq!(server.limits.per_client.stats().granted, 3);
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
