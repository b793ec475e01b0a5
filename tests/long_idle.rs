//! Long idle, in paused time: keys and limiters left alone for one and
//! several wraps of every fixed-width word the crate keeps (the keyed
//! funnel's 64-bit `tat mod 2⁶⁴`, in units of 1/den ns), with and without
//! the sweeper, at rates whose interval has a large denominator. An idle
//! limiter must read as exactly what a new one would: full of tokens,
//! empty of water.

use std::hash::{BuildHasherDefault, Hasher};
use std::time::Duration;

use tokio::time;
use tokio_ratelimit::keyed::{Keyed, KeyedFunnel};
use tokio_ratelimit::{
    Funnel, LeakyBucket, Limiter, Rate, SmoothBursty, SmoothWarmingUp, TokenBucket,
};

mod support;
use support::settle;

/// Rates whose exact interval has a large denominator (in lowest terms),
/// so that one wrap of the 64-bit word is hours, not centuries: 999 983 is
/// prime (den 999 983: a wrap is 5 h 7 min), 1 048 573 is just under 2²⁰
/// (the largest denominator kept in 64 bits: a wrap is 4 h 53 min).
const RATES: [u32; 2] = [999_983, 1_048_573];

/// One wrap of the keyed word at `per_second`: 2⁶⁴ units of 1/den ns.
fn wrap(per_second: u32) -> Duration {
    // 10⁹ / per_second ns in lowest terms has den = per_second here.
    Duration::from_nanos(u64::try_from((1u128 << 64) / u128::from(per_second)).unwrap())
}

fn keyed(per_second: u32, capacity: u32, sweeper: bool) -> KeyedFunnel<u64> {
    KeyedFunnel::builder()
        .rate(Rate::per_second(per_second))
        .capacity(capacity)
        .background_sweep(sweeper)
        .build()
        .unwrap()
}

/// The reproduction: a key filled, then idle for one wrap + 1 ns,
/// reads as full (free 0, refused) where a `Funnel` is empty.
#[tokio::test(start_paused = true)]
async fn a_key_idle_for_one_wrap_reads_as_empty() {
    let per_second = 999_983;
    let map = keyed(per_second, 999_983, false);
    let funnel = Funnel::builder()
        .rate(Rate::per_second(per_second))
        .capacity(999_983)
        .build()
        .unwrap();
    map.try_acquire_many(&1, 999_983).unwrap();
    funnel.try_acquire_many(999_983).unwrap();
    time::advance(wrap(per_second) + Duration::from_nanos(1)).await;
    assert_eq!(funnel.free(), 999_983);
    assert_eq!(map.free(&1), 999_983);
    assert_eq!(map.empty_in(&1), Duration::ZERO);
    assert_eq!(map.try_acquire_many(&1, 999_983), Ok(()));
    assert_eq!(funnel.try_acquire_many(999_983), Ok(()));
    assert!(map.try_acquire(&1).is_err());
}

/// Every key idle for one and several wraps, at offsets just past each wrap
/// where a word read relative to `now` would land inside the bucket, reads
/// as empty — with the sweeper and without, with keys kept busy in between
/// or not — and then grants exactly its capacity.
#[tokio::test(start_paused = true)]
async fn keys_idle_for_several_wraps_read_as_empty() {
    for per_second in RATES {
        let capacity = 1000;
        // τ, rounded down to whole ns: for that long after each wrap, the
        // low 64 bits of a full bucket's `tat` are again ahead of `now` by
        // less than τ.
        let tau = Duration::from_nanos(1_000_000_000 * u64::from(capacity) / u64::from(per_second));
        for sweeper in [false, true] {
            let map = keyed(per_second, capacity, sweeper);
            map.try_acquire_many(&1, capacity).unwrap();
            let mut idle = Duration::ZERO;
            for (wraps, offset) in [
                (1, Duration::ZERO),
                (1, Duration::from_nanos(1)),
                (1, tau / 2),
                (2, Duration::from_nanos(1)),
                (3, tau),
                (7, tau / 3),
            ] {
                let target = wrap(per_second) * wraps + offset;
                time::advance(target.checked_sub(idle).unwrap()).await;
                settle().await;
                idle = target;
                let what = format!("{per_second}/s, sweeper {sweeper}, {wraps} wraps + {offset:?}");
                assert_eq!(map.free(&1), capacity, "{what}");
                assert_eq!(map.empty_in(&1), Duration::ZERO, "{what}");
            }
            // And the key is poured as a new one: capacity, then refused.
            assert_eq!(map.try_acquire_many(&1, capacity), Ok(()));
            assert!(map.try_acquire(&1).is_err());
        }
    }
}

/// Hashes every key alike, so that all keys share one shard of the map.
#[derive(Default)]
struct OneShard;

impl Hasher for OneShard {
    fn finish(&self) -> u64 {
        0
    }

    fn write(&mut self, _: &[u8]) {}
}

/// A key poured again and again across many wraps, with another key of
/// the same shard busy in between (so the shard's sweep time moves on
/// while the first key idles), keeps the exact funnel arithmetic.
#[tokio::test(start_paused = true)]
async fn pours_across_many_wraps_keep_exact_numbers() {
    let per_second: u32 = 999_983;
    let capacity = 10;
    let map: KeyedFunnel<u64, _> = KeyedFunnel::builder()
        .rate(Rate::per_second(per_second))
        .capacity(capacity)
        .background_sweep(false)
        .hasher(BuildHasherDefault::<OneShard>::default())
        .build()
        .unwrap();
    let funnel = Funnel::builder()
        .rate(Rate::per_second(per_second))
        .capacity(capacity)
        .build()
        .unwrap();
    let step = wrap(per_second) / 3 + Duration::from_nanos(17);
    for round in 0..24 {
        // Key 0 is busy every round; key 1 only every fifth.
        assert_eq!(map.try_acquire_many(&0, capacity), Ok(()), "round {round}");
        assert!(map.try_acquire(&0).is_err(), "round {round}");
        if round % 5 == 0 {
            assert_eq!(map.free(&1), capacity, "round {round}");
            assert_eq!(map.try_acquire_many(&1, capacity), Ok(()));
            assert_eq!(funnel.try_acquire_many(capacity), Ok(()));
            // Just filled: the same refusal as the funnel's.
            let expected = funnel.try_acquire();
            assert!(expected.is_err());
            assert_eq!(map.try_acquire(&1), expected);
        }
        time::advance(step).await;
    }
}

/// The bucket limiters and the smooth ones, idle for years: full of tokens,
/// empty of water, and the first grant is exact.
#[tokio::test(start_paused = true)]
async fn limiters_idle_for_years_are_like_new() {
    let rate = Rate::per_second(999_983);
    let token = TokenBucket::builder()
        .rate(rate)
        .capacity(5)
        .build()
        .unwrap();
    let leaky = LeakyBucket::builder()
        .rate(rate)
        .capacity(5)
        .build()
        .unwrap();
    let funnel = Funnel::builder().rate(rate).capacity(5).build().unwrap();
    let bursty = SmoothBursty::builder()
        .permits_per_second(999_983.0)
        .build()
        .unwrap();
    let warming = SmoothWarmingUp::builder()
        .permits_per_second(999_983.0)
        .warmup(Duration::from_secs(1))
        .build()
        .unwrap();
    let generic: Keyed<u64, TokenBucket> = Keyed::builder()
        .limiter(move || TokenBucket::builder().rate(rate).capacity(5).build())
        .background_sweep(false)
        .build()
        .unwrap();
    let limiters: [(&str, &dyn Limiter); 5] = [
        ("token", &token),
        ("leaky", &leaky),
        ("funnel", &funnel),
        ("bursty", &bursty),
        ("warming", &warming),
    ];
    for (name, limiter) in limiters {
        limiter
            .try_acquire_many(5)
            .unwrap_or_else(|e| panic!("{name}: {e}"));
    }
    generic.try_acquire_many(&1, 5).unwrap();
    // One year, then ten more, in steps the timer wheel takes.
    for years in [1u64, 10] {
        time::advance(Duration::from_secs(years * 365 * 86_400)).await;
        settle().await;
        for (name, limiter) in limiters {
            assert_eq!(
                limiter.try_acquire_many(5),
                Ok(()),
                "{name} after {years} years"
            );
        }
        assert_eq!(generic.try_acquire_many(&1, 5), Ok(()));
        assert!(token.try_acquire().is_err());
        assert_eq!(
            token.acquire_timeout(1, Duration::from_secs(1)).await,
            Ok(())
        );
    }
}
