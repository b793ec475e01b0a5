//! Review: `RedisFunnel` where its features meet — tiers of different band
//! counts on one key in turn, `set_quota` while keys hold water, gaps of
//! hours (the stored absolute instants shifted back, as if every earlier
//! decision had been made that much earlier), fine units beside round
//! ones, the refusal cache across keys and tiers, and `peek` against the
//! next decision. Expected answers come from an exact per-band GCRA
//! (checked here against `algorithm::FunnelState`), per the tier-change
//! rule: a call pours into its quota's bands only (same index), bands
//! beyond its count are left as they are (and drain), missing ones read
//! empty.

#![cfg(feature = "redis")]
#![expect(
    clippy::many_single_char_names,
    reason = "quotas a, b, c and the reference's arithmetic, named as in its formulas"
)]

#[path = "support/redis_server.rs"]
mod redis_server;
mod support;
use support::Lcg;

use std::time::{Duration, SystemTime};

use redis_server::RedisServer;
use tokio_ratelimit::algorithm::FunnelState;
use tokio_ratelimit::redis::{FailurePolicy, RedisFunnel, RedisLimitError};
use tokio_ratelimit::{Band, Peek, Quota, Rate, TryAcquireError};

fn gcd(mut a: u128, mut b: u128) -> u128 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

/// A band's exact interval: `num / den` ns, lowest terms.
fn frac(rate: Rate) -> (u128, u128) {
    let p = u128::from(rate.permits());
    let t = rate.period().as_nanos();
    let g = gcd(p, t);
    (t / g, p / g)
}

/// One stored band (an index of the key), in `1/den` ns since the origin.
/// Every band used at one index here has the same `den` (the same units),
/// so no instant is rounded to a microsecond.
#[derive(Clone, Debug)]
struct Slot {
    den: u128,
    tat: u128,
}

impl Slot {
    /// The instant read by a band of `den` (documented rule: written in
    /// other units, an instant with a fraction of a microsecond is read
    /// rounded up to the next whole microsecond). The origin is a whole µs.
    fn read(&self, den: u128) -> u128 {
        if den == self.den {
            return self.tat;
        }
        let unit = 1000 * self.den;
        let us = self.tat.div_ceil(unit);
        us * 1000 * den
    }
}

#[derive(Clone, Debug)]
struct Key {
    slots: Vec<Slot>,
}

impl Key {
    fn new(dens: &[u128]) -> Key {
        Key {
            slots: dens.iter().map(|&den| Slot { den, tat: 0 }).collect(),
        }
    }

    /// The exact GCRA, every band of `quota` on the key's slot of the same
    /// index, all or none: the answer, and the new tats if granted.
    fn pour(
        &self,
        quota: &Quota,
        now_ns: u128,
        n: u32,
    ) -> (Result<(), TryAcquireError>, Vec<(u128, u128)>) {
        let mut ends = vec![];
        let mut wait: Option<Duration> = None;
        for (band, slot) in quota.bands().iter().zip(&self.slots) {
            let (num, den) = frac(band.rate());
            let now = now_ns * den;
            let tau = u128::from(band.capacity()) * num;
            let end = slot.read(den).max(now) + u128::from(n) * num;
            if end - now <= tau {
                ends.push((end, den));
            } else {
                let w = end - now - tau;
                let w = Duration::from_nanos(u64::try_from(w.div_ceil(den)).unwrap());
                wait = wait.max(Some(w));
            }
        }
        match wait {
            None => (Ok(()), ends),
            Some(retry_after) => (Err(TryAcquireError::Limited { retry_after }), vec![]),
        }
    }

    fn try_pour(&mut self, quota: &Quota, now_ns: u128, n: u32) -> Result<(), TryAcquireError> {
        let (answer, ends) = self.pour(quota, now_ns, n);
        for (slot, (end, den)) in self.slots.iter_mut().zip(ends) {
            slot.tat = end;
            slot.den = den;
        }
        answer
    }

    /// `(band, available, full_in)` of each of `quota`'s bands at `now_ns`.
    fn states(&self, quota: &Quota, now_ns: u128) -> Vec<(Band, u32, Duration)> {
        quota
            .bands()
            .iter()
            .zip(&self.slots)
            .map(|(band, slot)| {
                let (num, den) = frac(band.rate());
                let now = now_ns * den;
                let tau = u128::from(band.capacity()) * num;
                let water = slot.read(den).saturating_sub(now);
                let available = if water >= tau {
                    0
                } else {
                    u32::try_from((tau - water) / num).unwrap()
                };
                let full_in = Duration::from_nanos(u64::try_from(water.div_ceil(den)).unwrap());
                (*band, available, full_in)
            })
            .collect()
    }
}

/// The reference is the crate's GCRA: on one band it answers what
/// `FunnelState` answers, to the nanosecond.
#[test]
fn the_reference_is_funnel_state() {
    let fine = Rate::per(1_048_573, Duration::from_secs(100 * 86_400));
    for (rate, cap) in [
        (fine, 8),
        (Rate::per_second(10), 5),
        (Rate::per_hour(7), 3),
        (Rate::per_day(5), 5),
    ] {
        let q = Quota::new(rate, cap);
        let mut key = Key::new(&[frac(rate).1]);
        let mut f = FunnelState::new(rate, cap).unwrap();
        let mut rng = Lcg(u64::from(cap));
        let mut now = 0u128;
        let step = rate.period().as_nanos() / u128::from(rate.permits());
        for _ in 0..2000 {
            now += u128::from(rng.below(u64::try_from(step).unwrap() + 1));
            let n = u32::try_from(rng.below(u64::from(cap)) + 1).unwrap();
            let d = Duration::from_nanos(u64::try_from(now).unwrap());
            assert_eq!(key.states(&q, now)[0].1, f.free(d));
            assert_eq!(key.try_pour(&q, now, n), f.try_pour(d, n));
            assert_eq!(
                Duration::from_nanos(
                    u64::try_from(key.slots[0].tat.div_ceil(key.slots[0].den)).unwrap()
                ),
                f.empty_at()
            );
        }
    }
}

async fn admin(server: &RedisServer) -> redis::aio::MultiplexedConnection {
    redis::Client::open(server.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap()
}

async fn limiter(server: &RedisServer, quota: Quota, prefix: &str, cache: usize) -> RedisFunnel {
    RedisFunnel::builder(server.url())
        .quota(quota)
        .prefix(prefix)
        .failure_policy(FailurePolicy::Closed)
        .timeout(Duration::from_millis(500))
        .refusal_cache(cache)
        .build()
        .await
        .unwrap()
}

fn ns(t: SystemTime) -> u128 {
    t.duration_since(SystemTime::UNIX_EPOCH).unwrap().as_nanos()
}

/// Moves every stored band of `key` back by `by_us` microseconds (the grants'
/// ids left as they are, the expiry too): the state as if every decision
/// had been made that much earlier, i.e. `by_us` more has passed since.
async fn shift_back(con: &mut redis::aio::MultiplexedConnection, key: &str, by_us: u64) {
    let state: Option<String> = redis::cmd("GET").arg(key).query_async(con).await.unwrap();
    let Some(state) = state else { return };
    let (bands, ids) = match state.split_once(" | ") {
        Some((b, i)) => (b, Some(i)),
        None => (state.as_str(), None),
    };
    let n: Vec<u64> = bands.split(' ').map(|p| p.parse().unwrap()).collect();
    let mut out: Vec<String> = vec![];
    for c in n.chunks(3) {
        out.push(format!("{} {} {}", c[0] - by_us, c[1], c[2]));
    }
    let mut new = out.join(" ");
    if let Some(ids) = ids {
        new.push_str(" | ");
        new.push_str(ids);
    }
    let () = redis::cmd("SET")
        .arg(key)
        .arg(new)
        .arg("KEEPTTL")
        .query_async(con)
        .await
        .unwrap();
}

fn as_try(r: Option<Duration>) -> Result<(), TryAcquireError> {
    match r {
        None => Ok(()),
        Some(retry_after) => Err(TryAcquireError::Limited { retry_after }),
    }
}

fn tuples(peek: &Peek) -> Vec<(Band, u32, Duration)> {
    peek.bands()
        .map(|s| (s.band, s.available, s.full_in))
        .collect()
}

const HOUR_US: u64 = 3_600_000_000;

/// How a step chooses its quota.
#[derive(Clone, Copy, Debug)]
enum How {
    /// `decide_with(key, tier)`.
    Call,
    /// `set_quota(tier)`, then `decide(key)`.
    Own,
}

/// Random decisions on a few keys under tiers of 1 to 4 bands (same band at
/// each index, so the reference needs no rounding), each preceded by a
/// peek under the same tier, with shifts of hours now and then. Every
/// decision, and every peek whose time can be recovered, matches the
/// reference exactly.
async fn tiers_replay(
    server: &RedisServer,
    prefix: &str,
    tiers: &[Quota],
    how: How,
    seed: u64,
    steps: usize,
) -> (u32, u32) {
    let l = limiter(server, tiers[0], prefix, 0).await;
    let mut con = admin(server).await;
    let widest = tiers.iter().max_by_key(|q| q.bands().len()).unwrap();
    let dens: Vec<u128> = widest.bands().iter().map(|b| frac(b.rate()).1).collect();
    let keys = ["a", "b", "c"];
    let mut refs: Vec<Key> = keys.iter().map(|_| Key::new(&dens)).collect();
    let origin = ns(l.decide("origin", 0).await.unwrap().server_time);
    // Per key: how far (ns) it has been shifted back in all.
    let mut shifted = [0u128; 3];
    let mut rng = Lcg(seed);
    let (mut granted, mut refused) = (0, 0);
    let mut last_now = [0u128; 3];
    for step in 0..steps {
        let k = usize::try_from(rng.below(3)).unwrap();
        let t = usize::try_from(rng.below(tiers.len() as u64)).unwrap();
        let tier = tiers[t];
        let n = u32::try_from(rng.below(u64::from(tier.capacity().min(4))) + 1).unwrap();
        if rng.below(12) == 0 {
            let by = HOUR_US * (1 + rng.below(30)) + rng.below(1_000_000);
            shift_back(&mut con, &format!("{prefix}{}", keys[k]), by).await;
            shifted[k] += u128::from(by) * 1000;
        }
        let peek = l.peek_with(keys[k], &tier, n).await.unwrap();
        let d = match how {
            How::Call => l.decide_with(keys[k], &tier, n).await.unwrap(),
            How::Own => {
                l.set_quota(tier).unwrap();
                l.decide(keys[k], n).await.unwrap()
            }
        };
        let now = ns(d.server_time) - origin + shifted[k];
        let r = &mut refs[k];
        let ctx = format!(
            "step {step}: key {} tier {t} {tier:?} n {n} at {now} ns (shifted {} h)",
            keys[k],
            shifted[k] / 3_600_000_000_000
        );
        // The peek: its server time from a band that is not full.
        let timed = r
            .states(&tier, now)
            .iter()
            .zip(peek.bands())
            .zip(&r.slots)
            .find(|((_, s), _)| !s.full_in.is_zero())
            .map(|((st, s), slot)| {
                let den = frac(st.0.rate()).1;
                slot.read(den).div_ceil(den) - s.full_in.as_nanos()
            });
        if let Some(at) = timed {
            assert!(at <= now && at >= last_now[k], "{ctx}: peek at {at}");
            let (answer, _) = r.pour(&tier, at, n);
            assert_eq!(peek.answer(), answer, "{ctx}: peek at {at}");
            assert_eq!(tuples(&peek), r.states(&tier, at), "{ctx}: peek at {at}");
        } else {
            assert!(
                peek.is_granted(),
                "{ctx}: peek of full bands {:?}",
                tuples(&peek)
            );
        }
        // The peek agrees with the next decision: granted then ⇒ granted now.
        if peek.is_granted() {
            assert!(
                d.is_granted(),
                "{ctx}: the peek granted, the decision refused {d:?}"
            );
        } else if let Some(r) = d.retry_after {
            assert!(r <= peek.retry_after().unwrap(), "{ctx}");
        }
        last_now[k] = now;
        let expected = r.try_pour(&tier, now, n);
        assert_eq!(as_try(d.retry_after), expected, "{ctx}");
        if d.is_granted() {
            granted += 1;
        } else {
            refused += 1;
        }
    }
    (granted, refused)
}

fn fine() -> Rate {
    Rate::per(1_048_573, Duration::from_secs(100 * 86_400))
}

/// Tiers of 1, 2, 3 and 4 bands: 10/s, then a day band, then the fine
/// band, then 7 an hour.
fn tier_family() -> Vec<Quota> {
    let one = Quota::new(Rate::per_second(10), 5);
    let two = one.and(Rate::per_day(5), 5);
    let three = two.and(fine(), 8);
    let four = three.and(Rate::per_hour(7), 3);
    vec![four, one, three, two]
}

#[tokio::test]
async fn tiers_of_other_band_counts_on_one_key_in_turn() {
    let Some(server) = RedisServer::start("tiers_of_other_band_counts_on_one_key_in_turn") else {
        return;
    };
    let (g, r) = tiers_replay(&server, "tj:", &tier_family(), How::Call, 1, 400).await;
    assert!(g > 30 && r > 30, "{g} granted, {r} refused");
}

#[tokio::test]
async fn set_quota_while_keys_hold_water() {
    let Some(server) = RedisServer::start("set_quota_while_keys_hold_water") else {
        return;
    };
    let (g, r) = tiers_replay(&server, "sq:", &tier_family(), How::Own, 2, 400).await;
    assert!(g > 30 && r > 30, "{g} granted, {r} refused");
}

/// Fine units in the first band, round ones after; and a tier that has
/// only the fine band.
#[tokio::test]
async fn fine_units_first_beside_round_bands() {
    let Some(server) = RedisServer::start("fine_units_first_beside_round_bands") else {
        return;
    };
    let a = Quota::new(fine(), 8)
        .and(Rate::per_second(10), 5)
        .and(Rate::per_hour(7), 3);
    let b = Quota::new(fine(), 8);
    let c = Quota::new(fine(), 8).and(Rate::per_second(10), 5);
    let (g, r) = tiers_replay(&server, "fu:", &[a, b, c], How::Call, 3, 300).await;
    assert!(g > 10 && r > 10, "{g} granted, {r} refused");
}

/// A two-band key refused by its day band under the two-band tier: the
/// one-band tier must still be granted (its band has room), a refusal
/// cached for the key must not answer another key in the same cache slot,
/// and once the one-band tier has poured, the day band is as it was.
#[tokio::test]
async fn the_cache_keeps_to_its_key_and_tier() {
    let Some(server) = RedisServer::start("the_cache_keeps_to_its_key_and_tier") else {
        return;
    };
    let two = Quota::new(Rate::per_second(10), 5).and(Rate::per_day(2), 2);
    let one = Quota::new(Rate::per_second(10), 5);
    // One slot: every key collides.
    let l = limiter(&server, two, "ck:", 1).await;
    let plain = limiter(&server, two, "ck:", 0).await;
    l.try_acquire_many("k", 2).await.unwrap();
    let refused = l.try_acquire("k").await;
    let Err(RedisLimitError::Limited { retry_after }) = refused else {
        panic!("{refused:?}")
    };
    assert!(
        retry_after > Duration::from_secs(11 * 3600),
        "{retry_after:?}"
    );
    // Cached now: the same key and tier is refused without Redis.
    let before = l.stats().cached_refusals;
    assert!(l.try_acquire("k").await.is_err());
    assert_eq!(l.stats().cached_refusals, before + 1);
    // Another key in the same slot: Redis decides (fresh key: granted).
    l.try_acquire("j").await.unwrap();
    // The one-band tier on the refused key: its band has room.
    l.try_acquire_with("k", &one, 1).await.unwrap();
    // The day band is untouched by that: still two used.
    let p = plain.peek("k", 1).await.unwrap();
    let day = p.bands().nth(1).unwrap();
    assert_eq!(day.available, 0, "{p:?}");
    // And the cache refuses under the two-band tier again only through Redis.
    assert!(l.try_acquire("k").await.is_err());
    // A cached refusal of n = 1 under the two-band tier: a request of the
    // one-band tier (another quota) goes to Redis, granted.
    for _ in 0..2 {
        l.try_acquire_with("k", &one, 1).await.unwrap();
    }
    // Five in the first band within a few ms: refused under both tiers now.
    let e = l.try_acquire_with("k", &one, 1).await;
    assert!(matches!(e, Err(RedisLimitError::Limited { .. })), "{e:?}");
}

/// Bands of other rates and capacities at the same index, in the same
/// units and in others (thirds, sevenths, the fine band), with tiers of 1
/// to 3 bands: each stored instant carries over (rounded up to a whole µs
/// when read in other units), bands beyond a tier are left to drain.
#[tokio::test]
async fn other_rates_and_units_at_one_index() {
    let Some(server) = RedisServer::start("other_rates_and_units_at_one_index") else {
        return;
    };
    let tiers = [
        Quota::new(Rate::per_second(10), 5)
            .and(Rate::per_day(5), 5)
            .and(fine(), 8),
        Quota::new(Rate::per_second(100), 20),
        Quota::new(Rate::per_second(3), 3).and(Rate::per_hour(24), 3),
        Quota::new(Rate::per_second(7), 4)
            .and(Rate::per_minute(1), 2)
            .and(Rate::per_hour(7), 3),
        Quota::new(fine(), 2).and(fine(), 8),
    ];
    let (g, r) = tiers_replay(&server, "ou:", &tiers, How::Call, 4, 500).await;
    assert!(g > 30 && r > 30, "{g} granted, {r} refused");
    let (g, r) = tiers_replay(&server, "ov:", &tiers, How::Own, 5, 500).await;
    assert!(g > 30 && r > 30, "{g} granted, {r} refused");
}

/// A refusal cached for `n` permits answers a request of more permits of
/// the same key and tier: its `retry_after` must still be that request's
/// own exact wait (what Redis, and a local funnel of the same quota,
/// answer), not the smaller request's.
#[tokio::test]
async fn a_cached_refusal_tells_a_larger_request_its_own_wait() {
    let Some(server) = RedisServer::start("a_cached_refusal_tells_a_larger_request_its_own_wait")
    else {
        return;
    };
    // One permit a second, three at once.
    let q = Quota::new(Rate::per_second(1), 3);
    let l = limiter(&server, q, "cw:", 1024).await;
    let plain = limiter(&server, q, "cw:", 0).await;
    l.try_acquire_many("k", 3).await.unwrap();
    // Redis refuses one permit for about a second: cached.
    let one = l.try_acquire_many("k", 1).await;
    assert!(
        matches!(one, Err(RedisLimitError::Limited { retry_after }) if retry_after > Duration::from_millis(900)),
        "{one:?}"
    );
    // Three permits: Redis (through a limiter without the cache) says
    // about three seconds.
    let exact = plain.peek("k", 3).await.unwrap().retry_after().unwrap();
    assert!(exact > Duration::from_millis(2900), "{exact:?}");
    let before = l.stats().cached_refusals;
    let three = l.try_acquire_many("k", 3).await;
    let cached = l.stats().cached_refusals > before;
    let Err(RedisLimitError::Limited { retry_after }) = three else {
        panic!("{three:?}")
    };
    assert!(
        retry_after + Duration::from_millis(50) >= exact,
        "3 permits refused with retry_after {retry_after:?} (from the cache: {cached}), \
         but they fit only in {exact:?}"
    );
}
