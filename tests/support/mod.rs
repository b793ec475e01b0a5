//! Helpers shared by the integration tests (each test file uses some).
#![allow(
    dead_code,
    reason = "each includer uses a part (an expect would fail for the one that uses all)"
)]

use std::time::Duration;

use tokio::task::{JoinHandle, yield_now};
use tokio_ratelimit::TryAcquireError;

/// A seeded generator (runs are reproducible): a 64-bit LCG (Knuth's
/// MMIX constants), its high bits.
pub(crate) struct Lcg(pub(crate) u64);

impl Lcg {
    /// A number below `n`.
    pub(crate) fn below(&mut self, n: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (self.0 >> 33) % n
    }
}

/// Runs `f` to its end on a runtime whose clock is paused (for the
/// property tests, whose cases are plain functions).
pub(crate) fn run<F: std::future::Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .unwrap()
        .block_on(f)
}

/// `n` milliseconds.
pub(crate) fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// `n` microseconds.
pub(crate) fn us(n: u64) -> Duration {
    Duration::from_micros(n)
}

/// The refusal `try_acquire` gives when the request fits after
/// `retry_after`.
pub(crate) fn limited(retry_after: Duration) -> Result<(), TryAcquireError> {
    Err(TryAcquireError::Limited { retry_after })
}

/// Lets every spawned task that can run, run (without moving the clock).
pub(crate) async fn settle() {
    for _ in 0..5 {
        yield_now().await;
    }
}

/// Awaits every task, in order.
pub(crate) async fn join_all<T>(handles: Vec<JoinHandle<T>>) -> Vec<T> {
    let mut out = Vec::with_capacity(handles.len());
    for handle in handles {
        out.push(handle.await.expect("task panicked"));
    }
    out
}

/// A token bucket of `capacity` that starts full and refills one permit
/// every `every`.
pub(crate) fn bucket(capacity: u32, every: Duration) -> tokio_ratelimit::TokenBucket {
    tokio_ratelimit::TokenBucket::builder()
        .rate(tokio_ratelimit::Rate::every(every))
        .capacity(capacity)
        .build()
        .unwrap()
}
