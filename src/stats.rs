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
/// two threads sharing a limiter do not fight over one line.
///
/// Each stripe is *owned* by one thread, for good: the first two threads
/// that count on a limiter claim one each (a thread tries the stripe its
/// id points to first, then the other). The owner's counts have their own
/// words that no other thread writes, so the owner adds with a plain load
/// and store — exact, and without the locked read-modify-write that costs a
/// few nanoseconds on every `try_acquire`. Any further thread adds to the
/// shared words of the stripe its id points to with `fetch_add`. The owners
/// sit on a line of their own, written only when claimed, so reading them
/// on every call costs no miss. Nothing is kept per thread outside the
/// limiter, so a thread that exits loses no counts (its stripe's later
/// threads just keep using `fetch_add`).
#[derive(Debug, Default)]
pub(crate) struct Counters {
    /// Each stripe's owning thread's id (see [`thread_id`]); 0 while
    /// unclaimed.
    owners: Owners,
    stripes: [Stripe; STRIPES],
}

const STRIPES: usize = 2;

#[derive(Debug, Default)]
#[repr(align(64))]
struct Owners([AtomicU64; STRIPES]);

#[derive(Debug, Default)]
#[repr(align(64))]
struct Stripe {
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
        #[allow(clippy::cast_possible_truncation)]
        let first = id as usize % STRIPES;
        let second = (first + 1) % STRIPES;
        let owners = &self.owners.0;
        let owner = owners[first].load(Ordering::Relaxed);
        if owner == id {
            return add_owned(counter(&self.stripes[first].owned), amount);
        }
        let other = owners[second].load(Ordering::Relaxed);
        if other == id {
            add_owned(counter(&self.stripes[second].owned), amount);
        } else if owner != 0 && other != 0 {
            // Both taken (for good): no write to the owners' line.
            counter(&self.stripes[first].shared).fetch_add(amount, Ordering::Relaxed);
        } else {
            self.claim_and_add(id, [first, second], amount, counter);
        }
    }

    /// [`add`](Self::add) by a thread that owns no stripe while one was
    /// free a moment ago: claims it, or if another thread was quicker, adds
    /// to the shared words of its first stripe.
    #[cold]
    fn claim_and_add(
        &self,
        id: u64,
        order: [usize; 2],
        amount: u64,
        counter: impl Fn(&Pair) -> &AtomicU64,
    ) {
        for i in order {
            if self.owners.0[i]
                .compare_exchange(0, id, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
            {
                add_owned(counter(&self.stripes[i].owned), amount);
                return;
            }
        }
        counter(&self.stripes[order[0]].shared).fetch_add(amount, Ordering::Relaxed);
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
                .owners
                .0
                .iter()
                .all(|owner| owner.load(Ordering::Relaxed) != 0)
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

    #[test]
    fn the_first_two_threads_own_a_stripe_each_whatever_their_ids() {
        let counters = Counters::default();
        // Threads made one after another, with ids of the same parity or
        // not: the two of them always end up owning both stripes.
        for _ in 0..2 {
            std::thread::scope(|scope| {
                scope.spawn(|| {
                    let _ = thread_id(); // an id taken in between
                });
            });
            std::thread::scope(|scope| {
                scope.spawn(|| counters.granted(1));
            });
        }
        let owners: Vec<u64> = counters
            .owners
            .0
            .iter()
            .map(|owner| owner.load(Ordering::Relaxed))
            .collect();
        assert!(owners.iter().all(|&owner| owner != 0), "{owners:?}");
        assert_ne!(owners[0], owners[1]);
        assert_eq!(counters.totals(), (2, 0));
    }
}
