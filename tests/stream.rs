//! The stream adapters (`stream::RateLimitStreamExt`), in paused time:
//! pacing at exact instants, weights, the order they share with other users
//! of a limiter, cancellation, and errors.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use futures::{Stream, StreamExt, stream};
use tokio::time::{self, Instant};
use tokio_ratelimit::stream::RateLimitStreamExt;
use tokio_ratelimit::{AcquireError, Funnel, LeakyBucket, Limiter, Rate};
use tokio_test::{assert_pending, assert_ready, task};

mod support;
use support::{bucket, ms};

/// Drains a stream, noting when each item came (since the call).
async fn timed<S: Stream + Unpin>(mut stream: S) -> Vec<(S::Item, Duration)> {
    let start = Instant::now();
    let mut out = Vec::new();
    while let Some(item) = stream.next().await {
        out.push((item, start.elapsed()));
    }
    out
}

/// A stream of `0..n` that counts how many items have been pulled from it.
fn counted(n: u32) -> (impl Stream<Item = u32> + Unpin, Arc<AtomicUsize>) {
    let pulled = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&pulled);
    let items = stream::iter(0..n).inspect(move |_| {
        counter.fetch_add(1, Ordering::SeqCst);
    });
    (items, pulled)
}

#[tokio::test(start_paused = true)]
async fn rate_limited_paces_items_at_exact_instants() {
    let limiter = bucket(2, ms(100));
    let items = timed(
        stream::iter(0..5)
            .rate_limited(limiter.clone())
            .map(Result::unwrap),
    )
    .await;
    // A burst of 2, then one per 100 ms; the end is seen once the next
    // permit has come (500 ms), and that permit is given back.
    assert_eq!(
        items,
        [
            (0, ms(0)),
            (1, ms(0)),
            (2, ms(100)),
            (3, ms(200)),
            (4, ms(300))
        ]
    );
    assert_eq!(limiter.stats().granted, 5);
    assert_eq!(limiter.available(), 1);
}

#[tokio::test(start_paused = true)]
async fn rate_limited_does_not_pull_before_the_permit() {
    let (items, pulled) = counted(10);
    let mut paced = task::spawn(items.rate_limited(bucket(1, ms(100))));
    assert_eq!(assert_ready!(paced.poll_next()), Some(Ok(0)));
    assert_pending!(paced.poll_next());
    assert_eq!(pulled.load(Ordering::SeqCst), 1); // item 1 not produced yet
    time::sleep(ms(99)).await;
    assert_pending!(paced.poll_next());
    assert_eq!(pulled.load(Ordering::SeqCst), 1);
    time::sleep(ms(1)).await;
    assert_eq!(assert_ready!(paced.poll_next()), Some(Ok(1)));
    assert_eq!(pulled.load(Ordering::SeqCst), 2);
}

#[tokio::test(start_paused = true)]
async fn the_permit_is_held_while_the_item_is_produced() {
    // Items that take 250 ms each to produce, through a limiter that
    // allows one per 100 ms: the items come as fast as they are made.
    let limiter = bucket(1, ms(100));
    let slow = stream::iter(0..3).then(|i| async move {
        time::sleep(ms(250)).await;
        i
    });
    let items = timed(Box::pin(
        slow.rate_limited(limiter.clone()).map(Result::unwrap),
    ))
    .await;
    assert_eq!(items, [(0, ms(250)), (1, ms(500)), (2, ms(750))]);
    assert_eq!(limiter.stats().granted, 3);
}

#[tokio::test(start_paused = true)]
async fn a_stream_shares_the_limiter_in_fifo_order_with_other_users() {
    let limiter = bucket(1, ms(100));
    let mut paced = task::spawn(stream::iter(0..3).rate_limited(limiter.clone()));
    assert_eq!(assert_ready!(paced.poll_next()), Some(Ok(0))); // 0 ms
    assert_pending!(paced.poll_next()); // reserved the 100 ms permit
    let mut other = task::spawn(limiter.acquire()); // arrives after: 200 ms
    assert_pending!(other.poll());
    time::sleep(ms(100)).await;
    assert_pending!(other.poll());
    assert_eq!(assert_ready!(paced.poll_next()), Some(Ok(1)));
    assert_pending!(paced.poll_next()); // behind `other`: 300 ms
    time::sleep(ms(100)).await;
    assert_ready!(other.poll()).unwrap();
    assert_pending!(paced.poll_next());
    time::sleep(ms(100)).await;
    assert_eq!(assert_ready!(paced.poll_next()), Some(Ok(2)));
}

#[tokio::test(start_paused = true)]
async fn dropping_a_waiting_stream_gives_its_permit_back() {
    let limiter = bucket(1, ms(100));
    let mut paced = task::spawn(stream::iter(0..3).rate_limited(limiter.clone()));
    assert_eq!(assert_ready!(paced.poll_next()), Some(Ok(0)));
    assert_pending!(paced.poll_next()); // waits for 100 ms
    let mut other = task::spawn(limiter.acquire()); // queued behind: 200 ms
    assert_pending!(other.poll());
    drop(paced);
    time::sleep(ms(100)).await;
    assert_ready!(other.poll()).unwrap(); // moved up to 100 ms
    assert_eq!(limiter.stats().granted, 2);
}

#[tokio::test(start_paused = true)]
async fn dropping_a_stream_that_holds_a_permit_gives_it_back() {
    let limiter = bucket(1, ms(100));
    // An upstream that never yields: the permit is held, waiting for it.
    let mut paced = task::spawn(stream::pending::<u32>().rate_limited(limiter.clone()));
    assert_pending!(paced.poll_next());
    assert_eq!(limiter.available(), 0);
    drop(paced);
    assert_eq!(limiter.available(), 1);
    assert_eq!(limiter.stats().granted, 0);
}

#[tokio::test(start_paused = true)]
async fn an_empty_stream_ends_without_spending() {
    let limiter = bucket(1, ms(100));
    let items: Vec<_> = stream::empty::<u32>()
        .rate_limited(limiter.clone())
        .collect()
        .await;
    assert!(items.is_empty());
    assert_eq!(limiter.available(), 1);
    assert_eq!(limiter.stats().granted, 0);
}

#[tokio::test(start_paused = true)]
async fn a_closed_limiter_ends_the_stream_after_one_error() {
    let limiter = bucket(1, ms(100));
    let (items, pulled) = counted(3);
    let mut paced = items.rate_limited(limiter.clone());
    assert_eq!(paced.next().await, Some(Ok(0)));
    limiter.close();
    assert_eq!(paced.next().await, Some(Err(AcquireError::Closed)));
    assert_eq!(paced.next().await, None);
    assert_eq!(pulled.load(Ordering::SeqCst), 1); // nothing pulled for the error
}

#[tokio::test(start_paused = true)]
async fn a_shaper_overflow_is_one_error_and_the_stream_goes_on() {
    // Room for one request's water; another user keeps it full.
    let shaper = LeakyBucket::builder()
        .rate(Rate::every(ms(100)))
        .capacity(1)
        .build()
        .unwrap();
    shaper.acquire().await.unwrap();
    let mut paced = stream::iter(0..2).rate_limited(shaper.clone());
    assert_eq!(paced.next().await, Some(Err(AcquireError::Overflow)));
    time::sleep(ms(100)).await;
    assert_eq!(paced.next().await, Some(Ok(0)));
}

#[tokio::test(start_paused = true)]
async fn rate_limited_takes_any_limiter() {
    let funnel: Arc<dyn Limiter> = Arc::new(
        Funnel::builder()
            .rate(Rate::per_second(4))
            .capacity(1)
            .build()
            .unwrap(),
    );
    let items = timed(
        stream::iter(0..3)
            .rate_limited(Arc::clone(&funnel))
            .map(Result::unwrap),
    )
    .await;
    assert_eq!(items, [(0, ms(0)), (1, ms(250)), (2, ms(500))]);
    assert_eq!(funnel.stats().granted, 3);
}

// ---- rate_limited_by ----

#[tokio::test(start_paused = true)]
async fn rate_limited_by_paces_by_weight() {
    // 1000 units a second, bursts of 1000.
    let limiter = bucket(1000, ms(1));
    let chunks = stream::iter([1000, 500, 250, 0, 1000]);
    let items = timed(
        chunks
            .rate_limited_by(limiter.clone(), |n: &u32| *n)
            .map(Result::unwrap),
    )
    .await;
    assert_eq!(
        items,
        [
            (1000, ms(0)),
            (500, ms(500)),
            (250, ms(750)),
            (0, ms(750)), // weight 0: at once
            (1000, ms(1750))
        ]
    );
    assert_eq!(limiter.stats().granted, 2750);
}

#[tokio::test(start_paused = true)]
async fn rate_limited_by_pulls_the_item_first() {
    let (items, pulled) = counted(10);
    let mut paced = task::spawn(items.rate_limited_by(bucket(1, ms(100)), |_| 1));
    assert_eq!(assert_ready!(paced.poll_next()), Some(Ok(0)));
    assert_pending!(paced.poll_next());
    assert_eq!(pulled.load(Ordering::SeqCst), 2); // item 1 waits for its permit
    assert_eq!(paced.size_hint(), (9, Some(9)));
    time::sleep(ms(100)).await;
    assert_eq!(assert_ready!(paced.poll_next()), Some(Ok(1)));
}

#[tokio::test(start_paused = true)]
async fn an_item_heavier_than_the_capacity_is_handed_back_at_once() {
    let limiter = bucket(10, ms(1));
    let chunks = stream::iter([vec![0u8; 4], vec![1u8; 11], vec![2u8; 10]]);
    let items = timed(chunks.rate_limited_by(limiter, |c| u32::try_from(c.len()).unwrap())).await;
    assert_eq!(items[0], (Ok(vec![0u8; 4]), ms(0)));
    let (Err(refused), at) = &items[1] else {
        panic!("expected a refusal: {:?}", items[1]);
    };
    assert_eq!(*at, ms(0));
    assert_eq!(refused.error, AcquireError::InsufficientCapacity);
    assert_eq!(refused.item, vec![1u8; 11]);
    assert_eq!(
        refused.to_string(),
        "more permits requested than the limiter's capacity"
    );
    // The stream goes on: 10 units when 6 are left, so 4 more at 1 per ms.
    assert_eq!(items[2], (Ok(vec![2u8; 10]), ms(4)));
    assert_eq!(items.len(), 3);
}

#[tokio::test(start_paused = true)]
async fn dropping_a_weighted_stream_gives_the_items_permits_back() {
    let limiter = bucket(4, ms(100));
    let mut paced = task::spawn(stream::iter([4, 3, 1]).rate_limited_by(limiter.clone(), |n| *n));
    assert_eq!(assert_ready!(paced.poll_next()), Some(Ok(4))); // 0 ms
    assert_pending!(paced.poll_next()); // 3 units: due at 300 ms
    let mut other = task::spawn(limiter.acquire()); // behind them: 400 ms
    assert_pending!(other.poll());
    drop(paced);
    time::sleep(ms(100)).await;
    assert_ready!(other.poll()).unwrap(); // moved up to 100 ms
    assert_eq!(limiter.stats().granted, 5);
}

#[tokio::test(start_paused = true)]
async fn a_closed_limiter_hands_the_item_back_and_ends_the_weighted_stream() {
    let limiter = bucket(1, ms(100));
    let mut paced = stream::iter([1, 1, 1]).rate_limited_by(limiter.clone(), |n| *n);
    assert_eq!(paced.next().await, Some(Ok(1)));
    let mut next = task::spawn(paced.next());
    assert_pending!(next.poll());
    limiter.close();
    assert!(next.is_woken());
    let refused = assert_ready!(next.poll()).unwrap().unwrap_err();
    assert_eq!((refused.error, refused.item), (AcquireError::Closed, 1));
    drop(next);
    assert_eq!(paced.next().await, None);
    assert_eq!(paced.size_hint(), (0, Some(0)));
}

#[test]
fn adapters_are_send_and_debug() {
    fn send<T: Send>(_: &T) {}
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap();
    let _guard = rt.enter();
    let paced = stream::iter(0..3).rate_limited(bucket(1, ms(1)));
    send(&paced);
    assert!(format!("{paced:?}").starts_with("Throttled { stream: Iter"));
    let weighted = stream::iter(0..3).rate_limited_by(bucket(1, ms(1)), |_| 1);
    send(&weighted);
    assert!(format!("{weighted:?}").starts_with("ThrottledBy { stream: Iter"));
    assert!(matches!(
        stream::iter([1]).rate_limited(bucket(1, ms(1))).size_hint(),
        (1, None)
    ));
}
