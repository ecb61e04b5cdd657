//! The repair (`-y`). Everything is planned in memory first — every allocation,
//! every block and inode to write — so that a plan that cannot be carried out (no
//! space) stops before the first write. Then the writes go out in steps, each ended by
//! a sync, ordered so that a crash (or a cancel) between any two steps leaves a file
//! system that mounts no worse than before and that the next fsck repairs:
//!
//! 0. descriptor copies, disk headers, log headers (independent of the rest);
//! 1. the allocation and inode maps as the union of what they say, everything any
//!    inode claims and every allocation of this repair: from here on nothing in use
//!    or about to be used is marked free (recreated map files get new blocks, their
//!    content, then their inode);
//! 2. new blocks: copies of cross-linked blocks, rebuilt directory blocks, new
//!    indirect blocks, recreated log headers — all in space nothing points at yet;
//! 3. pointer switches: changed indirect blocks, then inodes (a new /lost+found and a
//!    recreated root before the directories that name them, files, directories,
//!    link counts and parents);
//! 4. inodes cleared or freed: their slots zeroed (no entry names them any more);
//! 5. the maps as they must be: leaked and abandoned space and inode numbers freed.
//!
//! A crash after 3 leaves leaked space and inodes still marked, which the next run
//! frees; a crash inside 3 leaves some pointers switched, whose old targets are then
//! unowned or the new ones orphaned — both repairable. Nothing that is in use is ever
//! marked free, in any step.
//!
//! The repair writes the structures directly instead of mounting the image and using
//! `FileSystem`: the operations it needs (set a link count, link a directory under
//! /lost+found, drop an entry lookup cannot find, cut a pointer) are not POSIX
//! operations, and mounting a damaged image would run the file system over the very
//! inconsistencies being repaired.

use crate::allocator::{RepairAllocator, Use};
use crate::crosslink::CrossFix;
use crate::dir_build::{build_dir, build_tree, BlockWrite};
use crate::directory_check::inline_room;
use crate::error::FsckError;
use crate::layout::{is_dir, Layout, S_IFDIR, S_IFREG};
use crate::maps;
use crate::metafiles::{MetaFile, Metafiles, LOG_HEADER_COPY_OFFSETS, LOG_RECORDS_OFFSET};
use crate::namespace::{NsPlan, LOST_FOUND_MODE};
use crate::problem::Problem;
use crate::progress::{Phase, Progress};
use crate::reader::{MetadataReader, MetadataWriter};
use crate::scan::{find, Extent, Fix, InodeRec, Piece};
use crate::space::Bitmap;
use crate::superblock::{descriptor_da, expected_header};
use crate::tree::is_under;
use crate::xattr_check::{self, XattrDamage};
use mako_disk::BufferType;
use mako_format::error::Location;
use mako_format::indirect::{IndirectBlock, IndirectId};
use mako_format::inode::{Inode, InodeContent, Timestamp, FLAG_SYSTEM};
use mako_format::inode_map_segment::InodeMapSegment;
use mako_format::log_header::LogHeader;
use mako_format::DiskAddress;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};

/// Everything the check found that the repair needs.
pub struct Findings {
    pub l: Layout,
    pub rewrite_descriptor: Vec<u32>,
    pub rewrite_header: Vec<u32>,
    /// The file system was not stopped cleanly (its log was replayed before the
    /// check): every log header is rewritten clean and the descriptor unmounted.
    pub mark_clean: bool,
    pub meta: Metafiles,
    pub recs: Vec<InodeRec>,
    /// Every subblock some inode claimed during the scan.
    pub claims: Bitmap,
    pub ns: NsPlan,
    pub cross: Vec<CrossFix>,
}

/// Steps of the repair, for progress.
const STEPS: u64 = 6;

fn now() -> Timestamp {
    let d = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    Timestamp {
        sec: d.as_secs() as i64,
        nsec: d.subsec_nanos(),
    }
}

struct Plan {
    step0: Vec<BlockWrite>,
    /// Map files recreated: written in step 1 after their content.
    map_inodes: Vec<Inode>,
    new_blocks: Vec<BlockWrite>,
    indirect_updates: Vec<BlockWrite>,
    /// Inodes to write in step 3, in this order.
    inodes: Vec<Inode>,
    zero: Vec<u64>,
    /// Final extents of every inode the maps must show in use.
    final_bits: Bitmap,
    final_inodes: BTreeSet<u64>,
    alloc_file: MetaFile,
    imap_file: MetaFile,
    /// The inode file's blocks after the repair (it may grow by one).
    inode_file: crate::metafiles::MetaBlocks,
    table_file: MetaFile,
}

/// Plan and carry out the repair. On success every correctable problem is fixed.
pub fn run(
    f: &Findings,
    r: &dyn MetadataReader,
    w: &dyn MetadataWriter,
    problems: &mut [Problem],
    cancel: &AtomicBool,
    progress: &dyn Progress,
) -> Result<(), FsckError> {
    progress.update(Phase::Repair, 0, STEPS);
    if cancel.load(Ordering::Relaxed) {
        return Err(FsckError::Cancelled {
            during_repair: false,
        });
    }
    let plan = plan(f, r, problems)?;
    execute(f, w, plan, cancel, progress)?;
    for p in problems.iter_mut() {
        p.fixed = p.correctable;
    }
    Ok(())
}

fn read_inode(f: &Findings, r: &dyn MetadataReader, ino: u64) -> Result<Inode, FsckError> {
    let l = &f.l;
    let da = l
        .inode_da(&f.meta.inode_file, ino)
        .ok_or_else(|| FsckError::Unusable(format!("inode {ino} lies past the inode file")))?;
    let mut buf = vec![0u8; l.inode_bytes() as usize];
    r.read(da, &mut buf, BufferType::Inode, ino)
        .map_err(|e| FsckError::Disk {
            what: format!("reading inode {ino} for its repair"),
            source: e,
        })?;
    // The scan decoded it; a failure now means the disk changed under fsck.
    Inode::decode(&buf, l.geo.inode_bytes, ino, Location::Disk(da)).map_err(|e| {
        FsckError::Unusable(format!(
            "inode {ino} changed since it was checked ({e}); is the file system mounted somewhere?"
        ))
    })
}

fn no_space(what: &str) -> FsckError {
    FsckError::Unusable(format!(
        "no free space left for the repair ({what}); nothing was written. Add a disk or free space and run fsck again"
    ))
}

fn plan(f: &Findings, r: &dyn MetadataReader, problems: &mut [Problem]) -> Result<Plan, FsckError> {
    let l = &f.l;
    let desc = &l.desc;
    let m = desc.metadata_inodes;
    let ns = &f.ns;
    let t = now();
    let mut busy = f.claims.clone();
    busy.union_with(&maps::ondisk_alloc(l, &f.meta));
    let mut alloc = RepairAllocator::new(l, busy);
    let mut plan = Plan {
        step0: Vec::new(),
        map_inodes: Vec::new(),
        new_blocks: Vec::new(),
        indirect_updates: Vec::new(),
        inodes: Vec::new(),
        zero: Vec::new(),
        final_bits: Bitmap::new(l),
        final_inodes: BTreeSet::new(),
        alloc_file: f.meta.alloc.clone(),
        imap_file: f.meta.imap.clone(),
        table_file: f.meta.table.clone(),
        inode_file: f.meta.inode_file.clone(),
    };
    // 0. Descriptor copies, disk headers.
    let mut new_desc = desc.clone();
    let mut rewrite_descriptor: BTreeSet<u32> = f.rewrite_descriptor.iter().copied().collect();
    if f.mark_clean {
        new_desc.mounted = false;
        new_desc.generation += 1;
        rewrite_descriptor.extend(desc.descriptor_disks.iter().copied());
    }
    let dbytes = new_desc
        .encode()
        .map_err(|e| FsckError::Unusable(format!("the descriptor cannot be encoded: {e}")))?;
    for &d in &rewrite_descriptor {
        plan.step0
            .push((descriptor_da(d), dbytes.clone(), BufferType::Descriptor));
    }
    for &d in &f.rewrite_header {
        plan.step0.push((
            DiskAddress::new(d, 0),
            expected_header(desc, &desc.disks[d as usize]).encode(),
            BufferType::DiskHeader,
        ));
    }
    // 1. Metadata files: recreated ones get new blocks; damaged log headers a clean one.
    let mut recreated: BTreeSet<u64> = BTreeSet::new();
    // `only`: the blocks to allocate of a sparse file (the inode map), the rest holes.
    let new_meta = |file: &mut MetaFile,
                    alloc: &mut RepairAllocator,
                    plan: &mut Plan,
                    only: Option<BTreeSet<u64>>|
     -> Result<Inode, FsckError> {
        let n = file.bytes.div_ceil(l.block_bytes);
        let mut units = BTreeMap::new();
        let which: Vec<u64> = match only {
            Some(set) => set.into_iter().filter(|b| *b < n).collect(),
            None => (0..n).collect(),
        };
        for b in which {
            units.insert(
                b,
                alloc
                    .allocate(Use::Metadata, l.spb as u32)
                    .ok_or_else(|| no_space("a metadata file block"))?,
            );
        }
        let tree = build_tree(l, alloc, file.ino, &units).map_err(|e| no_space(&e))?;
        let mut inode = Inode::new(file.ino, S_IFREG);
        inode.flags = FLAG_SYSTEM;
        inode.nlink = 1;
        (inode.atime, inode.mtime, inode.ctime, inode.crtime) = (t, t, t, t);
        inode.size = n * l.block_bytes;
        inode.subblocks =
            units.len() as u64 * l.spb + tree.indirect.len() as u64 * l.indirect_subblocks() as u64;
        inode.depth = tree.depth;
        inode.content = InodeContent::Pointers(tree.pointers);
        for &da in units.values() {
            plan.final_bits.set_extent(l, da, l.spb as u32);
        }
        for &da in &tree.indirect {
            plan.final_bits.set_extent(l, da, l.indirect_subblocks());
        }
        plan.new_blocks.extend(tree.writes);
        let mut blocks = crate::metafiles::MetaBlocks::new(n);
        for (b, da) in units {
            blocks.set(b, da);
        }
        file.blocks = Some(blocks);
        Ok(inode)
    };
    if plan.alloc_file.blocks.is_none() {
        let mut file = plan.alloc_file.clone();
        let inode = new_meta(&mut file, &mut alloc, &mut plan, None)?;
        plan.map_inodes.push(inode);
        plan.alloc_file = file;
        recreated.insert(m.block_alloc_map);
    }
    if plan.imap_file.blocks.is_none() {
        let mut file = plan.imap_file.clone();
        // Sparse: the blocks of the segments with numbers in use (and the reserved
        // ones, in block 0); every other segment is blank, a hole.
        let per = desc.inodes_per_segment;
        let bbu = desc.geometry.block_bytes;
        let mut only: BTreeSet<u64> = BTreeSet::from([0]);
        for r in f.recs.iter().filter(|r| r.live()) {
            only.insert(
                mako_format::inode_map_segment::slot_offset(r.ino / per as u64, per, bbu)
                    / bbu as u64,
            );
        }
        let inode = new_meta(&mut file, &mut alloc, &mut plan, Some(only))?;
        plan.map_inodes.push(inode);
        plan.imap_file = file;
        recreated.insert(m.inode_alloc_map);
    }
    if plan.table_file.blocks.is_none() {
        // A new, empty log table: every node makes a new log at its next mount (the old
        // logs, unreachable now, are reclaimed with everything else nothing claims).
        let mut file = plan.table_file.clone();
        let inode = new_meta(&mut file, &mut alloc, &mut plan, None)?;
        for (_, da) in file.blocks.iter().flat_map(|b| b.iter()) {
            plan.new_blocks
                .push((da, vec![0u8; l.block_bytes as usize], BufferType::Log));
        }
        plan.map_inodes.push(inode);
        plan.table_file = file;
        recreated.insert(m.log_table);
    }
    for log in &f.meta.logs {
        let file = log.file.clone();
        if file.blocks.is_none() {
            // A log fsck cannot read: its entry goes (first the entry, which is what
            // makes the log exist, then its inode slot); its blocks, claimed by
            // nothing, are freed with the rest.
            if !log.entry_da.is_null()
                && plan.table_file.blocks.is_some()
                && !recreated.contains(&m.log_table)
            {
                plan.step0.push((
                    log.entry_da,
                    vec![0u8; mako_format::log_table::LOG_ENTRY_BYTES as usize],
                    BufferType::Log,
                ));
            }
            continue;
        }
        if log.rewrite_header || f.mark_clean {
            // An empty log (tail = head: clean, or just replayed) keeps its LSN, and
            // nothing in it can match the LSN it expects next. Otherwise (no valid
            // header, a recreated file) the whole log is zeroed: its records are lost
            // either way, and none may be found by a later replay.
            let keep = log
                .header
                .as_ref()
                .filter(|h| log.file.blocks.is_some() && h.tail_lsn == h.head_lsn);
            let lsn = log
                .header
                .as_ref()
                .map(|h| h.head_lsn.max(h.tail_lsn))
                .unwrap_or(0);
            let header = LogHeader {
                node: log.node,
                log_bytes: desc.log_bytes,
                tail_lsn: lsn,
                head_lsn: lsn,
                clean: true,
            };
            let hb = header.encode();
            let blocks = file
                .blocks
                .clone()
                .ok_or_else(|| FsckError::Unusable("a recreated log has no blocks".into()))?;
            let whole = keep.is_none();
            for (b, da) in blocks.iter() {
                if b > 0 && !whole {
                    break;
                }
                let len = if whole {
                    l.block_bytes
                } else {
                    LOG_RECORDS_OFFSET
                };
                let mut area = vec![0u8; len as usize];
                if b == 0 {
                    for off in LOG_HEADER_COPY_OFFSETS {
                        area[off as usize..off as usize + hb.len()].copy_from_slice(&hb);
                    }
                }
                plan.step0.push((da, area, BufferType::Log));
            }
        }
    }
    // The inode file grows by a zeroed block when /lost+found needs a slot and none
    // is free; the inode file's own inode is written first in step 3.
    let mut first_inodes = Vec::new(); // grown inode file, new /lost+found, recreated root
    if ns.grow_inode_file {
        let rec0 = &f.recs[find(&f.recs, m.inode_file)
            .ok_or_else(|| FsckError::Unusable("the inode file's inode was not scanned".into()))?];
        let mut units: BTreeMap<u64, DiskAddress> = rec0
            .extents
            .iter()
            .filter_map(|e| {
                if let Piece::Unit(u) = e.piece {
                    Some((u, e.da))
                } else {
                    None
                }
            })
            .collect();
        // The new block goes past the file's end (the first slot of the block is what
        // the namespace plan chose: `slots`), holes before it staying holes.
        let n = plan.inode_file.len_blocks();
        let have = units.len() as u64;
        let new = alloc
            .allocate(Use::Metadata, l.spb as u32)
            .ok_or_else(|| no_space("a new inode-file block"))?;
        plan.new_blocks
            .push((new, vec![0u8; l.block_bytes as usize], BufferType::Inode));
        units.insert(n, new);
        let tree = build_tree(l, &mut alloc, m.inode_file, &units).map_err(|e| no_space(&e))?;
        let mut inode0 = read_inode(f, r, m.inode_file)?;
        inode0.content = InodeContent::Pointers(tree.pointers);
        inode0.depth = tree.depth;
        inode0.size = (n + 1) * l.block_bytes;
        inode0.subblocks =
            (have + 1) * l.spb + tree.indirect.len() as u64 * l.indirect_subblocks() as u64;
        for &da in units.values() {
            plan.final_bits.set_extent(l, da, l.spb as u32);
        }
        for &da in &tree.indirect {
            plan.final_bits.set_extent(l, da, l.indirect_subblocks());
        }
        plan.new_blocks.extend(tree.writes);
        plan.inode_file.set(n, new);
        recreated.insert(m.inode_file);
        plan.final_inodes.insert(m.inode_file);
        first_inodes.push(inode0);
    }
    // 2. Cross-links: copies, or holes when there is no space.
    let mut repoint: BTreeMap<u64, Vec<(Piece, Option<DiskAddress>)>> = BTreeMap::new();
    for cf in &f.cross {
        let rec = &f.recs[find(&f.recs, cf.ino).expect("cross-link owner")];
        let e = rec.extents[cf.extent];
        let target = if cf.cut {
            None
        } else {
            match alloc.allocate(Use::Data, e.subblocks) {
                Some(new) => {
                    let mut buf = vec![0u8; (e.subblocks as u64 * l.sb_bytes) as usize];
                    r.read(e.da, &mut buf, BufferType::Data, cf.ino)
                        .map_err(|err| FsckError::Disk {
                            what: format!("reading the cross-linked block at {} to copy it", e.da),
                            source: err,
                        })?;
                    plan.new_blocks.push((new, buf, BufferType::Data));
                    problems[cf.problem].repair = format!(
                        "{}; the copy is at {new}",
                        problems[cf.problem]
                            .repair
                            .replace(" (a hole if no space is left)", "")
                    );
                    Some(new)
                }
                None => {
                    problems[cf.problem].repair = format!(
                        "no space left for a copy: cut inode {}'s pointer ({:?} becomes a hole)",
                        cf.ino, e.piece
                    );
                    None
                }
            }
        };
        repoint.entry(cf.ino).or_default().push((e.piece, target));
    }
    // 3. Files and directories.
    // Inodes freed or cleared; a slot the new /lost+found reuses is not among them:
    // its new inode overwrites it, and its old blocks are dropped with the old inode.
    let freed: BTreeSet<u64> = ns
        .free
        .iter()
        .chain(&ns.clear)
        .copied()
        .filter(|&i| Some(i) != ns.create_lost_found)
        .collect();
    let mut file_inodes = Vec::new();
    let mut dir_inodes = Vec::new();
    let mut built_dirs: BTreeSet<u64> = BTreeSet::new();
    for (&d, entries) in &ns.dirs {
        if freed.contains(&d) {
            continue;
        }
        let fresh = (d == m.root_dir && ns.recreate_root) || Some(d) == ns.create_lost_found;
        let mut inode = if fresh {
            let mode = if d == m.root_dir {
                S_IFDIR | 0o755
            } else {
                LOST_FOUND_MODE
            };
            let mut i = Inode::new(d, mode);
            (i.atime, i.mtime, i.ctime, i.crtime) = (t, t, t, t);
            i
        } else {
            read_inode(f, r, d)?
        };
        let room = inline_room(l, &inode);
        let built = build_dir(l, &mut alloc, d, entries.clone(), room).map_err(|e| no_space(&e))?;
        // Its attributes outside the inode stay (rebuilt if damaged).
        let xattrs = match find(&f.recs, d).map(|i| &f.recs[i]) {
            Some(rec) if !fresh => {
                let changes = repoint.get(&d).map_or(&[][..], |v| v.as_slice());
                xattrs_after(
                    l,
                    r,
                    &mut alloc,
                    &mut plan.new_blocks,
                    &mut inode,
                    rec,
                    changes,
                )
            }
            _ => Vec::new(),
        };
        inode.content = built.content;
        inode.size = built.size;
        inode.depth = built.depth;
        inode.last_block_subblocks = 0;
        inode.subblocks = built.subblocks + xattrs.iter().map(|e| e.subblocks as u64).sum::<u64>();
        for e in &xattrs {
            plan.final_bits.set_extent(l, e.da, e.subblocks);
        }
        inode.entries = built.entries;
        if let Some(&n) = ns.nlink.get(&d) {
            inode.nlink = n;
        }
        if let Some(&p) = ns.parent.get(&d) {
            inode.parent = p;
        }
        if let Some(rec) = find(&f.recs, d).map(|i| &f.recs[i]) {
            if rec.fixes().contains(&Fix::ClearSystemFlag) {
                inode.flags &= !FLAG_SYSTEM;
            }
        }
        for &(da, n) in &built.extents {
            plan.final_bits.set_extent(l, da, n);
        }
        plan.new_blocks.extend(built.writes);
        plan.final_inodes.insert(d);
        built_dirs.insert(d);
        if fresh {
            first_inodes.push(inode);
        } else {
            dir_inodes.push(inode);
        }
    }
    for rec in &f.recs {
        if rec.system {
            if !recreated.contains(&rec.ino) {
                for e in &rec.extents {
                    plan.final_bits.set_extent(l, e.da, e.subblocks);
                }
                plan.final_inodes.insert(rec.ino);
            }
            continue;
        }
        if !rec.live() || freed.contains(&rec.ino) || built_dirs.contains(&rec.ino) {
            continue;
        }
        if rec.ino == m.root_dir && ns.recreate_root {
            continue;
        }
        plan.final_inodes.insert(rec.ino);
        let changes = repoint.get(&rec.ino);
        let needs = !rec.lost().is_empty()
            || changes.is_some()
            || !rec.fixes().is_empty()
            || rec.xattr_damage().is_some()
            || ns.nlink.contains_key(&rec.ino)
            || ns.parent.contains_key(&rec.ino);
        if !needs {
            for e in &rec.extents {
                plan.final_bits.set_extent(l, e.da, e.subblocks);
            }
            continue;
        }
        let mut inode = read_inode(f, r, rec.ino)?;
        let mut extents: Vec<Extent> = rec.extents.clone();
        for fix in rec.fixes() {
            match *fix {
                Fix::Depth(d) => inode.depth = d,
                Fix::Size(s) => inode.size = s,
                Fix::Subblocks(s) => inode.subblocks = s,
                Fix::LastBlockSubblocks(n) => inode.last_block_subblocks = n,
                Fix::Entries(n) => inode.entries = n,
                Fix::ClearSystemFlag => inode.flags &= !FLAG_SYSTEM,
                Fix::EmptySpecial => {
                    inode.content = InodeContent::InlineData(Vec::new());
                    // Its data goes; its attributes (and their blocks) stay.
                    extents.retain(|e| e.piece.is_xattr());
                    (
                        inode.size,
                        inode.subblocks,
                        inode.depth,
                        inode.last_block_subblocks,
                    ) = (0, extents.iter().map(|e| e.subblocks as u64).sum(), 0, 0);
                }
            }
        }
        let changes = changes.map_or(&[][..], |v| v.as_slice());
        if !rec.lost().is_empty() || changes.iter().any(|(p, _)| !p.is_xattr()) {
            let edits = edit_tree(f, r, &mut inode, rec, changes, &mut plan.indirect_updates)?;
            extents = edits;
            inode.subblocks = extents.iter().map(|e| e.subblocks as u64).sum();
        }
        let xattrs = xattrs_after(
            l,
            r,
            &mut alloc,
            &mut plan.new_blocks,
            &mut inode,
            rec,
            changes,
        );
        extents.retain(|e| !e.piece.is_xattr());
        extents.extend(xattrs);
        inode.subblocks = extents.iter().map(|e| e.subblocks as u64).sum();
        if let Some(&n) = ns.nlink.get(&rec.ino) {
            inode.nlink = n;
        }
        if let Some(&p) = ns.parent.get(&rec.ino) {
            if is_dir(inode.mode) {
                inode.parent = p;
            }
        }
        for e in &extents {
            plan.final_bits.set_extent(l, e.da, e.subblocks);
        }
        file_inodes.push(inode);
    }
    if let Some(lf) = ns.create_lost_found {
        plan.final_inodes.insert(lf);
    }
    if ns.recreate_root {
        plan.final_inodes.insert(m.root_dir);
    }
    plan.inodes.extend(first_inodes);
    plan.inodes.extend(file_inodes);
    plan.inodes.extend(dir_inodes);
    plan.zero = freed.into_iter().collect();
    Ok(plan)
}

/// The extents of `inode`'s attributes outside it after the repair: its current ones,
/// or — when blocks are damaged or a cross-link took one (`changes`) — new blocks
/// holding the attributes still whole, with `inode.xattr_index` set to their index (or
/// NULL: nothing to keep, or no space left for them).
fn xattrs_after(
    l: &Layout,
    r: &dyn MetadataReader,
    alloc: &mut RepairAllocator,
    new_blocks: &mut Vec<BlockWrite>,
    inode: &mut Inode,
    rec: &InodeRec,
    changes: &[(Piece, Option<DiskAddress>)],
) -> Vec<Extent> {
    let current: Vec<Extent> = rec
        .extents
        .iter()
        .filter(|e| e.piece.is_xattr())
        .copied()
        .collect();
    // Metadata pieces of a cross-link are only ever cut, never copied.
    let cut: Vec<u32> = changes
        .iter()
        .filter_map(|(p, _)| match p {
            Piece::XattrBlock(k) => Some(*k),
            _ => None,
        })
        .collect();
    let damage = if changes.iter().any(|(p, _)| *p == Piece::XattrIndex) {
        XattrDamage::IndexLost
    } else {
        match rec.xattr_damage() {
            Some(d) => d.clone(),
            None if !cut.is_empty() => XattrDamage::Blocks(Vec::new()),
            None => return current,
        }
    };
    let (keep, _lost) = xattr_check::survivors(l, r, inode, &damage, &cut);
    match xattr_check::rebuild(l, alloc, inode.ino, &keep) {
        Some((index, writes, extents)) => {
            inode.xattr_index = index;
            new_blocks.extend(writes);
            extents
        }
        None => {
            inode.xattr_index = DiskAddress::NULL;
            Vec::new()
        }
    }
}

/// Apply cut pointers and new targets to an inode's tree; return its extents after.
fn edit_tree(
    f: &Findings,
    r: &dyn MetadataReader,
    inode: &mut Inode,
    rec: &InodeRec,
    changes: &[(Piece, Option<DiskAddress>)],
    updates: &mut Vec<BlockWrite>,
) -> Result<Vec<Extent>, FsckError> {
    let l = &f.l;
    let depth = inode.depth;
    let mut blocks: BTreeMap<(u8, u64), (DiskAddress, IndirectBlock)> = BTreeMap::new();
    for e in &rec.extents {
        if let Piece::Indirect(level, index) = e.piece {
            let mut buf = vec![0u8; l.geo.indirect_bytes as usize];
            r.read(e.da, &mut buf, BufferType::Indirect, rec.ino)
                .map_err(|err| FsckError::Disk {
                    what: format!(
                        "reading an indirect block of inode {} for its repair",
                        rec.ino
                    ),
                    source: err,
                })?;
            let b = IndirectBlock::decode(
                &buf,
                l.geo.indirect_bytes,
                IndirectId {
                    ino: rec.ino,
                    level,
                    index,
                },
                Location::Disk(e.da),
            )
            .map_err(|err| {
                FsckError::Unusable(format!(
                    "inode {}'s indirect block changed since it was checked ({err})",
                    rec.ino
                ))
            })?;
            blocks.insert((level, index), (e.da, b));
        }
    }
    let mut dirty: BTreeSet<(u8, u64)> = BTreeSet::new();
    let mut set = |level: u8, index: u64, value: DiskAddress, inode: &mut Inode| {
        if level == depth {
            if let InodeContent::Pointers(p) = &mut inode.content {
                if let Some(slot) = p.get_mut(index as usize) {
                    *slot = value;
                }
            }
        } else if let Some((_, b)) = blocks.get_mut(&(level + 1, index / l.ppi)) {
            b.pointers[(index % l.ppi) as usize] = value;
            dirty.insert((level + 1, index / l.ppi));
        }
    };
    let mut cuts: Vec<(u8, u64)> = rec.lost().iter().map(|x| (x.level, x.index)).collect();
    let mut moved: BTreeMap<(u8, u64), DiskAddress> = BTreeMap::new();
    for &(piece, target) in changes {
        let (level, index) = match piece {
            Piece::Unit(u) => (0, u),
            Piece::Indirect(lv, i) => (lv, i),
            // Not part of the tree: rebuilt by the caller.
            Piece::XattrIndex | Piece::XattrBlock(_) => continue,
        };
        match target {
            Some(new) => {
                set(level, index, new, inode);
                moved.insert((level, index), new);
            }
            None => cuts.push((level, index)),
        }
    }
    for &(level, index) in &cuts {
        set(level, index, DiskAddress::NULL, inode);
    }
    let mut out = Vec::new();
    for e in &rec.extents {
        let (level, index) = match e.piece {
            Piece::Unit(u) => (0, u),
            Piece::Indirect(lv, i) => (lv, i),
            Piece::XattrIndex | Piece::XattrBlock(_) => {
                out.push(*e);
                continue;
            }
        };
        if cuts
            .iter()
            .any(|&(cl, ci)| is_under(l, cl, ci, level, index))
        {
            continue;
        }
        let da = moved.get(&(level, index)).copied().unwrap_or(e.da);
        out.push(Extent { da, ..*e });
    }
    for key in dirty {
        if cuts
            .iter()
            .any(|&(cl, ci)| is_under(l, cl, ci, key.0, key.1))
        {
            continue; // cut away: nothing points at it any more
        }
        let (da, b) = &blocks[&key];
        updates.push((*da, b.encode(l.geo.indirect_bytes), BufferType::Indirect));
    }
    Ok(out)
}

fn execute(
    f: &Findings,
    w: &dyn MetadataWriter,
    mut plan: Plan,
    cancel: &AtomicBool,
    progress: &dyn Progress,
) -> Result<(), FsckError> {
    let l = &f.l;
    let write = |da: DiskAddress, bytes: &[u8], what: BufferType, ino: u64, step: u32| {
        w.write(da, bytes, what, ino).map_err(|e| FsckError::Disk {
            what: format!(
                "repair step {step} failed writing {} bytes at {da}; steps before it are on disk and the file system is \
                 no worse than before: fix the disk and run `mako fsck -y` again",
                bytes.len()
            ),
            source: e,
        })
    };
    let sync = |step: u32| {
        w.sync().map_err(|e| FsckError::Disk {
            what: format!("repair step {step}: sync failed; run `mako fsck -y` again"),
            source: e,
        })
    };
    let checkpoint = |step: u64| -> Result<(), FsckError> {
        progress.update(Phase::Repair, step, STEPS);
        if cancel.load(Ordering::Relaxed) {
            return Err(FsckError::Cancelled {
                during_repair: true,
            });
        }
        Ok(())
    };
    let write_inode = |inode: &Inode, step: u32| -> Result<(), FsckError> {
        let da = l.inode_da(&plan.inode_file, inode.ino).ok_or_else(|| {
            FsckError::Unusable(format!("inode {} lies past the inode file", inode.ino))
        })?;
        let bytes = inode.encode(l.geo.inode_bytes).map_err(|e| {
            FsckError::Unusable(format!("inode {} cannot be encoded: {e}", inode.ino))
        })?;
        write(da, &bytes, BufferType::Inode, inode.ino, step)
    };
    // Step 0.
    for (da, bytes, what) in &plan.step0 {
        write(*da, bytes, *what, 0, 0)?;
    }
    sync(0)?;
    checkpoint(1)?;
    // Step 1: the union of what the maps say, what is claimed and what is new.
    let ondisk = maps::ondisk_alloc(l, &f.meta);
    let mut union = f.claims.clone();
    union.union_with(&ondisk);
    union.union_with(&plan.final_bits);
    let mut union_inodes: BTreeSet<u64> = plan.final_inodes.clone();
    for r in &f.recs {
        if r.live() {
            union_inodes.insert(r.ino);
        }
    }
    let per = l.desc.inodes_per_segment as u64;
    for (&s, seg) in f.meta.imap_segments.segments.iter() {
        for (wi, &word) in seg.iter().flat_map(|x| x.bitmap.iter()).enumerate() {
            let mut bits = word;
            while bits != 0 {
                let b = bits.trailing_zeros() as u64;
                bits &= bits - 1;
                union_inodes.insert(s * per + wi as u64 * 64 + b);
            }
        }
    }
    write_maps(f, &plan, &union, &union_inodes, 1, &write)?;
    for inode in &plan.map_inodes {
        write_inode(inode, 1)?;
    }
    sync(1)?;
    checkpoint(2)?;
    // Step 2: new blocks.
    for (da, bytes, what) in &plan.new_blocks {
        write(*da, bytes, *what, 0, 2)?;
    }
    sync(2)?;
    checkpoint(3)?;
    // Step 3: pointer switches.
    for (da, bytes, what) in &plan.indirect_updates {
        write(*da, bytes, *what, 0, 3)?;
    }
    for inode in &plan.inodes {
        write_inode(inode, 3)?;
    }
    sync(3)?;
    checkpoint(4)?;
    // Step 4: cleared and freed inodes.
    let blank = vec![0u8; l.inode_bytes() as usize];
    for &ino in &plan.zero {
        if let Some(da) = l.inode_da(&plan.inode_file, ino) {
            write(da, &blank, BufferType::Inode, ino, 4)?;
        }
    }
    sync(4)?;
    checkpoint(5)?;
    // Step 5: the maps as they must be.
    let final_bits = std::mem::replace(&mut plan.final_bits, Bitmap::new(l));
    let final_inodes = std::mem::take(&mut plan.final_inodes);
    write_maps(f, &plan, &final_bits, &final_inodes, 5, &write)?;
    sync(5)?;
    progress.update(Phase::Repair, STEPS, STEPS);
    Ok(())
}

/// A write of the repair: address, bytes, buffer type, inode, step.
type WriteFn<'a> = dyn Fn(DiskAddress, &[u8], BufferType, u64, u32) -> Result<(), FsckError> + 'a;

/// Write every map segment whose content differs from what was read.
fn write_maps(
    f: &Findings,
    plan: &Plan,
    bits: &Bitmap,
    inodes: &BTreeSet<u64>,
    step: u32,
    write: &WriteFn,
) -> Result<(), FsckError> {
    let l = &f.l;
    let slot = f.meta.alloc_slot_bytes;
    for seg in maps::alloc_segments(l, bits) {
        let r = seg.region as usize;
        if f.meta.alloc.blocks.is_some()
            && f.meta
                .alloc_segments
                .get(r)
                .is_some_and(|s| s.as_ref() == Some(&seg))
        {
            continue;
        }
        // A segment straddling two blocks is a mako-fs bug reported as uncorrectable.
        let Ok(da) = plan.alloc_file.da(l, r as u64 * slot, slot) else {
            continue;
        };
        write(
            da,
            &seg.encode(slot as usize),
            BufferType::AllocMap,
            plan.alloc_file.ino,
            step,
        )?;
    }
    // The inode map: every segment that must have a number marked, and every segment
    // of a block that exists (which may have to lose its marks). A segment in a hole is
    // blank; one that must be marked there is reported uncorrectable (`compare_imap`).
    let islot = f.meta.imap_slot_bytes;
    let per = l.desc.inodes_per_segment;
    let bbu = l.desc.geometry.block_bytes;
    let mut want = maps::imap_segments(l, inodes);
    for &s in f.meta.imap_segments.segments.keys() {
        want.entry(s)
            .or_insert_with(|| InodeMapSegment::new(s as u32, s * per as u64, per));
    }
    let recreated_file = f.meta.imap.blocks.is_none();
    for (s, seg) in want {
        let on_disk = f.meta.imap_segments.segments.get(&s);
        if !recreated_file {
            match on_disk {
                Some(Some(x)) if *x == seg => continue,
                // A hole: blank on disk; nothing to write if it must be blank.
                None if seg.bitmap.iter().all(|w| *w == 0) => continue,
                _ => {}
            }
        }
        let offset = mako_format::inode_map_segment::slot_offset(s, per, bbu);
        let Ok(da) = plan.imap_file.da(l, offset, islot) else {
            continue;
        };
        write(
            da,
            &seg.encode(),
            BufferType::InodeMap,
            plan.imap_file.ino,
            step,
        )?;
    }
    // Every slot of a recreated file's blocks holds a valid segment.
    if recreated_file {
        if let Some(blocks) = &plan.imap_file.blocks {
            let nseg = mako_fs::inode_map::InodeMap::segment_count(l.desc.inodes_max, per);
            let written = maps::imap_segments(l, inodes);
            for (b, _) in blocks.iter() {
                for s in mako_format::inode_map_segment::segments_in_block(b, nseg, per, bbu) {
                    if written.contains_key(&s) {
                        continue;
                    }
                    let offset = mako_format::inode_map_segment::slot_offset(s, per, bbu);
                    let Ok(da) = plan.imap_file.da(l, offset, islot) else {
                        continue;
                    };
                    let blank = InodeMapSegment::new(s as u32, s * per as u64, per);
                    write(
                        da,
                        &blank.encode(),
                        BufferType::InodeMap,
                        plan.imap_file.ino,
                        step,
                    )?;
                }
            }
        }
    }
    Ok(())
}
