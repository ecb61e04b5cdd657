//! The fifth phase: the allocation maps against what is in use. A subblock some file
//! owns but the block map shows free would be handed out twice (it must be marked);
//! a subblock marked in use that nothing owns is leaked (it is freed). The inode map
//! likewise against the inodes in use. Also builds the maps fsck writes back.

use crate::layout::Layout;
use crate::metafiles::Metafiles;
use crate::problem::{Problem, ProblemKind};
use crate::progress::{Phase, Progress};
use crate::scan::{find, InodeRec, SlotState};
use crate::space::{runs, Bitmap};
use mako_format::alloc_segment::AllocSegment;
use mako_format::inode_map_segment::InodeMapSegment;
use std::collections::{BTreeMap, BTreeSet};

/// Leaked runs listed one by one; beyond this they are summed in one problem.
const LEAKED_RUNS_LISTED_MAX: usize = 1000;

/// The block allocation map as read: set bits of every readable segment.
pub fn ondisk_alloc(l: &Layout, meta: &Metafiles) -> Bitmap {
    let mut b = Bitmap::new(l);
    for seg in meta.alloc_segments.iter().flatten() {
        for (s, bits) in seg.slices.iter().zip(&seg.bitmaps) {
            b.insert(s.disk as usize, s.first_subblock, s.subblocks, bits);
        }
    }
    b
}

/// Compare the block allocation map with the claims of the scan.
pub fn compare_alloc(
    l: &Layout,
    meta: &Metafiles,
    claims: &Bitmap,
    recs: &[InodeRec],
    problems: &mut Vec<Problem>,
    progress: &dyn Progress,
) {
    // 1. Owned but marked free: runs found word by word, then named by owner.
    let mut unmarked: Vec<(u32, u64, u64)> = Vec::new();
    for seg in meta.alloc_segments.iter().flatten() {
        for (s, bits) in seg.slices.iter().zip(&seg.bitmaps) {
            let owned = claims.extract(s.disk as usize, s.first_subblock, s.subblocks);
            if bits.iter().zip(&owned).all(|(m, o)| o & !m == 0) {
                continue;
            }
            let bit = |i: u64| {
                owned[(i / 64) as usize] >> (i % 64) & 1 == 1
                    && bits[(i / 64) as usize] >> (i % 64) & 1 == 0
            };
            for (a, b) in runs(0, s.subblocks, bit) {
                unmarked.push((s.disk, s.first_subblock + a, s.first_subblock + b));
            }
        }
    }
    unmarked.sort_unstable();
    if !unmarked.is_empty() {
        for r in recs {
            for e in &r.extents {
                let (d, s0) = (e.da.disk(), l.subblock(e.da));
                let s1 = s0 + e.subblocks as u64;
                let from = unmarked.partition_point(|u| (u.0, u.2) <= (d, s0));
                let free: u64 = unmarked[from..]
                    .iter()
                    .take_while(|u| u.0 == d && u.1 < s1)
                    .map(|u| u.2.min(s1).saturating_sub(u.1.max(s0)))
                    .sum();
                if free == 0 {
                    continue;
                }
                let what = e.piece.name();
                problems.push(
                    Problem::new(
                        ProblemKind::BlockMarkedFree,
                        format!(
                            "{free} of the {} subblocks of its {what} at {} are marked free in the allocation map: they could be handed out again",
                            e.subblocks, e.da
                        ),
                        "mark them in use",
                    )
                    .ino(r.ino)
                    .at(e.da),
                );
            }
        }
    }
    // 2. Marked in use but owned by nothing.
    let mut leaked = Vec::new();
    for (ri, seg) in meta.alloc_segments.iter().enumerate() {
        progress.update(Phase::Space, ri as u64, meta.alloc_segments.len() as u64);
        let Some(seg) = seg else { continue };
        for (s, bits) in seg.slices.iter().zip(&seg.bitmaps) {
            let d = s.disk as usize;
            let owned = claims.extract(d, s.first_subblock, s.subblocks);
            let any = bits.iter().zip(&owned).any(|(m, o)| m & !o != 0);
            if !any {
                continue;
            }
            let bit = |i: u64| {
                bits[(i / 64) as usize] >> (i % 64) & 1 == 1
                    && owned[(i / 64) as usize] >> (i % 64) & 1 == 0
            };
            for (a, b) in runs(0, s.subblocks, bit) {
                leaked.push((s.disk, s.first_subblock + a, b - a));
            }
        }
    }
    let total: u64 = leaked.iter().map(|x| x.2).sum();
    for &(disk, s, n) in leaked.iter().take(LEAKED_RUNS_LISTED_MAX) {
        problems.push(
            Problem::new(
                ProblemKind::BlockLeaked,
                format!("{n} subblocks are marked in use but no file owns them"),
                "mark them free",
            )
            .at(l.da(disk, s)),
        );
    }
    if leaked.len() > LEAKED_RUNS_LISTED_MAX {
        let rest = &leaked[LEAKED_RUNS_LISTED_MAX..];
        problems.push(Problem::new(
            ProblemKind::BlockLeaked,
            format!(
                "{} more runs ({} subblocks) are marked in use but no file owns them ({total} subblocks leaked in all)",
                rest.len(),
                rest.iter().map(|x| x.2).sum::<u64>()
            ),
            "mark them free",
        ));
    }
}

/// Compare the inode map with the inodes in use.
pub fn compare_imap(l: &Layout, meta: &Metafiles, recs: &[InodeRec], problems: &mut Vec<Problem>) {
    let per = l.desc.inodes_per_segment as u64;
    let first_user = l.desc.metadata_inodes.first_user_inode;
    for (&si, seg) in meta.imap_segments.segments.iter() {
        let Some(seg) = seg else { continue };
        let base = si * per;
        let bit = |ino: u64| {
            let i = ino - base;
            seg.bitmap
                .get((i / 64) as usize)
                .is_some_and(|w| w >> (i % 64) & 1 == 1)
        };
        // Reserved numbers are always marked (mkfs marks them).
        let reserved_clear: Vec<u64> = (base..(base + per).min(first_user))
            .filter(|&i| !bit(i))
            .collect();
        if !reserved_clear.is_empty() {
            problems.push(Problem::new(
                ProblemKind::InodeMarkedFree,
                format!("reserved inode numbers {reserved_clear:?} are marked free; they must never be handed out"),
                "mark them in use",
            ));
        }
        for (wi, &w) in seg.bitmap.iter().enumerate() {
            let mut word = w;
            while word != 0 {
                let b = word.trailing_zeros() as u64;
                word &= word - 1;
                let ino = base + wi as u64 * 64 + b;
                if ino < first_user || ino >= l.desc.inodes_max {
                    continue;
                }
                if find(recs, ino).is_none() {
                    problems.push(
                        Problem::new(
                            ProblemKind::InodeLeaked,
                            "inode number is marked in use, but its slot holds no inode",
                            "mark it free",
                        )
                        .ino(ino),
                    );
                }
            }
        }
    }
    if meta.imap_segments.usable && !meta.imap_segments.segments.contains_key(&0) {
        problems.push(
            Problem::new(
                ProblemKind::InodeMarkedFree,
                "the inode map's first block, which marks the reserved inode numbers, is a hole",
                "none: fsck does not add blocks to the inode map file; restore from a backup",
            )
            .uncorrectable(),
        );
    }
    for r in recs {
        if r.system || !r.live() {
            continue;
        }
        if meta.imap_segments.in_hole(r.ino) {
            // mako-fs makes a segment's block with the first number it hands out there.
            problems.push(
                Problem::new(
                    ProblemKind::InodeMarkedFree,
                    "inode is in use but its inode-map segment lies in a hole of the inode map file",
                    "none: fsck does not add blocks to the inode map file; copy the file off and remove it",
                )
                .ino(r.ino)
                .at(r.slot)
                .uncorrectable(),
            );
            continue;
        }
        if meta.imap_segments.bit(r.ino) == Some(false) && r.state == SlotState::Live {
            problems.push(
                Problem::new(
                    ProblemKind::InodeMarkedFree,
                    "inode is in use but free in the inode map: it could be handed out again",
                    "mark it in use",
                )
                .ino(r.ino)
                .at(r.slot),
            );
        }
    }
}

/// Allocation map segments holding `bits`.
pub fn alloc_segments(l: &Layout, bits: &Bitmap) -> Vec<AllocSegment> {
    (0..l.desc.regions)
        .map(|r| {
            let slices = mako_fs::alloc_map::region_slices(&l.desc, r);
            let bitmaps = slices
                .iter()
                .map(|s| bits.extract(s.disk as usize, s.first_subblock, s.subblocks))
                .collect();
            AllocSegment {
                region: r,
                slices,
                bitmaps,
            }
        })
        .collect()
}

/// Inode map segments with exactly `used` (plus the reserved numbers) marked: those
/// with a number marked (every other one is blank).
pub fn imap_segments(l: &Layout, used: &BTreeSet<u64>) -> BTreeMap<u64, InodeMapSegment> {
    let per = l.desc.inodes_per_segment;
    let n = mako_fs::inode_map::InodeMap::segment_count(l.desc.inodes_max, per);
    let mut segs: BTreeMap<u64, InodeMapSegment> = BTreeMap::new();
    let first_user = l.desc.metadata_inodes.first_user_inode;
    for ino in (0..first_user).chain(used.iter().copied()) {
        let s = ino / per as u64;
        if s >= n {
            continue;
        }
        let i = ino % per as u64;
        let seg = segs
            .entry(s)
            .or_insert_with(|| InodeMapSegment::new(s as u32, s * per as u64, per));
        seg.bitmap[(i / 64) as usize] |= 1 << (i % 64);
    }
    segs
}
