//! The pagepool: Mako's own bounded cache of file data blocks (DESIGN.md 5).
//!
//! Invariants:
//! - Bytes held by buffers never exceed `pagepool` by more than the buffers being
//!   filled at this moment (insertions evict clean buffers first; dirty data is bounded
//!   by `dirty_limit`, and writers wait for write-behind before adding more).
//! - A dirty buffer is never evicted; it leaves only by being written or by its file
//!   being truncated or deleted.
//! - Lock order: inode state lock, then a buffer's lock; the pool's map lock is never
//!   held while taking a buffer lock.

use mako_diag::Condvar;
use mako_diag::{CountedMutex, LockClass, Wait, WaitGuard};
use mako_disk::AlignedBuf;
use parking_lot::Mutex;
use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

pub type BufferKey = (u64, u64);

/// One cached block of a file.
#[derive(Default)]
pub struct DataBuffer {
    /// Block content from offset 0; bytes past `bytes.len()` read as zero.
    pub bytes: AlignedBuf,
    /// The bytes reflect the whole block (disk content merged with writes).
    pub loaded: bool,
    /// Outside the dirty range the bytes are what the block's disk copy holds (read
    /// from it, or written to it): a write-back may then write just the dirty range.
    /// False for a buffer built without reading (new data over a hole or past EOF).
    pub on_disk: bool,
    /// Dirty byte range within the block. When not `loaded`, only these bytes are valid.
    pub dirty: Option<(u32, u32)>,
    /// Bytes written since the buffer was last clean (overwrites count again). When it
    /// reaches the block size the block is complete and goes to write-behind: a test
    /// on the dirty envelope instead re-queues the block for every record that lands
    /// after the last byte was written (interleaved writers), amplifying writes.
    pub written_since_clean: u64,
    /// Brought in by prefetch and not read yet (prefetch efficiency).
    pub prefetched: bool,
    /// Subblocks reserved in the allocation map for this block's dirty data, until
    /// write-behind allocates it (or truncate/delete gives them back).
    pub reserved: u32,
    /// For a chunk of the inode file, one per inode slot: 1 + the token client's
    /// `grant_clock` when the slot was read from disk, 0 when it must be read again
    /// (its token left). An inode granted to this node after its slot was read may be
    /// newer on disk than here: that slot alone is read again (`Core::read_inode`),
    /// the chunk's other inodes stay.
    pub slot_stamps: Vec<u64>,
    /// Bytes charged to the pool for this buffer.
    charged: u64,
}

impl DataBuffer {
    pub fn is_dirty(&self) -> bool {
        self.dirty.is_some()
    }
    /// Mark `lo..hi` dirty, merging with the current range.
    pub fn add_dirty(&mut self, lo: u32, hi: u32) {
        self.dirty = Some(match self.dirty {
            None => (lo, hi),
            Some((a, b)) => (a.min(lo), b.max(hi)),
        });
    }
}

/// Lock classes of `mako diag counters`.
pub static BUFFER_LOCK: LockClass = LockClass::new("buffer");
pub static PAGEPOOL_MAP_LOCK: LockClass = LockClass::new("pagepool.map");
pub static PAGEPOOL_CLOCK_LOCK: LockClass = LockClass::new("pagepool.clock");

pub struct BufferSlot {
    pub buf: CountedMutex<DataBuffer>,
    referenced: AtomicBool,
}

#[derive(Default)]
pub struct PoolStats {
    pub hits: AtomicU64,
    pub misses: AtomicU64,
    pub evictions: AtomicU64,
    pub prefetch_issued: AtomicU64,
    pub prefetch_used: AtomicU64,
    pub prefetch_wasted: AtomicU64,
    pub writer_waits: AtomicU64,
}

pub struct PagePool {
    map: CountedMutex<BTreeMap<BufferKey, Arc<BufferSlot>>>,
    clock: CountedMutex<VecDeque<BufferKey>>,
    bytes: AtomicU64,
    dirty_bytes: AtomicU64,
    limit: AtomicU64,
    room: (Mutex<()>, Condvar),
    /// Woken when write-behind has work.
    pub flush_wake: (Mutex<bool>, Condvar),
    pub stats: PoolStats,
}

impl PagePool {
    /// Freed block buffers kept for reuse beside a pagepool of `limit` bytes: up to the
    /// pagepool itself. This adds nothing to the peak: spares are memory that buffers
    /// used before and give back to the next buffer (`AlignedBuf` unmaps spares before
    /// it maps anew), so makod's data memory stays at most the pagepool's peak use, and
    /// streaming never pays for fresh zeroed pages once the pagepool has filled.
    pub fn spare_budget(limit: u64) -> usize {
        limit.max(16 << 20) as usize
    }

    pub fn new(limit_bytes: u64) -> PagePool {
        mako_disk::AlignedBuf::set_spare_budget(Self::spare_budget(limit_bytes));
        PagePool {
            map: CountedMutex::new(&PAGEPOOL_MAP_LOCK, BTreeMap::new()),
            clock: CountedMutex::new(&PAGEPOOL_CLOCK_LOCK, VecDeque::new()),
            bytes: AtomicU64::new(0),
            dirty_bytes: AtomicU64::new(0),
            limit: AtomicU64::new(limit_bytes),
            room: (Mutex::new(()), Condvar::new()),
            flush_wake: (Mutex::new(false), Condvar::new()),
            stats: PoolStats::default(),
        }
    }

    pub fn limit(&self) -> u64 {
        self.limit.load(Ordering::Relaxed)
    }
    pub fn used_bytes(&self) -> u64 {
        self.bytes.load(Ordering::Relaxed)
    }
    pub fn dirty_bytes(&self) -> u64 {
        self.dirty_bytes.load(Ordering::Relaxed)
    }
    /// Dirty data allowed before writers wait for write-behind: half the pool.
    pub fn dirty_limit(&self) -> u64 {
        self.limit() / 2
    }
    pub fn buffers(&self) -> usize {
        self.map.lock().len()
    }

    pub fn get(&self, key: BufferKey) -> Option<Arc<BufferSlot>> {
        let s = self.map.lock().get(&key).cloned();
        if let Some(s) = &s {
            s.referenced.store(true, Ordering::Relaxed);
        }
        s
    }

    /// The slot for `key`, created empty (not loaded, not dirty) if absent.
    pub fn get_or_create(&self, key: BufferKey) -> Arc<BufferSlot> {
        let mut map = self.map.lock();
        if let Some(s) = map.get(&key) {
            s.referenced.store(true, Ordering::Relaxed);
            self.stats.hits.fetch_add(1, Ordering::Relaxed);
            return s.clone();
        }
        self.stats.misses.fetch_add(1, Ordering::Relaxed);
        let s = Arc::new(BufferSlot {
            buf: CountedMutex::new(&BUFFER_LOCK, DataBuffer::default()),
            referenced: AtomicBool::new(true),
        });
        map.insert(key, s.clone());
        drop(map);
        self.clock.lock().push_back(key);
        s
    }

    /// Record a change in a buffer's size and dirtiness; call with the buffer locked,
    /// after changing it, passing what it was before.
    pub fn account(&self, buf: &mut DataBuffer, was_dirty: bool) {
        let now = buf.bytes.capacity() as u64;
        if now > buf.charged {
            self.bytes.fetch_add(now - buf.charged, Ordering::Relaxed);
        } else {
            self.bytes.fetch_sub(buf.charged - now, Ordering::Relaxed);
        }
        let dirty_before = if was_dirty { buf.charged } else { 0 };
        let dirty_after = if buf.is_dirty() { now } else { 0 };
        if dirty_after > dirty_before {
            self.dirty_bytes
                .fetch_add(dirty_after - dirty_before, Ordering::Relaxed);
        } else if dirty_before > dirty_after {
            self.dirty_bytes
                .fetch_sub(dirty_before - dirty_after, Ordering::Relaxed);
            self.room.1.notify_all();
        }
        buf.charged = now;
        if self.used_bytes() > self.limit() {
            self.evict(self.used_bytes() - self.limit());
        }
    }

    /// Drop clean buffers (second-chance clock) until `want` bytes are freed or no
    /// clean buffer is left to drop.
    pub fn evict(&self, want: u64) {
        let mut freed = 0u64;
        let mut scanned = 0usize;
        let max_scan = self.clock.lock().len() * 2 + 1;
        while freed < want && scanned < max_scan {
            scanned += 1;
            let key = match self.clock.lock().pop_front() {
                Some(k) => k,
                None => break,
            };
            let slot = match self.map.lock().get(&key).cloned() {
                Some(s) => s,
                None => continue, // already removed
            };
            if slot.referenced.swap(false, Ordering::Relaxed) {
                self.clock.lock().push_back(key);
                continue;
            }
            let Some(mut b) = slot.buf.try_lock() else {
                self.clock.lock().push_back(key);
                continue;
            };
            if b.is_dirty() {
                self.clock.lock().push_back(key);
                continue;
            }
            let mut map = self.map.lock();
            if map.get(&key).is_some_and(|s| Arc::ptr_eq(s, &slot)) {
                map.remove(&key);
            }
            drop(map);
            if b.prefetched {
                self.stats.prefetch_wasted.fetch_add(1, Ordering::Relaxed);
            }
            freed += b.charged;
            self.bytes.fetch_sub(b.charged, Ordering::Relaxed);
            b.charged = 0;
            b.bytes = AlignedBuf::new();
            b.loaded = false;
            b.on_disk = false;
            self.stats.evictions.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Remove every buffer of `ino` at block index >= `from`, dirty or not (truncate,
    /// delete). Waits for in-flight users of each buffer.
    #[must_use = "reserved subblocks must be given back to the allocation map"]
    pub fn remove_from(&self, ino: u64, from: u64) -> u64 {
        self.remove_from_range(ino, from, u64::MAX)
    }

    /// Remove `ino`'s buffers with block index in `from..to` (punch hole).
    /// Returns the subblocks the removed buffers had reserved (the caller gives them
    /// back to the allocation map).
    #[must_use = "reserved subblocks must be given back to the allocation map"]
    pub fn remove_from_range(&self, ino: u64, from: u64, to: u64) -> u64 {
        let mut released = 0u64;
        if to == 0 {
            return 0;
        }
        let slots: Vec<(BufferKey, Arc<BufferSlot>)> = {
            let map = self.map.lock();
            map.range((ino, from)..=(ino, to - 1))
                .map(|(k, v)| (*k, v.clone()))
                .collect()
        };
        for (key, slot) in slots {
            let mut b = slot.buf.lock();
            let was_dirty = b.is_dirty();
            let mut map = self.map.lock();
            if map.get(&key).is_some_and(|s| Arc::ptr_eq(s, &slot)) {
                map.remove(&key);
            }
            drop(map);
            b.dirty = None;
            b.bytes = AlignedBuf::new();
            b.loaded = false;
            b.on_disk = false;
            released += b.reserved as u64;
            b.reserved = 0;
            self.account(&mut b, was_dirty);
        }
        released
    }

    /// Keys of `ino`'s buffers in order (dirty only if `dirty_only`).
    pub fn keys_of(&self, ino: u64, dirty_only: bool) -> Vec<BufferKey> {
        let slots: Vec<(BufferKey, Arc<BufferSlot>)> = self
            .map
            .lock()
            .range((ino, 0)..=(ino, u64::MAX))
            .map(|(k, v)| (*k, v.clone()))
            .collect();
        slots
            .into_iter()
            .filter(|(_, s)| !dirty_only || s.buf.lock().is_dirty())
            .map(|(k, _)| k)
            .collect()
    }

    /// First cached block index of `ino` at or after `from`.
    pub fn first_cached_from(&self, ino: u64, from: u64) -> Option<u64> {
        self.map
            .lock()
            .range((ino, from)..=(ino, u64::MAX))
            .next()
            .map(|(k, _)| k.1)
    }

    /// Every cached buffer's key, in order (diagnostics; the simulation's check that
    /// cached data lies under a token).
    pub fn keys(&self) -> Vec<BufferKey> {
        self.map.lock().keys().copied().collect()
    }

    /// Every dirty buffer key, oldest clock position first.
    pub fn dirty_keys(&self, max: usize) -> Vec<BufferKey> {
        let slots: Vec<(BufferKey, Arc<BufferSlot>)> = self
            .map
            .lock()
            .iter()
            .map(|(k, v)| (*k, v.clone()))
            .collect();
        slots
            .into_iter()
            .filter(|(_, s)| s.buf.lock().is_dirty())
            .map(|(k, _)| k)
            .take(max)
            .collect()
    }

    /// Drop every clean buffer (`mako bench` cache drop, tests).
    pub fn drop_clean(&self) {
        let slots: Vec<(BufferKey, Arc<BufferSlot>)> = self
            .map
            .lock()
            .iter()
            .map(|(k, v)| (*k, v.clone()))
            .collect();
        for (key, slot) in slots {
            let mut b = slot.buf.lock();
            if b.is_dirty() {
                continue;
            }
            self.map.lock().remove(&key);
            self.bytes.fetch_sub(b.charged, Ordering::Relaxed);
            b.charged = 0;
            b.bytes = AlignedBuf::new();
            b.loaded = false;
            b.on_disk = false;
        }
        self.clock.lock().retain(|_| true);
    }

    /// Writers call this before taking any inode lock: wait while dirty data is over
    /// its limit, waking write-behind. Bounded wait per round so shutdown is never stuck.
    pub fn wait_for_room(&self, incoming: u64, give_up: &dyn Fn() -> bool) {
        let mut waited = None;
        let start = std::time::Instant::now();
        while self.dirty_bytes() + incoming > self.dirty_limit() && self.dirty_bytes() > 0 {
            // Never wait forever: when write-behind cannot make progress (a failing disk
            // turned the mount read-only) the write goes on and reports the error.
            if give_up() || start.elapsed() > Duration::from_secs(30) {
                return;
            }
            if waited.is_none() {
                self.stats.writer_waits.fetch_add(1, Ordering::Relaxed);
                waited = Some(WaitGuard::new(Wait::Static(
                    "waiting for write-behind to free pagepool",
                )));
            }
            self.wake_flushers();
            let mut g = self.room.0.lock();
            self.room.1.wait_for(&mut g, Duration::from_millis(20));
        }
    }

    pub fn wake_flushers(&self) {
        let mut w = self.flush_wake.0.lock();
        *w = true;
        self.flush_wake.1.notify_all();
    }

    pub fn set_limit(&self, bytes: u64) {
        self.limit.store(bytes, Ordering::Relaxed);
        mako_disk::AlignedBuf::set_spare_budget(Self::spare_budget(bytes));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn eviction_keeps_dirty_and_bounds_memory() {
        let pool = PagePool::new(1 << 20);
        for i in 0..16u64 {
            let s = pool.get_or_create((1, i));
            let mut b = s.buf.lock();
            b.bytes = AlignedBuf::from_slice(&[1u8; 128 << 10]);
            b.loaded = true;
            if i == 0 {
                b.add_dirty(0, 10);
                pool.account(&mut b, false);
            } else {
                pool.account(&mut b, false);
            }
        }
        assert!(
            pool.used_bytes() <= (1 << 20) + (128 << 10),
            "used {}",
            pool.used_bytes()
        );
        assert!(pool.get((1, 0)).is_some(), "dirty buffer evicted");
        assert_eq!(pool.dirty_bytes(), 128 << 10);
        assert_eq!(pool.remove_from(1, 0), 0);
        assert_eq!(pool.dirty_bytes(), 0);
        assert_eq!(pool.used_bytes(), 0);
    }
}
