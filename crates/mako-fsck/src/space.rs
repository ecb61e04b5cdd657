//! Space bookkeeping: who owns which subblocks. `Ownership` is filled by the parallel
//! inode scan (an atomic bitmap: a claim of something already claimed is a cross-link);
//! `Bitmap` is the plain form used to build the allocation map fsck writes back.

use crate::layout::Layout;
use mako_format::DiskAddress;
use std::sync::atomic::{AtomicU64, Ordering};

/// Every subblock claimed by some inode, one bit each, shared by the scan threads.
pub struct Ownership {
    disks: Vec<Vec<AtomicU64>>,
}

fn words(l: &Layout, disk: usize) -> usize {
    l.disk_subblocks(disk).div_ceil(64) as usize
}

impl Ownership {
    pub fn new(l: &Layout) -> Ownership {
        Ownership {
            disks: (0..l.disk_blocks.len())
                .map(|d| (0..words(l, d)).map(|_| AtomicU64::new(0)).collect())
                .collect(),
        }
    }

    /// Claim `n` subblocks at `da` (a valid extent). False if any was claimed before:
    /// the caller has found a cross-link.
    pub fn claim(&self, l: &Layout, da: DiskAddress, n: u32) -> bool {
        let map = &self.disks[da.disk() as usize];
        let mut s = l.subblock(da);
        let end = s + n as u64;
        let mut clash = false;
        while s < end {
            let w = (s / 64) as usize;
            let bit = s % 64;
            let take = (64 - bit).min(end - s);
            let mask = if take == 64 {
                u64::MAX
            } else {
                ((1u64 << take) - 1) << bit
            };
            let old = map[w].fetch_or(mask, Ordering::Relaxed);
            clash |= old & mask != 0;
            s += take;
        }
        !clash
    }

    pub fn to_bitmap(&self) -> Bitmap {
        Bitmap {
            disks: self
                .disks
                .iter()
                .map(|d| d.iter().map(|w| w.load(Ordering::Relaxed)).collect())
                .collect(),
        }
    }
}

/// A subblock bitmap over every disk (bit set = in use).
#[derive(Clone, PartialEq, Eq)]
pub struct Bitmap {
    pub disks: Vec<Vec<u64>>,
}

impl Bitmap {
    pub fn new(l: &Layout) -> Bitmap {
        Bitmap {
            disks: (0..l.disk_blocks.len())
                .map(|d| vec![0u64; words(l, d)])
                .collect(),
        }
    }
    pub fn get(&self, disk: usize, s: u64) -> bool {
        self.disks[disk]
            .get((s / 64) as usize)
            .is_some_and(|w| w >> (s % 64) & 1 == 1)
    }
    pub fn set_range(&mut self, disk: usize, s: u64, n: u64) {
        let map = &mut self.disks[disk];
        let (mut i, end) = (s, s + n);
        while i < end {
            let bit = i % 64;
            let take = (64 - bit).min(end - i);
            map[(i / 64) as usize] |= if take == 64 {
                u64::MAX
            } else {
                ((1u64 << take) - 1) << bit
            };
            i += take;
        }
    }
    pub fn set_extent(&mut self, l: &Layout, da: DiskAddress, n: u32) {
        self.set_range(da.disk() as usize, l.subblock(da), n as u64);
    }
    pub fn range_free(&self, disk: usize, s: u64, n: u64) -> bool {
        (s..s + n).all(|i| !self.get(disk, i))
    }
    pub fn union_with(&mut self, other: &Bitmap) {
        for (a, b) in self.disks.iter_mut().zip(&other.disks) {
            for (x, y) in a.iter_mut().zip(b) {
                *x |= *y;
            }
        }
    }
    /// `count` bits of `disk` from subblock `first`, packed from bit 0 (a segment slice).
    pub fn extract(&self, disk: usize, first: u64, count: u64) -> Vec<u64> {
        let map = &self.disks[disk];
        let word = |i: usize| map.get(i).copied().unwrap_or(0);
        let shift = (first % 64) as u32;
        let base = (first / 64) as usize;
        let mut out: Vec<u64> = (0..count.div_ceil(64) as usize)
            .map(|k| {
                if shift == 0 {
                    word(base + k)
                } else {
                    word(base + k) >> shift | word(base + k + 1) << (64 - shift)
                }
            })
            .collect();
        if count % 64 != 0 {
            if let Some(last) = out.last_mut() {
                *last &= (1u64 << (count % 64)) - 1;
            }
        }
        out
    }
    /// Set the bits of a segment slice (`bits` packed from bit 0) at `first`.
    pub fn insert(&mut self, disk: usize, first: u64, count: u64, bits: &[u64]) {
        for i in 0..count {
            if bits
                .get((i / 64) as usize)
                .is_some_and(|w| w >> (i % 64) & 1 == 1)
            {
                self.disks[disk][((first + i) / 64) as usize] |= 1 << ((first + i) % 64);
            }
        }
    }
}

/// Maximal runs `[start, end)` of subblocks on one disk where `pred(i)` holds, for
/// `i` in `[first, first + count)`.
pub fn runs(first: u64, count: u64, pred: impl Fn(u64) -> bool) -> Vec<(u64, u64)> {
    let mut out = Vec::new();
    let mut start = None;
    for i in first..first + count {
        match (pred(i), start) {
            (true, None) => start = Some(i),
            (false, Some(s)) => {
                out.push((s, i));
                start = None;
            }
            _ => {}
        }
    }
    if let Some(s) = start {
        out.push((s, first + count));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use mako_fs::test_util::test_descriptor;

    #[test]
    fn claims_detect_overlap_across_words() {
        let l = Layout::new(&test_descriptor(2, 64 << 20, 1 << 20));
        let o = Ownership::new(&l);
        let da = l.da(1, 200);
        assert!(o.claim(&l, da, 100));
        assert!(o.claim(&l, l.da(1, 300), 28));
        assert!(
            !o.claim(&l, l.da(1, 299), 1),
            "last subblock of the first claim"
        );
        assert!(
            o.claim(&l, l.da(0, 200), 100),
            "another disk is independent"
        );
        let b = o.to_bitmap();
        assert!(b.get(1, 200) && b.get(1, 327) && !b.get(1, 328) && !b.get(1, 199));
        assert_eq!(runs(190, 150, |i| b.get(1, i)), vec![(200, 328)]);
        let bits = b.extract(1, 192, 200);
        let mut c = Bitmap::new(&l);
        c.insert(1, 192, 200, &bits);
        assert!(c.get(1, 200) && c.get(1, 327) && !c.get(1, 328));
    }
}
