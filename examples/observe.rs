//! Watching limiters: their `stats()` and their tracing events.
//!
//! ```sh
//! cargo run --example observe                                # tokio_ratelimit=trace
//! RUST_LOG=tokio_ratelimit=debug cargo run --example observe # actors starting and stopping only
//! ```

use std::error::Error;

use tokio_ratelimit::keyed::KeyedFunnel;
use tokio_ratelimit::{Rate, TokenBucket};
use tracing_subscriber::EnvFilter;

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn Error>> {
    // RUST_LOG if set, else every event of this crate.
    let filter = EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| EnvFilter::new("tokio_ratelimit=trace"));
    tracing_subscriber::fmt().with_env_filter(filter).init();

    // 20/s, bursts of 2: two permits at once, the next two 50 ms apart.
    let bucket = TokenBucket::builder()
        .rate(Rate::per_second(20))
        .capacity(2)
        .build()?;
    for _ in 0..4 {
        bucket.acquire().await?;
    }
    let refused = bucket.try_acquire().is_err();
    println!("try_acquire refused: {refused}");
    println!("{:?}", bucket.stats());

    let per_user: KeyedFunnel<String> = KeyedFunnel::builder()
        .rate(Rate::per_second(1))
        .capacity(1)
        .build()?;
    for user in ["ann", "bob", "ann"] {
        println!("{user}: {:?}", per_user.try_acquire(user));
    }
    println!("{:?}", per_user.stats());

    bucket.close(); // a debug event, and the actor stops
    tokio::task::yield_now().await;
    Ok(())
}
