//! Who a request comes from: [`ClientKey`] and the extractors that find it.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::str::FromStr;
use std::sync::Arc;

use http::header::HeaderName;

/// The key a request is limited by: one client address (grouped by
/// prefix), one value of a header (an API key), or one key for everyone.
///
/// Converts into a `String` (`"ip:203.0.113.7"`, `"key:abc"`, `"all"`) for
/// limiters keyed by strings, such as `redis::RedisFunnel`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum ClientKey {
    /// A client address, its host bits cleared past the prefix length
    /// ([`ClientIp::ipv6_prefix`]): `2001:db8:1:2::/64` is one key.
    Ip(IpAddr),
    /// A header's value (an API key, a tenant id).
    Value(String),
    /// Every request: one limit for the whole service.
    Global,
}

impl fmt::Display for ClientKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ClientKey::Ip(ip) => write!(f, "ip:{ip}"),
            ClientKey::Value(v) => write!(f, "key:{v}"),
            ClientKey::Global => f.write_str("all"),
        }
    }
}

impl From<ClientKey> for String {
    fn from(key: ClientKey) -> String {
        key.to_string()
    }
}

/// Finds the [`ClientKey`] of a request; `None` when it has none (no
/// address, no such header). Implemented by the extractors of this module,
/// by [`Or`] (one, else another), and by any
/// `Fn(&http::request::Parts) -> Option<ClientKey>`.
pub trait KeyExtractor: Send + Sync + 'static {
    /// The key of a request with these parts (method, URI, headers,
    /// extensions).
    fn extract(&self, request: &http::request::Parts) -> Option<ClientKey>;

    /// This extractor, else `other` when this one finds nothing: per API key
    /// if there is one, else per client address.
    fn or<E: KeyExtractor>(self, other: E) -> Or<Self, E>
    where
        Self: Sized,
    {
        Or(self, other)
    }
}

impl<F> KeyExtractor for F
where
    F: Fn(&http::request::Parts) -> Option<ClientKey> + Send + Sync + 'static,
{
    fn extract(&self, request: &http::request::Parts) -> Option<ClientKey> {
        self(request)
    }
}

/// The first extractor's key, else the second's: made by
/// [`KeyExtractor::or`].
#[derive(Debug, Clone)]
pub struct Or<A, B>(A, B);

impl<A: KeyExtractor, B: KeyExtractor> KeyExtractor for Or<A, B> {
    fn extract(&self, request: &http::request::Parts) -> Option<ClientKey> {
        self.0.extract(request).or_else(|| self.1.extract(request))
    }
}

/// One key for every request ([`ClientKey::Global`]).
#[derive(Debug, Clone, Copy, Default)]
pub struct Global;

impl KeyExtractor for Global {
    fn extract(&self, _: &http::request::Parts) -> Option<ClientKey> {
        Some(ClientKey::Global)
    }
}

/// A header's value as the key: an API key, a tenant id. A request without
/// the header (or with a value that is not visible ASCII) has no key.
///
/// The value is whatever the client sent: key by it only what the client
/// cannot pick freely (an API key the service checks), or a client can
/// have a fresh limit per request.
#[derive(Debug, Clone)]
pub struct Header {
    name: HeaderName,
}

impl Header {
    /// The value of header `name` (e.g. `"x-api-key"`), for a name written
    /// in the code; [`try_new`](Self::try_new) for one from configuration.
    ///
    /// # Panics
    ///
    /// When `name` is not a valid header name (as `HeaderName::from_static`
    /// does).
    pub fn new(name: &str) -> Header {
        Header::try_new(name).expect("a valid header name")
    }

    /// The value of header `name`.
    ///
    /// # Errors
    ///
    /// When `name` is not a valid header name.
    pub fn try_new(name: &str) -> Result<Header, http::header::InvalidHeaderName> {
        Ok(Header {
            name: HeaderName::from_str(name)?,
        })
    }
}

impl KeyExtractor for Header {
    fn extract(&self, request: &http::request::Parts) -> Option<ClientKey> {
        let value = request.headers.get(&self.name)?.to_str().ok()?;
        (!value.is_empty()).then(|| ClientKey::Value(value.to_owned()))
    }
}

/// An IP network, such as `10.0.0.0/8` or `2001:db8::/32`: what
/// [`ClientIp::trust`] takes for the proxies in front of the service.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cidr {
    network: IpAddr,
    len: u8,
}

/// A string that is not an address or network.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CidrError(String);

impl fmt::Display for CidrError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "not an IP network (such as 10.0.0.0/8): {:?}", self.0)
    }
}

impl std::error::Error for CidrError {}

impl FromStr for Cidr {
    type Err = CidrError;

    /// `"10.0.0.0/8"`, `"::1/128"`, or a bare address (all its bits).
    fn from_str(s: &str) -> Result<Cidr, CidrError> {
        let error = || CidrError(s.to_owned());
        let (addr, len) = match s.split_once('/') {
            Some((addr, len)) => (addr, Some(len.parse::<u8>().map_err(|_| error())?)),
            None => (s, None),
        };
        let addr: IpAddr = addr.parse().map_err(|_| error())?;
        let max = bits(addr);
        let len = len.unwrap_or(max);
        if len > max {
            return Err(error());
        }
        // An IPv4-mapped network (`::ffff:10.0.0.0/104`, as a dual-stack
        // socket prints it) is the IPv4 network it maps, since addresses
        // are compared as IPv4 (see `contains`).
        if let Some(v4) = addr_mapped(addr)
            && len >= 96
        {
            return Ok(Cidr {
                network: mask(IpAddr::V4(v4), len - 96),
                len: len - 96,
            });
        }
        Ok(Cidr {
            network: mask(addr, len),
            len,
        })
    }
}

impl Cidr {
    /// Whether `ip` is in this network (an IPv4-mapped IPv6 address counts
    /// as its IPv4 address).
    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = canonical(ip);
        bits(ip) == bits(self.network) && mask(ip, self.len) == self.network
    }
}

fn bits(ip: IpAddr) -> u8 {
    if ip.is_ipv4() { 32 } else { 128 }
}

/// `ip` with every bit past the first `len` cleared.
fn mask(ip: IpAddr, len: u8) -> IpAddr {
    match ip {
        IpAddr::V4(v4) => {
            let keep = u32::MAX.checked_shl(32 - u32::from(len)).unwrap_or(0);
            IpAddr::V4(Ipv4Addr::from(u32::from(v4) & keep))
        }
        IpAddr::V6(v6) => {
            let keep = u128::MAX.checked_shl(128 - u32::from(len)).unwrap_or(0);
            IpAddr::V6(Ipv6Addr::from(u128::from(v6) & keep))
        }
    }
}

/// The IPv4 address an IPv4-mapped IPv6 address (`::ffff:1.2.3.4`) maps.
fn addr_mapped(ip: IpAddr) -> Option<Ipv4Addr> {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped(),
        IpAddr::V4(_) => None,
    }
}

/// An IPv4-mapped IPv6 address (`::ffff:1.2.3.4`) as the IPv4 address it
/// is, so that dual-stack sockets key an IPv4 client as IPv4.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        IpAddr::V4(_) => ip,
    }
}

/// The client's address: the peer of the connection, or — behind proxies
/// the service trusts — the address they say they forwarded for, grouped
/// by prefix.
///
/// The peer address comes from the request's extensions: a
/// [`SocketAddr`], or axum's `ConnectInfo<SocketAddr>` with the `axum`
/// feature (serve with `into_make_service_with_connect_info::<SocketAddr>()`).
///
/// # Proxies
///
/// By default no proxy is trusted and forwarding headers are ignored: a
/// client that could set `X-Forwarded-For` itself could pick a fresh
/// identity per request. With [`trust`](Self::trust), a peer in a trusted
/// network is a proxy: the client is found by walking the forwarded chain
/// of the one header the proxies write — `X-Forwarded-For` by default, or
/// `Forwarded: for=…` (RFC 7239) or `X-Real-IP`, set with
/// [`forwarded_by`](Self::forwarded_by); the others are ignored, since a
/// client may send them itself and a proxy that does not write them passes
/// them on — from the right, past every trusted hop, to the first
/// address that is not trusted. A hop that is not an address (`unknown`,
/// an obfuscated `_name`, garbage) ends the walk at the last trusted hop,
/// which is then the key: a proxy that forwards for clients it cannot name
/// is limited as one client. At most [`max_hops`](Self::max_hops) hops are
/// read.
///
/// # Grouping
///
/// One host with an IPv6 /64 has 2⁶⁴ addresses: keyed one per address, it
/// could take 2⁶⁴ limits (and, with `max_keys`, fill the map and lock out
/// everyone new). So IPv6 addresses are keyed by their /64 and IPv4 ones by
/// the whole address, each configurable.
#[derive(Debug, Clone)]
pub struct ClientIp {
    trusted: Arc<[Cidr]>,
    forwarding: Forwarding,
    ipv4_prefix: u8,
    ipv6_prefix: u8,
    max_hops: usize,
}

/// The forwarding header the trusted proxies in front of a service write,
/// which [`ClientIp`] reads (see [`ClientIp::forwarded_by`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Forwarding {
    /// `X-Forwarded-For`, to which each proxy appends the address it was
    /// connected from (nginx's `$proxy_add_x_forwarded_for`, most load
    /// balancers and CDNs). The default.
    #[default]
    XForwardedFor,
    /// `Forwarded` (RFC 7239): the `for=` of each element, one per proxy.
    Forwarded,
    /// `X-Real-IP`, set (not appended) by the proxy to the address it was
    /// connected from: one hop.
    XRealIp,
}

impl Default for ClientIp {
    fn default() -> Self {
        ClientIp {
            trusted: Arc::new([]),
            forwarding: Forwarding::default(),
            ipv4_prefix: 32,
            ipv6_prefix: 64,
            max_hops: 16,
        }
    }
}

impl ClientIp {
    /// The peer's address, no proxy trusted, IPv6 by /64.
    pub fn new() -> ClientIp {
        ClientIp::default()
    }

    /// Trusts the proxies in these networks (their forwarding headers are
    /// read).
    ///
    /// # Errors
    ///
    /// A network that does not parse.
    pub fn trust<I, S>(mut self, networks: I) -> Result<ClientIp, CidrError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let mut all: Vec<Cidr> = self.trusted.to_vec();
        for n in networks {
            all.push(n.as_ref().parse()?);
        }
        self.trusted = all.into();
        Ok(self)
    }

    /// The header the trusted proxies write, the only one read (default
    /// [`Forwarding::XForwardedFor`]). Choose the one your proxies write:
    /// another one, which they pass on as the client sent it, would let a
    /// client pick its key.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::net::{IpAddr, Ipv4Addr};
    /// use tokio_ratelimit::http::{ClientIp, Forwarding};
    ///
    /// let behind_nginx = ClientIp::new()
    ///     .trust(["10.0.0.0/8"])
    ///     .unwrap()
    ///     .forwarded_by(Forwarding::XRealIp);
    /// let mut headers = http::HeaderMap::new();
    /// headers.insert("x-real-ip", "203.0.113.5".parse().unwrap());
    /// // The client's own X-Forwarded-For, passed on by the proxy: ignored.
    /// headers.insert("x-forwarded-for", "198.51.100.77".parse().unwrap());
    /// let proxy = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2));
    /// assert_eq!(behind_nginx.client(proxy, &headers), IpAddr::V4(Ipv4Addr::new(203, 0, 113, 5)));
    /// ```
    #[must_use]
    pub fn forwarded_by(mut self, forwarding: Forwarding) -> ClientIp {
        self.forwarding = forwarding;
        self
    }

    /// How many leading bits of an IPv4 address make one key (default 32:
    /// every address its own).
    ///
    /// # Panics
    ///
    /// Above 32.
    #[must_use]
    pub fn ipv4_prefix(mut self, bits: u8) -> ClientIp {
        assert!(bits <= 32, "an IPv4 prefix is at most 32 bits");
        self.ipv4_prefix = bits;
        self
    }

    /// How many leading bits of an IPv6 address make one key (default 64:
    /// a host's usual allocation).
    ///
    /// # Panics
    ///
    /// Above 128.
    #[must_use]
    pub fn ipv6_prefix(mut self, bits: u8) -> ClientIp {
        assert!(bits <= 128, "an IPv6 prefix is at most 128 bits");
        self.ipv6_prefix = bits;
        self
    }

    /// The most forwarded hops read, from the right (default 16). A longer
    /// chain's client is taken among the last `max_hops`: the first
    /// untrusted one, else the leftmost read.
    #[must_use]
    pub fn max_hops(mut self, hops: usize) -> ClientIp {
        self.max_hops = hops.max(1);
        self
    }

    fn is_trusted(&self, ip: IpAddr) -> bool {
        self.trusted.iter().any(|n| n.contains(ip))
    }

    /// `ip` grouped by its prefix.
    fn key(&self, ip: IpAddr) -> ClientKey {
        let ip = canonical(ip);
        let len = if ip.is_ipv4() {
            self.ipv4_prefix
        } else {
            self.ipv6_prefix
        };
        ClientKey::Ip(mask(ip, len))
    }

    /// The client's address for a request from `peer`.
    pub fn client(&self, peer: IpAddr, headers: &http::HeaderMap) -> IpAddr {
        let peer = canonical(peer);
        if !self.is_trusted(peer) {
            return peer;
        }
        let hops = forwarded_hops(headers, self.forwarding);
        let mut client = peer;
        for hop in hops.iter().rev().take(self.max_hops) {
            let Some(ip) = hop else {
                // Not an address: the last trusted hop is the client.
                return client;
            };
            client = canonical(*ip);
            if !self.is_trusted(client) {
                return client;
            }
        }
        client
    }
}

impl KeyExtractor for ClientIp {
    fn extract(&self, request: &http::request::Parts) -> Option<ClientKey> {
        let peer = peer_addr(&request.extensions)?;
        Some(self.key(self.client(peer.ip(), &request.headers)))
    }
}

/// The connection's peer address from a request's extensions.
fn peer_addr(extensions: &http::Extensions) -> Option<SocketAddr> {
    if let Some(addr) = extensions.get::<SocketAddr>() {
        return Some(*addr);
    }
    #[cfg(feature = "axum")]
    if let Some(axum::extract::ConnectInfo(addr)) =
        extensions.get::<axum::extract::ConnectInfo<SocketAddr>>()
    {
        return Some(*addr);
    }
    None
}

/// The forwarded chain of `forwarding`'s header, leftmost (the original
/// client) first, over all its lines in order. `None` marks a hop that is
/// not an address. Each hop is read on its own: bytes that are not text
/// in one (a client's) make that hop `None`, not the line's others (a
/// proxy's appended after it).
fn forwarded_hops(headers: &http::HeaderMap, forwarding: Forwarding) -> Vec<Option<IpAddr>> {
    let name = match forwarding {
        Forwarding::XForwardedFor => "x-forwarded-for",
        Forwarding::Forwarded => "forwarded",
        Forwarding::XRealIp => "x-real-ip",
    };
    let mut hops = Vec::new();
    for value in headers.get_all(name) {
        let bytes = value.as_bytes();
        if forwarding == Forwarding::Forwarded {
            forwarded_for(bytes, &mut hops);
        } else {
            for hop in bytes.split(|&b| b == b',') {
                hops.push(text(hop).and_then(|h| parse_hop(h.trim())));
            }
        }
    }
    hops
}

fn text(bytes: &[u8]) -> Option<&str> {
    std::str::from_utf8(bytes).ok()
}

/// The `for=` values of one `Forwarded` line (RFC 7239: elements split by
/// `,`, pairs by `;`, a value a token or a quoted string, in which `,`,
/// `;` and `=` are text), pushed as hops in order. A value not closed by
/// its quote is not an address.
fn forwarded_for(line: &[u8], hops: &mut Vec<Option<IpAddr>>) {
    let mut rest = line;
    while !rest.is_empty() {
        // One pair: up to the next `;` or `,` outside quotes.
        let mut quoted = false;
        let mut escaped = false;
        let mut end = rest.len();
        for (i, &b) in rest.iter().enumerate() {
            if escaped {
                escaped = false;
            } else if quoted && b == b'\\' {
                escaped = true;
            } else if b == b'"' {
                quoted = !quoted;
            } else if !quoted && (b == b';' || b == b',') {
                end = i;
                break;
            }
        }
        let pair = &rest[..end];
        rest = rest.get(end + 1..).unwrap_or(&[]);
        let Some(eq) = pair.iter().position(|&b| b == b'=') else {
            continue;
        };
        let (key, value) = (pair[..eq].trim_ascii(), pair[eq + 1..].trim_ascii());
        if !key.eq_ignore_ascii_case(b"for") {
            continue;
        }
        let value = match value {
            [b'"', inner @ .., b'"'] => inner,
            [b'"', ..] => {
                hops.push(None);
                continue;
            }
            token => token,
        };
        hops.push(text(value).and_then(parse_hop));
    }
}

/// One hop: `1.2.3.4`, `1.2.3.4:80`, `1.2.3.4:_port` (an obfuscated port,
/// RFC 7239), `2001:db8::1`, `[2001:db8::1]:80`, `fe80::1%eth0` (the zone
/// dropped).
fn parse_hop(hop: &str) -> Option<IpAddr> {
    if let Ok(ip) = hop.parse::<IpAddr>() {
        return Some(ip);
    }
    if let Ok(addr) = hop.parse::<SocketAddr>() {
        return Some(addr.ip());
    }
    if let Some(bracketed) = hop.strip_prefix('[') {
        let bare = bracketed.split(']').next().unwrap_or(bracketed);
        return bare.split('%').next().unwrap_or(bare).parse().ok();
    }
    // IPv4 with a port of any kind: one colon.
    if let Some((host, _port)) = hop.split_once(':')
        && let Ok(v4) = host.parse::<Ipv4Addr>()
    {
        return Some(IpAddr::V4(v4));
    }
    hop.split('%').next().unwrap_or(hop).parse().ok()
}

#[cfg(test)]
mod tests {
    use http::HeaderValue;

    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> http::HeaderMap {
        let mut map = http::HeaderMap::new();
        for (k, v) in pairs {
            map.append(
                HeaderName::from_str(k).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        map
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn networks_parse_and_contain() {
        let n: Cidr = "10.0.0.0/8".parse().unwrap();
        assert!(n.contains(ip("10.255.0.1")));
        assert!(!n.contains(ip("11.0.0.1")));
        assert!(n.contains(ip("::ffff:10.1.2.3")), "IPv4-mapped");
        let v6: Cidr = "2001:db8::/32".parse().unwrap();
        assert!(v6.contains(ip("2001:db8:ffff::1")));
        assert!(!v6.contains(ip("10.0.0.1")));
        assert!("1.2.3.4".parse::<Cidr>().unwrap().contains(ip("1.2.3.4")));
        assert!("0.0.0.0/0".parse::<Cidr>().unwrap().contains(ip("8.8.8.8")));
        for bad in [
            "10.0.0.0/33",
            "::/129",
            "10.0.0/8",
            "garbage",
            "1.2.3.4/x",
            "",
        ] {
            assert!(bad.parse::<Cidr>().is_err(), "{bad}");
        }
    }

    #[test]
    fn an_untrusted_peer_is_the_client_whatever_it_claims() {
        let extractor = ClientIp::new();
        let spoofed = headers(&[("x-forwarded-for", "1.1.1.1"), ("forwarded", "for=2.2.2.2")]);
        assert_eq!(
            extractor.client(ip("203.0.113.9"), &spoofed),
            ip("203.0.113.9")
        );
        let trusting = ClientIp::new().trust(["10.0.0.0/8"]).unwrap();
        assert_eq!(
            trusting.client(ip("203.0.113.9"), &spoofed),
            ip("203.0.113.9")
        );
    }

    #[test]
    fn two_trusted_proxies_name_the_client() {
        let extractor = ClientIp::new()
            .trust(["10.0.0.0/8", "192.168.0.0/16"])
            .unwrap();
        // client 198.51.100.4 → proxy 192.168.1.1 → proxy 10.0.0.2 → us.
        let h = headers(&[("x-forwarded-for", "6.6.6.6, 198.51.100.4, 192.168.1.1")]);
        assert_eq!(extractor.client(ip("10.0.0.2"), &h), ip("198.51.100.4"));
        // The client's own claim (6.6.6.6, leftmost) is not believed.
        let by = |forwarding| extractor.clone().forwarded_by(forwarding);
        let h = headers(&[(
            "forwarded",
            r#"for=6.6.6.6, for="[2001:db8::7]:4711";proto=https, for=192.168.1.1"#,
        )]);
        let forwarded = by(Forwarding::Forwarded);
        assert_eq!(forwarded.client(ip("10.0.0.2"), &h), ip("2001:db8::7"));
        let h = headers(&[("x-real-ip", "198.51.100.5")]);
        let real_ip = by(Forwarding::XRealIp);
        assert_eq!(real_ip.client(ip("10.0.0.2"), &h), ip("198.51.100.5"));
        // Only the header the proxies write is read: the others are the
        // client's, passed on.
        let h = headers(&[
            ("forwarded", "for=198.51.100.6"),
            ("x-forwarded-for", "198.51.100.7"),
            ("x-real-ip", "198.51.100.8"),
        ]);
        assert_eq!(extractor.client(ip("10.0.0.2"), &h), ip("198.51.100.7"));
        assert_eq!(forwarded.client(ip("10.0.0.2"), &h), ip("198.51.100.6"));
        assert_eq!(real_ip.client(ip("10.0.0.2"), &h), ip("198.51.100.8"));
    }

    #[test]
    fn malformed_chains_end_at_the_last_trusted_hop() {
        let extractor = ClientIp::new().trust(["10.0.0.0/8"]).unwrap().max_hops(3);
        for (value, client) in [
            ("garbage", "10.0.0.2"),
            ("1.2.3.4, unknown", "10.0.0.2"),
            ("1.2.3.4, _hidden, 10.0.0.9", "10.0.0.9"),
            ("1.2.3.4:8080", "1.2.3.4"),
            ("[2001:db8::1]:443", "2001:db8::1"),
            ("fe80::1%eth0", "fe80::1"),
            ("", "10.0.0.2"),
            (",,,", "10.0.0.2"),
            // More hops than read: the first untrusted among the last 3.
            ("9.9.9.9, 10.0.0.5, 10.0.0.6, 10.0.0.7", "10.0.0.5"),
        ] {
            let h = headers(&[("x-forwarded-for", value)]);
            assert_eq!(
                extractor.client(ip("10.0.0.2"), &h),
                ip(client),
                "{value:?}"
            );
        }
        let mut h = http::HeaderMap::new();
        h.insert(
            "x-forwarded-for",
            HeaderValue::from_bytes(b"\xff\xfe").unwrap(),
        );
        assert_eq!(extractor.client(ip("10.0.0.2"), &h), ip("10.0.0.2"));
    }

    #[test]
    fn a_header_name_from_configuration_is_checked() {
        assert!(Header::try_new("x-api-key").is_ok());
        assert!(Header::try_new("not a header").is_err());
        assert!(Header::try_new("").is_err());
    }

    #[test]
    fn ipv6_is_keyed_by_its_prefix() {
        let e = ClientIp::new();
        let a = e.key(ip("2001:db8:1:2:aaaa::1"));
        let b = e.key(ip("2001:db8:1:2:ffff:ffff:ffff:ffff"));
        assert_eq!(a, b);
        assert_eq!(a, ClientKey::Ip(ip("2001:db8:1:2::")));
        assert_ne!(a, e.key(ip("2001:db8:1:3::1")));
        assert_eq!(e.key(ip("::ffff:1.2.3.4")), ClientKey::Ip(ip("1.2.3.4")));
        let e = e.ipv4_prefix(24).ipv6_prefix(48);
        assert_eq!(e.key(ip("1.2.3.4")), ClientKey::Ip(ip("1.2.3.0")));
        assert_eq!(
            e.key(ip("2001:db8:1:2::1")),
            ClientKey::Ip(ip("2001:db8:1::"))
        );
        assert_eq!(ClientKey::Ip(ip("1.2.3.0")).to_string(), "ip:1.2.3.0");
    }
}
