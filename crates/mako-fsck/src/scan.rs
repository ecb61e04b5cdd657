//! The third phase, the long one: every inode slot of the inode file, in parallel
//! over inode ranges. Each worker takes the next chunk of the inode file (one read of
//! up to `CHUNK_BYTES_MAX`, never one I/O per inode), decodes every slot, checks its
//! fields, walks its indirect tree, checks its directory structure, and claims its
//! subblocks in the shared `Ownership` bitmap (a claim of a claimed subblock is a
//! cross-link, resolved after the scan). What later phases need is kept per inode in
//! a compact `InodeRec`; the full inode is read again only for inodes fsck rewrites.

use crate::directory_check::{self, DirScan};
use crate::error::FsckError;
use crate::layout::{dtype, is_dir, is_reg, kind_name, valid_kind, Layout, S_IFMT, TREE_DEPTH_MAX};
use crate::metafiles::Metafiles;
use crate::problem::{describe, Problem, ProblemKind};
use crate::progress::{Phase, Progress, TICK_MS};
use crate::reader::MetadataReader;
use crate::space::Ownership;
use crate::tree::{probe_depth, walk, LostPointer, UnitRule, Walk};
use crate::xattr_check::{self, XattrDamage};
use mako_disk::BufferType;
use mako_format::error::Location;
use mako_format::inode::{Inode, InodeContent, FLAG_SYSTEM};
use mako_format::DiskAddress;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Duration;

/// Largest read of the inode file (256 inodes of 4 KiB).
pub const CHUNK_BYTES_MAX: u64 = 1 << 20;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SlotState {
    /// In use, with links.
    Live,
    /// Marked in use, no links: open and unlinked when the file system stopped.
    Unlinked,
    /// Does not decode, or cannot be a file: cleared by a repair.
    Bad,
}

/// A piece of a file's tree, or of its extended attributes outside the inode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Piece {
    Unit(u64),
    Indirect(u8, u64),
    /// The xattr index block.
    XattrIndex,
    /// An xattr block, by its place in the index.
    XattrBlock(u32),
}

impl Piece {
    /// Part of the attributes outside the inode (rebuilt, never edited in place).
    pub fn is_xattr(self) -> bool {
        matches!(self, Piece::XattrIndex | Piece::XattrBlock(_))
    }
    /// What it is, for messages.
    pub fn name(self) -> String {
        match self {
            Piece::Unit(u) => format!("unit {u}"),
            Piece::Indirect(level, index) => format!("level-{level} indirect block {index}"),
            Piece::XattrIndex => "xattr index block".into(),
            Piece::XattrBlock(k) => format!("xattr block {k}"),
        }
    }
}

#[derive(Debug, Clone, Copy)]
pub struct Extent {
    pub da: DiskAddress,
    pub subblocks: u32,
    pub piece: Piece,
}

/// A field correction, applied when the inode is rewritten.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fix {
    Size(u64),
    Subblocks(u64),
    LastBlockSubblocks(u16),
    Entries(u64),
    Depth(u8),
    ClearSystemFlag,
    /// A device, fifo or socket holding data: it becomes empty.
    EmptySpecial,
}

/// What the scan found beyond the common fields (boxed: most inodes need none).
#[derive(Debug, Default)]
pub struct Extra {
    pub lost: Vec<LostPointer>,
    pub fixes: Vec<Fix>,
    pub dir: Option<DirScan>,
    /// The attributes outside the inode must be rebuilt.
    pub xattr: Option<XattrDamage>,
    /// Why a `Bad` inode is bad.
    pub bad: Option<String>,
}

/// One non-blank inode slot, as the later phases need it.
#[derive(Debug)]
pub struct InodeRec {
    pub ino: u64,
    pub state: SlotState,
    pub mode: u32,
    pub nlink: u32,
    pub parent: u64,
    pub size: u64,
    /// A metadata file (inode file, maps, logs).
    pub system: bool,
    pub slot: DiskAddress,
    pub extents: Vec<Extent>,
    pub extra: Option<Box<Extra>>,
}

impl InodeRec {
    pub fn is_dir(&self) -> bool {
        is_dir(self.mode)
    }
    pub fn live(&self) -> bool {
        matches!(self.state, SlotState::Live | SlotState::Unlinked)
    }
    /// Why a `Bad` inode is bad.
    pub fn bad_reason(&self) -> Option<&str> {
        self.extra.as_ref().and_then(|e| e.bad.as_deref())
    }
    pub fn fixes(&self) -> &[Fix] {
        self.extra.as_ref().map_or(&[], |e| &e.fixes)
    }
    pub fn lost(&self) -> &[LostPointer] {
        self.extra.as_ref().map_or(&[], |e| &e.lost)
    }
    pub fn xattr_damage(&self) -> Option<&XattrDamage> {
        self.extra.as_ref().and_then(|e| e.xattr.as_ref())
    }
    pub fn dtype(&self) -> u8 {
        dtype(self.mode)
    }
}

/// Binary search of the records (sorted by inode number).
pub fn find(recs: &[InodeRec], ino: u64) -> Option<usize> {
    recs.binary_search_by_key(&ino, |r| r.ino).ok()
}

/// The inode map as read from disk: `None` where its segment is damaged.
pub struct InodeBits<'a> {
    pub segments: &'a crate::metafiles::ImapSegments,
}

impl InodeBits<'_> {
    pub fn get(&self, ino: u64) -> Option<bool> {
        self.segments.bit(ino)
    }
}

/// Everything the scan found.
pub struct ScanOut {
    /// Non-blank slots, sorted by inode number.
    pub recs: Vec<InodeRec>,
    /// Extents whose claim met an earlier claim: (inode, index into its extents).
    pub conflicts: Vec<(u64, usize)>,
    pub problems: Vec<Problem>,
    pub slots: u64,
    /// Slots actually read: those of inode-file blocks that exist.
    pub scanned: u64,
}

#[derive(Default)]
struct ChunkOut {
    recs: Vec<InodeRec>,
    conflicts: Vec<(u64, usize)>,
    problems: Vec<Problem>,
    newer: Vec<String>,
    fatal: Option<String>,
}

struct Scanner<'a> {
    l: &'a Layout,
    r: &'a dyn MetadataReader,
    meta: &'a Metafiles,
    imap: InodeBits<'a>,
    owners: &'a Ownership,
}

/// Scan every slot with `threads` workers.
pub fn run(
    l: &Layout,
    r: &dyn MetadataReader,
    meta: &Metafiles,
    owners: &Ownership,
    threads: usize,
    cancel: &AtomicBool,
    progress: &dyn Progress,
) -> Result<ScanOut, FsckError> {
    let isz = l.inode_bytes();
    let chunk_bytes = l.block_bytes.min(CHUNK_BYTES_MAX);
    let per_chunk = chunk_bytes / isz;
    let slots = meta.slots;
    // Only the chunks of inode-file blocks that exist: the inode file is sparse, and a
    // scan costs what is allocated, not the inode limit.
    let per_block = l.block_bytes / chunk_bytes;
    let chunks: Vec<u64> = meta
        .inode_file
        .iter()
        .flat_map(|(b, _)| b * per_block..(b + 1) * per_block)
        .filter(|c| c * per_chunk < slots)
        .collect();
    let nchunks = chunks.len();
    let total: u64 = chunks
        .iter()
        .map(|c| (c * per_chunk + per_chunk).min(slots) - c * per_chunk)
        .sum();
    let sc = Scanner {
        l,
        r,
        meta,
        imap: InodeBits {
            segments: &meta.imap_segments,
        },
        owners,
    };
    let next = AtomicUsize::new(0);
    let done = AtomicU64::new(0);
    let running = AtomicUsize::new(threads.max(1));
    let results: Vec<Mutex<Option<ChunkOut>>> = (0..nchunks).map(|_| Mutex::new(None)).collect();
    // The coordinator reports progress every tick and is woken as soon as the last
    // worker ends (a small file system is scanned in well under a tick).
    let coordinator = std::thread::current();
    std::thread::scope(|s| {
        for t in 0..threads.max(1) {
            let (sc, next, done, running, results) = (&sc, &next, &done, &running, &results);
            let chunks = &chunks;
            let coordinator = coordinator.clone();
            std::thread::Builder::new()
                .name(format!("fsck-scan-{t}"))
                .spawn_scoped(s, move || {
                    loop {
                        let k = next.fetch_add(1, Ordering::Relaxed);
                        if k >= nchunks || cancel.load(Ordering::Relaxed) {
                            break;
                        }
                        let c = chunks[k];
                        let first = c * per_chunk;
                        let last = (first + per_chunk).min(slots);
                        let out = sc.chunk(c, chunk_bytes, first, last);
                        *results[k].lock().unwrap_or_else(|e| e.into_inner()) = Some(out);
                        done.fetch_add(last - first, Ordering::Relaxed);
                    }
                    running.fetch_sub(1, Ordering::Release);
                    coordinator.unpark();
                })
                .expect("spawning a scan thread");
        }
        while running.load(Ordering::Acquire) > 0 {
            progress.update(Phase::Inodes, done.load(Ordering::Relaxed), total);
            std::thread::park_timeout(Duration::from_millis(TICK_MS));
        }
    });
    progress.update(Phase::Inodes, done.load(Ordering::Relaxed), total);
    if cancel.load(Ordering::Relaxed) {
        return Err(FsckError::Cancelled {
            during_repair: false,
        });
    }
    let mut out = ScanOut {
        recs: Vec::new(),
        conflicts: Vec::new(),
        problems: Vec::new(),
        slots,
        scanned: total,
    };
    let mut newer = Vec::new();
    for r in results {
        let c = r
            .into_inner()
            .unwrap_or_else(|e| e.into_inner())
            .expect("every chunk scanned");
        if let Some(f) = c.fatal {
            return Err(FsckError::Unusable(f));
        }
        out.recs.extend(c.recs);
        out.conflicts.extend(c.conflicts);
        out.problems.extend(c.problems);
        newer.extend(c.newer);
    }
    // The logs' inodes live in the log table, not in the inode file; their numbers
    // follow every inode-file number, so the records stay in order.
    let mut log_out = ChunkOut::default();
    for log in &meta.logs {
        if let Some(inode) = &log.inode {
            sc.metadata_inode(inode.clone(), log.inode_da, &mut log_out);
        }
    }
    out.recs.extend(log_out.recs);
    out.conflicts.extend(log_out.conflicts);
    if !newer.is_empty() {
        return Err(FsckError::NewerFormat(format!(
            "{} inode(s) were written by a newer Mako than this fsck ({}{}); upgrade Mako and run its fsck",
            newer.len(),
            newer[0],
            if newer.len() > 1 { ", …" } else { "" }
        )));
    }
    Ok(out)
}

impl Scanner<'_> {
    fn chunk(&self, c: u64, chunk_bytes: u64, first: u64, last: u64) -> ChunkOut {
        let l = self.l;
        let mut out = ChunkOut::default();
        let per_block = l.block_bytes / chunk_bytes;
        let block = self.meta.inode_file[(c / per_block) as usize];
        debug_assert!(
            !block.is_null(),
            "only chunks of existing blocks are scanned"
        );
        if block.is_null() {
            // A hole of the sparse inode file: no inode lives there.
            return out;
        }
        let base = block.offset_by((c % per_block) * chunk_bytes);
        let isz = l.inode_bytes();
        let mut buf = vec![0u8; ((last - first) * isz) as usize];
        if let Err(e) = self.r.read(
            base,
            &mut buf,
            BufferType::Inode,
            l.desc.metadata_inodes.inode_file,
        ) {
            // Inodes fsck cannot read may own blocks: going on would free them.
            out.fatal = Some(format!(
                "the inode file cannot be read at {base} (inodes {first}..{}): {e}; fix the disk and run fsck again",
                last - 1
            ));
            return out;
        }
        for (i, bytes) in buf.chunks_exact(isz as usize).enumerate() {
            let ino = first + i as u64;
            self.inode(ino, bytes, base.offset_by(i as u64 * isz), &mut out);
        }
        out
    }

    fn inode(&self, ino: u64, bytes: &[u8], slot: DiskAddress, out: &mut ChunkOut) {
        let l = self.l;
        let m = l.desc.metadata_inodes;
        let metadata = ino == m.inode_file
            || ino == m.block_alloc_map
            || ino == m.inode_alloc_map
            || ino == m.log_table;
        if ino < m.first_user_inode && ino != m.root_dir && !metadata {
            return; // reserved numbers no file uses
        }
        if Inode::is_blank(bytes) {
            return; // a free slot; the inode map comparison reports a set bit
        }
        let inode = match Inode::decode(bytes, l.geo.inode_bytes, ino, Location::Disk(slot)) {
            Ok(i) => i,
            Err(e) if !e.is_corruption() => {
                out.newer.push(format!("inode {ino} at {slot}"));
                return;
            }
            Err(_) if metadata => return, // the metadata phase reported it
            Err(e) if ino == m.root_dir => {
                // The namespace pass recreates the root and says so.
                out.recs.push(bad_rec(ino, slot, describe(&e)));
                return;
            }
            Err(e) => {
                let used = self.imap.get(ino) != Some(false);
                let (kind, repair) = if used {
                    (ProblemKind::BadInode, "clear the inode and remove the entries that name it; its blocks are reclaimed")
                } else {
                    (ProblemKind::DamagedFreeInode, "zero the free slot")
                };
                out.problems
                    .push(Problem::new(kind, describe(&e), repair).ino(ino).at(slot));
                out.recs.push(bad_rec(ino, slot, describe(&e)));
                return;
            }
        };
        if metadata {
            self.metadata_inode(inode, slot, out);
            return;
        }
        let state = if inode.nlink > 0 {
            SlotState::Live
        } else if self.imap.get(ino) == Some(true) {
            SlotState::Unlinked
        } else {
            return; // freed: mako-fs writes freed inodes back with no links
        };
        if !valid_kind(inode.mode) {
            let why = format!(
                "inode {ino} has an invalid file type (mode {:o})",
                inode.mode
            );
            out.problems.push(
                Problem::new(
                    ProblemKind::BadInode,
                    why.clone(),
                    "clear the inode and remove the entries that name it; its blocks are reclaimed",
                )
                .ino(ino)
                .at(slot),
            );
            out.recs.push(bad_rec(ino, slot, why));
            return;
        }
        let mut rec = InodeRec {
            ino,
            state,
            mode: inode.mode,
            nlink: inode.nlink,
            parent: inode.parent,
            size: inode.size,
            system: false,
            slot,
            extents: Vec::new(),
            extra: None,
        };
        let mut fixes = Vec::new();
        let mut field = |what: String, fix: Fix, repair: String, out: &mut ChunkOut| {
            out.problems.push(
                Problem::new(ProblemKind::InodeField, what, repair)
                    .ino(ino)
                    .at(slot),
            );
            fixes.push(fix);
        };
        if inode.flags & FLAG_SYSTEM != 0 {
            field(
                format!("{} is flagged as a metadata file", kind_name(inode.mode)),
                Fix::ClearSystemFlag,
                "clear the flag".into(),
                out,
            );
        }
        let dir = is_dir(inode.mode);
        let special = !dir && !is_reg(inode.mode) && inode.mode & S_IFMT != crate::layout::S_IFLNK;
        // Extended attributes outside the inode: their blocks count in `subblocks`.
        // When they are damaged the repair rebuilds them and sets the count itself.
        let xscan = xattr_check::check(l, self.r, &inode, slot, &mut out.problems);
        let xattr_held = xscan.damaged.is_none().then(|| {
            xscan
                .extents
                .iter()
                .map(|e| e.subblocks as u64)
                .sum::<u64>()
        });
        let mut tree: Option<Walk> = None;
        match &inode.content {
            InodeContent::InlineData(d) => {
                if special && inode.size != 0 {
                    field(
                        format!("{} has size {}", kind_name(inode.mode), inode.size),
                        Fix::EmptySpecial,
                        "make it empty".into(),
                        out,
                    );
                } else if d.len() as u64 != inode.size {
                    field(
                        format!(
                            "holds {} bytes of data in the inode but its size says {}",
                            d.len(),
                            inode.size
                        ),
                        Fix::Size(d.len() as u64),
                        format!("set the size to {}", d.len()),
                        out,
                    );
                }
                let x = xattr_held.unwrap_or(inode.subblocks);
                if inode.subblocks != x || inode.depth != 0 || inode.last_block_subblocks != 0 {
                    field(
                        format!(
                            "keeps its data in the inode but claims {} subblocks (its xattr blocks take {x}), depth {}, last block {}",
                            inode.subblocks, inode.depth, inode.last_block_subblocks
                        ),
                        Fix::Subblocks(x),
                        format!("set them to {x}, 0 and 0"),
                        out,
                    );
                }
            }
            InodeContent::InlineDir(_) => {
                let x = xattr_held.unwrap_or(inode.subblocks);
                if inode.size != 0 || inode.subblocks != x {
                    field(
                        format!(
                            "keeps its entries in the inode but has size {} and {} subblocks (its xattr blocks take {x})",
                            inode.size, inode.subblocks
                        ),
                        Fix::Subblocks(x),
                        format!("set them to 0 and {x}"),
                        out,
                    );
                    fixes.push(Fix::Size(0));
                }
            }
            InodeContent::Pointers(ptrs) => {
                if special {
                    field(
                        format!("{} holds block pointers", kind_name(inode.mode)),
                        Fix::EmptySpecial,
                        "make it empty; its blocks are reclaimed".into(),
                        out,
                    );
                } else {
                    match self.pointers(&inode, ptrs, slot, xattr_held, &mut fixes, out) {
                        Some(w) => tree = Some(w),
                        None => {
                            let why = format!("inode {ino} says its tree has depth {}, deeper than any Mako file ({TREE_DEPTH_MAX})", inode.depth);
                            out.problems.push(
                                Problem::new(ProblemKind::BadInode, why.clone(), "clear the inode and remove the entries that name it; its blocks are reclaimed")
                                    .ino(ino)
                                    .at(slot),
                            );
                            out.recs.push(bad_rec(ino, slot, why));
                            return;
                        }
                    }
                }
            }
        }
        let mut extra = Extra::default();
        if let Some(w) = &tree {
            for &(u, da, n) in &w.units {
                rec.extents.push(Extent {
                    da,
                    subblocks: n,
                    piece: Piece::Unit(u),
                });
            }
            for &(level, index, da) in &w.indirect {
                rec.extents.push(Extent {
                    da,
                    subblocks: l.indirect_subblocks(),
                    piece: Piece::Indirect(level, index),
                });
            }
        }
        rec.extents.extend(xscan.extents);
        extra.xattr = xscan.damaged;
        if dir {
            let scan =
                directory_check::check(l, self.r, &inode, tree.as_ref(), slot, &mut out.problems);
            if let Some(n) = scan.count_fix {
                fixes.push(Fix::Entries(n));
            }
            extra.dir = Some(scan);
        }
        if let Some(w) = tree {
            extra.lost = w.lost;
        }
        extra.fixes = fixes;
        if !extra.lost.is_empty()
            || !extra.fixes.is_empty()
            || extra.dir.is_some()
            || extra.xattr.is_some()
        {
            rec.extra = Some(Box::new(extra));
        }
        for (k, e) in rec.extents.iter().enumerate() {
            if !self.owners.claim(l, e.da, e.subblocks) {
                out.conflicts.push((ino, k));
            }
        }
        out.recs.push(rec);
    }

    /// A metadata file's inode: the metadata phase checked it; claim its blocks.
    fn metadata_inode(&self, inode: Inode, slot: DiskAddress, out: &mut ChunkOut) {
        let l = self.l;
        let mut rec = InodeRec {
            ino: inode.ino,
            state: SlotState::Live,
            mode: inode.mode,
            nlink: inode.nlink,
            parent: 0,
            size: inode.size,
            system: true,
            slot,
            extents: Vec::new(),
            extra: None,
        };
        if let InodeContent::Pointers(ptrs) = &inode.content {
            let n = inode.size / l.block_bytes;
            let rule = UnitRule {
                full: l.spb as u32,
                last: n.checked_sub(1),
                last_subblocks: 0,
                beyond_eof: false,
                size: inode.size,
            };
            if inode.depth <= TREE_DEPTH_MAX {
                let w = walk(l, self.r, inode.ino, inode.depth, ptrs, &rule);
                for (u, da, n) in w.units {
                    rec.extents.push(Extent {
                        da,
                        subblocks: n,
                        piece: Piece::Unit(u),
                    });
                }
                for (level, index, da) in w.indirect {
                    rec.extents.push(Extent {
                        da,
                        subblocks: l.indirect_subblocks(),
                        piece: Piece::Indirect(level, index),
                    });
                }
            }
        }
        for (k, e) in rec.extents.iter().enumerate() {
            if !self.owners.claim(l, e.da, e.subblocks) {
                out.conflicts.push((inode.ino, k));
            }
        }
        out.recs.push(rec);
    }

    /// Walk a file's tree, correcting the depth when the tree disagrees with the
    /// inode, and report what cannot be followed. `None`: no usable depth.
    fn pointers(
        &self,
        inode: &Inode,
        ptrs: &[DiskAddress],
        slot: DiskAddress,
        xattr_held: Option<u64>,
        fixes: &mut Vec<Fix>,
        out: &mut ChunkOut,
    ) -> Option<Walk> {
        let l = self.l;
        let ino = inode.ino;
        let dir = is_dir(inode.mode);
        let unit_sb = l.unit_subblocks(dir);
        let unit_bytes = l.unit_bytes(dir);
        let mut lbs = inode.last_block_subblocks as u32;
        if lbs >= unit_sb {
            out.problems.push(
                Problem::new(
                    ProblemKind::InodeField,
                    format!("says its last block is a fragment of {lbs} subblocks, but a full unit is {unit_sb}"),
                    "treat the last block as a full unit",
                )
                .ino(ino)
                .at(slot),
            );
            fixes.push(Fix::LastBlockSubblocks(0));
            lbs = 0;
        }
        let last = inode.size.checked_sub(1).map(|b| b / unit_bytes);
        let rule = UnitRule {
            full: unit_sb,
            last,
            last_subblocks: lbs,
            beyond_eof: is_reg(inode.mode),
            size: inode.size,
        };
        let mut depth = inode.depth;
        let mut w = if depth <= TREE_DEPTH_MAX {
            Some(walk(l, self.r, ino, depth, ptrs, &rule))
        } else {
            None
        };
        // A tree whose root pointers fail their identity, or a file too large for its
        // depth that has root pointers, may just have the wrong depth in its inode.
        let top_failed = w.as_ref().is_some_and(|w| {
            w.lost
                .iter()
                .any(|x| x.level == depth && x.kind == ProblemKind::BadIndirectBlock)
        });
        let too_big =
            last.is_some_and(|u| u >= l.capacity(depth)) && ptrs.iter().any(|p| !p.is_null());
        if w.is_none() || top_failed || (depth == 0 && too_big) {
            if let Some(real) = probe_depth(l, self.r, ino, ptrs) {
                if real != depth {
                    out.problems.push(
                        Problem::new(
                            ProblemKind::TreeDepth,
                            format!("says its indirect tree has depth {depth}, but its first root pointer holds a level-{real} indirect block of this file"),
                            format!("set the depth to {real}"),
                        )
                        .ino(ino)
                        .at(slot),
                    );
                    fixes.push(Fix::Depth(real));
                    depth = real;
                    w = Some(walk(l, self.r, ino, depth, ptrs, &rule));
                }
            }
        }
        let w = w?;
        for lost in &w.lost {
            let (u0, u1) = (
                lost.index.saturating_mul(l.span(lost.level)),
                lost.index
                    .saturating_add(1)
                    .saturating_mul(l.span(lost.level)),
            );
            let (b0, b1) = l.byte_range(dir, u0, u1, inode.size);
            let consequence = if dir {
                "the directory is rebuilt from what is readable".to_string()
            } else if b1 > b0 {
                format!("bytes {b0}..{b1} of the file are lost (they read as zeros)")
            } else {
                "only preallocated space past the end of the file is lost".to_string()
            };
            let mut p = Problem::new(
                lost.kind,
                format!("{}; {consequence}", lost.why),
                format!("cut the pointer: units {u0}..{u1} become a hole"),
            )
            .ino(ino);
            p = if lost.da.is_null() {
                p.at(slot)
            } else {
                p.at(lost.da)
            };
            out.problems.push(p);
        }
        let tree_held: u64 = w.units.iter().map(|u| u.2 as u64).sum::<u64>()
            + w.indirect.len() as u64 * l.indirect_subblocks() as u64;
        if let (true, Some(x)) = (w.lost.is_empty(), xattr_held) {
            let held = tree_held + x;
            if held != inode.subblocks {
                out.problems.push(
                    Problem::new(
                        ProblemKind::InodeField,
                        format!(
                            "counts {} subblocks, its tree holds {tree_held} and its xattr blocks {x}",
                            inode.subblocks
                        ),
                        format!("set the count to {held}"),
                    )
                    .ino(ino)
                    .at(slot),
                );
                fixes.push(Fix::Subblocks(held));
            }
        }
        // A fragment may hold fewer bytes than the size gives the last block: the rest
        // reads as zeros (mako-fs reads what is allocated and zero-fills), which is
        // what a crash leaves when a file grew and its fragment was not yet written
        // back (write-behind grows the fragment; the size was committed with an fsync
        // of anything). Not a problem.
        Some(w)
    }
}

fn bad_rec(ino: u64, slot: DiskAddress, why: String) -> InodeRec {
    InodeRec {
        ino,
        state: SlotState::Bad,
        mode: 0,
        nlink: 0,
        parent: 0,
        size: 0,
        system: false,
        slot,
        extents: Vec::new(),
        extra: Some(Box::new(Extra {
            bad: Some(why),
            ..Default::default()
        })),
    }
}
