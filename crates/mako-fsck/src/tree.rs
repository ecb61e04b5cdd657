//! Block pointer trees, read-only: every unit and indirect block an inode points at,
//! and every pointer that cannot be followed (outside the disks, misaligned, past the
//! end of the file, or to a block that is not the indirect block the parent expects).
//!
//! Same addressing as `mako_fs::block_map`: the inode's pointer `i` is the block of
//! level `depth` and index `i`; slot `j` of the block (level `L`, index `x`) points at
//! (level `L-1`, index `x * ppi + j`); level 0 indexes are unit numbers.

use crate::layout::{Layout, TREE_DEPTH_MAX};
use crate::problem::{describe, ProblemKind};
use crate::reader::MetadataReader;
use mako_disk::BufferType;
use mako_format::error::Location;
use mako_format::indirect::{IndirectBlock, IndirectId, INDIRECT_MAGIC};
use mako_format::DiskAddress;

/// A pointer fsck cuts: the child at (level, index) is unusable.
#[derive(Debug, Clone)]
pub struct LostPointer {
    pub level: u8,
    pub index: u64,
    pub da: DiskAddress,
    pub kind: ProblemKind,
    pub why: String,
}

/// What a tree holds.
#[derive(Debug, Default)]
pub struct Walk {
    /// Allocated units: (unit, address, subblocks).
    pub units: Vec<(u64, DiskAddress, u32)>,
    /// Indirect blocks that decoded with the identity their parent expects.
    pub indirect: Vec<(u8, u64, DiskAddress)>,
    pub lost: Vec<LostPointer>,
}

/// How big each unit's allocation is, and which units may exist.
pub struct UnitRule {
    /// Subblocks of a full unit.
    pub full: u32,
    /// The last unit of the file (`None`: the file is empty).
    pub last: Option<u64>,
    /// Subblocks of the last unit when it is a fragment (0: a full unit).
    pub last_subblocks: u32,
    /// Units past the last one are allowed (fallocate with KEEP_SIZE on regular files).
    pub beyond_eof: bool,
    pub size: u64,
}

impl UnitRule {
    fn subblocks(&self, unit: u64) -> u32 {
        if Some(unit) == self.last && self.last_subblocks != 0 {
            self.last_subblocks
        } else {
            self.full
        }
    }
    fn allowed(&self, unit: u64) -> bool {
        self.beyond_eof || self.last.is_some_and(|l| unit <= l)
    }
}

struct Walker<'a> {
    l: &'a Layout,
    r: &'a dyn MetadataReader,
    ino: u64,
    rule: &'a UnitRule,
    out: Walk,
}

/// Walk the tree of inode `ino` whose root pointers are `pointers` at `depth`.
pub fn walk(
    l: &Layout,
    r: &dyn MetadataReader,
    ino: u64,
    depth: u8,
    pointers: &[DiskAddress],
    rule: &UnitRule,
) -> Walk {
    let mut w = Walker {
        l,
        r,
        ino,
        rule,
        out: Walk::default(),
    };
    for (i, &p) in pointers.iter().enumerate().take(l.npi) {
        if !p.is_null() {
            w.visit(depth, i as u64, p);
        }
    }
    w.out
}

impl Walker<'_> {
    fn lose(&mut self, level: u8, index: u64, da: DiskAddress, kind: ProblemKind, why: String) {
        self.out.lost.push(LostPointer {
            level,
            index,
            da,
            kind,
            why,
        });
    }

    fn visit(&mut self, level: u8, index: u64, ptr: DiskAddress) {
        if level == 0 {
            let unit = index;
            if !self.rule.allowed(unit) {
                let why = format!(
                    "points at unit {unit}, past the end of the file (size {} bytes)",
                    self.rule.size
                );
                return self.lose(0, unit, ptr, ProblemKind::BadPointer, why);
            }
            let n = self.rule.subblocks(unit);
            match self.l.check_extent(ptr, n) {
                Ok(()) => self.out.units.push((unit, ptr, n)),
                Err(why) => self.lose(
                    0,
                    unit,
                    ptr,
                    ProblemKind::BadPointer,
                    format!("pointer to unit {unit} ({n} subblocks at {ptr}) {why}"),
                ),
            }
            return;
        }
        let l = self.l;
        if let Err(why) = l.check_extent(ptr, l.indirect_subblocks()) {
            return self.lose(
                level,
                index,
                ptr,
                ProblemKind::BadPointer,
                format!("pointer to the level-{level} indirect block {index} ({ptr}) {why}"),
            );
        }
        let mut buf = vec![0u8; l.geo.indirect_bytes as usize];
        if let Err(e) = self.r.read(ptr, &mut buf, BufferType::Indirect, self.ino) {
            return self.lose(
                level,
                index,
                ptr,
                ProblemKind::BadIndirectBlock,
                format!("indirect block at {ptr} cannot be read: {e}"),
            );
        }
        let id = IndirectId {
            ino: self.ino,
            level,
            index,
        };
        let block = match IndirectBlock::decode(&buf, l.geo.indirect_bytes, id, Location::Disk(ptr))
        {
            Ok(b) => b,
            Err(e) => {
                return self.lose(
                    level,
                    index,
                    ptr,
                    ProblemKind::BadIndirectBlock,
                    describe(&e),
                )
            }
        };
        self.out.indirect.push((level, index, ptr));
        for (j, &c) in block.pointers.iter().enumerate() {
            if c.is_null() {
                continue;
            }
            match index
                .checked_mul(l.ppi)
                .and_then(|x| x.checked_add(j as u64))
            {
                Some(child) => self.visit(level - 1, child, c),
                // Only a corrupt tree deeper than any real file gets here.
                None => self.lose(
                    level - 1,
                    u64::MAX,
                    c,
                    ProblemKind::BadPointer,
                    "points past the largest possible file".into(),
                ),
            }
        }
    }
}

/// The depth of the tree the inode's first root pointer really starts, when that
/// pointer holds an indirect block of this inode (checked by magic, identity and
/// checksum). Used when the inode's depth does not fit what it points at.
pub fn probe_depth(
    l: &Layout,
    r: &dyn MetadataReader,
    ino: u64,
    pointers: &[DiskAddress],
) -> Option<u8> {
    let (slot, &p) = pointers
        .iter()
        .enumerate()
        .take(l.npi)
        .find(|(_, p)| !p.is_null())?;
    l.check_extent(p, l.indirect_subblocks()).ok()?;
    let mut buf = vec![0u8; l.geo.indirect_bytes as usize];
    r.read(p, &mut buf, BufferType::Indirect, ino).ok()?;
    if u32::from_le_bytes([buf[0], buf[1], buf[2], buf[3]]) != INDIRECT_MAGIC as u32 {
        return None;
    }
    // Byte 10 is the level (after magic u32, version u16, crc u32).
    let level = buf[10];
    if level == 0 || level > TREE_DEPTH_MAX {
        return None;
    }
    let id = IndirectId {
        ino,
        level,
        index: slot as u64,
    };
    IndirectBlock::decode(&buf, l.geo.indirect_bytes, id, Location::Disk(p))
        .ok()
        .map(|_| level)
}

/// Is the piece (a unit, or an indirect block at `level`/`index`) under the child at
/// (`cut_level`, `cut_index`) of the same tree?
pub fn is_under(l: &Layout, cut_level: u8, cut_index: u64, level: u8, index: u64) -> bool {
    if level > cut_level {
        return false;
    }
    let shift = l.span(cut_level - level);
    index / shift.max(1) == cut_index
}
