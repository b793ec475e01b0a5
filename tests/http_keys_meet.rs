//! Client identification of the HTTP layer, met against its documentation:
//! which key a request is limited under (`ClientIp` behind trusted
//! proxies, prefix grouping, `Header`, `Unidentified`, the key strings).
//! A request's key is asserted exactly where the extractor exposes it, and
//! "same key" vs "another key" is observed through the layer over a
//! `KeyedFunnel` of capacity 1 on a paused clock: 429 vs 200.
//!
//! The review that wrote this file found six wrong keys (all fixed): a
//! client's own forwarding header read before the one the trusted proxy
//! wrote (now only the header chosen with `ClientIp::forwarded_by` is
//! read), a byte that is not text hiding the proxy's hop, quoted values in
//! `Forwarded` split, an IPv4-mapped trusted network containing nothing, an
//! IPv4 node with an obfuscated port not read.

use std::convert::Infallible;
use std::net::{IpAddr, SocketAddr};

use axum::body::Body;
use axum::extract::ConnectInfo;
use http::{HeaderName, HeaderValue, Request, Response};
use tokio_ratelimit::http::{
    Cidr, ClientIp, ClientKey, Forwarding, Header, HttpRateLimitLayer, KeyExtractor, Unidentified,
};
use tokio_ratelimit::keyed::{AsyncKeyedLimiter, KeyedFunnel};
use tokio_ratelimit::{Quota, Rate};
use tower::{Layer, ServiceExt, service_fn};

type Svc = tower::util::BoxCloneService<Request<Body>, Response<Body>, Infallible>;

fn service<L, E>(layer: &HttpRateLimitLayer<L, E>) -> Svc
where
    L: AsyncKeyedLimiter + 'static,
    L::Key: From<ClientKey>,
    E: KeyExtractor,
{
    let inner = service_fn(|_: Request<Body>| {
        futures::future::ready(Ok::<_, Infallible>(Response::new(Body::empty())))
    });
    tower::util::BoxCloneService::new(layer.layer(inner))
}

/// One permit a day per key: nothing refills during a test.
fn one_per_key<K>() -> KeyedFunnel<K>
where
    K: std::hash::Hash + Eq + Clone + Send + Sync + 'static,
{
    KeyedFunnel::builder()
        .quota(Quota::new(Rate::per_day(1), 1))
        .background_sweep(false)
        .build()
        .unwrap()
}

/// A request from `peer` (as axum's `ConnectInfo`), with these header
/// lines, appended in order (a name may repeat), values as raw bytes.
fn request(peer: Option<&str>, headers: &[(&str, &[u8])]) -> Request<Body> {
    let mut r = Request::get("/").body(Body::empty()).unwrap();
    if let Some(peer) = peer {
        let addr: SocketAddr = peer.parse().unwrap();
        r.extensions_mut().insert(ConnectInfo(addr));
    }
    for (k, v) in headers {
        r.headers_mut().append(
            HeaderName::from_bytes(k.as_bytes()).unwrap(),
            HeaderValue::from_bytes(v).unwrap(),
        );
    }
    r
}

fn key_of(extractor: &impl KeyExtractor, r: Request<Body>) -> Option<ClientKey> {
    let (parts, _) = r.into_parts();
    extractor.extract(&parts)
}

/// The key of address `s` (already grouped), as an extractor answers it.
#[allow(clippy::unnecessary_wraps)]
fn ip_key(s: &str) -> Option<ClientKey> {
    Some(ClientKey::Ip(s.parse().unwrap()))
}

async fn status(svc: &Svc, r: Request<Body>) -> u16 {
    svc.clone().oneshot(r).await.unwrap().status().as_u16()
}

/// The proxy in front of the service, and the only network trusted.
const PROXY: &str = "10.0.0.2:443";

/// Behind proxies that write `X-Forwarded-For` (the default header read).
fn behind_proxy() -> ClientIp {
    ClientIp::new().trust(["10.0.0.0/8"]).unwrap()
}

/// Behind proxies that write `forwarding`'s header.
fn behind(forwarding: Forwarding) -> ClientIp {
    behind_proxy().forwarded_by(forwarding)
}

// ---------------------------------------------------------------------
// Findings: wrong keys.
// ---------------------------------------------------------------------

/// A trusted proxy that writes `X-Forwarded-For` (nginx's
/// `$proxy_add_x_forwarded_for`, most load balancers) passes a client's own
/// `Forwarded` header through untouched; `ClientIp` reads `Forwarded` first,
/// so the client names itself: a fresh key per request, or a victim's key.
#[tokio::test(start_paused = true)]
async fn a_clients_own_forwarded_header_does_not_beat_the_proxys_x_forwarded_for() {
    let e = behind_proxy();
    // The proxy saw 203.0.113.5 and said so in X-Forwarded-For; the client
    // added `Forwarded: for=198.51.100.77` itself.
    let forged = || {
        request(
            Some(PROXY),
            &[
                ("forwarded", b"for=198.51.100.77"),
                ("x-forwarded-for", b"203.0.113.5"),
            ],
        )
    };
    assert_eq!(key_of(&e, forged()), ip_key("203.0.113.5"));
    // A `Forwarded` with no `for=` at all hides the proxy's X-Forwarded-For
    // too: the client is keyed as the proxy.
    let no_for = request(
        Some(PROXY),
        &[
            ("forwarded", b"proto=https"),
            ("x-forwarded-for", b"203.0.113.5"),
        ],
    );
    assert_eq!(key_of(&e, no_for), ip_key("203.0.113.5"));
    // Through the layer: one client, a new claim per request, one permit.
    let svc = service(&HttpRateLimitLayer::new(one_per_key::<ClientKey>(), e));
    let mut statuses = Vec::new();
    for i in 0..3 {
        let claim = format!("for=198.51.100.{i}");
        let r = request(
            Some(PROXY),
            &[
                ("forwarded", claim.as_bytes()),
                ("x-forwarded-for", b"203.0.113.5"),
            ],
        );
        statuses.push(status(&svc, r).await);
    }
    assert_eq!(statuses, [200, 429, 429], "one client, three keys");
}

/// The same with a proxy that writes `X-Real-IP` (nginx's
/// `proxy_set_header X-Real-IP $remote_addr`), said with
/// `forwarded_by(Forwarding::XRealIp)`: the client's own `X-Forwarded-For`,
/// which the proxy passes through, is not read. (It was, first, before the
/// fix.)
#[tokio::test(start_paused = true)]
async fn a_clients_own_x_forwarded_for_does_not_beat_the_proxys_x_real_ip() {
    let e = behind(Forwarding::XRealIp);
    let victim = || {
        request(
            Some(PROXY),
            &[
                ("x-forwarded-for", b"198.51.100.77"),
                ("x-real-ip", b"203.0.113.5"),
            ],
        )
    };
    assert_eq!(key_of(&e, victim()), ip_key("203.0.113.5"));
    // The attacker 203.0.113.5 spends the victim 198.51.100.77's permit.
    let svc = service(&HttpRateLimitLayer::new(one_per_key::<ClientKey>(), e));
    assert_eq!(status(&svc, victim()).await, 200);
    let real_victim = request(Some(PROXY), &[("x-real-ip", b"198.51.100.77")]);
    assert_eq!(
        status(&svc, real_victim).await,
        200,
        "the victim is blocked"
    );
}

/// A proxy appends its hop to the same `X-Forwarded-For` line the client
/// started. One byte that is not ASCII in the client's part makes the whole
/// line one "not an address" hop: the address the trusted proxy appended,
/// the rightmost, is never read, and the client is keyed as the proxy.
#[tokio::test(start_paused = true)]
async fn a_non_ascii_byte_left_of_the_proxys_hop_does_not_hide_it() {
    let e = behind_proxy();
    let xff = |client: &str| {
        let mut v = b"\xff, ".to_vec();
        v.extend_from_slice(client.as_bytes());
        request(Some(PROXY), &[("x-forwarded-for", &v)])
    };
    assert_eq!(key_of(&e, xff("203.0.113.5")), ip_key("203.0.113.5"));
    let fwd = {
        let mut v = b"for=\xff, for=".to_vec();
        v.extend_from_slice(b"203.0.113.5");
        request(Some(PROXY), &[("forwarded", &v)])
    };
    assert_eq!(
        key_of(&behind(Forwarding::Forwarded), fwd),
        ip_key("203.0.113.5")
    );
    // Two clients doing it share one key: the proxy's.
    let svc = service(&HttpRateLimitLayer::new(one_per_key::<ClientKey>(), e));
    assert_eq!(status(&svc, xff("203.0.113.5")).await, 200);
    assert_eq!(
        status(&svc, xff("203.0.113.6")).await,
        200,
        "another client"
    );
}

/// RFC 7239 §4: a value may be a quoted-string, and a quoted-string may
/// hold `,`, `;` and `=`. The proxy's element
/// `for=203.0.113.5;host="x,for=6.6.6.6"` (a proxy copying the client's
/// `Host`) names one client; split on `,` and `;` regardless of quotes, it
/// names the client's pick.
#[test]
fn a_quoted_forwarded_value_is_one_value() {
    let e = behind(Forwarding::Forwarded);
    for header in [
        r#"for=203.0.113.5;host="x,for=6.6.6.6""#,
        r#"for=203.0.113.5;host="x;for=6.6.6.6""#,
        r#"for=6.6.6.6, for=203.0.113.5;proto=https;host="a,for=6.6.6.7""#,
    ] {
        let r = request(Some(PROXY), &[("forwarded", header.as_bytes())]);
        assert_eq!(key_of(&e, r), ip_key("203.0.113.5"), "{header}");
    }
}

/// `Cidr::contains`: "an IPv4-mapped IPv6 address counts as its IPv4
/// address". A network written IPv4-mapped (as a dual-stack socket prints a
/// peer: `::ffff:10.0.0.2`) contains nothing, not even itself: the proxy is
/// not trusted, and every client behind it is one key.
#[tokio::test(start_paused = true)]
async fn a_network_written_ipv4_mapped_contains_its_addresses() {
    let n: Cidr = "::ffff:10.0.0.2".parse().unwrap();
    let mapped: IpAddr = "::ffff:10.0.0.2".parse().unwrap();
    let v4: IpAddr = "10.0.0.2".parse().unwrap();
    assert_eq!((n.contains(mapped), n.contains(v4)), (true, true));
    let e = ClientIp::new().trust(["::ffff:10.0.0.0/104"]).unwrap();
    let svc = service(&HttpRateLimitLayer::new(one_per_key::<ClientKey>(), e));
    for client in ["203.0.113.5", "203.0.113.6"] {
        let r = request(
            Some("[::ffff:10.0.0.2]:443"),
            &[("x-forwarded-for", client.as_bytes())],
        );
        assert_eq!(status(&svc, r).await, 200, "{client} has its own key");
    }
}

/// RFC 7239 §6: `node = nodename [ ":" node-port ]`, `node-port = port /
/// obfport`. An IPv6 node with an obfuscated port is read
/// (`"[2001:db8::1]:_abc"`), an IPv4 one is not: a proxy that obfuscates
/// ports makes all its IPv4 clients one key, its own.
#[test]
fn an_ipv4_node_with_an_obfuscated_port_is_its_address() {
    let e = behind(Forwarding::Forwarded);
    let r = request(
        Some(PROXY),
        &[("forwarded", br#"for="[2001:db8::1]:_abc""#)],
    );
    assert_eq!(key_of(&e, r), ip_key("2001:db8::"), "IPv6: read");
    let r = request(Some(PROXY), &[("forwarded", br#"for="192.0.2.43:_abc""#)]);
    assert_eq!(key_of(&e, r), ip_key("192.0.2.43"), "IPv4");
}

// ---------------------------------------------------------------------
// What holds.
// ---------------------------------------------------------------------

/// Several `X-Forwarded-For` lines are one list, in order: the proxy's
/// line (appended last) holds the rightmost hops.
#[tokio::test(start_paused = true)]
async fn x_forwarded_for_lines_are_one_chain_in_order() {
    let e = ClientIp::new()
        .trust(["10.0.0.0/8", "192.168.0.0/16"])
        .unwrap();
    let r = || {
        request(
            Some(PROXY),
            &[
                ("x-forwarded-for", b"6.6.6.6"),
                ("x-forwarded-for", b" 10.9.9.9 ,, 203.0.113.5 , 192.168.1.1"),
            ],
        )
    };
    assert_eq!(key_of(&e, r()), ip_key("203.0.113.5"));
    // The same across Forwarded lines, behind proxies that write them.
    let e = e.forwarded_by(Forwarding::Forwarded);
    let f = request(
        Some(PROXY),
        &[
            ("forwarded", b"for=6.6.6.6"),
            ("forwarded", b"for=203.0.113.5;proto=https, FOR=192.168.1.1"),
        ],
    );
    assert_eq!(key_of(&e, f), ip_key("203.0.113.5"));
}

/// One client written every way a proxy may write it — with a port, in
/// brackets, IPv4-mapped, quoted in `Forwarded`, as the peer itself — is
/// one key, and one permit.
#[tokio::test(start_paused = true)]
async fn one_client_written_every_way_is_one_key() {
    // Each way read by an extractor for its header; one limiter.
    let by = |name: &str| match name {
        "forwarded" => behind(Forwarding::Forwarded),
        "x-real-ip" => behind(Forwarding::XRealIp),
        _ => behind_proxy(),
    };
    let ways: [(&str, &str, &[u8]); 7] = [
        (PROXY, "x-forwarded-for", b"203.0.113.5"),
        (PROXY, "x-forwarded-for", b"203.0.113.5:5678"),
        (PROXY, "x-forwarded-for", b"::ffff:203.0.113.5"),
        (PROXY, "x-forwarded-for", b"[::ffff:203.0.113.5]:80"),
        (PROXY, "forwarded", br#"for="203.0.113.5:4711""#),
        (PROXY, "x-real-ip", b"::FFFF:203.0.113.5"),
        ("[::ffff:203.0.113.5]:9999", "x-forwarded-for", b"1.1.1.1"),
    ];
    for (peer, name, value) in ways {
        let r = request(Some(peer), &[(name, value)]);
        assert_eq!(
            key_of(&by(name), r),
            ip_key("203.0.113.5"),
            "{peer} {name}: {}",
            String::from_utf8_lossy(value)
        );
    }
    let limiter = one_per_key::<ClientKey>();
    let mut statuses = Vec::new();
    for (peer, name, value) in ways {
        let svc = service(&HttpRateLimitLayer::new(limiter.clone(), by(name)));
        statuses.push(status(&svc, request(Some(peer), &[(name, value)])).await);
    }
    assert_eq!(statuses, [200, 429, 429, 429, 429, 429, 429]);
}

/// Fewer untrusted hops than proxies: the leftmost hop read is the client
/// (documented: "the first untrusted one, else the leftmost read"), not the
/// peer; a hop that is not an address ends the walk at the last trusted hop.
#[test]
fn an_all_trusted_chain_is_keyed_by_its_leftmost_hop() {
    let e = behind_proxy();
    let r = request(Some(PROXY), &[("x-forwarded-for", b"10.0.0.7, 10.0.0.8")]);
    assert_eq!(key_of(&e, r), ip_key("10.0.0.7"));
    let e = e.forwarded_by(Forwarding::Forwarded);
    let r = request(Some(PROXY), &[("forwarded", b"for=unknown, for=10.0.0.8")]);
    assert_eq!(key_of(&e, r), ip_key("10.0.0.8"));
    let r = request(Some(PROXY), &[("forwarded", b"for=_hidden")]);
    assert_eq!(key_of(&e, r), ip_key("10.0.0.2"));
}

/// Prefix lengths at their edges, exactly: 0 (one key for the family), the
/// whole address, an IPv4 client under an IPv6 setting and the reverse, an
/// IPv4-mapped client under the IPv4 length.
#[test]
fn prefix_lengths_at_their_edges() {
    let peer = |ip: &str| {
        let addr = SocketAddr::new(ip.parse().unwrap(), 1);
        request(Some(&addr.to_string()), &[])
    };
    let zero = ClientIp::new().ipv6_prefix(0);
    assert_eq!(key_of(&zero, peer("2001:db8::1")), ip_key("::"));
    assert_eq!(key_of(&zero, peer("fe80::1")), ip_key("::"));
    assert_eq!(key_of(&zero, peer("192.0.2.1")), ip_key("192.0.2.1"));
    let zero4 = ClientIp::new().ipv4_prefix(0);
    assert_eq!(key_of(&zero4, peer("192.0.2.1")), ip_key("0.0.0.0"));
    assert_eq!(key_of(&zero4, peer("::ffff:192.0.2.1")), ip_key("0.0.0.0"));
    assert_eq!(
        key_of(&zero4, peer("2001:db8:0:1::1")),
        ip_key("2001:db8:0:1::")
    );
    let full = ClientIp::new().ipv6_prefix(128);
    assert_eq!(key_of(&full, peer("2001:db8::1")), ip_key("2001:db8::1"));
    assert_ne!(key_of(&full, peer("2001:db8::2")), ip_key("2001:db8::1"));
    // The /64 boundary: the last address of one /64, the first of the next.
    let d = ClientIp::new();
    assert_eq!(
        key_of(&d, peer("2001:db8:0:1:ffff:ffff:ffff:ffff")),
        ip_key("2001:db8:0:1::")
    );
    assert_eq!(key_of(&d, peer("2001:db8:0:2::")), ip_key("2001:db8:0:2::"));
    let v4_24 = ClientIp::new().ipv4_prefix(24).ipv6_prefix(56);
    assert_eq!(
        key_of(&v4_24, peer("::ffff:192.0.2.200")),
        ip_key("192.0.2.0")
    );
    assert_eq!(
        key_of(&v4_24, peer("2001:db8:0:1ff::1")),
        ip_key("2001:db8:0:100::")
    );
}

/// `Header`: the name is case-insensitive; an empty value or one that is
/// not ASCII is no key (the configured answer: 400 by default), and a
/// value is a key — never the unidentified answer — even under `Allow`.
#[tokio::test(start_paused = true)]
async fn a_header_key_and_the_unidentified_answer() {
    let e = Header::new("X-Api-Key");
    let r = request(None, &[("x-api-key", b"abc")]);
    assert_eq!(key_of(&e, r), Some(ClientKey::Value("abc".into())));
    assert_eq!(key_of(&e, request(None, &[("x-api-key", b"")])), None);
    assert_eq!(
        key_of(&e, request(None, &[("x-api-key", "ключ".as_bytes())])),
        None
    );
    let svc = service(&HttpRateLimitLayer::new(
        one_per_key::<ClientKey>(),
        Header::new("X-API-KEY"),
    ));
    assert_eq!(
        status(&svc, request(None, &[("x-api-key", b"")])).await,
        400
    );
    assert_eq!(status(&svc, request(None, &[])).await, 400);
    assert_eq!(
        status(&svc, request(None, &[("x-api-key", b"abc")])).await,
        200
    );
    assert_eq!(
        status(&svc, request(None, &[("X-Api-Key", b"abc")])).await,
        429
    );
    let allow = service(
        &HttpRateLimitLayer::new(one_per_key::<ClientKey>(), Header::new("x-api-key"))
            .unidentified(Unidentified::Allow),
    );
    assert_eq!(
        status(&allow, request(None, &[("x-api-key", b"k")])).await,
        200
    );
    assert_eq!(
        status(&allow, request(None, &[("x-api-key", b"k")])).await,
        429
    );
    for _ in 0..3 {
        assert_eq!(
            status(&allow, request(None, &[("x-api-key", b"")])).await,
            200
        );
    }
}

/// The peer address from a plain `SocketAddr` extension and from axum's
/// `ConnectInfo` is one client; with neither there is no key.
#[tokio::test(start_paused = true)]
async fn the_peer_from_either_extension_is_one_client() {
    let svc = service(
        &HttpRateLimitLayer::new(one_per_key::<ClientKey>(), ClientIp::new())
            .unidentified(Unidentified::Key(ClientKey::Global)),
    );
    let mut plain = Request::get("/").body(Body::empty()).unwrap();
    plain
        .extensions_mut()
        .insert("192.0.2.9:1000".parse::<SocketAddr>().unwrap());
    assert_eq!(status(&svc, plain).await, 200);
    assert_eq!(
        status(&svc, request(Some("192.0.2.9:2000"), &[])).await,
        429
    );
    // No peer at all: the configured key, not 192.0.2.9's.
    assert_eq!(status(&svc, request(None, &[])).await, 200);
    assert_eq!(status(&svc, request(None, &[])).await, 429);
}

/// The key strings (what a `RedisFunnel` or any `String`-keyed map sees)
/// are injective: a header value cannot spell an address's key or the
/// global one.
#[tokio::test(start_paused = true)]
async fn key_strings_cannot_collide_across_kinds() {
    let strings = [
        ClientKey::Ip("203.0.113.5".parse().unwrap()),
        ClientKey::Value("ip:203.0.113.5".into()),
        ClientKey::Value("203.0.113.5".into()),
        ClientKey::Global,
        ClientKey::Value("all".into()),
        ClientKey::Value("key:all".into()),
    ]
    .map(String::from);
    let distinct: std::collections::HashSet<_> = strings.iter().collect();
    assert_eq!(distinct.len(), strings.len(), "{strings:?}");
    // Through a String-keyed map: a client naming an address in its API key
    // does not spend that address's permit.
    let limits: KeyedFunnel<String> = one_per_key();
    let svc = service(&HttpRateLimitLayer::new(
        limits,
        Header::new("x-api-key").or(ClientIp::new()),
    ));
    let attacker = request(Some("198.51.100.1:1"), &[("x-api-key", b"ip:203.0.113.5")]);
    assert_eq!(status(&svc, attacker).await, 200);
    assert_eq!(status(&svc, request(Some("203.0.113.5:1"), &[])).await, 200);
}
