//! The tool: the flags that turn the playground from the demo into a
//! replay of a whole traffic ([`Plan`]), and running it ([`run`]).

use std::fmt::Write as _;
use std::io::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::CommandFactory as _;
use clap::error::ErrorKind;

use super::engine::{self, Replay, ReplayError};
use super::spec::{self, Defaults, Spec};
use super::traffic::{Format, Generated, OnError, Pattern, Trace, TraceError, Traffic, show_span};
use super::{Config, Flags, MAX_SPAN};

/// The end of `--help`, after the demo's examples.
pub(crate) const HELP: &str = "
Examples, the tool (a whole traffic: totals, per-second rates, a chart, JSON):
  cargo run --release -p playground -- --traffic poisson:rate=30,keys=50 --duration 10m \\
      --limiter funnel:rate=20,burst=40,per-key --limiter token:rate=20,burst=40 --svg chart.svg
  cargo run --release -p playground -- --trace tests/data/trace_small.csv \\
      --limiter funnel:rate=2,burst=2,per-key --limiter shaper:rate=2,burst=4 --json -
  cargo run --release -p playground -- --traffic bursts:size=100,every=10s --duration 1m \\
      --limiter 'funnel:quota=20/s:40+600/m:600' --limiter token-wait:rate=20,burst=40,timeout=2s

--traffic PATTERN[:KNOB=V,...], over --duration, from --seed:
  constant:rate=R (or every=SPAN)   one request every 1/R s
  poisson:rate=R                    exponential gaps, R a second on average
  bursts:size=N,every=SPAN[,width=SPAN]   N requests at once (or spread over width)
  onoff:rate=R,on=SPAN,off=SPAN     Poisson at R while on, nothing while off
  ramp:from=R,to=R                  Poisson, its rate going linearly from one to the other
  each also takes keys=N (key-1 ... key-N), skew=S (Zipf, default 1; 0 is even), weight=N
  (no --traffic and no --trace: the demo's --interval and --count)

--trace FILE: one request a line; blank lines and lines starting with # are skipped.
  csv         timestamp[,key[,weight]], or columns named by a header line
              (timestamp/time/ts/t, key/client, weight/permits/n)
  jsonl       {\"t\": ..., \"key\": \"...\", \"weight\": 2} (t, ts, time or timestamp)
  access-log  Apache/nginx common or combined log format; the client host is the key
  A timestamp is RFC 3339 (2026-12-01T10:00:00.250Z, any offset; time starts at the
  first request) or seconds from the start (12.25). Timestamps must not go backwards.

--limiter NAME[:KNOB=V,...]: a name above (the demo's seven, plus funnel-wait,
  bursty-try, warmup-try), and knobs: rate=R (per second, or N/PERIOD: 20/s, 100/m, 5/10s),
  capacity=N or burst=N, quota=RATE:CAP+RATE:CAP (bands), per-key, max-keys=N,
  initial=N (token), max-burst=SPAN (bursty), warmup=SPAN, cold-factor=F,
  timeout=SPAN (waiting modes), label=TEXT. Unset, rate and capacity are --rate and --capacity.
  Try modes (token, leaky, funnel, *-try) stream: a day at 1000/s (86 M requests) in well under a minute.
  Waiting modes run a task per request: keep them to a few million requests.

Exit status: 0 done; 1 an output (--svg, --json, --keys) could not be written; 2 a bad flag or
  a limiter that cannot be built; 3 a trace that cannot be read, is empty, or has a bad
  line (without --on-error skip); 4 traffic the replay cannot hold (past --bucket's
  buckets, too many waiting at once).";

/// Generated traffic as `--traffic` gives it (the duration and seed are
/// flags of their own).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct PatternSpec {
    pattern: Pattern,
    keys: u32,
    skew: f64,
    weight: u32,
}

/// What the tool does.
#[derive(Debug, Clone)]
pub(crate) struct Plan {
    pub(crate) traffic: Traffic,
    pub(crate) specs: Vec<Spec>,
    pub(crate) bucket: Duration,
    pub(crate) svg: Option<PathBuf>,
    pub(crate) json: Option<PathBuf>,
    /// `--keys`: every key's counts, one JSON line per key.
    pub(crate) keys: Option<PathBuf>,
    pub(crate) top: usize,
}

/// The tool's plan from the flags (the demo's `config` gives the defaults).
pub(crate) fn plan(flags: &Flags, config: &Config) -> Result<Plan, clap::Error> {
    let invalid = |message: String| Flags::command().error(ErrorKind::ValueValidation, message);
    let defaults = Defaults {
        rate: config.rate,
        capacity: config.capacity,
        warmup: config.warmup,
        cold_factor: config.cold_factor,
    };
    let specs = if flags.limiter.is_empty() {
        config
            .limiters
            .iter()
            .map(|entry| Spec::named(entry.name, defaults).map_err(&invalid))
            .collect::<Result<Vec<_>, _>>()?
    } else {
        flags
            .limiter
            .iter()
            .map(|text| {
                Spec::parse(text, defaults).map_err(|reason| {
                    invalid(format!(
                        "invalid value '{text}' for '--limiter <SPEC>': {reason}"
                    ))
                })
            })
            .collect::<Result<Vec<_>, _>>()?
    };
    let is_stdout = |p: &Option<PathBuf>| p.as_deref().is_some_and(|p| p.as_os_str() == "-");
    if is_stdout(&flags.json) && is_stdout(&flags.keys) {
        return Err(invalid(
            "--json - and --keys - both want stdout: give one of them a file".to_owned(),
        ));
    }
    let traffic = match (&flags.trace, &flags.traffic) {
        (Some(path), _) => Traffic::Trace(Trace {
            path: path.clone(),
            format: flags.format,
            on_error: flags.on_error,
        }),
        (None, Some(spec)) => Traffic::Generated(Generated {
            pattern: spec.pattern.clone(),
            duration: flags.duration,
            seed: flags.seed,
            keys: spec.keys,
            skew: spec.skew,
            weight: spec.weight,
        }),
        (None, None) => Traffic::Generated(Generated {
            pattern: Pattern::Constant {
                every: config.interval,
                count: Some(u64::from(config.count)),
            },
            duration: MAX_SPAN,
            seed: flags.seed,
            keys: 1,
            skew: 1.0,
            weight: 1,
        }),
    };
    if let Traffic::Generated(generated) = &traffic {
        let buckets = generated.duration.as_nanos() / flags.bucket.as_nanos().max(1);
        if buckets >= engine::MAX_BUCKETS as u128 && flags.traffic.is_some() {
            return Err(invalid(format!(
                "--duration {} is more than {} buckets of --bucket {}: give a longer --bucket",
                show_span(generated.duration),
                engine::MAX_BUCKETS,
                show_span(flags.bucket),
            )));
        }
    }
    Ok(Plan {
        traffic,
        specs,
        bucket: flags.bucket,
        svg: flags.svg.clone(),
        json: flags.json.clone(),
        keys: flags.keys.clone(),
        top: flags.top,
    })
}

// The value parsers (messages complete clap's "invalid value '…' for '…': ").

/// `--duration`, `--bucket`: a span of at most a year.
pub(crate) fn span(value: &str) -> Result<Duration, String> {
    let span = spec::parse_span(value)?;
    if span > MAX_SPAN {
        return Err(format!(
            "must be at most {} days",
            MAX_SPAN.as_secs() / 86_400
        ));
    }
    Ok(span)
}

pub(crate) fn format(value: &str) -> Result<Format, String> {
    match value.trim() {
        "auto" => Ok(Format::Auto),
        "csv" => Ok(Format::Csv),
        "jsonl" | "json" => Ok(Format::Jsonl),
        "access-log" | "clf" => Ok(Format::AccessLog),
        _ => Err("expects auto, csv, jsonl or access-log".to_owned()),
    }
}

pub(crate) fn on_error(value: &str) -> Result<OnError, String> {
    match value.trim() {
        "stop" => Ok(OnError::Stop),
        "skip" => Ok(OnError::Skip),
        _ => Err("expects stop or skip".to_owned()),
    }
}

/// `--traffic PATTERN[:KNOB=V,...]`.
#[expect(clippy::too_many_lines, reason = "one arm per pattern, each short")]
pub(crate) fn pattern(value: &str) -> Result<PatternSpec, String> {
    let (kind, knobs) = value.trim().split_once(':').unwrap_or((value.trim(), ""));
    let mut given: Vec<(&str, &str)> = Vec::new();
    for knob in knobs.split(',').map(str::trim).filter(|k| !k.is_empty()) {
        let (key, v) = knob
            .split_once('=')
            .ok_or_else(|| format!("'{knob}' is not KNOB=VALUE"))?;
        given.push((key.trim(), v.trim()));
    }
    let mut take = |key: &str| -> Option<&str> {
        let at = given.iter().position(|(k, _)| *k == key)?;
        Some(given.remove(at).1)
    };
    let rate = |v: Option<&str>, name: &str| -> Result<f64, String> {
        let v = v.ok_or_else(|| format!("'{kind}' needs {name}=R (requests per second)"))?;
        match v.parse::<f64>() {
            Ok(r) if r.is_finite() && r > 0.0 => Ok(r),
            _ => Err(format!(
                "{name}={v}: expects a positive number of requests per second"
            )),
        }
    };
    let span_of = |v: Option<&str>, name: &str| -> Result<Duration, String> {
        let v = v.ok_or_else(|| format!("'{kind}' needs {name}=SPAN"))?;
        span(v).map_err(|e| format!("{name}={v}: {e}"))
    };
    let whole = |v: &str, name: &str| -> Result<u32, String> {
        match v.parse::<u32>() {
            Ok(n) if n > 0 => Ok(n),
            _ => Err(format!("{name}={v}: expects a whole number of at least 1")),
        }
    };
    let pattern = match kind {
        "constant" => match (take("rate"), take("every")) {
            (Some(_), Some(_)) => return Err("give constant either rate= or every=".to_owned()),
            (None, every @ Some(_)) => Pattern::Constant {
                every: span_of(every, "every")?,
                count: None,
            },
            (r, None) => {
                let r = rate(r, "rate")?;
                let every = Duration::try_from_secs_f64(1.0 / r)
                    .ok()
                    .filter(|d| !d.is_zero())
                    .ok_or("rate: at most 10^9 requests per second")?;
                Pattern::Constant { every, count: None }
            }
        },
        "poisson" => Pattern::Poisson {
            rate: rate(take("rate"), "rate")?,
        },
        "bursts" => {
            let size = whole(take("size").ok_or("'bursts' needs size=N")?, "size")?;
            let every = span_of(take("every"), "every")?;
            let width = match take("width") {
                Some("0") | None => Duration::ZERO,
                Some(w) => span(w).map_err(|e| format!("width={w}: {e}"))?,
            };
            if width > every {
                return Err("width= must not be longer than every=".to_owned());
            }
            Pattern::Bursts { size, every, width }
        }
        "onoff" => Pattern::OnOff {
            rate: rate(take("rate"), "rate")?,
            on: span_of(take("on"), "on")?,
            off: span_of(take("off"), "off")?,
        },
        "ramp" => {
            let from = take("from").unwrap_or("0");
            let from = match from.parse::<f64>() {
                Ok(r) if r.is_finite() && r >= 0.0 => r,
                _ => {
                    return Err(format!(
                        "from={from}: expects a number of requests per second, at least 0"
                    ));
                }
            };
            Pattern::Ramp {
                from,
                to: rate(take("to"), "to")?,
            }
        }
        _ => {
            return Err(format!(
                "unknown pattern '{kind}' (known: constant, poisson, bursts, onoff, ramp)"
            ));
        }
    };
    let keys = take("keys").map_or(Ok(1), |v| whole(v, "keys"))?;
    let skew = match take("skew") {
        None => 1.0,
        Some(v) => match v.parse::<f64>() {
            Ok(s) if s.is_finite() && s >= 0.0 => s,
            _ => return Err(format!("skew={v}: expects a number, at least 0")),
        },
    };
    let weight = take("weight").map_or(Ok(1), |v| whole(v, "weight"))?;
    if let Some((key, _)) = given.first() {
        return Err(format!("'{key}' is not a knob of '{kind}'"));
    }
    Ok(PatternSpec {
        pattern,
        keys,
        skew,
        weight,
    })
}

// ---------------------------------------------------------------------------

/// How many bad lines are reported one by one on stderr.
const WARNINGS: usize = 20;

/// Replays the plan and writes its answers: the text (or `--json -`) on
/// stdout, the chart and the JSON to their files.
pub(crate) fn run(plan: &Plan) -> ExitCode {
    let mut warned = 0usize;
    let mut on_skip = |error: &TraceError| {
        warned += 1;
        if warned <= WARNINGS {
            eprintln!("warning: {error} (line left out)");
        } else if warned == WARNINGS + 1 {
            eprintln!("warning: more bad lines left out; the report counts them");
        }
    };
    let started = std::time::Instant::now();
    let replay = match engine::replay(&plan.traffic, &plan.specs, plan.bucket, &mut on_skip) {
        Ok(replay) => replay,
        Err(error) => {
            eprintln!("error: {error}");
            if matches!(error, ReplayError::Trace(TraceError::Line { .. })) {
                eprintln!("(--on-error skip leaves bad lines out and goes on)");
            }
            return ExitCode::from(error.exit_code());
        }
    };
    let elapsed = started.elapsed();
    match answer(plan, &replay, elapsed) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error}");
            ExitCode::FAILURE
        }
    }
}

fn answer(plan: &Plan, replay: &Replay, elapsed: Duration) -> Result<(), String> {
    let json_to_stdout = plan.json.as_deref().is_some_and(|p| p.as_os_str() == "-");
    let keys_to_stdout = plan.keys.as_deref().is_some_and(|p| p.as_os_str() == "-");
    let to_stdout = json_to_stdout || keys_to_stdout;
    if let Some(path) = &plan.keys {
        let written = if keys_to_stdout {
            super::summary::write_keys(
                &mut std::io::BufWriter::new(std::io::stdout().lock()),
                replay,
            )
        } else {
            std::fs::File::create(path).and_then(|file| {
                super::summary::write_keys(&mut std::io::BufWriter::new(file), replay)
            })
        };
        // A closed pipe (`| head`) is the reader's choice, not a failure.
        if let Err(error) = written {
            if !(keys_to_stdout && error.kind() == std::io::ErrorKind::BrokenPipe) {
                return Err(format!("{}: {error}", path.display()));
            }
        }
    }
    if let Some(path) = &plan.svg {
        let title = format!("tokio-ratelimit playground: {}", plan.traffic.describe());
        let svg = super::chart::svg(&title, replay)?;
        std::fs::write(path, svg).map_err(|e| format!("{}: {e}", path.display()))?;
    }
    if let Some(path) = &plan.json {
        let mut value = super::summary::json(&plan.traffic, replay, plan.top);
        value["replay_seconds"] = serde_json::json!(elapsed.as_secs_f64());
        let text = serde_json::to_string_pretty(&value).expect("a JSON value prints") + "\n";
        if json_to_stdout {
            let _ = std::io::stdout().lock().write_all(text.as_bytes());
        } else {
            std::fs::write(path, text).map_err(|e| format!("{}: {e}", path.display()))?;
        }
    }
    if !to_stdout {
        let mut report = String::new();
        super::summary::render(&mut report, &plan.traffic, replay, plan.top)
            .expect("formatting into a String");
        let _ = writeln!(
            report,
            "\nreplayed in {:.2} s of real time",
            elapsed.as_secs_f64()
        );
        if let Some(path) = &plan.svg {
            let _ = writeln!(report, "chart: {}", path.display());
        }
        if let Some(path) = &plan.json {
            let _ = writeln!(report, "JSON: {}", path.display());
        }
        if let Some(path) = &plan.keys {
            let _ = writeln!(report, "keys: {}", path.display());
        }
        let _ = std::io::stdout().lock().write_all(report.as_bytes());
    }
    Ok(())
}
