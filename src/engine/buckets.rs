//! What a bucket handle (`TokenBucket`, `LeakyBucket`, `Funnel`) holds: an
//! engine over one band (lock-free) or over several.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use super::{Banded, Bucket, Engine, Kind, Setup, Waits};
use crate::algorithm::{Params, Release};
use crate::{AcquireError, ConfigError, Peek, Quota, Rate, Reservation, Stats, TryAcquireError};

/// A bucket limiter's engine.
#[derive(Clone)]
pub(crate) enum BucketEngine {
    /// One band: the lock-free cell.
    One(Arc<Engine<Bucket>>),
    /// Several bands, decided together under the lock.
    Bands(Arc<Engine<Banded>>),
}

/// Calls `$method` on whichever engine it is.
macro_rules! either {
    ($self:ident, $engine:ident => $call:expr) => {
        match $self {
            BucketEngine::One($engine) => $call,
            BucketEngine::Bands($engine) => $call,
        }
    };
}

impl BucketEngine {
    /// Builds the engine of `quota` (one band or several), each band
    /// lacking `deficit` of its capacity.
    pub(crate) fn start(
        kind: Kind,
        quota: Quota,
        deficit: u32,
        release: Release,
        spawn_actor: bool,
        meter: crate::meter::Slot,
    ) -> Result<BucketEngine, ConfigError> {
        if let [band] = quota.bands() {
            let params = Params::new(band.rate(), band.capacity())?;
            return Engine::start(
                &Setup {
                    kind,
                    rate: band.rate(),
                    params,
                    deficit,
                    release,
                    spawn_actor,
                },
                meter,
            )
            .map(BucketEngine::One);
        }
        Engine::start_bands(kind, quota, deficit, release, spawn_actor, meter)
            .map(BucketEngine::Bands)
    }

    pub(crate) async fn acquire(
        &self,
        n: u32,
        max_wait: Option<Duration>,
    ) -> Result<(), AcquireError> {
        either!(self, e => e.acquire(n, max_wait).await)
    }

    /// Waits in the queue until `n` permits fit (see [`Waits::ForRoom`]).
    pub(crate) async fn acquire_room(&self, n: u32) -> Result<(), AcquireError> {
        either!(self, e => e.acquire_waiting(n, None, Waits::ForRoom).await)
    }

    #[inline]
    pub(crate) fn try_acquire(&self, n: u32) -> Result<(), TryAcquireError> {
        either!(self, e => e.try_acquire(n))
    }

    pub(crate) async fn reserve(&self, n: u32) -> Result<Reservation, AcquireError> {
        either!(self, e => e.reserve(n).await)
    }

    /// Changes the rate of a one-band bucket.
    pub(crate) fn set_rate(&self, rate: Rate) -> Result<(), ConfigError> {
        match self {
            BucketEngine::One(e) => e.set_rate(rate),
            BucketEngine::Bands(_) => Err(ConfigError::InvalidParameter {
                name: "rate",
                reason: "a bucket of several bands has no single rate to change",
            }),
        }
    }

    /// The rate of the (first) band.
    pub(crate) fn rate(&self) -> Rate {
        match self {
            BucketEngine::One(e) => e.rate(),
            BucketEngine::Bands(e) => e.quota().bands()[0].rate(),
        }
    }

    /// The quota: every band.
    pub(crate) fn quota(&self) -> Quota {
        match self {
            BucketEngine::One(e) => Quota::new(e.rate(), e.capacity()),
            BucketEngine::Bands(e) => e.quota(),
        }
    }

    pub(crate) fn peek(&self, n: u32) -> Peek {
        either!(self, e => e.peek(n))
    }

    pub(crate) fn available(&self) -> u32 {
        either!(self, e => e.available())
    }

    pub(crate) fn level(&self) -> u32 {
        either!(self, e => e.level())
    }

    pub(crate) fn waiting(&self) -> usize {
        either!(self, e => e.waiting())
    }

    pub(crate) fn capacity(&self) -> u32 {
        either!(self, e => e.capacity())
    }

    pub(crate) fn close(&self) {
        either!(self, e => e.close());
    }

    pub(crate) fn is_closed(&self) -> bool {
        either!(self, e => e.is_closed())
    }

    pub(crate) fn stats(&self) -> Stats {
        either!(self, e => e.stats())
    }

    /// Whether this is the only handle and the bucket is as new.
    pub(crate) fn is_fresh(&self) -> bool {
        either!(self, e => Arc::strong_count(e) == 1 && e.is_fresh())
    }
}

impl fmt::Debug for BucketEngine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        either!(self, e => e.fmt(f))
    }
}
