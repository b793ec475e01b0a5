//! The playground: one traffic pattern, replayed through every limiter.
//!
//! It sends the same requests — one every `--interval` — to each limiter
//! in turn and shows, for each limiter, which requests pass at once, which
//! wait (and how long), and which are refused (with the `retry_after` the
//! limiter reports, or `Overflow` when a leaky bucket is full). Then it
//! compares the limiters on one timeline, a character per request.
//!
//! Everything runs in virtual time, on a current-thread tokio runtime whose
//! clock is paused: a replay that spans minutes takes no real time, and the
//! output is the same on every run. Each request is issued at its own
//! instant by the replay, whatever the requests before it are still
//! waiting for, so waits overlap as they would in a real service.
//!
//! The default pattern is the classic demo: a capacity of 2, a
//! rate of 2 per second, one request every 200 ms, 30 requests. There,
//! the token bucket, the leaky bucket's meter and the funnel refuse
//! exactly the same requests (`++-+-+--+-...`): they are the same
//! arithmetic.
//!
//! ```text
//! cargo run --release -p playground
//! cargo run --release -p playground -- --limiters token,shaper
//! cargo run --release -p playground -- --rate 10 --capacity 5 --interval 50 --count 60
//! cargo run --release -p playground -- --rate 0.5 --interval 1500 --count 12
//! cargo run --release -p playground -- --rate 1000 --capacity 1 --interval 0.4 --count 40
//! cargo run --release -p playground -- --help
//! ```
//!
//! Limiters (`--limiters`, comma-separated; default: all of them):
//!
//! | name | call | what a request does |
//! |---|---|---|
//! | `token` | `TokenBucket::try_acquire` | takes a token at once, or is refused with `retry_after` |
//! | `token-wait` | `TokenBucket::acquire` | waits its turn (FIFO); nobody is refused |
//! | `leaky` | `LeakyBucket::try_acquire` | the meter: pours one unit if it fits, or is refused |
//! | `shaper` | `LeakyBucket::acquire` | pours one unit and waits for the water ahead to drain; `Overflow` if full |
//! | `funnel` | `Funnel::try_acquire` | the lazy meter, with no background task |
//!
//! A limiter is one entry of the [`LIMITERS`] table: a name, a line of
//! description and a function that builds it and returns how one request
//! goes through it. Adding a limiter is adding an entry.
//!
//! tokio's timer fires on 1 ms ticks, so a waiter is released on the first
//! tick at or after its turn: with an interval that is not a whole number
//! of milliseconds, waits end on the tick (requests themselves are issued
//! at their exact instants).
//!
//! # The tool
//!
//! Any of `--traffic`, `--trace`, `--limiter`, `--svg` or `--json` turns
//! the demo into a replay of a whole traffic, answered with totals, rates
//! per second, the keys most refused, a chart and JSON (`--help` has
//! examples). One module per concern:
//!
//! | module | what it holds |
//! |---|---|
//! | `traffic` | generated patterns (seeded) and recorded traces, one arrival at a time |
//! | `spec` | `--limiter NAME[:KNOB=V,…]`: a configuration, and building it |
//! | `engine` | the replay: the meters' streaming pass, the waiters' task pass, the tallies |
//! | `summary` | the text report and the JSON summary |
//! | `chart` | the SVG chart (plotters) |
//! | `tool` | the tool's flags and running it |
//!
//! This file is the demo: the table of limiters, the flags, the request-by-
//! request replay (whose clock the waiters' pass reuses) and its report.

pub(crate) mod chart;
pub(crate) mod engine;
pub(crate) mod spec;
pub(crate) mod summary;
pub(crate) mod tool;
pub(crate) mod traffic;

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::fmt::{self, Write as _};
use std::future::Future;
use std::io::Write as _;
use std::path::PathBuf;
use std::pin::Pin;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use clap::error::ErrorKind;
use clap::{CommandFactory as _, Parser};
use tokio::time::{self, Instant};
use tokio_ratelimit::{
    AcquireError, ConfigError, Funnel, LeakyBucket, Limiter, Rate, SmoothBursty, SmoothWarmingUp,
    TokenBucket, TryAcquireError,
};

// ---------------------------------------------------------------------------
// The limiters
// ---------------------------------------------------------------------------

/// One limiter in one mode: a row of the playground.
#[derive(Debug)]
pub(crate) struct Entry {
    /// The name used by `--limiters` and in the chart.
    pub(crate) name: &'static str,
    /// The call each request makes.
    pub(crate) call: &'static str,
    /// What the limiter does with a request, in a line.
    pub(crate) about: &'static str,
    /// Builds the limiter for a configuration (inside the replay's runtime)
    /// and returns how one request goes through it.
    pub(crate) build: fn(&Config) -> Result<Request, ConfigError>,
}

/// Runs one request through a limiter. Called at the request's arrival
/// instant; the future resolves when the limiter has decided.
pub(crate) type Request = Arc<dyn Fn() -> Decision + Send + Sync>;

/// A limiter's decision on one request, still to come.
pub(crate) type Decision = Pin<Box<dyn Future<Output = Verdict> + Send>>;

/// Every limiter the playground knows, in the order it shows them.
pub(crate) const LIMITERS: &[Entry] = &[
    Entry {
        name: "token",
        call: "TokenBucket::try_acquire",
        about: "a bucket of tokens, full at the start, refilled at the rate up to the capacity; \
                a request takes a token at once or is refused with retry_after",
        build: |config| Ok(try_each(token_bucket(config)?)),
    },
    Entry {
        name: "token-wait",
        call: "TokenBucket::acquire",
        about: "the same bucket, but a request waits in line (FIFO) until a token is its own; \
                nobody is refused, the excess waits",
        build: |config| Ok(wait_each(token_bucket(config)?)),
    },
    Entry {
        name: "leaky",
        call: "LeakyBucket::try_acquire",
        about: "the leaky bucket as a meter: a request pours one unit if it fits \
                (the bucket drains at the rate), or is refused with retry_after",
        build: |config| Ok(try_each(leaky_bucket(config)?)),
    },
    Entry {
        name: "shaper",
        call: "LeakyBucket::acquire",
        about: "the leaky bucket as a shaper: a request pours one unit and waits for the water \
                ahead of it to drain, so output is paced at the rate; if it does not fit it overflows",
        build: |config| Ok(wait_each(leaky_bucket(config)?)),
    },
    Entry {
        name: "funnel",
        call: "Funnel::try_acquire",
        about: "the lazy meter, no background task: the same numbers as the leaky meter \
                and the full token bucket",
        build: |config| Ok(try_each(funnel(config)?)),
    },
    // Any other `Limiter` fits in a few lines, like Guava's two below.
    Entry {
        name: "bursty",
        call: "SmoothBursty::acquire",
        about: "Guava's SmoothBursty: idle time stores permits (up to capacity) that go out \
                at once; a request waits for the debt of the one before it, then pays for \
                itself (the first is free)",
        build: |config| {
            let bursty = SmoothBursty::builder()
                .permits_per_second(config.rate)
                .max_burst(Duration::from_secs_f64(
                    f64::from(config.capacity) / config.rate,
                ))
                .build()?;
            Ok(wait_each(bursty))
        },
    },
    Entry {
        name: "warmup",
        call: "SmoothWarmingUp::acquire",
        about: "Guava's SmoothWarmingUp: starts cold, permits spaced cold-factor × 1/rate \
                apart, and ramps to the rate over the warm-up period (--warmup, --cold-factor)",
        build: |config| {
            let warming = SmoothWarmingUp::builder()
                .permits_per_second(config.rate)
                .warmup(config.warmup)
                .cold_factor(config.cold_factor)
                .build()?;
            Ok(wait_each(warming))
        },
    },
];

fn token_bucket(config: &Config) -> Result<TokenBucket, ConfigError> {
    TokenBucket::builder()
        .rate(config.rate())
        .capacity(config.capacity)
        .build()
}

fn leaky_bucket(config: &Config) -> Result<LeakyBucket, ConfigError> {
    LeakyBucket::builder()
        .rate(config.rate())
        .capacity(config.capacity)
        .build()
}

fn funnel(config: &Config) -> Result<Funnel, ConfigError> {
    Funnel::builder()
        .rate(config.rate())
        .capacity(config.capacity)
        .build()
}

/// Each request calls `try_acquire()` once: it passes now, or is refused.
pub(crate) fn try_each<L: Limiter + 'static>(limiter: L) -> Request {
    Arc::new(move || {
        let verdict = Verdict::from(limiter.try_acquire());
        Box::pin(async move { verdict })
    })
}

/// Each request awaits `acquire()`: it passes when its turn comes, or fails.
pub(crate) fn wait_each<L: Limiter + 'static>(limiter: L) -> Request {
    let limiter = Arc::new(limiter);
    Arc::new(move || {
        let limiter = Arc::clone(&limiter);
        Box::pin(async move { Verdict::from(limiter.acquire().await) })
    })
}

/// What a limiter said to one request (the replay adds the timing).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Go ahead.
    Granted,
    /// Not now; the same request would pass after this long.
    Limited(Duration),
    /// A leaky bucket is full: the request is discarded.
    Overflow,
    /// Any other error (none is expected in the playground).
    Failed(String),
}

impl From<Result<(), TryAcquireError>> for Verdict {
    fn from(result: Result<(), TryAcquireError>) -> Verdict {
        match result {
            Ok(()) => Verdict::Granted,
            Err(TryAcquireError::Limited { retry_after }) => Verdict::Limited(retry_after),
            Err(e) => Verdict::Failed(e.to_string()),
        }
    }
}

impl From<Result<(), AcquireError>> for Verdict {
    fn from(result: Result<(), AcquireError>) -> Verdict {
        match result {
            Ok(()) => Verdict::Granted,
            Err(AcquireError::Overflow) => Verdict::Overflow,
            Err(e) => Verdict::Failed(e.to_string()),
        }
    }
}

// ---------------------------------------------------------------------------
// Configuration and flags
// ---------------------------------------------------------------------------

/// The traffic pattern and the limit every limiter is built with.
#[derive(Debug, Clone)]
pub(crate) struct Config {
    /// Permits per second.
    pub(crate) rate: f64,
    /// The burst: tokens in the bucket, or units of water it holds.
    pub(crate) capacity: u32,
    /// Time between two requests.
    pub(crate) interval: Duration,
    /// Number of requests.
    pub(crate) count: u32,
    /// The warm-up period of the `warmup` limiter.
    pub(crate) warmup: Duration,
    /// The cold factor of the `warmup` limiter.
    pub(crate) cold_factor: f64,
    /// The limiters to replay the traffic through, in order.
    pub(crate) limiters: Vec<&'static Entry>,
}

impl Default for Config {
    /// The classic demo, through every limiter: the flags'
    /// defaults, which live once, on [`Flags`].
    fn default() -> Config {
        parse_args(std::iter::empty::<&str>()).expect("the flags' defaults are valid")
    }
}

impl Config {
    /// The limit as a [`Rate`] (an invalid one is reported by `build()`).
    pub(crate) fn rate(&self) -> Rate {
        Rate::per_second_f64(self.rate)
    }

    /// When request `index` (from 0) arrives, since the start.
    pub(crate) fn arrival(&self, index: u32) -> Duration {
        self.interval * index
    }
}

/// The command line. Each flag's value is checked by its own parser below,
/// so a bad one is reported by clap with the flag's name; what depends on
/// two flags is checked by [`parse_args`]. Numeric flags take negative
/// numbers as values, so that `--rate -2` is refused as not positive rather
/// than as an unknown flag `-2`.
#[derive(Debug, Parser)]
#[command(
    name = "playground",
    about = "Replays a traffic pattern through tokio-ratelimit's limiters, in virtual time.",
    // This doc comment is for readers of the code, not for `--help`.
    long_about = None,
    override_usage = "cargo run --release -p playground -- [OPTIONS]",
    after_help = after_help(),
    // A repeated flag: the last one wins, as a shell alias expects.
    args_override_self = true
)]
pub(crate) struct Flags {
    /// Permits per second, may be fractional
    #[arg(long, value_name = "R", default_value = "2", allow_negative_numbers = true,
          value_parser = positive_float)]
    rate: f64,
    /// The burst: bucket size in tokens or units
    #[arg(long, value_name = "N", default_value = "2", allow_negative_numbers = true,
          value_parser = capacity)]
    capacity: u32,
    /// Milliseconds between two requests, may be fractional
    #[arg(long, value_name = "MS", default_value = "200", allow_negative_numbers = true,
          value_parser = interval)]
    interval: Duration,
    /// Number of requests, at most 100000
    #[arg(long, value_name = "N", default_value = "30", allow_negative_numbers = true,
          value_parser = count)]
    count: u32,
    /// Comma-separated names, or 'all'
    #[arg(long, value_name = "LIST", default_value = "all", value_parser = limiter_list)]
    limiters: Chosen,
    /// Warm-up period of the 'warmup' limiter, in seconds
    #[arg(long, value_name = "SECS", default_value = "2", allow_negative_numbers = true,
          value_parser = warmup)]
    warmup: Duration,
    /// Its cold factor, at least 1
    #[arg(long, value_name = "F", default_value = "3", allow_negative_numbers = true,
          value_parser = cold_factor)]
    cold_factor: f64,

    // The tool: any of these flags replays a whole traffic and answers
    // with totals, a chart and JSON instead of the demo's request list.
    /// Generated traffic, PATTERN[:KNOB=V,...] (see below)
    #[arg(long, value_name = "PATTERN", value_parser = tool::pattern,
          conflicts_with = "trace", help_heading = "Traffic")]
    traffic: Option<tool::PatternSpec>,
    /// How long generated traffic lasts (250ms, 90s, 2m, 1h, 1d)
    #[arg(long, value_name = "SPAN", default_value = "60s", value_parser = tool::span,
          help_heading = "Traffic")]
    duration: Duration,
    /// The generator's seed: the same seed, the same traffic
    #[arg(long, value_name = "N", default_value = "1", help_heading = "Traffic")]
    seed: u64,
    /// A recorded trace: one request a line (CSV, JSON lines or an access log)
    #[arg(long, value_name = "FILE", help_heading = "Traffic")]
    trace: Option<PathBuf>,
    /// The trace's format: auto, csv, jsonl or access-log
    #[arg(long, value_name = "FORMAT", default_value = "auto", value_parser = tool::format,
          help_heading = "Traffic")]
    format: traffic::Format,
    /// A bad line of the trace: stop there, or skip it (with a warning)
    #[arg(long, value_name = "WHAT", default_value = "stop", value_parser = tool::on_error,
          help_heading = "Traffic")]
    on_error: traffic::OnError,
    /// A limiter to replay through, NAME[:KNOB=V,...]; repeat to compare
    /// (instead of --limiters)
    #[arg(long = "limiter", value_name = "SPEC", action = clap::ArgAction::Append,
          help_heading = "Limiters")]
    limiter: Vec<String>,
    /// Write the chart to FILE as SVG
    #[arg(long, value_name = "FILE", help_heading = "Answers")]
    svg: Option<PathBuf>,
    /// Write the JSON summary to FILE ('-': to stdout, instead of the text)
    #[arg(long, value_name = "FILE", help_heading = "Answers")]
    json: Option<PathBuf>,
    /// Write every key's counts to FILE, one JSON line per key: passed, waited
    /// and refused per limiter ('-': to stdout, instead of the text)
    #[arg(long, value_name = "FILE", help_heading = "Answers")]
    keys: Option<PathBuf>,
    /// The span each per-second row, chart point and JSON bucket counts
    #[arg(long, value_name = "SPAN", default_value = "1s", value_parser = tool::span,
          help_heading = "Answers")]
    bucket: Duration,
    /// How many of the most refused keys to list, per limiter
    #[arg(long, value_name = "N", default_value = "5", help_heading = "Answers")]
    top: usize,
}

/// The value of `--limiters`: one flag, one list (a bare `Vec` field would
/// make clap expect the flag once per name).
#[derive(Debug, Clone)]
struct Chosen(Vec<&'static Entry>);

/// The most requests a replay takes.
const MAX_COUNT: u32 = 100_000;
/// The longest a replay's traffic may last (tokio's timer reaches ~2 years).
const MAX_SPAN: Duration = Duration::from_secs(365 * 24 * 3600);

/// Parses the flags (without the program name). `--flag value` and
/// `--flag=value` are both accepted; `--help` and `-h` come back as an
/// error of kind [`ErrorKind::DisplayHelp`], whose `exit()` prints the help.
pub(crate) fn parse_args<I>(args: I) -> Result<Config, clap::Error>
where
    I: IntoIterator,
    I::Item: Into<OsString>,
{
    demo_config(&parse_flags(args)?)
}

/// What the command line asks for.
#[derive(Debug)]
pub(crate) enum Command {
    /// The demo: every request of a short pattern, one by one.
    Demo(Config),
    /// The tool: a whole traffic, answered with totals, a chart and JSON.
    Tool(tool::Plan),
}

/// Parses the flags (without the program name) into what to do.
pub(crate) fn parse_command<I>(args: I) -> Result<Command, clap::Error>
where
    I: IntoIterator,
    I::Item: Into<OsString>,
{
    let flags = parse_flags(args)?;
    let config = demo_config(&flags)?;
    if flags.traffic.is_none()
        && flags.trace.is_none()
        && flags.limiter.is_empty()
        && flags.svg.is_none()
        && flags.json.is_none()
    {
        return Ok(Command::Demo(config));
    }
    tool::plan(&flags, &config).map(Command::Tool)
}

fn parse_flags<I>(args: I) -> Result<Flags, clap::Error>
where
    I: IntoIterator,
    I::Item: Into<OsString>,
{
    let program = OsString::from("playground");
    Flags::try_parse_from(std::iter::once(program).chain(args.into_iter().map(Into::into)))
}

/// The demo's configuration, checked.
fn demo_config(flags: &Flags) -> Result<Config, clap::Error> {
    let span = flags.interval.checked_mul(flags.count - 1);
    if span.is_none_or(|span| span > MAX_SPAN) {
        return Err(Flags::command().error(
            ErrorKind::ValueValidation,
            format!(
                "--count {} × --interval lasts more than the playground's limit of {} days",
                flags.count,
                MAX_SPAN.as_secs() / 86_400
            ),
        ));
    }
    Ok(Config {
        rate: flags.rate,
        capacity: flags.capacity,
        interval: flags.interval,
        count: flags.count,
        warmup: flags.warmup,
        cold_factor: flags.cold_factor,
        limiters: flags.limiters.0.clone(),
    })
}

// The value parsers. Each message completes clap's "invalid value '…' for
// '--flag <V>': ".

fn positive_float(value: &str) -> Result<f64, String> {
    match value.trim().parse::<f64>() {
        Ok(x) if x.is_finite() && x > 0.0 => Ok(x),
        Ok(_) => Err("must be a positive number".to_owned()),
        Err(_) => Err("expects a number".to_owned()),
    }
}

fn positive_whole(value: &str, max: u32) -> Result<u32, String> {
    let value = value.trim();
    let n = value.parse::<u64>().map_err(|_| {
        if value.starts_with('-') || value.parse::<f64>().is_ok() {
            "expects a whole number of at least 1".to_owned()
        } else {
            "expects a whole number".to_owned()
        }
    })?;
    match u32::try_from(n) {
        Ok(0) => Err("must be at least 1".to_owned()),
        Ok(n) if n <= max => Ok(n),
        _ => Err(format!("must be at most {max}")),
    }
}

fn capacity(value: &str) -> Result<u32, String> {
    positive_whole(value, u32::MAX)
}

fn count(value: &str) -> Result<u32, String> {
    positive_whole(value, MAX_COUNT)
}

fn interval(value: &str) -> Result<Duration, String> {
    let ms = positive_float(value)?;
    match Duration::try_from_secs_f64(ms / 1000.0)
        .ok()
        .filter(|d| *d <= MAX_SPAN)
    {
        Some(d) if !d.is_zero() => Ok(d),
        Some(_) => Err("must be at least 1 ns (0.000001 ms)".to_owned()),
        None => Err(format!(
            "must be at most {} days",
            MAX_SPAN.as_secs() / 86_400
        )),
    }
}

fn warmup(value: &str) -> Result<Duration, String> {
    let secs = positive_float(value)?;
    Duration::try_from_secs_f64(secs)
        .ok()
        .filter(|d| *d <= MAX_SPAN)
        .ok_or_else(|| format!("must be at most {} days", MAX_SPAN.as_secs() / 86_400))
}

fn cold_factor(value: &str) -> Result<f64, String> {
    let factor = positive_float(value)?;
    if factor < 1.0 {
        return Err("must be at least 1".to_owned());
    }
    Ok(factor)
}

/// Names in the order given, each once; `all` stands for every limiter.
fn limiter_list(value: &str) -> Result<Chosen, String> {
    let mut chosen: Vec<&'static Entry> = Vec::new();
    for name in value.split(',').map(str::trim) {
        let found: Vec<&'static Entry> = match name {
            "all" => LIMITERS.iter().collect(),
            "" => return Err("empty limiter name".to_owned()),
            _ => match LIMITERS.iter().find(|entry| entry.name == name) {
                Some(entry) => vec![entry],
                None => return Err(format!("unknown limiter '{name}' (known: {})", names())),
            },
        };
        for entry in found {
            if !chosen.iter().any(|e| e.name == entry.name) {
                chosen.push(entry);
            }
        }
    }
    Ok(Chosen(chosen))
}

fn names() -> String {
    LIMITERS
        .iter()
        .map(|entry| entry.name)
        .collect::<Vec<_>>()
        .join(", ")
}

/// The end of the help: the limiters and a few command lines.
fn after_help() -> String {
    let mut text = String::from("Limiters (--limiters for the demo; names of --limiter specs):\n");
    for (name, _, _, call) in spec::KINDS {
        let _ = writeln!(text, "  {name:<11} {call}");
    }
    text.push_str(
        "\nExamples, the demo (every request, one by one):\n  \
           cargo run --release -p playground -- --limiters token,shaper\n  \
           cargo run --release -p playground -- --limiters warmup --rate 5 --interval 100 --count 40\n  \
           cargo run --release -p playground -- --rate 10 --capacity 5 --interval 50 --count 60\n",
    );
    text.push_str(tool::HELP);
    text
}

// ---------------------------------------------------------------------------
// The replay
// ---------------------------------------------------------------------------

/// What happened to one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Record {
    /// When the request was issued, since the start of the replay.
    pub(crate) arrival: Duration,
    /// What the limiter did with it.
    pub(crate) outcome: Outcome,
}

/// The fate of one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// Granted at once.
    Passed,
    /// Granted after waiting this long.
    Waited(Duration),
    /// Refused; the limiter said to retry after this long.
    Refused(Duration),
    /// Refused: the leaky bucket was full.
    Overflow,
    /// An unexpected error.
    Failed(String),
}

impl Record {
    /// When the request was granted, since the start, if it was.
    pub(crate) fn granted(&self) -> Option<Duration> {
        match self.outcome {
            Outcome::Passed => Some(self.arrival),
            Outcome::Waited(wait) => Some(self.arrival + wait),
            _ => None,
        }
    }

    /// The request's character on the timeline.
    pub(crate) fn symbol(&self) -> char {
        match self.outcome {
            Outcome::Passed => '+',
            Outcome::Waited(_) => 'w',
            Outcome::Refused(_) | Outcome::Overflow => '-',
            Outcome::Failed(_) => '!',
        }
    }
}

/// One limiter's replay.
#[derive(Debug)]
pub(crate) struct Run {
    /// The limiter.
    pub(crate) entry: &'static Entry,
    /// One record per request, in arrival order.
    pub(crate) records: Vec<Record>,
}

/// Replays the traffic through every chosen limiter.
///
/// The first limiter that cannot be built stops it: its name and the
/// builder's error.
pub(crate) fn replay_all(config: &Config) -> Result<Vec<Run>, (&'static str, ConfigError)> {
    config
        .limiters
        .iter()
        .map(|&entry| {
            let records = replay(entry, config).map_err(|e| (entry.name, e))?;
            Ok(Run { entry, records })
        })
        .collect()
}

/// Replays the traffic through one limiter, on a fresh current-thread
/// runtime with a paused clock, and returns one record per request.
///
/// # Errors
///
/// The limiter's `ConfigError` when it cannot be built.
///
/// # Panics
///
/// If the runtime cannot be built or a request task panics.
pub(crate) fn replay(entry: &Entry, config: &Config) -> Result<Vec<Record>, ConfigError> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .expect("a current-thread tokio runtime");
    runtime.block_on(async {
        let request = (entry.build)(config)?;
        let clock = Clock::new();
        let mut tasks = Vec::new();
        for index in 0..config.count {
            clock.advance_to(config.arrival(index)).await;
            tasks.push(tokio::spawn(clock.issue(Arc::clone(&request))));
        }
        // Back onto the millisecond grid before the waits still pending end
        // (see `Clock::advance_to`).
        clock.advance_to(clock.next_tick()).await;
        let mut records = Vec::with_capacity(tasks.len());
        for task in tasks {
            records.push(task.await.expect("a request task panicked"));
        }
        Ok(records)
    })
}

/// tokio's timer resolution: timers fire on 1 ms ticks counted from the
/// runtime's start.
const TICK: Duration = Duration::from_millis(1);

/// The replay's virtual clock, and a count of what the request tasks have
/// done (to tell when they are all blocked).
struct Clock {
    start: Instant,
    progress: Arc<AtomicUsize>,
}

impl Clock {
    /// Starts counting from now. The runtime is fresh, so now is on its
    /// millisecond grid.
    fn new() -> Clock {
        Clock {
            start: Instant::now(),
            progress: Arc::new(AtomicUsize::new(0)),
        }
    }

    fn now(&self) -> Duration {
        self.start.elapsed()
    }

    /// The first tick after now (now itself when it is a tick).
    fn next_tick(&self) -> Duration {
        let now = self.now();
        let tick = tick_of(now);
        if tick == now { now } else { tick + TICK }
    }

    /// A task that issues one request now and records what happens.
    fn issue(&self, request: Request) -> impl Future<Output = Record> + Send + 'static {
        let (start, progress) = (self.start, Arc::clone(&self.progress));
        async move {
            progress.fetch_add(1, Ordering::Relaxed);
            let issued = Instant::now();
            let verdict = request().await;
            let waited = issued.elapsed();
            progress.fetch_add(1, Ordering::Relaxed);
            let outcome = match verdict {
                Verdict::Granted if waited.is_zero() => Outcome::Passed,
                Verdict::Granted => Outcome::Waited(waited),
                Verdict::Limited(retry_after) => Outcome::Refused(retry_after),
                Verdict::Overflow => Outcome::Overflow,
                Verdict::Failed(error) => Outcome::Failed(error),
            };
            Record {
                arrival: issued.duration_since(start),
                outcome,
            }
        }
    }

    /// Moves the paused clock to `target` (since the start), letting every
    /// timer on the way fire at its own tick and every task it wakes run
    /// before time moves on.
    ///
    /// Between ticks, `sleep` cannot stop the clock anywhere but on a tick,
    /// so an instant inside a tick is reached with `tokio::time::advance`.
    /// `advance` moves the clock at once, even while tasks woken at the
    /// current instant have still to run; so first let them run
    /// ([`settle`](Self::settle)). From inside a tick the clock steps onto
    /// the next tick with `advance` too, because tokio's auto-advance would
    /// keep the offset into the tick and leave the grid.
    async fn advance_to(&self, target: Duration) {
        loop {
            let now = self.now();
            if now >= target {
                return;
            }
            let tick = tick_of(now);
            let target_tick = tick_of(target);
            if tick == now && target_tick > now {
                // On the grid: sleeping fires every timer up to the target's
                // tick in order, each at its own instant.
                time::sleep_until(self.start + target_tick).await;
                continue;
            }
            self.settle().await;
            let next_tick = tick + TICK;
            time::advance(target.min(next_tick).saturating_sub(now)).await;
        }
    }

    /// Returns once every task that can run at the current instant has run:
    /// when a round of the scheduler (a `yield_now`) has let no request
    /// task start or finish, twice in a row.
    async fn settle(&self) {
        let mut quiet = 0;
        while quiet < 2 {
            let before = self.progress.load(Ordering::Relaxed);
            tokio::task::yield_now().await;
            if self.progress.load(Ordering::Relaxed) == before {
                quiet += 1;
            } else {
                quiet = 0;
            }
        }
    }
}

/// The tick an offset (since the runtime's start) falls in: the offset
/// rounded down to a whole millisecond.
fn tick_of(offset: Duration) -> Duration {
    Duration::from_secs(offset.as_secs()) + Duration::from_millis(u64::from(offset.subsec_millis()))
}

// ---------------------------------------------------------------------------
// Summaries
// ---------------------------------------------------------------------------

/// One second of a replay: the requests that arrived in it, and the grants
/// that fell in it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct SecondRow {
    /// Which second (0 is the first).
    pub(crate) second: u64,
    /// Requests that arrived in this second.
    pub(crate) arrived: usize,
    /// Of those, granted at once.
    pub(crate) passed: usize,
    /// Of those, granted after a wait.
    pub(crate) waited: usize,
    /// Of those, refused (rate limited or overflow) or failed.
    pub(crate) refused: usize,
    /// Grants in this second, whenever their request arrived: the rate
    /// achieved.
    pub(crate) granted: usize,
}

/// The per-second summary of a replay; seconds with no arrival and no
/// grant are left out.
pub(crate) fn per_second(records: &[Record]) -> Vec<SecondRow> {
    fn at(seconds: &mut BTreeMap<u64, SecondRow>, offset: Duration) -> &mut SecondRow {
        let second = offset.as_secs();
        seconds.entry(second).or_insert_with(|| SecondRow {
            second,
            ..SecondRow::default()
        })
    }
    let mut seconds = BTreeMap::new();
    for record in records {
        let row = at(&mut seconds, record.arrival);
        row.arrived += 1;
        match record.outcome {
            Outcome::Passed => row.passed += 1,
            Outcome::Waited(_) => row.waited += 1,
            _ => row.refused += 1,
        }
        if let Some(granted) = record.granted() {
            at(&mut seconds, granted).granted += 1;
        }
    }
    seconds.into_values().collect()
}

/// Totals over a replay.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Totals {
    /// Granted at once.
    pub(crate) passed: usize,
    /// Granted after a wait.
    pub(crate) waited: usize,
    /// Refused (rate limited or overflow) or failed.
    pub(crate) refused: usize,
    /// The longest wait.
    pub(crate) longest_wait: Option<Duration>,
    /// The last grant, since the start.
    pub(crate) last_grant: Option<Duration>,
}

/// Totals over a replay.
pub(crate) fn totals(records: &[Record]) -> Totals {
    let mut totals = Totals::default();
    for record in records {
        match record.outcome {
            Outcome::Passed => totals.passed += 1,
            Outcome::Waited(wait) => {
                totals.waited += 1;
                totals.longest_wait = totals.longest_wait.max(Some(wait));
            }
            _ => totals.refused += 1,
        }
        totals.last_grant = totals.last_grant.max(record.granted());
    }
    totals
}

/// The timeline of a replay: one character per request, in arrival order.
pub(crate) fn timeline(records: &[Record]) -> String {
    records.iter().map(Record::symbol).collect()
}

// ---------------------------------------------------------------------------
// Output
// ---------------------------------------------------------------------------

/// Requests per row of the timeline chart (fits a 100-column terminal).
const CHART_WIDTH: usize = 60;

/// Writes the whole report.
pub(crate) fn render(out: &mut impl fmt::Write, config: &Config, runs: &[Run]) -> fmt::Result {
    let rate = config.rate();
    let per_second = Rate::every(config.interval).permits_per_second();
    writeln!(
        out,
        "tokio-ratelimit playground: {} requests, one every {} ({}/s), through {} limiter{}",
        config.count,
        show(config.interval),
        number(per_second),
        runs.len(),
        if runs.len() == 1 { "" } else { "s" },
    )?;
    writeln!(
        out,
        "limit: rate {}/s (a permit every {}), capacity {}",
        number(config.rate),
        show(rate.interval()),
        config.capacity,
    )?;
    writeln!(
        out,
        "virtual time: tokio's clock is paused, so the replay takes no real time"
    )?;
    for run in runs {
        writeln!(out)?;
        render_run(out, config, run)?;
    }
    writeln!(out)?;
    render_chart(out, config, runs)?;
    writeln!(out)?;
    render_totals(out, runs)
}

fn render_run(out: &mut impl fmt::Write, config: &Config, run: &Run) -> fmt::Result {
    let title = format!("== {}: {} ", run.entry.name, run.entry.call);
    writeln!(out, "{title:=<96}")?;
    writeln!(
        out,
        "   rate {}/s, capacity {}; one request every {}",
        number(config.rate),
        config.capacity,
        show(config.interval),
    )?;
    for line in wrap(run.entry.about, 92) {
        writeln!(out, "   {line}")?;
    }
    writeln!(out)?;
    let width = config.count.to_string().len().max(3);
    writeln!(
        out,
        "   {:>width$}  {:>10}  {:<34} {:>10}",
        "#", "arrival", "outcome", "granted"
    )?;
    for (index, record) in run.records.iter().enumerate() {
        let outcome = match &record.outcome {
            Outcome::Passed => "pass".to_owned(),
            Outcome::Waited(wait) => format!("wait {}", show(*wait)),
            Outcome::Refused(retry_after) => format!("refused: retry after {}", show(*retry_after)),
            Outcome::Overflow => "refused: overflow (bucket full)".to_owned(),
            Outcome::Failed(error) => format!("error: {error}"),
        };
        let granted = record.granted().map_or_else(|| "-".to_owned(), show);
        writeln!(
            out,
            "   {:>width$}  {:>10}  {outcome:<34} {granted:>10}",
            index + 1,
            show(record.arrival),
        )?;
    }
    writeln!(out)?;
    writeln!(
        out,
        "   per second   arrived  passed  waited  refused  | granted (achieved rate)"
    )?;
    for row in per_second(&run.records) {
        writeln!(
            out,
            "   {:>10}   {:>7}  {:>6}  {:>6}  {:>7}  | {:>7}",
            format!("{}s", row.second),
            row.arrived,
            row.passed,
            row.waited,
            row.refused,
            row.granted,
        )?;
    }
    let sum = totals(&run.records);
    writeln!(
        out,
        "   {:>10}   {:>7}  {:>6}  {:>6}  {:>7}  | {:>7}",
        "total",
        run.records.len(),
        sum.passed,
        sum.waited,
        sum.refused,
        sum.passed + sum.waited,
    )
}

fn render_chart(out: &mut impl fmt::Write, config: &Config, runs: &[Run]) -> fmt::Result {
    let title = "== timeline: one character per request, in arrival order ";
    writeln!(out, "{title:=<96}")?;
    writeln!(
        out,
        "   +  passed at once    w  waited, then passed    -  refused (rate limited or overflow)"
    )?;
    let failed = |run: &Run| run.records.iter().any(|r| r.symbol() == '!');
    if runs.iter().any(failed) {
        writeln!(out, "   !  failed with an unexpected error")?;
    }
    let name_width = runs
        .iter()
        .map(|run| run.entry.name.len())
        .fold("request".len(), usize::max);
    let count = usize::try_from(config.count).unwrap_or(usize::MAX);
    let rows: Vec<String> = runs.iter().map(|run| timeline(&run.records)).collect();
    for first in (0..count).step_by(CHART_WIDTH) {
        let last = (first + CHART_WIDTH).min(count);
        writeln!(out)?;
        // A ruler: the number of every tenth request, and its arrival.
        let mut numbers = String::new();
        let mut times = String::new();
        for index in (first..last).step_by(10) {
            let _ = write!(numbers, "{:<10}", format!("#{}", index + 1));
            let arrival = u32::try_from(index).map_or(Duration::MAX, |i| config.arrival(i));
            let _ = write!(times, "{:<10}", show(arrival));
        }
        writeln!(out, "   {:name_width$}  {}", "request", numbers.trim_end())?;
        writeln!(out, "   {:name_width$}  {}", "arrival", times.trim_end())?;
        for (run, row) in runs.iter().zip(&rows) {
            let part = row.get(first..last).unwrap_or_default();
            writeln!(out, "   {:name_width$} |{part}|", run.entry.name)?;
        }
    }
    Ok(())
}

fn render_totals(out: &mut impl fmt::Write, runs: &[Run]) -> fmt::Result {
    writeln!(
        out,
        "   {:<11} {:>7} {:>7} {:>8} {:>13} {:>11}",
        "limiter", "passed", "waited", "refused", "longest wait", "last grant"
    )?;
    for run in runs {
        let sum = totals(&run.records);
        writeln!(
            out,
            "   {:<11} {:>7} {:>7} {:>8} {:>13} {:>11}",
            run.entry.name,
            sum.passed,
            sum.waited,
            sum.refused,
            sum.longest_wait.map_or_else(|| "-".to_owned(), show),
            sum.last_grant.map_or_else(|| "-".to_owned(), show),
        )?;
    }
    Ok(())
}

/// A duration for people: whole milliseconds as `200ms`, fractions to the
/// microsecond (`666.667ms`), under a microsecond in `ns`, from 100 s in
/// seconds.
pub(crate) fn show(d: Duration) -> String {
    let nanos = d.as_nanos();
    if nanos >= 100_000_000_000 {
        let millis = (nanos + 500_000) / 1_000_000;
        return trimmed(format!("{}.{:03}", millis / 1000, millis % 1000)) + "s";
    }
    if nanos % 1_000_000 == 0 {
        return format!("{}ms", nanos / 1_000_000);
    }
    if nanos < 1000 {
        return format!("{nanos}ns");
    }
    let micros = (nanos + 500) / 1000;
    trimmed(format!("{}.{:03}", micros / 1000, micros % 1000)) + "ms"
}

/// Splits `text` into lines of at most `width` characters, at spaces.
fn wrap(text: &str, width: usize) -> Vec<String> {
    let mut lines = Vec::new();
    let mut line = String::new();
    for word in text.split_whitespace() {
        if !line.is_empty() && line.len() + 1 + word.len() > width {
            lines.push(std::mem::take(&mut line));
        }
        if !line.is_empty() {
            line.push(' ');
        }
        line.push_str(word);
    }
    if !line.is_empty() {
        lines.push(line);
    }
    lines
}

/// A float without a useless fraction: `2`, `1.5`, `0.333`.
fn number(x: f64) -> String {
    trimmed(format!("{x:.3}"))
}

fn trimmed(decimal: String) -> String {
    if decimal.contains('.') {
        decimal
            .trim_end_matches('0')
            .trim_end_matches('.')
            .to_owned()
    } else {
        decimal
    }
}

// ---------------------------------------------------------------------------

fn main() -> ExitCode {
    // `exit` prints the help (to stdout, status 0) or the error with the
    // usage (to stderr, status 2).
    match parse_command(std::env::args_os().skip(1)).unwrap_or_else(|error| error.exit()) {
        Command::Demo(config) => demo(&config),
        Command::Tool(plan) => tool::run(&plan),
    }
}

fn demo(config: &Config) -> ExitCode {
    let runs = match replay_all(config) {
        Ok(runs) => runs,
        Err((name, error)) => {
            eprintln!("error: cannot build the '{name}' limiter: {error}");
            return ExitCode::from(2);
        }
    };
    let mut report = String::new();
    render(&mut report, config, &runs).expect("formatting into a String");
    // A closed pipe (`| head`) is not an error worth a panic.
    let _ = std::io::stdout().lock().write_all(report.as_bytes());
    ExitCode::SUCCESS
}
