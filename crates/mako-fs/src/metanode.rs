//! The metanode (docs/coherence.md section 4). While several nodes write one file, one
//! of them — the metanode — owns its inode and indirect blocks: it alone changes and
//! logs them. The others hold the inode in `rw` and keep a *shared* view (`Shared`):
//! block addresses they asked the metanode for (cached under their data tokens),
//! blocks they allocated themselves and must report, and the size and times of their
//! own writes. They send the metanode idempotent updates (sizes and times are maxima,
//! a block pointer changes only from the address the sender saw), so a retried or
//! duplicated update is harmless.
//!
//! This module has both sides: the `FileSystem` service that answers as metanode, and
//! the calls a shared writer makes. Requests to a metanode are *leaf* requests: their
//! handler takes only local locks and the local log gate, never a token or a remote
//! call (rule R4).

use crate::core::{timestamp, Core, InodeHandle, InodeState};
use crate::error::{FsError, FsResult};
use crate::writer_seq::{Key, Outcome, Seen};
use mako_format::error::Location;
use mako_format::inode::{Inode, Timestamp};
use mako_format::DiskAddress;
use mako_rt::{CallOptions, NodeId, Service, ServiceId};
use mako_token::{ByteRange, TokenMode};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, OnceLock, Weak};
use std::time::Duration;

/// A block pointer a shared writer changed: `unit` now lives at `new` (`subblocks` of
/// it) instead of `old` (null for a hole). The metanode applies it only where the
/// pointer is still `old` (or already `new`), and frees `old`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SetBlock {
    pub unit: u64,
    pub old: u64,
    pub new: u64,
    pub subblocks: u32,
}

/// What a shared writer reports: the file is at least `size_at_least` long, was
/// modified at `mtime` and changed at `ctime`, and these blocks moved.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Update {
    pub ino: u64,
    pub size_at_least: u64,
    pub mtime: (i64, u32),
    pub ctime: (i64, u32),
    pub sets: Vec<SetBlock>,
    /// A directory's entry count and link count change by these (not idempotent:
    /// each update is applied once; the metanode remembers `key`).
    pub entries_delta: i64,
    pub nlink_delta: i64,
    /// The update's idempotency key (`writer_seq`): every copy `to_metanode` sends
    /// carries the same one, and a metanode that applied it answers a copy without
    /// applying it again. None for an update applied where it is made.
    pub key: Option<Key>,
}

/// Requests of the `FileSystem` service.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum FsRequest {
    /// The metanode's merged inode.
    GetAttr {
        ino: u64,
    },
    /// Addresses of `count` units from `first`: (unit, address, subblocks).
    GetBlocks {
        ino: u64,
        first: u64,
        count: u32,
    },
    Update(Update),
    /// Commit the metanode's log (a shared writer's fsync).
    Sync {
        ino: u64,
    },
    /// Free these extents (raw address, subblocks) and inode numbers in the receiver's
    /// regions and segments: the sender freed them in files it changed, and the
    /// transactions that did are checkpointed (`ownership::deliver_frees`).
    /// `key` makes a copy harmless (`writer_seq`); `to` is the incarnation of the
    /// receiver the sender means (0: not known yet): another one answers
    /// `Incarnation` and frees nothing.
    Free {
        key: Key,
        to: u64,
        extents: Vec<(u64, u32)>,
        inos: Vec<u64>,
    },
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum FsReply {
    /// An encoded inode.
    Inode(Vec<u8>),
    /// The addresses asked for (unit, address, subblocks), and the file's size as the
    /// metanode has it: every writer that gave up a data token reported first, so it
    /// covers whatever they wrote into the units the asker now holds.
    Blocks {
        size: u64,
        list: Vec<(u64, u64, u32)>,
    },
    Done,
    /// This node is not (or no longer) the file's metanode: locate it again.
    NotMetanode,
    /// The metanode could not commit its log (it was fenced, or its log failed): what
    /// was asked is not durable. The asker waits for its recovery, as for a metanode
    /// that does not answer, and sends it again to the next one.
    Unavailable(String),
    Failed(String),
    /// The receiver is this incarnation, not the one the request named: it did nothing.
    Incarnation(u64),
}

/// A shared writer's view of a file whose metanode is another node.
#[derive(Debug, Default)]
pub struct Shared {
    pub metanode: Option<NodeId>,
    /// Unit -> (address, subblocks), as the metanode said or as this node set them.
    /// Valid while this node holds a data token over the unit.
    pub blocks: BTreeMap<u64, (DiskAddress, u32)>,
    /// Pointers this node changed and has not reported yet.
    pub pending: Vec<SetBlock>,
    /// Directory entries and links this node added (or removed) and has not reported.
    pub entries_delta: i64,
    pub nlink_delta: i64,
    /// Size, mtime and ctime as the metanode last had them from this node (or as this
    /// view began): a report with nothing new is not sent. A shared writer that only
    /// read must not need the metanode when its tokens go (the metanode may be going
    /// at the same moment).
    pub reported: Option<(u64, Timestamp, Timestamp)>,
}

/// Units fetched per `GetBlocks` beyond what an operation needs (read-ahead of the
/// block map: a streaming writer asks once per this many blocks).
pub const BLOCK_MAP_FETCH: u64 = 64;
/// Attempts to reach the metanode while it changes hands.
const LOCATE_ATTEMPTS_MAX: u32 = 1000;

fn ts(t: Timestamp) -> (i64, u32) {
    (t.sec, t.nsec)
}
fn from_ts((sec, nsec): (i64, u32)) -> Timestamp {
    Timestamp { sec, nsec }
}
fn later(a: Timestamp, b: Timestamp) -> Timestamp {
    if (b.sec, b.nsec) > (a.sec, a.nsec) {
        b
    } else {
        a
    }
}

// ---- the metanode's side ---------------------------------------------------------

/// The `FileSystem` service of a node.
#[derive(Default)]
pub struct FsService {
    core: OnceLock<Weak<Core>>,
}

impl FsService {
    pub fn attach(&self, core: &Arc<Core>) {
        let _ = self.core.set(Arc::downgrade(core));
    }
}

impl Service for FsService {
    fn handle(&self, _from: NodeId, request: &[u8]) -> Vec<u8> {
        let reply = match (
            self.core.get().and_then(|w| w.upgrade()),
            mako_rt::decode::<FsRequest>("file system request", request),
        ) {
            (None, _) => FsReply::NotMetanode,
            (_, Err(e)) => FsReply::Failed(e.to_string()),
            (Some(core), Ok(req)) => {
                core.stats.metanode_served.fetch_add(1, Ordering::Relaxed);
                match serve(&core, req) {
                    Ok(r) => r,
                    // This node can no longer serve (its lease ran out, it was
                    // expelled, its file system panicked: a disk read refused by
                    // the fence): as a metanode that does not answer, the asker
                    // waits for its recovery and a new metanode rather than fail
                    // (faults seed 610 of `bad_disk_panics_the_node_s_file_system`:
                    // a survivor's write got EIO from its panicked metanode).
                    Err(e)
                        if matches!(e, FsError::Disk(mako_disk::DiskError::Fenced { .. }))
                            || core.check_fence().is_err() =>
                    {
                        FsReply::Unavailable(e.to_string())
                    }
                    Err(e) => FsReply::Failed(e.to_string()),
                }
            }
        };
        mako_rt::encode("file system reply", &reply).unwrap_or_default()
    }
}

fn serve(core: &Arc<Core>, req: FsRequest) -> FsResult<FsReply> {
    if let FsRequest::Free {
        key,
        to,
        extents,
        inos,
    } = &req
    {
        return Ok(serve_free(core, key, *to, extents, inos));
    }
    let ino = match &req {
        FsRequest::GetAttr { ino } | FsRequest::GetBlocks { ino, .. } => *ino,
        FsRequest::Update(u) => u.ino,
        FsRequest::Sync { ino } => *ino,
        // Served above.
        FsRequest::Free { .. } => return Ok(FsReply::Done),
    };
    // Still the metanode, and staying so while this request is served?
    let Ok(_hold) = core
        .tokens
        .try_hold_inode(ino, crate::coherence::Need::Write)
    else {
        return Ok(FsReply::NotMetanode);
    };
    let Some(h) = core.cached_handle(ino) else {
        return Ok(FsReply::NotMetanode);
    };
    if !h.state.read().metanode {
        // The manager named this node the metanode when it granted the write token
        // (the grant said so), but no operation of this node has used the inode since:
        // take over now. Waiting for its own operation to get there could wait for
        // a token the asker's operation holds (docs/coherence.md section 4).
        if !core.tokens.client().named_metanode(core.tokens.inode(ino)) {
            return Ok(FsReply::NotMetanode);
        }
        let st = h.state.write();
        if !st.metanode {
            core.stats.metanode_named.fetch_add(1, Ordering::Relaxed);
            take_over(core, &h, st)?;
        }
    }
    match req {
        FsRequest::GetAttr { .. } => {
            let st = h.state.read();
            Ok(FsReply::Inode(st.inode.encode(core.inode_bytes())?))
        }
        FsRequest::GetBlocks { first, count, .. } => {
            let st = h.state.read();
            let mut out = Vec::with_capacity(count as usize);
            for unit in first..first.saturating_add(count as u64) {
                let da = crate::block_map::lookup(core, &st, unit)?;
                let sb = if da.is_null() {
                    0
                } else {
                    crate::block_map::allocated_subblocks(core, &st, unit)
                };
                out.push((unit, da.raw(), sb));
            }
            Ok(FsReply::Blocks {
                size: st.inode.size,
                list: out,
            })
        }
        FsRequest::Update(u) => {
            let lasting = {
                let _tx = core.begin();
                let mut st = h.state.write();
                let lasting = !u.sets.is_empty()
                    || u.entries_delta != 0
                    || u.nlink_delta != 0
                    || u.size_at_least > st.inode.size;
                // Looked up and recorded under the inode's lock: a copy arriving while
                // the first is applied finds it applied.
                if let Some(key) = &u.key {
                    match core.applied.check(key) {
                        Seen::New => {}
                        Seen::Copy(Outcome::Failed(e)) => {
                            core.stats.copies_answered.fetch_add(1, Ordering::Relaxed);
                            return Ok(FsReply::Failed(e));
                        }
                        Seen::Copy(_) | Seen::Acknowledged => {
                            // Applied once: answered as the first copy was (made durable
                            // if it lasts), not applied again.
                            core.stats.copies_answered.fetch_add(1, Ordering::Relaxed);
                            drop(st);
                            drop(_tx);
                            let lasting =
                                !u.sets.is_empty() || u.entries_delta != 0 || u.nlink_delta != 0;
                            return Ok(if lasting {
                                commit_for_writer(core)
                            } else {
                                FsReply::Done
                            });
                        }
                    }
                }
                let applied = apply_update(core, &mut st, &u);
                if let Some(key) = &u.key {
                    core.applied.record(
                        key,
                        match &applied {
                            Ok(()) => Outcome::Applied,
                            Err(e) => Outcome::Failed(e.to_string()),
                        },
                    );
                }
                applied?;
                lasting
            };
            if lasting {
                // Durable before the writer takes it as reported: it keeps nothing of
                // it, so a metanode that failed with it uncommitted would lose another
                // node's blocks, size or entry count (faults seed 68 of
                // `pause_past_the_lease`: a survivor's records were lost with the
                // expelled metanode). Times alone stay lazy.
                return Ok(commit_for_writer(core));
            }
            Ok(FsReply::Done)
        }
        FsRequest::Sync { .. } => Ok(commit_for_writer(core)),
        FsRequest::Free { .. } => Ok(FsReply::Done),
    }
}

/// Free what another node freed in this node's regions and segments, once per key
/// (`writer_seq`): a copy of a batch this incarnation applied is answered as the first
/// was and frees nothing. A batch meant for another incarnation of this node (one
/// that may have applied it before it restarted) is refused.
fn serve_free(core: &Core, key: &Key, to: u64, extents: &[(u64, u32)], inos: &[u64]) -> FsReply {
    if to != core.writer.incarnation {
        return FsReply::Incarnation(core.writer.incarnation);
    }
    let _one = core.applied.free_apply.lock();
    match core.applied.check(key) {
        Seen::New => {}
        Seen::Copy(Outcome::Running) => {
            return FsReply::Unavailable("a copy of these frees is being applied".into())
        }
        Seen::Copy(Outcome::Failed(e)) => {
            core.stats.copies_answered.fetch_add(1, Ordering::Relaxed);
            return FsReply::Failed(e);
        }
        Seen::Copy(Outcome::Applied) | Seen::Acknowledged => {
            core.stats.copies_answered.fetch_add(1, Ordering::Relaxed);
            return FsReply::Done;
        }
    }
    if let Err(e) = core.check_writable() {
        // Nothing freed: a later copy may be.
        core.applied.forget(key);
        return FsReply::Unavailable(e.to_string());
    }
    // Only what this node still owns is freed in its map; the rest becomes its own
    // foreign free and travels on.
    match crate::ownership::apply_frees(core, extents, inos) {
        Ok(()) => {
            core.applied.record(key, Outcome::Applied);
            core.stats
                .foreign_frees_served
                .fetch_add(1, Ordering::Relaxed);
            FsReply::Done
        }
        Err(e) => {
            // Perhaps part freed: no copy frees anything again.
            core.applied.record(key, Outcome::Failed(e.to_string()));
            FsReply::Failed(e.to_string())
        }
    }
}

/// Commit this node's log for a shared writer's update or fsync: `Done`, or
/// `Unavailable` when the log cannot be committed (this node was fenced, or its log
/// failed and the mount is read-only): the writer then waits for this node's recovery
/// and a new metanode, as for one that does not answer.
fn commit_for_writer(core: &Core) -> FsReply {
    let seq = core.journal.running_seq();
    match core.journal.commit_upto(core, seq) {
        Ok(()) => FsReply::Done,
        Err(e) => FsReply::Unavailable(e.to_string()),
    }
}

/// Merge a shared writer's update into the inode this node owns as metanode. Call with
/// a transaction handle open and the inode locked.
pub fn apply_update(core: &Core, st: &mut InodeState, u: &Update) -> FsResult<()> {
    debug_assert!(st.metanode, "update applied by a node that is not metanode");
    let mut changed = false;
    for s in &u.sets {
        let cur = crate::block_map::lookup(core, st, s.unit)?;
        let new = DiskAddress::from_raw(s.new);
        if cur == new {
            continue; // already applied (a retry)
        }
        if cur.raw() != s.old {
            return Err(FsError::Token(format!(
                "inode {} unit {}: a shared writer moved it from {} but the metanode has {}; \
                 two nodes allocated one block (a token bug)",
                u.ino,
                s.unit,
                DiskAddress::from_raw(s.old),
                cur
            )));
        }
        if !cur.is_null() {
            let old_sb = crate::block_map::allocated_subblocks(core, st, s.unit);
            core.alloc.free(cur, old_sb, u.ino)?;
            st.inode.subblocks = st.inode.subblocks.saturating_sub(old_sb as u64);
        }
        crate::block_map::set(core, st, s.unit, new)?;
        st.inode.subblocks += s.subblocks as u64;
        if Some(s.unit) == crate::block_map::last_unit(core, &st.inode) {
            let spb = core.geo.subblocks_per_block;
            st.inode.last_block_subblocks = if s.subblocks < spb {
                s.subblocks as u16
            } else {
                0
            };
        }
        changed = true;
    }
    if u.size_at_least > st.inode.size {
        let before = crate::block_map::last_unit(core, &st.inode);
        if let Some(b) = before.filter(|_| st.inode.last_block_subblocks != 0) {
            if u.size_at_least.div_ceil(core.block_bytes()) > b + 1
                && !crate::block_map::lookup(core, st, b)?.is_null()
            {
                // A writer that grows the file past a fragment moves that unit to a
                // whole block first (`file_io::grow_prepare`, reported in `sets`), and
                // nobody makes a fragment while others write: one left here would stop
                // being the last block and be read as a whole one.
                return Err(FsError::integrity(
                    crate::error::IntegrityError::new(
                        "shared write",
                        format!(
                            "a shared writer grows inode {} to {} bytes past unit {b}, \
                             still a fragment of {} subblocks",
                            u.ino, u.size_at_least, st.inode.last_block_subblocks
                        ),
                    )
                    .ino(u.ino),
                ));
            }
        }
        st.inode.size = u.size_at_least;
        if before != crate::block_map::last_unit(core, &st.inode) {
            st.inode.last_block_subblocks = 0;
        }
        changed = true;
    }
    if u.entries_delta != 0 || u.nlink_delta != 0 {
        st.inode.entries = (st.inode.entries as i64 + u.entries_delta).max(0) as u64;
        st.inode.nlink = (st.inode.nlink as i64 + u.nlink_delta).max(0) as u32;
        changed = true;
    }
    let m = later(st.inode.mtime, from_ts(u.mtime));
    let c = later(st.inode.ctime, from_ts(u.ctime));
    if m != st.inode.mtime || c != st.inode.ctime {
        st.inode.mtime = m;
        st.inode.ctime = c;
        changed = true;
    }
    if changed {
        st.mark_dirty();
    }
    Ok(())
}

// ---- the shared writer's side ----------------------------------------------------

/// Bring the handle's role in line with the token this node holds, without asking
/// anyone (`Core::get` calls it for every use): `xw` makes it the metanode, `ro` or no
/// write token a plain holder, and `rw` without knowing the metanode a shared writer
/// until `prepare` finds out (so nothing is logged by a node that may not own it).
pub fn settle(core: &Core, h: &InodeHandle) -> FsResult<()> {
    let mode = core.tokens.inode_mode(h.ino);
    let (metanode, shared) = {
        let st = h.state.read();
        (st.metanode, st.shared.is_some())
    };
    match mode {
        Some(TokenMode::Xw) if metanode && !shared => Ok(()),
        Some(TokenMode::Rw) if metanode || shared => Ok(()),
        Some(TokenMode::Ro) | None if !metanode && !shared => Ok(()),
        Some(TokenMode::Rw) => {
            if let Some(hook) = core.test_settle_gap.get() {
                hook();
            }
            let mut st = h.state.write();
            // Looked at again under the write lock: since the look above this node
            // may have become the metanode (a request it served took over, `serve`;
            // so does another operation's `locate`), or another operation may have
            // begun the shared view. A shared view set over the metanode made it
            // answer `GetBlocks` from that empty view, "needs the address of unit N
            // from its metanode": other nodes' reads of the file failed with EIO
            // until its token left (three-node seed 172).
            if st.metanode || st.shared.is_some() {
                return Ok(());
            }
            let now = (st.inode.size, st.inode.mtime, st.inode.ctime);
            st.shared = Some(Box::new(Shared {
                reported: Some(now),
                ..Default::default()
            }));
            Ok(())
        }
        _ => prepare(core, h),
    }
}

/// Work out this node's role for a file it is about to read or write, with no lock
/// held (phase A): the owner of the inode (`xw`, a reader's `ro`, or the metanode), or
/// a shared writer that talks to the metanode. A node that becomes metanode reads the
/// inode again from disk (the last metanode wrote it there before it resigned).
pub fn prepare(core: &Core, h: &InodeHandle) -> FsResult<()> {
    let mode = core.tokens.inode_mode(h.ino);
    match mode {
        Some(TokenMode::Xw) => {
            let mut st = h.state.write();
            if st.shared.is_some() {
                // Everyone else gave up: the disk holds the merged inode, except what
                // this node changed as a shared writer and had not reported yet (an
                // upgrade from `rw` revokes only the others).
                return take_over(core, h, st);
            }
            // Under the lock of the look at `shared`: a shared view begun between the
            // two (the token weakened to `rw` meanwhile) would be left under a
            // metanode (see `settle`).
            st.metanode = true;
            Ok(())
        }
        Some(TokenMode::Rw) => {
            if h.state.read().metanode {
                return Ok(());
            }
            let known = h.state.read().shared.as_ref().and_then(|s| s.metanode);
            if known.is_some() {
                return Ok(());
            }
            locate(core, h)
        }
        // A reader (or a node that is about to acquire): the local copy is what the
        // disk holds, written there by the last writer.
        _ => {
            let mut st = h.state.write();
            st.metanode = false;
            if st.shared.is_some() {
                st.shared = None;
                reload(core, &mut st)?;
            }
            Ok(())
        }
    }
}

/// Become the metanode: start from what the last one wrote in place, then apply what
/// this node changed while it was a shared writer and had not reported (its pending
/// block pointers, a larger size, later times, entry and link counts). Dropping those
/// would lose the data this node wrote into blocks it allocated (three-node seed 19: a
/// truncate upgrading `rw` to `xw` discarded two pending pointers and a record).
fn take_over(
    core: &Core,
    h: &InodeHandle,
    mut st: parking_lot::RwLockWriteGuard<'_, InodeState>,
) -> FsResult<()> {
    let pending = st.shared.take();
    let (size, mtime, ctime) = (st.inode.size, st.inode.mtime, st.inode.ctime);
    // Directory pages this node logged as a shared writer stay in its log; the inode
    // the last metanode wrote is the base.
    reload(core, &mut st)?;
    st.metanode = true;
    let Some(p) = pending else {
        return Ok(());
    };
    if p.pending.is_empty()
        && size <= st.inode.size
        && p.entries_delta == 0
        && p.nlink_delta == 0
        && later(st.inode.mtime, mtime) == st.inode.mtime
        && later(st.inode.ctime, ctime) == st.inode.ctime
    {
        return Ok(());
    }
    drop(st);
    // A whole change of its own: an operation that called this (`Core::get` settles
    // the handle) may still restart for a token it finds missing next (three-node
    // seed 266: an unlink turned the mount read-only so).
    crate::journal::complete_change(|| {
        let _tx = core.begin();
        let mut st = h.state.write();
        apply_update(
            core,
            &mut st,
            &Update {
                ino: h.ino,
                size_at_least: size,
                mtime: ts(mtime),
                ctime: ts(ctime),
                sets: p.pending,
                entries_delta: p.entries_delta,
                nlink_delta: p.nlink_delta,
                key: None,
            },
        )
    })
}

fn reload(core: &Core, st: &mut InodeState) -> FsResult<()> {
    // From the disk, not from a cached inode-file chunk: under `rw` the chunk may have
    // been read while the last metanode still had the inode (it wrote it in place
    // before it gave its token up, which is what this node reads now).
    crate::cache_flush::drop_inode_chunk(core, st.inode.ino);
    st.inode = core.read_inode(st.inode.ino)?;
    st.indirect.lock().clear();
    // Directory blocks with pages this node changed and has not committed stay: the
    // pages are its own (under its name tokens) and exist nowhere else yet; blocks do
    // not move while this node holds the inode in `rw`. Dropping them lost a name
    // this node had just inserted (its own unlink then found ENOENT).
    st.dir_blocks.lock().retain(|_, n| n.dirty_pages != 0);
    st.shared = None;
    // Read from disk just now: `Core::get` must not read it again over what this node
    // merges from here on (a takeover in `serve` may find a handle marked stale).
    st.stale = false;
    Ok(())
}

/// Ask the token manager who the metanode is (becoming it if there is none).
fn locate(core: &Core, h: &InodeHandle) -> FsResult<()> {
    let res = core.tokens.inode(h.ino);
    let m = core
        .tokens
        .client()
        .locate_metanode(res, true)
        .map_err(crate::coherence::token_error)?;
    let mut st = h.state.write();
    match m {
        Some(n) if n == core.tokens.node() => {
            if !st.metanode {
                return take_over(core, h, st);
            }
            Ok(())
        }
        Some(n) => {
            st.metanode = false;
            let now = (st.inode.size, st.inode.mtime, st.inode.ctime);
            st.shared
                .get_or_insert_with(|| {
                    Box::new(Shared {
                        reported: Some(now),
                        ..Default::default()
                    })
                })
                .metanode = Some(n);
            Ok(())
        }
        // No metanode, and the manager no longer counts this node as a writer: its
        // write token was revoked after this node looked at its own (phase A holds
        // nothing, nor does the block fetch between an operation's attempts). The
        // operation starts again and asks for what it needs.
        None => Err(FsError::need_token(
            core.tokens
                .inode_missing(h.ino, crate::coherence::Need::Cache),
        )),
    }
}

/// Send `req` to node `to`'s file-system service.
pub fn call_node(core: &Core, to: NodeId, req: &FsRequest) -> FsResult<FsReply> {
    call(core, to, req)
}

fn call(core: &Core, to: NodeId, req: &FsRequest) -> FsResult<FsReply> {
    call_raw(core, to, req).map_err(|e| FsError::Token(e.to_string()))
}

fn call_raw(core: &Core, to: NodeId, req: &FsRequest) -> Result<FsReply, mako_rt::TransportError> {
    core.stats.metanode_sent.fetch_add(1, Ordering::Relaxed);
    mako_rt::call(
        &*core.env.transport,
        to,
        ServiceId::FileSystem,
        req,
        CallOptions::default(),
    )
}

/// The metanode `to` did not answer, or could not make what it was sent durable (it
/// may have failed or been fenced; its role goes with its tokens when a survivor
/// recovers it, docs/coherence.md section 7a): forget it and pause before locating
/// the metanode again, or fail on the last attempt.
fn metanode_gone(
    core: &Core,
    h: &InodeHandle,
    to: NodeId,
    attempt: u32,
    e: &dyn std::fmt::Display,
) -> FsResult<()> {
    if attempt + 1 == LOCATE_ATTEMPTS_MAX {
        return Err(FsError::Token(format!(
            "metanode {to} of inode {}: {e}",
            h.ino
        )));
    }
    if let Some(s) = h.state.write().shared.as_mut() {
        s.metanode = None;
    }
    core.env.clock.sleep(Duration::from_millis(10));
    Ok(())
}

/// Send `req` to the file's metanode, locating it again (with a short pause while it
/// changes hands) when the node asked is no longer it. Returns `None` if this node
/// became the metanode itself (the caller then does the work locally).
fn to_metanode(core: &Core, h: &InodeHandle, req: &FsRequest) -> FsResult<Option<FsReply>> {
    for attempt in 0..LOCATE_ATTEMPTS_MAX {
        prepare(core, h)?;
        let target = {
            let st = h.state.read();
            if st.metanode {
                return Ok(None);
            }
            st.shared.as_ref().and_then(|s| s.metanode)
        };
        let Some(to) = target else {
            locate(core, h)?;
            continue;
        };
        let reply = match call_raw(core, to, req) {
            Ok(r) => r,
            // The metanode does not answer: it may have failed. Its role goes with
            // its tokens when a survivor recovers it (docs/coherence.md section 7a);
            // then another node (maybe this one) becomes the metanode. Wait for that.
            Err(
                e @ (mako_rt::TransportError::Unreachable { .. }
                | mako_rt::TransportError::Timeout { .. }),
            ) => {
                metanode_gone(core, h, to, attempt, &e)?;
                continue;
            }
            Err(e) => return Err(FsError::Token(e.to_string())),
        };
        match reply {
            FsReply::Unavailable(e) => metanode_gone(core, h, to, attempt, &e)?,
            FsReply::NotMetanode => {
                if let Some(s) = h.state.write().shared.as_mut() {
                    s.metanode = None;
                }
                // The old metanode is writing the inode in place and resigning.
                core.env
                    .clock
                    .sleep(Duration::from_micros(200 * (1 + attempt.min(50) as u64)));
            }
            FsReply::Failed(e) => {
                return Err(FsError::Token(format!(
                    "metanode {to} of inode {}: {e}",
                    h.ino
                )))
            }
            other => return Ok(Some(other)),
        }
    }
    Err(FsError::Token(format!(
        "inode {}: the metanode kept changing hands ({LOCATE_ATTEMPTS_MAX} attempts)",
        h.ino
    )))
}

/// The file's merged inode, for a shared writer's `stat` (no lock held).
pub fn refresh_attr(core: &Core, h: &InodeHandle) -> FsResult<()> {
    let req = FsRequest::GetAttr { ino: h.ino };
    if let Some(FsReply::Inode(bytes)) = to_metanode(core, h, &req)? {
        let inode = Inode::decode(&bytes, core.inode_bytes(), h.ino, Location::Memory)?;
        let mut st = h.state.write();
        if st.shared.is_some() {
            // Keep this node's view of its own unreported writes.
            let size = st.inode.size.max(inode.size);
            let (m, c) = (
                later(st.inode.mtime, inode.mtime),
                later(st.inode.ctime, inode.ctime),
            );
            st.inode = inode;
            st.inode.size = size;
            st.inode.mtime = m;
            st.inode.ctime = c;
        }
    }
    Ok(())
}

/// Make sure a shared writer knows the addresses of `first..last` (no lock held).
/// `covered`: the caller holds the data token over `first..last` in a way no revoke can
/// finish under it (a hold, or it is the revoke handler flushing that range), so those
/// addresses stay valid; any other unit is kept only if `holds_steadily` says so.
pub fn fetch_blocks(
    core: &Core,
    h: &InodeHandle,
    first: u64,
    last: u64,
    covered: bool,
) -> FsResult<()> {
    let missing = {
        let st = h.state.read();
        let Some(s) = &st.shared else {
            return Ok(());
        };
        (first..last.max(first + 1)).find(|u| !s.blocks.contains_key(u))
    };
    let Some(from) = missing else {
        return Ok(());
    };
    let count = (last.max(from + 1) - from).clamp(BLOCK_MAP_FETCH, 1 << 16) as u32;
    let req = FsRequest::GetBlocks {
        ino: h.ino,
        first: from,
        count,
    };
    if let Some(FsReply::Blocks { size, list }) = to_metanode(core, h, &req)? {
        let bb = core.block_bytes();
        let data = core.tokens.data(h.ino);
        let mut st = h.state.write();
        if st.shared.is_some() && size > st.inode.size {
            // Another writer grew the file, perhaps with data in a unit this node now
            // holds: what is on disk there counts (`file_io` reads up to the size), and
            // must not be taken for a hole past the end and overwritten with zeros
            // (three-node seed 22: a record's tail in a block two nodes shared was lost).
            let view = (st.inode.size, st.inode.mtime, st.inode.ctime);
            st.inode.size = size;
            let s = st.shared.as_mut().expect("checked above");
            if s.reported == Some(view) {
                // Nothing of this node's own is unreported: the metanode's size is not news.
                s.reported = Some((size, view.1, view.2));
            }
        }
        // A directory's blocks move only with a change of its shape, under its inode in
        // `xw`, which takes this node's `rw` (and this shared view) away first: its
        // `rw` token keeps every address steady (it has no data tokens).
        let directory = st.inode.mode & crate::fs::S_IFMT == crate::fs::S_IFDIR;
        if let Some(s) = st.shared.as_mut() {
            for (unit, da, sb) in list {
                // An address is this node's to keep only while no other node can move
                // it: under a data token over the unit that no revoke is taking away
                // (the revoke drops it under this same lock, `cache_flush::revoke_data`).
                // The units read ahead past the caller's are often not.
                let range = ByteRange {
                    start: unit.saturating_mul(bb),
                    end: unit.saturating_add(1).saturating_mul(bb),
                };
                let mine = covered && unit >= first && unit < last.max(first + 1);
                if !mine && !directory && !core.tokens.client().holds_steadily(data, range) {
                    continue;
                }
                // What this node set itself is newer than the metanode's answer.
                s.blocks
                    .entry(unit)
                    .or_insert((DiskAddress::from_raw(da), sb));
            }
        }
    }
    Ok(())
}

/// Report what a shared writer changed: its size and times, and the blocks it moved.
/// The blocks' allocation is made durable in this node's log first (data, then the
/// allocation, then the pointer: a crash never leaves a pointer to a block the owner
/// may hand out again). No lock held.
pub fn report(core: &Core, h: &InodeHandle) -> FsResult<()> {
    let update = {
        let mut st = h.state.write();
        let view = (st.inode.size, st.inode.mtime, st.inode.ctime);
        let Some(s) = st.shared.as_mut() else {
            return Ok(());
        };
        if s.pending.is_empty()
            && s.entries_delta == 0
            && s.nlink_delta == 0
            && s.reported == Some(view)
        {
            return Ok(());
        }
        let u = Update {
            ino: h.ino,
            size_at_least: view.0,
            mtime: ts(view.1),
            ctime: ts(view.2),
            sets: s.pending.clone(),
            entries_delta: s.entries_delta,
            nlink_delta: s.nlink_delta,
            // Every copy `to_metanode` sends carries this key.
            key: Some(core.writer.key(core.writer.next_seq())),
        };
        // The counts are not idempotent: from here on they are this report's, not the
        // shared view's (taken under the same lock, so two reports never send one
        // count twice). A `take_over` while the update is on its way applies only what
        // is still in the view; what no metanode took, this report gives back
        // (`give_back_counts`). Leaving them in the view while the update was on its
        // way counted them twice (three-node seeds 3 and 43 with `CROWD_NODES` 1: a
        // takeover applied counts the old metanode had merged and written in place
        // before it resigned).
        s.entries_delta = 0;
        s.nlink_delta = 0;
        u
    };
    let counts = update.entries_delta != 0 || update.nlink_delta != 0;
    if !update.sets.is_empty() || counts {
        // What the update reports is durable in this node's log first: a crash after
        // the metanode applied a count must not lose the directory page it counts
        // (the count would stay one above the entries: docs/coherence.md section 4,
        // "Entry and link counts").
        if let Err(e) = core.journal.commit(core) {
            if counts {
                give_back_counts(core, h, &update)?;
            }
            return Err(e);
        }
    }
    if counts && core.counts_unsent.load(Ordering::Relaxed) {
        return give_back_counts(core, h, &update);
    }
    let sent = to_metanode(core, h, &FsRequest::Update(update.clone()));
    if let Some(key) = &update.key {
        // Answered, or given up: no copy of it is sent again (counts that no metanode
        // took go back into the view and travel under a new key).
        core.writer.answered(key.seq);
    }
    let outcome = match sent {
        Ok(Some(FsReply::Done)) => Ok(true),
        Ok(Some(other)) => Err(FsError::Token(format!(
            "metanode answered an update of inode {} with {other:?}",
            h.ino
        ))),
        // This node is the metanode now: `take_over` applied what its view held,
        // which no longer has this report's counts.
        Ok(None) => Ok(false),
        Err(e) => Err(e),
    };
    if counts && !matches!(outcome, Ok(true)) {
        give_back_counts(core, h, &update)?;
    }
    if !outcome? {
        return Ok(());
    }
    let mut st = h.state.write();
    if let Some(s) = st.shared.as_mut() {
        s.pending.retain(|p| !update.sets.contains(p));
        s.reported = Some((
            update.size_at_least,
            from_ts(update.mtime),
            from_ts(update.ctime),
        ));
    }
    Ok(())
}

/// A report's counts that no metanode took: apply them here if this node is the
/// metanode now, or put them back into the shared view for the next report.
fn give_back_counts(core: &Core, h: &InodeHandle, update: &Update) -> FsResult<()> {
    let counts_only = Update {
        ino: h.ino,
        size_at_least: 0,
        mtime: (0, 0),
        ctime: (0, 0),
        sets: Vec::new(),
        entries_delta: update.entries_delta,
        nlink_delta: update.nlink_delta,
        key: None,
    };
    crate::journal::complete_change(|| {
        let _tx = core.begin();
        let mut st = h.state.write();
        if let Some(s) = st.shared.as_mut() {
            s.entries_delta += update.entries_delta;
            s.nlink_delta += update.nlink_delta;
            return Ok(());
        }
        if !st.metanode {
            // Neither: the inode token left this node with the counts unreported.
            // Log recovery's recount is what repairs such a count after a crash
            // (`recovery::recount_directories`); a live node never gets here.
            tracing::error!(
                "inode {}: entry and link counts {:+}/{:+} of this node reached no metanode",
                h.ino,
                update.entries_delta,
                update.nlink_delta
            );
            return Ok(());
        }
        apply_update(core, &mut st, &counts_only)
    })
}

/// A shared writer's fsync: its own data and allocations are durable; the metanode
/// commits the pointers and size it merged. No lock held.
pub fn sync_metanode(core: &Core, h: &InodeHandle) -> FsResult<()> {
    if h.state.read().shared.is_none() {
        return Ok(());
    }
    report(core, h)?;
    match to_metanode(core, h, &FsRequest::Sync { ino: h.ino })? {
        Some(FsReply::Done) | None => Ok(()),
        Some(other) => Err(FsError::Token(format!(
            "metanode answered a sync of inode {} with {other:?}",
            h.ino
        ))),
    }
}

/// Run after an operation that wrote as a shared writer: report to the metanode.
pub fn defer_report(core: &Arc<Core>, h: &Arc<InodeHandle>) -> FsResult<()> {
    if h.state.read().shared.is_none() {
        return Ok(());
    }
    let (c, hh) = (core.clone(), h.clone());
    crate::op::defer(core, Box::new(move || report(&c, &hh)))
}

/// The wall-clock time of this node as a `Timestamp`.
pub fn now(core: &Core) -> Timestamp {
    timestamp(core.env.clock.wall())
}
