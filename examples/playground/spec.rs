//! Limiter specs: `--limiter NAME[:KNOB=VALUE,…]`, one configuration of
//! one of the crate's limiters, and what building it gives the replay.
//!
//! A spec's *mode* is how its requests go through: `Try` calls
//! `try_acquire_many` (passes now or is refused), `Wait` awaits
//! `acquire_many` (passes when its turn comes, or fails).

use std::future::Future;
use std::hash::{BuildHasherDefault, DefaultHasher};
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use tokio_ratelimit::keyed::{Keyed, KeyedFunnel};
use tokio_ratelimit::{
    AcquireError, ConfigError, Funnel, LeakyBucket, Quota, Rate, SmoothBursty, SmoothWarmingUp,
    TokenBucket, TryAcquireError,
};

/// The limiter families.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Family {
    Token,
    Leaky,
    Funnel,
    Bursty,
    Warmup,
}

/// How a request goes through a limiter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    /// `try_acquire_many`: now or refused.
    Try,
    /// `acquire_many`: waits its turn.
    Wait,
}

/// The names `--limiter` knows: (name, family, mode, the call).
pub(crate) const KINDS: &[(&str, Family, Mode, &str)] = &[
    (
        "token",
        Family::Token,
        Mode::Try,
        "TokenBucket::try_acquire_many",
    ),
    (
        "token-wait",
        Family::Token,
        Mode::Wait,
        "TokenBucket::acquire_many",
    ),
    (
        "leaky",
        Family::Leaky,
        Mode::Try,
        "LeakyBucket::try_acquire_many",
    ),
    (
        "shaper",
        Family::Leaky,
        Mode::Wait,
        "LeakyBucket::acquire_many",
    ),
    (
        "funnel",
        Family::Funnel,
        Mode::Try,
        "Funnel::try_acquire_many",
    ),
    (
        "funnel-wait",
        Family::Funnel,
        Mode::Wait,
        "Funnel::acquire_many",
    ),
    (
        "bursty",
        Family::Bursty,
        Mode::Wait,
        "SmoothBursty::acquire_many",
    ),
    (
        "bursty-try",
        Family::Bursty,
        Mode::Try,
        "SmoothBursty::try_acquire_many",
    ),
    (
        "warmup",
        Family::Warmup,
        Mode::Wait,
        "SmoothWarmingUp::acquire_many",
    ),
    (
        "warmup-try",
        Family::Warmup,
        Mode::Try,
        "SmoothWarmingUp::try_acquire_many",
    ),
];

/// The knobs, for `--help` and the error messages.
pub(crate) const KNOBS: &str = "rate=R (per second, or N/PERIOD: 20/s, 100/m, 5/10s, 1000/d), \
capacity=N (or burst=N), quota=BAND+BAND… (a band is RATE:CAPACITY, e.g. 20/s:40+10000/d:10000), \
per-key, max-keys=N, initial=N (token), max-burst=SPAN (bursty), warmup=SPAN, cold-factor=F, \
timeout=SPAN (waiting modes), label=TEXT";

/// One limiter configuration.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Spec {
    /// How it is named in the report, the chart and the JSON.
    pub(crate) label: String,
    pub(crate) name: &'static str,
    pub(crate) family: Family,
    pub(crate) mode: Mode,
    call: &'static str,
    /// The limit: one band, or several.
    pub(crate) quota: Quota,
    /// One limiter per key of the traffic (`keyed::KeyedFunnel` for the
    /// funnel, `keyed::Keyed` for the others).
    pub(crate) per_key: bool,
    pub(crate) max_keys: Option<usize>,
    /// The token bucket's tokens at the start (default: full).
    pub(crate) initial: Option<u32>,
    /// `SmoothBursty`'s stored-permit horizon (default: capacity ÷ rate).
    pub(crate) max_burst: Option<Duration>,
    pub(crate) warmup: Duration,
    pub(crate) cold_factor: f64,
    /// How long a waiting request waits at most before it gives up.
    pub(crate) timeout: Option<Duration>,
}

/// The defaults a spec starts from: the demo's `--rate`, `--capacity`,
/// `--warmup` and `--cold-factor`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Defaults {
    pub(crate) rate: f64,
    pub(crate) capacity: u32,
    pub(crate) warmup: Duration,
    pub(crate) cold_factor: f64,
}

impl Spec {
    /// A spec of `name` with the defaults (the `--limiters` list's).
    pub(crate) fn named(name: &str, defaults: Defaults) -> Result<Spec, String> {
        let &(name, family, mode, call) = KINDS
            .iter()
            .find(|kind| kind.0 == name)
            .ok_or_else(|| format!("unknown limiter '{name}' (known: {})", kind_names()))?;
        Ok(Spec {
            label: name.to_owned(),
            name,
            family,
            mode,
            call,
            quota: Quota::new(Rate::per_second_f64(defaults.rate), defaults.capacity),
            per_key: false,
            max_keys: None,
            initial: None,
            max_burst: None,
            warmup: defaults.warmup,
            cold_factor: defaults.cold_factor,
            timeout: None,
        })
    }

    /// Parses `NAME[:KNOB=VALUE,…]`.
    pub(crate) fn parse(text: &str, defaults: Defaults) -> Result<Spec, String> {
        let text = text.trim();
        let (name, knobs) = text.split_once(':').unwrap_or((text, ""));
        let mut spec = Spec::named(name.trim(), defaults)?;
        text.clone_into(&mut spec.label);
        let (mut rate, mut capacity, mut quota) = (None, None, None);
        for knob in knobs.split(',').map(str::trim).filter(|k| !k.is_empty()) {
            let (key, value) = knob
                .split_once('=')
                .map_or((knob, ""), |(k, v)| (k.trim(), v.trim()));
            let bad = |reason: String| format!("{key}={value}: {reason}");
            match key {
                "rate" => rate = Some(parse_rate(value).map_err(bad)?),
                "capacity" | "burst" => capacity = Some(whole(value).map_err(bad)?),
                "quota" => quota = Some(parse_quota(value).map_err(bad)?),
                "per-key" if value.is_empty() => spec.per_key = true,
                "max-keys" => {
                    spec.max_keys = Some(whole(value).map_err(bad)? as usize);
                }
                "initial" if spec.family == Family::Token => {
                    spec.initial = Some(
                        value
                            .parse()
                            .map_err(|_| bad("expects a whole number".into()))?,
                    );
                }
                "max-burst" if spec.family == Family::Bursty => {
                    spec.max_burst = Some(parse_span(value).map_err(bad)?);
                }
                "warmup" if spec.family == Family::Warmup => {
                    spec.warmup = parse_span(value).map_err(bad)?;
                }
                "cold-factor" if spec.family == Family::Warmup => {
                    spec.cold_factor = match value.parse::<f64>() {
                        Ok(f) if f >= 1.0 && f.is_finite() => f,
                        _ => return Err(bad("must be a number of at least 1".into())),
                    };
                }
                "timeout" if spec.mode == Mode::Wait => {
                    spec.timeout = Some(parse_span(value).map_err(bad)?);
                }
                "label" if !value.is_empty() => value.clone_into(&mut spec.label),
                _ => {
                    return Err(format!(
                        "'{knob}' is not a knob of '{}' (knobs: {KNOBS}; some are for one limiter only)",
                        spec.name
                    ));
                }
            }
        }
        if quota.is_some() && (rate.is_some() || capacity.is_some()) {
            return Err("give either quota= or rate= and capacity=, not both".to_owned());
        }
        let one = spec.quota.bands()[0];
        spec.quota = quota.unwrap_or_else(|| {
            Quota::new(
                rate.unwrap_or(one.rate()),
                capacity.unwrap_or(one.capacity()),
            )
        });
        if spec.quota.bands().len() > 1 && matches!(spec.family, Family::Bursty | Family::Warmup) {
            return Err(format!(
                "'{}' takes one rate, not a quota of several bands",
                spec.name
            ));
        }
        Ok(spec)
    }

    /// The limit in words: `20/s burst 40`, `20/s burst 40 + 10000/1d burst 10000`.
    pub(crate) fn describe_limit(&self) -> String {
        let bands: Vec<String> = self
            .quota
            .bands()
            .iter()
            .map(|band| format!("{} burst {}", show_rate(band.rate()), band.capacity()))
            .collect();
        bands.join(" + ")
    }

    /// The method each request calls.
    pub(crate) fn call(&self) -> String {
        match (self.per_key, self.family) {
            (false, _) => self.call.to_owned(),
            (true, Family::Funnel) => format!("keyed::Keyed{}", self.call),
            (true, _) => {
                let (limiter, method) = self.call.split_once("::").expect("Type::method");
                format!("keyed::Keyed<_, {limiter}>::{method}")
            }
        }
    }

    fn rate(&self) -> Rate {
        self.quota.bands()[0].rate()
    }

    fn capacity(&self) -> u32 {
        self.quota.bands()[0].capacity()
    }
}

fn kind_names() -> String {
    KINDS.iter().map(|k| k.0).collect::<Vec<_>>().join(", ")
}

fn whole(value: &str) -> Result<u32, String> {
    match value.parse::<u32>() {
        Ok(0) => Err("must be at least 1".to_owned()),
        Ok(n) => Ok(n),
        Err(_) => Err("expects a whole number".to_owned()),
    }
}

/// `20` (per second, may be fractional) or `N/PERIOD` (`20/s`, `5/10s`).
pub(crate) fn parse_rate(value: &str) -> Result<Rate, String> {
    let rate = match value.split_once('/') {
        Some((n, period)) => {
            let n = whole(n.trim())?;
            let period = period.trim();
            let period = if period.starts_with(|c: char| c.is_ascii_digit()) {
                parse_span(period)?
            } else {
                parse_span(&format!("1{period}"))?
            };
            Rate::per(n, period)
        }
        None => match value.parse::<f64>() {
            Ok(x) if x.is_finite() && x > 0.0 => Rate::per_second_f64(x),
            _ => return Err("expects a positive number per second, or N/PERIOD".to_owned()),
        },
    };
    rate.validate().map_err(|e| e.to_string())?;
    Ok(rate)
}

/// `RATE:CAPACITY+RATE:CAPACITY…`
fn parse_quota(value: &str) -> Result<Quota, String> {
    let mut quota: Option<Quota> = None;
    for band in value.split('+') {
        let (rate, capacity) = band
            .split_once(':')
            .ok_or_else(|| format!("the band '{band}' is not RATE:CAPACITY"))?;
        let (rate, capacity) = (parse_rate(rate.trim())?, whole(capacity.trim())?);
        quota = Some(match quota {
            None => Quota::new(rate, capacity),
            Some(quota) if quota.bands().len() < Quota::MAX_BANDS => quota.and(rate, capacity),
            Some(_) => return Err(format!("more than {} bands", Quota::MAX_BANDS)),
        });
    }
    quota.ok_or_else(|| "no band".to_owned())
}

/// A span: `250ms`, `1.5s`, `2m`, `1h30m`, `1d`, `10us`, `100ns`; a bare
/// number is seconds.
pub(crate) fn parse_span(value: &str) -> Result<Duration, String> {
    let value = value.trim();
    let bad = || format!("'{value}' is not a span (250ms, 1.5s, 2m, 1h30m, 1d)");
    let mut rest = value;
    let mut seconds = 0.0;
    if rest.is_empty() {
        return Err(bad());
    }
    while !rest.is_empty() {
        let split = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let number: f64 = rest[..split].parse().map_err(|_| bad())?;
        rest = &rest[split..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let unit = match rest[..unit_len].trim() {
            "" | "s" => 1.0,
            "ns" => 1e-9,
            "us" | "µs" => 1e-6,
            "ms" => 1e-3,
            "m" | "min" => 60.0,
            "h" => 3600.0,
            "d" => 86_400.0,
            other => {
                return Err(format!(
                    "unknown unit '{other}' in '{value}' (ns, us, ms, s, m, h, d)"
                ));
            }
        };
        rest = &rest[unit_len..];
        seconds += number * unit;
    }
    Duration::try_from_secs_f64(seconds)
        .ok()
        .filter(|d| !d.is_zero())
        .ok_or_else(|| format!("'{value}' must be more than 0 and at most 584 years"))
}

/// A rate for people, in the period it was given: `20/s`, `1/2s`,
/// `600/1m`, `10000/1d`.
pub(crate) fn show_rate(rate: Rate) -> String {
    let period = rate.period();
    let per_second = rate.permits_per_second();
    // A rate given per second may have been reduced (2/s is 1/500ms).
    if period <= Duration::from_secs(1) {
        format!("{}/s", super::number(per_second))
    } else {
        format!("{}/{}", rate.permits(), super::traffic::show_span(period))
    }
}

// ---------------------------------------------------------------------------
// Building
// ---------------------------------------------------------------------------

/// A try-mode limiter: decides `(key, permits)` at once, at tokio's now.
pub(crate) type Meter = Box<dyn Fn(u32, u32) -> Result<(), TryAcquireError>>;

/// A waiting-mode limiter: the future of one request `(key, permits)`.
pub(crate) type Waiter = Arc<dyn Fn(u32, u32) -> Wait + Send + Sync>;

/// One request's wait.
pub(crate) type Wait = Pin<Box<dyn Future<Output = Result<(), AcquireError>> + Send>>;

/// The keyed maps' hasher: `SipHash` with fixed keys rather than std's
/// random ones. Keys come from the traffic, not from an attacker, and a
/// replay must give the same answers on every run: with `max-keys`, whether
/// a new key finds room depends on which shard it hashes to (only its
/// shard is swept for drained keys), so a random hasher makes the number of
/// `Unavailable` refusals vary from run to run.
type Fixed = BuildHasherDefault<DefaultHasher>;

/// A built limiter.
pub(crate) enum Built {
    Meter(Meter),
    Waiter(Waiter),
}

impl Spec {
    /// Builds the limiter, inside the replay's runtime (the actors of the
    /// token and leaky buckets are spawned on it).
    pub(crate) fn build(&self) -> Result<Built, ConfigError> {
        match (self.family, self.per_key) {
            (Family::Funnel, true) => {
                let mut builder = KeyedFunnel::<u32>::builder().hasher(Fixed::default());
                builder.quota(self.quota).background_sweep(false);
                if let Some(max) = self.max_keys {
                    builder.max_keys(max);
                }
                let map = builder.build()?;
                Ok(match self.mode {
                    Mode::Try => {
                        Built::Meter(Box::new(move |key, n| map.try_acquire_many(&key, n)))
                    }
                    Mode::Wait => Built::Waiter(self.with_timeout(Arc::new(move |key, n| {
                        let map = map.clone();
                        Box::pin(async move { map.acquire_many(&key, n).await })
                    }))),
                })
            }
            (Family::Token, true) => {
                let this = self.clone();
                self.keyed(move || this.token_bucket())
            }
            (Family::Leaky, true) => {
                let this = self.clone();
                self.keyed(move || this.leaky_bucket())
            }
            (Family::Bursty, true) => {
                let this = self.clone();
                self.keyed(move || this.bursty())
            }
            (Family::Warmup, true) => {
                let this = self.clone();
                self.keyed(move || this.warming_up())
            }
            (Family::Token, false) => Ok(self.single(self.token_bucket()?)),
            (Family::Leaky, false) => Ok(self.single(self.leaky_bucket()?)),
            (Family::Funnel, false) => {
                Ok(self.single(Funnel::builder().quota(self.quota).build()?))
            }
            (Family::Bursty, false) => Ok(self.single(self.bursty()?)),
            (Family::Warmup, false) => Ok(self.single(self.warming_up()?)),
        }
    }

    fn token_bucket(&self) -> Result<TokenBucket, ConfigError> {
        let mut builder = TokenBucket::builder();
        builder.quota(self.quota);
        if let Some(initial) = self.initial {
            builder.initial(initial);
        }
        builder.build()
    }

    fn leaky_bucket(&self) -> Result<LeakyBucket, ConfigError> {
        LeakyBucket::builder().quota(self.quota).build()
    }

    fn bursty(&self) -> Result<SmoothBursty, ConfigError> {
        let rate = self.rate().permits_per_second();
        let max_burst = self
            .max_burst
            .unwrap_or_else(|| Duration::from_secs_f64(f64::from(self.capacity()) / rate));
        SmoothBursty::builder()
            .permits_per_second(rate)
            .max_burst(max_burst)
            .build()
    }

    fn warming_up(&self) -> Result<SmoothWarmingUp, ConfigError> {
        SmoothWarmingUp::builder()
            .permits_per_second(self.rate().permits_per_second())
            .warmup(self.warmup)
            .cold_factor(self.cold_factor)
            .build()
    }

    /// One limiter for every request.
    fn single<L: tokio_ratelimit::Limiter + 'static>(&self, limiter: L) -> Built {
        match self.mode {
            Mode::Try => Built::Meter(Box::new(move |_, n| limiter.try_acquire_many(n))),
            Mode::Wait => {
                let limiter = Arc::new(limiter);
                Built::Waiter(self.with_timeout(Arc::new(move |_, n| {
                    let limiter = Arc::clone(&limiter);
                    Box::pin(async move { limiter.acquire_many(n).await })
                })))
            }
        }
    }

    /// One limiter per key, built from `make` on a key's first request.
    fn keyed<L, F>(&self, make: F) -> Result<Built, ConfigError>
    where
        L: tokio_ratelimit::Limiter + Clone + 'static,
        F: Fn() -> Result<L, ConfigError> + Send + Sync + 'static,
    {
        // Fail now, not on every key's first request.
        drop(make()?);
        let mut builder = Keyed::<u32, L>::builder().hasher(Fixed::default());
        builder.limiter(make).background_sweep(false);
        if let Some(max) = self.max_keys {
            builder.max_keys(max);
        }
        let map = builder.build()?;
        Ok(match self.mode {
            Mode::Try => Built::Meter(Box::new(move |key, n| map.try_acquire_many(&key, n))),
            Mode::Wait => Built::Waiter(self.with_timeout(Arc::new(move |key, n| {
                let map = map.clone();
                Box::pin(async move { map.acquire_many(&key, n).await })
            }))),
        })
    }

    /// The waiter, giving up after `timeout` if there is one (dropping the
    /// wait gives back what it reserved: the limiters are cancel-safe).
    fn with_timeout(&self, waiter: Waiter) -> Waiter {
        match self.timeout {
            None => waiter,
            Some(timeout) => Arc::new(move |key, n| {
                let wait = waiter(key, n);
                Box::pin(async move {
                    tokio::time::timeout(timeout, wait)
                        .await
                        .unwrap_or(Err(AcquireError::Timeout))
                })
            }),
        }
    }
}
