//! Space for repairs (block copies for cross-links, rebuilt directories, recreated
//! metadata files). It hands out only subblocks that nothing claims and that the
//! on-disk allocation map also shows free where it is readable, so a repair never
//! writes over anything that might be in use; same placement rules as mako-fs: a full
//! block is block-aligned, a smaller allocation stays inside one block, data on disks
//! that hold data, metadata on disks that hold metadata.

use crate::layout::Layout;
use crate::space::Bitmap;
use mako_format::descriptor::DiskStatus;
use mako_format::DiskAddress;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Use {
    Data,
    Metadata,
}

pub struct RepairAllocator<'a> {
    l: &'a Layout,
    busy: Bitmap,
    /// What this repair allocated, to be marked in use.
    pub new: Vec<(DiskAddress, u32)>,
    cursor: Vec<u64>,
    rotor: usize,
}

impl<'a> RepairAllocator<'a> {
    /// `busy`: everything claimed or marked in use.
    pub fn new(l: &'a Layout, busy: Bitmap) -> Self {
        RepairAllocator {
            l,
            busy,
            new: Vec::new(),
            cursor: l.disk_blocks.iter().map(|_| l.first_block).collect(),
            rotor: 0,
        }
    }

    /// `n` subblocks (a full block when `n` is the subblocks per block), or `None`
    /// when no disk of the right use has room.
    pub fn allocate(&mut self, what: Use, n: u32) -> Option<DiskAddress> {
        let l = self.l;
        let spb = l.spb;
        assert!(n >= 1 && n as u64 <= spb, "allocation of {n} subblocks");
        let disks: Vec<usize> = l
            .desc
            .disks
            .iter()
            .filter(|d| {
                d.status == DiskStatus::Ready
                    && if what == Use::Data {
                        d.usage.holds_data()
                    } else {
                        d.usage.holds_metadata()
                    }
            })
            .map(|d| d.index as usize)
            .collect();
        for k in 0..disks.len() {
            let d = disks[(self.rotor + k) % disks.len()];
            let total = l.disk_blocks[d];
            let span = total.saturating_sub(l.first_block);
            for step in 0..span {
                let b = l.first_block + (self.cursor[d] - l.first_block + step) % span.max(1);
                let base = b * spb;
                let found = if n as u64 == spb {
                    self.busy.range_free(d, base, spb).then_some(base)
                } else {
                    let mut run = 0;
                    let mut at = None;
                    for i in 0..spb {
                        if self.busy.get(d, base + i) {
                            run = 0;
                        } else {
                            run += 1;
                            if run == n as u64 {
                                at = Some(base + i + 1 - run);
                                break;
                            }
                        }
                    }
                    at
                };
                if let Some(s) = found {
                    self.busy.set_range(d, s, n as u64);
                    self.cursor[d] = b;
                    self.rotor = self.rotor.wrapping_add(1);
                    let da = l.da(d as u32, s);
                    self.new.push((da, n));
                    return Some(da);
                }
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mako_fs::test_util::test_descriptor;

    #[test]
    fn allocates_only_free_space_with_mako_placement() {
        let l = Layout::new(&test_descriptor(2, 8 << 20, 1 << 20));
        let mut busy = Bitmap::new(&l);
        // Everything busy but block 3 of disk 1 (half used) and block 5 of disk 0.
        for d in 0..2 {
            busy.set_range(d, 0, l.disk_subblocks(d));
        }
        let spb = l.spb;
        busy.disks[1][(3 * spb / 64) as usize] = 0; // first 64 subblocks of block 3 free
        for i in 0..spb {
            busy.disks[0][((5 * spb + i) / 64) as usize] &= !(1 << ((5 * spb + i) % 64));
        }
        let mut a = RepairAllocator::new(&l, busy);
        let full = a.allocate(Use::Data, spb as u32).unwrap();
        assert_eq!(
            (full.disk(), l.subblock(full)),
            (0, 5 * spb),
            "the only free full block"
        );
        assert!(
            a.allocate(Use::Data, spb as u32).is_none(),
            "no second full block"
        );
        let frag = a.allocate(Use::Metadata, 10).unwrap();
        assert_eq!(frag.disk(), 1);
        assert!(l.subblock(frag) >= 3 * spb && l.subblock(frag) + 10 <= 3 * spb + 64);
        let frag2 = a.allocate(Use::Metadata, 10).unwrap();
        assert_ne!(frag, frag2, "allocations never overlap");
        assert_eq!(a.new.len(), 3);
    }
}
