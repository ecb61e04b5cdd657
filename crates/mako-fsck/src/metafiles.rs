//! The second phase: the files that hold metadata. The inode file (found through its
//! own inode at the descriptor's `inode_file_start`), the block allocation map, the
//! inode allocation map, the log table and the recovery log of every node that has one
//! (`mako_format::log_table`: a node's log exists once its entry is written, at its
//! first mount), with their contents read for the later phases (map segments, the
//! logs' inodes, which live in the table and not in the inode file) or checked now
//! (log headers).
//!
//! The log's records were replayed (or laid over the reads) before this phase
//! (`crate::replay`); here the headers are checked, and an unclean stop reported.

use crate::error::FsckError;
use crate::layout::{Layout, S_IFMT, S_IFREG};
use crate::problem::{describe, Problem, ProblemKind};
use crate::reader::MetadataReader;
use crate::tree::{walk, UnitRule};
use mako_disk::BufferType;
use mako_format::alloc_segment::AllocSegment;
use mako_format::error::Location;
use mako_format::inode::{Inode, InodeContent, FLAG_SYSTEM};
use mako_format::inode_map_segment::InodeMapSegment;
use mako_format::log_header::{LogHeader, LOG_HEADER_BYTES};
use mako_format::DiskAddress;
pub use mako_fs::meta_blocks::MetaBlocks;
use std::collections::BTreeMap;

pub use mako_format::log_header::{
    LOG_HEADER_OFFSETS as LOG_HEADER_COPY_OFFSETS, LOG_RECORDS_OFFSET,
};

/// One metadata file: its blocks when its inode and tree are sound.
#[derive(Debug, Clone)]
pub struct MetaFile {
    pub ino: u64,
    /// Block addresses by block index, when readable; `None` when fsck recreates it.
    /// Sparse: the inode map file has holes (blank segments).
    pub blocks: Option<MetaBlocks>,
    /// Bytes the file must hold.
    pub bytes: u64,
}

impl MetaFile {
    /// Address of `len` bytes at `offset`, when they lie inside one block of the file.
    pub fn da(&self, l: &Layout, offset: u64, len: u64) -> Result<DiskAddress, String> {
        let blocks = self
            .blocks
            .as_ref()
            .ok_or_else(|| format!("metadata file {} is being recreated", self.ino))?;
        let b = (offset / l.block_bytes) as usize;
        let within = offset % l.block_bytes;
        if within + len > l.block_bytes {
            return Err(format!(
                "bytes {offset}..{} of metadata file {} straddle its blocks {b} and {}",
                offset + len,
                self.ino,
                b + 1
            ));
        }
        blocks
            .get(b)
            .map(|d| d.offset_by(within))
            .ok_or_else(|| format!("metadata file {} has no block {b}", self.ino))
    }
}

/// The state of one node's recovery log.
#[derive(Debug, Clone)]
pub struct LogState {
    pub node: u32,
    /// Blocks `None` when the log's inode or block map is damaged: the repair removes
    /// its entry (the node makes a new log at its next mount).
    pub file: MetaFile,
    /// Where its entry and its inode lie in the log table.
    pub entry_da: DiskAddress,
    pub inode_da: DiskAddress,
    /// Its inode, when readable (scanned for the blocks it owns).
    pub inode: Option<Inode>,
    /// The winning header copy, if any copy is valid.
    pub header: Option<LogHeader>,
    /// The header area must be rewritten (no valid copy, or fields that disagree).
    pub rewrite_header: bool,
}

pub struct Metafiles {
    /// By block index; a hole holds no inode.
    pub inode_file: MetaBlocks,
    /// Inode slots the inode file spans, holes included (capped at the inode limit).
    pub slots: u64,
    pub alloc: MetaFile,
    pub imap: MetaFile,
    pub table: MetaFile,
    /// The logs of the nodes that have one.
    pub logs: Vec<LogState>,
    pub alloc_slot_bytes: u64,
    pub imap_slot_bytes: u64,
    /// Decoded segments; `None` where damaged (or the file is recreated).
    pub alloc_segments: Vec<Option<AllocSegment>>,
    /// Only the segments in blocks of the inode map file that exist: a segment in a
    /// hole is blank (`ImapSegments::bit`).
    pub imap_segments: ImapSegments,
}

fn read_inode(
    l: &Layout,
    r: &dyn MetadataReader,
    da: DiskAddress,
    ino: u64,
) -> Result<Inode, String> {
    let mut buf = vec![0u8; l.inode_bytes() as usize];
    r.read(da, &mut buf, BufferType::Inode, ino)
        .map_err(|e| format!("inode {ino} at {da} cannot be read: {e}"))?;
    Inode::decode(&buf, l.geo.inode_bytes, ino, Location::Disk(da)).map_err(|e| describe(&e))
}

/// The blocks of a metadata file of at least `min_bytes`, or why they cannot be used.
fn metafile_blocks(
    l: &Layout,
    r: &dyn MetadataReader,
    inode: &Inode,
    min_bytes: u64,
) -> Result<MetaBlocks, String> {
    metafile_blocks_with(l, r, inode, min_bytes, false)
}

/// `metafile_blocks`; with `holes` (the inode file and the inode map file, which grow
/// sparsely) a hole is no damage. Costs what is allocated, not the file's size.
fn metafile_blocks_with(
    l: &Layout,
    r: &dyn MetadataReader,
    inode: &Inode,
    min_bytes: u64,
    holes: bool,
) -> Result<MetaBlocks, String> {
    if inode.flags & FLAG_SYSTEM == 0 || inode.mode & S_IFMT != S_IFREG {
        return Err(format!(
            "inode {} is not a metadata file (mode {:o}, flags {:#x})",
            inode.ino, inode.mode, inode.flags
        ));
    }
    let InodeContent::Pointers(ptrs) = &inode.content else {
        return Err(format!("inode {} holds no block pointers", inode.ino));
    };
    if inode.size < min_bytes || inode.size % l.block_bytes != 0 {
        return Err(format!(
            "inode {} is {} bytes; it must be whole blocks and at least {min_bytes} bytes",
            inode.ino, inode.size
        ));
    }
    let n = inode.size / l.block_bytes;
    let rule = UnitRule {
        full: l.spb as u32,
        last: n.checked_sub(1),
        last_subblocks: 0,
        beyond_eof: false,
        size: inode.size,
    };
    let w = walk(l, r, inode.ino, inode.depth, ptrs, &rule);
    if let Some(lost) = w.lost.first() {
        return Err(format!("its block map is damaged: {}", lost.why));
    }
    let mut blocks = MetaBlocks::new(n);
    for (u, da, _) in w.units {
        blocks.set(u, da);
    }
    if !holes && (blocks.allocated() as u64) < n {
        let hole = (0..n)
            .find(|b| blocks.get(*b as usize).is_none())
            .unwrap_or(0);
        return Err(format!("block {hole} of inode {} is a hole", inode.ino));
    }
    Ok(blocks)
}

/// The inode map as read from disk.
#[derive(Debug, Clone, Default)]
pub struct ImapSegments {
    /// The segments of blocks that exist: `None` where damaged.
    pub segments: BTreeMap<u64, Option<InodeMapSegment>>,
    /// False when the inode map file itself is unusable (recreated by the repair):
    /// then nothing is known of any segment.
    pub usable: bool,
    pub per: u64,
}

impl ImapSegments {
    /// Whether `ino` is marked in use; `None` when its segment is damaged.
    pub fn bit(&self, ino: u64) -> Option<bool> {
        if !self.usable {
            return None;
        }
        let i = ino % self.per;
        match self.segments.get(&(ino / self.per)) {
            // A hole of the map file: a blank segment.
            None => Some(false),
            Some(None) => None,
            Some(Some(seg)) => seg
                .bitmap
                .get((i / 64) as usize)
                .map(|w| w >> (i % 64) & 1 == 1),
        }
    }
    /// True when `ino`'s segment lies in a hole of the map file.
    pub fn in_hole(&self, ino: u64) -> bool {
        self.usable && !self.segments.contains_key(&(ino / self.per))
    }
}

/// Read the metadata files. Damage that fsck can repair becomes a problem; damage it
/// cannot work around (the inode file) is an error.
pub fn read(
    l: &Layout,
    r: &dyn MetadataReader,
    problems: &mut Vec<Problem>,
) -> Result<Metafiles, FsckError> {
    let desc = &l.desc;
    let m = desc.metadata_inodes;
    // 1. The inode file, through its own inode at its fixed place.
    let start = desc.inode_file_start;
    let inode0 = read_inode(l, r, start, m.inode_file).map_err(|e| {
        FsckError::Unusable(format!(
            "the inode file's own inode (inode {} at {start}) is damaged: {e}; fsck cannot find any inode without it. \
             Restore the file system from a backup",
            m.inode_file
        ))
    })?;
    let inode_file = metafile_blocks_with(l, r, &inode0, l.block_bytes, true).map_err(|e| {
        FsckError::Unusable(format!("the inode file (inode {}) cannot be read whole: {e}; restore the file system from a backup", m.inode_file))
    })?;
    if inode_file[0] != start {
        return Err(FsckError::Unusable(format!(
            "the inode file's block 0 is at {}, but the descriptor says the inode file starts at {start}; restore from a backup",
            inode_file[0]
        )));
    }
    let slots = (inode_file.len() as u64 * l.block_bytes / l.inode_bytes()).min(desc.inodes_max);
    let meta_inode = |ino: u64| -> Result<Inode, String> {
        let da = l
            .inode_da(&inode_file, ino)
            .ok_or_else(|| format!("inode {ino} lies past the inode file"))?;
        read_inode(l, r, da, ino)
    };
    let slot_of = |ino: u64| l.inode_da(&inode_file, ino);
    // 2. The allocation maps: their files, then every segment.
    let alloc_slot_bytes = mako_fs::alloc_map::segment_slot_bytes(desc) as u64;
    let per = desc.inodes_per_segment;
    let imap_slot_bytes = InodeMapSegment::slot_bytes(per) as u64;
    let nseg = mako_fs::inode_map::InodeMap::segment_count(desc.inodes_max, per);
    let open_map = |ino: u64, bytes: u64, what: &str, problems: &mut Vec<Problem>| -> MetaFile {
        // The inode map file is sparse (format version 3); the others are whole.
        let blocks = meta_inode(ino)
            .and_then(|i| metafile_blocks_with(l, r, &i, bytes, ino == m.inode_alloc_map));
        match blocks {
            Ok(b) => MetaFile {
                ino,
                blocks: Some(b),
                bytes,
            },
            Err(e) => {
                let mut p = Problem::new(
                    ProblemKind::MetadataFile,
                    format!("the {what} file (inode {ino}) is unusable: {e}"),
                    format!(
                        "recreate the {what} file on new blocks and write it from what is in use"
                    ),
                )
                .ino(ino);
                if let Some(da) = slot_of(ino) {
                    p = p.at(da);
                }
                problems.push(p);
                MetaFile {
                    ino,
                    blocks: None,
                    bytes,
                }
            }
        }
    };
    let alloc = open_map(
        m.block_alloc_map,
        desc.regions as u64 * alloc_slot_bytes,
        "block allocation map",
        problems,
    );
    let imap = open_map(
        m.inode_alloc_map,
        mako_format::inode_map_segment::file_bytes(nseg, per, desc.geometry.block_bytes),
        "inode allocation map",
        problems,
    );
    let mut alloc_segments = Vec::new();
    for region in 0..desc.regions {
        alloc_segments.push(read_alloc_segment(
            l,
            r,
            &alloc,
            region,
            alloc_slot_bytes,
            problems,
        ));
    }
    // Only the segments of blocks that exist: fsck costs what was ever used, not the
    // inode limit.
    let mut imap_segments = ImapSegments {
        segments: BTreeMap::new(),
        usable: imap.blocks.is_some(),
        per: per as u64,
    };
    if let Some(blocks) = &imap.blocks {
        for (b, _) in blocks.iter() {
            for s in mako_format::inode_map_segment::segments_in_block(
                b,
                nseg,
                per,
                desc.geometry.block_bytes,
            ) {
                let seg = read_imap_segment(l, r, &imap, s as u32, imap_slot_bytes, problems);
                imap_segments.segments.insert(s, seg);
            }
        }
    }
    // 3. The log table and the recovery logs it names.
    let table = open_map(
        m.log_table,
        mako_format::log_table::table_bytes(m.log_count, l.geo.inode_bytes),
        "log table",
        problems,
    );
    let mut logs = Vec::new();
    if table.blocks.is_some() {
        for node in 0..m.log_count {
            if let Some(file) = open_log(l, r, &table, node, problems) {
                logs.push(read_log(l, r, file, problems));
            }
        }
    }
    Ok(Metafiles {
        inode_file,
        slots,
        alloc,
        imap,
        table,
        logs,
        alloc_slot_bytes,
        imap_slot_bytes,
        alloc_segments,
        imap_segments,
    })
}

/// Read `len` bytes at `offset` of a metadata file the way mako-fs does: from the
/// address of the first byte onwards. Returns the bytes and their address.
fn read_range(
    l: &Layout,
    r: &dyn MetadataReader,
    f: &MetaFile,
    offset: u64,
    len: u64,
    what: BufferType,
) -> Result<(Vec<u8>, DiskAddress), String> {
    let da = f.da(l, offset, len)?;
    let mut buf = vec![0u8; len as usize];
    r.read(da, &mut buf, what, f.ino)
        .map_err(|e| format!("cannot be read at {da}: {e}"))?;
    Ok((buf, da))
}

fn read_alloc_segment(
    l: &Layout,
    r: &dyn MetadataReader,
    f: &MetaFile,
    region: u32,
    slot: u64,
    problems: &mut Vec<Problem>,
) -> Option<AllocSegment> {
    f.blocks.as_ref()?;
    let fail = |what: String, at: Option<DiskAddress>, correctable: bool| {
        let mut p = Problem::new(
            ProblemKind::AllocSegment,
            format!("allocation map segment of region {region} {what}"),
            if correctable {
                "rewrite the segment from the blocks in use"
            } else {
                "none: this is a mako-fs bug, report it; fsck leaves the segment alone"
            },
        );
        if let Some(da) = at {
            p = p.at(da);
        }
        if !correctable {
            p = p.uncorrectable();
        }
        p
    };
    let (buf, da) = match read_range(l, r, f, region as u64 * slot, slot, BufferType::AllocMap) {
        Ok(x) => x,
        Err(e) => {
            let straddles = e.contains("straddle");
            problems.push(fail(e, None, !straddles));
            return None;
        }
    };
    match AllocSegment::decode(&buf, region, Location::Disk(da)) {
        Ok(seg) if seg.slices == mako_fs::alloc_map::region_slices(&l.desc, region) => Some(seg),
        Ok(seg) => {
            problems.push(fail(
                format!(
                    "covers {:?}, but the descriptor gives the region other slices",
                    seg.slices.first()
                ),
                Some(da),
                true,
            ));
            None
        }
        Err(e) => {
            problems.push(fail(
                format!("is damaged: {}", describe(&e)),
                Some(da),
                true,
            ));
            None
        }
    }
}

fn read_imap_segment(
    l: &Layout,
    r: &dyn MetadataReader,
    f: &MetaFile,
    s: u32,
    slot: u64,
    problems: &mut Vec<Problem>,
) -> Option<InodeMapSegment> {
    f.blocks.as_ref()?;
    let per = l.desc.inodes_per_segment;
    let offset =
        mako_format::inode_map_segment::slot_offset(s as u64, per, l.desc.geometry.block_bytes);
    debug_assert_eq!(slot, InodeMapSegment::slot_bytes(per) as u64);
    let (buf, da) = match read_range(l, r, f, offset, slot, BufferType::InodeMap) {
        Ok(x) => x,
        Err(e) => {
            let straddles = e.contains("straddle");
            let mut p = Problem::new(
                ProblemKind::InodeMapSegment,
                format!("inode map segment {s} {e}"),
                if straddles {
                    "none: this is a mako-fs bug, report it; fsck leaves the segment alone"
                } else {
                    "rewrite the segment from the inodes in use"
                },
            );
            if straddles {
                p = p.uncorrectable();
            }
            problems.push(p);
            return None;
        }
    };
    match InodeMapSegment::decode(&buf, s, per, Location::Disk(da)) {
        Ok(seg) if seg.first_ino == s as u64 * per as u64 => Some(seg),
        Ok(seg) => {
            problems.push(
                Problem::new(
                    ProblemKind::InodeMapSegment,
                    format!(
                        "inode map segment {s} says it starts at inode {}, it must start at {}",
                        seg.first_ino,
                        s as u64 * per as u64
                    ),
                    "rewrite the segment from the inodes in use",
                )
                .at(da),
            );
            None
        }
        Err(e) => {
            problems.push(
                Problem::new(
                    ProblemKind::InodeMapSegment,
                    format!("inode map segment {s} is damaged: {}", describe(&e)),
                    "rewrite the segment from the inodes in use",
                )
                .at(da),
            );
            None
        }
    }
}

/// Node `node`'s log as its entry in the table says: `None` when it has none; its
/// file without blocks (and a problem) when the entry, inode or block map is damaged.
fn open_log(
    l: &Layout,
    r: &dyn MetadataReader,
    table: &MetaFile,
    node: u32,
    problems: &mut Vec<Problem>,
) -> Option<LogState> {
    use mako_format::log_table::{entry_offset, inode_offset, log_ino, LogEntry, LOG_ENTRY_BYTES};
    let ino = log_ino(node);
    let m = l.desc.metadata_inodes;
    let isz = l.inode_bytes();
    let (sector, entry_da) = match read_range(
        l,
        r,
        table,
        entry_offset(node),
        LOG_ENTRY_BYTES,
        BufferType::Log,
    ) {
        Ok(x) => x,
        Err(e) => {
            problems.push(
                Problem::new(
                    ProblemKind::MetadataFile,
                    format!("the log table entry of node {node} {e}"),
                    "none: fsck cannot reach it",
                )
                .ino(m.log_table)
                .uncorrectable(),
            );
            return None;
        }
    };
    let inode_da = table
        .da(l, inode_offset(m.log_count, isz as u32, node), isz)
        .unwrap_or(DiskAddress::NULL);
    let damaged = |what: String, at: DiskAddress, problems: &mut Vec<Problem>| {
        problems.push(
            Problem::new(
                ProblemKind::MetadataFile,
                format!("the recovery log of node {node} (inode {ino}) is unusable: {what}"),
                "remove its entry from the log table (what the log held that was not in place is lost; \
                 the node makes a new log at its next mount) and reclaim its blocks",
            )
            .ino(ino)
            .at(at),
        );
        Some(LogState {
            node,
            file: MetaFile {
                ino,
                blocks: None,
                bytes: l.desc.log_bytes,
            },
            entry_da,
            inode_da,
            inode: None,
            header: None,
            rewrite_header: false,
        })
    };
    match LogEntry::decode(&sector, node, &l.desc.fs_uuid, Location::Disk(entry_da)) {
        Ok(None) => return None,
        Ok(Some(e)) if e.log_bytes != l.desc.log_bytes => {
            return damaged(
                format!(
                    "its entry says it is {} bytes, the descriptor says {}",
                    e.log_bytes, l.desc.log_bytes
                ),
                entry_da,
                problems,
            )
        }
        Ok(Some(_)) => {}
        Err(e) => {
            return damaged(
                format!("its entry is damaged: {}", describe(&e)),
                entry_da,
                problems,
            )
        }
    }
    let inode = match read_inode(l, r, inode_da, ino) {
        Ok(i) => i,
        Err(e) => return damaged(format!("its inode is damaged: {e}"), inode_da, problems),
    };
    match metafile_blocks(l, r, &inode, l.desc.log_bytes.max(LOG_RECORDS_OFFSET)) {
        Ok(blocks) => Some(LogState {
            node,
            file: MetaFile {
                ino,
                blocks: Some(blocks),
                bytes: l.desc.log_bytes,
            },
            entry_da,
            inode_da,
            inode: Some(inode),
            header: None,
            rewrite_header: false,
        }),
        Err(e) => damaged(e, inode_da, problems),
    }
}

fn read_log(
    l: &Layout,
    r: &dyn MetadataReader,
    log: LogState,
    problems: &mut Vec<Problem>,
) -> LogState {
    let node = log.node;
    if log.file.blocks.is_none() {
        return log;
    }
    let file = log.file.clone();
    let mut copies = Vec::new();
    let mut damaged = Vec::new();
    let mut first_da = None;
    for (k, &off) in LOG_HEADER_COPY_OFFSETS.iter().enumerate() {
        match read_range(l, r, &file, off, LOG_HEADER_BYTES as u64, BufferType::Log) {
            Ok((buf, da)) => {
                first_da.get_or_insert(da);
                match LogHeader::decode(&buf, node, Location::Disk(da)) {
                    Ok(h) => copies.push(h),
                    Err(e) => damaged.push(format!("copy {k}: {}", describe(&e))),
                }
            }
            Err(e) => damaged.push(format!("copy {k}: {e}")),
        }
    }
    // The valid copy with the greater tail LSN is the current one (both copies are
    // written together, so they normally agree).
    let header = copies.into_iter().max_by_key(|h| h.tail_lsn);
    let mut rewrite_header = false;
    match &header {
        None => {
            let mut p = Problem::new(
                ProblemKind::LogHeader,
                format!("the recovery log of node {node} (inode {}) has no valid header: {}", file.ino, damaged.join("; ")),
                "rewrite a clean header and clear the log (whatever it held that was not in place is lost)",
            )
            .ino(file.ino);
            if let Some(da) = first_da {
                p = p.at(da);
            }
            problems.push(p);
            rewrite_header = true;
        }
        Some(h) if h.log_bytes != l.desc.log_bytes => {
            problems.push(
                Problem::new(
                    ProblemKind::LogHeader,
                    format!("the recovery log header of node {node} says the log is {} bytes, the descriptor says {}", h.log_bytes, l.desc.log_bytes),
                    "rewrite the header with the descriptor's size",
                )
                .ino(file.ino),
            );
            rewrite_header = true;
        }
        Some(_) if !damaged.is_empty() => {
            let mut p = Problem::new(
                ProblemKind::LogHeader,
                format!(
                    "a recovery log header copy of node {node} (inode {}) is damaged: {}",
                    file.ino,
                    damaged.join("; ")
                ),
                "rewrite both copies from the valid one",
            )
            .ino(file.ino);
            if let Some(da) = first_da {
                p = p.at(da);
            }
            problems.push(p);
            rewrite_header = true;
        }
        Some(_) => {}
    }
    LogState {
        header,
        rewrite_header,
        ..log
    }
}

/// Whether the logs say the file system stopped cleanly, as a problem if not. The
/// replay itself (`mako_fs::recovery`) happens before this check reads anything: for
/// `-y` in place, for `-n` as an overlay (`crate::replay`); this only reports what the
/// log state still says after it (a header left unclean, the descriptor's mount flag),
/// which the repair's step 0 clears.
pub fn log_state_problems(l: &Layout, logs: &[LogState], problems: &mut Vec<Problem>) -> bool {
    let mut unclean = Vec::new();
    if l.desc.mounted {
        unclean.push("the descriptor says it is mounted".to_string());
    }
    for log in logs {
        if let Some(h) = &log.header {
            if !h.clean {
                unclean.push(format!(
                    "the recovery log header of node {} is not marked clean",
                    log.node
                ));
            }
        }
    }
    if unclean.is_empty() {
        return false;
    }
    problems.push(Problem::new(
        ProblemKind::LogReplay,
        format!(
            "file system {} was not stopped cleanly: {}",
            l.desc.fs_name,
            unclean.join("; ")
        ),
        "mark the logs clean and the file system unmounted (after the replay and the check)",
    ));
    true
}
