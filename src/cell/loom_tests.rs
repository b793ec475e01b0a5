//! loom models of the cell's concurrency: every interleaving of a few
//! operations, and every value a weakly ordered load may return, must give
//! one of the results of running the same operations one at a time in some
//! order (linearizability), checked against a plain sequential model of the
//! word built from [`Params`]. Run with
//! `RUSTFLAGS="--cfg tokio_ratelimit_loom" cargo test --lib loom_` (as
//! `.ci/run` does, with `LOOM_MAX_PREEMPTIONS=4`).

use loom::sync::Arc;
use loom::thread;

use super::*;
use crate::Rate;
use crate::engine::{Bucket, Configured, Grant, Queue};

const MS: u128 = 1_000_000;

/// One operation on the cell, as a thread of a model performs it.
#[derive(Debug, Clone, Copy)]
enum Op {
    /// `try_pour(now, n)`.
    Pour(u128, u32),
    /// A waiter's `reserve(now, n, Tokens, no limit, may queue)`.
    Reserve(u128, u32),
    /// `set_params(params, now)`.
    SetParams(Params, u128),
    /// `snapshot()`.
    Snapshot,
    /// A cancel's `refund(amount)`; the thread computes the amount the
    /// engine's way, and the model checks it is this one.
    Refund(u128),
    /// `close()`.
    Close,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    Pour(Result<(), Option<Duration>>),
    Reserve(Reserve<Place>),
    SetParams,
    Seen(State),
    Refund,
    /// `close()`: whether the cell was open.
    Closed(bool),
}

/// What a reader may see: the whole word and the interval.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct State {
    word: u128,
    params: Params,
}

/// The sequential specification of one operation.
fn apply(s: State, op: Op) -> (State, Outcome) {
    let p = s.params;
    let tat = s.word & TAT_MASK;
    let with_tat = |tat: u128| State {
        word: (s.word & !TAT_MASK) | tat,
        params: p,
    };
    let closed = s.word & CLOSED != 0;
    match op {
        Op::Pour(..) if closed => (s, Outcome::Pour(Err(None))),
        Op::Reserve(..) if closed => (s, Outcome::Reserve(Reserve::Closed)),
        Op::Close => (
            State {
                word: s.word | CLOSED,
                params: p,
            },
            Outcome::Closed(!closed),
        ),
        Op::Pour(now, n) => match p.try_pour(tat, p.scale_nanos(now), n) {
            Ok(end) => (with_tat(end), Outcome::Pour(Ok(()))),
            Err(wait) => (s, Outcome::Pour(Err(Some(p.duration_ceil(wait))))),
        },
        Op::Reserve(now, n) => {
            let now = p.scale_nanos(now);
            let r = p.reserve(tat, now, now, n, Release::Tokens).unwrap();
            let outcome = if r.ready <= now {
                Reserve::Ready(r)
            } else {
                Reserve::Queued(r)
            };
            (with_tat(r.end), Outcome::Reserve(outcome))
        }
        Op::SetParams(new, now) => {
            let tat = p.rescale(&new, tat, now);
            let word = with_generation((s.word & !TAT_MASK) | tat, generation(s.word) + 2);
            (State { word, params: new }, Outcome::SetParams)
        }
        Op::Snapshot => (s, Outcome::Seen(s)),
        Op::Refund(amount) => (with_tat(tat.saturating_sub(amount)), Outcome::Refund),
    }
}

/// Every result of running the threads' operations one at a time, in
/// every order that keeps each thread's own order: each thread's
/// outcomes, and the final state.
fn serial_results(start: State, threads: &[Vec<Op>]) -> Vec<(Vec<Vec<Outcome>>, State)> {
    fn go(
        s: State,
        threads: &[Vec<Op>],
        done: &mut Vec<Vec<Outcome>>,
        out: &mut Vec<(Vec<Vec<Outcome>>, State)>,
    ) {
        let mut finished = true;
        for t in 0..threads.len() {
            let Some(&op) = threads[t].get(done[t].len()) else {
                continue;
            };
            finished = false;
            let (next, outcome) = apply(s, op);
            done[t].push(outcome);
            go(next, threads, done, out);
            done[t].pop();
        }
        if finished {
            out.push((done.clone(), s));
        }
    }
    let mut out = Vec::new();
    go(
        start,
        threads,
        &mut vec![Vec::new(); threads.len()],
        &mut out,
    );
    out
}

/// Performs a thread's operations on the cell.
fn run(cell: &Cell, ops: &[Op]) -> Vec<Outcome> {
    ops.iter()
        .map(|&op| match op {
            Op::Pour(now, n) => Outcome::Pour(cell.try_pour(now, n)),
            Op::Reserve(now, n) => {
                Outcome::Reserve(cell.reserve_at(now, n, Release::Tokens, None, Wait::Queue))
            }
            Op::SetParams(new, now) => {
                let before = cell.snapshot().params;
                let mut conversions = 0;
                cell.set_params(new, now, |old, to| {
                    assert_eq!((*old, *to), (before, new));
                    conversions += 1;
                });
                assert_eq!(conversions, 1);
                Outcome::SetParams
            }
            Op::Snapshot => {
                let s = cell.snapshot();
                Outcome::Seen(State {
                    word: s.word,
                    params: s.params,
                })
            }
            Op::Refund(_) => unreachable!("refunds run as the engine's cancel"),
            Op::Close => Outcome::Closed(cell.close()),
        })
        .collect()
}

/// Runs `threads` concurrently on a cell in state `start` (the first
/// list on the model's main thread), under loom, and asserts that
/// every execution matches a serial order. `check` sees each
/// execution's outcomes too.
fn check_linearizable(
    start: State,
    threads: Vec<Vec<Op>>,
    check: impl Fn(&[Vec<Outcome>]) + Send + Sync + 'static,
) {
    let serial = serial_results(start, &threads);
    model(move || {
        let cell = Arc::new(Cell::new(
            start.params,
            start.word,
            clock::Origin::at(Instant::now()),
        ));
        let handles: Vec<_> = threads[1..]
            .iter()
            .map(|ops| {
                let (cell, ops) = (cell.clone(), ops.clone());
                thread::spawn(move || run(&cell, &ops))
            })
            .collect();
        let mut outcomes = vec![run(&cell, &threads[0])];
        outcomes.extend(handles.into_iter().map(|h| h.join().unwrap()));
        let end = cell.snapshot();
        let end = State {
            word: end.word,
            params: end.params,
        };
        check(&outcomes);
        assert!(
            serial.iter().any(|(o, s)| *o == outcomes && *s == end),
            "no serial order gives {outcomes:?} ending in {end:?}"
        );
    });
}

/// A loom model with a preemption bound of 3 unless
/// `LOOM_MAX_PREEMPTIONS` sets one (CI: 4): unbounded, the three-thread
/// models take a minute and more; at 3 every deliberate breakage tried
/// on the cell was still caught.
fn model(f: impl Fn() + Send + Sync + 'static) {
    let mut builder = loom::model::Builder::new();
    if builder.preemption_bound.is_none() {
        builder.preemption_bound = Some(3);
    }
    builder.check(f);
}

fn params(rate: Rate) -> Params {
    Params::new(rate, 2).unwrap()
}

fn admitted(outcomes: &[Vec<Outcome>]) -> usize {
    outcomes
        .iter()
        .flatten()
        .filter(|o| **o == Outcome::Pour(Ok(())))
        .count()
}

/// Concurrent meters, one with a stale `now`: at most `capacity + rate ×
/// window` is admitted, and every request that fits when it is decided
/// is admitted.
#[test]
fn loom_concurrent_pours() {
    let p = params(Rate::per_second(10));
    let start = State { word: 0, params: p };
    let threads = vec![
        vec![Op::Pour(100 * MS, 1)],
        vec![Op::Pour(0, 1), Op::Pour(0, 1)],
        vec![Op::Pour(100 * MS, 1)],
    ];
    // The window is [0, 100 ms]: 2 + 1.
    check_linearizable(start, threads, |o| {
        assert!(admitted(o) <= 3, "over-admitted: {o:?}");
    });
}

/// A rate change at 50 ms against a meter at 100 ms and a reader, on a
/// bucket full at 0 ms (10/s, capacity 2).
fn set_params_against(reader: Op, rate: Rate) {
    let old = params(Rate::per_second(10));
    let start = State {
        word: old.cost(2),
        params: old,
    };
    let threads = vec![
        vec![Op::SetParams(params(rate), 50 * MS)],
        vec![reader, Op::Snapshot],
    ];
    check_linearizable(start, threads, |_| {});
}

/// A rate change against a meter and a reader: nobody acts on a tat of
/// one generation with the interval of another, and the water is
/// converted exactly once. At 100 ms the old rate admits one more; at
/// 3/s (a new `den`) the converted water refuses it; at 20/s it admits
/// it, and the old tat read with the new interval would refuse it.
#[test]
fn loom_set_params_against_pour() {
    set_params_against(Op::Pour(100 * MS, 1), Rate::per_second(3));
    set_params_against(Op::Pour(100 * MS, 1), Rate::per_second(20));
}

/// The same against a waiter's reservation.
#[test]
fn loom_set_params_against_reserve() {
    set_params_against(Op::Reserve(100 * MS, 1), Rate::per_second(3));
    set_params_against(Op::Reserve(100 * MS, 1), Rate::per_second(20));
}

/// A waiter's cancel, done as the engine does it (under the queue
/// lock, which the meters do not take), against lock-free meters: the
/// cancelled reservation consumes nothing and nothing is admitted twice.
#[test]
fn loom_refund_against_pours() {
    let p = params(Rate::per_second(10));
    let cancel_at = 50 * MS;
    let threads = [
        vec![Op::Pour(200 * MS, 1), Op::Pour(200 * MS, 1)],
        vec![Op::Pour(200 * MS, 1)],
    ];
    // A waiter of 2 goes at once (water to 200 ms); one of 1 queues
    // (to 300 ms) and gives up at 50 ms: its 100 ms come back.
    let refund = p.refund(300 * MS, 1, p.scale_nanos(cancel_at));
    assert_eq!(refund, 100 * MS);
    let serial = serial_results(
        State {
            word: 300 * MS,
            params: p,
        },
        &[
            threads[0].clone(),
            threads[1].clone(),
            vec![Op::Refund(refund)],
        ],
    );
    model(move || {
        let bucket = Arc::new(Bucket::new(p, 0, Release::Tokens));
        let cell = &bucket.cell;
        let mut queue = Queue::<Bucket>::new(Configured::new(Rate::per_second(10)));
        assert!(matches!(
            cell.reserve_at(0, 2, Release::Tokens, None, Wait::Queue),
            Reserve::Ready(_)
        ));
        let Reserve::Queued(r) = cell.reserve_at(0, 1, Release::Tokens, None, Wait::Queue) else {
            panic!("the second waiter queues")
        };
        let (id, _) = queue.push(1, crate::engine::Turn::tokens(r.end), Grant::Spend);
        let canceller = {
            let bucket = bucket.clone();
            thread::spawn(move || {
                // Engine::cancel, under its lock.
                let view = bucket.view_at(p.scale_nanos(cancel_at));
                assert_eq!(queue.withdraw(id, &*bucket, &view), Some(0));
                vec![Outcome::Refund]
            })
        };
        let meter = {
            let (bucket, ops) = (bucket.clone(), threads[1].clone());
            thread::spawn(move || run(&bucket.cell, &ops))
        };
        let mut outcomes = vec![run(cell, &threads[0])];
        outcomes.push(meter.join().unwrap());
        outcomes.push(canceller.join().unwrap());
        let end = cell.snapshot();
        let end = State {
            word: end.word,
            params: end.params,
        };
        // 2 went to the first waiter; over [0, 200 ms] the bucket
        // allows 2 + 2.
        assert!(admitted(&outcomes) <= 2, "over-admitted: {outcomes:?}");
        assert!(
            serial.iter().any(|(o, s)| *o == outcomes && *s == end),
            "no serial order gives {outcomes:?} ending in {end:?}"
        );
    });
}

/// Closing (which widens the cell) against meters on the narrow word:
/// no pour is lost or admitted after the close, and none acts on the
/// narrow word once the state has moved.
#[test]
fn loom_close_against_pours() {
    let p = params(Rate::per_second(10));
    let start = State { word: 0, params: p };
    let threads = vec![
        vec![Op::Close, Op::Snapshot],
        vec![Op::Pour(0, 1), Op::Pour(0, 2), Op::Pour(100 * MS, 1)],
    ];
    check_linearizable(start, threads, |o| {
        assert!(admitted(o) <= 2, "over-admitted: {o:?}");
    });
}

/// A pour whose time outgrows the narrow word widens the cell, against
/// a pour and a reader on the narrow word. At 4 294 967 291 per 5 s (`den`
/// just under 2³²) the narrow word holds 1.07 s.
#[test]
fn loom_widening_pour_against_pour() {
    let p = params(Rate::per(4_294_967_291, Duration::from_secs(5)));
    let start = State { word: 0, params: p };
    let late = 1_100 * MS;
    assert!(p.scale_nanos(late) > u128::from(NARROW_LIMIT));
    let threads = vec![
        vec![Op::Pour(late, 2)],
        vec![Op::Pour(late, 1), Op::Snapshot],
    ];
    check_linearizable(start, threads, |o| {
        assert!(admitted(o) <= 2, "over-admitted: {o:?}");
    });
}
