//! `KeyedFunnelBuilder`: the map's settings, checked, and the sweeper spawned.

use std::collections::hash_map::RandomState;
use std::fmt;
use std::hash::{BuildHasher, Hash};
use std::sync::{Arc, Weak};
use std::time::Duration;

use tokio::sync::Notify;

use super::{Inner, KeyedFunnel, Words, map};
use crate::algorithm::Params;
use crate::keyed::{Sweep, spawn_sweeper};
use crate::stats::Counters;
use crate::{ConfigError, Rate, clock};

/// Configures a [`KeyedFunnel`]; made by [`KeyedFunnel::builder`].
pub struct KeyedFunnelBuilder<K, S = RandomState> {
    rate: Option<Rate>,
    capacity: Option<u32>,
    max_keys: usize,
    sweep_interval: Duration,
    background_sweep: bool,
    hasher: S,
    keys: std::marker::PhantomData<fn() -> K>,
}

impl<K, S: fmt::Debug> fmt::Debug for KeyedFunnelBuilder<K, S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyedFunnelBuilder")
            .field("rate", &self.rate)
            .field("capacity", &self.capacity)
            .field("max_keys", &self.max_keys)
            .field("sweep_interval", &self.sweep_interval)
            .field("background_sweep", &self.background_sweep)
            .field("hasher", &self.hasher)
            .finish()
    }
}

impl<K> Default for KeyedFunnelBuilder<K> {
    fn default() -> Self {
        KeyedFunnelBuilder {
            rate: None,
            capacity: None,
            max_keys: usize::MAX,
            sweep_interval: Duration::from_secs(1),
            background_sweep: true,
            hasher: RandomState::new(),
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
            max_keys: self.max_keys,
            sweep_interval: self.sweep_interval,
            background_sweep: self.background_sweep,
            hasher,
            keys: std::marker::PhantomData,
        }
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
        let rate = self.rate.ok_or(ConfigError::MissingRate)?;
        let params = Params::new(rate, self.capacity.unwrap_or(rate.permits()))?;
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
        // Amortized sweeps of one shard at most this often.
        let gap = self.sweep_interval / 8;
        let origin = clock::Origin::now();
        let narrow = params.tau() <= 1 << 56 && params.den() <= 1 << 20;
        let hasher = self.hasher.clone();
        let words = if narrow {
            Words::Narrow(map(&params, hasher, self.max_keys, gap, origin))
        } else {
            Words::Wide(map(&params, hasher, self.max_keys, gap, origin))
        };
        let runtime = tokio::runtime::Handle::try_current()
            .ok()
            .filter(|_| self.background_sweep);
        let notify = runtime.as_ref().map(|_| Arc::new(Notify::new()));
        let inner = Arc::new(Inner {
            params,
            rate,
            origin,
            words,
            sweeper: notify.clone(),
            counters: Counters::default(),
        });
        if let (Some(runtime), Some(notify)) = (runtime, notify) {
            let interval = self.sweep_interval;
            let weak: Weak<dyn Sweep> = Arc::downgrade(&inner) as Weak<dyn Sweep>;
            spawn_sweeper(&runtime, weak, notify, interval, "keyed_funnel");
        }
        Ok(KeyedFunnel { inner })
    }
}
