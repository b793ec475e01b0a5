//! `max_keys` is a limit on keys that hold water: a key that drained long
//! ago, in whichever shard, gives its slot to a new one.

use std::time::Duration;

use tokio::time::{self, Instant};
use tokio_ratelimit::keyed::KeyedFunnel;
use tokio_ratelimit::{Rate, TryAcquireError};

/// README: "With `max_keys`, a new key is refused while every slot is
/// active"; a drained key "is indistinguishable from a new one, so the map
/// drops it on its own". With `max_keys(1)` and the one slot held by a key
/// that drained long ago, a new key must get the slot. The map sweeps only
/// the *new* key's shard before refusing, so a new key hashed to another
/// shard is refused (503) for as long as nothing else sweeps — forever
/// without the background sweeper, which `background_sweep(false)`
/// documents as still dropping drained keys "when a shard would otherwise
/// grow". Every key below arrives a full second after the last grant (all
/// funnels empty).
#[tokio::test(start_paused = true)]
async fn max_keys_refuses_a_new_key_while_the_only_slot_holds_a_drained_key() {
    let map: KeyedFunnel<u64> = KeyedFunnel::builder()
        .rate(Rate::per_second(10))
        .capacity(1)
        .max_keys(1)
        .background_sweep(false)
        .build()
        .unwrap();
    let mut refused = vec![];
    for key in 0..16u64 {
        time::advance(Duration::from_secs(1)).await;
        if map.try_acquire(&key) == Err(TryAcquireError::Unavailable) {
            refused.push(key);
        }
    }
    assert_eq!(
        refused,
        Vec::<u64>::new(),
        "new keys refused as Unavailable though the only slot held a key drained a second before \
         (stats: {:?})",
        map.stats()
    );
}

/// The same map through `acquire`, which "waits for a sweep to free a
/// slot": each new key, a second after the last, finds the one slot held
/// by a key drained long ago (in its own shard or another) and is granted
/// at once. (Before, a new key in another shard than the drained one's
/// waited for a sweep of that shard, which without the background sweeper
/// never came.)
#[tokio::test(start_paused = true)]
async fn acquire_on_a_new_key_takes_the_slot_of_a_drained_key_in_any_shard() {
    let map: KeyedFunnel<u64> = KeyedFunnel::builder()
        .rate(Rate::per_second(10))
        .capacity(1)
        .max_keys(1)
        .background_sweep(false)
        .build()
        .unwrap();
    map.try_acquire(&0).unwrap();
    for key in 1..64u64 {
        time::advance(Duration::from_secs(1)).await;
        let started = Instant::now();
        let waited = time::timeout(Duration::from_secs(60), map.acquire(&key)).await;
        assert_eq!(waited, Ok(Ok(())), "acquire({key})");
        assert_eq!(started.elapsed(), Duration::ZERO, "acquire({key}) waited");
    }
    assert_eq!(map.len(), 1);
}

/// The same for a map of any limiter (`Keyed`, the same map underneath):
/// a bucket refilled long ago gives its slot to a new key, in any shard.
#[tokio::test(start_paused = true)]
async fn a_keyed_map_of_buckets_gives_a_refilled_key_s_slot_to_a_new_one() {
    use tokio_ratelimit::TokenBucket;
    use tokio_ratelimit::keyed::Keyed;

    let map: Keyed<u64, TokenBucket> = Keyed::builder()
        .limiter(|| {
            TokenBucket::builder()
                .rate(Rate::per_second(10))
                .capacity(1)
                .build()
        })
        .max_keys(1)
        .background_sweep(false)
        .build()
        .unwrap();
    for key in 0..16u64 {
        time::advance(Duration::from_secs(1)).await;
        assert_eq!(map.try_acquire(&key), Ok(()), "key {key}");
    }
}
