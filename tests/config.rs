//! Bad configuration gets a clear error, never a panic: missing, zero,
//! sub-nanosecond, over-long and non-finite rates, zero capacity, too many
//! initial tokens, no runtime; plus the defaults and the error messages.

use std::time::Duration;

use tokio_ratelimit::{
    AcquireError, ConfigError, Funnel, LeakyBucket, Rate, TokenBucket, TryAcquireError,
};

/// Builds each of the three limiters from `rate` and `capacity` and returns
/// their errors (or `None` for success).
fn build_all(rate: Option<Rate>, capacity: Option<u32>) -> [Option<ConfigError>; 3] {
    let mut t = TokenBucket::builder();
    let mut l = LeakyBucket::builder();
    let mut f = Funnel::builder();
    if let Some(rate) = rate {
        t.rate(rate);
        l.rate(rate);
        f.rate(rate);
    }
    if let Some(capacity) = capacity {
        t.capacity(capacity);
        l.capacity(capacity);
        f.capacity(capacity);
    }
    [t.build().err(), l.build().err(), f.build().err()]
}

fn invalid_rate(reason: &'static str) -> ConfigError {
    ConfigError::InvalidRate { reason }
}

/// The rate is rejected the same way by `validate` and by every builder.
fn assert_rate_rejected(rate: Rate, reason: &'static str) {
    assert_eq!(
        rate.validate(),
        Err(ConfigError::InvalidRate { reason }),
        "{rate:?}"
    );
    assert_eq!(
        build_all(Some(rate), Some(1)),
        [Some(invalid_rate(reason)); 3],
        "{rate:?}"
    );
}

#[tokio::test]
async fn missing_rate() {
    assert_eq!(
        build_all(None, Some(1)),
        [Some(ConfigError::MissingRate); 3]
    );
    assert_eq!(build_all(None, None), [Some(ConfigError::MissingRate); 3]);
}

#[tokio::test]
async fn zero_permits() {
    assert_rate_rejected(Rate::per_second(0), "zero permits per period");
    assert_rate_rejected(Rate::per_minute(0), "zero permits per period");
    assert_rate_rejected(
        Rate::per(0, Duration::from_secs(1)),
        "zero permits per period",
    );
    // Without an explicit capacity (the default would be 0) the rate is
    // still what is reported.
    assert_eq!(
        build_all(Some(Rate::per_second(0)), None),
        [Some(invalid_rate("zero permits per period")); 3]
    );
}

#[tokio::test]
async fn zero_period() {
    assert_rate_rejected(Rate::per(1, Duration::ZERO), "zero period");
    assert_rate_rejected(Rate::every(Duration::ZERO), "zero period");
}

#[tokio::test]
async fn faster_than_one_per_nanosecond() {
    let reason = "faster than one permit per nanosecond";
    assert_rate_rejected(Rate::per_second(1_000_000_001), reason);
    assert_rate_rejected(Rate::per_second(u32::MAX), reason);
    assert_rate_rejected(Rate::per(2, Duration::from_nanos(1)), reason);
    // Exactly one per nanosecond is the fastest valid rate.
    assert_eq!(Rate::per_second(1_000_000_000).validate(), Ok(()));
    assert_eq!(Rate::every(Duration::from_nanos(1)).validate(), Ok(()));
    assert_eq!(
        build_all(Some(Rate::per_second(1_000_000_000)), None),
        [None; 3]
    );
}

#[tokio::test]
async fn period_longer_than_u64_max_nanoseconds() {
    let reason = "period longer than u64::MAX nanoseconds";
    assert_rate_rejected(Rate::per(1, Duration::MAX), reason);
    assert_rate_rejected(
        Rate::every(Duration::from_nanos(u64::MAX) + Duration::from_nanos(1)),
        reason,
    );
    // u64::MAX nanoseconds (584 years) is still valid.
    let slowest = Rate::every(Duration::from_nanos(u64::MAX));
    assert_eq!(slowest.validate(), Ok(()));
    assert_eq!(build_all(Some(slowest), Some(1)), [None; 3]);
}

#[tokio::test]
async fn bad_float_rates() {
    assert_rate_rejected(Rate::per_second_f64(f64::NAN), "NaN permits per second");
    assert_rate_rejected(
        Rate::per_second_f64(f64::INFINITY),
        "infinite permits per second",
    );
    assert_rate_rejected(
        Rate::per_second_f64(f64::NEG_INFINITY),
        "infinite permits per second",
    );
    for not_positive in [0.0, -0.0, -1.0, -1e-300, f64::MIN] {
        assert_rate_rejected(
            Rate::per_second_f64(not_positive),
            "permits per second must be positive",
        );
    }
    assert_rate_rejected(
        Rate::per_second_f64(2e9),
        "faster than one permit per nanosecond",
    );
    assert_rate_rejected(
        Rate::per_second_f64(1e-12),
        "slower than one permit per u64::MAX nanoseconds",
    );
    assert_rate_rejected(
        Rate::per_second_f64(f64::MIN_POSITIVE),
        "slower than one permit per u64::MAX nanoseconds",
    );
    // Good floats build.
    for good in [0.001, 0.5, 1.0 / 3.0, 3.3, 7e6, 1e9] {
        assert_eq!(
            build_all(Some(Rate::per_second_f64(good)), Some(1)),
            [None; 3],
            "{good}"
        );
    }
}

#[tokio::test]
async fn zero_capacity() {
    assert_eq!(
        build_all(Some(Rate::per_second(1)), Some(0)),
        [Some(ConfigError::ZeroCapacity); 3]
    );
}

#[tokio::test]
async fn initial_exceeds_capacity() {
    let err = TokenBucket::builder()
        .rate(Rate::per_second(10))
        .capacity(5)
        .initial(6)
        .build()
        .unwrap_err();
    assert_eq!(
        err,
        ConfigError::InitialExceedsCapacity {
            initial: 6,
            capacity: 5
        }
    );
    assert_eq!(
        err.to_string(),
        "initial tokens (6) exceed the capacity (5)"
    );
    // Against the default capacity, too.
    let err = TokenBucket::builder()
        .rate(Rate::per_second(10))
        .initial(11)
        .build()
        .unwrap_err();
    assert_eq!(
        err,
        ConfigError::InitialExceedsCapacity {
            initial: 11,
            capacity: 10
        }
    );
    // initial == capacity and initial == 0 are fine.
    for initial in [0, 5] {
        let b = TokenBucket::builder()
            .rate(Rate::per_second(10))
            .capacity(5)
            .initial(initial)
            .build()
            .unwrap();
        assert_eq!(b.available(), initial);
    }
}

#[test]
fn token_and_leaky_bucket_outside_a_runtime() {
    let rate = Rate::per_second(10);
    assert_eq!(
        TokenBucket::builder().rate(rate).build().unwrap_err(),
        ConfigError::NoRuntime
    );
    assert_eq!(
        LeakyBucket::builder().rate(rate).build().unwrap_err(),
        ConfigError::NoRuntime
    );
    assert_eq!(
        build_all(Some(rate), None)[..2],
        [Some(ConfigError::NoRuntime); 2]
    );
}

#[test]
fn funnel_outside_a_runtime() {
    // Real time here (there is no runtime to pause): one per hour leaves no
    // room for a second permit within the test, whatever the machine.
    let f = Funnel::builder()
        .rate(Rate::per_hour(1))
        .capacity(2)
        .build()
        .unwrap();
    assert_eq!(f.try_acquire(), Ok(()));
    assert_eq!(f.try_acquire(), Ok(()));
    match f.try_acquire() {
        Err(TryAcquireError::Limited { retry_after }) => {
            assert!(retry_after <= Duration::from_secs(3600), "{retry_after:?}");
            assert!(retry_after > Duration::from_secs(3500), "{retry_after:?}");
        }
        other => panic!("expected Limited, got {other:?}"),
    }
    assert_eq!(
        f.try_acquire_many(3),
        Err(TryAcquireError::InsufficientCapacity)
    );
    assert_eq!(f.level(), 2);
    assert_eq!(f.free(), 0);
    f.set_rate(Rate::per_second(1)).unwrap();
    f.close();
    assert_eq!(f.try_acquire(), Err(TryAcquireError::Closed));
}

#[tokio::test]
async fn set_rate_with_an_invalid_rate_is_an_error() {
    let rate = Rate::per_second(10);
    let t = TokenBucket::builder().rate(rate).build().unwrap();
    let l = LeakyBucket::builder().rate(rate).build().unwrap();
    let f = Funnel::builder().rate(rate).build().unwrap();
    for (bad, reason) in [
        (Rate::per_second(0), "zero permits per period"),
        (Rate::per(1, Duration::ZERO), "zero period"),
        (
            Rate::per_second(2_000_000_000),
            "faster than one permit per nanosecond",
        ),
        (
            Rate::per(1, Duration::MAX),
            "period longer than u64::MAX nanoseconds",
        ),
        (Rate::per_second_f64(f64::NAN), "NaN permits per second"),
        (
            Rate::per_second_f64(-1.0),
            "permits per second must be positive",
        ),
    ] {
        let expected = Err(ConfigError::InvalidRate { reason });
        assert_eq!(t.set_rate(bad), expected);
        assert_eq!(l.set_rate(bad), expected);
        assert_eq!(f.set_rate(bad), expected);
    }
    assert_eq!(t.rate(), rate);
    assert_eq!(l.rate(), rate);
    assert_eq!(f.rate(), rate);
    assert_eq!(t.available(), 10);
    assert_eq!(f.free(), 10);
    assert_eq!(l.level(), 0);
}

#[tokio::test]
async fn default_capacity_is_the_permits_per_period() {
    for (rate, expected) in [
        (Rate::per_second(100), 100),
        (Rate::per_minute(120), 120),
        (Rate::per(7, Duration::from_millis(3)), 7),
        (Rate::every(Duration::from_secs(5)), 1),
        (Rate::per_second_f64(0.5), 1),
        (Rate::per_second_f64(3.3), 33),
    ] {
        let t = TokenBucket::builder().rate(rate).build().unwrap();
        let l = LeakyBucket::builder().rate(rate).build().unwrap();
        let f = Funnel::builder().rate(rate).build().unwrap();
        assert_eq!(t.capacity(), expected, "{rate:?}");
        assert_eq!(l.capacity(), expected, "{rate:?}");
        assert_eq!(f.capacity(), expected, "{rate:?}");
        // The token bucket starts full; the others start empty.
        assert_eq!(t.available(), expected, "{rate:?}");
        assert_eq!(f.free(), expected, "{rate:?}");
        assert_eq!(l.level(), 0, "{rate:?}");
    }
}

#[test]
fn messages_are_lowercase_without_a_trailing_period() {
    let mut messages: Vec<String> = vec![
        ConfigError::MissingRate.to_string(),
        ConfigError::ZeroCapacity.to_string(),
        ConfigError::NoRuntime.to_string(),
        ConfigError::InitialExceedsCapacity {
            initial: 2,
            capacity: 1,
        }
        .to_string(),
        ConfigError::InvalidParameter {
            name: "warmup",
            reason: "must be positive",
        }
        .to_string(),
        AcquireError::Closed.to_string(),
        AcquireError::InsufficientCapacity.to_string(),
        AcquireError::Overflow.to_string(),
        AcquireError::Timeout.to_string(),
        TryAcquireError::Closed.to_string(),
        TryAcquireError::InsufficientCapacity.to_string(),
        TryAcquireError::Limited {
            retry_after: Duration::from_millis(1500),
        }
        .to_string(),
    ];
    // Every invalid-rate reason, as the builders report it.
    for rate in [
        Rate::per_second(0),
        Rate::per(1, Duration::ZERO),
        Rate::per_second(u32::MAX),
        Rate::per(1, Duration::MAX),
        Rate::per_second_f64(f64::NAN),
        Rate::per_second_f64(f64::INFINITY),
        Rate::per_second_f64(-1.0),
        Rate::per_second_f64(1e-12),
    ] {
        messages.push(rate.validate().unwrap_err().to_string());
    }
    // A float that cannot be a rate displays as such.
    for bad in [f64::NAN, f64::INFINITY, 0.0, 2e9, 1e-12] {
        messages.push(Rate::per_second_f64(bad).to_string());
    }
    for m in &messages {
        let first = m.chars().next().unwrap();
        assert!(first.is_lowercase(), "{m:?} does not start lowercase");
        assert!(!m.ends_with('.'), "{m:?} ends with a period");
        assert!(!m.contains('\n'), "{m:?} spans lines");
    }
    assert_eq!(
        ConfigError::MissingRate.to_string(),
        "no rate was configured"
    );
    assert_eq!(
        Rate::per_second(0).validate().unwrap_err().to_string(),
        "invalid rate: zero permits per period"
    );
    assert_eq!(
        ConfigError::InvalidParameter {
            name: "warmup",
            reason: "must be positive"
        }
        .to_string(),
        "invalid warmup: must be positive"
    );
    assert_eq!(
        TryAcquireError::Limited {
            retry_after: Duration::from_millis(1500)
        }
        .to_string(),
        "rate limited, retry after 1.5s"
    );
    assert_eq!(
        Rate::per_second_f64(f64::NAN).to_string(),
        "invalid rate (NaN permits per second)"
    );
}
