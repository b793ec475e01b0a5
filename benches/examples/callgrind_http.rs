//! A fixed workload of the `http` layer for `valgrind --tool=callgrind`:
//! the axum service of the `http` bench called in-process with
//! `tower::ServiceExt::oneshot` — no sockets, no HTTP parsing — so that the
//! instructions counted are the router's, the handler's and the layer's:
//!
//! ```text
//! cargo build --release -p tokio-ratelimit-benches --example callgrind_http
//! for c in none global key legacy; do for n in 0 100000; do
//!   valgrind --tool=callgrind --callgrind-out-file=cg.$c.$n \
//!     target/release/examples/callgrind_http $c $n
//! done; done
//! callgrind_annotate --inclusive=yes cg.key.100000 | head -60
//! ```
//!
//! Arguments: `none|global|key|legacy` (as the bench's (a)–(d)) and a
//! request count N. Every request carries an `x-api-key` from 100 000
//! values in turn; `key` and `legacy` first send one request per key (in
//! every run, N = 0 included), so the N measured requests find their keys
//! held. Instructions per request: (total of run N − total of run 0) / N.
//! The maps are built without the background sweeper, so that no timer
//! fires during the run and the counts do not depend on how long valgrind
//! takes.

use axum::Router;
use axum::body::Body;
use axum::routing::get;
use http_body_util::BodyExt as _;
use tokio_ratelimit::Rate;
use tokio_ratelimit::http::{ClientKey, Global, Header, HttpRateLimitLayer};
use tokio_ratelimit::keyed::KeyedFunnel;
use tower::ServiceExt as _;

const KEYS: usize = 100_000;

fn main() {
    let mut args = std::env::args().skip(1);
    let which = args.next().unwrap_or_else(|| "key".into());
    let n: usize = args.next().map_or(100_000, |s| s.parse().expect("a count"));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let router = Router::new().route("/", get(|| async { "ok" }));
    let (app, warm) = match which.as_str() {
        "none" => (router, false),
        "global" => {
            let limiter: KeyedFunnel<ClientKey> = KeyedFunnel::builder()
                .rate(Rate::per_second(1_000_000_000))
                .capacity(1_000_000_000)
                .background_sweep(false)
                .build()
                .unwrap();
            (
                router.layer(HttpRateLimitLayer::new(limiter, Global)),
                false,
            )
        }
        "key" | "legacy" => {
            let limiter: KeyedFunnel<ClientKey> = KeyedFunnel::builder()
                .rate(Rate::per_hour(1))
                .capacity(1_000_000)
                .background_sweep(false)
                .build()
                .unwrap();
            let layer = HttpRateLimitLayer::new(limiter, Header::new("x-api-key"))
                .legacy_headers(which == "legacy");
            (router.layer(layer), true)
        }
        other => panic!("unknown configuration {other} (none|global|key|legacy)"),
    };
    let keys: Vec<String> = (0..KEYS).map(|i| format!("key-{i:06}")).collect();
    let mut ok = 0usize;
    rt.block_on(async {
        let call = |i: usize| {
            let request = axum::http::Request::get("/")
                .header("x-api-key", keys[i % KEYS].as_str())
                .body(Body::empty())
                .unwrap();
            let app = app.clone();
            async move {
                let response = app.oneshot(request).await.unwrap();
                let status = response.status();
                response.into_body().collect().await.unwrap();
                status.is_success()
            }
        };
        if warm {
            for i in 0..KEYS {
                assert!(call(i).await, "a request was refused");
            }
        }
        for i in 0..n {
            ok += usize::from(call(i).await);
        }
    });
    println!("{which}: {ok} of {n} requests answered 2xx");
}
