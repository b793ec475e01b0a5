//! The `io` feature's wrappers, measured in one run: what a wrapper costs
//! when it never waits, and the CPU and the pacing of a copy at a limited
//! rate, beside `async-speed-limit` 0.4 doing the same copy.
//!
//! ```sh
//! cargo bench -p tokio-ratelimit-benches --bench io
//! BENCH_QUICK=1 cargo bench -p tokio-ratelimit-benches --bench io   # a smoke test
//! BENCH_SECS=5 BENCH_ROUNDS=5 cargo bench -p tokio-ratelimit-benches --bench io
//! cargo bench -p tokio-ratelimit-benches --bench io -- overhead   # or: limited
//! ```
//!
//! Every copy reads from `tokio::io::repeat(0)` (memory, no system call:
//! what a byte costs to make is a `memset`) and writes to a sink, on a
//! multi-thread runtime of 2 workers, the copy driven by `block_on`.
//!
//! * **Overhead** (`overhead`): 1 GiB copied raw (`tokio::io::copy`, its
//!   8 KiB buffer; and `copy_buf` from a 16 KiB `BufReader`, the wrapper's
//!   buffer size without a limit) and through each wrapper over a
//!   `TokenBucket` that never makes it wait (10⁹ bytes a second, a burst of
//!   4 GiB: the 1 GiB fits, so what is measured is the payments, one per
//!   chunk, not a rate): `io::copy` (a `RateLimitedRead` under tokio's
//!   `copy_buf`, no second buffer), the same with 8 KiB chunks,
//!   `tokio::io::copy` into a `RateLimitedWrite` (a payment per 8 KiB
//!   write), and `tokio::io::copy` from a `RateLimitedRead` (which copies
//!   every byte once more, from the wrapper's buffer into `copy`'s). And
//!   async-speed-limit's reader at an infinite speed, its "unlimited". Two
//!   sources: a 64 MiB buffer read over and over (every byte from RAM, as
//!   from the page cache or a socket's buffers; its `memcpy` speed depends
//!   on how the source and the destination buffers happen to be aligned, by
//!   up to 2× from run to run, so read this table for orders of magnitude),
//!   and `repeat(0)`, a `memset` into the caller's buffer: the cheapest
//!   bytes there are, where the payments weigh most. The routes alternate
//!   in `BENCH_ROUNDS` rounds (default 7); quoted: the median time and CPU
//!   time, and the medians of the per-round ratios to the raw copy. The
//!   instructions a payment costs, which no noise changes, are counted by
//!   `examples/callgrind_io.rs`.
//! * **Limited** (`limited`; 100 MiB/s and 10 MiB/s): `BENCH_SECS`
//!   (default 3) seconds' worth of bytes at the rate, through `io::copy`
//!   with a `TokenBucket` (16 KiB chunks), through a `RateLimitedRead`
//!   whose chunk is the burst (100 ms of the rate, async-speed-limit's
//!   grain), and through `tokio::io::copy` from async-speed-limit's reader (its
//!   defaults: a bucket of 100 ms of the rate, refilled continuously, and
//!   at least 100 ms of sleep once it is empty). Both bursts are the same,
//!   100 ms of the rate: the token bucket's capacity is set so. Quoted,
//!   medians over `BENCH_ROUNDS` rounds (default 3):
//!   - CPU per GiB: the process's CPU time (`getrusage`, all threads:
//!     the runtime's, and futures-timer's thread that async-speed-limit's
//!     clock sleeps on) over the run, per GiB moved;
//!   - lateness: each write into the sink (a chunk: 16 KiB for the
//!     wrapper, 8 KiB for async-speed-limit's `copy`) is due at
//!     `start + max(0, bytes_before - burst) / rate`, `bytes_before` the
//!     bytes written before it; lateness = arrival − due (p50, p99, max);
//!   - early: the most a chunk's last byte came before the limit allowed it,
//!     `start + max(0, bytes_through - burst) / rate` (0 when never);
//!   - rate: the run's bytes after the burst over the time to the last
//!     chunk, against the configured rate.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite};
use tokio::runtime::Runtime;
use tokio_ratelimit::io::{self as rio, RateLimitIoExt as _, RateLimitedRead};
use tokio_ratelimit::{Rate, TokenBucket};
use tokio_ratelimit_benches::{
    Table, cpu_time, load_average, machine, median, quantile, ratio_line, today_utc,
};

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;
/// The target: a wrapper that never waits costs at most this much time.
const TARGET: f64 = 0.05;

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn quick() -> bool {
    std::env::var_os("BENCH_QUICK").is_some()
}

/// A source of `n` zero bytes.
fn zeros(n: u64) -> impl AsyncRead + Unpin {
    tokio::io::repeat(0).take(n)
}

/// `n` bytes read from a buffer of `MEMORY` bytes in memory, over and over
/// (64 MiB: far larger than the caches, so every byte is read from RAM,
/// as a copy from the page cache or a socket's buffers reads it).
struct Memory {
    data: std::sync::Arc<[u8]>,
    pos: usize,
    left: u64,
}

const MEMORY: usize = 64 << 20;

impl Memory {
    fn new(data: &std::sync::Arc<[u8]>, n: u64) -> Memory {
        Memory {
            data: std::sync::Arc::clone(data),
            pos: 0,
            left: n,
        }
    }

    /// The buffer, its pages touched (a zeroed allocation maps one shared
    /// page until it is written).
    fn buffer() -> std::sync::Arc<[u8]> {
        (0..MEMORY).map(|i| (i % 251) as u8).collect()
    }
}

impl AsyncRead for Memory {
    fn poll_read(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        let n = buf
            .remaining()
            .min(this.data.len() - this.pos)
            .min(usize::try_from(this.left).unwrap_or(usize::MAX));
        buf.put_slice(&this.data[this.pos..this.pos + n]);
        this.pos = (this.pos + n) % this.data.len();
        this.left -= n as u64;
        Poll::Ready(Ok(()))
    }
}

/// A sink that notes when each write arrived and how many bytes came
/// before it.
struct Recorder {
    written: u64,
    arrivals: Vec<(Instant, u64, u64)>,
}

impl AsyncWrite for Recorder {
    fn poll_write(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let before = self.written;
        self.written += buf.len() as u64;
        let through = self.written;
        self.arrivals.push((Instant::now(), before, through));
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

/// Runs `f` as a task of `rt` (as a server runs each connection), and
/// waits for it.
fn spawn_on<T: Send + 'static>(rt: &Runtime, f: impl Future<Output = T> + Send + 'static) -> T {
    rt.block_on(rt.spawn(f)).unwrap()
}

/// A token bucket of `rate` bytes a second and `capacity` bytes of burst.
fn bucket(rate: u32, capacity: u32) -> TokenBucket {
    TokenBucket::builder()
        .rate(Rate::per_second(rate))
        .capacity(capacity)
        .build()
        .unwrap()
}

// ---------------------------------------------------------------- overhead

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Route {
    Raw,
    RawBuf,
    IoCopy,
    IoCopy8,
    Write,
    ReadCopy,
    SpeedLimit,
}

impl Route {
    const ALL: [Route; 7] = [
        Route::Raw,
        Route::RawBuf,
        Route::IoCopy,
        Route::IoCopy8,
        Route::Write,
        Route::ReadCopy,
        Route::SpeedLimit,
    ];

    fn name(self) -> &'static str {
        match self {
            Route::Raw => "raw `tokio::io::copy` (8 KiB buffer)",
            Route::RawBuf => "raw `copy_buf` from a 16 KiB `BufReader`",
            Route::IoCopy => "`io::copy` (RateLimitedRead + copy_buf, 16 KiB chunks)",
            Route::IoCopy8 => "the same, `with_max_chunk(8 KiB)`",
            Route::Write => "`tokio::io::copy` into `limited_write`",
            Route::ReadCopy => "`tokio::io::copy` from `limited_read`",
            Route::SpeedLimit => "async-speed-limit, speed ∞",
        }
    }

    /// Copies `n` bytes from `source()`; returns the wall time and the CPU
    /// time.
    fn run<R>(self, rt: &Runtime, n: u64, source: impl Fn(u64) -> R) -> (Duration, Duration)
    where
        R: AsyncRead + Unpin + Send + 'static,
    {
        let mut reader = source(n);
        spawn_on(rt, async move {
            // Never waits: 1 GiB fits in the burst of 4 GiB.
            let unlimited = bucket(1_000_000_000, u32::MAX);
            let mut sink = tokio::io::sink();
            let (cpu, start) = (cpu_time(), Instant::now());
            let copied = match self {
                Route::Raw => tokio::io::copy(&mut reader, &mut sink).await,
                Route::IoCopy => rio::copy(&mut reader, &mut sink, unlimited).await,
                Route::RawBuf => {
                    let mut reader = tokio::io::BufReader::with_capacity(16 << 10, reader);
                    tokio::io::copy_buf(&mut reader, &mut sink).await
                }
                Route::IoCopy8 => {
                    let mut reader = RateLimitedRead::with_max_chunk(8 << 10, reader, unlimited);
                    tokio::io::copy_buf(&mut reader, &mut sink).await
                }
                Route::Write => {
                    tokio::io::copy(&mut reader, &mut sink.limited_write(unlimited)).await
                }
                Route::ReadCopy => {
                    tokio::io::copy(&mut reader.limited_read(unlimited), &mut sink).await
                }
                Route::SpeedLimit => {
                    let limiter = <async_speed_limit::Limiter>::new(f64::INFINITY);
                    tokio::io::copy(&mut limiter.limit(reader), &mut sink).await
                }
            };
            assert_eq!(copied.unwrap(), n);
            (start.elapsed(), cpu_time() - cpu)
        })
    }
}

/// The overhead table of one source.
fn overhead<R>(rt: &Runtime, title: &str, source: impl Fn(u64) -> R)
where
    R: AsyncRead + Unpin + Send + 'static,
{
    let rounds = if quick() {
        1
    } else {
        env_u64("BENCH_ROUNDS", 7)
    };
    let n = if quick() { GIB / 8 } else { GIB };
    let mut times: Vec<Vec<f64>> = vec![Vec::new(); Route::ALL.len()];
    let mut cpus: Vec<Vec<f64>> = vec![Vec::new(); Route::ALL.len()];
    let mut time_ratios: Vec<Vec<f64>> = vec![Vec::new(); Route::ALL.len()];
    let mut cpu_ratios: Vec<Vec<f64>> = vec![Vec::new(); Route::ALL.len()];
    let _ = Route::Raw.run(rt, n / 8, &source); // warm up: pages, caches, the runtime
    for _ in 0..rounds {
        let round: Vec<(Duration, Duration)> =
            Route::ALL.iter().map(|c| c.run(rt, n, &source)).collect();
        let (raw_wall, raw_cpu) = round[0];
        for (i, (wall, cpu)) in round.iter().enumerate() {
            times[i].push(wall.as_secs_f64());
            cpus[i].push(cpu.as_secs_f64());
            time_ratios[i].push(wall.as_secs_f64() / raw_wall.as_secs_f64());
            cpu_ratios[i].push(cpu.as_secs_f64() / raw_cpu.as_secs_f64());
        }
    }
    #[expect(clippy::cast_precision_loss, reason = "byte counts far below 2^53")]
    let gib = n as f64 / GIB as f64;
    let mut t = Table::new(
        format!("Overhead: {gib} GiB from {title} to a sink, never waiting ({rounds} rounds)"),
        &[
            "copy",
            "time (ms)",
            "GiB/s",
            "CPU ms",
            "time / raw",
            "CPU / raw",
        ],
    );
    for (i, route) in Route::ALL.iter().enumerate() {
        let time = median(&times[i]);
        t.row(vec![
            route.name().to_string(),
            format!("{:.1}", time * 1e3),
            format!("{:.2}", gib / time),
            format!("{:.1}", median(&cpus[i]) * 1e3),
            format!("{:.3}", median(&time_ratios[i])),
            format!("{:.3}", median(&cpu_ratios[i])),
        ]);
    }
    for (i, what) in [
        (2, "`io::copy`"),
        (3, "`io::copy`, 8 KiB chunks"),
        (4, "`limited_write`"),
    ] {
        t.note(ratio_line(
            &format!("{what}: CPU over raw − 1 (median of per-round ratios)"),
            median(&cpu_ratios[i]) - 1.0,
            "≤",
            TARGET,
        ));
    }
    t.note(
        "- time and CPU per route are medians over the rounds, the ratios medians of each \
         round's ratio to that round's raw copy; the target is read on CPU time, which \
         other processes sharing the cores inflate less than wall time"
            .to_string(),
    );
    t.print();
}

// ----------------------------------------------------------------- limited

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Peer {
    /// `io::copy`: 16 KiB chunks, the default.
    Ours,
    /// `copy_buf` from a `RateLimitedRead` whose chunk is the burst, 100 ms
    /// of the rate: async-speed-limit's grain.
    OursCoarse,
    SpeedLimit,
}

impl Peer {
    const ALL: [Peer; 3] = [Peer::Ours, Peer::OursCoarse, Peer::SpeedLimit];

    fn name(self) -> &'static str {
        match self {
            Peer::Ours => "tokio-ratelimit `io::copy` (16 KiB chunks)",
            Peer::OursCoarse => "tokio-ratelimit, chunks of 100 ms",
            Peer::SpeedLimit => "async-speed-limit 0.4",
        }
    }
}

/// One limited run's figures.
struct Paced {
    cpu_per_gib: f64,
    p50_ms: f64,
    p99_ms: f64,
    max_ms: f64,
    early_ms: f64,
    achieved: f64,
}

/// Copies `secs` seconds' worth of bytes at `rate` bytes a second, a burst
/// of 100 ms of the rate.
fn limited(rt: &Runtime, peer: Peer, rate: u64, secs: u64) -> Paced {
    let n = rate * secs;
    let burst = rate / 10;
    let (arrivals, start, cpu) = spawn_on(rt, async move {
        let mut sink = Recorder {
            written: 0,
            arrivals: Vec::with_capacity(usize::try_from(n / 4096).unwrap()),
        };
        let bytes = bucket(u32::try_from(rate).unwrap(), u32::try_from(burst).unwrap());
        let speed = <async_speed_limit::Limiter>::new(rate as f64);
        let (cpu, start) = (cpu_time(), Instant::now());
        let copied = match peer {
            Peer::Ours => rio::copy(&mut zeros(n), &mut sink, bytes).await,
            Peer::OursCoarse => {
                let chunk = u32::try_from(burst).unwrap();
                let mut reader = RateLimitedRead::with_max_chunk(chunk, zeros(n), bytes);
                tokio::io::copy_buf(&mut reader, &mut sink).await
            }
            Peer::SpeedLimit => tokio::io::copy(&mut speed.limit(zeros(n)), &mut sink).await,
        };
        assert_eq!(copied.unwrap(), n);
        (sink.arrivals, start, cpu_time() - cpu)
    });
    let due = |bytes: u64| {
        start + Duration::from_secs_f64(bytes.saturating_sub(burst) as f64 / rate as f64)
    };
    let mut late: Vec<f64> = arrivals
        .iter()
        .map(|&(at, before, _)| at.saturating_duration_since(due(before)).as_secs_f64())
        .collect();
    late.sort_by(f64::total_cmp);
    let early = arrivals
        .iter()
        .map(|&(at, _, through)| due(through).saturating_duration_since(at).as_secs_f64())
        .fold(0.0, f64::max);
    let last = arrivals.last().unwrap().0 - start;
    #[expect(clippy::cast_precision_loss, reason = "byte counts far below 2^53")]
    Paced {
        cpu_per_gib: cpu.as_secs_f64() / (n as f64 / GIB as f64),
        p50_ms: quantile(&late, 0.5) * 1e3,
        p99_ms: quantile(&late, 0.99) * 1e3,
        max_ms: late.last().unwrap() * 1e3,
        early_ms: early * 1e3,
        achieved: (n - burst) as f64 / rate as f64 / last.as_secs_f64(),
    }
}

/// CPU µs per wake of a task that sleeps 1.5625 ms in a loop for 1 s.
fn sleep_wake_us(rt: &Runtime) -> f64 {
    let (cpu, wakes) = spawn_on(rt, async {
        let (cpu, start) = (cpu_time(), Instant::now());
        let mut wakes = 0u32;
        while start.elapsed() < Duration::from_secs(1) {
            tokio::time::sleep(Duration::from_micros(1562)).await;
            wakes += 1;
        }
        (cpu_time() - cpu, wakes)
    });
    cpu.as_secs_f64() * 1e6 / f64::from(wakes)
}

fn pacing(rt: &Runtime) {
    let rounds = if quick() {
        1
    } else {
        env_u64("BENCH_ROUNDS", 3)
    };
    let secs = if quick() { 1 } else { env_u64("BENCH_SECS", 3) };
    let mut t = Table::new(
        format!(
            "Limited: {secs} s of bytes at the rate, burst 100 ms of it ({rounds} rounds, medians)"
        ),
        &[
            "rate",
            "copy",
            "CPU s / GiB",
            "late p50 (ms)",
            "late p99 (ms)",
            "late max (ms)",
            "early max (ms)",
            "achieved / configured",
        ],
    );
    for (label, rate) in [("100 MiB/s", 100 * MIB), ("10 MiB/s", 10 * MIB)] {
        let mut samples: Vec<Vec<Paced>> = Peer::ALL.iter().map(|_| Vec::new()).collect();
        for _ in 0..rounds {
            for (i, peer) in Peer::ALL.into_iter().enumerate() {
                samples[i].push(limited(rt, peer, rate, secs));
            }
        }
        for (i, peer) in Peer::ALL.into_iter().enumerate() {
            let m = |f: fn(&Paced) -> f64| median(&samples[i].iter().map(f).collect::<Vec<_>>());
            t.row(vec![
                label.to_string(),
                peer.name().to_string(),
                format!("{:.3}", m(|p| p.cpu_per_gib)),
                format!("{:.2}", m(|p| p.p50_ms)),
                format!("{:.2}", m(|p| p.p99_ms)),
                format!("{:.2}", m(|p| p.max_ms)),
                format!("{:.2}", m(|p| p.early_ms)),
                format!("{:.4}", m(|p| p.achieved)),
            ]);
        }
    }
    t.note(
        "- every CPU figure includes the source's `memset`s (about 0.02 CPU s per GiB, \
         see the overhead tables)"
            .to_string(),
    );
    t.note(format!(
        "- a wait costs what a timer wake costs: a task looping on a 1.5625 ms \
         `tokio::time::sleep` (16 KiB at 10 MiB/s) on this runtime takes {:.1} µs of CPU \
         per wake; the CPU per GiB follows the wakes per GiB (the chunk), not the limiter",
        sleep_wake_us(rt)
    ));
    t.print();
}

fn main() {
    // `cargo bench` passes `--bench`; other arguments name the sections to run.
    let only: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    let run = |section: &str| only.is_empty() || only.iter().any(|o| o == section);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    println!("## tokio-ratelimit benchmarks: bandwidth (`io`)\n");
    println!("- date: {} (UTC)", today_utc());
    println!("- machine: {}", machine());
    println!("- command: `cargo bench -p tokio-ratelimit-benches --bench io`");
    println!("- load average (1 min) at start: {}", load_average());
    let started = Instant::now();
    if run("overhead") {
        let memory = Memory::buffer();
        overhead(&rt, "a 64 MiB buffer in memory, read over and over", |n| {
            Memory::new(&memory, n)
        });
        overhead(&rt, "`repeat(0)` (a `memset`)", zeros);
    }
    if run("limited") {
        pacing(&rt);
    }
    println!("\n- load average (1 min) at end: {}", load_average());
    println!("- total: {:.0} s", started.elapsed().as_secs_f64());
}
