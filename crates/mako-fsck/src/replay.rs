//! The recovery log, before anything else is checked: an offline check must see the
//! file system as its last committed transaction left it, as a mount would.
//!
//! - `-y`: the log of every node is replayed in place by `mako_fs::recovery::replay`
//!   (the same code a mount runs; idempotent, so a crash during it is harmless).
//! - `-n`: nothing may be written, so the images a replay would write are read from
//!   the log (`mako_fs::recovery::pending`) and laid over every read (`Overlay`).
//!
//! Either way, a log that held committed transactions or a torn last one is reported
//! as a `log_replay` problem. Damaged committed transactions with valid ones after
//! them (media damage, which a mount refuses) are a `log_transaction_lost` problem
//! naming the LSN range and `disk:sector`: `-y` replays every valid transaction on
//! both sides (`mako_fs::recovery::replay_around_damage`), `-n` lays them all over its
//! reads, and the rest of the check finds what the lost ones left inconsistent. A log
//! that cannot be read at all (its inode or both header copies damaged) is left to the
//! metadata-file phase, which reports it.

use crate::problem::{Problem, ProblemKind};
use crate::reader::MetadataReader;
use mako_disk::{BufferType, DiskError, Nsd};
use mako_format::descriptor::Descriptor;
use mako_format::log_record::LogImage;
use mako_format::DiskAddress;
use mako_fs::recovery::ReplayReport;
use std::collections::BTreeMap;

/// What the logs leave for the check (`logs`).
#[derive(Default)]
pub struct Pending {
    /// The images to lay over reads (empty after an in-place replay).
    pub images: Vec<LogImage>,
    /// Check only: the inodes the logs' last images leave in use with no links, no
    /// free of their number logged after (`ReplayReport::orphans`), with their
    /// generation. A mount of a file system of one node frees its own
    /// (`mako_fs::mount`); after an in-place replay (`-y`) no mount will, and they are
    /// left to the check (`unlinked_inode`).
    pub orphans: BTreeMap<u64, u32>,
}

/// Replay (`repair`) or collect (check only) the logs of every node.
pub fn logs(
    desc: &Descriptor,
    nsd: &dyn Nsd,
    repair: bool,
    problems: &mut Vec<Problem>,
) -> Pending {
    let mut out = Pending::default();
    let m = desc.metadata_inodes;
    for node in 0..m.log_count {
        let ino = mako_format::log_table::log_ino(node);
        let result = if repair {
            mako_fs::recovery::replay_around_damage(nsd, desc, node).map(|r| (r, Vec::new()))
        } else {
            mako_fs::recovery::pending(nsd, desc, node)
        };
        match result {
            Ok((report, pending)) => {
                if let Some(p) = problem(&report, ino, repair) {
                    problems.push(p);
                }
                for lost in &report.lost {
                    problems.push(
                        Problem::new(
                            ProblemKind::LogTransactionLost,
                            format!("recovery log: {}", lost.describe(node)),
                            if repair {
                                "the valid transactions before and after the damage were replayed; the lost ones' changes are gone, \
                                 and what they left inconsistent is repaired by the rest of this run"
                            } else {
                                "replay the valid transactions before and after the damage (this check read the file system as if \
                                 they were) and repair what the lost ones left inconsistent"
                            },
                        )
                        .ino(ino)
                        .at(lost.da),
                    );
                }
                // The replay rewrote a damaged header copy (a check only reports it
                // when it reads the headers, in the metadata-file phase).
                if let (true, Some(why)) = (repair, &report.header_problem) {
                    problems.push(
                        Problem::new(
                            ProblemKind::LogHeader,
                            format!("a recovery log header copy of node {node} (inode {ino}) was damaged: {why}"),
                            "both copies rewritten from the valid one by the replay",
                        )
                        .ino(ino),
                    );
                }
                if !repair {
                    out.orphans.extend(&report.orphans);
                }
                out.images.extend(pending);
            }
            Err(e) => {
                // The metadata-file phase names a damaged log inode or header; an
                // error here that it will not see is reported now.
                let msg = e.to_string();
                if msg.contains("overlap") {
                    problems.push(
                        Problem::new(
                            ProblemKind::LogReplay,
                            format!("the recovery log of node {node} cannot be replayed: {msg}"),
                            "none: this is a Mako bug, report it with the log file; the check goes on without the log",
                        )
                        .ino(ino)
                        .uncorrectable(),
                    );
                }
            }
        }
    }
    out
}

fn problem(r: &ReplayReport, ino: u64, replayed: bool) -> Option<Problem> {
    if r.transactions == 0 && r.torn_tail.is_none() {
        return None;
    }
    let mut what = format!("the recovery log of node {} holds ", r.node);
    if r.transactions > 0 {
        what += &format!(
            "{} committed transaction(s) not yet in place ({} images, {} KiB of log, LSN {}..{})",
            r.transactions,
            r.images,
            r.log_bytes.div_ceil(1024),
            r.tail_lsn,
            r.head_lsn
        );
        if r.revoked > 0 {
            what += &format!(
                "; {} older images in it are revoked ({} revoke records: written in place before their token left the node, \
                 perhaps changed by another node since) and are not replayed",
                r.revoked, r.revokes
            );
        }
    } else {
        what += "no committed transaction";
    }
    if let Some(t) = &r.torn_tail {
        what += &format!(
            ", and a torn last transaction at LSN {} that was never acknowledged ({t})",
            r.head_lsn
        );
    }
    let repair = if replayed {
        format!(
            "replayed in place ({} KiB written in {:.2} s){}",
            r.image_bytes.div_ceil(1024),
            r.duration.as_secs_f64(),
            if r.torn_tail.is_some() {
                ", the torn tail discarded"
            } else {
                ""
            }
        )
    } else {
        "replay the log (as a mount would) and discard a torn tail; this check read the file system as if replayed".to_string()
    };
    Some(Problem::new(ProblemKind::LogReplay, what, repair).ino(ino))
}

/// A reader that sees the disks with the log's images laid over them.
pub struct Overlay<'a> {
    inner: &'a dyn MetadataReader,
    /// Images by address; they never overlap each other.
    images: BTreeMap<DiskAddress, LogImage>,
    /// The longest image, in sectors: how far back an image may start and still reach.
    max_sectors: u64,
}

impl<'a> Overlay<'a> {
    pub fn new(inner: &'a dyn MetadataReader, images: Vec<LogImage>) -> Overlay<'a> {
        let max_sectors = images
            .iter()
            .map(|i| (i.length as u64).div_ceil(512))
            .max()
            .unwrap_or(0);
        Overlay {
            inner,
            images: images.into_iter().map(|i| (i.da, i)).collect(),
            max_sectors,
        }
    }
    pub fn is_empty(&self) -> bool {
        self.images.is_empty()
    }
}

impl MetadataReader for Overlay<'_> {
    fn read(
        &self,
        da: DiskAddress,
        buf: &mut [u8],
        what: BufferType,
        ino: u64,
    ) -> Result<(), DiskError> {
        self.inner.read(da, buf, what, ino)?;
        if self.images.is_empty() {
            return Ok(());
        }
        let from = DiskAddress::new(da.disk(), da.sector().saturating_sub(self.max_sectors));
        let to = DiskAddress::new(da.disk(), da.sector() + (buf.len() as u64).div_ceil(512));
        for img in self.images.range(from..to).map(|(_, img)| img) {
            img.apply(da, buf);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Zeros;
    impl MetadataReader for Zeros {
        fn read(
            &self,
            _: DiskAddress,
            buf: &mut [u8],
            _: BufferType,
            _: u64,
        ) -> Result<(), DiskError> {
            buf.fill(0xee);
            Ok(())
        }
    }

    #[test]
    fn images_cover_exactly_their_bytes() {
        let img = |disk, sector, length: u32, bytes: &[u8]| LogImage {
            da: DiskAddress::new(disk, sector),
            length,
            bytes: bytes.to_vec(),
        };
        let o = Overlay::new(
            &Zeros,
            vec![
                img(0, 8, 1024, &[1, 2, 3]),
                img(0, 20, 512, &[9; 512]),
                img(1, 8, 512, &[7]),
            ],
        );
        // A read that starts inside the first image and ends inside the second.
        let mut buf = vec![0u8; 12 * 512];
        o.read(DiskAddress::new(0, 9), &mut buf, BufferType::Inode, 0)
            .unwrap();
        assert!(
            buf[..512].iter().all(|&b| b == 0),
            "the rest of image 1 is its implied zeros"
        );
        let disk_part = &buf[512..(20 - 9) * 512];
        assert!(
            disk_part.iter().all(|&b| b == 0xee),
            "between the images the disk shows"
        );
        assert!(buf[(20 - 9) * 512..].iter().all(|&b| b == 9), "image 2");
        // The first image from its start; another disk is not touched by disk 0's images.
        let mut buf = vec![0u8; 512];
        o.read(DiskAddress::new(0, 8), &mut buf, BufferType::Inode, 0)
            .unwrap();
        assert_eq!(&buf[..4], &[1, 2, 3, 0]);
        o.read(DiskAddress::new(2, 8), &mut buf, BufferType::Inode, 0)
            .unwrap();
        assert!(buf.iter().all(|&b| b == 0xee));
    }
}
