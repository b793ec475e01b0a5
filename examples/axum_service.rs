//! A small HTTP service with rate limits: per client, and for the whole
//! server in front of an expensive route.
//!
//! ```sh
//! cargo run --example axum_service -- 3000   # or PORT=3000; 3000 by default
//! curl -i -H 'x-client-id: ann' http://127.0.0.1:3000/
//!
//! # The same service, its per-client limit shared by every replica through Redis:
//! REDIS_URL=redis://127.0.0.1:6379/ cargo run --features redis --example axum_service
//! ```
//!
//! * Every route is limited **per client** through `KeyedRateLimitLayer`,
//!   by a [`KeyedFunnel`](tokio_ratelimit::keyed::KeyedFunnel) in this
//!   process or — with `REDIS_URL` set (and the `redis` feature) — by a
//!   [`RedisFunnel`](tokio_ratelimit::redis::RedisFunnel) that every
//!   replica shares. The layer and the handlers are the same code either
//!   way: the limiter is an `Arc<dyn AsyncKeyedLimiter>` picked at start.
//!   A client is its `x-client-id` header, or else its peer IP address. (A
//!   real service would take the id from authentication: a client that
//!   picks its own id can pick a new one.) Over the limit, the answer is
//!   `429 Too Many Requests` at once; a shared limit that cannot be decided
//!   (Redis down, failing closed) is `503 Service Unavailable`, never 429.
//! * `GET /expensive` is also limited **for the whole server** by a
//!   [`TokenBucket`](tokio_ratelimit::TokenBucket) through `RateLimitLayer`:
//!   requests beyond its rate wait their turn (backpressure), they are not
//!   refused.
//!
//! # Headers
//!
//! On every response of a limited route, after the IETF draft
//! `draft-ietf-httpapi-ratelimit-headers` (the separate-fields form), for the
//! client's funnel as the response leaves:
//!
//! * `RateLimit-Limit` — the per-client burst: how many requests a client
//!   with a clean slate can make at once (the funnel's capacity).
//! * `RateLimit-Remaining` — how many more requests the client could make
//!   right now, without waiting (whole units of free room).
//! * `RateLimit-Reset` — seconds until the client's quota is whole again
//!   (its funnel has drained), rounded up; `0` when it already is.
//!
//! And on a `429` only:
//!
//! * `Retry-After` — seconds until the same request can succeed, rounded up:
//!   never `0` while limited, so a client that waits exactly that long is
//!   admitted.

use std::error::Error;
use std::net::SocketAddr;
use std::time::Duration;

use axum::Router;
use axum::error_handling::HandleErrorLayer;
use axum::extract::{ConnectInfo, Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use std::sync::Arc;

use tokio::net::TcpListener;
use tokio_ratelimit::keyed::{AsyncKeyedLimiter, KeyedFunnel};
use tokio_ratelimit::tower::{BoxError, KeyedRateLimitLayer, RateLimitLayer, RateLimited};
use tokio_ratelimit::{ConfigError, Rate, TokenBucket};
use tower::ServiceBuilder;

/// The limits, as numbers.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Config {
    /// How fast each client's allowance comes back.
    pub(crate) per_client_rate: Rate,
    /// How many requests a client can make at once.
    pub(crate) per_client_burst: u32,
    /// The whole server's rate on `/expensive`.
    pub(crate) expensive_rate: Rate,
    /// How many `/expensive` requests can run at once before the rate
    /// applies.
    pub(crate) expensive_burst: u32,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            per_client_rate: Rate::per_second(1),
            per_client_burst: 5,
            expensive_rate: Rate::per_second(2),
            expensive_burst: 2,
        }
    }
}

/// The per-client limit, wherever it lives: a map in this process or a
/// limit shared through Redis.
pub(crate) type PerClient = Arc<dyn AsyncKeyedLimiter<Key = String>>;

/// The limiters the service uses (cheap handles).
#[derive(Clone)]
pub(crate) struct Limits {
    /// Per client (see [`client_key`]).
    pub(crate) per_client: PerClient,
    /// For the whole server, on `/expensive`.
    pub(crate) expensive: TokenBucket,
}

impl Limits {
    /// The limiters of one process (inside a tokio runtime: the token
    /// bucket spawns its actor there), with the per-client map given.
    pub(crate) fn with(per_client: PerClient, config: &Config) -> Result<Limits, ConfigError> {
        Ok(Limits {
            per_client,
            expensive: TokenBucket::builder()
                .rate(config.expensive_rate)
                .capacity(config.expensive_burst)
                .build()?,
        })
    }

    /// Per client in this process.
    pub(crate) fn local(config: &Config) -> Result<Limits, ConfigError> {
        let per_client: KeyedFunnel<String> = KeyedFunnel::builder()
            .rate(config.per_client_rate)
            .capacity(config.per_client_burst)
            .build()?;
        Limits::with(Arc::new(per_client), config)
    }

    /// Per client shared through the Redis at `url` (every replica that
    /// uses the same server and prefix shares each client's limit).
    #[cfg(feature = "redis")]
    pub(crate) async fn shared(config: &Config, url: &str) -> Result<Limits, Box<dyn Error>> {
        let per_client = tokio_ratelimit::redis::RedisFunnel::builder(url)
            .rate(config.per_client_rate)
            .capacity(config.per_client_burst)
            .prefix("axum_service:")
            .build()
            .await?;
        Ok(Limits::with(Arc::new(per_client), config)?)
    }
}

/// The service. Serve it with connect info (see [`serve`]) so that clients
/// without an id are told apart by address.
pub(crate) fn app(limits: Limits) -> Router {
    let expensive = get(expensive).layer(
        ServiceBuilder::new()
            .layer(HandleErrorLayer::new(limiter_failed))
            .layer(RateLimitLayer::new(limits.expensive)),
    );
    Router::new()
        .route("/", get(|| async { "hello\n" }))
        .route("/expensive", expensive)
        // `Router::layer` wraps each route: its routes are always ready, so
        // the client's limit is checked on arrival, before `/expensive`
        // waits for the global one.
        .layer(
            ServiceBuilder::new()
                .layer(middleware::from_fn_with_state(
                    limits.per_client.clone(),
                    quota_headers,
                ))
                .layer(HandleErrorLayer::new(too_many_requests))
                .layer(KeyedRateLimitLayer::new(limits.per_client, client_key)),
        )
}

/// Serves [`app`] on `listener` until the task is dropped.
///
/// # Errors
///
/// If the listener fails for good.
pub(crate) async fn serve(listener: TcpListener, limits: Limits) -> std::io::Result<()> {
    let app = app(limits).into_make_service_with_connect_info::<SocketAddr>();
    axum::serve(listener, app).await
}

/// Who a request counts against: its `x-client-id`, or else its peer IP.
pub(crate) fn client_key(request: &Request) -> String {
    if let Some(id) = request
        .headers()
        .get("x-client-id")
        .and_then(|v| v.to_str().ok())
    {
        return format!("id:{id}");
    }
    match request.extensions().get::<ConnectInfo<SocketAddr>>() {
        Some(ConnectInfo(peer)) => format!("ip:{}", peer.ip()),
        None => "unknown".to_owned(),
    }
}

/// A duration in whole seconds, rounded up.
pub(crate) fn seconds_up(duration: Duration) -> u64 {
    duration.as_secs() + u64::from(duration.subsec_nanos() > 0)
}

async fn expensive() -> &'static str {
    "expensive result\n"
}

/// `RateLimit-*` headers for the client's funnel, on every response (when
/// the limit can be looked at).
async fn quota_headers(
    State(per_client): State<PerClient>,
    request: Request,
    next: Next,
) -> Response {
    let key = client_key(&request);
    let mut response = next.run(request).await;
    if let Ok(Some(peek)) = per_client.peek(&key, 1).await {
        let headers = response.headers_mut();
        let fewest = peek.bands().min_by_key(|b| b.available);
        let limit = peek.bands().map(|b| b.band.capacity()).min();
        let reset = peek.bands().map(|b| b.full_in).max();
        if let (Some(band), Some(limit), Some(reset)) = (fewest, limit, reset) {
            headers.insert("ratelimit-limit", limit.into());
            headers.insert("ratelimit-remaining", band.available.into());
            headers.insert("ratelimit-reset", seconds_up(reset).into());
        }
    }
    response
}

/// The per-client layer's refusal: 429 with `Retry-After`.
async fn too_many_requests(error: BoxError) -> Response {
    match error.downcast::<RateLimited<String>>() {
        Ok(limited) => {
            let retry_after = seconds_up(limited.retry_after).max(1);
            let mut response =
                (StatusCode::TOO_MANY_REQUESTS, "too many requests\n").into_response();
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(retry_after));
            response
        }
        Err(error) => limiter_failed(error).await,
    }
}

/// Any other limiter error — a shared limit that could not be decided (its
/// store down, failing closed), a limiter closed at shutdown: 503, with a
/// `Retry-After` of a second (the service's guess: the limiter cannot know
/// when its store is back).
async fn limiter_failed(error: BoxError) -> Response {
    let mut response = (StatusCode::SERVICE_UNAVAILABLE, format!("{error}\n")).into_response();
    response
        .headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from(1));
    response
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn Error>> {
    let port: u16 = match std::env::args()
        .nth(1)
        .or_else(|| std::env::var("PORT").ok())
    {
        Some(port) => port.parse()?,
        None => 3000,
    };
    let config = Config::default();
    let (limits, place) = match std::env::var("REDIS_URL") {
        #[cfg(feature = "redis")]
        Ok(url) => (
            Limits::shared(&config, &url).await?,
            format!("shared through {url}"),
        ),
        #[cfg(not(feature = "redis"))]
        Ok(_) => {
            return Err("REDIS_URL needs the redis feature: cargo run --features redis …".into());
        }
        Err(_) => (Limits::local(&config)?, "in this process".to_owned()),
    };
    let listener = TcpListener::bind(("127.0.0.1", port)).await?;
    println!(
        "listening on http://{}: per client {} (bursts of {}, {place}), /expensive {} for everyone",
        listener.local_addr()?,
        config.per_client_rate,
        config.per_client_burst,
        config.expensive_rate,
    );
    serve(listener, limits).await?;
    Ok(())
}
