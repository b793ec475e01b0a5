//! The auto-trait promises of the public surface, in one table (after
//! tokio's `tests/async_send_sync.rs`): every public type, and every future
//! a public `async fn` returns, with the traits it guarantees.
//!
//! Everything here is checked when the file compiles; nothing runs. A type
//! or future that loses a promised trait (a `Rc`, a `Cell` or a raw pointer
//! added to a handle, a `!Send` guard held across an `.await`) fails the
//! build of this test.
//!
//! What is deliberately *not* asserted:
//! * `Unpin` of the futures of `async fn`s: compiler-made futures are
//!   `!Unpin`, which promises nothing either way; callers `pin!` them.
//! * `Sync` of the stream adapters and the I/O wrappers, of the `Limiter` trait's futures and of
//!   `Keyed`'s futures (which await the trait's): they hold
//!   `Pin<Box<dyn Future + Send>>` (the trait is async-trait), and a stream
//!   or future is only ever polled through `&mut`.
//!
//! The one negative assertion is intended: a [`Reservation`] is not `Clone`,
//! because each reservation gives its permits back once.

use std::collections::hash_map::RandomState;
use std::fmt::Debug;
use std::sync::Arc;
use std::time::Duration;

use futures::stream;
use tokio_ratelimit::keyed::{
    Keyed, KeyedBuilder, KeyedFunnel, KeyedFunnelBuilder, KeyedLimiter, KeyedStats,
};
use tokio_ratelimit::stream::{Throttled, ThrottledBy};
use tokio_ratelimit::{
    AcquireError, ConfigError, Funnel, FunnelBuilder, LeakyBucket, LeakyBucketBuilder, Limiter,
    Rate, Refused, Reservation, SmoothBursty, SmoothBurstyBuilder, SmoothWarmingUp,
    SmoothWarmingUpBuilder, Stats, TokenBucket, TokenBucketBuilder, TryAcquireError, algorithm,
    test_util,
};

/// `$ty` implements every trait listed.
macro_rules! assert_impl {
    ($ty:ty: $($bound:path),+ $(,)?) => {
        const _: fn() = || {
            fn check<T: ?Sized $(+ $bound)+>() {}
            check::<$ty>();
        };
    };
}

/// The value `$make` computes from `$arg` (a future, usually) implements
/// every trait listed. Compiled, never called.
macro_rules! assert_value {
    (|$arg:ident: $arg_ty:ty| $make:expr => $($bound:path),+ $(,)?) => {
        const _: fn($arg_ty) = |$arg| {
            fn check<T: ?Sized $(+ $bound)+>(_: &T) {}
            check(&$make);
        };
    };
}

/// `$ty` does not implement `$bound`: if it did, the method call below would
/// be ambiguous between the two blanket impls (tokio's `AmbiguousIf*`).
macro_rules! assert_not_impl {
    ($ty:ty: $bound:path) => {
        const _: fn() = || {
            struct Invalid;
            trait AmbiguousIfImpl<A> {
                fn some_item() {}
            }
            impl<T: ?Sized> AmbiguousIfImpl<()> for T {}
            impl<T: ?Sized + $bound> AmbiguousIfImpl<Invalid> for T {}
            <$ty as AmbiguousIfImpl<_>>::some_item();
        };
    };
}

// --- The limiters and their builders -------------------------------------

assert_impl!(TokenBucket: Send, Sync, Unpin, Clone, Debug, Limiter);
assert_impl!(LeakyBucket: Send, Sync, Unpin, Clone, Debug, Limiter);
assert_impl!(Funnel: Send, Sync, Unpin, Clone, Debug, Limiter);
assert_impl!(SmoothBursty: Send, Sync, Unpin, Clone, Debug, Limiter);
assert_impl!(SmoothWarmingUp: Send, Sync, Unpin, Clone, Debug, Limiter);

assert_impl!(TokenBucketBuilder: Send, Sync, Unpin, Clone, Debug, Default);
assert_impl!(LeakyBucketBuilder: Send, Sync, Unpin, Clone, Debug, Default);
assert_impl!(FunnelBuilder: Send, Sync, Unpin, Clone, Debug, Default);
assert_impl!(SmoothBurstyBuilder: Send, Sync, Unpin, Clone, Debug, Default);
assert_impl!(SmoothWarmingUpBuilder: Send, Sync, Unpin, Clone, Debug, Default);

// A service holds `Arc<dyn Limiter>` and shares it across tasks.
assert_impl!(dyn Limiter: Send, Sync);
assert_impl!(Arc<dyn Limiter>: Send, Sync, Unpin, Clone, Limiter);
assert_impl!(&'static dyn Limiter: Send, Sync, Unpin, Limiter);
assert_impl!(Arc<TokenBucket>: Limiter);
assert_impl!(Box<LeakyBucket>: Limiter);
assert_impl!(&'static Funnel: Limiter);
assert_impl!(Box<dyn Limiter>: Send, Sync, Unpin, Limiter);

assert_impl!(Reservation: Send, Sync, Unpin, Debug);
assert_not_impl!(Reservation: Clone);

// --- Values ---------------------------------------------------------------

assert_impl!(Rate: Send, Sync, Unpin, Copy, Debug, std::fmt::Display, std::hash::Hash, Eq);
assert_impl!(Stats: Send, Sync, Unpin, Copy, Debug, Default);
assert_impl!(ConfigError: Send, Sync, Unpin, Copy, Eq, Debug, std::error::Error);
assert_impl!(AcquireError: Send, Sync, Unpin, Copy, Eq, Debug, std::error::Error);
assert_impl!(TryAcquireError: Send, Sync, Unpin, Copy, Eq, Debug, std::error::Error);
assert_impl!(Refused<String>: Send, Sync, Unpin, Clone, Debug, std::error::Error);

assert_impl!(algorithm::FunnelState: Send, Sync, Unpin, Clone, Debug);
assert_impl!(algorithm::TokenState: Send, Sync, Unpin, Clone, Debug);
assert_impl!(algorithm::SmoothState: Send, Sync, Unpin, Clone, Debug);

// --- Futures of the limiters ----------------------------------------------

assert_value!(|l: &TokenBucket| l.acquire() => Send, Sync);
assert_value!(|l: &TokenBucket| l.acquire_many(1) => Send, Sync);
assert_value!(|l: &TokenBucket| l.acquire_timeout(1, Duration::MAX) => Send, Sync);
assert_value!(|l: &TokenBucket| l.reserve(1) => Send, Sync);

assert_value!(|l: &LeakyBucket| l.acquire() => Send, Sync);
assert_value!(|l: &LeakyBucket| l.acquire_many(1) => Send, Sync);
assert_value!(|l: &LeakyBucket| l.acquire_timeout(1, Duration::MAX) => Send, Sync);
assert_value!(|l: &LeakyBucket| l.reserve(1) => Send, Sync);

assert_value!(|l: &Funnel| l.acquire() => Send, Sync);
assert_value!(|l: &Funnel| l.acquire_many(1) => Send, Sync);
assert_value!(|l: &Funnel| l.acquire_timeout(1, Duration::MAX) => Send, Sync);
assert_value!(|l: &Funnel| l.reserve(1) => Send, Sync);

assert_value!(|l: &SmoothBursty| l.acquire() => Send, Sync);
assert_value!(|l: &SmoothBursty| l.acquire_many(1) => Send, Sync);
assert_value!(|l: &SmoothBursty| l.acquire_timeout(1, Duration::MAX) => Send, Sync);
assert_value!(|l: &SmoothBursty| l.reserve(1) => Send, Sync);

assert_value!(|l: &SmoothWarmingUp| l.acquire() => Send, Sync);
assert_value!(|l: &SmoothWarmingUp| l.acquire_many(1) => Send, Sync);
assert_value!(|l: &SmoothWarmingUp| l.acquire_timeout(1, Duration::MAX) => Send, Sync);
assert_value!(|l: &SmoothWarmingUp| l.reserve(1) => Send, Sync);

// Through the trait: async-trait's boxed futures.
assert_value!(|l: &dyn Limiter| l.acquire() => Send, Unpin);
assert_value!(|l: &dyn Limiter| l.acquire_many(1) => Send, Unpin);
assert_value!(|l: &dyn Limiter| l.acquire_timeout(1, Duration::MAX) => Send, Unpin);
assert_value!(|l: &dyn Limiter| l.reserve(1) => Send, Unpin);

// --- Keyed ----------------------------------------------------------------

assert_impl!(KeyedFunnel<String>: Send, Sync, Unpin, Clone, Debug, KeyedLimiter<Key = String>);
assert_impl!(KeyedFunnelBuilder<String>: Send, Sync, Unpin, Debug, Default);
assert_impl!(Keyed<String, TokenBucket>: Send, Sync, Unpin, Clone, Debug, KeyedLimiter<Key = String>);
assert_impl!(KeyedBuilder<String, TokenBucket>: Send, Sync, Unpin, Debug, Default);
assert_impl!(KeyedStats: Send, Sync, Unpin, Copy, Debug, Default);
assert_impl!(dyn KeyedLimiter<Key = String>: Send, Sync);
// The default hasher is named in the types above; std's is Send + Sync.
assert_impl!(KeyedFunnel<String, RandomState>: Send, Sync);

assert_value!(|l: &KeyedFunnel<String>| l.acquire("k") => Send, Sync);
assert_value!(|l: &KeyedFunnel<String>| l.acquire_many("k", 1) => Send, Sync);
assert_value!(|l: &Keyed<String, TokenBucket>| l.acquire("k") => Send);
assert_value!(|l: &Keyed<String, TokenBucket>| l.acquire_many("k", 1) => Send);
assert_value!(|l: &Keyed<String, SmoothBursty>| l.acquire("k") => Send);

// --- Stream adapters --------------------------------------------------------

/// A `Send + Sync + Unpin` stream to wrap.
type Items = stream::Iter<std::vec::IntoIter<u32>>;
/// A weight function that is `Send + Sync + Unpin`.
type Weight = fn(&u32) -> u32;

assert_impl!(Throttled<Items>: Send, Unpin, Debug, futures::Stream);
assert_impl!(ThrottledBy<Items, Weight>: Send, Unpin, Debug, futures::Stream);

// --- I/O wrappers (not `Sync`, as the stream adapters) ----------------------

assert_impl!(tokio_ratelimit::io::RateLimitedRead<tokio::io::DuplexStream, TokenBucket>:
    Send, Unpin, Debug, tokio::io::AsyncRead, tokio::io::AsyncBufRead, tokio::io::AsyncWrite);
assert_impl!(tokio_ratelimit::io::RateLimitedWrite<tokio::io::DuplexStream, Arc<dyn Limiter>>:
    Send, Unpin, Debug, tokio::io::AsyncRead, tokio::io::AsyncWrite);
assert_value!(|r: &mut tokio::io::DuplexStream|
    tokio_ratelimit::io::copy(r, &mut tokio::io::sink(), Funnel::builder().build().unwrap()) => Send);

// --- test_util ---------------------------------------------------------------

assert_impl!(test_util::Grant: Send, Sync, Unpin, Copy, Debug);
assert_impl!(test_util::GrantLog: Send, Sync, Unpin, Clone, Debug);
assert_value!(|l: &TokenBucket| test_util::record_acquires(l, 1, 1) => Send);

// --- tower --------------------------------------------------------------------

#[cfg(feature = "tower")]
mod with_tower {
    use std::fmt::Debug;
    use std::future::Ready;

    use tokio_ratelimit::keyed::KeyedFunnel;
    use tokio_ratelimit::tower::{
        BoxError, KeyedRateLimit, KeyedRateLimitLayer, RateLimit, RateLimitLayer, RateLimited,
        ResponseFuture,
    };

    /// An inner service that is `Send + Sync + Unpin + Clone`.
    type Inner = tower::util::ServiceFn<fn(u32) -> Ready<Result<u32, BoxError>>>;
    /// A key function.
    type Key = fn(&u32) -> String;

    assert_impl!(RateLimitLayer: Send, Sync, Unpin, Clone, Debug);
    assert_impl!(RateLimit<Inner>: Send, Sync, Unpin, Clone);
    assert_impl!(KeyedRateLimitLayer<KeyedFunnel<String>, Key>: Send, Sync, Unpin, Clone, Debug);
    assert_impl!(KeyedRateLimit<Inner, KeyedFunnel<String>, Key>: Send, Sync, Unpin, Clone);
    assert_impl!(RateLimited<String>: Send, Sync, Unpin, Clone, Debug, std::error::Error);
    // A refusal converts into the boxed error tower services return.
    assert_impl!(BoxError: Send, Sync, Unpin);
    // The response future is as Send, Sync and Unpin as the inner one.
    assert_impl!(ResponseFuture<Ready<Result<u32, BoxError>>>: Send, Sync, Unpin, Debug, Future);
}

// --- redis -------------------------------------------------------------------

#[cfg(feature = "redis")]
mod with_redis {
    use std::fmt::Debug;

    use tokio_ratelimit::redis::{
        Decision, FailurePolicy, RedisBuildError, RedisFunnel, RedisFunnelBuilder, RedisLimitError,
        RedisStats,
    };

    assert_impl!(RedisFunnel: Send, Sync, Unpin, Clone, Debug);
    assert_impl!(RedisFunnelBuilder: Send, Sync, Unpin, Clone, Debug);
    assert_impl!(FailurePolicy: Send, Sync, Unpin, Copy, Debug, Default);
    assert_impl!(RedisLimitError: Send, Sync, Unpin, Clone, Debug, std::error::Error);
    assert_impl!(RedisBuildError: Send, Sync, Unpin, Clone, Debug, std::error::Error);
    assert_impl!(RedisStats: Send, Sync, Unpin, Copy, Debug, Default);
    assert_impl!(Decision: Send, Sync, Unpin, Copy, Debug);

    assert_value!(|b: &RedisFunnelBuilder| b.build() => Send);
    assert_value!(|l: &RedisFunnel| l.try_acquire("k") => Send);
    assert_value!(|l: &RedisFunnel| l.try_acquire_many("k", 1) => Send);
    assert_value!(|l: &RedisFunnel| l.acquire("k") => Send);
    assert_value!(|l: &RedisFunnel| l.acquire_many("k", 1) => Send);
    assert_value!(|l: &RedisFunnel| l.try_acquire_many_keys(&[("k", 1)]) => Send);
    assert_value!(|l: &RedisFunnel| l.decide("k", 1) => Send);
}
