//! The fast clock: the CPU's counter (x86's TSC, ARM's virtual counter),
//! read through `quanta`, kept in step with the OS monotonic clock.
//!
//! `std::time::Instant::now()` is a `clock_gettime` call: on the machines
//! this crate is measured on, 23 to 35 ns, two thirds of a `try_acquire`.
//! Reading the counter costs a third of that. But a raw counter is only as
//! good as its calibration (quanta's, done once in about half a
//! millisecond, was 16 ppm fast here: 1.4 s a day), and a limiter's
//! instants must map onto tokio's (its timer runs on the OS clock) to the
//! microsecond, for as long as the process runs. So the counter is scaled
//! the way the kernel scales it, in segments:
//!
//! ```text
//! ns = anchor_ns + ((counter − anchor_counter) × mult) >> 32
//! ```
//!
//! Whoever reads the clock more than [`PERIOD`] after the anchor starts a
//! new segment (one compare-and-swap wins): it reads the OS clock between
//! two counter reads, takes the ratio of the OS clock to the counter since
//! the first anchor (a baseline that grows with the process, so the ratio
//! gets exact), and sets the new slope so that the error it found is gone
//! by the end of the next segment, within ±[`SLEW_PPM`] of that ratio. The
//! new segment starts where the old one was at that instant, so the clock
//! is continuous and, its slopes being positive, monotonic. An OS clock
//! more than [`STEP`] ahead (a suspend, a migrated VM) is stepped to; one
//! behind is only ever slewed to, so the clock never goes back.
//!
//! The segment (anchor and slope) is three plain atomics under a sequence
//! number, a seqlock: a reader loads the number, the three, and the number
//! again, and uses them if it was even and unchanged — on x86-64, five
//! plain loads. The writer computes the next segment first, claims the
//! number with a compare-and-swap from the even value it read (so one
//! writer per segment), stores the three, and makes the number even again:
//! a window of three stores, in which a reader spins.
//!
//! Where it is used: Linux on x86-64 when the kernel's own clocksource is
//! the TSC (the kernel checked at boot that the cores' counters agree, and
//! its watchdog switches away from a TSC that misbehaves; quanta's issue
//! #111, governor's #299: an unsynchronised counter on one core), and
//! Linux on `aarch64` when it is the architected counter. Anywhere else, or
//! with `TOKIO_RATELIMIT_CLOCK=system` in the environment, limiters read
//! the OS clock through tokio, as before.

use std::sync::OnceLock;
use std::time::Duration;

use crate::sync::{AtomicU64, Ordering, fence, spin_loop};

/// How long a segment lasts before a reader starts the next.
const PERIOD: Duration = Duration::from_millis(50);
/// The most a segment's slope departs from the measured ratio, in parts
/// per million: an error of up to 25 µs is absorbed in one segment (NTP
/// slews the OS clock by at most 500 ppm).
const SLEW_PPM: u64 = 500;
/// An error this large is stepped, not slewed.
const STEP: Duration = Duration::from_millis(1);

/// What the fast clock is made of: a counter, and the OS clock to keep it
/// in step with.
pub(crate) trait Source {
    /// The counter now.
    fn counter(&self) -> u64;
    /// The counter now, read after every load and store before it has
    /// completed (see [`Fast::since_ordered`]).
    fn counter_ordered(&self) -> u64 {
        self.counter()
    }
    /// The OS monotonic clock now, in nanoseconds.
    fn os_nanos(&self) -> Option<u64>;
    /// Nanoseconds per 2³² counts, as first estimated.
    fn nanos_per_2_32(&self) -> u64;
}

/// The CPU's counter, and std's clock; `quanta` for the first
/// calibration (and, off x86-64, the counter itself).
pub(crate) struct Tsc(quanta::Clock);

impl Source for Tsc {
    #[inline]
    fn counter(&self) -> u64 {
        read_counter(&self.0)
    }

    fn counter_ordered(&self) -> u64 {
        read_counter_ordered(&self.0)
    }

    fn os_nanos(&self) -> Option<u64> {
        // std's instant as decoded by `super::decode`: the representation
        // tokio's instants share.
        super::decode(&tokio::time::Instant::from_std(std::time::Instant::now()))
    }

    fn nanos_per_2_32(&self) -> u64 {
        self.0.delta_as_nanos(0, 1 << 32)
    }
}

/// The counter on x86-64: `rdtsc`, inlined. quanta's `Clock::raw` makes
/// the same call, but out of line (it is not `#[inline]`), and a call on the
/// hot path costs more than the call: everything live across it moves to
/// callee-saved registers, five pushes and pops on every `try_acquire`.
/// [`get`] checks that quanta reads this very counter before trusting its
/// calibration for it.
#[cfg(target_arch = "x86_64")]
#[inline]
fn read_counter(_: &quanta::Clock) -> u64 {
    // SAFETY: `rdtsc` reads the time-stamp counter into two registers. It
    // has no preconditions (every x86-64 CPU has it, and it touches no
    // memory); `core::arch` declares it `unsafe` as it does every
    // intrinsic. quanta's `Counter::now` is exactly this call.
    #[expect(
        unsafe_code,
        reason = "one of the crate's two unsafe blocks, both here: an intrinsic with no preconditions"
    )]
    unsafe {
        std::arch::x86_64::_rdtsc()
    }
}

/// [`read_counter`] after every earlier load and store has completed:
/// `mfence` completes them and `lfence` keeps `rdtsc` from starting before
/// (`rdtsc` alone may run ahead of loads before it, and read a time
/// earlier than an event those loads saw). Linux's `rdtsc_ordered` fences
/// the same way, with the fence each vendor documents; both are here.
#[cfg(target_arch = "x86_64")]
fn read_counter_ordered(_: &quanta::Clock) -> u64 {
    // SAFETY: as `read_counter`'s; the fences have no preconditions either
    // (SSE2 is part of x86-64) and touch no memory.
    #[expect(
        unsafe_code,
        reason = "intrinsics with no preconditions, as in `read_counter`"
    )]
    unsafe {
        std::arch::x86_64::_mm_mfence();
        std::arch::x86_64::_mm_lfence();
        std::arch::x86_64::_rdtsc()
    }
}

/// [`read_counter`] elsewhere: after a fence, which orders memory but, on
/// aarch64, not the counter's read (that takes an `isb`, which quanta does
/// not expose); a best effort.
#[cfg(not(target_arch = "x86_64"))]
fn read_counter_ordered(clock: &quanta::Clock) -> u64 {
    std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
    clock.raw()
}

/// The counter elsewhere: quanta's (`cntvct_el0` on aarch64).
#[cfg(not(target_arch = "x86_64"))]
#[inline]
fn read_counter(clock: &quanta::Clock) -> u64 {
    clock.raw()
}

/// Whether quanta reads the counter [`read_counter`] reads (and not, for
/// want of an invariant TSC, the OS clock), so that its calibration is the
/// counter's: its reading falls between two of ours.
fn quanta_reads_the_counter(clock: &quanta::Clock) -> bool {
    let before = read_counter(clock);
    let theirs = clock.raw();
    let after = read_counter(clock);
    cfg!(not(target_arch = "x86_64")) || (before <= theirs && theirs <= after)
}

/// The fast clock, set up once per process.
pub(crate) struct Fast<S = Tsc> {
    source: S,
    /// Even while the segment below is whole; odd while it is replaced.
    seq: AtomicU64,
    /// The segment's anchor on the counter.
    count: AtomicU64,
    /// The segment's anchor in nanoseconds.
    nanos: AtomicU64,
    /// The segment's slope: nanoseconds per count × 2³².
    mult: AtomicU64,
    /// The first anchor (counter, nanoseconds): the baseline of the ratio.
    first: (u64, u64),
    /// [`PERIOD`] in counts.
    period: u64,
}

impl<S> std::fmt::Debug for Fast<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fast")
            .field("mult", &self.mult.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

/// The fast clock, once [`get`] has decided.
static FAST: OnceLock<Option<Fast>> = OnceLock::new();

/// The fast clock if [`get`] has set it up (an origin on it was made).
#[inline]
pub(crate) fn peek() -> Option<&'static Fast> {
    FAST.get().and_then(Option::as_ref)
}

/// The fast clock, if this machine and process use one (decided once).
#[inline]
pub(crate) fn get() -> Option<&'static Fast> {
    FAST.get_or_init(|| {
        let wanted = std::env::var("TOKIO_RATELIMIT_CLOCK").map_or(true, |v| v != "system");
        if !(wanted && trusted_counter()) {
            return None;
        }
        let clock = quanta::Clock::new();
        if !quanta_reads_the_counter(&clock) {
            return None;
        }
        Fast::new(Tsc(clock), PERIOD)
    })
    .as_ref()
}

/// Whether the kernel itself keeps time with the counter quanta reads.
fn trusted_counter() -> bool {
    let wanted = if cfg!(target_arch = "x86_64") {
        "tsc"
    } else if cfg!(target_arch = "aarch64") {
        "arch_sys_counter"
    } else {
        return false;
    };
    cfg!(target_os = "linux")
        && std::fs::read_to_string(
            "/sys/devices/system/clocksource/clocksource0/current_clocksource",
        )
        .is_ok_and(|s| s.trim() == wanted)
}

impl<S: Source> Fast<S> {
    /// The clock on `source`, its segments `period` long.
    pub(crate) fn new(source: S, period: Duration) -> Option<Fast<S>> {
        let mult = source.nanos_per_2_32().max(1);
        let (count, nanos) = pair(&source)?;
        let period = u64::try_from(
            (u128::from(u64::try_from(period.as_nanos()).ok()?) << 32) / u128::from(mult),
        )
        .ok()?
        .max(1);
        Some(Fast {
            source,
            seq: AtomicU64::new(0),
            count: AtomicU64::new(count),
            nanos: AtomicU64::new(nanos),
            mult: AtomicU64::new(mult),
            first: (count, nanos),
            period,
        })
    }

    /// Now, in nanoseconds on the OS monotonic clock's scale.
    #[inline]
    pub(crate) fn now(&self) -> u64 {
        self.since(0)
    }

    /// Nanoseconds from `origin` (an earlier reading of this clock) to now;
    /// 0 if now reads earlier (another core's counter a hair behind).
    ///
    /// The hot path of every limiter on this clock, so it is laid out for
    /// latency: everything but the counter is loaded while the counter is
    /// read, `origin` is taken off the anchor meanwhile, and after the
    /// counter come one subtraction, one 64-bit multiply, a shift, an add
    /// and a sign check (a segment is short enough for the product to fit
    /// in 64 bits; the rare one that is not takes the slow path).
    #[inline]
    pub(crate) fn since(&self, origin: u64) -> u64 {
        self.since_count(origin, self.source.counter())
    }

    /// [`since`](Self::since) when the segment answers it; `None` when it
    /// is being replaced or due to be (then `since` answers), with no call.
    #[inline]
    pub(crate) fn since_leaf(&self, origin: u64) -> Option<u64> {
        self.in_segment(origin, self.source.counter())
    }

    /// [`since`](Self::since), with the counter read only once every load
    /// and store before this call has completed: a time at least that of
    /// any event those loads saw (a grant another thread made under a lock
    /// this thread has just taken). Several times the cost of `since`; for
    /// the rare checks that need it.
    pub(crate) fn since_ordered(&self, origin: u64) -> u64 {
        self.since_count(origin, self.source.counter_ordered())
    }

    /// [`since`](Self::since) for the counter reading `count`.
    #[inline]
    fn since_count(&self, origin: u64, count: u64) -> u64 {
        match self.in_segment(origin, count) {
            Some(since) => since,
            None => self.now_slow(count).saturating_sub(origin),
        }
    }

    /// [`since_count`](Self::since_count) from the segment as it is, if it
    /// is whole and `count` is within it.
    #[inline]
    fn in_segment(&self, origin: u64, count: u64) -> Option<u64> {
        let seq = self.seq.load(Ordering::Acquire);
        let segment = self.segment();
        // Order the three loads before the check that validates them.
        fence(Ordering::Acquire);
        // Below the anchor (read before it), the difference wraps and takes
        // the slow path too.
        let since = count.wrapping_sub(segment.count);
        if seq & 1 == 0 && since <= self.period && self.seq.load(Ordering::Relaxed) == seq {
            if let Some(product) = since.checked_mul(segment.mult) {
                return Some(segment.at_since(origin, product >> 32));
            }
        }
        None
    }

    /// The segment's three atomics, loaded (not validated).
    #[inline]
    fn segment(&self) -> Segment {
        Segment {
            count: self.count.load(Ordering::Relaxed),
            nanos: self.nanos.load(Ordering::Relaxed),
            mult: self.mult.load(Ordering::Relaxed),
        }
    }

    /// [`now`](Self::now) for the counter reading `count`, when the
    /// segment is being replaced or is due to be.
    #[cold]
    #[inline(never)]
    fn now_slow(&self, count: u64) -> u64 {
        loop {
            let seq = self.seq.load(Ordering::Acquire);
            let segment = self.segment();
            fence(Ordering::Acquire);
            if seq & 1 == 1 || self.seq.load(Ordering::Relaxed) != seq {
                // Being replaced: three stores.
                spin_loop();
                continue;
            }
            let since = count.saturating_sub(segment.count);
            if since <= self.period {
                return segment.at(since);
            }
            if let Some(nanos) = self.next_segment(seq, segment, since) {
                return nanos;
            }
        }
    }

    /// Starts the segment after `old` (read at `seq`, `since` counts
    /// ago); `None` if another reader did. (Should the OS clock not read,
    /// `old` goes on.)
    fn next_segment(&self, seq: u64, old: Segment, since: u64) -> Option<u64> {
        let Some((count, os)) = pair(&self.source) else {
            return Some(old.at(since));
        };
        let next = old.next(count, os, self.first, self.period);
        self.seq
            .compare_exchange(seq, seq + 1, Ordering::Relaxed, Ordering::Relaxed)
            .ok()?;
        // Order the odd number before the stores (readers that see any of
        // them see it).
        fence(Ordering::Release);
        self.count.store(next.count, Ordering::Relaxed);
        self.nanos.store(next.nanos, Ordering::Relaxed);
        self.mult.store(next.mult, Ordering::Relaxed);
        self.seq.store(seq + 2, Ordering::Release);
        Some(next.nanos)
    }
}

/// The counter and the OS clock read at (nearly) the same instant: the OS
/// clock between two counter reads, paired with their midpoint.
fn pair(source: &impl Source) -> Option<(u64, u64)> {
    let before = source.counter();
    let nanos = source.os_nanos()?;
    let after = source.counter();
    Some((before + after.saturating_sub(before) / 2, nanos))
}

/// One segment of the clock: from `count` on the counter (`nanos` then),
/// `mult` nanoseconds × 2³² per count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Segment {
    count: u64,
    nanos: u64,
    mult: u64,
}

impl Segment {
    /// `elapsed` ns after the anchor, less `origin`: 0 if that is before
    /// `origin`. Both are nanoseconds since boot (below 2⁶², see
    /// `super::FAST`), so their difference fits an `i64`, and it does not
    /// depend on the counter: only the add and the sign check come after
    /// the multiply.
    #[inline]
    #[expect(
        clippy::cast_possible_wrap,
        clippy::cast_sign_loss,
        reason = "two's complement on purpose: the anchor and the origin are \
                  below 2⁶², `elapsed` below 2³²"
    )]
    fn at_since(self, origin: u64, elapsed: u64) -> u64 {
        let base = self.nanos.wrapping_sub(origin) as i64;
        let t = base.wrapping_add(elapsed as i64);
        if t < 0 { 0 } else { t as u64 }
    }

    /// The time `since` counts after the anchor.
    #[inline]
    fn at(self, since: u64) -> u64 {
        #[expect(
            clippy::cast_possible_truncation,
            reason = "a 64-bit count times a 64-bit slope over 2³² is below 2⁹⁶; \
                      nanoseconds past 2⁶⁴ (584 years) are out of reach"
        )]
        let elapsed = ((u128::from(since) * u128::from(self.mult)) >> 32) as u64;
        self.nanos.saturating_add(elapsed)
    }

    /// The segment after this one, starting at `count`, when the OS clock
    /// read `os` there: the ratio of the OS clock to the counter since
    /// `first`, corrected so that the error found is closed over the next
    /// `period` counts (by at most [`SLEW_PPM`]), or, if the OS clock is
    /// more than [`STEP`] ahead, stepped forward to it. Otherwise it starts
    /// where this one is at `count`: the clock never goes back, and its
    /// slopes being positive, it is monotonic.
    fn next(self, count: u64, os: u64, first: (u64, u64), period: u64) -> Segment {
        let ours = self.at(count.saturating_sub(self.count));
        let (first_count, first_nanos) = first;
        let ratio = u64::try_from(
            (u128::from(os.saturating_sub(first_nanos)) << 32)
                / u128::from(count.saturating_sub(first_count).max(1)),
        )
        .unwrap_or(self.mult)
        .max(1);
        let error = os.abs_diff(ours);
        // Forward only: a clock ahead of the OS clock slews back.
        if os > ours && u128::from(error) > STEP.as_nanos() {
            return Segment {
                count,
                nanos: os,
                mult: ratio,
            };
        }
        let bound = ratio / 1_000_000 * SLEW_PPM;
        let gap = (u128::from(error) << 32) / u128::from(period);
        let gap = u64::try_from(gap).unwrap_or(u64::MAX).min(bound);
        let mult = if os >= ours {
            ratio.saturating_add(gap)
        } else {
            ratio.saturating_sub(gap).max(1)
        };
        Segment {
            count,
            nanos: ours,
            mult,
        }
    }
}

#[cfg(all(test, not(tokio_ratelimit_loom)))]
mod tests {
    use std::sync::Mutex;

    use super::*;

    /// A counter and an OS clock the test sets.
    struct Manual(Mutex<(u64, u64)>, u64);

    impl Manual {
        fn set(&self, counter: u64, os: u64) {
            *self.0.lock().unwrap() = (counter, os);
        }
    }

    impl Source for &Manual {
        fn counter(&self) -> u64 {
            self.0.lock().unwrap().0
        }
        fn os_nanos(&self) -> Option<u64> {
            Some(self.0.lock().unwrap().1)
        }
        fn nanos_per_2_32(&self) -> u64 {
            self.1
        }
    }

    /// 2.5 counts per ns (a 2.5 GHz counter), its first estimate off by
    /// `ppm` (quanta's was 16 ppm here).
    fn source(ppm: i64) -> Manual {
        let exact = (1u64 << 32) * 2 / 5;
        let estimate = exact.saturating_add_signed(i64::try_from(exact).unwrap() / 1_000_000 * ppm);
        Manual(Mutex::new((1_000, 7_000_000)), estimate)
    }

    /// The OS clock at `counter` for a 2.5 GHz counter from the start.
    fn os(counter: u64) -> u64 {
        7_000_000 + (counter - 1_000) * 2 / 5
    }

    #[test]
    fn converges_on_the_os_clock_and_never_goes_back() {
        for ppm in [-400, -16, 0, 16, 400] {
            let m = source(ppm);
            let fast = Fast::new(&m, PERIOD).unwrap();
            let mut last = 0;
            let mut worst_late = 0;
            // 20 s in steps of 7 ms: readings between segments, and every
            // segment started by a reader.
            let mut c = 1_000;
            for i in 0..2_857u64 {
                c += 17_500_000;
                m.set(c, os(c));
                let t = fast.now();
                assert!(t >= last, "{ppm} ppm: went back at {i}");
                last = t;
                if i > 1_000 {
                    worst_late = worst_late.max(t.abs_diff(os(c)));
                }
            }
            // After 7 s, within a microsecond of the OS clock.
            assert!(worst_late <= 1_000, "{ppm} ppm: {worst_late} ns off");
        }
    }

    /// The leaf reading (no call) answers exactly as `since` within a
    /// segment, and leaves the rest to it: a segment due to end, one being
    /// replaced, a counter behind the anchor (another core's).
    #[test]
    fn the_leaf_reading_is_since_within_a_segment_and_nothing_else() {
        let m = source(16);
        let fast = Fast::new(&m, PERIOD).unwrap();
        let origin = fast.now();
        let anchor = fast.count.load(Ordering::Relaxed);
        // Within the segment, to its last count.
        for step in [0, 1, 7, 2_500_000, fast.period - 1, fast.period] {
            m.set(anchor + step, os(anchor + step));
            assert_eq!(fast.since_leaf(origin), Some(fast.since(origin)), "{step}");
            assert_eq!(fast.since_leaf(origin + 3), Some(fast.since(origin + 3)));
        }
        // Past it: the call starts the next segment; the leaf does not.
        m.set(anchor + fast.period + 1, os(anchor + fast.period + 1));
        assert_eq!(fast.since_leaf(origin), None);
        let t = fast.since(origin);
        assert_eq!(fast.since_leaf(origin), Some(t), "the next segment answers");
        // A counter behind the anchor.
        let anchor = fast.count.load(Ordering::Relaxed);
        m.set(anchor - 1, os(anchor - 1));
        assert_eq!(fast.since_leaf(origin), None);
        // A segment being replaced (an odd sequence number).
        m.set(anchor + 10, os(anchor + 10));
        assert!(fast.since_leaf(origin).is_some());
        fast.seq.fetch_add(1, Ordering::Relaxed);
        assert_eq!(fast.since_leaf(origin), None);
        fast.seq.fetch_add(1, Ordering::Relaxed);
        assert_eq!(fast.since_leaf(origin), Some(fast.since(origin)));
    }

    #[test]
    fn steps_forward_and_slews_back() {
        let m = source(0);
        let fast = Fast::new(&m, PERIOD).unwrap();
        let mut c = 1_000 + 200_000_000; // 80 ms
        m.set(c, os(c));
        assert!(fast.now().abs_diff(os(c)) <= 1);
        // The OS clock jumps 10 ms ahead (a suspend): followed at once.
        let jump = 10_000_000;
        c += 200_000_000;
        m.set(c, os(c) + jump);
        let stepped = fast.now();
        assert_eq!(stepped, os(c) + jump);
        // It jumps back 10 ms: the fast clock goes on, slewing by at most
        // SLEW_PPM, never back.
        c += 200_000_000;
        m.set(c, os(c));
        let mut last = fast.now();
        let elapsed = os(c) - os(c - 200_000_000);
        assert!(last >= stepped + elapsed - elapsed / 1_000_000 * SLEW_PPM - 2);
        for _ in 0..1000 {
            let before = c;
            c += 200_000_000;
            m.set(c, os(c));
            let t = fast.now();
            assert!(t >= last);
            let elapsed = os(c) - os(before);
            assert!(t - last >= elapsed - elapsed / 1_000_000 * SLEW_PPM - 2);
            last = t;
        }
    }

    /// `since(origin)` is the time less `origin`, saturating at 0, for
    /// origins behind, at and ahead of the reading, within a segment and
    /// across segments, and with segments too long for the fast path's
    /// 64-bit product (10 s: it falls back to the 128-bit one). The
    /// reference is a twin clock on the same source read through the slow
    /// path (`now_slow`, 128-bit arithmetic throughout): both start the
    /// same segments at the same readings.
    #[test]
    fn since_an_origin_is_now_less_the_origin() {
        for period in [PERIOD, Duration::from_secs(10)] {
            let m = source(16);
            let (fast, twin) = (
                Fast::new(&m, period).unwrap(),
                Fast::new(&m, period).unwrap(),
            );
            let mut c = 1_000u64;
            for i in 0..5_000u64 {
                // Steps from 1 count to ~6 s, so that readings fall inside
                // segments, just past them and far past them.
                c += 1 + (i * 2_654_435_761) % 16_000_000_000 / (1 + (i % 3) * 1_000);
                m.set(c, os(c));
                let now = twin.now_slow(c);
                let origins = [
                    0,
                    now / 2,
                    now.saturating_sub(1),
                    now,
                    now + 1,
                    now + 1_000_000_000,
                ];
                let origin = origins[usize::try_from(i).unwrap() % origins.len()];
                assert_eq!(
                    fast.since(origin),
                    now.saturating_sub(origin),
                    "{period:?}, {i}"
                );
            }
        }
    }

    #[test]
    fn on_this_machine_tracks_std() {
        let Some(fast) = get() else { return };
        let os = || Tsc(quanta::Clock::new()).os_nanos().unwrap();
        let mut last = fast.now();
        let start = std::time::Instant::now();
        // Both reads, the ordered one every other time.
        let mut ordered = false;
        while start.elapsed() < Duration::from_millis(300) {
            ordered = !ordered;
            let read = || {
                if ordered {
                    fast.since_ordered(0)
                } else {
                    fast.now()
                }
            };
            let (before, t, after) = (os(), read(), os());
            assert!(t >= last);
            last = t;
            // Within 100 µs of the OS clock read around it (a reader may be
            // preempted between the reads).
            assert!(
                t + 100_000 >= before && t <= after + 100_000,
                "{before} {t} {after}"
            );
        }
    }
}

/// loom model of the segment switch: two readers find the segment due and
/// race to replace it. Run with
/// `RUSTFLAGS="--cfg tokio_ratelimit_loom" cargo test --lib loom_`.
#[cfg(all(test, tokio_ratelimit_loom))]
mod loom_tests {
    use loom::sync::Arc;
    use loom::thread;

    use super::*;

    /// A counter that moves on by one at every read, and an OS clock of one
    /// ns per count, while the first estimate says two: the first segment
    /// runs twice too fast, and the next slews back. (std's atomic: the
    /// counter is the CPU's, not memory loom need order.)
    struct Counting(std::sync::atomic::AtomicU64);

    impl Source for Counting {
        fn counter(&self) -> u64 {
            self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1
        }
        fn os_nanos(&self) -> Option<u64> {
            Some(self.0.load(std::sync::atomic::Ordering::Relaxed))
        }
        fn nanos_per_2_32(&self) -> u64 {
            2 << 32
        }
    }

    #[test]
    fn loom_fast_clock_readers_see_whole_segments() {
        loom::model(|| {
            let fast = Arc::new(
                Fast::new(
                    Counting(std::sync::atomic::AtomicU64::new(1_000)),
                    Duration::from_nanos(100),
                )
                .unwrap(),
            );
            let first = fast.segment();
            // Well past the first segment (50 counts).
            fast.source
                .0
                .store(2_000, std::sync::atomic::Ordering::Relaxed);
            let floor = first.at(2_000 - first.count);
            let readers: Vec<_> = (0..2)
                .map(|_| {
                    let fast = Arc::clone(&fast);
                    thread::spawn(move || fast.now())
                })
                .collect();
            let readings: Vec<u64> = readers.into_iter().map(|r| r.join().unwrap()).collect();
            // A reading is the first segment at its count (at least the
            // floor) or the next segment, which starts where the first was
            // and slews back by at most SLEW_PPM; a torn read (the new
            // anchor's count with the old nanoseconds) falls far below.
            for &reading in &readings {
                assert!(reading >= floor, "{reading} < {floor}");
                assert!(reading <= first.at(2_010 - first.count), "{reading}");
            }
            // One writer won; the segment is whole and even.
            assert_eq!(fast.seq.load(Ordering::Relaxed), 2);
            let next = fast.segment();
            assert!(next.count > 2_000 && next.nanos >= floor);
            assert!(next.mult < first.mult);
        });
    }
}
