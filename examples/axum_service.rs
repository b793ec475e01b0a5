//! A small HTTP service with rate limits: per client with a free and a paid
//! tier, and for the whole server in front of an expensive route.
//!
//! ```sh
//! cargo run --example axum_service -- 3000   # or PORT=3000; 3000 by default
//! curl -i http://127.0.0.1:3000/                          # free, by address
//! curl -i -H 'x-api-key: paid-ann' http://127.0.0.1:3000/ # paid, by API key
//! curl http://127.0.0.1:3000/metrics                       # Prometheus's text format
//!
//! # The same service, its per-client limit shared by every replica through Redis:
//! REDIS_URL=redis://127.0.0.1:6379/ cargo run --features redis --example axum_service
//! # Behind a proxy on 10.0.0.0/8 that sets X-Forwarded-For:
//! TRUSTED_PROXIES=10.0.0.0/8 cargo run --example axum_service
//! ```
//!
//! * Every route is limited **per client** by one
//!   [`HttpRateLimitLayer`]: a client is its `x-api-key` (keys starting
//!   with `paid-` get the paid tier; a real service would look its keys
//!   up), or else its address — the peer's, or behind trusted proxies the
//!   one they forwarded for (IPv6 by /64). The limiter is a
//!   [`KeyedFunnel`](tokio_ratelimit::keyed::KeyedFunnel) in this process
//!   or, with `REDIS_URL` set (and the `redis` feature), a
//!   [`RedisFunnel`](tokio_ratelimit::redis::RedisFunnel) every replica
//!   shares: the same layer either way (`Arc<dyn AsyncKeyedLimiter>`).
//!   Over the limit: `429` with `Retry-After`; a limit that cannot be
//!   decided (Redis down, failing closed): `503`, never 429. Every answer
//!   carries `RateLimit-Policy` and `RateLimit` (one item per band).
//! * `GET /metrics` (not limited) serves the limiters' metrics in
//!   Prometheus's text format: the `metrics` feature records through the
//!   `metrics` facade, here into metrics-exporter-prometheus's recorder,
//!   installed before the limiters (named `per_client` and `expensive`) are
//!   built. See [`tokio_ratelimit::metrics`] for the series.
//! * `GET /expensive` is also limited **for the whole server** by a
//!   [`TokenBucket`](tokio_ratelimit::TokenBucket) through `RateLimitLayer`:
//!   requests beyond its rate wait their turn (backpressure), they are not
//!   refused.

use std::error::Error;
use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::error_handling::HandleErrorLayer;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use tokio::net::TcpListener;
use tokio_ratelimit::http::{ClientIp, ClientKey, Header, HttpRateLimitLayer, KeyExtractor};
use tokio_ratelimit::keyed::{AsyncKeyedLimiter, KeyedFunnel};
use tokio_ratelimit::tower::{BoxError, RateLimitLayer};
use tokio_ratelimit::{ConfigError, Quota, Rate, TokenBucket};
use tower::ServiceBuilder;

/// The limits, as numbers.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Config {
    /// Each free client's quota.
    pub(crate) free: Quota,
    /// Each paid client's.
    pub(crate) paid: Quota,
    /// The whole server's rate on `/expensive`.
    pub(crate) expensive_rate: Rate,
    /// How many `/expensive` requests can run at once before the rate
    /// applies.
    pub(crate) expensive_burst: u32,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            // 1 per second with bursts of 5, and 1 000 a day; ten times that.
            free: Quota::new(Rate::per_second(1), 5).and(Rate::per_day(1_000), 1_000),
            paid: Quota::new(Rate::per_second(10), 50).and(Rate::per_day(10_000), 10_000),
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
    /// Per client (see [`app`]).
    pub(crate) per_client: PerClient,
    /// For the whole server, on `/expensive`.
    pub(crate) expensive: TokenBucket,
    /// What `/metrics` renders: the recorder the limiters (named
    /// `per_client` and `expensive`) record into, if one was installed
    /// before they were built.
    pub(crate) metrics: Option<PrometheusHandle>,
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
                .name("expensive")
                .build()?,
            metrics: None,
        })
    }

    /// Per client in this process: both tiers in one map.
    pub(crate) fn local(config: &Config) -> Result<Limits, ConfigError> {
        let per_client: KeyedFunnel<String> = KeyedFunnel::builder()
            .quota(config.free)
            .tier(config.paid)
            .name("per_client")
            .build()?;
        Limits::with(Arc::new(per_client), config)
    }

    /// Per client shared through the Redis at `url` (every replica that
    /// uses the same server and prefix shares each client's limit; the tier
    /// goes with each call).
    #[cfg(feature = "redis")]
    pub(crate) async fn shared(config: &Config, url: &str) -> Result<Limits, Box<dyn Error>> {
        let per_client = tokio_ratelimit::redis::RedisFunnel::builder(url)
            .quota(config.free)
            .prefix("axum_service:")
            .name("per_client")
            .build()
            .await?;
        Ok(Limits::with(Arc::new(per_client), config)?)
    }
}

/// Who a request is: its API key, else its address (`trusted` proxies'
/// forwarding headers read, nobody else's).
pub(crate) fn clients(trusted: &[String]) -> Result<impl KeyExtractor, Box<dyn Error>> {
    Ok(Header::new("x-api-key").or(ClientIp::new().trust(trusted)?))
}

/// The service. Serve it with connect info (see [`serve`]) so that clients
/// without an API key are told apart by address.
pub(crate) fn app(limits: Limits, config: &Config, clients: impl KeyExtractor) -> Router {
    let paid = config.paid;
    let per_client = HttpRateLimitLayer::new(limits.per_client, clients).quota_for(move |key| {
        matches!(key, ClientKey::Value(k) if k.starts_with("paid-")).then_some(paid)
    });
    let expensive = get(expensive).layer(
        ServiceBuilder::new()
            .layer(HandleErrorLayer::new(limiter_failed))
            .layer(RateLimitLayer::new(limits.expensive)),
    );
    let router = Router::new()
        .route("/", get(|| async { "hello\n" }))
        .route("/expensive", expensive)
        // `Router::layer` wraps each route: its routes are always ready, so
        // the client's limit is checked on arrival, before `/expensive`
        // waits for the global one.
        .layer(per_client);
    // Added after the layer, so a scraper is not rate limited.
    match limits.metrics {
        Some(metrics) => router.route(
            "/metrics",
            get(move || {
                // Grants reach the recorder once a second on their own;
                // a scrape sees them all.
                tokio_ratelimit::metrics::flush();
                std::future::ready(metrics.render())
            }),
        ),
        None => router,
    }
}

/// Serves [`app`] on `listener` until the task is dropped.
///
/// # Errors
///
/// If the listener fails for good.
pub(crate) async fn serve(
    listener: TcpListener,
    limits: Limits,
    config: &Config,
    clients: impl KeyExtractor,
) -> std::io::Result<()> {
    let app = app(limits, config, clients).into_make_service_with_connect_info::<SocketAddr>();
    axum::serve(listener, app).await
}

async fn expensive() -> &'static str {
    "expensive result\n"
}

/// The global limiter closed (at shutdown): 503.
async fn limiter_failed(error: BoxError) -> Response {
    (StatusCode::SERVICE_UNAVAILABLE, format!("{error}\n")).into_response()
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
    // Before the limiters: they register their series when built.
    let metrics = PrometheusBuilder::new().install_recorder()?;
    let (mut limits, place) = match std::env::var("REDIS_URL") {
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
    limits.metrics = Some(metrics);
    let trusted: Vec<String> = std::env::var("TRUSTED_PROXIES")
        .map(|v| v.split(',').map(str::to_owned).collect())
        .unwrap_or_default();
    let listener = TcpListener::bind(("127.0.0.1", port)).await?;
    println!(
        "listening on http://{}: per client {:?} free, {:?} paid ({place}), /expensive {} for everyone",
        listener.local_addr()?,
        config.free,
        config.paid,
        config.expensive_rate,
    );
    serve(listener, limits, &config, clients(&trusted)?).await?;
    Ok(())
}
