//! [`HttpRateLimitLayer`]: who the client is, the limit's decision, the
//! answer, and the headers, for any tower HTTP service.

use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use futures::future::BoxFuture;
use http::header::RETRY_AFTER;
use http::{HeaderName, HeaderValue, Request, Response, StatusCode};
use tower_layer::Layer;
use tower_service::Service;

use super::client::{ClientKey, KeyExtractor};
use super::headers;
use crate::keyed::AsyncKeyedLimiter;
use crate::{BandState, Peek, Quota, TryAcquireError};

/// What to do with a request whose key cannot be extracted (no peer
/// address, no such header): never a panic.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Unidentified {
    /// Answer with this status, without calling the service (the default:
    /// `400 Bad Request`).
    Reject(StatusCode),
    /// Let it through, unlimited.
    Allow,
    /// Limit all of them together, under this key.
    Key(ClientKey),
}

/// The quota of a key, when keys have tiers.
type QuotaFor = dyn Fn(&ClientKey) -> Option<Quota> + Send + Sync;

/// A layer's configuration. Setters copy it if the layer has been cloned
/// (the clone keeps what it had); the limiter and the extractor are shared
/// by every copy.
struct Config<L, E> {
    limiter: Arc<L>,
    extractor: Arc<E>,
    quota_for: Option<Arc<QuotaFor>>,
    unidentified: Unidentified,
    limited: StatusCode,
    unavailable: StatusCode,
    unavailable_retry_after: Duration,
    policy_headers: bool,
    legacy_headers: bool,
    /// The fields of each quota seen, built once.
    fields: headers::FieldsCache,
}

impl<L, E> Config<L, E> {
    /// The same configuration, sharing the limiter and the extractor (and
    /// starting a cache of header fields of its own).
    fn copy(&self) -> Config<L, E> {
        Config {
            limiter: Arc::clone(&self.limiter),
            extractor: Arc::clone(&self.extractor),
            quota_for: self.quota_for.clone(),
            unidentified: self.unidentified.clone(),
            limited: self.limited,
            unavailable: self.unavailable,
            unavailable_retry_after: self.unavailable_retry_after,
            policy_headers: self.policy_headers,
            legacy_headers: self.legacy_headers,
            fields: headers::FieldsCache::default(),
        }
    }
}

/// Rate limits an HTTP service per client, answering for the limit: finds
/// each request's [`ClientKey`] with a [`KeyExtractor`], takes one permit
/// of that key from a keyed limiter — a
/// [`KeyedFunnel<ClientKey>`](crate::keyed::KeyedFunnel) in the process,
/// or a `redis::RedisFunnel` shared by a fleet (any
/// [`AsyncKeyedLimiter`] whose key is made from a `ClientKey`) — and:
///
/// * granted: calls the service;
/// * over the limit: `429 Too Many Requests`, with `Retry-After` in whole
///   seconds, rounded up (never 0 while limited);
/// * the limit could not be decided — a keyed map full (`max_keys`), or a
///   shared store failing closed: `503 Service Unavailable` with a
///   `Retry-After` of a second (configurable): not the client's doing, so
///   never a 429. (A store failing *open* grants, and counts it.)
///
/// On granted and refused responses alike it adds `RateLimit-Policy` and
/// `RateLimit` (draft-ietf-httpapi-ratelimit-headers-12; one item per band
/// of the key's quota, see the [module docs](super)), and optionally the
/// legacy `X-RateLimit-Limit`, `-Remaining` and `-Reset`, from the key's
/// state as the decision left it: read with the decision (for a
/// `KeyedFunnel` the same read of the key, for `RedisFunnel` the same round
/// trip; a refusal `RedisFunnel` answers from its refusal cache reports the
/// bands that refusal showed, moved on to now). `RateLimit-Policy` is built
/// once per quota. A request a shared store could not decide and granted
/// by failing open carries no fields: no state was read.
///
/// A local map decides inside `call`, and the service made ready is
/// called at once: no future is boxed. A shared store's decision is one
/// boxed future.
///
/// The setters may be called in any order, before or after the layer is
/// cloned: a setter changes the layer it is called on (and the services it
/// makes from then on), never a clone made before; the clones share the
/// limiter and the extractor.
///
/// Refusals have an empty body (`ResBody: Default`, as axum's `Body`);
/// their statuses are configurable. The service must be `Clone` (the one
/// made ready goes with the decision).
///
/// # Examples
///
/// ```
/// use axum::{Router, routing::get};
/// use tokio_ratelimit::http::{ClientIp, ClientKey, Header, HttpRateLimitLayer, KeyExtractor};
/// use tokio_ratelimit::{Quota, Rate, keyed::KeyedFunnel};
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let free = Quota::new(Rate::per_second(20), 40).and(Rate::per_day(10_000), 10_000);
/// let paid = Quota::new(Rate::per_second(200), 400).and(Rate::per_day(100_000), 100_000);
/// let limits: KeyedFunnel<ClientKey> = KeyedFunnel::builder().quota(free).tier(paid).build()?;
/// let per_client = HttpRateLimitLayer::new(limits, Header::new("x-api-key").or(ClientIp::new()))
///     .quota_for(move |key| matches!(key, ClientKey::Value(k) if k.starts_with("paid-")).then_some(paid));
/// let app: Router = Router::new().route("/", get(|| async { "hi" })).layer(per_client);
/// # Ok(())
/// # }
/// ```
pub struct HttpRateLimitLayer<L, E> {
    config: Arc<Config<L, E>>,
}

impl<L, E> Clone for HttpRateLimitLayer<L, E> {
    fn clone(&self) -> Self {
        HttpRateLimitLayer {
            config: Arc::clone(&self.config),
        }
    }
}

impl<L, E> HttpRateLimitLayer<L, E> {
    /// Limits each request by `extractor`'s key in `limiter`, under the
    /// limiter's own quota.
    pub fn new(limiter: L, extractor: E) -> Self {
        HttpRateLimitLayer {
            config: Arc::new(Config {
                limiter: Arc::new(limiter),
                extractor: Arc::new(extractor),
                quota_for: None,
                unidentified: Unidentified::Reject(StatusCode::BAD_REQUEST),
                limited: StatusCode::TOO_MANY_REQUESTS,
                unavailable: StatusCode::SERVICE_UNAVAILABLE,
                unavailable_retry_after: Duration::from_secs(1),
                policy_headers: true,
                legacy_headers: false,
                fields: headers::FieldsCache::default(),
            }),
        }
    }

    /// Changes the configuration of this layer (and of the services it
    /// makes from now on) only: once the layer has been cloned, the
    /// configuration is copied first, so a clone keeps what it had.
    fn with(mut self, change: impl FnOnce(&mut Config<L, E>)) -> Self {
        if Arc::get_mut(&mut self.config).is_none() {
            self.config = Arc::new(self.config.copy());
        }
        if let Some(config) = Arc::get_mut(&mut self.config) {
            change(config);
        }
        self
    }

    /// The quota of a key (its tier): `None` for the limiter's own. With a
    /// `KeyedFunnel`, every quota returned must be one of the map's tiers
    /// (another is refused as `Closed`: a 503).
    #[must_use]
    pub fn quota_for<F>(self, quota_for: F) -> Self
    where
        F: Fn(&ClientKey) -> Option<Quota> + Send + Sync + 'static,
    {
        self.with(|c| c.quota_for = Some(Arc::new(quota_for)))
    }

    /// What to do with a request whose key cannot be extracted (default:
    /// reject with `400 Bad Request`).
    #[must_use]
    pub fn unidentified(self, answer: Unidentified) -> Self {
        self.with(|c| c.unidentified = answer)
    }

    /// The status of a request over its limit (default `429`).
    #[must_use]
    pub fn limited_status(self, status: StatusCode) -> Self {
        self.with(|c| c.limited = status)
    }

    /// The status and `Retry-After` of a request whose limit could not be
    /// decided (default `503`, 1 s).
    #[must_use]
    pub fn unavailable(self, status: StatusCode, retry_after: Duration) -> Self {
        self.with(|c| {
            c.unavailable = status;
            c.unavailable_retry_after = retry_after;
        })
    }

    /// Whether to add `RateLimit-Policy` and `RateLimit` (default: yes).
    #[must_use]
    pub fn policy_headers(self, enabled: bool) -> Self {
        self.with(|c| c.policy_headers = enabled)
    }

    /// Whether to add the legacy `X-RateLimit-Limit`, `-Remaining` and
    /// `-Reset`, for the band that binds first (default: no).
    #[must_use]
    pub fn legacy_headers(self, enabled: bool) -> Self {
        self.with(|c| c.legacy_headers = enabled)
    }
}

impl<L, E> fmt::Debug for HttpRateLimitLayer<L, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HttpRateLimitLayer")
            .field("unidentified", &self.config.unidentified)
            .field("limited", &self.config.limited)
            .field("unavailable", &self.config.unavailable)
            .finish_non_exhaustive()
    }
}

impl<S, L, E> Layer<S> for HttpRateLimitLayer<L, E> {
    type Service = HttpRateLimit<S, L, E>;

    fn layer(&self, inner: S) -> Self::Service {
        HttpRateLimit {
            inner,
            config: Arc::clone(&self.config),
        }
    }
}

/// The service [`HttpRateLimitLayer`] makes.
pub struct HttpRateLimit<S, L, E> {
    inner: S,
    config: Arc<Config<L, E>>,
}

impl<S: Clone, L, E> Clone for HttpRateLimit<S, L, E> {
    fn clone(&self) -> Self {
        HttpRateLimit {
            inner: self.inner.clone(),
            config: Arc::clone(&self.config),
        }
    }
}

impl<S: fmt::Debug, L, E> fmt::Debug for HttpRateLimit<S, L, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HttpRateLimit")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

impl<S, L, E, ReqBody, ResBody> Service<Request<ReqBody>> for HttpRateLimit<S, L, E>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    ReqBody: Send + 'static,
    ResBody: Default + Send + 'static,
    L: AsyncKeyedLimiter + 'static,
    L::Key: From<ClientKey>,
    E: KeyExtractor,
{
    type Response = Response<ResBody>;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future, ResBody, S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        let (parts, body) = request.into_parts();
        let key = self.config.extractor.extract(&parts);
        let request = Request::from_parts(parts, body);
        let key = match key {
            Some(key) => key,
            None => match &self.config.unidentified {
                Unidentified::Key(key) => key.clone(),
                Unidentified::Allow => {
                    return ResponseFuture::called(self.inner.call(request), Added::none());
                }
                Unidentified::Reject(status) => {
                    tracing::debug!(%status, "http rate limit: no key for the request");
                    return ResponseFuture::ready(empty(*status));
                }
            },
        };
        let quota = self.config.quota_for.as_ref().and_then(|f| f(&key));
        let key = L::Key::from(key);
        // A local map decides at once: the service made ready is called
        // now, and no future is boxed.
        if let Some(report) = self
            .config
            .limiter
            .try_acquire_and_peek_now(&key, quota.as_ref(), 1)
        {
            let added = self.config.fields(&report);
            return match self.config.refusal(&report) {
                None => ResponseFuture::called(self.inner.call(request), added),
                Some(mut response) => {
                    added.add_to(&mut response);
                    ResponseFuture::ready(response)
                }
            };
        }
        // A shared store: the service made ready goes with the decision.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let config = Arc::clone(&self.config);
        ResponseFuture::boxed(Box::pin(async move {
            let report = config
                .limiter
                .try_acquire_and_peek(&key, quota.as_ref(), 1)
                .await;
            let added = config.fields(&report);
            let mut response = match config.refusal(&report) {
                None => inner.call(request).await?,
                Some(response) => response,
            };
            added.add_to(&mut response);
            Ok(response)
        }))
    }
}

impl<L, E> Config<L, E> {
    /// The response for a refused request (`None`: granted).
    fn refusal<B: Default>(&self, report: &Peek) -> Option<Response<B>> {
        match report.answer() {
            Ok(()) => None,
            Err(TryAcquireError::Limited { retry_after }) => {
                Some(with_retry_after(self.limited, retry_after))
            }
            Err(TryAcquireError::Unavailable) => Some(with_retry_after(
                self.unavailable,
                self.unavailable_retry_after,
            )),
            Err(error) => {
                // n = 1 above every capacity cannot be; a closed limiter,
                // or a quota it cannot hold keys to.
                tracing::warn!(%error, "http rate limit: the limiter cannot serve the request");
                Some(empty(StatusCode::SERVICE_UNAVAILABLE))
            }
        }
    }

    /// The rate-limit fields for a response to `report`: none unless the
    /// limit decided on the key (its state is the key's only then).
    fn fields(&self, report: &Peek) -> Added {
        let decided = matches!(
            report.answer(),
            Ok(()) | Err(TryAcquireError::Limited { .. })
        );
        let mut added = Added::none();
        if !decided || !(self.policy_headers || self.legacy_headers) {
            return added;
        }
        let states: Vec<BandState> = report.bands().collect();
        if self.policy_headers {
            if let Some(fields) = self.fields.get(&states) {
                added.push(HeaderName::from_static("ratelimit-policy"), fields.policy());
                if let Some(v) = fields.limit(&states) {
                    added.push(HeaderName::from_static("ratelimit"), v);
                }
            }
        }
        if self.legacy_headers {
            for (name, v) in headers::legacy(&states).into_iter().flatten() {
                added.push(HeaderName::from_static(name), v);
            }
        }
        added
    }
}

/// Fields to add to a response, kept inline (at most five).
struct Added {
    fields: [Option<(HeaderName, HeaderValue)>; 5],
}

impl Added {
    fn none() -> Added {
        Added {
            fields: Default::default(),
        }
    }

    fn push(&mut self, name: HeaderName, value: HeaderValue) {
        if let Some(slot) = self.fields.iter_mut().find(|f| f.is_none()) {
            *slot = Some((name, value));
        }
    }

    fn add_to<B>(self, response: &mut Response<B>) {
        let headers = response.headers_mut();
        for (name, value) in self.fields.into_iter().flatten() {
            headers.insert(name, value);
        }
    }
}

pin_project_lite::pin_project! {
    /// The response future of [`HttpRateLimit`]: the service's response
    /// with the rate-limit fields added, or the refusal.
    pub struct ResponseFuture<F, B, E> {
        #[pin]
        kind: Kind<F, B, E>,
    }
}

pin_project_lite::pin_project! {
    #[project = KindProj]
    enum Kind<F, B, E> {
        Called { #[pin] future: F, added: Option<Added> },
        Ready { response: Option<Response<B>> },
        Boxed { future: BoxFuture<'static, Result<Response<B>, E>> },
    }
}

impl<F, B, E> ResponseFuture<F, B, E> {
    fn called(future: F, added: Added) -> Self {
        ResponseFuture {
            kind: Kind::Called {
                future,
                added: Some(added),
            },
        }
    }

    fn ready(response: Response<B>) -> Self {
        ResponseFuture {
            kind: Kind::Ready {
                response: Some(response),
            },
        }
    }

    fn boxed(future: BoxFuture<'static, Result<Response<B>, E>>) -> Self {
        ResponseFuture {
            kind: Kind::Boxed { future },
        }
    }
}

impl<F, B, E> std::future::Future for ResponseFuture<F, B, E>
where
    F: std::future::Future<Output = Result<Response<B>, E>>,
{
    type Output = Result<Response<B>, E>;

    fn poll(self: std::pin::Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().kind.project() {
            KindProj::Called { future, added } => {
                let mut response = std::task::ready!(future.poll(cx))?;
                if let Some(added) = added.take() {
                    added.add_to(&mut response);
                }
                Poll::Ready(Ok(response))
            }
            KindProj::Ready { response } => Poll::Ready(Ok(response
                .take()
                .expect("ResponseFuture polled after completion"))),
            KindProj::Boxed { future } => future.as_mut().poll(cx),
        }
    }
}

impl<F, B, E> fmt::Debug for ResponseFuture<F, B, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}

fn empty<B: Default>(status: StatusCode) -> Response<B> {
    let mut response = Response::new(B::default());
    *response.status_mut() = status;
    response
}

fn with_retry_after<B: Default>(status: StatusCode, retry_after: Duration) -> Response<B> {
    let mut response = empty(status);
    let seconds = headers::seconds_up(retry_after).max(1);
    response
        .headers_mut()
        .insert(RETRY_AFTER, HeaderValue::from(seconds));
    response
}
