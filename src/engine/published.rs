//! The bands' states published for refusals that take no lock: a seqlock.
//!
//! A bucket of several bands decides under the engine's lock, and after
//! every change the writer (holding that lock) publishes the new states
//! here. A `try_acquire` reads them without the lock; if they would refuse
//! it, the refusal stands (it is the answer at the instant of the read), and
//! only a request that may be granted takes the lock. A read that overlaps
//! a publication gets `None` and takes the lock too, so nobody spins.
//!
//! The protocol is the classic one, with atomics throughout: the writer
//! makes the generation odd, fences (release), stores the words, and makes
//! the generation even with a release store; the reader loads the
//! generation (acquire), the words, fences (acquire), and loads the
//! generation again. Both even and equal: the words are one publication.

use crate::algorithm::{MAX_BANDS, PerBand};
use crate::sync::{AtomicU64, Ordering, fence};

/// The published states: each band's `tat` as two 64-bit halves.
pub(crate) struct Published {
    generation: AtomicU64,
    words: [AtomicU64; 2 * MAX_BANDS],
}

impl Published {
    pub(crate) fn new(tats: &PerBand) -> Published {
        let published = Published {
            generation: AtomicU64::new(0),
            words: std::array::from_fn(|_| AtomicU64::new(0)),
        };
        published.publish(tats);
        published
    }

    /// Publishes `tats`. One writer at a time (the engine's lock).
    #[expect(clippy::cast_possible_truncation, reason = "halves, on purpose")]
    pub(crate) fn publish(&self, tats: &PerBand) {
        let generation = self.generation.load(Ordering::Relaxed);
        self.generation
            .store(generation.wrapping_add(1), Ordering::Relaxed);
        fence(Ordering::Release);
        for (halves, &tat) in self.words.chunks(2).zip(tats) {
            halves[0].store((tat >> 64) as u64, Ordering::Relaxed);
            halves[1].store(tat as u64, Ordering::Relaxed);
        }
        self.generation
            .store(generation.wrapping_add(2), Ordering::Release);
    }

    /// The states of one publication, or `None` if a publication overlapped
    /// the read.
    pub(crate) fn read(&self) -> Option<PerBand> {
        let before = self.generation.load(Ordering::Acquire);
        if before & 1 == 1 {
            return None;
        }
        let mut tats = [0; MAX_BANDS];
        for (tat, halves) in tats.iter_mut().zip(self.words.chunks(2)) {
            let high = u128::from(halves[0].load(Ordering::Relaxed));
            let low = u128::from(halves[1].load(Ordering::Relaxed));
            *tat = high << 64 | low;
        }
        fence(Ordering::Acquire);
        (self.generation.load(Ordering::Relaxed) == before).then_some(tats)
    }
}

#[cfg(all(test, tokio_ratelimit_loom))]
mod loom_tests {
    use loom::sync::Arc;
    use loom::thread;

    use super::*;

    /// States whose halves all differ, so that a torn read shows.
    fn state(k: u128) -> PerBand {
        let mut tats = [0; MAX_BANDS];
        for (b, tat) in tats.iter_mut().enumerate() {
            *tat = (k << 64 | k) * (b as u128 + 1);
        }
        tats
    }

    /// A reader racing a publication sees the old state or the new one
    /// whole, or nothing; never halves of both. (One publication: with
    /// eight words, every value each relaxed load may return makes two
    /// already slow to explore; the second publication adds nothing the
    /// generation check does not already cover.)
    #[test]
    fn loom_published_reads_are_never_torn() {
        loom::model(|| {
            let published = Arc::new(Published::new(&state(1)));
            let writer = {
                let published = Arc::clone(&published);
                thread::spawn(move || published.publish(&state(2)))
            };
            if let Some(tats) = published.read() {
                assert!((1..=2).any(|k| tats == state(k)), "a torn read: {tats:?}");
            }
            writer.join().unwrap();
            assert_eq!(published.read(), Some(state(2)));
        });
    }
}
