//! The inode allocation map: which inode numbers are in use, in segments.

use crate::error::{DamageSink, FsError, FsResult, IntegrityError, SinkSlot};
use mako_diag::CountedRwLock;
use mako_diag::{CountedMutex, LockClass};
use mako_format::inode_map_segment::InodeMapSegment;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

/// Lock class of `mako diag counters`.
pub static INODE_MAP_SEGMENT_LOCK: LockClass = LockClass::new("inodeMap.segment");

pub struct InodeMap {
    /// The segments in memory, by index: every segment whose block of the inode map
    /// file exists (read at mount), and those made since. A segment absent here lies in
    /// a hole of the file: blank, all free. The map is sparse so that a file system
    /// made for 2^40 inodes costs, in memory and at mount, what is in use.
    segments: CountedRwLock<BTreeMap<u64, Slot>>,
    segment_count: u64,
    /// Block size of the inode map file (segment slots never straddle a block).
    block_bytes: u32,
    inodes_per_segment: u32,
    inodes_max: u64,
    used: AtomicU64,
    cursor: AtomicU64,
    /// Segments changed since the last commit (for the log's size estimate).
    dirty_segments: AtomicU64,
    /// Numbers set aside for operations in flight (`reserve`): free in the map, but not
    /// handed to anyone else until used or given back.
    reserved: CountedMutex<crate::core::FastSet<u64>>,
    /// Where an inode freed twice or a number past the limit is reported.
    damage: SinkSlot,
    /// True while this node owns every segment (one node mounts the file system).
    all_owned: AtomicBool,
    /// Segments this node hands numbers out of and frees in when it does not own all:
    /// those whose token it holds (docs/coherence.md section 6). Others keep their
    /// bitmap as last read.
    owned: parking_lot::RwLock<BTreeSet<u64>>,
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
/// Lock class of `mako diag counters`.
pub static INODE_MAP_SEGMENTS_LOCK: LockClass = LockClass::new("inodeMap.segments");

/// A segment in memory and whether it changed since the last commit.
type Slot = Arc<CountedMutex<(InodeMapSegment, bool)>>;

fn ones(s: &InodeMapSegment) -> u64 {
    s.bitmap.iter().map(|w| w.count_ones() as u64).sum()
}

impl InodeMap {
    pub fn segment_count(inodes_max: u64, per_segment: u32) -> u64 {
        inodes_max.div_ceil(per_segment as u64)
    }

    /// `segments`: the segments read from disk (those in allocated blocks of the inode
    /// map file); every other one is blank.
    pub fn new(
        segments: Vec<InodeMapSegment>,
        inodes_max: u64,
        per_segment: u32,
        block_bytes: u32,
    ) -> InodeMap {
        let used = segments.iter().map(ones).sum();
        InodeMap {
            segments: CountedRwLock::new(
                &INODE_MAP_SEGMENTS_LOCK,
                segments
                    .into_iter()
                    .map(|s| {
                        (
                            s.segment as u64,
                            Arc::new(CountedMutex::new(&INODE_MAP_SEGMENT_LOCK, (s, false))),
                        )
                    })
                    .collect(),
            ),
            segment_count: Self::segment_count(inodes_max, per_segment),
            block_bytes,
            inodes_per_segment: per_segment,
            inodes_max,
            used: AtomicU64::new(used),
            cursor: AtomicU64::new(0),
            dirty_segments: AtomicU64::new(0),
            reserved: CountedMutex::new(&INODE_MAP_RESERVED_LOCK, Default::default()),
            damage: SinkSlot::default(),
            all_owned: AtomicBool::new(true),
            owned: parking_lot::RwLock::new(BTreeSet::new()),
            foreign: parking_lot::Mutex::new(Vec::new()),
            foreign_ready: parking_lot::Mutex::new(Vec::new()),
        }
    }

    /// Segment `s` in memory, made blank if it is not (it lies in a hole).
    fn seg(&self, s: u64) -> Slot {
        if let Some(x) = self.segments.read().get(&s) {
            return x.clone();
        }
        let per = self.inodes_per_segment;
        self.segments
            .write()
            .entry(s)
            .or_insert_with(|| {
                Arc::new(CountedMutex::new(
                    &INODE_MAP_SEGMENT_LOCK,
                    (InodeMapSegment::new(s as u32, s * per as u64, per), false),
                ))
            })
            .clone()
    }

    /// Segment `s` if it is in memory.
    fn loaded(&self, s: u64) -> Option<Slot> {
        self.segments.read().get(&s).cloned()
    }

    pub fn segment_of(&self, ino: u64) -> usize {
        (ino / self.inodes_per_segment as u64) as usize
    }

    /// Number of segments the inode limit spans (most lie in holes, never read).
    pub fn segments(&self) -> usize {
        self.segment_count as usize
    }

    /// Segments in memory (read at mount or made since): what this node's map costs.
    pub fn segments_loaded(&self) -> usize {
        self.segments.read().len()
    }

    pub fn inodes_per_segment(&self) -> u32 {
        self.inodes_per_segment
    }

    pub fn is_owned(&self, segment: usize) -> bool {
        (segment as u64) < self.segment_count
            && (self.all_owned.load(Ordering::Acquire)
                || self.owned.read().contains(&(segment as u64)))
    }

    /// The segments this node owns (all of them while it owns all: `None`).
    pub fn owned_segments(&self) -> Option<Vec<usize>> {
        if self.all_owned.load(Ordering::Acquire) {
            return None;
        }
        Some(self.owned.read().iter().map(|s| *s as usize).collect())
    }

    /// Stop owning every segment (a node of a cluster, at mount, before it takes its
    /// own): nothing is handed out until `own`.
    pub fn disown_all(&self) {
        if self.all_owned.swap(false, Ordering::AcqRel) {
            let loaded: Vec<Slot> = self.segments.read().values().cloned().collect();
            for x in loaded {
                let mut g = x.lock();
                if g.1 {
                    g.1 = false;
                    self.dirty_segments.fetch_sub(1, Ordering::Relaxed);
                }
            }
        }
        for s in std::mem::take(&mut *self.owned.write()) {
            self.disown(s as usize);
        }
    }

    /// Stop handing out numbers of `segment` (see `AllocMap::disown`).
    pub fn disown(&self, segment: usize) {
        self.owned.write().remove(&(segment as u64));
        if let Some(x) = self.loaded(segment as u64) {
            let mut g = x.lock();
            if g.1 {
                g.1 = false;
                self.dirty_segments.fetch_sub(1, Ordering::Relaxed);
            }
        }
    }

    /// Start handing out numbers of `segment`, from `seg` as read from disk.
    pub fn own(&self, segment: usize, seg: InodeMapSegment) {
        if self.is_owned(segment) {
            return;
        }
        let x = self.seg(segment as u64);
        let mut g = x.lock();
        let (before, after) = (ones(&g.0), ones(&seg));
        g.0 = seg;
        drop(g);
        self.used.fetch_add(after, Ordering::Relaxed);
        self.used.fetch_sub(before, Ordering::Relaxed);
        self.owned.write().insert(segment as u64);
    }

    /// Hand out numbers from `segment` first (the next `reserve` starts there): a test
    /// hook and an administrator's choice alike, it changes nothing on disk.
    pub fn start_at(&self, segment: u64) {
        self.cursor.store(
            segment.min(self.segment_count.saturating_sub(1)),
            Ordering::Relaxed,
        );
    }

    /// The segments to look in for a free number, from the cursor on: every segment
    /// while this node owns all (lazily: the walk stops at the first with room), else
    /// the owned ones.
    fn candidates(&self) -> Box<dyn Iterator<Item = u64> + '_> {
        let start = self.cursor.load(Ordering::Relaxed);
        if self.all_owned.load(Ordering::Acquire) {
            let n = self.segment_count;
            Box::new((0..n).map(move |k| (start + k) % n))
        } else {
            let owned: Vec<u64> = self.owned.read().iter().copied().collect();
            let (after, before): (Vec<u64>, Vec<u64>) =
                owned.into_iter().partition(|s| *s >= start);
            Box::new(after.into_iter().chain(before))
        }
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
        for s in self.candidates() {
            let x = self.seg(s);
            let g = x.lock();
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
        let x = self.seg(s);
        let mut g = x.lock();
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

    /// Segment, word and bit of `ino`; `None` past the inode limit (or the segments).
    fn locate(&self, ino: u64) -> Option<(u64, usize, u64)> {
        if ino >= self.inodes_max {
            return None;
        }
        let s = ino / self.inodes_per_segment as u64;
        let i = ino % self.inodes_per_segment as u64;
        (s < self.segment_count).then_some((s, (i / 64) as usize, i % 64))
    }

    /// `locate`, or an integrity failure: an inode number to change that lies past
    /// the limit came from damaged metadata or a bug.
    fn slot(&self, ino: u64, doing: &str) -> FsResult<(u64, usize, u64)> {
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
        let x = self.seg(s);
        let mut g = x.lock();
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
            Some((s, w, b)) => self
                .loaded(s)
                .is_some_and(|x| x.lock().0.bitmap[w] >> b & 1 == 1),
            None => false,
        }
    }

    /// Free `ino`. Freeing a free inode is an integrity failure (the map is damaged
    /// or Mako has a bug): refused before anything changes, reported, and the mount
    /// turns read-only.
    pub fn free(&self, ino: u64) -> FsResult<()> {
        let (s, w, b) = self.slot(ino, "freeing it")?;
        if !self.is_owned(s as usize) {
            crate::journal::note_change();
            self.foreign.lock().push((UNCOMMITTED, ino));
            return Ok(());
        }
        let x = self.seg(s);
        let mut g = x.lock();
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

    /// Mark every segment in memory dirty (file system creation writes them all).
    pub fn mark_all_dirty(&self) {
        let all: Vec<Slot> = self.segments.read().values().cloned().collect();
        for x in all {
            let mut g = x.lock();
            if !g.1 {
                g.1 = true;
                self.dirty_segments.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Dirty segments: (segment index, encoded bytes); clears dirty flags.
    pub fn take_dirty(&self) -> Vec<(u64, Vec<u8>)> {
        let mut out = Vec::new();
        if self.dirty_segments.load(Ordering::Relaxed) == 0 {
            return out;
        }
        let all: Vec<(u64, Slot)> = self
            .segments
            .read()
            .iter()
            .map(|(s, x)| (*s, x.clone()))
            .collect();
        for (i, x) in all {
            let mut g = x.lock();
            if g.1 {
                g.1 = false;
                self.dirty_segments.fetch_sub(1, Ordering::Relaxed);
                out.push((i, g.0.encode()));
            }
        }
        out
    }

    /// Bytes of segments the next commit will log.
    pub fn dirty_bytes(&self) -> u64 {
        self.dirty_segments.load(Ordering::Relaxed) * self.slot_bytes() as u64
    }

    /// Byte offset of segment `s` in the inode map file.
    pub fn slot_offset(&self, s: u64) -> u64 {
        mako_format::inode_map_segment::slot_offset(s, self.inodes_per_segment, self.block_bytes)
    }

    /// Block of the inode map file that holds segment `s`.
    pub fn block_of(&self, s: u64) -> u64 {
        self.slot_offset(s) / self.block_bytes as u64
    }

    /// The segments whose slots lie in block `b` of the inode map file.
    pub fn segments_in_block(&self, b: u64) -> std::ops::Range<u64> {
        mako_format::inode_map_segment::segments_in_block(
            b,
            self.segment_count,
            self.inodes_per_segment,
            self.block_bytes,
        )
    }

    /// A blank segment `s` (all free): what a hole of the inode map file holds.
    pub fn blank(&self, s: u64) -> InodeMapSegment {
        let per = self.inodes_per_segment;
        InodeMapSegment::new(s as u32, s * per as u64, per)
    }

    pub fn slot_bytes(&self) -> usize {
        InodeMapSegment::slot_bytes(self.inodes_per_segment)
    }
}
