//! What this node does before a token leaves it (docs/coherence.md section 5): make
//! what the token covers durable where the next holder will read it, then drop (or
//! keep read-only) the cached copies, in makod and in the kernel. Called by the token
//! client with the range marked revoking and every operation's hold on it released, on
//! the thread of whoever asked for the token; it holds no hold of its own.

use crate::core::{Core, INODE_CACHE_KEY};
use crate::error::{FsError, FsResult};
use crate::file_io;
use mako_token::{ByteRange, NodeId, ResourceId, ResourceKind, TokenError, TokenMode};
use std::sync::atomic::Ordering;
use std::sync::{Arc, OnceLock, Weak};

/// TEST ONLY: ways to break a revoke on purpose, for the tests that prove the cluster
/// simulation (`mako-sim`) catches a broken one. Stored in `Core::revoke_fault`, which
/// every real mount leaves at `None`; nothing but those tests sets it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum RevokeFault {
    /// Revokes work as they must.
    None = 0,
    /// A data revoke drops the dirty buffers without writing them back (lost writes).
    SkipWriteBack = 1,
    /// A data revoke writes back but keeps the cached buffers (a missing invalidation:
    /// the node goes on serving data it no longer holds a token for).
    KeepCachedData = 2,
}

impl RevokeFault {
    fn of(core: &Core) -> RevokeFault {
        match core.revoke_fault.load(std::sync::atomic::Ordering::Relaxed) {
            1 => RevokeFault::SkipWriteBack,
            2 => RevokeFault::KeepCachedData,
            _ => RevokeFault::None,
        }
    }
}

#[derive(Default)]
pub struct FsCacheFlush {
    core: OnceLock<Weak<Core>>,
}

impl FsCacheFlush {
    pub fn attach(&self, core: &Arc<Core>) {
        let _ = self.core.set(Arc::downgrade(core));
    }
}

impl mako_token::CacheFlush for FsCacheFlush {
    fn flush_and_invalidate(
        &self,
        resource: ResourceId,
        range: ByteRange,
        keep: Option<TokenMode>,
    ) -> Result<(), TokenError> {
        let Some(core) = self.core.get().and_then(|w| w.upgrade()) else {
            // Not mounted yet, or unmounted: nothing is cached.
            return Ok(());
        };
        let r = match resource.kind {
            ResourceKind::Inode => revoke_inode(&core, resource.id, keep),
            ResourceKind::ByteRange => revoke_data(&core, resource.id, range, keep),
            ResourceKind::DirBucket => revoke_names(&core, resource.id, keep),
            ResourceKind::AllocRegion => crate::ownership::revoke_region(&core, resource.id),
            ResourceKind::InodeMapSegment => crate::ownership::revoke_segment(&core, resource.id),
            // Covers no cached state: the loop check of a rename reads under it.
            ResourceKind::RenameLock => Ok(()),
            // Covers no cached state: a recovery holds it while it replays a failed
            // node's log, and releases it when done.
            ResourceKind::RecoveryLog => Ok(()),
        };
        r.map_err(|e| {
            // Fenced (its lease ran out, it was expelled): this node can no longer
            // give what it holds; its recovery by a survivor will (its log replayed,
            // its tokens released). The requester waits for that, as for a holder
            // that does not answer.
            // A request of this node refused by another (it was expelled) is the same.
            let fenced = matches!(e, FsError::Disk(mako_disk::DiskError::Fenced { .. }))
                || core.check_fence().is_err()
                || mako_rt::is_refusal(&e.to_string());
            if fenced {
                TokenError::HolderFenced {
                    node: NodeId(core.node),
                    reason: e.to_string(),
                }
            } else {
                TokenError::FlushFailed {
                    node: NodeId(core.node),
                    resource,
                    range,
                    reason: e.to_string(),
                }
            }
        })
    }
}

/// The inode token leaves (or weakens): the file's dirty data first (without the
/// inode token this node could no longer record where it wrote it), then its metadata
/// committed and written in place, then the cached inode dropped or kept read-only.
fn revoke_inode(core: &Arc<Core>, ino: u64, keep: Option<TokenMode>) -> FsResult<()> {
    core.stats.revokes_inode.fetch_add(1, Ordering::Relaxed);
    let cached = core.cached_handle(ino);
    if cached.is_none() && keep.is_none() && !crate::ownership::shared(core) {
        // A file system of one node (one recovery log): the token goes back to a
        // manager that can give it to nobody else, so nothing need be where another
        // node would read it. With no cached inode (a freed one, or one evicted with
        // its attributes) there is nothing to commit either: its images reach the log
        // with the running transaction, its slot of the cached inode-file chunk is
        // current (`Core::encode_inode` copies every image there), and a read that
        // misses the chunk sees the committed images through the overlay. This is
        // every unlink's release of the freed inode's tokens: it committed the log and
        // wrote the free image in place with a barrier, a commit for every few unlinks
        // once the inode cache was full (`bench/create-cost`, docs/performance.md).
        core.stat_cache.lock().remove(ino);
        core.invalidate_kernel_attrs(ino);
        return Ok(());
    }
    if let Some(h) = cached {
        file_io::flush_data(core, &h)?;
        // A shared writer's blocks and size reach the metanode before the token goes.
        crate::metanode::report(core, &h)?;
    }
    core.journal.write_in_place(core, ino)?;
    match keep {
        // Shared write kept: the metanode stays metanode, a shared writer stays one.
        // Others may now change size and times without revoking anything here, so the
        // kernel must stop trusting what it was told under the stronger token (from
        // now on it is answered with a zero timeout: `FileSystem::attributes_shared`).
        Some(TokenMode::Rw) => {
            core.invalidate_kernel_attrs(ino);
            return Ok(());
        }
        // Read-only from now on: the disk holds the merged inode; a shared writer's
        // view is replaced by it at the next use.
        Some(_) => {
            if let Some(h) = core.cached_handle(ino) {
                let mut st = h.state.write();
                st.metanode = false;
                if st.shared.take().is_some() {
                    st.stale = true;
                }
            }
            return Ok(());
        }
        None => {}
    }
    core.stat_cache.lock().remove(ino);
    drop_inode_chunk(core, ino);
    if let Some(h) = core.cached_handle(ino) {
        let opens = h.opens.load(Ordering::SeqCst);
        let mut st = h.state.write();
        // The files that hold metadata stay cached (the core keeps their block lists);
        // they are read again at their next use.
        let system = st.inode.flags & mako_format::inode::FLAG_SYSTEM != 0;
        // Everything was committed above; what is cached is clean but may go stale.
        st.indirect.lock().clear();
        st.dir_blocks.lock().clear();
        st.metanode = false;
        st.shared = None;
        if system || opens > 0 || Arc::strong_count(&h) > 2 {
            // Open files keep their handle (it counts the opens); the inode is read
            // again from disk at the next use.
            st.stale = true;
        } else {
            drop(st);
            core.inodes.lock().remove(&ino);
        }
    }
    core.invalidate_kernel_attrs(ino);
    Ok(())
}

/// The cached inode-file chunk holding `ino` may be changed by the next holder: drop it.
/// Inode `ino`'s slot of its cached inode-file chunk must be read from disk at its
/// next use (its token left, or another node wrote it in place): the chunk's other
/// inodes stay cached.
pub(crate) fn drop_inode_chunk(core: &Core, ino: u64) {
    let chunk = core.inode_chunk_bytes();
    let off = ino * core.inode_bytes() as u64;
    if let Some(slot) = core.pool.get((INODE_CACHE_KEY, off / chunk)) {
        let slot_index = ((off % chunk) / core.inode_bytes() as u64) as usize;
        if let Some(s) = slot.buf.lock().slot_stamps.get_mut(slot_index) {
            *s = 0;
        }
    }
}

/// A byte range of file data leaves (or becomes read-only): dirty blocks under it are
/// written back, cached blocks dropped (unless kept for reading), and the kernel's page
/// cache for the range invalidated.
fn revoke_data(
    core: &Arc<Core>,
    ino: u64,
    range: ByteRange,
    keep: Option<TokenMode>,
) -> FsResult<()> {
    core.stats.revokes_data.fetch_add(1, Ordering::Relaxed);
    let bb = core.block_bytes();
    let first = range.start / bb;
    let last = if range.end == u64::MAX {
        u64::MAX
    } else {
        range.end.div_ceil(bb)
    };
    let fault = RevokeFault::of(core);
    if let Some(h) = core.cached_handle(ino) {
        for (_, b) in core.pool.keys_of(ino, true) {
            if b >= first && b < last && fault != RevokeFault::SkipWriteBack {
                file_io::flush_block(core, &h, b)?;
            }
        }
        // Where the blocks went reaches the metanode before the next holder asks it.
        crate::metanode::report(core, &h)?;
        if keep.is_none() {
            if let Some(s) = h.state.write().shared.as_mut() {
                s.blocks.retain(|u, _| *u < first || *u >= last);
            }
        }
    }
    if keep.is_none() && fault != RevokeFault::KeepCachedData {
        core.alloc
            .unreserve(core.pool.remove_from_range(ino, first, last));
        let (off, len) = if range.end == u64::MAX {
            (range.start as i64, 0)
        } else {
            (
                range.start as i64,
                (range.end - range.start).min(i64::MAX as u64) as i64,
            )
        };
        core.invalidate_kernel_data(ino, off, len);
    }
    Ok(())
}

/// A directory's names leave (or become read-only): its changed pages are committed
/// and written in place, the cached directory blocks dropped.
fn revoke_names(core: &Arc<Core>, dir: u64, keep: Option<TokenMode>) -> FsResult<()> {
    core.stats.revokes_dir.fetch_add(1, Ordering::Relaxed);
    core.journal.write_in_place(core, dir)?;
    if keep.is_some() {
        return Ok(());
    }
    if let Some(h) = core.cached_handle(dir) {
        // Under the inode's lock in write: an operation on the directory (reading the
        // cached blocks under other names, or under the inode in `xw` with no name
        // token) finds its blocks where it located them. A block with pages changed
        // since `write_in_place` committed stays: an operation under names this node
        // still holds changed it meanwhile (the revoked names cannot have changed: the
        // revoke waited for their holds), and dropping it would lose that change while
        // the inode's entry count keeps it (a name lost by concurrent creates, scale
        // seed 1). Its clean pages are read again when names are next granted.
        h.state
            .write()
            .dir_blocks
            .lock()
            .retain(|_, n| n.dirty_pages != 0);
    }
    core.invalidate_kernel_names(dir);
    Ok(())
}
