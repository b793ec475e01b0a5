//! loom models of the word's read-and-pour: every interleaving of two
//! threads that each read a shared clock and then pour, including a thread
//! whose `now` is older than the other's pour.

use loom::sync::Arc;
use loom::thread;

use super::*;
use crate::sync::{AtomicU64 as Clock, Ordering};

/// 1 unit per 10 ns (in scaled units, den 1), capacity 2: τ = 20.
fn params() -> Params {
    Params::new(Rate::every(Duration::from_nanos(10)), 2).unwrap()
}

/// Runs `pours` (each: clock step, units) on threads of their own
/// against one key's word, starting from `start`; returns what each
/// granted with its `now`, and the `tat` left.
fn run(epoch: u128, start: u128, pours: &[(u64, u32)]) -> (Vec<(u128, u32)>, u128) {
    let params = params();
    let word = Arc::new(<AtomicU64 as Word>::new(start));
    let clock = Arc::new(Clock::new(0));
    let handles: Vec<_> = pours
        .iter()
        .map(|&(step, n)| {
            let (word, clock) = (Arc::clone(&word), Arc::clone(&clock));
            thread::spawn(move || {
                let now = epoch + u128::from(clock.fetch_add(step, Ordering::Relaxed) + step);
                let granted = decide(&params, &*word, epoch, || Some(now), n) == Some(Ok(()));
                (now, if granted { n } else { 0 })
            })
        })
        .collect();
    let grants = handles.into_iter().map(|h| h.join().unwrap()).collect();
    (grants, word.read(epoch).1)
}

/// Never over-admits (in the window up to the latest `now`, at most
/// capacity + elapsed / interval units), and the execution is one of
/// the serial ones: the same grants and the same final `tat` as pouring
/// the requests one at a time, each at its own `now`, in some order. (A
/// thread whose `now` is stale may so be refused what it would have had
/// a moment earlier: it judged the water at an earlier time, as a
/// `Funnel` does.)
fn check(epoch: u128, start: u128, pours: &[(u64, u32)], grants: &[(u128, u32)], tat: u128) {
    let params = params();
    let latest = grants.iter().map(|&(now, _)| now).max().unwrap();
    let units: u32 = grants.iter().map(|&(_, n)| n).sum();
    let bound = 2 - (start - epoch) / 10 + (latest - epoch) / 10;
    assert!(u128::from(units) <= bound, "{grants:?}: {units} > {bound}");
    let asked: Vec<(u128, u32)> = grants
        .iter()
        .zip(pours)
        .map(|(&(now, _), &(_, n))| (now, n))
        .collect();
    let serial = |order: [usize; 2]| {
        let mut state = start;
        let mut out = vec![(0, 0); 2];
        for i in order {
            let (now, n) = asked[i];
            out[i] = (now, 0);
            if let Ok(end) = params.try_pour(state, now, n) {
                state = end;
                out[i].1 = n;
            }
        }
        (out, state)
    };
    let actual = (grants.to_vec(), tat);
    assert!(
        actual == serial([0, 1]) || actual == serial([1, 0]),
        "{actual:?} is no serial order of {asked:?}"
    );
}

#[test]
fn loom_keyed_pours_from_stale_clocks_never_over_admit() {
    // Both ask for the whole bucket one ns apart: exactly one may have
    // it, whichever read the clock first.
    loom::model(|| {
        let epoch = 7u128 << 64;
        let pours = [(1, 2), (1, 2)];
        let (grants, tat) = run(epoch, epoch, &pours);
        check(epoch, epoch, &pours, &grants, tat);
        let units: u32 = grants.iter().map(|g| g.1).sum();
        assert_eq!(units, 2, "{grants:?}");
    });
}

#[test]
fn loom_keyed_pours_are_serializable() {
    // Half the bucket and one unit, from a bucket half full: whether the
    // second fits depends on the order and on the clock each one read.
    loom::model(|| {
        let epoch = 0;
        let pours = [(1, 1), (3, 1)];
        let (grants, tat) = run(epoch, epoch + 10, &pours);
        check(epoch, epoch + 10, &pours, &grants, tat);
        // Two units into a bucket holding one at time ≥ 1: the first
        // pour always fits.
        assert!(grants.iter().any(|g| g.1 == 1), "{grants:?}");
    });
}

/// Two bands in one [`Pair`] word: 1 unit per 10 ns with a burst of 2, and
/// 1 per 40 ns with a burst of 3.
fn two_bands() -> Bands {
    Bands::new(&[
        params(),
        Params::new(Rate::every(Duration::from_nanos(40)), 3).unwrap(),
    ])
}

#[test]
fn loom_two_bands_in_one_word_are_one_decision() {
    // Thread one pours 2, thread two 2 then (on its own) 1: the first band
    // refuses one of the first two pours and the second band the pour of
    // 1 if both twos went in. Every execution must be a serial one of the
    // three pours at the `now`s they read: no band debited by a refusal,
    // none over-admitted.
    loom::model(|| {
        let bands = two_bands();
        let quota = Quota::new(Rate::every(Duration::from_nanos(10)), 2)
            .and(Rate::every(Duration::from_nanos(40)), 3);
        let tier = Tier::new(quota, bands, bands);
        let epoch_ns = 0u64;
        let word = Arc::new(<Pair as Stored>::fresh(&bands, 0));
        let clock = Arc::new(Clock::new(0));
        let tier = Arc::new(tier);
        let pour = move |word: &Pair, clock: &Clock, tier: &Tier, n: u32| {
            let now = clock.fetch_add(1, Ordering::Relaxed) + 1;
            (
                now,
                word.decide(tier, epoch_ns, None, || Some(now), n) == Some(Ok(())),
            )
        };
        let other = {
            let (word, clock, tier) = (Arc::clone(&word), Arc::clone(&clock), Arc::clone(&tier));
            thread::spawn(move || pour(&word, &clock, &tier, 2))
        };
        let second = pour(&word, &clock, &tier, 2);
        let third = pour(&word, &clock, &tier, 1);
        let first = other.join().unwrap();
        let tats = word.tats(&bands, epoch_ns);
        let asked = [(first.0, 2), (second.0, 2), (third.0, 1)];
        let serial = |order: [usize; 3]| {
            let mut state = bands.start(0, 0);
            let mut granted = [false; 3];
            for i in order {
                let (now, n) = asked[i];
                granted[i] = bands.try_pour(&mut state, u128::from(now), n).is_ok();
            }
            (granted, state[..2].to_vec())
        };
        let actual = ([first.1, second.1, third.1], tats[..2].to_vec());
        // Thread two's pours are in its program order; thread one's goes
        // before, between or after them.
        assert!(
            [[0, 1, 2], [1, 0, 2], [1, 2, 0]]
                .into_iter()
                .any(|order| serial(order) == actual),
            "{actual:?} is no serial order of {asked:?}"
        );
    });
}
