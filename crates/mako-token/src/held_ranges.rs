//! The tokens one node holds on one resource: sorted, disjoint, coalesced ranges, each
//! with one mode. Shared by the manager's table and the client's cache so both split,
//! merge and upgrade ranges by exactly the same rules.

use crate::mode::{covers, join, TokenMode};
use crate::range::ByteRange;

/// Disjoint `(range, mode)` pieces in ascending order. Two adjacent pieces never have
/// the same mode (they are merged), so the number of pieces is the number of tokens.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct HeldRanges {
    pieces: Vec<(ByteRange, TokenMode)>,
}

impl HeldRanges {
    pub(crate) fn len(&self) -> usize {
        self.pieces.len()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.pieces.is_empty()
    }

    pub(crate) fn pieces(&self) -> &[(ByteRange, TokenMode)] {
        &self.pieces
    }

    /// Add `mode` over `range`. Where the node already holds something, it keeps the
    /// join of old and new mode, so acquiring never silently weakens a token that may
    /// have dirty data under it.
    pub(crate) fn grant(&mut self, range: ByteRange, mode: TokenMode) {
        assert!(!range.is_empty(), "grant of empty range {range}");
        let mut out = Vec::with_capacity(self.pieces.len() + 2);
        let mut cursor = range.start;
        for &(piece, held) in &self.pieces {
            let Some(common) = piece.intersect(&range) else {
                if piece.start >= range.end && cursor < range.end {
                    out.push((ByteRange::new(cursor, range.end), mode));
                    cursor = range.end;
                }
                out.push((piece, held));
                continue;
            };
            let (below, above) = piece.subtract(&range);
            if let Some(below) = below {
                out.push((below, held));
            }
            if common.start > cursor {
                out.push((ByteRange::new(cursor, common.start), mode));
            }
            out.push((common, join(held, mode)));
            cursor = common.end;
            if let Some(above) = above {
                out.push((above, held));
            }
        }
        if cursor < range.end {
            out.push((ByteRange::new(cursor, range.end), mode));
        }
        self.pieces = out;
        self.coalesce();
    }

    /// Drop everything held over `range`, splitting pieces that straddle its ends.
    pub(crate) fn remove(&mut self, range: ByteRange) {
        let mut out = Vec::with_capacity(self.pieces.len() + 1);
        for &(piece, held) in &self.pieces {
            let (below, above) = piece.subtract(&range);
            out.extend(below.map(|r| (r, held)));
            out.extend(above.map(|r| (r, held)));
        }
        self.pieces = out;
        self.check();
    }

    /// Weaken everything held over `range` to `to`. Fails without changing anything,
    /// returning the first offending piece, if some held mode does not cover `to`.
    pub(crate) fn downgrade(
        &mut self,
        range: ByteRange,
        to: TokenMode,
    ) -> Result<(), (ByteRange, TokenMode)> {
        for &(piece, held) in &self.pieces {
            if let Some(common) = piece.intersect(&range) {
                if !covers(held, to) {
                    return Err((common, held));
                }
            }
        }
        let mut out = Vec::with_capacity(self.pieces.len() + 2);
        for &(piece, held) in &self.pieces {
            let Some(common) = piece.intersect(&range) else {
                out.push((piece, held));
                continue;
            };
            let (below, above) = piece.subtract(&range);
            out.extend(below.map(|r| (r, held)));
            out.push((common, to));
            out.extend(above.map(|r| (r, held)));
        }
        self.pieces = out;
        self.coalesce();
        Ok(())
    }

    /// The widest run of contiguous pieces, each covering `mode`, that contains all of
    /// `range`; `None` if some part of `range` is not held in a covering mode. This is
    /// the client's hot path: a binary search and a walk over the few pieces involved.
    pub(crate) fn covering_run(&self, range: ByteRange, mode: TokenMode) -> Option<ByteRange> {
        let first = self.pieces.partition_point(|(p, _)| p.end <= range.start);
        let mut run: Option<ByteRange> = None;
        let mut cursor = range.start;
        for &(piece, held) in &self.pieces[first..] {
            if piece.start > cursor || !covers(held, mode) {
                break;
            }
            run = Some(ByteRange::new(
                run.map_or(piece.start, |r| r.start),
                piece.end,
            ));
            cursor = piece.end;
            if cursor >= range.end {
                break;
            }
        }
        run.filter(|r| r.contains(&range))
    }

    /// Merge adjacent pieces with equal modes, then check the representation.
    fn coalesce(&mut self) {
        let mut out: Vec<(ByteRange, TokenMode)> = Vec::with_capacity(self.pieces.len());
        for &(piece, held) in &self.pieces {
            match out.last_mut() {
                Some((last, last_mode)) if *last_mode == held && last.end == piece.start => {
                    last.end = piece.end;
                }
                _ => out.push((piece, held)),
            }
        }
        self.pieces = out;
        self.check();
    }

    /// The representation invariant, checked after every change. It is cheap (one pass)
    /// and guards the token table, so it stays on in release builds.
    fn check(&self) {
        for &(piece, _) in &self.pieces {
            assert!(!piece.is_empty(), "held piece {piece} is empty");
        }
        for pair in self.pieces.windows(2) {
            let (a, b) = (pair[0], pair[1]);
            assert!(
                a.0.end <= b.0.start,
                "held pieces {} and {} overlap or are unsorted",
                a.0,
                b.0
            );
            assert!(
                !(a.0.end == b.0.start && a.1 == b.1),
                "held pieces {} and {} should have been merged",
                a.0,
                b.0
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use TokenMode::*;

    fn r(s: u64, e: u64) -> ByteRange {
        ByteRange::new(s, e)
    }

    #[test]
    fn grant_merges_and_joins() {
        let mut h = HeldRanges::default();
        h.grant(r(0, 10), Ro);
        h.grant(r(20, 30), Ro);
        h.grant(r(10, 20), Ro);
        assert_eq!(h.pieces(), &[(r(0, 30), Ro)]);
        h.grant(r(5, 8), Rw);
        assert_eq!(h.pieces(), &[(r(0, 5), Ro), (r(5, 8), Xw), (r(8, 30), Ro)]);
        h.grant(r(25, 40), Xw);
        assert_eq!(
            h.pieces(),
            &[
                (r(0, 5), Ro),
                (r(5, 8), Xw),
                (r(8, 25), Ro),
                (r(25, 40), Xw)
            ]
        );
    }

    #[test]
    fn grant_fills_gaps_between_pieces() {
        let mut h = HeldRanges::default();
        h.grant(r(10, 20), Xw);
        h.grant(r(30, 40), Xw);
        h.grant(r(0, 50), Ro);
        assert_eq!(
            h.pieces(),
            &[
                (r(0, 10), Ro),
                (r(10, 20), Xw),
                (r(20, 30), Ro),
                (r(30, 40), Xw),
                (r(40, 50), Ro)
            ]
        );
    }

    #[test]
    fn remove_splits() {
        let mut h = HeldRanges::default();
        h.grant(r(0, 100), Rw);
        h.remove(r(40, 60));
        assert_eq!(h.pieces(), &[(r(0, 40), Rw), (r(60, 100), Rw)]);
        h.remove(ByteRange::WHOLE);
        assert!(h.is_empty());
    }

    #[test]
    fn downgrade_checks_cover() {
        let mut h = HeldRanges::default();
        h.grant(r(0, 100), Xw);
        h.downgrade(r(10, 20), Ro).expect("xw covers ro");
        assert_eq!(
            h.pieces(),
            &[(r(0, 10), Xw), (r(10, 20), Ro), (r(20, 100), Xw)]
        );
        let before = h.clone();
        assert_eq!(h.downgrade(r(0, 50), Rw), Err((r(10, 20), Ro)));
        assert_eq!(h, before, "failed downgrade changes nothing");
    }

    #[test]
    fn covering_run() {
        let mut h = HeldRanges::default();
        h.grant(r(0, 10), Xw);
        h.grant(r(10, 20), Ro);
        h.grant(r(30, 40), Ro);
        assert_eq!(h.covering_run(r(5, 15), Ro), Some(r(0, 20)));
        assert_eq!(h.covering_run(r(5, 15), Rw), None);
        assert_eq!(h.covering_run(r(2, 3), Rw), Some(r(0, 10)));
        assert_eq!(h.covering_run(r(15, 35), Ro), None, "gap at [20, 30)");
        assert_eq!(h.covering_run(r(40, 41), Ro), None);
    }
}
