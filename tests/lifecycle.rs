//! Lifecycle: no waiter hangs, whatever happened to the runtime a limiter
//! was built in, to the tasks waiting on it or to its handles.
//!
//! Deadlines never re-poll a waiter (a waiter that is only ready when polled
//! again would pass a `timeout` around it): waiters are spawned and their
//! `JoinHandle`s awaited under the deadline, and every cross-runtime test
//! runs on a std thread watched in real time, only to turn a hang into a
//! failure.
//!
//! Clocks: each paused runtime has its own clock, which starts at the real
//! instant the runtime is built. A limiter built in runtime A keeps A's
//! instant as its origin and reads "now" in whatever runtime polls it, so in
//! runtime B (built later) it sees a few real milliseconds more than A did.
//! The tests make that gap irrelevant: they advance B past every refill
//! before measuring, or check states that do not depend on it.

use std::future::Future;
use std::sync::LazyLock;
use std::sync::mpsc;
use std::time::Duration;

use tokio::runtime::{Builder, Runtime};
use tokio::task::JoinHandle;
use tokio::time::{self, Instant};
use tokio_ratelimit::keyed::{Keyed, KeyedFunnel};
use tokio_ratelimit::{
    AcquireError, Funnel, LeakyBucket, Limiter, Rate, SmoothBursty, SmoothWarmingUp, TokenBucket,
};

mod support;
use support::{ms, settle};

/// Real time after which a test counts as hung.
const WATCHDOG: Duration = Duration::from_secs(5);

/// Virtual time after which a waiter counts as hung.
const DEADLINE: Duration = Duration::from_secs(60);

fn paused_runtime() -> Runtime {
    Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .unwrap()
}

/// Runs `f` on its own thread and returns its result; fails if it has not
/// finished within [`WATCHDOG`] of real time (the thread is left behind).
fn watched<T: Send + 'static>(name: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
        let _ = tx.send(result);
    });
    match rx.recv_timeout(WATCHDOG) {
        Ok(Ok(value)) => value,
        Ok(Err(panic)) => std::panic::resume_unwind(panic),
        Err(_) => panic!("{name}: hung for {WATCHDOG:?} of real time"),
    }
}

/// Builds a value in a paused runtime that is dropped right after.
fn built_in_dropped_runtime<T>(build: impl FnOnce() -> T) -> T {
    let rt = paused_runtime();
    let value = rt.block_on(async { build() });
    drop(rt);
    value
}

/// Awaits `handle` until `deadline` (virtual), without re-polling the task.
async fn finish<T>(handle: JoinHandle<T>, deadline: Instant) -> T {
    time::timeout_at(deadline, handle)
        .await
        .expect("waiter hung past its deadline")
        .expect("waiter panicked")
}

/// Spawns a waiter and lets it take its place in line; it returns its
/// answer and when it got it (since `start`).
async fn spawn_timed<T, F>(start: Instant, fut: F) -> JoinHandle<(T, Duration)>
where
    F: Future<Output = T> + Send + 'static,
    T: Send + 'static,
{
    let handle = tokio::spawn(async move {
        let out = fut.await;
        (out, start.elapsed())
    });
    settle().await;
    handle
}

fn rate() -> Rate {
    Rate::per_second(20)
}

fn token() -> TokenBucket {
    TokenBucket::builder()
        .rate(rate())
        .capacity(2)
        .build()
        .unwrap()
}

fn leaky() -> LeakyBucket {
    LeakyBucket::builder()
        .rate(rate())
        .capacity(8)
        .build()
        .unwrap()
}

fn funnel() -> Funnel {
    Funnel::builder().rate(rate()).capacity(2).build().unwrap()
}

fn bursty() -> SmoothBursty {
    SmoothBursty::builder()
        .permits_per_second(20.0)
        .build()
        .unwrap()
}

fn warming_up() -> SmoothWarmingUp {
    SmoothWarmingUp::builder()
        .permits_per_second(20.0)
        .warmup(Duration::from_secs(1))
        .build()
        .unwrap()
}

/// `acquire`, `acquire_many(2)`, `acquire_timeout` and `reserve`, one after
/// the other (each arrives while the ones before it wait), after the
/// limiter has idled 10 s; when each was served.
async fn script<L: Limiter + Clone + 'static>(limiter: L) -> Vec<Duration> {
    time::advance(Duration::from_secs(10)).await;
    let start = Instant::now();
    let deadline = start + DEADLINE;
    let l = limiter.clone();
    let a = spawn_timed(start, async move { l.acquire().await }).await;
    let l = limiter.clone();
    let b = spawn_timed(start, async move { l.acquire_many(2).await }).await;
    let l = limiter.clone();
    let c = spawn_timed(start, async move {
        l.acquire_timeout(1, Duration::from_secs(10)).await
    })
    .await;
    let l = limiter.clone();
    let d = spawn_timed(start, async move { l.reserve(1).await.map(|r| r.commit()) }).await;
    let mut out = Vec::new();
    for handle in [a, b, c, d] {
        let (result, at) = finish(handle, deadline).await;
        assert_eq!(result, Ok(()));
        out.push(at);
    }
    out
}

/// The script on a limiter built in a runtime since dropped, run in
/// another; and the same script on one built in the runtime it runs in.
fn moved_and_reference<L>(name: &str, make: fn() -> L) -> (Vec<Duration>, Vec<Duration>)
where
    L: Limiter + Clone + 'static,
{
    let moved = built_in_dropped_runtime(make);
    let moved = watched(name, move || paused_runtime().block_on(script(moved)));
    let reference = watched(name, move || {
        paused_runtime().block_on(async { script(make()).await })
    });
    (moved, reference)
}

#[test]
fn token_bucket_moved_to_another_runtime_serves_on_time() {
    let (moved, reference) = moved_and_reference("token", token);
    // Full (2): one at once, then one token per 50 ms.
    assert_eq!(moved, [ms(0), ms(50), ms(100), ms(150)]);
    assert_eq!(moved, reference);
}

#[test]
fn leaky_bucket_moved_to_another_runtime_serves_on_time() {
    let (moved, reference) = moved_and_reference("leaky", leaky);
    // Empty: the first at once, then each after the water ahead drains.
    assert_eq!(moved, [ms(0), ms(50), ms(150), ms(200)]);
    assert_eq!(moved, reference);
}

#[test]
fn funnel_moved_to_another_runtime_serves_on_time() {
    let (moved, reference) = moved_and_reference("funnel", funnel);
    assert_eq!(moved, [ms(0), ms(50), ms(100), ms(150)]);
    assert_eq!(moved, reference);
}

#[test]
fn smooth_bursty_moved_to_another_runtime_serves_on_time() {
    let (moved, reference) = moved_and_reference("bursty", bursty);
    // One second of stored permits (20) covers all four requests.
    assert_eq!(moved, [ms(0); 4]);
    assert_eq!(moved, reference);
}

#[test]
fn smooth_warming_up_moved_to_another_runtime_serves_on_time() {
    let (moved, reference) = moved_and_reference("warming_up", warming_up);
    assert!(moved[3] > ms(0), "a cold limiter makes later requests wait");
    assert_eq!(moved, reference);
}

fn keyed_token() -> Keyed<String, TokenBucket> {
    Keyed::builder()
        .limiter(|| TokenBucket::builder().rate(rate()).capacity(2).build())
        .background_sweep(false)
        .build()
        .unwrap()
}

fn keyed_funnel() -> KeyedFunnel<String> {
    KeyedFunnel::builder()
        .rate(rate())
        .capacity(2)
        .background_sweep(false)
        .build()
        .unwrap()
}

/// `acquire` and `acquire_many(2)` on key "k" after 10 s idle, then on a new
/// key "new"; when each was served.
async fn keyed_script<F>(acquire: F) -> Vec<Duration>
where
    F: Fn(&'static str, u32) -> JoinHandle<Result<(), AcquireError>>,
{
    time::advance(Duration::from_secs(10)).await;
    let start = Instant::now();
    let deadline = start + DEADLINE;
    let mut handles = Vec::new();
    for (key, n) in [("k", 1), ("k", 2), ("new", 2), ("new", 1)] {
        let handle = acquire(key, n);
        handles.push(tokio::spawn(async move {
            let result = handle.await.unwrap();
            (result, start.elapsed())
        }));
        settle().await;
    }
    let mut out = Vec::new();
    for handle in handles {
        let (result, at) = finish(handle, deadline).await;
        assert_eq!(result, Ok(()));
        out.push(at);
    }
    out
}

#[test]
fn keyed_token_buckets_moved_to_another_runtime_serve_on_time() {
    // Key "k" (and its actor) is made in the dropped runtime.
    let keyed = built_in_dropped_runtime(|| {
        let keyed = keyed_token();
        let _k = keyed.get("k");
        keyed
    });
    let at = watched("keyed", move || {
        paused_runtime().block_on(keyed_script(move |key, n| {
            let keyed = keyed.clone();
            tokio::spawn(async move { keyed.acquire_many(key, n).await })
        }))
    });
    assert_eq!(at, [ms(0), ms(50), ms(0), ms(50)]);
}

#[test]
fn keyed_funnel_moved_to_another_runtime_serves_on_time() {
    let keyed = built_in_dropped_runtime(|| {
        let keyed = keyed_funnel();
        keyed.try_acquire_many("k", 0).unwrap();
        keyed
    });
    let at = watched("keyed_funnel", move || {
        paused_runtime().block_on(keyed_script(move |key, n| {
            let keyed = keyed.clone();
            tokio::spawn(async move { keyed.acquire_many(key, n).await })
        }))
    });
    assert_eq!(at, [ms(0), ms(50), ms(0), ms(50)]);
}
