//! The HTTP edge (feature `http`): who the client is, what to answer, and
//! the standard headers, in one tower layer an axum service adopts in a
//! few lines.
//!
//! * **Who** — [`KeyExtractor`]s find a request's [`ClientKey`]: the
//!   peer's address ([`ClientIp`]), or the client's address behind proxies
//!   the service trusts (and only those: a client's own
//!   `X-Forwarded-For` is ignored by default; behind them, only the one
//!   header they write is read, [`Forwarding`]), IPv6 grouped by /64; a
//!   header such as an API key ([`Header`]); one key for everyone
//!   ([`Global`]); and one else another ([`KeyExtractor::or`]).
//! * **What to answer** — [`HttpRateLimitLayer`]: `429` with `Retry-After`
//!   over the limit; `503` with `Retry-After` when the limit cannot be
//!   decided (a keyed map full, a shared store failing closed), never
//!   blaming the client; a configurable answer for a request with no key.
//! * **Headers** — `RateLimit-Policy` and `RateLimit` as
//!   draft-ietf-httpapi-ratelimit-headers-12 defines them, one item per
//!   band of the key's quota, from the state the decision left; optionally
//!   the legacy `X-RateLimit-*`.
//!
//! # The fields
//!
//! A quota of 20 per second with bursts of 40, and 10 000 per day, after a
//! client's first request:
//!
//! ```text
//! RateLimit-Policy: "40-per-2s";q=40;w=2, "10000-per-86400s";q=10000;w=86400
//! RateLimit: "40-per-2s";r=39;t=1, "10000-per-86400s";r=9999;t=9
//! ```
//!
//! Each band is a policy named for what it allows. A band refills its
//! whole capacity `C` in `τ = C / rate`: its window `w` is `τ` in whole
//! seconds, rounded up (at least 1, as the draft requires), and `q` what
//! refills in `w` — the capacity itself when `τ` is whole seconds. `r` is
//! the permits available now, `t` the seconds until one more is (rounded
//! up; 0 when the band is full). The bucket refills continuously, so "per
//! window" here is a rate, not a fixed window that resets all at once.

mod client;
mod headers;
mod layer;

pub use client::{
    Cidr, CidrError, ClientIp, ClientKey, Forwarding, Global, Header, KeyExtractor, Or,
};
pub use layer::{HttpRateLimit, HttpRateLimitLayer, ResponseFuture, Unidentified};
