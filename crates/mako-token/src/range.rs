//! Half-open byte ranges: the unit in which tokens are granted, split and given up.

use std::fmt;
use std::num::NonZeroU64;

use serde::{Deserialize, Serialize};

/// The half-open range `[start, end)`. `end == u64::MAX` means "to end of file and
/// beyond", so a token over `[x, u64::MAX)` also covers appends.
///
/// Ranges with `start >= end` are empty; the manager rejects them in requests, and the
/// helpers here never return them (they return `None` instead).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ByteRange {
    pub start: u64,
    pub end: u64,
}

impl ByteRange {
    /// Everything. Non-range resources (inodes, allocation regions, inode-map
    /// segments) are always held over this range.
    pub const WHOLE: ByteRange = ByteRange {
        start: 0,
        end: u64::MAX,
    };

    pub const fn new(start: u64, end: u64) -> Self {
        ByteRange { start, end }
    }

    /// From `start` to infinity, as used for "desired: to end of file".
    pub const fn from(start: u64) -> Self {
        ByteRange {
            start,
            end: u64::MAX,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.start >= self.end
    }

    /// Does `end` mean "infinity" rather than a byte offset?
    pub fn is_open_ended(&self) -> bool {
        self.end == u64::MAX
    }

    pub fn overlaps(&self, other: &ByteRange) -> bool {
        !self.is_empty() && !other.is_empty() && self.start < other.end && other.start < self.end
    }

    /// Does `self` contain all of `other`? Every range contains the empty range.
    pub fn contains(&self, other: &ByteRange) -> bool {
        other.is_empty() || (self.start <= other.start && other.end <= self.end)
    }

    pub fn contains_offset(&self, offset: u64) -> bool {
        self.start <= offset && offset < self.end
    }

    /// The common part, or `None` when the ranges do not overlap.
    pub fn intersect(&self, other: &ByteRange) -> Option<ByteRange> {
        let r = ByteRange::new(self.start.max(other.start), self.end.min(other.end));
        (!r.is_empty()).then_some(r)
    }

    /// `self` minus `other`: up to two pieces, the one below `other` and the one above.
    /// This is how a held token is split when part of it is relinquished.
    pub fn subtract(&self, other: &ByteRange) -> (Option<ByteRange>, Option<ByteRange>) {
        if !self.overlaps(other) {
            let whole = (!self.is_empty()).then_some(*self);
            return (whole, None);
        }
        let below = ByteRange::new(self.start, other.start);
        let above = ByteRange::new(other.end, self.end);
        (
            (!below.is_empty()).then_some(below),
            (!above.is_empty()).then_some(above),
        )
    }

    /// Widen to whole blocks: `start` rounded down and `end` rounded up to multiples of
    /// `block_size`. Data byte-range tokens are requested in whole blocks so that two
    /// nodes never hold tokens over parts of the same block; only the holder of a block
    /// may allocate it, so a block is never allocated twice. An open end stays open, and
    /// an end that would round past `u64::MAX` becomes open.
    pub fn round_to_blocks(&self, block_size: NonZeroU64) -> ByteRange {
        let b = block_size.get();
        let start = self.start - self.start % b;
        let end = if self.is_open_ended() || self.end % b == 0 {
            self.end
        } else {
            (self.end - self.end % b).saturating_add(b)
        };
        ByteRange::new(start, end)
    }
}

impl fmt::Display for ByteRange {
    /// `[0, 4096)`, or `[4096, eof)` for an open end.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_open_ended() {
            write!(f, "[{}, eof)", self.start)
        } else {
            write!(f, "[{}, {})", self.start, self.end)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn r(s: u64, e: u64) -> ByteRange {
        ByteRange::new(s, e)
    }

    #[test]
    fn overlap_and_contains() {
        assert!(r(0, 10).overlaps(&r(9, 20)));
        assert!(
            !r(0, 10).overlaps(&r(10, 20)),
            "half-open: touching is not overlapping"
        );
        assert!(!r(5, 5).overlaps(&r(0, 10)), "empty overlaps nothing");
        assert!(r(0, 10).contains(&r(0, 10)));
        assert!(r(0, 10).contains(&r(3, 7)));
        assert!(!r(0, 10).contains(&r(3, 11)));
        assert!(ByteRange::WHOLE.contains(&r(0, u64::MAX)));
        assert!(r(0, 10).contains_offset(9));
        assert!(!r(0, 10).contains_offset(10));
    }

    #[test]
    fn intersect_and_subtract() {
        assert_eq!(r(0, 10).intersect(&r(5, 20)), Some(r(5, 10)));
        assert_eq!(r(0, 10).intersect(&r(10, 20)), None);
        assert_eq!(r(0, 10).subtract(&r(3, 7)), (Some(r(0, 3)), Some(r(7, 10))));
        assert_eq!(r(0, 10).subtract(&r(0, 7)), (None, Some(r(7, 10))));
        assert_eq!(r(0, 10).subtract(&r(5, 50)), (Some(r(0, 5)), None));
        assert_eq!(r(0, 10).subtract(&r(20, 30)), (Some(r(0, 10)), None));
        assert_eq!(r(0, 10).subtract(&ByteRange::WHOLE), (None, None));
    }

    #[test]
    fn block_rounding() {
        let b = NonZeroU64::new(4096).expect("nonzero");
        assert_eq!(r(1, 2).round_to_blocks(b), r(0, 4096));
        assert_eq!(r(4096, 8192).round_to_blocks(b), r(4096, 8192));
        assert_eq!(r(5000, 8193).round_to_blocks(b), r(4096, 12288));
        assert_eq!(
            ByteRange::from(5000).round_to_blocks(b),
            ByteRange::from(4096)
        );
        assert_eq!(r(0, u64::MAX - 1).round_to_blocks(b), ByteRange::WHOLE);
    }

    #[test]
    fn display() {
        assert_eq!(r(0, 4096).to_string(), "[0, 4096)");
        assert_eq!(ByteRange::from(7).to_string(), "[7, eof)");
    }

    proptest! {
        /// Subtracting splits a range into pieces that, with the intersection, tile it.
        #[test]
        fn subtract_tiles(a in 0u64..100, la in 1u64..50, b in 0u64..100, lb in 1u64..50) {
            let x = r(a, a + la);
            let y = r(b, b + lb);
            let (lo, hi) = x.subtract(&y);
            let mut total = 0;
            for p in [lo, hi, x.intersect(&y)].into_iter().flatten() {
                prop_assert!(x.contains(&p));
                total += p.end - p.start;
            }
            prop_assert_eq!(total, la);
            for p in [lo, hi].into_iter().flatten() {
                prop_assert!(!p.overlaps(&y));
            }
        }

        #[test]
        fn rounding_widens_to_blocks(s in 0u64..1_000_000, l in 1u64..1_000_000, bs in 1u64..70_000) {
            let x = r(s, s + l);
            let b = NonZeroU64::new(bs).expect("nonzero");
            let y = x.round_to_blocks(b);
            prop_assert!(y.contains(&x));
            prop_assert_eq!(y.start % bs, 0);
            prop_assert_eq!(y.end % bs, 0);
            prop_assert!(y.end - y.start < l + 2 * bs);
        }
    }
}
