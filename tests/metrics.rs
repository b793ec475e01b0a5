//! The `metrics` feature: what each named limiter records, read back from
//! a Prometheus recorder of the test's own (thread-local, so the tests do
//! not share series), in paused time.
#![expect(
    clippy::float_cmp,
    reason = "the series are counts and sums of whole milliseconds, rendered exactly"
)]

use std::collections::BTreeMap;
use std::time::Duration;

use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle, PrometheusRecorder};
use tokio_ratelimit::keyed::{Keyed, KeyedFunnel};
use tokio_ratelimit::{
    AcquireError, ConfigError, Funnel, LeakyBucket, Rate, SmoothBursty, SmoothWarmingUp,
    TokenBucket, TryAcquireError,
};
use tokio_test::{assert_pending, assert_ready, task};

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// A recorder, set as this thread's default until the guard is dropped:
/// limiters built meanwhile record into it.
struct Recorded {
    handle: PrometheusHandle,
    _guard: metrics::LocalRecorderGuard<'static>,
}

fn recorded() -> Recorded {
    let recorder: &'static PrometheusRecorder =
        Box::leak(Box::new(PrometheusBuilder::new().build_recorder()));
    Recorded {
        handle: recorder.handle(),
        _guard: metrics::set_default_local_recorder(recorder),
    }
}

impl Recorded {
    /// Every series rendered, its labels sorted, to its value.
    fn series(&self) -> BTreeMap<String, f64> {
        self.handle
            .render()
            .lines()
            .filter(|line| !line.is_empty() && !line.starts_with('#'))
            .map(|line| {
                let (series, value) = line.rsplit_once(' ').unwrap();
                let series = match series.split_once('{') {
                    Some((name, labels)) => {
                        let mut labels: Vec<&str> =
                            labels.trim_end_matches('}').split(',').collect();
                        labels.sort_unstable();
                        format!("{name}{{{}}}", labels.join(","))
                    }
                    None => series.to_owned(),
                };
                (series, value.parse().unwrap())
            })
            .collect()
    }

    fn get(&self, series: &str) -> f64 {
        let all = self.series();
        all.get(series)
            .copied()
            .unwrap_or_else(|| panic!("no {series} in {all:#?}"))
    }

    /// `requests_total` of `limiter` by outcome, in the order
    /// `granted`, `limited`, `overflow`, `timeout`, `too_large`, `unavailable`.
    fn outcomes(&self, limiter: &str) -> [f64; 6] {
        [
            "granted",
            "limited",
            "overflow",
            "timeout",
            "too_large",
            "unavailable",
        ]
        .map(|outcome| {
            self.get(&format!(
                "tokio_ratelimit_requests_total{{limiter=\"{limiter}\",outcome=\"{outcome}\"}}"
            ))
        })
    }

    fn of(&self, name: &str, limiter: &str) -> f64 {
        self.get(&format!("{name}{{limiter=\"{limiter}\"}}"))
    }
}

/// A token bucket: grants and permits, a refusal for the rate and one for
/// size, a waiter counted while it waits and its wait recorded, a timeout.
#[tokio::test(start_paused = true)]
async fn a_token_bucket_records_every_answer_and_wait() {
    let m = recorded();
    let bucket = TokenBucket::builder()
        .rate(Rate::per_second(10))
        .capacity(2)
        .name("tb")
        .build()
        .unwrap();
    bucket.try_acquire_many(2).unwrap();
    assert!(matches!(
        bucket.try_acquire(),
        Err(TryAcquireError::Limited { .. })
    ));
    assert_eq!(
        bucket.try_acquire_many(3),
        Err(TryAcquireError::InsufficientCapacity)
    );
    assert_eq!(m.outcomes("tb"), [1.0, 1.0, 0.0, 0.0, 1.0, 0.0]);
    assert_eq!(m.of("tokio_ratelimit_permits_granted_total", "tb"), 2.0);

    // A waiter, 100 ms from its permit: waiting 1 until it goes.
    let mut waiter = task::spawn(bucket.acquire());
    assert_pending!(waiter.poll());
    assert_eq!(m.of("tokio_ratelimit_waiting", "tb"), 1.0);
    tokio::time::advance(ms(100)).await;
    assert_ready!(waiter.poll()).unwrap();
    drop(waiter);
    assert_eq!(m.of("tokio_ratelimit_waiting", "tb"), 0.0);
    assert_eq!(m.of("tokio_ratelimit_wait_seconds_count", "tb"), 1.0);
    assert_eq!(m.of("tokio_ratelimit_wait_seconds_sum", "tb"), 0.1);

    // One that would wait 100 ms with 50 allowed: refused at once; one
    // dropped while waiting: no longer waiting, its 30 ms recorded.
    assert_eq!(
        bucket.acquire_timeout(1, ms(50)).await,
        Err(AcquireError::Timeout)
    );
    let mut dropped = task::spawn(bucket.acquire());
    assert_pending!(dropped.poll());
    tokio::time::advance(ms(30)).await;
    drop(dropped);
    assert_eq!(m.of("tokio_ratelimit_waiting", "tb"), 0.0);
    assert_eq!(m.of("tokio_ratelimit_wait_seconds_count", "tb"), 2.0);
    assert_eq!(m.outcomes("tb"), [2.0, 1.0, 0.0, 1.0, 1.0, 0.0]);
    assert_eq!(m.of("tokio_ratelimit_permits_granted_total", "tb"), 3.0);
    let stats = bucket.stats();
    assert_eq!((stats.granted, stats.refused), (3, 3));
}

/// A leaky bucket's shaper overflows; a funnel's and a smooth limiter's
/// answers; an unnamed limiter records nothing.
#[tokio::test(start_paused = true)]
async fn the_other_limiters_record_theirs_and_unnamed_ones_nothing() {
    let m = recorded();
    let leaky = LeakyBucket::builder()
        .rate(Rate::per_second(10))
        .capacity(2)
        .name("leaky")
        .build()
        .unwrap();
    leaky.acquire().await.unwrap();
    assert_eq!(
        leaky.acquire_many(3).await,
        Err(AcquireError::InsufficientCapacity)
    );
    let mut second = task::spawn(leaky.acquire());
    assert_pending!(second.poll());
    // The shaper is full (one draining, one queued): the next overflows.
    assert_eq!(leaky.acquire().await, Err(AcquireError::Overflow));
    tokio::time::advance(ms(100)).await;
    assert_ready!(second.poll()).unwrap();
    assert_eq!(m.outcomes("leaky"), [2.0, 0.0, 1.0, 0.0, 1.0, 0.0]);

    let funnel = Funnel::builder()
        .rate(Rate::per_second(1))
        .capacity(1)
        .name("funnel")
        .build()
        .unwrap();
    funnel.try_acquire().unwrap();
    funnel.try_acquire().unwrap_err();
    assert_eq!(m.outcomes("funnel"), [1.0, 1.0, 0.0, 0.0, 0.0, 0.0]);

    let smooth = SmoothBursty::builder()
        .permits_per_second(1.0)
        .name("smooth")
        .build()
        .unwrap();
    smooth.try_acquire().unwrap();
    smooth.try_acquire().unwrap_err();
    assert_eq!(m.outcomes("smooth")[..2], [1.0, 1.0]);

    let unnamed = TokenBucket::builder()
        .rate(Rate::per_second(1))
        .capacity(1)
        .build()
        .unwrap();
    unnamed.try_acquire().unwrap();
    let limiters: Vec<String> = m
        .series()
        .keys()
        .filter_map(|s| Some(s.split_once("limiter=\"")?.1.split('"').next()?.to_owned()))
        .collect();
    assert!(
        limiters
            .iter()
            .all(|l| ["leaky", "funnel", "smooth"].contains(&l.as_str())),
        "{limiters:?}"
    );
}

/// A keyed funnel: grants, refusals, the key the full map turns away, the
/// key count as keys come and are swept, and a waiting `acquire`.
#[tokio::test(start_paused = true)]
async fn a_keyed_funnel_records_answers_keys_and_waits() {
    let m = recorded();
    let map: KeyedFunnel<String> = KeyedFunnel::builder()
        .rate(Rate::per_second(10))
        .capacity(1)
        .max_keys(2)
        .background_sweep(false)
        .name("kf")
        .build()
        .unwrap();
    map.try_acquire("a").unwrap();
    map.try_acquire("a").unwrap_err();
    map.try_acquire("b").unwrap();
    assert_eq!(m.of("tokio_ratelimit_keys", "kf"), 2.0);
    assert_eq!(map.try_acquire("c"), Err(TryAcquireError::Unavailable));
    assert_eq!(
        map.try_acquire_many("a", 2),
        Err(TryAcquireError::InsufficientCapacity)
    );
    // "a" waits 100 ms for its next unit.
    map.acquire("a").await.unwrap();
    assert_eq!(m.outcomes("kf"), [3.0, 1.0, 0.0, 0.0, 1.0, 1.0]);
    assert_eq!(m.of("tokio_ratelimit_wait_seconds_count", "kf"), 1.0);
    assert_eq!(m.of("tokio_ratelimit_wait_seconds_sum", "kf"), 0.1);
    assert_eq!(m.of("tokio_ratelimit_waiting", "kf"), 0.0);
    tokio::time::advance(ms(200)).await;
    assert_eq!(map.sweep(), 0);
    assert_eq!(m.of("tokio_ratelimit_keys", "kf"), 0.0);
}

/// A map of token buckets: the map's answers and keys (the buckets'
/// waits are theirs to record, named by the factory).
#[tokio::test(start_paused = true)]
async fn a_keyed_map_of_buckets_records_answers_and_keys() {
    let m = recorded();
    let map: Keyed<u32, TokenBucket> = Keyed::builder()
        .limiter(|| {
            TokenBucket::builder()
                .rate(Rate::per_second(10))
                .capacity(1)
                .build()
        })
        .max_keys(1)
        .background_sweep(false)
        .name("keyed")
        .build()
        .unwrap();
    map.try_acquire(&1).unwrap();
    map.try_acquire(&1).unwrap_err();
    assert_eq!(map.try_acquire(&2), Err(TryAcquireError::Unavailable));
    map.acquire(&1).await.unwrap();
    assert_eq!(m.outcomes("keyed"), [2.0, 1.0, 0.0, 0.0, 0.0, 1.0]);
    assert_eq!(m.of("tokio_ratelimit_keys", "keyed"), 1.0);
}

/// An empty name is refused at build, by every builder: a `limiter=""`
/// label would merge every limiter so named into one series.
#[tokio::test(start_paused = true)]
async fn an_empty_name_is_refused_at_build() {
    let empty = |e: ConfigError| {
        assert!(
            matches!(e, ConfigError::InvalidParameter { name: "name", .. }),
            "{e:?}"
        );
    };
    let rate = Rate::per_second(10);
    empty(
        TokenBucket::builder()
            .rate(rate)
            .capacity(1)
            .name("")
            .build()
            .unwrap_err(),
    );
    empty(
        LeakyBucket::builder()
            .rate(rate)
            .capacity(1)
            .name("")
            .build()
            .unwrap_err(),
    );
    empty(
        Funnel::builder()
            .rate(rate)
            .capacity(1)
            .name("")
            .build()
            .unwrap_err(),
    );
    empty(
        SmoothBursty::builder()
            .permits_per_second(10.0)
            .name("")
            .build()
            .unwrap_err(),
    );
    empty(
        SmoothWarmingUp::builder()
            .permits_per_second(10.0)
            .warmup(Duration::from_secs(1))
            .name("")
            .build()
            .unwrap_err(),
    );
    empty(
        KeyedFunnel::<u64>::builder()
            .rate(rate)
            .capacity(1)
            .name("")
            .build()
            .unwrap_err(),
    );
    empty(
        Keyed::<u64, Funnel>::builder()
            .limiter(move || Funnel::builder().rate(rate).capacity(1).build())
            .name("")
            .build()
            .unwrap_err(),
    );
    // A name is taken as given otherwise, a space included.
    TokenBucket::builder()
        .rate(rate)
        .capacity(1)
        .name(" ")
        .build()
        .unwrap();
}
