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
//!
//! The Redis-backed runs (feature `redis`) use Redis's clock (real time),
//! with limits slow enough that the milliseconds a test takes change no
//! answer.

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
use tokio_ratelimit::keyed::KeyedFunnel;
use tokio_ratelimit::{Quota, Rate};

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

enum Control {
    /// Move the server's clock forward.
    Advance(Duration, oneshot::Sender<()>),
    /// How far the server's clock has moved since it started.
    Elapsed(oneshot::Sender<Duration>),
    /// Sweep the local map, on the server's clock; the keys left.
    Sweep(oneshot::Sender<usize>),
}

/// Where the per-client limit lives.
#[derive(Clone)]
enum Backend {
    /// A `KeyedFunnel` in the server, on a paused clock.
    Local {
        /// `max_keys` of the map.
        max_keys: usize,
    },
    /// A `RedisFunnel` on this server (real time: Redis's clock).
    #[cfg(feature = "redis")]
    Redis {
        url: String,
        prefix: String,
        policy: tokio_ratelimit::redis::FailurePolicy,
    },
    /// A `RedisFunnel` on this Redis Cluster.
    #[cfg(feature = "redis")]
    Cluster { nodes: Vec<String>, prefix: String },
}

const LOCAL: Backend = Backend::Local {
    max_keys: usize::MAX,
};

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

impl Server {
    fn start(config: Config) -> Server {
        #![expect(
            clippy::large_types_passed_by_value,
            reason = "a test's configuration, once"
        )]
        Server::start_on(config, &LOCAL, &[])
    }

    fn start_on(config: Config, backend: &Backend, trusted: &[&str]) -> Server {
        #![expect(
            clippy::large_types_passed_by_value,
            reason = "a test's configuration, once"
        )]
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let (control, mut commands) = mpsc::unbounded_channel();
        let paused = matches!(backend, Backend::Local { .. });
        let backend = backend.clone();
        let trusted: Vec<String> = trusted.iter().map(|&t| t.to_owned()).collect();
        let thread = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .start_paused(paused)
                .build()
                .unwrap();
            // This server's own metrics recorder: the limiters register
            // their series in it when built on this thread (every task of
            // the current-thread runtime runs here too), and `/metrics`
            // renders it, apart from the other tests' servers.
            let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
            let rendered = recorder.handle();
            let _recorder = metrics::set_default_local_recorder(&recorder);
            runtime.block_on(async move {
                let (per_client, local): (PerClient, _) = match backend {
                    Backend::Local { max_keys } => {
                        // No sweeper task, no timer (see above).
                        let map = KeyedFunnel::builder()
                            .quota(config.free)
                            .tier(config.paid)
                            .max_keys(max_keys)
                            .background_sweep(false)
                            .name("per_client")
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
                            .quota(config.free)
                            .prefix(prefix)
                            .failure_policy(policy)
                            .build()
                            .await
                            .unwrap();
                        (Arc::new(shared), None)
                    }
                    #[cfg(feature = "redis")]
                    Backend::Cluster { nodes, prefix } => {
                        let shared = tokio_ratelimit::redis::RedisFunnel::cluster_builder(nodes)
                            .quota(config.free)
                            .prefix(prefix)
                            .failure_policy(tokio_ratelimit::redis::FailurePolicy::Closed)
                            .build()
                            .await
                            .unwrap();
                        (Arc::new(shared), None)
                    }
                };
                let mut limits = Limits::with(per_client, &config).unwrap();
                limits.metrics = Some(rendered);
                let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
                let start = Instant::now();
                ready_tx
                    .send((
                        listener.local_addr().unwrap(),
                        limits.clone(),
                        local.clone(),
                    ))
                    .unwrap();
                let clients = service::clients(&trusted).unwrap();
                let server = tokio::spawn(async move {
                    service::serve(listener, limits, &config, clients).await
                });
                while let Some(command) = commands.recv().await {
                    match command {
                        Control::Advance(by, done) => {
                            tokio::time::advance(by).await;
                            let _ = done.send(());
                        }
                        Control::Elapsed(reply) => {
                            let _ = reply.send(start.elapsed());
                        }
                        Control::Sweep(reply) => {
                            let _ = reply.send(local.as_ref().expect("a local map").sweep());
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

    /// Sweeps the local map on the server's (paused) clock: from the test's
    /// runtime the map would read the test's clock.
    async fn sweep(&self) -> usize {
        let (reply, answer) = oneshot::channel();
        self.control().send(Control::Sweep(reply)).unwrap();
        answer.await.unwrap()
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

/// One item of a `RateLimit-Policy` or `RateLimit` field: its policy name
/// and its integer parameters.
type Item = (String, BTreeMap<String, u64>);

/// Parses a field as the draft defines it (RFC 9651 structured fields): a
/// List of Items, each an sf-string with parameters. Only what the draft's
/// fields use is accepted: string items (printable ASCII, `\"` and `\\`
/// escapes) and parameters `;key=integer` with lowercase keys (keys
/// `[a-z*][a-z0-9_.*-]*`, integers of at most 15 digits). Anything else is
/// a test failure.
fn parse_list(field: &str) -> Vec<Item> {
    let mut items = Vec::new();
    let mut rest = field.trim_start_matches(' ');
    loop {
        let Some(after_quote) = rest.strip_prefix('"') else {
            panic!("an item must be an sf-string: {field:?}");
        };
        let mut name = String::new();
        let mut chars = after_quote.char_indices();
        let end = loop {
            match chars.next() {
                Some((i, '"')) => break i,
                Some((_, '\\')) => match chars.next() {
                    Some((_, c @ ('"' | '\\'))) => name.push(c),
                    other => panic!("bad escape {other:?} in {field:?}"),
                },
                Some((_, c)) if (' '..='~').contains(&c) => name.push(c),
                other => panic!("bad string character {other:?} in {field:?}"),
            }
        };
        rest = &after_quote[end + 1..];
        let mut params = BTreeMap::new();
        while let Some(after) = rest.strip_prefix(';') {
            let (pair, tail) = after.split_at(after.find([';', ',']).unwrap_or(after.len()));
            let (key, value) = pair.split_once('=').expect("key=value");
            assert!(
                key.starts_with(|c: char| c.is_ascii_lowercase() || c == '*')
                    && key.chars().all(|c| c.is_ascii_lowercase()
                        || c.is_ascii_digit()
                        || "_-.*".contains(c)),
                "bad key {key:?} in {field:?}"
            );
            assert!(
                !value.is_empty() && value.len() <= 15 && value.bytes().all(|b| b.is_ascii_digit()),
                "bad integer {value:?} in {field:?}"
            );
            assert!(
                params
                    .insert(key.to_owned(), value.parse().unwrap())
                    .is_none()
            );
            rest = tail;
        }
        items.push((name, params));
        if rest.is_empty() {
            return items;
        }
        rest = rest
            .strip_prefix(',')
            .unwrap_or_else(|| panic!("items are separated by commas: {field:?}"))
            .trim_start_matches([' ', '\t']);
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

    /// The `RateLimit-Policy` items: (name, q, w).
    fn policies(&self) -> Vec<(String, u64, u64)> {
        parse_list(self.header("ratelimit-policy"))
            .into_iter()
            .map(|(name, p)| {
                assert_eq!(p.len(), 2, "{p:?}");
                (name, p["q"], p["w"])
            })
            .collect()
    }

    /// The `RateLimit` items: (name, r, t).
    fn limits(&self) -> Vec<(String, u64, u64)> {
        parse_list(self.header("ratelimit"))
            .into_iter()
            .map(|(name, p)| {
                assert_eq!(p.len(), 2, "{p:?}");
                (name, p["r"], p["t"])
            })
            .collect()
    }

    /// `(status, r, t, Retry-After)` of the first band.
    fn summary(&self) -> (u16, u64, u64, &str) {
        let first = self.limits().remove(0);
        (self.status, first.1, first.2, self.header("retry-after"))
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

    /// GET `path` with an `x-api-key` when given, else by address.
    async fn get(&self, path: &str, api_key: Option<&str>) -> Answer {
        self.get_with(path, api_key, &[]).await
    }

    async fn get_with(&self, path: &str, api_key: Option<&str>, extra: &[(&str, &str)]) -> Answer {
        let mut request = hyper::Request::get(format!("{}{path}", self.base));
        if let Some(key) = api_key {
            request = request.header("x-api-key", key);
        }
        for (name, value) in extra {
            request = request.header(*name, *value);
        }
        let response = self
            .client
            .request(request.body(Empty::new()).unwrap())
            .await
            .unwrap();
        let status = response.status().as_u16();
        let mut headers = BTreeMap::new();
        for name in ["ratelimit-policy", "ratelimit", "retry-after"] {
            let values: Vec<&str> = response
                .headers()
                .get_all(name)
                .iter()
                .map(|v| v.to_str().unwrap())
                .collect();
            assert!(values.len() <= 1, "{name} sent {} times", values.len());
            if let Some(value) = values.first() {
                headers.insert(name, (*value).to_owned());
            }
        }
        response.into_body().collect().await.unwrap();
        Answer { status, headers }
    }
}

/// One band, 2 per 3 s (one every 1.5 s, so the seconds round up) with
/// bursts of 3; paid ten times that.
fn config() -> Config {
    Config {
        free: Quota::new(Rate::per(2, Duration::from_secs(3)), 3),
        paid: Quota::new(Rate::per(20, Duration::from_secs(3)), 30),
        expensive_rate: Rate::per_second(2),
        expensive_burst: 1,
    }
}

/// `/metrics` as a map from each series (its labels sorted) to its value.
async fn scrape(http: &HttpClient) -> BTreeMap<String, f64> {
    let response = http
        .client
        .request(
            hyper::Request::get(format!("{}/metrics", http.base))
                .body(Empty::new())
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 200);
    let body = response.into_body().collect().await.unwrap().to_bytes();
    let text = String::from_utf8(body.to_vec()).unwrap();
    text.lines()
        .filter(|line| !line.is_empty() && !line.starts_with('#'))
        .map(|line| {
            let (series, value) = line.rsplit_once(' ').unwrap();
            let series = match series.split_once('{') {
                Some((name, labels)) => {
                    let mut labels: Vec<&str> = labels.trim_end_matches('}').split(',').collect();
                    labels.sort_unstable();
                    format!("{name}{{{}}}", labels.join(","))
                }
                None => series.to_owned(),
            };
            (series, value.parse().unwrap())
        })
        .collect()
}

fn count(answers: &[Answer], status: u16) -> usize {
    answers.iter().filter(|a| a.status == status).count()
}

#[tokio::test]
async fn per_client_limits_are_exact_and_retry_after_is_honoured() {
    let server = Server::start(config());
    let http = HttpClient::new(&server);
    let mut all = Vec::new();

    // At 0 s: a burst of 3, then 429s. One more permit every 1.5 s: `t`
    // and `Retry-After` say 2 (rounded up).
    let mut ann = Vec::new();
    for _ in 0..5 {
        ann.push(http.get("/", Some("ann")).await);
    }
    let summaries: Vec<_> = ann.iter().map(Answer::summary).collect();
    assert_eq!(
        summaries,
        [
            (200, 2, 2, "-"),
            (200, 1, 2, "-"),
            (200, 0, 2, "-"),
            (429, 0, 2, "2"),
            (429, 0, 2, "2"),
        ]
    );
    // The policy: a burst of 3 refilled in 4.5 s, so a 5 s window of 3.
    for a in &ann {
        assert_eq!(a.policies(), [("3-per-5s".to_owned(), 3, 5)]);
        assert_eq!(a.limits()[0].0, "3-per-5s");
    }
    all.extend(ann);
    for key in [Some("bob"), None] {
        // `None`: no API key, so the peer address is the key.
        let mut answers = Vec::new();
        for _ in 0..4 {
            answers.push(http.get("/", key).await);
        }
        let statuses: Vec<_> = answers.iter().map(|a| a.status).collect();
        assert_eq!(statuses, [200, 200, 200, 429], "{key:?}");
        all.extend(answers);
    }
    assert_eq!((count(&all, 200), count(&all, 429)), (9, 4));

    // Just before ann's retry_after (1.5 s): still limited, and Retry-After
    // is 1 (rounded up), not 0.
    server
        .advance(ms(1499) + Duration::from_nanos(999_999))
        .await;
    assert_eq!(http.get("/", Some("ann")).await.summary(), (429, 0, 1, "1"));
    server.advance(Duration::from_nanos(1)).await;
    assert_eq!(http.get("/", Some("ann")).await.summary(), (200, 0, 2, "-"));
    let limited = http.get("/", Some("ann")).await;
    assert_eq!(limited.summary(), (429, 0, 2, "2"));

    // Honour Retry-After to the letter: wait it, retry, admitted.
    let retry_after: u64 = limited.header("retry-after").parse().unwrap();
    server.advance(Duration::from_secs(retry_after)).await;
    assert_eq!(http.get("/", Some("ann")).await.summary(), (200, 0, 1, "-"));
    assert_eq!(http.get("/", Some("ann")).await.summary(), (429, 0, 1, "1"));

    // The limiter's own account agrees with what the clients saw.
    let stats = server.local_stats();
    assert_eq!((stats.keys, stats.granted, stats.limited), (3, 11, 7));
    assert_eq!(server.elapsed().await, Duration::from_millis(3500));
}

#[tokio::test]
async fn each_tier_gets_its_own_quota_exactly() {
    let server = Server::start(config());
    let http = HttpClient::new(&server);
    let mut statuses = BTreeMap::new();
    for key in ["free-1", "paid-1", "paid-2"] {
        let mut answers = Vec::new();
        for _ in 0..32 {
            answers.push(http.get("/", Some(key)).await);
        }
        statuses.insert(key, (count(&answers, 200), count(&answers, 429)));
        let policy = answers[0].policies();
        if key.starts_with("paid-") {
            // 30 refilled in 4.5 s: 5 s, in which 33 refill.
            assert_eq!(policy, [("33-per-5s".to_owned(), 33, 5)]);
        } else {
            assert_eq!(policy, [("3-per-5s".to_owned(), 3, 5)]);
        }
    }
    assert_eq!(
        statuses,
        BTreeMap::from([
            ("free-1", (3, 29)),
            ("paid-1", (30, 2)),
            ("paid-2", (30, 2))
        ])
    );
}

#[tokio::test]
async fn two_bands_show_as_two_policies() {
    let server = Server::start(Config {
        free: Quota::new(Rate::per_second(2), 4).and(Rate::per_day(10), 10),
        ..config()
    });
    let http = HttpClient::new(&server);
    let mut answers = Vec::new();
    for _ in 0..5 {
        answers.push(http.get("/", Some("ann")).await);
    }
    assert_eq!(
        answers[0].policies(),
        [
            ("4-per-2s".to_owned(), 4, 2),
            ("10-per-86400s".to_owned(), 10, 86_400),
        ]
    );
    let limits: Vec<_> = answers.iter().map(|a| (a.status, a.limits())).collect();
    let l = |r1, t1, r2, t2| {
        vec![
            ("4-per-2s".to_owned(), r1, t1),
            ("10-per-86400s".to_owned(), r2, t2),
        ]
    };
    // A day's permit every 8 640 s.
    assert_eq!(
        limits,
        [
            (200, l(3, 1, 9, 8_640)),
            (200, l(2, 1, 8, 8_640)),
            (200, l(1, 1, 7, 8_640)),
            (200, l(0, 1, 6, 8_640)),
            (429, l(0, 1, 6, 8_640)),
        ]
    );
    assert_eq!(answers[4].header("retry-after"), "1");
    // Five more seconds: the first band is full again, the day's is not.
    server.advance(Duration::from_secs(5)).await;
    let later = http.get("/", Some("ann")).await;
    assert_eq!((later.status, later.limits()), (200, l(3, 1, 5, 8_635)));
}

#[tokio::test]
async fn a_client_cannot_pick_its_identity_through_x_forwarded_for() {
    let server = Server::start(config());
    let http = HttpClient::new(&server);
    // No proxy is trusted: every claimed address is the same client (the
    // peer, 127.0.0.1).
    let mut statuses = Vec::new();
    for i in 0..5 {
        let claim = format!("198.51.100.{i}");
        let a = http
            .get_with(
                "/",
                None,
                &[
                    ("x-forwarded-for", &claim),
                    ("forwarded", &format!("for={claim}")),
                ],
            )
            .await;
        statuses.push(a.status);
    }
    assert_eq!(statuses, [200, 200, 200, 429, 429]);
}

#[tokio::test]
async fn behind_a_trusted_proxy_each_forwarded_client_has_its_own_limit() {
    // The test's connections come from 127.0.0.1: trusted as a proxy, as
    // is a second one on 10.0.0.0/8.
    let server = Server::start_on(config(), &LOCAL, &["127.0.0.1/32", "10.0.0.0/8"]);
    let http = HttpClient::new(&server);
    // Two clients through two proxies (the leftmost claim is ignored).
    let mut a = Vec::new();
    let mut b = Vec::new();
    for _ in 0..4 {
        let chain = [("x-forwarded-for", "6.6.6.6, 198.51.100.4, 10.0.0.2")];
        a.push(http.get_with("/", None, &chain).await.status);
        let chain = [("x-forwarded-for", "198.51.100.5")];
        b.push(http.get_with("/", None, &chain).await.status);
    }
    assert_eq!(
        (a.as_slice(), b.as_slice()),
        (
            [200, 200, 200, 429].as_slice(),
            [200, 200, 200, 429].as_slice()
        )
    );
    // Twenty addresses of one IPv6 /64 are one client.
    let mut v6 = Vec::new();
    for i in 0..20 {
        let chain = format!("2001:db8:1:2::{i:x}");
        v6.push(
            http.get_with("/", None, &[("x-forwarded-for", &chain)])
                .await
                .status,
        );
    }
    assert_eq!(v6.iter().filter(|&&s| s == 200).count(), 3, "{v6:?}");
    // Garbage and zone ids neither panic nor make new clients.
    for chain in [
        "garbage",
        "fe80::1%eth0, 10.0.0.9",
        ",,,",
        "[::1]:80, unknown",
    ] {
        let a = http
            .get_with("/", None, &[("x-forwarded-for", chain)])
            .await;
        assert!(matches!(a.status, 200 | 429), "{chain}: {}", a.status);
    }
    assert!(server.local_stats().keys >= 4);
}

#[tokio::test]
async fn a_full_map_answers_503_not_429() {
    let server = Server::start_on(config(), &Backend::Local { max_keys: 1 }, &[]);
    let http = HttpClient::new(&server);
    assert_eq!(http.get("/", Some("ann")).await.status, 200);
    // Every slot holds an active key: bob is turned away, and not for his
    // own doing.
    let bob = http.get("/", Some("bob")).await;
    assert_eq!((bob.status, bob.header("retry-after")), (503, "1"));
    assert_eq!(bob.header("ratelimit"), "-");
    // Once ann's funnel has drained (1.5 s) and a sweep has run (the
    // background sweeper's work, off on this paused clock), bob gets in.
    server.advance(ms(1_500)).await;
    assert_eq!(server.sweep().await, 0);
    assert_eq!(http.get("/", Some("bob")).await.status, 200);
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
    assert_eq!(a.policies()[0].1, 3);
    assert_eq!(server.local_stats().granted, 3);
}

#[tokio::test]
async fn the_per_client_limit_answers_before_the_global_wait() {
    let server = Server::start(Config {
        free: Quota::new(Rate::per(2, Duration::from_secs(3)), 1),
        ..config()
    });
    let http = HttpClient::new(&server);
    assert_eq!(http.get("/expensive", Some("ann")).await.status, 200);
    // ann is over her own limit: refused at once, without taking (or
    // waiting for) the global token.
    let refused = http.get("/expensive", Some("ann")).await;
    assert_eq!(refused.summary(), (429, 0, 2, "2"));
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
        free: Quota::new(Rate::per(1, Duration::from_secs(20)), 3),
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
    let summaries: Vec<_> = answers.iter().map(Answer::summary).collect();
    // 20 s until one more (less the milliseconds real time took: still 20).
    assert_eq!(
        summaries,
        [
            (200, 2, 20, "-"),
            (200, 1, 20, "-"),
            (200, 0, 20, "-"),
            (429, 0, 20, "20"),
            (429, 0, 20, "20"),
        ]
    );
    assert!(
        answers
            .iter()
            .all(|a| a.policies() == [("3-per-60s".to_owned(), 3, 60)])
    );
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
#[path = "support/redis_cluster.rs"]
mod redis_cluster;

/// Two replicas of the service share each client's limit through a Redis
/// Cluster (three masters): the same answers again, for clients whose keys
/// live on different masters.
#[cfg(feature = "redis")]
#[tokio::test]
async fn two_replicas_share_a_limit_through_a_redis_cluster() {
    let Some(cluster) = redis_cluster::RedisCluster::start("axum_two_replicas_on_a_cluster") else {
        return;
    };
    let backend = Backend::Cluster {
        nodes: cluster.urls(),
        prefix: "replicas:".to_owned(),
    };
    let (a, b) = (
        Server::start_on(slow_config(), &backend, &[]),
        Server::start_on(slow_config(), &backend, &[]),
    );
    burst_then_refused(&[&a, &b]).await;
    // Clients on every master: each its own limit.
    let http = HttpClient::new(&a);
    let mut masters = std::collections::HashSet::new();
    for i in 0..12 {
        let key = format!("client-{i}");
        masters.insert(cluster.master_of_slot(cluster.slot(&format!("replicas:key:{key}"))));
        assert_eq!(http.get("/", Some(&key)).await.status, 200, "{key}");
    }
    assert_eq!(masters.len(), 3, "the clients' keys span every master");
}

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
        Server::start_on(slow_config(), &backend, &[]),
        Server::start_on(slow_config(), &backend, &[]),
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
        &shared(&redis, "policy:", FailurePolicy::Closed),
        &[],
    );
    let open = Server::start_on(
        slow_config(),
        &shared(&redis, "policy:", FailurePolicy::Open),
        &[],
    );
    let (closed_http, open_http) = (HttpClient::new(&closed), HttpClient::new(&open));
    assert_eq!(closed_http.get("/", Some("ann")).await.status, 200);
    redis.kill();
    let refused = closed_http.get("/", Some("ann")).await;
    assert_eq!((refused.status, refused.header("retry-after")), (503, "1"));
    assert_eq!(open_http.get("/", Some("ann")).await.status, 200);
}

/// `/metrics`, scraped over HTTP after traffic, counts what the clients
/// saw: the per-client map's grants, refusals for the rate, the client the
/// full map turned away, its keys; the global bucket's grants and the one
/// request that waited half a second for it.
#[tokio::test]
async fn the_metrics_scraped_over_http_match_the_traffic() {
    #![expect(
        clippy::float_cmp,
        reason = "counts, and a sum of 500 ms, rendered exactly"
    )]
    let server = Server::start_on(config(), &Backend::Local { max_keys: 2 }, &[]);
    let http = HttpClient::new(&server);
    let mut all = Vec::new();
    for _ in 0..5 {
        all.push(http.get("/", Some("ann")).await);
    }
    for _ in 0..4 {
        all.push(http.get("/", Some("bob")).await);
    }
    // A third client: the map (`max_keys` 2) is full of active keys.
    all.push(http.get("/", Some("carl")).await);
    // 1.5 s on, ann and bob have a permit each; `/expensive` lets one go
    // at once (a burst of 1) and the next after 0.5 s (2 per second).
    server.advance(ms(1500)).await;
    all.push(http.get("/expensive", Some("ann")).await);
    all.push(http.get("/expensive", Some("bob")).await);
    let seen = (count(&all, 200), count(&all, 429), count(&all, 503));
    assert_eq!(seen, (8, 3, 1));

    let m = scrape(&http).await;
    let get = |series: &str| {
        m.get(series)
            .copied()
            .unwrap_or_else(|| panic!("no {series} in {m:#?}"))
    };
    let requests = |limiter: &str, outcome: &str| {
        get(&format!(
            "tokio_ratelimit_requests_total{{limiter=\"{limiter}\",outcome=\"{outcome}\"}}"
        ))
    };
    assert_eq!(requests("per_client", "granted"), 8.0);
    assert_eq!(requests("per_client", "limited"), 3.0);
    assert_eq!(requests("per_client", "unavailable"), 1.0);
    assert_eq!(requests("per_client", "too_large"), 0.0);
    assert_eq!(
        get("tokio_ratelimit_permits_granted_total{limiter=\"per_client\"}"),
        8.0
    );
    assert_eq!(get("tokio_ratelimit_keys{limiter=\"per_client\"}"), 2.0);
    assert_eq!(requests("expensive", "granted"), 2.0);
    assert_eq!(requests("expensive", "limited"), 0.0);
    assert_eq!(
        get("tokio_ratelimit_permits_granted_total{limiter=\"expensive\"}"),
        2.0
    );
    assert_eq!(get("tokio_ratelimit_waiting{limiter=\"expensive\"}"), 0.0);
    assert_eq!(
        get("tokio_ratelimit_wait_seconds_count{limiter=\"expensive\"}"),
        1.0
    );
    assert_eq!(
        get("tokio_ratelimit_wait_seconds_sum{limiter=\"expensive\"}"),
        0.5
    );
    // The map's own account agrees.
    let stats = server.local_stats();
    assert_eq!((stats.granted, stats.limited, stats.keys), (8, 3, 2));
}
