//! The first phase: which disk is which, the descriptor (majority of the copies, the
//! highest generation), and every descriptor copy and disk header checked against it.
//!
//! Disks may be given in any order. A disk's index comes from its header; a disk whose
//! header is damaged is matched to the descriptor by its name, or by elimination when
//! it is the only one left, so that a damaged header can be rewritten rather than
//! make the file system unusable.

use crate::error::FsckError;
use crate::problem::{describe, Problem, ProblemKind};
use mako_disk::Disk;
use mako_format::descriptor::{
    Descriptor, DiskEntry, DESCRIPTOR_BYTES_MAX, DESCRIPTOR_OFFSET, RESERVED_BYTES,
};
use mako_format::disk_header::{DiskHeader, DISK_HEADER_BYTES};
use mako_format::error::Location;
use mako_format::{DiskAddress, FormatErrorKind};
use std::sync::Arc;

/// The outcome of the first phase.
pub struct Superblock {
    pub desc: Descriptor,
    /// The disks ordered by their index in the file system.
    pub disks: Vec<Arc<dyn Disk>>,
    /// Disks whose descriptor copy must be rewritten from `desc`.
    pub rewrite_descriptor: Vec<u32>,
    /// Disks whose header must be rewritten from `desc`.
    pub rewrite_header: Vec<u32>,
}

enum Copy {
    Valid(Box<Descriptor>),
    Blank,
    Damaged(String),
}

struct Probe {
    header: Result<DiskHeader, String>,
    copy: Copy,
}

/// Address of the descriptor copy on disk `disk`.
pub fn descriptor_da(disk: u32) -> DiskAddress {
    DiskAddress::new(disk, DESCRIPTOR_OFFSET / mako_format::SECTOR_BYTES)
}

/// The header a disk of this file system must carry.
pub fn expected_header(desc: &Descriptor, entry: &DiskEntry) -> DiskHeader {
    DiskHeader {
        version: mako_format::FORMAT_VERSION,
        disk_uuid: entry.uuid,
        fs_uuid: desc.fs_uuid,
        name: entry.name.clone(),
        size_bytes: entry.size_bytes,
        sector_bytes: mako_format::SECTOR_BYTES as u32,
        pool: entry.pool.clone(),
        failure_group: entry.failure_group,
        usage: entry.usage,
        disk_index: entry.index,
    }
}

fn probe(d: &dyn Disk) -> Result<Probe, FsckError> {
    if d.size_bytes() < RESERVED_BYTES {
        return Err(FsckError::Unusable(format!(
            "disk {} is {} bytes, smaller than the {RESERVED_BYTES} bytes of header and descriptor every Mako disk starts with; \
             is it the right file?",
            d.name(),
            d.size_bytes()
        )));
    }
    let mut hbuf = vec![0u8; DISK_HEADER_BYTES];
    let header = match d.read_at(&mut hbuf, 0) {
        Ok(()) => DiskHeader::decode(&hbuf, Location::Memory).map_err(|e| describe(&e)),
        Err(e) => Err(format!("cannot be read: {e}")),
    };
    let mut dbuf = vec![0u8; DESCRIPTOR_BYTES_MAX];
    let copy = match d.read_at(&mut dbuf, DESCRIPTOR_OFFSET) {
        Ok(()) => match Descriptor::decode(&dbuf, Location::Memory) {
            Ok(desc) => Copy::Valid(Box::new(desc)),
            Err(e) if e.kind == (FormatErrorKind::BadMagic { found: 0 }) => Copy::Blank,
            Err(e) => Copy::Damaged(describe(&e)),
        },
        Err(e) => Copy::Damaged(format!("cannot be read: {e}")),
    };
    Ok(Probe { header, copy })
}

fn names(disks: &[Arc<dyn Disk>]) -> String {
    disks
        .iter()
        .map(|d| d.name().to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

/// Identify the disks, choose the descriptor, and check every copy and header.
pub fn open(
    given: Vec<Arc<dyn Disk>>,
    problems: &mut Vec<Problem>,
) -> Result<Superblock, FsckError> {
    if given.is_empty() {
        return Err(FsckError::Unusable("no disks given".into()));
    }
    let probes = given
        .iter()
        .map(|d| probe(d.as_ref()))
        .collect::<Result<Vec<_>, _>>()?;
    // 1. The descriptor: the highest generation among valid copies (as mount does);
    //    among copies of that generation, the one most copies agree with.
    let valid: Vec<&Descriptor> = probes
        .iter()
        .filter_map(|p| match &p.copy {
            Copy::Valid(d) => Some(d.as_ref()),
            _ => None,
        })
        .collect();
    let top = valid.iter().map(|d| d.generation).max().ok_or_else(|| {
        FsckError::Unusable(format!(
            "no valid file system descriptor on any of the disks ({}); are these the disks of a Mako file system?",
            names(&given)
        ))
    })?;
    let best: Descriptor = valid
        .iter()
        .filter(|d| d.generation == top)
        .max_by_key(|d| valid.iter().filter(|o| o == d).count())
        .map(|d| (*d).clone())
        .expect("a copy of the top generation");
    let n = best.disks.len();
    // 2. Which given disk holds which index.
    let mut slot: Vec<Option<usize>> = vec![None; n];
    let mut pending = Vec::new();
    for (p, pr) in probes.iter().enumerate() {
        match &pr.header {
            Ok(h) if h.fs_uuid == best.fs_uuid => {
                let i = h.disk_index as usize;
                if i < n && best.disks[i].uuid == h.disk_uuid && slot[i].is_none() {
                    slot[i] = Some(p);
                } else if i < n && slot[i].is_some() {
                    return Err(FsckError::Unusable(format!(
                        "disks {} and {} both claim index {i} of file system {}; one of them is a copy, pass only the disks in use",
                        given[slot[i].expect("taken")].name(),
                        given[p].name(),
                        best.fs_name
                    )));
                } else {
                    pending.push(p);
                }
            }
            Ok(h) if h.fs_uuid != [0; 16] => {
                return Err(FsckError::Unusable(format!(
                    "disk {} belongs to another file system (its header names file system {:02x?}); pass only the disks of {}",
                    given[p].name(),
                    &h.fs_uuid[..4],
                    best.fs_name
                )));
            }
            _ => pending.push(p),
        }
    }
    let mut unplaced = Vec::new();
    for p in pending {
        match (0..n).find(|&i| slot[i].is_none() && best.disks[i].name == given[p].name()) {
            Some(i) => slot[i] = Some(p),
            None => unplaced.push(p),
        }
    }
    let free: Vec<usize> = (0..n).filter(|&i| slot[i].is_none()).collect();
    if unplaced.len() == 1 && free.len() == 1 {
        slot[free[0]] = Some(unplaced[0]);
    } else if !unplaced.is_empty() {
        return Err(FsckError::Unusable(format!(
            "cannot tell which disk of file system {} the disk(s) {} are: their headers are unreadable and their names match \
             no free disk entry ({}); pass the disks with the names they have in cluster.toml",
            best.fs_name,
            unplaced.iter().map(|&p| given[p].name().to_string()).collect::<Vec<_>>().join(", "),
            free.iter().map(|&i| best.disks[i].name.clone()).collect::<Vec<_>>().join(", ")
        )));
    }
    let mut ordered = Vec::with_capacity(n);
    for (i, s) in slot.iter().enumerate() {
        let p = s.ok_or_else(|| {
            FsckError::Unusable(format!(
                "disk {} (index {i}) of file system {} is missing; pass every disk of the file system",
                best.disks[i].name, best.fs_name
            ))
        })?;
        if given[p].size_bytes() < best.disks[i].size_bytes {
            return Err(FsckError::Unusable(format!(
                "disk {} is truncated: {} bytes, the file system uses {}; restore the disk at its full size",
                best.disks[i].name,
                given[p].size_bytes(),
                best.disks[i].size_bytes
            )));
        }
        ordered.push(p);
    }
    // 3. A majority of the copies the descriptor lists must be readable.
    let expected = best.descriptor_disks.len();
    let readable = best
        .descriptor_disks
        .iter()
        .filter(|&&d| (d as usize) < n && matches!(&probes[ordered[d as usize]].copy, Copy::Valid(c) if c.fs_uuid == best.fs_uuid))
        .count();
    if readable * 2 <= expected {
        return Err(FsckError::Unusable(format!(
            "only {readable} of the {expected} descriptor copies of {} are readable; a majority is needed to trust one. \
             Restore the disks holding the others ({}) and run fsck again",
            best.fs_name,
            best.descriptor_disks.iter().map(|&d| best.disks.get(d as usize).map_or(format!("#{d}"), |e| e.name.clone())).collect::<Vec<_>>().join(", ")
        )));
    }
    let mut rewrite_descriptor = Vec::new();
    for &d in &best.descriptor_disks {
        let Some(&p) = ordered.get(d as usize) else {
            return Err(FsckError::Unusable(format!(
                "the descriptor lists disk {d} for a copy but has {n} disks"
            )));
        };
        let name = &best.disks[d as usize].name;
        let what = match &probes[p].copy {
            Copy::Valid(c) if **c == best => continue,
            Copy::Valid(c) if c.generation < best.generation => {
                format!("descriptor copy on disk {name} is stale: generation {}, the file system is at {}", c.generation, best.generation)
            }
            Copy::Valid(_) => format!(
                "descriptor copy on disk {name} differs from the majority copy of generation {}",
                best.generation
            ),
            Copy::Blank => format!("descriptor copy on disk {name} is lost (the slot is blank)"),
            Copy::Damaged(e) => format!("descriptor copy on disk {name} is damaged: {e}"),
        };
        problems.push(
            Problem::new(
                ProblemKind::DescriptorCopy,
                what,
                format!("rewrite it from the copy of generation {}", best.generation),
            )
            .at(descriptor_da(d)),
        );
        rewrite_descriptor.push(d);
    }
    // 4. Every disk header against the descriptor.
    let mut rewrite_header = Vec::new();
    for (i, entry) in best.disks.iter().enumerate() {
        let want = expected_header(&best, entry);
        let what = match &probes[ordered[i]].header {
            Ok(h) => {
                let mut diff = Vec::new();
                if h.disk_uuid != want.disk_uuid {
                    diff.push("disk UUID");
                }
                if h.fs_uuid != want.fs_uuid {
                    diff.push("file system UUID");
                }
                if h.name != want.name {
                    diff.push("name");
                }
                if h.size_bytes != want.size_bytes {
                    diff.push("size");
                }
                if h.pool != want.pool {
                    diff.push("pool");
                }
                if h.failure_group != want.failure_group {
                    diff.push("failure group");
                }
                if h.usage != want.usage {
                    diff.push("usage");
                }
                if h.disk_index != want.disk_index {
                    diff.push("index");
                }
                if diff.is_empty() {
                    continue;
                }
                format!(
                    "disk header of {} disagrees with the descriptor: {}",
                    entry.name,
                    diff.join(", ")
                )
            }
            Err(e) => format!("disk header of {} is damaged: {e}", entry.name),
        };
        problems.push(
            Problem::new(
                ProblemKind::DiskHeader,
                what,
                "rewrite it from the descriptor",
            )
            .at(DiskAddress::new(i as u32, 0)),
        );
        rewrite_header.push(i as u32);
    }
    best.check_supported().map_err(FsckError::Unusable)?;
    check_descriptor_fields(&best)?;
    let disks = ordered.iter().map(|&p| given[p].clone()).collect();
    Ok(Superblock {
        desc: best,
        disks,
        rewrite_descriptor,
        rewrite_header,
    })
}

/// Fields the rest of the check relies on. A descriptor that passed its checksum
/// and a majority vote but breaks these was written by a bug: nothing can be trusted.
fn check_descriptor_fields(d: &Descriptor) -> Result<(), FsckError> {
    let m = &d.metadata_inodes;
    let mut bad = Vec::new();
    let below_user = |ino: u64| ino < m.first_user_inode;
    if !(below_user(m.inode_file)
        && below_user(m.root_dir)
        && below_user(m.block_alloc_map)
        && below_user(m.inode_alloc_map))
    {
        bad.push("metadata inode numbers reach into the user range".to_string());
    }
    if !below_user(m.log_table)
        || (m.log_table + 1) * d.geometry.inode_bytes as u64 > d.geometry.block_bytes as u64
    {
        bad.push(format!(
            "the log table's inode {} is not a metadata inode of the inode file's first block",
            m.log_table
        ));
    }
    if m.log_count == 0 || m.log_count > mako_format::log_table::NODES_MAX {
        bad.push(format!("{} nodes", m.log_count));
    }
    if d.inodes_max <= m.first_user_inode {
        bad.push(format!("inode limit {} leaves no user inode", d.inodes_max));
    }
    if bad.is_empty() {
        Ok(())
    } else {
        Err(FsckError::Unusable(format!(
            "the descriptor of {} (generation {}) is inconsistent: {}; fsck cannot check this file system",
            d.fs_name,
            d.generation,
            bad.join("; ")
        )))
    }
}
