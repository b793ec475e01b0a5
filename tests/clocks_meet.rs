//! Where a limiter's clock (the fast clock, or tokio's) meets the other
//! layers: tokio's timer, which every waiter sleeps on; the paused clock of
//! a test runtime; a runtime that is gone.
//!
//! Two kinds of test:
//!
//! * **Real time, the fast clock** (limiters built outside any paused
//!   runtime): a waiter is never released before its turn, and a caller
//!   that honours `retry_after` to the nanosecond (spinning on std's clock,
//!   which is tokio's outside a paused runtime) is then granted. Every
//!   limiter kind, with waits of tens of milliseconds. The assertions are
//!   one-sided (never early; late by any amount) or exact counts, so a
//!   loaded machine makes them slower, never red.
//! * **Clocks mixed**: a limiter built on one clock and used where another
//!   runs (a paused runtime, a runtime since dropped). These are paused
//!   where the behaviour allows, and wait real time only where the real
//!   clock is the point.

use std::sync::Arc;
use std::time::{Duration, Instant as StdInstant};

use tokio::runtime::{Builder, Runtime};
use tokio::time::{self, Instant};
use tokio_ratelimit::keyed::{Keyed, KeyedFunnel};
use tokio_ratelimit::{
    AcquireError, Funnel, LeakyBucket, Limiter, Quota, Rate, SmoothBursty, SmoothWarmingUp,
    TokenBucket, TryAcquireError,
};

/// What the real-time `retry_after` test grants the fast clock: it was seen
/// to fall up to 6 µs behind std's over a 20 ms wait on a loaded machine
/// (finding 5), and a segment's slope may depart from the measured ratio
/// by 500 ppm, 25 µs over one 50 ms segment; the drift measure saw 21 µs
/// with four threads spinning. Twice that, so that a loaded CI machine does
/// not fail it; a clock 0.5 % slow (100 µs over the wait) still does.
const FAST_CLOCK_SLACK: Duration = Duration::from_micros(50);

/// The interval of every limiter in the real-time tests: 50 per second.
const INTERVAL: Duration = Duration::from_millis(20);
const PER_SECOND: u32 = 50;

fn multi_thread() -> Runtime {
    Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

fn paused() -> Runtime {
    Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .unwrap()
}

/// Sleeps on std's clock until `deadline` is reached, to the nanosecond:
/// a thread sleep for all but the last 2 ms, then a spin.
fn until(deadline: StdInstant) {
    let left = deadline.saturating_duration_since(StdInstant::now());
    if let Some(sleep) = left.checked_sub(Duration::from_millis(2)) {
        std::thread::sleep(sleep);
    }
    while StdInstant::now() < deadline {
        std::hint::spin_loop();
    }
}

/// A limiter asked through a closure: `try_acquire` of one permit, and the
/// `acquire` of one, boxed.
struct Kind {
    name: &'static str,
    try_one: Box<dyn Fn() -> Result<(), TryAcquireError> + Send + Sync>,
    acquire_one: Box<
        dyn Fn() -> futures::future::BoxFuture<'static, Result<(), AcquireError>> + Send + Sync,
    >,
}

fn of_limiter<L: Limiter + Clone + 'static>(name: &'static str, limiter: L) -> Kind {
    let l = limiter.clone();
    Kind {
        name,
        try_one: Box::new(move || l.try_acquire()),
        acquire_one: Box::new(move || {
            let l = limiter.clone();
            Box::pin(async move { l.acquire().await })
        }),
    }
}

/// A leaky bucket's waiters ask for room (its shaper overflows a full
/// bucket rather than wait; it has a test of its own).
fn of_leaky(name: &'static str, limiter: LeakyBucket) -> Kind {
    let l = limiter.clone();
    Kind {
        name,
        try_one: Box::new(move || l.try_acquire()),
        acquire_one: Box::new(move || {
            let l = limiter.clone();
            Box::pin(async move { l.acquire_room(1).await })
        }),
    }
}

/// Every kind of limiter at 50/s, built on the fast clock (in a runtime
/// that is not paused: the actor buckets need one to be built). Capacity 1
/// where there is one (2 for the leaky bucket's shaper to queue behind one
/// in flight), and the smooth limiters without stored permits.
fn every_kind() -> Vec<Kind> {
    let rate = Rate::per_second(PER_SECOND);
    let token = TokenBucket::builder()
        .rate(rate)
        .capacity(1)
        .build()
        .unwrap();
    let leaky = LeakyBucket::builder()
        .rate(rate)
        .capacity(1)
        .build()
        .unwrap();
    let funnel = Funnel::builder().rate(rate).capacity(1).build().unwrap();
    let bursty = SmoothBursty::builder()
        .permits_per_second(f64::from(PER_SECOND))
        .max_burst(Duration::from_nanos(1))
        .build()
        .unwrap();
    let warming = SmoothWarmingUp::builder()
        .permits_per_second(f64::from(PER_SECOND))
        .warmup(Duration::from_millis(100))
        .build()
        .unwrap();
    // Two bands: 50/s with a burst of 1, and 20/s with a burst of 2.
    let two_bands = TokenBucket::builder()
        .quota(Quota::new(rate, 1).and(Rate::per_second(20), 2))
        .build()
        .unwrap();
    let keyed: Keyed<u32, TokenBucket> = Keyed::builder()
        .limiter(move || TokenBucket::builder().rate(rate).capacity(1).build())
        .background_sweep(false)
        .build()
        .unwrap();
    let keyed_funnel: KeyedFunnel<u32> = KeyedFunnel::builder()
        .rate(rate)
        .capacity(1)
        .background_sweep(false)
        .build()
        .unwrap();
    let keyed_two_bands: KeyedFunnel<u32> = KeyedFunnel::builder()
        .quota(Quota::new(rate, 1).and(Rate::per_second(20), 2))
        .background_sweep(false)
        .build()
        .unwrap();
    let keyed = Arc::new(keyed);
    let keyed_funnel = Arc::new(keyed_funnel);
    let keyed_two_bands = Arc::new(keyed_two_bands);
    let (k1, k2, k3) = (
        Arc::clone(&keyed),
        Arc::clone(&keyed_funnel),
        Arc::clone(&keyed_two_bands),
    );
    vec![
        of_limiter("token", token),
        of_leaky("leaky (room)", leaky),
        of_limiter("funnel", funnel),
        of_limiter("bursty", bursty),
        of_limiter("warming_up", warming),
        of_limiter("token, two bands", two_bands),
        Kind {
            name: "keyed token",
            try_one: Box::new(move || keyed.try_acquire(&7)),
            acquire_one: Box::new(move || {
                let k = Arc::clone(&k1);
                Box::pin(async move { k.acquire(&7).await })
            }),
        },
        Kind {
            name: "keyed funnel",
            try_one: Box::new(move || keyed_funnel.try_acquire(&7)),
            acquire_one: Box::new(move || {
                let k = Arc::clone(&k2);
                Box::pin(async move { k.acquire(&7).await })
            }),
        },
        Kind {
            name: "keyed funnel, two bands",
            try_one: Box::new(move || keyed_two_bands.try_acquire(&7)),
            acquire_one: Box::new(move || {
                let k = Arc::clone(&k3);
                Box::pin(async move { k.acquire(&7).await })
            }),
        },
    ]
}

/// Takes whatever the limiter grants at once (at most 10: the capacities
/// here are 1 or 2), and answers the wait the first refusal gave, with
/// std's instant just before the call that refused: the permit refused is
/// due no earlier than that instant plus the wait.
fn drain(kind: &Kind) -> (StdInstant, Duration) {
    for _ in 0..10 {
        let before = StdInstant::now();
        match (kind.try_one)() {
            Ok(()) => {}
            Err(TryAcquireError::Limited { retry_after }) => return (before, retry_after),
            Err(other) => panic!("{}: {other:?}", kind.name),
        }
    }
    panic!("{}: never refused", kind.name)
}

/// On the fast clock, in a multi-thread runtime: three waiters queued
/// behind a drained limiter. The refusal said the next permit is due
/// `retry_after` after a reading made no earlier than `before`; each
/// permit after it is due at least an interval later (the warming-up
/// limiter's, cold, later still). So the k-th waiter released (k from 0)
/// must be released no earlier than `before + retry_after + k × interval`,
/// on std's clock, which tokio's timer sleeps on. Lateness is not checked.
#[test]
fn fast_clock_waiters_are_never_released_before_their_turn() {
    let rt = multi_thread();
    let kinds = rt.block_on(async { every_kind() });
    let mut early = Vec::new();
    for kind in &kinds {
        for round in 0..2 {
            std::thread::sleep(INTERVAL);
            let (before, retry_after) = drain(kind);
            let released = rt.block_on(async {
                let mut handles = Vec::new();
                for _ in 0..3 {
                    let fut = (kind.acquire_one)();
                    handles.push(tokio::spawn(async move {
                        let result = fut.await;
                        (result, StdInstant::now())
                    }));
                    // In arrival order: the next one after this one queued.
                    time::sleep(Duration::from_micros(200)).await;
                }
                let mut out = Vec::new();
                for handle in handles {
                    out.push(handle.await.unwrap());
                }
                out
            });
            let mut times: Vec<Duration> = released
                .iter()
                .map(|(result, at)| {
                    assert_eq!(*result, Ok(()), "{}", kind.name);
                    *at - before
                })
                .collect();
            times.sort();
            for (k, at) in (0u32..).zip(&times) {
                let due = retry_after + INTERVAL * k;
                if *at < due {
                    early.push(format!(
                        "{} round {round}: waiter {k} released {at:?} after the refusal's call, due {due:?}",
                        kind.name
                    ));
                }
            }
        }
    }
    assert!(early.is_empty(), "released early:\n{}", early.join("\n"));
}

/// The leaky bucket's shaper, on the fast clock: four requests poured
/// into an idle bucket of four go one interval apart, the first at once;
/// the k-th no earlier than `k` intervals after the instant before the
/// first was poured.
#[test]
fn fast_clock_shaped_requests_are_never_released_before_their_turn() {
    let rt = multi_thread();
    rt.block_on(async {
        let leaky = LeakyBucket::builder()
            .rate(Rate::per_second(PER_SECOND))
            .capacity(4)
            .build()
            .unwrap();
        let before = StdInstant::now();
        let mut handles = Vec::new();
        for _ in 0..4 {
            let leaky = leaky.clone();
            handles.push(tokio::spawn(async move {
                leaky.acquire().await.unwrap();
                before.elapsed()
            }));
            time::sleep(Duration::from_micros(200)).await;
        }
        let mut times = Vec::new();
        for handle in handles {
            times.push(handle.await.unwrap());
        }
        times.sort();
        for (k, at) in (0u32..).zip(&times) {
            assert!(
                *at >= INTERVAL * k,
                "shaped request {k} released after {at:?}: {times:?}"
            );
        }
    });
}

/// On the fast clock: a refusal's `retry_after`, honoured on std's clock
/// from the instant after the refusal returned (plus [`FAST_CLOCK_SLACK`]),
/// is granted. Five rounds per kind. (To the nanosecond it is not always:
/// finding 5.)
#[test]
fn fast_clock_retry_after_honoured_exactly_is_granted() {
    let rt = multi_thread();
    let kinds = rt.block_on(async { every_kind() });
    let _guard = rt.enter();
    let mut refused = Vec::new();
    for kind in &kinds {
        for round in 0..5 {
            // Whatever is free now (time may have passed since the last
            // grant), then the refusal.
            let (_, retry_after) = drain(kind);
            let after = StdInstant::now();
            assert!(
                retry_after <= INTERVAL * 3,
                "{}: {retry_after:?}",
                kind.name
            );
            until(after + retry_after + FAST_CLOCK_SLACK);
            match (kind.try_one)() {
                Ok(()) => {}
                Err(e) => refused.push(format!(
                    "{} round {round}: waited {retry_after:?}, then {e:?}",
                    kind.name
                )),
            }
        }
    }
    assert!(
        refused.is_empty(),
        "refused after retry_after:\n{}",
        refused.join("\n")
    );
}

fn limited(result: Result<(), TryAcquireError>) -> Duration {
    match result {
        Err(TryAcquireError::Limited { retry_after }) => retry_after,
        other => panic!("expected a refusal, got {other:?}"),
    }
}

/// One limiter's `try_acquire`, by reference.
type TryOne<'a> = &'a dyn Fn() -> Result<(), TryAcquireError>;

/// A funnel of 20/s (a permit every 50 ms), capacity 1, built in a paused
/// runtime after an hour of virtual time (as a test's `static` is, built by
/// whichever test touches it first, after its waits), and drained there.
fn funnel_from_an_advanced_paused_runtime() -> Funnel {
    paused().block_on(async {
        time::advance(Duration::from_secs(3600)).await;
        let funnel = Funnel::builder()
            .rate(Rate::per_second(20))
            .capacity(1)
            .build()
            .unwrap();
        funnel.try_acquire().unwrap();
        funnel
    })
}

/// "Survives its runtime": a limiter built in one paused runtime and used
/// in another (a `static` shared by paused tests). The refusal says 50 ms;
/// honoured on the second runtime's clock, the limiter refuses again with
/// the same 50 ms: the second clock reads before the first's origin, and
/// the limiter's time stands still until it passes it (an hour). The
/// funnel, the keyed funnel, the token bucket and `SmoothBursty` alike.
#[test]
#[ignore = "known, README \"Testing code that uses it\" (clocks review finding 1): a limiter from an advanced paused runtime is frozen in the next runtime: retry_after honoured is refused again"]
fn retry_after_from_an_advanced_paused_runtime_is_honoured_in_the_next() {
    let rate = Rate::per_second(20);
    let funnel = funnel_from_an_advanced_paused_runtime();
    let (keyed, token, bursty) = paused().block_on(async {
        time::advance(Duration::from_secs(3600)).await;
        let keyed: KeyedFunnel<u32> = KeyedFunnel::builder()
            .rate(rate)
            .capacity(1)
            .background_sweep(false)
            .build()
            .unwrap();
        let token = TokenBucket::builder()
            .rate(rate)
            .capacity(1)
            .build()
            .unwrap();
        let bursty = SmoothBursty::builder()
            .permits_per_second(20.0)
            .build()
            .unwrap();
        keyed.try_acquire(&1).unwrap();
        token.try_acquire().unwrap();
        bursty.try_acquire().unwrap();
        (keyed, token, bursty)
    });
    let kinds: [(&str, TryOne<'_>); 4] = [
        ("funnel", &|| funnel.try_acquire()),
        ("keyed funnel", &|| keyed.try_acquire(&1)),
        ("token", &|| token.try_acquire()),
        ("bursty", &|| bursty.try_acquire()),
    ];
    let mut refused = Vec::new();
    paused().block_on(async {
        for (name, try_one) in kinds {
            let retry_after = limited(try_one());
            assert!(retry_after <= Duration::from_millis(50), "{retry_after:?}");
            time::sleep(retry_after).await;
            if let Err(e) = try_one() {
                refused.push(format!(
                    "{name}: slept its retry_after {retry_after:?}, then {e:?}"
                ));
            }
        }
    });
    assert!(refused.is_empty(), "{}", refused.join("\n"));
}

/// The same funnel after its runtime is gone, in a runtime that is not
/// paused (real time): a waiter whose turn the refusal put 50 ms away is
/// not served within a second (its timer is armed an hour ahead), and
/// `retry_after` honoured in real time is refused again.
#[test]
#[ignore = "known, README \"Testing code that uses it\" (clocks review finding 1): a limiter from an advanced paused runtime is frozen in real time: waiter not served, retry_after wrong"]
fn a_limiter_from_an_advanced_paused_runtime_serves_real_time_waiters() {
    let funnel = funnel_from_an_advanced_paused_runtime();
    let rt = multi_thread();
    let retry_after = limited(funnel.try_acquire());
    assert!(retry_after <= Duration::from_millis(50), "{retry_after:?}");
    let after = StdInstant::now();
    until(after + retry_after);
    let again = funnel.try_acquire();
    let waited = rt.block_on(async {
        let waiter = tokio::spawn({
            let funnel = funnel.clone();
            async move { funnel.acquire().await }
        });
        time::timeout(Duration::from_secs(1), waiter).await
    });
    assert!(
        again.is_ok() && matches!(waited, Ok(Ok(Ok(())))),
        "retry_after {retry_after:?} honoured: {again:?}; a waiter within 1 s: {waited:?}"
    );
}

/// A funnel on the fast clock (built outside any runtime, as a `static`
/// is), used in a paused test, "reads real time" (lib.rs, Features). A
/// paused runtime's clock stands still while real time passes; here 300
/// ms pass between the runtime's start and the funnel's build. Drained,
/// its next permit is 50 ms away on its own clock, well within a 200 ms
/// `acquire_timeout` — which times out at once: the deadline is on the
/// paused clock, the turn is mapped from the funnel's origin, read on
/// std's clock, 300 ms ahead of the paused one.
#[test]
#[ignore = "known, README \"Testing code that uses it\" (clocks review finding 2): acquire_timeout on a fast-clock limiter in a paused runtime times out a turn within its timeout"]
fn a_fast_clock_limiter_in_a_paused_runtime_keeps_its_acquire_timeout() {
    let rt = paused();
    std::thread::sleep(Duration::from_millis(300));
    let funnel = Funnel::builder()
        .rate(Rate::per_second(20))
        .capacity(1)
        .build()
        .unwrap();
    rt.block_on(async {
        funnel.try_acquire().unwrap();
        let retry_after = funnel.peek(1).retry_after().unwrap();
        let (real, virt) = (StdInstant::now(), Instant::now());
        let result = funnel.acquire_timeout(1, Duration::from_millis(200)).await;
        assert_eq!(
            result,
            Ok(()),
            "turn {retry_after:?} away, timeout 200 ms: answered after {:?} real, {:?} paused",
            real.elapsed(),
            virt.elapsed()
        );
    });
}

/// The paused clock while a fast-clock limiter's waiter waits its real
/// turn: the waiter sleeps on the paused clock, which auto-advances to each
/// deadline at once; finding its turn not come (real time has not passed),
/// it arms the next, and so on, a tick of virtual time (or a whole
/// `retry_after`, for the keyed funnel) per round, busily. A 100 ms real
/// wait must not carry the paused clock past a concurrent 1 s sleep (ten
/// times the wait).
fn paused_clock_during_a_real_wait(name: &str, acquire: impl std::future::Future) {
    paused().block_on(async {
        let virt = Instant::now();
        let real = StdInstant::now();
        let sleeper = tokio::spawn(time::sleep(Duration::from_secs(1)));
        acquire.await;
        let (virt, real) = (virt.elapsed(), real.elapsed());
        assert!(
            virt <= Duration::from_secs(1) && !sleeper.is_finished(),
            "{name}: a {real:?} real wait moved the paused clock by {virt:?}, past a 1 s sleep"
        );
    });
}

#[test]
#[ignore = "known, README \"Testing code that uses it\" (clocks review finding 3): a fast-clock funnel's waiter in a paused runtime spins the paused clock far ahead"]
fn a_fast_clock_funnel_waiter_leaves_the_paused_clock_alone() {
    let funnel = Funnel::builder()
        .rate(Rate::per_second(10))
        .capacity(1)
        .build()
        .unwrap();
    funnel.try_acquire().unwrap();
    paused_clock_during_a_real_wait("funnel", async { funnel.acquire().await.unwrap() });
}

#[test]
#[ignore = "known, README \"Testing code that uses it\" (clocks review finding 3): a fast-clock keyed funnel's waiter in a paused runtime spins the paused clock far ahead"]
fn a_fast_clock_keyed_funnel_waiter_leaves_the_paused_clock_alone() {
    let keyed: KeyedFunnel<u32> = KeyedFunnel::builder()
        .rate(Rate::per_second(10))
        .capacity(1)
        .background_sweep(false)
        .build()
        .unwrap();
    keyed.try_acquire(&1).unwrap();
    paused_clock_during_a_real_wait("keyed funnel", async { keyed.acquire(&1).await.unwrap() });
}

/// A fast-clock limiter's waiter in a runtime that is not paused: released
/// on time and without spinning: at most a handful of wake-ups per wait
/// (the timer armed a tick early, then at the turn), counted by polling it
/// by hand.
#[test]
fn a_fast_clock_waiter_in_real_time_wakes_a_few_times_only() {
    let rt = multi_thread();
    let funnel = Funnel::builder()
        .rate(Rate::per_second(PER_SECOND))
        .capacity(1)
        .build()
        .unwrap();
    let polls = rt.block_on(async {
        funnel.try_acquire().unwrap();
        let mut fut = std::pin::pin!(funnel.acquire());
        let mut polls = 0u32;
        std::future::poll_fn(|cx| {
            polls += 1;
            fut.as_mut().poll(cx)
        })
        .await
        .unwrap();
        polls
    });
    assert!(polls <= 6, "{polls} polls for one 20 ms wait");
}

/// `TOKIO_RATELIMIT_CLOCK=system`, the documented way for a `static` to
/// follow a paused test's clock: a funnel built outside any runtime, then
/// waited on in a paused runtime, takes exactly its interval of paused time
/// and none of real time. The variable is read once per process, so the
/// check runs in a child process (this test binary again, this test only)
/// with the variable set; in the parent it only starts that child.
#[test]
fn system_clock_statics_follow_the_paused_clock() {
    const CHILD: &str = "CLOCKS_MEET_SYSTEM_CHILD";
    if std::env::var_os(CHILD).is_none() {
        let mut child = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "system_clock_statics_follow_the_paused_clock",
                "--test-threads=1",
            ])
            .env(CHILD, "1")
            .env("TOKIO_RATELIMIT_CLOCK", "system")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        // A watchdog (real time): a hung child is a failure, not a hang.
        let started = StdInstant::now();
        while child.try_wait().unwrap().is_none() {
            if started.elapsed() > Duration::from_secs(60) {
                child.kill().unwrap();
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let output = child.wait_with_output().unwrap();
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(
            output.status.success() && stdout.contains("1 passed"),
            "child: {stdout}\n{}",
            String::from_utf8_lossy(&output.stderr)
        );
        return;
    }
    let funnel = Funnel::builder()
        .rate(Rate::per_second(1))
        .capacity(1)
        .build()
        .unwrap();
    let token = multi_thread().block_on(async {
        TokenBucket::builder()
            .rate(Rate::per_second(1))
            .capacity(1)
            .build()
            .unwrap()
    });
    paused().block_on(async {
        for limiter in [&funnel as &dyn Limiter, &token] {
            limiter.try_acquire().unwrap();
            let real = StdInstant::now();
            let start = Instant::now();
            limiter.acquire().await.unwrap();
            assert_eq!(start.elapsed(), Duration::from_secs(1));
            assert!(
                real.elapsed() < Duration::from_millis(500),
                "{:?}",
                real.elapsed()
            );
        }
    });
}

#[test]
#[ignore = "known, README \"Testing code that uses it\" (clocks review finding 3): a fast-clock token bucket's actor in a paused runtime spins the paused clock far ahead"]
fn a_fast_clock_token_bucket_waiter_leaves_the_paused_clock_alone() {
    let token = multi_thread().block_on(async {
        TokenBucket::builder()
            .rate(Rate::per_second(10))
            .capacity(1)
            .build()
            .unwrap()
    });
    token.try_acquire().unwrap();
    paused_clock_during_a_real_wait("token bucket", async { token.acquire().await.unwrap() });
}

/// A runtime paused, advanced an hour and resumed (`time::resume`) runs
/// again, so a funnel built in it reads the fast clock — but takes its
/// origin's instant from that runtime's clock, an hour ahead of std's.
/// Used from another runtime (real time), its `try_acquire` says 50 ms and
/// is right (the fast clock), while a waiter's timer is armed on the
/// origin's instant, an hour away: not served within a second.
#[test]
#[ignore = "known, README \"Testing code that uses it\" (clocks review finding 4): a fast-clock limiter built in a resumed runtime: retry_after says 50 ms, a waiter elsewhere sleeps an hour"]
fn a_fast_clock_limiter_from_a_resumed_runtime_serves_waiters_elsewhere() {
    let funnel = paused().block_on(async {
        time::advance(Duration::from_secs(3600)).await;
        time::resume();
        Funnel::builder()
            .rate(Rate::per_second(20))
            .capacity(1)
            .build()
            .unwrap()
    });
    let rt = multi_thread();
    funnel.try_acquire().unwrap();
    let retry_after = limited(funnel.try_acquire());
    let waited = rt.block_on(async {
        let start = StdInstant::now();
        let waiter = tokio::spawn({
            let funnel = funnel.clone();
            async move { funnel.acquire().await }
        });
        let result = time::timeout(Duration::from_secs(1), waiter).await;
        (result, start.elapsed())
    });
    assert!(
        matches!(waited.0, Ok(Ok(Ok(())))),
        "refusal said {retry_after:?}; a waiter after {:?}: {:?}",
        waited.1,
        waited.0
    );
}

/// The io wrapper on the fast clock: 300 bytes through a funnel of
/// 5 000 bytes/s holding 100 (paid 100 at a time) take at least the 40 ms
/// the last 200 cost, from the instant before the first byte was paid.
#[test]
fn fast_clock_io_writes_are_never_early() {
    use tokio::io::AsyncWriteExt;
    use tokio_ratelimit::io::RateLimitedWrite;
    multi_thread().block_on(async {
        let funnel = Funnel::builder()
            .rate(Rate::per_second(5_000))
            .capacity(100)
            .build()
            .unwrap();
        let mut writer = RateLimitedWrite::new(Vec::<u8>::new(), funnel);
        let before = StdInstant::now();
        writer.write_all(&[7; 300]).await.unwrap();
        let took = before.elapsed();
        assert!(took >= Duration::from_millis(40), "300 bytes in {took:?}");
        assert_eq!(writer.get_ref().len(), 300);
    });
}

/// The tower layer on the fast clock: four calls through a bucket of
/// 50/s holding 1; the k-th is ready no earlier than k intervals after the
/// instant before the first was.
#[test]
fn fast_clock_tower_calls_are_never_early() {
    use tokio_ratelimit::tower::RateLimitLayer;
    use tower::{Layer, Service, ServiceExt, service_fn};
    multi_thread().block_on(async {
        let token = TokenBucket::builder()
            .rate(Rate::per_second(PER_SECOND))
            .capacity(1)
            .build()
            .unwrap();
        let mut service = RateLimitLayer::new(token).layer(service_fn(|x: u32| async move {
            Ok::<_, std::convert::Infallible>(x)
        }));
        let before = StdInstant::now();
        for k in 0u32..4 {
            let answer = service.ready().await.unwrap().call(k).await.unwrap();
            assert_eq!(answer, k);
            let at = before.elapsed();
            assert!(at >= INTERVAL * k, "call {k} at {at:?}");
        }
    });
}

/// `retry_after` "exact to the nanosecond", on a fast clock "kept within a
/// microsecond of the OS clock": honoured to the nanosecond on std's clock
/// (spinning to `after + retry_after`, `after` read once the refusal has
/// returned, so the wait is if anything a little long), the request must
/// be granted. Every kind five times, then a funnel of 1 000/s a thousand
/// times, with four threads spinning on the machine's cores (a loaded
/// machine). Intermittent: seen refused with 0.3–4.6 µs left in 3 of ~70
/// runs of this file on a loaded 2-core machine, with 0.1–0.2 µs left in 1
/// of 5 runs of a funnel loop under load, and with 6 µs left in 1 of 6
/// runs of this test.
#[test]
#[ignore = "open (clocks review finding 5; README \"On the fast clock too\") (intermittent, under load): retry_after honoured to the ns on std's clock is refused with up to 6 us left"]
fn fast_clock_retry_after_honoured_to_the_nanosecond_is_granted() {
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let spinners: Vec<_> = (0..4)
        .map(|_| {
            let stop = Arc::clone(&stop);
            std::thread::spawn(move || {
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    std::hint::spin_loop();
                }
            })
        })
        .collect();
    let rt = multi_thread();
    let mut kinds = rt.block_on(async { every_kind() });
    let funnel = Funnel::builder()
        .rate(Rate::per_second(1_000))
        .capacity(1)
        .build()
        .unwrap();
    kinds.push(of_limiter("funnel 1000/s", funnel));
    let _guard = rt.enter();
    let mut refused = Vec::new();
    for kind in &kinds {
        let rounds = if kind.name == "funnel 1000/s" {
            1_000
        } else {
            5
        };
        for round in 0..rounds {
            let (_, retry_after) = drain(kind);
            let after = StdInstant::now();
            until(after + retry_after);
            if let Err(e) = (kind.try_one)() {
                refused.push(format!(
                    "{} round {round}: waited {retry_after:?}, then {e:?}",
                    kind.name
                ));
            }
        }
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for spinner in spinners {
        spinner.join().unwrap();
    }
    assert!(
        refused.is_empty(),
        "refused after retry_after:\n{}",
        refused.join("\n")
    );
}

/// The fast clock "kept within a microsecond of the OS clock", measured
/// through a limiter: a funnel of one permit a minute, drained, whose
/// `peek` says how long until the next permit. Each sample brackets that
/// permit's due instant on std's clock: `[before + wait, after + wait]`,
/// with `before` and `after` read around the `peek` (samples whose bracket
/// is wider than 2 µs, a preemption, are dropped). The due instant does not
/// move, so were the limiter's clock std's, every bracket would overlap
/// every other. The clock's documented microsecond either way lets two
/// samples' brackets miss each other by up to 2 µs; twice that is allowed:
/// no sample's earliest may be more than 4 µs after an earlier sample's
/// latest (the limiter's clock fell behind std's), nor its latest more
/// than 4 µs before an earlier sample's earliest (it got ahead). Sampled
/// for up to 20 s, two threads spinning. Seen: most runs within 0.7–2.2
/// µs; 3.0 µs ahead 16 ms after the clock was set up (its first segment
/// runs on quanta's calibration); 8.4 µs behind and 8.2 µs ahead in one
/// idle run; 21 µs with four threads spinning.
#[test]
#[ignore = "open (clocks review finding 5; README \"On the fast clock too\") (intermittent): the fast clock departs from std's by up to 8-21 us at times (documented: within a microsecond)"]
fn fast_clock_stays_within_microseconds_of_std() {
    const LIMIT: i128 = 4_000;
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let spinners: Vec<_> = (0..2)
        .map(|_| {
            let stop = Arc::clone(&stop);
            std::thread::spawn(move || {
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    std::hint::spin_loop();
                }
            })
        })
        .collect();
    let funnel = Funnel::builder()
        .rate(Rate::per(1, Duration::from_secs(60)))
        .capacity(1)
        .build()
        .unwrap();
    funnel.try_acquire().unwrap();
    let base = StdInstant::now();
    let nanos = |d: Duration| i128::try_from(d.as_nanos()).unwrap();
    // The latest of the earliest dues seen, and the earliest of the latest.
    let (mut earliest, mut latest) = (i128::MIN, i128::MAX);
    let (mut behind, mut ahead) = ((0, Duration::ZERO), (0, Duration::ZERO));
    while base.elapsed() < Duration::from_secs(20) && behind.0.max(ahead.0) <= LIMIT {
        let before = StdInstant::now();
        let wait = funnel.peek(1).retry_after().unwrap();
        let after = StdInstant::now();
        if after - before > Duration::from_micros(2) {
            continue;
        }
        let (from, to) = (nanos(before - base + wait), nanos(after - base + wait));
        if from.saturating_sub(latest) > behind.0 {
            behind = (from - latest, base.elapsed());
        }
        if earliest.saturating_sub(to) > ahead.0 {
            ahead = (earliest - to, base.elapsed());
        }
        earliest = earliest.max(from);
        latest = latest.min(to);
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for spinner in spinners {
        spinner.join().unwrap();
    }
    assert!(
        behind.0 <= LIMIT && ahead.0 <= LIMIT,
        "the limiter's clock against std's: {} ns behind (at {:?}), {} ns ahead (at {:?})",
        behind.0,
        behind.1,
        ahead.0,
        ahead.1
    );
}
