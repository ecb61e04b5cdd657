//! Directories (DESIGN.md 3.5): entries live in the inode while they fit, then in one
//! fragment-sized directory block that grows to a full directory block
//! (`avoidDirFragments` skips the fragment), then in directory blocks organised by
//! extendible hashing on the name's cookie, so lookup, insert and delete touch one
//! block whatever the directory's size. `DirPreSplitLevels` pre-splits a directory
//! when it first leaves the inode.
//!
//! Every entry keeps the cookie it was given at insertion for its whole life; readdir
//! offsets are cookies, so they stay valid while the directory changes and splits.

use crate::alloc_map::AllocKind;
use crate::block_map;
use crate::coherence::Missing;
use crate::core::{Core, DirNode, InodeState};
use crate::error::{FsError, FsResult};
use mako_disk::nsd::IoTag;
use mako_disk::BufferType;
use mako_format::dir_block::*;
use mako_format::error::Location;
use mako_format::inode::{payload_bytes, xattrs_encoded_len, InodeContent};
use mako_format::name_hash::{home_cookie, COOKIE_MAX, COOKIE_MIN};
use mako_format::DiskAddress;
use mako_token::{ByteRange, TokenMode};
use std::sync::atomic::Ordering;

/// Deepest hash tree: the cookie has 63 bits.
const DIR_DEPTH_MAX: u8 = 62;

// ---- name tokens (docs/coherence.md section 4) ---------------------------------------
//
// Name tokens (`DirBucket`, over cookie ranges) keep every node's view of the entries
// (cached pages, lookups, kernel dentries) right; the directory inode token keeps its
// shape right (block map, size, which blocks and pages exist) and its cached blocks.
//
// - Under the directory inode in `rw` (creates and unlinks of distinct names from many
//   nodes), every entry an operation reads or changes lies under a name token over its
//   whole page: `ro` to read, `xw` to change. A page is written back by the one node
//   that holds it in `xw`, so nodes changing different pages of one block work in
//   parallel.
// - Under the directory inode in `xw` (a directory in its inode, or a change of shape),
//   no other node can change an entry or cache a block: an operation reads entries
//   without name tokens and changes an entry under `xw` on that one cookie only (other
//   nodes' cached lookups of the name must go). Distinct names never conflict.
// - Changing the shape (leaving the inode, growing a fragment, splitting a block) moves
//   entries without changing any (cookies are for life), so it needs the inode in `xw`
//   and no name token: one token, so many nodes meeting one full block cannot take
//   turns revoking each other's halves of what the split needs. The request is
//   conditional on the shape version: if somebody changed the shape meanwhile, the
//   manager grants `rw` instead and the operation looks again (the seeds' pitfall of
//   many nodes asking at once to move a directory out of its inode).
// A missing token is `FsError::NeedToken`, always found before the operation changes
// anything.

/// The cookie range of the page that holds `cookie`; while the directory lives in its
/// inode (always changed under the inode in `xw`), just the cookie.
pub fn page_range(core: &Core, st: &InodeState, cookie: u64) -> FsResult<ByteRange> {
    if is_inline(st) {
        return Ok(ByteRange::new(cookie, cookie.saturating_add(1)));
    }
    let idx = locate(core, st, cookie)?;
    let cache = st.dir_blocks.lock();
    let n = &cache[&idx];
    let (lo, hi) = page_cookie_range(
        n.id.index,
        n.depth,
        n.capacity_bytes,
        n.page_of(cookie) as u32,
    );
    Ok(ByteRange::new(lo, hi.saturating_add(1)))
}

/// The cookie range of block `idx` (at its depth).
fn block_cookies(st: &InodeState, idx: u64) -> ByteRange {
    let cache = st.dir_blocks.lock();
    let n = &cache[&idx];
    let (lo, hi) = cookie_range(idx, n.depth);
    ByteRange::new(lo, hi.saturating_add(1))
}

/// Does the current operation hold the directory inode exclusively (its entries and
/// shape are this node's alone)?
fn holds_exclusive(core: &Core, st: &InodeState) -> bool {
    crate::op::holds_inode(core, st.inode.ino, crate::coherence::Need::Exclusive)
}

/// The operation must hold the directory's names over `range` (`xw` if `write`).
/// Under the directory inode in `xw` reading needs no name token.
fn cover(core: &Core, st: &InodeState, range: ByteRange, write: bool) -> FsResult<()> {
    if !crate::op::in_op(core) {
        // Creation and tools: nothing else shares the directory.
        return Ok(());
    }
    if !write && holds_exclusive(core, st) {
        return fresh(core, st, core.tokens.inode(st.inode.ino));
    }
    let resource = core.tokens.dir(st.inode.ino);
    let mode = if write { TokenMode::Xw } else { TokenMode::Ro };
    if crate::op::holds(core, resource, range, Some(mode)) {
        return fresh(core, st, resource);
    }
    // This node may hold it already (granted by the restart that this very check
    // asked for, or by an earlier operation): hold it for the operation, never wait.
    if let Some(h) = core.tokens.client().try_hold(resource, mode, range) {
        crate::op::push_hold(core, h);
        return fresh(core, st, resource);
    }
    Err(FsError::need_token(Missing {
        resource,
        mode,
        required: range,
        desired: ByteRange::WHOLE,
        replace: false,
        upgrade_to: Some(TokenMode::Xw),
        alt_mode: None,
        condition: None,
    }))
}

/// The operation holds `resource` (the directory's names, or its inode in `xw`): the
/// cached blocks' clean pages must be as new as its last grant to this node. A page
/// read before it, while this node did not hold the page, may miss a name another
/// node inserted. `op::run` reads them again after an acquire that asked the manager,
/// but an operation whose acquire found the token granted already (to another
/// operation of this node that had not read them again yet) went on with the stale
/// page (three-node seed 53 with `CROWD_NODES` 1: a lookup missed a directory another
/// node had created, ENOENT). So they are read again here when older than the grant:
/// in place, since this may come after the operation changed something (no restart),
/// and another operation of this node may be reading them (the blocks stay).
fn fresh(core: &Core, st: &InodeState, resource: mako_token::ResourceId) -> FsResult<()> {
    let granted = core.tokens.client().granted_at(resource);
    if granted <= st.names_seen.load(Ordering::SeqCst) {
        return Ok(());
    }
    reread_clean_pages(core, st)
}

fn cover_cookie(core: &Core, st: &InodeState, cookie: u64, write: bool) -> FsResult<()> {
    if !crate::op::in_op(core) {
        return Ok(());
    }
    if holds_exclusive(core, st) {
        if !write {
            return Ok(());
        }
        // The page is this node's to write anyway: only the name's cached lookups
        // elsewhere must go.
        return cover(
            core,
            st,
            ByteRange::new(cookie, cookie.saturating_add(1)),
            true,
        );
    }
    let range = page_range(core, st, cookie)?;
    cover(core, st, range, write)
}

/// Changing the directory's shape needs the directory inode exclusively (its block
/// map and size change; every other node's cached blocks and dirty pages went with
/// its inode token). It is asked for on the condition that nobody changed the shape
/// since this node last heard (the seeds' pitfall: many nodes asking at once to move
/// one directory out of its inode); if somebody did, the manager grants the shared
/// write mode instead and the operation looks again.
pub(crate) fn cover_structure(core: &Core, st: &InodeState) -> FsResult<()> {
    if !crate::op::in_op(core) {
        return Ok(());
    }
    let ino = st.inode.ino;
    let held = crate::op::holds_inode(core, ino, crate::coherence::Need::Exclusive)
        || match core
            .tokens
            .try_hold_inode(ino, crate::coherence::Need::Exclusive)
        {
            // Held already (the grant a restart asked for): the state this operation
            // read was read under it.
            Ok(h) => {
                crate::op::push_hold(core, h);
                true
            }
            Err(_) => false,
        };
    if !held {
        let resource = core.tokens.inode(ino);
        let seen = core.tokens.client().version_hint(resource);
        let mut missing = core
            .tokens
            .inode_missing(ino, crate::coherence::Need::Exclusive);
        missing.condition = Some(mako_token::Condition {
            seen_version: seen,
            fallback_mode: TokenMode::Rw,
            fallback_required: ByteRange::WHOLE,
            fallback_desired: ByteRange::WHOLE,
        });
        return Err(FsError::need_token(missing));
    }
    Ok(())
}

/// After a change of shape: tell the manager (phase C), so that requests made for the
/// old shape get their fallback.
fn shape_changed(core: &Core, ino: u64) -> FsResult<()> {
    if !crate::op::in_op(core) {
        return Ok(());
    }
    let tokens = core.tokens.clone();
    crate::op::defer(
        core,
        Box::new(move || {
            let resource = tokens.inode(ino);
            let v = tokens.client().version_hint(resource) + 1;
            tokens
                .client()
                .set_version(resource, v)
                .map_err(crate::coherence::token_error)
        }),
    )
}

fn dir_unit(core: &Core) -> u64 {
    core.geo.dir_block_bytes() as u64
}

fn global_depth(core: &Core, st: &InodeState) -> u8 {
    let d = dir_unit(core);
    if st.inode.size <= d {
        0
    } else {
        (st.inode.size / d).trailing_zeros() as u8
    }
}

fn is_inline(st: &InodeState) -> bool {
    matches!(st.inode.content, InodeContent::InlineDir(_))
}

/// Bytes the inode has left for inline entries.
fn inline_room(core: &Core, st: &InodeState) -> usize {
    payload_bytes(core.inode_bytes()).saturating_sub(xattrs_encoded_len(&st.inode.xattrs))
}

/// Load directory block `idx` into the cache; false if it is a hole.
fn load_block(core: &Core, st: &InodeState, idx: u64) -> FsResult<bool> {
    if st.dir_blocks.lock().contains_key(&idx) {
        return Ok(true);
    }
    let da = block_map::lookup(core, st, idx)?;
    if da.is_null() {
        return Ok(false);
    }
    let bytes =
        block_map::allocated_subblocks(core, st, idx) as usize * core.geo.subblock_bytes() as usize;
    let mut buf = vec![0u8; bytes];
    core.read_metadata(
        da,
        &mut buf,
        IoTag {
            buffer_type: BufferType::Directory,
            ino: st.inode.ino,
        },
    )?;
    let id = DirBlockId {
        ino: st.inode.ino,
        index: idx,
    };
    let block = DirBlock::decode(&buf, id, Location::Disk(da)).map_err(|e| {
        core.stats.corruptions.fetch_add(1, Ordering::Relaxed);
        tracing::error!("{e} (directory inode {})", st.inode.ino);
        FsError::from(e)
    })?;
    // Its capacity decides its pages and how it grows: it must be its allocation.
    if block.capacity_bytes as usize != bytes {
        return Err(core.integrity(
            crate::error::IntegrityError::new(
                "directory block",
                format!(
                    "block {idx} says it holds {} bytes, {bytes} are allocated to it",
                    block.capacity_bytes
                ),
            )
            .ino(st.inode.ino)
            .at(da),
        ));
    }
    st.dir_blocks
        .lock()
        .insert(idx, DirNode::from_block(block, da, false));
    Ok(true)
}

/// Names were granted to this node anew: the pages of cached blocks it did not change
/// are read again (another node may have changed them meanwhile); blocks it did not
/// change at all are dropped and read when next needed.
pub fn refresh_cached(core: &Core, h: &crate::core::InodeHandle) -> FsResult<()> {
    // In write: another operation of this node may be reading the cached blocks (it
    // found a block where it located it and must keep finding it there).
    let st = h.state.write();
    st.dir_blocks.lock().retain(|_, n| n.dirty_pages != 0);
    reread_clean_pages(core, &st)
}

/// Read the clean pages of every cached block again (the blocks stay where they are:
/// an operation of this node that located one keeps finding it), and note when
/// (`InodeState::names_seen`).
fn reread_clean_pages(core: &Core, st: &InodeState) -> FsResult<()> {
    // Every grant so far is older than what is read now.
    let clock = core.tokens.client().grant_clock();
    let cached: Vec<(u64, DiskAddress, bool)> = st
        .dir_blocks
        .lock()
        .iter()
        .map(|(i, n)| (*i, n.da, n.dirty_pages.count_ones() >= n.pages()))
        .collect();
    for (idx, da, all_dirty) in cached {
        let bytes = block_map::allocated_subblocks(core, st, idx) as usize
            * core.geo.subblock_bytes() as usize;
        let mut buf = vec![0u8; bytes];
        core.read_metadata(
            da,
            &mut buf,
            IoTag {
                buffer_type: BufferType::Directory,
                ino: st.inode.ino,
            },
        )?;
        let id = DirBlockId {
            ino: st.inode.ino,
            index: idx,
        };
        let fresh = match DirBlock::decode(&buf, id, Location::Disk(da)) {
            Ok(b) => b,
            // A block whose every page changed has nothing to refresh, and may not be
            // on disk yet: one a change of shape just made (a directory that left its
            // inode under `xw`, then took its names' pages, read bad magic here).
            Err(_) if all_dirty => continue,
            Err(e) => return Err(e.into()),
        };
        if let Some(n) = st.dir_blocks.lock().get_mut(&idx) {
            n.refresh_clean_pages(fresh);
        }
    }
    st.names_seen.fetch_max(clock, Ordering::SeqCst);
    Ok(())
}

/// Change cached block `idx` with `f` (which marks the pages it changes), accounting
/// the pages that turned dirty to the running log transaction.
fn modify_block<R>(st: &mut InodeState, idx: u64, f: impl FnOnce(&mut DirNode) -> R) -> R {
    let (r, newly) = {
        let mut cache = st.dir_blocks.lock();
        let node = cache.get_mut(&idx).expect("directory block cached");
        let before = node.dirty_pages.count_ones();
        let r = f(node);
        let newly =
            node.dirty_pages.count_ones().saturating_sub(before) as u64 * node.page_bytes() as u64;
        (r, newly)
    };
    st.mark_unit_dirty(newly);
    r
}

/// Cache a new (all pages dirty) directory block and account it to the running
/// transaction.
fn insert_new_block(st: &mut InodeState, idx: u64, node: DirNode) {
    let cap = node.capacity_bytes as u64;
    st.dir_blocks.lock().insert(idx, node);
    st.mark_unit_dirty(cap);
}

/// Logical index of the block holding `cookie`.
fn locate(core: &Core, st: &InodeState, cookie: u64) -> FsResult<u64> {
    let g = global_depth(core, st);
    let idx_g = index_for(cookie, g);
    for d in (0..=g).rev() {
        let idx = if d == 0 { 0 } else { idx_g & ((1u64 << d) - 1) };
        if load_block(core, st, idx)? {
            let cache = st.dir_blocks.lock();
            let node = &cache[&idx];
            let (lo, hi) = cookie_range(idx, node.depth);
            if node.depth > d || cookie < lo || cookie > hi {
                return Err(FsError::from(mako_format::FormatError::invalid(
                    "directory block",
                    Location::Disk(node.da),
                    format!(
                        "block {idx} at depth {} does not cover cookie {cookie}",
                        node.depth
                    ),
                )));
            }
            return Ok(idx);
        }
    }
    Err(FsError::from(mako_format::FormatError::invalid(
        "directory",
        Location::Memory,
        format!("directory inode {} has no block 0", st.inode.ino),
    )))
}

fn entry_at(core: &Core, st: &InodeState, cookie: u64) -> FsResult<Option<DirEntry>> {
    cover_cookie(core, st, cookie, false)?;
    if let InodeContent::InlineDir(e) = &st.inode.content {
        return Ok(e
            .binary_search_by_key(&cookie, |x| x.cookie)
            .ok()
            .map(|i| e[i].clone()));
    }
    let idx = locate(core, st, cookie)?;
    let cache = st.dir_blocks.lock();
    Ok(cache[&idx].entries.get(&cookie).cloned())
}

/// Find `name`: returns the entry if present, else the cookie it would get.
fn probe(core: &Core, st: &InodeState, name: &[u8]) -> FsResult<Result<DirEntry, u64>> {
    let mut c = home_cookie(name);
    loop {
        match entry_at(core, st, c)? {
            None => return Ok(Err(c)),
            Some(e) if e.name == name => return Ok(Ok(e)),
            Some(_) => {
                if c >= COOKIE_MAX {
                    return Err(FsError::NoSpace(
                        "directory hash space exhausted around this name".into(),
                    ));
                }
                c += 1;
            }
        }
    }
}

pub fn check_name(name: &[u8]) -> FsResult<()> {
    if name.len() > NAME_BYTES_MAX {
        return Err(FsError::NameTooLong(name.len()));
    }
    if name.is_empty() || name.contains(&b'/') || name.contains(&0) {
        return Err(FsError::Invalid(format!(
            "bad name {:?}",
            String::from_utf8_lossy(name)
        )));
    }
    Ok(())
}

pub fn lookup(core: &Core, st: &InodeState, name: &[u8]) -> FsResult<Option<DirEntry>> {
    if name.len() > NAME_BYTES_MAX {
        return Err(FsError::NameTooLong(name.len()));
    }
    Ok(probe(core, st, name)?.ok())
}

/// Add an entry; `Exists` if the name is taken. Returns the entry's cookie.
pub fn insert(core: &Core, st: &mut InodeState, name: &[u8], ino: u64, kind: u8) -> FsResult<u64> {
    check_name(name)?;
    let cookie = match probe(core, st, name)? {
        Ok(_) => return Err(FsError::Exists(String::from_utf8_lossy(name).into_owned())),
        Err(c) => c,
    };
    place(
        core,
        st,
        DirEntry {
            cookie,
            ino,
            kind,
            name: name.to_vec(),
        },
    )?;
    Ok(cookie)
}

/// Before an operation changes anything for an insert of `name`: if the block the
/// entry goes to is full, the insert will change the directory's shape, which needs
/// the inode in `xw` (`cover_structure`); asking for it only in `place`, after the new
/// inode was allocated, turned the mount read-only (three nodes creating in one
/// directory: a change, then a missing token). Entries in the inode are covered by
/// `need_parent` already.
pub fn prepare_insert(core: &Core, st: &InodeState, name: &[u8], kind: u8) -> FsResult<()> {
    if is_inline(st) {
        return Ok(());
    }
    let cookie = match probe(core, st, name)? {
        Ok(_) => return Ok(()),
        Err(c) => c,
    };
    let len = DirEntry {
        cookie,
        ino: 0,
        kind,
        name: name.to_vec(),
    }
    .encoded_len();
    let idx = locate(core, st, cookie)?;
    let room = st.dir_blocks.lock()[&idx].has_room(cookie, len);
    if !room {
        cover_structure(core, st)?;
    }
    Ok(())
}

/// Put `entry` at its cookie (free), in the inode or in the block that covers it,
/// splitting or growing the directory until it fits.
fn place(core: &Core, st: &mut InodeState, entry: DirEntry) -> FsResult<()> {
    let cookie = entry.cookie;
    let len = entry.encoded_len();
    if is_inline(st) {
        // The entries are inode content.
        cover_structure(core, st)?;
        cover_cookie(core, st, cookie, true)?;
        let used = match &st.inode.content {
            InodeContent::InlineDir(e) => entries_encoded_len(e),
            _ => 0,
        };
        // Other nodes wait for the directory inode (the manager said so with its
        // grant): they all create here too. Entries in the inode would pass the
        // inode from node to node in `xw` for every name; in blocks they need it
        // only in `rw`, and each its name's page. So the directory leaves its inode
        // now, and the manager downgrades the others' requests for `xw` to `rw`
        // (`shape_changed`: the seeds' pitfall, docs/coherence.md section 4).
        let crowded = crowded(core, st);
        if used + len <= inline_room(core, st) && !crowded {
            if let InodeContent::InlineDir(e) = &mut st.inode.content {
                let pos = e.partition_point(|x| x.cookie < cookie);
                e.insert(pos, entry);
            }
            st.add_entries(1);
            st.mark_dirty();
            return Ok(());
        }
        leave_inode(core, st, used + len, crowded)?;
        shape_changed(core, st.inode.ino)?;
    }
    loop {
        let idx = locate(core, st, cookie)?;
        cover_cookie(core, st, cookie, true)?;
        let room = st.dir_blocks.lock()[&idx].has_room(cookie, len);
        if room {
            modify_block(st, idx, |node| node.insert(entry));
            st.add_entries(1);
            return Ok(());
        }
        cover_structure(core, st)?;
        split_or_grow(core, st, idx)?;
        shape_changed(core, st.inode.ino)?;
    }
}

/// Take the entry at `cookie` out (inode or block).
fn take(core: &Core, st: &mut InodeState, cookie: u64) -> FsResult<()> {
    if is_inline(st) {
        cover_structure(core, st)?;
    }
    cover_cookie(core, st, cookie, true)?;
    if let InodeContent::InlineDir(e) = &mut st.inode.content {
        e.retain(|x| x.cookie != cookie);
    } else {
        let idx = locate(core, st, cookie)?;
        modify_block(st, idx, |node| node.remove(cookie));
    }
    st.add_entries(-1);
    st.mark_dirty();
    Ok(())
}

/// Other nodes waiting for a directory inode in `xw` when it was granted, from which
/// a directory in its inode leaves it at once (`place`). With fewer, the entries stay
/// in the inode until it is full, as on one node. (Three, not one: with one the
/// three-node simulation's workload moves almost every directory into blocks, which
/// found a shared writer's entry count applied twice (seeds 3 and 43, fixed: docs/
/// coherence.md section 4, "Entry and link counts") and a lookup in a page older than
/// its grant (seed 53, fixed: `fresh`); seeds 1-300 passed with it (1-90 checked on
/// the latest schedules), but the real
/// cluster's figures with it are not measured yet. `Core::crowd_nodes` holds a node's
/// threshold; the simulation can set another, `SeedConfig::crowd_nodes`.)
pub const CROWD_NODES: u32 = 3;

/// Is this operation's directory inode token (`xw`) one that a crowd of other nodes
/// was waiting for when it was granted (`TokenClient::contenders`)?
fn crowded(core: &Core, st: &InodeState) -> bool {
    crate::op::in_op(core)
        && core
            .tokens
            .client()
            .contenders(core.tokens.inode(st.inode.ino))
            >= core.crowd_nodes.load(std::sync::atomic::Ordering::Relaxed)
}

/// Move the inline entries out of the inode into directory blocks: a fragment sized
/// for them, unless `crowded` (other nodes wait to create here: a full block, so that
/// growing the fragment does not take the inode in `xw` from all of them again).
fn leave_inode(core: &Core, st: &mut InodeState, needed: usize, crowded: bool) -> FsResult<()> {
    let entries = match std::mem::replace(&mut st.inode.content, InodeContent::Pointers(vec![])) {
        InodeContent::InlineDir(e) => e,
        other => {
            st.inode.content = other;
            return Ok(());
        }
    };
    st.inode.content = InodeContent::Pointers(vec![
        DiskAddress::NULL;
        mako_format::inode::pointers_in_inode(
            core.inode_bytes()
        )
    ]);
    let cfg = core.cfg.read().clone();
    let desc = core.desc.lock().clone();
    let avoid = cfg.avoid_dir_fragments.unwrap_or(desc.avoid_dir_fragments);
    let levels = cfg
        .dir_pre_split_levels
        .unwrap_or(desc.dir_pre_split_levels)
        .min(10);
    let sb = core.geo.subblock_bytes() as usize;
    let full_sb = core.geo.dir_block_subblocks();
    let (depth, cap_sb) = if levels > 0 {
        (levels, full_sb)
    } else if avoid || crowded {
        (0, full_sb)
    } else {
        let want = (DIR_BLOCK_HEADER_BYTES + needed) * 2;
        (0, (want.div_ceil(sb) as u32).clamp(1, full_sb))
    };
    let ino = st.inode.ino;
    let nblocks = 1u64 << depth;
    for idx in 0..nblocks {
        let (lo, hi) = cookie_range(idx, depth);
        let mine: Vec<DirEntry> = entries
            .iter()
            .filter(|e| e.cookie >= lo && e.cookie <= hi)
            .cloned()
            .collect();
        let da = core.alloc.allocate(AllocKind::Metadata, cap_sb, ino, idx)?;
        st.inode.subblocks += cap_sb as u64;
        block_map::set(core, st, idx, da)?;
        let block = DirBlock {
            id: DirBlockId { ino, index: idx },
            depth,
            capacity_bytes: cap_sb * sb as u32,
            entries: mine,
        };
        insert_new_block(st, idx, DirNode::from_block(block, da, true));
    }
    if cap_sb < full_sb {
        st.inode.size = cap_sb as u64 * sb as u64;
        st.inode.last_block_subblocks = cap_sb as u16;
    } else {
        st.inode.size = dir_unit(core) << depth;
        st.inode.last_block_subblocks = 0;
    }
    st.mark_dirty();
    Ok(())
}

/// Move an inline directory into a directory block (to make room in the inode).
pub fn force_out_of_inode(core: &Core, st: &mut InodeState) -> FsResult<()> {
    let used = match &st.inode.content {
        InodeContent::InlineDir(e) => entries_encoded_len(e),
        _ => return Ok(()),
    };
    cover_structure(core, st)?;
    leave_inode(core, st, used.max(64), false)?;
    shape_changed(core, st.inode.ino)
}

/// Grow or split block `idx`, and keep going on the resulting blocks until none has a
/// page holding more than a page can: a reshaped block's entries fall into pages
/// anew, and a page that ends up overfull could not be written.
fn split_or_grow(core: &Core, st: &mut InodeState, idx: u64) -> FsResult<()> {
    let (depth, _) = block_shape(st, idx);
    split_or_grow_once(core, st, idx)?;
    let (new_depth, _) = block_shape(st, idx);
    let mut check = vec![idx];
    if new_depth > depth {
        check.push(idx + (1u64 << depth));
    }
    for b in check {
        if overfull(st, b) {
            split_or_grow(core, st, b)?;
        }
    }
    Ok(())
}

fn block_shape(st: &InodeState, idx: u64) -> (u8, u32) {
    let cache = st.dir_blocks.lock();
    let n = &cache[&idx];
    (n.depth, n.capacity_bytes)
}

fn overfull(st: &InodeState, idx: u64) -> bool {
    let cache = st.dir_blocks.lock();
    let n = &cache[&idx];
    let room = mako_format::dir_block::page_room(n.capacity_bytes);
    n.page_used.iter().any(|&u| u > room)
}

fn split_or_grow_once(core: &Core, st: &mut InodeState, idx: u64) -> FsResult<()> {
    let sb = core.geo.subblock_bytes();
    let full_sb = core.geo.dir_block_subblocks();
    let ino = st.inode.ino;
    let (cap, depth, old_da) = {
        let cache = st.dir_blocks.lock();
        let n = &cache[&idx];
        (n.capacity_bytes, n.depth, n.da)
    };
    let cap_sb = cap / sb;
    if cap_sb < full_sb {
        // A fragment directory grows (doubling) until it is a full directory block.
        let new_sb = (cap_sb * 2).min(full_sb);
        let da = core.alloc.allocate(AllocKind::Metadata, new_sb, ino, 0)?;
        core.alloc.free(old_da, cap_sb, ino)?;
        st.inode.subblocks = st.inode.subblocks + new_sb as u64 - cap_sb as u64;
        block_map::set(core, st, 0, da)?;
        // At its new address and size every page of the block is new.
        modify_block(st, 0, |n| {
            n.capacity_bytes = new_sb * sb;
            n.da = da;
            n.dirty_pages = 0;
            n.reshape();
        });
        st.inode.size = new_sb as u64 * sb as u64;
        st.inode.last_block_subblocks = if new_sb == full_sb { 0 } else { new_sb as u16 };
        st.mark_dirty();
        return Ok(());
    }
    if depth >= DIR_DEPTH_MAX {
        return Err(FsError::NoSpace(format!(
            "directory inode {ino}: hash tree at its deepest"
        )));
    }
    // Split: entries whose next cookie bit is set move to block idx + 2^depth.
    let new_depth = depth + 1;
    let right_idx = idx + (1u64 << depth);
    let bit = 62 - depth as u32;
    let g = global_depth(core, st);
    if new_depth > g {
        st.inode.size = dir_unit(core) << new_depth;
    }
    let da = core
        .alloc
        .allocate(AllocKind::Metadata, full_sb, ino, right_idx)?;
    st.inode.subblocks += full_sb as u64;
    block_map::set(core, st, right_idx, da)?;
    // Cookies with the bit set are the upper half of the block's range: split there.
    let (lo, _) = cookie_range(idx, depth);
    let boundary = lo | (1u64 << bit);
    let moved: Vec<DirEntry> = modify_block(st, idx, |left| {
        let moved: Vec<DirEntry> = left.entries.split_off(&boundary).into_values().collect();
        debug_assert!(moved.iter().all(|e| (e.cookie >> bit) & 1 == 1));
        // Half the range: every page's range changes.
        left.depth = new_depth;
        left.dirty_pages = 0;
        left.reshape();
        moved
    });
    let right = DirBlock {
        id: DirBlockId {
            ino,
            index: right_idx,
        },
        depth: new_depth,
        capacity_bytes: full_sb * sb,
        entries: moved,
    };
    insert_new_block(st, right_idx, DirNode::from_block(right, da, true));
    core.stats.dir_splits.fetch_add(1, Ordering::Relaxed);
    Ok(())
}

/// Remove `name`, returning its entry.
pub fn remove(core: &Core, st: &mut InodeState, name: &[u8]) -> FsResult<DirEntry> {
    let entry = match probe(core, st, name)? {
        Ok(e) => e,
        Err(_) => {
            return Err(FsError::NotFound(
                String::from_utf8_lossy(name).into_owned(),
            ))
        }
    };
    cover_removal(core, st, entry.cookie)?;
    take(core, st, entry.cookie)?;
    close_gap(core, st, entry.cookie)?;
    Ok(entry)
}

/// Linear probing without tombstones: a lookup stops at the first free cookie, so a
/// freed cookie must not cut the probe chain of an entry placed past it. Entries after
/// the hole whose home cookie is at or before it move back into it (backward-shift
/// deletion), until a free cookie ends the run. Only names whose 63-bit home cookies
/// collide or are adjacent are ever moved — in practice never, unless names are made
/// to collide; a readdir in progress may then miss a moved entry once.
fn close_gap(core: &Core, st: &mut InodeState, freed: u64) -> FsResult<()> {
    let mut hole = freed;
    let mut j = freed;
    loop {
        if j >= COOKIE_MAX {
            return Ok(());
        }
        j += 1;
        let Some(e) = entry_at(core, st, j)? else {
            return Ok(());
        };
        if home_cookie(&e.name) <= hole {
            take(core, st, j)?;
            place(core, st, DirEntry { cookie: hole, ..e })?;
            core.stats.dir_entries_moved.fetch_add(1, Ordering::Relaxed);
            hole = j;
        }
    }
}

/// Before a removal changes anything: the tokens the removal and the backward shift
/// after it (see `close_gap`) will need. A run of occupied cookies after the freed one
/// that stays within its page needs only the page; one that crosses into another page
/// may move entries between pages, which can overfill one: that takes the block.
fn cover_removal(core: &Core, st: &InodeState, freed: u64) -> FsResult<()> {
    if !crate::op::in_op(core) {
        return Ok(());
    }
    if is_inline(st) || holds_exclusive(core, st) {
        // Under the inode in `xw`: every cookie of the run may change hands.
        if is_inline(st) {
            cover_structure(core, st)?;
        }
        return cover_run(core, st, freed);
    }
    let page = page_range(core, st, freed)?;
    let mut end = freed;
    while end < COOKIE_MAX && end + 1 < page.end {
        match entry_at(core, st, end + 1)? {
            Some(_) => end += 1,
            None => return cover(core, st, page, true),
        }
    }
    if end + 1 < page.end {
        return cover(core, st, page, true);
    }
    // The run reaches the page's end: it may go on in the next page, and moving
    // entries between pages may overfill one. That takes the directory inode.
    cover_structure(core, st)?;
    cover_run(core, st, freed)
}

/// Under the directory inode in `xw`: the names from `freed` to the end of the run of
/// occupied cookies after it (the entries `close_gap` may move, and their new places).
fn cover_run(core: &Core, st: &InodeState, freed: u64) -> FsResult<()> {
    let mut end = freed;
    while end < COOKIE_MAX && entry_at(core, st, end + 1)?.is_some() {
        end += 1;
    }
    cover(core, st, ByteRange::new(freed, end.saturating_add(1)), true)
}

/// Point an existing entry at another inode (rename over an existing name).
pub fn replace(
    core: &Core,
    st: &mut InodeState,
    name: &[u8],
    ino: u64,
    kind: u8,
) -> FsResult<DirEntry> {
    let entry = match probe(core, st, name)? {
        Ok(e) => e,
        Err(_) => {
            return Err(FsError::NotFound(
                String::from_utf8_lossy(name).into_owned(),
            ))
        }
    };
    if is_inline(st) {
        cover_structure(core, st)?;
    }
    cover_cookie(core, st, entry.cookie, true)?;
    let upd = |e: &mut DirEntry| {
        if e.cookie == entry.cookie {
            e.ino = ino;
            e.kind = kind;
        }
    };
    if let InodeContent::InlineDir(e) = &mut st.inode.content {
        e.iter_mut().for_each(upd);
    } else {
        let idx = locate(core, st, entry.cookie)?;
        modify_block(st, idx, |node| {
            node.entries.get_mut(&entry.cookie).map(upd);
            node.touch(entry.cookie);
        });
    }
    st.mark_dirty();
    Ok(entry)
}

/// Up to `max` entries with cookies greater than `after`, in cookie order.
pub fn list(core: &Core, st: &InodeState, after: u64, max: usize) -> FsResult<Vec<DirEntry>> {
    if let InodeContent::InlineDir(e) = &st.inode.content {
        cover(core, st, ByteRange::WHOLE, false)?;
        let start = e.partition_point(|x| x.cookie <= after);
        return Ok(e[start..].iter().take(max).cloned().collect());
    }
    let mut out = Vec::new();
    let mut c = after.saturating_add(1).max(COOKIE_MIN);
    while c <= COOKIE_MAX && out.len() < max {
        let idx = locate(core, st, c)?;
        cover(core, st, block_cookies(st, idx), false)?;
        let cache = st.dir_blocks.lock();
        let node = &cache[&idx];
        for e in node.entries.range(c..).map(|(_, e)| e) {
            if out.len() >= max {
                break;
            }
            out.push(e.clone());
        }
        let (_, hi) = cookie_range(idx, node.depth);
        if hi >= COOKIE_MAX {
            break;
        }
        c = hi + 1;
    }
    Ok(out)
}

/// Number of blocks and the hash depth, for diagnostics and tests.
pub fn shape(core: &Core, st: &InodeState) -> (usize, u8) {
    if is_inline(st) {
        (0, 0)
    } else {
        (st.dir_blocks.lock().len(), global_depth(core, st))
    }
}
