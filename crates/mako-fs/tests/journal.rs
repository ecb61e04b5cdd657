//! Recovery log tests on in-memory disks: what fsync promises survives a crash (the
//! mounted file system dropped without unmount, its disks remounted as they are), the
//! log wraps around its circle, evicted metadata is read back through the overlay of
//! committed images, and freed space is not reused before its checkpoint.
//!
//! The crash here keeps every write that reached the disks; lost and torn unsynced
//! writes are the crash-test backend's (tests/crash_consistency.rs).

use mako_disk::{Disk, MemDisk};
use mako_fs::fs::{Ctx, SetAttr, ROOT_INO};
use mako_fs::test_util::pattern;
use mako_fs::test_util::{small_config, small_params, MemDisks};
use mako_fs::{FsConfig, FsError};
use std::sync::Arc;

const C: Ctx = Ctx {
    uid: 0,
    gid: 0,
    pid: 1,
};

/// No background threads: only fsync/sync write, so the test knows what is durable.
fn quiet() -> FsConfig {
    FsConfig {
        background_workers: false,
        ..small_config()
    }
}

/// The disks as a crash leaves them: every completed write, nothing more.
fn crash_copy(disks: &MemDisks) -> MemDisks {
    MemDisks {
        disks: disks
            .disks
            .iter()
            .enumerate()
            .map(|(i, d)| {
                let img = d.snapshot();
                let m = MemDisk::new(&format!("d{i}"), img.len() as u64);
                m.write_at(&img, 0).unwrap();
                Arc::new(m)
            })
            .collect(),
    }
}

#[test]
fn fsynced_files_survive_a_crash_and_replay_is_reported() {
    let disks = MemDisks::new(4, 32 << 20);
    disks.format(&small_params());
    let m = disks.mount(quiet());
    assert_eq!(
        m.recovery.transactions, 0,
        "a fresh file system has nothing to replay"
    );
    let fs = &m.fs;
    let d = fs.mkdir(C, ROOT_INO, b"dir", 0o755, 0).unwrap();
    let mut files = Vec::new();
    for (i, size) in [0usize, 100, 5000, 64 << 10, 300_000]
        .into_iter()
        .enumerate()
    {
        let a = fs
            .create(C, d.ino, format!("f{i}").as_bytes(), 0o644, 0, true)
            .unwrap();
        fs.write(a.ino, 0, &pattern(i as u64, size), false).unwrap();
        fs.setxattr(a.ino, b"user.n", format!("{i}").as_bytes(), 0)
            .unwrap();
        files.push((a.ino, size));
    }
    for (ino, _) in &files {
        fs.fsync(*ino, false).unwrap();
    }
    // Changes after the last fsync may or may not survive; these are not checked.
    let late = fs.create(C, ROOT_INO, b"late", 0o644, 0, true).unwrap();
    fs.write(late.ino, 0, b"not synced", false).unwrap();
    let stats = &m.core().journal.stats;
    assert!(stats.commits.load(std::sync::atomic::Ordering::Relaxed) >= 1);
    let crashed = crash_copy(&disks);
    drop(m);

    let m = crashed.mount(quiet());
    assert!(
        m.recovery.transactions >= 1,
        "the fsync's transaction is replayed: {:?}",
        m.recovery
    );
    assert!(m.recovery.images > 0);
    assert!(!m.recovery.was_clean);
    let fs = &m.fs;
    let d = fs.lookup(ROOT_INO, b"dir").unwrap();
    for (i, (_, size)) in files.iter().enumerate() {
        let a = fs.lookup(d.ino, format!("f{i}").as_bytes()).unwrap();
        assert_eq!(a.size, *size as u64, "f{i}");
        assert_eq!(
            fs.read(a.ino, 0, *size as u32 + 10).unwrap(),
            pattern(i as u64, *size),
            "f{i} content"
        );
        assert_eq!(
            fs.getxattr(a.ino, b"user.n").unwrap(),
            format!("{i}").into_bytes()
        );
    }
    // The recovered file system works: new files, remount, clean stop.
    let n = fs.create(C, ROOT_INO, b"after", 0o644, 0, false).unwrap();
    fs.write(n.ino, 0, b"after recovery", false).unwrap();
    m.unmount().unwrap();
    let m = crashed.mount(quiet());
    assert_eq!(
        m.recovery.transactions, 0,
        "a clean unmount leaves nothing to replay"
    );
    assert!(m.recovery.was_clean);
    let a = m.fs.lookup(ROOT_INO, b"after").unwrap();
    assert_eq!(m.fs.read(a.ino, 0, 100).unwrap(), b"after recovery");
    m.unmount().unwrap();
}

#[test]
fn renames_and_unlinks_after_fsync_are_atomic_across_a_crash() {
    let disks = MemDisks::new(2, 32 << 20);
    disks.format(&small_params());
    let m = disks.mount(quiet());
    let fs = &m.fs;
    let a = fs.create(C, ROOT_INO, b"old", 0o644, 0, true).unwrap();
    fs.write(a.ino, 0, &pattern(7, 70_000), false).unwrap();
    let b = fs.create(C, ROOT_INO, b"gone", 0o644, 0, true).unwrap();
    fs.write(b.ino, 0, &pattern(8, 1000), false).unwrap();
    fs.fsync(a.ino, false).unwrap();
    fs.rename(ROOT_INO, b"old", ROOT_INO, b"new", 0).unwrap();
    fs.unlink(ROOT_INO, b"gone").unwrap();
    fs.fsync(ROOT_INO, false).unwrap();
    let crashed = crash_copy(&disks);
    drop(m);
    let m = crashed.mount(quiet());
    let fs = &m.fs;
    assert!(matches!(
        fs.lookup(ROOT_INO, b"old"),
        Err(FsError::NotFound(_))
    ));
    assert!(matches!(
        fs.lookup(ROOT_INO, b"gone"),
        Err(FsError::NotFound(_))
    ));
    let n = fs.lookup(ROOT_INO, b"new").unwrap();
    assert_eq!(fs.read(n.ino, 0, 80_000).unwrap(), pattern(7, 70_000));
    m.unmount().unwrap();
}

#[test]
fn log_wraps_around_many_times_and_still_recovers() {
    let disks = MemDisks::new(2, 32 << 20);
    disks.format(&small_params()); // 1 MiB log
    let m = disks.mount(quiet());
    let fs = &m.fs;
    let cap = m.core().journal.capacity();
    let mut expect = Vec::new();
    // Enough fsynced transactions to go round the 1 MiB log several times.
    for i in 0..1200u64 {
        let name = format!("file{i:04}");
        let a = fs
            .create(C, ROOT_INO, name.as_bytes(), 0o644, 0, true)
            .unwrap();
        fs.write(a.ino, 0, &pattern(i, (i as usize * 37) % 9000), false)
            .unwrap();
        fs.fsync(a.ino, false).unwrap();
        if i % 3 == 0 && i > 0 {
            let victim = format!("file{:04}", i - 1);
            fs.unlink(ROOT_INO, victim.as_bytes()).unwrap();
            expect.retain(|(n, _)| *n != victim);
        }
        expect.push((name, i));
        // Checkpoints happen when the log fills (no sync thread here).
    }
    fs.fsync(ROOT_INO, false).unwrap();
    let head = m.core().journal.head_lsn();
    assert!(
        head > 2 * cap,
        "the log went round {} times (head {head}, capacity {cap})",
        head / cap
    );
    assert!(
        m.core()
            .journal
            .stats
            .checkpoints
            .load(std::sync::atomic::Ordering::Relaxed)
            > 0
    );
    let crashed = crash_copy(&disks);
    drop(m);
    let m = crashed.mount(quiet());
    let fs = &m.fs;
    for (name, i) in &expect {
        let a = fs
            .lookup(ROOT_INO, name.as_bytes())
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(
            fs.read(a.ino, 0, 10_000).unwrap(),
            pattern(*i, (*i as usize * 37) % 9000),
            "{name}"
        );
    }
    assert_eq!(
        fs.readdir(ROOT_INO, 0, 10_000).unwrap().len(),
        expect.len() + 2
    );
    m.unmount().unwrap();
}

#[test]
fn evicted_inodes_are_read_back_through_the_overlay_before_checkpoint() {
    let disks = MemDisks::new(2, 32 << 20);
    disks.format(&small_params());
    let m = disks.mount(FsConfig {
        max_files_to_cache: 20,
        max_stat_cache: 0,
        ..quiet()
    });
    let fs = &m.fs;
    let core = m.core().clone();
    let mut inos = Vec::new();
    for i in 0..200u64 {
        let a = fs
            .create(C, ROOT_INO, format!("e{i}").as_bytes(), 0o600, 0, true)
            .unwrap();
        fs.write(a.ino, 0, &pattern(i, 3000), false).unwrap();
        inos.push(a.ino);
    }
    fs.sync().unwrap(); // committed, not checkpointed: the images wait in the overlay
    assert!(core.journal.pending_images() > 0);
    mako_fs::workers::evict_inodes(&core).unwrap();
    assert!(
        core.inodes.lock().len() <= 40,
        "{} inodes still cached",
        core.inodes.lock().len()
    );
    core.pool.drop_clean();
    for (i, ino) in inos.iter().enumerate() {
        let a = fs.getattr(*ino).unwrap();
        assert_eq!(a.size, 3000, "inode {ino} read back older than committed");
        assert_eq!(fs.read(*ino, 0, 3000).unwrap(), pattern(i as u64, 3000));
    }
    core.journal.checkpoint(&core).unwrap();
    assert_eq!(core.journal.pending_images(), 0);
    m.unmount().unwrap();
}

#[test]
fn freed_space_is_not_reused_before_its_checkpoint() {
    let disks = MemDisks::new(1, 32 << 20);
    disks.format(&small_params());
    let m = disks.mount(quiet());
    let fs = &m.fs;
    let core = m.core().clone();
    let a = fs.create(C, ROOT_INO, b"a", 0o644, 0, true).unwrap();
    fs.write(a.ino, 0, &pattern(1, 64 << 10), false).unwrap();
    fs.fsync(a.ino, false).unwrap();
    let old: Vec<_> = fs
        .block_list(a.ino)
        .unwrap()
        .into_iter()
        .map(|(_, d)| d)
        .collect();
    fs.setattr(
        a.ino,
        SetAttr {
            size: Some(0),
            ..Default::default()
        },
    )
    .unwrap();
    assert!(core.alloc.quarantined_subblocks() > 0);
    let b = fs.create(C, ROOT_INO, b"b", 0o644, 0, true).unwrap();
    fs.write(b.ino, 0, &pattern(2, 64 << 10), false).unwrap();
    fs.fsync(b.ino, false).unwrap();
    let new: Vec<_> = fs
        .block_list(b.ino)
        .unwrap()
        .into_iter()
        .map(|(_, d)| d)
        .collect();
    assert!(
        old.iter().all(|d| !new.contains(d)),
        "a block freed by an uncheckpointed transaction was reused"
    );
    core.journal.checkpoint(&core).unwrap();
    assert_eq!(
        core.alloc.quarantined_subblocks(),
        0,
        "the checkpoint releases the quarantine"
    );
    m.unmount().unwrap();
}

#[test]
fn full_file_system_reuses_freed_space_after_forcing_a_checkpoint() {
    let disks = MemDisks::new(1, 16 << 20);
    disks.format(&small_params());
    let m = disks.mount(small_config()); // write-behind runs: the writes below are large
    let fs = &m.fs;
    let chunk = pattern(3, 256 << 10);
    let a = fs.create(C, ROOT_INO, b"fill", 0o644, 0, true).unwrap();
    let mut off = 0u64;
    loop {
        match fs.write(a.ino, off, &chunk, false) {
            Ok(n) if n == chunk.len() => off += n as u64,
            Ok(n) => {
                off += n as u64;
                break;
            }
            Err(FsError::NoSpace(_)) => break,
            Err(e) => panic!("{e}"),
        }
    }
    fs.sync().unwrap();
    fs.unlink(ROOT_INO, b"fill").unwrap();
    // All of it is quarantined now; the write must still succeed (it checkpoints).
    let b = fs.create(C, ROOT_INO, b"again", 0o644, 0, true).unwrap();
    let mut off2 = 0u64;
    while off2 < off / 2 {
        off2 += fs.write(b.ino, off2, &chunk, false).unwrap() as u64;
    }
    fs.sync().unwrap();
    m.unmount().unwrap();
}

#[test]
fn rename_over_a_file_writes_the_new_data_first() {
    let disks = MemDisks::new(2, 32 << 20);
    disks.format(&small_params());
    let m = disks.mount(quiet());
    let fs = &m.fs;
    let old = fs.create(C, ROOT_INO, b"config", 0o644, 0, true).unwrap();
    fs.write(old.ino, 0, &pattern(1, 20_000), false).unwrap();
    fs.fsync(old.ino, false).unwrap();
    // The replace-by-rename idiom, without an fsync of the new file.
    let tmp = fs
        .create(C, ROOT_INO, b"config.tmp", 0o644, 0, true)
        .unwrap();
    fs.write(tmp.ino, 0, &pattern(2, 30_000), false).unwrap();
    fs.rename(ROOT_INO, b"config.tmp", ROOT_INO, b"config", 0)
        .unwrap();
    // Something else commits the log (another program's fsync).
    let other = fs.create(C, ROOT_INO, b"other", 0o644, 0, true).unwrap();
    fs.fsync(other.ino, false).unwrap();
    let crashed = crash_copy(&disks);
    drop(m);
    let m = crashed.mount(quiet());
    let a = m.fs.lookup(ROOT_INO, b"config").unwrap();
    assert_eq!(
        m.fs.read(a.ino, 0, 40_000).unwrap(),
        pattern(2, 30_000),
        "the renamed file has its data, not zeros"
    );
    m.unmount().unwrap();
}

/// Replay of a full log from file-backed disks: the time is printed (the figure of the
/// recovery time), correctness is asserted. `MAKO_RECOVERY_LOG_MIB` sets the log size
/// (CI: 4 MiB; the figure: 32, the default log).
#[test]
fn a_full_log_replays_from_disk_files() {
    use mako_format::disk_header::DiskUsage;
    use mako_fs::mkfs::{format, DiskSpec, MkfsParams};
    let log_mib: u64 = std::env::var("MAKO_RECOVERY_LOG_MIB")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(4);
    let dir = tempfile::Builder::new()
        .prefix("mako-recovery-")
        .tempdir_in("/var/tmp")
        .unwrap();
    let specs: Vec<DiskSpec> = (0..4)
        .map(|i| {
            let path = dir.path().join(format!("d{i}.img"));
            std::fs::File::create(&path)
                .unwrap()
                .set_len(512 << 20)
                .unwrap();
            DiskSpec {
                name: format!("d{i}"),
                path,
                pool: "system".into(),
                failure_group: i + 1,
                usage: DiskUsage::DataAndMetadata,
            }
        })
        .collect();
    format(
        &specs,
        &MkfsParams {
            block_bytes: 1 << 20,
            log_bytes: log_mib << 20,
            ..MkfsParams::default()
        },
    )
    .unwrap();
    let cfg = FsConfig {
        background_workers: false,
        pagepool_bytes: 64 << 20,
        ..FsConfig::default()
    };
    let m = mako_fs::mount::mount(&specs, cfg.clone(), 0).unwrap();
    let fs = &m.fs;
    let core = m.core().clone();
    let cap = core.journal.capacity();
    // Fill the log with transactions of 50 creates each, without a checkpoint.
    let mut n = 0u64;
    let mut dirs = Vec::new();
    while core.journal.used_bytes() < cap * 9 / 10
        && core
            .journal
            .stats
            .checkpoints
            .load(std::sync::atomic::Ordering::Relaxed)
            == 0
    {
        let d = fs
            .mkdir(C, ROOT_INO, format!("d{n}").as_bytes(), 0o755, 0)
            .unwrap();
        for k in 0..50u32 {
            let a = fs
                .create(C, d.ino, format!("file-{k}").as_bytes(), 0o644, 0, true)
                .unwrap();
            fs.setxattr(a.ino, b"user.k", &k.to_le_bytes(), 0).unwrap();
        }
        fs.fsync(d.ino, false).unwrap();
        dirs.push(d.ino);
        n += 1;
    }
    let used = core.journal.used_bytes();
    drop(m); // a crash: nothing more is written
    let m = mako_fs::mount::mount(&specs, cfg, 0).unwrap();
    let r = &m.recovery;
    println!(
        "replayed a {:.1} MiB log ({} transactions, {} images, {:.1} MiB written in place) in {} ms from 4 file-backed disks",
        used as f64 / (1 << 20) as f64,
        r.transactions,
        r.images,
        r.image_bytes as f64 / (1 << 20) as f64,
        r.duration.as_millis()
    );
    assert!(r.transactions >= n, "every transaction replayed");
    assert!(r.log_bytes >= used * 9 / 10);
    for i in [0, n / 2, n - 1] {
        let d = m.fs.lookup(ROOT_INO, format!("d{i}").as_bytes()).unwrap();
        assert_eq!(
            m.fs.readdir(d.ino, 0, 1000).unwrap().len(),
            52,
            "directory d{i} complete"
        );
    }
    m.unmount().unwrap();
}

/// Where LSN `lsn` of node 0's log lies on disk.
fn log_da(core: &mako_fs::Core, lsn: u64) -> mako_format::DiskAddress {
    let log = mako_format::log_table::log_ino(0);
    let off = mako_format::log_header::LOG_RECORDS_OFFSET + lsn % core.journal.capacity();
    core.metafile_da(log, off).unwrap()
}

/// Create `name` with some data and fsync it: one committed transaction. Returns the
/// LSN range it took in the log.
fn commit_file(m: &mako_fs::Mounted, name: &str, seed: u64) -> (u64, u64) {
    let lsn = m.core().journal.head_lsn();
    let a =
        m.fs.create(C, ROOT_INO, name.as_bytes(), 0o644, 0, true)
            .unwrap();
    m.fs.write(a.ino, 0, &pattern(seed, 3000), false).unwrap();
    m.fs.fsync(a.ino, false).unwrap();
    let end = m.core().journal.head_lsn();
    assert!(end > lsn, "{name} committed a transaction");
    (lsn, end)
}

/// Flip one byte of a disk (a sector gone bad, as a media error leaves it).
fn damage(disks: &MemDisks, da: mako_format::DiskAddress, byte: u64) {
    disks.disks[da.disk() as usize].corrupt(da.byte_offset() + byte, 0x5a);
}

/// A committed transaction damaged in the middle of the log, with valid ones after it,
/// is media damage, not a torn last commit: the mount refuses (naming the LSN,
/// `disk:sector` and `mako fsck -y`) and writes nothing; replaying around the damage
/// (what fsck -y does) keeps every valid transaction after it. Damage in the payload
/// (the header says where the next one starts) and in the header (the next one is
/// searched for).
#[test]
fn damage_in_the_middle_of_the_log_is_refused_at_mount() {
    for (what, byte) in [("payload", 300u64), ("header", 20), ("header magic", 0)] {
        let disks = MemDisks::new(2, 32 << 20);
        disks.format(&small_params());
        let m = disks.mount(quiet());
        commit_file(&m, "before", 1);
        let (lsn, next) = commit_file(&m, "damaged", 2);
        commit_file(&m, "after", 3);
        commit_file(&m, "after2", 4);
        let da = log_da(m.core(), lsn);
        let crashed = crash_copy(&disks);
        drop(m);
        damage(&crashed, da, byte);
        let images: Vec<Vec<u8>> = crashed.disks.iter().map(|d| d.snapshot()).collect();
        let e = match mako_fs::mount::mount_disks(crashed.as_dyn(), quiet(), 0) {
            Ok(_) => panic!("{what}: the mount dropped committed transactions silently"),
            Err(e) => e,
        };
        let msg = e.to_string();
        for want in [
            format!("LSN {lsn}"),
            format!("LSN {next}"),
            da.to_string(),
            "mako fsck -y".to_string(),
            "media damage".to_string(),
        ] {
            assert!(msg.contains(&want), "{what}: {want:?} missing from: {msg}");
        }
        assert_eq!(e.errno(), libc::EIO, "{what}");
        assert!(
            crashed
                .disks
                .iter()
                .zip(&images)
                .all(|(d, img)| d.snapshot() == *img),
            "{what}: the refused mount wrote nothing"
        );
        // What fsck -y does: replay everything valid, on both sides of the damage.
        let (desc, dyn_disks) = mako_fs::mount::find_descriptor(crashed.as_dyn()).unwrap();
        let nsd = mako_disk::LocalNsd::new(dyn_disks, 16);
        let r = mako_fs::recovery::replay_around_damage(&nsd, &desc, 0).unwrap();
        assert_eq!(r.lost.len(), 1, "{what}: {r:?}");
        assert_eq!(
            (r.lost[0].from_lsn, r.lost[0].to_lsn, r.lost[0].da),
            (lsn, next, da),
            "{what}"
        );
        assert!(r.torn_tail.is_none(), "{what}: {r:?}");
        // The first mount made node 0's log and committed its allocation into it.
        assert_eq!(
            r.transactions, 4,
            "{what}: the log's own creation, before, after, after2"
        );
        let m = crashed.mount(quiet());
        assert!(m.recovery.lost.is_empty(), "the replay emptied the log");
        for (name, seed) in [("before", 1), ("after", 3), ("after2", 4)] {
            let a = m.fs.lookup(ROOT_INO, name.as_bytes()).unwrap();
            assert_eq!(m.fs.read(a.ino, 0, 5000).unwrap(), pattern(seed, 3000));
        }
    }
}

/// A torn last transaction stays a torn tail — the normal end of the log after a crash
/// — even when the log has wrapped, so that transactions of an earlier lap (with lower
/// LSNs) lie after it: torn in its payload, or with its header never written.
#[test]
fn a_torn_last_transaction_is_not_taken_for_damage_after_the_log_wrapped() {
    for (what, byte) in [("payload", 300u64), ("header", 20)] {
        let disks = MemDisks::new(2, 32 << 20);
        disks.format(&small_params()); // 1 MiB log
        let m = disks.mount(quiet());
        let cap = m.core().journal.capacity();
        // A new log starts at an LSN of its own (`mount::fresh_log_lsn`), not 0.
        let start = m.core().journal.head_lsn();
        let mut i = 0;
        let mut last = (0, 0);
        while m.core().journal.head_lsn() < start + 2 * cap + cap / 2 {
            last = commit_file(&m, &format!("f{i}"), i);
            i += 1;
        }
        let da = log_da(m.core(), last.0);
        let crashed = crash_copy(&disks);
        drop(m);
        if what == "header" {
            // The header sector never reached the disk: what was there before shows.
            let zeros = vec![0u8; 512];
            crashed.disks[da.disk() as usize]
                .write_at(&zeros, da.byte_offset())
                .unwrap();
        } else {
            damage(&crashed, da, byte);
        }
        let m = crashed.mount(quiet());
        assert!(m.recovery.lost.is_empty(), "{what}: {:?}", m.recovery);
        assert_eq!(
            m.recovery.torn_tail.is_some(),
            what == "payload",
            "{what}: {:?}",
            m.recovery
        );
        assert!(m
            .fs
            .lookup(ROOT_INO, format!("f{}", i - 2).as_bytes())
            .is_ok());
        assert!(
            m.fs.lookup(ROOT_INO, format!("f{}", i - 1).as_bytes())
                .is_err(),
            "{what}: the torn commit is discarded"
        );
        m.unmount().unwrap();
    }
}
