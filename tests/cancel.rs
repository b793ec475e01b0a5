//! Cancellation loses nothing: for `TokenBucket`, `LeakyBucket` (the shaper)
//! and `Funnel`, a dropped, aborted or timed-out `acquire` gives back what it
//! reserved at once, and the waiters behind it move to their new, earlier
//! instants exactly.

use std::time::Duration;

use tokio::task::{JoinHandle, yield_now};
use tokio::time::{self, Instant};
use tokio_ratelimit::test_util::GrantLog;
use tokio_ratelimit::{
    AcquireError, Funnel, LeakyBucket, Limiter, Rate, TokenBucket, TryAcquireError,
};
use tokio_test::{assert_pending, assert_ready_ok, task};

mod support;
use support::{join_all, limited, ms, settle};

fn every_100ms() -> Rate {
    Rate::every(ms(100))
}

fn token(capacity: u32, initial: u32) -> TokenBucket {
    TokenBucket::builder()
        .rate(every_100ms())
        .capacity(capacity)
        .initial(initial)
        .build()
        .unwrap()
}

fn leaky(capacity: u32) -> LeakyBucket {
    LeakyBucket::builder()
        .rate(every_100ms())
        .capacity(capacity)
        .build()
        .unwrap()
}

fn funnel(capacity: u32) -> Funnel {
    Funnel::builder()
        .rate(every_100ms())
        .capacity(capacity)
        .build()
        .unwrap()
}

/// Spawns a task that acquires `n` permits and returns when it got them
/// (since `start`); lets it arrive before returning, so that arrival order
/// is spawn order.
async fn spawn_acquire<L>(limiter: &L, n: u32, start: Instant) -> JoinHandle<Duration>
where
    L: Limiter + Clone + 'static,
{
    let limiter = limiter.clone();

    let handle = tokio::spawn(async move {
        limiter.acquire_many(n).await.unwrap();
        start.elapsed()
    });
    settle().await;
    handle
}

// ---------------------------------------------------------------------------
// Dropping a pending large request
// ---------------------------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn token_bucket_drop_pending_large_request() {
    let b = token(5, 0);
    let start = Instant::now();
    // big: the bucket must hold all 5 → 500 ms. Behind it: 600, 700 ms.
    let mut big = task::spawn(b.acquire_many(5));
    assert_pending!(big.poll());
    let behind = vec![
        spawn_acquire(&b, 1, start).await,
        spawn_acquire(&b, 1, start).await,
    ];
    assert_eq!(b.waiting(), 3);
    assert_eq!(b.try_acquire(), limited(ms(800)));
    drop(big);
    // Its 500 ms (five tokens) come back at once.
    assert_eq!(b.waiting(), 2);
    assert_eq!(b.try_acquire(), limited(ms(300)));
    assert_eq!(join_all(behind).await, [ms(100), ms(200)]);
}

#[tokio::test(start_paused = true)]
async fn token_bucket_drop_pending_request_frees_the_room_at_once() {
    let b = token(5, 5);
    b.try_acquire().unwrap();
    let mut big = task::spawn(b.acquire_many(5));
    assert_pending!(big.poll());
    assert_eq!(b.available(), 0);
    assert_eq!(b.try_acquire_many(4), limited(ms(500)));
    drop(big);
    assert_eq!(b.available(), 4);
    assert_eq!(b.try_acquire_many(4), Ok(()));
}

#[tokio::test(start_paused = true)]
async fn leaky_bucket_drop_pending_large_request() {
    let b = leaky(6);
    let start = Instant::now();
    b.acquire().await.unwrap(); // into the idle bucket: at once
    // big (3 units) comes out when the first unit has drained: 100 ms.
    let mut big = task::spawn(b.acquire_many(3));
    assert_pending!(big.poll());
    // Behind it: 400 and 500 ms.
    let behind = vec![
        spawn_acquire(&b, 1, start).await,
        spawn_acquire(&b, 1, start).await,
    ];
    assert_eq!(b.level(), 6);
    assert_eq!(b.waiting(), 3);
    assert_eq!(b.try_acquire_many(4), limited(ms(400)));
    assert_eq!(b.try_acquire_many(3), limited(ms(300)));
    drop(big);
    // Its 3 units of water come back out of the bucket at once.
    assert_eq!(b.level(), 3);
    assert_eq!(b.waiting(), 2);
    assert_eq!(b.try_acquire_many(4), limited(ms(100)));
    // The meter sees the room (and pours behind the waiters: they keep
    // their turns).
    assert_eq!(b.try_acquire_many(3), Ok(()));
    assert_eq!(join_all(behind).await, [ms(100), ms(200)]);
}

#[tokio::test(start_paused = true)]
async fn funnel_drop_pending_large_request() {
    let f = funnel(5);
    let start = Instant::now();
    f.try_acquire_many(5).unwrap();
    let mut big = task::spawn(f.acquire_many(5));
    assert_pending!(big.poll());
    let behind = vec![
        spawn_acquire(&f, 1, start).await,
        spawn_acquire(&f, 1, start).await,
    ];
    assert_eq!(f.try_acquire(), limited(ms(800)));
    drop(big);
    assert_eq!(f.try_acquire(), limited(ms(300)));
    // The waiters keep their own timers; the drop re-arms them.
    assert_eq!(join_all(behind).await, [ms(100), ms(200)]);
}

// ---------------------------------------------------------------------------
// Dropping a waiter whose turn has come but that never observed it
// ---------------------------------------------------------------------------

// Observed behaviour (all three limiters): a waiter that was granted (by the
// actor, or whose turn came for the funnel) but dropped before it was polled
// to completion did not proceed, so it is treated as cancelled. The engine
// refunds the part of its reservation that has not drained at the drop;
// the limiter ends up exactly as if the request had never come.

#[tokio::test(start_paused = true)]
async fn token_bucket_drop_granted_but_unobserved_waiter() {
    let b = token(3, 0);
    let mut w = task::spawn(b.acquire_many(2));
    assert_pending!(w.poll());
    // Its turn: 200 ms (the bucket back within capacity with 2 taken).
    time::sleep(ms(250)).await;
    assert!(w.is_woken(), "the actor granted it at 200 ms");
    assert_eq!(b.waiting(), 0);
    assert_eq!(b.available(), 0);
    drop(w);
    // Left alone since t = 0, the bucket would hold 2.5 tokens at 250 ms:
    // the two tokens come back, and the half token is kept.
    assert_eq!(b.available(), 2);
    assert_eq!(b.try_acquire_many(3), limited(ms(50)));
    assert_eq!(b.try_acquire_many(2), Ok(()));
}

#[tokio::test(start_paused = true)]
async fn leaky_bucket_drop_granted_but_unobserved_waiter() {
    let b = leaky(3);
    b.acquire().await.unwrap();
    let mut w = task::spawn(b.acquire());
    assert_pending!(w.poll());
    time::sleep(ms(150)).await;
    assert!(w.is_woken(), "the actor released it at 100 ms");
    assert_eq!(b.level(), 1); // half a unit of its water left
    drop(w);
    // The undrained half unit comes back: the bucket is empty, and a new
    // request goes through at once instead of at 200 ms.
    assert_eq!(b.level(), 0);
    let start = Instant::now();
    b.acquire().await.unwrap();
    assert_eq!(start.elapsed(), Duration::ZERO);
}

#[tokio::test(start_paused = true)]
async fn funnel_drop_due_but_unpolled_waiter() {
    let f = funnel(1);
    f.try_acquire().unwrap();
    let mut w = task::spawn(f.acquire());
    assert_pending!(w.poll());
    time::sleep(ms(150)).await;
    assert!(w.is_woken(), "its own timer fired at 100 ms");
    assert_eq!(f.free(), 0);
    drop(w);
    assert_eq!(f.free(), 1);
    assert_eq!(f.try_acquire(), Ok(()));
    assert_eq!(f.try_acquire(), limited(ms(100)));
}

// ---------------------------------------------------------------------------
// Many waiters, half aborted
// ---------------------------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn thousand_waiters_half_aborted_mid_wait() {
    let rate = Rate::per_second(1000);
    let b = TokenBucket::builder()
        .rate(rate)
        .capacity(1)
        .build()
        .unwrap();
    let log = GrantLog::new();
    let handles: Vec<_> = (0..1000usize)
        .map(|who| {
            let b = b.clone();
            let log = log.clone();
            tokio::spawn(async move {
                b.acquire().await.unwrap();
                log.record_for(who, 1);
            })
        })
        .collect();
    // All arrive at t = 0: task i's turn is i ms.
    for _ in 0..1000 {
        if b.waiting() == 999 {
            break;
        }
        yield_now().await;
    }
    assert_eq!(b.waiting(), 999);
    time::sleep(ms(100)).await;
    // At 100 ms, abort 500 of the 899 tasks still waiting for 101..=999 ms,
    // spread over the line (7919 is prime to 899, so i·7919 mod 899 runs
    // over every residue once).
    let aborted: Vec<usize> = (101..1000).filter(|i| i * 7919 % 899 < 500).collect();
    assert_eq!(aborted.len(), 500);
    for &i in &aborted {
        handles[i].abort();
    }
    let mut kept = vec![];
    for (i, h) in handles.into_iter().enumerate() {
        match h.await {
            Ok(()) => kept.push(i),
            Err(e) => {
                assert!(e.is_cancelled());
                assert!(aborted.contains(&i), "task {i} failed: {e}");
            }
        }
    }
    assert_eq!(kept.len(), 500);
    assert_eq!(b.waiting(), 0);
    // 500 grants at 1000/s from a full bucket of 1: the last one at 499 ms,
    // exactly. Every aborted turn went back: the 399 kept waiters behind
    // 100 ms were served at 101, 102, …, 499 ms, in arrival order.
    assert_eq!(log.total(), 500);
    let grants = log.grants();
    assert_eq!(grants.iter().map(|g| g.at).max(), Some(ms(499)));
    let mut late: Vec<(usize, Duration)> = grants
        .iter()
        .filter(|g| g.who > 100)
        .map(|g| (g.who, g.at))
        .collect();
    late.sort_unstable();
    assert_eq!(late.len(), 399);
    for (k, (who, at)) in (101u64..).zip(late) {
        assert_eq!(at, ms(k), "task {who}");
    }
    for g in grants.iter().filter(|g| g.who <= 100) {
        assert_eq!(g.at, ms(u64::try_from(g.who).unwrap()));
    }
    log.assert_rate(rate, 1, ms(1));
}

// ---------------------------------------------------------------------------
// acquire_timeout
// ---------------------------------------------------------------------------

/// A waiter with a 50 ms timeout is queued behind nobody with its turn at
/// 10 ms, and B behind it at 20 ms; then the rate drops to one per 100 ms,
/// pushing them to 100 and 200 ms. A times out at 50 ms and gives its turn
/// back, so B is served at 100 ms, not 200 ms.
async fn timed_out_waiter_gives_back<L>(
    limiter: &L,
    set_rate: impl Fn(Rate),
    then: Result<(), TryAcquireError>,
) where
    L: Limiter + Clone + 'static,
{
    let start = Instant::now();
    let a = {
        let limiter = limiter.clone();
        tokio::spawn(async move {
            let result = limiter.acquire_timeout(1, ms(50)).await;
            (result, start.elapsed())
        })
    };
    settle().await;
    let b = spawn_acquire(limiter, 1, start).await;
    set_rate(Rate::every(ms(100)));
    assert_eq!(a.await.unwrap(), (Err(AcquireError::Timeout), ms(50)));
    assert_eq!(b.await.unwrap(), ms(100));
    assert_eq!(limiter.try_acquire(), then);
}

#[tokio::test(start_paused = true)]
async fn token_bucket_timed_out_waiter_gives_back_its_turn() {
    let b = TokenBucket::builder()
        .rate(Rate::every(ms(10)))
        .capacity(1)
        .initial(0)
        .build()
        .unwrap();
    timed_out_waiter_gives_back(&b, |r| b.set_rate(r).unwrap(), limited(ms(100))).await;
}

#[tokio::test(start_paused = true)]
async fn leaky_bucket_timed_out_waiter_gives_back_its_turn() {
    let b = LeakyBucket::builder()
        .rate(Rate::every(ms(10)))
        .capacity(3)
        .build()
        .unwrap();
    b.try_acquire().unwrap();
    // At 100 ms B's unit is the only water left: the meter has room.
    timed_out_waiter_gives_back(&b, |r| b.set_rate(r).unwrap(), Ok(())).await;
}

#[tokio::test(start_paused = true)]
async fn funnel_timed_out_waiter_gives_back_its_turn() {
    let f = Funnel::builder()
        .rate(Rate::every(ms(10)))
        .capacity(1)
        .build()
        .unwrap();
    f.try_acquire().unwrap();
    timed_out_waiter_gives_back(&f, |r| f.set_rate(r).unwrap(), limited(ms(100))).await;
}

/// An `acquire_timeout` that fails at once reserves nothing: the next
/// waiter's turn is where it would have been (100 ms).
async fn immediate_timeout_reserves_nothing<L: Limiter>(limiter: &L) {
    let start = Instant::now();
    assert_eq!(
        limiter.acquire_timeout(1, ms(50)).await,
        Err(AcquireError::Timeout)
    );
    assert_eq!(start.elapsed(), Duration::ZERO);
    limiter.acquire().await.unwrap();
    assert_eq!(start.elapsed(), ms(100));
}

#[tokio::test(start_paused = true)]
async fn immediate_timeouts_reserve_nothing() {
    immediate_timeout_reserves_nothing(&token(1, 0)).await;
    let b = leaky(3);
    b.acquire().await.unwrap();
    immediate_timeout_reserves_nothing(&b).await;
    let f = funnel(1);
    f.try_acquire().unwrap();
    immediate_timeout_reserves_nothing(&f).await;
}

// ---------------------------------------------------------------------------
// Futures never polled
// ---------------------------------------------------------------------------

/// Creates and drops `acquire` futures without polling them; nothing
/// changes: the limiter still refuses `try_n` permits with `retry_after`,
/// and the next waiter is served at `next`.
async fn unpolled_changes_nothing<L: Limiter>(
    limiter: &L,
    try_n: u32,
    retry_after: Duration,
    next: Duration,
) {
    let start = Instant::now();
    drop(limiter.acquire_many(1));
    drop(limiter.acquire_timeout(1, Duration::MAX));
    drop(task::spawn(limiter.acquire()));
    assert_eq!(limiter.try_acquire_many(try_n), limited(retry_after));
    limiter.acquire().await.unwrap();
    assert_eq!(start.elapsed(), next);
}

#[tokio::test(start_paused = true)]
async fn token_bucket_unpolled_future_changes_nothing() {
    let b = token(2, 0);
    drop(b.acquire_many(2));
    assert_eq!(b.waiting(), 0);
    unpolled_changes_nothing(&b, 1, ms(100), ms(100)).await;
}

#[tokio::test(start_paused = true)]
async fn leaky_bucket_unpolled_future_changes_nothing() {
    let b = leaky(2);
    b.acquire().await.unwrap();
    drop(b.acquire());
    assert_eq!(b.level(), 1);
    assert_eq!(b.waiting(), 0);
    unpolled_changes_nothing(&b, 2, ms(100), ms(100)).await;
}

#[tokio::test(start_paused = true)]
async fn funnel_unpolled_future_changes_nothing() {
    let f = funnel(1);
    f.try_acquire().unwrap();
    drop(f.acquire());
    assert_eq!(f.level(), 1);
    unpolled_changes_nothing(&f, 1, ms(100), ms(100)).await;
}

#[tokio::test(start_paused = true)]
async fn unpolled_future_on_a_ready_bucket_takes_nothing() {
    let b = token(1, 1);
    let mut f = task::spawn(b.acquire());
    drop(task::spawn(b.acquire()));
    assert_eq!(b.available(), 1);
    assert_ready_ok!(f.poll());
    assert_eq!(b.available(), 0);
}
