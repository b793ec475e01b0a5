//! `http::HttpRateLimitLayer` without a network: requests built by hand
//! (with the peer address an axum server would put in their extensions),
//! a service that counts its calls, and paused time.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::body::Body;
use axum::extract::ConnectInfo;
use http::{Request, Response, StatusCode};
use tokio_ratelimit::http::{
    ClientIp, ClientKey, Global, Header, HttpRateLimitLayer, KeyExtractor, Unidentified,
};
use tokio_ratelimit::keyed::{AsyncKeyedLimiter, Keyed, KeyedFunnel};
use tokio_ratelimit::{Quota, Rate, TokenBucket};
use tower::{Layer, ServiceExt, service_fn};

type Svc = tower::util::BoxCloneService<Request<Body>, Response<Body>, Infallible>;

/// A service that answers 200 and counts its calls, behind `layer`.
fn counted<L, E>(layer: &HttpRateLimitLayer<L, E>, calls: &Arc<AtomicUsize>) -> Svc
where
    L: AsyncKeyedLimiter + 'static,
    L::Key: From<ClientKey>,
    E: KeyExtractor,
{
    let calls = Arc::clone(calls);
    let inner = service_fn(move |_: Request<Body>| {
        calls.fetch_add(1, Ordering::SeqCst);
        futures::future::ready(Ok::<_, Infallible>(Response::new(Body::empty())))
    });
    tower::util::BoxCloneService::new(layer.layer(inner))
}

fn request(peer: Option<&str>, headers: &[(&str, &str)]) -> Request<Body> {
    let mut r = Request::get("/").body(Body::empty()).unwrap();
    if let Some(peer) = peer {
        let addr: SocketAddr = peer.parse().unwrap();
        r.extensions_mut().insert(ConnectInfo(addr));
    }
    for (k, v) in headers {
        r.headers_mut().insert(
            http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
            v.parse().unwrap(),
        );
    }
    r
}

async fn call(svc: &Svc, r: Request<Body>) -> Response<Body> {
    svc.clone().oneshot(r).await.unwrap()
}

fn map(quota: Quota) -> KeyedFunnel<ClientKey> {
    KeyedFunnel::builder()
        .quota(quota)
        .background_sweep(false)
        .build()
        .unwrap()
}

#[tokio::test(start_paused = true)]
async fn a_request_with_no_key_gets_the_configured_answer() {
    let calls = Arc::new(AtomicUsize::new(0));
    let q = Quota::new(Rate::per_second(1), 1);
    // No peer address (a server without connect info): 400 by default.
    let svc = counted(&HttpRateLimitLayer::new(map(q), ClientIp::new()), &calls);
    assert_eq!(
        call(&svc, request(None, &[])).await.status(),
        StatusCode::BAD_REQUEST
    );
    // Or let through, unlimited.
    let svc = counted(
        &HttpRateLimitLayer::new(map(q), ClientIp::new()).unidentified(Unidentified::Allow),
        &calls,
    );
    for _ in 0..3 {
        assert_eq!(
            call(&svc, request(None, &[])).await.status(),
            StatusCode::OK
        );
    }
    // Or limited together under one key.
    let svc = counted(
        &HttpRateLimitLayer::new(map(q), Header::new("x-api-key"))
            .unidentified(Unidentified::Key(ClientKey::Value("anonymous".into()))),
        &calls,
    );
    assert_eq!(
        call(&svc, request(None, &[])).await.status(),
        StatusCode::OK
    );
    assert_eq!(
        call(&svc, request(None, &[])).await.status(),
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(
        call(&svc, request(None, &[("x-api-key", "k1")]))
            .await
            .status(),
        StatusCode::OK
    );
    assert_eq!(calls.load(Ordering::SeqCst), 5);
}

#[tokio::test(start_paused = true)]
async fn legacy_headers_show_the_band_that_binds_first() {
    let calls = Arc::new(AtomicUsize::new(0));
    let q = Quota::new(Rate::per_second(10), 10).and(Rate::per_minute(3), 3);
    let svc = counted(
        &HttpRateLimitLayer::new(map(q), Global).legacy_headers(true),
        &calls,
    );
    let r = call(&svc, request(None, &[])).await;
    let h = |name: &str| r.headers()[name].to_str().unwrap().to_owned();
    // The minute's band binds: 2 left, one more in 20 s.
    assert_eq!(
        (
            h("x-ratelimit-limit"),
            h("x-ratelimit-remaining"),
            h("x-ratelimit-reset")
        ),
        ("3".into(), "2".into(), "20".into())
    );
    assert_eq!(
        h("ratelimit"),
        r#""10-per-1s";r=9;t=1, "3-per-60s";r=2;t=20"#
    );
    // Without them, only the draft's fields.
    let svc = counted(
        &HttpRateLimitLayer::new(map(q), Global).policy_headers(false),
        &calls,
    );
    let r = call(&svc, request(None, &[])).await;
    assert!(
        r.headers().get("ratelimit").is_none() && r.headers().get("x-ratelimit-limit").is_none()
    );
}

#[tokio::test(start_paused = true)]
async fn an_api_key_else_the_client_address() {
    let calls = Arc::new(AtomicUsize::new(0));
    let q = Quota::new(Rate::per_second(1), 2);
    let svc = counted(
        &HttpRateLimitLayer::new(map(q), Header::new("x-api-key").or(ClientIp::new())),
        &calls,
    );
    let statuses = async |r: fn() -> Request<Body>| {
        let mut s = Vec::new();
        for _ in 0..3 {
            s.push(call(&svc, r()).await.status().as_u16());
        }
        s
    };
    // Two API keys from one address: two clients; no key: the address.
    assert_eq!(
        statuses(|| request(Some("192.0.2.1:5000"), &[("x-api-key", "a")])).await,
        [200, 200, 429]
    );
    assert_eq!(
        statuses(|| request(Some("192.0.2.1:5000"), &[("x-api-key", "b")])).await,
        [200, 200, 429]
    );
    assert_eq!(
        statuses(|| request(Some("192.0.2.1:6000"), &[])).await,
        [200, 200, 429]
    );
    // The same address on another port is the same client.
    assert_eq!(
        statuses(|| request(Some("192.0.2.1:7000"), &[])).await,
        [429, 429, 429]
    );
    assert_eq!(calls.load(Ordering::SeqCst), 6);
}

#[test]
fn ten_thousand_addresses_of_one_slash_64_are_one_key() {
    let extractor = ClientIp::new().trust(["10.0.0.0/8"]).unwrap();
    let mut keys = std::collections::HashSet::new();
    for i in 0..10_000u32 {
        let client = format!("2001:db8:aa:bb:{:x}:{:x}::1", i >> 8, i & 0xff);
        let (parts, ()) = request(Some("10.1.2.3:443"), &[("x-forwarded-for", &client)])
            .map(|_| ())
            .into_parts();
        keys.insert(extractor.extract(&parts).unwrap());
    }
    assert_eq!(keys.len(), 1, "{keys:?}");
    assert_eq!(
        keys.into_iter().next().unwrap(),
        ClientKey::Ip("2001:db8:aa:bb::".parse().unwrap())
    );
}

#[tokio::test(start_paused = true)]
async fn any_keyed_limiter_fits_and_a_foreign_tier_is_a_503() {
    let calls = Arc::new(AtomicUsize::new(0));
    // A token bucket per key, FIFO per key: `Keyed` behind the same layer.
    let per_key: Keyed<ClientKey, TokenBucket> = Keyed::builder()
        .limiter(|| {
            TokenBucket::builder()
                .rate(Rate::per_second(1))
                .capacity(1)
                .build()
        })
        .build()
        .unwrap();
    let svc = counted(&HttpRateLimitLayer::new(per_key, Global), &calls);
    assert_eq!(
        call(&svc, request(None, &[])).await.status(),
        StatusCode::OK
    );
    let refused = call(&svc, request(None, &[])).await;
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(refused.headers()["retry-after"], "1");
    assert_eq!(refused.headers()["ratelimit"], r#""1-per-1s";r=0;t=1"#);
    // A quota the map was not built with cannot be served: 503, logged.
    let other = Quota::new(Rate::per_second(5), 5);
    let svc = counted(
        &HttpRateLimitLayer::new(map(Quota::new(Rate::per_second(1), 1)), Global)
            .quota_for(move |_| Some(other)),
        &calls,
    );
    assert_eq!(
        call(&svc, request(None, &[])).await.status(),
        StatusCode::SERVICE_UNAVAILABLE
    );
    tokio::time::advance(Duration::from_secs(1)).await;
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

/// Configuration order is never a panic (issue 26): a setter on a clone
/// changes that clone only; the clones share the limiter (and so the keys'
/// state).
#[tokio::test(start_paused = true)]
async fn a_layer_configured_after_it_is_cloned_changes_that_clone_only() {
    let calls = Arc::new(AtomicUsize::new(0));
    let layer = HttpRateLimitLayer::new(map(Quota::new(Rate::per_second(1), 1)), ClientIp::new());
    let before = layer.clone();
    let teapot = layer
        .clone()
        .limited_status(StatusCode::IM_A_TEAPOT)
        .legacy_headers(true);
    let (svc, teapot_svc) = (counted(&before, &calls), counted(&teapot, &calls));
    let peer = Some("192.0.2.7:40000");
    assert_eq!(
        call(&svc, request(peer, &[])).await.status(),
        StatusCode::OK
    );
    // The same key, one map: the second request is over the limit, answered
    // by each layer's own configuration.
    let refused = call(&teapot_svc, request(peer, &[])).await;
    assert_eq!(refused.status(), StatusCode::IM_A_TEAPOT);
    assert!(refused.headers().contains_key("x-ratelimit-limit"));
    let refused = call(&svc, request(peer, &[])).await;
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    assert!(!refused.headers().contains_key("x-ratelimit-limit"));
    // And the layer cloned from keeps its own too.
    let original = counted(&layer, &calls);
    assert_eq!(
        call(&original, request(peer, &[])).await.status(),
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}
