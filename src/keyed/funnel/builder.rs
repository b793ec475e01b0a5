//! `KeyedFunnelBuilder`: the map's settings, checked, and the sweeper spawned.

use std::collections::hash_map::RandomState;
use std::fmt;
use std::hash::{BuildHasher, Hash};
use std::sync::{Arc, Weak};
use std::time::Duration;

use tokio::sync::Notify;

use super::{Inner, KeyedFunnel, Tier, Words, map};
use crate::algorithm::in_common_units;
use crate::keyed::{Sweep, spawn_sweeper};
use crate::stats::Counters;
use crate::{ConfigError, Quota, Rate, clock};

/// Configures a [`KeyedFunnel`]; made by [`KeyedFunnel::builder`].
pub struct KeyedFunnelBuilder<K, S = RandomState> {
    rate: Option<Rate>,
    capacity: Option<u32>,
    quota: Option<Quota>,
    tiers: Vec<Quota>,
    max_keys: usize,
    sweep_interval: Duration,
    background_sweep: bool,
    hasher: S,
    name: crate::meter::Name,
    keys: std::marker::PhantomData<fn() -> K>,
}

impl<K, S: fmt::Debug> fmt::Debug for KeyedFunnelBuilder<K, S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyedFunnelBuilder")
            .field("rate", &self.rate)
            .field("capacity", &self.capacity)
            .field("quota", &self.quota)
            .field("tiers", &self.tiers)
            .field("max_keys", &self.max_keys)
            .field("sweep_interval", &self.sweep_interval)
            .field("background_sweep", &self.background_sweep)
            .field("hasher", &self.hasher)
            .field("name", &self.name)
            .finish()
    }
}

impl<K> Default for KeyedFunnelBuilder<K> {
    fn default() -> Self {
        KeyedFunnelBuilder {
            rate: None,
            capacity: None,
            quota: None,
            tiers: Vec::new(),
            max_keys: usize::MAX,
            sweep_interval: Duration::from_secs(1),
            background_sweep: true,
            hasher: RandomState::new(),
            name: crate::meter::Name::default(),
            keys: std::marker::PhantomData,
        }
    }
}

impl<K, S> KeyedFunnelBuilder<K, S>
where
    K: Hash + Eq + Send + Sync + 'static,
    S: BuildHasher + Clone + Send + Sync + 'static,
{
    /// The leak rate of every key's funnel (required).
    pub fn rate(&mut self, rate: Rate) -> &mut Self {
        self.rate = Some(rate);
        self
    }

    /// How many units each key's funnel holds (its burst). Defaults to the
    /// rate's permits per period.
    pub fn capacity(&mut self, capacity: u32) -> &mut Self {
        self.capacity = Some(capacity);
        self
    }

    /// Holds every key to `quota`'s bands (instead of one
    /// [`rate`](Self::rate) and [`capacity`](Self::capacity)): a request
    /// is granted only when every band has room, and then poured into all;
    /// a refused one changes no band. Each key keeps one instant per band:
    /// two bands take one 128-bit word per key, decided with one
    /// compare-and-swap; three or four are kept under a small lock per
    /// key.
    ///
    /// # Examples
    ///
    /// ```
    /// use tokio_ratelimit::{Quota, Rate, keyed::KeyedFunnel};
    ///
    /// // 20 per second with bursts of 40, and 10 000 per day, per key.
    /// let quota = Quota::new(Rate::per_second(20), 40).and(Rate::per_day(10_000), 10_000);
    /// let per_key: KeyedFunnel<u64> = KeyedFunnel::builder().quota(quota).build().unwrap();
    /// assert!(per_key.try_acquire_many(&7, 40).is_ok());
    /// let peek = per_key.peek(&7, 1);
    /// let [second, day]: [_; 2] = peek.bands().collect::<Vec<_>>().try_into().unwrap();
    /// assert_eq!((second.available, day.available), (0, 9_960));
    /// ```
    pub fn quota(&mut self, quota: Quota) -> &mut Self {
        self.quota = Some(quota);
        self
    }

    /// Declares another quota keys may be held to, with
    /// [`try_acquire_with`](KeyedFunnel::try_acquire_with) and the other
    /// `_with` calls: tiers (free and paid keys) in one map. Every tier
    /// counts time in the same units, so a key's state — one instant per
    /// band, whichever tier it is used under — costs no more with many
    /// tiers than with one.
    ///
    /// **Changing a key's tier** takes effect at its next request, which
    /// finds the key's bands as they are: each band's instant (when it is
    /// empty again) carries over, exactly, to the band of the same index in
    /// the new quota. The time until each band is empty is kept, so for
    /// tiers whose bands have the same window (capacity ÷ rate, such as 20/s
    /// burst 20 and 200/s burst 200) a key keeps the *fraction* of each
    /// band it had used (Bucket4j's `PROPORTIONALLY`); a band of a shorter
    /// window is that much fuller (over-full if the time left exceeds its
    /// window: it grants again once enough has drained), and one of a
    /// longer window emptier: the same time of water, a smaller fraction
    /// (a key drained under 10/s burst 10 holds one permit's water under
    /// 1/s burst 10, and may take 9 at once). Bands beyond the new quota's
    /// count are left as they are (and drain); bands beyond the old one's
    /// start empty. The same rule applies when the map's own quota is
    /// switched to a tier with [`KeyedFunnel::set_quota`].
    pub fn tier(&mut self, quota: Quota) -> &mut Self {
        self.tiers.push(quota);
        self
    }

    /// The most keys held at once (default: unbounded). When all are active,
    /// new keys are refused; see [`KeyedFunnel`].
    pub fn max_keys(&mut self, max_keys: usize) -> &mut Self {
        self.max_keys = max_keys;
        self
    }

    /// How often the background sweeper drops drained keys (default 1 s).
    /// The sweeper runs only while the map holds keys, and only when the
    /// map is built inside a tokio runtime.
    pub fn sweep_interval(&mut self, interval: Duration) -> &mut Self {
        self.sweep_interval = interval;
        self
    }

    /// Whether to spawn the background sweeper (default: yes, when built
    /// inside a tokio runtime). Without it drained keys are still dropped when
    /// a shard would otherwise grow, and by [`sweep`](KeyedFunnel::sweep); the map then
    /// never arms a timer — which a server tested on tokio's paused clock
    /// needs, since a pending timer lets the clock jump ahead while the
    /// server waits on its sockets.
    pub fn background_sweep(&mut self, enabled: bool) -> &mut Self {
        self.background_sweep = enabled;
        self
    }

    /// Replaces the hasher (by default std's randomly keyed `SipHash`, which
    /// resists hash flooding; a faster one is fine for trusted keys).
    pub fn hasher<S2>(&self, hasher: S2) -> KeyedFunnelBuilder<K, S2> {
        KeyedFunnelBuilder {
            rate: self.rate,
            capacity: self.capacity,
            quota: self.quota,
            tiers: self.tiers.clone(),
            max_keys: self.max_keys,
            sweep_interval: self.sweep_interval,
            background_sweep: self.background_sweep,
            hasher,
            name: self.name.clone(),
            keys: std::marker::PhantomData,
        }
    }

    /// Names the map for its metrics: the `limiter` label of every series
    /// it records, its key count included (see [`crate::metrics`]).
    /// Unnamed, it records none.
    /// An empty name is refused by `build`
    /// ([`ConfigError::InvalidParameter`]).
    #[cfg(feature = "metrics")]
    #[cfg_attr(docsrs, doc(cfg(feature = "metrics")))]
    pub fn name(&mut self, name: impl Into<String>) -> &mut Self {
        self.name.set(name.into());
        self
    }

    /// Builds the map, and spawns its sweeper when called inside a tokio
    /// runtime (outside one it works too, with sweeps only when a shard
    /// fills up).
    ///
    /// # Errors
    ///
    /// [`ConfigError::MissingRate`], [`ConfigError::InvalidRate`],
    /// [`ConfigError::ZeroCapacity`]; [`ConfigError::InvalidParameter`] for
    /// a zero `max_keys` or `sweep_interval`.
    pub fn build(&self) -> Result<KeyedFunnel<K, S>, ConfigError> {
        self.name.check()?;
        let default = Quota::configured(self.rate, self.capacity, self.quota)?;
        if self.max_keys == 0 {
            return Err(ConfigError::InvalidParameter {
                name: "max_keys",
                reason: "must be at least 1",
            });
        }
        if self.sweep_interval.is_zero() {
            return Err(ConfigError::InvalidParameter {
                name: "sweep_interval",
                reason: "must be positive",
            });
        }
        let mut quotas = vec![default];
        for tier in &self.tiers {
            if !quotas.contains(tier) {
                quotas.push(*tier);
            }
        }
        let params = quotas
            .iter()
            .map(Quota::params)
            .collect::<Result<Vec<_>, _>>()?;
        let (bands, units) = in_common_units(&params).ok_or(ConfigError::InvalidParameter {
            name: "tier",
            reason: "the tiers' rates share no exact time unit the map can count in \
                     (it would be finer than 2^-32 ns, or an interval in it above 2^64 units)",
        })?;
        // The map's own quota is the first.
        let mut tiers: Vec<Tier> = quotas
            .into_iter()
            .zip(bands)
            .map(|(quota, bands)| Tier::new(quota, bands, units))
            .collect();
        // Amortized sweeps of one shard at most this often.
        let gap = self.sweep_interval / 8;
        let origin = clock::Origin::now();
        // 64 bits per band (read relative to the shard's epoch) while every
        // band of every tier fits; see the module docs.
        let narrow = units.params().iter().all(|u| u.den() <= 1 << 20)
            && tiers
                .iter()
                .flat_map(|t| t.bands.params())
                .all(|p| p.tau() <= 1 << 56);
        let hasher = self.hasher.clone();
        let (max_keys, u) = (self.max_keys, &units);
        let words = match (units.params().len(), narrow) {
            (1, true) => Words::Narrow(map(u, hasher, max_keys, gap, origin)),
            (1, false) => Words::Wide(map(u, hasher, max_keys, gap, origin)),
            (2, true) => Words::Pair(map(u, hasher, max_keys, gap, origin)),
            _ => Words::Locked(map(u, hasher, max_keys, gap, origin)),
        };
        let runtime = tokio::runtime::Handle::try_current()
            .ok()
            .filter(|_| self.background_sweep);
        let notify = runtime.as_ref().map(|_| Arc::new(Notify::new()));
        let others: Box<[Tier]> = tiers.split_off(1).into();
        let Some(first) = tiers.pop() else {
            unreachable!("the map's own quota is always there")
        };
        let inner = Arc::new(Inner {
            first,
            others,
            default: std::sync::atomic::AtomicUsize::new(0),
            units,
            origin,
            words,
            sweeper: notify.clone(),
            counters: Counters::default(),
            meter: self.name.slot(true),
        });
        if let (Some(runtime), Some(notify)) = (runtime, notify) {
            let interval = self.sweep_interval;
            let weak: Weak<dyn Sweep> = Arc::downgrade(&inner) as Weak<dyn Sweep>;
            spawn_sweeper(&runtime, weak, notify, interval, "keyed_funnel");
        }
        let owner: Weak<dyn crate::meter::Publish> =
            Arc::downgrade(&inner) as Weak<dyn crate::meter::Publish>;
        inner.meter.register(owner);
        Ok(KeyedFunnel { inner })
    }
}
