//! Background workers and the write-back paths they share with fsync and unmount:
//! write-behind threads (dirty data blocks in full-block I/Os), prefetch threads, and
//! the sync thread (periodic write-back of data then metadata, and inode cache
//! eviction down to `maxFilesToCache`, keeping attributes in the `maxStatCache` tier).

use crate::block_map;
use crate::core::{Core, InodeHandle, InodeState};
use crate::directory;
use crate::error::{FsError, FsResult};
use crate::file_io;
use mako_disk::BufferType;
use mako_format::inode::{InodeContent, FLAG_SYSTEM};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Write an inode back: its data first, then its indirect and directory blocks, then
/// the inode itself (ordered mode: nothing points at data that is not on disk).
pub fn flush_inode(core: &Core, h: &InodeHandle) -> FsResult<()> {
    file_io::flush_data(core, h)?;
    let mut st = h.state.write();
    if st.deleted {
        return Ok(());
    }
    block_map::flush_indirect(core, &st)?;
    directory::flush_blocks(core, &st)?;
    if st.dirty {
        core.write_inode(&st.inode)?;
        st.dirty = false;
    }
    Ok(())
}

/// Write back dirty allocation-map and inode-map segments.
pub fn flush_maps(core: &Core) -> FsResult<()> {
    let m = core.metadata_inodes();
    for (r, bytes) in core.alloc.take_dirty(core.alloc_slot_bytes) {
        core.metafile_write(m.block_alloc_map, r as u64 * core.alloc_slot_bytes as u64, &bytes, BufferType::AllocMap)?;
    }
    let slot = core.imap.slot_bytes() as u64;
    for (s, bytes) in core.imap.take_dirty() {
        core.metafile_write(m.inode_alloc_map, s as u64 * slot, &bytes, BufferType::InodeMap)?;
    }
    Ok(())
}

/// Write back everything dirty and make it durable.
pub fn sync_all(core: &Core) -> FsResult<()> {
    let handles: Vec<Arc<InodeHandle>> = core.inodes.lock().values().cloned().collect();
    // User inodes first, then the system inodes they may have changed (inode file).
    let (system, user): (Vec<_>, Vec<_>) = handles.into_iter().partition(|h| h.state.read().inode.flags & FLAG_SYSTEM != 0);
    for h in user.iter().chain(system.iter()) {
        flush_inode(core, h)?;
    }
    flush_maps(core)?;
    core.nsd.sync_all()?;
    Ok(())
}

/// Release an inode whose last link and last reference are gone: free its blocks,
/// write it back as free, and clear it in the inode map.
pub fn free_inode(core: &Core, st: &mut InodeState) -> FsResult<()> {
    let ino = st.inode.ino;
    assert_eq!(st.inode.nlink, 0, "freeing inode {ino} that still has links");
    core.alloc.unreserve(core.pool.remove_from(ino, 0));
    let units = block_map::cut_from(core, st, 0)?;
    for (_, da, n) in units {
        core.alloc.free(da, n)?;
    }
    st.dir_blocks.lock().clear();
    st.indirect.lock().clear();
    st.realloc.clear();
    st.inode.size = 0;
    st.inode.subblocks = 0;
    st.inode.depth = 0;
    st.inode.last_block_subblocks = 0;
    st.inode.entries = 0;
    st.inode.xattrs.clear();
    st.inode.content = InodeContent::InlineData(Vec::new());
    core.write_inode(&st.inode)?;
    st.dirty = false;
    st.deleted = true;
    core.imap.free(ino)?;
    core.inodes.lock().remove(&ino);
    core.lookups.lock().remove(&ino);
    core.coherence.release(ino);
    Ok(())
}

/// Evict inodes beyond `maxFilesToCache` (least recently used, clean, unopened),
/// keeping their attributes in the stat cache up to `maxStatCache`.
pub fn evict_inodes(core: &Core) -> FsResult<()> {
    let (max_files, max_stat) = {
        let c = core.cfg.read();
        (c.max_files_to_cache, c.max_stat_cache)
    };
    let mut candidates: Vec<Arc<InodeHandle>> = {
        let map = core.inodes.lock();
        if map.len() <= max_files {
            return Ok(());
        }
        map.values().filter(|h| Arc::strong_count(h) == 1 && h.opens.load(Ordering::SeqCst) == 0).cloned().collect()
    };
    candidates.retain(|h| {
        let st = h.state.read();
        st.inode.flags & FLAG_SYSTEM == 0 && st.inode.nlink > 0 && !st.deleted
    });
    candidates.sort_by_key(|h| h.last_use.load(Ordering::Relaxed));
    let excess = core.inodes.lock().len().saturating_sub(max_files);
    for h in candidates.into_iter().take(excess) {
        flush_inode(core, &h)?;
        let st = h.state.read();
        if st.dirty || !core.pool.keys_of(h.ino, true).is_empty() {
            continue;
        }
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
        core.alloc.unreserve(core.pool.remove_from(h.ino, 0));
        core.coherence.release(h.ino);
        if max_stat > 0 {
            let mut sc = core.stat_cache.lock();
            let (m, order) = &mut *sc;
            m.insert(inode.ino, inode);
            order.push_back(h.ino);
            while m.len() > max_stat {
                match order.pop_front() {
                    Some(old) => {
                        m.remove(&old);
                    }
                    None => break,
                }
            }
        }
    }
    Ok(())
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
            threads.push(std::thread::Builder::new().name(format!("writebehind{i}")).spawn(move || writebehind_loop(&c)).expect("spawn"));
        }
        for i in 0..cfg.prefetch_threads.max(1) {
            let c = core.clone();
            threads.push(std::thread::Builder::new().name(format!("prefetch{i}")).spawn(move || prefetch_loop(&c)).expect("spawn"));
        }
        let c = core.clone();
        threads.push(std::thread::Builder::new().name("sync".into()).spawn(move || sync_loop(&c)).expect("spawn"));
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

fn writebehind_loop(core: &Core) {
    loop {
        let job = core.flushq.lock().pop_front();
        if let Some((ino, b)) = job {
            if let Some(h) = core.cached_handle(ino) {
                if let Err(e) = file_io::flush_block(core, &h, b) {
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
                    match file_io::flush_block(core, &h, b) {
                        Ok(()) => progressed = true,
                        Err(e) => report(core, &format!("write-behind of inode {ino} block {b}"), e),
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
            core.pool.flush_wake.1.wait_for(&mut w, Duration::from_millis(100));
        }
        *w = false;
    }
}

fn prefetch_loop(core: &Core) {
    loop {
        let job = {
            let mut q = core.prefetchq.lock();
            if q.is_empty() && !core.shutting_down.load(Ordering::SeqCst) {
                core.prefetch_cv.wait_for(&mut q, Duration::from_millis(100));
            }
            q.pop_front()
        };
        match job {
            Some((ino, b)) => {
                if let Some(h) = core.cached_handle(ino) {
                    if let Err(e) = file_io::prefetch_block(core, &h, b) {
                        report(core, &format!("prefetch of inode {ino} block {b}"), e);
                    }
                }
            }
            None if core.shutting_down.load(Ordering::SeqCst) => return,
            None => {}
        }
    }
}

fn sync_loop(core: &Core) {
    let mut last = Instant::now();
    loop {
        std::thread::sleep(Duration::from_millis(100));
        if core.shutting_down.load(Ordering::SeqCst) {
            return;
        }
        let interval = Duration::from_secs(core.cfg.read().sync_interval_secs.max(1));
        if core.inodes.lock().len() > core.cfg.read().max_files_to_cache {
            if let Err(e) = evict_inodes(core) {
                report(core, "inode cache eviction", e);
            }
        }
        if last.elapsed() >= interval {
            last = Instant::now();
            if core.read_only.load(Ordering::Relaxed) {
                continue;
            }
            if let Err(e) = sync_all(core) {
                report(core, "periodic sync", e);
            }
        }
    }
}
