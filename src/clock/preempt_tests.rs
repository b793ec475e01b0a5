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
use crate::{Funnel, LeakyBucket, Quota, Rate, TokenBucket, TryAcquireError};

/// Where the clock starts (the fake clocks read nanoseconds).
const START: u64 = 1_000_000_000;
const SECOND: u64 = 1_000_000_000;

type TryAcquire = Box<dyn Fn(u32) -> Result<(), TryAcquireError> + Send + Sync>;
/// A limiter's name, and how to build it.
type Build = (&'static str, Box<dyn Fn() -> TryAcquire>);

/// A limiter on a fake clock that can be preempted.
struct Preemptible {
    try_acquire: Arc<OnceLock<TryAcquire>>,
    now: Arc<AtomicU64>,
    /// The stale reading the next reading returns, after another caller's
    /// `try_acquire` (0: none armed).
    armed: Arc<AtomicU64>,
}

impl Preemptible {
    /// `build` makes the limiter (on the fake clock, at `START`).
    fn new(build: impl FnOnce() -> TryAcquire) -> Preemptible {
        let try_acquire: Arc<OnceLock<TryAcquire>> = Arc::new(OnceLock::new());
        let now = Arc::new(AtomicU64::new(START));
        let armed = Arc::new(AtomicU64::new(0));
        let clock = {
            let (try_acquire, now, armed) = (
                Arc::clone(&try_acquire),
                Arc::clone(&now),
                Arc::clone(&armed),
            );
            fake::Clock::new(move || match armed.swap(0, Ordering::SeqCst) {
                0 => now.load(Ordering::SeqCst),
                stale => {
                    // Another thread's call, at the clock's time (on a
                    // thread of its own: this one may hold a lock the
                    // call takes).
                    let other = try_acquire.get().unwrap();
                    std::thread::scope(|s| s.spawn(|| other(1)).join().unwrap()).unwrap();
                    stale
                }
            })
        };
        {
            let _clock = clock.enter();
            assert!(try_acquire.set(build()).is_ok());
        }
        Preemptible {
            try_acquire,
            now,
            armed,
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

    fn try_acquire(&self, n: u32) -> Result<(), TryAcquireError> {
        self.try_acquire.get().unwrap()(n)
    }
}

/// The three buckets on the cell, and a keyed funnel's key in one word
/// and in a pair: each 1/s with a capacity of 2 (and a band that never
/// binds). (A key of three bands or more reads the clock under its own
/// lock: no grant can come between.)
fn limiters() -> Vec<Build> {
    let rate = Rate::per_second(1);
    let keyed = |quota: Quota| -> Box<dyn Fn() -> TryAcquire> {
        Box::new(move || {
            let map = KeyedFunnel::<u8>::builder()
                .quota(quota)
                .background_sweep(false)
                .build()
                .unwrap();
            Box::new(move |n| map.try_acquire_many(&1, n))
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
                Box::new(move |n| b.try_acquire_many(n))
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
                Box::new(move |n| b.try_acquire_many(n))
            }),
        ),
        (
            "Funnel",
            Box::new(move || {
                let b = Funnel::builder().rate(rate).capacity(2).build().unwrap();
                Box::new(move |n| b.try_acquire_many(n))
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
                Box::new(move |n| b.try_acquire_many(n))
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

/// Emptied at 0 s, full again at 2 s. A caller reads 1 s, and is preempted
/// until 3 s, while another takes one permit: at 3 s one is left, so it
/// is granted. (Reading before loading, it decided on the other's grant
/// with 1 s: refused for 2 s.)
#[test]
fn a_grant_made_while_a_caller_was_preempted_does_not_refuse_it() {
    let rt = runtime();
    let _rt = rt.enter();
    for (name, build) in limiters() {
        let b = Preemptible::new(build);
        b.try_acquire(2).unwrap();
        b.at(3 * SECOND).preempted(SECOND);
        assert_eq!(b.try_acquire(1), Ok(()), "{name}");
        assert_eq!(b.try_acquire(1), limited(Duration::from_secs(1)), "{name}");
    }
}

/// The shaper's overflow, on the lock-free path and under the lock alike:
/// a caller preempted while another pours is not refused for water that
/// has drained by the time it decides. (Emptied at 0 s, drained at 2 s; the
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
        Box::new(move |n| b.try_acquire_many(n))
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
