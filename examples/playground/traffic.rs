//! Traffic: the requests a replay sends, generated from a seed or read from
//! a recorded trace, one [`Arrival`] at a time (nothing is held but the
//! current line and the table of key names).
//!
//! An *arrival* is one request: when it comes (nanoseconds since the start
//! of the traffic), whose it is (a key id, see [`Keys`]) and how many
//! permits it asks for (its weight). Arrivals come in time order; a trace
//! whose timestamps go backwards is bad input.

use std::collections::HashMap;
use std::fmt::{self, Write as _};
use std::fs::File;
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::time::Duration;

use rand::{Rng as _, SeedableRng as _};
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution as _, Exp1, Zipf};

/// One request of the traffic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Arrival {
    /// When it arrives, in nanoseconds since the start of the traffic.
    pub(crate) at: u64,
    /// Whose it is: an index into the traffic's [`Keys`].
    pub(crate) key: u32,
    /// Permits it asks for (at least 1).
    pub(crate) weight: u32,
}

/// A generated pattern (`--traffic`), over `--duration`, from `--seed`.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Pattern {
    /// One request every `every`, `count` of them at most: the classic
    /// demo's traffic (`--interval`, `--count`) and `constant:rate=R`.
    Constant { every: Duration, count: Option<u64> },
    /// A Poisson process: exponential gaps, `rate` requests per second on
    /// average.
    Poisson { rate: f64 },
    /// `size` requests every `every`, spread evenly over `width` (all at
    /// once when it is zero).
    Bursts {
        size: u32,
        every: Duration,
        width: Duration,
    },
    /// Poisson at `rate` for `on`, then silence for `off`, repeated.
    OnOff {
        rate: f64,
        on: Duration,
        off: Duration,
    },
    /// A Poisson process whose rate goes linearly from `from` to `to`
    /// requests per second over the whole duration.
    Ramp { from: f64, to: f64 },
}

/// Generated traffic: a pattern, and how its requests are spread over keys.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Generated {
    pub(crate) pattern: Pattern,
    /// How long the traffic lasts.
    pub(crate) duration: Duration,
    /// The random generator's seed: the same seed, the same requests.
    pub(crate) seed: u64,
    /// Keys `key-1` … `key-N`; 1 means one client.
    pub(crate) keys: u32,
    /// The Zipf exponent of the keys' popularity: 0 spreads requests evenly,
    /// 1 (the default) makes `key-1` twice as busy as `key-2`.
    pub(crate) skew: f64,
    /// Permits each request asks for.
    pub(crate) weight: u32,
}

/// A recorded trace's format (`--format`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Format {
    /// Decided from the first line: `{` is JSON lines, `[date]` after two
    /// fields is an access log, anything else CSV.
    Auto,
    /// `timestamp[,key[,weight]]`, with an optional header line naming the
    /// columns (`time`/`timestamp`/`ts`/`t`, `key`, `weight`).
    Csv,
    /// One JSON object a line: `{"t": …, "key": "…", "weight": 2}` (`t`,
    /// `ts`, `time` or `timestamp`; a number of seconds or an RFC 3339
    /// string; `key` a string or a number).
    Jsonl,
    /// The Common or Combined Log Format of Apache and nginx
    /// (`host ident user [10/Oct/2000:13:55:36 -0700] "GET / HTTP/1.1" …`):
    /// the client host is the key.
    AccessLog,
}

/// What to do with a bad line of a trace (`--on-error`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum OnError {
    /// Stop the run with the line's message.
    Stop,
    /// Report the line on stderr and go on without it.
    Skip,
}

/// A recorded trace.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Trace {
    pub(crate) path: PathBuf,
    pub(crate) format: Format,
    pub(crate) on_error: OnError,
}

/// Where a replay's requests come from.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Traffic {
    Generated(Generated),
    Trace(Trace),
}

/// Bad input in a trace, with where it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum TraceError {
    /// The file cannot be opened or read.
    Io { path: String, error: String },
    /// The file holds no request.
    Empty { path: String },
    /// One line is wrong; `line` counts from 1.
    Line {
        path: String,
        line: u64,
        reason: String,
    },
}

impl fmt::Display for TraceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TraceError::Io { path, error } => write!(f, "{path}: {error}"),
            TraceError::Empty { path } => write!(f, "{path}: no requests in the trace"),
            TraceError::Line { path, line, reason } => write!(f, "{path}, line {line}: {reason}"),
        }
    }
}

impl std::error::Error for TraceError {}

/// The keys of the traffic, by id. Generated keys are named from their
/// rank; a trace's are interned as they come (memory follows the number of
/// distinct keys, not of requests).
#[derive(Debug, Clone, Default)]
pub(crate) struct Keys {
    /// Generated traffic's number of keys (then `names` is empty).
    generated: u32,
    names: Vec<String>,
    ids: HashMap<String, u32>,
}

impl Keys {
    fn generated(n: u32) -> Keys {
        Keys {
            generated: n,
            ..Keys::default()
        }
    }

    /// The id of `name`, added if new.
    fn intern(&mut self, name: &str) -> Result<u32, String> {
        if let Some(&id) = self.ids.get(name) {
            return Ok(id);
        }
        let id = u32::try_from(self.names.len()).map_err(|_| "more than 2^32 keys".to_owned())?;
        self.names.push(name.to_owned());
        self.ids.insert(name.to_owned(), id);
        Ok(id)
    }

    /// How many keys there are.
    pub(crate) fn len(&self) -> usize {
        if self.generated > 0 {
            self.generated as usize
        } else {
            self.names.len()
        }
    }

    /// The name of key `id` (`-` for a trace's requests without a key).
    pub(crate) fn name(&self, id: u32) -> String {
        if self.generated > 0 {
            return format!("key-{}", u64::from(id) + 1);
        }
        match self.names.get(id as usize).map(String::as_str) {
            Some("") | None => "-".to_owned(),
            Some(name) => name.to_owned(),
        }
    }
}

impl Traffic {
    /// Starts reading (or generating) the traffic from its beginning. Each
    /// call gives the same requests.
    pub(crate) fn open(&self) -> Result<Source, TraceError> {
        match self {
            Traffic::Generated(generated) => {
                Ok(Source::Generated(Box::new(Generator::new(generated))))
            }
            Traffic::Trace(trace) => Reader::open(trace).map(|r| Source::Trace(Box::new(r))),
        }
    }

    /// A line describing the traffic for the report.
    pub(crate) fn describe(&self) -> String {
        match self {
            Traffic::Generated(g) => {
                let mut text = match &g.pattern {
                    Pattern::Constant { every, count } => match count {
                        Some(count) => format!("{count} requests, one every {}", show_span(*every)),
                        None => format!("constant, one request every {}", show_span(*every)),
                    },
                    Pattern::Poisson { rate } => {
                        format!("Poisson, {} requests/s on average", num(*rate))
                    }
                    Pattern::Bursts { size, every, width } if width.is_zero() => {
                        format!("bursts of {size} requests every {}", show_span(*every))
                    }
                    Pattern::Bursts { size, every, width } => format!(
                        "bursts of {size} requests over {} every {}",
                        show_span(*width),
                        show_span(*every)
                    ),
                    Pattern::OnOff { rate, on, off } => format!(
                        "on/off: Poisson {} requests/s for {}, then {} off",
                        num(*rate),
                        show_span(*on),
                        show_span(*off)
                    ),
                    Pattern::Ramp { from, to } => {
                        format!("a ramp from {} to {} requests/s", num(*from), num(*to))
                    }
                };
                if !matches!(g.pattern, Pattern::Constant { count: Some(_), .. }) {
                    let _ = write!(text, " for {}", show_span(g.duration));
                }
                if g.keys > 1 {
                    let _ = write!(text, ", over {} keys (Zipf {})", g.keys, num(g.skew));
                }
                if g.weight > 1 {
                    let _ = write!(text, ", {} permits each", g.weight);
                }
                if !matches!(g.pattern, Pattern::Constant { .. } | Pattern::Bursts { .. })
                    || g.keys > 1
                {
                    let _ = write!(text, ", seed {}", g.seed);
                }
                text
            }
            Traffic::Trace(trace) => format!("the trace {}", trace.path.display()),
        }
    }
}

/// The requests of a traffic, in time order.
#[derive(Debug)]
pub(crate) enum Source {
    Generated(Box<Generator>),
    Trace(Box<Reader>),
}

impl Source {
    /// The next request; `None` at the end. A bad line of a trace read with
    /// [`OnError::Skip`] is passed to `skipped` and left out.
    pub(crate) fn next(
        &mut self,
        skipped: &mut dyn FnMut(TraceError),
    ) -> Option<Result<Arrival, TraceError>> {
        match self {
            Source::Generated(generator) => generator.next().map(Ok),
            Source::Trace(reader) => reader.next(skipped),
        }
    }

    /// The keys seen so far (all of them once the source is exhausted).
    pub(crate) fn keys(&self) -> &Keys {
        match self {
            Source::Generated(generator) => &generator.keys,
            Source::Trace(reader) => &reader.keys,
        }
    }
}

// ---------------------------------------------------------------------------
// Generated traffic
// ---------------------------------------------------------------------------

const NANOS_PER_SEC: f64 = 1e9;

/// Makes a pattern's arrivals, one at a time.
#[derive(Debug)]
pub(crate) struct Generator {
    pattern: Pattern,
    end: u64,
    rng: ChaCha8Rng,
    keys: Keys,
    zipf: Option<Zipf<f64>>,
    weight: u32,
    /// Requests made so far.
    made: u64,
    /// The last arrival, in nanoseconds (fractional, so that exponential
    /// gaps do not lose their fractions).
    t: f64,
    /// The ramp's integrated rate so far (expected requests since start).
    area: f64,
}

impl Generator {
    fn new(g: &Generated) -> Generator {
        let zipf = (g.keys > 1)
            .then(|| Zipf::new(f64::from(g.keys), g.skew).expect("checked by the flag parser"));
        Generator {
            pattern: g.pattern.clone(),
            end: nanos(g.duration),
            rng: ChaCha8Rng::seed_from_u64(g.seed),
            keys: Keys::generated(g.keys.max(1)),
            zipf,
            weight: g.weight,
            made: 0,
            t: 0.0,
            area: 0.0,
        }
    }

    #[expect(
        clippy::cast_precision_loss,
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        reason = "random gaps are floats; instants below 2^53 ns (104 days) are exact, later ones within 1 ns in 10^16"
    )]
    fn next(&mut self) -> Option<Arrival> {
        let at = match self.pattern {
            Pattern::Constant { every, count } => {
                if count.is_some_and(|count| self.made >= count) {
                    return None;
                }
                let at = nanos(every).checked_mul(self.made)?;
                if count.is_none() && at >= self.end {
                    return None;
                }
                at
            }
            Pattern::Poisson { rate } => {
                let gap: f64 = self.rng.sample(Exp1);
                self.t += gap * NANOS_PER_SEC / rate;
                self.before_end()?
            }
            Pattern::Bursts { size, every, width } => {
                let burst = self.made / u64::from(size);
                let within = self.made % u64::from(size);
                let at = nanos(every).checked_mul(burst)? + nanos(width) * within / u64::from(size);
                if at >= self.end {
                    return None;
                }
                at
            }
            Pattern::OnOff { rate, on, off } => {
                let gap: f64 = self.rng.sample(Exp1);
                self.t += gap * NANOS_PER_SEC / rate;
                // Time runs only while on: map "on time" onto the clock.
                let (on, period) = (nanos(on) as f64, (nanos(on) + nanos(off)) as f64);
                let cycles = (self.t / on).floor();
                let clock = cycles * period + (self.t - cycles * on);
                if clock >= self.end as f64 {
                    return None;
                }
                clock as u64
            }
            Pattern::Ramp { from, to } => {
                // Inverse of the integrated rate Λ(t) = from·t + (to−from)·t²/2D,
                // t in seconds: the next arrival is where Λ reaches one more
                // exponential step.
                let step: f64 = self.rng.sample(Exp1);
                self.area += step;
                let d = self.end as f64 / NANOS_PER_SEC;
                let slope = (to - from) / d;
                let secs = if slope.abs() < 1e-12 {
                    self.area / from
                } else {
                    (-from + (from * from + 2.0 * slope * self.area).max(0.0).sqrt()) / slope
                };
                if !secs.is_finite() {
                    return None;
                }
                self.t = secs * NANOS_PER_SEC;
                self.before_end()?
            }
        };
        self.made += 1;
        let key = match &self.zipf {
            // Zipf draws ranks 1..=n.
            Some(zipf) => (zipf.sample(&mut self.rng) as u32).saturating_sub(1),
            None => 0,
        };
        Some(Arrival {
            at,
            key,
            weight: self.weight,
        })
    }

    #[expect(
        clippy::cast_precision_loss,
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        reason = "as in `next`"
    )]
    fn before_end(&self) -> Option<u64> {
        (self.t < self.end as f64).then_some(self.t as u64)
    }
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

// ---------------------------------------------------------------------------
// Recorded traces
// ---------------------------------------------------------------------------

/// How a trace's timestamps count: all one way, set by the first request.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Stamps {
    /// Seconds from the start of the trace (`12.5`).
    Relative,
    /// Absolute instants; the first request's is the start.
    Absolute { start: i128 },
}

/// Reads a trace line by line.
#[derive(Debug)]
pub(crate) struct Reader {
    path: String,
    lines: std::io::Lines<BufReader<File>>,
    format: Format,
    on_error: OnError,
    line: u64,
    /// CSV columns: (time, key, weight) indices.
    columns: (usize, Option<usize>, Option<usize>),
    /// Whether the first CSV line (perhaps a header) has been read.
    header_read: bool,
    /// Whether a header named the columns (then other columns are allowed).
    named_columns: bool,
    stamps: Option<Stamps>,
    /// The last request's arrival and line.
    last: Option<(u64, u64)>,
    keys: Keys,
    requests: u64,
    done: bool,
}

impl Reader {
    fn open(trace: &Trace) -> Result<Reader, TraceError> {
        let path = trace.path.display().to_string();
        let file = File::open(&trace.path).map_err(|e| TraceError::Io {
            path: path.clone(),
            error: e.to_string(),
        })?;
        Ok(Reader {
            path,
            lines: BufReader::with_capacity(1 << 16, file).lines(),
            format: trace.format,
            on_error: trace.on_error,
            line: 0,
            columns: (0, Some(1), Some(2)),
            header_read: false,
            named_columns: false,
            stamps: None,
            last: None,
            keys: Keys::default(),
            requests: 0,
            done: false,
        })
    }

    fn next(&mut self, skipped: &mut dyn FnMut(TraceError)) -> Option<Result<Arrival, TraceError>> {
        while !self.done {
            let Some(text) = self.lines.next() else {
                self.done = true;
                if self.requests == 0 {
                    return Some(Err(TraceError::Empty {
                        path: self.path.clone(),
                    }));
                }
                return None;
            };
            self.line += 1;
            let text = match text {
                Ok(text) => text,
                Err(e) => {
                    self.done = true;
                    return Some(Err(TraceError::Io {
                        path: self.path.clone(),
                        error: format!("line {}: {e}", self.line),
                    }));
                }
            };
            match self.parse(&text) {
                Ok(None) => {}
                Ok(Some(arrival)) => {
                    self.requests += 1;
                    return Some(Ok(arrival));
                }
                Err(reason) => {
                    let error = TraceError::Line {
                        path: self.path.clone(),
                        line: self.line,
                        reason,
                    };
                    match self.on_error {
                        OnError::Stop => {
                            self.done = true;
                            return Some(Err(error));
                        }
                        OnError::Skip => skipped(error),
                    }
                }
            }
        }
        None
    }

    /// One line: a request, nothing (blank, a comment, the CSV header), or
    /// what is wrong with it.
    fn parse(&mut self, text: &str) -> Result<Option<Arrival>, String> {
        let text = text.trim();
        if text.is_empty() || text.starts_with('#') {
            return Ok(None);
        }
        if self.format == Format::Auto {
            self.format = detect(text);
        }
        let (time, key, weight) = match self.format {
            Format::Csv | Format::Auto => {
                let fields: Vec<&str> = text
                    .split(',')
                    .map(|f| f.trim().trim_matches('"'))
                    .collect();
                if self.line_is_header(&fields)? {
                    return Ok(None);
                }
                let (t, k, w) = self.columns;
                let time = Stamp::parse(fields.get(t).copied().unwrap_or(""))?;
                let key = k.and_then(|k| fields.get(k).copied()).unwrap_or("");
                let weight = w
                    .and_then(|w| fields.get(w).copied())
                    .filter(|w| !w.is_empty());
                if fields.len() > 3 && !self.named_columns {
                    return Err(format!(
                        "{} fields; expected timestamp[,key[,weight]]",
                        fields.len()
                    ));
                }
                (time, key.to_owned(), weight.map(parse_weight).transpose()?)
            }
            Format::Jsonl => parse_json(text)?,
            Format::AccessLog => parse_access_log(text)?,
        };
        let at = self.arrival(time)?;
        let key = self.keys.intern(&key)?;
        Ok(Some(Arrival {
            at,
            key,
            weight: weight.unwrap_or(1),
        }))
    }

    /// Whether this CSV line is the header; the first non-blank line is
    /// one when its first field is not a timestamp.
    fn line_is_header(&mut self, fields: &[&str]) -> Result<bool, String> {
        if self.header_read {
            return Ok(false);
        }
        self.header_read = true;
        let first = fields.first().copied().unwrap_or("");
        if Stamp::parse(first).is_ok() || first.parse::<f64>().is_ok() {
            return Ok(false);
        }
        let mut columns = (None, None, None);
        for (i, name) in fields.iter().enumerate() {
            match name.to_ascii_lowercase().as_str() {
                "t" | "ts" | "time" | "timestamp" => columns.0 = Some(i),
                "key" | "client" => columns.1 = Some(i),
                "weight" | "permits" | "n" => columns.2 = Some(i),
                _ => {}
            }
        }
        let Some(time) = columns.0 else {
            return Err(format!(
                "'{first}' is not a timestamp, and a header line needs a 'timestamp' column"
            ));
        };
        self.columns = (time, columns.1, columns.2);
        self.named_columns = true;
        Ok(true)
    }

    /// A timestamp as nanoseconds since the start, checked for going
    /// backwards.
    fn arrival(&mut self, stamp: Stamp) -> Result<u64, String> {
        let at = match (self.stamps, stamp) {
            (None | Some(Stamps::Relative), Stamp::Seconds(secs)) => {
                self.stamps = Some(Stamps::Relative);
                secs
            }
            (None, Stamp::Absolute(ns)) => {
                self.stamps = Some(Stamps::Absolute { start: ns });
                0
            }
            (Some(Stamps::Absolute { start }), Stamp::Absolute(ns)) => {
                if ns < start {
                    return Err(backwards(ns - start));
                }
                u64::try_from(ns - start)
                    .map_err(|_| "more than 584 years after the first request".to_owned())?
            }
            (Some(Stamps::Relative), Stamp::Absolute(_)) => {
                return Err("an absolute timestamp in a trace of seconds from the start".to_owned());
            }
            (Some(Stamps::Absolute { .. }), Stamp::Seconds(_)) => {
                return Err("seconds from the start in a trace of absolute timestamps".to_owned());
            }
        };
        match self.last {
            Some((last, line)) if at < last => {
                return Err(format!(
                    "the timestamp goes backwards: {} after line {line}'s {}",
                    show_span(Duration::from_nanos(at)),
                    show_span(Duration::from_nanos(last)),
                ));
            }
            _ => {}
        }
        self.last = Some((at, self.line));
        Ok(at)
    }
}

/// The message for a timestamp before the first request's.
fn backwards(before_start: i128) -> String {
    format!(
        "the timestamp goes backwards: {} before the first request",
        show_span(Duration::from_nanos(
            u64::try_from(-before_start).unwrap_or(u64::MAX)
        ))
    )
}

/// A trace's timestamp.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Stamp {
    /// Seconds from the start, in nanoseconds.
    Seconds(u64),
    /// Nanoseconds since the Unix epoch.
    Absolute(i128),
}

impl Stamp {
    fn parse(text: &str) -> Result<Stamp, String> {
        if text.is_empty() {
            return Err("no timestamp".to_owned());
        }
        if let Ok(secs) = text.parse::<f64>() {
            return match Duration::try_from_secs_f64(secs) {
                Ok(d) => Ok(Stamp::Seconds(nanos(d))),
                Err(_) => Err(format!(
                    "'{text}' is not a time since the start (seconds, at least 0)"
                )),
            };
        }
        text.parse::<jiff::Timestamp>()
            .map(|t| Stamp::Absolute(t.as_nanosecond()))
            .map_err(|_| {
                format!("'{text}' is not a timestamp (RFC 3339, or seconds from the start)")
            })
    }
}

fn parse_weight(text: &str) -> Result<u32, String> {
    match text.parse::<u32>() {
        Ok(0) => Err("a weight of 0 (at least 1 permit)".to_owned()),
        Ok(n) => Ok(n),
        Err(_) => Err(format!(
            "'{text}' is not a weight (a whole number of permits)"
        )),
    }
}

fn detect(line: &str) -> Format {
    if line.starts_with('{') {
        Format::Jsonl
    } else if line.split(' ').nth(3).is_some_and(|f| f.starts_with('[')) {
        Format::AccessLog
    } else {
        Format::Csv
    }
}

fn parse_json(text: &str) -> Result<(Stamp, String, Option<u32>), String> {
    let value: serde_json::Value =
        serde_json::from_str(text).map_err(|e| format!("not JSON: {e}"))?;
    let object = value.as_object().ok_or("not a JSON object")?;
    let time = ["t", "ts", "time", "timestamp"]
        .iter()
        .find_map(|name| object.get(*name))
        .ok_or("no timestamp (a field 't', 'ts', 'time' or 'timestamp')")?;
    let stamp = match time {
        serde_json::Value::Number(n) => Stamp::parse(&n.to_string())?,
        serde_json::Value::String(s) => Stamp::parse(s)?,
        other => {
            return Err(format!(
                "the timestamp {other} is neither a number nor a string"
            ));
        }
    };
    let key = match object.get("key") {
        None | Some(serde_json::Value::Null) => String::new(),
        Some(serde_json::Value::String(s)) => s.clone(),
        Some(serde_json::Value::Number(n)) => n.to_string(),
        Some(other) => return Err(format!("the key {other} is neither a string nor a number")),
    };
    let weight = match object.get("weight") {
        None | Some(serde_json::Value::Null) => None,
        Some(serde_json::Value::Number(n)) => Some(parse_weight(&n.to_string())?),
        Some(other) => return Err(format!("the weight {other} is not a whole number")),
    };
    Ok((stamp, key, weight))
}

/// `host ident user [day/Mon/year:hh:mm:ss zone] "request" status bytes …`
fn parse_access_log(text: &str) -> Result<(Stamp, String, Option<u32>), String> {
    let host = text.split(' ').next().unwrap_or("");
    let (Some(open), Some(close)) = (text.find('['), text.find(']')) else {
        return Err("not an access-log line (no [date])".to_owned());
    };
    let date = text
        .get(open + 1..close)
        .ok_or("not an access-log line (no [date])")?;
    let zoned = jiff::fmt::strtime::parse("%d/%b/%Y:%H:%M:%S %z", date)
        .and_then(|t| t.to_timestamp())
        .map_err(|_| format!("'{date}' is not an access-log date (10/Oct/2000:13:55:36 -0700)"))?;
    Ok((
        Stamp::Absolute(zoned.as_nanosecond()),
        host.to_owned(),
        None,
    ))
}

// ---------------------------------------------------------------------------

/// A span for people: `200ms`, `1.5s`, `2m`, `1h30m`, `1d`.
pub(crate) fn show_span(d: Duration) -> String {
    let nanos = d.as_nanos();
    if nanos < 1_000_000_000 {
        return super::show(d);
    }
    let secs = d.as_secs();
    if d.subsec_nanos() != 0 || secs < 60 {
        return format!("{}s", num(d.as_secs_f64()));
    }
    let parts = [
        (secs / 86_400, "d"),
        (secs / 3600 % 24, "h"),
        (secs / 60 % 60, "m"),
        (secs % 60, "s"),
    ];
    let mut text = String::new();
    for (n, unit) in parts.iter().filter(|(n, _)| *n > 0) {
        let _ = write!(text, "{n}{unit}");
    }
    text
}

/// A float without a useless fraction (as the demo prints them).
pub(crate) fn num(x: f64) -> String {
    super::number(x)
}
