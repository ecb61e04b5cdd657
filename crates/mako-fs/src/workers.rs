//! Background workers and the write-back paths they share with fsync and unmount:
//! write-behind threads (dirty data blocks in full-block I/Os), prefetch threads, and
//! the sync thread (periodic write-back of data then metadata, and inode cache
//! eviction down to `maxFilesToCache`, keeping attributes in the `maxStatCache` tier).

use crate::block_map;
use crate::core::{Core, InodeHandle, InodeState};
use crate::error::{FsError, FsResult};
use crate::file_io;
use crate::fs::is_dir_mode;
use mako_format::inode::{InodeContent, FLAG_SYSTEM};
use std::collections::HashSet;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The tokens a write-back of `ino`'s blocks needs (the inode's write token, to record
/// where the blocks go, and the data token over them), held for its duration. `None`
/// while a revoke takes one of them away: the revoke writes the data back itself.
pub fn flush_holds(core: &Core, ino: u64, blocks: std::ops::Range<u64>) -> Option<FlushHolds> {
    let bb = core.block_bytes();
    let inode = core
        .tokens
        .try_hold_inode(ino, crate::coherence::Need::Write)
        .ok()?;
    let range = mako_token::ByteRange::new(
        blocks.start.saturating_mul(bb),
        blocks
            .end
            .saturating_mul(bb)
            .max(blocks.start.saturating_mul(bb) + 1),
    );
    let data =
        core.tokens
            .client()
            .try_hold(core.tokens.data(ino), mako_token::TokenMode::Xw, range)?;
    Some(FlushHolds {
        _inode: inode,
        _data: data,
    })
}

/// See `flush_holds`.
pub struct FlushHolds {
    _inode: mako_token::Hold,
    _data: mako_token::Hold,
}

/// Write an inode's dirty data back (write-behind's work, done now). Metadata is not
/// written here: it reaches disk through the recovery log (`journal`).
pub fn flush_inode(core: &Core, h: &InodeHandle) -> FsResult<()> {
    let dirty = core.pool.keys_of(h.ino, true);
    if dirty.is_empty() {
        return Ok(());
    }
    let Ok(_inode) = core
        .tokens
        .try_hold_inode(h.ino, crate::coherence::Need::Write)
    else {
        return Ok(());
    };
    // Each dirty block under a hold of its own block's data token: this node may hold
    // the file's data token over part of the file only (another node holds the rest),
    // and one hold over the whole file then failed and wrote nothing back — an fsync
    // on such a node returned without its data. A block whose hold fails is being
    // revoked, and the revoke writes it back.
    for (_, b) in dirty {
        if let Some(_holds) = flush_holds(core, h.ino, b..b + 1) {
            file_io::flush_block(core, h, b)?;
        }
    }
    crate::metanode::report(core, h)
}

/// Write back every dirty data block of every cached inode, then commit the log: what
/// was changed before the call is durable when it returns.
pub fn sync_all(core: &Core) -> FsResult<()> {
    let mut handles: Vec<Arc<InodeHandle>> = core.inodes.lock().values().cloned().collect();
    // In inode order: the same state always gives the same writes (reproducible tests).
    handles.sort_unstable_by_key(|h| h.ino);
    for h in &handles {
        flush_inode(core, h)?;
    }
    core.journal.commit(core)
}

/// Release an inode whose last link and last reference are gone: free its blocks,
/// log it as free, and clear it in the inode map. Call with a transaction open.
pub fn free_inode(core: &Core, st: &mut InodeState) -> FsResult<()> {
    let ino = st.inode.ino;
    assert_eq!(
        st.inode.nlink, 0,
        "freeing inode {ino} that still has links"
    );
    core.alloc.unreserve(core.pool.remove_from(ino, 0));
    crate::xattr::free_all(core, st)?;
    let units = block_map::cut_from(core, st, 0)?;
    for (_, da, n) in units {
        core.alloc.free(da, n, ino)?;
    }
    st.dir_blocks.lock().clear();
    st.indirect.lock().clear();
    st.inode.size = 0;
    st.inode.subblocks = 0;
    st.inode.depth = 0;
    st.inode.last_block_subblocks = 0;
    st.inode.entries = 0;
    st.inode.xattrs.clear();
    st.inode.content = InodeContent::InlineData(Vec::new());
    // The handle leaves the cache: its free image goes to the transaction directly.
    let (da, bytes) = core.encode_inode(&st.inode)?;
    core.journal.add_image(
        mako_disk::BufferType::Inode,
        ino,
        mako_format::log_record::LogImage::trimmed(da, &bytes),
    );
    if st.dirty {
        // Filed in the running transaction, which will write no image of it but the
        // free image above.
        core.journal.inbox().unfile_inode();
    }
    st.dirty = false;
    st.deleted = true;
    core.imap.free(ino)?;
    core.inodes.lock().remove(&ino);
    core.lookups.lock().remove(&ino);
    // The operation still holds the tokens; they go back later, outside it.
    core.token_release.lock().push(ino);
    Ok(())
}

/// Evict inodes beyond `maxFilesToCache` (least recently used, clean, unopened),
/// keeping their attributes in the stat cache up to `maxStatCache`.
pub fn evict_inodes(core: &Core) -> FsResult<()> {
    evict_inodes_counted(core).map(|_| ())
}

/// `evict_inodes`, telling how many inodes left the cache.
pub fn evict_inodes_counted(core: &Core) -> FsResult<usize> {
    let (max_files, max_stat) = {
        let c = core.cfg.read();
        (c.max_files_to_cache, c.max_stat_cache)
    };
    let mut candidates: Vec<Arc<InodeHandle>> = {
        let map = core.inodes.lock();
        if map.len() <= max_files {
            return Ok(0);
        }
        map.values()
            .filter(|h| Arc::strong_count(h) == 1 && h.opens.load(Ordering::SeqCst) == 0)
            .cloned()
            .collect()
    };
    // A directory the kernel still knows (the root, or one it holds a lookup of) stays:
    // the kernel keeps its names for long under this node's name token, and giving that
    // token up would invalidate them by name, which waits for the directory's lock in
    // the kernel — held by any lookup there waiting for this very token (a deadlock).
    let root = core.metadata_inodes().root_dir;
    let kernel_dirs: HashSet<u64> = {
        let lookups = core.lookups.lock();
        candidates
            .iter()
            .filter(|h| h.ino == root || lookups.contains_key(&h.ino))
            .map(|h| h.ino)
            .collect()
    };
    candidates.retain(|h| {
        let st = h.state.read();
        st.inode.flags & FLAG_SYSTEM == 0
            && st.inode.nlink > 0
            && !st.deleted
            && !(is_dir_mode(st.inode.mode) && kernel_dirs.contains(&h.ino))
    });
    candidates.sort_by_key(|h| h.last_use.load(Ordering::Relaxed));
    let excess = core.inodes.lock().len().saturating_sub(max_files);
    let mut evicted = 0;
    for h in candidates.into_iter().take(excess) {
        // Dirty metadata stays cached until a commit has logged it.
        if h.state.read().dirty {
            continue;
        }
        flush_inode(core, &h)?;
        // The attributes may go to the stat cache only while a token covers them, and
        // no revoke may slip between the look and the insert (it would find neither
        // the handle nor the stat-cache entry to drop, and a stale inode would stay
        // cached with no token: three-node seed 211 lost a name in an inline
        // directory so). A hold keeps the token here until the insert is done.
        let hold = core
            .tokens
            .client()
            .try_hold_any(core.tokens.inode(h.ino), mako_token::ByteRange::WHOLE);
        let st = h.state.read();
        if st.dirty || !core.pool.keys_of(h.ino, true).is_empty() {
            continue;
        }
        // A shared writer's copy (`rw`) is not what the disk will say once the metanode
        // has merged: only a copy no other node writes under is kept.
        let keep_attrs = hold.is_some() && !st.stale && st.shared.is_none();
        let inode = st.inode.clone();
        drop(st);
        {
            let mut map = core.inodes.lock();
            // Two references: the map's and ours. Anything more is a user in flight.
            if Arc::strong_count(&h) != 2 {
                continue;
            }
            map.remove(&h.ino);
        }
        evicted += 1;
        core.alloc.unreserve(core.pool.remove_from(h.ino, 0));
        if !keep_attrs {
            // Stale (the token left): nothing to keep; whatever token part remains
            // goes back with the others.
            core.token_release.lock().push(h.ino);
            continue;
        }
        // The attributes stay (under the token this node keeps); what the stat cache
        // pushes out gives its token back.
        let pushed = core.stat_cache.lock().insert(inode);
        drop(hold);
        core.token_release.lock().extend(pushed);
    }
    let _ = max_stat;
    release_tokens(core)?;
    Ok(evicted)
}

/// Whether the sync thread should scan the inode cache for eviction again after a
/// scan at `last_fruitless` (the log's commit count then, and when) evicted nothing:
/// the inodes past `maxFilesToCache` were then dirty (new ones stay dirty until the
/// next commit) or in use. A scan sorts every cached inode, and scanning every 100 ms
/// while nothing can leave cost the sync thread a sixth of makod's CPU during creates
/// (docs/performance.md). So: again once a commit has cleaned inodes, and at the
/// latest after `interval`, for inodes that became unused without a commit.
pub(crate) fn evict_scan_due(
    last_fruitless: Option<(u64, Instant)>,
    commits_now: u64,
    now: Instant,
    interval: Duration,
) -> bool {
    match last_fruitless {
        None => true,
        Some((commits, at)) => commits != commits_now || now.duration_since(at) >= interval,
    }
}

/// Give back the tokens of inodes that nothing on this node uses any more: freed ones,
/// and those pushed out of the stat cache. Blocks (a release flushes); call outside
/// operations.
pub fn release_tokens(core: &Core) -> FsResult<()> {
    let mut inos = std::mem::take(&mut *core.token_release.lock());
    inos.sort_unstable();
    inos.dedup();
    inos.retain(|&ino| {
        !(core.inodes.lock().contains_key(&ino)
            || core.stat_cache.lock().contains(ino)
            || core.imap.is_reserved(ino))
    });
    for ino in inos {
        core.tokens.release_inode(ino)?;
    }
    // Frees in other nodes' space whose transactions are checkpointed.
    crate::ownership::deliver_frees(core)
}

fn report(core: &Core, what: &str, e: FsError) {
    core.stats.background_errors.fetch_add(1, Ordering::Relaxed);
    tracing::error!("{what}: {e}");
    if matches!(e, FsError::Disk(_)) {
        core.go_read_only(&format!("{what} failed: {e}"));
    }
}

pub struct Workers {
    core: Arc<Core>,
    threads: Vec<JoinHandle<()>>,
}

impl Workers {
    pub fn start(core: Arc<Core>) -> Workers {
        let mut threads = Vec::new();
        let cfg = core.cfg.read().clone();
        for i in 0..cfg.writebehind_threads.max(1) {
            let c = core.clone();
            threads.push(
                std::thread::Builder::new()
                    .name(format!("writebehind{i}"))
                    .spawn(move || writebehind_loop(&c))
                    .expect("spawn"),
            );
        }
        for i in 0..cfg.prefetch_threads.max(1) {
            let c = core.clone();
            threads.push(
                std::thread::Builder::new()
                    .name(format!("prefetch{i}"))
                    .spawn(move || prefetch_loop(&c))
                    .expect("spawn"),
            );
        }
        let c = core.clone();
        threads.push(
            std::thread::Builder::new()
                .name("sync".into())
                .spawn(move || sync_loop(&c))
                .expect("spawn"),
        );
        Workers { core, threads }
    }

    /// Stop every worker (after it finishes queued write-behind).
    pub fn stop(&mut self) {
        self.core.shutting_down.store(true, Ordering::SeqCst);
        self.core.pool.wake_flushers();
        self.core.prefetch_cv.notify_all();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

impl Drop for Workers {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Write one block back; when space is short only because freed space waits for a
/// checkpoint, checkpoint and try again. When it is short because a region whose
/// space backed the block's reservation was taken by another node (`revoke_region`),
/// take one more region (outside an operation: inside one, `op::run` does, and runs
/// it again) and try again.
pub fn writebehind_block(core: &Core, h: &InodeHandle, b: u64) -> FsResult<()> {
    loop {
        let Some(holds) = flush_holds(core, h.ino, b..b + 1) else {
            return Ok(());
        };
        let r = match file_io::flush_block(core, h, b) {
            Err(FsError::NoSpace(_)) if core.alloc.quarantined_subblocks() > 0 => {
                core.journal.quiesce(core)?;
                file_io::flush_block(core, h, b)
            }
            r => r,
        };
        match r {
            Err(FsError::NoSpace(why)) if !crate::op::in_op(core) => {
                // With no hold open: acquiring may revoke a region elsewhere, whose
                // commit may wait for an operation that waits for these tokens.
                drop(holds);
                if !crate::ownership::acquire_or_steal_region(core)? {
                    return Err(FsError::NoSpace(why));
                }
            }
            r => {
                r?;
                return crate::metanode::report(core, h);
            }
        }
    }
}

fn writebehind_loop(core: &Core) {
    loop {
        let job = core.flushq.lock().pop_front();
        if let Some((ino, b)) = job {
            if let Some(h) = core.cached_handle(ino) {
                if let Err(e) = writebehind_block(core, &h, b) {
                    report(core, &format!("write-behind of inode {ino} block {b}"), e);
                    // Back off: a failing block must not turn into a busy loop.
                    std::thread::sleep(Duration::from_millis(50));
                }
            }
            continue;
        }
        if core.pool.dirty_bytes() > core.pool.dirty_limit() / 2 {
            let keys = core.pool.dirty_keys(4);
            let mut progressed = false;
            for (ino, b) in keys {
                if let Some(h) = core.cached_handle(ino) {
                    match writebehind_block(core, &h, b) {
                        Ok(()) => progressed = true,
                        Err(e) => {
                            report(core, &format!("write-behind of inode {ino} block {b}"), e)
                        }
                    }
                }
            }
            if progressed {
                continue;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        if core.shutting_down.load(Ordering::SeqCst) {
            return;
        }
        let mut w = core.pool.flush_wake.0.lock();
        if !*w {
            core.pool
                .flush_wake
                .1
                .wait_for(&mut w, Duration::from_millis(100));
        }
        *w = false;
    }
}

/// Read one block ahead, if this node still holds the tokens that make a cached copy
/// trustworthy (the inode, and the data over the block); otherwise skip it.
pub fn prefetch_block(core: &Core, h: &InodeHandle, b: u64) -> FsResult<()> {
    let bb = core.block_bytes();
    let Some(_inode) = core
        .tokens
        .client()
        .try_hold_any(core.tokens.inode(h.ino), mako_token::ByteRange::WHOLE)
    else {
        return Ok(());
    };
    let range =
        mako_token::ByteRange::new(b.saturating_mul(bb), b.saturating_add(1).saturating_mul(bb));
    let Some(_data) =
        core.tokens
            .client()
            .try_hold(core.tokens.data(h.ino), mako_token::TokenMode::Ro, range)
    else {
        return Ok(());
    };
    file_io::prefetch_block(core, h, b)
}

fn prefetch_loop(core: &Core) {
    loop {
        let job = {
            let mut q = core.prefetchq.lock();
            if q.is_empty() && !core.shutting_down.load(Ordering::SeqCst) {
                core.prefetch_cv
                    .wait_for(&mut q, Duration::from_millis(100));
            }
            q.pop_front()
        };
        match job {
            Some((ino, b)) => {
                if let Some(h) = core.cached_handle(ino) {
                    if let Err(e) = prefetch_block(core, &h, b) {
                        report(core, &format!("prefetch of inode {ino} block {b}"), e);
                    }
                }
            }
            None if core.shutting_down.load(Ordering::SeqCst) => return,
            None => {}
        }
    }
}

/// The sync thread: every 100 ms it commits the log if the running transaction has
/// grown large and evicts inodes over `maxFilesToCache`; every sync interval it writes
/// dirty data back and commits; it checkpoints when a quarter of the log is used, or
/// when the file system has been idle for two intervals (so an idle file system has an
/// empty log and nothing to replay).
fn sync_loop(core: &Core) {
    let mut last = Instant::now();
    // The last eviction scan that evicted nothing: the commit count then, and when.
    let mut fruitless: Option<(u64, Instant)> = None;
    loop {
        std::thread::sleep(Duration::from_millis(100));
        if core.shutting_down.load(Ordering::SeqCst) {
            return;
        }
        if core.read_only.load(Ordering::Relaxed) {
            continue;
        }
        let j = &core.journal;
        let interval = Duration::from_secs(core.cfg.read().sync_interval_secs.max(1));
        let big = j.running_bytes(core) > j.soft_limit();
        if big {
            if let Err(e) = j.commit(core) {
                report(core, "recovery log commit", e);
            }
        }
        if core.inodes.lock().len() > core.cfg.read().max_files_to_cache {
            let commits = j.stats.commits.load(Ordering::Relaxed);
            let now = Instant::now();
            if evict_scan_due(fruitless, commits, now, interval) {
                match evict_inodes_counted(core) {
                    Ok(0) => fruitless = Some((commits, now)),
                    Ok(_) => fruitless = None,
                    Err(e) => report(core, "inode cache eviction", e),
                }
            }
        }
        if last.elapsed() >= interval {
            last = Instant::now();
            if let Err(e) = sync_all(core) {
                report(core, "periodic sync", e);
                continue;
            }
        }
        let used = j.used_bytes();
        let idle = j.running_bytes(core) == 0 && j.since_checkpoint() >= interval * 2;
        if used > j.capacity() / 4 || (used > 0 && idle) {
            if let Err(e) = j.checkpoint(core) {
                report(core, "recovery log checkpoint", e);
            }
            if let Err(e) = crate::ownership::deliver_frees(core) {
                report(core, "frees in other nodes' space", e);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::evict_scan_due;
    use std::time::{Duration, Instant};

    #[test]
    fn a_fruitless_eviction_scan_is_repeated_only_after_a_commit_or_the_interval() {
        let t0 = Instant::now();
        let interval = Duration::from_secs(5);
        assert!(evict_scan_due(None, 7, t0, interval));
        let last = Some((7, t0));
        // Same commit count, within the interval: nothing new can be evicted.
        assert!(!evict_scan_due(last, 7, t0, interval));
        assert!(!evict_scan_due(
            last,
            7,
            t0 + Duration::from_millis(4900),
            interval
        ));
        // A commit cleaned the new inodes.
        assert!(evict_scan_due(
            last,
            8,
            t0 + Duration::from_millis(100),
            interval
        ));
        // Inodes closed without a commit are found within the interval.
        assert!(evict_scan_due(last, 7, t0 + interval, interval));
    }
}
