//! The `RateLimit-Policy` and `RateLimit` fields of
//! draft-ietf-httpapi-ratelimit-headers (revision 12), and the legacy
//! `X-RateLimit-*` ones, from a limit's band states.
//!
//! Each band is one policy, named for what it allows: `"40-per-2s"`. A
//! band of capacity `C` refilled at one permit per `I` refills its whole
//! capacity in `τ = C·I`, which is the policy's window: `w = ⌈τ⌉` seconds
//! (at least 1, as the draft wants a whole, positive number), and `q` is
//! what refills in `w`, `⌊w / I⌋` — the capacity itself when `τ` is whole
//! seconds. In `RateLimit`, `r` is the permits available now and `t` the
//! seconds until one more is (rounded up; 0 when the band is full).

use std::fmt::Write as _;
use std::time::Duration;

use http::HeaderValue;

use crate::{Band, BandState};

/// One band as a policy: its name, `q` and `w`.
pub(crate) struct Policy {
    pub(crate) name: String,
    pub(crate) q: u64,
    pub(crate) w: u64,
}

impl Policy {
    pub(crate) fn of(band: &Band) -> Policy {
        let (q, w) = Policy::q_w(band);
        Policy {
            name: format!("{q}-per-{w}s"),
            q,
            w,
        }
    }

    /// The band's `q` and `w`, without its name.
    fn q_w(band: &Band) -> (u64, u64) {
        let period = band.rate().period().as_nanos();
        let permits = u128::from(band.rate().permits());
        // τ in ns = C × period / permits; w = ⌈τ⌉ s, at least 1.
        let tau_ns = u128::from(band.capacity()) * period;
        let w = tau_ns.div_ceil(permits * 1_000_000_000).max(1);
        // q = ⌊w s / I⌋ = ⌊w × 10⁹ × permits / period⌋.
        let q = w * 1_000_000_000 * permits / period;
        (
            u64::try_from(q).unwrap_or(u64::MAX),
            u64::try_from(w).unwrap_or(u64::MAX),
        )
    }
}

/// The fields of one quota that do not change from response to response:
/// its `RateLimit-Policy` value, and each band's `RateLimit` item up to its
/// remaining count (`"40-per-2s";r=`).
#[derive(Debug)]
pub(crate) struct Fields {
    bands: Vec<Band>,
    policy: HeaderValue,
    prefixes: Vec<String>,
}

impl Fields {
    fn of(bands: &[Band]) -> Option<Fields> {
        let mut policy = String::new();
        let mut prefixes = Vec::with_capacity(bands.len());
        for (i, band) in bands.iter().enumerate() {
            let p = Policy::of(band);
            if i > 0 {
                policy.push_str(", ");
            }
            write!(policy, "\"{}\";q={};w={}", p.name, p.q, p.w).ok()?;
            prefixes.push(format!("\"{}\";r=", p.name));
        }
        Some(Fields {
            bands: bands.to_vec(),
            policy: HeaderValue::try_from(policy).ok()?,
            prefixes,
        })
    }

    /// `RateLimit-Policy`.
    pub(crate) fn policy(&self) -> HeaderValue {
        self.policy.clone()
    }

    /// `RateLimit` for `states` (of these bands, in order).
    pub(crate) fn limit(&self, states: &[BandState]) -> Option<HeaderValue> {
        let mut out = String::with_capacity(self.prefixes.iter().map(|p| p.len() + 26).sum());
        for (i, (prefix, b)) in self.prefixes.iter().zip(states).enumerate() {
            if i > 0 {
                out.push_str(", ");
            }
            out.push_str(prefix);
            push_u64(&mut out, u64::from(b.available));
            out.push_str(";t=");
            push_u64(&mut out, seconds_up(b.next_in));
        }
        // Digits, letters, quotes and punctuation: a valid value, taken
        // without a copy.
        HeaderValue::try_from(out).ok()
    }
}

/// The [`Fields`] of the quotas a layer has seen, built once each.
#[derive(Debug, Default)]
pub(crate) struct FieldsCache {
    seen: std::sync::RwLock<Vec<std::sync::Arc<Fields>>>,
}

impl FieldsCache {
    /// The most quotas kept (tiers are few; past this they are built per
    /// response).
    const MOST: usize = 64;

    /// The fields of the quota whose bands `states` are; `None` for none.
    pub(crate) fn get(&self, states: &[BandState]) -> Option<std::sync::Arc<Fields>> {
        if states.is_empty() {
            return None;
        }
        let same = |f: &Fields| {
            f.bands.len() == states.len() && f.bands.iter().zip(states).all(|(a, b)| *a == b.band)
        };
        let read = |seen: &Vec<std::sync::Arc<Fields>>| seen.iter().find(|f| same(f)).cloned();
        if let Some(found) = read(
            &self
                .seen
                .read()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        ) {
            return Some(found);
        }
        let bands: Vec<Band> = states.iter().map(|b| b.band).collect();
        let fields = std::sync::Arc::new(Fields::of(&bands)?);
        let mut seen = self
            .seen
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(found) = read(&seen) {
            return Some(found);
        }
        if seen.len() < Self::MOST {
            seen.push(std::sync::Arc::clone(&fields));
        }
        Some(fields)
    }
}

/// `n` in decimal at the end of `out`.
fn push_u64(out: &mut String, mut n: u64) {
    let mut digits = [0u8; 20];
    let mut i = digits.len();
    loop {
        i -= 1;
        digits[i] = b"0123456789"[usize::from(u8::try_from(n % 10).unwrap_or(0))];
        n /= 10;
        if n == 0 {
            break;
        }
    }
    for &d in &digits[i..] {
        out.push(char::from(d));
    }
}

/// Whole seconds, rounded up.
pub(crate) fn seconds_up(d: Duration) -> u64 {
    d.as_secs() + u64::from(d.subsec_nanos() > 0)
}

/// The legacy fields, for the band that binds first (the fewest
/// available; the later reset on a tie): `X-RateLimit-Limit` (its `q`),
/// `-Remaining` and `-Reset` (seconds until one more).
pub(crate) fn legacy(bands: &[BandState]) -> Option<[(&'static str, HeaderValue); 3]> {
    let b = bands
        .iter()
        .min_by_key(|b| (b.available, std::cmp::Reverse(b.next_in)))?;
    Some([
        ("x-ratelimit-limit", Policy::q_w(&b.band).0.into()),
        ("x-ratelimit-remaining", b.available.into()),
        ("x-ratelimit-reset", seconds_up(b.next_in).into()),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Rate;

    fn state(rate: Rate, capacity: u32, available: u32, next_in: Duration) -> BandState {
        BandState {
            band: Band::new(rate, capacity),
            available,
            full_in: Duration::ZERO,
            next_in,
        }
    }

    #[test]
    fn bands_as_policies() {
        let p = |rate, cap| {
            let p = Policy::of(&Band::new(rate, cap));
            (p.name, p.q, p.w)
        };
        assert_eq!(p(Rate::per_second(20), 40), ("40-per-2s".into(), 40, 2));
        assert_eq!(
            p(Rate::per_day(10_000), 10_000),
            ("10000-per-86400s".into(), 10_000, 86_400)
        );
        // A window under a second is one second, and q what refills in it.
        assert_eq!(p(Rate::per_second(10), 1), ("10-per-1s".into(), 10, 1));
        // 2 per 3 s, capacity 5: τ = 7.5 s, so w = 8 and q = ⌊16/3⌋.
        assert_eq!(
            p(Rate::per(2, Duration::from_secs(3)), 5),
            ("5-per-8s".into(), 5, 8)
        );
    }

    #[test]
    fn fields() {
        let bands = [
            state(Rate::per_second(20), 40, 3, Duration::from_millis(1)),
            state(
                Rate::per_day(10_000),
                10_000,
                9_960,
                Duration::from_secs(8) + Duration::from_millis(640),
            ),
        ];
        let cache = FieldsCache::default();
        let fields = cache.get(&bands).unwrap();
        assert_eq!(
            fields.policy(),
            r#""40-per-2s";q=40;w=2, "10000-per-86400s";q=10000;w=86400"#
        );
        assert_eq!(
            fields.limit(&bands).unwrap(),
            r#""40-per-2s";r=3;t=1, "10000-per-86400s";r=9960;t=9"#
        );
        let [l, r, t] = legacy(&bands).unwrap();
        assert_eq!(
            (l.1, r.1, t.1),
            (
                HeaderValue::from(40),
                HeaderValue::from(3),
                HeaderValue::from(1)
            )
        );
        assert!(cache.get(&[]).is_none() && legacy(&[]).is_none());
        // Built once per quota.
        assert!(std::sync::Arc::ptr_eq(&fields, &cache.get(&bands).unwrap()));
        let mut s = String::new();
        for n in [0, 7, 10, 12_345, u64::MAX] {
            s.clear();
            push_u64(&mut s, n);
            assert_eq!(s, n.to_string());
        }
    }
}
