//! The one place that reads the time and arms timers.
//!
//! A limiter reads the time through its [`Origin`]: the fast clock
//! ([`fast`]) or tokio's, chosen when it is built. Timers always go through
//! `tokio::time`, so a runtime started with a paused clock
//! (`#[tokio::test(start_paused = true)]`) drives every limiter built in it
//! in virtual time.

#[cfg(test)]
pub(crate) mod fake;
#[cfg(feature = "fast-clock")]
pub(crate) mod fast;
#[cfg(test)]
mod preempt_tests;
#[cfg(test)]
mod skew_tests;

use std::hash::{Hash, Hasher};
use std::time::Duration;

use tokio::time::{Instant, Sleep};

/// tokio's timer resolution: a sleep ends on the first millisecond tick at
/// or after its deadline, so a waiter can be woken up to this much late.
pub(crate) const TICK: Duration = Duration::from_millis(1);

/// The current instant on tokio's clock (paused or not).
pub(crate) fn now() -> Instant {
    Instant::now()
}

/// A fixed instant on a limiter's clock, and the exact nanoseconds from it
/// to now: the one place a limiter reads the time.
///
/// A limiter reads one of two clocks, chosen when it is built
/// ([`Origin::now`]):
///
/// * **the fast clock** ([`fast`]): the CPU's counter, kept in step with
///   the OS monotonic clock, where the kernel itself trusts that counter;
///   the default outside a paused runtime;
/// * **tokio's clock**: in a runtime whose clock is paused
///   (`start_paused`, `tokio::time::pause`), so that `advance` drives the
///   limiter; and where there is no fast clock (another OS, the
///   `fast-clock` feature off, `TOKIO_RATELIMIT_CLOCK=system`).
///
/// Either way the origin also keeps its instant on tokio's clock, and an
/// instant `n` ns after the origin is `instant + n` there: the fast clock
/// runs on the OS clock's scale (within a microsecond or so), which is the
/// clock tokio's timer sleeps on outside a paused runtime.
///
/// On tokio's clock, `Instant - Instant` goes through std's
/// `Timespec::sub_timespec` and `Duration::new`, out of line: about 55
/// instructions, a tenth of a limiter's `try_acquire`. An instant's `Hash`
/// feeds the hasher its representation — on the platforms with a
/// `timespec` clock (Linux, the BSDs, macOS) the seconds as an `i64` and
/// then the nanoseconds as a `u32`; on Windows the seconds as a `u64` and
/// then the nanoseconds — and, being generic, inlines to two loads.
/// [`Origin::elapsed_nanos`] reads instants that way, as `seconds × 10⁹ +
/// nanoseconds`, and subtracts.
///
/// That is exact, but only as long as the representation is what we take it
/// for, so it is checked rather than assumed: every instant must feed
/// exactly one 64-bit integer, then one 32-bit integer below 10⁹, and when
/// the origin is made, decoding `origin + 1.999999999 s` must give exactly
/// 1 999 999 999 ns more than decoding the origin (the nanoseconds carry
/// into the seconds there). Anything else — another platform, another
/// layout in a later std, an overflow — takes the plain subtraction, which
/// debug builds also compare with on every call.
///
/// `repr(C)`, the decoded origin first: it is what every call reads, and
/// the cell keeps it with its word (the instant, read on slow paths only,
/// may fall on the next cache line).
#[derive(Debug, Clone, Copy)]
#[repr(C)]
pub(crate) struct Origin {
    /// Which clock, and the origin on it: [`FAST`] and the fast clock's
    /// nanoseconds; or tokio's clock, the origin as decoded nanoseconds
    /// (0 when instants do not decode).
    raw: u64,
    instant: Instant,
}

/// [`Origin::raw`]'s tag for the fast clock. Its nanoseconds (the OS
/// monotonic clock's: time since boot) stay below 2⁶² for 146 years.
const FAST: u64 = 1 << 63;
/// [`Origin::raw`]'s tag for a test's fake clock (see [`fake`]).
#[cfg(test)]
const FAKE: u64 = 1 << 62;
const TAGS: u64 = FAST | FAST >> 1;

impl Origin {
    /// Now as the origin, on the clock a limiter built here should read:
    /// tokio's if this thread is in a runtime whose clock is paused (or
    /// there is no fast clock), the fast clock otherwise.
    pub(crate) fn now() -> Origin {
        #[cfg(test)]
        if let Some(index) = fake::current() {
            let base = fake::read(index) & ((1 << fake::BASE_BITS) - 1);
            return Origin {
                raw: FAKE | index << fake::BASE_BITS | base,
                instant: now(),
            };
        }
        // Not in the loom models: the fast clock is one per process, and its
        // atomics are loom's there (a model's objects live one execution).
        #[cfg(all(feature = "fast-clock", not(all(test, tokio_ratelimit_loom))))]
        if let Some(fast) = fast::get() {
            if !runtime_is_paused() {
                return Origin {
                    raw: FAST | fast.now(),
                    instant: now(),
                };
            }
        }
        Origin::at(now())
    }

    /// `instant` as the origin, on tokio's clock.
    pub(crate) fn at(instant: Instant) -> Origin {
        const PROBE: Duration = Duration::new(1, 999_999_999);
        let raw = decode(&instant)
            .filter(|&origin| {
                instant
                    .checked_add(PROBE)
                    .and_then(|later| decode(&later))
                    .is_some_and(|later| later.checked_sub(origin) == Some(1_999_999_999))
            })
            .filter(|&origin| origin & TAGS == 0)
            .unwrap_or(0);
        Origin { raw, instant }
    }

    /// The origin itself, on tokio's clock.
    #[cfg(test)]
    pub(crate) fn instant(&self) -> Instant {
        self.instant
    }

    /// Nanoseconds from the origin to now on the limiter's clock: 0 if now
    /// reads earlier, `u64::MAX` if more (584 years).
    #[inline]
    pub(crate) fn elapsed_nanos(&self) -> u64 {
        #[cfg(feature = "fast-clock")]
        if self.raw & FAST != 0 {
            if let Some(fast) = fast::get() {
                return fast.since(self.raw & !FAST);
            }
        }
        self.elapsed_nanos_other()
    }

    /// [`elapsed_nanos`](Self::elapsed_nanos) on the fast clock, when it
    /// answers without a call (within its segment); `None` otherwise:
    /// another clock, or a segment to replace.
    #[inline]
    pub(crate) fn elapsed_nanos_leaf(&self) -> Option<u64> {
        #[cfg(feature = "fast-clock")]
        if self.raw & FAST != 0 {
            return fast::peek()?.since_leaf(self.raw & !FAST);
        }
        #[cfg(not(feature = "fast-clock"))]
        let _ = self;
        None
    }

    /// [`elapsed_nanos`](Self::elapsed_nanos), read only once every load
    /// and store before it has completed (see
    /// [`Fast::since_ordered`](fast::Fast::since_ordered)): at least the
    /// time of any event this thread has seen. tokio's clock is std's,
    /// which the OS reads in order already.
    pub(crate) fn elapsed_nanos_ordered(&self) -> u64 {
        #[cfg(feature = "fast-clock")]
        if self.raw & FAST != 0 {
            if let Some(fast) = fast::get() {
                return fast.since_ordered(self.raw & !FAST);
            }
        }
        self.elapsed_nanos_other()
    }

    /// [`elapsed_nanos`](Self::elapsed_nanos) on tokio's clock (or a
    /// test's fake one): out of line, so that the fast clock's path is
    /// short enough to inline (and `cold`, so that it is laid out after
    /// it: in a paused test the branch is as well predicted either way).
    #[cold]
    #[inline(never)]
    fn elapsed_nanos_other(&self) -> u64 {
        #[cfg(feature = "fast-clock")]
        assert!(
            self.raw & FAST == 0,
            "an origin on the fast clock was made with it"
        );
        #[cfg(test)]
        if self.raw & FAKE != 0 {
            let raw = self.raw & !TAGS;
            let base = raw & ((1 << fake::BASE_BITS) - 1);
            return fake::read(raw >> fake::BASE_BITS).saturating_sub(base);
        }
        self.nanos_since(now())
    }

    /// Nanoseconds from the origin to `t` on tokio's clock: 0 if `t` is
    /// earlier, `u64::MAX` if more (584 years).
    #[inline]
    fn nanos_since(&self, t: Instant) -> u64 {
        let nanos = match (self.raw, decode(&t)) {
            (0, _) | (_, None) => self.nanos_since_slow(t),
            (origin, Some(t)) => t.saturating_sub(origin),
        };
        debug_assert_eq!(nanos, self.nanos_since_slow(t));
        nanos
    }

    /// [`nanos_since`](Self::nanos_since) by subtracting instants.
    #[cold]
    fn nanos_since_slow(&self, t: Instant) -> u64 {
        let elapsed = t.saturating_duration_since(self.instant);
        // In 64 bits: `as_nanos` multiplies in 128.
        elapsed
            .as_secs()
            .saturating_mul(1_000_000_000)
            .saturating_add(u64::from(elapsed.subsec_nanos()))
    }

    /// The instant on tokio's clock `nanos` after the origin (saturating a
    /// thousand years away).
    pub(crate) fn instant_after(&self, nanos: Duration) -> Instant {
        let origin = self.instant;
        origin
            .checked_add(nanos)
            .unwrap_or_else(|| origin + Duration::from_secs(86_400 * 365 * 1000))
    }
}

/// Whether this thread is in a tokio runtime whose clock is paused.
///
/// tokio has no public question for it. Without its `test-util` feature
/// its instants are std's, and with it an unpaused runtime's are too; a
/// paused runtime's clock stands still while this thread runs (it only
/// auto-advances when the runtime is idle). So: two readings of tokio's
/// clock around one of std's. Running, they bracket it; paused, they are
/// equal and std's differs (time has passed since the pause).
#[cfg(all(feature = "fast-clock", not(all(test, tokio_ratelimit_loom))))]
fn runtime_is_paused() -> bool {
    if tokio::runtime::Handle::try_current().is_err() {
        return false;
    }
    let before = Instant::now();
    let std = Instant::from_std(std::time::Instant::now());
    let after = Instant::now();
    before == after && std != before
}

/// An instant as `seconds × 10⁹ + nanoseconds` of its representation, if
/// it feeds its hasher one 64-bit integer and then one 32-bit integer below
/// 10⁹ (see [`Origin`]), and the total fits.
#[inline]
fn decode(t: &Instant) -> Option<u64> {
    let mut parts = Parts::default();
    t.hash(&mut parts);
    match parts {
        Parts {
            secs,
            nanos,
            writes: 2,
            other: false,
        } if nanos < 1_000_000_000 => secs
            .checked_mul(1_000_000_000)
            .and_then(|n| n.checked_add(u64::from(nanos))),
        _ => None,
    }
}

/// A hasher that keeps what an instant feeds it (see [`decode`]).
#[derive(Default)]
struct Parts {
    secs: u64,
    nanos: u32,
    /// Integers written in the expected order so far.
    writes: u8,
    /// Whether anything unexpected was written.
    other: bool,
}

impl Hasher for Parts {
    fn finish(&self) -> u64 {
        0
    }

    fn write(&mut self, _: &[u8]) {
        self.other = true;
    }

    #[inline]
    fn write_u64(&mut self, n: u64) {
        if self.writes == 0 {
            self.secs = n;
            self.writes = 1;
        } else {
            self.other = true;
        }
    }

    #[inline]
    fn write_i64(&mut self, n: i64) {
        // A negative number of seconds becomes huge and fails the checked
        // multiplication: the slow path handles it.
        #[expect(
            clippy::cast_sign_loss,
            reason = "a negative number of seconds becomes huge and fails the checked multiplication"
        )]
        self.write_u64(n as u64);
    }

    #[inline]
    fn write_u32(&mut self, n: u32) {
        if self.writes == 1 {
            self.nanos = n;
            self.writes = 2;
        } else {
            self.other = true;
        }
    }
}

/// Where to arm the timer that waits for a turn: first a tick before it,
/// then (once that has fired and the turn has not come) at the turn itself.
///
/// tokio fires a timer on the first millisecond tick at or after its
/// deadline, and in real time processes that tick some way into the
/// millisecond (the lag drifts from 0 to 1 ms and wraps around). A timer
/// armed at the turn fires on the tick after it, even when the turn came
/// while the tick before was being processed. Armed a tick early, it fires
/// on that tick, and the turn goes then if it has come; otherwise the timer
/// is armed again for the turn (never a third time: no busy loop). So a
/// turn is served by the first tick processed at or after it. In paused
/// time, where ticks are processed on the millisecond, the early timer only
/// ever finds the turn not yet come, and release instants are unchanged.
///
/// On the fast clock a turn's instant on tokio's clock can be a hair
/// (the fast clock's error against the OS clock, about a microsecond)
/// before the turn itself; should the timer armed at the turn fire in that
/// hair, the turn has not come, and the timer is armed a tick later rather
/// than at the same instant again (which would fire at once, in a loop).
/// The waiter is still released only once its turn has come on the
/// limiter's clock.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct TwoStep {
    /// The turn whose early timer has fired.
    early_fired: Option<Instant>,
    /// The turn whose timer at the turn has fired.
    turn_fired: Option<Instant>,
}

impl TwoStep {
    /// The deadline to arm for `turn`, and whether it is the early one.
    pub(crate) fn deadline(&self, turn: Instant) -> (Instant, bool) {
        if self.turn_fired == Some(turn) {
            return (now().max(turn) + TICK, false);
        }
        match turn.checked_sub(TICK) {
            Some(early) if self.early_fired != Some(turn) => (early, true),
            _ => (turn, false),
        }
    }

    /// The timer armed at `deadline(turn)` has fired.
    pub(crate) fn fired(&mut self, turn: Instant, early: bool) {
        if early {
            self.early_fired = Some(turn);
        } else {
            self.turn_fired = Some(turn);
        }
    }
}

/// A timer that fires at `deadline` (rounded up to the next tick).
pub(crate) fn sleep_until(deadline: Instant) -> Sleep {
    tokio::time::sleep_until(deadline)
}

/// A timer that fires after `duration` (rounded up to the next tick).
pub(crate) fn sleep(duration: Duration) -> Sleep {
    tokio::time::sleep(duration)
}

/// `future`, or `Elapsed` once `deadline` has passed.
#[cfg(feature = "redis")]
pub(crate) fn timeout_at<F: std::future::Future>(
    deadline: Instant,
    future: F,
) -> tokio::time::Timeout<F> {
    tokio::time::timeout_at(deadline, future)
}

/// `future`, or `Elapsed` once `duration` has passed.
#[cfg(feature = "redis")]
pub(crate) fn timeout<F: std::future::Future>(
    duration: Duration,
    future: F,
) -> tokio::time::Timeout<F> {
    tokio::time::timeout(duration, future)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decoded_nanos_agree_with_subtraction() {
        let origin = Origin::at(now());
        // Where the fast path exists, it is used (and checked).
        if cfg!(any(target_os = "linux", target_os = "macos", windows)) {
            assert_ne!(Origin::at(now()).raw, 0);
        }
        let mut nanos = vec![0, 1, 999_999_999, 1_000_000_000, 1_000_000_001];
        nanos.extend((0..1000u64).map(|i| i * 7_777_777 + i % 3));
        for n in nanos {
            let t = origin.instant() + Duration::from_nanos(n);
            assert_eq!(origin.nanos_since(t), n);
            assert_eq!(origin.nanos_since_slow(t), n);
        }
        // Before the origin: 0, on both paths.
        let later = Origin::at(origin.instant() + Duration::from_nanos(1_500_000_001));
        assert_eq!(later.nanos_since(origin.instant()), 0);
        assert_eq!(later.nanos_since_slow(origin.instant()), 0);
        assert_eq!(
            later.nanos_since(origin.instant() + Duration::from_secs(2)),
            499_999_999
        );
    }

    #[test]
    fn unexpected_writes_are_refused() {
        let mut parts = Parts::default();
        parts.write_u32(5);
        parts.write_u64(5);
        assert!(parts.other);
        let mut parts = Parts::default();
        parts.write_u64(5);
        parts.write_u32(5);
        parts.write_u8(1);
        assert!(parts.other);
    }
}
