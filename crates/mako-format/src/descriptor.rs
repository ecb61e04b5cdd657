//! The file system descriptor (superblock), replicated on up to three disks in
//! distinct failure groups with a generation number; the highest valid generation
//! held by a majority of the copies wins.

use crate::codec::{check_header, Reader, Writer};
use crate::disk_header::DiskUsage;
use crate::error::{FormatError, Location};
use crate::geometry::Geometry;
use crate::DiskAddress;

pub const DESCRIPTOR_MAGIC: u64 = u64::from_le_bytes(*b"MAKOFSDS");
/// Byte offset of the descriptor copy on a disk (right after the disk header).
pub const DESCRIPTOR_OFFSET: u64 = 4096;
/// Bytes reserved for a descriptor copy.
pub const DESCRIPTOR_BYTES_MAX: usize = 60 * 1024;
/// Bytes at the start of every disk that hold no allocatable subblocks.
pub const RESERVED_BYTES: u64 = 64 * 1024;
/// Smallest and largest recovery log a descriptor may name (`mako fs create -L`).
pub const LOG_BYTES_MIN: u64 = 1 << 20;
pub const LOG_BYTES_MAX: u64 = 1 << 30;
/// The oldest format version this Mako mounts: version 1 kept at most 12 recovery logs
/// at fixed inode numbers, version 2 finds them through the log table but packs the
/// inode map's segments across blocks, version 3 keeps the inode map sparse (one
/// segment never straddles a block) for inode limits up to 2^40 and past.
pub const DESCRIPTOR_VERSION_MIN: u16 = 3;
const CRC_OFFSET: usize = 10;

/// State of a disk in the file system (`mako disk show`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DiskStatus {
    Ready = 0,
    Suspended = 1,
    Down = 2,
}

impl DiskStatus {
    pub fn name(self) -> &'static str {
        match self {
            DiskStatus::Ready => "ready",
            DiskStatus::Suspended => "suspended",
            DiskStatus::Down => "down",
        }
    }
}

/// Block placement across the disks of a pool (`-j`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LayoutMap {
    /// Blocks of a file spread pseudo-randomly over all disks (default).
    Scatter = 0,
    /// Blocks laid out round-robin and contiguously, for small clusters.
    Cluster = 1,
}

impl LayoutMap {
    pub fn name(self) -> &'static str {
        match self {
            LayoutMap::Scatter => "scatter",
            LayoutMap::Cluster => "cluster",
        }
    }
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "scatter" => Some(LayoutMap::Scatter),
            "cluster" => Some(LayoutMap::Cluster),
            _ => None,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiskEntry {
    pub index: u32,
    pub uuid: [u8; 16],
    pub name: String,
    pub size_bytes: u64,
    pub pool: String,
    pub failure_group: i32,
    pub usage: DiskUsage,
    pub status: DiskStatus,
}

/// Well-known inode numbers of the files that hold metadata.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MetadataInodes {
    pub inode_file: u64,
    pub root_dir: u64,
    pub block_alloc_map: u64,
    pub inode_alloc_map: u64,
    /// The log table (`log_table`): where each node's recovery log is. Its inode lies
    /// in the first block of the inode file and its blocks never change.
    pub log_table: u64,
    /// Most nodes that may mount the file system (`mako fs create -n`): the log table
    /// has a place for each, and regions and inode-map segments are shared among them.
    pub log_count: u32,
    /// First inode number handed to user files.
    pub first_user_inode: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Descriptor {
    pub version: u16,
    pub generation: u64,
    pub fs_name: String,
    pub fs_uuid: [u8; 16],
    pub geometry: Geometry,
    pub default_metadata_replicas: u8,
    pub max_metadata_replicas: u8,
    pub default_data_replicas: u8,
    pub max_data_replicas: u8,
    pub layout: LayoutMap,
    pub avoid_dir_fragments: bool,
    pub dir_pre_split_levels: u8,
    pub log_bytes: u64,
    pub inodes_max: u64,
    /// Allocation regions; each covers a slice of every disk.
    pub regions: u32,
    /// Inodes per inode-map segment.
    pub inodes_per_segment: u32,
    pub created_unix: i64,
    /// Set while mounted; a mount that finds it set knows the last stop was not clean.
    pub mounted: bool,
    pub metadata_inodes: MetadataInodes,
    /// Where inode 0 (the inode file's own inode) lives; fixed at creation.
    pub inode_file_start: DiskAddress,
    /// Disks holding a descriptor copy.
    pub descriptor_disks: Vec<u32>,
    pub disks: Vec<DiskEntry>,
}

/// The largest inode limit with this geometry: the inode file, `inode limit × inode
/// size` bytes, stays within 2^62 bytes (the largest file), below the log inodes'
/// numbers (`log_table::LOG_INO_BASE`).
pub fn inodes_max_for(geometry: &Geometry) -> u64 {
    crate::inode::FILE_BYTES_MAX / geometry.inode_bytes.max(1) as u64
}

impl Descriptor {
    /// Refuse a file system of an older format, saying what to do.
    pub fn check_supported(&self) -> Result<(), String> {
        if self.version < DESCRIPTOR_VERSION_MIN {
            let why = if self.version < 2 {
                "whose recovery logs this Mako cannot find (version 2 and later keep them in a log table)"
            } else {
                "whose inode allocation map this Mako cannot read (version 3 keeps it sparse, one \
                 segment per block slot, for inode limits up to 2^40 and past)"
            };
            return Err(format!(
                "file system {} has format version {}, made by an older Mako {why}; this Mako \
                 mounts version {} and later: mount it with the Mako that made it, copy the \
                 files off, and create it again with `mako fs create`",
                self.fs_name, self.version, DESCRIPTOR_VERSION_MIN
            ));
        }
        Ok(())
    }

    pub fn encode(&self) -> Result<Vec<u8>, FormatError> {
        let mut w = Writer::with_capacity(4096);
        w.u64(DESCRIPTOR_MAGIC);
        w.u16(crate::FORMAT_VERSION);
        w.u32(0); // crc
        w.u32(0); // length, filled below
        w.u64(self.generation);
        w.blob16(self.fs_name.as_bytes());
        w.bytes(&self.fs_uuid);
        w.u32(self.geometry.block_bytes);
        w.u32(self.geometry.subblocks_per_block);
        w.u32(self.geometry.inode_bytes);
        w.u32(self.geometry.indirect_bytes);
        w.u8(self.default_metadata_replicas);
        w.u8(self.max_metadata_replicas);
        w.u8(self.default_data_replicas);
        w.u8(self.max_data_replicas);
        w.u8(self.layout as u8);
        w.u8(self.avoid_dir_fragments as u8);
        w.u8(self.dir_pre_split_levels);
        w.u64(self.log_bytes);
        w.u64(self.inodes_max);
        w.u32(self.regions);
        w.u32(self.inodes_per_segment);
        w.i64(self.created_unix);
        w.u8(self.mounted as u8);
        let m = &self.metadata_inodes;
        w.u64(m.inode_file);
        w.u64(m.root_dir);
        w.u64(m.block_alloc_map);
        w.u64(m.inode_alloc_map);
        w.u64(m.log_table);
        w.u32(m.log_count);
        w.u64(m.first_user_inode);
        w.u64(self.inode_file_start.raw());
        w.u16(self.descriptor_disks.len() as u16);
        for d in &self.descriptor_disks {
            w.u32(*d);
        }
        w.u32(self.disks.len() as u32);
        for d in &self.disks {
            w.u32(d.index);
            w.bytes(&d.uuid);
            w.blob16(d.name.as_bytes());
            w.u64(d.size_bytes);
            w.blob16(d.pool.as_bytes());
            w.u32(d.failure_group as u32);
            w.u8(d.usage as u8);
            w.u8(d.status as u8);
        }
        let len = w.len();
        if len > DESCRIPTOR_BYTES_MAX {
            return Err(FormatError::invalid(
                "descriptor",
                Location::Memory,
                format!(
                    "{len} bytes with {} disks exceeds the {DESCRIPTOR_BYTES_MAX}-byte slot",
                    self.disks.len()
                ),
            ));
        }
        w.buf[14..18].copy_from_slice(&(len as u32).to_le_bytes());
        w.pad_to(len.div_ceil(512) * 512);
        let crc = crate::checksum_with_hole(&w.buf[..len], CRC_OFFSET);
        w.buf[CRC_OFFSET..CRC_OFFSET + 4].copy_from_slice(&crc.to_le_bytes());
        Ok(w.buf)
    }

    pub fn decode(bytes: &[u8], location: Location) -> Result<Self, FormatError> {
        const S: &str = "descriptor";
        let mut r = Reader::new(bytes, S, location);
        let magic = r.u64()?;
        let version = r.u16()?;
        let crc = r.u32()?;
        let len = r.u32()? as usize;
        if magic != DESCRIPTOR_MAGIC {
            return Err(FormatError::new(
                S,
                location,
                crate::FormatErrorKind::BadMagic { found: magic },
            ));
        }
        if !(18..=DESCRIPTOR_BYTES_MAX).contains(&len) || len > bytes.len() {
            return Err(FormatError::invalid(
                S,
                location,
                format!("length {len} (buffer {})", bytes.len()),
            ));
        }
        check_header(
            &bytes[..len],
            S,
            location,
            DESCRIPTOR_MAGIC,
            magic,
            version,
            CRC_OFFSET,
            crc,
        )?;
        let mut r = Reader::new(&bytes[..len], S, location);
        r.seek(18)?;
        let generation = r.u64()?;
        let fs_name = r.string16("file system name")?;
        let mut fs_uuid = [0u8; 16];
        fs_uuid.copy_from_slice(r.take(16)?);
        let geometry = Geometry {
            block_bytes: r.u32()?,
            subblocks_per_block: r.u32()?,
            inode_bytes: r.u32()?,
            indirect_bytes: r.u32()?,
        };
        geometry
            .validate()
            .map_err(|e| FormatError::invalid(S, location, e))?;
        let default_metadata_replicas = r.u8()?;
        let max_metadata_replicas = r.u8()?;
        let default_data_replicas = r.u8()?;
        let max_data_replicas = r.u8()?;
        let layout = match r.u8()? {
            0 => LayoutMap::Scatter,
            1 => LayoutMap::Cluster,
            v => {
                return Err(FormatError::invalid(
                    S,
                    location,
                    format!("layout code {v}"),
                ))
            }
        };
        let avoid_dir_fragments = r.u8()? != 0;
        let dir_pre_split_levels = r.u8()?;
        let log_bytes = r.u64()?;
        let inodes_max = r.u64()?;
        let regions = r.u32()?;
        let inodes_per_segment = r.u32()?;
        let created_unix = r.i64()?;
        let mounted = r.u8()? != 0;
        let metadata_inodes = MetadataInodes {
            inode_file: r.u64()?,
            root_dir: r.u64()?,
            block_alloc_map: r.u64()?,
            inode_alloc_map: r.u64()?,
            log_table: r.u64()?,
            log_count: r.u32()?,
            first_user_inode: r.u64()?,
        };
        let inode_file_start = DiskAddress::from_raw(r.u64()?);
        let ndesc = r.u16()? as usize;
        let mut descriptor_disks = Vec::with_capacity(ndesc.min(16));
        for _ in 0..ndesc {
            descriptor_disks.push(r.u32()?);
        }
        let ndisks = r.u32()? as usize;
        if ndisks == 0 || ndisks > 65536 {
            return Err(FormatError::invalid(S, location, format!("{ndisks} disks")));
        }
        // Reserve for the entries the bytes can hold (38 bytes each at least), not for
        // what the count claims.
        let mut disks = Vec::with_capacity(ndisks.min(r.remaining() / 38));
        for _ in 0..ndisks {
            let index = r.u32()?;
            let mut uuid = [0u8; 16];
            uuid.copy_from_slice(r.take(16)?);
            let name = r.string16("disk name")?;
            let size_bytes = r.u64()?;
            let pool = r.string16("pool name")?;
            let failure_group = r.u32()? as i32;
            let usage_raw = r.u8()?;
            let usage = DiskUsage::from_u8(usage_raw).ok_or_else(|| {
                FormatError::invalid(S, location, format!("disk usage code {usage_raw}"))
            })?;
            let status = match r.u8()? {
                0 => DiskStatus::Ready,
                1 => DiskStatus::Suspended,
                2 => DiskStatus::Down,
                v => {
                    return Err(FormatError::invalid(
                        S,
                        location,
                        format!("disk status code {v}"),
                    ))
                }
            };
            disks.push(DiskEntry {
                index,
                uuid,
                name,
                size_bytes,
                pool,
                failure_group,
                usage,
                status,
            });
        }
        for (i, d) in disks.iter().enumerate() {
            if d.index as usize != i {
                return Err(FormatError::invalid(
                    S,
                    location,
                    format!("disk entry {i} has index {}", d.index),
                ));
            }
        }
        if regions == 0 || inodes_per_segment == 0 || inodes_per_segment % 64 != 0 {
            return Err(FormatError::invalid(
                S,
                location,
                "zero regions or bad inode segment size",
            ));
        }
        // Every disk has a slice in every allocation region: no more regions than the
        // smallest disk has blocks (mkfs's own limit). The count sizes tables of the
        // allocation map, so it must not be taken on trust.
        let smallest_disk_blocks = disks
            .iter()
            .map(|d| d.size_bytes / geometry.block_bytes as u64)
            .min()
            .unwrap_or(0);
        if regions as u64 > smallest_disk_blocks {
            return Err(FormatError::invalid(
                S,
                location,
                format!(
                    "{regions} allocation regions, more than the {smallest_disk_blocks} blocks of the smallest disk"
                ),
            ));
        }
        // The log's size bounds every LSN computation (`% capacity`): mkfs makes logs
        // of 1 MiB to 1 GiB.
        if !(LOG_BYTES_MIN..=LOG_BYTES_MAX).contains(&log_bytes) {
            return Err(FormatError::invalid(
                S,
                location,
                format!("recovery log of {log_bytes} bytes (a log has {LOG_BYTES_MIN}..{LOG_BYTES_MAX})"),
            ));
        }
        // The node count sizes the log table and loops over nodes; the inode limit
        // bounds offsets in the inode file (`ino × inode size`), which must stay below
        // the log inodes' numbers and never overflow.
        if metadata_inodes.log_count == 0 || metadata_inodes.log_count > crate::log_table::NODES_MAX
        {
            return Err(FormatError::invalid(
                S,
                location,
                format!(
                    "{} nodes (a file system has 1..{})",
                    metadata_inodes.log_count,
                    crate::log_table::NODES_MAX
                ),
            ));
        }
        if inodes_max > inodes_max_for(&geometry) {
            return Err(FormatError::invalid(
                S,
                location,
                format!(
                    "inode limit {inodes_max} (at most {} with {}-byte inodes)",
                    inodes_max_for(&geometry),
                    geometry.inode_bytes
                ),
            ));
        }
        // The segment count sizes the inode map's file and tokens; a segment's number
        // is 32 bits, and a slot must fit a block (`inode_map_segment::slot_offset`).
        let segments = inodes_max.div_ceil(inodes_per_segment as u64);
        if segments > crate::inode_map_segment::SEGMENTS_MAX
            || crate::inode_map_segment::InodeMapSegment::slot_bytes(inodes_per_segment) as u64
                > geometry.block_bytes as u64
        {
            return Err(FormatError::invalid(
                S,
                location,
                format!(
                    "{inodes_per_segment} inodes per inode-map segment for {inodes_max} inodes \
                     ({segments} segments; at most {} segments of at most one block each)",
                    crate::inode_map_segment::SEGMENTS_MAX
                ),
            ));
        }
        if inode_file_start.is_null()
            || inode_file_start.disk() as usize >= disks.len()
            || inode_file_start.byte_offset() >= disks[inode_file_start.disk() as usize].size_bytes
        {
            return Err(FormatError::invalid(
                S,
                location,
                format!("inode file start {inode_file_start}"),
            ));
        }
        Ok(Descriptor {
            version,
            generation,
            fs_name,
            fs_uuid,
            geometry,
            default_metadata_replicas,
            max_metadata_replicas,
            default_data_replicas,
            max_data_replicas,
            layout,
            avoid_dir_fragments,
            dir_pre_split_levels,
            log_bytes,
            inodes_max,
            regions,
            inodes_per_segment,
            created_unix,
            mounted,
            metadata_inodes,
            inode_file_start,
            descriptor_disks,
            disks,
        })
    }

    /// Pick the disks that hold descriptor copies: three (five with five or more
    /// failure groups), each in a different failure group where possible.
    pub fn choose_descriptor_disks(disks: &[DiskEntry]) -> Vec<u32> {
        let mut groups: Vec<i32> = disks.iter().map(|d| d.failure_group).collect();
        groups.sort();
        groups.dedup();
        let want = if groups.len() >= 5 { 5 } else { 3 }.min(disks.len());
        let mut chosen: Vec<u32> = Vec::new();
        let mut used_groups: Vec<i32> = Vec::new();
        for d in disks {
            if chosen.len() < want && !used_groups.contains(&d.failure_group) {
                chosen.push(d.index);
                used_groups.push(d.failure_group);
            }
        }
        for d in disks {
            if chosen.len() < want && !chosen.contains(&d.index) {
                chosen.push(d.index);
            }
        }
        chosen
    }
}
