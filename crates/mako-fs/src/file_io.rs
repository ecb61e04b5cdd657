//! File data: reads and writes through the pagepool, data-in-inode, fragments and
//! their promotion, holes, truncation, fallocate, SEEK_DATA/SEEK_HOLE, and writing one
//! dirty block back (write-behind and fsync use the same `flush_block`).
//!
//! Durable-write order for data (ordered mode): a block's data is written before the
//! inode or indirect block that points at it (`flush_inode` writes data first).
//! Bytes past the end of a file always read as zero: when a file grows, the tail of its
//! old last block is zeroed in the pagepool and written back.

use crate::alloc_map::AllocKind;
use crate::block_map;
use crate::core::{Core, InodeHandle, InodeState};
use crate::error::{FsError, FsResult};
use crate::pagepool::DataBuffer;
use mako_disk::nsd::IoTag;
use mako_disk::BufferType;
use mako_disk::{AlignedBuf, IO_ALIGN};
use mako_format::inode::{payload_bytes, pointers_in_inode, xattrs_encoded_len, InodeContent};
use mako_format::DiskAddress;
use mako_token::TokenMode;
use std::sync::atomic::Ordering;

/// Largest file size (bytes): far beyond any disk, bounded so offsets never overflow. The
/// format's own limit (inodes with larger sizes do not decode); `block_map` asserts that its
/// deepest tree maps it in every geometry.
pub use mako_format::inode::FILE_BYTES_MAX;

fn tag(ino: u64) -> IoTag {
    IoTag {
        buffer_type: BufferType::Data,
        ino,
    }
}

pub fn inline_capacity(core: &Core, st: &InodeState) -> usize {
    payload_bytes(core.inode_bytes()).saturating_sub(xattrs_encoded_len(&st.inode.xattrs))
}

fn valid_len(core: &Core, size: u64, b: u64) -> usize {
    let bs = b * core.block_bytes();
    size.saturating_sub(bs).min(core.block_bytes()) as usize
}

/// Read block `b`'s disk content (up to `valid` bytes) into a fresh vector.
fn read_disk_block(core: &Core, st: &InodeState, b: u64, valid: usize) -> FsResult<AlignedBuf> {
    let mut out = AlignedBuf::with_capacity(valid.next_multiple_of(512));
    let da = block_map::lookup(core, st, b)?;
    if da.is_null() || valid == 0 {
        out.resize(valid, 0);
        return Ok(out);
    }
    let alloc =
        block_map::allocated_subblocks(core, st, b) as usize * core.geo.subblock_bytes() as usize;
    let len = valid.next_multiple_of(512).min(alloc);
    // The read overwrites all of it; zeroing first would only cost page faults.
    core.nsd.read_append(da, &mut out, len, tag(st.inode.ino))?;
    out.resize(valid, 0);
    Ok(out)
}

/// Make `buf` hold the whole block: disk content merged under its dirty bytes.
pub fn load_buffer(core: &Core, st: &InodeState, b: u64, buf: &mut DataBuffer) -> FsResult<()> {
    if buf.loaded {
        return Ok(());
    }
    let valid = valid_len(core, st.inode.size, b);
    let mut disk = read_disk_block(core, st, b, valid)?;
    if let Some((lo, hi)) = buf.dirty {
        let (lo, hi) = (lo as usize, hi as usize);
        if disk.len() < hi {
            disk.resize(hi, 0);
        }
        disk[lo..hi].copy_from_slice(&buf.bytes[lo..hi]);
    }
    buf.bytes = disk;
    buf.loaded = true;
    buf.on_disk = true;
    Ok(())
}

/// Move data-in-inode out to block 0 in the pagepool.
pub fn convert_inline(core: &Core, st: &mut InodeState) -> FsResult<()> {
    let needs_block = matches!(&st.inode.content, InodeContent::InlineData(d) if !d.is_empty());
    if needs_block {
        core.alloc.reserve(core.geo.subblocks_per_block)?;
    }
    let data = match std::mem::replace(
        &mut st.inode.content,
        InodeContent::Pointers(vec![
            DiskAddress::NULL;
            pointers_in_inode(core.inode_bytes())
        ]),
    ) {
        InodeContent::InlineData(d) => d,
        other => {
            st.inode.content = other;
            return Ok(());
        }
    };
    st.inode.depth = 0;
    st.inode.last_block_subblocks = 0;
    st.mark_dirty();
    if !data.is_empty() {
        let slot = core.pool.get_or_create((st.inode.ino, 0));
        let mut buf = slot.buf.lock();
        let was = buf.is_dirty();
        let n = data.len() as u32;
        buf.bytes = AlignedBuf::from_slice(&data);
        buf.loaded = true;
        buf.on_disk = false;
        buf.reserved += core.geo.subblocks_per_block;
        buf.add_dirty(0, n);
        core.pool.account(&mut buf, was);
    }
    Ok(())
}

/// Give block `b` (a hole or a fragment) a full block now, written with its current
/// content (disk merged with dirty data, zeros elsewhere) before the pointer moves, so
/// that no log commit ever names a block whose content is not on disk, and an inode
/// never claims a full block where a fragment is allocated.
fn make_full_block(core: &Core, st: &mut InodeState, b: u64) -> FsResult<()> {
    let ino = st.inode.ino;
    let spb = core.geo.subblocks_per_block;
    let bb = core.block_bytes() as usize;
    let cur = block_map::lookup(core, st, b)?;
    let cur_sb = if cur.is_null() {
        0
    } else {
        block_map::allocated_subblocks(core, st, b)
    };
    if cur_sb >= spb {
        // Already a whole block (a shared writer's own copy of the unit).
        return Ok(());
    }
    // A shared writer never changes the metanode's allocation: it moves the unit to a
    // whole block of its own space, and the metanode frees the fragment when it moves
    // the pointer (`metanode::apply_update`).
    let shared = st.shared.is_some();
    let slot = core.pool.get_or_create((ino, b));
    let mut buf = slot.buf.lock();
    let was = buf.is_dirty();
    load_buffer(core, st, b, &mut buf)?;
    // A fragment at the start of its block with the rest of the block free becomes
    // the full block where it is (no copy, nothing freed).
    let in_place = !cur.is_null()
        && !shared
        && core
            .alloc
            .extend(AllocKind::Data, cur, cur_sb, spb, buf.reserved)?;
    let new = if in_place {
        cur
    } else {
        core.alloc
            .allocate_reserved(AllocKind::Data, spb, ino, b, buf.reserved)?
    };
    buf.reserved = 0;
    let mut full = AlignedBuf::with_capacity(bb);
    full.extend_from_slice(&buf.bytes[..buf.bytes.len().min(bb)]);
    full.resize(bb, 0);
    core.nsd.write(new, &full, tag(ino))?;
    core.journal.note_ordered_write();
    if !cur.is_null() {
        if !in_place && !shared {
            core.alloc.free(cur, cur_sb, ino)?;
        }
        st.inode.subblocks = st.inode.subblocks.saturating_sub(cur_sb as u64);
    }
    block_map::set(core, st, b, new)?;
    st.inode.subblocks += spb as u64;
    buf.dirty = None;
    buf.written_since_clean = 0;
    core.pool.account(&mut buf, was);
    st.mark_dirty();
    Ok(())
}

/// Before the size grows to `new_size`: a fragment last block that stops being the
/// last becomes a full block now (`make_full_block`); otherwise the old last block's
/// tail is zeroed through the pagepool.
fn grow_prepare(core: &Core, st: &mut InodeState, new_size: u64) -> FsResult<()> {
    let old = st.inode.size;
    if old == 0 {
        return Ok(());
    }
    let bb = core.block_bytes();
    let b0 = (old - 1) / bb;
    let new_last = (new_size - 1) / bb;
    let frag = st.inode.last_block_subblocks;
    if new_last > b0 && frag != 0 {
        // (`make_full_block` leaves a unit that already is a whole block alone: a
        // shared writer's view of the last block's size can be the metanode's while
        // the unit is its own whole block.)
        make_full_block(core, st, b0)?;
        st.inode.last_block_subblocks = 0;
        return Ok(());
    }
    if !old.is_multiple_of(bb) || frag != 0 {
        let cached = core.pool.get((st.inode.ino, b0)).is_some();
        if cached || !block_map::lookup(core, st, b0)?.is_null() {
            let slot = core.pool.get_or_create((st.inode.ino, b0));
            let mut buf = slot.buf.lock();
            let was = buf.is_dirty();
            load_buffer(core, st, b0, &mut buf)?;
            // Dirty from the last byte of the old end of file: the write-back then
            // covers every byte past it to the end of the allocation (zeros, or what is
            // written there), and not the whole block again — an append of 8 KiB to a
            // large fragment writes about 8 KiB.
            let n = buf.bytes.len() as u32;
            buf.add_dirty(n.saturating_sub(1), n.max(1).min(bb as u32));
            if buf.bytes.is_empty() {
                buf.bytes.resize(1, 0);
            }
            core.pool.account(&mut buf, was);
        }
    }
    Ok(())
}

/// A shared writer learns block addresses from the metanode between attempts
/// (`FsError::NeedBlocks`), and a missing one must be found before the write changes
/// anything (an operation that changed memory and then restarts turns the mount
/// read-only): every unit the write looks up — those it writes, and the old last
/// block that growing the file changes (`grow_prepare`) — must be known here, and the
/// old last block held (this node's view of the size may have grown since the
/// caller took its holds: three-node seed 227).
fn shared_write_ready(core: &Core, st: &InodeState, offset: u64, end: u64) -> FsResult<()> {
    let Some(s) = &st.shared else {
        return Ok(());
    };
    if !matches!(st.inode.content, InodeContent::Pointers(_)) || end <= offset {
        return Ok(());
    }
    let bb = core.block_bytes();
    let ino = st.inode.ino;
    let size = st.inode.size;
    if end > size && size > 0 && (size - 1) / bb < offset / bb {
        let b0 = (size - 1) / bb;
        if crate::op::in_op(core) {
            crate::op::hold_range(
                core,
                core.tokens.data(ino),
                TokenMode::Xw,
                mako_token::ByteRange {
                    start: b0 * bb,
                    end: (b0 + 1).saturating_mul(bb),
                },
                mako_token::ByteRange::WHOLE,
            )?;
        }
        if !s.blocks.contains_key(&b0) {
            return Err(FsError::need_blocks(ino, b0));
        }
    }
    match (offset / bb..end.div_ceil(bb)).find(|u| !s.blocks.contains_key(u)) {
        Some(u) => Err(FsError::need_blocks(ino, u)),
        None => Ok(()),
    }
}

pub fn write(core: &Core, h: &InodeHandle, offset: u64, data: &[u8]) -> FsResult<usize> {
    core.check_writable()?;
    let st = h.state.write();
    write_locked(core, h, st, offset, data)
}

/// O_APPEND: the offset is the size, read under the same lock as the write.
pub fn write_append(core: &Core, h: &InodeHandle, data: &[u8]) -> FsResult<usize> {
    core.check_writable()?;
    let st = h.state.write();
    let offset = st.inode.size;
    write_locked(core, h, st, offset, data)
}

fn write_locked(
    core: &Core,
    h: &InodeHandle,
    mut st: parking_lot::RwLockWriteGuard<'_, InodeState>,
    offset: u64,
    data: &[u8],
) -> FsResult<usize> {
    if st.deleted {
        return Err(FsError::Stale(h.ino));
    }
    // As the kernel's own file systems do (`generic_write_check_limits`): a write that
    // starts at or past the largest file size is EFBIG; one that would cross it is
    // shortened to end there, and reports the bytes it wrote.
    if offset >= FILE_BYTES_MAX && !data.is_empty() {
        return Err(FsError::TooBig(format!(
            "write at offset {offset} of inode {} (files end at {FILE_BYTES_MAX} bytes)",
            h.ino
        )));
    }
    let data = &data[..data
        .len()
        .min((FILE_BYTES_MAX - offset.min(FILE_BYTES_MAX)) as usize)];
    let len = data.len() as u64;
    let mut end = offset
        .checked_add(len)
        .filter(|e| *e <= FILE_BYTES_MAX)
        .ok_or_else(|| FsError::TooBig(format!("write at {offset}+{len}")))?;
    let t = core.now();
    if len == 0 {
        return Ok(0);
    }
    if let InodeContent::InlineData(_) = &st.inode.content {
        let cap = inline_capacity(core, &st);
        if end as usize <= cap {
            if let InodeContent::InlineData(d) = &mut st.inode.content {
                if d.len() < end as usize {
                    d.resize(end as usize, 0);
                }
                d[offset as usize..end as usize].copy_from_slice(data);
            }
            st.inode.size = st.inode.size.max(end);
            st.inode.mtime = t;
            st.inode.ctime = t;
            st.mark_dirty();
            return Ok(data.len());
        }
        convert_inline(core, &mut st)?;
    }
    shared_write_ready(core, &st, offset, end)?;
    let size_before = st.inode.size;
    if end > size_before {
        grow_prepare(core, &mut st, end)?;
    }
    let bb = core.block_bytes();
    let ino = h.ino;
    let mut full_blocks = Vec::new();
    let mut b = offset / bb;
    while b * bb < end {
        let bs = b * bb;
        let lo = (offset.max(bs) - bs) as usize;
        let hi = (end.min(bs + bb) - bs) as usize;
        let src = &data[(bs + lo as u64 - offset) as usize..(bs + hi as u64 - offset) as usize];
        let slot = core.pool.get_or_create((ino, b));
        let mut buf = slot.buf.lock();
        let was = buf.is_dirty();
        // Dirty data of an unallocated block holds a reservation of a full block until
        // write-behind allocates it, so that write-behind never meets ENOSPC: the
        // write meets it here, and reports it. So does data past the end of a fragment
        // (write-behind grows it).
        let needs_space = buf.reserved == 0 && {
            let da = block_map::lookup(core, &st, b)?;
            let allocated = block_map::allocated_subblocks(core, &st, b);
            da.is_null()
                || (allocated < core.geo.subblocks_per_block
                    && hi as u64 > allocated as u64 * core.geo.subblock_bytes() as u64)
        };
        if needs_space {
            if let Err(e) = core.alloc.reserve(core.geo.subblocks_per_block) {
                if b == offset / bb {
                    return Err(e);
                }
                // A short write: what fit is written.
                end = bs;
                break;
            }
            buf.reserved = core.geo.subblocks_per_block;
        }
        if !buf.loaded {
            let old_valid = valid_len(core, size_before, b);
            if old_valid == 0 || (lo == 0 && hi >= old_valid) {
                // Nothing on disk survives this write: no read needed.
                if old_valid == 0 || buf.dirty.is_none() {
                    buf.bytes.clear();
                    buf.loaded = true;
                    buf.on_disk = false;
                } else {
                    load_buffer(core, &st, b, &mut buf)?;
                }
            } else if block_map::lookup(core, &st, b)?.is_null() {
                // A hole: its content is zeros plus whatever is dirty.
                let mut z = AlignedBuf::with_capacity(old_valid.max(hi));
                z.resize(old_valid.max(hi), 0);
                if let Some((dl, dh)) = buf.dirty {
                    z[dl as usize..dh as usize]
                        .copy_from_slice(&buf.bytes[dl as usize..dh as usize]);
                }
                buf.bytes = z;
                buf.loaded = true;
                buf.on_disk = false;
            } else {
                match buf.dirty {
                    // Partial write to a block on disk: keep only the dirty range, read
                    // nothing (a small random write must not cost a block read).
                    None => buf.bytes.clear(),
                    Some((dl, dh)) if (lo as u32) <= dh && (hi as u32) >= dl => {}
                    Some(_) => load_buffer(core, &st, b, &mut buf)?,
                }
            }
        }
        if buf.bytes.len() < hi
            && buf.bytes.capacity() < hi
            && hi as u64 <= bb
            && (lo == 0 || buf.bytes.len() >= lo)
            && offset / bb != end.saturating_sub(1) / bb
        {
            // Streaming into this block: reserve it whole once.
            let have = buf.bytes.len();
            buf.bytes.reserve_exact(bb as usize - have);
        }
        // Zeros up to `lo` if the buffer is shorter; `lo..hi` is copied, not zeroed first.
        buf.bytes.overwrite_at(lo, src);
        buf.add_dirty(lo as u32, hi as u32);
        let before = buf.written_since_clean;
        buf.written_since_clean += (hi - lo) as u64;
        if before < bb && buf.written_since_clean >= bb {
            full_blocks.push(b);
        }
        core.pool.account(&mut buf, was);
        b += 1;
    }
    st.inode.size = st.inode.size.max(end);
    st.inode.mtime = t;
    st.inode.ctime = t;
    st.mark_dirty();
    drop(st);
    for b in full_blocks {
        core.queue_flush(ino, b);
    }
    let written = end - offset;
    core.stats
        .bytes_written
        .fetch_add(written, Ordering::Relaxed);
    Ok(written as usize)
}

/// Read up to `size` bytes at `offset`. `sequential` says the caller saw a sequential
/// pattern, so whole blocks are worth caching.
pub fn read(
    core: &Core,
    st: &InodeState,
    offset: u64,
    size: usize,
    sequential: bool,
) -> FsResult<AlignedBuf> {
    let fsize = st.inode.size;
    if offset >= fsize || size == 0 {
        return Ok(AlignedBuf::new());
    }
    let end = fsize.min(offset.saturating_add(size as u64));
    if let InodeContent::InlineData(d) = &st.inode.content {
        let mut out = AlignedBuf::zeroed((end - offset) as usize);
        let have = (d.len() as u64).min(end);
        if have > offset {
            out[..(have - offset) as usize].copy_from_slice(&d[offset as usize..have as usize]);
        }
        return Ok(out);
    }
    let bb = core.block_bytes();
    let ino = st.inode.ino;
    // An AlignedBuf: a block-sized one is a reused mapping, not fresh pages to fault in.
    let mut out = AlignedBuf::with_capacity((end - offset) as usize);
    let mut b = offset / bb;
    while b * bb < end {
        let bs = b * bb;
        let lo = (offset.max(bs) - bs) as usize;
        let hi = (end.min(bs + bb) - bs) as usize;
        let slot = core.pool.get((ino, b));
        let whole = sequential || hi - lo >= (bb as usize) / 2;
        match slot {
            Some(slot) => {
                let mut buf = slot.buf.lock();
                let covered = buf
                    .dirty
                    .is_some_and(|(dl, dh)| dl as usize <= lo && dh as usize >= hi);
                if !buf.loaded && !covered {
                    let was = buf.is_dirty();
                    load_buffer(core, st, b, &mut buf)?;
                    core.pool.account(&mut buf, was);
                }
                if buf.prefetched {
                    buf.prefetched = false;
                    core.pool
                        .stats
                        .prefetch_used
                        .fetch_add(1, Ordering::Relaxed);
                }
                copy_out(&buf.bytes, lo, hi, &mut out);
            }
            None if whole => {
                let slot = core.pool.get_or_create((ino, b));
                let mut buf = slot.buf.lock();
                if !buf.loaded {
                    let was = buf.is_dirty();
                    load_buffer(core, st, b, &mut buf)?;
                    core.pool.account(&mut buf, was);
                }
                copy_out(&buf.bytes, lo, hi, &mut out);
            }
            // Small random read of an uncached block: read just its sectors.
            None => read_uncached(core, st, b, lo, hi, &mut out)?,
        }
        b += 1;
    }
    core.stats
        .bytes_read
        .fetch_add(out.len() as u64, Ordering::Relaxed);
    Ok(out)
}

/// Append bytes `lo..hi` of block `b` to `out`, read from disk without caching.
fn read_uncached(
    core: &Core,
    st: &InodeState,
    b: u64,
    lo: usize,
    hi: usize,
    out: &mut AlignedBuf,
) -> FsResult<()> {
    let da = block_map::lookup(core, st, b)?;
    let start = out.len();
    out.resize(start + (hi - lo), 0);
    if !da.is_null() {
        let alloc = block_map::allocated_subblocks(core, st, b) as usize
            * core.geo.subblock_bytes() as usize;
        let alo = lo / 512 * 512;
        let ahi = hi.next_multiple_of(512).min(alloc);
        if ahi > alo && alloc > lo {
            let mut tmp = AlignedBuf::new();
            core.nsd.read_append(
                da.offset_by(alo as u64),
                &mut tmp,
                ahi - alo,
                tag(st.inode.ino),
            )?;
            let n = hi.min(ahi) - lo;
            out[start..start + n].copy_from_slice(&tmp[lo - alo..lo - alo + n]);
        }
    }
    Ok(())
}

/// O_DIRECT read: straight from disk (the caller flushed dirty buffers in the range).
pub fn read_direct(core: &Core, st: &InodeState, offset: u64, size: usize) -> FsResult<AlignedBuf> {
    let fsize = st.inode.size;
    if offset >= fsize || size == 0 {
        return Ok(AlignedBuf::new());
    }
    if matches!(st.inode.content, InodeContent::InlineData(_)) {
        return read(core, st, offset, size, false);
    }
    let end = fsize.min(offset.saturating_add(size as u64));
    let bb = core.block_bytes();
    let mut out = AlignedBuf::with_capacity((end - offset) as usize);
    let mut b = offset / bb;
    while b * bb < end {
        let bs = b * bb;
        let lo = (offset.max(bs) - bs) as usize;
        let hi = (end.min(bs + bb) - bs) as usize;
        read_uncached(core, st, b, lo, hi, &mut out)?;
        b += 1;
    }
    Ok(out)
}

/// Can this aligned O_DIRECT write go straight to disk? Only overwrites of allocated
/// full blocks inside the file with no dirty cached data under them.
pub fn direct_eligible(core: &Core, st: &InodeState, offset: u64, len: usize) -> FsResult<bool> {
    if !matches!(st.inode.content, InodeContent::Pointers(_))
        || len == 0
        || offset.saturating_add(len as u64) > st.inode.size
    {
        return Ok(false);
    }
    let bb = core.block_bytes();
    let spb = core.geo.subblocks_per_block;
    // Below the size, so no overflow.
    for b in offset / bb..(offset + len as u64).div_ceil(bb) {
        if block_map::lookup(core, st, b)?.is_null()
            || block_map::allocated_subblocks(core, st, b) != spb
        {
            return Ok(false);
        }
        if core
            .pool
            .get((st.inode.ino, b))
            .is_some_and(|s| s.buf.lock().is_dirty())
        {
            return Ok(false);
        }
    }
    Ok(true)
}

pub fn write_direct(core: &Core, st: &mut InodeState, offset: u64, data: &[u8]) -> FsResult<usize> {
    let bb = core.block_bytes();
    let ino = st.inode.ino;
    let end = offset + data.len() as u64;
    let mut b = offset / bb;
    while b * bb < end {
        let bs = b * bb;
        let lo = offset.max(bs) - bs;
        let hi = end.min(bs + bb) - bs;
        let da = block_map::lookup(core, st, b)?;
        let src = &data[(bs + lo - offset) as usize..(bs + hi - offset) as usize];
        core.nsd.write(da.offset_by(lo), src, tag(ino))?;
        b += 1;
    }
    core.journal.note_ordered_write();
    // Clean cached copies of these blocks are now stale.
    core.alloc.unreserve(
        core.pool
            .remove_from_range(ino, offset / bb, end.div_ceil(bb)),
    );
    let t = core.now();
    st.inode.mtime = t;
    st.inode.ctime = t;
    st.mark_dirty();
    core.stats
        .bytes_written
        .fetch_add(data.len() as u64, Ordering::Relaxed);
    Ok(data.len())
}

/// Read like `read`, handing the bytes to `f`. When the range lies inside one cached
/// block, `f` gets a slice of the pagepool buffer itself (no copy; the FUSE reply is
/// written straight from it).
pub fn read_with<R>(
    core: &Core,
    st: &InodeState,
    offset: u64,
    size: usize,
    sequential: bool,
    f: &mut Option<impl FnOnce(&[u8]) -> R>,
) -> FsResult<R> {
    // `f` is taken only once the bytes are in hand: a read that fails here (or asks for
    // a restart) leaves it for the next attempt.
    let mut reply = |bytes: &[u8]| {
        f.take().map(|f| f(bytes)).ok_or_else(|| {
            FsError::integrity(crate::error::IntegrityError::new(
                "read",
                "the read's reply was made twice",
            ))
        })
    };
    let fsize = st.inode.size;
    let bb = core.block_bytes();
    let end = fsize.min(offset.saturating_add(size as u64));
    let single = offset < end
        && offset / bb == (end - 1) / bb
        && matches!(st.inode.content, InodeContent::Pointers(_));
    if single {
        let b = offset / bb;
        let (lo, hi) = ((offset - b * bb) as usize, (end - b * bb) as usize);
        let whole = sequential || hi - lo >= (bb as usize) / 2;
        let slot = match core.pool.get((st.inode.ino, b)) {
            Some(s) => Some(s),
            None if whole => Some(core.pool.get_or_create((st.inode.ino, b))),
            None => None,
        };
        if let Some(slot) = slot {
            let mut buf = slot.buf.lock();
            if !buf.loaded {
                let was = buf.is_dirty();
                load_buffer(core, st, b, &mut buf)?;
                core.pool.account(&mut buf, was);
            }
            if buf.bytes.len() >= hi {
                if buf.prefetched {
                    buf.prefetched = false;
                    core.pool
                        .stats
                        .prefetch_used
                        .fetch_add(1, Ordering::Relaxed);
                }
                core.stats
                    .bytes_read
                    .fetch_add((hi - lo) as u64, Ordering::Relaxed);
                return reply(&buf.bytes[lo..hi]);
            }
        }
    }
    let v = read(core, st, offset, size, sequential)?;
    reply(&v)
}

fn copy_out(bytes: &[u8], lo: usize, hi: usize, out: &mut AlignedBuf) {
    let have = bytes.len().min(hi);
    if have > lo {
        out.extend_from_slice(&bytes[lo..have]);
    }
    let pad = hi - lo.max(have);
    out.resize(out.len() + pad, 0);
}

/// Bring one block into the pagepool ahead of a sequential reader.
pub fn prefetch_block(core: &Core, h: &InodeHandle, b: u64) -> FsResult<()> {
    let st = h.state.read();
    if st.deleted
        || b * core.block_bytes() >= st.inode.size
        || !matches!(st.inode.content, InodeContent::Pointers(_))
    {
        return Ok(());
    }
    if core.pool.get((h.ino, b)).is_some() {
        return Ok(());
    }
    let slot = core.pool.get_or_create((h.ino, b));
    let mut buf = slot.buf.lock();
    if buf.loaded {
        return Ok(());
    }
    let was = buf.is_dirty();
    load_buffer(core, &st, b, &mut buf)?;
    buf.prefetched = true;
    core.pool.account(&mut buf, was);
    core.pool
        .stats
        .prefetch_issued
        .fetch_add(1, Ordering::Relaxed);
    Ok(())
}

/// Write one dirty block back to disk, allocating (or re-sizing: fragment <-> full
/// block) its space first. Called by write-behind, fsync and sync.
pub fn flush_block(core: &Core, h: &InodeHandle, b: u64) -> FsResult<()> {
    // A shared writer learns the block's address first, with no lock held. Every
    // caller holds the block's data token (a hold, or the revoke of it is running).
    crate::metanode::fetch_blocks(core, h, b, b + 1, true)?;
    // The handle stays open until the data write is done: a commit that logs the new
    // pointer waits for it, so the log never names a block whose data is not written.
    let _tx = core.begin();
    let mut st = h.state.write();
    let shared = st.shared.is_some();
    if st.deleted {
        return Ok(());
    }
    let Some(slot) = core.pool.get((h.ino, b)) else {
        return Ok(());
    };
    let mut buf = slot.buf.lock();
    if !buf.is_dirty() {
        return Ok(());
    }
    let bb = core.block_bytes();
    let size = st.inode.size;
    if b * bb >= size || !matches!(st.inode.content, InodeContent::Pointers(_)) {
        // Beyond the end of file (truncated meanwhile): nothing to write.
        buf.dirty = None;
        buf.written_since_clean = 0;
        core.alloc.unreserve(buf.reserved as u64);
        buf.reserved = 0;
        core.pool.account(&mut buf, true);
        return Ok(());
    }
    let sb = core.geo.subblock_bytes() as usize;
    let spb = core.geo.subblocks_per_block;
    let valid = valid_len(core, size, b);
    let is_last = block_map::last_unit(core, &st.inode) == Some(b);
    // Shared writers allocate whole blocks only: the metanode owns fragments. So does
    // the metanode while others write (its `rw` token): a writer that grows the file
    // past a block the metanode made a fragment would leave a fragment that is not
    // the last block (`metanode::apply_update`).
    let whole_only = shared || core.tokens.inode_mode(h.ino) == Some(TokenMode::Rw);
    let desired = if is_last && (valid as u64) < bb && !whole_only {
        valid.div_ceil(sb) as u32
    } else {
        spb
    };
    let cur = block_map::lookup(core, &st, b)?;
    let cur_sb = if cur.is_null() {
        0
    } else {
        block_map::allocated_subblocks(core, &st, b)
    };
    // An allocation only grows here (a fragment promoted to a full block); it never
    // shrinks, so space preallocated by fallocate past the end of file stays.
    let desired = desired.max(cur_sb);
    // Subblocks the allocation had when it grew where it is (its new subblocks hold
    // whatever the disk held: the write below covers them).
    let mut grown_from = None;
    // The allocation changes `st_blocks`, which the kernel may cache for long under
    // this node's inode token: it must ask again (below, with no lock of the inode).
    let blocks_change = cur.is_null() || cur_sb != desired;
    let target = if blocks_change {
        if !buf.loaded {
            load_buffer(core, &st, b, &mut buf)?;
        }
        // A growing fragment (appends to the last block) grows in place when the
        // subblocks after it are free: no copy of the block, nothing freed to wait for
        // a checkpoint. Otherwise it moves to a new allocation of the new size.
        // A shared writer always moves to a new whole block of its own space: the old
        // one is the metanode's to free when it moves the pointer (it owns the block
        // map; see `metanode::apply_update`).
        let target = if !cur.is_null()
            && !shared
            && core
                .alloc
                .extend(AllocKind::Data, cur, cur_sb, desired, buf.reserved)?
        {
            grown_from = Some(cur_sb);
            cur
        } else {
            let new =
                core.alloc
                    .allocate_reserved(AllocKind::Data, desired, h.ino, b, buf.reserved)?;
            if !cur.is_null() && !shared {
                core.alloc.free(cur, cur_sb, h.ino)?;
            }
            block_map::set(core, &mut st, b, new)?;
            new
        };
        buf.reserved = 0;
        st.inode.subblocks = st.inode.subblocks.saturating_sub(cur_sb as u64) + desired as u64;
        if is_last {
            st.inode.last_block_subblocks = if desired < spb { desired as u16 } else { 0 };
        }
        st.mark_dirty();
        target
    } else {
        cur
    };
    let ino = h.ino;
    drop(st);
    let write_len = desired as usize * sb;
    let written = (|| -> FsResult<()> {
        if buf.loaded {
            // A block that stays where it is, with the disk holding everything outside the
            // dirty range, gets just its dirty pages (an fsync after a small write must not
            // cost a whole-block write); otherwise the whole allocation. Bytes past the
            // buffer's end read as zero (a truncate cut them) while the disk may still hold
            // old bytes there, so then the write runs to the end of the allocation.
            let (alo, ahi) = match buf.dirty {
                Some((lo, hi)) if target == cur && buf.on_disk => {
                    let alo = (lo as usize / IO_ALIGN * IO_ALIGN).min(write_len);
                    let ahi = if buf.bytes.len() < write_len {
                        write_len
                    } else {
                        (hi as usize).next_multiple_of(IO_ALIGN).min(write_len)
                    };
                    match grown_from {
                        // Grown in place: the new subblocks are written whole, from the old
                        // end of the allocation on at the latest (zeros past the buffer).
                        Some(old) => (alo.min(old as usize * sb / IO_ALIGN * IO_ALIGN), write_len),
                        None => (alo, ahi),
                    }
                }
                _ => (0, write_len),
            };
            if ahi > alo {
                if buf.bytes.len() >= ahi {
                    core.nsd
                        .write(target.offset_by(alo as u64), &buf.bytes[alo..ahi], tag(ino))?;
                } else {
                    let mut padded = AlignedBuf::with_capacity(ahi - alo);
                    padded.extend_from_slice(&buf.bytes[alo.min(buf.bytes.len())..]);
                    padded.resize(ahi - alo, 0);
                    core.nsd
                        .write(target.offset_by(alo as u64), &padded, tag(ino))?;
                }
            }
        } else {
            // Only a dirty range is valid: write its sectors, reading the edge sectors.
            let (lo, hi) = buf
                .dirty
                .map(|(a, b)| (a as usize, b as usize))
                .expect("dirty");
            let alo = lo / 512 * 512;
            let ahi = hi.next_multiple_of(512).min(write_len);
            let mut tmp = AlignedBuf::zeroed(ahi - alo);
            if alo < lo || hi < ahi {
                core.nsd
                    .read(target.offset_by(alo as u64), &mut tmp, tag(ino))?;
            }
            tmp[lo - alo..hi - alo].copy_from_slice(&buf.bytes[lo..hi]);
            core.nsd
                .write(target.offset_by(alo as u64), &tmp, tag(ino))?;
        }
        Ok(())
    })();
    if let Err(e) = written {
        if blocks_change {
            // The block's new allocation is in memory only, and the operation failed
            // after changing it: the mount turns read-only (`journal`), keeping its
            // tokens, so a revoke of them could never flush and other nodes' operations
            // would fail. As for a failed write of metadata, the file system panics
            // (unless the error is the lease fence): the node is expelled and a
            // survivor recovers it (faults seed 1299 of
            // `bad_disk_panics_the_node_s_file_system`).
            core.log_write_failed("a data block write after its allocation changed", &e);
        }
        return Err(e);
    }
    core.journal.note_ordered_write();
    // A loaded buffer now matches its disk copy (what the write skipped already did).
    buf.on_disk = buf.loaded;
    buf.dirty = None;
    buf.written_since_clean = 0;
    core.pool.account(&mut buf, true);
    drop(buf);
    core.stats.blocks_flushed.fetch_add(1, Ordering::Relaxed);
    if blocks_change {
        core.invalidate_kernel_attrs(ino);
    }
    Ok(())
}

/// Write back every dirty data block of the inode.
pub fn flush_data(core: &Core, h: &InodeHandle) -> FsResult<()> {
    for (_, b) in core.pool.keys_of(h.ino, true) {
        flush_block(core, h, b)?;
    }
    Ok(())
}

/// Change the file size (truncate up or down).
pub fn set_size(core: &Core, st: &mut InodeState, new: u64) -> FsResult<()> {
    if new > FILE_BYTES_MAX {
        return Err(FsError::TooBig(format!("size {new}")));
    }
    let old = st.inode.size;
    if new == old {
        return Ok(());
    }
    if let InodeContent::InlineData(_) = &st.inode.content {
        if new as usize <= inline_capacity(core, st) {
            if let InodeContent::InlineData(d) = &mut st.inode.content {
                d.resize(new as usize, 0);
            }
            st.inode.size = new;
            st.mark_dirty();
            return Ok(());
        }
        convert_inline(core, st)?;
    }
    if new > old {
        grow_prepare(core, st, new)?;
        st.inode.size = new;
        st.mark_dirty();
        return Ok(());
    }
    let bb = core.block_bytes();
    let ino = st.inode.ino;
    let first_gone = new.div_ceil(bb);
    let old_last = block_map::last_unit(core, &st.inode);
    // Drop cached buffers first: a write-behind in flight holds its buffer's lock, so
    // this waits for it before the blocks below are freed.
    core.alloc.unreserve(core.pool.remove_from(ino, first_gone));
    let units = block_map::cut_from(core, st, first_gone)?;
    for (_, da, n) in units {
        core.alloc.free(da, n, ino)?;
        st.inode.subblocks = st.inode.subblocks.saturating_sub(n as u64);
    }
    if !new.is_multiple_of(bb) {
        let b = new / bb;
        let cached = core.pool.get((ino, b)).is_some();
        if cached || !block_map::lookup(core, st, b)?.is_null() {
            let slot = core.pool.get_or_create((ino, b));
            let mut buf = slot.buf.lock();
            let was = buf.is_dirty();
            load_buffer(core, st, b, &mut buf)?;
            let keep = (new % bb) as usize;
            buf.bytes.truncate(keep);
            buf.dirty = Some((0, keep as u32));
            core.pool.account(&mut buf, was);
        }
    }
    let new_last = if new == 0 { None } else { Some((new - 1) / bb) };
    if new_last != old_last {
        st.inode.last_block_subblocks = 0;
    }
    st.inode.size = new;
    if new == 0 && st.inode.depth == 0 && block_map::allocated_from(core, st, 0, 1)?.is_empty() {
        st.inode.content = InodeContent::InlineData(Vec::new());
    }
    st.mark_dirty();
    Ok(())
}

/// Deallocate whole blocks in [offset, offset+len) and zero the partial edges.
pub fn punch_hole(core: &Core, st: &mut InodeState, offset: u64, len: u64) -> FsResult<()> {
    let size = st.inode.size;
    let end = offset.saturating_add(len).min(size);
    if offset >= end {
        return Ok(());
    }
    if let InodeContent::InlineData(d) = &mut st.inode.content {
        let e = (end as usize).min(d.len());
        if (offset as usize) < e {
            d[offset as usize..e].fill(0);
        }
        st.mark_dirty();
        return Ok(());
    }
    let bb = core.block_bytes();
    let ino = st.inode.ino;
    let mut b = offset / bb;
    while b * bb < end {
        let bs = b * bb;
        let lo = (offset.max(bs) - bs) as usize;
        let hi = (end.min(bs + bb) - bs) as usize;
        let valid = valid_len(core, size, b);
        if lo == 0 && hi >= valid {
            // The whole (valid part of the) block goes.
            let n = block_map::allocated_subblocks(core, st, b);
            core.alloc
                .unreserve(core.pool.remove_from_range(ino, b, b + 1));
            let da = block_map::lookup(core, st, b)?;
            if !da.is_null() {
                block_map::set(core, st, b, DiskAddress::NULL)?;
                core.alloc.free(da, n, ino)?;
                st.inode.subblocks = st.inode.subblocks.saturating_sub(n as u64);
                if block_map::last_unit(core, &st.inode) == Some(b) {
                    st.inode.last_block_subblocks = 0;
                }
            }
        } else {
            let cached = core.pool.get((ino, b)).is_some();
            if cached || !block_map::lookup(core, st, b)?.is_null() {
                let slot = core.pool.get_or_create((ino, b));
                let mut buf = slot.buf.lock();
                let was = buf.is_dirty();
                load_buffer(core, st, b, &mut buf)?;
                if buf.bytes.len() < hi {
                    buf.bytes.resize(hi, 0);
                }
                buf.bytes[lo..hi].fill(0);
                buf.add_dirty(lo as u32, hi as u32);
                core.pool.account(&mut buf, was);
            }
        }
        b += 1;
    }
    block_map::prune_indirect(core, st)?;
    st.mark_dirty();
    Ok(())
}

/// Subblocks to reserve before allocating [offset, end): a whole block for every hole
/// and fragment of the range whose buffer holds no reservation yet, and for an old
/// fragment last block that growing the file turns into a block. ENOSPC, before
/// anything changes, when the file system has fewer empty blocks than that.
fn range_reservation(
    core: &Core,
    st: &InodeState,
    offset: u64,
    end: u64,
    keep_size: bool,
) -> FsResult<u64> {
    let pointers = matches!(st.inode.content, InodeContent::Pointers(_));
    if end <= offset || (!pointers && end as usize <= inline_capacity(core, st)) {
        return Ok(0);
    }
    let bb = core.block_bytes();
    let spb = core.geo.subblocks_per_block;
    let ino = st.inode.ino;
    // Counting stops once more blocks are needed than the file system has: the answer
    // is known, and a range of petabytes is not walked.
    let limit = core.alloc.empty_blocks();
    let (first, last) = (offset / bb, (end - 1) / bb);
    let mut blocks = 0u64;
    for b in first..=last {
        let full = pointers
            && !block_map::lookup(core, st, b)?.is_null()
            && block_map::allocated_subblocks(core, st, b) == spb;
        let held = core
            .pool
            .get((ino, b))
            .is_some_and(|slot| slot.buf.lock().reserved > 0);
        if !full && !held {
            blocks += 1;
        }
        if blocks > limit {
            return Err(FsError::NoSpace(format!(
                "fallocate of {} bytes needs more blocks than the file system has free",
                end - offset
            )));
        }
    }
    if grown_fragment(core, st, end, keep_size, first).is_some() {
        blocks += 1;
    }
    Ok(blocks * spb as u64)
}

/// The old last block, a fragment before `first`, that growing the file to `end`
/// turns into a full block (`grow_prepare`).
fn grown_fragment(
    core: &Core,
    st: &InodeState,
    end: u64,
    keep_size: bool,
    first: u64,
) -> Option<u64> {
    let size = st.inode.size;
    let b0 = size.checked_sub(1)? / core.block_bytes();
    (!keep_size && end > size && st.inode.last_block_subblocks != 0 && b0 < first).then_some(b0)
}

/// Run `f`, which allocates block `b` through its buffer, with a reservation lent from
/// `pool` to that buffer (unless it holds one); taken back if `f` fails without using
/// it, so that no clean buffer keeps a reservation.
fn with_lent_reservation(
    core: &Core,
    ino: u64,
    b: u64,
    pool: &mut u64,
    f: impl FnOnce() -> FsResult<()>,
) -> FsResult<()> {
    let spb = core.geo.subblocks_per_block;
    let lent = {
        let slot = core.pool.get_or_create((ino, b));
        let mut buf = slot.buf.lock();
        if buf.reserved == 0 && *pool >= spb as u64 {
            buf.reserved = spb;
            *pool -= spb as u64;
            true
        } else {
            false
        }
    };
    let r = f();
    if r.is_err() && lent {
        if let Some(slot) = core.pool.get((ino, b)) {
            let mut buf = slot.buf.lock();
            if buf.reserved == spb && !buf.is_dirty() {
                buf.reserved = 0;
                *pool += spb as u64;
            }
        }
    }
    r
}

/// Allocate (zeroed) blocks under [offset, offset+len); grows the size unless
/// `keep_size`. Every block it needs is reserved first (ENOSPC then, with nothing
/// changed), so the allocations succeed and their indirect blocks come from the
/// metadata reserve: what statfs calls available can be allocated in one call.
pub fn allocate_range(
    core: &Core,
    st: &mut InodeState,
    offset: u64,
    len: u64,
    keep_size: bool,
) -> FsResult<()> {
    let end = offset
        .checked_add(len)
        .filter(|e| *e <= FILE_BYTES_MAX)
        .ok_or_else(|| FsError::TooBig("fallocate range".into()))?;
    let need = range_reservation(core, st, offset, end, keep_size)?;
    core.alloc.reserve_subblocks(need)?;
    let mut pool = need;
    let r = allocate_reserved_range(core, st, offset, end, keep_size, &mut pool);
    if pool > 0 {
        core.alloc.unreserve(pool);
    }
    r
}

fn allocate_reserved_range(
    core: &Core,
    st: &mut InodeState,
    offset: u64,
    end: u64,
    keep_size: bool,
    pool: &mut u64,
) -> FsResult<()> {
    let bb = core.block_bytes();
    let ino = st.inode.ino;
    if !keep_size && end > st.inode.size {
        match grown_fragment(core, st, end, keep_size, offset / bb) {
            Some(b0) => with_lent_reservation(core, ino, b0, pool, || set_size(core, st, end))?,
            None => set_size(core, st, end)?,
        }
    }
    if matches!(st.inode.content, InodeContent::InlineData(_)) {
        if end as usize <= inline_capacity(core, st) {
            return Ok(());
        }
        convert_inline(core, st)?;
    }
    let spb = core.geo.subblocks_per_block;
    let zeros = AlignedBuf::zeroed(bb as usize);
    let mut b = offset / bb;
    while b * bb < end {
        let cur = block_map::lookup(core, st, b)?;
        let cur_sb = if cur.is_null() {
            0
        } else {
            block_map::allocated_subblocks(core, st, b)
        };
        if cur_sb < spb {
            if !cur.is_null() || core.pool.get((ino, b)).is_some() {
                // A fragment, or a hole with cached data: its content moves to the full
                // block before the pointer does.
                with_lent_reservation(core, ino, b, pool, || make_full_block(core, st, b))?;
            } else {
                // A hole becomes a full block of zeros (on disk before the log names it).
                let held = if *pool >= spb as u64 { spb } else { 0 };
                let da = core
                    .alloc
                    .allocate_reserved(AllocKind::Data, spb, ino, b, held)?;
                *pool -= held as u64;
                core.nsd.write(da, &zeros, tag(ino))?;
                core.journal.note_ordered_write();
                block_map::set(core, st, b, da)?;
                st.inode.subblocks += spb as u64;
            }
            if block_map::last_unit(core, &st.inode) == Some(b) {
                st.inode.last_block_subblocks = 0;
            }
        }
        b += 1;
    }
    st.mark_dirty();
    Ok(())
}

/// lseek SEEK_DATA.
pub fn seek_data(core: &Core, st: &InodeState, offset: u64) -> FsResult<u64> {
    let size = st.inode.size;
    if offset >= size {
        return Err(FsError::NoSuchOffset);
    }
    if matches!(st.inode.content, InodeContent::InlineData(_)) {
        return Ok(offset);
    }
    let bb = core.block_bytes();
    let b = offset / bb;
    let mapped = block_map::allocated_from(core, st, b, 1)?
        .first()
        .map(|(u, _)| *u);
    let cached = core
        .pool
        .keys_of(st.inode.ino, true)
        .into_iter()
        .map(|(_, k)| k)
        .find(|&k| k >= b);
    let next = match (mapped, cached) {
        (Some(a), Some(c)) => a.min(c),
        (Some(a), None) => a,
        (None, Some(c)) => c,
        (None, None) => return Err(FsError::NoSuchOffset),
    };
    let pos = offset.max(next * bb);
    if pos >= size {
        return Err(FsError::NoSuchOffset);
    }
    Ok(pos)
}

/// lseek SEEK_HOLE (the end of file counts as a hole). Data is an allocated block or
/// dirty data not yet allocated (a clean cached copy of a hole is still a hole); holes
/// are found through the indirect tree (`block_map::first_hole_from`), so a long run
/// of data or a huge file is not probed block by block.
pub fn seek_hole(core: &Core, st: &InodeState, offset: u64) -> FsResult<u64> {
    let size = st.inode.size;
    if offset >= size {
        return Err(FsError::NoSuchOffset);
    }
    if matches!(st.inode.content, InodeContent::InlineData(_)) {
        return Ok(size);
    }
    let bb = core.block_bytes();
    let last = (size - 1) / bb;
    let first = offset / bb;
    let dirty: std::collections::BTreeSet<u64> = core
        .pool
        .keys_of(st.inode.ino, true)
        .into_iter()
        .map(|(_, k)| k)
        .filter(|&k| k >= first)
        .collect();
    let mut b = first;
    loop {
        let h = block_map::first_hole_from(core, st, b, last + 1)?;
        if h > last {
            return Ok(size);
        }
        // Dirty data over a hole is data (there are at most as many as the pagepool
        // holds dirty blocks).
        if dirty.contains(&h) {
            b = h + 1;
            continue;
        }
        return Ok(offset.max(h * bb));
    }
}
