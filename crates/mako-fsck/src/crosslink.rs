//! Cross-linked blocks: subblocks claimed by two owners during the scan. All owners of
//! each overlapping run are gathered; one keeps the block — an owner whose block was
//! identity-checked (an indirect, directory or xattr block, a metadata file) before a data
//! owner, then the lowest inode and unit — and every other data owner gets its own
//! copy (or a hole when there is no space left, decided at repair time). A metadata
//! owner that loses (two metadata owners cannot both be right) has its pointer cut.
//! Owners that the repair abandons anyway (freed inodes, rebuilt directories,
//! recreated metadata files) do not count: the block stays with the other owner.

use crate::layout::Layout;
use crate::problem::{Problem, ProblemKind};
use crate::scan::{find, InodeRec, Piece};
use std::collections::BTreeSet;

/// A repair for one losing owner's extent.
#[derive(Debug, Clone)]
pub struct CrossFix {
    pub ino: u64,
    /// Index into the inode's extents.
    pub extent: usize,
    /// Cut the pointer instead of copying the block.
    pub cut: bool,
    /// Index of its problem, to say what was done.
    pub problem: usize,
}

fn piece_name(p: Piece) -> String {
    p.name()
}

/// Decide who keeps each cross-linked run. `abandoned`: inodes whose current blocks
/// the repair gives up.
pub fn resolve(
    l: &Layout,
    recs: &[InodeRec],
    conflicts: &[(u64, usize)],
    abandoned: &BTreeSet<u64>,
    problems: &mut Vec<Problem>,
) -> Vec<CrossFix> {
    if conflicts.is_empty() {
        return Vec::new();
    }
    let span = |ino: u64, k: usize| {
        let e = &recs[find(recs, ino).expect("conflict owner")].extents[k];
        let s = l.subblock(e.da);
        (e.da.disk(), s, s + e.subblocks as u64)
    };
    // 1. The runs of conflicting subblocks, merged.
    let mut runs: Vec<(u32, u64, u64)> = conflicts.iter().map(|&(i, k)| span(i, k)).collect();
    runs.sort_unstable();
    let mut merged: Vec<(u32, u64, u64)> = Vec::new();
    for r in runs {
        match merged.last_mut() {
            Some(m) if m.0 == r.0 && r.1 < m.2 => m.2 = m.2.max(r.2),
            _ => merged.push(r),
        }
    }
    // 2. Every extent overlapping a run is an owner of it.
    let mut owners: Vec<Vec<(u64, usize)>> = vec![Vec::new(); merged.len()];
    for r in recs {
        for (k, e) in r.extents.iter().enumerate() {
            let (d, s0, s1) = (
                e.da.disk(),
                l.subblock(e.da),
                l.subblock(e.da) + e.subblocks as u64,
            );
            let at = merged.partition_point(|m| (m.0, m.2) <= (d, s0));
            let mut j = at;
            while j < merged.len() && merged[j].0 == d && merged[j].1 < s1 {
                if merged[j].2 > s0 {
                    owners[j].push((r.ino, k));
                }
                j += 1;
            }
        }
    }
    // 3. One keeper per run.
    let mut fixes: Vec<CrossFix> = Vec::new();
    let mut done: BTreeSet<(u64, usize)> = BTreeSet::new();
    for (run, list) in merged.iter().zip(owners) {
        let alive: Vec<(u64, usize)> = list
            .into_iter()
            .filter(|(ino, _)| !abandoned.contains(ino))
            .collect();
        if alive.len() < 2 {
            continue;
        }
        let meta = |&(ino, k): &(u64, usize)| {
            let r = &recs[find(recs, ino).expect("owner")];
            r.system
                || r.is_dir()
                || matches!(r.extents[k].piece, Piece::Indirect(..))
                || r.extents[k].piece.is_xattr()
        };
        let unit = |&(ino, k): &(u64, usize)| match recs[find(recs, ino).expect("owner")].extents[k]
            .piece
        {
            Piece::Unit(u) => u,
            Piece::Indirect(_, i) => i,
            Piece::XattrIndex => 0,
            Piece::XattrBlock(k) => k as u64,
        };
        let keeper = *alive
            .iter()
            .min_by_key(|o| (!meta(o), o.0, unit(o)))
            .expect("two owners");
        let kr = &recs[find(recs, keeper.0).expect("keeper")];
        let ke = kr.extents[keeper.1];
        for o in alive.iter().filter(|o| **o != keeper) {
            if !done.insert(*o) {
                continue;
            }
            let r = &recs[find(recs, o.0).expect("owner")];
            let e = r.extents[o.1];
            let cut = meta(o);
            let repair = if cut {
                if r.system {
                    "none: two metadata files own the block; restore from a backup".to_string()
                } else if e.piece.is_xattr() {
                    format!(
                        "drop inode {}'s {} (its attributes with a piece there are lost, the others are written to new xattr blocks)",
                        o.0,
                        piece_name(e.piece)
                    )
                } else {
                    format!(
                        "cut inode {}'s pointer to it ({} becomes a hole)",
                        o.0,
                        piece_name(e.piece)
                    )
                }
            } else {
                format!("give inode {} its own copy of the block for its {} (a hole if no space is left)", o.0, piece_name(e.piece))
            };
            let mut p = Problem::new(
                ProblemKind::CrossLinkedBlock,
                format!(
                    "{} subblocks at {} ({} of inode {}) are also owned by inode {} ({}, {} subblocks at {}); run {}:{}..{}",
                    e.subblocks,
                    e.da,
                    piece_name(e.piece),
                    o.0,
                    keeper.0,
                    piece_name(ke.piece),
                    ke.subblocks,
                    ke.da,
                    run.0,
                    run.1,
                    run.2
                ),
                repair,
            )
            .ino(o.0)
            .at(e.da);
            if cut && r.system {
                p = p.uncorrectable();
            }
            problems.push(p);
            if !(cut && r.system) {
                fixes.push(CrossFix {
                    ino: o.0,
                    extent: o.1,
                    cut,
                    problem: problems.len() - 1,
                });
            }
        }
    }
    fixes
}
