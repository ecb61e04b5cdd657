//! Mounting: open the disks, check their headers, find the descriptor (majority of
//! copies, highest generation), load the metadata files and the allocation maps,
//! start the workers. Unmounting writes everything back and marks the descriptor clean.

use crate::alloc_map::AllocMap;
use crate::coherence::Tokens;
use crate::core::{Core, FsConfig};
use crate::env::NodeEnv;
use crate::error::{FsError, FsResult, IntegrityError};
use crate::fs::FileSystem;
use crate::inode_map::InodeMap;
use crate::meta_blocks::MetaBlocks;
use crate::mkfs::DiskSpec;
use crate::workers::{self, Workers};
use mako_disk::nsd::IoTag;
use mako_disk::{BufferType, Disk, FileDisk, LocalNsd, Nsd};
use mako_format::alloc_segment::AllocSegment;
use mako_format::descriptor::{
    Descriptor, DESCRIPTOR_BYTES_MAX, DESCRIPTOR_OFFSET, RESERVED_BYTES,
};
use mako_format::disk_header::{DiskHeader, DISK_HEADER_BYTES};
use mako_format::error::Location;
use mako_format::geometry::Geometry;
use mako_format::indirect::{IndirectBlock, IndirectId};
use mako_format::inode::{pointers_in_inode, Inode, InodeContent, FLAG_SYSTEM};
use mako_format::inode_map_segment::InodeMapSegment;
use mako_format::DiskAddress;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// Open disk files; a missing, unreadable, read-only or truncated file is refused
/// with a message naming the disk.
pub fn open_disk_files(specs: &[DiskSpec]) -> FsResult<Vec<Arc<dyn Disk>>> {
    let mut out: Vec<Arc<dyn Disk>> = Vec::new();
    for s in specs {
        let d = FileDisk::open(&s.name, &s.path)?;
        if d.size_bytes() < RESERVED_BYTES {
            return Err(FsError::Invalid(format!(
                "disk {} ({}) is truncated: {} bytes, smaller than a disk header",
                s.name,
                s.path.display(),
                d.size_bytes()
            )));
        }
        tracing::info!(
            "disk {} ({}): {} bytes, {}",
            s.name,
            s.path.display(),
            d.size_bytes(),
            if d.is_direct() {
                "direct I/O"
            } else {
                "buffered I/O (the host file system refuses O_DIRECT)"
            }
        );
        out.push(Arc::new(d));
    }
    Ok(out)
}

pub fn write_descriptor(nsd: &dyn Nsd, desc: &Descriptor) -> FsResult<()> {
    let bytes = desc.encode()?;
    for &d in &desc.descriptor_disks {
        nsd.write(
            DiskAddress::new(d, DESCRIPTOR_OFFSET / 512),
            &bytes,
            IoTag {
                buffer_type: BufferType::Descriptor,
                ino: 0,
            },
        )?;
    }
    Ok(())
}

/// Read headers and descriptor copies from open disks (given in any order).
/// Returns the descriptor and the disks ordered by their index in the file system.
pub fn find_descriptor(disks: Vec<Arc<dyn Disk>>) -> FsResult<(Descriptor, Vec<Arc<dyn Disk>>)> {
    let mut headers = Vec::new();
    let mut copies = Vec::new();
    for d in &disks {
        let mut buf = vec![0u8; DISK_HEADER_BYTES];
        d.read_at(&mut buf, 0)?;
        let h = DiskHeader::decode(&buf, Location::Memory).map_err(|e| {
            FsError::Invalid(format!(
                "disk {}: {e}; is it a Mako disk of this file system?",
                d.name()
            ))
        })?;
        let mut dbuf = vec![0u8; DESCRIPTOR_BYTES_MAX];
        d.read_at(&mut dbuf, DESCRIPTOR_OFFSET)?;
        match Descriptor::decode(
            &dbuf,
            Location::Disk(DiskAddress::new(h.disk_index, DESCRIPTOR_OFFSET / 512)),
        ) {
            Ok(desc) => copies.push((h.disk_index, desc)),
            Err(e) if e.kind == mako_format::FormatErrorKind::BadMagic { found: 0 } => {}
            Err(e) => tracing::warn!("disk {}: descriptor copy unusable: {e}", d.name()),
        }
        headers.push(h);
    }
    let best = copies
        .iter()
        .filter(|(_, c)| headers.iter().any(|h| h.fs_uuid == c.fs_uuid))
        .max_by_key(|(_, c)| c.generation)
        .map(|(_, c)| c.clone())
        .ok_or_else(|| FsError::Invalid("no valid file system descriptor on any disk".into()))?;
    best.check_supported().map_err(FsError::Invalid)?;
    let expected = best.descriptor_disks.len();
    let readable = copies
        .iter()
        .filter(|(i, c)| best.descriptor_disks.contains(i) && c.fs_uuid == best.fs_uuid)
        .count();
    if readable * 2 <= expected {
        return Err(FsError::Invalid(format!(
            "only {readable} of {expected} descriptor copies are readable; a majority is needed (disks {:?})",
            best.descriptor_disks
        )));
    }
    let mut ordered: Vec<Option<Arc<dyn Disk>>> = vec![None; best.disks.len()];
    for (h, d) in headers.iter().zip(disks) {
        if h.fs_uuid != best.fs_uuid {
            return Err(FsError::Invalid(format!(
                "disk {} belongs to another file system",
                h.name
            )));
        }
        let idx = h.disk_index as usize;
        if idx >= ordered.len() || ordered[idx].is_some() {
            return Err(FsError::Invalid(format!(
                "disk {} claims index {idx}, which is taken or unknown",
                h.name
            )));
        }
        let entry = &best.disks[idx];
        if d.size_bytes() < entry.size_bytes {
            return Err(FsError::Invalid(format!(
                "disk {} is truncated: {} bytes, the file system uses {}",
                entry.name,
                d.size_bytes(),
                entry.size_bytes
            )));
        }
        ordered[idx] = Some(d);
    }
    let mut out = Vec::new();
    for (i, d) in ordered.into_iter().enumerate() {
        out.push(d.ok_or_else(|| {
            FsError::Invalid(format!(
                "disk {} (index {i}) of file system {} is missing",
                best.disks[i].name, best.fs_name
            ))
        })?);
    }
    Ok((best, out))
}

pub fn read_descriptor(specs: &[DiskSpec]) -> FsResult<Descriptor> {
    Ok(find_descriptor(open_disk_files(specs)?)?.0)
}

/// Every block address of a metadata file, by walking its inode's block map directly.
/// Holes are refused except in the inode file (`collect_blocks_sparse`).
pub fn collect_blocks(nsd: &dyn Nsd, geo: &Geometry, inode: &Inode) -> FsResult<Vec<DiskAddress>> {
    let m = collect_blocks_with(nsd, geo, inode, false)?;
    Ok((0..m.len()).map(|b| m[b]).collect())
}

/// `collect_blocks` of the inode file and the inode allocation map, which grow
/// sparsely: each node hands out numbers from its own inode-map segments, and only
/// the blocks that hold numbers in use exist. The walk reads only the indirect blocks
/// that exist: it costs what is allocated, not the file's size.
pub fn collect_blocks_sparse(nsd: &dyn Nsd, geo: &Geometry, inode: &Inode) -> FsResult<MetaBlocks> {
    collect_blocks_with(nsd, geo, inode, true)
}

fn collect_blocks_with(
    nsd: &dyn Nsd,
    geo: &Geometry,
    inode: &Inode,
    holes: bool,
) -> FsResult<MetaBlocks> {
    let nblocks = inode.size.div_ceil(geo.block_bytes as u64);
    let bad = |what: String| {
        FsError::integrity(
            IntegrityError::new("metadata file", format!("{what}; run `mako fsck`")).ino(inode.ino),
        )
    };
    let ptrs = match &inode.content {
        InodeContent::Pointers(p) => p.clone(),
        _ => return Err(bad("it has no block pointers".into())),
    };
    // Its blocks are read, and offsets within them computed, before any allocation map
    // exists to check them against: each must lie whole on a disk the NSD has.
    let check = |ptr: DiskAddress, bytes: u64| -> FsResult<()> {
        let fits = (ptr.disk() as usize) < nsd.disk_count()
            && nsd.disk_size(ptr.disk()).is_ok_and(|size| {
                ptr.byte_offset()
                    .checked_add(bytes)
                    .is_some_and(|end| end <= size)
            });
        if fits || ptr.is_null() {
            Ok(())
        } else {
            Err(bad(format!(
                "a block pointer to {ptr} ({bytes} bytes) lies outside every disk"
            )))
        }
    };
    let ppi = geo.pointers_per_indirect();
    let mut out = MetaBlocks::new(nblocks);
    #[allow(clippy::too_many_arguments)]
    fn walk(
        nsd: &dyn Nsd,
        geo: &Geometry,
        ino: u64,
        level: u8,
        index: u64,
        ptr: DiskAddress,
        ppi: u64,
        out: &mut MetaBlocks,
        want: u64,
        check: &dyn Fn(DiskAddress, u64) -> FsResult<()>,
    ) -> FsResult<()> {
        // `index` is the first block the pointer covers times ppi^level's inverse: the
        // subtree covers blocks [index * ppi^level, (index + 1) * ppi^level).
        let first = index.saturating_mul(ppi.saturating_pow(level as u32));
        if first >= want || ptr.is_null() {
            return Ok(());
        }
        if level == 0 {
            check(ptr, geo.block_bytes as u64)?;
            out.set(index, ptr);
            return Ok(());
        }
        check(ptr, geo.indirect_bytes as u64)?;
        let mut buf = vec![0u8; geo.indirect_bytes as usize];
        nsd.read(
            ptr,
            &mut buf,
            IoTag {
                buffer_type: BufferType::Indirect,
                ino,
            },
        )?;
        let id = IndirectId { ino, level, index };
        let blk = IndirectBlock::decode(&buf, geo.indirect_bytes, id, Location::Disk(ptr))?;
        for (j, p) in blk.pointers.iter().enumerate() {
            walk(
                nsd,
                geo,
                ino,
                level - 1,
                index * ppi + j as u64,
                *p,
                ppi,
                out,
                want,
                check,
            )?;
        }
        Ok(())
    }
    for (i, p) in ptrs
        .iter()
        .enumerate()
        .take(pointers_in_inode(geo.inode_bytes))
    {
        walk(
            nsd,
            geo,
            inode.ino,
            inode.depth,
            i as u64,
            *p,
            ppi,
            &mut out,
            nblocks,
            &check,
        )?;
    }
    if !holes && (out.allocated() as u64) < nblocks {
        return Err(bad("it has holes in its block map".into()));
    }
    Ok(out)
}

/// A mounted file system and its workers.
pub struct Mounted {
    pub fs: FileSystem,
    /// What the recovery log replay at mount found and did.
    pub recovery: crate::recovery::ReplayReport,
    workers: Option<Workers>,
    unmounted: bool,
}

impl Mounted {
    pub fn core(&self) -> &Arc<Core> {
        &self.fs.core
    }

    /// Write everything back, empty the log, mark the descriptor clean and stop the
    /// workers.
    pub fn unmount(mut self) -> FsResult<()> {
        self.unmount_inner()
    }

    fn unmount_inner(&mut self) -> FsResult<()> {
        if self.unmounted {
            return Ok(());
        }
        self.unmounted = true;
        let core = self.fs.core.clone();
        if core.read_only.load(Ordering::Relaxed) {
            // Nothing more may be written; what the log holds is replayed at the next mount.
            if let Some(mut w) = self.workers.take() {
                w.stop();
            }
            return Ok(());
        }
        workers::sync_all(&core)?;
        if let Some(mut w) = self.workers.take() {
            w.stop();
        }
        workers::sync_all(&core)?;
        if !core.read_only.load(Ordering::Relaxed) {
            // Everything in place, the log empty and marked clean: nothing to replay.
            core.journal.checkpoint(&core)?;
            if crate::ownership::shared(&core) {
                // Frees in other nodes' space, checkpointed now, go to them; what this
                // node freed for itself meanwhile is checkpointed too. Then its space
                // is free for others to take.
                if let Err(e) = crate::ownership::deliver_frees(&core) {
                    tracing::warn!("unmount: frees in other nodes' space not delivered ({e}); fsck reclaims them");
                }
                // Delivering frees may have taken regions nobody owned and freed there;
                // `release_all` commits and checkpoints that before the regions go.
                crate::ownership::release_all(&core)?;
            }
            let head = core.journal.head_lsn();
            core.journal.write_header(&core, head, head, true)?;
            let mut desc = core.desc.lock();
            desc.mounted = false;
            desc.generation += 1;
            write_descriptor(core.nsd.as_ref(), &desc)?;
        }
        core.nsd.sync_all()?;
        Ok(())
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        if !self.unmounted {
            // Dropped without unmount (a test that failed): stop the threads, write
            // nothing further — like a crash.
            if let Some(mut w) = self.workers.take() {
                w.stop();
            }
        }
    }
}

pub fn mount(specs: &[DiskSpec], cfg: FsConfig, node: u32) -> FsResult<Mounted> {
    mount_disks(open_disk_files(specs)?, cfg, node)
}

/// Mount as a single-node cluster: this node is its own token manager and
/// file-system manager (through the same in-process services a cluster uses).
pub fn mount_disks(disks: Vec<Arc<dyn Disk>>, cfg: FsConfig, node: u32) -> FsResult<Mounted> {
    mount_node(disks, cfg, NodeEnv::single_node(node))
}

/// This node's token client, offered as its `TokenClient` service.
pub fn node_tokens(env: &NodeEnv) -> Tokens {
    let client = mako_token::TokenClient::new(
        env.node_id(),
        env.transport.clone(),
        env.managers.clone(),
        mako_token::TokenClientLimits::default(),
    );
    if let Some(reg) = &env.registry {
        reg.register(
            env.node_id(),
            mako_rt::ServiceId::TokenClient,
            client.service(),
        );
    }
    Tokens::new(env.fs_index, client)
}

/// Mount one node of a file system whose disks it shares with others (`env` says who
/// it is and how it reaches the cluster's services).
pub fn mount_node(disks: Vec<Arc<dyn Disk>>, cfg: FsConfig, env: NodeEnv) -> FsResult<Mounted> {
    let node = env.node;
    // Every disk behind the file system's panic on this node (`core::FsPanic`).
    let fs_panic = Arc::new(crate::core::FsPanic::default());
    let disks: Vec<Arc<dyn Disk>> = disks
        .into_iter()
        .map(|inner| {
            Arc::new(crate::core::PanicFence {
                inner,
                panic: fs_panic.clone(),
            }) as Arc<dyn Disk>
        })
        .collect();
    let (mut desc, disks) = find_descriptor(disks)?;
    if node >= desc.metadata_inodes.log_count {
        return Err(crate::recovery::node_out_of_range(&desc, node));
    }
    let geo = desc.geometry;
    let nsd: Arc<dyn Nsd> = Arc::new(LocalNsd::new(disks, cfg.iohist_size));
    let tag = |bt, ino| IoTag {
        buffer_type: bt,
        ino,
    };
    // 0. Replay the recovery log before anything reads metadata in place.
    let mut recovery = crate::recovery::replay(nsd.as_ref(), &desc, node)?;
    if recovery.absent {
        // A log made now starts at an LSN no earlier log of this node can have reached
        // (its blocks may be those of a log fsck removed, transactions and all).
        let lsn = fresh_log_lsn(env.clock.wall(), desc.log_bytes);
        recovery.tail_lsn = lsn;
        recovery.head_lsn = lsn;
    }
    if recovery.transactions > 0 || !recovery.was_clean || desc.mounted {
        tracing::warn!(
            "file system {} was not unmounted cleanly: {}",
            desc.fs_name,
            recovery.summary()
        );
    } else {
        tracing::info!("file system {}: {}", desc.fs_name, recovery.summary());
    }
    // 1. The inode file's own inode, at its fixed place.
    let mut buf = vec![0u8; geo.inode_bytes as usize];
    nsd.read(desc.inode_file_start, &mut buf, tag(BufferType::Inode, 0))?;
    let m = desc.metadata_inodes;
    let inode0 = Inode::decode(
        &buf,
        geo.inode_bytes,
        m.inode_file,
        Location::Disk(desc.inode_file_start),
    )?;
    let inode_file_blocks = collect_blocks_sparse(nsd.as_ref(), &geo, &inode0)?;
    // 2. The other metadata files' inodes, through the inode file.
    let read_meta_inode = |ino: u64| -> FsResult<Inode> {
        let off = ino * geo.inode_bytes as u64;
        let da = inode_file_blocks
            .get((off / geo.block_bytes as u64) as usize)
            .ok_or_else(|| {
                FsError::integrity(
                    IntegrityError::new("inode file", "the inode lies past its end").ino(ino),
                )
            })?
            .offset_by(off % geo.block_bytes as u64);
        let mut b = vec![0u8; geo.inode_bytes as usize];
        nsd.read(da, &mut b, tag(BufferType::Inode, ino))?;
        Ok(Inode::decode(&b, geo.inode_bytes, ino, Location::Disk(da))?)
    };
    let mut others = Vec::new();
    for ino in [m.block_alloc_map, m.inode_alloc_map, m.log_table] {
        let inode = read_meta_inode(ino)?;
        // The inode map file is sparse (format version 3): a hole holds blank segments.
        let blocks = if ino == m.inode_alloc_map {
            collect_blocks_sparse(nsd.as_ref(), &geo, &inode)?
        } else {
            collect_blocks(nsd.as_ref(), &geo, &inode)?.into()
        };
        others.push((ino, inode, blocks));
    }
    // This node's log, through the log table (absent at its first mount).
    if let Some(log) = crate::recovery::find_log(nsd.as_ref(), &desc, node)? {
        others.push((log.ino, log.inode, log.blocks.into()));
    }
    let mut metafiles = vec![(m.inode_file, inode0.clone(), inode_file_blocks.clone())];
    metafiles.extend(others);
    let blocks_of = |ino: u64| {
        metafiles
            .iter()
            .find(|(i, _, _)| *i == ino)
            .map(|(_, _, b)| b.clone())
            .unwrap_or_default()
    };
    // A range of a metadata file, read piece by piece where it crosses block boundaries.
    let read_meta = |ino: u64, off: u64, len: usize, bt| -> FsResult<(Vec<u8>, DiskAddress)> {
        let blocks = blocks_of(ino);
        let bb = geo.block_bytes as u64;
        let mut b = vec![0u8; len];
        let mut first = None;
        let mut done = 0usize;
        while done < len {
            let pos = off + done as u64;
            let da = blocks
                .get((pos / bb) as usize)
                .ok_or_else(|| {
                    FsError::integrity(
                        IntegrityError::new(
                            "metadata file",
                            format!("too short for offset {pos}; run `mako fsck`"),
                        )
                        .ino(ino),
                    )
                })?
                .offset_by(pos % bb);
            let n = ((bb - pos % bb) as usize).min(len - done);
            nsd.read(da, &mut b[done..done + n], tag(bt, ino))?;
            first.get_or_insert(da);
            done += n;
        }
        Ok((b, first.unwrap_or(DiskAddress::NULL)))
    };
    // 3. Allocation map and inode map segments.
    let slot = crate::alloc_map::segment_slot_bytes(&desc);
    let mut segs = Vec::new();
    for r in 0..desc.regions {
        let (b, da) = read_meta(
            m.block_alloc_map,
            r as u64 * slot as u64,
            slot,
            BufferType::AllocMap,
        )?;
        segs.push(AllocSegment::decode(&b, r, Location::Disk(da))?);
    }
    let alloc = AllocMap::new(&desc, segs)?;
    // The inode map: only the segments in blocks of its file that exist (the rest lie
    // in holes, blank), so a mount reads what was ever used, not the inode limit.
    let per = desc.inodes_per_segment;
    let islot = InodeMapSegment::slot_bytes(per);
    let nseg = InodeMap::segment_count(desc.inodes_max, per);
    let bbu = geo.block_bytes;
    let mut isegs = Vec::new();
    for (b, _) in blocks_of(m.inode_alloc_map).iter() {
        for s in mako_format::inode_map_segment::segments_in_block(b, nseg, per, bbu) {
            let (b, da) = read_meta(
                m.inode_alloc_map,
                mako_format::inode_map_segment::slot_offset(s, per, bbu),
                islot,
                BufferType::InodeMap,
            )?;
            let seg = InodeMapSegment::decode(&b, s as u32, per, Location::Disk(da))?;
            // Allocation numbers inodes from `first_ino`: a wrong one would hand out
            // numbers of another segment, in use.
            if seg.first_ino != s * per as u64 {
                return Err(FsError::integrity(
                    IntegrityError::new(
                        "inode allocation map",
                        format!(
                            "segment {s} says it starts at inode {}, not {}; run `mako fsck`",
                            seg.first_ino,
                            s * per as u64
                        ),
                    )
                    .at(da),
                ));
            }
            isegs.push(seg);
        }
    }
    let imap = InodeMap::new(isegs, desc.inodes_max, per, bbu);
    desc.mounted = true;
    desc.generation += 1;
    write_descriptor(nsd.as_ref(), &desc)?;
    nsd.sync_all()?;
    // 5. The in-memory file system.
    let flush = Arc::new(crate::cache_flush::FsCacheFlush::default());
    let tokens = node_tokens(&env);
    tokens.client().set_cache_flush(flush.clone());
    let mut core = Core::new(nsd, desc, alloc, imap, cfg, env, tokens, recovery.start());
    core.fs_panic = fs_panic;
    let core = Arc::new(core);
    flush.attach(&core);
    let service = Arc::new(crate::metanode::FsService::default());
    service.attach(&core);
    if let Some(reg) = &core.env.registry {
        reg.register(core.env.node_id(), mako_rt::ServiceId::FileSystem, service);
    }
    for (ino, inode, blocks) in metafiles {
        core.metafile_blocks.write().insert(ino, blocks);
        let h = core.new_handle(inode);
        debug_assert!(h.state.read().inode.flags & FLAG_SYSTEM != 0);
        core.inodes.lock().insert(ino, h);
    }
    if recovery.absent {
        // The node's first mount: it takes its share of the space, then makes its log
        // there (which leaves the log in use).
        crate::ownership::claim_at_mount(&core)?;
        create_log(&core)?;
    } else {
        // The log is in use until a clean unmount says otherwise.
        let head = recovery.head_lsn;
        core.journal.write_header(&core, head, head, false)?;
        // A node of a cluster takes its share of the space before anything is allocated.
        crate::ownership::claim_at_mount(&core)?;
    }
    if crate::ownership::shared(&core) {
        // The inode file's inode was read without its token: another node may grow the
        // file at any time, so the first use under the token reads it again.
        // So may the inode map file (`Core::ensure_imap_block`).
        for ino in [m.inode_file, m.inode_alloc_map] {
            if let Some(h) = core.cached_handle(ino) {
                h.state.write().stale = true;
            }
        }
    }
    if let Some(ino) = mako_diag::test_hooks::first_inode() {
        if ino < core.imap.inodes_max() {
            let segment = core.imap.segment_of(ino) as u64;
            let taken = crate::ownership::allocate_from_segment(&core, segment)?;
            tracing::warn!(
                "test hook {}: new inode numbers from segment {segment} (inode {ino}): {}",
                mako_diag::test_hooks::FIRST_INODE_ENV,
                if taken {
                    "taken"
                } else {
                    "held by another node"
                }
            );
        }
    }
    let fs = FileSystem { core: core.clone() };
    fs.getattr(m.root_dir)?;
    reclaim_own_orphans(&core, &recovery);
    let background = core.cfg.read().background_workers;
    let workers = background.then(|| Workers::start(core));
    Ok(Mounted {
        fs,
        recovery,
        workers,
        unmounted: false,
    })
}

/// On a file system of one node (one recovery log), free the inodes its replayed log
/// left in use with no links (`ReplayReport::orphans`): files unlinked while they were
/// still open, or only known to this node's kernel (FUSE frees an unlinked file at its
/// forget, which may come after a commit has made the unlink durable), when the node
/// stopped. Nothing can close them any more: each is freed as its last close would have
/// (`recovery::reclaim_orphans`, committed), so a crash between an unlink's commit and
/// its free's leaves no inode in use without a name. `mako fsck -n` before the mount
/// lists them as freed by the next mount, not as damage. With several nodes another
/// node may have such a file open (its last close there frees it), so they are left.
fn reclaim_own_orphans(core: &Arc<Core>, recovery: &crate::recovery::ReplayReport) {
    if recovery.orphans.is_empty()
        || crate::ownership::shared(core)
        || core.read_only.load(std::sync::atomic::Ordering::Relaxed)
    {
        return;
    }
    let (freed, failed) = crate::recovery::reclaim_orphans(core, &recovery.orphans);
    tracing::warn!(
        "file system {}: inodes the recovery log left in use with no links (unlinked while \
         open or known to the kernel when the node stopped): {} freed {:?}, {} not freed {:?}",
        core.desc.lock().fs_name,
        freed.len(),
        freed,
        failed.len(),
        failed
    );
}

/// Create this node's recovery log at its first mount (`mako_format::log_table`).
///
/// Its blocks come from this node's own space (a node of a cluster that owns no region
/// takes one), allocated in a transaction of the new log itself: the log's header and
/// the start of its records are written, the transaction that marks its blocks used
/// is committed into it, and only then are its indirect blocks and inode written in
/// the node's slot of the log table, and last the node's entry. A crash before the
/// entry leaves the allocation map on disk unchanged (the transaction lives only in a
/// log nobody finds), so nothing leaks and nothing is referenced twice; after it, the
/// log is found and replayed like any other.
fn create_log(core: &Arc<Core>) -> FsResult<()> {
    use mako_format::log_table::{log_ino, LogEntry};
    let desc = core.desc.lock().clone();
    let geo = desc.geometry;
    let bb = geo.block_bytes as u64;
    let ino = log_ino(core.node);
    let nblocks = desc.log_bytes.div_ceil(bb);
    // A node past the regions it was given at mount (more nodes than regions, or its
    // share taken) takes free regions until its log fits.
    while core.alloc.ready_blocks() < nblocks + 1 {
        if !crate::ownership::acquire_region(core)? {
            break;
        }
    }
    let t = core.now();
    let built = {
        let _tx = core.begin();
        build_system_file(core, ino, nblocks, t)
    };
    let (inode, indirect, leaves) = built.map_err(|e| match e {
        FsError::NoSpace(why) => FsError::NoSpace(format!(
            "no room for node {}'s recovery log of {} bytes in the space this node can take ({why}); \
             free space or add a disk, or create the file system with a smaller log (-L)",
            core.node, desc.log_bytes
        )),
        e => e,
    })?;
    core.metafile_blocks.write().insert(ino, leaves.into());
    // An empty log: both header copies (in use, not clean) and the start of the records
    // zeroed, so that nothing left on reused blocks looks like a transaction.
    let lsn = core.journal.head_lsn();
    core.journal.write_header(core, lsn, lsn, false)?;
    core.metafile_write(
        ino,
        mako_format::log_header::LOG_RECORDS_OFFSET,
        &[0u8; 4096],
        BufferType::Log,
    )?;
    // The allocation of the log's blocks, committed into the log itself.
    core.journal.commit(core)?;
    let tag = |bt, ino| IoTag {
        buffer_type: bt,
        ino,
    };
    for (da, bytes) in &indirect {
        core.nsd.write(*da, bytes, tag(BufferType::Indirect, ino))?;
    }
    let table = core
        .metafile_blocks
        .read()
        .get(&desc.metadata_inodes.log_table)
        .map(|t| (0..t.len()).map(|b| t[b]).collect::<Vec<_>>())
        .unwrap_or_default();
    let (entry_da, inode_da) = crate::recovery::table_slots(&desc, &table, core.node)?;
    core.nsd.write(
        inode_da,
        &inode.encode(geo.inode_bytes)?,
        tag(BufferType::Inode, ino),
    )?;
    core.nsd.sync_all()?;
    let entry = LogEntry {
        node: core.node,
        fs_uuid: desc.fs_uuid,
        log_bytes: desc.log_bytes,
    };
    core.nsd
        .write(entry_da, &entry.encode(), tag(BufferType::Log, ino))?;
    core.nsd.sync_all()?;
    let h = core.new_handle(inode);
    core.inodes.lock().insert(ino, h);
    tracing::info!(
        "file system {}: created the recovery log of node {} ({} bytes in {nblocks} blocks)",
        desc.fs_name,
        core.node,
        desc.log_bytes
    );
    Ok(())
}

/// The first LSN of a log made at wall-clock time `now`: 2^31 per second since the
/// epoch. LSNs only grow, so a transaction of an earlier log of the node left on blocks
/// this log reuses could only be taken for one of this log's (same node, same file
/// system, the LSN its position expects) if that log had written 2 GiB of log per
/// second of its life; and LSNs stay below 2^63 until the year 2106. It is rounded up
/// to a whole number of passes over the log's circular area, so a new log starts at
/// the start of that area (zeroed by `create_log`) whatever the second: a first mount
/// makes the same writes, and wraps at the same point, in any second.
fn fresh_log_lsn(now: std::time::Duration, log_bytes: u64) -> u64 {
    let lsn = now.as_secs().min(u32::MAX as u64) << 31;
    lsn.next_multiple_of(crate::journal::log_capacity(log_bytes).max(1))
}

/// A metadata file built in memory: its inode, its indirect blocks (address, encoded
/// bytes) and its blocks by index.
pub type SystemFile = (Inode, Vec<(DiskAddress, Vec<u8>)>, Vec<DiskAddress>);

/// A metadata file of `nblocks` whole blocks allocated now (call with a transaction
/// open): its inode, its indirect blocks (address, encoded bytes) and its blocks by
/// index. Nothing is written and no handle made: the caller writes it where it lives.
pub fn build_system_file(
    core: &Core,
    ino: u64,
    nblocks: u64,
    t: mako_format::inode::Timestamp,
) -> FsResult<SystemFile> {
    use crate::alloc_map::AllocKind;
    let geo = core.geo;
    let spb = geo.subblocks_per_block;
    let top = pointers_in_inode(geo.inode_bytes) as u64;
    let ppi = geo.pointers_per_indirect();
    let mut depth = 0u8;
    let mut span = 1u64; // blocks under one pointer of the inode
    while top.saturating_mul(span) < nblocks {
        depth += 1;
        span = span.saturating_mul(ppi);
    }
    let mut leaves = Vec::with_capacity(nblocks as usize);
    for b in 0..nblocks {
        leaves.push(core.alloc.allocate(AllocKind::Metadata, spb, ino, b)?);
    }
    struct Build<'a> {
        core: &'a Core,
        ino: u64,
        ppi: u64,
        nblocks: u64,
        leaves: &'a [DiskAddress],
        writes: Vec<(DiskAddress, Vec<u8>)>,
    }
    impl Build<'_> {
        /// The pointer to the subtree at (`level`, `index`), covering blocks from
        /// `index × span` where `span` is ppi^level.
        fn node(&mut self, level: u8, index: u64, span: u64) -> FsResult<DiskAddress> {
            if level == 0 {
                return Ok(self
                    .leaves
                    .get(index as usize)
                    .copied()
                    .unwrap_or(DiskAddress::NULL));
            }
            if index.saturating_mul(span) >= self.nblocks {
                return Ok(DiskAddress::NULL);
            }
            let geo = self.core.geo;
            let da = self.core.alloc.allocate(
                crate::alloc_map::AllocKind::Metadata,
                geo.indirect_subblocks(),
                self.ino,
                u64::MAX - level as u64,
            )?;
            let id = IndirectId {
                ino: self.ino,
                level,
                index,
            };
            let mut block = IndirectBlock::new(id, self.ppi as usize);
            for j in 0..self.ppi {
                block.pointers[j as usize] =
                    self.node(level - 1, index * self.ppi + j, span / self.ppi)?;
            }
            self.writes.push((da, block.encode(geo.indirect_bytes)));
            Ok(da)
        }
    }
    let mut b = Build {
        core,
        ino,
        ppi,
        nblocks,
        leaves: &leaves,
        writes: Vec::new(),
    };
    let mut ptrs = vec![DiskAddress::NULL; top as usize];
    for (i, p) in ptrs.iter_mut().enumerate() {
        *p = b.node(depth, i as u64, span)?;
    }
    let writes = b.writes;
    let mut inode = Inode::new(ino, 0o100000);
    inode.flags = FLAG_SYSTEM;
    inode.nlink = 1;
    (inode.atime, inode.mtime, inode.ctime, inode.crtime) = (t, t, t, t);
    inode.size = nblocks * geo.block_bytes as u64;
    inode.subblocks = nblocks * spb as u64 + writes.len() as u64 * geo.indirect_subblocks() as u64;
    inode.depth = depth;
    inode.content = InodeContent::Pointers(ptrs);
    Ok((inode, writes, leaves))
}

#[cfg(test)]
mod tests {
    use super::fresh_log_lsn;
    use crate::journal::log_capacity;
    use std::time::Duration;

    #[test]
    fn a_new_log_starts_at_the_start_of_its_circular_area_in_any_second() {
        let log_bytes = 1 << 20;
        let cap = log_capacity(log_bytes);
        let mut last = 0;
        for secs in [
            1_700_000_000u64,
            1_700_000_001,
            1_790_000_007,
            4_000_000_000,
        ] {
            let lsn = fresh_log_lsn(Duration::from_secs(secs), log_bytes);
            assert_eq!(lsn % cap, 0, "second {secs}: LSN {lsn}");
            assert!(lsn >= secs << 31 && lsn > last, "second {secs}: LSN {lsn}");
            last = lsn;
        }
    }
}
