//! Checks the playground's tool mode (`--traffic`, `--trace`, `--limiter`,
//! `--svg`, `--json`): the example's own code, included as a module, as in
//! `tests/playground.rs`.
//!
//! Every replay runs on a paused clock, so the counts and waits asserted are
//! exact; the recorded traces are in `tests/data/`.

#[path = "../examples/playground/main.rs"]
#[expect(
    dead_code,
    reason = "`main` and the demo's printing helpers are for the example only"
)]
mod playground;

use std::path::PathBuf;
use std::time::Duration;

use playground::engine::{self, Refusal, Replay, ReplayError, Tally};
use playground::spec::{Built, Spec};
use playground::tool::Plan;
use playground::traffic::{Arrival, Traffic};
use playground::{Command, parse_command, summary};

fn ms(n: u64) -> u64 {
    n * 1_000_000
}

fn plan(args: &[&str]) -> Plan {
    match parse_command(args.iter().copied()) {
        Ok(Command::Tool(plan)) => plan,
        Ok(Command::Demo(_)) => panic!("{args:?} is the demo"),
        Err(error) => panic!("{args:?}: {error}"),
    }
}

fn run(plan: &Plan) -> Result<Replay, ReplayError> {
    engine::replay(&plan.traffic, &plan.specs, plan.bucket, &mut |_| {})
}

fn replay(args: &[&str]) -> Replay {
    run(&plan(args)).unwrap()
}

fn data(name: &str) -> String {
    format!("{}/tests/data/{name}", env!("CARGO_MANIFEST_DIR"))
}

/// passed, waited, refused (all causes).
fn counts(tally: &Tally) -> (u64, u64, u64) {
    (tally.passed, tally.waited, tally.refused_total())
}

fn refused(tally: &Tally, cause: Refusal) -> u64 {
    tally.refused[cause as usize]
}

/// Every arrival of a traffic.
fn arrivals(traffic: &Traffic) -> Vec<Arrival> {
    let mut source = traffic.open().unwrap();
    let mut all = Vec::new();
    while let Some(arrival) = source.next(&mut |e| panic!("{e}")) {
        all.push(arrival.unwrap());
    }
    all
}

const SMALL: [&str; 7] = [
    "--limiter",
    "funnel:rate=1,burst=2,per-key",
    "--limiter",
    "funnel:rate=1,burst=2",
    "--limiter=token:rate=1,burst=2",
    "--limiter=token:rate=1,burst=2,per-key",
    "--limiter=leaky:rate=1,burst=2,per-key",
];

/// `tests/data/trace_small.csv` (and `.jsonl`, the same requests), worked
/// out by hand with GCRA: emission interval I = 1 s, tolerance τ = 2 s (a
/// burst of 2); a request of n permits at t passes when
/// `max(tat, t) + n·I − t ≤ τ`, and then `tat = max(tat, t) + n·I`.
///
/// ```text
/// per key                       t     n   max(tat,t)+nI−t   result
/// alice                         0     1        1              +   tat 1
///                               0.1   1        1.9            +   tat 2
///                               0.2   1        2.8            −
///                               0.4   1        2.6            −
///                               1     1        2              +   tat 3
///                               2     1        2              +   tat 4
///                               3     2        3              −
/// bob                           0.3   1        1              +   tat 1.3
///                               1     2        2.3            −
///                               2     1        1              +   tat 3
/// carol                         1.5   3        (3 > burst 2: too large)
///                               2.25  1        1              +
/// ```
///
/// Per key: 7 pass, 4 limited, 1 too large. One funnel for everybody: 0,
/// 0.1, 1 and 2 pass (the same tat as alice's alone), 7 limited, 1 too
/// large; the token bucket, starting full, and the leaky bucket's meter
/// are the same arithmetic, per key or not.
#[test]
fn the_small_trace_replays_to_the_counts_worked_out_by_hand() {
    for file in ["trace_small.csv", "trace_small.jsonl"] {
        let path = data(file);
        let mut args = vec!["--trace", &path];
        args.extend(SMALL);
        let replay = replay(&args);
        assert_eq!(replay.seen.requests, 12, "{file}");
        assert_eq!(replay.seen.keys.len(), 3, "{file}");
        assert_eq!(replay.seen.last, ms(3000), "{file}");
        let [per_key, one, token, token_per_key, leaky_per_key] = &replay.tallies[..] else {
            panic!("five tallies")
        };
        // A full token bucket and a leaky bucket's meter per key: the
        // funnel's arithmetic, so the same answers, cause by cause.
        for tally in [token_per_key, leaky_per_key] {
            assert_eq!(
                tally.refused, per_key.refused,
                "{file} {}",
                tally.spec.label
            );
            assert_eq!(counts(tally), (7, 0, 5), "{file} {}", tally.spec.label);
        }
        assert_eq!(counts(per_key), (7, 0, 5), "{file}");
        assert_eq!(refused(per_key, Refusal::Limited), 4, "{file}");
        assert_eq!(refused(per_key, Refusal::TooLarge), 1, "{file}");
        for tally in [one, token] {
            assert_eq!(counts(tally), (4, 0, 8), "{file} {}", tally.spec.label);
            assert_eq!(refused(tally, Refusal::TooLarge), 1, "{file}");
        }
        // Permits: 16 asked; 7 granted, one each.
        assert_eq!((per_key.permits_offered, per_key.permits_granted), (16, 7));

        // Per second: arrivals 0, 0.1, 0.2, 0.3, 0.4 | 1, 1, 1.5 | 2, 2,
        // 2.25 | 3; grants (per key) 0, 0.1, 0.3 | 1 | 2, 2, 2.25.
        let offered: Vec<u64> = per_key.buckets.iter().map(|b| b.offered).collect();
        let admitted: Vec<u64> = per_key.buckets.iter().map(|b| b.admitted).collect();
        let refusals: Vec<u64> = per_key.buckets.iter().map(|b| b.refused).collect();
        assert_eq!(offered, [5, 3, 3, 1], "{file}");
        assert_eq!(admitted, [3, 1, 3, 0], "{file}");
        assert_eq!(refusals, [2, 2, 0, 1], "{file}");

        // The keys most refused: alice 3 of 7; bob and carol 1 each, in the
        // order they first came.
        let names = |tally: &Tally| -> Vec<(String, u64, u64)> {
            summary::top_refused(tally, 5)
                .into_iter()
                .map(|(id, refused, requests)| (replay.seen.keys.name(id), refused, requests))
                .collect()
        };
        let expected = [("alice", 3, 7), ("bob", 1, 3), ("carol", 1, 2)];
        let expected: Vec<(String, u64, u64)> = expected
            .iter()
            .map(|&(k, r, n)| (k.to_owned(), r, n))
            .collect();
        assert_eq!(names(per_key), expected, "{file}");
        assert_eq!(names(per_key)[..1], expected[..1]);
        assert_eq!(summary::top_refused(per_key, 1).len(), 1);
    }
}

/// Waiting per key on the same trace. A token bucket that starts full
/// grants a request of n at `tat − τ`, where `tat = max(tat, t) + n·I` as
/// above, FIFO:
///
/// ```text
/// alice  0 +, 0.1 +, 0.2 → 1 (waits 0.8), 0.4 → 2 (1.6), 1 → 3 (2), 2 → 4 (2),
///        3 (n = 2) → 6 (3)
/// bob    0.3 +, 1 (n = 2) → 1.3 (0.3), 2 → 2.3 (0.3)
/// carol  1.5 (n = 3): too large; 2.25 +
/// ```
///
/// Every grant falls on a whole millisecond, so tokio's timer adds nothing.
#[test]
fn waits_per_key_are_exact_and_percentiles_are_nearest_rank() {
    let path = data("trace_small.csv");
    let replay = replay(&[
        "--trace",
        &path,
        "--limiter",
        "token-wait:rate=1,burst=2,per-key",
        "--limiter",
        "funnel-wait:rate=1,burst=2,per-key",
    ]);
    // The funnel waits for room as the full token bucket waits for tokens.
    assert_eq!(replay.tallies[0].waits, replay.tallies[1].waits);
    assert_eq!(replay.tallies[0].buckets, replay.tallies[1].buckets);
    let tally = &replay.tallies[0];
    assert_eq!(counts(tally), (4, 7, 1));
    assert_eq!(refused(tally, Refusal::TooLarge), 1);
    let mut waits = tally.waits.clone();
    waits.sort_unstable();
    assert_eq!(
        waits,
        [300, 300, 800, 1600, 2000, 2000, 3000].map(ms).to_vec()
    );
    // 11 granted: 4 waited nothing. p50 is the 6th (300 ms), p99 the 11th.
    assert_eq!(
        summary::waits(tally),
        [Some(ms(300)), Some(ms(3000)), Some(ms(3000))]
    );
    // Grants per second: 0, 0.1, 0.3 | 1, 1.3 | 2, 2.25, 2.3 | 3 | 4 | 6.
    let admitted: Vec<u64> = tally.buckets.iter().map(|b| b.admitted).collect();
    assert_eq!(admitted, [3, 2, 3, 1, 1, 0, 1]);
    let longest: Vec<u64> = tally.buckets.iter().map(|b| b.max_wait).collect();
    assert_eq!(longest, [0, 800, 1600, 2000, 2000, 0, 3000].map(ms));
}

#[test]
fn an_access_log_is_keyed_by_client_host() {
    // Two hosts; 203.0.113.7 at 0, 0, 1 (03:00:01 at −07:00), 1; the other
    // at 0 and 5. A burst of 1 at 1/s per host: the second request of each
    // instant is refused.
    let path = data("access_small.log");
    let replay = replay(&[
        "--trace",
        &path,
        "--limiter",
        "funnel:rate=1,burst=1,per-key",
    ]);
    assert_eq!((replay.seen.requests, replay.seen.keys.len()), (6, 2));
    assert_eq!(replay.seen.last, ms(5000));
    let tally = &replay.tallies[0];
    assert_eq!(counts(tally), (4, 0, 2));
    let top = summary::top_refused(tally, 5);
    assert_eq!(top.len(), 1);
    assert_eq!(replay.seen.keys.name(top[0].0), "203.0.113.7");
    assert_eq!((top[0].1, top[0].2), (2, 4));
}

#[test]
fn the_demo_traffic_through_the_tool_gives_the_demo_answers() {
    // No --traffic: the demo's 30 requests, one every 200 ms.
    let replay = replay(&[
        "--limiter",
        "token",
        "--limiter",
        "leaky",
        "--limiter",
        "funnel",
        "--limiter",
        "shaper",
        "--limiter",
        "token-wait",
    ]);
    let got: Vec<(u64, u64, u64)> = replay.tallies.iter().map(counts).collect();
    assert_eq!(
        got,
        [
            (13, 0, 17),
            (13, 0, 17),
            (13, 0, 17),
            (1, 12, 17),
            (2, 28, 0)
        ]
    );
    assert_eq!(refused(&replay.tallies[3], Refusal::Overflow), 17);
    assert_eq!(summary::waits(&replay.tallies[4])[2], Some(ms(8200)));
}

/// The meters' pass moves the paused clock by hand, outside the scheduler,
/// and lets the buckets' actors run once a virtual second. The same specs
/// on a runtime driven the ordinary way — `time::advance(…).await` inside
/// `block_on`, every task let run at every arrival — must answer the same
/// on every request.
#[test]
fn the_meters_pass_answers_as_the_limiters_do_on_a_running_runtime() {
    let plan = plan(&[
        "--traffic",
        "poisson:rate=40,keys=7,skew=0.8,weight=1",
        "--duration",
        "20s",
        "--seed",
        "7",
        "--limiter",
        "token:rate=10,burst=5",
        "--limiter",
        "leaky:rate=10,burst=5",
        "--limiter",
        "funnel:rate=10,burst=5",
        "--limiter",
        "funnel:rate=3,burst=2,per-key",
        "--limiter",
        "token:rate=3,burst=2,per-key",
        "--limiter",
        "leaky:rate=3,burst=2,per-key,max-keys=4",
        "--limiter",
        "funnel:quota=10/s:5+100/m:60",
        "--limiter",
        "bursty-try:rate=10,burst=5",
        "--limiter",
        "warmup-try:rate=10,warmup=2s",
    ]);
    let fast = run(&plan).unwrap();
    let arrivals = arrivals(&plan.traffic);
    assert_eq!(arrivals.len() as u64, fast.seen.requests);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap();
    let outcomes: Vec<Vec<Result<(), tokio_ratelimit::TryAcquireError>>> =
        runtime.block_on(async {
            let meters: Vec<_> = plan
                .specs
                .iter()
                .map(|spec| match spec.build().unwrap() {
                    Built::Meter(meter) => meter,
                    Built::Waiter(_) => unreachable!(),
                })
                .collect();
            let start = tokio::time::Instant::now();
            let mut outcomes = vec![Vec::new(); meters.len()];
            for arrival in &arrivals {
                let at = start + Duration::from_nanos(arrival.at);
                tokio::time::advance(at - tokio::time::Instant::now()).await;
                for _ in 0..4 {
                    tokio::task::yield_now().await;
                }
                for (meter, outcome) in meters.iter().zip(&mut outcomes) {
                    outcome.push(meter(arrival.key, arrival.weight));
                }
            }
            outcomes
        });
    for (tally, outcomes) in fast.tallies.iter().zip(&outcomes) {
        let passed = outcomes.iter().filter(|o| o.is_ok()).count() as u64;
        let limited = outcomes
            .iter()
            .filter(|o| matches!(o, Err(tokio_ratelimit::TryAcquireError::Limited { .. })))
            .count() as u64;
        let unavailable = outcomes
            .iter()
            .filter(|o| matches!(o, Err(tokio_ratelimit::TryAcquireError::Unavailable)))
            .count() as u64;
        assert_eq!(tally.passed, passed, "{}", tally.spec.label);
        assert_eq!(
            refused(tally, Refusal::Limited),
            limited,
            "{}",
            tally.spec.label
        );
        assert_eq!(
            refused(tally, Refusal::Unavailable),
            unavailable,
            "{}",
            tally.spec.label
        );
        assert_eq!(tally.requests, outcomes.len() as u64);
    }
    // The traffic is over the limits, so the comparison has refusals to
    // compare: 40/s offered to 10/s.
    assert!(fast.tallies.iter().all(|t| t.refused_total() > 0));
    assert!(fast.tallies.iter().all(|t| t.passed > 0));
}

#[test]
fn generated_patterns_are_exact_or_seeded() {
    let traffic = |args: &[&str]| plan(args).traffic;
    let at =
        |args: &[&str]| -> Vec<u64> { arrivals(&traffic(args)).iter().map(|a| a.at).collect() };

    // Constant: every 1/R, up to the duration (excluded).
    assert_eq!(
        at(&["--traffic", "constant:rate=4", "--duration", "1s"]),
        [0, 250, 500, 750].map(ms)
    );
    assert_eq!(
        at(&["--traffic", "constant:every=300ms", "--duration", "1s"]),
        [0, 300, 600, 900].map(ms)
    );
    // Bursts: 3 at once every second, or spread over 300 ms.
    assert_eq!(
        at(&["--traffic", "bursts:size=3,every=1s", "--duration", "2s"]),
        [0, 0, 0, 1000, 1000, 1000].map(ms)
    );
    assert_eq!(
        at(&[
            "--traffic",
            "bursts:size=3,every=1s,width=300ms",
            "--duration",
            "2s"
        ]),
        [0, 100, 200, 1000, 1100, 1200].map(ms)
    );

    // Poisson: the same seed, the same arrivals; another seed, others.
    let poisson = ["--traffic", "poisson:rate=100,keys=10", "--duration", "60s"];
    let one = arrivals(&traffic(&poisson));
    assert_eq!(one, arrivals(&traffic(&poisson)));
    let mut other_seed = poisson.to_vec();
    other_seed.extend(["--seed", "2"]);
    let other = arrivals(&traffic(&other_seed));
    assert_ne!(one, other);
    // Pinned by ChaCha8 and the locked rand_distr; about 6000 either way.
    assert_eq!(one.len(), 6063);
    for n in [one.len(), other.len()] {
        assert!((5700..6300).contains(&n), "{n}");
    }
    assert!(one.windows(2).all(|w| w[0].at <= w[1].at));
    // Ten keys, key-1 (id 0) the busiest: Zipf 1 gives it 1/H(10) ≈ 34 %.
    let busiest = one.iter().filter(|a| a.key == 0).count();
    assert!((1800..2300).contains(&busiest), "{busiest}");
    assert!(one.iter().all(|a| a.key < 10 && a.weight == 1));

    // On/off: only while on (the first 2 s of every 5 s), at 50/s.
    let onoff = arrivals(&traffic(&[
        "--traffic",
        "onoff:rate=50,on=2s,off=3s",
        "--duration",
        "50s",
    ]));
    assert!(onoff.iter().all(|a| a.at % ms(5000) < ms(2000)));
    assert!((900..1100).contains(&onoff.len()), "{}", onoff.len());

    // A ramp from 0 to 100/s over 20 s: 1000 expected, a quarter of them in
    // the first half.
    let ramp = arrivals(&traffic(&[
        "--traffic",
        "ramp:from=0,to=100",
        "--duration",
        "20s",
    ]));
    let first_half = ramp.iter().filter(|a| a.at < ms(10_000)).count();
    assert!((900..1100).contains(&ramp.len()), "{}", ramp.len());
    assert!((200..300).contains(&first_half), "{first_half}");

    // weight=N asks N permits a request.
    let heavy = arrivals(&traffic(&[
        "--traffic",
        "constant:rate=1,weight=3",
        "--duration",
        "2s",
    ]));
    assert!(heavy.iter().all(|a| a.weight == 3));
}

/// A trace file of `content` in the temp directory, removed on drop.
struct TempTrace(PathBuf);

impl TempTrace {
    fn new(name: &str, content: &str) -> TempTrace {
        let path = std::env::temp_dir().join(format!(
            "tokio-ratelimit-playground-{}-{name}",
            std::process::id()
        ));
        std::fs::write(&path, content).unwrap();
        TempTrace(path)
    }

    fn path(&self) -> &str {
        self.0.to_str().unwrap()
    }
}

impl Drop for TempTrace {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

#[test]
#[expect(clippy::too_many_lines, reason = "a table of cases")]
fn bad_input_gets_a_message_naming_the_line() {
    // (file name, content, the message after "<path>, line N: " or
    // "<path>: ", requests left when bad lines are skipped)
    let cases: &[(&str, &str, &str, Option<u64>)] = &[
        (
            "stamp.csv",
            "0,a\n0.5,b\nyesterday,c\n1,a\n",
            "line 3: 'yesterday' is not a timestamp (RFC 3339, or seconds from the start)",
            Some(3),
        ),
        (
            "backwards.csv",
            "0,a\n2,a\n1,b\n3,b\n",
            "line 3: the timestamp goes backwards: 1s after line 2's 2s",
            Some(3),
        ),
        (
            "backwards.jsonl",
            "{\"t\": \"2026-12-01T10:00:05Z\"}\n{\"t\": \"2026-12-01T10:00:01Z\"}\n",
            "line 2: the timestamp goes backwards: 4s before the first request",
            Some(1),
        ),
        ("empty.csv", "", "no requests in the trace", None),
        (
            "only-header.csv",
            "# nothing recorded\ntimestamp,key\n\n",
            "no requests in the trace",
            None,
        ),
        (
            "weight.csv",
            "0,a,1\n1,a,0\n2,a,x\n",
            "line 2: a weight of 0 (at least 1 permit)",
            Some(1),
        ),
        (
            "fields.csv",
            "0,a,1,extra\n1,a\n",
            "line 1: 4 fields; expected timestamp[,key[,weight]]",
            Some(1),
        ),
        (
            "header.csv",
            "when,who\n0,a\n",
            "line 1: 'when' is not a timestamp, and a header line needs a 'timestamp' column",
            Some(1),
        ),
        (
            "mixed.csv",
            "2026-12-01T10:00:00Z,a\n1.5,a\n",
            "line 2: seconds from the start in a trace of absolute timestamps",
            Some(1),
        ),
        (
            "json.jsonl",
            "{\"t\": 0}\n{\"t\": 1,\n{\"key\": \"a\"}\n{\"t\": 2}\n",
            "line 2: not JSON: EOF while parsing a value at line 1 column 8",
            Some(2),
        ),
        (
            "nostamp.jsonl",
            "{\"t\": 0}\n{\"key\": \"a\"}\n",
            "line 2: no timestamp (a field 't', 'ts', 'time' or 'timestamp')",
            Some(1),
        ),
        (
            "negative.jsonl",
            "{\"t\": 0}\n{\"t\": -1}\n",
            "line 2: '-1' is not a time since the start (seconds, at least 0)",
            Some(1),
        ),
        (
            "date.log",
            "h - - [01/Dec/2026:10:00:00 +0000] \"GET /\" 200 1\nh - - [31/Foo/2026:10:00:00 +0000] \"GET /\" 200 1\n",
            "line 2: '31/Foo/2026:10:00:00 +0000' is not an access-log date (10/Oct/2000:13:55:36 -0700)",
            Some(1),
        ),
    ];
    for &(name, content, message, left) in cases {
        let file = TempTrace::new(name, content);
        let expected = if message.starts_with("line") {
            format!("{}, {message}", file.path())
        } else {
            format!("{}: {message}", file.path())
        };
        // Stop (the default): the run ends with the message.
        let stopped = run(&plan(&["--trace", file.path(), "--limiter", "funnel"]));
        match stopped {
            Err(ReplayError::Trace(error)) => assert_eq!(error.to_string(), expected, "{name}"),
            other => panic!("{name}: {other:?}"),
        }
        // Skip: the line is left out, reported once, and the run goes on.
        let plan = plan(&[
            "--trace",
            file.path(),
            "--on-error",
            "skip",
            "--limiter",
            "funnel",
            "--limiter",
            "token-wait",
        ]);
        let mut heard = Vec::new();
        let skipped = engine::replay(&plan.traffic, &plan.specs, plan.bucket, &mut |e| {
            heard.push(e.to_string());
        });
        match (skipped, left) {
            (Ok(replay), Some(left)) => {
                assert_eq!(replay.seen.requests, left, "{name}");
                assert_eq!(heard.first(), Some(&expected), "{name}");
                assert_eq!(
                    heard.len() as u64,
                    replay.seen.skipped,
                    "{name}: heard once"
                );
                assert_eq!(replay.seen.skipped_first[0].to_string(), expected, "{name}");
                assert!(replay.tallies.iter().all(|t| t.requests == left), "{name}");
            }
            (Err(ReplayError::Trace(error)), None) => {
                assert_eq!(error.to_string(), expected, "{name}");
                // A bad trace exits apart from a bad flag (2).
                assert_eq!(ReplayError::Trace(error).exit_code(), 3, "{name}");
            }
            (other, _) => panic!("{name}: {other:?}"),
        }
    }
    // A trace longer than the tally keeps buckets for.
    let long = TempTrace::new("long.csv", "0,a\n3000000,a\n");
    let error = run(&plan(&["--trace", long.path(), "--limiter", "funnel"])).unwrap_err();
    assert_eq!(error.exit_code(), 4);
    assert_eq!(
        error.to_string(),
        "a request at 34d17h20m is past 2000000 buckets of 1s (--bucket): give a longer --bucket"
    );
    let plan_10s = plan(&[
        "--trace",
        long.path(),
        "--bucket",
        "10s",
        "--limiter",
        "funnel",
    ]);
    assert_eq!(run(&plan_10s).unwrap().seen.requests, 2);
    // A file that is not there.
    let missing = run(&plan(&[
        "--trace",
        "/nonexistent/trace.csv",
        "--limiter",
        "funnel",
    ]));
    assert!(
        matches!(&missing, Err(ReplayError::Trace(e)) if e.to_string().starts_with("/nonexistent/trace.csv: No such file")),
        "{missing:?}"
    );
}

#[test]
fn the_chart_is_well_formed_svg_with_one_series_per_limiter() {
    let path = data("trace_small.csv");
    let replay = replay(&[
        "--trace",
        &path,
        "--limiter",
        "funnel:rate=1,burst=2,per-key",
        "--limiter",
        "token:rate=1,burst=2",
        "--limiter",
        "token-wait:rate=1,burst=2,per-key",
    ]);
    let svg = playground::chart::svg("a title", &replay).unwrap();
    let doc = roxmltree::Document::parse(&svg).expect("well-formed XML");
    let root = doc.root_element();
    assert_eq!(root.tag_name().name(), "svg");
    let texts: Vec<String> = doc
        .descendants()
        .filter(|n| n.has_tag_name("text"))
        .map(|n| n.text().unwrap_or("").trim().to_owned())
        .collect();
    for needed in [
        "a title",
        "requests per second",
        "wait (ms)",
        "time since the start (s)",
        "offered",
    ] {
        assert!(
            texts.iter().any(|t| t == needed),
            "no text {needed:?} in {texts:?}"
        );
    }
    // Each limiter: a line of admitted requests and a line of waits, each
    // with its legend entry, all in the limiter's own colour.
    let lines: Vec<(String, usize)> = doc
        .descendants()
        .filter(|n| {
            // Not the axes and grid (black), not the offered traffic (grey).
            n.has_tag_name("polyline")
                && !matches!(n.attribute("stroke"), Some("#000000" | "#BEBEBE"))
        })
        .map(|n| {
            let points = n
                .attribute("points")
                .unwrap_or("")
                .split_whitespace()
                .count();
            (n.attribute("stroke").unwrap().to_owned(), points)
        })
        .collect();
    let mut colours: Vec<&str> = lines.iter().map(|(c, _)| c.as_str()).collect();
    colours.sort_unstable();
    colours.dedup();
    assert_eq!(colours.len(), 3, "{lines:?}");
    for colour in colours {
        let of = |long: bool| {
            lines
                .iter()
                .filter(|(c, n)| c == colour && (*n > 2) == long)
                .count()
        };
        // Two series (a point per second of the 7 s replay) and two
        // legend strokes (two points).
        assert_eq!((of(true), of(false)), (2, 2), "{colour}: {lines:?}");
    }
    for tally in &replay.tallies {
        for prefix in ["admitted: ", "wait: "] {
            let label = format!("{prefix}{}", tally.spec.label);
            assert!(texts.contains(&label), "no legend {label:?}");
        }
    }
}

#[test]
fn the_json_summary_has_the_answers() {
    let path = data("trace_small.csv");
    let plan = plan(&[
        "--trace",
        &path,
        "--limiter",
        "funnel:rate=1,burst=2,per-key,label=per client",
        "--limiter",
        "token-wait:rate=1,burst=2,per-key",
        "--json",
        "-",
    ]);
    let replay = run(&plan).unwrap();
    let json = summary::json(&plan.traffic, &replay, 2);
    // Through text and back, as a script reads it.
    let json: serde_json::Value = serde_json::from_str(&json.to_string()).unwrap();
    assert_eq!(json["traffic"]["requests"], 12);
    assert_eq!(json["traffic"]["keys"], 3);
    assert_eq!(json["bucket_s"], 1.0);
    let funnel = &json["limiters"][0];
    assert_eq!(funnel["label"], "per client");
    assert_eq!(funnel["call"], "keyed::KeyedFunnel::try_acquire_many");
    assert_eq!(funnel["per_key"], true);
    assert_eq!(funnel["limit"], "1/s burst 2");
    let totals = [&funnel["passed"], &funnel["waited"], &funnel["refused"]];
    assert_eq!(totals, [7, 0, 5]);
    assert_eq!(funnel["refused_by"]["limited"], 4);
    assert_eq!(funnel["refused_by"]["too_large"], 1);
    assert_eq!(
        funnel["per_bucket"]["offered"],
        serde_json::json!([5, 3, 3, 1])
    );
    assert_eq!(
        funnel["per_bucket"]["admitted"],
        serde_json::json!([3, 1, 3, 0])
    );
    assert_eq!(
        funnel["top_refused_keys"],
        serde_json::json!([
            {"key": "alice", "refused": 3, "requests": 7},
            {"key": "bob", "refused": 1, "requests": 3},
        ])
    );
    let waiting = &json["limiters"][1];
    assert_eq!(
        waiting["call"],
        "keyed::Keyed<_, TokenBucket>::acquire_many"
    );
    assert_eq!(waiting["wait_ms"]["p50"], 300.0);
    assert_eq!(waiting["wait_ms"]["p99"], 3000.0);
    assert_eq!(waiting["wait_ms"]["max"], 3000.0);
}

/// `--keys FILE`: one JSON line per key, for every key (refused or not),
/// with each limiter's passed / waited / refused: on the small trace, the
/// counts worked out by hand above (the per-key funnel refuses alice 3 of
/// 7, bob 1 of 3, carol her request of 3; the waiting token bucket makes
/// alice wait 5 times and refuses her nothing; a roomy funnel refuses
/// nobody).
#[test]
fn every_keys_counts_are_written_one_line_each() {
    let path = data("trace_small.csv");
    let out = TempTrace::new("keys.jsonl", "");
    let keys = plan(&[
        "--trace",
        &path,
        "--limiter",
        "funnel:rate=1,burst=2,per-key",
        "--limiter",
        "token-wait:rate=1,burst=2,per-key",
        "--limiter",
        "funnel:rate=1000,burst=1000,label=roomy",
        "--keys",
        out.path(),
    ]);
    assert_eq!(
        playground::tool::run(&keys),
        std::process::ExitCode::SUCCESS
    );
    let text = std::fs::read_to_string(&out.0).unwrap();
    let lines: Vec<serde_json::Value> = text
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    let row = |key: &str, requests: u64, counts: [[u64; 3]; 3]| {
        let labels = [
            "funnel:rate=1,burst=2,per-key",
            "token-wait:rate=1,burst=2,per-key",
            "roomy",
        ];
        serde_json::json!({
            "key": key,
            "requests": requests,
            "limiters": labels.iter().zip(counts).map(|(label, [passed, waited, refused])| {
                serde_json::json!({"label": label, "passed": passed, "waited": waited, "refused": refused})
            }).collect::<Vec<_>>(),
        })
    };
    assert_eq!(
        lines,
        [
            row("alice", 7, [[4, 0, 3], [2, 5, 0], [7, 0, 0]]),
            row("bob", 3, [[2, 0, 1], [1, 2, 0], [3, 0, 0]]),
            row("carol", 2, [[1, 0, 1], [1, 0, 1], [2, 0, 0]]),
        ]
    );
    // Both answers cannot take stdout.
    assert!(parse_command(["--trace", &path, "--json", "-", "--keys", "-"]).is_err());
    // A file that cannot be written is an output failure: exit 1.
    let unwritable = plan(&["--trace", &path, "--keys", "/nonexistent/keys.jsonl"]);
    assert_eq!(
        playground::tool::run(&unwritable),
        std::process::ExitCode::FAILURE
    );
}

/// Many keys: a line each, in the order they came, and the lines add up to
/// the traffic.
#[test]
fn keys_are_streamed_for_many_keys() {
    let plan = plan(&[
        "--traffic",
        "poisson:rate=20000,keys=20000",
        "--duration",
        "2s",
        "--limiter",
        "funnel:rate=1,burst=1,per-key",
    ]);
    let replay = run(&plan).unwrap();
    let mut out = Vec::new();
    summary::write_keys(&mut out, &replay).unwrap();
    let lines: Vec<serde_json::Value> = out
        .split(|&b| b == b'\n')
        .filter(|line| !line.is_empty())
        .map(|line| serde_json::from_slice(line).unwrap())
        .collect();
    assert_eq!(lines.len(), replay.seen.keys.len());
    assert!(lines.len() > 15_000, "{} keys", lines.len());
    let total = |field: &str| -> u64 {
        lines
            .iter()
            .map(|l| l["limiters"][0][field].as_u64().unwrap())
            .sum()
    };
    let requests: u64 = lines.iter().map(|l| l["requests"].as_u64().unwrap()).sum();
    assert_eq!(requests, replay.seen.requests);
    let tally = &replay.tallies[0];
    assert_eq!(
        (total("passed"), total("waited"), total("refused")),
        counts(tally)
    );
    for (id, line) in lines.iter().enumerate() {
        assert_eq!(line["key"], format!("key-{}", id + 1));
    }
}

#[test]
fn the_text_report_answers_the_question() {
    let path = data("trace_small.csv");
    let plan = plan(&[
        "--trace",
        &path,
        "--limiter",
        "funnel:rate=1,burst=2,per-key",
    ]);
    let replay = run(&plan).unwrap();
    let mut text = String::new();
    summary::render(&mut text, &plan.traffic, &replay, 5).unwrap();
    for needed in [
        "12 requests over 3s, 3 keys",
        "#1          7         0         5     41.7%        0ms       0ms       0ms  funnel:rate=1,burst=2,per-key",
        "refused: 4 limited, 1 too large",
        "#1 funnel:rate=1,burst=2,per-key: alice 3/7, bob 1/3, carol 1/2",
    ] {
        assert!(text.contains(needed), "no {needed:?} in\n{text}");
    }
    // The table ends each row with the limiter's label, however long.
    let widest = text.lines().map(|l| l.chars().count()).max().unwrap();
    let label = "funnel:rate=1,burst=2,per-key".len();
    assert!(widest <= 80 + label, "a line of {widest} columns");
}

#[test]
#[expect(clippy::too_many_lines, reason = "a table of cases")]
fn tool_flags_are_checked() {
    let refused: &[(&[&str], &str)] = &[
        (
            &["--traffic", "zigzag:rate=1"],
            "unknown pattern 'zigzag' (known: constant, poisson, bursts, onoff, ramp)",
        ),
        (
            &["--traffic", "poisson"],
            "'poisson' needs rate=R (requests per second)",
        ),
        (
            &["--traffic", "poisson:rate=-1"],
            "rate=-1: expects a positive number of requests per second",
        ),
        (
            &["--traffic", "poisson:rate=1,burst=3"],
            "'burst' is not a knob of 'poisson'",
        ),
        (&["--traffic", "bursts:size=3"], "'bursts' needs every=SPAN"),
        (
            &["--traffic", "bursts:size=3,every=1s,width=2s"],
            "width= must not be longer than every=",
        ),
        (
            &["--duration", "1fortnight"],
            "unknown unit 'fortnight' in '1fortnight'",
        ),
        (&["--duration", "400d"], "must be at most 365 days"),
        (
            &["--traffic", "poisson:rate=1", "--duration", "30d"],
            "--duration 30d is more than 2000000 buckets of --bucket 1s: give a longer --bucket",
        ),
        (
            &["--format", "xml"],
            "expects auto, csv, jsonl or access-log",
        ),
        (&["--on-error", "retry"], "expects stop or skip"),
        (
            &["--limiter", "gcra"],
            "unknown limiter 'gcra' (known: token, token-wait, leaky, shaper, funnel, \
             funnel-wait, bursty, bursty-try, warmup, warmup-try)",
        ),
        (
            &["--limiter", "token:rate=0"],
            "rate=0: expects a positive number per second, or N/PERIOD",
        ),
        (
            &["--limiter", "token:warmup=2s"],
            "'warmup=2s' is not a knob of 'token'",
        ),
        (
            &["--limiter", "funnel:quota=20/s"],
            "the band '20/s' is not RATE:CAPACITY",
        ),
        (
            &["--limiter", "funnel:rate=2,quota=20/s:40"],
            "give either quota= or rate= and capacity=, not both",
        ),
        (
            &["--limiter", "bursty:quota=20/s:40+1000/d:1000"],
            "'bursty' takes one rate, not a quota of several bands",
        ),
        (
            &["--trace", "x.csv", "--traffic", "poisson:rate=1"],
            "cannot be used with",
        ),
    ];
    for &(args, message) in refused {
        let error = parse_command(args.iter().copied()).unwrap_err();
        assert!(error.to_string().contains(message), "{args:?}: {error}");
        // A bad flag exits with clap's 2; a bad trace with 3.
        assert_eq!(error.exit_code(), 2, "{args:?}");
    }
    // A spec's knobs, and its defaults from the demo's flags.
    let plan = plan(&[
        "--rate",
        "5",
        "--capacity",
        "3",
        "--limiter",
        "token",
        "--limiter",
        "funnel:quota=20/s:40+10000/d:10000,per-key,max-keys=100,label=api",
        "--limiter",
        "warmup:rate=0.5,warmup=1m30s,cold-factor=4",
        "--limiter",
        "shaper:rate=5/10s,burst=7,timeout=250ms",
    ]);
    let describe: Vec<String> = plan.specs.iter().map(Spec::describe_limit).collect();
    assert_eq!(
        describe,
        [
            "5/s burst 3",
            "20/s burst 40 + 10000/1d burst 10000",
            "1/2s burst 3",
            "5/10s burst 7"
        ]
    );
    assert_eq!(plan.specs[1].label, "api");
    assert!(plan.specs[1].per_key);
    assert_eq!(plan.specs[1].max_keys, Some(100));
    assert_eq!(plan.specs[2].warmup, Duration::from_secs(90));
    assert_eq!(plan.specs[2].cold_factor.to_bits(), 4.0f64.to_bits());
    assert_eq!(plan.specs[3].timeout, Some(Duration::from_millis(250)));
    // No tool flag: the demo, as it was.
    assert!(matches!(
        parse_command(["--count", "5"]),
        Ok(Command::Demo(_))
    ));
    // The help shows the tool's examples.
    let help = parse_command(["--help"]).unwrap_err().to_string();
    for needed in [
        "--traffic <PATTERN>",
        "--limiter <SPEC>",
        "Examples, the tool",
        "poisson:rate=R",
    ] {
        assert!(help.contains(needed), "no {needed:?} in the help");
    }
}
