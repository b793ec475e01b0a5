//! The `metrics` feature: what each named limiter records, read back from
//! a Prometheus recorder of the test's own (thread-local, so the tests do
//! not share series), in paused time.
#![expect(
    clippy::float_cmp,
    reason = "the series are counts and sums of whole milliseconds, rendered exactly"
)]

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use tokio_ratelimit::keyed::{Keyed, KeyedFunnel};
use tokio_ratelimit::{
    AcquireError, ConfigError, Funnel, LeakyBucket, Rate, SmoothBursty, SmoothWarmingUp,
    TokenBucket, TryAcquireError,
};
use tokio_test::{assert_pending, assert_ready, task};

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

#[path = "support/recorder.rs"]
mod recorder;
use recorder::{Recorded, recorded};

impl Recorded {
    /// `limiter`'s granted requests, permits and `limited` refusals as
    /// rendered now, without a flush (0 for a series not there yet).
    fn unflushed_of(&self, limiter: &str) -> (f64, f64, f64) {
        let all = self.unflushed();
        let get = |series: String| all.get(&series).copied().unwrap_or(0.0);
        let outcome = |outcome: &str| {
            get(format!(
                "tokio_ratelimit_requests_total{{limiter=\"{limiter}\",outcome=\"{outcome}\"}}"
            ))
        };
        (
            outcome("granted"),
            get(format!(
                "tokio_ratelimit_permits_granted_total{{limiter=\"{limiter}\"}}"
            )),
            outcome("limited"),
        )
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
    // A key's limiter closed: its refusals are not the key's limit, counted
    // neither in the stats nor in the series.
    map.get(&1).close();
    assert_eq!(map.try_acquire(&1), Err(TryAcquireError::Closed));
    assert_eq!(map.acquire(&1).await, Err(AcquireError::Closed));
    assert_eq!(m.outcomes("keyed"), [2.0, 1.0, 0.0, 0.0, 0.0, 1.0]);
    assert_eq!((map.stats().granted, map.stats().limited), (2, 1));
}

/// A keyed map whose factory names its per-key limiters (as the module
/// docs advise): every key's limiter adds into the one series; a key swept
/// away publishes its last answers as its limiter is dropped, and the key
/// made again adds on from there (never a reset); the map's own series
/// count the same answers.
#[tokio::test(start_paused = true)]
async fn per_key_limiters_named_in_the_factory_add_into_one_series() {
    let m = recorded();
    let map: Keyed<u32, TokenBucket> = Keyed::builder()
        .limiter(|| {
            TokenBucket::builder()
                .rate(Rate::per_second(10))
                .capacity(2)
                .name("per_key")
                .build()
        })
        .background_sweep(false)
        .name("map")
        .build()
        .unwrap();
    map.try_acquire_many(&1, 2).unwrap();
    map.try_acquire(&1).unwrap_err();
    map.try_acquire(&2).unwrap();
    map.try_acquire(&3).unwrap();
    map.try_acquire(&3).unwrap();
    map.try_acquire(&3).unwrap_err();
    // Requests granted, permits, `limited` refusals, after a flush.
    let flushed = |limiter: &str| {
        let [granted, limited, ..] = m.outcomes(limiter);
        (
            granted,
            m.of("tokio_ratelimit_permits_granted_total", limiter),
            limited,
        )
    };
    assert_eq!(flushed("per_key"), (4.0, 5.0, 2.0));
    assert_eq!(flushed("map"), (4.0, 5.0, 2.0));

    // More answers, not flushed; then every key swept away (refilled after
    // 200 ms): each limiter publishes its own as it is dropped.
    map.try_acquire(&2).unwrap();
    map.try_acquire(&2).unwrap_err();
    tokio::time::advance(ms(200)).await;
    // The background publisher holds a handle to each named limiter while
    // it publishes (a few microseconds, once a second): a sweep that meets
    // it keeps that key for the next one. So sweep until it is gone.
    let mut sweeps = 1;
    while map.sweep() != 0 {
        assert!(sweeps < 1_000, "a key outlived {sweeps} sweeps");
        sweeps += 1;
        std::thread::yield_now();
    }
    assert_eq!(m.unflushed_of("per_key"), (5.0, 6.0, 3.0));

    // Key 1 again: a new limiter under the same name adds on.
    map.try_acquire_many(&1, 2).unwrap();
    map.try_acquire(&1).unwrap_err();
    assert_eq!(flushed("per_key"), (6.0, 8.0, 4.0));
    assert_eq!(flushed("map"), (6.0, 8.0, 4.0));
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

/// Grants reach the recorder without a flush too: when the limiter is
/// dropped (every kind of owner: an engine, a keyed funnel, a keyed map),
/// and from the background publisher within a few of its one-second
/// rounds.
#[tokio::test(start_paused = true)]
async fn grants_are_published_on_drop_and_in_the_background() {
    let m = recorded();
    let bucket = TokenBucket::builder()
        .rate(Rate::per_second(10))
        .capacity(5)
        .name("dropped")
        .build()
        .unwrap();
    bucket.try_acquire_many(3).unwrap();
    bucket.try_acquire().unwrap();
    bucket.try_acquire_many(2).unwrap_err();
    drop(bucket);
    assert_eq!(m.unflushed_of("dropped"), (2.0, 4.0, 1.0));

    let map: KeyedFunnel<u32> = KeyedFunnel::builder()
        .rate(Rate::per_second(10))
        .capacity(5)
        .background_sweep(false)
        .name("dropped_kf")
        .build()
        .unwrap();
    map.try_acquire_many(&1, 2).unwrap();
    map.try_acquire(&2).unwrap();
    map.try_acquire_many(&2, 5).unwrap_err();
    drop(map);
    assert_eq!(m.unflushed_of("dropped_kf"), (2.0, 3.0, 1.0));

    let keyed: Keyed<u32, TokenBucket> = Keyed::builder()
        .limiter(|| {
            TokenBucket::builder()
                .rate(Rate::per_second(10))
                .capacity(5)
                .build()
        })
        .background_sweep(false)
        .name("dropped_keyed")
        .build()
        .unwrap();
    keyed.try_acquire_many(&1, 5).unwrap();
    keyed.try_acquire(&1).unwrap_err();
    drop(keyed);
    assert_eq!(m.unflushed_of("dropped_keyed"), (1.0, 5.0, 1.0));

    // Kept alive, never flushed: the publisher thread adds them (it runs
    // on real time, once a second).
    let kept = Funnel::builder()
        .rate(Rate::per_second(10))
        .capacity(5)
        .name("kept")
        .build()
        .unwrap();
    kept.try_acquire_many(5).unwrap();
    kept.try_acquire().unwrap_err();
    let start = std::time::Instant::now();
    while m.unflushed_of("kept") != (1.0, 5.0, 1.0) {
        assert!(
            start.elapsed() < std::time::Duration::from_secs(10),
            "not published in 10 s: {:?}",
            m.unflushed_of("kept")
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// A recorder whose `requests_total` series of the outcomes given check, at
/// each increment, that their total does not run ahead of the answers
/// made: those counted in their `done` (after each returns) and those of
/// the threads in a call that answers so (flagged before the call, and
/// read before `done`: a call the publisher saw is in one or the other).
struct Checked {
    outcomes: Vec<(&'static str, Arc<CheckedCounter>)>,
}

#[derive(Default)]
struct CheckedCounter {
    /// The answers made and counted so far.
    done: AtomicU64,
    /// Whether each thread is in a call answered so.
    in_call: [AtomicBool; 2],
    total: AtomicU64,
    checks: AtomicU64,
    /// Set instead of panicking on the publisher's thread.
    ahead: std::sync::Mutex<Option<String>>,
}

impl metrics::CounterFn for CheckedCounter {
    fn increment(&self, value: u64) {
        let total = self.total.fetch_add(value, Ordering::SeqCst) + value;
        let in_call = self
            .in_call
            .iter()
            .filter(|flag| flag.load(Ordering::SeqCst))
            .count() as u64;
        let bound = self.done.load(Ordering::SeqCst) + in_call;
        self.checks.fetch_add(1, Ordering::SeqCst);
        if total > bound {
            *self.ahead.lock().unwrap() = Some(format!("{total} published, {bound} made at most"));
        }
    }

    fn absolute(&self, _: u64) {
        unreachable!("never set absolutely");
    }
}

impl metrics::Recorder for Checked {
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

    fn register_counter(&self, key: &metrics::Key, _: &metrics::Metadata<'_>) -> metrics::Counter {
        let outcome = key
            .labels()
            .find(|l| l.key() == "outcome")
            .map(metrics::Label::value);
        let checked = self
            .outcomes
            .iter()
            .find(|(o, _)| key.name() == "tokio_ratelimit_requests_total" && Some(*o) == outcome);
        match checked {
            Some((_, counter)) => metrics::Counter::from_arc(Arc::clone(counter)),
            None => metrics::Counter::noop(),
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

/// Two threads call `call` `CALLS` times each on a limiter built by
/// `build` into a [`Checked`] recorder of `outcomes`, while a third
/// publishes over and over; `call(limiter, thread, i)` answers with the
/// index in `outcomes` its answer counts in, which `plan(thread, i)` says
/// beforehand, and thread `t` spins `gap[t]` times between calls. Every
/// increment was checked; the totals are returned.
fn race<L: Sync>(
    outcomes: &[&'static str],
    build: impl FnOnce() -> L,
    plan: impl Fn(u64, u64) -> usize + Sync,
    call: impl Fn(&L, u64, u64) -> usize + Sync,
    gap: [u32; 2],
) -> Vec<u64> {
    const CALLS: u64 = 200_000;
    let recorder = Checked {
        outcomes: outcomes
            .iter()
            .map(|&o| (o, Arc::new(CheckedCounter::default())))
            .collect(),
    };
    // Built in a runtime (waiters would need one), used from plain
    // threads: `try_acquire` needs none.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let limiter = metrics::with_local_recorder(&recorder, || {
        let _entered = runtime.enter();
        build()
    });
    let stop = AtomicBool::new(false);
    std::thread::scope(|scope| {
        let callers: Vec<_> = (0..2)
            .map(|t| {
                let (limiter, plan, call, recorder) = (&limiter, &plan, &call, &recorder);
                #[expect(clippy::cast_possible_truncation, reason = "two threads")]
                let (flag, gap) = (t as usize, gap[t as usize]);
                scope.spawn(move || {
                    for i in 0..CALLS {
                        let counter = &recorder.outcomes[plan(t, i)].1;
                        counter.in_call[flag].store(true, Ordering::SeqCst);
                        assert_eq!(call(limiter, t, i), plan(t, i));
                        counter.done.fetch_add(1, Ordering::SeqCst);
                        counter.in_call[flag].store(false, Ordering::SeqCst);
                        for _ in 0..gap {
                            std::hint::spin_loop();
                        }
                    }
                })
            })
            .collect();
        let stop = &stop;
        let publisher = scope.spawn(move || {
            let mut rounds = 0_u64;
            while !stop.load(Ordering::SeqCst) {
                tokio_ratelimit::metrics::flush();
                rounds += 1;
            }
            rounds
        });
        for caller in callers {
            caller.join().unwrap();
        }
        stop.store(true, Ordering::SeqCst);
        // Published while the calls went on (the machine's scheduler
        // decides how often).
        assert!(publisher.join().unwrap() > 10);
    });
    tokio_ratelimit::metrics::flush();
    recorder
        .outcomes
        .iter()
        .map(|(outcome, counter)| {
            assert_eq!(*counter.ahead.lock().unwrap(), None, "{outcome}");
            assert!(counter.checks.load(Ordering::SeqCst) > 0, "{outcome}");
            let total = counter.total.load(Ordering::SeqCst);
            assert_eq!(total, counter.done.load(Ordering::SeqCst), "{outcome}");
            total
        })
        .collect()
}

/// Two threads grant one or a thousand permits while a third publishes
/// over and over: the published requests never run ahead of the grants
/// made (the requests are the permits less the many-permit grants' extra,
/// which each grant records before its permits), and are exact at the end.
#[test]
fn published_grants_never_run_ahead_on_real_threads() {
    const MANY: u32 = 1_000;
    let granted = race(
        &["granted"],
        || {
            TokenBucket::builder()
                .rate(Rate::per_second(1_000_000_000))
                .capacity(1_000_000_000)
                .name("racing_grants")
                .build()
                .unwrap()
        },
        |_, _| 0,
        |bucket, t, i| {
            let n = if (i + t) % 2 == 0 { MANY } else { 1 };
            bucket.try_acquire_many(n).unwrap();
            0
        },
        [0, 0],
    );
    assert_eq!(granted, [400_000]);
}

/// Two threads are refused, one for size, the other (now and then) for the
/// rate, while a third publishes over and over: the published `limited`
/// refusals (the refusals less the other causes, which each refusal
/// records before it is counted) never run ahead of those made, nor do the
/// `too_large` ones.
#[test]
fn published_refusals_never_run_ahead_on_real_threads() {
    // A race won about one time in two (the window is a few
    // instructions): four rounds.
    for _ in 0..4 {
        let refused = race(
            &["limited", "too_large"],
            || {
                let bucket = TokenBucket::builder()
                    .rate(Rate::per_hour(1))
                    .capacity(1)
                    .name("racing_refusals")
                    .build()
                    .unwrap();
                bucket.try_acquire().unwrap();
                bucket
            },
            |t, _| usize::from(t == 0),
            |bucket, t, _| {
                if t == 0 {
                    assert_eq!(
                        bucket.try_acquire_many(2),
                        Err(TryAcquireError::InsufficientCapacity)
                    );
                    1
                } else {
                    assert!(matches!(
                        bucket.try_acquire(),
                        Err(TryAcquireError::Limited { .. })
                    ));
                    0
                }
            },
            // The rate's refusals spaced out: a size refusal published as one
            // is then seldom hidden by a rate refusal under way.
            [0, 50],
        );
        assert_eq!(refused, [200_000, 200_000]);
    }
}
