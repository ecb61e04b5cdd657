//! Building structures fsck writes: a block pointer tree for a set of units, and a
//! whole directory from a list of entries, laid out the way `mako_fs::directory`
//! reads it (in the inode when the entries fit; otherwise full directory blocks
//! split by extendible hashing until each fits, the file sized to the deepest split).

use crate::allocator::{RepairAllocator, Use};
use crate::layout::Layout;
use crate::namespace::NewEntry;
use mako_disk::BufferType;
use mako_format::dir_block::{
    entries_encoded_len, page_of, page_room, pages, DirBlock, DirBlockId, DirEntry,
};
use mako_format::indirect::{IndirectBlock, IndirectId};
use mako_format::inode::InodeContent;
use mako_format::name_hash::{home_cookie, COOKIE_MAX};
use mako_format::DiskAddress;
use std::collections::{BTreeMap, BTreeSet};

/// A block to write: where, what, and its buffer type.
pub type BlockWrite = (DiskAddress, Vec<u8>, BufferType);

/// A pointer tree to install in an inode.
pub struct BuiltTree {
    pub pointers: Vec<DiskAddress>,
    pub depth: u8,
    pub writes: Vec<BlockWrite>,
    /// The indirect blocks' addresses (subblocks: `indirect_subblocks`).
    pub indirect: Vec<DiskAddress>,
}

/// A tree mapping `units` (unit -> address) for inode `ino`, with new indirect blocks.
pub fn build_tree(
    l: &Layout,
    alloc: &mut RepairAllocator,
    ino: u64,
    units: &BTreeMap<u64, DiskAddress>,
) -> Result<BuiltTree, String> {
    let top = units.keys().next_back().copied().unwrap_or(0);
    let depth = l.depth_for(top);
    if top >= l.capacity(depth) {
        return Err(format!("unit {top} is beyond the largest tree"));
    }
    let mut pointers = vec![DiskAddress::NULL; l.npi];
    if depth == 0 {
        for (&u, &da) in units {
            pointers[u as usize] = da;
        }
        return Ok(BuiltTree {
            pointers,
            depth,
            writes: Vec::new(),
            indirect: Vec::new(),
        });
    }
    let ppi = l.ppi as usize;
    let mut blocks: BTreeMap<(u8, u64), (DiskAddress, IndirectBlock)> = BTreeMap::new();
    for (&u, &da) in units {
        let mut child = da;
        for level in 1..=depth {
            let index = u / l.span(level);
            let slot = ((u / l.span(level - 1)) % l.ppi) as usize;
            let entry = match blocks.entry((level, index)) {
                std::collections::btree_map::Entry::Occupied(o) => {
                    o.into_mut().1.pointers[slot] = child;
                    break;
                }
                std::collections::btree_map::Entry::Vacant(v) => {
                    let at = alloc
                        .allocate(Use::Metadata, l.indirect_subblocks())
                        .ok_or("no space left for an indirect block")?;
                    let mut b = IndirectBlock::new(IndirectId { ino, level, index }, ppi);
                    b.pointers[slot] = child;
                    v.insert((at, b));
                    at
                }
            };
            child = entry;
            if level == depth {
                pointers[index as usize] = entry;
            }
        }
    }
    let mut writes = Vec::new();
    let mut indirect = Vec::new();
    for (at, b) in blocks.into_values() {
        writes.push((at, b.encode(l.geo.indirect_bytes), BufferType::Indirect));
        indirect.push(at);
    }
    Ok(BuiltTree {
        pointers,
        depth,
        writes,
        indirect,
    })
}

/// A directory ready to install: the inode fields and the blocks to write.
pub struct BuiltDir {
    pub content: InodeContent,
    pub size: u64,
    pub depth: u8,
    pub subblocks: u64,
    pub entries: u64,
    pub writes: Vec<BlockWrite>,
    /// Every allocation the directory holds now: (address, subblocks).
    pub extents: Vec<(DiskAddress, u32)>,
}

/// Give every entry a cookie on its name's probe chain, in a stable order.
fn place(entries: Vec<NewEntry>) -> Vec<DirEntry> {
    let mut keyed: Vec<(u64, NewEntry)> = entries
        .into_iter()
        .map(|e| (home_cookie(&e.name), e))
        .collect();
    keyed.sort_by(|a, b| (a.0, &a.1.name).cmp(&(b.0, &b.1.name)));
    let mut used = BTreeSet::new();
    let mut out = Vec::with_capacity(keyed.len());
    for (home, e) in keyed {
        let mut c = home;
        while used.contains(&c) {
            c += 1;
        }
        assert!(c <= COOKIE_MAX, "cookie space exhausted");
        used.insert(c);
        out.push(DirEntry {
            cookie: c,
            ino: e.ino,
            kind: e.kind,
            name: e.name,
        });
    }
    out.sort_by_key(|e| e.cookie);
    out
}

/// Split `entries` (sorted by cookie) into hash blocks: (index, depth, entries).
fn split(
    l: &Layout,
    index: u64,
    depth: u8,
    entries: Vec<DirEntry>,
    out: &mut Vec<(u64, u8, Vec<DirEntry>)>,
) -> Result<(), String> {
    let capacity = l.dir_block_bytes() as u32;
    // A block fits when every one of its pages does (each page holds the entries of
    // its slice of the block's cookie range).
    let mut used = vec![0usize; pages(capacity) as usize];
    for e in &entries {
        used[page_of(index, depth, capacity, e.cookie) as usize] += e.encoded_len();
    }
    if used.iter().all(|&u| u <= page_room(capacity)) {
        out.push((index, depth, entries));
        return Ok(());
    }
    if depth >= 62 {
        return Err("directory hash tree at its deepest".into());
    }
    // Cookies whose next bit (from the top of 63) is set go to the right block.
    let bit = 62 - depth as u32;
    let (right, left): (Vec<DirEntry>, Vec<DirEntry>) = entries
        .into_iter()
        .partition(|e| (e.cookie >> bit) & 1 == 1);
    split(l, index, depth + 1, left, out)?;
    split(l, index + (1u64 << depth), depth + 1, right, out)
}

/// Build directory `ino` holding `entries`, inline when they fit in `inline_room`.
pub fn build_dir(
    l: &Layout,
    alloc: &mut RepairAllocator,
    ino: u64,
    entries: Vec<NewEntry>,
    inline_room: usize,
) -> Result<BuiltDir, String> {
    let placed = place(entries);
    let count = placed.len() as u64;
    if entries_encoded_len(&placed) <= inline_room {
        return Ok(BuiltDir {
            content: InodeContent::InlineDir(placed),
            size: 0,
            depth: 0,
            subblocks: 0,
            entries: count,
            writes: Vec::new(),
            extents: Vec::new(),
        });
    }
    let mut blocks = Vec::new();
    split(l, 0, 0, placed, &mut blocks)?;
    let global = blocks.iter().map(|b| b.1).max().unwrap_or(0);
    let sub = l.unit_subblocks(true);
    let mut writes = Vec::new();
    let mut extents = Vec::new();
    let mut units = BTreeMap::new();
    for (index, depth, entries) in blocks {
        let da = alloc
            .allocate(Use::Metadata, sub)
            .ok_or("no space left for a directory block")?;
        let block = DirBlock {
            id: DirBlockId { ino, index },
            depth,
            capacity_bytes: l.dir_block_bytes() as u32,
            entries,
        };
        writes.push((da, block.encode(), BufferType::Directory));
        extents.push((da, sub));
        units.insert(index, da);
    }
    let tree = build_tree(l, alloc, ino, &units)?;
    extents.extend(tree.indirect.iter().map(|&d| (d, l.indirect_subblocks())));
    writes.extend(tree.writes);
    let subblocks = extents.iter().map(|e| e.1 as u64).sum();
    Ok(BuiltDir {
        content: InodeContent::Pointers(tree.pointers),
        size: l.dir_block_bytes() << global,
        depth: tree.depth,
        subblocks,
        entries: count,
        writes,
        extents,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::space::Bitmap;
    use mako_format::dir_block::cookie_range;
    use mako_fs::test_util::test_descriptor;

    #[test]
    fn hashed_directory_tiles_and_keeps_chains() {
        let mut desc = test_descriptor(1, 64 << 20, 64 << 10);
        desc.geometry.indirect_bytes = 4096;
        let l = Layout::new(&desc);
        let mut a = RepairAllocator::new(&l, Bitmap::new(&l));
        let entries: Vec<NewEntry> = (0..20_000)
            .map(|i| NewEntry {
                name: format!("entry-{i}").into_bytes(),
                ino: 100 + i,
                kind: 8,
            })
            .collect();
        let d = build_dir(&l, &mut a, 42, entries, 3000).unwrap();
        assert_eq!(d.entries, 20_000);
        let n = d.size / l.dir_block_bytes();
        assert!(n.is_power_of_two() && n >= 8, "{n} blocks");
        // Decode what would be written and check the tiling.
        let mut ranges = Vec::new();
        let mut total = 0;
        for (_, bytes, t) in &d.writes {
            if *t != BufferType::Directory {
                continue;
            }
            let idx = u64::from_le_bytes(bytes[18..26].try_into().unwrap());
            let b = DirBlock::decode(
                bytes,
                DirBlockId {
                    ino: 42,
                    index: idx,
                },
                mako_format::error::Location::Memory,
            )
            .unwrap();
            total += b.entries.len();
            ranges.push(cookie_range(idx, b.depth));
        }
        assert_eq!(total, 20_000);
        ranges.sort();
        assert_eq!(ranges[0].0, 0);
        for w in ranges.windows(2) {
            assert_eq!(w[0].1 + 1, w[1].0, "blocks tile the cookie space");
        }
        assert_eq!(ranges.last().unwrap().1, COOKIE_MAX);
        let small = build_dir(
            &l,
            &mut a,
            43,
            vec![NewEntry {
                name: b"a".to_vec(),
                ino: 7,
                kind: 8,
            }],
            3000,
        )
        .unwrap();
        assert!(matches!(small.content, InodeContent::InlineDir(ref e) if e.len() == 1));
    }

    #[test]
    fn trees_address_every_unit() {
        let mut desc = test_descriptor(1, 64 << 20, 64 << 10);
        desc.geometry.indirect_bytes = 4096;
        let l = Layout::new(&desc);
        let mut a = RepairAllocator::new(&l, Bitmap::new(&l));
        let units: BTreeMap<u64, DiskAddress> = [0u64, 63, 64, 700, 1500]
            .iter()
            .map(|&u| (u, l.da(0, 10_000 + u)))
            .collect();
        let t = build_tree(&l, &mut a, 9, &units).unwrap();
        assert_eq!(t.depth, 1);
        // Follow each unit through the built blocks.
        let blocks: BTreeMap<DiskAddress, IndirectBlock> = t
            .writes
            .iter()
            .map(|(da, b, _)| {
                let level = b[10];
                let index = u64::from_le_bytes(b[20..28].try_into().unwrap());
                (
                    *da,
                    IndirectBlock::decode(
                        b,
                        4096,
                        IndirectId {
                            ino: 9,
                            level,
                            index,
                        },
                        mako_format::error::Location::Memory,
                    )
                    .unwrap(),
                )
            })
            .collect();
        for (&u, &da) in &units {
            let top = t.pointers[(u / l.ppi) as usize];
            assert_eq!(blocks[&top].pointers[(u % l.ppi) as usize], da, "unit {u}");
        }
    }
}
