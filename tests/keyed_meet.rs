//! Where the generic keyed map `Keyed<K, L>` meets every limiter kind as
//! `L` (token bucket, leaky bucket, funnel, the two smooth limiters, a
//! two-band bucket, and a limiter of the user's that keeps the trait's
//! defaults) and the crate's other features: sweeps (a key is dropped only
//! when nobody could tell), live factory changes, `max_keys`, `peek`, and
//! the tower and HTTP layers. All in paused time, every instant exact.

use std::collections::HashMap;
use std::convert::Infallible;
use std::time::Duration;

use async_trait::async_trait;
use axum::body::Body;
use http::{Request, Response, StatusCode};
use tokio::time::{self, Instant};
use tokio_ratelimit::http::{ClientKey, Header, HttpRateLimitLayer};
use tokio_ratelimit::keyed::Keyed;
use tokio_ratelimit::tower::{BoxError, KeyedRateLimitLayer, RateLimited};
use tokio_ratelimit::{
    AcquireError, ConfigError, Funnel, LeakyBucket, Limiter, Quota, Rate, SmoothBursty,
    SmoothWarmingUp, TokenBucket, TryAcquireError,
};
use tokio_test::{assert_pending, assert_ready, task};
use tower::{Layer, ServiceExt, service_fn};

mod support;
use support::{Lcg, limited, ms, settle};

// ---- the kinds ----

fn r10() -> Rate {
    Rate::per_second(10)
}

fn token() -> Result<TokenBucket, ConfigError> {
    TokenBucket::builder().rate(r10()).capacity(2).build()
}

fn leaky() -> Result<LeakyBucket, ConfigError> {
    LeakyBucket::builder().rate(r10()).capacity(2).build()
}

fn leaky1() -> Result<LeakyBucket, ConfigError> {
    LeakyBucket::builder().rate(r10()).capacity(1).build()
}

fn funnel() -> Result<Funnel, ConfigError> {
    Funnel::builder().rate(r10()).capacity(2).build()
}

fn bursty() -> Result<SmoothBursty, ConfigError> {
    SmoothBursty::builder().permits_per_second(10.0).build()
}

fn warming() -> Result<SmoothWarmingUp, ConfigError> {
    SmoothWarmingUp::builder()
        .permits_per_second(10.0)
        .warmup(ms(1000))
        .build()
}

/// 10/s burst 2 and 30/min burst 3.
fn two_band() -> Result<TokenBucket, ConfigError> {
    TokenBucket::builder()
        .quota(Quota::new(r10(), 2).and(Rate::per_minute(30), 3))
        .build()
}

/// A token bucket that starts below its capacity (1 token of 2).
fn token_below() -> Result<TokenBucket, ConfigError> {
    TokenBucket::builder()
        .rate(r10())
        .capacity(2)
        .initial(1)
        .build()
}

/// A limiter of the user's: a token bucket of capacity 2 underneath, and
/// the trait's defaults for everything else (`peek` None, `is_fresh`
/// false, `reserve` spends at once).
#[derive(Clone, Debug)]
struct Mine {
    inner: TokenBucket,
}

fn mine() -> Result<Mine, ConfigError> {
    Ok(Mine { inner: token()? })
}

#[async_trait]
impl Limiter for Mine {
    async fn acquire_many(&self, n: u32) -> Result<(), AcquireError> {
        self.inner.acquire_many(n).await
    }
    fn try_acquire_many(&self, n: u32) -> Result<(), TryAcquireError> {
        self.inner.try_acquire_many(n)
    }
    async fn acquire_timeout(&self, n: u32, timeout: Duration) -> Result<(), AcquireError> {
        self.inner.acquire_timeout(n, timeout).await
    }
}

fn map<L, F>(make: F) -> Keyed<u32, L>
where
    L: Limiter + Clone + 'static,
    F: Fn() -> Result<L, ConfigError> + Send + Sync + 'static,
{
    Keyed::builder()
        .limiter(make)
        .background_sweep(false)
        .build()
        .unwrap()
}

fn full_map<L, F>(make: F) -> Keyed<u32, L>
where
    L: Limiter + Clone + 'static,
    F: Fn() -> Result<L, ConfigError> + Send + Sync + 'static,
{
    Keyed::builder()
        .limiter(make)
        .max_keys(1)
        .background_sweep(false)
        .build()
        .unwrap()
}

/// Runs `check` over every kind, with its name.
macro_rules! every_kind {
    ($check:ident $(, $arg:expr)*) => {{
        every_crate_kind!($check $(, $arg)*);
        $check("mine", mine $(, $arg)*).await;
    }};
}

/// Runs `check` over every kind of the crate's, with its name.
macro_rules! every_crate_kind {
    ($check:ident $(, $arg:expr)*) => {{
        $check("token", token $(, $arg)*).await;
        $check("leaky", leaky $(, $arg)*).await;
        $check("leaky1", leaky1 $(, $arg)*).await;
        $check("funnel", funnel $(, $arg)*).await;
        $check("bursty", bursty $(, $arg)*).await;
        $check("warming", warming $(, $arg)*).await;
        $check("two-band", two_band $(, $arg)*).await;
    }};
}

// ---- 1. sweeps: a key goes only when nobody could tell ----

/// What each side did at one step, for the comparison.
#[derive(Debug, PartialEq)]
enum Did {
    Try(u32, u32, Result<(), TryAcquireError>),
    Peek(u32, u32, Option<Result<(), TryAcquireError>>),
    Waited(u32, u32, Duration, Result<(), AcquireError>),
}

/// A map swept before every step against a twin per key that is never
/// dropped (built when the map first builds the key): every answer, every
/// `peek` and every waiter's grant instant must be the same. Waiters go
/// through `Keyed::acquire_many` on one side and the twin's own on the
/// other; some steps hold a handle (`get`) for a while.
#[expect(clippy::too_many_lines, reason = "one walk, its steps side by side")]
async fn eviction_is_invisible<L, F>(name: &str, make: F, seed: u64)
where
    L: Limiter + Clone + 'static,
    F: Fn() -> Result<L, ConfigError> + Send + Sync + Clone + 'static,
{
    let keyed = map(make.clone());
    let mut twins: HashMap<u32, L> = HashMap::new();
    let mut rng = Lcg(seed);
    let steps = [0, 1, 37, 50, 100, 250, 1000, 3000];
    let mut held: Vec<(u32, L)> = Vec::new();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let start = Instant::now();
    let mut map_log = Vec::new();
    let mut twin_log = Vec::new();
    let mut tasks: Vec<tokio::task::JoinHandle<()>> = Vec::new();
    for step in 0..300u32 {
        let gap = ms(steps[usize::try_from(rng.below(8)).unwrap()]);
        time::advance(gap).await;
        settle().await;
        keyed.sweep();
        if rng.below(4) == 0 {
            held.clear();
        }
        let key = u32::try_from(rng.below(3)).unwrap();
        // 10: a smooth limiter's whole store (1 s of permits) at once.
        let n = [0, 1, 2, 10][usize::try_from(rng.below(4)).unwrap()];
        let op = rng.below(8);
        // The twin is built when the map builds the key: a peek of a key
        // the map does not hold (and a cancel) builds nothing there, so
        // they use a throwaway here too (for the kinds whose state moves
        // from their build on: a bursty limiter storing, a bucket
        // refilling).
        let twin = if matches!(op, 0 | 4) && !twins.contains_key(&key) {
            make().unwrap()
        } else {
            twins.entry(key).or_insert_with(|| make().unwrap()).clone()
        };
        match op {
            0 => {
                let mp = keyed.peek(&key, n).map(|p| p.answer());
                let tp = twin.peek(n).map(|p| p.answer());
                map_log.push(Did::Peek(step, key, mp));
                twin_log.push(Did::Peek(step, key, tp));
            }
            1 => {
                // A waiter on each side.
                let (m2, tx2, tx3) = (keyed.clone(), tx.clone(), tx.clone());
                tasks.push(tokio::spawn(async move {
                    let r = m2.acquire_many(&key, n).await;
                    tx2.send((true, step, key, start.elapsed(), r)).unwrap();
                }));
                let t2 = twin.clone();
                tasks.push(tokio::spawn(async move {
                    let r = t2.acquire_many(n).await;
                    tx3.send((false, step, key, start.elapsed(), r)).unwrap();
                }));
                settle().await;
            }
            2 => {
                // Hold a handle; with one held already, take through it.
                if let Some((_, handle)) = held.iter().find(|(k, _)| *k == key) {
                    map_log.push(Did::Try(step, key, handle.try_acquire_many(n)));
                    twin_log.push(Did::Try(step, key, twin.try_acquire_many(n)));
                } else {
                    held.push((key, keyed.get(&key)));
                }
            }
            3 => {
                // A reservation on each side, held for a while, then
                // committed or given back.
                let for_how_long = ms(steps[usize::try_from(rng.below(8)).unwrap()]);
                let commit = rng.below(2) == 0;
                let (tx2, tx3) = (tx.clone(), tx.clone());
                let sides: [(bool, L, _); 2] =
                    [(true, keyed.get(&key), tx2), (false, twin.clone(), tx3)];
                for (on_map, limiter, tx) in sides {
                    let handle = tokio::spawn(async move {
                        let r = limiter.reserve(n).await;
                        drop(limiter);
                        let at = start.elapsed();
                        match r {
                            Ok(reservation) => {
                                time::sleep(for_how_long).await;
                                if commit {
                                    reservation.commit();
                                }
                                tx.send((on_map, step, key, at, Ok(()))).unwrap();
                            }
                            Err(e) => tx.send((on_map, step, key, at, Err(e))).unwrap(),
                        }
                    });
                    tasks.push(handle);
                }
                settle().await;
            }
            4 => {
                // Cancel the last pair of tasks (a waiter or a holder).
                if tasks.len() >= 2 {
                    let twin_task = tasks.pop().unwrap();
                    let map_task = tasks.pop().unwrap();
                    map_task.abort();
                    twin_task.abort();
                    settle().await;
                }
            }
            _ => {
                map_log.push(Did::Try(step, key, keyed.try_acquire_many(&key, n)));
                twin_log.push(Did::Try(step, key, twin.try_acquire_many(n)));
            }
        }
        while let Ok((on_map, when, which, at, answer)) = rx.try_recv() {
            let log = if on_map { &mut map_log } else { &mut twin_log };
            log.push(Did::Waited(when, which, at, answer));
        }
    }
    // Let every waiter finish (at most a few seconds of debt).
    held.clear();
    time::advance(Duration::from_secs(600)).await;
    settle().await;
    drop(tx);
    while let Some((on_map, when, which, at, answer)) = rx.recv().await {
        let log = if on_map { &mut map_log } else { &mut twin_log };
        log.push(Did::Waited(when, which, at, answer));
    }
    // Waiters log in completion order; compare them by step.
    let sort = |log: &mut Vec<Did>| {
        log.sort_by_key(|d| match d {
            Did::Try(s, ..) | Did::Peek(s, ..) | Did::Waited(s, ..) => *s,
        });
    };
    sort(&mut map_log);
    sort(&mut twin_log);
    for (i, (a, b)) in map_log.iter().zip(&twin_log).enumerate() {
        assert_eq!(
            a,
            b,
            "{name} seed {seed}: entry {i}: map vs never-evicted twin (evicted so far: {})",
            keyed.stats().evicted
        );
    }
    assert_eq!(map_log.len(), twin_log.len(), "{name}");
    // The sweeps did drop keys (else this proves nothing), but those of
    // the kinds that are never fresh: the user's, a bursty limiter that
    // stores permits, a token bucket built below its capacity.
    assert_eq!(
        keyed.stats().evicted > 0,
        !matches!(name, "mine" | "bursty" | "token-below"),
        "{name} seed {seed}"
    );
}

#[tokio::test(start_paused = true)]
async fn eviction_changes_no_answer_on_every_kind_but_smooth_bursty() {
    for seed in [1, 2, 3] {
        eviction_is_invisible("token", token, seed).await;
        eviction_is_invisible("leaky", leaky, seed).await;
        eviction_is_invisible("leaky1", leaky1, seed).await;
        eviction_is_invisible("funnel", funnel, seed).await;
        eviction_is_invisible("warming", warming, seed).await;
        eviction_is_invisible("two-band", two_band, seed).await;
        eviction_is_invisible("mine", mine, seed).await;
    }
}

/// The same walk on `SmoothBursty`: never fresh (it stores permits), never
/// evicted, the same answers. (Before the fix it was evicted when its debt
/// was paid and rebuilt without the permits it would have stored; seed 1
/// diverged at step 156.) See the minimal case below.
#[tokio::test(start_paused = true)]
async fn eviction_changes_no_answer_on_smooth_bursty() {
    for seed in [1, 2, 3] {
        eviction_is_invisible("bursty", bursty, seed).await;
    }
}

/// The module docs: "A key whose state is indistinguishable from a fresh
/// one [...] is dropped by the crate itself [...]. The next use of the key
/// builds it anew, exactly as it would have been"; "Bounded memory, with
/// no change in what is granted". A `SmoothBursty` whose debt is paid and
/// which stores nothing is as a new one at that instant, but not a second
/// later: it stores permits from when it was built (Guava's semantics), so
/// a key rebuilt a second later would lack the second of permits the kept
/// limiter stored. So it is never fresh (while it can store permits), and
/// the key is kept. (Before the fix it reported fresh and was swept.)
#[tokio::test(start_paused = true)]
async fn a_smooth_bursty_key_swept_when_fresh_keeps_the_permits_it_would_have_stored() {
    let m = map(bursty);
    let twin = bursty().unwrap(); // built with the key, never dropped
    assert_eq!(m.try_acquire(&1), Ok(()));
    assert_eq!(twin.try_acquire(), Ok(()));
    time::advance(ms(100)).await; // the first request's debt is paid
    assert!(!twin.is_fresh());
    assert_eq!(
        m.sweep(),
        1,
        "kept: it gathers permits a new one would not have"
    );
    time::advance(ms(1000)).await;
    assert!((twin.stored_permits() - 10.0).abs() < 1e-9);
    assert_eq!(twin.try_acquire_many(10), Ok(()));
    assert_eq!(m.try_acquire_many(&1, 10), Ok(())); // the first request is free
    // The kept limiter spent its stored permits and owes nothing; the
    // rebuilt key owes the second its first request cost.
    assert_eq!(twin.try_acquire(), Ok(()));
    assert_eq!(m.try_acquire(&1), Ok(()), "as the kept limiter answered");
}

/// The same walk on a token bucket that starts below its capacity (1 token
/// of 2), which `Keyed`'s docs list among the limiters that "never report
/// fresh": see the minimal case below.
#[tokio::test(start_paused = true)]
async fn eviction_changes_no_answer_on_a_token_bucket_that_starts_below_capacity() {
    for seed in [1, 2, 3] {
        eviction_is_invisible("token-below", token_below, seed).await;
    }
}

/// `Keyed`'s docs: "Limiters that never report fresh (the default for user
/// types; a token bucket that starts below capacity) are kept until the map
/// is dropped." A bucket of capacity 2 that starts with 1 token is as a
/// new one whenever it is back at exactly 1 token, but not later: the kept
/// bucket refills from that instant, one rebuilt at the key's next use
/// would start at 1 token again. So it never reports fresh, and the key is
/// kept. (Before the fix it reported fresh at 1 token and was swept; a
/// second later the rebuilt key refused what the kept bucket, holding 2,
/// grants.)
#[tokio::test(start_paused = true)]
async fn a_token_bucket_that_starts_below_capacity_is_kept_until_the_map_is_dropped() {
    let m = map(token_below);
    let twin = token_below().unwrap(); // built with the key, never dropped
    assert_eq!(m.try_acquire(&1), Ok(()));
    assert_eq!(twin.try_acquire(), Ok(()));
    time::advance(ms(100)).await; // 1 token again, as when built
    assert!(!twin.is_fresh(), "never fresh: built below its capacity");
    let left = m.sweep();
    time::advance(ms(1000)).await;
    assert_eq!(twin.try_acquire_many(2), Ok(()));
    assert_eq!(
        m.try_acquire_many(&1, 2),
        Ok(()),
        "as the kept bucket answered (keys left by the sweep: {left})"
    );
}

/// The sweep does drop keys of the kinds that become fresh once used and
/// left alone, and keeps the user's limiter and a `SmoothBursty` that
/// stores permits (never fresh).
async fn evicted_after_use<L, F>(name: &str, make: F)
where
    L: Limiter + Clone + 'static,
    F: Fn() -> Result<L, ConfigError> + Send + Sync + 'static,
{
    let m = map(make);
    m.try_acquire(&1).unwrap();
    assert_eq!(m.sweep(), 1, "{name}: just used");
    // Long enough for every kind: funnels and leaky buckets drained, token
    // buckets full, the warming-up limiter cold again.
    time::advance(ms(60_000)).await;
    let left = m.sweep();
    let expected = usize::from(matches!(name, "mine" | "bursty"));
    assert_eq!(left, expected, "{name}: a minute later");
}

#[tokio::test(start_paused = true)]
async fn every_fresh_kind_is_evicted_and_the_user_s_is_kept() {
    every_kind!(evicted_after_use);
}

/// A key with a held handle, or a waiter in flight (through
/// `Keyed::acquire` or a handle's `acquire_room`: for a leaky bucket of
/// capacity 1 the only way to wait), is kept by a sweep, whatever its state;
/// a handle dropped lets a fresh key go.
async fn holding_keeps_the_key<L, F>(name: &str, make: F)
where
    L: Limiter + Clone + 'static,
    F: Fn() -> Result<L, ConfigError> + Send + Sync + 'static,
{
    let m = map(make);
    // The kinds never fresh: the user's, a bursty limiter that stores.
    let mine = usize::from(matches!(name, "mine" | "bursty"));
    let handle = m.get(&1);
    assert_eq!(m.sweep(), 1, "{name}: a held handle");
    drop(handle);
    assert_eq!(m.sweep(), mine, "{name}: the handle dropped");
    // Empty key 2 (the smooth limiters: into debt), then wait on it.
    while m.try_acquire(&2).is_ok() {}
    let room = m.get(&2);
    let mut waiter = task::spawn(async move { room.acquire_room(1).await });
    assert_pending!(waiter.poll());
    // Empty key 3, then wait on it through the map (a leaky bucket's
    // shaper overflows instead).
    while m.try_acquire(&3).is_ok() {}
    let mut keyed_waiter = task::spawn(m.acquire(&3));
    let shaper_overflows = name.starts_with("leaky");
    if shaper_overflows {
        assert_eq!(
            assert_ready!(keyed_waiter.poll()),
            Err(AcquireError::Overflow),
            "{name}"
        );
    } else {
        assert_pending!(keyed_waiter.poll());
    }
    assert_eq!(m.sweep(), 2 + mine, "{name}: waiters on keys 2 and 3");
    time::advance(ms(60_000)).await;
    // Key 2's waiter is due but not polled yet: it still holds its handle.
    assert!(m.sweep() >= 1, "{name}: a waiter due, not yet polled");
    assert_ready!(waiter.poll()).unwrap();
    if !shaper_overflows {
        assert_ready!(keyed_waiter.poll()).unwrap();
    }
}

#[tokio::test(start_paused = true)]
async fn a_held_handle_or_a_waiter_keeps_its_key_on_every_kind() {
    every_kind!(holding_keeps_the_key);
}

// ---- 2. max_keys ----

/// A full map answers a new key's request of more than the key's limiter
/// can ever hold as that limiter would (`InsufficientCapacity`), for
/// `try_acquire_many` and at once for `acquire_many`.
async fn full_map_too_large<L, F>(name: &str, make: F)
where
    L: Limiter + Clone + 'static,
    F: Fn() -> Result<L, ConfigError> + Send + Sync + Clone + 'static,
{
    // What the key's limiter answers on its own.
    let alone = make().unwrap().try_acquire_many(3);
    let m = full_map(make);
    m.try_acquire(&1).unwrap(); // the one slot, active
    assert_eq!(m.try_acquire_many(&2, 0), Ok(()), "{name}: n = 0");
    assert_eq!(
        m.try_acquire(&2),
        Err(TryAcquireError::Unavailable),
        "{name}: n = 1"
    );
    let expected = match alone {
        Err(TryAcquireError::InsufficientCapacity) => Err(TryAcquireError::InsufficientCapacity),
        _ => Err(TryAcquireError::Unavailable),
    };
    assert_eq!(m.try_acquire_many(&2, 3), expected, "{name}: n = 3");
    let mut waiter = task::spawn(m.acquire_many(&2, 3));
    if expected == Err(TryAcquireError::InsufficientCapacity) {
        assert_eq!(
            assert_ready!(waiter.poll()),
            Err(AcquireError::InsufficientCapacity),
            "{name}: acquire_many(3)"
        );
    } else {
        assert_pending!(waiter.poll());
    }
}

#[tokio::test(start_paused = true)]
async fn a_full_map_answers_a_too_large_request_as_the_key_s_limiter_would_on_every_crate_kind() {
    every_crate_kind!(full_map_too_large);
}

/// A limiter of the user's (capacity 2, `peek` the trait's default): the
/// map reads a new key's capacity from `peek`, so here the map's refusal
/// stands, as `KeyedBuilder::max_keys` says ("a limiter of your own that
/// keeps the trait's default `peek` gets `Unavailable` there too"); `n` = 0
/// still passes. (The review that found this read the older docs, which
/// promised `InsufficientCapacity` for every limiter.)
#[tokio::test(start_paused = true)]
async fn a_full_map_of_user_limiters_without_peek_refuses_a_new_key_as_unavailable() {
    let m = full_map(mine);
    m.try_acquire(&1).unwrap();
    assert_eq!(m.try_acquire_many(&2, 0), Ok(()));
    assert_eq!(m.try_acquire_many(&2, 3), Err(TryAcquireError::Unavailable));
    assert_eq!(m.try_acquire(&2), Err(TryAcquireError::Unavailable));
}

/// `n` = 1 never builds a limiter for a new key a full map turns away
/// (every kind holds one permit): it is `Unavailable` on every kind, even
/// a leaky bucket of capacity 1 whose only key has a request for room
/// waiting on credit (water above the capacity).
#[tokio::test(start_paused = true)]
async fn a_full_map_of_leaky_buckets_of_one_refuses_a_new_key_as_unavailable() {
    let m = full_map(leaky1);
    m.try_acquire(&1).unwrap();
    let handle = m.get(&1);
    let mut room = task::spawn(async move { handle.acquire_room(1).await });
    assert_pending!(room.poll());
    assert_eq!(m.try_acquire(&2), Err(TryAcquireError::Unavailable));
    assert_eq!(
        m.try_acquire_many(&2, 2),
        Err(TryAcquireError::InsufficientCapacity)
    );
    assert_eq!(m.peek(&2, 1).unwrap().answer(), Ok(()), "not foreseen");
    assert_eq!(m.stats().refused, 1);
    // The waiter comes out after the first unit drained (100 ms); its own
    // unit drains 100 ms later, and then key 1 is fresh and gives its slot.
    time::advance(ms(100)).await;
    assert_ready!(room.poll()).unwrap();
    assert_eq!(m.try_acquire(&1), limited(ms(100)));
    time::advance(ms(100)).await;
    assert_eq!(m.try_acquire(&2), Ok(()));
}

// ---- 3. peek against the next call, held and absent keys ----

/// `Keyed::peek(key, n)` says what `try_acquire_many(key, n)` answers next
/// (when the kind peeks at all), for keys held (with waiters of every sort
/// queued on them: `Keyed::acquire_many`, a handle's `acquire_room`) and
/// keys absent (never seen, or swept).
async fn peek_agrees<L, F>(name: &str, make: F, seed: u64)
where
    L: Limiter + Clone + 'static,
    F: Fn() -> Result<L, ConfigError> + Send + Sync + 'static,
{
    let m = map(make);
    let mut rng = Lcg(seed);
    let steps = [0, 1, 37, 100, 250, 1000];
    let mut peeked = 0;
    for step in 0..400 {
        time::advance(ms(steps[usize::try_from(rng.below(6)).unwrap()])).await;
        settle().await;
        if rng.below(3) == 0 {
            m.sweep();
        }
        let key = u32::try_from(rng.below(3)).unwrap();
        let n = u32::try_from(rng.below(4)).unwrap();
        match rng.below(8) {
            0 => {
                let m = m.clone();
                tokio::spawn(async move { m.acquire_many(&key, n).await });
                settle().await;
            }
            1 => {
                let h = m.get(&key);
                tokio::spawn(async move { h.acquire_room(n).await });
                settle().await;
            }
            _ => {}
        }
        let held = m.len();
        let p = m.peek(&key, n);
        assert_eq!(m.len(), held, "{name}: peek added a key");
        let answered = m.try_acquire_many(&key, n);
        if let Some(p) = p {
            peeked += 1;
            assert_eq!(
                p.answer(),
                answered,
                "{name} seed {seed} step {step}: key {key} n {n}"
            );
        }
    }
    let peeks = !matches!(name, "bursty" | "warming" | "mine");
    assert_eq!(peeked > 0, peeks, "{name}");
}

#[tokio::test(start_paused = true)]
async fn peek_agrees_with_the_next_call_for_held_and_absent_keys_on_every_kind() {
    for seed in [5, 6] {
        every_kind!(peek_agrees, seed);
    }
}

// ---- 4. live changes of the factory ----

fn token_of(rate: Rate, capacity: u32) -> impl Fn() -> Result<TokenBucket, ConfigError> {
    move || TokenBucket::builder().rate(rate).capacity(capacity).build()
}

/// `set_limiter` while keys have waiters, held handles and reservations:
/// each held key keeps its limiter (and its queue) until it is fresh and
/// swept; a new key gets the new one; `peek` of an absent key and the next
/// `try_acquire` agree on both sides of the change.
#[tokio::test(start_paused = true)]
async fn set_limiter_changes_new_keys_and_keys_once_fresh() {
    let m: Keyed<u32, TokenBucket> = map(token_of(Rate::per_second(1), 1));
    assert_eq!(
        m.peek(&7, 5).unwrap().answer(),
        Err(TryAcquireError::InsufficientCapacity)
    );
    m.try_acquire(&1).unwrap();
    let mut waiter = task::spawn(m.acquire(&1)); // due at 1 s
    assert_pending!(waiter.poll());
    let handle = m.get(&5); // full, held outside
    let reserved = m.get(&6).reserve(1).await.unwrap(); // a reservation only
    m.set_limiter(token_of(Rate::per_second(10), 5)).unwrap();
    // Held keys: the old limiter (1/s, capacity 1), queue and all.
    assert_eq!(m.try_acquire(&1), limited(ms(2000)));
    assert_eq!(m.peek(&1, 1).unwrap().answer(), limited(ms(2000)));
    assert_eq!(
        m.try_acquire_many(&5, 2),
        Err(TryAcquireError::InsufficientCapacity)
    );
    assert_eq!(m.try_acquire(&6), limited(ms(1000)));
    // A new key: the new one, as peek said.
    assert_eq!(m.peek(&7, 5).unwrap().answer(), Ok(()));
    assert_eq!(m.try_acquire_many(&7, 5), Ok(()));
    assert_eq!(m.try_acquire(&7), limited(ms(100)));
    // The handle dropped: key 5 is fresh, swept, and made anew.
    drop(handle);
    m.sweep();
    assert_eq!(m.peek(&5, 5).unwrap().answer(), Ok(()));
    assert_eq!(m.try_acquire_many(&5, 5), Ok(()));
    // Key 6: committed, then full again after 1 s: new.
    reserved.commit();
    time::advance(ms(1000)).await;
    assert_ready!(waiter.poll()).unwrap();
    m.sweep();
    assert_eq!(m.try_acquire_many(&6, 5), Ok(()));
    // Key 1: its waiter's permit refills at 2 s; until then the old limiter.
    assert_eq!(m.try_acquire(&1), limited(ms(1000)));
    time::advance(ms(1000)).await;
    m.sweep();
    assert_eq!(m.peek(&1, 5).unwrap().answer(), Ok(()));
    assert_eq!(m.try_acquire_many(&1, 5), Ok(()));
}

/// `set_limiter_for` (per key) replaces a `limiter_for` factory the same
/// way, for every kind a key can move to (a tier of another kind is not
/// possible: one `L`), here leaky buckets.
#[tokio::test(start_paused = true)]
async fn set_limiter_for_gives_new_tiers_to_new_and_fresh_keys() {
    let m: Keyed<u32, LeakyBucket> = Keyed::builder()
        .limiter_for(|_: &u32| LeakyBucket::builder().rate(r10()).capacity(1).build())
        .background_sweep(false)
        .build()
        .unwrap();
    m.try_acquire(&1).unwrap();
    m.set_limiter_for(|key: &u32| {
        LeakyBucket::builder()
            .rate(r10())
            .capacity(if key % 2 == 0 { 4 } else { 2 })
            .build()
    });
    assert_eq!(m.try_acquire(&1), limited(ms(100)), "held: capacity 1");
    assert_eq!(m.peek(&2, 4).unwrap().answer(), Ok(()));
    assert_eq!(m.try_acquire_many(&2, 4), Ok(()));
    assert_eq!(
        m.peek(&3, 3).unwrap().answer(),
        Err(TryAcquireError::InsufficientCapacity)
    );
    assert_eq!(
        m.try_acquire_many(&3, 3),
        Err(TryAcquireError::InsufficientCapacity)
    );
    time::advance(ms(100)).await;
    m.sweep();
    assert_eq!(m.try_acquire_many(&1, 2), Ok(()), "swept: its new tier");
}

/// `Keyed`'s docs: "The factory is called inside the runtime the map was
/// built in, so keys can be added from any thread" — and `get` from a
/// plain thread does build a key. `set_limiter` checks its factory "when
/// called once, to check it (as build does)", but calls it on the caller's
/// thread, outside the map's runtime: a bucket's builder then fails with
/// `NoRuntime`, and a configuration reload from a plain thread is refused
/// though the factory is good (the map would call it inside its runtime).
#[tokio::test(start_paused = true)]
async fn set_limiter_from_a_plain_thread_accepts_a_good_factory() {
    let m: Keyed<u32, TokenBucket> = map(token);
    let other = m.clone();
    let (got, set) = std::thread::spawn(move || {
        let got = other.get(&1).capacity();
        let set = other.set_limiter(token_of(r10(), 5));
        (got, set)
    })
    .join()
    .unwrap();
    assert_eq!(
        got, 2,
        "get from the thread builds the key in the map's runtime"
    );
    assert!(set.is_ok(), "set_limiter from the thread: {set:?}");
    assert_eq!(m.try_acquire_many(&2, 5), Ok(()));
}

/// The same with the background sweeper, as a service runs it: a key whose
/// debt is paid on the sweeper's tick (1 permit a second, swept every
/// second) is dropped, and two seconds later the rebuilt key refuses the
/// second of two requests the kept limiter grants (its stored permit).
#[tokio::test(start_paused = true)]
async fn a_smooth_bursty_key_swept_by_the_background_sweeper_keeps_its_stored_permit() {
    let one = || SmoothBursty::builder().permits_per_second(1.0).build();
    let m: Keyed<u32, SmoothBursty> = Keyed::builder().limiter(one).build().unwrap();
    let twin = one().unwrap();
    assert_eq!(m.try_acquire(&1), Ok(()));
    assert_eq!(twin.try_acquire(), Ok(()));
    settle().await; // the sweeper's first sweep: 1 key left
    time::advance(ms(1000)).await;
    settle().await; // its second, at the instant the debt is paid
    time::advance(ms(2000)).await;
    settle().await;
    let kept = [twin.try_acquire(), twin.try_acquire()];
    let map = [m.try_acquire(&1), m.try_acquire(&1)];
    assert_eq!(
        map,
        kept,
        "map vs kept limiter (evicted: {})",
        m.stats().evicted
    );
}

// ---- 5. the tower and HTTP layers over a `Keyed` of each kind ----

fn ceil_secs(d: Duration) -> u64 {
    d.as_secs() + u64::from(d.subsec_nanos() > 0)
}

/// Each request through `HttpRateLimitLayer` over a `Keyed` (swept before
/// every request) is answered as a never-evicted twin of the key's limiter
/// decides: 200, or 429 with `Retry-After` its wait in whole seconds
/// rounded up (at least 1); and `RateLimit` shows the twin's bands after
/// the decision (`r` its permits available, `t` the seconds until one
/// more), or is absent for a kind that has no bands.
async fn http_answers_as_the_key_s_limiter<L, F>(name: &str, make: F)
where
    L: Limiter + Clone + 'static,
    F: Fn() -> Result<L, ConfigError> + Send + Sync + Clone + 'static,
{
    let m: Keyed<ClientKey, L> = Keyed::builder()
        .limiter(make.clone())
        .background_sweep(false)
        .build()
        .unwrap();
    let layer = HttpRateLimitLayer::new(m.clone(), Header::new("x-key"));
    let svc = layer.layer(service_fn(|_: Request<Body>| {
        futures::future::ready(Ok::<_, Infallible>(Response::new(Body::empty())))
    }));
    let mut twins: HashMap<&str, L> = HashMap::new();
    let mut rng = Lcg(11);
    let steps = [0, 1, 40, 100, 250, 1000, 5000];
    for step in 0..200 {
        time::advance(ms(steps[usize::try_from(rng.below(7)).unwrap()])).await;
        m.sweep();
        let key = ["a", "b"][usize::try_from(rng.below(2)).unwrap()];
        let request = Request::get("/")
            .header("x-key", key)
            .body(Body::empty())
            .unwrap();
        let response = svc.clone().oneshot(request).await.unwrap();
        let twin = twins.entry(key).or_insert_with(|| make().unwrap());
        let decided = twin.try_acquire();
        let at = format!("{name} step {step} key {key}");
        let headers = response.headers();
        match decided {
            Ok(()) => assert_eq!(response.status(), StatusCode::OK, "{at}"),
            Err(TryAcquireError::Limited { retry_after }) => {
                assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS, "{at}");
                assert_eq!(
                    headers["retry-after"],
                    ceil_secs(retry_after).max(1).to_string(),
                    "{at}: {retry_after:?}"
                );
            }
            other => panic!("{at}: the twin answered {other:?}"),
        }
        let bands: Vec<String> = twin
            .peek(0)
            .map(|p| {
                p.bands()
                    .map(|b| format!(";r={};t={}", b.available, ceil_secs(b.next_in)))
                    .collect()
            })
            .unwrap_or_default();
        let shown: Vec<String> = headers
            .get("ratelimit")
            .map(|v| {
                v.to_str()
                    .unwrap()
                    .split(", ")
                    .map(|item| item[item.find(";r=").unwrap()..].to_owned())
                    .collect()
            })
            .unwrap_or_default();
        assert_eq!(shown, bands, "{at}");
    }
}

#[tokio::test(start_paused = true)]
async fn the_http_layer_answers_as_each_key_s_limiter_decides_on_every_kind() {
    http_answers_as_the_key_s_limiter("token", token).await;
    http_answers_as_the_key_s_limiter("leaky", leaky).await;
    http_answers_as_the_key_s_limiter("leaky1", leaky1).await;
    http_answers_as_the_key_s_limiter("funnel", funnel).await;
    http_answers_as_the_key_s_limiter("warming", warming).await;
    http_answers_as_the_key_s_limiter("two-band", two_band).await;
    http_answers_as_the_key_s_limiter("mine", mine).await;
}

/// A full map: the HTTP layer answers a new key 503 with the configured
/// `Retry-After` (1 s) and no `RateLimit` fields (the key's limit decided
/// nothing), whatever the kind; the key in the slot is served as before.
async fn http_full_map<L, F>(name: &str, make: F)
where
    L: Limiter + Clone + 'static,
    F: Fn() -> Result<L, ConfigError> + Send + Sync + 'static,
{
    let m: Keyed<ClientKey, L> = Keyed::builder()
        .limiter(make)
        .max_keys(1)
        .background_sweep(false)
        .build()
        .unwrap();
    let svc =
        HttpRateLimitLayer::new(m, Header::new("x-key")).layer(service_fn(|_: Request<Body>| {
            futures::future::ready(Ok::<_, Infallible>(Response::new(Body::empty())))
        }));
    let call = |key: &str| {
        let request = Request::get("/")
            .header("x-key", key)
            .body(Body::empty())
            .unwrap();
        svc.clone().oneshot(request)
    };
    assert_eq!(call("a").await.unwrap().status(), StatusCode::OK, "{name}");
    let refused = call("b").await.unwrap();
    assert_eq!(refused.status(), StatusCode::SERVICE_UNAVAILABLE, "{name}");
    assert_eq!(refused.headers()["retry-after"], "1", "{name}");
    assert!(refused.headers().get("ratelimit").is_none(), "{name}");
    assert!(
        refused.headers().get("ratelimit-policy").is_none(),
        "{name}"
    );
}

#[tokio::test(start_paused = true)]
async fn the_http_layer_answers_a_full_map_503_on_every_kind() {
    every_kind!(http_full_map);
}

/// `KeyedRateLimitLayer` over a `Keyed` of each kind: granted requests
/// reach the service; refused ones fail with `RateLimited` carrying the key
/// and the exact wait the key's limiter (a never-evicted twin) gave.
async fn tower_answers_as_the_key_s_limiter<L, F>(name: &str, make: F)
where
    L: Limiter + Clone + 'static,
    F: Fn() -> Result<L, ConfigError> + Send + Sync + Clone + 'static,
{
    let m: Keyed<u32, L> = map(make.clone());
    let svc = KeyedRateLimitLayer::new(m.clone(), |req: &(u32, u32)| req.0).layer(service_fn(
        |req: (u32, u32)| futures::future::ready(Ok::<_, BoxError>(req.1)),
    ));
    let mut twins: HashMap<u32, L> = HashMap::new();
    let mut rng = Lcg(13);
    let steps = [0, 1, 40, 100, 250, 1000, 5000];
    for step in 0..200u32 {
        time::advance(ms(steps[usize::try_from(rng.below(7)).unwrap()])).await;
        m.sweep();
        let key = u32::try_from(rng.below(2)).unwrap();
        let answer = svc.clone().oneshot((key, step)).await;
        let twin = twins.entry(key).or_insert_with(|| make().unwrap());
        let at = format!("{name} step {step} key {key}");
        match (twin.try_acquire(), answer) {
            (Ok(()), Ok(echo)) => assert_eq!(echo, step, "{at}"),
            (Err(TryAcquireError::Limited { retry_after }), Err(error)) => {
                let limited = error
                    .downcast_ref::<RateLimited<u32>>()
                    .unwrap_or_else(|| panic!("{at}: {error}"));
                assert_eq!(
                    (limited.key, limited.retry_after),
                    (key, retry_after),
                    "{at}"
                );
            }
            (twin, answer) => panic!("{at}: twin {twin:?}, layer {answer:?}"),
        }
    }
}

#[tokio::test(start_paused = true)]
async fn the_keyed_tower_layer_answers_as_each_key_s_limiter_decides_on_every_kind() {
    tower_answers_as_the_key_s_limiter("token", token).await;
    tower_answers_as_the_key_s_limiter("leaky", leaky).await;
    tower_answers_as_the_key_s_limiter("leaky1", leaky1).await;
    tower_answers_as_the_key_s_limiter("funnel", funnel).await;
    tower_answers_as_the_key_s_limiter("warming", warming).await;
    tower_answers_as_the_key_s_limiter("two-band", two_band).await;
    tower_answers_as_the_key_s_limiter("mine", mine).await;
}

/// `KeyedBuilder::max_keys`: "A full map looks for fresh keys to drop ...
/// at most once per an eighth of the `sweep_interval`: a key that turns
/// fresh just after a look gives its slot at the next one, up to that long
/// later (125 ms by default)". The one slot holds a key fresh (a full
/// bucket, nobody holding it) from 100 ms; a refused attempt at 99 ms
/// looked; new keys are refused at 100, 150 and 200 ms and get the slot
/// at 250 ms, the first try after the next look is due (224 ms). (The
/// review that found this read the older docs, which did not say it.)
#[tokio::test(start_paused = true)]
async fn a_new_key_gets_the_slot_of_a_key_fresh_now_at_the_next_look() {
    let m = full_map(|| TokenBucket::builder().rate(r10()).capacity(1).build());
    m.try_acquire(&1).unwrap();
    time::advance(ms(99)).await;
    assert_eq!(
        m.try_acquire(&2),
        Err(TryAcquireError::Unavailable),
        "key 1 active"
    );
    time::advance(ms(1)).await; // key 1 full again, nobody holds it: fresh
    let mut answers = Vec::new();
    for _ in 0..4 {
        answers.push(m.try_acquire(&2));
        if answers.last() == Some(&Ok(())) {
            break;
        }
        time::advance(ms(50)).await;
    }
    assert_eq!(
        answers,
        [
            Err(TryAcquireError::Unavailable),
            Err(TryAcquireError::Unavailable),
            Err(TryAcquireError::Unavailable),
            Ok(())
        ],
        "at 100, 150, 200 and 250 ms"
    );
}

/// The same through `acquire`, which "waits until a slot frees up": its
/// first look at 0 ms finds key 1 active; key 1 is fresh at 100 ms, and the
/// next look, at 125 ms (the gap after the first), gives the new key its
/// slot.
#[tokio::test(start_paused = true)]
async fn acquire_on_a_new_key_gets_the_slot_at_the_next_look() {
    let m = full_map(|| TokenBucket::builder().rate(r10()).capacity(1).build());
    let start = Instant::now();
    m.try_acquire(&1).unwrap();
    m.acquire(&2).await.unwrap();
    assert_eq!(start.elapsed(), ms(125));
}
