//! `Reservation`: permits held by a caller, given back if not used.

use std::fmt;
use std::sync::Arc;

use crate::engine::Engine;
use crate::smooth::Withdrawal;

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
    held: Held,
}

pub(crate) enum Held {
    /// Nothing to give back (already spent, or `n = 0`).
    Spent,
    /// An entry held in a bucket's queue.
    Bucket { engine: Arc<Engine>, id: u64 },
    /// A smooth limiter's reservation.
    Smooth(Withdrawal),
}

impl Reservation {
    pub(crate) fn new(held: Held) -> Reservation {
        Reservation { held }
    }

    /// A reservation that has nothing to give back.
    pub fn spent() -> Reservation {
        Reservation::new(Held::Spent)
    }

    /// Spends the permits: from now on they are used, whatever happens to
    /// the caller.
    pub fn commit(mut self) {
        match std::mem::replace(&mut self.held, Held::Spent) {
            Held::Spent => {}
            Held::Bucket { engine, id } => engine.commit(id),
            Held::Smooth(withdrawal) => withdrawal.commit(),
        }
    }

    /// Whether dropping this reservation would give something back.
    pub fn is_returnable(&self) -> bool {
        !matches!(self.held, Held::Spent)
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        match std::mem::replace(&mut self.held, Held::Spent) {
            Held::Spent => {}
            Held::Bucket { engine, id } => engine.cancel(id),
            Held::Smooth(withdrawal) => drop(withdrawal), // gives back what it can
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
