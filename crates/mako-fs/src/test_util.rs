//! Helpers for tests: small descriptors and file systems on in-memory disks.

use crate::core::FsConfig;
use crate::mkfs::{format_disks, DiskMeta, MkfsParams};
use crate::mount::{mount_disks, Mounted};
use mako_disk::{Disk, MemDisk};
use mako_format::descriptor::*;
use mako_format::disk_header::DiskUsage;
use mako_format::geometry::{default_subblocks, Geometry};
use mako_format::DiskAddress;
use std::sync::Arc;

pub fn test_descriptor(ndisks: u32, disk_bytes: u64, block_bytes: u32) -> Descriptor {
    let disks: Vec<DiskEntry> = (0..ndisks)
        .map(|i| DiskEntry {
            index: i,
            uuid: [i as u8; 16],
            name: format!("d{i}"),
            size_bytes: disk_bytes,
            pool: "system".into(),
            failure_group: i as i32 + 1,
            usage: DiskUsage::DataAndMetadata,
            status: DiskStatus::Ready,
        })
        .collect();
    Descriptor {
        version: 1,
        generation: 1,
        fs_name: "t".into(),
        fs_uuid: [7; 16],
        geometry: Geometry {
            block_bytes,
            subblocks_per_block: default_subblocks(block_bytes).unwrap(),
            inode_bytes: 4096,
            indirect_bytes: 32768.min(block_bytes),
        },
        default_metadata_replicas: 1,
        max_metadata_replicas: 1,
        default_data_replicas: 1,
        max_data_replicas: 1,
        layout: LayoutMap::Scatter,
        avoid_dir_fragments: false,
        dir_pre_split_levels: 0,
        log_bytes: 1 << 20,
        inodes_max: 1 << 16,
        regions: 4,
        inodes_per_segment: 32768,
        created_unix: 0,
        mounted: false,
        metadata_inodes: MetadataInodes {
            inode_file: 0,
            root_dir: 1,
            block_alloc_map: 2,
            inode_alloc_map: 3,
            log_table: 4,
            log_count: 1,
            first_user_inode: 16,
        },
        inode_file_start: DiskAddress::new(0, 128),
        descriptor_disks: Descriptor::choose_descriptor_disks(&disks),
        disks,
    }
}

/// In-memory disks, kept so a test can remount them.
pub struct MemDisks {
    pub disks: Vec<Arc<MemDisk>>,
}

impl MemDisks {
    pub fn new(n: usize, bytes: u64) -> MemDisks {
        MemDisks {
            disks: (0..n)
                .map(|i| Arc::new(MemDisk::new(&format!("d{i}"), bytes)))
                .collect(),
        }
    }
    pub fn as_dyn(&self) -> Vec<Arc<dyn Disk>> {
        self.disks
            .iter()
            .map(|d| d.clone() as Arc<dyn Disk>)
            .collect()
    }
    pub fn format(&self, params: &MkfsParams) {
        let meta: Vec<DiskMeta> = (0..self.disks.len())
            .map(|i| DiskMeta {
                name: format!("d{i}"),
                pool: "system".into(),
                failure_group: i as i32 + 1,
                usage: DiskUsage::DataAndMetadata,
            })
            .collect();
        format_disks(self.as_dyn(), &meta, params).expect("format");
    }
    pub fn mount(&self, cfg: FsConfig) -> Mounted {
        mount_disks(self.as_dyn(), cfg, 0).expect("mount")
    }
}

/// Small geometry for fast tests: 64 KiB blocks, 2 KiB subblocks.
pub fn small_params() -> MkfsParams {
    MkfsParams {
        block_bytes: 64 << 10,
        indirect_bytes: 4096,
        inode_bytes: 4096,
        inodes_max: Some(200_000),
        log_bytes: 1 << 20,
        ..MkfsParams::default()
    }
}

pub fn small_config() -> FsConfig {
    FsConfig {
        pagepool_bytes: 8 << 20,
        sync_interval_secs: 3600,
        prefetch_threads: 2,
        writebehind_threads: 1,
        ..FsConfig::default()
    }
}

/// Deterministic test data: `len` bytes of an xorshift stream seeded by `seed`.
pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}
