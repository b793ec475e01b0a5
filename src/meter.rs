//! What a named limiter records through the `metrics` facade (the series
//! are listed in `crate::metrics`). Without the `metrics` feature a
//! [`Slot`] is zero-sized and its methods do nothing, so the call sites
//! need no `cfg`.

use std::time::Duration;

/// Why a request was refused, as the `outcome` label names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// `try_acquire` refused for the rate.
    Limited,
    /// A leaky bucket's shaper had no room.
    Overflow,
    /// The wait would exceed, or exceeded, the caller's limit.
    Timeout,
    /// More permits than the capacity.
    TooLarge,
    /// A keyed map full (`max_keys`).
    Unavailable,
}

impl Refusal {
    /// The refusal a `try_acquire` answer records (none for a grant or
    /// `Closed`).
    pub(crate) fn of_try<T>(answer: &Result<T, crate::TryAcquireError>) -> Option<Refusal> {
        use crate::TryAcquireError as E;
        match answer {
            Err(E::Limited { .. }) => Some(Refusal::Limited),
            Err(E::InsufficientCapacity) => Some(Refusal::TooLarge),
            Err(E::Unavailable) => Some(Refusal::Unavailable),
            Ok(_) | Err(E::Closed) => None,
        }
    }

    /// The refusal an `acquire` answer records (none for a grant or
    /// `Closed`).
    pub(crate) fn of_wait<T>(answer: &Result<T, crate::AcquireError>) -> Option<Refusal> {
        use crate::AcquireError as E;
        match answer {
            Err(E::Overflow) => Some(Refusal::Overflow),
            Err(E::Timeout) => Some(Refusal::Timeout),
            Err(E::InsufficientCapacity) => Some(Refusal::TooLarge),
            Ok(_) | Err(E::Closed | E::NoRuntime) => None,
        }
    }
}

#[cfg(feature = "metrics")]
impl Refusal {
    const ALL: [Refusal; 5] = [
        Refusal::Limited,
        Refusal::Overflow,
        Refusal::Timeout,
        Refusal::TooLarge,
        Refusal::Unavailable,
    ];

    fn label(self) -> &'static str {
        match self {
            Refusal::Limited => "limited",
            Refusal::Overflow => "overflow",
            Refusal::Timeout => "timeout",
            Refusal::TooLarge => "too_large",
            Refusal::Unavailable => "unavailable",
        }
    }
}

/// A limiter's handles into the recorder, registered once at build.
#[cfg(feature = "metrics")]
struct Meter {
    granted: metrics::Counter,
    permits: metrics::Counter,
    /// By [`Refusal`], in `Refusal::ALL`'s order.
    refused: [metrics::Counter; 5],
    waiting: metrics::Gauge,
    wait: metrics::Histogram,
    /// A keyed map's key count.
    keys: Option<metrics::Gauge>,
}

/// A limiter's metrics: nothing for an unnamed limiter (or without the
/// feature); one pointer either way.
#[derive(Default)]
pub(crate) struct Slot {
    #[cfg(feature = "metrics")]
    meter: Option<Box<Meter>>,
}

impl std::fmt::Debug for Slot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.is_on() {
            "Slot(on)"
        } else {
            "Slot(off)"
        })
    }
}

#[cfg_attr(
    not(feature = "metrics"),
    expect(
        clippy::unused_self,
        reason = "without the feature a slot is zero-sized and records nothing"
    )
)]
impl Slot {
    /// The meter of a limiter named `name` (a keyed map's when `keyed`);
    /// none when unnamed.
    #[cfg(feature = "metrics")]
    pub(crate) fn named(name: Option<&str>, keyed: bool) -> Slot {
        use crate::metrics::{KEYS, PERMITS, REQUESTS, WAIT_SECONDS, WAITING};
        static DESCRIBED: std::sync::Once = std::sync::Once::new();
        let Some(name) = name else {
            return Slot::default();
        };
        DESCRIBED.call_once(|| {
            metrics::describe_counter!(REQUESTS, "Requests answered by a rate limiter, by outcome");
            metrics::describe_counter!(PERMITS, "Permits granted by a rate limiter");
            metrics::describe_gauge!(WAITING, "Callers waiting on a rate limiter");
            metrics::describe_histogram!(
                WAIT_SECONDS,
                metrics::Unit::Seconds,
                "How long each waiting acquire waited"
            );
            metrics::describe_gauge!(KEYS, "Keys held by a keyed rate limiter");
        });
        let limiter = name.to_owned();
        let outcome = |outcome: &'static str| metrics::counter!(REQUESTS, "limiter" => limiter.clone(), "outcome" => outcome);
        Slot {
            meter: Some(Box::new(Meter {
                granted: outcome("granted"),
                permits: metrics::counter!(PERMITS, "limiter" => limiter.clone()),
                refused: Refusal::ALL.map(|r| outcome(r.label())),
                waiting: metrics::gauge!(WAITING, "limiter" => limiter.clone()),
                wait: metrics::histogram!(WAIT_SECONDS, "limiter" => limiter.clone()),
                keys: keyed.then(|| metrics::gauge!(KEYS, "limiter" => limiter.clone())),
            })),
        }
    }

    /// Whether this limiter records anything.
    #[inline]
    pub(crate) fn is_on(&self) -> bool {
        #[cfg(feature = "metrics")]
        return self.meter.is_some();
        #[cfg(not(feature = "metrics"))]
        false
    }

    /// A request of `n` permits was granted.
    #[inline]
    pub(crate) fn granted(&self, n: u32) {
        #[cfg(feature = "metrics")]
        if let Some(m) = &self.meter {
            m.granted.increment(1);
            m.permits.increment(u64::from(n));
        }
        #[cfg(not(feature = "metrics"))]
        let _ = n;
    }

    /// A request was refused.
    #[inline]
    pub(crate) fn refused(&self, why: Refusal) {
        #[cfg(feature = "metrics")]
        if let Some(m) = &self.meter {
            m.refused[why as usize].increment(1);
        }
        #[cfg(not(feature = "metrics"))]
        let _ = why;
    }

    /// `delta` more callers wait now (one starts: 1; one is done: -1).
    #[inline]
    pub(crate) fn waiting_more(&self, delta: i32) {
        #[cfg(feature = "metrics")]
        if let Some(m) = &self.meter {
            m.waiting.increment(f64::from(delta));
        }
        #[cfg(not(feature = "metrics"))]
        let _ = delta;
    }

    /// A waiting `acquire` ended after `waited`.
    #[inline]
    pub(crate) fn waited(&self, waited: Duration) {
        #[cfg(feature = "metrics")]
        if let Some(m) = &self.meter {
            m.wait.record(waited.as_secs_f64());
        }
        #[cfg(not(feature = "metrics"))]
        let _ = waited;
    }

    /// Records an answer of `n` permits: granted, or refused by `why`
    /// (nothing for neither, a closed limiter's).
    #[inline]
    pub(crate) fn answered(&self, n: u32, granted: bool, why: Option<Refusal>) {
        if granted {
            self.granted(n);
        } else if let Some(why) = why {
            self.refused(why);
        }
    }

    /// A keyed map holds `count` keys now.
    #[inline]
    pub(crate) fn keys(&self, count: usize) {
        #[cfg(feature = "metrics")]
        if let Some(keys) = self.meter.as_ref().and_then(|m| m.keys.as_ref()) {
            #[expect(clippy::cast_precision_loss, reason = "a gauge")]
            keys.set(count as f64);
        }
        #[cfg(not(feature = "metrics"))]
        let _ = count;
    }
}

/// A caller waiting, as the metrics see it: counted as waiting from its
/// start until it is dropped (granted, refused, timed out, or cancelled),
/// and its wait recorded then.
pub(crate) struct Waiter<'a> {
    meter: &'a Slot,
    since: Option<tokio::time::Instant>,
}

impl<'a> Waiter<'a> {
    pub(crate) fn start(meter: &'a Slot) -> Waiter<'a> {
        let since = meter.is_on().then(|| {
            meter.waiting_more(1);
            crate::clock::now()
        });
        Waiter { meter, since }
    }
}

impl Drop for Waiter<'_> {
    fn drop(&mut self) {
        if let Some(since) = self.since {
            self.meter.waiting_more(-1);
            self.meter
                .waited(crate::clock::now().saturating_duration_since(since));
        }
    }
}

/// A builder's `name` for the metrics (kept only with the feature).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Name {
    #[cfg(feature = "metrics")]
    name: Option<String>,
}

#[cfg_attr(
    not(feature = "metrics"),
    expect(
        clippy::unused_self,
        clippy::unnecessary_wraps,
        reason = "without the feature a name is kept nowhere and always valid"
    )
)]
impl Name {
    /// Names the limiter.
    #[cfg(feature = "metrics")]
    pub(crate) fn set(&mut self, name: String) {
        self.name = Some(name);
    }

    /// The name, if one was given.
    #[cfg(all(feature = "metrics", feature = "redis"))]
    pub(crate) fn get(&self) -> Option<&str> {
        self.name.as_deref()
    }

    /// Refuses an empty name: a `limiter=""` label is a mistake (an unset
    /// variable, say) that would merge every limiter so named into one
    /// series.
    pub(crate) fn check(&self) -> Result<(), crate::ConfigError> {
        #[cfg(feature = "metrics")]
        if self.name.as_deref().is_some_and(str::is_empty) {
            return Err(crate::ConfigError::InvalidParameter {
                name: "name",
                reason: "must not be empty",
            });
        }
        Ok(())
    }

    /// The limiter's meter (a keyed map's when `keyed`).
    pub(crate) fn slot(&self, keyed: bool) -> Slot {
        #[cfg(feature = "metrics")]
        return Slot::named(self.name.as_deref(), keyed);
        #[cfg(not(feature = "metrics"))]
        {
            let _ = keyed;
            Slot::default()
        }
    }
}
