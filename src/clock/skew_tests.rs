//! A clock that goes backwards, and differs between "cores", never makes
//! a limiter admit more.
//!
//! Each limiter is built twice, on two fake clocks (see [`fake`]): one
//! reads skewed readings (true time plus a random skew either way, as
//! threads on cores whose counters disagree would); the other, the highest
//! reading so far, a monotonic clock whose exactness the rest of the suite
//! proves. Every step goes to the first; what it grants goes to the second
//! too, which must grant it as well. So the first's grants are a run of a
//! limiter on the monotonic clock that refused some requests it could have
//! granted: a reading behind the latest is never more lenient than the
//! latest, and no window of the monotonic timeline gets more than it
//! allows. (A refusal changes no state, so the second need not see it.)

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use proptest::prelude::*;

use super::fake;
use crate::keyed::{Keyed, KeyedFunnel};
use crate::{
    Funnel, LeakyBucket, Quota, Rate, SmoothBursty, SmoothWarmingUp, TokenBucket, TryAcquireError,
};

/// Where both clocks start (the fake clocks read nanoseconds).
const START: u64 = 1_000_000_000;

/// One step of a run: true time moves on by `dt_us`, the skewed clock
/// reads `skew_us` off it, and `n` permits are asked for on `key` (or the
/// keyed maps are swept).
#[derive(Debug, Clone, Copy)]
struct Step {
    dt_us: u64,
    skew_us: i64,
    n: u32,
    key: u8,
    sweep: bool,
}

fn steps() -> impl Strategy<Value = Vec<Step>> {
    prop::collection::vec(
        (
            0..3_000u64,
            -2_500..2_500i64,
            1..=4u32,
            0..3u8,
            prop::bool::weighted(0.1),
        )
            .prop_map(|(dt_us, skew_us, n, key, sweep)| Step {
                dt_us,
                skew_us,
                n,
                key,
                sweep,
            }),
        1..120,
    )
}

/// Whose readings a limiter's monotonic timeline is made of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Timeline {
    /// Every reading: a limiter, or a keyed map whose keys share its clock.
    Shared,
    /// The readings on the step's key only: a map never swept.
    OwnKey,
}

/// The limiters under test, built on one clock: each answers a step.
type Limiters = Vec<(&'static str, Timeline, Box<dyn Fn(Step) -> Option<bool>>)>;

fn limiters(capacity: u32) -> Limiters {
    let rate = Rate::per_second(1000);
    let token = TokenBucket::builder()
        .rate(rate)
        .capacity(capacity)
        .build()
        .unwrap();
    let leaky = LeakyBucket::builder()
        .rate(rate)
        .capacity(capacity)
        .build()
        .unwrap();
    // Two bands: the limiter's, and one of twice the rate and capacity.
    let two_bands = TokenBucket::builder()
        .quota(Quota::new(rate, capacity).and(Rate::per_second(2000), 2 * capacity))
        .build()
        .unwrap();
    let funnel = Funnel::builder()
        .rate(rate)
        .capacity(capacity)
        .build()
        .unwrap();
    let bursty = SmoothBursty::builder()
        .permits_per_second(1000.0)
        .max_burst(Duration::from_millis(u64::from(capacity)))
        .build()
        .unwrap();
    let warming = SmoothWarmingUp::builder()
        .permits_per_second(1000.0)
        .warmup(Duration::from_millis(5))
        .cold_factor(3.0)
        .build()
        .unwrap();
    let keyed_funnel = KeyedFunnel::<u8>::builder()
        .rate(rate)
        .capacity(capacity)
        .build()
        .unwrap();
    // A key of two bands, in one 128-bit word (it grants on a reading made
    // before the lookup: see `keyed::funnel::word::Pair`).
    let keyed_pair = KeyedFunnel::<u8>::builder()
        .quota(Quota::new(rate, capacity).and(Rate::per_second(2000), 2 * capacity))
        .build()
        .unwrap();
    let keyed = Keyed::<u8, TokenBucket>::builder()
        .limiter(move || TokenBucket::builder().rate(rate).capacity(capacity).build())
        .background_sweep(false)
        .sweep_interval(Duration::from_secs(3600))
        .build()
        .unwrap();
    let ok = |r: Result<(), TryAcquireError>| Some(r.is_ok());
    vec![
        (
            "TokenBucket",
            Timeline::Shared,
            Box::new(move |s: Step| ok(token.try_acquire_many(s.n))),
        ),
        (
            "LeakyBucket",
            Timeline::Shared,
            Box::new(move |s: Step| ok(leaky.try_acquire_many(s.n))),
        ),
        (
            "TokenBucket, 2 bands",
            Timeline::Shared,
            Box::new(move |s: Step| ok(two_bands.try_acquire_many(s.n))),
        ),
        (
            "Funnel",
            Timeline::Shared,
            Box::new(move |s: Step| ok(funnel.try_acquire_many(s.n))),
        ),
        (
            "SmoothBursty",
            Timeline::Shared,
            Box::new(move |s: Step| ok(bursty.try_acquire_many(s.n))),
        ),
        (
            "SmoothWarmingUp",
            Timeline::Shared,
            Box::new(move |s: Step| ok(warming.try_acquire_many(s.n))),
        ),
        (
            "KeyedFunnel",
            // One key, swept, evicted and made again: a map's keys share
            // their shard's epoch (the latest sweep's reading, which every
            // decision in the shard reads time no earlier than), so with
            // several keys a key's decision may follow another key's
            // reading, which a twin on the key's own timeline cannot.
            Timeline::Shared,
            key_zero(keyed_funnel),
        ),
        (
            "KeyedFunnel, 2 bands",
            Timeline::Shared,
            key_zero(keyed_pair),
        ),
        (
            "Keyed<TokenBucket>",
            Timeline::OwnKey,
            // Not swept: its keys' limiters are the factory's, each built
            // on a reading of its own, and a key dropped and made again
            // starts a new history there (see the clock's docs).
            Box::new(move |s: Step| {
                (!s.sweep).then(|| keyed.try_acquire_many(&s.key, s.n).is_ok())
            }),
        ),
    ]
}

/// A keyed funnel's answers on key 0 (`None` for a step that sweeps it).
fn key_zero(map: KeyedFunnel<u8>) -> Box<dyn Fn(Step) -> Option<bool>> {
    Box::new(move |s: Step| {
        if s.sweep {
            map.sweep();
            return None;
        }
        Some(map.try_acquire_many(&0, s.n).is_ok())
    })
}

/// A fake clock reading the shared value.
fn clock() -> (fake::Clock, Arc<AtomicU64>) {
    let value = Arc::new(AtomicU64::new(START));
    let read = Arc::clone(&value);
    (fake::Clock::new(move || read.load(Ordering::SeqCst)), value)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn a_clock_going_backwards_never_admits_more(capacity in 1..=6u32, steps in steps()) {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        let _rt = rt.enter();
        let (skewed_clock, skewed) = clock();
        let (max_clock, max) = clock();
        let on_skewed = { let _c = skewed_clock.enter(); limiters(capacity) };
        let on_max = { let _c = max_clock.enter(); limiters(capacity) };
        let mut t = START;
        let (mut shared, mut own_key) = (START, [0; 3]);
        for (i, step) in steps.iter().enumerate() {
            // Within the capacity: a larger request is refused without
            // reading the clock.
            let step = &Step { n: (step.n - 1) % capacity + 1, ..*step };
            t += step.dt_us * 1000;
            let reading = t.saturating_add_signed(step.skew_us * 1000);
            skewed.store(reading, Ordering::SeqCst);
            shared = shared.max(reading);
            if !step.sweep {
                let own = &mut own_key[usize::from(step.key)];
                *own = (*own).max(reading);
            }
            for ((name, timeline, a), (_, _, b)) in on_skewed.iter().zip(&on_max) {
                // New keys' limiters are built on the calling thread's clock.
                let got = { let _c = skewed_clock.enter(); a(*step) };
                if got != Some(false) {
                    max.store(match timeline {
                        Timeline::Shared => shared,
                        Timeline::OwnKey => own_key[usize::from(step.key)],
                    }, Ordering::SeqCst);
                    let want = { let _c = max_clock.enter(); b(*step) };
                    prop_assert_eq!(got, want, "{} at step {}", name, i);
                }
            }
        }
    }
}
