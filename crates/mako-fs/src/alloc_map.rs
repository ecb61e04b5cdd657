//! The block allocation map (DESIGN.md 3.4): a subblock bitmap over every disk, cut
//! into regions; each region covers a slice of every disk, so an allocator working in
//! one region still stripes a file over all disks, and allocators in different regions
//! (other nodes, later) never contend.
//!
//! Invariants: a subblock is either free or owned by exactly one file; a full block is
//! block-aligned; a fragment never crosses a block boundary; the free counters always
//! equal the number of clear bits minus the quarantined ones.
//!
//! Logging (see `journal`): a change marks the 4 KiB pages of the region's encoded
//! segment that it touched; a commit logs those pages and the first page (which holds
//! the segment's checksum), never a whole segment for one bit. Freed subblocks are
//! clear in the bitmap (so the logged image says free) but quarantined: not handed out
//! again until the transaction that freed them has been checkpointed — unless the
//! running transaction allocated them itself: then no committed pointer and no log
//! image names them, and they are free at once (a fragment that grows append by
//! append is reallocated many times in one transaction; quarantining every copy left
//! the file system full of space nobody could use until the next checkpoint).
//!
//! Whole blocks: a reservation (dirty data waiting for write-behind) is a whole block
//! and is backed by a whole empty, unquarantined block (`ready_blocks`); no other
//! allocation takes an empty block when that would leave too few for the reservations
//! (`may_take_empty_block`), so write-behind always finds its block.
//!
//! What users see (`statfs`, `mako status`): free = clear bits (quarantined ones
//! included: an allocation that needs them checkpoints first) minus what is promised
//! to dirty data; available = whole empty blocks minus reservations and the metadata
//! reserve (which data never takes, and from which the indirect blocks mapping data
//! come) (`user_available_subblocks`). Every byte reported available can be reserved,
//! then allocated, by one write or fallocate.

use crate::error::{DamageSink, FsError, FsResult, IntegrityError, SinkSlot};
use mako_diag::{CountedMutex, LockClass};
use mako_format::alloc_segment::{AllocSegment, DiskSlice};
use mako_format::descriptor::{Descriptor, DiskStatus, LayoutMap, RESERVED_BYTES};
use mako_format::geometry::Geometry;
use mako_format::DiskAddress;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

/// One changed page of an encoded allocation segment: (offset in the segment slot, bytes).
pub type DirtyPage = (u64, Vec<u8>);

/// Lock class of `mako diag counters`.
pub static ALLOC_REGION_LOCK: LockClass = LockClass::new("alloc.region");

/// What an allocation will hold: data goes to data disks, the rest to metadata disks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AllocKind {
    Data,
    Metadata,
}

/// Bytes of a page of an encoded segment, the unit of logging.
pub const MAP_PAGE_BYTES: usize = 4096;
/// A free not yet committed: tagged with its transaction at the commit's snapshot.
const UNCOMMITTED: u64 = u64::MAX;

pub struct Region {
    pub seg: AllocSegment,
    /// Pages of the encoded segment changed since the last commit.
    dirty_pages: std::collections::BTreeSet<u32>,
    /// Per slice: free subblocks (not counting quarantined ones), and where the next
    /// search starts (in blocks).
    free: Vec<u64>,
    cursor: Vec<u64>,
    /// Per slice: byte offset of the bitmap's first word in the encoded segment.
    bitmap_offsets: Vec<usize>,
    /// Per slice: subblocks freed but not reusable yet (empty until the first free).
    quarantine: Vec<Vec<u64>>,
    /// Per slice: how many subblocks are quarantined.
    quarantined: Vec<u64>,
    /// Per slice: blocks with no subblock in use (quarantined ones count as unused):
    /// what full-block allocations can get after a checkpoint.
    empty: Vec<u64>,
    /// Per slice: empty blocks with no subblock quarantined either: what full-block
    /// allocations can get now.
    ready: Vec<u64>,
    spb: u64,
    /// The region's token is being revoked (`AllocMap::stop_allocating`): nothing is
    /// allocated here any more, and frees here go to the next owner as foreign frees.
    leaving: bool,
    /// How many times the region's token began to leave this node (`stop_allocating`):
    /// kept across `own`, so that a node that took the token can tell whether it left
    /// again before it started using the map it read (`AllocMap::own_since`).
    revokes: u64,
}

pub struct AllocMap {
    geo: Geometry,
    layout: LayoutMap,
    regions: Vec<CountedMutex<Region>>,
    /// Per disk: region boundaries in blocks (regions+1 entries).
    boundaries: Vec<Vec<u64>>,
    data_disks: Vec<u32>,
    meta_disks: Vec<u32>,
    free_subblocks: AtomicU64,
    /// Blocks with no subblock in use, quarantined ones included (`Region::empty`).
    empty_blocks: AtomicU64,
    /// Empty blocks without quarantined subblocks (`Region::ready`).
    ready_blocks: AtomicU64,
    /// Subblocks promised to dirty data not allocated yet (delayed allocation): a
    /// write reserves before it is accepted, so write-behind never meets ENOSPC.
    reserved_subblocks: AtomicU64,
    /// Subblocks that only metadata may take (indirect blocks, directory blocks and
    /// inode-file growth that a data flush may need).
    metadata_reserve: AtomicU64,
    total_subblocks: u64,
    /// Regions this node allocates in and frees in (docs/coherence.md section 6):
    /// those whose token it holds. Every counter above (free, empty, ready, reserved,
    /// quarantined, the metadata reserve) is about owned regions only: they say what
    /// this node can allocate. A region not owned keeps its segment as last read.
    owned: Vec<AtomicBool>,
    /// Subblocks in owned regions.
    owned_subblocks: AtomicU64,
    /// Frees in regions this node does not own: (transaction, address, subblocks).
    /// After the transaction is checkpointed they go to the region's owner
    /// (`take_foreign_frees`), which frees them in its map.
    foreign: parking_lot::Mutex<Vec<(u64, DiskAddress, u32)>>,
    /// Foreign frees whose transaction is checkpointed, waiting to be sent.
    foreign_ready: parking_lot::Mutex<Vec<(DiskAddress, u32)>>,
    next_region: AtomicUsize,
    rotor: AtomicUsize,
    /// Pages marked dirty in all regions (for the log's size estimate).
    dirty_pages: AtomicU64,
    /// Quarantined frees: (transaction, address, subblocks).
    frees: parking_lot::Mutex<Vec<(u64, DiskAddress, u32)>>,
    quarantined_subblocks: AtomicU64,
    /// Where a double free or an address outside every disk is reported.
    damage: SinkSlot,
    /// Allocations the running transaction made: address -> subblocks. Freed before
    /// the transaction's commit snapshot, they are reusable at once (module doc).
    fresh: parking_lot::Mutex<crate::core::FastMap<DiskAddress, u32>>,
}

/// What the allocation map's integrity failures are about.
const STRUCTURE: &str = "block allocation map";

/// Bytes of the allocation map file slot for one region.
pub fn segment_slot_bytes(desc: &Descriptor) -> usize {
    // Regions differ by up to a block per disk (integer division): size by the largest.
    let largest = (0..desc.regions)
        .map(|r| AllocSegment::encoded_len(&region_slices(desc, r)))
        .max()
        .unwrap_or(0);
    largest.div_ceil(4096) * 4096
}

/// First allocatable block on every disk (after the header and descriptor area).
pub fn first_block(geo: &Geometry) -> u64 {
    RESERVED_BYTES.div_ceil(geo.block_bytes as u64)
}

fn disk_blocks(desc: &Descriptor, disk: usize) -> u64 {
    desc.disks[disk].size_bytes / desc.geometry.block_bytes as u64
}

fn boundaries_for(desc: &Descriptor, disk: usize) -> Vec<u64> {
    let first = first_block(&desc.geometry);
    let n = disk_blocks(desc, disk).saturating_sub(first);
    let r = desc.regions as u64;
    (0..=r).map(|i| first + n * i / r).collect()
}

/// The slices of every disk that region `region` covers.
pub fn region_slices(desc: &Descriptor, region: u32) -> Vec<DiskSlice> {
    let spb = desc.geometry.subblocks_per_block as u64;
    (0..desc.disks.len())
        .map(|d| {
            let b = boundaries_for(desc, d);
            let lo = b[region as usize];
            let hi = b[region as usize + 1];
            DiskSlice {
                disk: d as u32,
                first_subblock: lo * spb,
                subblocks: (hi - lo) * spb,
            }
        })
        .collect()
}

fn bit(bm: &[u64], i: u64) -> bool {
    bm[(i / 64) as usize] >> (i % 64) & 1 == 1
}

fn range_free(bm: &[u64], start: u64, len: u64) -> bool {
    let mut i = start;
    let end = start + len;
    while i < end {
        if i.is_multiple_of(64) && end - i >= 64 {
            if bm[(i / 64) as usize] != 0 {
                return false;
            }
            i += 64;
        } else {
            if bit(bm, i) {
                return false;
            }
            i += 1;
        }
    }
    true
}

fn set_range(bm: &mut [u64], start: u64, len: u64, on: bool) {
    let mut i = start;
    let end = start + len;
    while i < end {
        if i.is_multiple_of(64) && end - i >= 64 {
            bm[(i / 64) as usize] = if on { u64::MAX } else { 0 };
            i += 64;
        } else {
            let w = &mut bm[(i / 64) as usize];
            if on {
                *w |= 1 << (i % 64);
            } else {
                *w &= !(1 << (i % 64));
            }
            i += 1;
        }
    }
}

fn count_used(bm: &[u64], len: u64) -> u64 {
    let full = (len / 64) as usize;
    let mut n: u64 = bm[..full].iter().map(|w| w.count_ones() as u64).sum();
    if !len.is_multiple_of(64) {
        n += (bm[full] & ((1u64 << (len % 64)) - 1)).count_ones() as u64;
    }
    n
}

impl Region {
    fn from_segment(seg: AllocSegment, spb: u64) -> Region {
        let free = seg
            .slices
            .iter()
            .zip(&seg.bitmaps)
            .map(|(s, b)| s.subblocks - count_used(b, s.subblocks))
            .collect();
        let cursor = vec![0; seg.slices.len()];
        let mut bitmap_offsets = Vec::new();
        let mut off = mako_format::alloc_segment::ALLOC_HEADER_BYTES;
        for s in &seg.slices {
            off += 20;
            bitmap_offsets.push(off);
            off += s.subblocks.div_ceil(64) as usize * 8;
        }
        let quarantine = vec![Vec::new(); seg.slices.len()];
        let quarantined = vec![0; seg.slices.len()];
        let empty = seg
            .slices
            .iter()
            .zip(&seg.bitmaps)
            .map(|(s, b)| {
                (0..s.subblocks / spb)
                    .filter(|k| range_free(b, k * spb, spb))
                    .count() as u64
            })
            .collect::<Vec<u64>>();
        Region {
            seg,
            dirty_pages: Default::default(),
            free,
            cursor,
            bitmap_offsets,
            quarantine,
            quarantined,
            ready: empty.clone(),
            empty,
            spb,
            leaving: false,
            revokes: 0,
        }
    }

    /// No subblock of block `k` of slice `si` in use.
    fn block_empty(&self, si: usize, k: u64) -> bool {
        range_free(&self.seg.bitmaps[si], k * self.spb, self.spb)
    }

    /// No subblock of block `k` of slice `si` in use or quarantined.
    fn block_ready(&self, si: usize, k: u64) -> bool {
        self.allocatable(si, k * self.spb, self.spb)
    }

    /// Blocks of slice `si` that subblocks `off..off+n` touch.
    fn blocks_of(&self, off: u64, n: u64) -> std::ops::Range<u64> {
        off / self.spb..(off + n.max(1)).div_ceil(self.spb)
    }

    /// Mark subblocks in use; returns how many blocks stopped being empty, and ready.
    fn set_bits(&mut self, si: usize, off: u64, n: u64) -> (u64, u64) {
        let (mut empty, mut ready) = (0, 0);
        for k in self.blocks_of(off, n) {
            empty += u64::from(self.block_empty(si, k));
            ready += u64::from(self.block_ready(si, k));
        }
        set_range(&mut self.seg.bitmaps[si], off, n, true);
        self.empty[si] -= empty;
        self.ready[si] -= ready;
        (empty, ready)
    }

    /// Count the blocks under subblocks `off..off+n`, which were in use until now and
    /// are free (or quarantined) now, that became empty, and ready.
    fn count_freed(&mut self, si: usize, off: u64, n: u64) -> (u64, u64) {
        let (mut empty, mut ready) = (0, 0);
        for k in self.blocks_of(off, n) {
            empty += u64::from(self.block_empty(si, k));
            ready += u64::from(self.block_ready(si, k));
        }
        self.empty[si] += empty;
        self.ready[si] += ready;
        (empty, ready)
    }

    /// Mark the pages holding subblocks `start..start+len` of slice `si` dirty; returns
    /// how many pages turned dirty.
    fn touch(&mut self, si: usize, start: u64, len: u64) -> u64 {
        let base = self.bitmap_offsets[si];
        let first = (base + (start / 64) as usize * 8) / MAP_PAGE_BYTES;
        let last = (base + ((start + len.max(1) - 1) / 64) as usize * 8 + 7) / MAP_PAGE_BYTES;
        let mut added = 0;
        // Page 0 holds the checksum, which every change alters.
        for p in std::iter::once(0).chain(first..=last) {
            if self.dirty_pages.insert(p as u32) {
                added += 1;
            }
        }
        added
    }

    fn quarantined(&self, si: usize, i: u64) -> bool {
        let q = &self.quarantine[si];
        !q.is_empty() && bit(q, i)
    }

    fn allocatable(&self, si: usize, start: u64, len: u64) -> bool {
        range_free(&self.seg.bitmaps[si], start, len)
            && (self.quarantine[si].is_empty() || range_free(&self.quarantine[si], start, len))
    }
}

impl AllocMap {
    /// Build from segments read from disk (or fresh ones at creation).
    pub fn new(desc: &Descriptor, segments: Vec<AllocSegment>) -> FsResult<AllocMap> {
        let geo = desc.geometry;
        if segments.len() != desc.regions as usize {
            return Err(FsError::integrity(IntegrityError::new(
                STRUCTURE,
                format!(
                    "{} allocation segments for {} regions; run `mako fsck`",
                    segments.len(),
                    desc.regions
                ),
            )));
        }
        let mut total = 0;
        let mut free_total = 0;
        let mut empty_total = 0;
        let mut regions = Vec::new();
        let nregions = segments.len();
        for (r, seg) in segments.into_iter().enumerate() {
            let expect = region_slices(desc, r as u32);
            if seg.slices != expect {
                return Err(FsError::integrity(IntegrityError::new(
                    STRUCTURE,
                    format!(
                        "allocation region {r} covers {:?}, the descriptor says {:?}; run `mako fsck`",
                        seg.slices, expect
                    ),
                )));
            }
            let region = Region::from_segment(seg, geo.subblocks_per_block as u64);
            total += region.seg.slices.iter().map(|s| s.subblocks).sum::<u64>();
            free_total += region.free.iter().sum::<u64>();
            empty_total += region.empty.iter().sum::<u64>();
            regions.push(CountedMutex::new(&ALLOC_REGION_LOCK, region));
        }
        let usable = |d: &&mako_format::descriptor::DiskEntry| d.status == DiskStatus::Ready;
        let data_disks = desc
            .disks
            .iter()
            .filter(usable)
            .filter(|d| d.usage.holds_data())
            .map(|d| d.index)
            .collect();
        let meta_disks = desc
            .disks
            .iter()
            .filter(usable)
            .filter(|d| d.usage.holds_metadata())
            .map(|d| d.index)
            .collect();
        Ok(AllocMap {
            geo,
            layout: desc.layout,
            regions,
            boundaries: (0..desc.disks.len())
                .map(|d| boundaries_for(desc, d))
                .collect(),
            data_disks,
            meta_disks,
            free_subblocks: AtomicU64::new(free_total),
            empty_blocks: AtomicU64::new(empty_total),
            ready_blocks: AtomicU64::new(empty_total),
            reserved_subblocks: AtomicU64::new(0),
            // 1% of the space, at least 16 and at most 1024 full blocks.
            metadata_reserve: AtomicU64::new(reserve_for(total, geo.subblocks_per_block)),
            total_subblocks: total,
            owned: (0..nregions).map(|_| AtomicBool::new(true)).collect(),
            owned_subblocks: AtomicU64::new(total),
            foreign: parking_lot::Mutex::new(Vec::new()),
            foreign_ready: parking_lot::Mutex::new(Vec::new()),
            next_region: AtomicUsize::new(0),
            rotor: AtomicUsize::new(0),
            dirty_pages: AtomicU64::new(0),
            frees: parking_lot::Mutex::new(Vec::new()),
            quarantined_subblocks: AtomicU64::new(0),
            damage: SinkSlot::default(),
            fresh: parking_lot::Mutex::new(Default::default()),
        })
    }

    /// Report integrity failures to the mounted file system's sink.
    pub fn attach_damage(&self, sink: DamageSink) {
        self.damage.attach(sink);
    }

    pub fn fresh_segments(desc: &Descriptor) -> Vec<AllocSegment> {
        (0..desc.regions)
            .map(|r| AllocSegment::new(r, region_slices(desc, r)))
            .collect()
    }

    pub fn total_subblocks(&self) -> u64 {
        self.total_subblocks
    }
    pub fn free_subblocks(&self) -> u64 {
        self.free_subblocks.load(Ordering::Relaxed)
    }
    pub fn reserved_subblocks(&self) -> u64 {
        self.reserved_subblocks.load(Ordering::Relaxed)
    }
    /// Free subblocks nobody has a claim on now (quarantined ones not counted).
    pub fn available_subblocks(&self) -> u64 {
        self.free_subblocks()
            .saturating_sub(self.reserved_subblocks())
    }

    /// Subblocks kept for metadata: data allocations never take them.
    pub fn metadata_reserve(&self) -> u64 {
        self.metadata_reserve.load(Ordering::Relaxed)
    }

    /// Free space as users see it (statfs `f_bfree`, `mako status`): every subblock not
    /// in use and not promised to dirty data. Quarantined subblocks count: an allocation
    /// that needs them checkpoints the log first (`FileSystem`'s retry on ENOSPC).
    pub fn user_free_subblocks(&self) -> u64 {
        (self.free_subblocks() + self.quarantined_subblocks())
            .saturating_sub(self.reserved_subblocks())
    }

    /// Space data can still get (statfs `f_bavail`), in whole blocks: blocks with no
    /// subblock in use (after a checkpoint), less what is promised to dirty data and
    /// the metadata reserve. Free subblocks in blocks partly in use hold fragments of
    /// small files but not one block of a large file, so they are not promised. All of
    /// it can be reserved by one write or fallocate, and the indirect blocks mapping it
    /// come from the metadata reserve.
    pub fn user_available_subblocks(&self) -> u64 {
        self.data_room_blocks() * self.geo.subblocks_per_block as u64
    }

    /// Blocks with no subblock in use (quarantined ones included).
    pub fn empty_blocks(&self) -> u64 {
        self.empty_blocks.load(Ordering::Relaxed)
    }

    /// Empty blocks without quarantined subblocks: what full-block allocations can get
    /// now.
    pub fn ready_blocks(&self) -> u64 {
        self.ready_blocks.load(Ordering::Relaxed)
    }

    fn took_blocks(&self, (empty, ready): (u64, u64)) {
        self.empty_blocks.fetch_sub(empty, Ordering::Relaxed);
        self.ready_blocks.fetch_sub(ready, Ordering::Relaxed);
    }

    fn gave_blocks(&self, (empty, ready): (u64, u64)) {
        self.empty_blocks.fetch_add(empty, Ordering::Relaxed);
        self.ready_blocks.fetch_add(ready, Ordering::Relaxed);
    }

    /// May an allocation of `kind` (holding `held` reserved subblocks) take a whole
    /// empty block? Only while enough ready blocks stay for every other reservation
    /// (a reserved block needs a whole block when write-behind allocates it) and, for
    /// unreserved data, the metadata reserve.
    fn may_take_empty_block(&self, kind: AllocKind, held: u64) -> bool {
        let spb = self.geo.subblocks_per_block as u64;
        let others = self.reserved_subblocks().saturating_sub(held);
        let floor = if kind == AllocKind::Data && held == 0 {
            self.metadata_reserve()
        } else {
            0
        };
        self.ready_blocks() * spb >= others + floor + spb
    }

    /// Empty blocks (after a checkpoint) that are neither promised to dirty data nor
    /// part of the metadata reserve: what one more reservation can get.
    fn data_room_blocks(&self) -> u64 {
        let spb = self.geo.subblocks_per_block as u64;
        self.empty_blocks().saturating_sub(
            self.metadata_reserve().div_ceil(spb) + self.reserved_subblocks().div_ceil(spb),
        )
    }

    /// Subblocks an allocation of `kind` may use, counting `held` of the reservations
    /// as the caller's own.
    ///
    /// Reservations are only made while they leave the metadata floor free, so: data
    /// allocated against its own reservation needs no more than the space not promised
    /// to others; unreserved data must also leave the floor; metadata may use the floor
    /// but never space promised to data.
    fn usable(&self, kind: AllocKind, held: u64) -> u64 {
        let others = self.reserved_subblocks().saturating_sub(held);
        let floor = if kind == AllocKind::Data && held == 0 {
            self.metadata_reserve()
        } else {
            0
        };
        self.free_subblocks()
            .saturating_sub(others)
            .saturating_sub(floor)
    }

    /// Promise `n` subblocks to dirty data; ENOSPC when they are not there. A
    /// reservation is of a whole block, and backed by one: ready empty blocks, less
    /// the metadata reserve, cover every reservation (free subblocks scattered over
    /// blocks partly in use cannot take a block).
    pub fn reserve(&self, n: u32) -> FsResult<()> {
        self.reserve_subblocks(n as u64)
    }

    /// `reserve` of any number of subblocks (a whole fallocate's blocks at once).
    pub fn reserve_subblocks(&self, n: u64) -> FsResult<()> {
        if n == 0 {
            return Ok(());
        }
        let spb = self.geo.subblocks_per_block as u64;
        let mut cur = self.reserved_subblocks.load(Ordering::Relaxed);
        loop {
            let free = self
                .free_subblocks()
                .saturating_sub(self.metadata_reserve());
            let blocks = (self.ready_blocks() * spb).saturating_sub(self.metadata_reserve());
            if free < cur + n || blocks < cur + n {
                return Err(FsError::NoSpace(format!(
                    "{} subblocks free, {} promised to data not yet written, {} kept for metadata",
                    self.free_subblocks(),
                    cur,
                    self.metadata_reserve()
                )));
            }
            match self.reserved_subblocks.compare_exchange_weak(
                cur,
                cur + n,
                Ordering::AcqRel,
                Ordering::Relaxed,
            ) {
                Ok(_) => return Ok(()),
                Err(now) => cur = now,
            }
        }
    }

    /// Give back a reservation that will not be used (truncate, delete).
    pub fn unreserve(&self, n: u64) {
        let prev = self.reserved_subblocks.fetch_sub(n, Ordering::AcqRel);
        assert!(prev >= n, "unreserving {n} subblocks, only {prev} reserved");
    }
    pub fn region_count(&self) -> usize {
        self.regions.len()
    }
    /// Free (quarantined included, as `user_free_subblocks`) and total subblocks per
    /// disk (`mako disk show`).
    pub fn per_disk_usage(&self, disks: usize) -> Vec<(u64, u64)> {
        let mut out = vec![(0u64, 0u64); disks];
        for r in &self.regions {
            let r = r.lock();
            for (i, s) in r.seg.slices.iter().enumerate() {
                out[s.disk as usize].0 += r.free[i] + r.quarantined[i];
                out[s.disk as usize].1 += s.subblocks;
            }
        }
        out
    }

    fn pick_disk(&self, kind: AllocKind, ino: u64, unit: u64, attempt: usize) -> FsResult<u32> {
        let disks = match kind {
            AllocKind::Data => &self.data_disks,
            AllocKind::Metadata => &self.meta_disks,
        };
        if disks.is_empty() {
            return Err(FsError::NoSpace(format!("no ready disk may hold {kind:?}")));
        }
        let n = disks.len() as u64;
        let slot = match self.layout {
            // Cluster: consecutive blocks of a file go round-robin over the disks.
            LayoutMap::Cluster => ino.wrapping_add(unit),
            // Scatter: a pseudo-random disk per block, but a round of `n` consecutive
            // blocks still visits every disk once (a permutation per round), so a
            // large file streams from all disks at once.
            LayoutMap::Scatter => {
                let round = unit / n;
                let mix = splitmix(ino ^ round.wrapping_mul(0x9e37_79b9));
                (unit % n).wrapping_add(mix)
            }
        };
        Ok(disks[((slot + attempt as u64) % n) as usize])
    }

    /// Allocate `subblocks` contiguous subblocks (a full block when equal to the
    /// subblocks per block) for unit `unit` of inode `ino`.
    pub fn allocate(
        &self,
        kind: AllocKind,
        subblocks: u32,
        ino: u64,
        unit: u64,
    ) -> FsResult<DiskAddress> {
        self.allocate_reserved(kind, subblocks, ino, unit, 0)
    }

    /// Allocate, consuming `held` subblocks the caller reserved earlier (released
    /// whether or not the allocation needs all of them).
    pub fn allocate_reserved(
        &self,
        kind: AllocKind,
        subblocks: u32,
        ino: u64,
        unit: u64,
        held: u32,
    ) -> FsResult<DiskAddress> {
        let may_take_block = self.may_take_empty_block(kind, held as u64);
        if self.usable(kind, held as u64) < subblocks as u64
            || (subblocks == self.geo.subblocks_per_block && !may_take_block)
        {
            return Err(FsError::NoSpace(format!(
                "{subblocks} subblocks wanted, {} free ({} empty blocks) of which {} are promised to unwritten data",
                self.free_subblocks(),
                self.ready_blocks(),
                self.reserved_subblocks()
            )));
        }
        let da = self.allocate_any(kind, subblocks, ino, unit, may_take_block)?;
        if held > 0 {
            self.unreserve(held as u64);
        }
        self.fresh.lock().insert(da, subblocks);
        Ok(da)
    }

    /// Grow the allocation of `cur` subblocks at `da` to `new` subblocks in place, when
    /// the subblocks after it in its block are free (and not quarantined). False when
    /// they are not (the caller reallocates); ENOSPC when the space is not there.
    ///
    /// A fragment that grows (appends to a file's last block) then keeps its address:
    /// no copy, and nothing freed to wait for a checkpoint. `held` reserved subblocks
    /// are the caller's, given back when it succeeds.
    pub fn extend(
        &self,
        kind: AllocKind,
        da: DiskAddress,
        cur: u32,
        new: u32,
        held: u32,
    ) -> FsResult<bool> {
        if cur == 0 || new <= cur {
            return Err(FsError::Invalid(format!(
                "extending {cur} subblocks at {da} to {new}"
            )));
        }
        let spb = self.geo.subblocks_per_block as u64;
        let (region, si, off) = self.locate(da, cur).map_err(|what| {
            self.damage
                .integrity(IntegrityError::new(STRUCTURE, what).at(da))
        })?;
        if !self.owned[region].load(Ordering::Acquire) {
            // Another node's region: the fragment moves to this node's space.
            return Ok(false);
        }
        let subblock = self.regions[region].lock().seg.slices[si].first_subblock + off;
        if subblock % spb + new as u64 > spb {
            return Ok(false);
        }
        let want = (new - cur) as u64;
        if self.usable(kind, held as u64) < want {
            return Err(FsError::NoSpace(format!(
                "{want} subblocks wanted, {} free of which {} are promised to unwritten data",
                self.free_subblocks(),
                self.reserved_subblocks()
            )));
        }
        let mut r = self.regions[region].lock();
        if r.leaving || !self.owned[region].load(Ordering::Acquire) {
            return Ok(false);
        }
        let bm = &r.seg.bitmaps[si];
        if !(off..off + cur as u64).all(|i| bit(bm, i)) {
            return Err(self.damage.integrity(
                IntegrityError::new(
                    STRUCTURE,
                    format!("extending {cur} subblocks: they are not all in use"),
                )
                .at(da),
            ));
        }
        if !r.allocatable(si, off + cur as u64, want) {
            return Ok(false);
        }
        crate::journal::note_change();
        let gone = r.set_bits(si, off + cur as u64, want);
        r.free[si] -= want;
        self.took_blocks(gone);
        let pages = r.touch(si, off + cur as u64, want);
        drop(r);
        self.dirty_pages.fetch_add(pages, Ordering::Relaxed);
        self.free_subblocks.fetch_sub(want, Ordering::Relaxed);
        if held > 0 {
            self.unreserve(held as u64);
        }
        let mut fresh = self.fresh.lock();
        match fresh.get_mut(&da) {
            // Allocated by the running transaction: all of it stays reusable at once.
            Some(n) if *n == cur => *n = new,
            // Otherwise a free of the whole goes to quarantine (the old part is
            // committed); the added part is not recorded on its own.
            _ => {
                fresh.remove(&da);
            }
        }
        Ok(true)
    }

    fn allocate_any(
        &self,
        kind: AllocKind,
        subblocks: u32,
        ino: u64,
        unit: u64,
        may_take_block: bool,
    ) -> FsResult<DiskAddress> {
        let spb = self.geo.subblocks_per_block;
        if subblocks < 1 || subblocks > spb {
            return Err(self.damage.integrity(
                IntegrityError::new(
                    STRUCTURE,
                    format!(
                        "an allocation of {subblocks} subblocks was asked for (1..{spb} can be)"
                    ),
                )
                .ino(ino),
            ));
        }
        let ndisks = match kind {
            AllocKind::Data => self.data_disks.len(),
            AllocKind::Metadata => self.meta_disks.len(),
        }
        .max(1);
        let nregions = self.regions.len();
        // Data starts in the file's home region and takes the next free block after the
        // region's cursor, so a file's blocks on each disk lie one after another (a
        // streaming read is then sequential on every disk) and two files written at once
        // rarely share a region (no interleaving, no lock contention). Metadata blocks go
        // round the regions.
        let start_region = match kind {
            AllocKind::Data => (splitmix(ino) % nregions as u64) as usize,
            AllocKind::Metadata => self.next_region.fetch_add(1, Ordering::Relaxed) % nregions,
        };
        for attempt in 0..ndisks {
            let disk = self.pick_disk(kind, ino, unit, attempt)?;
            for k in 0..nregions {
                let r = (start_region + k) % nregions;
                if let Some(da) = self.allocate_in(r, disk, subblocks, may_take_block) {
                    return Ok(da);
                }
            }
        }
        Err(FsError::NoSpace(format!(
            "no {subblocks} free subblocks on any {} disk ({} of {} subblocks free)",
            if kind == AllocKind::Data {
                "data"
            } else {
                "metadata"
            },
            self.free_subblocks(),
            self.total_subblocks
        )))
    }

    /// `may_take_block`: a fragment may go to an empty block (else only to blocks
    /// partly in use; see `may_take_empty_block`).
    fn allocate_in(
        &self,
        region: usize,
        disk: u32,
        subblocks: u32,
        may_take_block: bool,
    ) -> Option<DiskAddress> {
        if !self.owned[region].load(Ordering::Acquire) {
            return None;
        }
        let spb = self.geo.subblocks_per_block as u64;
        let mut r = self.regions[region].lock();
        // Under the region's lock, where `own`, `stop_allocating` and `disown` change
        // them: a region that left since the check above is not allocated in.
        if r.leaving || !self.owned[region].load(Ordering::Acquire) {
            return None;
        }
        let si = r.seg.slices.iter().position(|s| s.disk == disk)?;
        if r.free[si] < subblocks as u64 {
            return None;
        }
        let slice = r.seg.slices[si];
        let nblocks = slice.subblocks / spb;
        let start = r.cursor[si] % nblocks.max(1);
        let want = subblocks as u64;
        let mut found = None;
        for k in 0..nblocks {
            let b = (start + k) % nblocks;
            let base = b * spb;
            let bm = &r.seg.bitmaps[si];
            if want == spb {
                if r.allocatable(si, base, spb) {
                    found = Some(base);
                    break;
                }
            } else {
                // A fragment: first run of `want` free subblocks inside this block.
                if !may_take_block && r.block_ready(si, b) {
                    continue;
                }
                let mut run = 0;
                for i in 0..spb {
                    if bit(bm, base + i) || r.quarantined(si, base + i) {
                        run = 0;
                    } else {
                        run += 1;
                        if run == want {
                            found = Some(base + i + 1 - want);
                            break;
                        }
                    }
                }
                if found.is_some() {
                    break;
                }
            }
        }
        let at = found?;
        crate::journal::note_change();
        let gone = r.set_bits(si, at, want);
        r.free[si] -= want;
        self.took_blocks(gone);
        r.cursor[si] = at / spb;
        let pages = r.touch(si, at, want);
        self.dirty_pages.fetch_add(pages, Ordering::Relaxed);
        self.free_subblocks.fetch_sub(want, Ordering::Relaxed);
        let subblock = slice.first_subblock + at;
        Some(DiskAddress::new(
            disk,
            subblock * self.geo.sectors_per_subblock(),
        ))
    }

    /// Where `subblocks` subblocks at `da` lie: (region, slice index, offset in the
    /// slice). An address taken from disk is checked, never trusted: it must name a
    /// disk, be subblock-aligned and lie, whole, in one region's slice of that disk.
    fn locate(&self, da: DiskAddress, subblocks: u32) -> Result<(usize, usize, u64), String> {
        let spb = self.geo.subblocks_per_block as u64;
        let sps = self.geo.sectors_per_subblock();
        let Some(b) = self.boundaries.get(da.disk() as usize) else {
            return Err(format!(
                "disk address {da} names disk {}, the file system has {}",
                da.disk(),
                self.boundaries.len()
            ));
        };
        if !da.sector().is_multiple_of(sps) {
            return Err(format!("disk address {da} is not subblock aligned"));
        }
        let subblock = da.sector() / sps;
        let block = subblock / spb;
        let region = b.partition_point(|&x| x <= block);
        if region == 0 || region > self.regions.len() {
            return Err(format!(
                "disk address {da} is outside the allocatable area of disk {}",
                da.disk()
            ));
        }
        let region = region - 1;
        let (lo, hi) = (b[region] * spb, b[region + 1] * spb);
        if subblock + subblocks as u64 > hi {
            return Err(format!(
                "{subblocks} subblocks at {da} run past the end of allocation region {region}"
            ));
        }
        // Slices are in disk order in every region (checked in `new`).
        Ok((region, da.disk() as usize, subblock - lo))
    }

    /// Check that `subblocks` subblocks at `da` (read from disk) lie inside one
    /// allocation region of a disk; the reason if not.
    pub fn check_extent(&self, da: DiskAddress, subblocks: u32) -> Result<(), String> {
        self.locate(da, subblocks).map(|_| ())
    }

    /// `locate`, with a failure reported as an integrity failure of inode `ino`.
    fn locate_or_report(
        &self,
        da: DiskAddress,
        subblocks: u32,
        ino: u64,
        doing: &str,
    ) -> FsResult<(usize, usize, u64)> {
        self.locate(da, subblocks).map_err(|why| {
            self.damage.integrity(
                IntegrityError::new(STRUCTURE, format!("{doing}: {why}"))
                    .ino(ino)
                    .at(da),
            )
        })
    }

    /// Return subblocks of inode `ino` to the free pool: clear in the map at once (the
    /// next commit logs them free), reusable once that commit is checkpointed
    /// (`release_frees`). Freeing a free subblock, or an address outside the map, is
    /// an integrity failure (the map or the pointer is damaged, or Mako has a bug):
    /// refused before anything changes, reported, and the mount turns read-only.
    pub fn free(&self, da: DiskAddress, subblocks: u32, ino: u64) -> FsResult<()> {
        let doing = format!("freeing {subblocks} subblocks");
        let (region, si, off) = self.locate_or_report(da, subblocks, ino, &doing)?;
        let mut r = self.regions[region].lock();
        if !self.owned[region].load(Ordering::Acquire) || r.leaving {
            // The owner frees it, once the transaction that freed it here is
            // checkpointed (so this node's log can never write over it again). A region
            // whose token is leaving counts as another node's already: its map is
            // about to be written in place as committed, and a change made here now
            // would be lost with it; its next owner frees it.
            drop(r);
            crate::journal::note_change();
            self.fresh.lock().remove(&da);
            self.foreign.lock().push((UNCOMMITTED, da, subblocks));
            return Ok(());
        }
        let n = subblocks as u64;
        let bm = &r.seg.bitmaps[si];
        if let Some(i) = (off..off + n).find(|&i| !bit(bm, i)) {
            drop(r);
            return Err(self.damage.integrity(
                IntegrityError::new(
                    STRUCTURE,
                    format!(
                        "{doing}: subblock {} of them is already free (a double free)",
                        i - off
                    ),
                )
                .ino(ino)
                .at(da),
            ));
        }
        crate::journal::note_change();
        set_range(&mut r.seg.bitmaps[si], off, n, false);
        let pages = r.touch(si, off, n);
        self.dirty_pages.fetch_add(pages, Ordering::Relaxed);
        let fresh = {
            let mut f = self.fresh.lock();
            match f.get(&da) {
                Some(&m) if m == subblocks => {
                    f.remove(&da);
                    true
                }
                Some(_) => {
                    // Part of a fresh allocation: the rest is still in use and no
                    // longer tracked; quarantine is always safe.
                    f.remove(&da);
                    false
                }
                None => false,
            }
        };
        if fresh {
            // Allocated and freed by the running transaction: nothing durable or logged
            // names it, so it is free at once.
            r.free[si] += n;
            let freed = r.count_freed(si, off, n);
            drop(r);
            self.gave_blocks(freed);
            self.free_subblocks.fetch_add(n, Ordering::Relaxed);
            return Ok(());
        }
        if r.quarantine[si].is_empty() {
            let words = r.seg.bitmaps[si].len();
            r.quarantine[si] = vec![0u64; words];
        }
        set_range(&mut r.quarantine[si], off, n, true);
        r.quarantined[si] += n;
        let freed = r.count_freed(si, off, n);
        drop(r);
        self.gave_blocks(freed);
        self.quarantined_subblocks.fetch_add(n, Ordering::Relaxed);
        self.frees.lock().push((UNCOMMITTED, da, subblocks));
        Ok(())
    }

    /// The running transaction becomes transaction `seq` (called by the commit's
    /// snapshot, with no operation in flight): its frees are tagged with `seq`, and its
    /// allocations are from now on named by a transaction that will be durable, so
    /// space they give back waits for a checkpoint like any other.
    pub fn end_transaction(&self, seq: u64) {
        for f in self.frees.lock().iter_mut() {
            if f.0 == UNCOMMITTED {
                f.0 = seq;
            }
        }
        for f in self.foreign.lock().iter_mut() {
            if f.0 == UNCOMMITTED {
                f.0 = seq;
            }
        }
        self.fresh.lock().clear();
    }

    /// Make space freed by transactions up to `seq` (now checkpointed) allocatable.
    pub fn release_frees(&self, seq: u64) {
        {
            let mut f = self.foreign.lock();
            if !f.is_empty() {
                let (done, keep): (Vec<_>, Vec<_>) = f.drain(..).partition(|(s, _, _)| *s <= seq);
                *f = keep;
                self.foreign_ready
                    .lock()
                    .extend(done.into_iter().map(|(_, da, n)| (da, n)));
            }
        }
        let done: Vec<(u64, DiskAddress, u32)> = {
            let mut f = self.frees.lock();
            let (done, keep): (Vec<_>, Vec<_>) = f.drain(..).partition(|(s, _, _)| *s <= seq);
            *f = keep;
            done
        };
        for (_, da, subblocks) in done {
            // `free` located every address it queued.
            let Ok((region, si, off)) = self.locate(da, subblocks) else {
                continue;
            };
            let mut r = self.regions[region].lock();
            let n = subblocks as u64;
            set_range(&mut r.quarantine[si], off, n, false);
            r.quarantined[si] -= n;
            r.free[si] += n;
            // Blocks that are empty and now free of quarantine too become ready (they
            // were counted empty when freed).
            let mut ready = 0;
            for k in r.blocks_of(off, n) {
                ready += u64::from(r.block_ready(si, k));
            }
            r.ready[si] += ready;
            self.ready_blocks.fetch_add(ready, Ordering::Relaxed);
            self.free_subblocks.fetch_add(n, Ordering::Relaxed);
            self.quarantined_subblocks.fetch_sub(n, Ordering::Relaxed);
        }
    }

    /// Subblocks freed but not reusable until the next checkpoint.
    pub fn quarantined_subblocks(&self) -> u64 {
        self.quarantined_subblocks.load(Ordering::Relaxed)
    }

    /// Mark subblocks in use (file system creation; fsck repair).
    pub fn mark_used(&self, da: DiskAddress, subblocks: u32) -> FsResult<()> {
        let doing = format!("marking {subblocks} subblocks in use");
        let (region, si, off) = self.locate_or_report(da, subblocks, 0, &doing)?;
        let mut r = self.regions[region].lock();
        let n = subblocks as u64;
        if !range_free(&r.seg.bitmaps[si], off, n) {
            drop(r);
            return Err(self.damage.integrity(
                IntegrityError::new(STRUCTURE, format!("{doing}: some are in use already")).at(da),
            ));
        }
        let gone = r.set_bits(si, off, n);
        self.took_blocks(gone);
        r.free[si] -= n;
        let pages = r.touch(si, off, n);
        self.dirty_pages.fetch_add(pages, Ordering::Relaxed);
        self.free_subblocks.fetch_sub(n, Ordering::Relaxed);
        Ok(())
    }

    /// Whether every one of `subblocks` subblocks at `da` is in use; `Err` with the
    /// reason if they do not lie inside the map (a question, not a report: the caller
    /// decides whether that is damage).
    pub fn is_used(&self, da: DiskAddress, subblocks: u32) -> Result<bool, String> {
        let (region, si, off) = self.locate(da, subblocks)?;
        let r = self.regions[region].lock();
        Ok((off..off + subblocks as u64).all(|i| bit(&r.seg.bitmaps[si], i)))
    }

    /// The changed pages of every region's encoded segment, for the log: (region,
    /// [(offset in the segment slot, page bytes)]). Clears the dirty marks.
    pub fn take_dirty_pages(&self, slot_bytes: usize) -> Vec<(u32, Vec<DirtyPage>)> {
        let mut out = Vec::new();
        for (i, r) in self.regions.iter().enumerate() {
            let mut r = r.lock();
            if r.dirty_pages.is_empty() {
                continue;
            }
            let bytes = r.seg.encode(slot_bytes);
            let pages = std::mem::take(&mut r.dirty_pages);
            self.dirty_pages
                .fetch_sub(pages.len() as u64, Ordering::Relaxed);
            let v = pages
                .into_iter()
                .map(|p| p as usize * MAP_PAGE_BYTES)
                .filter(|&lo| lo < bytes.len())
                .map(|lo| {
                    (
                        lo as u64,
                        bytes[lo..(lo + MAP_PAGE_BYTES).min(bytes.len())].to_vec(),
                    )
                })
                .collect();
            out.push((i as u32, v));
        }
        out
    }

    /// Bytes of map pages the next commit will log (an upper bound).
    pub fn dirty_page_bytes(&self) -> u64 {
        self.dirty_pages.load(Ordering::Relaxed) * MAP_PAGE_BYTES as u64
    }

    /// Mark a region's whole segment for logging (file system creation writes them all).
    pub fn mark_region_dirty(&self, region: u32) {
        let mut r = self.regions[region as usize].lock();
        let pages = (AllocSegment::encoded_len(&r.seg.slices)).div_ceil(MAP_PAGE_BYTES) as u32;
        let mut added = 0;
        for p in 0..pages {
            if r.dirty_pages.insert(p) {
                added += 1;
            }
        }
        self.dirty_pages.fetch_add(added, Ordering::Relaxed);
    }

    /// Does this node allocate in `region`?
    pub fn is_owned(&self, region: usize) -> bool {
        self.owned
            .get(region)
            .is_some_and(|o| o.load(Ordering::Acquire))
    }

    /// The region `da` lies in (`None` outside every region).
    pub fn region_of(&self, da: DiskAddress) -> Option<usize> {
        self.locate(da, 1).ok().map(|(r, _, _)| r)
    }

    /// Stop allocating in `region`: its space leaves this node's counters. Called for
    /// the regions a node of a cluster does not own when it mounts (before anything is
    /// allocated), and when a region's token leaves after its map was written in place.
    pub fn disown(&self, region: usize) {
        // Under the region's lock: an allocation that holds it sees the region owned
        // or not, never half disowned.
        let mut r = self.regions[region].lock();
        if !self.owned[region].swap(false, Ordering::AcqRel) {
            return;
        }
        let free: u64 = r.free.iter().sum();
        let empty: u64 = r.empty.iter().sum();
        let ready: u64 = r.ready.iter().sum();
        let quarantined: u64 = r.quarantined.iter().sum();
        let pages = std::mem::take(&mut r.dirty_pages).len() as u64;
        let total: u64 = r.seg.slices.iter().map(|s| s.subblocks).sum();
        self.free_subblocks.fetch_sub(free, Ordering::Relaxed);
        self.took_blocks((empty, ready));
        self.quarantined_subblocks
            .fetch_sub(quarantined, Ordering::Relaxed);
        self.dirty_pages.fetch_sub(pages, Ordering::Relaxed);
        let owned = self.owned_subblocks.fetch_sub(total, Ordering::Relaxed) - total;
        self.metadata_reserve.store(
            reserve_for(owned, self.geo.subblocks_per_block),
            Ordering::Relaxed,
        );
        drop(r);
        self.frees
            .lock()
            .retain(|(_, da, n)| self.locate(*da, *n).map(|(g, _, _)| g) != Ok(region));
    }

    /// The region's token is about to leave: from now on nothing is allocated in it
    /// (an allocation that already took its region lock is done, and its operation
    /// is in flight: the revoke's commit waits for it), and frees in it are queued for
    /// its next owner (`free`). `disown` ends this once the map is written in place.
    pub fn stop_allocating(&self, region: usize) {
        if let Some(r) = self.regions.get(region) {
            let mut r = r.lock();
            r.leaving = true;
            r.revokes += 1;
        }
    }

    /// How many times `region`'s token began to leave this node (see `own_since`).
    pub fn revokes(&self, region: usize) -> u64 {
        self.regions[region].lock().revokes
    }

    /// Subblocks of `region` freed and not reusable until a checkpoint.
    pub fn region_quarantined(&self, region: usize) -> u64 {
        self.regions[region].lock().quarantined.iter().sum()
    }

    /// Free subblocks (quarantined ones included) and all subblocks of `region`, as
    /// this node knows it: exact for a region it owns, as last read for another
    /// node's (a hint of where space may be).
    pub fn region_space(&self, region: usize) -> (u64, u64) {
        let r = self.regions[region].lock();
        (
            r.free.iter().sum::<u64>() + r.quarantined.iter().sum::<u64>(),
            r.seg.slices.iter().map(|s| s.subblocks).sum(),
        )
    }

    /// Start allocating in `region`, from `seg` as read from disk (its last owner wrote
    /// it in place before its token left).
    pub fn own(&self, region: usize, seg: AllocSegment) -> FsResult<()> {
        self.own_since(region, seg, None).map(|_| ())
    }

    /// `own`, unless the region's token began to leave this node again since
    /// `revokes(region)` said `seen` (read before the token was asked for): a token
    /// granted and revoked before its map was read and used (`revoke_region` then found
    /// nothing owned to stop) must not be used with that map. False then.
    pub fn own_since(&self, region: usize, seg: AllocSegment, seen: Option<u64>) -> FsResult<bool> {
        let mut r = self.regions[region].lock();
        if self.owned[region].load(Ordering::Acquire) {
            return Ok(true);
        }
        if seen.is_some_and(|s| s != r.revokes) {
            return Ok(false);
        }
        if seg.slices != r.seg.slices {
            drop(r);
            return Err(self.damage.integrity(IntegrityError::new(
                STRUCTURE,
                format!("allocation region {region} read from disk covers other slices"),
            )));
        }
        let revokes = r.revokes;
        *r = Region::from_segment(seg, self.geo.subblocks_per_block as u64);
        r.revokes = revokes;
        let free: u64 = r.free.iter().sum();
        let empty: u64 = r.empty.iter().sum();
        let total: u64 = r.seg.slices.iter().map(|s| s.subblocks).sum();
        self.free_subblocks.fetch_add(free, Ordering::Relaxed);
        self.gave_blocks((empty, empty));
        let owned = self.owned_subblocks.fetch_add(total, Ordering::Relaxed) + total;
        self.metadata_reserve.store(
            reserve_for(owned, self.geo.subblocks_per_block),
            Ordering::Relaxed,
        );
        self.owned[region].store(true, Ordering::Release);
        Ok(true)
    }

    /// Free and empty-block space (in subblocks) of the regions this node does not
    /// own, as last read: the rest of the file system for statfs.
    pub fn unowned_space(&self) -> (u64, u64) {
        let spb = self.geo.subblocks_per_block as u64;
        let (mut free, mut empty) = (0, 0);
        for (i, r) in self.regions.iter().enumerate() {
            if self.owned[i].load(Ordering::Acquire) {
                continue;
            }
            let r = r.lock();
            free += r.free.iter().sum::<u64>();
            empty += r.empty.iter().sum::<u64>() * spb;
        }
        (free, empty)
    }

    /// Frees in other nodes' regions whose transactions are checkpointed: to be sent
    /// to the regions' owners.
    pub fn take_foreign_frees(&self) -> Vec<(DiskAddress, u32)> {
        std::mem::take(&mut *self.foreign_ready.lock())
    }

    /// Put back frees that could not be delivered (tried again later).
    pub fn return_foreign_frees(&self, frees: Vec<(DiskAddress, u32)>) {
        self.foreign_ready.lock().extend(frees);
    }

    /// Spread allocation start points (used by threads that allocate a lot).
    pub fn rotate(&self) -> usize {
        self.rotor.fetch_add(1, Ordering::Relaxed)
    }
}

/// The metadata reserve of `subblocks` of owned space: 1% of it, at least 16 and at
/// most 1024 full blocks, never more than a quarter.
fn reserve_for(subblocks: u64, spb: u32) -> u64 {
    (subblocks / 100)
        .clamp(16 * spb as u64, 1024 * spb as u64)
        .min(subblocks / 4)
}

fn splitmix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_util::test_descriptor;
    use std::collections::HashSet;

    #[test]
    fn never_double_allocates_and_frees_balance() {
        let desc = test_descriptor(4, 64 << 20, 1 << 20);
        let map = AllocMap::new(&desc, AllocMap::fresh_segments(&desc)).unwrap();
        let spb = desc.geometry.subblocks_per_block;
        let total = map.free_subblocks();
        let mut seen = HashSet::new();
        let mut allocs = Vec::new();
        let mut disks = HashSet::new();
        for i in 0..40u64 {
            let n = if i % 3 == 0 { spb } else { (i % 7 + 1) as u32 };
            let da = map.allocate(AllocKind::Data, n, 99, i).unwrap();
            disks.insert(da.disk());
            let sps = desc.geometry.sectors_per_subblock();
            for k in 0..n as u64 {
                assert!(
                    seen.insert((da.disk(), da.sector() + k * sps)),
                    "subblock handed out twice"
                );
            }
            if n == spb {
                assert_eq!(
                    da.sector() % desc.geometry.sectors_per_block(),
                    0,
                    "full block not aligned"
                );
            } else {
                let first = da.sector() / desc.geometry.sectors_per_block();
                let last = (da.sector() + (n as u64 - 1) * sps) / desc.geometry.sectors_per_block();
                assert_eq!(first, last, "fragment crosses a block boundary");
            }
            allocs.push((da, n));
        }
        assert_eq!(disks.len(), 4, "a file's blocks stripe over every disk");
        // The allocations are committed: what is freed from now on names them.
        map.end_transaction(0);
        for (da, n) in &allocs {
            map.free(*da, *n, 99).unwrap();
        }
        // Freed space is quarantined until its transaction is checkpointed.
        assert_eq!(map.free_subblocks() + map.quarantined_subblocks(), total);
        let again = map.allocate(AllocKind::Data, spb, 99, 1000).unwrap();
        assert!(
            !allocs.iter().any(|(da, _)| *da == again),
            "quarantined space handed out again"
        );
        map.end_transaction(1);
        map.free(again, spb, 99).unwrap();
        map.end_transaction(1);
        map.release_frees(1);
        assert_eq!(map.free_subblocks(), total);
        assert_eq!(map.quarantined_subblocks(), 0);
        assert!(
            map.free(allocs[0].0, allocs[0].1, 99).is_err(),
            "double free refused"
        );
    }

    #[test]
    fn two_files_written_at_once_each_get_consecutive_blocks_per_disk() {
        let desc = test_descriptor(4, 256 << 20, 1 << 20);
        let map = AllocMap::new(&desc, AllocMap::fresh_segments(&desc)).unwrap();
        assert!(map.region_count() > 1, "the test needs several regions");
        let spb = desc.geometry.subblocks_per_block;
        let spbk = desc.geometry.sectors_per_block();
        // Two inodes whose home regions differ.
        let home = |ino: u64| splitmix(ino) % map.region_count() as u64;
        let a = 100u64;
        let b = (101..).find(|&i| home(i) != home(a)).unwrap();
        let mut by_file_disk: std::collections::BTreeMap<(u64, u32), Vec<u64>> = Default::default();
        for unit in 0..16u64 {
            for ino in [a, b] {
                let da = map.allocate(AllocKind::Data, spb, ino, unit).unwrap();
                by_file_disk
                    .entry((ino, da.disk()))
                    .or_default()
                    .push(da.sector() / spbk);
            }
        }
        assert_eq!(by_file_disk.len(), 8, "each file stripes over all 4 disks");
        for ((ino, disk), blocks) in by_file_disk {
            assert!(
                blocks.windows(2).all(|w| w[1] == w[0] + 1),
                "inode {ino} on disk {disk}: blocks {blocks:?} are not one after another"
            );
        }
    }

    #[test]
    fn space_of_the_running_transaction_is_reusable_at_once_and_fragments_grow_in_place() {
        let desc = test_descriptor(1, 64 << 20, 1 << 20);
        let map = AllocMap::new(&desc, AllocMap::fresh_segments(&desc)).unwrap();
        let total = map.free_subblocks();
        // Allocated and freed before a commit snapshot: free at once, no quarantine.
        let a = map.allocate(AllocKind::Data, 3, 5, 0).unwrap();
        map.free(a, 3, 5).unwrap();
        assert_eq!(map.quarantined_subblocks(), 0);
        assert_eq!(map.free_subblocks(), total);
        // A fragment grows in place while the subblocks after it are free.
        let f = map.allocate(AllocKind::Data, 2, 5, 0).unwrap();
        assert!(map.extend(AllocKind::Data, f, 2, 7, 0).unwrap());
        assert!(map.is_used(f, 7).unwrap());
        assert_eq!(map.free_subblocks(), total - 7);
        // Still the running transaction's: its free is immediate, whole.
        map.free(f, 7, 5).unwrap();
        assert_eq!(map.free_subblocks(), total);
        // Committed allocations are quarantined when freed, extended or not.
        let g = map.allocate(AllocKind::Data, 2, 5, 0).unwrap();
        map.end_transaction(1);
        assert!(map.extend(AllocKind::Data, g, 2, 4, 0).unwrap());
        // The next fragment lands right after it: g cannot grow any more.
        let next = map.allocate(AllocKind::Data, 1, 5, 1).unwrap();
        assert_eq!(
            next.sector(),
            g.sector() + 4 * desc.geometry.sectors_per_subblock()
        );
        assert!(!map.extend(AllocKind::Data, g, 4, 5, 0).unwrap());
        map.free(g, 4, 5).unwrap();
        assert_eq!(map.quarantined_subblocks(), 4);
        assert_eq!(
            map.user_free_subblocks(),
            total - 1,
            "quarantined space counts as free for users"
        );
        map.end_transaction(2);
        map.release_frees(2);
        assert_eq!(map.quarantined_subblocks(), 0);
        assert_eq!(map.free_subblocks(), total - 1);
    }

    #[test]
    fn full_disk_reports_enospc() {
        let desc = test_descriptor(1, 8 << 20, 1 << 20);
        let map = AllocMap::new(&desc, AllocMap::fresh_segments(&desc)).unwrap();
        let spb = desc.geometry.subblocks_per_block;
        let mut n = 0;
        while map.allocate(AllocKind::Data, spb, 1, n).is_ok() {
            n += 1;
        }
        let e = map.allocate(AllocKind::Data, spb, 1, n).unwrap_err();
        assert_eq!(e.errno(), libc::ENOSPC);
        assert!(n > 0);
    }
}
