//! Extended attributes of a file: the one place that reads and changes them. They live
//! in the inode while they fit (`Inode::xattrs`); the others in xattr blocks listed by
//! an xattr index block (`mako_format::xattr`), loaded on first use and kept with the
//! cached inode (`InodeState::xattr`).
//!
//! Limits, per file (`XATTR_*` below; Linux's are per value and per list):
//! - a name is 1..=255 bytes, a value at most 64 KiB (XATTR_SIZE_MAX);
//! - the names, as listxattr returns them (each with its NUL), at most 64 KiB
//!   (XATTR_LIST_MAX): listxattr always fits the largest buffer the kernel allows;
//! - names and values together at most 256 KiB.
//!   A setxattr past a limit fails with ENOSPC and changes nothing (a value over
//!   64 KiB never gets here: the kernel refuses it with E2BIG).
//!
//! Invariants:
//! - A refused change (a limit, no space for a block) changes nothing: every check and
//!   every allocation is made before the first change.
//! - The inode, its index and its xattr blocks change in one transaction; xattr blocks
//!   are metadata: logged as images, written in place by checkpoints, freed through the
//!   allocation map's quarantine. Their subblocks count in `Inode::subblocks`.
//! - Blocks are packed deterministically (`mako_format::xattr::pack`); a change logs
//!   only the blocks whose pieces changed, and the index.

use crate::alloc_map::AllocKind;
use crate::core::{Core, InodeState};
use crate::error::{FsError, FsResult};
use mako_disk::nsd::IoTag;
use mako_disk::BufferType;
use mako_format::error::Location;
use mako_format::inode::{payload_bytes, xattrs_encoded_len};
use mako_format::log_record::LogImage;
use mako_format::xattr::{
    assemble, index_capacity, pack, Xattr, XattrBlock, XattrIndex, XattrPiece,
};
use mako_format::{DiskAddress, FormatError};
use std::sync::atomic::Ordering;

pub use mako_format::xattr::{XATTR_NAME_BYTES_MAX, XATTR_VALUE_BYTES_MAX};

/// Names of one file's attributes as listxattr returns them, NULs included
/// (Linux XATTR_LIST_MAX).
pub const XATTR_LIST_BYTES_MAX: usize = 65536;
/// Names and values of one file's attributes together.
pub const XATTR_BYTES_MAX: usize = 256 * 1024;
/// Unit number under which xattr blocks are allocated (only the disk choice uses it).
const XATTR_UNIT: u64 = u64::MAX - 64;

/// Upper bound of the log images a change of `value_bytes` to the attributes of the
/// inode in `st` makes: its xattr blocks as they are (a change rewrites at most all of
/// them), the blocks the new value may add, and the index. Reading them (if they are
/// not cached) is the price of knowing; if that fails, `log_bytes_max`.
pub fn log_bytes_for(core: &Core, st: &InodeState, value_bytes: usize) -> u64 {
    let bb = core.geo.xattr_block_bytes() as usize;
    let room = mako_format::xattr::block_room(bb as u32);
    match with_overflow(core, st, |o| o.blocks.len()) {
        Ok(n) => ((n + value_bytes.div_ceil(room) + 2) * bb) as u64,
        Err(_) => log_bytes_max(core),
    }
}

/// Upper bound of the log images one change of a file's attributes makes: every
/// xattr block its attributes can take (the pieces of 256 KiB of names and values,
/// and the overhead of as many attributes as 64 KiB of names allow), and the index.
/// Changes open their transaction with room for their images (`Journal::begin_for`).
pub fn log_bytes_max(core: &Core) -> u64 {
    let bb = core.geo.xattr_block_bytes() as usize;
    let room = mako_format::xattr::block_room(bb as u32);
    let attrs = XATTR_LIST_BYTES_MAX / 2;
    let bytes = XATTR_BYTES_MAX + attrs * mako_format::xattr::XATTR_PIECE_OVERHEAD_BYTES;
    ((bytes.div_ceil(room) + 2) * bb) as u64
}

/// One xattr block of a cached inode.
pub struct XattrNode {
    pub da: DiskAddress,
    pub pieces: Vec<XattrPiece>,
    /// Changed since the last commit.
    pub dirty: bool,
}

/// The attributes of a cached inode that live outside it, with their blocks.
#[derive(Default)]
pub struct Overflow {
    pub attrs: Vec<Xattr>,
    pub blocks: Vec<XattrNode>,
    /// The index changed since the last commit.
    pub index_dirty: bool,
}

fn corrupt(core: &Core, st: &InodeState, e: FormatError) -> FsError {
    core.stats.corruptions.fetch_add(1, Ordering::Relaxed);
    tracing::error!("{e} (extended attributes of inode {})", st.inode.ino);
    FsError::from(e)
}

fn read_block(core: &Core, ino: u64, da: DiskAddress) -> FsResult<Vec<u8>> {
    let mut buf = vec![0u8; core.geo.xattr_block_bytes() as usize];
    core.read_metadata(
        da,
        &mut buf,
        IoTag {
            buffer_type: BufferType::Xattr,
            ino,
        },
    )?;
    Ok(buf)
}

fn read_index(core: &Core, st: &InodeState) -> FsResult<XattrIndex> {
    let (ino, da) = (st.inode.ino, st.inode.xattr_index);
    let bytes = read_block(core, ino, da)?;
    XattrIndex::decode(
        &bytes,
        core.geo.xattr_block_bytes(),
        ino,
        Location::Disk(da),
    )
    .map_err(|e| corrupt(core, st, e))
}

fn load(core: &Core, st: &InodeState) -> FsResult<Overflow> {
    if st.inode.xattr_index.is_null() {
        return Ok(Overflow::default());
    }
    let ino = st.inode.ino;
    let bb = core.geo.xattr_block_bytes();
    let index = read_index(core, st)?;
    let mut blocks = Vec::with_capacity(index.blocks.len());
    for (k, &da) in index.blocks.iter().enumerate() {
        let bytes = read_block(core, ino, da)?;
        let b = XattrBlock::decode(&bytes, bb, ino, k as u32, Location::Disk(da))
            .map_err(|e| corrupt(core, st, e))?;
        blocks.push(b);
    }
    let attrs = assemble(&blocks)
        .ok()
        .filter(|a| a.len() == index.attrs as usize)
        .ok_or_else(|| {
            let why = match assemble(&blocks) {
                Err(e) => e,
                Ok(a) => format!(
                    "the index counts {} attributes, the blocks hold {}",
                    index.attrs,
                    a.len()
                ),
            };
            corrupt(
                core,
                st,
                FormatError::invalid(
                    "xattr index block",
                    Location::Disk(st.inode.xattr_index),
                    format!("inode {ino}: {why}"),
                ),
            )
        })?;
    Ok(Overflow {
        attrs,
        blocks: index
            .blocks
            .iter()
            .zip(blocks)
            .map(|(&da, b)| XattrNode {
                da,
                pieces: b.pieces,
                dirty: false,
            })
            .collect(),
        index_dirty: false,
    })
}

/// Run `f` on the attributes outside the inode, loading them on first use.
fn with_overflow<R>(core: &Core, st: &InodeState, f: impl FnOnce(&Overflow) -> R) -> FsResult<R> {
    let mut g = st.xattr.lock();
    if g.is_none() {
        *g = Some(load(core, st)?);
    }
    Ok(f(g.as_ref().expect("loaded")))
}

/// The value of attribute `name`, if the file has it.
pub fn get(core: &Core, st: &InodeState, name: &[u8]) -> FsResult<Option<Vec<u8>>> {
    if let Some((_, v)) = st.inode.xattrs.iter().find(|(n, _)| n == name) {
        return Ok(Some(v.clone()));
    }
    with_overflow(core, st, |o| {
        o.attrs
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.clone())
    })
}

/// Every attribute name, each followed by a NUL (the listxattr format).
pub fn list(core: &Core, st: &InodeState) -> FsResult<Vec<u8>> {
    let mut out = Vec::new();
    for (n, _) in &st.inode.xattrs {
        out.extend_from_slice(n);
        out.push(0);
    }
    with_overflow(core, st, |o| {
        for (n, _) in &o.attrs {
            out.extend_from_slice(n);
            out.push(0);
        }
    })?;
    Ok(out)
}

/// Every attribute (in the inode, then outside it).
pub fn all(core: &Core, st: &InodeState) -> FsResult<Vec<Xattr>> {
    let mut out = st.inode.xattrs.clone();
    with_overflow(core, st, |o| out.extend(o.attrs.iter().cloned()))?;
    Ok(out)
}

/// Set attribute `name` (`flags`: XATTR_CREATE, XATTR_REPLACE). On any error nothing
/// has changed.
pub fn set(
    core: &Core,
    st: &mut InodeState,
    name: &[u8],
    value: &[u8],
    flags: i32,
) -> FsResult<()> {
    let ino = st.inode.ino;
    let outside = with_overflow(core, st, |o| o.attrs.clone())?;
    let in_inode = st.inode.xattrs.iter().position(|(n, _)| n == name);
    let in_blocks = outside.iter().position(|(n, _)| n == name);
    let exists = in_inode.is_some() || in_blocks.is_some();
    if exists && flags & libc::XATTR_CREATE != 0 {
        return Err(FsError::Exists(String::from_utf8_lossy(name).into_owned()));
    }
    if !exists && flags & libc::XATTR_REPLACE != 0 {
        return Err(FsError::NoAttr);
    }
    if value.len() > XATTR_VALUE_BYTES_MAX {
        return Err(FsError::TooBig(format!(
            "xattr value of {} bytes (at most {XATTR_VALUE_BYTES_MAX})",
            value.len()
        )));
    }
    // The limits, counted over every attribute as they would be after the change.
    let old = in_inode
        .map(|i| &st.inode.xattrs[i])
        .or_else(|| in_blocks.map(|i| &outside[i]));
    let (names, bytes) = st
        .inode
        .xattrs
        .iter()
        .chain(outside.iter())
        .fold((0usize, 0usize), |(n, b), (k, v)| {
            (n + k.len() + 1, b + k.len() + v.len())
        });
    let (old_names, old_bytes) = old.map_or((0, 0), |(k, v)| (k.len() + 1, k.len() + v.len()));
    let names = names - old_names + name.len() + 1;
    let bytes = bytes - old_bytes + name.len() + value.len();
    if names > XATTR_LIST_BYTES_MAX {
        return Err(FsError::NoSpace(format!(
            "the names of inode {ino}'s extended attributes would take {names} bytes as listxattr \
             returns them; at most {XATTR_LIST_BYTES_MAX} (XATTR_LIST_MAX)"
        )));
    }
    if bytes > XATTR_BYTES_MAX {
        return Err(FsError::NoSpace(format!(
            "inode {ino}'s extended attributes would take {bytes} bytes (names and values); \
             at most {XATTR_BYTES_MAX} per file"
        )));
    }
    // Where it goes: the inode when it fits there (with everything else the inode
    // holds), else the xattr blocks — in place of its old value there, or at the end.
    let mut inline = st.inode.xattrs.clone();
    if let Some(i) = in_inode {
        inline.remove(i);
    }
    let record = (name.to_vec(), value.to_vec());
    let room = payload_bytes(core.inode_bytes())
        .saturating_sub(xattrs_encoded_len(&inline) + st.inode.content_len(core.inode_bytes()));
    let mut blocks = outside.clone();
    if xattrs_encoded_len(std::slice::from_ref(&record)) <= room && value.len() <= u16::MAX as usize
    {
        if let Some(i) = in_blocks {
            blocks.remove(i);
        }
        inline.push(record);
    } else {
        match in_blocks {
            Some(i) => blocks[i] = record,
            None => blocks.push(record),
        }
    }
    if blocks != outside {
        rewrite(core, st, blocks)?;
    }
    st.inode.xattrs = inline;
    st.mark_dirty();
    Ok(())
}

/// Remove attribute `name`.
pub fn remove(core: &Core, st: &mut InodeState, name: &[u8]) -> FsResult<()> {
    if let Some(i) = st.inode.xattrs.iter().position(|(n, _)| n == name) {
        st.inode.xattrs.remove(i);
        st.mark_dirty();
        return Ok(());
    }
    let mut blocks = with_overflow(core, st, |o| o.attrs.clone())?;
    let i = blocks
        .iter()
        .position(|(n, _)| n == name)
        .ok_or(FsError::NoAttr)?;
    blocks.remove(i);
    rewrite(core, st, blocks)?;
    st.mark_dirty();
    Ok(())
}

/// Give the attributes outside the inode a new content: pack them, allocate what is
/// missing (before anything changes), then change the blocks whose pieces differ and
/// free those no longer needed.
fn rewrite(core: &Core, st: &mut InodeState, attrs: Vec<Xattr>) -> FsResult<()> {
    let ino = st.inode.ino;
    let bb = core.geo.xattr_block_bytes();
    let xsb = core.geo.xattr_block_subblocks();
    let packed = pack(&attrs, bb);
    if packed.len() > index_capacity(bb) {
        // The limits above keep far below this; a refusal is still better than a panic.
        return Err(FsError::NoSpace(format!(
            "inode {ino}'s extended attributes need {} xattr blocks, an index lists {}",
            packed.len(),
            index_capacity(bb)
        )));
    }
    let mut ov = st.xattr.lock().take().unwrap_or_default();
    let old_n = ov.blocks.len();
    let new_n = packed.len();
    let need_index = new_n > 0 && st.inode.xattr_index.is_null();
    let want = new_n.saturating_sub(old_n) + usize::from(need_index);
    let mut fresh = Vec::with_capacity(want);
    for _ in 0..want {
        match core
            .alloc
            .allocate(AllocKind::Metadata, xsb, ino, XATTR_UNIT)
        {
            Ok(da) => fresh.push(da),
            Err(e) => {
                // Allocated by this operation only: freed at once, nothing changed.
                for da in fresh {
                    core.alloc.free(da, xsb, st.inode.ino)?;
                }
                *st.xattr.lock() = Some(ov);
                return Err(e);
            }
        }
    }
    // From here on nothing is refused.
    let mut dirty_units = 0u64;
    let mut blocks = Vec::with_capacity(new_n);
    let mut old = std::mem::take(&mut ov.blocks).into_iter();
    for pieces in packed {
        match old.next() {
            Some(mut node) => {
                if node.pieces != pieces {
                    node.pieces = pieces;
                    if !std::mem::replace(&mut node.dirty, true) {
                        dirty_units += 1;
                    }
                }
                blocks.push(node);
            }
            None => {
                blocks.push(XattrNode {
                    da: fresh.pop().expect("allocated"),
                    pieces,
                    dirty: true,
                });
                dirty_units += 1;
            }
        }
    }
    let mut freed = 0u64;
    for node in old {
        core.alloc.free(node.da, xsb, ino)?;
        freed += 1;
    }
    let allocated = want as u64;
    if new_n == 0 {
        if !st.inode.xattr_index.is_null() {
            core.alloc.free(st.inode.xattr_index, xsb, st.inode.ino)?;
            freed += 1;
            st.inode.xattr_index = DiskAddress::NULL;
        }
        ov.index_dirty = false;
    } else {
        if need_index {
            st.inode.xattr_index = fresh.pop().expect("allocated");
        }
        if !std::mem::replace(&mut ov.index_dirty, true) {
            dirty_units += 1;
        }
    }
    ov.blocks = blocks;
    ov.attrs = attrs;
    st.inode.subblocks =
        (st.inode.subblocks + allocated * xsb as u64).saturating_sub(freed * xsb as u64);
    *st.xattr.lock() = Some(ov);
    for _ in 0..dirty_units {
        st.mark_unit_dirty(bb as u64);
    }
    st.mark_dirty();
    Ok(())
}

/// Free the index and xattr blocks of an inode being freed (its attributes are gone).
pub fn free_all(core: &Core, st: &mut InodeState) -> FsResult<()> {
    if st.inode.xattr_index.is_null() {
        return Ok(());
    }
    let xsb = core.geo.xattr_block_subblocks();
    let blocks: Vec<DiskAddress> = match st.xattr.lock().take() {
        Some(ov) => ov.blocks.iter().map(|n| n.da).collect(),
        None => read_index(core, st)?.blocks,
    };
    for da in blocks {
        core.alloc.free(da, xsb, st.inode.ino)?;
    }
    core.alloc.free(st.inode.xattr_index, xsb, st.inode.ino)?;
    st.inode.xattr_index = DiskAddress::NULL;
    st.inode.xattrs.clear();
    Ok(())
}

/// Log images of the index and the changed xattr blocks (the commit's snapshot).
pub fn take_images(core: &Core, st: &InodeState, out: &mut Vec<(BufferType, u64, LogImage)>) {
    let mut g = st.xattr.lock();
    let Some(ov) = g.as_mut() else {
        return;
    };
    let ino = st.inode.ino;
    let bb = core.geo.xattr_block_bytes();
    for (k, node) in ov.blocks.iter_mut().enumerate() {
        if std::mem::replace(&mut node.dirty, false) {
            let block = XattrBlock {
                ino,
                index: k as u32,
                pieces: node.pieces.clone(),
            };
            out.push((
                BufferType::Xattr,
                ino,
                LogImage::from_vec(node.da, block.encode(bb)),
            ));
        }
    }
    if std::mem::replace(&mut ov.index_dirty, false) && !st.inode.xattr_index.is_null() {
        let index = XattrIndex {
            ino,
            attrs: ov.attrs.len() as u32,
            blocks: ov.blocks.iter().map(|n| n.da).collect(),
        };
        out.push((
            BufferType::Xattr,
            ino,
            LogImage::from_vec(st.inode.xattr_index, index.encode(bb)),
        ));
    }
}
