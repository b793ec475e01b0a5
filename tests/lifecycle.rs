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
    AcquireError, Funnel, LeakyBucket, Limiter, Quota, Rate, SmoothBursty, SmoothWarmingUp,
    TokenBucket,
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
        Err(mpsc::RecvTimeoutError::Timeout | mpsc::RecvTimeoutError::Disconnected) => {
            panic!("{name}: hung for {WATCHDOG:?} of real time")
        }
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
#[expect(
    clippy::many_single_char_names,
    reason = "one letter per waiter, in arrival order"
)]
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
    let d = spawn_timed(start, async move {
        l.reserve(1).await.map(tokio_ratelimit::Reservation::commit)
    })
    .await;
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

/// Builds a limiter in a paused runtime, runs `setup` on it and spawns
/// three waiters (each one permit) that must wait, then shuts the runtime
/// down with the waiters in it (their tasks are dropped).
fn waiters_shut_down<L: Limiter + Clone + 'static>(make: fn() -> L, setup: fn(&L)) -> L {
    let rt = paused_runtime();
    let limiter = rt.block_on(async {
        let limiter = make();
        setup(&limiter);
        for _ in 0..3 {
            let l = limiter.clone();
            tokio::spawn(async move { l.acquire().await });
        }
        settle().await;
        assert_eq!(limiter.stats().waiting, 3);
        limiter
    });
    rt.shutdown_timeout(Duration::ZERO);
    limiter
}

fn slow_token() -> TokenBucket {
    TokenBucket::builder()
        .rate(Rate::per_second(1))
        .capacity(10)
        .build()
        .unwrap()
}

fn slow_funnel() -> Funnel {
    Funnel::builder()
        .rate(Rate::per_second(1))
        .capacity(10)
        .build()
        .unwrap()
}

fn slow_leaky() -> LeakyBucket {
    LeakyBucket::builder()
        .rate(Rate::per_second(1))
        .capacity(10)
        .build()
        .unwrap()
}

/// In a new runtime: after `idle`, the limiter has exactly what it would
/// have had without the dropped waiters (`n` permits at once, which their
/// reservations would have taken), and the next `acquire` is served after
/// `next` (at most `next`, for a limiter whose price depends on the real
/// time between the two runtimes).
fn still_works<L: Limiter + 'static>(
    name: &str,
    limiter: L,
    idle: Duration,
    n: u32,
    next: Duration,
) {
    still_works_within(name, limiter, idle, n, next, true);
}

fn still_works_within<L: Limiter + 'static>(
    name: &str,
    limiter: L,
    idle: Duration,
    n: u32,
    next: Duration,
    exact: bool,
) {
    watched(name, move || {
        paused_runtime().block_on(async move {
            assert_eq!(limiter.stats().waiting, 0);
            time::advance(idle).await;
            assert_eq!(limiter.try_acquire_many(n), Ok(()), "permits lost");
            let start = Instant::now();
            let limiter = std::sync::Arc::new(limiter);
            let l = std::sync::Arc::clone(&limiter);
            let handle = spawn_timed(start, async move { l.acquire().await }).await;
            let (result, at) = finish(handle, start + DEADLINE).await;
            assert_eq!(result, Ok(()));
            if exact {
                assert_eq!(at, next);
            } else {
                assert!(at <= next, "{at:?} > {next:?}");
            }
        });
    });
}

#[test]
fn token_bucket_survives_a_runtime_shut_down_with_waiters() {
    let bucket = waiters_shut_down(slow_token, |b| b.try_acquire_many(10).unwrap());
    // Without the refunds, 10 s later only 7 tokens would be back.
    still_works(
        "token",
        bucket,
        Duration::from_secs(10),
        10,
        Duration::from_secs(1),
    );
}

#[test]
fn funnel_survives_a_runtime_shut_down_with_waiters() {
    let funnel = waiters_shut_down(slow_funnel, |f| f.try_acquire_many(10).unwrap());
    still_works(
        "funnel",
        funnel,
        Duration::from_secs(10),
        10,
        Duration::from_secs(1),
    );
}

#[test]
fn leaky_bucket_survives_a_runtime_shut_down_with_waiters() {
    let bucket = waiters_shut_down(slow_leaky, |b| b.try_acquire_many(7).unwrap());
    // 7 s later the 7 units have drained; the waiters' 3 are given back.
    still_works(
        "leaky",
        bucket,
        Duration::from_secs(7),
        9,
        Duration::from_secs(9),
    );
}

#[test]
fn smooth_bursty_survives_a_runtime_shut_down_with_waiters() {
    fn make() -> SmoothBursty {
        SmoothBursty::builder()
            .permits_per_second(1.0)
            .build()
            .unwrap()
    }
    let limiter = waiters_shut_down(make, |l| l.try_acquire().unwrap());
    // The debt is the first request's 1 s again, not 4 s.
    // (Permits stored in the real time between the runtimes make the next
    // one a little cheaper.)
    let second = Duration::from_secs(1);
    still_works_within("bursty", limiter, second, 1, second, false);
}

#[test]
fn smooth_warming_up_survives_a_runtime_shut_down_with_waiters() {
    fn make() -> SmoothWarmingUp {
        SmoothWarmingUp::builder()
            .permits_per_second(1.0)
            .warmup(Duration::from_secs(2))
            .build()
            .unwrap()
    }
    let limiter = waiters_shut_down(make, |l| l.try_acquire().unwrap());
    // What the first request costs when cold (the three cancelled cost more).
    let probe = make();
    let reference = watched("warming_up reference", move || {
        paused_runtime().block_on(async move {
            probe.try_acquire().unwrap();
            let start = Instant::now();
            probe.acquire().await.unwrap();
            start.elapsed()
        })
    });
    // Idle that long after the first request, the waiters' debt (had it
    // stayed) would still be 9 s; the next request pays at most the cold
    // price again.
    still_works_within("warming_up", limiter, reference, 1, reference, false);
}

#[test]
fn keyed_survive_a_runtime_shut_down_with_waiters() {
    let rt = paused_runtime();
    let (keyed, funnels) = rt.block_on(async {
        let keyed: Keyed<String, TokenBucket> = Keyed::builder()
            .limiter(|| Ok(slow_token()))
            .background_sweep(false)
            .build()
            .unwrap();
        let funnels: KeyedFunnel<String> = KeyedFunnel::builder()
            .rate(Rate::per_second(1))
            .capacity(10)
            .background_sweep(false)
            .build()
            .unwrap();
        keyed.try_acquire_many("k", 10).unwrap();
        funnels.try_acquire_many("k", 10).unwrap();
        for _ in 0..3 {
            let k = keyed.clone();
            tokio::spawn(async move { k.acquire("k").await });
            let f = funnels.clone();
            tokio::spawn(async move { f.acquire("k").await });
        }
        settle().await;
        assert_eq!(keyed.get("k").stats().waiting, 3);
        (keyed, funnels)
    });
    rt.shutdown_timeout(Duration::ZERO);
    watched("keyed", move || {
        paused_runtime().block_on(async move {
            time::advance(Duration::from_secs(10)).await;
            assert_eq!(keyed.try_acquire_many("k", 10), Ok(()), "permits lost");
            assert_eq!(funnels.try_acquire_many("k", 10), Ok(()), "permits lost");
            let start = Instant::now();
            let k = keyed.clone();
            let a = spawn_timed(start, async move { k.acquire("k").await }).await;
            let f = funnels.clone();
            let b = spawn_timed(start, async move { f.acquire("k").await }).await;
            let second = Duration::from_secs(1);
            assert_eq!(finish(a, start + DEADLINE).await, (Ok(()), second));
            assert_eq!(finish(b, start + DEADLINE).await, (Ok(()), second));
        });
    });
}

/// Outside any runtime, a waiter whose actor is gone cannot be served: it
/// fails at once, and gives its reservation back.
#[test]
fn waiting_outside_any_runtime_fails_at_once_when_the_actor_is_gone() {
    let bucket = built_in_dropped_runtime(token);
    let leaky = built_in_dropped_runtime(leaky);
    let (bucket, leaky) = watched("no runtime", move || {
        bucket.try_acquire_many(2).unwrap();
        let got = tokio_test::task::spawn(bucket.acquire()).poll();
        assert_eq!(got, std::task::Poll::Ready(Err(AcquireError::NoRuntime)));
        leaky.try_acquire().unwrap();
        let got = tokio_test::task::spawn(leaky.acquire()).poll();
        assert_eq!(got, std::task::Poll::Ready(Err(AcquireError::NoRuntime)));
        assert_eq!(leaky.level(), 1, "the failed waiter's water is given back");
        (bucket, leaky)
    });
    // And in a runtime again, it works.
    watched("back in a runtime", move || {
        paused_runtime().block_on(async move {
            assert_eq!(bucket.stats().waiting, 0);
            time::advance(Duration::from_secs(10)).await;
            let start = Instant::now();
            bucket.try_acquire_many(2).unwrap();
            bucket.acquire().await.unwrap();
            leaky.acquire().await.unwrap();
            assert_eq!(start.elapsed(), ms(50));
        });
    });
}

// One limiter of each actor-backed kind shared by several tests, each on
// its own runtime: whichever test touches it first builds it (and its
// actor) in its runtime, which ends with that test.
static SHARED_TOKEN: LazyLock<TokenBucket> = LazyLock::new(|| {
    TokenBucket::builder()
        .rate(Rate::per_second(500))
        .capacity(1)
        .build()
        .unwrap()
});
static SHARED_LEAKY: LazyLock<LeakyBucket> = LazyLock::new(|| {
    LeakyBucket::builder()
        .rate(Rate::per_second(500))
        .capacity(100)
        .build()
        .unwrap()
});

/// Ten permits from each shared limiter, one at a time. Real time, so that
/// the runtimes share one clock; the deadline (on the join handles, which
/// does not re-poll the waiters) only turns a hang into a failure.
async fn use_shared() {
    let task = tokio::spawn(async {
        for _ in 0..10 {
            SHARED_TOKEN.acquire().await.unwrap();
            SHARED_LEAKY.acquire().await.unwrap();
        }
    });
    time::timeout(WATCHDOG, task)
        .await
        .expect("hung on a shared limiter")
        .unwrap();
}

#[tokio::test]
async fn shared_in_a_static_1() {
    use_shared().await;
}

#[tokio::test]
async fn shared_in_a_static_2() {
    use_shared().await;
}

#[tokio::test]
async fn shared_in_a_static_3() {
    use_shared().await;
}

#[tokio::test]
async fn shared_in_a_static_4() {
    use_shared().await;
}

/// Every waiter holds a handle (it borrows one), so dropping all the other
/// handles does not end the actor: the waiters are served on time, and the
/// actor ends with the last of them (no task is left).
#[tokio::test(start_paused = true)]
async fn waiters_are_served_after_every_other_handle_is_dropped() {
    async fn check<L: Limiter + Clone + 'static>(limiter: L, drain: u32, first: u64) {
        limiter.try_acquire_many(drain).unwrap();
        let start = Instant::now();
        let mut handles = Vec::new();
        for _ in 0..3 {
            let l = limiter.clone();
            handles.push(spawn_timed(start, async move { l.acquire().await }).await);
        }
        drop(limiter);
        for (i, handle) in (0..).zip(handles) {
            let at = ms(first + 50 * i);
            assert_eq!(finish(handle, start + DEADLINE).await, (Ok(()), at));
        }
        settle().await;
        let tasks = tokio::runtime::Handle::current()
            .metrics()
            .num_alive_tasks();
        assert_eq!(tasks, 0, "the actor outlived its limiter");
    }
    check(token(), 2, 50).await;
    check(funnel(), 2, 50).await;
    // Guava's first request is free, the next pay for the one before.
    check(bursty(), 0, 0).await;
    check(leaky(), 1, 50).await;
}

/// `close()` fails every waiter at once with `Closed`, also when the actor
/// was built in a runtime since dropped.
#[test]
fn close_fails_waiters_at_once() {
    fn check<L, F>(name: &'static str, make: F, close: fn(&L), ns: [u32; 3])
    where
        L: Limiter + Clone + 'static,
        F: FnOnce() -> L + Send + 'static,
    {
        watched(name, move || {
            paused_runtime().block_on(async move {
                let limiter = make();
                time::advance(Duration::from_secs(10)).await;
                let start = Instant::now();
                let mut handles = Vec::new();
                for n in ns {
                    let l = limiter.clone();
                    handles.push(spawn_timed(start, async move { l.acquire_many(n).await }).await);
                }
                close(&limiter);
                settle().await;
                let (first, _) = handles.remove(0).await.unwrap();
                assert_eq!(first, Ok(()));
                for handle in handles {
                    assert!(handle.is_finished(), "{name}: a waiter outlived close()");
                    assert_eq!(handle.await.unwrap(), (Err(AcquireError::Closed), ms(0)));
                }
            });
        });
    }
    // The first goes at once, the others must wait. (A smooth limiter's
    // first request is free, however large, and the next pay for it.)
    const BUCKET: [u32; 3] = [1, 2, 2];
    const SMOOTH: [u32; 3] = [30, 1, 1];
    let moved = built_in_dropped_runtime(token);
    check("token", token, TokenBucket::close, BUCKET);
    check("token moved", move || moved, TokenBucket::close, BUCKET);
    let moved = built_in_dropped_runtime(leaky);
    check("leaky", leaky, LeakyBucket::close, BUCKET);
    check("leaky moved", move || moved, LeakyBucket::close, BUCKET);
    check("funnel", funnel, Funnel::close, BUCKET);
    check("bursty", bursty, SmoothBursty::close, SMOOTH);
    check("warming_up", warming_up, SmoothWarmingUp::close, SMOOTH);
    let keyed = built_in_dropped_runtime(|| {
        let keyed = keyed_token();
        let _k = keyed.get("k");
        keyed
    });
    check("keyed", move || keyed.get("k"), TokenBucket::close, BUCKET);
}

/// A waiter in runtime B, queued behind one from runtime A whose poll
/// started the actor there, is woken when A goes away, and served at once
/// (its turn has passed). Deterministic: A is never driven after that poll,
/// so its actor never runs (not even once) and B's waiter cannot have been
/// served by it.
fn waiting_when_the_actors_runtime_goes<L: Limiter + Clone + 'static>(name: &str, make: fn() -> L) {
    let name = name.to_owned();
    watched(&name.clone(), move || {
        let rt_a = paused_runtime();
        let (limiter, mut first) = rt_a.block_on(async {
            let limiter = make();
            while limiter.try_acquire().is_ok() {}
            let l = limiter.clone();
            let mut first = tokio_test::task::spawn(async move { l.acquire().await });
            // Queued; the actor it spawned on A has not run.
            tokio_test::assert_pending!(first.poll());
            (limiter, first)
        });
        paused_runtime().block_on(async move {
            let start = Instant::now();
            let l = limiter.clone();
            let waiter = spawn_timed(start, async move { l.acquire().await }).await;
            time::advance(ms(2_000)).await;
            settle().await;
            assert!(
                !waiter.is_finished(),
                "{name}: served with its actor's runtime idle"
            );
            // A runtime cannot be dropped inside another's context.
            std::thread::spawn(move || drop(rt_a)).join().unwrap();
            let (result, at) = finish(waiter, start + DEADLINE).await;
            assert_eq!(result, Ok(()), "{name}");
            assert_eq!(at, ms(2_000), "{name}");
            assert!(first.is_woken(), "{name}: A's waiter was not woken");
            tokio_test::assert_ready_eq!(first.poll(), Ok(()));
        });
    });
}

#[test]
fn a_waiter_waiting_when_the_actors_runtime_goes_is_served() {
    waiting_when_the_actors_runtime_goes("token", token);
    waiting_when_the_actors_runtime_goes("slow token", slow_token);
}

/// A bucket built on runtime A is waited on from B, then (B gone) from C:
/// each time the actor is a task of the waiter's runtime, for as long as
/// it waits and no longer, and A never holds one.
fn the_actor_runs_on_the_waiters_runtime<L: Limiter + Clone + 'static>(
    name: &str,
    make: fn() -> L,
) {
    let name = name.to_owned();
    watched(&name.clone(), move || {
        let rt_a = paused_runtime();
        let limiter = rt_a.block_on(async { make() });
        assert_eq!(
            rt_a.metrics().num_alive_tasks(),
            0,
            "{name}: built, a task on A"
        );
        for runtime in ["B", "C"] {
            let rt = paused_runtime();
            rt.block_on(async {
                let alive = || {
                    tokio::runtime::Handle::current()
                        .metrics()
                        .num_alive_tasks()
                };
                // Take what goes at once; the first that must wait stays.
                let mut waiter = loop {
                    let mut waiter = tokio_test::task::spawn(limiter.acquire());
                    if waiter.poll().is_pending() {
                        break waiter;
                    }
                };
                assert_eq!(alive(), 1, "{name}: the actor, on {runtime}");
                // (Each paused runtime has its own clock, so the wait
                // depends on how far the last one advanced: a few ticks.)
                for _ in 0..10 {
                    if waiter.is_woken() {
                        break;
                    }
                    time::advance(ms(50)).await;
                    settle().await;
                }
                tokio_test::assert_ready_eq!(waiter.poll(), Ok(()));
                drop(waiter);
                settle().await;
                assert_eq!(alive(), 0, "{name}: the actor ended on {runtime}");
            });
            drop(rt);
            assert_eq!(rt_a.metrics().num_alive_tasks(), 0, "{name}: a task on A");
        }
    });
}

#[test]
fn each_waiter_starts_the_actor_on_its_own_runtime() {
    fn two_band_token() -> TokenBucket {
        TokenBucket::builder()
            .quota(Quota::new(rate(), 2).and(Rate::per_hour(10_000), 100))
            .build()
            .unwrap()
    }
    the_actor_runs_on_the_waiters_runtime("token", token);
    the_actor_runs_on_the_waiters_runtime("leaky", leaky);
    the_actor_runs_on_the_waiters_runtime("two-band token", two_band_token);
}
