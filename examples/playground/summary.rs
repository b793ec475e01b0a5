//! The tool's answers: the text report for the terminal and the JSON
//! summary for scripts, from a [`Replay`].
//!
//! Waits are over *granted* requests: one that passed at once waited 0.
//! Percentiles are nearest-rank (p99 is the wait that 99 % of granted
//! requests did not exceed), exact.

use std::fmt::{self, Write as _};
use std::time::Duration;

use serde_json::{Value, json};

use super::engine::{Bucket, Refusal, Replay, Tally};
use super::traffic::{Traffic, show_span};

/// A granted request's wait at percentile `p` (0 < p ≤ 1), in nanoseconds.
pub(crate) fn percentile(tally: &Tally, sorted_waits: &[u64], p: f64) -> Option<u64> {
    let granted = tally.passed + tally.waited;
    if granted == 0 {
        return None;
    }
    #[expect(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        clippy::cast_precision_loss,
        reason = "a rank below 2^53"
    )]
    let rank = ((p * granted as f64).ceil() as u64).clamp(1, granted);
    if rank <= tally.passed {
        return Some(0);
    }
    Some(sorted_waits[usize::try_from(rank - tally.passed - 1).expect("a rank fits")])
}

/// A limiter's waits: p50, p99 and max, in nanoseconds.
pub(crate) fn waits(tally: &Tally) -> [Option<u64>; 3] {
    let mut sorted = tally.waits.clone();
    sorted.sort_unstable();
    let max = if tally.passed + tally.waited == 0 {
        None
    } else {
        Some(sorted.last().copied().unwrap_or(0))
    };
    [
        percentile(tally, &sorted, 0.5),
        percentile(tally, &sorted, 0.99),
        max,
    ]
}

/// The keys that had the most refusals (ties by key id), at most `n`.
pub(crate) fn top_refused(tally: &Tally, n: usize) -> Vec<(u32, u64, u64)> {
    let mut keys: Vec<(u32, u64, u64)> = tally
        .keys
        .iter()
        .enumerate()
        .filter(|(_, k)| k.refused > 0)
        .map(|(id, k)| {
            (
                u32::try_from(id).expect("key ids are u32"),
                k.refused,
                k.requests,
            )
        })
        .collect();
    keys.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    keys.truncate(n);
    keys
}

/// Writes what every limiter did with every key, one JSON line per key in
/// the order keys first appeared: `{"key": …, "requests": …, "limiters":
/// [{"label": …, "passed": …, "waited": …, "refused": …}, …]}` (the
/// limiters in the report's order). Streamed: a line is built, written and
/// dropped, so millions of keys cost no more than their counts.
pub(crate) fn write_keys(out: &mut impl std::io::Write, replay: &Replay) -> std::io::Result<()> {
    for id in 0..replay.seen.keys.len() {
        let counts = |tally: &Tally| tally.keys.get(id).copied().unwrap_or_default();
        let requests = replay.tallies.first().map_or(0, |t| counts(t).requests);
        let limiters: Vec<Value> = replay
            .tallies
            .iter()
            .map(|tally| {
                let k = counts(tally);
                json!({
                    "label": tally.spec.label,
                    "passed": k.passed,
                    "waited": k.waited,
                    "refused": k.refused,
                })
            })
            .collect();
        let id = u32::try_from(id).expect("key ids are u32");
        let line = json!({
            "key": replay.seen.keys.name(id),
            "requests": requests,
            "limiters": limiters,
        });
        serde_json::to_writer(&mut *out, &line)?;
        out.write_all(b"\n")?;
    }
    out.flush()
}

/// `buckets` merged `by` at a time (sums; the longest wait).
pub(crate) fn coarsen(buckets: &[Bucket], by: usize) -> Vec<Bucket> {
    buckets
        .chunks(by.max(1))
        .map(|chunk| {
            chunk.iter().fold(Bucket::default(), |sum, b| Bucket {
                offered: sum.offered + b.offered,
                admitted: sum.admitted + b.admitted,
                refused: sum.refused + b.refused,
                max_wait: sum.max_wait.max(b.max_wait),
            })
        })
        .collect()
}

/// A wait for people: `0ms`, `300ms`, `1.949s`, `1m50.34s`… (see `show_span`).
fn wait(nanos: Option<u64>) -> String {
    nanos.map_or_else(|| "-".to_owned(), |n| show_span(Duration::from_nanos(n)))
}

fn percent(part: u64, whole: u64) -> String {
    if whole == 0 {
        return "-".to_owned();
    }
    #[expect(clippy::cast_precision_loss, reason = "a percentage")]
    let p = part as f64 * 100.0 / whole as f64;
    format!("{p:.1}%")
}

/// Rows of the text view's rate table.
const RATE_ROWS: usize = 24;

/// Writes the text report.
pub(crate) fn render(
    out: &mut impl fmt::Write,
    traffic: &Traffic,
    replay: &Replay,
    top: usize,
) -> fmt::Result {
    let seen = &replay.seen;
    writeln!(out, "tokio-ratelimit playground: {}", traffic.describe())?;
    let keys = seen.keys.len();
    writeln!(
        out,
        "{} requests over {}{}; virtual time (tokio's clock is paused)",
        seen.requests,
        show_span(Duration::from_nanos(seen.last)),
        if keys > 1 {
            format!(", {keys} keys")
        } else {
            String::new()
        },
    )?;
    if let Some(first) = seen.skipped_first.first() {
        writeln!(
            out,
            "{} bad lines left out (--on-error skip); the first: {first}",
            seen.skipped,
        )?;
    }
    writeln!(out)?;
    writeln!(
        out,
        "   {:<3} {:>9} {:>9} {:>9} {:>9}  {:>9} {:>9} {:>9}  limiter",
        "", "passed", "waited", "refused", "% refused", "wait p50", "wait p99", "wait max",
    )?;
    for (i, tally) in replay.tallies.iter().enumerate() {
        let [p50, p99, max] = waits(tally);
        writeln!(
            out,
            "   {:<3} {:>9} {:>9} {:>9} {:>9}  {:>9} {:>9} {:>9}  {}",
            format!("#{}", i + 1),
            tally.passed,
            tally.waited,
            tally.refused_total(),
            percent(tally.refused_total(), tally.requests),
            wait(p50),
            wait(p99),
            wait(max),
            tally.spec.label,
        )?;
    }
    writeln!(out)?;
    for (i, tally) in replay.tallies.iter().enumerate() {
        let causes: Vec<String> = Refusal::ALL
            .iter()
            .filter(|&&r| tally.refused[r as usize] > 0)
            .map(|&r| {
                format!(
                    "{} {}",
                    tally.refused[r as usize],
                    r.name().replace('_', " ")
                )
            })
            .collect();
        writeln!(
            out,
            "   #{} {}\n      {}, {}; {}",
            i + 1,
            tally.spec.label,
            tally.spec.call(),
            tally.spec.describe_limit(),
            if causes.is_empty() {
                "none refused".to_owned()
            } else {
                format!("refused: {}", causes.join(", "))
            },
        )?;
    }
    render_rates(out, replay)?;
    if keys > 1 && top > 0 {
        render_top(out, replay, top)?;
    }
    Ok(())
}

/// Offered vs admitted requests per second, over at most [`RATE_ROWS`]
/// rows of time.
fn render_rates(out: &mut impl fmt::Write, replay: &Replay) -> fmt::Result {
    let Some(first) = replay.tallies.first() else {
        return Ok(());
    };
    let longest = replay
        .tallies
        .iter()
        .map(|t| t.buckets.len())
        .max()
        .unwrap_or(0);
    let by = longest.div_ceil(RATE_ROWS).max(1);
    let span = first.bucket_width() * u32::try_from(by).unwrap_or(u32::MAX);
    writeln!(out)?;
    let title = format!(
        "== requests per second, offered and admitted (each row {}) ",
        show_span(span)
    );
    writeln!(out, "{title:=<96}")?;
    let mut header = format!("   {:>10}  {:>10}", "from", "offered");
    for i in 0..replay.tallies.len() {
        let _ = write!(header, "  {:>9}", format!("#{}", i + 1));
    }
    writeln!(out, "{header}")?;
    let rows: Vec<Vec<Bucket>> = replay
        .tallies
        .iter()
        .map(|t| coarsen(&t.buckets, by))
        .collect();
    for row in 0..rows.iter().map(Vec::len).max().unwrap_or(0) {
        // The last row may cover fewer buckets.
        let covered =
            first.bucket_width() * u32::try_from(by.min(longest - row * by)).unwrap_or(u32::MAX);
        let per_second = |count: u64| {
            #[expect(clippy::cast_precision_loss, reason = "a rate for people")]
            let rate = count as f64 / covered.as_secs_f64();
            super::number(rate)
        };
        let offered = rows[0].get(row).map_or(0, |b| b.offered);
        let mut line = format!(
            "   {:>10}  {:>10}",
            show_span(span * u32::try_from(row).unwrap_or(u32::MAX)),
            per_second(offered)
        );
        for buckets in &rows {
            let _ = write!(
                line,
                "  {:>9}",
                per_second(buckets.get(row).map_or(0, |b| b.admitted))
            );
        }
        writeln!(out, "{line}")?;
    }
    Ok(())
}

fn render_top(out: &mut impl fmt::Write, replay: &Replay, top: usize) -> fmt::Result {
    writeln!(out)?;
    let title = format!("== the {top} keys most refused, per limiter ");
    writeln!(out, "{title:=<96}")?;
    for (i, tally) in replay.tallies.iter().enumerate() {
        let keys = top_refused(tally, top);
        let listed: Vec<String> = keys
            .iter()
            .map(|&(id, refused, requests)| {
                format!("{} {refused}/{requests}", replay.seen.keys.name(id))
            })
            .collect();
        writeln!(
            out,
            "   #{} {}: {}",
            i + 1,
            tally.spec.label,
            if listed.is_empty() {
                "none refused".to_owned()
            } else {
                listed.join(", ")
            }
        )?;
    }
    Ok(())
}

/// The JSON summary.
pub(crate) fn json(traffic: &Traffic, replay: &Replay, top: usize) -> Value {
    let seen = &replay.seen;
    let limiters: Vec<Value> = replay
        .tallies
        .iter()
        .map(|tally| {
            let [p50, p99, max] = waits(tally);
            let to_ms = |n: Option<u64>| n.map(|n| Duration::from_nanos(n).as_secs_f64() * 1e3);
            let refused: serde_json::Map<String, Value> = Refusal::ALL
                .iter()
                .map(|&r| (r.name().to_owned(), json!(tally.refused[r as usize])))
                .collect();
            json!({
                "label": tally.spec.label,
                "limiter": tally.spec.name,
                "call": tally.spec.call(),
                "per_key": tally.spec.per_key,
                "limit": tally.spec.describe_limit(),
                "requests": tally.requests,
                "passed": tally.passed,
                "waited": tally.waited,
                "refused": tally.refused_total(),
                "refused_by": refused,
                "permits_offered": tally.permits_offered,
                "permits_granted": tally.permits_granted,
                "wait_ms": { "p50": to_ms(p50), "p99": to_ms(p99), "max": to_ms(max) },
                "per_bucket": {
                    "offered": tally.buckets.iter().map(|b| b.offered).collect::<Vec<_>>(),
                    "admitted": tally.buckets.iter().map(|b| b.admitted).collect::<Vec<_>>(),
                    "refused": tally.buckets.iter().map(|b| b.refused).collect::<Vec<_>>(),
                    "max_wait_ms": tally.buckets.iter()
                        .map(|b| Duration::from_nanos(b.max_wait).as_secs_f64() * 1e3)
                        .collect::<Vec<_>>(),
                },
                "top_refused_keys": top_refused(tally, top).iter().map(|&(id, refused, requests)| json!({
                    "key": seen.keys.name(id), "refused": refused, "requests": requests,
                })).collect::<Vec<_>>(),
            })
        })
        .collect();
    json!({
        "traffic": {
            "description": traffic.describe(),
            "requests": seen.requests,
            "keys": seen.keys.len(),
            "last_arrival_s": Duration::from_nanos(seen.last).as_secs_f64(),
            "skipped_lines": seen.skipped,
            "skipped_first": seen.skipped_first.iter().map(ToString::to_string).collect::<Vec<_>>(),
        },
        "bucket_s": replay.tallies.first().map(|t| t.bucket_width().as_secs_f64()),
        "limiters": limiters,
    })
}
