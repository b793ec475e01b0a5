//! A caller preempted in the middle of its decision, on a fake clock (see
//! [`fake`]): another thread's grant made meanwhile must not have it
//! refused for a time it has already left behind.
//!
//! The clock is armed with a stale reading: the next reading runs another
//! caller's `try_acquire` first (at the clock's time, as another thread
//! would while this one was preempted), then returns the stale reading. A
//! limiter that read its clock before loading its state decides on that
//! grant's state with the stale time and refuses; one that reads it after
//! (every decision, a failed swap included) grants.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use super::fake;
use crate::keyed::KeyedFunnel;
use crate::{Funnel, LeakyBucket, Peek, Quota, Rate, TokenBucket, TryAcquireError};

/// Where the clock starts (the fake clocks read nanoseconds).
const START: u64 = 1_000_000_000;
const SECOND: u64 = 1_000_000_000;

type Answer = Box<dyn Fn(u32) -> Result<(), TryAcquireError> + Send + Sync>;

/// A limiter's `try_acquire_many(n)`, and what its `peek(n)` answers.
struct Calls {
    try_acquire: Answer,
    peek: Answer,
}

/// [`Calls`] of `limiter`.
fn calls<L: Clone + Send + Sync + 'static>(
    limiter: L,
    try_acquire: fn(&L, u32) -> Result<(), TryAcquireError>,
    peek: fn(&L, u32) -> Peek,
) -> Calls {
    let peeked = limiter.clone();
    Calls {
        try_acquire: Box::new(move |n| try_acquire(&limiter, n)),
        peek: Box::new(move |n| peek(&peeked, n).answer()),
    }
}

/// A limiter's name, and how to build it.
type Build = (&'static str, Box<dyn Fn() -> Calls>);

/// A limiter on a fake clock that can be preempted.
struct Preemptible {
    calls: Arc<OnceLock<Calls>>,
    now: Arc<AtomicU64>,
    /// The stale reading the next reading returns, after another caller's
    /// `try_acquire` (0: none armed).
    armed: Arc<AtomicU64>,
    /// A stale reading the next reading returns, before the armed one and
    /// without another caller (0: none).
    stale_first: Arc<AtomicU64>,
}

impl Preemptible {
    /// `build` makes the limiter (on the fake clock, at `START`).
    fn new(build: impl FnOnce() -> Calls) -> Preemptible {
        let calls: Arc<OnceLock<Calls>> = Arc::new(OnceLock::new());
        let now = Arc::new(AtomicU64::new(START));
        let armed = Arc::new(AtomicU64::new(0));
        let stale_first = Arc::new(AtomicU64::new(0));
        let clock = {
            let (calls, now, armed) = (Arc::clone(&calls), Arc::clone(&now), Arc::clone(&armed));
            let first = Arc::clone(&stale_first);
            fake::Clock::new(move || match first.swap(0, Ordering::SeqCst) {
                0 => match armed.swap(0, Ordering::SeqCst) {
                    0 => now.load(Ordering::SeqCst),
                    stale => {
                        // Another thread's call, at the clock's time (on a
                        // thread of its own: this one may hold a lock the
                        // call takes).
                        let other = &calls.get().unwrap().try_acquire;
                        std::thread::scope(|s| s.spawn(|| other(1)).join().unwrap()).unwrap();
                        stale
                    }
                },
                stale => stale,
            })
        };
        {
            let _clock = clock.enter();
            assert!(calls.set(build()).is_ok());
        }
        Preemptible {
            calls,
            now,
            armed,
            stale_first,
        }
    }

    fn at(&self, nanos: u64) -> &Self {
        self.now.store(START + nanos, Ordering::SeqCst);
        self
    }

    /// The next call's first reading is `nanos` (stale), and another
    /// caller takes a permit while this one is preempted.
    fn preempted(&self, nanos: u64) -> &Self {
        self.armed.store(START + nanos, Ordering::SeqCst);
        self
    }

    /// The next call's first reading is `nanos` (stale, and nobody calls
    /// meanwhile): the armed one, if any, is its second.
    fn read_first(&self, nanos: u64) -> &Self {
        self.stale_first.store(START + nanos, Ordering::SeqCst);
        self
    }

    fn try_acquire(&self, n: u32) -> Result<(), TryAcquireError> {
        (self.calls.get().unwrap().try_acquire)(n)
    }

    fn peek(&self, n: u32) -> Result<(), TryAcquireError> {
        (self.calls.get().unwrap().peek)(n)
    }
}

/// The three buckets on the cell, and a keyed funnel's key in one word
/// and in a pair: each 1/s with a capacity of 2 (and a band that never
/// binds). (A key of three bands or more reads the clock under its own
/// lock: no grant can come between.)
fn limiters() -> Vec<Build> {
    let rate = Rate::per_second(1);
    let keyed = |quota: Quota| -> Box<dyn Fn() -> Calls> {
        Box::new(move || {
            let map = KeyedFunnel::<u8>::builder()
                .quota(quota)
                .background_sweep(false)
                .build()
                .unwrap();
            calls(map, |m, n| m.try_acquire_many(&1, n), |m, n| m.peek(&1, n))
        })
    };
    vec![
        ("KeyedFunnel", keyed(Quota::new(rate, 2))),
        (
            "KeyedFunnel, 2 bands",
            keyed(Quota::new(rate, 2).and(Rate::per_second(100), 1000)),
        ),
        (
            "TokenBucket",
            Box::new(move || {
                let b = TokenBucket::builder()
                    .rate(rate)
                    .capacity(2)
                    .build()
                    .unwrap();
                calls(b, TokenBucket::try_acquire_many, TokenBucket::peek)
            }),
        ),
        (
            "LeakyBucket",
            Box::new(move || {
                let b = LeakyBucket::builder()
                    .rate(rate)
                    .capacity(2)
                    .build()
                    .unwrap();
                calls(b, LeakyBucket::try_acquire_many, LeakyBucket::peek)
            }),
        ),
        (
            "Funnel",
            Box::new(move || {
                let b = Funnel::builder().rate(rate).capacity(2).build().unwrap();
                calls(b, Funnel::try_acquire_many, Funnel::peek)
            }),
        ),
        (
            // The general (wide) word: a bucket whose rate was set.
            "TokenBucket, rate set",
            Box::new(move || {
                let b = TokenBucket::builder()
                    .rate(Rate::per_second(7))
                    .capacity(2)
                    .build()
                    .unwrap();
                b.set_rate(rate).unwrap();
                calls(b, TokenBucket::try_acquire_many, TokenBucket::peek)
            }),
        ),
    ]
}

/// A runtime to build limiters in (their waiters' timers).
fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap()
}

fn limited(after: Duration) -> Result<(), TryAcquireError> {
    Err(TryAcquireError::Limited { retry_after: after })
}

/// Runs `then` on each of [`limiters`], emptied at 0 s and armed at 3 s
/// with a stale reading of 1 s (another caller takes a permit meanwhile).
fn each_preempted(then: impl Fn(&str, &Preemptible)) {
    let rt = runtime();
    let _rt = rt.enter();
    for (name, build) in limiters() {
        let b = Preemptible::new(build);
        b.try_acquire(2).unwrap();
        b.at(3 * SECOND).preempted(SECOND);
        then(name, &b);
    }
}

/// Emptied at 0 s, full again at 2 s. A caller reads 1 s, and is preempted
/// until 3 s, while another takes one permit: at 3 s one is left, so it
/// is granted. (Reading before loading, it decided on the other's grant
/// with 1 s: refused for 2 s.)
#[test]
fn a_grant_made_while_a_caller_was_preempted_does_not_refuse_it() {
    each_preempted(|name, b| {
        assert_eq!(b.try_acquire(1), Ok(()), "{name}");
        assert_eq!(b.try_acquire(1), limited(Duration::from_secs(1)), "{name}");
    });
}

/// `peek` answers as a call would: on the state it read, at a reading
/// taken after it. (Reading first, it reported the other's grant at the
/// stale time: "refused for 2 s".)
#[test]
fn a_peek_while_another_grants_answers_as_a_call_would() {
    each_preempted(|name, b| {
        assert_eq!(b.peek(1), Ok(()), "{name}");
        // The other's grant is there for the next look.
        assert_eq!(b.peek(2), limited(Duration::from_secs(1)), "{name}");
    });
}

/// The shaper's overflow: a caller preempted while another pours is not
/// refused for water that has drained by the time it decides. (The stale
/// reading meets its first attempt, the one without the lock.) (Emptied at 0 s, drained at 2 s; the
/// other pours one at 3 s, leaving room for one.)
#[test]
fn a_shaper_does_not_overflow_on_a_stale_reading() {
    use std::task::Poll;

    let rt = runtime();
    let _rt = rt.enter();
    let shaper = Arc::new(OnceLock::new());
    let b = Preemptible::new(|| {
        let b = LeakyBucket::builder()
            .rate(Rate::per_second(1))
            .capacity(2)
            .build()
            .unwrap();
        shaper.set(b.clone()).unwrap();
        calls(b, LeakyBucket::try_acquire_many, LeakyBucket::peek)
    });
    let shaper = shaper.get().unwrap();
    b.try_acquire(2).unwrap();
    b.at(3 * SECOND).preempted(SECOND);
    let mut poured = tokio_test::task::spawn(shaper.acquire());
    // Its unit comes out at 4 s (after the other's).
    assert!(poured.poll().is_pending());
    assert!(matches!(
        tokio_test::task::spawn(shaper.acquire()).poll(),
        Poll::Ready(Err(crate::AcquireError::Overflow))
    ));
}

/// A key of two bands grants on a reading made before its lookup, and
/// refuses only on one made after its state. Its first reading is from
/// 0.5 s (the caller was preempted after it), when the key was empty: it
/// looks again, and is preempted during that reading too, while another
/// takes a permit at 3 s. Read after the state, the second reading (1 s,
/// as stale) decides on the state before the other's grant, whose swap
/// fails, and the next attempt reads 3 s: granted. (Reading the clock
/// before loading the state, the refusal's re-read decided on the other's
/// grant at 1 s: refused for 2 s.)
#[test]
fn a_two_band_key_refuses_only_on_a_reading_after_its_state() {
    let rt = runtime();
    let _rt = rt.enter();
    let (_, build) = limiters()
        .into_iter()
        .find(|(name, _)| *name == "KeyedFunnel, 2 bands")
        .unwrap();
    let b = Preemptible::new(build);
    b.try_acquire(2).unwrap();
    b.at(3 * SECOND).read_first(SECOND / 2).preempted(SECOND);
    assert_eq!(b.try_acquire(1), Ok(()));
    assert_eq!(b.try_acquire(1), limited(Duration::from_secs(1)));
}
