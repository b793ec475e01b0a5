//! A fixed workload of the `io` wrappers for `valgrind --tool=callgrind`:
//! N MiB copied from `tokio::io::repeat(0)` to a sink, raw or through a
//! wrapper over a `TokenBucket` that never makes it wait, so that the
//! instructions a payment costs can be counted on a noisy machine:
//!
//! ```text
//! cargo build --release -p tokio-ratelimit-benches --example callgrind_io
//! for r in raw copy write; do for n in 0 256; do
//!   valgrind --tool=callgrind --callgrind-out-file=cg.$r.$n \
//!     target/release/examples/callgrind_io $r $n
//! done; done
//! ```
//!
//! Arguments: `raw|copy|write` and a size N in MiB. `raw` is
//! `tokio::io::copy` (its 8 KiB buffer); `copy` is `io::copy` (a
//! `RateLimitedRead` under `copy_buf`: one payment per 16 KiB chunk);
//! `write` is `tokio::io::copy` into a `RateLimitedWrite` (one payment per
//! 8 KiB write). Instructions per MiB: (total of run N − total of run 0) / N;
//! a route's extra over `raw`, divided by its payments per MiB (64 or 128),
//! is what one payment costs.

use tokio::io::AsyncReadExt as _;
use tokio_ratelimit::io::{self as rio, RateLimitIoExt as _};
use tokio_ratelimit::{Rate, TokenBucket};

fn main() {
    let mut args = std::env::args().skip(1);
    let route = args.next().unwrap_or_else(|| "copy".into());
    let mib: u64 = args
        .next()
        .map_or(256, |s| s.parse().expect("a size in MiB"));
    let n = mib << 20;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let copied = rt.block_on(async {
        // Never waits: 10⁹ bytes a second and a burst of 4 GiB.
        let bucket = TokenBucket::builder()
            .rate(Rate::per_second(1_000_000_000))
            .capacity(u32::MAX)
            .build()
            .unwrap();
        let mut source = tokio::io::repeat(0).take(n);
        let mut sink = tokio::io::sink();
        match route.as_str() {
            "raw" => tokio::io::copy(&mut source, &mut sink).await,
            "copy" => rio::copy(&mut source, &mut sink, bucket).await,
            "write" => tokio::io::copy(&mut source, &mut sink.limited_write(bucket)).await,
            other => panic!("unknown route {other}: raw, copy or write"),
        }
    });
    assert_eq!(copied.unwrap(), n);
}
