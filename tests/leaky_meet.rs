//! The leaky bucket as a shaper (a FIFO queue drained at a fixed rate)
//! meeting the crate's other features: cancellation, timeouts,
//! reservations, the meter, `set_rate`, quotas of two bands, the tower
//! middleware and streams. Every instant is exact (paused clock).

#![expect(
    clippy::many_single_char_names,
    clippy::too_many_lines,
    reason = "the models name the bucket `b`, the model `m`, the tick `t`, as the other test \
              files do; their drivers are long loops"
)]

use std::time::Duration;

use futures::StreamExt;
use proptest::prelude::*;
use tokio::time::{self, Instant};
use tokio_ratelimit::stream::RateLimitStreamExt;
use tokio_ratelimit::{AcquireError, LeakyBucket, Quota, Rate, TryAcquireError};
use tokio_test::{assert_pending, assert_ready_eq, task};

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn leaky(rate: Rate, capacity: u32) -> LeakyBucket {
    LeakyBucket::builder()
        .rate(rate)
        .capacity(capacity)
        .build()
        .unwrap()
}

fn limited(retry_after: Duration) -> Result<(), TryAcquireError> {
    Err(TryAcquireError::Limited { retry_after })
}

// ---------------------------------------------------------------------------
// Two bands: the overflow rule.

/// A quota of 10/s (capacity 10) and 1/s (capacity 10). After one shaped
/// request the bucket holds one unit of water in each band: nine more
/// fit. The second shaped request waits for the 1/s band's water ahead
/// (1 s) and must be queued, not refused: `Overflow` is documented only
/// "when the bucket has no room for `n` units now", and the meter at the
/// same instant says there is room (it grants).
#[tokio::test(start_paused = true)]
#[ignore = "known, documented on LeakyBucketBuilder::quota (leaky review finding 1): two bands, a shaped request with room overflows (water poured at the turn)"]
async fn two_bands_a_shaped_request_with_room_is_queued_not_overflowed() {
    let quota = Quota::new(Rate::per_second(10), 10).and(Rate::per_second(1), 10);
    let b = LeakyBucket::builder().quota(quota).build().unwrap();
    let start = Instant::now();
    b.acquire().await.unwrap(); // into an idle bucket: at once
    assert_eq!(b.level(), 1);
    // The meter agrees there is room for one more.
    assert_eq!(b.peek(1).answer(), Ok(()));
    let mut second = task::spawn(b.acquire());
    assert_pending!(second.poll(), "room for 9 more: queued behind 1 s of water");
    time::advance(ms(999)).await;
    assert_pending!(second.poll());
    time::advance(ms(1)).await;
    assert_ready_eq!(second.poll(), Ok(()));
    assert_eq!(start.elapsed(), ms(1000));
}

/// The same quota as a per-second band and a per-minute one: the second
/// shaped request is refused with `Overflow` although `level()` is 1 of
/// 20 and `try_acquire` at the same instant is granted.
#[tokio::test(start_paused = true)]
#[ignore = "known, documented on LeakyBucketBuilder::quota (leaky review finding 1): two bands, the shaper overflows while the meter grants"]
async fn two_bands_overflow_agrees_with_the_meter() {
    let quota = Quota::new(Rate::per_second(20), 40).and(Rate::per_minute(10), 60);
    let b = LeakyBucket::builder().quota(quota).build().unwrap();
    b.acquire().await.unwrap();
    let level = b.level();
    let shaped = task::spawn(b.acquire()).poll();
    let shaper_refused = matches!(shaped, std::task::Poll::Ready(Err(AcquireError::Overflow)));
    let meter_granted = b.try_acquire().is_ok();
    assert!(
        !(shaper_refused && meter_granted),
        "the shaper overflowed with level {level} of {} while the meter granted",
        b.capacity()
    );
}

/// The same root seen from `level()` and the meter: 10/s (capacity 5) and
/// 5/s (capacity 5), three shaped requests at 0 ms (out at 0, 200 and
/// 400 ms, the 5/s band setting the pace). Three units of water are in
/// the bucket: `level()` is documented as "Units of water in the bucket
/// now … (including the water of requests still waiting to come out)",
/// so 3, and two more units fit in both bands (3 + 2 <= 5 each).
#[tokio::test(start_paused = true)]
#[ignore = "known, documented on LeakyBucketBuilder::quota (leaky review finding 1): two bands, level() counts the wait as water; the meter refuses room"]
async fn two_bands_level_and_the_meter_count_the_units_queued() {
    let quota = Quota::new(Rate::per_second(10), 5).and(Rate::per_second(5), 5);
    let b = LeakyBucket::builder().quota(quota).build().unwrap();
    let mut waiters: Vec<_> = (0..3).map(|_| task::spawn(b.acquire())).collect();
    assert_ready_eq!(waiters[0].poll(), Ok(()));
    assert_pending!(waiters[1].poll());
    assert_pending!(waiters[2].poll());
    assert_eq!((b.level(), b.stats().available), (3, Some(2)));
    assert_eq!(b.try_acquire_many(2), Ok(()));
}

/// Both bands shape the output: with 10/s (capacity 5) and 5/s (capacity
/// 5), queued requests leave 200 ms apart (the slower band).
#[tokio::test(start_paused = true)]
async fn two_bands_the_slower_band_spaces_the_output() {
    let quota = Quota::new(Rate::per_second(10), 5).and(Rate::per_second(5), 5);
    let b = LeakyBucket::builder().quota(quota).build().unwrap();
    let start = Instant::now();
    let mut waiters: Vec<_> = (0..3).map(|_| Some(task::spawn(b.acquire()))).collect();
    let mut released = vec![];
    for tick in 0..=600u64 {
        if tick > 0 {
            time::advance(ms(1)).await;
        }
        for (i, slot) in waiters.iter_mut().enumerate() {
            if let Some(w) = slot {
                if let std::task::Poll::Ready(r) = w.poll() {
                    assert_eq!(r, Ok(()));
                    released.push((i, start.elapsed()));
                    *slot = None;
                }
            }
        }
    }
    assert_eq!(released, [(0, ms(0)), (1, ms(200)), (2, ms(400))]);
}

// ---------------------------------------------------------------------------
// One band against an exact model of a FIFO queue drained at a fixed rate.

#[derive(Debug, Clone, Copy)]
enum Op {
    /// `acquire_many(n)`.
    Acquire(u32),
    /// `acquire_timeout(n, ms)`.
    Timeout(u32, u64),
    /// `try_acquire_many(n)`, after `peek(n)`.
    Try(u32),
    /// `reserve(n)`, held for `ms` after it is granted, then committed
    /// (`true`) or dropped.
    Reserve(u32, u64, bool),
    /// Drops the `k`-th waiter still pending (modulo their number).
    Cancel(usize),
}

fn op(capacity: u32) -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (1..=capacity).prop_map(Op::Acquire),
        2 => ((1..=capacity), 0u64..300).prop_map(|(n, t)| Op::Timeout(n, t)),
        2 => (1..=capacity).prop_map(Op::Try),
        2 => ((1..=capacity), 0u64..100, any::<bool>()).prop_map(|(n, h, c)| Op::Reserve(n, h, c)),
        2 => (0usize..8).prop_map(Op::Cancel),
    ]
}

/// One request in the model's queue (pending, or a held reservation).
#[derive(Debug, Clone)]
struct Entry {
    /// Index of the request (for its future).
    idx: usize,
    n: u64,
    /// Where its water ends (ms).
    end: u64,
    held: bool,
    /// Reservation: (hold ms, commit).
    reserve: Option<(u64, bool)>,
    /// When it was granted (ms), for a reservation.
    granted: Option<u64>,
}

struct Model {
    interval: u64,
    capacity: u64,
    tat: u64,
    queue: Vec<Entry>,
}

enum Fate {
    Now,
    Queued,
    Refused(AcquireError),
}

impl Model {
    fn water(&self, t: u64) -> u64 {
        self.tat.saturating_sub(t)
    }
    fn shaped(
        &mut self,
        t: u64,
        idx: usize,
        n: u64,
        timeout: Option<u64>,
        reserve: Option<(u64, bool)>,
    ) -> Fate {
        let cost = n * self.interval;
        if self.water(t) + cost > self.capacity * self.interval {
            return Fate::Refused(AcquireError::Overflow);
        }
        let ready = self.tat.max(t);
        if timeout.is_some_and(|to| ready - t > to) {
            return Fate::Refused(AcquireError::Timeout);
        }
        self.tat = ready + cost;
        if ready <= t && reserve.is_none() {
            return Fate::Now;
        }
        self.queue.push(Entry {
            idx,
            n,
            end: self.tat,
            held: false,
            reserve,
            granted: None,
        });
        if ready <= t { Fate::Now } else { Fate::Queued }
    }
    fn try_take(&mut self, t: u64, n: u64) -> Result<(), TryAcquireError> {
        let after = self.water(t) + n * self.interval;
        let tau = self.capacity * self.interval;
        if after > tau {
            return limited(ms(after - tau));
        }
        self.tat = self.tat.max(t) + n * self.interval;
        Ok(())
    }
    /// Withdraws queue entry `pos` at `t`.
    fn withdraw(&mut self, pos: usize, t: u64) {
        let e = self.queue.remove(pos);
        let refund = (e.n * self.interval).min(e.end.saturating_sub(t));
        for later in &mut self.queue[pos..] {
            later.end -= refund;
        }
        self.tat -= refund;
    }
    fn ready(&self, e: &Entry) -> u64 {
        e.end - e.n * self.interval
    }
    /// Entries pending whose turn has not come at `t`.
    fn not_due(&self, t: u64) -> usize {
        self.queue
            .iter()
            .filter(|e| e.granted.is_none() && self.ready(e) > t)
            .count()
    }
}

type Fut = task::Spawn<
    std::pin::Pin<
        Box<
            dyn std::future::Future<
                    Output = Result<Option<tokio_ratelimit::Reservation>, AcquireError>,
                > + Send,
        >,
    >,
>;

/// Runs `ops` (each after `gap` ms) on a bucket and on the model, checking
/// every answer, every release instant, `level`, `waiting` and `peek`.
async fn run_model(interval: u64, capacity: u32, ops: Vec<(u64, Op)>) -> Result<(), TestCaseError> {
    let b = leaky(Rate::every(ms(interval)), capacity);
    let mut m = Model {
        interval,
        capacity: u64::from(capacity),
        tat: 0,
        queue: vec![],
    };
    let start = Instant::now();
    let mut futs: Vec<Option<Fut>> = vec![];
    let mut held: Vec<Option<tokio_ratelimit::Reservation>> = vec![];
    let mut at = 0u64;
    let mut schedule = vec![];
    for (gap, op) in ops {
        at += gap;
        schedule.push((at, op));
    }
    let end = at + u64::from(capacity) * interval + 200;
    let mut next = 0;
    for t in 0..=end {
        if t > 0 {
            time::advance(ms(1)).await;
        }
        prop_assert_eq!(start.elapsed(), ms(t));
        // Releases due now, in the model and in the bucket.
        let poll_all = |futs: &mut Vec<Option<Fut>>,
                        held: &mut Vec<Option<tokio_ratelimit::Reservation>>,
                        m: &mut Model|
         -> Result<(), TestCaseError> {
            for (i, slot) in futs.iter_mut().enumerate() {
                let Some(f) = slot else { continue };
                let polled = f.poll();
                let pos = m.queue.iter().position(|e| e.idx == i);
                let due = pos.map(|p| m.granted_now(p, t));
                match polled {
                    std::task::Poll::Pending => {
                        prop_assert!(
                            due == Some(false),
                            "request {i} pending at {t} ms, model due {due:?}"
                        );
                    }
                    std::task::Poll::Ready(r) => {
                        prop_assert!(
                            due == Some(true),
                            "request {i} released at {t} ms ({r:?}), model due {due:?}"
                        );
                        let p = pos.unwrap();
                        let r =
                            r.map_err(|e| TestCaseError::fail(format!("request {i}: {e:?}")))?;
                        if let Some(res) = r {
                            held[i] = Some(res);
                            m.queue[p].granted = Some(t);
                            m.queue[p].held = true;
                        } else {
                            m.queue.remove(p);
                        }
                        *slot = None;
                    }
                }
            }
            Ok(())
        };
        poll_all(&mut futs, &mut held, &mut m)?;
        // Held reservations whose hold ends now.
        let mut k = 0;
        while k < m.queue.len() {
            let e = m.queue[k].clone();
            if let (Some(g), Some((hold, commit))) = (e.granted, e.reserve) {
                if g + hold == t {
                    let r = held[e.idx].take().unwrap();
                    if commit {
                        r.commit();
                        m.queue.remove(k);
                    } else {
                        drop(r);
                        m.withdraw(k, t);
                    }
                    poll_all(&mut futs, &mut held, &mut m)?;
                    continue;
                }
            }
            k += 1;
        }
        while next < schedule.len() && schedule[next].0 == t {
            let op = schedule[next].1;
            next += 1;
            let idx = futs.len();
            held.push(None);
            match op {
                Op::Acquire(n) | Op::Timeout(n, _) | Op::Reserve(n, _, _) => {
                    let (timeout, reserve) = match op {
                        Op::Timeout(_, to) => (Some(to), None),
                        Op::Reserve(_, h, c) => (None, Some((h, c))),
                        _ => (None, None),
                    };
                    let fut: std::pin::Pin<Box<dyn std::future::Future<Output = _> + Send>> = {
                        let b = b.clone();
                        match op {
                            Op::Reserve(..) => {
                                Box::pin(async move { b.reserve(n).await.map(Some) })
                            }
                            Op::Timeout(_, to) => Box::pin(async move {
                                b.acquire_timeout(n, ms(to)).await.map(|()| None)
                            }),
                            _ => Box::pin(async move { b.acquire_many(n).await.map(|()| None) }),
                        }
                    };
                    let mut f = task::spawn(fut);
                    let got = f.poll();
                    match m.shaped(t, idx, u64::from(n), timeout, reserve) {
                        Fate::Refused(e) => {
                            prop_assert!(
                                matches!(got, std::task::Poll::Ready(Err(ref g)) if *g == e),
                                "{op:?} at {t}: {got:?}, model {e:?}"
                            );
                            futs.push(None);
                        }
                        Fate::Now => {
                            prop_assert!(
                                matches!(got, std::task::Poll::Ready(Ok(_))),
                                "{op:?} at {t}: {got:?}, model at once"
                            );
                            if let std::task::Poll::Ready(Ok(Some(r))) = got {
                                held[idx] = Some(r);
                                let last = m.queue.last_mut().unwrap();
                                last.granted = Some(t);
                                last.held = true;
                            }
                            futs.push(None);
                        }
                        Fate::Queued => {
                            prop_assert!(got.is_pending(), "{op:?} at {t}: {got:?}, model queued");
                            futs.push(Some(f));
                        }
                    }
                }
                Op::Try(n) => {
                    let model = m.clone_try(t, u64::from(n));
                    prop_assert_eq!(b.peek(n).answer(), model, "peek({}) at {}", n, t);
                    prop_assert_eq!(
                        b.try_acquire_many(n),
                        m.try_take(t, u64::from(n)),
                        "try({}) at {}",
                        n,
                        t
                    );
                    futs.push(None);
                }
                Op::Cancel(k) => {
                    futs.push(None);
                    let pending: Vec<usize> =
                        (0..futs.len()).filter(|&i| futs[i].is_some()).collect();
                    if !pending.is_empty() {
                        let i = pending[k % pending.len()];
                        futs[i] = None; // dropped
                        let p = m.queue.iter().position(|e| e.idx == i).unwrap();
                        m.withdraw(p, t);
                        poll_all(&mut futs, &mut held, &mut m)?;
                    }
                }
            }
        }
        let level = m.water(t).div_ceil(interval);
        prop_assert_eq!(u64::from(b.level()), level, "level at {} ms", t);
        prop_assert_eq!(b.waiting(), m.not_due(t), "waiting at {} ms", t);
        prop_assert_eq!(b.stats().waiting, m.not_due(t), "stats.waiting at {} ms", t);
    }
    Ok(())
}

impl Model {
    /// Whether the queue entry at `pos` is granted by `t` (a held one is).
    fn granted_now(&self, pos: usize, t: u64) -> bool {
        let e = &self.queue[pos];
        e.granted.is_some() || self.ready(e) <= t
    }
    fn clone_try(&self, t: u64, n: u64) -> Result<(), TryAcquireError> {
        let after = self.water(t) + n * self.interval;
        let tau = self.capacity * self.interval;
        if after > tau {
            limited(ms(after - tau))
        } else {
            Ok(())
        }
    }
}

fn run_paused<F: std::future::Future<Output = Result<(), TestCaseError>>>(
    f: F,
) -> Result<(), TestCaseError> {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap()
        .block_on(f)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// Random arrivals of shaped requests, timeouts, meter calls,
    /// reservations held then committed or dropped, and cancellations,
    /// against a FIFO queue drained at a fixed rate: every answer, every
    /// release instant (to the millisecond, intervals being whole ones),
    /// `level`, `waiting` and `peek` agree.
    #[test]
    fn the_shaper_is_a_fifo_queue_drained_at_its_rate(
        interval in 1u64..40,
        (capacity, ops) in (1u32..6).prop_flat_map(|c| (Just(c), proptest::collection::vec((0u64..60, op(c)), 1..30))),
    ) {
        run_paused(run_model(interval, capacity, ops))?;
    }
}

// ---------------------------------------------------------------------------
// The meter and requests for room while shaped requests queue.

/// A request for room that fits now but waits behind a shaped waiter
/// (the queue is FIFO) has its room already: a meter's `try_acquire` made
/// after it is decided on the water alone and may be granted while it
/// waits (documented on `acquire_room`; the review that found this read
/// the older docs, "every request made after it (shaped, for room, or a
/// meter's) waits behind it"). The room request is not delayed by it: it
/// goes with the shaped one, at 100 ms.
#[tokio::test(start_paused = true)]
async fn a_meter_may_pass_a_request_for_room_that_has_its_room() {
    let b = leaky(Rate::per_second(10), 10);
    b.acquire().await.unwrap(); // at once: one unit of water
    let mut shaped = task::spawn(b.acquire());
    assert_pending!(shaped.poll()); // due at 100 ms
    let mut room = task::spawn(b.acquire_room(1));
    assert_pending!(room.poll(), "it fits, but waits behind the shaped one");
    assert_eq!(b.try_acquire(), Ok(()), "decided on the water alone");
    assert_pending!(room.poll(), "released in order, behind the shaped one");
    time::advance(ms(100)).await;
    assert_ready_eq!(shaped.poll(), Ok(()));
    assert_ready_eq!(room.poll(), Ok(()));
}

/// `try_acquire` while shaped requests queue neither jumps them nor delays
/// them, and its `retry_after` is exact: 10/s, capacity 4, four shaped
/// requests at 0 ms fill the bucket (one out at once, three queued).
#[tokio::test(start_paused = true)]
async fn the_meter_sees_the_queue_and_its_retry_after_is_exact() {
    let b = leaky(Rate::per_second(10), 4);
    let start = Instant::now();
    b.acquire().await.unwrap();
    let mut queued: Vec<_> = (0..3).map(|_| task::spawn(b.acquire())).collect();
    for q in &mut queued {
        assert_pending!(q.poll());
    }
    assert_eq!(b.level(), 4);
    assert_eq!(b.stats().waiting, 3);
    assert_eq!(b.peek(1).answer(), limited(ms(100)));
    assert_eq!(b.try_acquire(), limited(ms(100)));
    assert_eq!(b.acquire().await, Err(AcquireError::Overflow));
    time::advance(ms(99)).await;
    assert_eq!(b.try_acquire(), limited(ms(1)));
    time::advance(ms(1)).await;
    // The first queued is out; a meter's unit takes the freed room, after
    // all the water queued: it delays nobody.
    assert_ready_eq!(queued[0].poll(), Ok(()));
    assert_eq!(b.try_acquire(), Ok(()));
    assert_eq!(b.try_acquire(), limited(ms(100)));
    for (i, q) in queued.iter_mut().enumerate().skip(1) {
        let at = ms(100 * (i as u64 + 1));
        time::advance(at.checked_sub(start.elapsed() + ms(1)).unwrap()).await;
        assert_pending!(q.poll());
        time::advance(ms(1)).await;
        assert_ready_eq!(q.poll(), Ok(()));
    }
    // The meter's unit was poured behind the queue: a shaped request now
    // (300 ms) waits for it and for the last queued one's water.
    let mut next = task::spawn(b.acquire());
    assert_pending!(next.poll());
    time::advance(ms(199)).await;
    assert_pending!(next.poll());
    time::advance(ms(1)).await;
    assert_ready_eq!(next.poll(), Ok(()));
    assert_eq!(start.elapsed(), ms(500));
}

// ---------------------------------------------------------------------------
// Cancellation, timeouts and reservations inside a full queue.

/// A full queue (capacity 4 at 10/s): the second of three queued requests
/// is dropped at 50 ms. The third moves up by exactly one interval, the
/// freed room is usable at once (by the meter or the shaper), and a
/// shaped request that now fits takes the last place.
#[tokio::test(start_paused = true)]
async fn a_dropped_waiter_moves_the_ones_behind_up_and_frees_its_room_at_once() {
    let b = leaky(Rate::per_second(10), 4);
    let start = Instant::now();
    b.acquire().await.unwrap();
    let mut q1 = task::spawn(b.acquire()); // 100 ms
    let q2 = task::spawn(b.acquire()); // 200 ms
    let mut q3 = task::spawn(b.acquire()); // 300 ms
    let mut q2 = q2;
    assert_pending!(q1.poll());
    assert_pending!(q2.poll());
    assert_pending!(q3.poll());
    time::advance(ms(50)).await;
    assert_eq!(b.acquire().await, Err(AcquireError::Overflow)); // full: 3.5 units
    drop(q2);
    assert_eq!(b.level(), 3); // 2.5 units
    assert_eq!(b.stats().waiting, 2);
    let mut q4 = task::spawn(b.acquire());
    assert_pending!(q4.poll()); // fits: 3.5 units, out at 300 ms
    assert_eq!(b.peek(1).answer(), limited(ms(50)));
    time::advance(ms(50)).await;
    assert_ready_eq!(q1.poll(), Ok(()));
    time::advance(ms(99)).await;
    assert_pending!(q3.poll());
    time::advance(ms(1)).await;
    assert_ready_eq!(q3.poll(), Ok(()));
    assert_eq!(start.elapsed(), ms(200));
    assert_pending!(q4.poll());
    time::advance(ms(100)).await;
    assert_ready_eq!(q4.poll(), Ok(()));
}

/// `acquire_timeout` whose turn is beyond its timeout: `Timeout` at once,
/// nothing poured; one that would overflow: `Overflow` (the bucket has no
/// room, whatever the timeout); one whose turn is exactly its timeout
/// waits and goes.
#[tokio::test(start_paused = true)]
async fn timeouts_in_a_queue_take_no_room() {
    let b = leaky(Rate::per_second(10), 3);
    b.acquire().await.unwrap();
    let mut q1 = task::spawn(b.acquire());
    assert_pending!(q1.poll()); // 100 ms; water 2
    assert_eq!(
        b.acquire_timeout(1, ms(199)).await,
        Err(AcquireError::Timeout)
    );
    assert_eq!(b.level(), 2);
    assert_eq!(b.stats().refused, 1);
    let mut q2 = task::spawn(b.acquire_timeout(1, ms(200)));
    assert_pending!(q2.poll()); // exactly 200 ms: full now
    assert_eq!(
        b.acquire_timeout(1, Duration::MAX).await,
        Err(AcquireError::Overflow)
    );
    assert_eq!(
        b.acquire_timeout(1, ms(0)).await,
        Err(AcquireError::Overflow)
    );
    time::advance(ms(100)).await;
    assert_ready_eq!(q1.poll(), Ok(()));
    time::advance(ms(100)).await;
    assert_ready_eq!(q2.poll(), Ok(()));
    assert_eq!(b.stats().granted, 3);
}

/// A reservation held at the head of the queue, then dropped part way
/// through its water: the one behind moves up by the undrained part only,
/// and comes out at once if that is its turn; one committed keeps the
/// next one's turn.
#[tokio::test(start_paused = true)]
async fn a_held_reservation_dropped_or_committed_in_a_queue() {
    let b = leaky(Rate::per_second(10), 4);
    let start = Instant::now();
    let held = b.reserve(2).await.unwrap(); // at once, water to 200 ms
    let mut behind = task::spawn(b.acquire()); // 200 ms
    assert_pending!(behind.poll());
    let mut last = task::spawn(b.acquire()); // 300 ms
    assert_pending!(last.poll());
    time::advance(ms(150)).await;
    drop(held); // 50 ms undrained: the one behind is due now
    assert_ready_eq!(behind.poll(), Ok(()));
    assert_eq!(start.elapsed(), ms(150));
    time::advance(ms(99)).await;
    assert_pending!(last.poll());
    time::advance(ms(1)).await;
    assert_ready_eq!(last.poll(), Ok(()));
    // Committed: the water stays, the next waits for it. At 250 ms one
    // unit is in (the last one's): 3 more fit, out when it has drained.
    let held = b.reserve(3).await.unwrap();
    assert_eq!(start.elapsed(), ms(350));
    held.commit();
    let mut next = task::spawn(b.acquire());
    assert_pending!(next.poll());
    time::advance(ms(299)).await;
    assert_pending!(next.poll());
    time::advance(ms(1)).await;
    assert_ready_eq!(next.poll(), Ok(()));
}

// ---------------------------------------------------------------------------
// `set_rate` and `close` with a full queue.

/// 10/s, capacity 5, five requests at 0 ms (one out at once, four queued
/// at 100 … 400 ms). At 150 ms (the first queued is out, 3.5 units of
/// water) the rate halves: the water ahead of each drains at 5/s from then
/// on, so they come out at 250, 450, 650 ms, still 200 ms apart, and a
/// fifth (4.5 units: it fits) at 850 ms. At 450 ms the rate goes to 20/s:
/// the rest at 500 and 550 ms — none early, none lost, none bunched.
#[tokio::test(start_paused = true)]
async fn set_rate_with_a_full_queue_moves_every_turn() {
    let b = leaky(Rate::per_second(10), 5);
    let start = Instant::now();
    b.acquire().await.unwrap();
    let mut queued: Vec<_> = (0..4).map(|_| Some(task::spawn(b.acquire()))).collect();
    for q in queued.iter_mut().flatten() {
        assert_pending!(q.poll());
    }
    assert_eq!(b.acquire().await, Err(AcquireError::Overflow));
    let mut released = vec![];
    for t in 1..=1000u64 {
        time::advance(ms(1)).await;
        if t == 150 {
            b.set_rate(Rate::per_second(5)).unwrap();
            assert_eq!(b.level(), 4); // 3.5 units
            assert_eq!(b.try_acquire_many(2), limited(ms(100)));
            let mut fifth = task::spawn(b.acquire());
            assert_pending!(fifth.poll());
            queued.push(Some(fifth));
            assert_eq!(b.acquire().await, Err(AcquireError::Overflow));
        }
        if t == 450 {
            b.set_rate(Rate::per_second(20)).unwrap();
        }
        for (i, slot) in queued.iter_mut().enumerate() {
            if let Some(q) = slot {
                if let std::task::Poll::Ready(r) = q.poll() {
                    assert_eq!(r, Ok(()));
                    released.push((i, start.elapsed()));
                    *slot = None;
                }
            }
        }
    }
    assert_eq!(
        released,
        [
            (0, ms(100)),
            (1, ms(250)),
            (2, ms(450)),
            (3, ms(500)),
            (4, ms(550))
        ]
    );
    assert_eq!(b.level(), 0);
}

/// `close()` with a full queue and a held reservation: every queued one
/// fails at once, the held one can still be committed, and nothing later
/// passes.
#[tokio::test(start_paused = true)]
async fn close_with_a_full_queue() {
    let b = leaky(Rate::per_second(10), 3);
    let held = b.reserve(1).await.unwrap();
    let mut queued: Vec<_> = (0..2).map(|_| task::spawn(b.acquire())).collect();
    for q in &mut queued {
        assert_pending!(q.poll());
    }
    b.close();
    for q in &mut queued {
        assert_ready_eq!(q.poll(), Err(AcquireError::Closed));
    }
    held.commit();
    assert_eq!(b.acquire().await, Err(AcquireError::Closed));
    assert_eq!(b.try_acquire(), Err(TryAcquireError::Closed));
    assert_eq!(b.waiting(), 0);
}

// ---------------------------------------------------------------------------
// Two bands: invariants over random arrivals.

#[derive(Debug, Clone, Copy)]
enum BandOp {
    Acquire(u32),
    Try(u32),
    Cancel(usize),
}

type BandFut = task::Spawn<
    std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), AcquireError>> + Send>>,
>;

fn band_op(capacity: u32) -> impl Strategy<Value = BandOp> {
    prop_oneof![
        5 => (1..=capacity).prop_map(BandOp::Acquire),
        2 => (1..=capacity).prop_map(BandOp::Try),
        2 => (0usize..8).prop_map(BandOp::Cancel),
    ]
}

fn poll_bands(
    futs: &mut [Option<(u32, BandFut)>],
    released: &mut Vec<(usize, u32, u64)>,
    grants: &mut Vec<(u32, u64)>,
    t: u64,
) -> Result<(), TestCaseError> {
    for (i, slot) in futs.iter_mut().enumerate() {
        if let Some((n, f)) = slot {
            if let std::task::Poll::Ready(r) = f.poll() {
                prop_assert_eq!(r, Ok(()), "request {} at {} ms", i, t);
                released.push((i, *n, t));
                grants.push((*n, t));
                *slot = None;
            }
        }
    }
    Ok(())
}

/// Shaped requests, meter calls and cancellations on a quota of two bands
/// (intervals of whole milliseconds): shaped requests come out in arrival
/// order, each at least `n × interval` of every band after the one before
/// (the output is smooth in both bands), none is lost, and every grant
/// (shaped or metered) keeps each band's window bound.
async fn run_bands(bands: [(u64, u32); 2], ops: Vec<(u64, BandOp)>) -> Result<(), TestCaseError> {
    let quota = Quota::new(Rate::every(ms(bands[0].0)), bands[0].1)
        .and(Rate::every(ms(bands[1].0)), bands[1].1);
    let b = LeakyBucket::builder().quota(quota).build().unwrap();
    let slowest = bands[0].0.max(bands[1].0);
    let mut futs: Vec<Option<(u32, BandFut)>> = vec![];
    // (request index, n, release ms) of shaped releases; (n, ms) of grants.
    let mut released: Vec<(usize, u32, u64)> = vec![];
    let mut grants: Vec<(u32, u64)> = vec![];
    let mut at = 0;
    let mut schedule = vec![];
    for (gap, op) in ops {
        at += gap;
        schedule.push((at, op));
    }
    let end = at + 4 * slowest * u64::from(bands[0].1.max(bands[1].1)) + 100;
    let mut next = 0;
    for t in 0..=end {
        if t > 0 {
            time::advance(ms(1)).await;
        }
        poll_bands(&mut futs, &mut released, &mut grants, t)?;
        while next < schedule.len() && schedule[next].0 == t {
            let op = schedule[next].1;
            next += 1;
            match op {
                BandOp::Acquire(n) => {
                    let b2 = b.clone();
                    let fut: std::pin::Pin<
                        Box<dyn std::future::Future<Output = Result<(), AcquireError>> + Send>,
                    > = Box::pin(async move { b2.acquire_many(n).await });
                    let mut f = task::spawn(fut);
                    match f.poll() {
                        std::task::Poll::Ready(Ok(())) => {
                            released.push((futs.len(), n, t));
                            grants.push((n, t));
                            futs.push(None);
                        }
                        std::task::Poll::Ready(Err(e)) => {
                            prop_assert_eq!(e, AcquireError::Overflow);
                            futs.push(None);
                        }
                        std::task::Poll::Pending => futs.push(Some((n, f))),
                    }
                }
                BandOp::Try(n) => {
                    if b.try_acquire_many(n).is_ok() {
                        grants.push((n, t));
                    }
                }
                BandOp::Cancel(k) => {
                    let pending: Vec<usize> =
                        (0..futs.len()).filter(|&i| futs[i].is_some()).collect();
                    if !pending.is_empty() {
                        futs[pending[k % pending.len()]] = None;
                        poll_bands(&mut futs, &mut released, &mut grants, t)?;
                    }
                }
            }
        }
        poll_bands(&mut futs, &mut released, &mut grants, t)?;
    }
    prop_assert!(
        futs.iter().all(Option::is_none),
        "a request was never released"
    );
    for w in released.windows(2) {
        let ((i, n, r), (j, _, s)) = (w[0], w[1]);
        prop_assert!(i < j, "request {} released after {}", i, j);
        prop_assert!(
            s >= r + u64::from(n) * slowest,
            "request {} at {} ms, {} after request {} ({} units) at {} ms",
            j,
            s,
            s - r,
            i,
            n,
            r
        );
    }
    for &(interval, capacity) in &bands {
        for (a, &(_, from)) in grants.iter().enumerate() {
            for (z, &(_, to)) in grants.iter().enumerate().skip(a) {
                let units: u64 = grants[a..=z].iter().map(|&(n, _)| u64::from(n)).sum();
                let bound = u64::from(capacity) + (to - from) / interval;
                prop_assert!(
                    units <= bound,
                    "{} units in [{}, {}] ms > {} (band every {} ms, capacity {})",
                    units,
                    from,
                    to,
                    bound,
                    interval,
                    capacity
                );
            }
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn two_bands_shape_in_order_smoothly_and_within_both_bands(
        i1 in 1u64..30, c1 in 1u32..6,
        i2 in 1u64..60, c2 in 1u32..8,
        ops in proptest::collection::vec((0u64..40, band_op(5)), 1..30),
    ) {
        let cap = c1.min(c2);
        let ops: Vec<(u64, BandOp)> = ops
            .into_iter()
            .map(|(g, op)| (g, match op {
                BandOp::Acquire(n) => BandOp::Acquire(n.min(cap)),
                BandOp::Try(n) => BandOp::Try(n.min(cap)),
                other @ BandOp::Cancel(_) => other,
            }))
            .collect();
        run_paused(run_bands([(i1, c1), (i2, c2)], ops))?;
    }
}

// ---------------------------------------------------------------------------
// Timeouts across a rate change; the actor's timer after a withdrawal.

/// 10/s, capacity 5: the first at once (water to 100 ms), A =
/// `acquire_timeout(1, 150 ms)` due at 100 ms, B behind it at 200 ms. At
/// 50 ms the rate drops to 4/s: the water ahead of A (50 ms at 10/s) takes
/// 125 ms, so A is due at 175 ms, past its deadline: it times out at
/// 150 ms and takes its water out; B, whose water ahead is then only the
/// first one's, comes out at 175 ms exactly, not later.
#[tokio::test(start_paused = true)]
async fn a_shaped_timeout_pushed_past_its_deadline_gives_its_place_to_the_next() {
    let b = leaky(Rate::per_second(10), 5);
    let start = Instant::now();
    b.acquire().await.unwrap();
    let mut a = task::spawn(b.acquire_timeout(1, ms(150)));
    let mut w = task::spawn(b.acquire());
    assert_pending!(a.poll());
    assert_pending!(w.poll());
    time::advance(ms(50)).await;
    b.set_rate(Rate::per_second(4)).unwrap();
    time::advance(ms(99)).await;
    assert_pending!(a.poll());
    time::advance(ms(1)).await;
    assert_ready_eq!(a.poll(), Err(AcquireError::Timeout));
    drop(a);
    assert_eq!(start.elapsed(), ms(150));
    assert_eq!(b.level(), 2); // B's unit and 25 ms of the first's: 1.1 units
    time::advance(ms(24)).await;
    assert_pending!(w.poll());
    time::advance(ms(1)).await;
    assert_ready_eq!(w.poll(), Ok(()));
    let stats = b.stats();
    assert_eq!((stats.granted, stats.refused, stats.waiting), (2, 1, 0));
}

/// Spawned tasks woken by the actor alone (nobody polls them by hand): at
/// 10/s, capacity 5, four queued behind one that went at once; the second
/// is aborted at 50 ms and a rate change at 250 ms moves the rest. Each
/// task comes out on the tick of its turn: 100, 200 (was 300), then at
/// 20/s from 250 ms: the last one had 50 ms of water ahead at 10/s, so
/// 275 ms (was 300: the actor's timer must be re-armed earlier).
#[tokio::test(start_paused = true)]
async fn the_actor_rearms_after_a_withdrawal_and_a_rate_change() {
    use std::sync::{Arc, Mutex};
    let b = leaky(Rate::per_second(10), 5);
    let start = Instant::now();
    b.acquire().await.unwrap();
    let out = Arc::new(Mutex::new(vec![]));
    let mut handles = vec![];
    for who in 0..4 {
        let (b, out) = (b.clone(), out.clone());
        handles.push(tokio::spawn(async move {
            b.acquire().await.unwrap();
            out.lock().unwrap().push((who, start.elapsed()));
        }));
        tokio::task::yield_now().await;
    }
    assert_eq!(b.waiting(), 4);
    time::sleep(ms(50)).await;
    handles[1].abort();
    tokio::task::yield_now().await;
    assert_eq!(b.waiting(), 3);
    time::sleep(ms(200)).await;
    b.set_rate(Rate::per_second(20)).unwrap();
    time::sleep(ms(500)).await;
    assert_eq!(
        *out.lock().unwrap(),
        [(0, ms(100)), (2, ms(200)), (3, ms(275))]
    );
}

/// A shaped waiter whose turn came (the actor granted it) but whose future
/// was dropped before it saw the grant: documented as "takes its water
/// back out of the bucket": the one behind moves up to the same instant.
#[tokio::test(start_paused = true)]
async fn a_granted_but_unseen_waiter_dropped_gives_its_water_back() {
    let b = leaky(Rate::per_second(10), 5);
    let start = Instant::now();
    b.acquire().await.unwrap();
    let mut s = task::spawn(b.acquire()); // 100 ms
    let mut behind = task::spawn(b.acquire()); // 200 ms
    assert_pending!(s.poll());
    assert_pending!(behind.poll());
    time::advance(ms(100)).await; // the actor grants `s`; nobody polls it
    tokio::task::yield_now().await;
    assert_eq!(b.waiting(), 1);
    assert_eq!(b.level(), 2);
    drop(s);
    assert_eq!(b.level(), 1);
    assert_ready_eq!(behind.poll(), Ok(()));
    assert_eq!(start.elapsed(), ms(100));
    assert_eq!(b.stats().granted, 2);
}

// ---------------------------------------------------------------------------
// Through the crate's adapters.

/// `Keyed<K, LeakyBucket>`: each key a shaper of its own (queued per key,
/// smooth per key, `Overflow` per key), and a key is dropped only once its
/// queue has gone and its water drained.
#[tokio::test(start_paused = true)]
async fn keyed_leaky_buckets_shape_each_key_alone() {
    use tokio_ratelimit::keyed::Keyed;
    let m: Keyed<u32, LeakyBucket> = Keyed::builder()
        .limiter(|| {
            LeakyBucket::builder()
                .rate(Rate::per_second(10))
                .capacity(2)
                .build()
        })
        .build()
        .unwrap();
    let start = Instant::now();
    m.acquire(&1).await.unwrap();
    m.acquire(&2).await.unwrap();
    let mut one = task::spawn(m.acquire(&1));
    assert_pending!(one.poll());
    assert_eq!(m.acquire(&1).await, Err(AcquireError::Overflow));
    let mut two = task::spawn(m.acquire(&2));
    assert_pending!(two.poll());
    time::advance(ms(99)).await;
    assert_pending!(one.poll());
    assert_pending!(two.poll());
    time::advance(ms(1)).await;
    assert_ready_eq!(one.poll(), Ok(()));
    assert_ready_eq!(two.poll(), Ok(()));
    assert_eq!(start.elapsed(), ms(100));
    assert_eq!(m.peek(&1, 2).map(|p| p.answer()), Some(limited(ms(100))));
    assert_eq!(m.try_acquire(&1), Ok(()));
    assert_eq!(m.len(), 2);
}

/// A weighted stream over a shaper: each item's weight waits for the water
/// ahead of it, items come out `weight × interval` apart, and an item that
/// does not fit is handed back with `Overflow` and the stream goes on.
#[tokio::test(start_paused = true)]
async fn rate_limited_by_over_a_shaper_is_smooth_and_hands_back_overflow() {
    let b = leaky(Rate::per_second(10), 5);
    let start = Instant::now();
    let mut paced =
        futures::stream::iter([2u32, 3, 1, 4, 1, 3, 3, 2]).rate_limited_by(b.clone(), |w| *w);
    let mut seen = vec![];
    while let Some(item) = paced.next().await {
        match item {
            Ok(w) => seen.push((Ok(w), start.elapsed())),
            Err(refused) => seen.push((Err((refused.error, refused.item)), start.elapsed())),
        }
    }
    // 2 at 0 ms (water 2); 3 fits (5), out at 200 ms; 1 at 200 ms: 3 + 1
    // fits, out at 500 ms; 4 at 500 ms: 1 + 4 fits, out at 600 ms; 1 at
    // 600 ms: 4 + 1 fits, out at 1000 ms; 3 at 1000 ms: 1 + 3, out at
    // 1100 ms; the next 3 does not fit (3 + 3), handed back at once; 2
    // fits (5), out at 1400 ms.
    assert_eq!(
        seen,
        [
            (Ok(2), ms(0)),
            (Ok(3), ms(200)),
            (Ok(1), ms(500)),
            (Ok(4), ms(600)),
            (Ok(1), ms(1000)),
            (Ok(3), ms(1100)),
            (Err((AcquireError::Overflow, 3)), ms(1100)),
            (Ok(2), ms(1400)),
        ]
    );
}

// ---------------------------------------------------------------------------
// One band, with rate changes, against the exact model (in nanoseconds).

#[derive(Debug, Clone, Copy)]
enum RateOp {
    Acquire(u32),
    Timeout(u32, u64),
    Try(u32),
    Cancel(usize),
    /// `set_rate(Rate::every(k ms))`.
    SetRate(u64),
}

fn rate_op(capacity: u32) -> impl Strategy<Value = RateOp> {
    prop_oneof![
        4 => (1..=capacity).prop_map(RateOp::Acquire),
        2 => ((1..=capacity), 0u64..200).prop_map(|(n, t)| RateOp::Timeout(n, t)),
        2 => (1..=capacity).prop_map(RateOp::Try),
        1 => (0usize..8).prop_map(RateOp::Cancel),
        2 => (1u64..40).prop_map(RateOp::SetRate),
    ]
}

struct NsEntry {
    idx: usize,
    n: u128,
    end: u128,
    deadline: Option<u64>,
}

struct NsModel {
    interval: u128,
    capacity: u128,
    tat: u128,
    queue: Vec<NsEntry>,
}

const MS: u128 = 1_000_000;

impl NsModel {
    fn water(&self, now: u128) -> u128 {
        self.tat.saturating_sub(now)
    }
    fn ready(&self, e: &NsEntry) -> u128 {
        e.end - e.n * self.interval
    }
    fn withdraw(&mut self, pos: usize, now: u128) {
        let e = self.queue.remove(pos);
        let refund = (e.n * self.interval).min(e.end.saturating_sub(now));
        for later in &mut self.queue[pos..] {
            later.end -= refund;
        }
        self.tat -= refund;
    }
    fn rescale(&self, t: u128, now: u128, new: u128) -> u128 {
        if t <= now {
            now
        } else {
            now + ((t - now) * new).div_ceil(self.interval)
        }
    }
    fn set_interval(&mut self, new: u128, now: u128) {
        self.tat = self.rescale(self.tat, now, new);
        let ends: Vec<u128> = self
            .queue
            .iter()
            .map(|e| self.rescale(e.end, now, new))
            .collect();
        for (e, end) in self.queue.iter_mut().zip(ends) {
            e.end = end;
        }
        self.interval = new;
    }
}

type RateFut = task::Spawn<
    std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), AcquireError>> + Send>>,
>;

/// Polls every pending future at tick `t`, checking each against the model
/// (in queue order: a time-out withdraws before the ones behind look).
fn poll_rate(futs: &mut [Option<RateFut>], m: &mut NsModel, t: u64) -> Result<(), TestCaseError> {
    let now = u128::from(t) * MS;
    for (i, slot) in futs.iter_mut().enumerate() {
        let Some(f) = slot else { continue };
        let got = f.poll();
        let pos = m.queue.iter().position(|e| e.idx == i).unwrap();
        let ready = m.ready(&m.queue[pos]);
        let expect = if ready <= now {
            Some(Ok(()))
        } else if m.queue[pos].deadline == Some(t) {
            Some(Err(AcquireError::Timeout))
        } else {
            None
        };
        match (got, expect) {
            (std::task::Poll::Pending, None) => {}
            (std::task::Poll::Ready(r), Some(e)) if r == e => {
                if r.is_ok() {
                    m.queue.remove(pos);
                } else {
                    m.withdraw(pos, now);
                }
                *slot = None;
            }
            (got, expect) => prop_assert!(
                false,
                "request {} at {} ms: {:?}, model {:?} (ready at {} ns)",
                i,
                t,
                got,
                expect,
                ready
            ),
        }
    }
    Ok(())
}

async fn run_rates(
    interval: u64,
    capacity: u32,
    ops: Vec<(u64, RateOp)>,
) -> Result<(), TestCaseError> {
    let b = leaky(Rate::every(ms(interval)), capacity);
    let mut m = NsModel {
        interval: u128::from(interval) * MS,
        capacity: u128::from(capacity),
        tat: 0,
        queue: vec![],
    };
    let start = Instant::now();
    let mut futs: Vec<Option<RateFut>> = vec![];
    let mut at = 0;
    let mut schedule = vec![];
    for (gap, op) in ops {
        at += gap;
        schedule.push((at, op));
    }
    let end = at + 40 * u64::from(capacity) + 400;
    let mut next = 0;
    for t in 0..=end {
        if t > 0 {
            time::advance(ms(1)).await;
        }
        let now = u128::from(t) * MS;
        prop_assert_eq!(start.elapsed(), ms(t));
        poll_rate(&mut futs, &mut m, t)?;
        while next < schedule.len() && schedule[next].0 == t {
            let op = schedule[next].1;
            next += 1;
            match op {
                RateOp::Acquire(n) | RateOp::Timeout(n, _) => {
                    let to = match op {
                        RateOp::Timeout(_, to) => Some(to),
                        _ => None,
                    };
                    let b2 = b.clone();
                    let fut: std::pin::Pin<
                        Box<dyn std::future::Future<Output = Result<(), AcquireError>> + Send>,
                    > = match to {
                        Some(to) => Box::pin(async move { b2.acquire_timeout(n, ms(to)).await }),
                        None => Box::pin(async move { b2.acquire_many(n).await }),
                    };
                    let mut f = task::spawn(fut);
                    let got = f.poll();
                    let n = u128::from(n);
                    let cost = n * m.interval;
                    let ready = m.tat.max(now);
                    let expect = if m.water(now) + cost > m.capacity * m.interval {
                        Some(Err(AcquireError::Overflow))
                    } else if to.is_some_and(|to| ready - now > u128::from(to) * MS) {
                        Some(Err(AcquireError::Timeout))
                    } else {
                        m.tat = ready + cost;
                        if ready <= now {
                            Some(Ok(()))
                        } else {
                            m.queue.push(NsEntry {
                                idx: futs.len(),
                                n,
                                end: m.tat,
                                deadline: to.map(|to| t + to),
                            });
                            None
                        }
                    };
                    match (got, expect) {
                        (std::task::Poll::Pending, None) => futs.push(Some(f)),
                        (std::task::Poll::Ready(r), Some(e)) if r == e => futs.push(None),
                        (got, expect) => prop_assert!(
                            false,
                            "{:?} at {} ms: {:?}, model {:?}",
                            op,
                            t,
                            got,
                            expect
                        ),
                    }
                }
                RateOp::Try(n) => {
                    let after = m.water(now) + u128::from(n) * m.interval;
                    let tau = m.capacity * m.interval;
                    let expect = if after > tau {
                        limited(Duration::from_nanos(u64::try_from(after - tau).unwrap()))
                    } else {
                        Ok(())
                    };
                    prop_assert_eq!(b.peek(n).answer(), expect, "peek({}) at {} ms", n, t);
                    prop_assert_eq!(b.try_acquire_many(n), expect, "try({}) at {} ms", n, t);
                    if expect.is_ok() {
                        m.tat = m.tat.max(now) + u128::from(n) * m.interval;
                    }
                }
                RateOp::Cancel(k) => {
                    let pending: Vec<usize> =
                        (0..futs.len()).filter(|&i| futs[i].is_some()).collect();
                    if !pending.is_empty() {
                        let i = pending[k % pending.len()];
                        futs[i] = None;
                        let pos = m.queue.iter().position(|e| e.idx == i).unwrap();
                        m.withdraw(pos, now);
                    }
                }
                RateOp::SetRate(k) => {
                    b.set_rate(Rate::every(ms(k))).unwrap();
                    m.set_interval(u128::from(k) * MS, now);
                }
            }
            poll_rate(&mut futs, &mut m, t)?;
        }
        prop_assert_eq!(
            u128::from(b.level()),
            m.water(now).div_ceil(m.interval),
            "level at {} ms",
            t
        );
        let not_due = m.queue.iter().filter(|e| m.ready(e) > now).count();
        prop_assert_eq!(b.waiting(), not_due, "waiting at {} ms", t);
    }
    prop_assert!(
        futs.iter().all(Option::is_none),
        "a request was never released"
    );
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    /// Shaped requests, timeouts, meter calls, cancellations and rate
    /// changes against the exact model: a rate change drains the water
    /// ahead of every queued request at the new rate from then on (rounded
    /// up to the nanosecond), and a queued timeout pushed past its deadline
    /// fails at the deadline and gives its place to the ones behind.
    #[test]
    fn the_shaper_follows_rate_changes_exactly(
        interval in 1u64..40,
        (capacity, ops) in (1u32..6).prop_flat_map(|c| (Just(c), proptest::collection::vec((0u64..60, rate_op(c)), 1..30))),
    ) {
        run_paused(run_rates(interval, capacity, ops))?;
    }
}
