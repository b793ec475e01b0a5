//! Checks the playground example's logic: the code is the example's own
//! (`examples/playground/main.rs`, included as a module), so what the README's
//! main command prints is what is tested here.
//!
//! Each replay runs on its own current-thread runtime with a paused clock,
//! so these are plain `#[test]`s and the instants they assert are exact.

#[path = "../examples/playground/main.rs"]
#[expect(
    dead_code,
    reason = "`main` and the printing helpers are for the example only"
)]
mod playground;

use std::time::Duration;

use clap::CommandFactory as _;
use clap::error::ErrorKind;
use playground::{
    Config, Entry, Flags, LIMITERS, Outcome, Record, SecondRow, parse_args, per_second, replay,
    replay_all, timeline, totals,
};
use tokio_ratelimit::ConfigError;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn entry(name: &str) -> &'static Entry {
    LIMITERS
        .iter()
        .find(|entry| entry.name == name)
        .unwrap_or_else(|| panic!("no limiter named {name}"))
}

fn run(name: &str, config: &Config) -> Vec<Record> {
    replay(entry(name), config).unwrap()
}

fn arrivals(records: &[Record]) -> Vec<Duration> {
    records.iter().map(|r| r.arrival).collect()
}

fn grants(records: &[Record]) -> Vec<Duration> {
    records.iter().filter_map(Record::granted).collect()
}

fn config(rate: f64, capacity: u32, interval: Duration, count: u32) -> Config {
    Config {
        rate,
        capacity,
        interval,
        count,
        warmup: Duration::from_secs(2),
        cold_factor: 3.0,
        limiters: LIMITERS.iter().collect(),
    }
}

/// The classic demo: capacity 2, 2/s, a request every 200 ms.
const DEMO: &str = "++-+-+--+-+--+-+--+-+--+-+--+-";

#[test]
fn the_three_meters_refuse_the_same_requests_in_the_demo() {
    let config = Config::default();
    for name in ["token", "leaky", "funnel"] {
        let records = run(name, &config);
        assert_eq!(timeline(&records), DEMO, "{name}");
        let expected: Vec<Duration> = (0..30).map(|i| ms(200 * i)).collect();
        assert_eq!(arrivals(&records), expected, "{name}");
        // The third request comes 100 ms too early, the fifth 200 ms, the
        // seventh 300 ms: retry_after is exact.
        assert_eq!(records[2].outcome, Outcome::Refused(ms(100)), "{name}");
        assert_eq!(records[4].outcome, Outcome::Refused(ms(200)), "{name}");
        assert_eq!(records[6].outcome, Outcome::Refused(ms(300)), "{name}");
    }
}

#[test]
fn token_wait_serves_everyone_at_the_rate_with_overlapping_waits() {
    let records = run("token-wait", &Config::default());
    // Request i arrives at 200i ms, whatever is still waiting ahead of it,
    // and gets a token at max(200i, 500(i - 1)) ms: two at once from the
    // full bucket, then one every 500 ms.
    for (i, record) in (0u64..).zip(&records) {
        assert_eq!(record.arrival, ms(200 * i));
        let grant = ms((200 * i).max((500 * i).saturating_sub(500)));
        assert_eq!(record.granted(), Some(grant), "request {i}");
    }
    assert_eq!(timeline(&records), format!("++{}", "w".repeat(28)));
    assert_eq!(totals(&records).longest_wait, Some(ms(8200)));
}

#[test]
fn the_shaper_admits_what_the_meter_admits_and_paces_it() {
    let config = Config::default();
    let meter = run("leaky", &config);
    let shaper = run("shaper", &config);
    for (m, s) in meter.iter().zip(&shaper) {
        assert_eq!(m.granted().is_some(), s.granted().is_some());
        if m.granted().is_none() {
            assert_eq!(s.outcome, Outcome::Overflow);
        }
    }
    // Out of the shaper, one request every 500 ms exactly.
    let expected: Vec<Duration> = (0..13).map(|k| ms(500 * k)).collect();
    assert_eq!(grants(&shaper), expected);
    assert_eq!(timeline(&shaper), "+w-w-w--w-w--w-w--w-w--w-w--w-");
}

#[test]
fn per_second_summary_counts_arrivals_and_grants() {
    let records = run("token", &Config::default());
    let row = |second, passed, refused| SecondRow {
        second,
        arrived: 5,
        passed,
        waited: 0,
        refused,
        granted: passed,
    };
    let mut expected = vec![row(0, 3, 2)];
    expected.extend((1..6).map(|s| row(s, 2, 3)));
    assert_eq!(per_second(&records), expected);

    // Grants are counted in the second they happen, after the last arrival
    // too: token-wait delivers 2 per second until 14 s.
    let waits = per_second(&run("token-wait", &Config::default()));
    let achieved: Vec<(u64, usize)> = waits.iter().map(|r| (r.second, r.granted)).collect();
    let mut expected = vec![(0, 3)];
    expected.extend((1..14).map(|s| (s, 2)));
    expected.push((14, 1));
    assert_eq!(achieved, expected);
}

#[test]
fn requests_are_issued_at_exact_instants_inside_a_tick() {
    // 1000/s, capacity 1, a request every 0.4 ms: arrivals fall between
    // tokio's 1 ms ticks.
    let config = config(1000.0, 1, Duration::from_micros(400), 12);
    let expected: Vec<Duration> = (0..12).map(|i| Duration::from_micros(400 * i)).collect();
    for meter in ["token", "leaky", "funnel"] {
        let records = run(meter, &config);
        assert_eq!(arrivals(&records), expected, "{meter}");
        assert_eq!(timeline(&records), "+--+--+--+--", "{meter}");
        assert_eq!(
            records[1].outcome,
            Outcome::Refused(Duration::from_micros(600))
        );
    }
    // Waiters are released on the first tick at or after their turn: the
    // k-th at k ms.
    let waiting = run("token-wait", &config);
    assert_eq!(arrivals(&waiting), expected);
    let ticks: Vec<Duration> = (0..12).map(ms).collect();
    assert_eq!(grants(&waiting), ticks);
}

#[test]
fn the_shaper_off_the_millisecond_grid() {
    // A request every 0.3 ms into a bucket of 3 draining 1 per ms.
    let records = run("shaper", &config(1000.0, 3, Duration::from_micros(300), 12));
    let expected: Vec<Duration> = (0..12).map(|i| Duration::from_micros(300 * i)).collect();
    assert_eq!(arrivals(&records), expected);
    assert_eq!(timeline(&records), "+ww-w--w--w-");
    assert_eq!(grants(&records), [ms(0), ms(1), ms(2), ms(3), ms(4), ms(5)]);
    assert_eq!(records[3].outcome, Outcome::Overflow);
}

#[test]
fn a_fractional_rate_is_exact() {
    // 1.5/s: a permit every 666.666… ms; capacity 1; a request every 250 ms.
    let records = run("token-wait", &config(1.5, 1, ms(250), 4));
    let grants = grants(&records);
    // 2/1.5 s = 1333.33… ms, released on the 1334 ms tick.
    assert_eq!(grants, [ms(0), ms(667), ms(1334), ms(2000)]);
}

fn parse(args: &[&str]) -> Result<Config, clap::Error> {
    parse_args(args.iter().copied())
}

fn names(config: &Config) -> Vec<&'static str> {
    config.limiters.iter().map(|e| e.name).collect()
}

#[test]
fn the_flags_are_a_valid_clap_command() {
    // clap's own consistency checks (names, defaults, value names).
    Flags::command().debug_assert();
}

#[test]
fn flags_map_onto_the_config() {
    let config = parse(&[]).unwrap();
    assert_eq!(
        (config.rate, config.capacity, config.interval, config.count),
        (2.0, 2, ms(200), 30)
    );
    assert_eq!((config.warmup, config.cold_factor), (ms(2000), 3.0));
    let all = [
        "token",
        "token-wait",
        "leaky",
        "shaper",
        "funnel",
        "bursty",
        "warmup",
    ];
    assert_eq!(names(&config), all);

    let config = parse(&[
        "--rate",
        " 0.5 ",
        "--capacity=7",
        "--interval",
        "12.5",
        "--count",
        " 3 ",
        "--limiters",
        "funnel, token,funnel",
        "--warmup",
        "0.5",
        "--cold-factor=10",
    ])
    .unwrap();
    assert_eq!(
        (config.rate, config.capacity, config.interval, config.count),
        (0.5, 7, Duration::from_micros(12_500), 3)
    );
    assert_eq!((config.warmup, config.cold_factor), (ms(500), 10.0));
    assert_eq!(names(&config), ["funnel", "token"]);
    assert_eq!(names(&parse(&["--limiters", "shaper,all"]).unwrap()), {
        let mut order = vec!["shaper"];
        order.extend(all.iter().filter(|&&n| n != "shaper"));
        order
    });
    // A repeated flag: the last one wins.
    let config = parse(&["--capacity", "1", "--capacity", "3"]).unwrap();
    assert_eq!(config.capacity, 3);

    for help in [&["--rate", "3", "--help"][..], &["-h"]] {
        assert_eq!(parse(help).unwrap_err().kind(), ErrorKind::DisplayHelp);
    }
}

#[test]
fn bad_flags_are_refused_with_a_reason() {
    let refused: &[(&[&str], ErrorKind, &str)] = &[
        (&["--nope"], ErrorKind::UnknownArgument, "'--nope'"),
        (&["stray"], ErrorKind::UnknownArgument, "'stray'"),
        (&["--rate"], ErrorKind::InvalidValue, "'--rate <R>'"),
        // A flag is not a value (a negative number is, and is refused below).
        (
            &["--rate", "--count", "3"],
            ErrorKind::InvalidValue,
            "'--rate <R>'",
        ),
    ];
    // The flag as clap names it, the value, and the reason after clap's
    // "invalid value '…' for '…': ".
    let invalid: &[(&str, &str, &str)] = &[
        ("--rate <R>", "fast", "expects a number"),
        ("--rate <R>", "-2", "must be a positive number"),
        ("--rate <R>", "NaN", "must be a positive number"),
        ("--capacity <N>", "0", "must be at least 1"),
        (
            "--capacity <N>",
            "2.5",
            "expects a whole number of at least 1",
        ),
        ("--capacity <N>", "4294967296", "must be at most 4294967295"),
        ("--count <N>", "x", "expects a whole number"),
        ("--count <N>", "100001", "must be at most 100000"),
        ("--interval <MS>", "-1", "must be a positive number"),
        (
            "--interval <MS>",
            "1e-9",
            "must be at least 1 ns (0.000001 ms)",
        ),
        ("--interval <MS>", "1e30", "must be at most 365 days"),
        (
            "--limiters <LIST>",
            "token,bogus",
            "unknown limiter 'bogus' (known: token, token-wait, leaky, shaper, funnel, bursty, \
             warmup)",
        ),
        ("--limiters <LIST>", "token,", "empty limiter name"),
        ("--cold-factor <F>", "0.5", "must be at least 1"),
        ("--warmup <SECS>", "0", "must be a positive number"),
        ("--warmup <SECS>", "1e10", "must be at most 365 days"),
    ];
    let invalid = invalid.iter().map(|&(flag, value, reason)| {
        let name = flag.split(' ').next().unwrap();
        let message = format!("invalid value '{value}' for '{flag}': {reason}");
        (vec![name, value], ErrorKind::ValueValidation, message)
    });
    let refused = refused
        .iter()
        .map(|&(args, kind, message)| (args.to_vec(), kind, message.to_owned()));
    for (args, kind, message) in refused.chain(invalid) {
        let error = parse(&args).unwrap_err();
        assert_eq!(error.kind(), kind, "{args:?}: {error}");
        let text = error.to_string();
        assert!(text.contains(&message), "{args:?}: {text}");
        assert!(text.contains("try '--help'"), "{args:?}: {text}");
    }
    // The largest values allowed.
    let config = parse(&[
        "--capacity",
        "4294967295",
        "--count",
        "100000",
        "--interval",
        "1",
    ]);
    assert_eq!(
        config.map(|c| (c.capacity, c.count)).unwrap(),
        (u32::MAX, 100_000)
    );
}

#[test]
fn the_traffic_lasts_a_year_at_most() {
    // Two requests a year apart: the longest traffic allowed.
    let year = parse(&["--count", "2", "--interval", "31536000000"]).unwrap();
    assert_eq!(year.interval, Duration::from_secs(365 * 24 * 3600));
    // Each flag is fine alone; together the traffic lasts 1000 s × 99 999.
    for args in [
        ["--count", "3", "--interval", "31536000000"],
        ["--count", "100000", "--interval", "1000000"],
    ] {
        let error = parse(&args).unwrap_err();
        assert_eq!(error.kind(), ErrorKind::ValueValidation);
        let message = format!(
            "{} {} × --interval lasts more than the playground's limit of 365 days",
            args[0], args[1]
        );
        assert!(error.to_string().contains(&message), "{error}");
    }
}

#[test]
fn a_rate_the_builders_reject_is_a_config_error() {
    let config = parse(&["--rate", "2e9", "--limiters", "funnel,token"]).unwrap();
    let (name, error) = replay_all(&config).unwrap_err();
    assert_eq!(name, "funnel");
    assert!(matches!(error, ConfigError::InvalidRate { .. }), "{error}");
}

#[test]
fn the_report_shows_the_timelines_side_by_side() {
    let config = Config::default();
    let runs = replay_all(&config).unwrap();
    let mut report = String::new();
    playground::render(&mut report, &config, &runs).unwrap();
    for row in [
        format!("token      |{DEMO}|"),
        "token-wait |++wwwwwwwwwwwwwwwwwwwwwwwwwwww|".to_owned(),
        format!("leaky      |{DEMO}|"),
        "shaper     |+w-w-w--w-w--w-w--w-w--w-w--w-|".to_owned(),
        format!("funnel     |{DEMO}|"),
        "bursty     |+wwwwwwwwwwwwwwwwwwwwwwwwwwwww|".to_owned(),
        "warmup     |+wwwwwwwwwwwwwwwwwwwwwwwwwwwww|".to_owned(),
    ] {
        assert!(report.contains(&row), "missing {row:?} in\n{report}");
    }
    assert!(report.contains("+  passed at once"));
    let widest = report.lines().map(|l| l.chars().count()).max().unwrap();
    assert!(widest <= 100, "a line of {widest} columns");
}

#[test]
fn the_warm_up_limiter_ramps_to_the_rate() {
    // 5/s, warm-up 2 s, cold factor 3, ten requests a second: a cold
    // limiter spaces grants up to 3 × 200 ms apart, and the gaps shrink to
    // the stable 200 ms as it warms up, then stay there.
    let mut config = config(5.0, 2, Duration::from_millis(100), 40);
    config.limiters = vec![LIMITERS.iter().find(|e| e.name == "warmup").unwrap()];
    let records = run("warmup", &config);
    let granted = grants(&records);
    let gaps: Vec<u128> = granted
        .windows(2)
        .map(|w| w[1].saturating_sub(w[0]).as_millis())
        .collect();
    assert_eq!(&gaps[..6], [560, 480, 400, 320, 240, 200]);
    assert!(gaps[5..].iter().all(|&gap| gap == 200), "{gaps:?}");
}

#[test]
fn the_bursty_limiter_pays_later() {
    // Guava's SmoothBursty at the demo's 2/s with a 1 s burst: the first
    // request is free, every later one waits for the debt before it.
    let config = Config::default();
    let records = run("bursty", &config);
    let granted = grants(&records);
    assert_eq!(granted.len(), 30);
    assert_eq!(granted[0], Duration::ZERO);
    assert!(
        granted
            .windows(2)
            .all(|w| w[1].saturating_sub(w[0]) == Duration::from_millis(500)),
        "{granted:?}"
    );
}
