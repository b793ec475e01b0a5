//! A key's state as the decision script stores it, read back in Rust: the
//! same parsing and the same decision, in exact `u128`, so that a peek
//! answers what the script would have answered at the same server time.
//!
//! The state is `"<us> <rem> <unit>"` per band, single spaces: each band's
//! theoretical arrival time (when it is empty) as an absolute pair in the
//! units it was written in (see `repr.rs`). A one-band state is the format
//! of the one-band script that came before quotas, so keys it wrote read
//! as they did. After a grant the bands are followed by
//! `" | <keep> <evicted> <id>..."`, the latest grants' request ids (see
//! `gcra.lua`: what makes a resent decision harmless); a peek reads past
//! them.

use super::repr::{Encoded, Encoding, Split};
use crate::{BandState, Peek, TryAcquireError};

/// One band's stored instant: `us × unit + rem` scaled units of a band
/// whose unit is `unit` (scaled units per microsecond, `rem < unit`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Stored {
    pub(crate) us: u64,
    pub(crate) rem: u64,
    pub(crate) unit: u64,
}

/// The stored bands, in order, as the script reads them: three decimal
/// numbers per band, single spaces, `rem < unit`; `None` for anything else
/// (the script answers "malformed state"). A number beyond `u64` is
/// malformed here; the script, which never writes one, would read it
/// rounded.
pub(crate) fn parse(state: &str) -> Option<Vec<Stored>> {
    let state = match state.split_once(" | ") {
        None => state,
        Some((bands, ids)) => {
            let mut head = ids.splitn(3, ' ');
            let digits = |s: Option<&str>| {
                s.is_some_and(|s| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()))
            };
            if !digits(head.next()) || !digits(head.next()) {
                return None;
            }
            bands
        }
    };
    let numbers: Vec<&str> = state.split(' ').collect();
    if numbers.len() % 3 != 0 {
        return None;
    }
    let number = |s: &str| {
        if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
            None
        } else {
            s.parse::<u64>().ok()
        }
    };
    numbers
        .chunks_exact(3)
        .map(|band| {
            let (us, rem, unit) = (number(band[0])?, number(band[1])?, number(band[2])?);
            (rem < unit).then_some(Stored { us, rem, unit })
        })
        .collect()
}

/// Band `e`'s instant read from `stored`, in its scaled units since the
/// epoch: an instant written in other units with a fraction of a
/// microsecond is rounded up to the next whole microsecond (that fraction
/// means nothing in these units, and rounding up never frees water).
fn instant(e: &Encoding, stored: Stored) -> u128 {
    let (us, rem) = if stored.unit != e.unit() && stored.rem > 0 {
        (stored.us.saturating_add(1), 0)
    } else {
        (stored.us, stored.rem)
    };
    e.join(Split { us, rem })
}

/// What the script does for `n` units (`1 ≤ n ≤` the quota's capacity) at
/// `now_us`: every band's new state when every band grants (the quota's
/// bands, then any stored beyond them unchanged), or every band's wait in
/// its own units (zero where it grants).
pub(crate) fn pour(
    quota: &Encoded,
    stored: &[Stored],
    now_us: u64,
    n: u32,
) -> Result<Vec<Stored>, Vec<Split>> {
    let mut ends = Vec::with_capacity(stored.len().max(quota.bands().len()));
    let mut waits = Vec::with_capacity(quota.bands().len());
    for (i, e) in quota.bands().iter().enumerate() {
        let now = e.join(Split { us: now_us, rem: 0 });
        let tat = stored.get(i).map_or(0, |&s| instant(e, s));
        match e.params().try_pour(tat, now, n) {
            Ok(end) => {
                let end = e.split(end);
                ends.push(Stored {
                    us: end.us,
                    rem: end.rem,
                    unit: e.unit(),
                });
                waits.push(Split { us: 0, rem: 0 });
            }
            Err(short) => waits.push(e.split(short)),
        }
    }
    if ends.len() < quota.bands().len() {
        return Err(waits);
    }
    ends.extend(stored.iter().skip(quota.bands().len()));
    Ok(ends)
}

/// What a request of `n` would get at `now_us` on this state, and every
/// band of the quota then: its whole permits available (as the local
/// limiters count them) and the time until it is full again, rounded up to
/// a nanosecond.
pub(crate) fn peek(quota: &Encoded, stored: &[Stored], now_us: u64, n: u32) -> Peek {
    let answer = if n > quota.capacity() {
        Err(TryAcquireError::InsufficientCapacity)
    } else if n == 0 {
        Ok(())
    } else {
        match pour(quota, stored, now_us, n) {
            Ok(_) => Ok(()),
            Err(waits) => Err(TryAcquireError::Limited {
                retry_after: quota.retry_after(&waits),
            }),
        }
    };
    let mut bands = Vec::with_capacity(quota.bands().len());
    for ((i, e), band) in quota.bands().iter().enumerate().zip(quota.quota().bands()) {
        let p = e.params();
        let now = e.join(Split { us: now_us, rem: 0 });
        let tat = stored.get(i).map_or(0, |&s| instant(e, s));
        bands.push(BandState::of(*band, p, tat, now));
    }
    Peek::new(answer, &bands)
}

/// The instant at which the script makes a key with these bands expire:
/// the next whole millisecond after the latest band's whole microseconds.
#[cfg(test)]
pub(crate) fn expiry_ms(bands: &[Stored]) -> u64 {
    bands.iter().map(|b| b.us).max().unwrap_or(0) / 1000 + 1
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::{Quota, Rate};

    #[test]
    fn parses_what_the_script_writes_and_nothing_else() {
        let one = Stored {
            us: 1_712_345_678_901_234,
            rem: 2000,
            unit: 3000,
        };
        let two = Stored {
            us: 5,
            rem: 0,
            unit: 1000,
        };
        assert_eq!(parse("1712345678901234 2000 3000"), Some(vec![one]));
        assert_eq!(
            parse("1712345678901234 2000 3000 5 0 1000"),
            Some(vec![one, two])
        );
        // The grants' ids after the bands are read past.
        assert_eq!(
            parse("1712345678901234 2000 3000 | 1712345679 0 0123456789abcdef"),
            Some(vec![one])
        );
        assert_eq!(
            parse("1712345678901234 2000 3000 5 0 1000 | 17 16 a b"),
            Some(vec![one, two])
        );
        for bad in [
            "",
            " ",
            "1 2",
            "1 2 3 ",
            " 1 2 3",
            "1  2 3",
            "1 2 3 4",
            "1 3 3",
            "1 -2 3",
            "1 2 3x",
            "1 2 +3",
            "99999999999999999999999 0 1",
            "not a state",
            "1 2 3 | ",
            "1 2 3 | 4",
            "1 2 3 | x 5 id",
            " | 4 5 id",
        ] {
            assert_eq!(parse(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn bands_beyond_the_quota_are_kept_and_missing_ones_read_empty() {
        let q = Encoded::new(&Quota::new(Rate::per_second(10), 10)).unwrap();
        let now = 1_000_000_000;
        let kept = Stored {
            us: now + 86_400_000_000,
            rem: 7,
            unit: 3000,
        };
        // Band 0 is empty at `now + 500 ms`; the second stored band is kept.
        let stored = [
            Stored {
                us: now + 500_000,
                rem: 0,
                unit: 1000,
            },
            kept,
        ];
        let after = pour(&q, &stored, now, 2).unwrap();
        assert_eq!(after[0].us, now + 700_000);
        assert_eq!(after[1], kept);
        assert_eq!(expiry_ms(&after), kept.us / 1000 + 1);
        // A two-band quota reads a one-band state's second band as empty.
        let q2 = Encoded::new(&Quota::new(Rate::per_second(10), 10).and(Rate::per_minute(5), 5))
            .unwrap();
        let after = pour(&q2, &stored[..1], now, 5).unwrap();
        assert_eq!(after.len(), 2);
        assert_eq!(after[1].us, now + 60_000_000);
        let peek = peek(&q2, &stored[..1], now, 1);
        let states: Vec<_> = peek.bands().collect();
        assert_eq!(states[0].available, 5);
        assert_eq!(states[0].full_in, Duration::from_millis(500));
        assert_eq!(states[1].available, 5);
        assert_eq!(states[1].full_in, Duration::ZERO);
    }
}
