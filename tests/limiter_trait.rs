//! Every `Limiter` method called through `Arc<dyn Limiter>`, `Box<dyn
//! Limiter>` and the pointer impls, for the three bucket limiters, in paused
//! time. (The auto traits of the public types are in `auto_traits.rs`.)

use std::error::Error;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tokio_ratelimit::{
    AcquireError, Funnel, LeakyBucket, Limiter, Rate, TokenBucket, TryAcquireError,
};

mod support;
use support::{limited, ms};

#[test]
fn errors_convert_into_the_usual_boxed_error() {
    let boxed: Box<dyn Error + Send + Sync> = AcquireError::Closed.into();
    assert_eq!(boxed.to_string(), "rate limiter closed");
}

#[tokio::test(start_paused = true)]
async fn a_spawned_task_can_own_a_handle_and_wait_on_it() {
    let t = TokenBucket::builder()
        .rate(Rate::per_second(1))
        .build()
        .unwrap();
    tokio::spawn(async move { t.acquire().await })
        .await
        .unwrap()
        .unwrap();
}

/// Every trait method on a token bucket or a funnel of 10/s, capacity 2,
/// starting with room for 2 (the two behave the same).
async fn exercise_burst(l: &dyn Limiter) {
    let start = Instant::now();
    assert_eq!(l.try_acquire(), Ok(()));
    assert_eq!(l.try_acquire_many(2), limited(ms(100)));
    assert_eq!(
        l.try_acquire_many(3),
        Err(TryAcquireError::InsufficientCapacity)
    );
    assert_eq!(l.acquire().await, Ok(())); // the second of the burst
    assert_eq!(start.elapsed(), Duration::ZERO);
    assert_eq!(l.acquire_many(2).await, Ok(()));
    assert_eq!(start.elapsed(), ms(200));
    assert_eq!(
        l.acquire_many(3).await,
        Err(AcquireError::InsufficientCapacity)
    );
    assert_eq!(
        l.acquire_timeout(1, ms(99)).await,
        Err(AcquireError::Timeout)
    );
    assert_eq!(start.elapsed(), ms(200));
    assert_eq!(l.acquire_timeout(1, ms(100)).await, Ok(()));
    assert_eq!(start.elapsed(), ms(300));
    assert_eq!(l.acquire_many(0).await, Ok(()));
    assert_eq!(l.try_acquire_many(0), Ok(()));
    assert_eq!(start.elapsed(), ms(300));
}

/// Every trait method on a leaky bucket (the shaper) of 10/s, capacity 2.
async fn exercise_shaper(l: &dyn Limiter) {
    let start = Instant::now();
    assert_eq!(l.try_acquire(), Ok(())); // the meter pours one unit
    assert_eq!(l.try_acquire_many(2), limited(ms(100)));
    assert_eq!(l.acquire().await, Ok(())); // after the unit ahead drained
    assert_eq!(start.elapsed(), ms(100));
    assert_eq!(l.acquire_many(2).await, Err(AcquireError::Overflow));
    assert_eq!(
        l.acquire_many(3).await,
        Err(AcquireError::InsufficientCapacity)
    );
    assert_eq!(
        l.acquire_timeout(1, ms(99)).await,
        Err(AcquireError::Timeout)
    );
    assert_eq!(start.elapsed(), ms(100));
    assert_eq!(l.acquire_timeout(1, ms(100)).await, Ok(()));
    assert_eq!(start.elapsed(), ms(200));
    assert_eq!(l.acquire_many(0).await, Ok(()));
    assert_eq!(l.try_acquire_many(0), Ok(()));
}

fn token_bucket() -> TokenBucket {
    TokenBucket::builder()
        .rate(Rate::per_second(10))
        .capacity(2)
        .build()
        .unwrap()
}

fn leaky_bucket() -> LeakyBucket {
    LeakyBucket::builder()
        .rate(Rate::per_second(10))
        .capacity(2)
        .build()
        .unwrap()
}

fn a_funnel() -> Funnel {
    Funnel::builder()
        .rate(Rate::per_second(10))
        .capacity(2)
        .build()
        .unwrap()
}

#[tokio::test(start_paused = true)]
async fn arc_dyn_limiter() {
    let all: Vec<(Arc<dyn Limiter>, bool)> = vec![
        (Arc::new(token_bucket()), true),
        (Arc::new(leaky_bucket()), false),
        (Arc::new(a_funnel()), true),
    ];
    for (l, burst) in all {
        // Clones of the Arc share the limiter; a spawned task can hold one.
        let clone = Arc::clone(&l);
        let task = tokio::spawn(async move {
            if burst {
                exercise_burst(&*clone).await;
            } else {
                exercise_shaper(&*clone).await;
            }
        });
        task.await.unwrap();
        // Arc<dyn Limiter> is itself a Limiter.
        assert!(matches!(
            Limiter::try_acquire_many(&l, 2),
            Err(TryAcquireError::Limited { .. })
        ));
    }
}

#[tokio::test(start_paused = true)]
async fn box_dyn_limiter() {
    let all: Vec<(Box<dyn Limiter>, bool)> = vec![
        (Box::new(token_bucket()), true),
        (Box::new(leaky_bucket()), false),
        (Box::new(a_funnel()), true),
    ];
    for (l, burst) in all {
        if burst {
            exercise_burst(&*l).await;
        } else {
            exercise_shaper(&*l).await;
        }
        assert!(matches!(
            Limiter::try_acquire_many(&l, 2),
            Err(TryAcquireError::Limited { .. })
        ));
    }
}

#[tokio::test(start_paused = true)]
async fn pointer_impls_forward_to_the_limiter() {
    // Arc<L>, Box<L> and &L are limiters over the same L.
    let token = Arc::new(token_bucket());
    let boxed: Box<dyn Limiter> = Box::new(Arc::clone(&token));
    exercise_burst(&*boxed).await;
    assert_eq!(token.available(), 0);
    let funnel = a_funnel();
    let by_ref: &dyn Limiter = &&funnel;
    exercise_burst(by_ref).await;
    assert_eq!(funnel.free(), 0);
    let leaky: Box<dyn Limiter> = Box::new(Box::new(leaky_bucket()));
    exercise_shaper(&*leaky).await;
}
