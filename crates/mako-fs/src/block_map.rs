//! The block map of a file: unit index -> disk address, through block pointers in the
//! inode and a tree of indirect blocks whose depth grows with the file (DESIGN.md 3.3).
//!
//! A unit is a data block for files and metadata files, and a directory block for
//! directories. Null pointers are holes. Growing the tree keeps every existing
//! indirect block's identity: the old top level becomes child 0.. of the new root,
//! whose child indices equal the old inode slots.

use crate::alloc_map::AllocKind;
use crate::core::{Core, IndNode, InodeState};
use crate::error::{FsError, FsResult};
use mako_disk::nsd::IoTag;
use mako_disk::BufferType;
use mako_format::error::Location;
use mako_format::indirect::{IndirectBlock, IndirectId};
use mako_format::inode::{pointers_in_inode, Inode, InodeContent};
use mako_format::DiskAddress;
use std::sync::atomic::Ordering;

/// Deepest tree we build; with 32 KiB indirect blocks depth 3 already maps exabytes.
pub const DEPTH_MAX: u8 = 5;

// Every file size up to the format's largest is mappable, so a write the size checks
// accept never meets "beyond the largest file" in write-behind: the smallest geometry
// (512-byte inodes with 16 pointers, 4 KiB indirect blocks, 64 KiB blocks) at DEPTH_MAX
// covers FILE_BYTES_MAX.
const _: () = {
    let per_indirect = ((4096 - mako_format::indirect::INDIRECT_HEADER_BYTES) / 8) as u128;
    let units = 16 * per_indirect.pow(DEPTH_MAX as u32);
    assert!(units * 65536 >= mako_format::inode::FILE_BYTES_MAX as u128);
};

pub fn is_dir(inode: &Inode) -> bool {
    inode.mode & 0o170000 == 0o040000
}

/// Bytes of one unit of this inode.
pub fn unit_bytes(core: &Core, inode: &Inode) -> u64 {
    if is_dir(inode) {
        core.geo.dir_block_bytes() as u64
    } else {
        core.block_bytes()
    }
}

/// Subblocks a full unit takes.
pub fn unit_subblocks(core: &Core, inode: &Inode) -> u32 {
    (unit_bytes(core, inode) / core.geo.subblock_bytes() as u64) as u32
}

pub fn last_unit(core: &Core, inode: &Inode) -> Option<u64> {
    if inode.size == 0 {
        None
    } else {
        Some((inode.size - 1) / unit_bytes(core, inode))
    }
}

/// Subblocks currently allocated to `unit` (assuming it is allocated).
pub fn allocated_subblocks(core: &Core, st: &InodeState, unit: u64) -> u32 {
    if let Some(s) = &st.shared {
        if let Some((_, sb)) = s.blocks.get(&unit) {
            return *sb;
        }
    }
    if Some(unit) == last_unit(core, &st.inode) && st.inode.last_block_subblocks != 0 {
        st.inode.last_block_subblocks as u32
    } else {
        unit_subblocks(core, &st.inode)
    }
}

fn ppi(core: &Core) -> u64 {
    core.geo.pointers_per_indirect()
}

fn capacity(core: &Core, depth: u8) -> u64 {
    let n = pointers_in_inode(core.inode_bytes()) as u64;
    let p = ppi(core);
    let mut c = n;
    for _ in 0..depth {
        c = c.saturating_mul(p);
    }
    c
}

/// Units one pointer at `level` covers (level 0 = a data unit).
fn span(core: &Core, level: u8) -> u64 {
    let p = ppi(core);
    let mut s: u64 = 1;
    for _ in 0..level {
        s = s.saturating_mul(p);
    }
    s
}

fn inode_pointers(inode: &Inode) -> &[DiskAddress] {
    match &inode.content {
        InodeContent::Pointers(p) => p,
        _ => &[],
    }
}

fn load_indirect(core: &Core, st: &InodeState, id: IndirectId, da: DiskAddress) -> FsResult<()> {
    let mut cache = st.indirect.lock();
    if cache.contains_key(&(id.level, id.index)) {
        return Ok(());
    }
    let mut buf = vec![0u8; core.geo.indirect_bytes as usize];
    core.read_metadata(
        da,
        &mut buf,
        IoTag {
            buffer_type: BufferType::Indirect,
            ino: id.ino,
        },
    )?;
    let block = IndirectBlock::decode(&buf, core.geo.indirect_bytes, id, Location::Disk(da))
        .map_err(|e| {
            core.stats.corruptions.fetch_add(1, Ordering::Relaxed);
            tracing::error!("{e} (inode {})", id.ino);
            FsError::from(e)
        })?;
    // A checksum-valid block whose pointers leave the disks is damage all the same
    // (a bug that wrote it, or a misdirected write of a valid block): never followed.
    for ptr in &block.pointers {
        core.check_pointer(*ptr, "indirect block", id.ino, da)?;
    }
    cache.insert(
        (id.level, id.index),
        IndNode {
            block,
            da,
            dirty: false,
        },
    );
    Ok(())
}

/// Disk address of `unit`, or NULL for a hole. A shared writer (see `metanode`) answers
/// from what the metanode told it; a unit it does not know yet is `FsError::NeedBlocks`
/// (the operation fetches it with no lock held and starts again).
pub fn lookup(core: &Core, st: &InodeState, unit: u64) -> FsResult<DiskAddress> {
    if let Some(s) = &st.shared {
        return match s.blocks.get(&unit) {
            Some((da, _)) => Ok(*da),
            None => Err(FsError::need_blocks(st.inode.ino, unit)),
        };
    }
    let inode = &st.inode;
    let depth = inode.depth;
    if unit >= capacity(core, depth) {
        return Ok(DiskAddress::NULL);
    }
    let ptrs = inode_pointers(inode);
    let top = (unit / span(core, depth)) as usize;
    let mut ptr = ptrs.get(top).copied().unwrap_or(DiskAddress::NULL);
    for level in (1..=depth).rev() {
        if ptr.is_null() {
            return Ok(DiskAddress::NULL);
        }
        let index = unit / span(core, level);
        let id = IndirectId {
            ino: inode.ino,
            level,
            index,
        };
        load_indirect(core, st, id, ptr)?;
        let slot = ((unit / span(core, level - 1)) % ppi(core)) as usize;
        ptr = st.indirect.lock()[&(level, index)].block.pointers[slot];
    }
    Ok(ptr)
}

/// Grow the tree until `unit` fits.
fn grow_to(core: &Core, st: &mut InodeState, unit: u64) -> FsResult<()> {
    if !matches!(st.inode.content, InodeContent::Pointers(_)) {
        st.inode.content = InodeContent::Pointers(vec![
            DiskAddress::NULL;
            pointers_in_inode(core.inode_bytes())
        ]);
    }
    while unit >= capacity(core, st.inode.depth) {
        if st.inode.depth >= DEPTH_MAX {
            return Err(FsError::TooBig(format!(
                "inode {}: unit {unit} beyond the largest file",
                st.inode.ino
            )));
        }
        let new_level = st.inode.depth + 1;
        let ino = st.inode.ino;
        let old: Vec<DiskAddress> = inode_pointers(&st.inode).to_vec();
        let any = old.iter().any(|d| !d.is_null());
        let n = old.len();
        if any {
            let id = IndirectId {
                ino,
                level: new_level,
                index: 0,
            };
            let mut block = IndirectBlock::new(id, ppi(core) as usize);
            block.pointers[..n].copy_from_slice(&old);
            let da = core.alloc.allocate(
                AllocKind::Metadata,
                core.geo.indirect_subblocks(),
                ino,
                u64::MAX - new_level as u64,
            )?;
            st.inode.subblocks += core.geo.indirect_subblocks() as u64;
            st.indirect.lock().insert(
                (new_level, 0),
                IndNode {
                    block,
                    da,
                    dirty: true,
                },
            );
            st.mark_unit_dirty(core.geo.indirect_bytes as u64);
            let mut p = vec![DiskAddress::NULL; n];
            p[0] = da;
            st.inode.content = InodeContent::Pointers(p);
        }
        st.inode.depth = new_level;
        st.mark_dirty();
    }
    Ok(())
}

/// Point `unit` at `da` (NULL punches a hole). Allocates indirect blocks on the way.
/// A shared writer records the change for the metanode instead (always a whole unit).
pub fn set(core: &Core, st: &mut InodeState, unit: u64, da: DiskAddress) -> FsResult<()> {
    let full = unit_subblocks(core, &st.inode);
    if let Some(s) = st.shared.as_mut() {
        let old = s
            .blocks
            .get(&unit)
            .map(|(d, _)| *d)
            .ok_or_else(|| FsError::need_blocks(st.inode.ino, unit))?;
        // Relative to what the metanode last knew: an unreported earlier move of this
        // unit keeps its `old`, and the block it moved to (never reported, so never
        // referenced) goes back to this node's own map.
        let mut first_old = old.raw();
        if let Some(i) = s.pending.iter().position(|p| p.unit == unit) {
            let earlier = s.pending.remove(i);
            first_old = earlier.old;
            let unreported = DiskAddress::from_raw(earlier.new);
            if !unreported.is_null() && unreported != da {
                core.alloc
                    .free(unreported, earlier.subblocks, st.inode.ino)?;
            }
        }
        s.pending.push(crate::metanode::SetBlock {
            unit,
            old: first_old,
            new: da.raw(),
            subblocks: full,
        });
        s.blocks.insert(unit, (da, full));
        return Ok(());
    }
    if da.is_null() && unit >= capacity(core, st.inode.depth) {
        return Ok(());
    }
    grow_to(core, st, unit)?;
    let depth = st.inode.depth;
    let ino = st.inode.ino;
    let top = (unit / span(core, depth)) as usize;
    if depth == 0 {
        if let InodeContent::Pointers(p) = &mut st.inode.content {
            p[top] = da;
        }
        st.mark_dirty();
        return Ok(());
    }
    // Walk down, creating missing indirect blocks (unless we are clearing).
    let mut parent_ptr = inode_pointers(&st.inode)[top];
    for level in (1..=depth).rev() {
        let index = unit / span(core, level);
        let id = IndirectId { ino, level, index };
        if parent_ptr.is_null() {
            if da.is_null() {
                return Ok(());
            }
            let nda = core.alloc.allocate(
                AllocKind::Metadata,
                core.geo.indirect_subblocks(),
                ino,
                index,
            )?;
            st.inode.subblocks += core.geo.indirect_subblocks() as u64;
            st.indirect.lock().insert(
                (level, index),
                IndNode {
                    block: IndirectBlock::new(id, ppi(core) as usize),
                    da: nda,
                    dirty: true,
                },
            );
            st.mark_unit_dirty(core.geo.indirect_bytes as u64);
            // Link it into its parent.
            if level == depth {
                if let InodeContent::Pointers(p) = &mut st.inode.content {
                    p[top] = nda;
                }
            } else {
                let pindex = unit / span(core, level + 1);
                let pslot = ((unit / span(core, level)) % ppi(core)) as usize;
                let newly = {
                    let mut cache = st.indirect.lock();
                    let parent = cache
                        .get_mut(&(level + 1, pindex))
                        .expect("parent indirect block cached");
                    parent.block.pointers[pslot] = nda;
                    !std::mem::replace(&mut parent.dirty, true)
                };
                if newly {
                    st.mark_unit_dirty(core.geo.indirect_bytes as u64);
                }
            }
            parent_ptr = nda;
        } else {
            load_indirect(core, st, id, parent_ptr)?;
        }
        let slot = ((unit / span(core, level - 1)) % ppi(core)) as usize;
        let newly = {
            let mut cache = st.indirect.lock();
            let node = cache
                .get_mut(&(level, index))
                .expect("indirect block cached");
            if level == 1 {
                node.block.pointers[slot] = da;
                !std::mem::replace(&mut node.dirty, true)
            } else {
                parent_ptr = node.block.pointers[slot];
                false
            }
        };
        if newly {
            st.mark_unit_dirty(core.geo.indirect_bytes as u64);
        }
    }
    st.mark_dirty();
    Ok(())
}

/// Every allocated unit at or after `from`, in order, with its address.
pub fn allocated_from(
    core: &Core,
    st: &InodeState,
    from: u64,
    limit: usize,
) -> FsResult<Vec<(u64, DiskAddress)>> {
    let mut out = Vec::new();
    let depth = st.inode.depth;
    let ptrs: Vec<DiskAddress> = inode_pointers(&st.inode).to_vec();
    let s = span(core, depth);
    for (i, p) in ptrs.iter().enumerate() {
        let base = i as u64 * s;
        if p.is_null() || base.saturating_add(s) <= from {
            continue;
        }
        walk(core, st, depth, i as u64, *p, base, from, limit, &mut out)?;
        if out.len() >= limit {
            break;
        }
    }
    Ok(out)
}

/// The first unit at or after `from` that no pointer maps (a hole), or `limit` when
/// every unit from `from` up to `limit` is mapped. Walks the tree: a null pointer at
/// any level answers for its whole subtree, so a hole of terabytes costs a few
/// pointer checks per level, and a run of mapped units a scan of their pointers.
pub fn first_hole_from(core: &Core, st: &InodeState, from: u64, limit: u64) -> FsResult<u64> {
    if from >= limit {
        return Ok(limit);
    }
    let depth = st.inode.depth;
    let ptrs: Vec<DiskAddress> = inode_pointers(&st.inode).to_vec();
    let s = span(core, depth);
    for (i, p) in ptrs.iter().enumerate() {
        let base = (i as u64).saturating_mul(s);
        if base.saturating_add(s) <= from {
            continue;
        }
        if base >= limit {
            return Ok(limit);
        }
        if p.is_null() {
            return Ok(base.max(from).min(limit));
        }
        if let Some(h) = hole_below(core, st, depth, i as u64, *p, base, from, limit)? {
            return Ok(h.min(limit));
        }
    }
    // Past what the inode's pointers reach: a hole.
    Ok(capacity(core, depth).max(from).min(limit))
}

/// The first hole at or after `from` (and below `limit`) in the subtree of the mapped
/// pointer `ptr` at `level` covering units from `base`; `None` if it has none there.
#[allow(clippy::too_many_arguments)]
fn hole_below(
    core: &Core,
    st: &InodeState,
    level: u8,
    index: u64,
    ptr: DiskAddress,
    base: u64,
    from: u64,
    limit: u64,
) -> FsResult<Option<u64>> {
    if level == 0 {
        return Ok(None);
    }
    let id = IndirectId {
        ino: st.inode.ino,
        level,
        index,
    };
    load_indirect(core, st, id, ptr)?;
    let children: Vec<DiskAddress> = st.indirect.lock()[&(level, index)].block.pointers.clone();
    let s = span(core, level - 1);
    for (j, c) in children.iter().enumerate() {
        let cbase = base.saturating_add((j as u64).saturating_mul(s));
        if cbase.saturating_add(s) <= from {
            continue;
        }
        if cbase >= limit {
            return Ok(None);
        }
        if c.is_null() {
            return Ok(Some(cbase.max(from)));
        }
        let child = index.saturating_mul(ppi(core)).saturating_add(j as u64);
        if let Some(h) = hole_below(core, st, level - 1, child, *c, cbase, from, limit)? {
            return Ok(Some(h));
        }
    }
    Ok(None)
}

#[allow(clippy::too_many_arguments)]
fn walk(
    core: &Core,
    st: &InodeState,
    level: u8,
    index: u64,
    ptr: DiskAddress,
    base: u64,
    from: u64,
    limit: usize,
    out: &mut Vec<(u64, DiskAddress)>,
) -> FsResult<()> {
    if level == 0 {
        if base >= from {
            out.push((base, ptr));
        }
        return Ok(());
    }
    let id = IndirectId {
        ino: st.inode.ino,
        level,
        index,
    };
    load_indirect(core, st, id, ptr)?;
    let children: Vec<DiskAddress> = st.indirect.lock()[&(level, index)].block.pointers.clone();
    let s = span(core, level - 1);
    for (j, c) in children.iter().enumerate() {
        let cbase = base + j as u64 * s;
        if c.is_null() || cbase.saturating_add(s) <= from {
            continue;
        }
        walk(
            core,
            st,
            level - 1,
            index * ppi(core) + j as u64,
            *c,
            cbase,
            from,
            limit,
            out,
        )?;
        if out.len() >= limit {
            return Ok(());
        }
    }
    Ok(())
}

/// Remove every unit at or after `from` from the map, returning them (with their
/// allocated subblocks) for the caller to free after dropping cached buffers; also
/// frees indirect blocks that no longer map anything.
pub fn cut_from(
    core: &Core,
    st: &mut InodeState,
    from: u64,
) -> FsResult<Vec<(u64, DiskAddress, u32)>> {
    let mut units = Vec::new();
    loop {
        let batch = allocated_from(core, st, from, 4096)?;
        if batch.is_empty() {
            break;
        }
        for (u, da) in batch {
            let n = allocated_subblocks(core, st, u);
            set(core, st, u, DiskAddress::NULL)?;
            units.push((u, da, n));
        }
    }
    prune_indirect(core, st)?;
    Ok(units)
}

/// Free indirect blocks whose pointers are all null, bottom-up, and shrink the depth
/// to zero when the file has no blocks left.
pub fn prune_indirect(core: &Core, st: &mut InodeState) -> FsResult<()> {
    let depth = st.inode.depth;
    if depth == 0 {
        return Ok(());
    }
    // Load the whole tree's nodes that are reachable, then drop the empty ones.
    let ptrs: Vec<DiskAddress> = inode_pointers(&st.inode).to_vec();
    for (i, p) in ptrs.iter().enumerate() {
        if !p.is_null() {
            let mut sink = Vec::new();
            walk(
                core,
                st,
                depth,
                i as u64,
                *p,
                i as u64 * span(core, depth),
                u64::MAX,
                0,
                &mut sink,
            )?;
        }
    }
    let ino = st.inode.ino;
    for level in 1..=depth {
        let empty: Vec<(u64, DiskAddress)> = st
            .indirect
            .lock()
            .iter()
            .filter(|((l, _), n)| *l == level && n.block.pointers.iter().all(|p| p.is_null()))
            .map(|((_, idx), n)| (*idx, n.da))
            .collect();
        for (index, da) in empty {
            st.indirect.lock().remove(&(level, index));
            core.alloc.free(da, core.geo.indirect_subblocks(), ino)?;
            st.inode.subblocks = st
                .inode
                .subblocks
                .saturating_sub(core.geo.indirect_subblocks() as u64);
            if level == depth {
                if let InodeContent::Pointers(p) = &mut st.inode.content {
                    p[index as usize] = DiskAddress::NULL;
                }
            } else {
                let pindex = index / ppi(core);
                let pslot = (index % ppi(core)) as usize;
                let newly = match st.indirect.lock().get_mut(&(level + 1, pindex)) {
                    Some(parent) => {
                        parent.block.pointers[pslot] = DiskAddress::NULL;
                        !std::mem::replace(&mut parent.dirty, true)
                    }
                    None => false,
                };
                if newly {
                    st.mark_unit_dirty(core.geo.indirect_bytes as u64);
                }
            }
            st.mark_dirty();
        }
    }
    if inode_pointers(&st.inode).iter().all(|p| p.is_null()) {
        st.inode.depth = 0;
        debug_assert!(
            st.indirect.lock().is_empty(),
            "inode {ino}: indirect blocks left with an empty root"
        );
    }
    Ok(())
}
