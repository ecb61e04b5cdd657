//! `mako fsck`: the parallel file system checker and repairer.
//!
//! A run goes in phases (`progress::Phase`): the disks and descriptor copies
//! (`superblock`), the metadata files and the log state (`metafiles`), every inode
//! in parallel over inode ranges (`scan`, with `tree` and `directory_check`), the
//! namespace (`namespace`), the allocation maps against what is in use (`maps`,
//! `crosslink`), then with `-y` the ordered repair (`repair`, `dir_build`,
//! `allocator`). What it found and did is a `Report` with e2fsck exit codes.
//!
//! API boundary: `check_offline` takes the disks of an unmounted file system (in any
//! order) and may repair them; `check_through` checks through any
//! `MetadataReader` and never writes — the online mode is the daemon handing in a
//! reader of the committed state of a mounted file system.
//!
//! Invariants: the check never writes; a repair never marks anything in use free, is
//! planned whole before its first write, and leaves a file system the next run can
//! repair if it stops between any two writes (see `repair`); only the stable parts of
//! mako-fs are used (`mount::{find_descriptor, …}`, `alloc_map::{region_slices,
//! segment_slot_bytes, first_block}`, `inode_map::InodeMap::segment_count`): the
//! walks over trees and directories are this crate's own, so that fsck does not trust
//! the code whose output it checks.

mod allocator;
mod crosslink;
mod dir_build;
mod directory_check;
pub mod error;
pub mod layout;
mod maps;
mod metafiles;
mod namespace;
pub mod problem;
pub mod progress;
pub mod reader;
mod repair;
pub mod replay;
mod scan;
mod space;
mod superblock;
mod tree;
mod xattr_check;

pub use error::FsckError;
pub use problem::{
    Problem, ProblemKind, Report, EXIT_CANCELLED, EXIT_CLEAN, EXIT_CORRECTED, EXIT_OPERATIONAL,
    EXIT_UNCORRECTED, EXIT_USAGE,
};
pub use progress::{JsonLines, NoProgress, Phase, Progress};
pub use reader::{MetadataReader, MetadataWriter, OfflineDisks};

use layout::Layout;
use mako_disk::Disk;
use mako_format::descriptor::Descriptor;
use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

/// How to run.
#[derive(Debug, Clone)]
pub struct Options {
    /// Repair (`-y`); otherwise only report (`-n`).
    pub repair: bool,
    /// Scan threads (`--threads`); the default is the number of available cores.
    pub threads: usize,
    /// Set from a signal handler to stop at the next safe point (exit 32).
    pub cancel: Arc<AtomicBool>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            repair: false,
            threads: std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(1),
            cancel: Arc::new(AtomicBool::new(false)),
        }
    }
}

impl Options {
    pub fn check() -> Options {
        Options::default()
    }
    pub fn repair() -> Options {
        Options {
            repair: true,
            ..Options::default()
        }
    }
    pub fn threads(mut self, n: usize) -> Options {
        self.threads = n.max(1);
        self
    }
}

fn cancelled(opts: &Options) -> Result<(), FsckError> {
    if opts.cancel.load(Ordering::Relaxed) {
        return Err(FsckError::Cancelled {
            during_repair: false,
        });
    }
    Ok(())
}

/// Check (and with `opts.repair`, repair) the unmounted file system on `disks`,
/// given in any order.
pub fn check_offline(
    disks: Vec<Arc<dyn Disk>>,
    opts: &Options,
    progress: &dyn Progress,
) -> Result<Report, FsckError> {
    let start = Instant::now();
    let mut problems = Vec::new();
    progress.update(Phase::Superblock, 0, 1);
    let sb = superblock::open(disks, &mut problems)?;
    progress.update(Phase::Superblock, 1, 1);
    let io = OfflineDisks::new(sb.disks.clone());
    // The recovery log first: replayed in place by -y, laid over every read by -n.
    let pending = replay::logs(&sb.desc, io.nsd(), opts.repair, &mut problems);
    let overlay = replay::Overlay::new(&io, pending.images);
    let (mut report, mut findings) = check(&sb.desc, &overlay, opts, progress, problems, true)?;
    if sb.desc.metadata_inodes.log_count == 1 {
        // One node: its next mount frees the inodes its log leaves in use with no links
        // (`mako_fs::mount`, `ReplayReport::orphans`): files unlinked while open or
        // known to its kernel when it stopped. Not damage, as long as the log holds them.
        report.problems.retain(|p| {
            let freed = p.kind == ProblemKind::UnlinkedInode
                && p.ino.is_some_and(|i| pending.orphans.contains_key(&i));
            if freed {
                report.freed_at_mount.extend(p.ino);
            }
            !freed
        });
    }
    findings.rewrite_descriptor = sb.rewrite_descriptor;
    findings.rewrite_header = sb.rewrite_header;
    if opts.repair && report.problems.iter().any(|p| p.correctable) {
        cancelled(opts)?;
        repair::run(
            &findings,
            &io,
            &io,
            &mut report.problems,
            &opts.cancel,
            progress,
        )?;
    }
    report.finish(start.elapsed());
    progress.finish();
    Ok(report)
}

/// Check a file system through `reader`, never writing. `desc` is its descriptor as
/// the reader's owner knows it. This is the online mode's entry point: the daemon
/// passes a reader of the committed state of the mounted file system.
pub fn check_through(
    desc: &Descriptor,
    reader: &dyn MetadataReader,
    opts: &Options,
    progress: &dyn Progress,
) -> Result<Report, FsckError> {
    if opts.repair {
        return Err(FsckError::NotSupported(
            "repairs need the file system unmounted: a reader-only check cannot write; run `mako fsck FS -y` offline".into(),
        ));
    }
    let start = Instant::now();
    let (mut report, _) = check(desc, reader, opts, progress, Vec::new(), false)?;
    report.finish(start.elapsed());
    progress.finish();
    Ok(report)
}

/// Every check phase; nothing is written.
fn check(
    desc: &Descriptor,
    r: &dyn MetadataReader,
    opts: &Options,
    progress: &dyn Progress,
    mut problems: Vec<Problem>,
    offline: bool,
) -> Result<(Report, repair::Findings), FsckError> {
    let l = Layout::new(desc);
    let mut report = Report::new(&desc.fs_name, opts.repair, opts.threads.max(1));
    cancelled(opts)?;
    progress.update(Phase::MetadataFiles, 0, 1);
    let meta = metafiles::read(&l, r, &mut problems)?;
    // Offline, an unclean stop is a problem (the log was replayed or laid over before
    // this check); online the file system is mounted, so of course it is not clean.
    let mark_clean = offline && metafiles::log_state_problems(&l, &meta.logs, &mut problems);
    progress.update(Phase::MetadataFiles, 1, 1);
    let owners = space::Ownership::new(&l);
    let scan = scan::run(
        &l,
        r,
        &meta,
        &owners,
        opts.threads.max(1),
        &opts.cancel,
        progress,
    )?;
    problems.extend(scan.problems);
    let mut recs = scan.recs;
    cancelled(opts)?;
    let ns = namespace::plan(&l, &mut recs, scan.slots, &mut problems, progress);
    if !offline {
        // Mounted: an inode in use with no links may be a file open on a live node
        // (its last close frees it), not damage.
        problems.retain(|p| {
            let open = p.kind == ProblemKind::UnlinkedInode;
            if open {
                report.open_unlinked.extend(p.ino);
            }
            !open
        });
    }
    let mut abandoned: BTreeSet<u64> = ns
        .free
        .iter()
        .chain(&ns.clear)
        .chain(ns.dirs.keys())
        .copied()
        .collect();
    for f in [&meta.alloc, &meta.imap]
        .into_iter()
        .chain(meta.logs.iter().map(|x| &x.file))
    {
        if f.blocks.is_none() {
            abandoned.insert(f.ino);
        }
    }
    let cross = crosslink::resolve(&l, &recs, &scan.conflicts, &abandoned, &mut problems);
    let claims = owners.to_bitmap();
    maps::compare_alloc(&l, &meta, &claims, &recs, &mut problems, progress);
    maps::compare_imap(&l, &meta, &recs, &mut problems);
    for p in problems.iter_mut() {
        if p.path.is_none() {
            p.path = p.ino.and_then(|ino| ns.path(ino));
        }
    }
    report.inodes_scanned = scan.scanned;
    report.files = recs.iter().filter(|r| r.live() && !r.system).count() as u64;
    report.directories = recs
        .iter()
        .filter(|r| r.live() && !r.system && r.is_dir())
        .count() as u64;
    report.problems = problems;
    let findings = repair::Findings {
        l,
        rewrite_descriptor: Vec::new(),
        rewrite_header: Vec::new(),
        mark_clean,
        meta,
        recs,
        claims,
        ns,
        cross,
    };
    Ok((report, findings))
}
