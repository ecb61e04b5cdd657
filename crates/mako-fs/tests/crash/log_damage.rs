//! Media damage in the middle of the recovery log, on crash images of the seeded
//! workload: every committed transaction but the last one (which a crash may tear,
//! and the main harness covers) is damaged in turn, in its header or its payload.
//! Only the last transaction can be torn, because each commit is synced before the
//! next is written; a bad transaction with a valid one after it is damage, and:
//!
//! 1. the mount refuses it, naming the LSN, `disk:sector` and `mako fsck -y`, and
//!    writes nothing;
//! 2. `mako fsck -n` reports it as `log_transaction_lost`;
//! 3. `mako fsck -y` replays the valid transactions on both sides and repairs what the
//!    lost one left inconsistent (exit 1), after which `fsck -n` is clean;
//! 4. the repaired file system mounts, passes the structural walk, unmounts, and is
//!    still clean.

use super::check::{walk, Violation};
use super::run::{config, disks_from};
use mako_disk::nsd::IoTag;
use mako_disk::{BufferType, Disk, LocalNsd, Nsd};
use mako_format::log_header::LOG_RECORDS_OFFSET;
use mako_format::log_record::{TxnHeader, TXN_HEADER_BYTES};
use mako_format::DiskAddress;
use mako_fs::mount::{find_descriptor, mount_disks};
use mako_fsck::{NoProgress, Options, ProblemKind, EXIT_CLEAN, EXIT_CORRECTED, EXIT_UNCORRECTED};
use std::sync::Arc;

/// One committed transaction of a crash image's log.
#[derive(Debug, Clone, Copy)]
pub struct LoggedTxn {
    pub lsn: u64,
    /// Where its first sector lies.
    pub da: DiskAddress,
    /// A byte in the middle of its payload: the sector and the offset in it (padding
    /// after the payload is not covered by its checksum).
    pub payload: (DiskAddress, u64),
}

/// The chain of committed transactions in node 0's log, from the tail its header names.
pub fn log_chain(images: &[Vec<u8>]) -> Vec<LoggedTxn> {
    let (_, disks) = disks_from(images.to_vec());
    let (desc, disks) = find_descriptor(disks).expect("a descriptor");
    let nsd = LocalNsd::new(disks, 16);
    let (log_ino, blocks) = mako_fs::recovery::log_blocks(&nsd, &desc, 0).expect("the log");
    let (header, _, _) = mako_fs::recovery::read_header(&nsd, &desc, 0).expect("a log header");
    let capacity = mako_fs::journal::log_capacity(desc.log_bytes);
    let bb = desc.geometry.block_bytes as u64;
    let da_of = |lsn: u64| {
        let off = LOG_RECORDS_OFFSET + lsn % capacity;
        blocks[(off / bb) as usize].offset_by(off % bb)
    };
    let tag = IoTag {
        buffer_type: BufferType::Log,
        ino: log_ino,
    };
    let mut out = Vec::new();
    let mut lsn = header.tail_lsn;
    while lsn + TXN_HEADER_BYTES as u64 <= header.tail_lsn + capacity {
        // A header never crosses a sector, so never a block of the log file.
        let mut h = vec![0u8; 512];
        nsd.read(da_of(lsn), &mut h, tag).unwrap();
        let loc = mako_format::error::Location::Disk(da_of(lsn));
        let Ok(th) = TxnHeader::decode(&h, 0, desc.fs_uuid, lsn, loc) else {
            break;
        };
        let mid = lsn + TXN_HEADER_BYTES as u64 + th.payload_bytes as u64 / 2;
        out.push(LoggedTxn {
            lsn,
            da: da_of(lsn),
            payload: (da_of(mid / 512 * 512), mid % 512),
        });
        lsn += th.total_bytes();
    }
    out
}

fn fsck(disks: &[Arc<dyn Disk>], repair: bool) -> mako_fsck::Report {
    let opts = if repair {
        Options::repair()
    } else {
        Options::check()
    }
    .threads(1);
    mako_fsck::check_offline(disks.to_vec(), &opts, &NoProgress).expect("fsck runs")
}

/// Damage `txn` in `images` (its header when `header`, else the middle of its payload)
/// and check steps 1 to 4 of the module doc. `what` names the case in violations.
pub fn damage_and_check(
    images: &[Vec<u8>],
    txn: LoggedTxn,
    header: bool,
    what: &str,
) -> Vec<Violation> {
    let mut v = Vec::new();
    let mut bad =
        |kind: &str, detail: String| v.push(Violation::new(kind, format!("{what}: {detail}")));
    let mut images = images.to_vec();
    let (da, byte) = if header { (txn.da, 20) } else { txn.payload };
    images[da.disk() as usize][(da.byte_offset() + byte) as usize] ^= 0x5a;

    // 1. The mount refuses and writes nothing.
    let (ctl, disks) = disks_from(images.clone());
    match mount_disks(disks, config(), 0) {
        Ok(_) => bad(
            "mount accepts a log damaged before its last transaction",
            format!(
                "transaction at LSN {} damaged, committed ones after it dropped",
                txn.lsn
            ),
        ),
        Err(e) => {
            let msg = e.to_string();
            for want in [
                format!("LSN {}", txn.lsn),
                txn.da.to_string(),
                "mako fsck -y".into(),
            ] {
                if !msg.contains(&want) {
                    bad(
                        "mount refusal does not name LSN, disk:sector and fsck",
                        format!("{want:?} missing: {msg}"),
                    );
                }
            }
        }
    }
    if ctl.writes() != 0 {
        bad("a refused mount wrote", format!("{} writes", ctl.writes()));
    }
    // 2. fsck -n names it.
    let (_, disks) = disks_from(images);
    let r = fsck(&disks, false);
    if r.exit_code != EXIT_UNCORRECTED
        || r.of_kind(ProblemKind::LogTransactionLost).next().is_none()
    {
        bad("fsck -n does not report the lost transaction", r.render());
    }
    // 3. fsck -y replays around it and repairs; fsck -n is clean after.
    let r = fsck(&disks, true);
    if r.exit_code != EXIT_CORRECTED {
        bad("fsck -y does not repair a lost log transaction", r.render());
    }
    let r = fsck(&disks, false);
    if r.exit_code != EXIT_CLEAN {
        bad("fsck -n is not clean after fsck -y", r.render());
    }
    // 4. Mount, walk, unmount, clean.
    match mount_disks(disks.clone(), config(), 0) {
        Err(e) => bad("the repaired file system does not mount", e.to_string()),
        Ok(m) => {
            let mut walked = Vec::new();
            walk(&m.fs, &mut walked);
            for w in walked {
                bad(&format!("after the repair: {}", w.kind), w.detail);
            }
            if let Err(e) = m.unmount() {
                bad("the repaired file system does not unmount", e.to_string());
            }
            let r = fsck(&disks, false);
            if r.exit_code != EXIT_CLEAN {
                bad(
                    "not clean after a mount and unmount of the repaired file system",
                    r.render(),
                );
            }
        }
    }
    v
}
