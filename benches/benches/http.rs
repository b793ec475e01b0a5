//! The `http` feature's `HttpRateLimitLayer`, measured: requests per second
//! and latency of a minimal axum handler with and without the layer, over
//! loopback, in one run.
//!
//! ```sh
//! cargo bench -p tokio-ratelimit-benches --bench http
//! BENCH_QUICK=1 cargo bench -p tokio-ratelimit-benches --bench http   # a smoke test
//! BENCH_SECS=3 BENCH_ROUNDS=7 cargo bench -p tokio-ratelimit-benches --bench http
//! ```
//!
//! The handler is `get(|| async { "ok" })`, served by `axum::serve` (HTTP/1,
//! `TCP_NODELAY`) on its own multi-thread runtime (2 workers). A hyper
//! client in the same process, on a second runtime (2 workers), keeps
//! `CONNECTIONS` keep-alive connections busy, one request in flight on
//! each, every request carrying an `x-api-key` header taken in turn from
//! `KEYS` distinct values — the same requests for every configuration:
//!
//! * **none**: the bare router;
//! * **Global**: `HttpRateLimitLayer` over a `KeyedFunnel<ClientKey>` with
//!   the `Global` extractor (one key);
//! * **API key**: the layer with `Header::new("x-api-key")`, the map holding
//!   all `KEYS` keys (filled before the first round);
//! * **API key + legacy**: the same with `legacy_headers(true)`.
//!
//! Every request is allowed (the quotas are far from their limits, and the
//! keys are never drained, so never swept): what is measured is the cost of
//! the decision and the headers, not of a 429.
//!
//! The configurations alternate in rounds (`BENCH_ROUNDS`, default 5, of
//! `BENCH_SECS`, default 2 s, each after a 0.25 s warm-up on fresh
//! connections), so that the machine's noise falls on all alike. Quoted:
//! medians over the rounds of requests per second, of the p50 and p99
//! latency (request sent to body received, at the client), and of the
//! server's CPU time per request (the CPU time of the server runtime's
//! worker threads, from `/proc/self/task/*/schedstat`: the layer's cost
//! undiluted by the client's, which shares the two cores). Overheads are
//! medians of the per-round ratios to **none** of the same round.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::routing::get;
use axum::serve::ListenerExt as _;
use http_body_util::{BodyExt as _, Empty};
use hyper::body::Bytes;
use hyper::header::{HOST, HeaderValue};
use hyper::{Request, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::{TcpListener, TcpStream};
use tokio_ratelimit::Rate;
use tokio_ratelimit::http::{ClientKey, Global, Header, HttpRateLimitLayer};
use tokio_ratelimit::keyed::KeyedFunnel;
use tokio_ratelimit_benches::{
    Table, load_average, machine, median, quantile, ratio_line, today_utc,
};

/// Keep-alive connections, one request in flight on each.
const CONNECTIONS: usize = 32;
/// Distinct `x-api-key` values, sent in turn.
const KEYS: usize = 100_000;
/// The target: at most this much more time per request with the layer.
const TARGET: f64 = 0.10;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Config {
    None,
    Global,
    ApiKey,
    ApiKeyLegacy,
}

impl Config {
    const ALL: [Config; 4] = [
        Config::None,
        Config::Global,
        Config::ApiKey,
        Config::ApiKeyLegacy,
    ];

    fn name(self) -> &'static str {
        match self {
            Config::None => "(a) none",
            Config::Global => "(b) Global (one key)",
            Config::ApiKey => "(c) Header(\"x-api-key\"), 100 000 keys",
            Config::ApiKeyLegacy => "(d) (c) + legacy_headers(true)",
        }
    }
}

/// The handler, alone or behind the layer. Built inside the server's
/// runtime (the maps' sweepers run there).
fn app(config: Config, keys: &[HeaderValue]) -> Router {
    let router = Router::new().route("/", get(|| async { "ok" }));
    match config {
        Config::None => router,
        Config::Global => {
            // One key takes every request: 10⁹/s with room for 10⁹.
            let limiter: KeyedFunnel<ClientKey> = KeyedFunnel::builder()
                .rate(Rate::per_second(1_000_000_000))
                .capacity(1_000_000_000)
                .build()
                .unwrap();
            router.layer(HttpRateLimitLayer::new(limiter, Global))
        }
        Config::ApiKey | Config::ApiKeyLegacy => {
            // A key is asked a few dozen times in a run: room for 10⁶, and
            // a leak of 1 an hour so that no key drains (and is swept)
            // between its visits.
            let limiter: KeyedFunnel<ClientKey> = KeyedFunnel::builder()
                .rate(Rate::per_hour(1))
                .capacity(1_000_000)
                .build()
                .unwrap();
            for key in keys {
                let key = ClientKey::Value(key.to_str().unwrap().to_owned());
                limiter.try_acquire_many(&key, 1).unwrap();
            }
            let layer = HttpRateLimitLayer::new(limiter, Header::new("x-api-key"))
                .legacy_headers(config == Config::ApiKeyLegacy);
            router.layer(layer)
        }
    }
}

/// CPU time of some threads of this process, in ns (the first field of
/// `/proc/self/task/<tid>/schedstat`).
fn cpu_ns(tids: &[i32]) -> u64 {
    tids.iter()
        .map(|tid| {
            std::fs::read_to_string(format!("/proc/self/task/{tid}/schedstat"))
                .ok()
                .and_then(|s| s.split_whitespace().next()?.parse::<u64>().ok())
                .unwrap_or(0)
        })
        .sum()
}

/// One round of one configuration.
struct Sample {
    rps: f64,
    p50_us: f64,
    p99_us: f64,
    server_us: f64,
}

/// Drives the server at `addr` for `warm` + `run` on `CONNECTIONS` fresh
/// keep-alive connections.
async fn drive(
    addr: std::net::SocketAddr,
    keys: Arc<[HeaderValue]>,
    server_tids: &[i32],
    warm: Duration,
    run: Duration,
) -> Sample {
    let begin = tokio::time::Instant::now();
    let (start, end) = (begin + warm, begin + warm + run);
    let (start_std, end_std) = (start.into_std(), end.into_std());
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::with_capacity(CONNECTIONS);
    for c in 0..CONNECTIONS {
        let keys = Arc::clone(&keys);
        let stop = Arc::clone(&stop);
        tasks.push(tokio::spawn(async move {
            let stream = TcpStream::connect(addr).await.unwrap();
            stream.set_nodelay(true).unwrap();
            let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
                .await
                .unwrap();
            tokio::spawn(conn);
            let host = HeaderValue::from_str(&addr.to_string()).unwrap();
            let mut latencies: Vec<u32> = Vec::with_capacity(1 << 16);
            let mut i = c;
            while !stop.load(Ordering::Relaxed) {
                let request = Request::get("/")
                    .header(HOST, host.clone())
                    .header("x-api-key", keys[i % keys.len()].clone())
                    .body(Empty::<Bytes>::new())
                    .unwrap();
                i += CONNECTIONS;
                sender.ready().await.unwrap();
                let sent = Instant::now();
                let response = sender.send_request(request).await.unwrap();
                assert_eq!(response.status(), StatusCode::OK, "a request was refused");
                response.into_body().collect().await.unwrap();
                let done = Instant::now();
                if sent >= start_std && done < end_std {
                    let ns = (done - sent).as_nanos();
                    latencies.push(u32::try_from(ns).unwrap_or(u32::MAX));
                }
            }
            latencies
        }));
    }
    tokio::time::sleep_until(start).await;
    let cpu_start = cpu_ns(server_tids);
    tokio::time::sleep_until(end).await;
    let cpu_end = cpu_ns(server_tids);
    stop.store(true, Ordering::Relaxed);
    let mut all: Vec<u32> = Vec::new();
    for task in tasks {
        all.extend(task.await.unwrap());
    }
    all.sort_unstable();
    #[expect(clippy::cast_precision_loss, reason = "counts that fit")]
    let n = all.len().max(1) as f64;
    #[expect(clippy::cast_precision_loss, reason = "ns that fit")]
    let server_us = (cpu_end - cpu_start) as f64 / 1_000.0 / n;
    Sample {
        rps: n / run.as_secs_f64(),
        p50_us: f64::from(quantile(&all, 0.5)) / 1_000.0,
        p99_us: f64::from(quantile(&all, 0.99)) / 1_000.0,
        server_us,
    }
}

fn settings() -> (usize, Duration) {
    let quick = std::env::var_os("BENCH_QUICK").is_some_and(|v| v != "0");
    let env = |name: &str| std::env::var(name).ok().and_then(|s| s.parse::<f64>().ok());
    let rounds = env("BENCH_ROUNDS").map_or(if quick { 2 } else { 5 }, |r| {
        #[expect(
            clippy::cast_possible_truncation,
            clippy::cast_sign_loss,
            reason = "a small count"
        )]
        let r = r.max(1.0) as usize;
        r
    });
    let secs = env("BENCH_SECS").unwrap_or(if quick { 0.5 } else { 2.0 });
    (rounds, Duration::from_secs_f64(secs))
}

fn main() {
    let (rounds, run) = settings();
    let warm = Duration::from_millis(250);
    let server_tids = Arc::new(Mutex::new(Vec::new()));
    let tids = Arc::clone(&server_tids);
    let server = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("http-server")
        .on_thread_start(move || {
            // SAFETY: gettid has no preconditions.
            tids.lock().unwrap().push(unsafe { libc::gettid() });
        })
        .enable_all()
        .build()
        .unwrap();
    let client = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("http-client")
        .enable_all()
        .build()
        .unwrap();

    let keys: Arc<[HeaderValue]> = (0..KEYS)
        .map(|i| HeaderValue::from_str(&format!("key-{i:06}")).unwrap())
        .collect();
    // One server per configuration, all listening throughout (an idle one
    // costs nothing); the rounds switch which one the client drives.
    let addrs: Vec<std::net::SocketAddr> = Config::ALL
        .iter()
        .map(|&config| {
            server.block_on(async {
                let app = app(config, &keys);
                let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
                let addr = listener.local_addr().unwrap();
                let listener = listener.tap_io(|tcp| {
                    let _ = tcp.set_nodelay(true);
                });
                tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
                addr
            })
        })
        .collect();
    let tids: Vec<i32> = server_tids.lock().unwrap().clone();
    assert!(!tids.is_empty(), "the server's worker threads started");

    println!("## tokio-ratelimit benchmarks: the HTTP layer\n");
    println!("- date: {} (UTC)", today_utc());
    println!("- machine: {}", machine());
    println!("- command: `cargo bench -p tokio-ratelimit-benches --bench http`");
    println!(
        "- settings: {rounds} rounds of {:.1} s per configuration (after {} ms of warm-up each), \
         configurations alternating; {CONNECTIONS} keep-alive connections, one request in flight \
         on each; {KEYS} distinct x-api-key values in turn; server and client runtimes 2 workers each",
        run.as_secs_f64(),
        warm.as_millis()
    );
    println!("- load average (1 min) at start: {}", load_average());

    let mut samples: Vec<Vec<Sample>> = Config::ALL.iter().map(|_| Vec::new()).collect();
    for _ in 0..rounds {
        for (i, addr) in addrs.iter().enumerate() {
            let sample = client.block_on(drive(*addr, Arc::clone(&keys), &tids, warm, run));
            samples[i].push(sample);
        }
    }
    println!("- load average (1 min) at end: {}", load_average());

    let mut t = Table::new(
        format!(
            "HTTP rate-limit layer: a minimal axum handler over loopback ({CONNECTIONS} connections)"
        ),
        &[
            "configuration",
            "requests/s (min–max)",
            "p50 µs",
            "p99 µs",
            "server CPU µs/request",
            "time/request vs (a)",
            "server CPU vs (a)",
        ],
    );
    let base = &samples[0];
    let mut overheads = Vec::new();
    for (config, s) in Config::ALL.iter().zip(&samples) {
        let of = |f: fn(&Sample) -> f64| median(&s.iter().map(f).collect::<Vec<_>>());
        let rps: Vec<f64> = s.iter().map(|x| x.rps).collect();
        let (min, max) = rps
            .iter()
            .fold((f64::MAX, f64::MIN), |(lo, hi), &r| (lo.min(r), hi.max(r)));
        // Per round: the time per request over that of (a) in the same round.
        let slower = median(
            &s.iter()
                .zip(base)
                .map(|(x, b)| b.rps / x.rps)
                .collect::<Vec<_>>(),
        );
        let cpu = median(
            &s.iter()
                .zip(base)
                .map(|(x, b)| x.server_us / b.server_us)
                .collect::<Vec<_>>(),
        );
        overheads.push((*config, slower - 1.0, cpu - 1.0));
        t.row(vec![
            config.name().into(),
            format!("{:.0} ({min:.0}–{max:.0})", median(&rps)),
            format!("{:.0}", of(|x| x.p50_us)),
            format!("{:.0}", of(|x| x.p99_us)),
            format!("{:.2}", of(|x| x.server_us)),
            format!("{slower:.3}"),
            format!("{cpu:.3}"),
        ]);
    }
    t.note(
        "requests/s, latencies and server CPU: medians over the rounds; the two ratios: medians \
         of the per-round ratios to (a) (requests/s of (a) ÷ of the row: the time per request)",
    );
    t.note(
        "server CPU: the server runtime's worker threads only; the client, in the same process, \
         takes about as much again, so requests/s dilutes the layer's share",
    );
    for (config, slower, cpu) in overheads.into_iter().skip(1) {
        let line = ratio_line(
            &format!("{}: time per request ÷ (a)'s", config.name()),
            1.0 + slower,
            "≤",
            1.0 + TARGET,
        );
        t.note(format!(
            "{line}; server CPU per request {:+.1} %",
            cpu * 100.0
        ));
    }
    t.print();
}
