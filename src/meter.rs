//! What a named limiter records through the `metrics` facade (the series
//! are listed in `crate::metrics`). Without the `metrics` feature a
//! [`Slot`] is zero-sized and its methods do nothing, so the call sites
//! need no `cfg`.

use std::sync::Weak;
use std::time::Duration;

/// The owner of a named limiter's meter, as the background publisher holds
/// it: publishing reads the owner's permit counter and hands it to its
/// [`Slot::publish`].
pub(crate) trait Publish: Send + Sync {
    /// Adds what was granted since the last time to the recorder.
    fn publish(&self);
}

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
///
/// Grants and rate-limit refusals are not pushed to the recorder one by
/// one: the owner's own counters (the ones `stats()` reads, paid anyway)
/// are the count, and [`Slot::publish`] adds what they grew by since the
/// last time to the `granted`, `permits` and `limited` series (see
/// `publisher` below). The requests granted are the permits less `extra`,
/// the `limited` refusals the refusals less `others` (the rarer causes,
/// which are also recorded as they happen), so that a one-permit grant and
/// a rate-limit refusal cost the meter nothing.
#[cfg(feature = "metrics")]
struct Meter {
    granted: metrics::Counter,
    permits: metrics::Counter,
    /// Σ (n − 1) over the grants of more than one permit.
    extra: crate::sync::AtomicU64,
    /// The refusals the owner counts that are not `Limited`.
    others: crate::sync::AtomicU64,
    /// What was added to `granted`, `permits` and the `limited` refusals
    /// so far; the lock makes the publishers take turns.
    published: std::sync::Mutex<Published>,
    /// By [`Refusal`], in `Refusal::ALL`'s order.
    refused: [metrics::Counter; 5],
    waiting: metrics::Gauge,
    wait: metrics::Histogram,
    /// A keyed map's key count.
    keys: Option<metrics::Gauge>,
}

/// What a meter has added to its counters from its owner's.
#[cfg(feature = "metrics")]
#[derive(Debug, Default, Clone, Copy)]
struct Published {
    requests: u64,
    permits: u64,
    limited: u64,
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
        clippy::needless_pass_by_value,
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
                extra: crate::sync::AtomicU64::new(0),
                others: crate::sync::AtomicU64::new(0),
                published: std::sync::Mutex::new(Published::default()),
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

    /// A request of `n` permits was granted; `count` adds them to the
    /// owner's permit counter, the one its [`Publish`] reads (with a
    /// `Release` add: see [`publish`](Self::publish)).
    ///
    /// The meter's share comes first, so that a publisher that sees the
    /// permits sees it too. A one-permit grant has none: the meter costs it
    /// nothing.
    #[inline]
    pub(crate) fn granted(&self, n: u32, count: impl FnOnce(u32)) {
        #[cfg(feature = "metrics")]
        if n > 1 {
            if let Some(m) = &self.meter {
                m.extra
                    .fetch_add(u64::from(n - 1), crate::sync::Ordering::Relaxed);
            }
        }
        count(n);
    }

    /// Adds to the recorder what was granted and refused for the rate
    /// since the last call: `(permits, refused)` are the owner's counters
    /// now, read with `Acquire` (so every grant and refusal they include
    /// has its `extra` or `others` visible here). The requests are the
    /// permits less `extra`, the `limited` refusals the refusals less
    /// `others`; both may also hold answers not counted by the owner yet:
    /// then the differences come out short, never over, and the next call
    /// makes up for it (a counter only grows, so a short reading is not
    /// published below what already was).
    pub(crate) fn publish(&self, (permits, refused): (u64, u64)) {
        #[cfg(feature = "metrics")]
        if let Some(m) = &self.meter {
            use crate::sync::Ordering::Relaxed;
            let mut done = m
                .published
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let (extra, others) = (m.extra.load(Relaxed), m.others.load(Relaxed));
            let now = Published {
                permits: permits.max(done.permits),
                requests: permits.saturating_sub(extra).max(done.requests),
                limited: refused.saturating_sub(others).max(done.limited),
            };
            let limited = &m.refused[Refusal::Limited as usize];
            for (counter, now, before) in [
                (&m.granted, now.requests, done.requests),
                (&m.permits, now.permits, done.permits),
                (limited, now.limited, done.limited),
            ] {
                if now > before {
                    counter.increment(now - before);
                }
            }
            *done = now;
        }
        #[cfg(not(feature = "metrics"))]
        let _ = (permits, refused);
    }

    /// Has the background publisher publish `owner`'s grants from now on,
    /// if this meter records anything. `owner` holds this slot: it calls
    /// [`publish`](Self::publish) with its permit counter, and once more
    /// when it is dropped.
    pub(crate) fn register(&self, owner: Weak<dyn Publish>) {
        #[cfg(feature = "metrics")]
        if self.is_on() {
            publisher::register(owner);
        }
        #[cfg(not(feature = "metrics"))]
        let _ = owner;
    }

    /// A request was refused by `why`; `count` adds it to the owner's
    /// refusal counter, the one its [`Publish`] reads (with a `Release`
    /// add). A `Limited` refusal is published from that counter and costs
    /// the meter nothing; the others are recorded now, and first noted in
    /// `others`, so that a publisher that sees the refusal sees them too.
    #[inline]
    pub(crate) fn refused(&self, why: Refusal, count: impl FnOnce()) {
        #[cfg(feature = "metrics")]
        if why != Refusal::Limited {
            if let Some(m) = &self.meter {
                m.others.fetch_add(1, crate::sync::Ordering::Relaxed);
                m.refused[why as usize].increment(1);
            }
        }
        #[cfg(not(feature = "metrics"))]
        let _ = why;
        count();
    }

    /// A request was refused by `why`, which the owner does not count (a
    /// keyed map full: not a key's limit): recorded now.
    pub(crate) fn refused_uncounted(&self, why: Refusal) {
        debug_assert_ne!(why, Refusal::Limited, "limited refusals are counted");
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

/// The background publisher: every named limiter's owner, held weakly,
/// and a thread that publishes them all every [`INTERVAL`]. Started by the
/// first named limiter.
#[cfg(feature = "metrics")]
mod publisher {
    use std::sync::{Arc, Mutex, Once, PoisonError, Weak};
    use std::time::Duration;

    use super::Publish;

    /// How often the background thread publishes.
    pub(crate) const INTERVAL: Duration = Duration::from_secs(1);

    static OWNERS: Mutex<Vec<Weak<dyn Publish>>> = Mutex::new(Vec::new());

    pub(super) fn register(owner: Weak<dyn Publish>) {
        static STARTED: Once = Once::new();
        OWNERS
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(owner);
        STARTED.call_once(|| {
            let started = std::thread::Builder::new()
                .name("tokio-ratelimit-metrics".to_owned())
                .spawn(|| {
                    loop {
                        std::thread::sleep(INTERVAL);
                        publish_all();
                    }
                });
            if let Err(error) = started {
                tracing::warn!(
                    %error,
                    "no metrics publisher thread: grants are published only by \
                     tokio_ratelimit::metrics::flush and when a limiter is dropped"
                );
            }
        });
    }

    /// Publishes every named limiter alive, and forgets the dropped ones
    /// (which published themselves as they went).
    pub(crate) fn publish_all() {
        let alive: Vec<Arc<dyn Publish>> = {
            let mut owners = OWNERS.lock().unwrap_or_else(PoisonError::into_inner);
            let mut alive = Vec::with_capacity(owners.len());
            owners.retain(|owner| match owner.upgrade() {
                Some(owner) => {
                    alive.push(owner);
                    true
                }
                None => false,
            });
            alive
        };
        // Outside the lock: the last handle may be dropped meanwhile, and
        // then the owner is dropped here (publishing itself once more).
        for owner in alive {
            owner.publish();
        }
    }
}

#[cfg(feature = "metrics")]
pub(crate) use publisher::publish_all;

/// The publisher against a grant and a refusal on another thread, in every
/// interleaving loom finds (and every value its weak loads may return):
/// the published requests and `limited` refusals never run ahead of the
/// answers made, and are exact once the answers are done. (One publisher:
/// the meter's lock is std's, which loom does not see; publishers take
/// turns under it anyway.)
#[cfg(all(test, tokio_ratelimit_loom, feature = "metrics"))]
mod loom_tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, Ordering};

    use super::{Refusal, Slot};
    use crate::stats::{self, Stripe};

    /// What one counter was incremented by in all (std's atomic: an
    /// observer outside the model).
    #[derive(Default)]
    struct Total(AtomicU64);

    impl metrics::CounterFn for Total {
        fn increment(&self, value: u64) {
            self.0.fetch_add(value, Ordering::SeqCst);
        }

        fn absolute(&self, _: u64) {
            unreachable!("never set absolutely");
        }
    }

    /// Records the `granted` and `limited` requests only.
    struct Recorder {
        granted: Arc<Total>,
        limited: Arc<Total>,
    }

    impl metrics::Recorder for Recorder {
        fn describe_counter(
            &self,
            _: metrics::KeyName,
            _: Option<metrics::Unit>,
            _: metrics::SharedString,
        ) {
        }
        fn describe_gauge(
            &self,
            _: metrics::KeyName,
            _: Option<metrics::Unit>,
            _: metrics::SharedString,
        ) {
        }
        fn describe_histogram(
            &self,
            _: metrics::KeyName,
            _: Option<metrics::Unit>,
            _: metrics::SharedString,
        ) {
        }

        fn register_counter(
            &self,
            key: &metrics::Key,
            _: &metrics::Metadata<'_>,
        ) -> metrics::Counter {
            let outcome = key
                .labels()
                .find(|l| l.key() == "outcome")
                .map(metrics::Label::value);
            match outcome {
                Some("granted") => metrics::Counter::from_arc(Arc::clone(&self.granted)),
                Some("limited") => metrics::Counter::from_arc(Arc::clone(&self.limited)),
                _ => metrics::Counter::noop(),
            }
        }

        fn register_gauge(&self, _: &metrics::Key, _: &metrics::Metadata<'_>) -> metrics::Gauge {
            metrics::Gauge::noop()
        }

        fn register_histogram(
            &self,
            _: &metrics::Key,
            _: &metrics::Metadata<'_>,
        ) -> metrics::Histogram {
            metrics::Histogram::noop()
        }
    }

    #[test]
    fn loom_published_answers_never_run_ahead() {
        loom::model(|| {
            let granted = Arc::new(Total::default());
            let limited = Arc::new(Total::default());
            let recorder = Recorder {
                granted: Arc::clone(&granted),
                limited: Arc::clone(&limited),
            };
            let slot = Arc::new(metrics::with_local_recorder(&recorder, || {
                Slot::named(Some("loom"), false)
            }));
            // The owner's counters: one stripe (the other stays empty).
            let stripes = Arc::new([Stripe::default(), Stripe::default()]);
            let answers = {
                let (slot, stripes) = (Arc::clone(&slot), Arc::clone(&stripes));
                loom::thread::spawn(move || {
                    slot.granted(3, |n| stripes[0].granted(n));
                    slot.refused(Refusal::TooLarge, || stripes[0].refused());
                })
            };
            slot.publish(stats::totals(&stripes[0], &stripes[1]));
            // One grant (of three permits) at most, no rate refusal.
            assert!(granted.0.load(Ordering::SeqCst) <= 1);
            assert_eq!(limited.0.load(Ordering::SeqCst), 0);
            answers.join().unwrap();
            slot.publish(stats::totals(&stripes[0], &stripes[1]));
            assert_eq!(granted.0.load(Ordering::SeqCst), 1);
            assert_eq!(limited.0.load(Ordering::SeqCst), 0);
        });
    }
}
