//! `Reservation`: permits held by a caller, given back if not used.
//!
//! A reservation knows one thing: the limiter that holds its entry, behind
//! the small [`Hold`] trait, and the entry's id there. So this module
//! depends on no limiter (as tokio's `SemaphorePermit` knows only its
//! semaphore).

use std::fmt;
use std::sync::Arc;

/// A limiter that holds reserved entries for [`Reservation`]s.
pub(crate) trait Hold: Send + Sync {
    /// Entry `id` is spent: it leaves the limiter's books for good.
    fn commit(&self, id: u64);
    /// Entry `id` was dropped unspent: give back what it holds.
    fn cancel(&self, id: u64);
}

/// Permits granted but not yet spent: [`commit`](Self::commit) spends them;
/// dropping the reservation instead gives them back, as if the request had
/// never come.
///
/// This is what a service needs when it takes a permit *before* it knows
/// the work will happen — tower's `poll_ready`, then `call`: if the service
/// is dropped in between, nothing is lost. Made by [`Limiter::reserve`]
/// (and the limiters' inherent `reserve`).
///
/// For the bucket limiters a dropped reservation returns exactly its
/// undrained part and moves every later reservation forward. The smooth
/// limiters give back the part of its cost not yet elapsed and move every
/// later reservation forward as much (the stored permits it spent stay
/// spent; withdrawn entirely while nothing was reserved after it). A
/// limiter without
/// support (the trait's default) hands out reservations that are already
/// spent.
///
/// [`Limiter::reserve`]: crate::Limiter::reserve
///
/// # Examples
///
/// ```
/// use tokio_ratelimit::{Rate, TokenBucket};
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// let bucket = TokenBucket::builder().rate(Rate::per_second(1)).capacity(1).build().unwrap();
/// let reservation = bucket.reserve(1).await.unwrap();
/// assert_eq!(bucket.available(), 0);
/// drop(reservation); // the work did not happen after all
/// assert_eq!(bucket.available(), 1);
/// bucket.reserve(1).await.unwrap().commit(); // spent
/// assert_eq!(bucket.available(), 0);
/// # }
/// ```
#[must_use = "a reservation is given back when dropped; call `commit` to spend it"]
#[clippy::has_significant_drop]
pub struct Reservation {
    /// The limiter holding the entry and its id; `None` once spent (or for
    /// `n = 0`).
    held: Option<(Arc<dyn Hold>, u64)>,
}

impl Reservation {
    /// Entry `id`, held by `holder`.
    pub(crate) fn held(holder: Arc<dyn Hold>, id: u64) -> Reservation {
        Reservation {
            held: Some((holder, id)),
        }
    }

    /// A reservation that has nothing to give back.
    pub fn spent() -> Reservation {
        Reservation { held: None }
    }

    /// Spends the permits: from now on they are used, whatever happens to
    /// the caller.
    pub fn commit(mut self) {
        if let Some((holder, id)) = self.held.take() {
            holder.commit(id);
        }
    }

    /// Whether dropping this reservation would give something back.
    pub fn is_returnable(&self) -> bool {
        self.held.is_some()
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        if let Some((holder, id)) = self.held.take() {
            holder.cancel(id);
        }
    }
}

impl fmt::Debug for Reservation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Reservation")
            .field("returnable", &self.is_returnable())
            .finish()
    }
}
