//! `Stats`: what a limiter has done, for metrics and logs.

use std::cell::Cell;
use std::sync::atomic::AtomicUsize;

// The counters go through `crate::sync` so that the metrics publisher's
// loom model (in `meter.rs`) sees them as loom atomics.
use crate::sync::{AtomicU64, Ordering};

/// A limiter's counters and its state now, from `stats()`.
///
/// # Examples
///
/// ```
/// use tokio_ratelimit::{Funnel, Rate};
///
/// let funnel = Funnel::builder().rate(Rate::per_second(1)).capacity(2).build().unwrap();
/// funnel.try_acquire_many(2).unwrap();
/// assert!(funnel.try_acquire().is_err());
/// let stats = funnel.stats();
/// assert_eq!((stats.granted, stats.refused, stats.waiting), (2, 1, 0));
/// assert_eq!(stats.available, Some(0));
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Stats {
    /// Permits granted so far (the sum of `n` over successful calls; a
    /// reservation counts once committed).
    pub granted: u64,
    /// Requests refused so far: rate limited, timed out, overflowed, or
    /// larger than the capacity (not those refused because the limiter was
    /// closed).
    pub refused: u64,
    /// Callers waiting in `acquire` now: those whose turn has not come (one
    /// whose turn has come has its permits, whether or not its future has
    /// been polled since).
    pub waiting: usize,
    /// Permits that could be taken at once now (whole tokens, or free room
    /// in a leaky bucket); `None` where the algorithm has no such number
    /// (the smooth limiters, which let any request through and make the
    /// next one pay).
    pub available: Option<u32>,
}

/// Counters bumped on the hot paths, striped over two cache lines so that
/// two threads sharing a limiter rarely fight over one line. Plain
/// `fetch_add` on a stripe chosen per thread: the cleverer schemes tried
/// (stripes owned by a thread, stripes left on contention) measured no
/// better and cost more on refusals (see `benches/README.md`).
///
/// The engine keeps its two [`Stripe`]s itself, placed on different lines
/// by its layout rather than by padding (see `engine::Engine`); these are
/// padded, for the maps.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    stripes: [Padded; 2],
}

/// A stripe alone on its cache line.
#[derive(Debug, Default)]
#[repr(align(64))]
struct Padded(Stripe);

/// One stripe of counters: what the threads on it granted and refused.
#[derive(Debug, Default)]
pub(crate) struct Stripe {
    granted: AtomicU64,
    refused: AtomicU64,
}

/// Of two stripes, the calling thread's: threads take stripes in turn, so
/// two threads sharing a limiter use different ones. The thread-local is
/// const-initialised, so reading it is a single load (no lazy-init check).
#[inline]
pub(crate) fn pick<'a>(first: &'a Stripe, second: &'a Stripe) -> &'a Stripe {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        /// 0: not chosen yet; 1: the first stripe; 2: the second.
        static STRIPE: Cell<u8> = const { Cell::new(0) };
    }
    match STRIPE.with(Cell::get) {
        1 => first,
        2 => second,
        _ => {
            let second_stripe = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed) % 2 == 1;
            STRIPE.with(|stripe| stripe.set(if second_stripe { 2 } else { 1 }));
            if second_stripe { second } else { first }
        }
    }
}

/// The totals of two stripes: (granted permits, refused requests), read
/// with `Acquire` (see [`Stripe::granted`]).
pub(crate) fn totals(first: &Stripe, second: &Stripe) -> (u64, u64) {
    [first, second].iter().fold((0, 0), |(g, r), s| {
        (
            g.wrapping_add(s.granted.load(Ordering::Acquire)),
            r.wrapping_add(s.refused.load(Ordering::Acquire)),
        )
    })
}

impl Stripe {
    /// Counts `permits` granted. `Release`: a metrics publisher that reads
    /// the total with `Acquire` sees what the grant's meter recorded before
    /// (see `meter::Slot::granted`); free on x86, where every locked add is
    /// a full barrier.
    #[inline]
    pub(crate) fn granted(&self, permits: u32) {
        self.granted
            .fetch_add(u64::from(permits), Ordering::Release);
    }

    /// Counts a refusal; `Release` as [`granted`](Self::granted) is.
    #[inline]
    pub(crate) fn refused(&self) {
        self.refused.fetch_add(1, Ordering::Release);
    }
}

impl Counters {
    #[inline]
    pub(crate) fn granted(&self, permits: u32) {
        pick(&self.stripes[0].0, &self.stripes[1].0).granted(permits);
    }

    #[inline]
    pub(crate) fn refused(&self) {
        pick(&self.stripes[0].0, &self.stripes[1].0).refused();
    }

    /// The totals: (granted permits, refused requests).
    pub(crate) fn totals(&self) -> (u64, u64) {
        totals(&self.stripes[0].0, &self.stripes[1].0)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Barrier;

    use super::*;

    #[test]
    fn counts_from_many_threads_are_exact() {
        // More threads than stripes (and than CPUs); the threads exit
        // before the totals are read.
        const THREADS: u64 = 6;
        const CALLS: u64 = 20_000;
        let counters = Counters::default();
        #[expect(clippy::cast_possible_truncation, reason = "six threads")]
        let barrier = Barrier::new(THREADS as usize);
        std::thread::scope(|scope| {
            for t in 0..THREADS {
                let (counters, barrier) = (&counters, &barrier);
                scope.spawn(move || {
                    barrier.wait();
                    for i in 0..CALLS {
                        if (i + t) % 3 == 0 {
                            counters.refused();
                        } else {
                            counters.granted(2);
                        }
                    }
                });
            }
        });
        let refused: u64 = (0..THREADS)
            .map(|t| (0..CALLS).filter(|i| (i + t) % 3 == 0).count() as u64)
            .sum();
        let granted = 2 * (THREADS * CALLS - refused);
        assert_eq!(counters.totals(), (granted, refused));
        // A later thread, and this one, still count exactly.
        std::thread::scope(|scope| {
            scope.spawn(|| counters.granted(5));
        });
        counters.refused();
        assert_eq!(counters.totals(), (granted + 5, refused + 1));
    }
}
