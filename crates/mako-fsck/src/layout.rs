//! The file system's geometry as fsck needs it: units, tree spans, and where an
//! extent of subblocks may lie. Re-derived from the descriptor and mako-format, so
//! that the checker does not depend on the file system core it checks.

use mako_format::descriptor::{Descriptor, RESERVED_BYTES};
use mako_format::geometry::Geometry;
use mako_format::inode::pointers_in_inode;
use mako_format::DiskAddress;

/// Deepest indirect tree mako-fs builds (`block_map::DEPTH_MAX`).
pub const TREE_DEPTH_MAX: u8 = 5;

pub const S_IFMT: u32 = 0o170000;
pub const S_IFDIR: u32 = 0o040000;
pub const S_IFREG: u32 = 0o100000;
pub const S_IFLNK: u32 = 0o120000;

pub fn is_dir(mode: u32) -> bool {
    mode & S_IFMT == S_IFDIR
}
pub fn is_reg(mode: u32) -> bool {
    mode & S_IFMT == S_IFREG
}
/// d_type of a mode, as directory entries store it.
pub fn dtype(mode: u32) -> u8 {
    ((mode & S_IFMT) >> 12) as u8
}
/// A file type mako-fs creates: regular, directory, symlink, device, fifo, socket.
pub fn valid_kind(mode: u32) -> bool {
    matches!(
        mode & S_IFMT,
        0o100000 | 0o040000 | 0o120000 | 0o020000 | 0o060000 | 0o010000 | 0o140000
    )
}
pub fn kind_name(mode: u32) -> &'static str {
    match mode & S_IFMT {
        0o100000 => "file",
        0o040000 => "directory",
        0o120000 => "symlink",
        0o020000 => "character device",
        0o060000 => "block device",
        0o010000 => "fifo",
        0o140000 => "socket",
        _ => "invalid type",
    }
}

#[derive(Debug, Clone)]
pub struct Layout {
    pub desc: Descriptor,
    pub geo: Geometry,
    pub block_bytes: u64,
    pub spb: u64,
    pub sb_bytes: u64,
    pub sectors_per_sb: u64,
    /// Pointers per indirect block.
    pub ppi: u64,
    /// Pointers in an inode.
    pub npi: usize,
    /// First allocatable block of every disk.
    pub first_block: u64,
    /// Blocks of each disk (the descriptor's size, in blocks).
    pub disk_blocks: Vec<u64>,
}

impl Layout {
    pub fn new(desc: &Descriptor) -> Layout {
        let geo = desc.geometry;
        let block_bytes = geo.block_bytes as u64;
        Layout {
            desc: desc.clone(),
            geo,
            block_bytes,
            spb: geo.subblocks_per_block as u64,
            sb_bytes: geo.subblock_bytes() as u64,
            sectors_per_sb: geo.sectors_per_subblock(),
            ppi: geo.pointers_per_indirect(),
            npi: pointers_in_inode(geo.inode_bytes),
            first_block: RESERVED_BYTES.div_ceil(block_bytes),
            disk_blocks: desc
                .disks
                .iter()
                .map(|d| d.size_bytes / block_bytes)
                .collect(),
        }
    }

    pub fn inode_bytes(&self) -> u64 {
        self.geo.inode_bytes as u64
    }
    pub fn dir_block_bytes(&self) -> u64 {
        self.geo.dir_block_bytes() as u64
    }
    /// Bytes of one unit: a directory block for directories, a block for the rest.
    pub fn unit_bytes(&self, dir: bool) -> u64 {
        if dir {
            self.dir_block_bytes()
        } else {
            self.block_bytes
        }
    }
    pub fn unit_subblocks(&self, dir: bool) -> u32 {
        (self.unit_bytes(dir) / self.sb_bytes) as u32
    }
    pub fn indirect_subblocks(&self) -> u32 {
        self.geo.indirect_subblocks()
    }
    /// Units one pointer at `level` covers (level 0: one unit).
    pub fn span(&self, level: u8) -> u64 {
        (0..level).fold(1u64, |s, _| s.saturating_mul(self.ppi))
    }
    /// Units a tree of `depth` can address.
    pub fn capacity(&self, depth: u8) -> u64 {
        (self.npi as u64).saturating_mul(self.span(depth))
    }
    /// Smallest depth whose tree addresses unit `unit`.
    pub fn depth_for(&self, unit: u64) -> u8 {
        (0..=TREE_DEPTH_MAX)
            .find(|&d| unit < self.capacity(d))
            .unwrap_or(TREE_DEPTH_MAX)
    }
    /// Subblock number (from the start of its disk) of a subblock-aligned address.
    pub fn subblock(&self, da: DiskAddress) -> u64 {
        da.sector() / self.sectors_per_sb
    }
    pub fn da(&self, disk: u32, subblock: u64) -> DiskAddress {
        DiskAddress::new(disk, subblock * self.sectors_per_sb)
    }
    /// Subblocks of disk `disk` (the allocation map's range ends there).
    pub fn disk_subblocks(&self, disk: usize) -> u64 {
        self.disk_blocks[disk] * self.spb
    }

    /// Why `n` subblocks at `da` cannot be an allocation, or Ok. An allocation lies on
    /// a disk of the file system, after the reserved area, before the disk's end, starts
    /// on a subblock and stays inside one block (so a full block is block-aligned).
    pub fn check_extent(&self, da: DiskAddress, n: u32) -> Result<(), String> {
        if da.is_null() {
            return Err("is null".into());
        }
        let disk = da.disk() as usize;
        if disk >= self.disk_blocks.len() {
            return Err(format!(
                "names disk {disk}; the file system has {} disks",
                self.disk_blocks.len()
            ));
        }
        if da.sector() % self.sectors_per_sb != 0 {
            return Err(format!(
                "is not on a subblock boundary ({} sectors)",
                self.sectors_per_sb
            ));
        }
        let s = self.subblock(da);
        if s / self.spb < self.first_block {
            return Err("lies in the reserved area at the start of the disk".into());
        }
        if s + n as u64 > self.disk_subblocks(disk) {
            return Err(format!(
                "runs past the end of disk {}",
                self.desc.disks[disk].name
            ));
        }
        if s % self.spb + n as u64 > self.spb {
            return Err(if n as u64 == self.spb {
                "is a full block that is not block-aligned".into()
            } else {
                "crosses a block boundary".into()
            });
        }
        Ok(())
    }

    /// Where inode `ino` lives, given the inode file's blocks.
    pub fn inode_da(
        &self,
        inode_file: &mako_fs::meta_blocks::MetaBlocks,
        ino: u64,
    ) -> Option<DiskAddress> {
        let off = ino.checked_mul(self.inode_bytes())?;
        // The inode file is sparse: a hole holds no inode.
        let block = inode_file
            .get((off / self.block_bytes) as usize)
            .filter(|d| !d.is_null())?;
        Some(block.offset_by(off % self.block_bytes))
    }

    /// Byte range `[first, end)` of a file that units `[u0, u1)` cover, clipped to `size`.
    pub fn byte_range(&self, dir: bool, u0: u64, u1: u64, size: u64) -> (u64, u64) {
        let ub = self.unit_bytes(dir);
        (
            u0.saturating_mul(ub).min(size),
            u1.saturating_mul(ub).min(size),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mako_fs::test_util::test_descriptor;

    #[test]
    fn extents_are_checked_against_the_disks() {
        let desc = test_descriptor(2, 64 << 20, 1 << 20);
        let l = Layout::new(&desc);
        let spb = l.spb as u32;
        let block = |disk, b: u64| l.da(disk, b * l.spb);
        assert!(l.check_extent(block(0, 1), spb).is_ok());
        assert!(l
            .check_extent(block(1, 0), spb)
            .unwrap_err()
            .contains("reserved"));
        assert!(l
            .check_extent(block(0, 0), spb)
            .unwrap_err()
            .contains("null"));
        assert!(l
            .check_extent(block(2, 1), spb)
            .unwrap_err()
            .contains("disk 2"));
        assert!(l
            .check_extent(l.da(0, l.spb + 1), spb)
            .unwrap_err()
            .contains("block-aligned"));
        assert!(l
            .check_extent(l.da(0, 2 * l.spb - 2), 3)
            .unwrap_err()
            .contains("crosses"));
        assert!(l.check_extent(l.da(0, 2 * l.spb - 3), 3).is_ok());
        assert!(l
            .check_extent(block(0, 64), spb)
            .unwrap_err()
            .contains("past the end"));
        assert!(l
            .check_extent(DiskAddress::new(0, l.spb * l.sectors_per_sb + 1), 1)
            .unwrap_err()
            .contains("subblock"));
        assert_eq!(l.span(0), 1);
        assert_eq!(l.capacity(1), l.npi as u64 * l.ppi);
        assert_eq!(l.depth_for(l.npi as u64 - 1), 0);
        assert_eq!(l.depth_for(l.npi as u64), 1);
    }
}
