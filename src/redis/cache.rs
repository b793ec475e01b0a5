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
//! What can break the argument is outside the script: a server restarted
//! without its data, a failover to a replica that missed the last writes
//! (the key is then emptier than the refusal saw), or a key deleted or
//! rewritten by hand. So an entry holds only while the evidence behind it
//! does:
//!
//! * **An epoch.** Each entry keeps the connection's epoch at the time its
//!   request was sent (`conn.rs`): a new connection to the node, and on a
//!   cluster any connection failure or redirect, moves the epoch, and an
//!   entry of another epoch is never answered. A restarted server or a
//!   promoted replica is only reached through one of these.
//! * **Any answer for the key.** A grant Redis gives the key (a decision of
//!   any kind, any quota, any number) removes its entry, and so does a
//!   peek that shows the refused request would fit now. Such an answer
//!   means the state is not what the entry assumed (or the entry's
//!   argument no longer needs the cache to hold), and a round trip is the
//!   only cost of being wrong.
//!
//! What remains is a key deleted or rewritten by hand while the same
//! connection stays up: the cache then refuses for at most the
//! `retry_after` it was told, as a client honouring `Retry-After` would
//! have waited anyway.
//!
//! While Redis cannot be reached the entries stand: they are refusals Redis
//! would give too (its state can only have moved later), whatever the
//! failure policy; a failing open limiter grants every other request.
//!
//! # What an answer from the cache reports
//!
//! An entry also keeps what the refusal showed of the key (each band's
//! instant, the server's time then), so that an answer from the cache can
//! report the bands as the `RateLimit` fields need them: moved on to now by
//! the local time since the request was sent, they read at most as full as
//! the key is (its state only moves later), and the band that refused
//! reads too full for the request, as Redis said.
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

use super::repr::Split;
use crate::Quota;
use crate::algorithm::MAX_BANDS;

/// What a refusal showed of the key: each band's instant as the script
/// read it, in its own units, and the server's time then (µs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Seen {
    pub(super) instants: [Split; MAX_BANDS],
    pub(super) now_us: u64,
}

/// Recent refusals, at most `slots` of them.
pub(super) struct RefusalCache {
    slots: Box<[Mutex<Option<Entry>>]>,
    hasher: std::collections::hash_map::RandomState,
}

/// One key's refusal: under `quota`, `n` or more permits cannot be had
/// before `until`, as long as the connection's epoch is `epoch`.
struct Entry {
    key: Box<str>,
    quota: Quota,
    n: u32,
    until: Instant,
    epoch: u64,
    /// The bands the refusal showed, and when its request was sent (boxed:
    /// the slots are allocated at build, and most hold nothing).
    seen: Option<Box<(Seen, Instant)>>,
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

    #[cfg(test)]
    /// How long `n` permits of `key` under `quota` are still known to be
    /// refused at `now`, in the connection's epoch `epoch`; `None` when
    /// Redis must be asked. Only the same key, the same quota, as many
    /// permits, and the same epoch: a refusal of fewer permits refuses more
    /// too, but not for as long, and the wait must be the request's own.
    pub(super) fn refused(
        &self,
        key: &str,
        quota: &Quota,
        n: u32,
        now: Instant,
        epoch: u64,
    ) -> Option<Duration> {
        self.refused_seen(key, quota, n, now, epoch)
            .map(|(wait, _)| wait)
    }

    /// As [`refused`](Self::refused), with what the refusal showed of the
    /// key's bands, moved on to `now`: the server's time taken as the one
    /// it read plus the local time since the request was *sent* (no later
    /// than the server read it), so the bands read at least as empty as
    /// they are (Redis's state only moves later) — what the `RateLimit`
    /// fields of an answer from the cache report.
    pub(super) fn refused_seen(
        &self,
        key: &str,
        quota: &Quota,
        n: u32,
        now: Instant,
        epoch: u64,
    ) -> Option<(Duration, Option<Seen>)> {
        let slot = self
            .slot(key)
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let entry = slot.as_ref()?;
        (entry.n == n
            && now < entry.until
            && entry.epoch == epoch
            && entry.quota == *quota
            && &*entry.key == key)
            .then(|| {
                let seen = entry.seen.as_deref().map(|&(seen, sent)| {
                    let since = u64::try_from(now.saturating_duration_since(sent).as_micros())
                        .unwrap_or(u64::MAX);
                    Seen {
                        now_us: seen.now_us.saturating_add(since),
                        ..seen
                    }
                });
                (entry.until - now, seen)
            })
    }

    /// Redis refused `n` permits of `key` under `quota`, to fit after
    /// `retry_after`, for a request sent at `sent` in epoch `epoch`,
    /// showing `seen` of the key's bands.
    #[expect(clippy::too_many_arguments, reason = "one refusal, as Redis gave it")]
    pub(super) fn remember(
        &self,
        key: &str,
        quota: &Quota,
        n: u32,
        sent: Instant,
        retry_after: Duration,
        epoch: u64,
        seen: Option<Seen>,
    ) {
        let until = sent + retry_after;
        let mut slot = self
            .slot(key)
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        // The latest refusal replaces whatever the slot held (another key's,
        // or this key's for another number of permits: each answers only
        // its own).
        *slot = Some(Entry {
            key: key.into(),
            quota: *quota,
            n,
            until,
            epoch,
            seen: seen.map(|seen| Box::new((seen, sent))),
        });
    }

    /// Redis granted a request of `key` (any quota, any number): its entry
    /// goes.
    pub(super) fn forget(&self, key: &str) {
        let mut slot = self
            .slot(key)
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if slot.as_ref().is_some_and(|held| &*held.key == key) {
            *slot = None;
        }
    }

    /// A peek read `key`'s state: its entry goes if `fits(quota, n)` says
    /// the refused request would fit now.
    pub(super) fn forget_if(&self, key: &str, fits: impl FnOnce(&Quota, u32) -> bool) {
        let mut slot = self
            .slot(key)
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if slot
            .as_ref()
            .is_some_and(|held| &*held.key == key && fits(&held.quota, held.n))
        {
            *slot = None;
        }
    }

    /// The number of slots.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.slots.len()
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use proptest::prelude::*;

    use super::*;
    use crate::Rate;
    use crate::redis::repr::Encoded;
    use crate::redis::state::{self, Stored};

    const Q: Quota = Quota::new(Rate::per_second(10), 5);

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn a_refusal_holds_for_as_many_until_it_expires() {
        let cache = RefusalCache::new(8);
        let t0 = Instant::now();
        cache.remember("k", &Q, 3, t0, ms(200), 1, None);
        assert_eq!(cache.refused("k", &Q, 3, t0 + ms(50), 1), Some(ms(150)));
        assert_eq!(
            cache.refused("k", &Q, 5, t0 + ms(50), 1),
            None,
            "more: refused too, but for longer than this says: ask"
        );
        assert_eq!(
            cache.refused("k", &Q, 2, t0 + ms(50), 1),
            None,
            "fewer: ask"
        );
        assert_eq!(cache.refused("k", &Q, 3, t0 + ms(200), 1), None, "expired");
        assert_eq!(cache.refused("other", &Q, 3, t0, 1), None);
        let paid = Quota::new(Rate::per_second(100), 50);
        assert_eq!(
            cache.refused("k", &paid, 3, t0, 1),
            None,
            "another tier: ask"
        );
        assert_eq!(cache.refused("k", &Q, 3, t0, 2), None, "another epoch: ask");
    }

    #[test]
    fn one_slot_answers_only_its_own_key() {
        // Every key in the one slot: they take it from each other, and
        // none is ever answered from another's refusal.
        let cache = RefusalCache::new(1);
        let t0 = Instant::now();
        cache.remember("a", &Q, 1, t0, ms(100), 1, None);
        assert_eq!(cache.refused("b", &Q, 5, t0, 1), None);
        cache.remember("b", &Q, 2, t0, ms(100), 1, None);
        assert_eq!(cache.refused("a", &Q, 5, t0, 1), None, "overwritten: ask");
        assert_eq!(cache.refused("b", &Q, 2, t0, 1), Some(ms(100)));
    }

    #[test]
    fn a_grant_or_a_peek_that_fits_removes_the_keys_refusal() {
        let cache = RefusalCache::new(4);
        let t0 = Instant::now();
        cache.remember("k", &Q, 2, t0, ms(100), 1, None);
        cache.forget("other");
        assert!(cache.refused("k", &Q, 2, t0, 1).is_some());
        cache.forget("k");
        assert_eq!(cache.refused("k", &Q, 2, t0, 1), None);
        cache.remember("k", &Q, 2, t0, ms(100), 1, None);
        cache.forget_if("k", |q, n| {
            assert_eq!((*q, n), (Q, 2));
            false
        });
        assert!(cache.refused("k", &Q, 2, t0, 1).is_some());
        cache.forget_if("k", |_, _| true);
        assert_eq!(cache.refused("k", &Q, 2, t0, 1), None);
    }

    #[test]
    fn the_latest_refusal_is_kept() {
        let cache = RefusalCache::new(1);
        let t0 = Instant::now();
        cache.remember("k", &Q, 1, t0, ms(100), 1, None);
        cache.remember("k", &Q, 4, t0, ms(300), 1, None);
        assert_eq!(cache.refused("k", &Q, 1, t0, 1), None);
        assert_eq!(cache.refused("k", &Q, 4, t0, 1), Some(ms(300)));
        cache.remember("k", &Q, 1, t0 + ms(100), ms(50), 1, None);
        assert_eq!(cache.refused("k", &Q, 1, t0 + ms(120), 1), Some(ms(30)));
        assert_eq!(cache.refused("k", &Q, 4, t0 + ms(120), 1), None);
        // A refusal of a new epoch replaces one of an old epoch.
        cache.remember("k", &Q, 1, t0 + ms(150), ms(100), 1, None);
        cache.remember("k", &Q, 4, t0 + ms(150), ms(100), 2, None);
        assert_eq!(cache.refused("k", &Q, 4, t0 + ms(150), 2), Some(ms(100)));
    }

    #[test]
    fn a_flood_of_keys_stays_in_its_slots() {
        let cache = RefusalCache::new(16);
        let t0 = Instant::now();
        for k in 0..10_000 {
            cache.remember(&k.to_string(), &Q, 1, t0, ms(1_000), 1, None);
        }
        assert_eq!(cache.len(), 16);
        let held = (0..10_000)
            .filter(|k| cache.refused(&k.to_string(), &Q, 1, t0, 1).is_some())
            .count();
        assert!((1..=16).contains(&held), "{held}");
    }

    /// What one step of the property test does.
    #[derive(Debug, Clone)]
    enum Step {
        /// A request from the client with the cache: `(key, tier, n,
        /// latency)`.
        Cached(usize, usize, u32, u64),
        /// A request from another client, without a cache.
        Other(usize, usize, u32),
        /// A peek by the client with the cache.
        Peek(usize),
        /// The server restarted without its data; the client reconnects.
        Restart,
    }

    fn step() -> impl Strategy<Value = (u64, Step)> {
        let req = (0usize..4, 0usize..2, 1u32..=5);
        (
            0u64..40,
            prop_oneof![
                6 => (req.clone(), 0u64..3).prop_map(|((k, t, n), l)| Step::Cached(k, t, n, l)),
                3 => req.prop_map(|(k, t, n)| Step::Other(k, t, n)),
                1 => (0usize..4).prop_map(Step::Peek),
                1 => Just(Step::Restart),
            ],
        )
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        /// Against the script's own arithmetic (`state::pour`, which the
        /// Redis tests pin to the script), four keys in one slot (every
        /// hash collides), two tiers (one and two bands) on the same keys,
        /// another client pouring meanwhile, peeks, and restarts that lose
        /// every key (the connection's epoch moves): every refusal the
        /// cache gives, the script gives too at that instant. The cached
        /// client's requests are "sent" up to 3 ms before Redis decides
        /// them (the round trip).
        #[test]
        fn the_cache_never_refuses_what_the_store_grants(steps in proptest::collection::vec(step(), 1..300)) {
            let tiers = [
                Quota::new(Rate::per_second(10), 5),
                Quota::new(Rate::per_second(20), 8).and(Rate::per_second(2), 6),
            ];
            let encoded: Vec<Encoded> = tiers.iter().map(|q| Encoded::new(q).unwrap()).collect();
            let keys = ["a", "b", "c", "d"];
            let start = Instant::now();
            let base_us = 1_700_000_000_000_000u64;
            let cache = RefusalCache::new(1);
            let mut store: HashMap<usize, Vec<Stored>> = HashMap::new();
            let mut epoch = 1;
            let mut now = Duration::ZERO;
            let mut cached = 0;
            for (gap, step) in steps {
                now += ms(gap);
                let at = start + now;
                let now_us = base_us + u64::try_from(now.as_micros()).unwrap();
                let mut pour = |k: usize, t: usize, n: u32| {
                    let stored = store.entry(k).or_default();
                    let decided = state::pour(&encoded[t], stored, now_us, n);
                    if let Ok(after) = &decided {
                        stored.clone_from(after);
                    }
                    decided
                };
                match step {
                    Step::Cached(k, t, n, latency) => {
                        if cache.refused(keys[k], &tiers[t], n, at, epoch).is_some() {
                            cached += 1;
                            let truth = state::pour(&encoded[t], store.get(&k).map_or(&[][..], Vec::as_slice), now_us, n);
                            prop_assert!(truth.is_err(), "cache refused {n} of {} under tier {t} at {now:?} but the script grants", keys[k]);
                            continue;
                        }
                        let sent = at.checked_sub(ms(latency)).unwrap_or(start);
                        match pour(k, t, n) {
                            Ok(_) => cache.forget(keys[k]),
                            Err(waits) => cache.remember(keys[k], &tiers[t], n, sent, encoded[t].retry_after(&waits), epoch, None),
                        }
                    }
                    Step::Other(k, t, n) => {
                        let _ = pour(k, t, n);
                    }
                    Step::Peek(k) => {
                        let stored = store.get(&k).cloned().unwrap_or_default();
                        cache.forget_if(keys[k], |q, n| {
                            Encoded::new(q).is_ok_and(|q| state::peek(&q, &stored, now_us, n).answer().is_ok())
                        });
                    }
                    Step::Restart => {
                        store.clear();
                        epoch += 1;
                    }
                }
            }
            let _ = cached;
        }
    }
}
