//! A clean, busy image checks clean, with one thread and in parallel, through the
//! offline path and through a plain reader; a repair run changes nothing.

mod common;

use common::*;
use mako_disk::nsd::IoTag;
use mako_disk::{BufferType, DiskError, LocalNsd, Nsd};
use mako_format::DiskAddress;
use mako_fs::fs::ROOT_INO;
use mako_fs::test_util::{small_config, small_params, MemDisks};
use mako_fsck::{
    check_through, MetadataReader, NoProgress, Options, Phase, ProblemKind, Progress, Report,
    EXIT_CLEAN,
};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

#[test]
fn busy_image_is_clean_in_parallel_and_serially() {
    let fx = fixture();
    let disks = fx.restore();
    for threads in [1, 2, 4] {
        let r = mako_fsck::check_offline(
            disks.as_dyn(),
            &Options::check().threads(threads),
            &NoProgress,
        )
        .unwrap();
        assert!(r.is_clean(), "{threads} threads:\n{}", r.render());
        assert_eq!(r.exit_code, EXIT_CLEAN);
        // Every file of the fixture (and the root) is counted.
        assert!(
            r.files >= (BIGDIR_ENTRIES + FRAGDIR_ENTRIES + 20) as u64,
            "{} files",
            r.files
        );
        assert_eq!(
            r.directories, 7,
            "root, dir1..3, emptydir, fragdir, bigdir, and no more"
        );
        if threads == 2 {
            eprintln!("{}", r.render());
        }
    }
}

#[test]
fn repair_of_a_clean_image_writes_nothing() {
    let fx = fixture();
    let disks = fx.restore();
    let before = snapshot(&disks);
    let writes: u64 = disks.disks.iter().map(|d| d.writes()).sum();
    let r = fsck(&disks, true);
    assert_eq!(r.exit_code, EXIT_CLEAN, "{}", r.render());
    assert_eq!(
        disks.disks.iter().map(|d| d.writes()).sum::<u64>(),
        writes,
        "a clean repair run wrote"
    );
    assert!(snapshot(&disks) == before, "the image changed");
}

/// A reader that is not the offline disks: what the online mode plugs in.
struct CountingReader {
    nsd: LocalNsd,
    reads: AtomicU64,
}

impl MetadataReader for CountingReader {
    fn read(
        &self,
        da: DiskAddress,
        buf: &mut [u8],
        what: BufferType,
        ino: u64,
    ) -> Result<(), DiskError> {
        self.reads.fetch_add(1, Ordering::Relaxed);
        self.nsd.read(
            da,
            buf,
            IoTag {
                buffer_type: what,
                ino,
            },
        )
    }
}

#[derive(Default)]
struct Phases(Mutex<Vec<(Phase, u64, u64)>>);
impl Progress for Phases {
    fn update(&self, phase: Phase, done: u64, total: u64) {
        self.0.lock().unwrap().push((phase, done, total));
    }
}

#[test]
fn a_check_through_another_reader_is_the_same_check() {
    let fx = fixture();
    let disks = fx.restore();
    let ins = Inspect::open(&disks);
    let reader = CountingReader {
        nsd: LocalNsd::new(disks.as_dyn(), 16),
        reads: AtomicU64::new(0),
    };
    let phases = Phases::default();
    let r = check_through(&ins.desc, &reader, &Options::check().threads(2), &phases).unwrap();
    assert!(r.is_clean(), "{}", r.render());
    // The inode file is read in chunks: far fewer reads than inodes.
    let reads = reader.reads.load(Ordering::Relaxed);
    assert!(reads > 0);
    let seen = phases.0.lock().unwrap();
    let inodes_done = seen.iter().rfind(|p| p.0 == Phase::Inodes).unwrap();
    assert_eq!(inodes_done.1, inodes_done.2, "progress reaches the total");
    assert!(
        check_through(&ins.desc, &reader, &Options::repair(), &NoProgress).is_err(),
        "a reader cannot repair"
    );
    // Damage seen through the reader is reported like offline.
    ins.flip(ins.inode_da(fx.ino("/tiny")), 300, 0x10);
    let r = check_through(&ins.desc, &reader, &Options::check(), &NoProgress).unwrap();
    assert!(
        r.of_kind(mako_fsck::ProblemKind::BadInode)
            .any(|p| p.ino == Some(fx.ino("/tiny"))),
        "{}",
        r.render()
    );
}

#[test]
fn an_unclean_file_system_is_checked_as_its_log_says_and_replayed_by_a_repair() {
    let fx = fixture();
    let disks = fx.restore();
    // Changes committed to the log (fsync) but not written in place; dropping the
    // mount without an unmount is a crash.
    let m = disks.mount(config());
    let fs = &m.fs;
    let d = fs.mkdir(C, ROOT_INO, b"after", 0o755, 0).unwrap().ino;
    let mut files = Vec::new();
    for i in 0..40u64 {
        let name = format!("f{i}");
        let f = fs
            .create(C, d, name.as_bytes(), 0o644, 0, true)
            .unwrap()
            .ino;
        fs.write(f, 0, &pattern(100 + i, 3000 + 500 * i as usize), false)
            .unwrap();
        files.push((name, f, pattern(100 + i, 3000 + 500 * i as usize)));
    }
    fs.unlink(ROOT_INO, b"tiny").unwrap();
    fs.rename(ROOT_INO, b"frag5000", d, b"moved", 0).unwrap();
    fs.fsync(files[0].1, false).unwrap();
    assert!(m.core().journal.durable_seq() > 0);
    drop(m);
    // -n reads the disks with the log laid over them: the only problem is the log
    // itself (the structure on disk alone would disagree with itself), and nothing is
    // written.
    let before = snapshot(&disks);
    let r = fsck(&disks, false);
    assert_eq!(r.exit_code, mako_fsck::EXIT_UNCORRECTED, "{}", r.render());
    assert!(
        r.problems.iter().all(|p| p.kind == ProblemKind::LogReplay),
        "only the log state:\n{}",
        r.render()
    );
    assert!(
        r.of_kind(ProblemKind::LogReplay)
            .any(|p| p.what.contains("committed transaction")),
        "{}",
        r.render()
    );
    assert!(snapshot(&disks) == before, "fsck -n wrote");
    // -y replays and marks the file system clean; then it is clean, mounts, and holds
    // everything that was committed.
    let r = fsck(&disks, true);
    assert_eq!(r.exit_code, mako_fsck::EXIT_CORRECTED, "{}", r.render());
    assert!(
        r.of_kind(ProblemKind::LogReplay).all(|p| p.fixed),
        "{}",
        r.render()
    );
    assert!(
        r.of_kind(ProblemKind::LogReplay)
            .any(|p| p.repair.contains("replayed in place")),
        "{}",
        r.render()
    );
    let r = fsck(&disks, false);
    assert!(r.is_clean(), "{}", r.render());
    let m = disks.mount(config());
    assert!(
        m.recovery.transactions == 0 && m.recovery.was_clean,
        "fsck -y left nothing to replay: {}",
        m.recovery.summary()
    );
    let d = lookup(&m.fs, "/after").unwrap();
    // Every name committed; the fsynced file's data exact; the others' data was never
    // written back (write-behind allocates at write-back), so it reads as a hole.
    for (k, (name, ino, data)) in files.iter().enumerate() {
        assert_eq!(m.fs.lookup(d, name.as_bytes()).unwrap().ino, *ino);
        let got = read_all(&m.fs, *ino);
        assert_eq!(got.len(), data.len(), "{name}");
        assert!(
            got == *data || (k > 0 && got.iter().all(|&b| b == 0)),
            "{name}: neither its data nor a hole"
        );
    }
    assert!(
        read_all(&m.fs, files[0].1) == files[0].2,
        "the fsynced file"
    );
    assert!(
        lookup(&m.fs, "/tiny").is_none()
            && lookup(&m.fs, "/after/moved").is_some()
            && lookup(&m.fs, "/frag5000").is_none()
    );
    m.unmount().unwrap();
    assert!(fsck(&disks, false).is_clean());
}

#[test]
fn a_cancelled_run_exits_32_and_writes_nothing() {
    let fx = fixture();
    let disks = fx.restore();
    let ins = Inspect::open(&disks);
    ins.flip(ins.inode_da(fx.ino("/tiny")), 300, 0x10);
    let before = snapshot(&disks);
    let opts = Options::repair();
    opts.cancel.store(true, Ordering::SeqCst);
    let e = mako_fsck::check_offline(disks.as_dyn(), &opts, &NoProgress).unwrap_err();
    assert_eq!(e.exit_code(), mako_fsck::EXIT_CANCELLED, "{e}");
    assert!(snapshot(&disks) == before, "a cancelled run wrote");
}

/// Write `header` as log header copy `k` (0 or 1) of node 0's log.
fn put_log_header(ins: &Inspect, k: u64, header: &mako_format::log_header::LogHeader) {
    let log = mako_format::log_table::log_ino(0);
    ins.write(ins.metafile_da(log, 512 * k), &header.encode());
}

#[test]
fn the_valid_log_header_copy_with_the_greater_tail_wins() {
    use mako_format::log_header::LogHeader;
    let fx = fixture();
    let disks = fx.restore();
    let ins = Inspect::open(&disks);
    let log = mako_format::log_table::log_ino(0);
    let clean = LogHeader {
        node: 0,
        log_bytes: ins.desc.log_bytes,
        tail_lsn: 40,
        head_lsn: 40,
        clean: true,
    };
    // Copy 1 valid and newer, copy 0 damaged: the check runs on copy 1 and reports
    // copy 0, which the repair rewrites.
    put_log_header(&ins, 1, &clean);
    ins.flip(ins.metafile_da(log, 0), 30, 0x01);
    let r = fsck(&disks, false);
    assert!(
        r.problems.iter().all(|p| p.kind == ProblemKind::LogHeader)
            && r.exit_code == mako_fsck::EXIT_UNCORRECTED,
        "{}",
        r.render()
    );
    assert_eq!(fsck(&disks, true).exit_code, mako_fsck::EXIT_CORRECTED);
    assert!(fsck(&disks, false).is_clean());
    // A newer copy that is not clean outranks an older clean one: an unclean stop.
    put_log_header(
        &ins,
        0,
        &LogHeader {
            tail_lsn: 10,
            head_lsn: 10,
            ..clean.clone()
        },
    );
    put_log_header(
        &ins,
        1,
        &LogHeader {
            tail_lsn: 50,
            head_lsn: 50,
            clean: false,
            ..clean.clone()
        },
    );
    let r = fsck(&disks, false);
    assert!(
        r.of_kind(ProblemKind::LogReplay)
            .any(|p| p.what.contains("not marked clean")),
        "{}",
        r.render()
    );
    // The newer copy clean, the older one not: the newer wins, the check is clean.
    put_log_header(
        &ins,
        0,
        &LogHeader {
            tail_lsn: 10,
            head_lsn: 30,
            clean: false,
            ..clean.clone()
        },
    );
    put_log_header(&ins, 1, &clean);
    assert!(fsck(&disks, false).is_clean());
}

/// A file in use with no links is one still open on a live node while the file system
/// is mounted (its last close frees it): the online check counts it and reports no
/// problem; offline, every node down, nobody can close it any more: `unlinked_inode`.
#[test]
fn an_open_unlinked_file_is_an_error_only_offline() {
    let fx = fixture();
    let disks = fx.restore();
    let ins = Inspect::open(&disks);
    let ino = fx.ino("/tiny");
    let mut e = ins.inline_entries(ROOT_INO);
    e.retain(|x| x.name != b"tiny");
    ins.set_inline_entries(ROOT_INO, e);
    let mut i = ins.inode(ino);
    i.nlink = 0;
    ins.put_inode(&i);
    let reader = CountingReader {
        nsd: LocalNsd::new(disks.as_dyn(), 16),
        reads: AtomicU64::new(0),
    };
    let online = check_through(&ins.desc, &reader, &Options::check(), &NoProgress).unwrap();
    assert!(online.is_clean(), "{}", online.render());
    assert_eq!(online.open_unlinked, vec![ino]);
    let offline = mako_fsck::check_offline(disks.as_dyn(), &Options::check(), &NoProgress).unwrap();
    assert!(
        offline
            .of_kind(ProblemKind::UnlinkedInode)
            .any(|p| p.ino == Some(ino)),
        "{}",
        offline.render()
    );
}

/// A kill -9 between an unlink's commit and its free's: FUSE frees an unlinked file at
/// the kernel's forget, which may come after a commit (an fsync of another file) made
/// the unlink durable. Its log shows the file with no links and no free of its number.
/// On a file system of one node, `fsck -n` before the mount lists it as freed by the
/// next mount (not `unlinked_inode`), and the mount frees it: the check after is clean.
/// With several nodes another node may still have it open, so it stays a problem.
fn unlinked_then_crash(log_count: u32) -> (MemDisks, u64, Report) {
    let disks = MemDisks::new(4, 64 << 20);
    disks.format(&mako_fs::mkfs::MkfsParams {
        log_count,
        ..small_params()
    });
    let m = disks.mount(small_config());
    let fs = &m.fs;
    let a = fs.create(C, ROOT_INO, b"a", 0o644, 0, true).unwrap();
    fs.write(a.ino, 0, &pattern(1, 166_333), false).unwrap();
    let b = fs.create(C, ROOT_INO, b"b", 0o644, 0, true).unwrap();
    fs.fsync(b.ino, false).unwrap();
    // The kernel knows the file (as after a lookup); the unlink leaves it to the forget.
    fs.add_lookup(a.ino);
    fs.unlink(ROOT_INO, b"a").unwrap();
    fs.fsync(b.ino, false).unwrap();
    // kill -9: dropped without unmount, nothing more is written.
    drop(m);
    let r = fsck(&disks, false);
    (disks, a.ino, r)
}

#[test]
fn a_file_unlinked_while_known_to_the_kernel_at_a_crash_is_freed_by_the_next_mount() {
    let (disks, ino, r) = unlinked_then_crash(1);
    assert_eq!(r.freed_at_mount, vec![ino], "{}", r.render());
    assert!(
        r.problems.iter().all(|p| p.kind == ProblemKind::LogReplay),
        "fsck -n after the crash finds more than the log to replay:\n{}",
        r.render()
    );
    let m = disks.mount(small_config());
    assert!(m.fs.lookup(ROOT_INO, b"b").is_ok());
    m.unmount().unwrap();
    let r = fsck(&disks, false);
    assert!(
        r.is_clean() && r.freed_at_mount.is_empty(),
        "{}",
        r.render()
    );
}

#[test]
fn a_file_unlinked_at_a_crash_stays_a_problem_with_several_nodes() {
    let (_, ino, r) = unlinked_then_crash(2);
    assert!(r.freed_at_mount.is_empty(), "{}", r.render());
    assert!(
        r.of_kind(ProblemKind::UnlinkedInode)
            .any(|p| p.ino == Some(ino)),
        "{}",
        r.render()
    );
}
