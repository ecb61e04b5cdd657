//! The inode allocation map: which inode numbers are in use, in segments.

use crate::error::{DamageSink, FsError, FsResult, IntegrityError, SinkSlot};
use mako_diag::{CountedMutex, LockClass};
use mako_format::inode_map_segment::InodeMapSegment;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

/// Lock class of `mako diag counters`.
pub static INODE_MAP_SEGMENT_LOCK: LockClass = LockClass::new("inodeMap.segment");

pub struct InodeMap {
    segments: Vec<CountedMutex<(InodeMapSegment, bool)>>,
    inodes_per_segment: u32,
    inodes_max: u64,
    used: AtomicU64,
    cursor: AtomicUsize,
    /// Segments changed since the last commit (for the log's size estimate).
    dirty_segments: AtomicU64,
    /// Numbers set aside for operations in flight (`reserve`): free in the map, but not
    /// handed to anyone else until used or given back.
    reserved: CountedMutex<crate::core::FastSet<u64>>,
    /// Where an inode freed twice or a number past the limit is reported.
    damage: SinkSlot,
    /// Segments this node hands numbers out of and frees in: those whose token it
    /// holds (docs/coherence.md section 6). Others keep their bitmap as last read.
    owned: Vec<AtomicBool>,
    /// Numbers freed here in other nodes' segments: (transaction, inode). Sent to the
    /// owner once the transaction is checkpointed (this node's log then never writes
    /// the inode again).
    foreign: parking_lot::Mutex<Vec<(u64, u64)>>,
    foreign_ready: parking_lot::Mutex<Vec<u64>>,
}

/// A foreign free not yet committed.
const UNCOMMITTED: u64 = u64::MAX;

/// Lock class of `mako diag counters`.
pub static INODE_MAP_RESERVED_LOCK: LockClass = LockClass::new("inodeMap.reserved");

impl InodeMap {
    pub fn segment_count(inodes_max: u64, per_segment: u32) -> u32 {
        inodes_max.div_ceil(per_segment as u64) as u32
    }

    pub fn fresh(inodes_max: u64, per_segment: u32) -> Vec<InodeMapSegment> {
        (0..Self::segment_count(inodes_max, per_segment))
            .map(|s| InodeMapSegment::new(s, s as u64 * per_segment as u64, per_segment))
            .collect()
    }

    pub fn new(segments: Vec<InodeMapSegment>, inodes_max: u64, per_segment: u32) -> InodeMap {
        let count = segments.len();
        let used = segments
            .iter()
            .map(|s| s.bitmap.iter().map(|w| w.count_ones() as u64).sum::<u64>())
            .sum();
        InodeMap {
            segments: segments
                .into_iter()
                .map(|s| CountedMutex::new(&INODE_MAP_SEGMENT_LOCK, (s, false)))
                .collect(),
            inodes_per_segment: per_segment,
            inodes_max,
            used: AtomicU64::new(used),
            cursor: AtomicUsize::new(0),
            dirty_segments: AtomicU64::new(0),
            reserved: CountedMutex::new(&INODE_MAP_RESERVED_LOCK, Default::default()),
            damage: SinkSlot::default(),
            owned: (0..count).map(|_| AtomicBool::new(true)).collect(),
            foreign: parking_lot::Mutex::new(Vec::new()),
            foreign_ready: parking_lot::Mutex::new(Vec::new()),
        }
    }

    pub fn segment_of(&self, ino: u64) -> usize {
        (ino / self.inodes_per_segment as u64) as usize
    }

    pub fn segments(&self) -> usize {
        self.segments.len()
    }

    pub fn is_owned(&self, segment: usize) -> bool {
        self.owned
            .get(segment)
            .is_some_and(|o| o.load(Ordering::Acquire))
    }

    /// Stop handing out numbers of `segment` (see `AllocMap::disown`).
    pub fn disown(&self, segment: usize) {
        self.owned[segment].store(false, Ordering::Release);
        let mut g = self.segments[segment].lock();
        if g.1 {
            g.1 = false;
            self.dirty_segments.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// Start handing out numbers of `segment`, from `seg` as read from disk.
    pub fn own(&self, segment: usize, seg: InodeMapSegment) {
        if self.is_owned(segment) {
            return;
        }
        let count =
            |s: &InodeMapSegment| s.bitmap.iter().map(|w| w.count_ones() as u64).sum::<u64>();
        let mut g = self.segments[segment].lock();
        let (before, after) = (count(&g.0), count(&seg));
        g.0 = seg;
        drop(g);
        self.used.fetch_add(after, Ordering::Relaxed);
        self.used.fetch_sub(before, Ordering::Relaxed);
        self.owned[segment].store(true, Ordering::Release);
    }

    /// The running transaction becomes `seq` (see `AllocMap::end_transaction`).
    pub fn end_transaction(&self, seq: u64) {
        for f in self.foreign.lock().iter_mut() {
            if f.0 == UNCOMMITTED {
                f.0 = seq;
            }
        }
    }

    /// Transactions up to `seq` are checkpointed: their foreign frees may be sent.
    pub fn release_frees(&self, seq: u64) {
        let mut f = self.foreign.lock();
        if f.is_empty() {
            return;
        }
        let (done, keep): (Vec<_>, Vec<_>) = f.drain(..).partition(|(s, _)| *s <= seq);
        *f = keep;
        self.foreign_ready
            .lock()
            .extend(done.into_iter().map(|(_, ino)| ino));
    }

    pub fn take_foreign_frees(&self) -> Vec<u64> {
        std::mem::take(&mut *self.foreign_ready.lock())
    }

    pub fn return_foreign_frees(&self, inos: Vec<u64>) {
        self.foreign_ready.lock().extend(inos);
    }

    /// Report integrity failures to the mounted file system's sink.
    pub fn attach_damage(&self, sink: DamageSink) {
        self.damage.attach(sink);
    }

    /// Set aside a free inode number for an operation that will use it once it holds
    /// the number's token (`use_reserved`), or give it back (`unreserve`). Changes
    /// nothing on disk, so an operation may restart after reserving.
    pub fn reserve(&self) -> FsResult<u64> {
        let mut reserved = self.reserved.lock();
        let n = self.segments.len();
        let start = self.cursor.load(Ordering::Relaxed);
        for k in 0..n {
            let s = (start + k) % n;
            if !self.owned[s].load(Ordering::Acquire) {
                continue;
            }
            let g = self.segments[s].lock();
            let seg = &g.0;
            for (wi, w) in seg.bitmap.iter().enumerate() {
                if *w == u64::MAX {
                    continue;
                }
                let mut free = !*w;
                while free != 0 {
                    let bit = free.trailing_zeros() as u64;
                    free &= free - 1;
                    let ino = seg.first_ino + wi as u64 * 64 + bit;
                    if ino >= self.inodes_max {
                        break;
                    }
                    if reserved.insert(ino) {
                        self.cursor.store(s, Ordering::Relaxed);
                        return Ok(ino);
                    }
                }
            }
        }
        Err(FsError::NoSpace(format!(
            "all {} inodes are in use; raise the inode limit (`mako fs create --inodes`)",
            self.inodes_max
        )))
    }

    pub fn is_reserved(&self, ino: u64) -> bool {
        self.reserved.lock().contains(&ino)
    }

    pub fn unreserve(&self, ino: u64) {
        self.reserved.lock().remove(&ino);
    }

    /// Undo `use_reserved` when the operation that used the number fails before it
    /// commits (or restarts): free again, and still reserved for it.
    pub fn unuse_reserved(&self, ino: u64) -> FsResult<()> {
        let mut reserved = self.reserved.lock();
        self.free(ino)?;
        reserved.insert(ino);
        Ok(())
    }

    /// Mark a reserved number used (part of the operation's transaction).
    pub fn use_reserved(&self, ino: u64) -> FsResult<()> {
        let (s, w, b) = self.slot(ino, "allocate")?;
        let mut g = self.segments[s].lock();
        if g.0.bitmap[w] >> b & 1 == 1 {
            return Err(self.damage.integrity(
                IntegrityError::new(
                    "inode allocation map",
                    "a reserved inode number is marked in use",
                )
                .ino(ino),
            ));
        }
        g.0.bitmap[w] |= 1 << b;
        crate::journal::note_change();
        if !g.1 {
            g.1 = true;
            self.dirty_segments.fetch_add(1, Ordering::Relaxed);
        }
        self.used.fetch_add(1, Ordering::Relaxed);
        drop(g);
        self.reserved.lock().remove(&ino);
        Ok(())
    }

    pub fn used(&self) -> u64 {
        self.used.load(Ordering::Relaxed)
    }
    pub fn inodes_max(&self) -> u64 {
        self.inodes_max
    }

    pub fn allocate(&self) -> FsResult<u64> {
        let reserved = self.reserved.lock();
        let n = self.segments.len();
        let start = self.cursor.load(Ordering::Relaxed);
        for k in 0..n {
            let s = (start + k) % n;
            let mut g = self.segments[s].lock();
            let (seg, dirty) = &mut *g;
            for (wi, w) in seg.bitmap.iter_mut().enumerate() {
                if *w != u64::MAX {
                    let mut free = !*w;
                    let mut pick = None;
                    while free != 0 {
                        let bit = free.trailing_zeros() as u64;
                        free &= free - 1;
                        if !reserved.contains(&(seg.first_ino + wi as u64 * 64 + bit)) {
                            pick = Some(bit);
                            break;
                        }
                    }
                    let Some(bit) = pick else { continue };
                    let ino = seg.first_ino + wi as u64 * 64 + bit;
                    if ino >= self.inodes_max {
                        break;
                    }
                    *w |= 1 << bit;
                    crate::journal::note_change();
                    if !*dirty {
                        *dirty = true;
                        self.dirty_segments.fetch_add(1, Ordering::Relaxed);
                    }
                    self.used.fetch_add(1, Ordering::Relaxed);
                    self.cursor.store(s, Ordering::Relaxed);
                    return Ok(ino);
                }
            }
        }
        Err(FsError::NoSpace(format!(
            "all {} inodes are in use; raise the inode limit (`mako fs create --inodes`)",
            self.inodes_max
        )))
    }

    /// Segment, word and bit of `ino`; `None` past the inode limit (or the segments).
    fn locate(&self, ino: u64) -> Option<(usize, usize, u64)> {
        if ino >= self.inodes_max {
            return None;
        }
        let s = (ino / self.inodes_per_segment as u64) as usize;
        let i = ino % self.inodes_per_segment as u64;
        (s < self.segments.len()).then_some((s, (i / 64) as usize, i % 64))
    }

    /// `locate`, or an integrity failure: an inode number to change that lies past
    /// the limit came from damaged metadata or a bug.
    fn slot(&self, ino: u64, doing: &str) -> FsResult<(usize, usize, u64)> {
        self.locate(ino).ok_or_else(|| {
            self.damage.integrity(
                IntegrityError::new(
                    "inode allocation map",
                    format!(
                        "{doing}: the number is past the inode limit {}",
                        self.inodes_max
                    ),
                )
                .ino(ino),
            )
        })
    }

    pub fn mark_used(&self, ino: u64) -> FsResult<()> {
        let (s, w, b) = self.slot(ino, "marking it in use")?;
        let mut g = self.segments[s].lock();
        if g.0.bitmap[w] >> b & 1 == 0 {
            g.0.bitmap[w] |= 1 << b;
            if !g.1 {
                g.1 = true;
                self.dirty_segments.fetch_add(1, Ordering::Relaxed);
            }
            self.used.fetch_add(1, Ordering::Relaxed);
        }
        Ok(())
    }

    pub fn is_used(&self, ino: u64) -> bool {
        match self.locate(ino) {
            Some((s, w, b)) => self.segments[s].lock().0.bitmap[w] >> b & 1 == 1,
            None => false,
        }
    }

    /// Free `ino`. Freeing a free inode is an integrity failure (the map is damaged
    /// or Mako has a bug): refused before anything changes, reported, and the mount
    /// turns read-only.
    pub fn free(&self, ino: u64) -> FsResult<()> {
        let (s, w, b) = self.slot(ino, "freeing it")?;
        if !self.owned[s].load(Ordering::Acquire) {
            crate::journal::note_change();
            self.foreign.lock().push((UNCOMMITTED, ino));
            return Ok(());
        }
        let mut g = self.segments[s].lock();
        if g.0.bitmap[w] >> b & 1 == 0 {
            drop(g);
            return Err(self.damage.integrity(
                IntegrityError::new(
                    "inode allocation map",
                    "freeing it: it is free already (a double free)",
                )
                .ino(ino),
            ));
        }
        g.0.bitmap[w] &= !(1 << b);
        crate::journal::note_change();
        if !g.1 {
            g.1 = true;
            self.dirty_segments.fetch_add(1, Ordering::Relaxed);
        }
        self.used.fetch_sub(1, Ordering::Relaxed);
        Ok(())
    }

    pub fn mark_all_dirty(&self) {
        for s in &self.segments {
            let mut g = s.lock();
            if !g.1 {
                g.1 = true;
                self.dirty_segments.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Dirty segments: (segment index, encoded bytes); clears dirty flags.
    pub fn take_dirty(&self) -> Vec<(u32, Vec<u8>)> {
        let mut out = Vec::new();
        if self.dirty_segments.load(Ordering::Relaxed) == 0 {
            return out;
        }
        for (i, s) in self.segments.iter().enumerate() {
            let mut g = s.lock();
            if g.1 {
                g.1 = false;
                self.dirty_segments.fetch_sub(1, Ordering::Relaxed);
                out.push((i as u32, g.0.encode()));
            }
        }
        out
    }

    /// Bytes of segments the next commit will log.
    pub fn dirty_bytes(&self) -> u64 {
        self.dirty_segments.load(Ordering::Relaxed) * self.slot_bytes() as u64
    }

    pub fn slot_bytes(&self) -> usize {
        InodeMapSegment::slot_bytes(self.inodes_per_segment)
    }
}
