//! Scenario 7 (`bands`): a limit of two bands — a per-second band and a
//! long one — as a `Quota`, against what a user builds today with governor:
//! two limiters checked one after the other.
//!
//! One thread asks as fast as it can for `set.run`. The chained limiters
//! check the long band first (either order leaks; this is the one that
//! shows it in the budget): every request the per-second limiter then
//! refuses has already spent a permit of the long band. The table shows the
//! grants, the long band's budget spent, and how much of it went to
//! requests that were refused (the leak).

use std::num::NonZeroU32;
use std::time::{Duration, Instant};

use governor::{Quota as GovernorQuota, RateLimiter};
use tokio_ratelimit::{Quota, Rate, TokenBucket};
use tokio_ratelimit_benches::Table;

use crate::settings::Settings;

/// The per-second band: 100/s, bursts of 10.
const PER_SECOND: u32 = 100;
const BURST: u32 = 10;
/// The long band: 1 000 per 100 s, all of it available at once (a day's
/// budget, scaled down so that a few seconds show its refill).
const LONG: u32 = 1_000;
const LONG_PERIOD: Duration = Duration::from_secs(100);

pub(crate) fn bands(rt: &tokio::runtime::Runtime, set: &Settings) {
    let mut t = Table::new(
        format!(
            "7. Two bands ({PER_SECOND}/s, burst {BURST}; {LONG} per {} s): saturating demand for {:.0} s on one thread",
            LONG_PERIOD.as_secs(),
            set.run.as_secs_f64()
        ),
        &[
            "limiter",
            "requests",
            "granted",
            "long band spent",
            "spent on refused requests",
        ],
    );
    let _entered = rt.enter();

    // This crate: one quota of two bands.
    let quota =
        Quota::new(Rate::per_second(PER_SECOND), BURST).and(Rate::per(LONG, LONG_PERIOD), LONG);
    let bucket = TokenBucket::builder().quota(quota).build().unwrap();
    let (mut asked, mut granted) = (0u64, 0u64);
    let start = Instant::now();
    while start.elapsed() < set.run {
        asked += 1;
        granted += u64::from(bucket.try_acquire().is_ok());
    }
    // What is left of the long band tells what was spent.
    let left = bucket.peek(1).bands().nth(1).map_or(0, |b| b.available);
    let refill = refilled(start.elapsed());
    let spent = u64::from(LONG) + refill - u64::from(left);
    t.row(vec![
        "TokenBucket with a Quota of two bands".into(),
        asked.to_string(),
        granted.to_string(),
        format!("{spent} (of {LONG} + {refill} refilled)"),
        spent.saturating_sub(granted).to_string(),
    ]);

    // governor: two limiters, the long one checked first.
    let nz = |n: u32| NonZeroU32::new(n).unwrap();
    let second =
        RateLimiter::direct(GovernorQuota::per_second(nz(PER_SECOND)).allow_burst(nz(BURST)));
    let long = RateLimiter::direct(
        GovernorQuota::with_period(LONG_PERIOD / LONG)
            .unwrap()
            .allow_burst(nz(LONG)),
    );
    let (mut asked, mut granted, mut spent) = (0u64, 0u64, 0u64);
    let start = Instant::now();
    while start.elapsed() < set.run {
        asked += 1;
        if long.check().is_ok() {
            spent += 1;
            granted += u64::from(second.check().is_ok());
        }
    }
    let refill = refilled(start.elapsed());
    t.row(vec![
        "governor: long limiter, then per-second limiter".into(),
        asked.to_string(),
        granted.to_string(),
        format!("{spent} (of {LONG} + {refill} refilled)"),
        spent.saturating_sub(granted).to_string(),
    ]);
    t.note(
        "spent on refused requests: permits of the long band that went to requests the \
         per-second band refused (the leak of chained limiters; a Quota debits no band for \
         a refused request)",
    );
    t.print();
}

/// Whole permits the long band refills in `elapsed`.
fn refilled(elapsed: Duration) -> u64 {
    u64::try_from(elapsed.as_nanos() * u128::from(LONG) / LONG_PERIOD.as_nanos()).unwrap()
}
