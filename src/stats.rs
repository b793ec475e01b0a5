//! `Stats`: what a limiter has done, for metrics and logs.

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};

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
    /// Callers waiting in `acquire` now.
    pub waiting: usize,
    /// Permits that could be taken at once now (whole tokens, or free room
    /// in a leaky bucket); `None` where the algorithm has no such number
    /// (the smooth limiters, which let any request through and make the
    /// next one pay).
    pub available: Option<u32>,
}

/// Counters bumped on the hot paths, striped over two cache lines so that
/// two threads sharing a limiter rarely fight over one line.
///
/// A thread always counts on the same stripe (chosen by its id). Each
/// stripe is *owned* by the first thread that counts on it (for good: the
/// owner never changes). The owner's counts have their own words that no
/// other thread writes, so the owner adds with a plain load and store —
/// exact, and without the locked read-modify-write that costs a few
/// nanoseconds on every `try_acquire`. The other threads on that stripe add
/// to its shared words with `fetch_add`, as every thread did before.
/// Nothing is kept per thread outside the limiter, so a thread that exits
/// loses no counts (its stripe's later threads just keep using
/// `fetch_add`).
#[derive(Debug, Default)]
pub(crate) struct Counters {
    stripes: [Stripe; STRIPES],
}

const STRIPES: usize = 2;

#[derive(Debug, Default)]
#[repr(align(64))]
struct Stripe {
    /// The owning thread's id (see [`thread_id`]); 0 while unclaimed.
    owner: AtomicU64,
    /// The owner's counts: written by the owner only.
    owned: Pair,
    /// Everybody else's counts: read-modify-writes.
    shared: Pair,
}

#[derive(Debug, Default)]
struct Pair {
    granted: AtomicU64,
    refused: AtomicU64,
}

/// The calling thread's id: unique for the life of the process, never 0.
/// The thread-local is const-initialised and has no destructor, so reading
/// it is a single load (no lazy-init check) and works during thread exit.
#[inline]
fn thread_id() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    thread_local! {
        static ID: Cell<u64> = const { Cell::new(0) };
    }
    ID.with(|id| match id.get() {
        0 => {
            let new = NEXT.fetch_add(1, Ordering::Relaxed);
            id.set(new);
            new
        }
        known => known,
    })
}

impl Counters {
    #[inline]
    pub(crate) fn granted(&self, permits: u32) {
        self.add(u64::from(permits), |pair| &pair.granted);
    }

    #[inline]
    pub(crate) fn refused(&self) {
        self.add(1, |pair| &pair.refused);
    }

    #[inline]
    fn add(&self, amount: u64, counter: impl Fn(&Pair) -> &AtomicU64) {
        let id = thread_id();
        // Consecutive threads use different stripes. A thread only ever
        // looks at its own stripe: reading another's owner word would pull
        // in a line that its owner writes on every call.
        #[allow(clippy::cast_possible_truncation)]
        let stripe = &self.stripes[id as usize % STRIPES];
        match stripe.owner.load(Ordering::Relaxed) {
            owner if owner == id => add_owned(counter(&stripe.owned), amount),
            0 => Self::claim_and_add(stripe, id, amount, counter),
            _ => {
                counter(&stripe.shared).fetch_add(amount, Ordering::Relaxed);
            }
        }
    }

    /// [`add`](Self::add) on a stripe nobody owned a moment ago: claims it,
    /// or, if another thread was quicker, adds to the shared words.
    #[cold]
    fn claim_and_add(stripe: &Stripe, id: u64, amount: u64, counter: impl Fn(&Pair) -> &AtomicU64) {
        match stripe
            .owner
            .compare_exchange(0, id, Ordering::Relaxed, Ordering::Relaxed)
        {
            Ok(_) => add_owned(counter(&stripe.owned), amount),
            Err(_) => {
                counter(&stripe.shared).fetch_add(amount, Ordering::Relaxed);
            }
        }
    }

    /// The totals: (granted permits, refused requests).
    pub(crate) fn totals(&self) -> (u64, u64) {
        self.stripes.iter().fold((0, 0), |(g, r), s| {
            (
                g.wrapping_add(s.owned.granted.load(Ordering::Relaxed))
                    .wrapping_add(s.shared.granted.load(Ordering::Relaxed)),
                r.wrapping_add(s.owned.refused.load(Ordering::Relaxed))
                    .wrapping_add(s.shared.refused.load(Ordering::Relaxed)),
            )
        })
    }
}

/// Adds to a counter that only the calling thread writes (a stripe's
/// `owned` words, by their owner): a load and a store, no update lost.
#[inline]
fn add_owned(counter: &AtomicU64, amount: u64) {
    counter.store(
        counter.load(Ordering::Relaxed).wrapping_add(amount),
        Ordering::Relaxed,
    );
}

#[cfg(test)]
mod tests {
    use std::sync::Barrier;

    use super::*;

    #[test]
    fn counts_from_many_threads_are_exact() {
        // More threads than stripes: two own a stripe each, the rest share;
        // the threads exit before the totals are read.
        const THREADS: u64 = 6;
        const CALLS: u64 = 20_000;
        let counters = Counters::default();
        #[allow(clippy::cast_possible_truncation)]
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
        // Owned and shared words were both used.
        assert!(
            counters
                .stripes
                .iter()
                .all(|s| s.owner.load(Ordering::Relaxed) != 0)
        );
        assert!(
            counters
                .stripes
                .iter()
                .any(|s| s.shared.granted.load(Ordering::Relaxed) != 0)
        );
        // A later thread, and this one, still count exactly.
        std::thread::scope(|scope| {
            scope.spawn(|| counters.granted(5));
        });
        counters.refused();
        assert_eq!(counters.totals(), (granted + 5, refused + 1));
    }
}
