//! The refusal cache: recent refusals answered without a round trip.
//!
//! A client hammering a key that is over its limit would cost one round
//! trip per request. When Redis refuses `n` permits of `key` under a quota
//! and says they fit in `retry_after`, the cache keeps "`key` cannot get
//! `n` or more under this quota before `until`", and answers the requests
//! that come before then itself.
//!
//! # Why it only refuses what Redis would refuse
//!
//! The script only ever moves a band's stored instant (when the band is
//! empty) *later*: a grant writes `max(instant, now) + cost` into every band
//! it decides, a refusal writes nothing, bands a quota does not have are
//! written back as they were, an instant written in another unit is read
//! rounded up, and the key expires only once every band has drained (when
//! reading it as empty is what the instants say anyway). So once a band
//! holds too much water for `n` until `T₀ + W` (the refusal's server time
//! plus its wait), it holds at least that much at every instant before,
//! whatever any process asks in between: a request of `n' ≥ n` under the
//! same quota is refused until then. The cache keeps `until = S + W` with
//! `S` the local instant the request was *sent*, no later than `T₀`: it
//! stops answering no later than Redis would start granting (clocks running
//! at the same rate over `W`). A smaller request, another quota (a tier
//! change) or a refusal past `until` goes to Redis.
//!
//! What can break the argument is outside the script: a key deleted or
//! rewritten by hand, or a failover to a replica that missed the last writes
//! (the key is then emptier than the refusal saw). The cache then refuses
//! for at most the `retry_after` it was told, as a client honouring
//! `Retry-After` would have waited anyway.
//!
//! # Bounded
//!
//! A fixed number of slots, each holding one key's latest refusal, chosen
//! by the key's hash: a flood of distinct keys only overwrites slots (a
//! colliding key loses its entry, which costs a round trip, never a wrong
//! answer: the full key is compared). Memory is the slots and the keys they
//! hold.

use std::hash::BuildHasher;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

use crate::Quota;

/// Recent refusals, at most `slots` of them.
pub(super) struct RefusalCache {
    slots: Box<[Mutex<Option<Entry>>]>,
    hasher: std::collections::hash_map::RandomState,
}

/// One key's refusal: under `quota`, `n` or more permits cannot be had
/// before `until`.
struct Entry {
    key: Box<str>,
    quota: Quota,
    n: u32,
    until: Instant,
}

impl RefusalCache {
    /// A cache of `slots` entries (at least one).
    pub(super) fn new(slots: usize) -> RefusalCache {
        RefusalCache {
            slots: (0..slots.max(1)).map(|_| Mutex::new(None)).collect(),
            hasher: std::collections::hash_map::RandomState::new(),
        }
    }

    fn slot(&self, key: &str) -> &Mutex<Option<Entry>> {
        #[expect(
            clippy::cast_possible_truncation,
            reason = "a remainder below the slot count"
        )]
        let i = (self.hasher.hash_one(key) % self.slots.len() as u64) as usize;
        &self.slots[i]
    }

    /// How long `n` permits of `key` under `quota` are still known to be
    /// refused at `now`; `None` when Redis must be asked.
    pub(super) fn refused(
        &self,
        key: &str,
        quota: &Quota,
        n: u32,
        now: Instant,
    ) -> Option<Duration> {
        let slot = self
            .slot(key)
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let entry = slot.as_ref()?;
        (entry.n <= n && now < entry.until && entry.quota == *quota && &*entry.key == key)
            .then(|| entry.until - now)
    }

    /// Redis refused `n` permits of `key` under `quota`, to fit after
    /// `retry_after`, for a request sent at `sent`.
    pub(super) fn remember(
        &self,
        key: &str,
        quota: &Quota,
        n: u32,
        sent: Instant,
        retry_after: Duration,
    ) {
        let until = sent + retry_after;
        let mut slot = self
            .slot(key)
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(held) = slot.as_ref() {
            // A refusal of fewer permits for the same key and quota says
            // more; keep it while it holds, unless this one is of as few.
            let same = &*held.key == key && held.quota == *quota;
            if same && held.n < n && sent < held.until {
                return;
            }
        }
        *slot = Some(Entry {
            key: key.into(),
            quota: *quota,
            n,
            until,
        });
    }

    /// The number of slots.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.slots.len()
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::Rate;
    use crate::algorithm::FunnelState;

    const Q: Quota = Quota::new(Rate::per_second(10), 5);

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn a_refusal_holds_for_as_many_or_more_until_it_expires() {
        let cache = RefusalCache::new(8);
        let t0 = Instant::now();
        cache.remember("k", &Q, 3, t0, ms(200));
        assert_eq!(cache.refused("k", &Q, 3, t0 + ms(50)), Some(ms(150)));
        assert_eq!(cache.refused("k", &Q, 5, t0 + ms(50)), Some(ms(150)));
        assert_eq!(cache.refused("k", &Q, 2, t0 + ms(50)), None, "fewer: ask");
        assert_eq!(cache.refused("k", &Q, 3, t0 + ms(200)), None, "expired");
        assert_eq!(cache.refused("other", &Q, 3, t0), None);
        let paid = Quota::new(Rate::per_second(100), 50);
        assert_eq!(cache.refused("k", &paid, 3, t0), None, "another tier: ask");
    }

    #[test]
    fn the_fewest_refused_is_kept() {
        let cache = RefusalCache::new(1);
        let t0 = Instant::now();
        cache.remember("k", &Q, 1, t0, ms(100));
        cache.remember("k", &Q, 4, t0, ms(300));
        assert_eq!(cache.refused("k", &Q, 1, t0), Some(ms(100)));
        // Once it has expired, the larger refusal replaces it.
        cache.remember("k", &Q, 4, t0 + ms(100), ms(300));
        assert_eq!(cache.refused("k", &Q, 4, t0 + ms(150)), Some(ms(250)));
        assert_eq!(cache.refused("k", &Q, 1, t0 + ms(150)), None);
    }

    #[test]
    fn a_flood_of_keys_stays_in_its_slots() {
        let cache = RefusalCache::new(16);
        let t0 = Instant::now();
        for k in 0..10_000 {
            cache.remember(&k.to_string(), &Q, 1, t0, ms(1_000));
        }
        assert_eq!(cache.len(), 16);
        let held = (0..10_000)
            .filter(|k| cache.refused(&k.to_string(), &Q, 1, t0).is_some())
            .count();
        assert!((1..=16).contains(&held), "{held}");
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        /// Against a model of the script (one funnel per key, poured by
        /// any number of clients): every refusal the cache gives, the
        /// funnel gives too at that instant. Requests arrive at random
        /// times and weights from two clients, one with a cache; the
        /// cached client's requests are "sent" up to 3 ms before Redis
        /// decides them (the round trip).
        #[test]
        fn the_cache_never_refuses_what_the_store_grants(
            steps in proptest::collection::vec((0u64..40, 1u32..=5, any::<bool>(), 0u64..3), 1..200),
        ) {
            let start = Instant::now();
            let cache = RefusalCache::new(4);
            let mut store = FunnelState::new(Rate::per_second(10), 5).unwrap();
            let mut now = Duration::ZERO;
            let mut cached = 0;
            for (gap, n, from_cache_client, latency) in steps {
                now += ms(gap);
                let at = start + now;
                if from_cache_client {
                    if let Some(left) = cache.refused("k", &Q, n, at) {
                        cached += 1;
                        let truth = store.clone().try_pour(now, n);
                        prop_assert!(truth.is_err(), "cache refused {n} at {now:?} ({left:?} left) but the store grants");
                        continue;
                    }
                    let sent = at.checked_sub(ms(latency)).unwrap_or(start);
                    if let Err(e) = store.try_pour(now, n) {
                        cache.remember("k", &Q, n, sent, e.retry_after().unwrap());
                    }
                } else {
                    let _ = store.try_pour(now, n);
                }
            }
            let _ = cached;
        }
    }
}
