//! File system creation (`mako fs create`, like mmcrfs): disk headers, the descriptor
//! on up to three (five) disks, the metadata files (inode file, block allocation map,
//! inode allocation map, the log table) and the root directory. No recovery log is
//! made here: each node's is created the first time it mounts (`mount::create_log`),
//! so a file system made for many nodes costs a sector and an inode per node, not a log.

use crate::alloc_map::{AllocKind, AllocMap};
use crate::block_map;
use crate::core::{system_now, Core, FsConfig};
use crate::error::{FsError, FsResult};
use crate::inode_map::InodeMap;
use crate::mount::{open_disk_files, write_descriptor};
use mako_disk::nsd::IoTag;
use mako_disk::{BufferType, Disk, LocalNsd, Nsd};
use mako_format::descriptor::*;
use mako_format::disk_header::{DiskHeader, DiskUsage};
use mako_format::geometry::{default_subblocks, Geometry};
use mako_format::inode::{pointers_in_inode, Inode, InodeContent, FLAG_SYSTEM};
use mako_format::inode_map_segment::InodeMapSegment;
use mako_format::DiskAddress;
use std::path::PathBuf;
use std::sync::Arc;

#[derive(Debug, Clone)]
pub struct MkfsParams {
    pub name: String,
    pub block_bytes: u32,
    pub subblocks_per_block: Option<u32>,
    pub inode_bytes: u32,
    pub indirect_bytes: u32,
    pub default_metadata_replicas: u8,
    pub max_metadata_replicas: u8,
    pub default_data_replicas: u8,
    pub max_data_replicas: u8,
    pub layout: LayoutMap,
    pub inodes_max: Option<u64>,
    pub log_bytes: u64,
    pub avoid_dir_fragments: bool,
    pub dir_pre_split_levels: u8,
    pub regions: Option<u32>,
    /// The most nodes that may mount the file system (like mmcrfs -n): the log table
    /// has a place for each node's recovery log (created at its first mount), and
    /// regions and inode-map segments are shared among them. 1 to `NODES_MAX`.
    pub log_count: u32,
    /// Reproducible formatting for simulations and tests that must replay bit-for-bit:
    /// UUIDs derived from a seed and one fixed time for every timestamp mkfs writes.
    /// `None` (the default, and what `mako fs create` uses): random UUIDs and the
    /// host's clock.
    pub reproducible: Option<Reproducible>,
}

/// What a reproducible format takes instead of randomness and the clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reproducible {
    /// Every UUID (file system, disks) is derived from this seed.
    pub uuid_seed: u64,
    /// Creation time, root directory and metadata-file timestamps.
    pub time: mako_format::inode::Timestamp,
}

impl Reproducible {
    /// The `index`-th UUID of this format: a SplitMix64 stream, so distinct indices
    /// give distinct UUIDs.
    fn uuid(&self, index: u64) -> [u8; 16] {
        let mix = |mut z: u64| {
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^ (z >> 31)
        };
        const GOLDEN: u64 = 0x9e37_79b9_7f4a_7c15;
        let base = self
            .uuid_seed
            .wrapping_add(index.wrapping_mul(2).wrapping_mul(GOLDEN));
        let a = mix(base.wrapping_add(GOLDEN));
        let b = mix(base.wrapping_add(GOLDEN.wrapping_mul(2)));
        let mut out = [0u8; 16];
        out[..8].copy_from_slice(&a.to_le_bytes());
        out[8..].copy_from_slice(&b.to_le_bytes());
        out
    }
}

impl Default for MkfsParams {
    fn default() -> Self {
        MkfsParams {
            name: "fs1".into(),
            block_bytes: 4 << 20,
            subblocks_per_block: None,
            inode_bytes: 4096,
            indirect_bytes: 32 << 10,
            default_metadata_replicas: 1,
            max_metadata_replicas: 2,
            default_data_replicas: 1,
            max_data_replicas: 2,
            layout: LayoutMap::Scatter,
            inodes_max: None,
            log_bytes: 32 << 20,
            avoid_dir_fragments: false,
            dir_pre_split_levels: 0,
            regions: None,
            log_count: 1,
            reproducible: None,
        }
    }
}

/// A disk as the administrator names it.
#[derive(Debug, Clone)]
pub struct DiskSpec {
    pub name: String,
    pub path: PathBuf,
    pub pool: String,
    pub failure_group: i32,
    pub usage: DiskUsage,
}

/// Per-disk attributes for `format_disks` (no path: the disk is already open).
#[derive(Debug, Clone)]
pub struct DiskMeta {
    pub name: String,
    pub pool: String,
    pub failure_group: i32,
    pub usage: DiskUsage,
}

/// Well-known inode numbers.
pub const INODE_FILE_INO: u64 = 0;
pub const ROOT_INO: u64 = 1;
pub const BLOCK_ALLOC_MAP_INO: u64 = 2;
pub const INODE_ALLOC_MAP_INO: u64 = 3;
/// The log table (`mako_format::log_table`): where each node's recovery log is.
pub const LOG_TABLE_INO: u64 = 4;
pub const FIRST_USER_INO: u64 = 16;
pub use mako_format::log_table::NODES_MAX;
/// Inodes per inode-map segment.
pub const INODES_PER_SEGMENT: u32 = 32768;
/// Inodes per segment of a file system several nodes mount: each node hands out numbers
/// from segments of its own (node k starts with segment k), and the inode file is
/// sparse past what mkfs pre-sized (`ensure_inode_slot`), so small segments keep every
/// node's first numbers in few inode-file blocks.
pub const INODES_PER_SEGMENT_SHARED: u32 = 64;

/// Inodes per inode-map segment for a file system of `nodes` nodes and `inodes_max`
/// inodes: `INODES_PER_SEGMENT` (one node) or `INODES_PER_SEGMENT_SHARED`, doubled
/// until the segments number at most `inode_map_segment::SEGMENTS_MAX` (a segment's
/// number is 32 bits): 2^40 inodes on several nodes take 256 per segment.
pub fn segment_size(nodes: u32, inodes_max: u64) -> u32 {
    let mut per = if nodes > 1 {
        INODES_PER_SEGMENT_SHARED
    } else {
        INODES_PER_SEGMENT
    };
    while InodeMap::segment_count(inodes_max, per) > mako_format::inode_map_segment::SEGMENTS_MAX {
        per *= 2;
    }
    per
}
/// At most this many bytes of inode file are allocated and written at mkfs for the
/// first segments of the nodes the file system is made for (see `format_disks`).
pub const INODE_FILE_PRESIZE_MAX: u64 = 64 << 20;
/// Default number of allocation regions (more for a file system made for more nodes).
pub const REGIONS_DEFAULT: u32 = 32;
/// Blocks of each disk a default region gets at least.
pub const REGION_BLOCKS_MIN: u64 = 16;

fn range_err(what: &str, v: impl std::fmt::Display, range: &str) -> FsError {
    FsError::Invalid(format!("{what} {v} is out of range ({range})"))
}

pub fn validate(params: &MkfsParams) -> FsResult<Geometry> {
    let spb = match params.subblocks_per_block {
        Some(s) => s,
        None => default_subblocks(params.block_bytes).ok_or_else(|| {
            range_err(
                "block size (-B)",
                params.block_bytes,
                "a power of two from 64K to 16M",
            )
        })?,
    };
    let geo = Geometry {
        block_bytes: params.block_bytes,
        subblocks_per_block: spb,
        inode_bytes: params.inode_bytes,
        indirect_bytes: params.indirect_bytes,
    };
    geo.validate().map_err(FsError::Invalid)?;
    for (flag, v) in [
        ("-m", params.default_metadata_replicas),
        ("-M", params.max_metadata_replicas),
        ("-r", params.default_data_replicas),
        ("-R", params.max_data_replicas),
    ] {
        if !(1..=3).contains(&v) {
            return Err(range_err(&format!("replicas ({flag})"), v, "1..3"));
        }
    }
    if params.default_metadata_replicas > params.max_metadata_replicas {
        return Err(FsError::Invalid("-m must not exceed -M".into()));
    }
    if params.default_data_replicas > params.max_data_replicas {
        return Err(FsError::Invalid("-r must not exceed -R".into()));
    }
    if params.name.is_empty()
        || params.name.len() > 63
        || !params
            .name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
    {
        return Err(FsError::Invalid(format!(
            "file system name {:?}: 1..63 letters, digits, '-' or '_'",
            params.name
        )));
    }
    // One transaction must always fit the log: at least 16 directory blocks.
    let log_min = (16 * geo.dir_block_bytes() as u64).max(mako_format::descriptor::LOG_BYTES_MIN);
    if params.log_bytes < log_min || params.log_bytes > mako_format::descriptor::LOG_BYTES_MAX {
        return Err(range_err(
            "log size (-L)",
            params.log_bytes,
            &format!(
                "{}K..1G for {}K blocks",
                log_min >> 10,
                geo.block_bytes >> 10
            ),
        ));
    }
    if !(1..=NODES_MAX).contains(&params.log_count) {
        return Err(range_err(
            "number of nodes (-n)",
            params.log_count,
            &format!("1..{NODES_MAX}"),
        ));
    }
    // Recovery finds the log table's inode in the first block of the inode file.
    if (LOG_TABLE_INO + 1) * params.inode_bytes as u64 > params.block_bytes as u64 {
        return Err(FsError::Invalid(format!(
            "inode size {} with block size {}: the log table's inode must lie in the first block",
            params.inode_bytes, params.block_bytes
        )));
    }
    if let Some(n) = params.inodes_max {
        let most = mako_format::descriptor::inodes_max_for(&geo);
        if n > most {
            return Err(range_err(
                "inode limit (--inodes)",
                n,
                &format!("up to {most} with {}-byte inodes", geo.inode_bytes),
            ));
        }
    }
    if params.dir_pre_split_levels > 10 {
        return Err(range_err(
            "DirPreSplitLevels",
            params.dir_pre_split_levels,
            "0..10",
        ));
    }
    Ok(geo)
}

/// Format disk files that already exist at their full size.
pub fn format(disks: &[DiskSpec], params: &MkfsParams) -> FsResult<Descriptor> {
    let opened = open_disk_files(disks)?;
    let meta = disks
        .iter()
        .map(|d| DiskMeta {
            name: d.name.clone(),
            pool: d.pool.clone(),
            failure_group: d.failure_group,
            usage: d.usage,
        })
        .collect::<Vec<_>>();
    format_disks(opened, &meta, params)
}

/// Format already-open disks (file-backed or in memory).
pub fn format_disks(
    disks: Vec<Arc<dyn Disk>>,
    meta: &[DiskMeta],
    params: &MkfsParams,
) -> FsResult<Descriptor> {
    let geo = validate(params)?;
    if disks.is_empty() {
        return Err(FsError::Invalid("no disks given".into()));
    }
    let bb = geo.block_bytes as u64;
    let first = crate::alloc_map::first_block(&geo);
    let mut entries = Vec::new();
    for (i, (d, m)) in disks.iter().zip(meta).enumerate() {
        let blocks = d.size_bytes() / bb;
        if blocks < first + 4 {
            return Err(FsError::Invalid(format!(
                "disk {} is too small: {} bytes hold {blocks} blocks of {bb} bytes; it needs at least {} bytes",
                m.name,
                d.size_bytes(),
                (first + 4) * bb
            )));
        }
        entries.push(DiskEntry {
            index: i as u32,
            uuid: match &params.reproducible {
                Some(r) => r.uuid(1 + i as u64),
                None => *uuid::Uuid::new_v4().as_bytes(),
            },
            name: m.name.clone(),
            size_bytes: blocks * bb,
            pool: m.pool.clone(),
            failure_group: m.failure_group,
            usage: m.usage,
            status: DiskStatus::Ready,
        });
    }
    if !entries.iter().any(|e| e.usage.holds_metadata()) {
        return Err(FsError::Invalid(
            "no disk may hold metadata (use dataAndMetadata or metadataOnly)".into(),
        ));
    }
    if !entries.iter().any(|e| e.usage.holds_data()) {
        return Err(FsError::Invalid(
            "no disk may hold data (use dataAndMetadata or dataOnly)".into(),
        ));
    }
    let min_blocks = entries
        .iter()
        .map(|e| e.size_bytes / bb - first)
        .min()
        .unwrap_or(1);
    // Every node allocates only in regions it owns (docs/coherence.md section 6), so a
    // file system needs at least one region per node that may mount it: a node left
    // without one could not allocate a single block (its recovery log at its first
    // mount, the inode file's block of its first inode numbers, a directory block),
    // whatever the free space elsewhere. By default regions get at least
    // `REGION_BLOCKS_MIN` blocks per disk (smaller ones leave a node too little space
    // past the metadata reserve), but never fewer regions than nodes while the disks
    // have a block per node.
    let blocks_cap = min_blocks.min(u32::MAX as u64) as u32;
    let by_size = (min_blocks / REGION_BLOCKS_MIN).clamp(1, u32::MAX as u64) as u32;
    let regions = params
        .regions
        .unwrap_or_else(|| {
            REGIONS_DEFAULT
                .max(params.log_count)
                .min(by_size.max(params.log_count))
        })
        .clamp(1, blocks_cap);
    if regions < params.log_count {
        return Err(FsError::Invalid(format!(
            "{regions} allocation regions for {} nodes: every node needs a region of its own; {}",
            params.log_count,
            if params.regions.is_some_and(|r| r < params.log_count)
                && blocks_cap >= params.log_count
            {
                format!("ask for at least {} regions", params.log_count)
            } else {
                format!(
                    "the smallest disk has {min_blocks} blocks (a region is at least one block of every disk): use disks of at least {} blocks or fewer nodes",
                    params.log_count
                )
            }
        )));
    }
    let total: u64 = entries.iter().map(|e| e.size_bytes).sum();
    let inodes_max = params
        .inodes_max
        .unwrap_or((total / (16 << 10)).clamp(65536, 1 << 32))
        .max(FIRST_USER_INO + 64);
    let per_segment = segment_size(params.log_count, inodes_max);
    if InodeMapSegment::slot_bytes(per_segment) as u64 > bb {
        return Err(range_err(
            "inode limit (--inodes)",
            inodes_max,
            &format!(
                "with {bb}-byte blocks, an inode-map segment of {per_segment} inodes would not fit a block; \
                 use fewer inodes or larger blocks (-B)"
            ),
        ));
    }
    let now = || match &params.reproducible {
        Some(r) => r.time,
        None => system_now(),
    };
    let desc = Descriptor {
        version: mako_format::FORMAT_VERSION,
        generation: 1,
        fs_name: params.name.clone(),
        fs_uuid: match &params.reproducible {
            Some(r) => r.uuid(0),
            None => *uuid::Uuid::new_v4().as_bytes(),
        },
        geometry: geo,
        default_metadata_replicas: params.default_metadata_replicas,
        max_metadata_replicas: params.max_metadata_replicas,
        default_data_replicas: params.default_data_replicas,
        max_data_replicas: params.max_data_replicas,
        layout: params.layout,
        avoid_dir_fragments: params.avoid_dir_fragments,
        dir_pre_split_levels: params.dir_pre_split_levels,
        log_bytes: params.log_bytes,
        inodes_max,
        regions,
        inodes_per_segment: per_segment,
        created_unix: now().sec,
        mounted: false,
        metadata_inodes: MetadataInodes {
            inode_file: INODE_FILE_INO,
            root_dir: ROOT_INO,
            block_alloc_map: BLOCK_ALLOC_MAP_INO,
            inode_alloc_map: INODE_ALLOC_MAP_INO,
            log_table: LOG_TABLE_INO,
            log_count: params.log_count,
            first_user_inode: FIRST_USER_INO,
        },
        inode_file_start: DiskAddress::new(0, 1),
        descriptor_disks: Descriptor::choose_descriptor_disks(&entries),
        disks: entries,
    };
    let nsd: Arc<dyn Nsd> = Arc::new(LocalNsd::new(disks, 0));
    let alloc = AllocMap::new(&desc, AllocMap::fresh_segments(&desc))?;
    // The inode map file is sparse (format version 3): only its first blocks exist,
    // those of every node's first segment (node k starts with segment k) as far as
    // `INODE_FILE_PRESIZE_MAX` allows; every other segment lies in a hole, blank, and
    // its block is made when a number of it is first used (`Core::ensure_imap_block`).
    // So neither mkfs nor a mount reads or writes space that grows with the limit.
    let nseg = InodeMap::segment_count(inodes_max, per_segment);
    let imap_file_bytes = mako_format::inode_map_segment::file_bytes(nseg, per_segment, bb as u32);
    let imap_presize = mako_format::inode_map_segment::file_bytes(
        (params.log_count as u64).min(nseg),
        per_segment,
        bb as u32,
    )
    .min(INODE_FILE_PRESIZE_MAX.next_multiple_of(bb))
    .max(bb);
    let presized_segments = (imap_presize / bb)
        * mako_format::inode_map_segment::slots_per_block(per_segment, bb as u32);
    let imap = InodeMap::new(
        (0..presized_segments.min(nseg))
            .map(|s| InodeMapSegment::new(s as u32, s * per_segment as u64, per_segment))
            .collect(),
        inodes_max,
        per_segment,
        bb as u32,
    );
    let cfg = FsConfig {
        pagepool_bytes: 64 << 20,
        ..FsConfig::default()
    };
    let env = crate::env::NodeEnv::single_node(0);
    let tokens = crate::mount::node_tokens(&env);
    let core = Core::new(
        nsd.clone(),
        desc,
        alloc,
        imap,
        cfg,
        env,
        tokens,
        crate::journal::LogStart {
            head_lsn: 0,
            next_seq: 1,
        },
    );
    // Creation writes everything in place itself (`write_back_unlogged`); the handle
    // only keeps the journal's bookkeeping of dirty inodes honest.
    let _tx = core.begin();
    for ino in 0..FIRST_USER_INO {
        core.imap.mark_used(ino)?;
    }
    let t = now();
    let slot_alloc = core.alloc_slot_bytes as u64;
    // The inode file grows (sparsely) under its token in `xw`, which every node that
    // reads inodes holds in `ro`: a growth revokes them all. So a file system several
    // nodes mount starts with room for every node's first segment (node k starts with
    // segment k), so that a node's first creates grow nothing, as far as
    // `INODE_FILE_PRESIZE_MAX` (every pre-sized byte is written at mkfs) and a 32nd of
    // the space allow; nodes past that grow the file by one block at their first create.
    let inode_file_bytes = if params.log_count > 1 {
        (params.log_count as u64 * per_segment as u64 * geo.inode_bytes as u64)
            .min(INODE_FILE_PRESIZE_MAX)
            .min(total / 32)
            .next_multiple_of(bb)
            .max(bb)
    } else {
        bb
    };
    // (inode, bytes allocated now, size): the inode map file is larger than what is
    // allocated of it, the rest holes.
    let alloc_map_bytes = regions as u64 * slot_alloc;
    let mut metafiles = vec![
        (INODE_FILE_INO, inode_file_bytes, inode_file_bytes),
        (BLOCK_ALLOC_MAP_INO, alloc_map_bytes, alloc_map_bytes),
        (
            INODE_ALLOC_MAP_INO,
            imap_presize,
            imap_file_bytes.max(imap_presize),
        ),
    ];
    let table_bytes = mako_format::log_table::table_bytes(params.log_count, geo.inode_bytes);
    metafiles.push((LOG_TABLE_INO, table_bytes, table_bytes));
    let mut handles = Vec::new();
    for (ino, bytes, size) in metafiles {
        let mut inode = Inode::new(ino, 0o100000);
        inode.flags = FLAG_SYSTEM;
        inode.nlink = 1;
        inode.atime = t;
        inode.mtime = t;
        inode.ctime = t;
        inode.crtime = t;
        inode.content =
            InodeContent::Pointers(vec![DiskAddress::NULL; pointers_in_inode(geo.inode_bytes)]);
        let h = core.insert_new(inode);
        let nblocks = bytes.div_ceil(bb);
        let mut das = Vec::new();
        {
            let mut st = h.state.write();
            for b in 0..nblocks {
                let da =
                    core.alloc
                        .allocate(AllocKind::Metadata, geo.subblocks_per_block, ino, b)?;
                block_map::set(&core, &mut st, b, da)?;
                das.push(da);
            }
            st.inode.size = size.div_ceil(bb).max(nblocks) * bb;
            st.inode.subblocks += nblocks * geo.subblocks_per_block as u64;
        }
        let mut blocks = crate::meta_blocks::MetaBlocks::from(das);
        blocks.set_len(size.div_ceil(bb));
        core.metafile_blocks.write().insert(ino, blocks);
        handles.push(h);
    }
    let inode_file_start = core.metafile_blocks.read()[&INODE_FILE_INO][0];
    core.desc.lock().inode_file_start = inode_file_start;
    // The inode file starts blank (every pre-sized block); so do the log table's
    // entries (no node has a log yet: nothing left on a reused disk may look like one).
    let inode_file_blocks = core.metafile_blocks.read()[&INODE_FILE_INO].clone();
    for (_, da) in inode_file_blocks.iter() {
        core.nsd.write(
            da,
            &vec![0u8; bb as usize],
            IoTag {
                buffer_type: BufferType::Inode,
                ino: 0,
            },
        )?;
    }
    let entries = mako_format::log_table::inode_offset(params.log_count, geo.inode_bytes, 0);
    let zeros = vec![0u8; bb as usize];
    let mut off = 0;
    while off < entries {
        let n = (entries - off).min(bb) as usize;
        core.metafile_write(LOG_TABLE_INO, off, &zeros[..n], BufferType::Log)?;
        off += n as u64;
    }
    // The root directory.
    let mut root = Inode::new(ROOT_INO, 0o040755);
    root.nlink = 2;
    root.parent = ROOT_INO;
    root.atime = t;
    root.mtime = t;
    root.ctime = t;
    root.crtime = t;
    root.content = InodeContent::InlineDir(Vec::new());
    handles.push(core.insert_new(root));
    write_back_unlogged(&core, &handles)?;
    let desc = core.desc.lock().clone();
    for d in &desc.disks {
        let header = DiskHeader {
            version: mako_format::FORMAT_VERSION,
            disk_uuid: d.uuid,
            fs_uuid: desc.fs_uuid,
            name: d.name.clone(),
            size_bytes: d.size_bytes,
            sector_bytes: 512,
            pool: d.pool.clone(),
            failure_group: d.failure_group,
            usage: d.usage,
            disk_index: d.index,
        };
        core.nsd.write(
            DiskAddress::new(d.index, 0),
            &header.encode(),
            IoTag {
                buffer_type: BufferType::DiskHeader,
                ino: 0,
            },
        )?;
    }
    write_descriptor(core.nsd.as_ref(), &desc)?;
    core.nsd.sync_all()?;
    Ok(desc)
}

/// Write the new file system's metadata in place, without the log (there is nothing
/// to recover if creation is interrupted: it is simply run again): every inode with
/// its indirect and directory blocks, and every map segment (a mount reads them all).
fn write_back_unlogged(core: &Core, handles: &[Arc<crate::core::InodeHandle>]) -> FsResult<()> {
    for h in handles {
        let st = h.state.read();
        for node in st.indirect.lock().values() {
            core.nsd.write(
                node.da,
                &node.block.encode(core.geo.indirect_bytes),
                IoTag {
                    buffer_type: BufferType::Indirect,
                    ino: h.ino,
                },
            )?;
        }
        for node in st.dir_blocks.lock().values() {
            core.nsd.write(
                node.da,
                &node.to_block().encode(),
                IoTag {
                    buffer_type: BufferType::Directory,
                    ino: h.ino,
                },
            )?;
        }
        let (da, bytes) = core.encode_inode(&st.inode)?;
        core.nsd.write(
            da,
            &bytes,
            IoTag {
                buffer_type: BufferType::Inode,
                ino: h.ino,
            },
        )?;
    }
    let desc = core.desc.lock().clone();
    let m = desc.metadata_inodes;
    let slot = core.alloc_slot_bytes;
    for r in 0..desc.regions {
        core.alloc.mark_region_dirty(r);
    }
    for (r, pages) in core.alloc.take_dirty_pages(slot) {
        for (off, bytes) in pages {
            core.metafile_write(
                m.block_alloc_map,
                r as u64 * slot as u64 + off,
                &bytes,
                BufferType::AllocMap,
            )?;
        }
    }
    core.imap.mark_all_dirty();
    for (sg, bytes) in core.imap.take_dirty() {
        core.metafile_write(
            m.inode_alloc_map,
            core.imap.slot_offset(sg),
            &bytes,
            BufferType::InodeMap,
        )?;
    }
    Ok(())
}
