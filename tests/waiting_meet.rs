//! Where the waiting APIs meet: `acquire`, `acquire_timeout`, `reserve`
//! against live rate changes, `close`, quotas of two bands and
//! cancellation, in paused time, with exact instants.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use proptest::prelude::*;
use tokio::time::{self, Instant};
use tokio_ratelimit::{
    AcquireError, Funnel, LeakyBucket, Limiter, Quota, Rate, Reservation, SmoothBursty,
    SmoothWarmingUp, TokenBucket, TryAcquireError,
};
use tokio_test::{assert_pending, assert_ready_eq, task};

mod support;
use support::{limited, ms};

fn ns(n: u64) -> Duration {
    Duration::from_nanos(n)
}

fn token(rate: Rate, capacity: u32, initial: u32) -> TokenBucket {
    TokenBucket::builder()
        .rate(rate)
        .capacity(capacity)
        .initial(initial)
        .build()
        .unwrap()
}

/// Moves the paused clock to `at` (since `start`).
async fn advance_to(start: Instant, at: Duration) {
    let now = start.elapsed();
    let Some(by) = at.checked_sub(now) else {
        panic!("{now:?} is past {at:?}")
    };
    time::advance(by).await;
}

// ---------------------------------------------------------------------------
// set_rate with waiters queued: exact turns, both directions
// ---------------------------------------------------------------------------

/// 3/s, capacity 1, empty: A, B, C due at ⅓, ⅔, 1 s. At 100 ms the rate
/// becomes 7/s: the shortfall then (3.7 permits, C's end at 4/3 s) refills
/// at 7/s. A is 1.7 permits short → 100 ms + 1.7/7 s − 1/7 s = 200 ms;
/// B 2.7 → 342 857 142.857 ns; C 3.7 → 485 714 285.714 ns. Each is pending
/// one nanosecond before its (rounded up) turn and granted at it.
#[tokio::test(start_paused = true)]
async fn raising_three_to_seven_moves_each_turn_exactly() {
    let b = token(Rate::per_second(3), 1, 0);
    let start = Instant::now();
    let mut w: Vec<_> = (0..3).map(|_| task::spawn(b.acquire())).collect();
    for t in &mut w {
        assert_pending!(t.poll());
    }
    advance_to(start, ms(100)).await;
    b.set_rate(Rate::per_second(7)).unwrap();
    // The meter sees the queue: its permit comes after C's, 4.7 short.
    assert_eq!(b.try_acquire(), limited(ns(528_571_429)));
    let due = [200_000_000u64, 342_857_143, 485_714_286];
    for (t, at) in w.iter_mut().zip(due) {
        advance_to(start, ns(at - 1)).await;
        assert_pending!(t.poll());
        advance_to(start, ns(at)).await;
        assert_ready_eq!(t.poll(), Ok(()));
    }
    assert_eq!(b.try_acquire(), limited(ns(628_571_429 - 485_714_286)));
}

/// 7/s, capacity 2, empty: A (1), B (2), C (1) due at 1/7, 3/7, 4/7 s. At
/// 100 ms the rate becomes 3/s: the shortfall (5.3 permits) refills at
/// 3/s from then. A is 2.3 short, 0.3 over capacity: 200 ms; B 4.3:
/// 866 666 666.67 ns; C 5.3: 1.2 s. Nobody is released early.
#[tokio::test(start_paused = true)]
async fn lowering_seven_to_three_moves_each_turn_exactly() {
    let b = token(Rate::per_second(7), 2, 0);
    let start = Instant::now();
    let mut w = [
        task::spawn(b.acquire_many(1)),
        task::spawn(b.acquire_many(2)),
        task::spawn(b.acquire_many(1)),
    ];
    for t in &mut w {
        assert_pending!(t.poll());
    }
    advance_to(start, ms(100)).await;
    b.set_rate(Rate::per_second(3)).unwrap();
    let due = [200_000_000u64, 866_666_667, 1_200_000_000];
    for (t, at) in w.iter_mut().zip(due) {
        advance_to(start, ns(at - 1)).await;
        assert_pending!(t.poll());
        advance_to(start, ns(at)).await;
        assert_ready_eq!(t.poll(), Ok(()));
    }
    // C's water ends at 1.2 s + 2/3 s: the bucket is full then.
    assert_eq!(b.try_acquire_many(2), limited(ns(666_666_667)));
}

/// Three changes in a row, the last to the same rate: 3/s → 7/s at
/// 100 ms → 3/s at 150 ms → 3/s at 175 ms. At 150 ms A is 50 ms (0.35
/// permits at 7/s) from its turn: at 3/s that is 116.67 ms, so 266.67 ms;
/// B and C follow one third of a second apart: 600 ms, 933.33 ms. The
/// change to the same rate moves nobody.
#[tokio::test(start_paused = true)]
async fn several_changes_in_a_row_and_one_to_the_same_rate() {
    let b = token(Rate::per_second(3), 1, 0);
    let start = Instant::now();
    let mut w: Vec<_> = (0..3).map(|_| task::spawn(b.acquire())).collect();
    for t in &mut w {
        assert_pending!(t.poll());
    }
    advance_to(start, ms(100)).await;
    b.set_rate(Rate::per_second(7)).unwrap();
    advance_to(start, ms(150)).await;
    b.set_rate(Rate::per_second(3)).unwrap();
    advance_to(start, ms(175)).await;
    let before = b.try_acquire();
    b.set_rate(Rate::per_second(3)).unwrap();
    assert_eq!(b.try_acquire(), before);
    assert_eq!(before, limited(ns(1_266_666_667 - 175_000_000)));
    let due = [266_666_667u64, 600_000_000, 933_333_334];
    for (t, at) in w.iter_mut().zip(due) {
        advance_to(start, ns(at - 1)).await;
        assert_pending!(t.poll());
        advance_to(start, ns(at)).await;
        assert_ready_eq!(t.poll(), Ok(()));
    }
}

/// The same schedule with the waiters as tasks woken by the actor: each is
/// released on the first 1 ms tick at or after its turn, in arrival order.
#[tokio::test(start_paused = true)]
async fn the_actor_releases_rescaled_turns_on_the_next_tick_in_order() {
    let b = token(Rate::per_second(3), 1, 0);
    let start = Instant::now();
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut handles = vec![];
    for who in 0..3 {
        let (b, order) = (b.clone(), order.clone());
        handles.push(tokio::spawn(async move {
            b.acquire().await.unwrap();
            order.lock().unwrap().push(who);
            start.elapsed()
        }));
        support::settle().await;
    }
    time::sleep(ms(100)).await;
    b.set_rate(Rate::per_second(7)).unwrap();
    let mut at = vec![];
    for h in handles {
        at.push(h.await.unwrap());
    }
    assert_eq!(at, [ms(200), ms(343), ms(486)]);
    assert_eq!(*order.lock().unwrap(), [0, 1, 2]);
}

// ---------------------------------------------------------------------------
// acquire_timeout against a rate change
// ---------------------------------------------------------------------------

/// 3/s, capacity 1, empty. A: `acquire_timeout(1, 400 ms)`, due at ⅓ s; B
/// behind it at ⅔ s. At 100 ms the rate drops to 1/s: A is 0.7 permits
/// short, due at 800 ms, past its deadline: it times out at 400 ms and gives
/// back its whole permit, so B (1.7 short at 100 ms, 1.8 s) takes A's turn,
/// 800 ms. Nothing lost: the next permit is a second after B's.
#[tokio::test(start_paused = true)]
async fn a_waiter_pushed_past_its_deadline_times_out_and_b_takes_its_turn() {
    let b = token(Rate::per_second(3), 1, 0);
    let start = Instant::now();
    let mut a = task::spawn(b.acquire_timeout(1, ms(400)));
    let mut w = task::spawn(b.acquire());
    assert_pending!(a.poll());
    assert_pending!(w.poll());
    advance_to(start, ms(100)).await;
    b.set_rate(Rate::per_second(1)).unwrap();
    advance_to(start, ns(399_999_999)).await;
    assert_pending!(a.poll());
    advance_to(start, ms(400)).await;
    assert_ready_eq!(a.poll(), Err(AcquireError::Timeout));
    drop(a);
    advance_to(start, ns(799_999_999)).await;
    assert_pending!(w.poll());
    advance_to(start, ms(800)).await;
    assert_ready_eq!(w.poll(), Ok(()));
    assert_eq!(b.try_acquire(), limited(ms(1000)));
    let stats = b.stats();
    assert_eq!((stats.granted, stats.refused, stats.waiting), (1, 2, 0));
}

/// A waiter pushed past its deadline and then pulled back inside it by a
/// second change is granted at its new turn: 3/s, `acquire_timeout(1,
/// 350 ms)` due at ⅓ s; 2/s at 100 ms (due at 450 ms); 7/s at 200 ms (half
/// a permit short: 271 428 571.43 ns).
#[tokio::test(start_paused = true)]
async fn a_waiter_pulled_back_inside_its_deadline_is_granted() {
    let b = token(Rate::per_second(3), 1, 0);
    let start = Instant::now();
    let mut a = task::spawn(b.acquire_timeout(1, ms(350)));
    assert_pending!(a.poll());
    advance_to(start, ms(100)).await;
    b.set_rate(Rate::per_second(2)).unwrap();
    advance_to(start, ms(200)).await;
    b.set_rate(Rate::per_second(7)).unwrap();
    advance_to(start, ns(271_428_571)).await;
    assert_pending!(a.poll());
    advance_to(start, ns(271_428_572)).await;
    assert_ready_eq!(a.poll(), Ok(()));
}

/// The timeout decision after a change that moves the turn past the
/// deadline by less than a timer tick: 1/s, capacity 1, empty;
/// `acquire_timeout(1, 1000.5 ms)`, due at 1 s (inside). At 500 ms the
/// rate becomes one per 1001.4 ms: half a permit short, the turn moves to
/// 1000.7 ms, past the 1000.5 ms deadline. The waiter must time out (on the
/// 1001 ms tick, when tokio's timer fires), not be granted.
#[tokio::test(start_paused = true)]
async fn a_turn_moved_just_past_the_deadline_times_out() {
    let b = token(Rate::per_second(1), 1, 0);
    let start = Instant::now();
    let a = b.clone();
    let handle = tokio::spawn(async move {
        let r = a.acquire_timeout(1, ns(1_000_500_000)).await;
        (r, start.elapsed())
    });
    support::settle().await;
    time::sleep(ms(500)).await;
    b.set_rate(Rate::every(ns(1_001_400_000))).unwrap();
    assert_eq!(
        handle.await.unwrap(),
        (Err(AcquireError::Timeout), ms(1001)),
        "turn at 1000.7 ms, deadline at 1000.5 ms"
    );
}

// ---------------------------------------------------------------------------
// Reservations across a rate change
// ---------------------------------------------------------------------------

/// Capacity 4, one per second, full. A held reservation of 3 and a meter's
/// permit after it empty the bucket at 0. At 500 ms (3.5 permits short:
/// the reservation's 2.5 undrained, then the meter's 1) the rate becomes one
/// per 100 ms; at 600 ms one more permit has drained, the reservation's:
/// dropping it gives back its undrained 1.5 permits, no more, so 3 tokens
/// are there (the meter's permit is still short), and the fourth 100 ms
/// after the three are taken.
#[tokio::test(start_paused = true)]
async fn a_reservation_dropped_after_a_rate_change_gives_back_its_undrained_part() {
    let b = token(Rate::every(ms(1000)), 4, 4);
    let start = Instant::now();
    let held = b.reserve(3).await.unwrap();
    b.try_acquire().unwrap();
    assert_eq!(b.available(), 0);
    advance_to(start, ms(500)).await;
    b.set_rate(Rate::every(ms(100))).unwrap();
    assert_eq!(b.try_acquire(), limited(ms(50)));
    advance_to(start, ms(600)).await;
    assert_eq!(b.available(), 1);
    drop(held);
    assert_eq!(b.available(), 3);
    assert_eq!(b.try_acquire_many(4), limited(ms(100)));
    assert_eq!(b.try_acquire_many(3), Ok(()));
    assert_eq!(b.try_acquire(), limited(ms(100)));
    let stats = b.stats();
    assert_eq!((stats.granted, stats.refused, stats.waiting), (4, 3, 0));
}

/// A `reserve` queued before a rate change is granted at its rescaled turn
/// and, committed, stays spent; a waiter behind it keeps its rescaled turn.
/// One per 100 ms, capacity 1, empty: R due at 100 ms, W at 200 ms; at
/// 50 ms one per 10 ms: R at 55 ms, W at 65 ms.
#[tokio::test(start_paused = true)]
async fn a_reservation_made_before_a_rate_change_and_committed_after_it() {
    let b = token(Rate::every(ms(100)), 1, 0);
    let start = Instant::now();
    let mut r = task::spawn(b.reserve(1));
    let mut w = task::spawn(b.acquire());
    assert_pending!(r.poll());
    assert_pending!(w.poll());
    advance_to(start, ms(50)).await;
    b.set_rate(Rate::every(ms(10))).unwrap();
    advance_to(start, ns(54_999_999)).await;
    assert_pending!(r.poll());
    advance_to(start, ms(55)).await;
    let std::task::Poll::Ready(Ok(held)) = r.poll() else {
        panic!("the reservation is due at 55 ms")
    };
    assert!(held.is_returnable());
    advance_to(start, ms(60)).await;
    held.commit();
    assert_eq!(b.stats().granted, 1);
    assert_pending!(w.poll());
    advance_to(start, ns(64_999_999)).await;
    assert_pending!(w.poll());
    advance_to(start, ms(65)).await;
    assert_ready_eq!(w.poll(), Ok(()));
    assert_eq!(b.try_acquire(), limited(ms(10)));
    assert_eq!(b.stats().granted, 2);
}

/// The same, but the reservation is dropped at 60 ms: half of its permit
/// (5 ms at the new rate) has not drained and comes back, so W, due at
/// 65 ms, is due at 60 ms and granted at once; the next permit is 10 ms
/// after W's.
#[tokio::test(start_paused = true)]
async fn a_reservation_made_before_a_rate_change_and_dropped_after_it() {
    let b = token(Rate::every(ms(100)), 1, 0);
    let start = Instant::now();
    let mut r = task::spawn(b.reserve(1));
    let mut w = task::spawn(b.acquire());
    assert_pending!(r.poll());
    assert_pending!(w.poll());
    advance_to(start, ms(50)).await;
    b.set_rate(Rate::every(ms(10))).unwrap();
    advance_to(start, ms(55)).await;
    let std::task::Poll::Ready(Ok(held)) = r.poll() else {
        panic!("the reservation is due at 55 ms")
    };
    advance_to(start, ms(60)).await;
    drop(held);
    assert!(w.is_woken());
    assert_ready_eq!(w.poll(), Ok(()));
    assert_eq!(b.try_acquire(), limited(ms(10)));
    let stats = b.stats();
    assert_eq!((stats.granted, stats.waiting), (1, 0));
}

// ---------------------------------------------------------------------------
// Cancellation interleaved with rate changes
// ---------------------------------------------------------------------------

/// 3/s → 7/s at 100 ms (A, B, C due at 200, 342.857…, 485.714… ms, as
/// above). B's task is aborted at 250 ms: its whole permit comes back and C
/// takes B's turn exactly; the next permit is one interval (1/7 s) after C.
#[tokio::test(start_paused = true)]
async fn aborting_a_waiter_after_a_rate_change_moves_the_one_behind_to_its_turn() {
    let b = token(Rate::per_second(3), 1, 0);
    let start = Instant::now();
    let mut handles = vec![];
    for _ in 0..3 {
        let b = b.clone();
        handles.push(tokio::spawn(async move {
            b.acquire().await.unwrap();
            start.elapsed()
        }));
        support::settle().await;
    }
    assert_eq!(b.waiting(), 3);
    time::sleep(ms(100)).await;
    b.set_rate(Rate::per_second(7)).unwrap();
    time::sleep(ms(150)).await;
    let c = handles.pop().unwrap();
    let bee = handles.pop().unwrap();
    bee.abort();
    assert!(bee.await.unwrap_err().is_cancelled());
    assert_eq!(b.waiting(), 1);
    // After the abort C's permit is the last: one more, 1/7 s after it.
    assert_eq!(
        b.try_acquire(),
        limited(ns(342_857_143 + 142_857_143 - 250_000_000))
    );
    assert_eq!(c.await.unwrap(), ms(343));
    assert_eq!(handles.pop().unwrap().await.unwrap(), ms(200));
    assert_eq!(b.stats().granted, 2);
}

/// A rate change between two drops, each one refunding at the rate in
/// force when it happens: one per 100 ms, capacity 2, empty; A (2) due at
/// 200 ms, B (1) at 300 ms, C (1) at 400 ms. A dropped at 50 ms gives back
/// all 200 ms: B at 100 ms, C at 200 ms. At 60 ms one per 40 ms: B is 0.4
/// permits short (16 ms): 76 ms; C 1.4 (56 ms): 116 ms. B dropped at 70 ms
/// gives back its whole permit (40 ms): C at 76 ms.
#[tokio::test(start_paused = true)]
async fn drops_on_both_sides_of_a_rate_change() {
    let b = token(Rate::every(ms(100)), 2, 0);
    let start = Instant::now();
    let mut a = task::spawn(b.acquire_many(2));
    let mut bee = task::spawn(b.acquire());
    let mut c = task::spawn(b.acquire());
    assert_pending!(a.poll());
    assert_pending!(bee.poll());
    assert_pending!(c.poll());
    advance_to(start, ms(50)).await;
    drop(a);
    advance_to(start, ms(60)).await;
    b.set_rate(Rate::every(ms(40))).unwrap();
    assert_eq!(b.try_acquire(), limited(ms(96)));
    advance_to(start, ms(70)).await;
    drop(bee);
    advance_to(start, ns(75_999_999)).await;
    assert_pending!(c.poll());
    advance_to(start, ms(76)).await;
    assert_ready_eq!(c.poll(), Ok(()));
    assert_eq!(b.try_acquire(), limited(ms(40)));
}

// ---------------------------------------------------------------------------
// close with waiters and reservations, on every limiter
// ---------------------------------------------------------------------------

/// What a limiter looks like to the close test: the trait, and its close.
trait Closable: Limiter + Clone + 'static {
    fn close_it(&self);
}

impl Closable for TokenBucket {
    fn close_it(&self) {
        self.close();
    }
}
impl Closable for LeakyBucket {
    fn close_it(&self) {
        self.close();
    }
}
impl Closable for Funnel {
    fn close_it(&self) {
        self.close();
    }
}
impl Closable for SmoothBursty {
    fn close_it(&self) {
        self.close();
    }
}
impl Closable for SmoothWarmingUp {
    fn close_it(&self) {
        self.close();
    }
}

/// `limiter` has `granted` permits granted and its next permit 100 ms or
/// more away. A held reservation H (made now: its turn comes at once or
/// later, so it is taken first), then a pending `reserve`, a pending
/// `acquire` and a pending `acquire_timeout`. At `close_at` (before any of
/// them is due) the limiter is closed: every pending one fails with
/// `Closed`, at once; none is refused or granted; H can still be
/// committed and counts once; every later call is `Closed`, also once the
/// limiter would have had room.
async fn close_meets_waiters_and_reservations<L: Closable>(limiter: &L, granted: u64) {
    let start = Instant::now();
    let mut h = task::spawn(limiter.reserve(1));
    let held = loop {
        if let std::task::Poll::Ready(r) = h.poll() {
            break r.unwrap();
        }
        time::advance(ms(1)).await;
    };
    drop(h);
    let mut r = task::spawn(limiter.reserve(1));
    let mut w = task::spawn(limiter.acquire());
    let mut t = task::spawn(limiter.acquire_timeout(1, Duration::from_secs(3600)));
    assert_pending!(r.poll());
    assert_pending!(w.poll());
    assert_pending!(t.poll());
    let before = limiter.stats();
    assert_eq!(before.waiting, 3);
    let closed_at = start.elapsed();
    limiter.close_it();
    assert!(r.is_woken() && w.is_woken() && t.is_woken());
    assert!(matches!(
        r.poll(),
        std::task::Poll::Ready(Err(AcquireError::Closed))
    ));
    assert_ready_eq!(w.poll(), Err(AcquireError::Closed));
    assert_ready_eq!(t.poll(), Err(AcquireError::Closed));
    assert_eq!(start.elapsed(), closed_at);
    let stats = limiter.stats();
    assert_eq!(
        (stats.granted, stats.refused, stats.waiting),
        (granted, before.refused, 0)
    );
    held.commit();
    assert_eq!(limiter.stats().granted, granted + 1);
    time::advance(Duration::from_secs(100)).await;
    assert_eq!(limiter.try_acquire(), Err(TryAcquireError::Closed));
    assert_eq!(limiter.acquire().await, Err(AcquireError::Closed));
    assert_eq!(
        limiter.acquire_timeout(1, ms(1)).await,
        Err(AcquireError::Closed)
    );
    assert!(matches!(
        limiter.reserve(1).await,
        Err(AcquireError::Closed)
    ));
    let stats = limiter.stats();
    assert_eq!(
        (stats.granted, stats.refused, stats.waiting),
        (granted + 1, before.refused, 0)
    );
}

#[tokio::test(start_paused = true)]
async fn close_meets_waiters_and_reservations_on_a_token_bucket() {
    let b = token(Rate::per_second(3), 2, 2);
    b.try_acquire_many(2).unwrap();
    close_meets_waiters_and_reservations(&b, 2).await;
}

#[tokio::test(start_paused = true)]
async fn close_meets_waiters_and_reservations_on_a_leaky_bucket() {
    let b = LeakyBucket::builder()
        .rate(Rate::per_second(7))
        .capacity(8)
        .build()
        .unwrap();
    b.try_acquire_many(2).unwrap();
    close_meets_waiters_and_reservations(&b, 2).await;
}

#[tokio::test(start_paused = true)]
async fn close_meets_waiters_and_reservations_on_a_funnel() {
    let f = Funnel::builder()
        .rate(Rate::per_second(7))
        .capacity(1)
        .build()
        .unwrap();
    f.try_acquire().unwrap();
    close_meets_waiters_and_reservations(&f, 1).await;
}

#[tokio::test(start_paused = true)]
async fn close_meets_waiters_and_reservations_on_a_two_band_quota() {
    let b = TokenBucket::builder()
        .quota(Quota::new(Rate::per_second(7), 2).and(Rate::per_second(1), 3))
        .build()
        .unwrap();
    b.try_acquire_many(2).unwrap();
    close_meets_waiters_and_reservations(&b, 2).await;
}

#[tokio::test(start_paused = true)]
async fn close_meets_waiters_and_reservations_on_the_smooth_limiters() {
    let s = SmoothBursty::builder()
        .permits_per_second(3.0)
        .build()
        .unwrap();
    s.try_acquire_many(1).unwrap();
    close_meets_waiters_and_reservations(&s, 1).await;
    let s = SmoothWarmingUp::builder()
        .permits_per_second(3.0)
        .warmup(Duration::from_secs(1))
        .build()
        .unwrap();
    s.try_acquire_many(1).unwrap();
    close_meets_waiters_and_reservations(&s, 1).await;
}

/// A waiter whose turn has come but who has not been granted yet when the
/// limiter closes is answered `Closed`: nothing is granted after the close.
/// A funnel (no actor: each waiter is granted by its own poll) with a
/// waiter due at 100 ms, closed at 100 ms before it is polled. A rate
/// change after the close grants nobody either.
#[tokio::test(start_paused = true)]
async fn a_due_but_ungranted_waiter_is_closed_and_a_later_set_rate_grants_nobody() {
    let f = Funnel::builder()
        .rate(Rate::every(ms(100)))
        .capacity(1)
        .build()
        .unwrap();
    f.try_acquire().unwrap();
    let start = Instant::now();
    let mut a = task::spawn(f.acquire());
    let mut c = task::spawn(f.acquire());
    assert_pending!(a.poll());
    assert_pending!(c.poll());
    advance_to(start, ms(100)).await;
    f.close();
    f.set_rate(Rate::every(ms(1))).unwrap();
    assert_ready_eq!(a.poll(), Err(AcquireError::Closed));
    assert_ready_eq!(c.poll(), Err(AcquireError::Closed));
    assert_eq!(f.try_acquire(), Err(TryAcquireError::Closed));
    let stats = f.stats();
    assert_eq!((stats.granted, stats.refused, stats.waiting), (1, 0, 0));
}

// ---------------------------------------------------------------------------
// Quotas of two bands: withdrawals, reservations, timeouts
// ---------------------------------------------------------------------------

/// 10/s with bursts of 1, and 1/s with bursts of 3, full. A meter's permit
/// at 0, then B, C, D, E wait: B and C on the fast band (100, 200 ms), D
/// and E on the slow one (1 s, 2 s). D is dropped at 50 ms: E takes D's
/// turn, and a meter asking then is told what a bucket that never saw D
/// would say (the slow band's fifth permit, 1.95 s away).
#[tokio::test(start_paused = true)]
async fn two_bands_a_dropped_waiter_gives_its_turn_to_the_one_behind() {
    let quota = Quota::new(Rate::per_second(10), 1).and(Rate::per_second(1), 3);
    let b = TokenBucket::builder().quota(quota).build().unwrap();
    let start = Instant::now();
    b.try_acquire().unwrap();
    let mut w: Vec<_> = (0..4).map(|_| task::spawn(b.acquire())).collect();
    for t in &mut w {
        assert_pending!(t.poll());
    }
    assert_eq!(b.try_acquire(), limited(ms(3000)));
    advance_to(start, ms(50)).await;
    let mut e = w.pop().unwrap();
    drop(w.pop());
    assert_eq!(b.try_acquire(), limited(ms(1950)));
    for (t, at) in w.iter_mut().zip([100, 200]) {
        advance_to(start, ns(at * 1_000_000 - 1)).await;
        assert_pending!(t.poll());
        advance_to(start, ms(at)).await;
        assert_ready_eq!(t.poll(), Ok(()));
    }
    advance_to(start, ns(999_999_999)).await;
    assert_pending!(e.poll());
    advance_to(start, ms(1000)).await;
    assert_ready_eq!(e.poll(), Ok(()));
    assert_eq!(b.try_acquire(), limited(ms(1000)));
}

/// 10/s with bursts of 2, and 1/s with bursts of 2, full. A reservation of
/// 2 held from 0, and W behind it, due when the slow band has a permit
/// again (1 s). At 500 ms the reservation is dropped: each band gets back
/// the part it had not refilled (the slow band 1.5 permits), so W goes at
/// once, and then one permit is left in the slow band, not two.
#[tokio::test(start_paused = true)]
async fn two_bands_a_held_reservation_dropped_gives_back_each_bands_undrained_part() {
    let quota = Quota::new(Rate::per_second(10), 2).and(Rate::per_second(1), 2);
    let b = TokenBucket::builder().quota(quota).build().unwrap();
    let start = Instant::now();
    let held = b.reserve(2).await.unwrap();
    let mut w = task::spawn(b.acquire());
    assert_pending!(w.poll());
    advance_to(start, ms(500)).await;
    assert_pending!(w.poll());
    drop(held);
    assert!(w.is_woken());
    assert_ready_eq!(w.poll(), Ok(()));
    assert_eq!(b.try_acquire_many(2), limited(ms(1000)));
    assert_eq!(b.try_acquire(), Ok(()));
    assert_eq!(b.try_acquire(), limited(ms(1000)));
    let stats = b.stats();
    assert_eq!((stats.granted, stats.waiting), (2, 0));
}

/// Two bands, 10/s bursts of 1 and 1/s bursts of 2; meter permits at 0
/// and 100 ms empty the slow band (its next permit at 1 s). At 100 ms an
/// `acquire_timeout` of 899.999999 ms fails at once (the turn is 900 ms
/// away); U (1 s timeout) waits for 1 s, W behind it for 2 s. U is dropped
/// at 600 ms: W takes its turn, 1 s, and nothing is lost (the next permit
/// is a second later).
#[tokio::test(start_paused = true)]
async fn two_bands_timeouts_and_a_withdrawal_behind_them() {
    let quota = Quota::new(Rate::per_second(10), 1).and(Rate::per_second(1), 2);
    let b = TokenBucket::builder().quota(quota).build().unwrap();
    let start = Instant::now();
    b.try_acquire().unwrap();
    advance_to(start, ms(100)).await;
    b.try_acquire().unwrap();
    // The slow band is empty until 1 s (one permit) and 2 s (two).
    assert_eq!(
        b.acquire_timeout(1, ns(899_999_999)).await,
        Err(AcquireError::Timeout)
    );
    let mut u = task::spawn(b.acquire_timeout(1, ms(1000)));
    let mut w = task::spawn(b.acquire());
    assert_pending!(u.poll());
    assert_pending!(w.poll());
    assert_eq!(b.try_acquire(), limited(ms(2900)));
    advance_to(start, ms(600)).await;
    drop(u);
    advance_to(start, ns(999_999_999)).await;
    assert_pending!(w.poll());
    advance_to(start, ms(1000)).await;
    assert_ready_eq!(w.poll(), Ok(()));
    assert_eq!(b.try_acquire(), limited(ms(1000)));
    let stats = b.stats();
    assert_eq!((stats.granted, stats.refused, stats.waiting), (3, 3, 0));
}

/// A waiter moved up by a dropped reservation goes at once; it must then
/// be poured into every band *at that instant* ("waiters … are poured into
/// every band at their turn, so each band keeps its window bound",
/// README). 100/s with bursts of 3, and 10/s with bursts of 5, full. H
/// holds 3 from 0 (the fast band has them back by 30 ms; the slow band's
/// 300 ms of water has not started to drain behind nothing); W (3) waits
/// for the slow band, due at 100 ms. At 50 ms H is dropped: W goes at once
/// — and the fast band, which has just granted W's 3 permits at 50 ms,
/// holds no room for more until 20 ms later. Observed: W is poured into
/// the fast band at 30 ms (its turn recomputed from its arrival at 0),
/// as if its permits had drained while it waited, and the fast band grants
/// 2 more at 50 ms: 5 permits at one instant in a band of burst 3.
#[tokio::test(start_paused = true)]
async fn two_bands_a_waiter_moved_up_by_a_dropped_reservation_is_poured_now() {
    let quota = Quota::new(Rate::every(ms(10)), 3).and(Rate::every(ms(100)), 5);
    let b = TokenBucket::builder().quota(quota).build().unwrap();
    let start = Instant::now();
    let held = b.reserve(3).await.unwrap();
    let mut w = task::spawn(b.acquire_many(3));
    assert_pending!(w.poll());
    advance_to(start, ms(50)).await;
    assert_pending!(w.poll());
    drop(held);
    assert!(w.is_woken());
    assert_ready_eq!(w.poll(), Ok(()));
    // The fast band granted 3 at this instant: it is empty of tokens until
    // 10 ms from now (one), 20 ms (two). The slow band holds W's 3 of 5.
    assert_eq!(
        b.try_acquire_many(2),
        limited(ms(20)),
        "W's 3 and 2 more at 50 ms: 5 permits at one instant in a band of burst 3"
    );
}

/// Two held reservations, the first dropped, then the second: each gives
/// back its own undrained part, and no more ("a dropped reservation returns
/// exactly its undrained part and moves every later reservation forward",
/// `Reservation`; "a withdrawn waiter gives back every band's undrained
/// part", README). One permit per 10 ms, bursts of 4 (for the quota, with a
/// second band of 1000/s and bursts of 100 that never binds):
///
/// * 0 ms: R1 and R2 hold 2 each (water until 20 and 40 ms);
/// * 10 ms: R1 is dropped, half drained: 10 ms come back, R2's water now
///   runs from 10 to 30 ms; T asks for 3: due at 20 ms (water to 60 ms);
/// * 20 ms: T goes; A asks for 2: due at 40 ms;
/// * 25 ms: R2 is dropped with 5 ms undrained (25 to 30): A moves up by
///   5 ms, to 35 ms.
///
/// Observed on the quota: R2 gives back 15 ms (its place as it was before
/// R1 left), A goes at once at 25 ms: T's 3 at 20 ms and A's 2 at 25 ms
/// are 5 permits within 5 ms in a band of burst 4 and one per 10 ms.
async fn two_reservations_dropped_one_after_the_other(b: &TokenBucket) {
    let start = Instant::now();
    let r1 = b.reserve(2).await.unwrap();
    let r2 = b.reserve(2).await.unwrap();
    advance_to(start, ms(10)).await;
    drop(r1);
    let mut t = task::spawn(b.acquire_many(3));
    assert_pending!(t.poll());
    advance_to(start, ms(20)).await;
    assert_ready_eq!(t.poll(), Ok(()));
    let mut a = task::spawn(b.acquire_many(2));
    assert_pending!(a.poll());
    advance_to(start, ms(25)).await;
    drop(r2);
    assert_pending!(a.poll(), "A is due at 35 ms, not at 25 ms");
    advance_to(start, ns(34_999_999)).await;
    assert_pending!(a.poll());
    advance_to(start, ms(35)).await;
    assert_ready_eq!(a.poll(), Ok(()));
    assert_eq!(b.try_acquire(), limited(ms(10)));
}

#[tokio::test(start_paused = true)]
async fn one_band_two_reservations_dropped_one_after_the_other() {
    two_reservations_dropped_one_after_the_other(&token(Rate::every(ms(10)), 4, 4)).await;
}

#[tokio::test(start_paused = true)]
async fn two_bands_two_reservations_dropped_one_after_the_other() {
    let quota = Quota::new(Rate::every(ms(10)), 4).and(Rate::per_second(1000), 100);
    let b = TokenBucket::builder().quota(quota).build().unwrap();
    two_reservations_dropped_one_after_the_other(&b).await;
}

// ---------------------------------------------------------------------------
// The leaky shaper and the funnel across a rate change
// ---------------------------------------------------------------------------

/// The shaper, 7/s, capacity 4: A goes at once, B and C at 1/7 and 2/7 s.
/// At 100 ms the rate becomes 3/s: the water ahead of B (0.3 permits)
/// drains at 3/s, so B comes out at 200 ms, C (1.3 ahead) at 533.33… ms;
/// neither a nanosecond early.
#[tokio::test(start_paused = true)]
async fn the_shaper_drains_the_water_ahead_at_the_new_rate() {
    let b = LeakyBucket::builder()
        .rate(Rate::per_second(7))
        .capacity(4)
        .build()
        .unwrap();
    let start = Instant::now();
    b.acquire().await.unwrap();
    let mut w = [task::spawn(b.acquire()), task::spawn(b.acquire())];
    for t in &mut w {
        assert_pending!(t.poll());
    }
    advance_to(start, ms(100)).await;
    b.set_rate(Rate::per_second(3)).unwrap();
    // 2.3 units of water: two more do not fit, one does.
    assert_eq!(b.level(), 3);
    assert_eq!(b.try_acquire_many(2), limited(ns(100_000_000)));
    for (t, at) in w.iter_mut().zip([200_000_000u64, 533_333_334]) {
        advance_to(start, ns(at - 1)).await;
        assert_pending!(t.poll());
        advance_to(start, ns(at)).await;
        assert_ready_eq!(t.poll(), Ok(()));
    }
}

/// The funnel's waiters keep their own timers: a rate change must re-arm
/// them. 7/s, capacity 1, full after a meter's permit: A due at 1/7 s, B at
/// 2/7 s. At 100 ms the rate becomes 3/s: A at 200 ms, B at 533.33… ms,
/// released on the ticks at or after.
#[tokio::test(start_paused = true)]
async fn the_funnels_own_timers_follow_a_rate_change() {
    let f = Funnel::builder()
        .rate(Rate::per_second(7))
        .capacity(1)
        .build()
        .unwrap();
    let start = Instant::now();
    f.try_acquire().unwrap();
    let mut handles = vec![];
    for _ in 0..2 {
        let f = f.clone();
        handles.push(tokio::spawn(async move {
            f.acquire().await.unwrap();
            start.elapsed()
        }));
        support::settle().await;
    }
    time::sleep(ms(100)).await;
    f.set_rate(Rate::per_second(3)).unwrap();
    let mut at = vec![];
    for h in handles {
        at.push(h.await.unwrap());
    }
    assert_eq!(at, [ms(200), ms(534)]);
}

// ---------------------------------------------------------------------------
// The smooth limiters: a rate change leaves every current waiter's turn
// ---------------------------------------------------------------------------

/// Two twins built at the same instant and driven alike, but for one
/// `set_rate` on the first at 50 ms: every waiter queued before it is
/// released at the same instant on both ("the debt already incurred, and
/// so the wait of every current waiter, is unchanged"); the next request is
/// priced at the new rate.
async fn smooth_twins<L: Limiter + Clone + 'static>(
    changed: &L,
    same: &L,
    set_rate: impl FnOnce(),
) -> (Vec<Duration>, Vec<Duration>) {
    let start = Instant::now();
    let mut handles = vec![];
    for l in [changed, same] {
        for n in [1, 3, 2] {
            let l = l.clone();
            handles.push(tokio::spawn(async move {
                l.acquire_many(n).await.unwrap();
                start.elapsed()
            }));
            support::settle().await;
        }
    }
    time::sleep(ms(50)).await;
    set_rate();
    let mut at = vec![];
    for h in handles {
        at.push(h.await.unwrap());
    }
    let other = at.split_off(3);
    (at, other)
}

#[tokio::test(start_paused = true)]
async fn smooth_bursty_set_rate_leaves_the_waiters_turns() {
    let build = || {
        SmoothBursty::builder()
            .permits_per_second(10.0)
            .build()
            .unwrap()
    };
    let (changed, same) = (build(), build());
    changed.try_acquire().unwrap();
    same.try_acquire().unwrap();
    let (a, b) = smooth_twins(&changed, &same, || changed.set_rate(1.0).unwrap()).await;
    // 1, 3, 2 permits after one at 0: at 100, 200 and 500 ms.
    assert_eq!(a, [ms(100), ms(200), ms(500)]);
    assert_eq!(a, b);
    // The ticket is at 700 ms on both; what comes after is priced apart.
    assert_eq!(changed.try_acquire(), limited(ms(200)));
    assert_eq!(same.try_acquire(), limited(ms(200)));
    time::sleep(ms(200)).await;
    changed.try_acquire().unwrap();
    same.try_acquire().unwrap();
    assert_eq!(changed.try_acquire(), limited(ms(1000)));
    assert_eq!(same.try_acquire(), limited(ms(100)));
}

#[tokio::test(start_paused = true)]
async fn smooth_warming_up_set_rate_leaves_the_waiters_turns() {
    let build = || {
        SmoothWarmingUp::builder()
            .permits_per_second(10.0)
            .warmup(Duration::from_secs(1))
            .build()
            .unwrap()
    };
    let (changed, same) = (build(), build());
    changed.try_acquire().unwrap();
    same.try_acquire().unwrap();
    let (a, b) = smooth_twins(&changed, &same, || changed.set_rate(1.0).unwrap()).await;
    assert_eq!(a, b);
    assert!(a.windows(2).all(|p| p[0] < p[1]), "{a:?}");
}

// ---------------------------------------------------------------------------
// Property: random interleavings on a TokenBucket against an exact model
// ---------------------------------------------------------------------------

/// What the driver does at one event.
#[derive(Debug, Clone, Copy)]
enum Op {
    Acquire(u32),
    /// `acquire_timeout(n, k ms + 300 µs)`: made at `e + 700 µs`, its
    /// deadline falls on a tick.
    Timeout(u32, u64),
    Reserve(u32),
    /// Drops request `i` (mod the number made): aborts its task while it
    /// waits, drops its reservation once held.
    Drop(usize),
    /// Commits reservation `i` if held.
    Commit(usize),
    SetRate(usize),
    Try(u32),
    Close,
}

const RATES: [Rate; 6] = [
    Rate::per_second(7),
    Rate::per_second(30),
    Rate::per(7, Duration::from_millis(100)),
    Rate::per(3, Duration::from_millis(50)),
    Rate::every(Duration::from_millis(9)),
    Rate::per_second(3),
];

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (1u32..=4).prop_map(Op::Acquire),
        2 => ((1u32..=4), 0u64..400).prop_map(|(n, t)| Op::Timeout(n, t)),
        2 => (1u32..=4).prop_map(Op::Reserve),
        3 => any::<usize>().prop_map(Op::Drop),
        1 => any::<usize>().prop_map(Op::Commit),
        3 => (0..RATES.len()).prop_map(Op::SetRate),
        2 => (1u32..=4).prop_map(Op::Try),
        1 => Just(Op::Close),
    ]
}

/// A rate's exact interval, `num / den` ns, and a capacity (as the crate
/// counts: scaled units of `1/den` ns).
#[derive(Debug, Clone, Copy)]
struct Iv {
    num: u128,
    den: u128,
    cap: u128,
}

impl Iv {
    fn of(rate: Rate, cap: u32) -> Iv {
        let (mut a, mut b) = (rate.period().as_nanos(), u128::from(rate.permits()));
        while b != 0 {
            (a, b) = (b, a % b);
        }
        Iv {
            num: rate.period().as_nanos() / a,
            den: u128::from(rate.permits()) / a,
            cap: u128::from(cap),
        }
    }
    fn cost(self, n: u32) -> u128 {
        self.num * u128::from(n)
    }
    fn tau(self) -> u128 {
        self.num * self.cap
    }
    /// When a reservation of `n` ending at `end` may go (scaled): the
    /// token rule (back within capacity) or the shaper's (the water ahead
    /// drained).
    fn ready(self, end: u128, n: u32, shaper: bool) -> u128 {
        end.saturating_sub(if shaper { self.cost(n) } else { self.tau() })
    }
    /// `t` of this interval, converted at `now` ns to `to`: the water still
    /// there drains at the new rate (rounded up to the new unit).
    fn rescale(self, to: Iv, t: u128, now: u128) -> u128 {
        let (from_now, to_now) = (now * self.den, now * to.den);
        if t <= from_now {
            to_now
        } else {
            to_now + ((t - from_now) * to.num).div_ceil(self.num)
        }
    }
}

type Outcome = Option<(Result<(), AcquireError>, u128)>;

/// The bucket limiters the model describes.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Which {
    Token,
    Funnel,
    Leaky,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Kind {
    Acquire,
    Timeout,
    Reserve,
}

#[derive(Debug)]
struct Entry {
    req: usize,
    n: u32,
    end: u128,
    held: bool,
    deadline: Option<u128>,
}

/// The bucket as documented: a GCRA `tat` in scaled units, a FIFO queue of
/// reservations (pending, or granted and held), `set_rate` rescaling the
/// water still undrained, a withdrawal giving back the undrained part and
/// moving everyone behind up by it, waiters released on the first tick at
/// or after their turn (or at once by the change that made them due).
struct Model {
    iv: Iv,
    /// The leaky bucket's shaper: no burst, overflow refused.
    shaper: bool,
    tat: u128,
    closed: bool,
    queue: Vec<Entry>,
    kinds: Vec<(Kind, u32)>,
    outcomes: Vec<Outcome>,
    /// Dropped by the driver (their task's outcome is not recorded).
    dropped: Vec<bool>,
    granted: u64,
    refused: u64,
    tries: Vec<Result<(), TryAcquireError>>,
}

impl Model {
    fn new(iv: Iv, shaper: bool) -> Model {
        Model {
            iv,
            shaper,
            tat: 0,
            closed: false,
            queue: vec![],
            kinds: vec![],
            outcomes: vec![],
            dropped: vec![],
            granted: 0,
            refused: 0,
            tries: vec![],
        }
    }

    /// Grants the prefix of pending entries due at `now` ns.
    fn release(&mut self, now: u128) {
        let mut i = 0;
        while i < self.queue.len() {
            let e = &self.queue[i];
            if e.held {
                i += 1;
                continue;
            }
            if self.iv.ready(e.end, e.n, self.shaper).div_ceil(self.iv.den) > now {
                break;
            }
            let (req, n) = (e.req, e.n);
            self.outcomes[req] = Some((Ok(()), now));
            if self.kinds[req].0 == Kind::Reserve {
                self.queue[i].held = true;
                i += 1;
            } else {
                self.granted += u64::from(n);
                self.queue.remove(i);
            }
        }
    }

    /// Withdraws the entry at `idx`; returns whether anything was given
    /// back (only then are the ones now due granted at once).
    fn withdraw(&mut self, idx: usize, now: u128) -> bool {
        let e = self.queue.remove(idx);
        let refund = self
            .iv
            .cost(e.n)
            .min(e.end.saturating_sub(now * self.iv.den));
        for later in &mut self.queue[idx..] {
            later.end -= refund;
        }
        self.tat = self.tat.saturating_sub(refund);
        refund > 0
    }

    /// A tick at `now` ns: releases, then the timeout due now (if its
    /// waiter is still pending), then what that freed.
    fn tick(&mut self, now: u128) {
        self.release(now);
        if let Some(idx) = self
            .queue
            .iter()
            .position(|e| !e.held && e.deadline == Some(now))
        {
            let req = self.queue[idx].req;
            let moved = self.withdraw(idx, now);
            self.outcomes[req] = Some((Err(AcquireError::Timeout), now));
            self.refused += 1;
            if moved {
                self.release(now);
            }
        }
    }

    fn arrive(&mut self, kind: Kind, n: u32, timeout: Option<u128>, now: u128) {
        let req = self.kinds.len();
        self.kinds.push((kind, n));
        self.dropped.push(false);
        self.outcomes.push(None);
        if self.closed {
            self.outcomes[req] = Some((Err(AcquireError::Closed), now));
            return;
        }
        let iv = self.iv;
        let scaled = now * iv.den;
        let end = self.tat.max(scaled) + iv.cost(n);
        if self.shaper && end - scaled > iv.tau() {
            self.outcomes[req] = Some((Err(AcquireError::Overflow), now));
            self.refused += 1;
            return;
        }
        let ready = iv.ready(end, n, self.shaper);
        if let Some(t) = timeout {
            if ready > scaled && (ready - scaled).div_ceil(iv.den) > t {
                self.outcomes[req] = Some((Err(AcquireError::Timeout), now));
                self.refused += 1;
                return;
            }
        }
        self.tat = end;
        let ready = ready <= scaled;
        if ready {
            self.outcomes[req] = Some((Ok(()), now));
            if kind != Kind::Reserve {
                self.granted += u64::from(n);
                return;
            }
        }
        self.queue.push(Entry {
            req,
            n,
            end,
            held: ready,
            deadline: timeout.map(|t| now + t),
        });
        // A new waiter's turn is after the ones ahead: nothing is granted
        // (ones ahead due since the last tick wait for the next).
    }

    fn event(&mut self, op: Op, now: u128) {
        match op {
            Op::Acquire(n) => self.arrive(Kind::Acquire, n, None, now),
            Op::Timeout(n, t) => {
                self.arrive(
                    Kind::Timeout,
                    n,
                    Some(u128::from(t) * 1_000_000 + 300_000),
                    now,
                );
            }
            Op::Reserve(n) => self.arrive(Kind::Reserve, n, None, now),
            Op::Drop(i) if !self.kinds.is_empty() => {
                let req = i % self.kinds.len();
                if let Some(idx) = self.queue.iter().position(|e| e.req == req) {
                    if !self.queue[idx].held {
                        self.dropped[req] = true;
                    }
                    if self.withdraw(idx, now) {
                        self.release(now);
                    }
                }
            }
            Op::Commit(i) if !self.kinds.is_empty() => {
                let req = i % self.kinds.len();
                if let Some(idx) = self.queue.iter().position(|e| e.req == req && e.held) {
                    self.granted += u64::from(self.queue.remove(idx).n);
                }
            }
            Op::SetRate(r) => {
                let new = Iv::of(RATES[r], u32::try_from(self.iv.cap).unwrap());
                self.tat = self.iv.rescale(new, self.tat, now);
                for e in &mut self.queue {
                    e.end = self.iv.rescale(new, e.end, now);
                }
                self.iv = new;
                self.release(now);
            }
            Op::Try(n) => {
                let iv = self.iv;
                let answer = if self.closed {
                    Err(TryAcquireError::Closed)
                } else if u128::from(n) > iv.cap {
                    self.refused += 1;
                    Err(TryAcquireError::InsufficientCapacity)
                } else {
                    let scaled = now * iv.den;
                    let end = self.tat.max(scaled) + iv.cost(n);
                    if end - scaled <= iv.tau() {
                        self.tat = end;
                        self.granted += u64::from(n);
                        Ok(())
                    } else {
                        self.refused += 1;
                        Err(TryAcquireError::Limited {
                            retry_after: Duration::from_nanos(
                                u64::try_from((end - scaled - iv.tau()).div_ceil(iv.den)).unwrap(),
                            ),
                        })
                    }
                };
                self.tries.push(answer);
            }
            Op::Close => {
                self.closed = true;
                let mut kept = vec![];
                for e in self.queue.drain(..) {
                    if e.held {
                        kept.push(e);
                    } else {
                        self.outcomes[e.req] = Some((Err(AcquireError::Closed), now));
                    }
                }
                self.queue = kept;
            }
            Op::Drop(_) | Op::Commit(_) => {}
        }
    }

    fn idle(&self) -> bool {
        self.queue.iter().all(|e| e.held)
    }
}

/// One request of the real run: its outcome (written by its task), its
/// task, and the reservation it holds.
struct Real {
    op: Op,
    /// When it was made, ns since the start.
    made: u128,
    outcome: Arc<Mutex<Outcome>>,
    handle: tokio::task::JoinHandle<()>,
    held: Arc<Mutex<Option<Reservation>>>,
}

impl Real {
    /// Makes the request `op` (an acquire, a timeout or a reserve) in a task
    /// of its own, which records its outcome and keeps its reservation.
    fn spawn(limiter: &Arc<dyn Limiter>, op: Op, start: Instant) -> Real {
        let outcome = Arc::new(Mutex::new(None));
        let held = Arc::new(Mutex::new(None));
        let (limiter, write, keep) = (limiter.clone(), outcome.clone(), held.clone());
        let handle = tokio::spawn(async move {
            let result = match op {
                Op::Acquire(n) => limiter.acquire_many(n).await,
                Op::Timeout(n, t) => {
                    let timeout = Duration::from_millis(t) + Duration::from_micros(300);
                    limiter.acquire_timeout(n, timeout).await
                }
                Op::Reserve(n) => limiter.reserve(n).await.map(|r| {
                    *keep.lock().unwrap() = Some(r);
                }),
                _ => unreachable!("not a request"),
            };
            *write.lock().unwrap() = Some((result, start.elapsed().as_nanos()));
        });
        Real {
            op,
            made: start.elapsed().as_nanos(),
            outcome,
            handle,
            held,
        }
    }

    fn outcome(&self) -> Outcome {
        *self.outcome.lock().unwrap()
    }

    /// Drops it: its reservation if it holds one, else its task (a no-op
    /// once the task is done).
    fn drop_it(&self) {
        let held = self.held.lock().unwrap().take();
        if held.is_none() {
            self.handle.abort();
        }
        drop(held);
    }

    /// Commits its reservation, if it holds one: its permits.
    fn commit(&self) -> Option<u32> {
        let held = self.held.lock().unwrap().take()?;
        held.commit();
        match self.op {
            Op::Reserve(n) => Some(n),
            _ => None,
        }
    }
}

/// A bucket limiter behind the trait, with its own `set_rate` and `close`.
struct Under {
    limiter: Arc<dyn Limiter>,
    set_rate: Box<dyn Fn(Rate)>,
    close: Box<dyn Fn()>,
}

impl Under {
    fn new<L: Limiter + Clone + 'static>(
        limiter: &L,
        set_rate: fn(&L, Rate),
        close: fn(&L),
    ) -> Under {
        let (for_rate, for_close) = (limiter.clone(), limiter.clone());
        Under {
            limiter: Arc::new(limiter.clone()),
            set_rate: Box::new(move |rate| set_rate(&for_rate, rate)),
            close: Box::new(move || close(&for_close)),
        }
    }

    fn build(which: Which, rate: Rate, capacity: u32) -> Under {
        match which {
            Which::Token => Under::new(
                &token(rate, capacity, capacity),
                |l, r| l.set_rate(r).unwrap(),
                TokenBucket::close,
            ),
            Which::Funnel => Under::new(
                &Funnel::builder()
                    .rate(rate)
                    .capacity(capacity)
                    .build()
                    .unwrap(),
                |l, r| l.set_rate(r).unwrap(),
                Funnel::close,
            ),
            Which::Leaky => Under::new(
                &LeakyBucket::builder()
                    .rate(rate)
                    .capacity(capacity)
                    .build()
                    .unwrap(),
                |l, r| l.set_rate(r).unwrap(),
                LeakyBucket::close,
            ),
        }
    }
}

const MS_NS: u128 = 1_000_000;

/// Runs `ops` (one at `k ms + 700 µs` for each `(k, op)`) on a bucket of
/// `capacity`, at `RATES[rate]` (a token bucket starts full), then until
/// every waiter is done; checks every outcome at every event and tick,
/// every meter answer, the stats, and the state after, against [`Model`].
async fn run_model(which: Which, rate: usize, capacity: u32, ops: &[(u64, Op)]) {
    let under = Under::build(which, RATES[rate], capacity);
    let limiter = &under.limiter;
    let mut model = Model::new(Iv::of(RATES[rate], capacity), which == Which::Leaky);
    let start = Instant::now();
    let mut real: Vec<Real> = vec![];
    let mut tries = vec![];
    let mut next = ops.iter().peekable();
    support::settle().await;
    model.tick(0);
    for k in 0u64.. {
        let tick = u128::from(k) * MS_NS;
        assert_eq!(start.elapsed().as_nanos(), tick);
        if next.peek().is_none() && model.idle() {
            break;
        }
        assert!(k < 60_000, "still waiting after a minute");
        time::advance(Duration::from_micros(700)).await;
        let now = tick + 700_000;
        while let Some(&&(at, op)) = next.peek() {
            if at > k {
                break;
            }
            next.next();
            match op {
                Op::Acquire(_) | Op::Timeout(..) | Op::Reserve(_) => {
                    real.push(Real::spawn(limiter, op, start));
                }
                Op::Drop(i) if !real.is_empty() => real[i % real.len()].drop_it(),
                Op::Commit(i) if !real.is_empty() => {
                    real[i % real.len()].commit();
                }
                Op::SetRate(r) => (under.set_rate)(RATES[r]),
                Op::Try(n) => tries.push(limiter.try_acquire_many(n)),
                Op::Close => (under.close)(),
                Op::Drop(_) | Op::Commit(_) => {}
            }
            support::settle().await;
            model.event(op, now);
            for (i, r) in real.iter().enumerate() {
                assert_eq!(
                    r.outcome(),
                    model.outcomes[i],
                    "request {i} after {op:?} at {now} ns"
                );
            }
        }
        time::advance(Duration::from_micros(300)).await;
        support::settle().await;
        let tick = tick + MS_NS;
        model.tick(tick);
        for (i, r) in real.iter().enumerate() {
            if !model.dropped[i] {
                assert_eq!(
                    r.outcome(),
                    model.outcomes[i],
                    "request {i} at the {tick} ns tick"
                );
            }
        }
    }
    assert_eq!(tries, model.tries, "meter answers");
    let stats = limiter.stats();
    assert_eq!(
        (stats.granted, stats.refused, stats.waiting),
        (model.granted, model.refused, 0),
        "stats"
    );
    // Afterwards the bucket is where the model says: a meter asking for
    // the whole capacity gets the exact answer.
    let mut after = Model {
        tries: vec![],
        ..model
    };
    after.event(Op::Try(capacity), start.elapsed().as_nanos());
    assert_eq!(
        limiter.try_acquire_many(capacity),
        after.tries[0],
        "the state after"
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Random interleavings of waiters, timeouts, reservations (committed
    /// or dropped), drops, rate changes (3/s, 7/s, fractional intervals),
    /// meter calls and a close, on a token bucket, a funnel (waiters on
    /// their own timers) and a leaky bucket's shaper: every outcome at its
    /// exact instant, every meter answer, and the stats, as the model says.
    #[test]
    fn the_buckets_meet_everything_as_the_model_says(
        rate in 0..RATES.len(),
        capacity in 1u32..=4,
        ops in prop::collection::vec((0u64..3, op()), 1..24),
    ) {
        // Events at distinct milliseconds, increasing; timeouts at distinct
        // deadlines.
        let mut at = 0;
        let mut deadlines = std::collections::HashSet::new();
        let ops: Vec<(u64, Op)> = ops
            .into_iter()
            .map(|(gap, op)| {
                at += gap * 20 + 1;
                let op = match op {
                    Op::Timeout(n, t) if !deadlines.insert(at + t + 1) => Op::Acquire(n.min(capacity)),
                    Op::Acquire(n) | Op::Timeout(n, _) | Op::Reserve(n) | Op::Try(n) => {
                        let n = n.min(capacity);
                        match op {
                            Op::Acquire(_) => Op::Acquire(n),
                            Op::Timeout(_, t) => Op::Timeout(n, t),
                            Op::Reserve(_) => Op::Reserve(n),
                            _ => Op::Try(n),
                        }
                    }
                    op => op,
                };
                (at, op)
            })
            .collect();
        for which in [Which::Token, Which::Funnel, Which::Leaky] {
            support::run(run_model(which, rate, capacity, &ops));
        }
    }
}

// ---------------------------------------------------------------------------
// Property: random interleavings on a two-band quota, against invariants
// ---------------------------------------------------------------------------

/// The bands the two-band property draws from: (rate, capacity).
const BANDS: [(Rate, u32); 6] = [
    (Rate::every(Duration::from_millis(10)), 3),
    (Rate::per_second(70), 2),
    (Rate::per(3, Duration::from_millis(50)), 4),
    (Rate::every(Duration::from_millis(100)), 6),
    (Rate::per_second(7), 3),
    (Rate::per(7, Duration::from_secs(1)), 10),
];

/// Every band's window bound over the grants `(instant ns, permits)`:
/// in any window `[a, b]` of grant instants, at most `capacity + rate ×
/// (b − a + 1 ms)` permits (waiters are released on 1 ms ticks).
fn assert_band_bound(grants: &[(u128, u32)], bands: &[(Rate, u32)]) {
    let mut grants = grants.to_vec();
    grants.sort_unstable();
    for &(rate, cap) in bands {
        let iv = Iv::of(rate, cap);
        for i in 0..grants.len() {
            let mut sum = 0u128;
            for j in i..grants.len() {
                sum += u128::from(grants[j].1);
                let window = grants[j].0 - grants[i].0 + MS_NS;
                // (sum − cap) permits take (sum − cap) × num scaled units.
                assert!(
                    sum <= iv.cap || (sum - iv.cap) * iv.num <= window * iv.den,
                    "band {rate:?} cap {cap}: {sum} permits in [{}, {}] ns; grants {grants:?}",
                    grants[i].0,
                    grants[j].0,
                );
            }
        }
    }
}

/// Runs `ops` (each at `k ms + 700 µs`, as [`run_model`]) on a token
/// bucket of two bands, and checks: every band's window bound over every
/// grant (waiters at the instant they were released, reservations that
/// were committed, meter grants); waiters released in arrival order; a
/// timed-out waiter answered on its deadline; the stats; and, once
/// everything is over, that the bucket fills up again (nothing held
/// forever).
#[expect(clippy::too_many_lines, reason = "one driver loop and its checks")]
async fn run_bands(bands: [(Rate, u32); 2], ops: &[(u64, Op)]) {
    let quota = Quota::new(bands[0].0, bands[0].1).and(bands[1].0, bands[1].1);
    let bucket = TokenBucket::builder().quota(quota).build().unwrap();
    let limiter: Arc<dyn Limiter> = Arc::new(bucket.clone());
    let start = Instant::now();
    let mut real: Vec<Real> = vec![];
    // Granted permits by instant, and the counts the stats must show.
    let mut grants: Vec<(u128, u32)> = vec![];
    let (mut granted, mut refused) = (0u64, 0u64);
    let mut closed = false;
    let mut next = ops.iter().peekable();
    for k in 0u64.. {
        support::settle().await;
        let done = real
            .iter()
            .all(|r| r.handle.is_finished() || r.held.lock().unwrap().is_some());
        if next.peek().is_none() && done {
            break;
        }
        assert!(k < 100_000, "still waiting after 100 s");
        time::advance(Duration::from_micros(700)).await;
        let now = start.elapsed().as_nanos();
        while let Some(&&(at, op)) = next.peek() {
            if at > k {
                break;
            }
            next.next();
            match op {
                Op::Acquire(_) | Op::Timeout(..) | Op::Reserve(_) => {
                    real.push(Real::spawn(&limiter, op, start));
                }
                Op::Drop(i) if !real.is_empty() => real[i % real.len()].drop_it(),
                Op::Commit(i) if !real.is_empty() => {
                    let r = &real[i % real.len()];
                    if let Some(n) = r.commit() {
                        let (_, at) = r.outcome().unwrap();
                        grants.push((at, n));
                        granted += u64::from(n);
                    }
                }
                Op::Try(n) => match bucket.try_acquire_many(n) {
                    Ok(()) => {
                        grants.push((now, n));
                        granted += u64::from(n);
                    }
                    Err(TryAcquireError::Limited { retry_after }) => {
                        assert!(!retry_after.is_zero());
                        refused += 1;
                    }
                    Err(TryAcquireError::Closed) => assert!(closed),
                    Err(e) => panic!("{e:?}"),
                },
                Op::Close => {
                    bucket.close();
                    closed = true;
                }
                Op::SetRate(_) | Op::Drop(_) | Op::Commit(_) => {}
            }
            support::settle().await;
        }
        time::advance(Duration::from_micros(300)).await;
    }
    // The waiters: released in arrival order; timeouts on their deadline.
    let mut last = 0;
    for r in &real {
        match (r.op, r.outcome()) {
            (Op::Acquire(n) | Op::Timeout(n, _) | Op::Reserve(n), Some((Ok(()), at))) => {
                assert!(
                    at >= last,
                    "{:?} made at {} released at {at}, before {last}",
                    r.op,
                    r.made
                );
                last = at;
                if !matches!(r.op, Op::Reserve(_)) {
                    grants.push((at, n));
                    granted += u64::from(n);
                }
            }
            (Op::Timeout(_, t), Some((Err(AcquireError::Timeout), at))) => {
                let deadline = r.made + u128::from(t) * MS_NS + 300_000;
                assert!(
                    at == r.made || at == deadline,
                    "{:?} made at {} timed out at {at}",
                    r.op,
                    r.made
                );
                refused += 1;
            }
            (_, Some((Err(AcquireError::Closed), _))) => assert!(closed),
            (_, None) => {} // dropped while waiting
            (op, outcome) => panic!("{op:?}: {outcome:?}"),
        }
    }
    assert_band_bound(&grants, &bands);
    let stats = bucket.stats();
    assert_eq!(
        (stats.granted, stats.refused, stats.waiting),
        (granted, refused, 0),
        "stats"
    );
    // Nothing is held forever: once every band has had time to refill,
    // the whole capacity is there again.
    for r in &real {
        drop(r.held.lock().unwrap().take());
    }
    if !closed {
        time::advance(Duration::from_secs(3600)).await;
        assert_eq!(bucket.available(), bucket.capacity());
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1000))]

    /// Random interleavings of waiters, timeouts, reservations, drops,
    /// meter calls and a close on a token bucket of two bands: no band
    /// ever over-admits, waiters go in arrival order, the stats add up.
    #[test]
    fn a_two_band_quota_meets_everything_within_every_band(
        fast in 0..BANDS.len(),
        slow in 0..BANDS.len(),
        ops in prop::collection::vec((0u64..3, op()), 1..24),
    ) {
        let bands = [BANDS[fast], BANDS[slow]];
        let capacity = bands[0].1.min(bands[1].1);
        let mut at = 0;
        let mut deadlines = std::collections::HashSet::new();
        let ops: Vec<(u64, Op)> = ops
            .into_iter()
            .map(|(gap, op)| {
                at += gap * 20 + 1;
                let op = match op {
                    Op::Timeout(n, t) if !deadlines.insert(at + t + 1) => Op::Acquire(n.min(capacity)),
                    Op::Acquire(n) => Op::Acquire(n.min(capacity)),
                    Op::Timeout(n, t) => Op::Timeout(n.min(capacity), t),
                    Op::Reserve(n) => Op::Reserve(n.min(capacity)),
                    Op::Try(n) => Op::Try(n.min(capacity)),
                    op => op,
                };
                (at, op)
            })
            .collect();
        support::run(run_bands(bands, &ops));
    }
}

// ---------------------------------------------------------------------------
// A change to the same rate changes nothing
// ---------------------------------------------------------------------------

/// How many `acquire`s a caller gets at once, at 1 ms, right after its
/// waiter was released late by the 1 ms timer: 100 000/s, capacity 1; a
/// permit at 0, a waiter due at 10 µs released on the 1 ms tick; `between`
/// runs after the release and before the caller comes back for more.
async fn burst_after_a_late_release(b: &TokenBucket, between: impl FnOnce()) -> usize {
    let start = Instant::now();
    b.acquire().await.unwrap();
    let mut w = task::spawn(b.acquire());
    assert_pending!(w.poll());
    advance_to(start, ms(1)).await;
    assert_ready_eq!(w.poll(), Ok(()));
    between();
    let mut at_once = 0;
    loop {
        let mut next = task::spawn(b.acquire());
        if next.poll().is_pending() {
            break;
        }
        at_once += 1;
    }
    at_once
}

/// The permits that fell due while the waiter overslept (10 µs to 1 ms:
/// 99 of them) are credited to its caller when it comes straight back
/// ("Permits that fall due while a waiter oversleeps the 1 ms timer are
/// credited", README): 99 at once. A `set_rate` to the rate the bucket
/// already has, in between, must not change that (same tokens, same
/// schedule). Observed: the caller gets 1, and the 98 are lost for good:
/// `Cell::set_params` clears the credit and rescales the idle `tat` up to
/// now whatever the rate, and `Cell::arrival` needs both.
#[tokio::test(start_paused = true)]
async fn a_set_rate_to_the_same_rate_keeps_the_timer_credit() {
    let rate = Rate::per_second(100_000);
    let unchanged = burst_after_a_late_release(&token(rate, 1, 1), || {}).await;
    assert_eq!(unchanged, 99);
    let b = token(rate, 1, 1);
    let same = burst_after_a_late_release(&b, || b.set_rate(rate).unwrap()).await;
    assert_eq!(
        same, unchanged,
        "a set_rate to the same rate lost the credit"
    );
}
