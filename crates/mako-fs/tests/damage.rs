//! Damaged metadata on a mounted file system: a structure whose checksum or identity
//! does not match is never used. Reads of it fail with EIO (`FsError::Corrupt`, which
//! names the structure and disk:sector), everything else keeps working, and makod's
//! core never panics. An operation that meets damage after it has changed something
//! turns the mount read-only instead of committing half of itself; the disk keeps the
//! last committed state, so a remount shows the operation not done.

use mako_format::DiskAddress;
use mako_fs::fs::{Ctx, ROOT_INO};
use mako_fs::test_util::{small_config, small_params, MemDisks};
#[allow(unused_imports)]
use mako_fs::FileSystem;
use mako_fs::{FsConfig, FsError};

const C: Ctx = Ctx {
    uid: 0,
    gid: 0,
    pid: 1,
};

fn quiet() -> FsConfig {
    FsConfig {
        background_workers: false,
        pagepool_bytes: 64 << 20,
        ..small_config()
    }
}

fn pattern(seed: u64, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u64).wrapping_mul(31).wrapping_add(seed) as u8)
        .collect()
}

/// Flip one byte at `da` + `byte` in the disk images.
fn flip(disks: &MemDisks, da: DiskAddress, byte: u64) {
    disks.disks[da.disk() as usize].corrupt(da.byte_offset() + byte, 0x5a);
}

#[test]
fn damaged_structures_give_eio_and_the_rest_keeps_working() {
    let disks = MemDisks::new(2, 64 << 20);
    disks.format(&small_params()); // 64 KiB blocks: 64 direct pointers cover 4 MiB
    let (dir_a_block, file_g_inode, file_f_indirect, f_ino);
    {
        let m = disks.mount(quiet());
        let fs = &m.fs;
        let core = m.core().clone();
        let a = fs.mkdir(C, ROOT_INO, b"a", 0o755, 0).unwrap();
        let b = fs.mkdir(C, ROOT_INO, b"b", 0o755, 0).unwrap();
        for i in 0..300 {
            fs.create(
                C,
                a.ino,
                format!("file-with-a-long-name-{i}").as_bytes(),
                0o644,
                0,
                true,
            )
            .unwrap();
        }
        let g = fs.create(C, b.ino, b"g", 0o644, 0, true).unwrap();
        fs.write(g.ino, 0, b"small", false).unwrap();
        let h = fs.create(C, b.ino, b"h", 0o644, 0, true).unwrap();
        fs.write(h.ino, 0, &pattern(1, 100_000), false).unwrap();
        let f = fs.create(C, b.ino, b"f", 0o644, 0, true).unwrap();
        fs.write(f.ino, 0, &pattern(2, 6 << 20), false).unwrap(); // past the direct pointers
        fs.sync().unwrap();
        f_ino = f.ino;
        let inode_file = core.metadata_inodes().inode_file;
        file_g_inode = core
            .metafile_da(inode_file, g.ino * core.inode_bytes() as u64)
            .unwrap();
        {
            let ha = core.get(a.ino).unwrap();
            let st = ha.state.read();
            dir_a_block = mako_fs::block_map::lookup(&core, &st, 0).unwrap();
            let hf = core.get(f.ino).unwrap();
            let stf = hf.state.read();
            mako_fs::block_map::lookup(&core, &stf, 70).unwrap(); // loads the indirect block
            file_f_indirect = stf
                .indirect
                .lock()
                .values()
                .next()
                .expect("an indirect block")
                .da;
        }
        assert!(!dir_a_block.is_null());
        m.unmount().unwrap();
    }
    flip(&disks, dir_a_block, 100); // inside page 0 of a's first directory block
    flip(&disks, file_g_inode, 20); // g's inode header
    flip(&disks, file_f_indirect, 200); // f's indirect block
    let m = disks.mount(quiet());
    let fs = &m.fs;
    let core = m.core().clone();
    let a = fs.lookup(ROOT_INO, b"a").unwrap();
    let b = fs.lookup(ROOT_INO, b"b").unwrap();
    // The damaged directory: EIO naming the structure and where it is.
    let e = fs.readdir(a.ino, 0, 1000).unwrap_err();
    assert!(matches!(e, FsError::Corrupt(_)), "{e}");
    assert_eq!(e.errno(), libc::EIO);
    let msg = e.to_string();
    assert!(
        msg.contains("directory block") && msg.contains(&format!("{}:", dir_a_block.disk())),
        "{msg}"
    );
    // The damaged inode.
    let e = fs.lookup(b.ino, b"g").unwrap_err();
    assert!(matches!(e, FsError::Corrupt(_)), "{e}");
    assert!(e.to_string().contains("inode"), "{e}");
    // The damaged indirect block: f's attributes are there, its data under the block is EIO.
    let f = fs.lookup(b.ino, b"f").unwrap();
    assert_eq!(f.size, 6 << 20);
    let e = fs.read(f.ino, 5 << 20, 4096).unwrap_err();
    assert!(
        matches!(e, FsError::Corrupt(_)) && e.to_string().contains("indirect block"),
        "{e}"
    );
    // Everything else works, and changes are committed.
    let h = fs.lookup(b.ino, b"h").unwrap();
    assert_eq!(fs.read(h.ino, 0, 200_000).unwrap(), pattern(1, 100_000));
    let n = fs.create(C, b.ino, b"new", 0o644, 0, true).unwrap();
    fs.write(n.ino, 0, b"written after the damage", false)
        .unwrap();
    fs.fsync(n.ino, false).unwrap();
    assert!(
        !core.read_only.load(std::sync::atomic::Ordering::Relaxed),
        "reads of damage alone keep the mount writable"
    );
    assert!(
        core.stats
            .corruptions
            .load(std::sync::atomic::Ordering::Relaxed)
            >= 3
    );
    // Unlinking f removes its name, then meets the damaged indirect block while freeing
    // its blocks: half done, so the mount turns read-only instead of committing it.
    assert_eq!(f.ino, f_ino);
    let e = fs.unlink(b.ino, b"f").unwrap_err();
    assert_eq!(e.errno(), libc::EIO, "{e}");
    assert!(
        core.read_only.load(std::sync::atomic::Ordering::Relaxed),
        "a half-done operation turns the mount read-only"
    );
    assert_eq!(
        fs.create(C, b.ino, b"refused", 0o644, 0, true)
            .unwrap_err()
            .errno(),
        libc::EROFS
    );
    drop(m);
    // The disk holds the last commit: f is still there, the fsynced file too.
    let m = disks.mount(quiet());
    let fs = &m.fs;
    let b = fs.lookup(ROOT_INO, b"b").unwrap();
    assert!(
        fs.lookup(b.ino, b"f").is_ok(),
        "the failed unlink was not committed"
    );
    let n = fs.lookup(b.ino, b"new").unwrap();
    assert_eq!(fs.read(n.ino, 0, 100).unwrap(), b"written after the damage");
}

fn read_bytes(disks: &MemDisks, extents: &[(DiskAddress, std::ops::Range<usize>)]) -> Vec<u8> {
    use mako_disk::Disk;
    let len = extents.last().map_or(0, |(_, r)| r.end);
    let mut out = vec![0u8; len];
    for (da, r) in extents {
        disks.disks[da.disk() as usize]
            .read_at(&mut out[r.clone()], da.byte_offset())
            .unwrap();
    }
    out
}

fn write_bytes(disks: &MemDisks, extents: &[(DiskAddress, std::ops::Range<usize>)], bytes: &[u8]) {
    use mako_disk::Disk;
    for (da, r) in extents {
        disks.disks[da.disk() as usize]
            .write_at(&bytes[r.clone()], da.byte_offset())
            .unwrap();
    }
}

/// What an integrity failure in the middle of an operation must leave: the error is
/// EIO (not EINVAL) naming the structure, inode and `disk:sector`, the mount is
/// read-only, the corruption counter went up, and the half-done operation is not on
/// disk (a remount after a crash shows it not done).
fn assert_integrity_failure(
    e: &FsError,
    core: &mako_fs::Core,
    corruptions_before: u64,
    names: &[&str],
) {
    use std::sync::atomic::Ordering::Relaxed;
    assert!(matches!(e, FsError::Integrity(_)), "{e:?}");
    assert_eq!(e.errno(), libc::EIO, "{e}");
    let msg = e.to_string();
    for n in names {
        assert!(msg.contains(n), "{n:?} missing from: {msg}");
    }
    assert!(core.read_only.load(Relaxed), "the mount turned read-only");
    assert!(
        core.read_only.reason().contains("integrity failure"),
        "{}",
        core.read_only.reason()
    );
    assert_eq!(
        core.stats.corruptions.load(Relaxed),
        corruptions_before + 1,
        "counted in corruptions_detected"
    );
}

/// A checksum-valid indirect block with a pointer outside every disk (what a bug or a
/// misdirected write of a valid block leaves): unlinking the file removes its name,
/// then meets the pointer while freeing its blocks. The pointer is never followed; the
/// unlink fails with an integrity failure and never commits.
#[test]
fn a_pointer_outside_every_disk_stops_the_operation_and_commits_nothing() {
    use std::sync::atomic::Ordering::Relaxed;
    let disks = MemDisks::new(2, 64 << 20);
    disks.format(&small_params());
    let (indirect_da, f_ino, indirect_bytes);
    {
        let m = disks.mount(quiet());
        let fs = &m.fs;
        let core = m.core().clone();
        let b = fs.mkdir(C, ROOT_INO, b"b", 0o755, 0).unwrap();
        let f = fs.create(C, b.ino, b"f", 0o644, 0, true).unwrap();
        fs.write(f.ino, 0, &pattern(2, 6 << 20), false).unwrap(); // past the direct pointers
        fs.sync().unwrap();
        f_ino = f.ino;
        indirect_bytes = core.geo.indirect_bytes;
        let hf = core.get(f.ino).unwrap();
        let st = hf.state.read();
        mako_fs::block_map::lookup(&core, &st, 70).unwrap();
        indirect_da = st
            .indirect
            .lock()
            .values()
            .next()
            .expect("an indirect block")
            .da;
        drop(st);
        m.unmount().unwrap();
    }
    // Re-encode the indirect block with one pointer on disk 7 of 2: a valid checksum.
    let ext = [(indirect_da, 0..indirect_bytes as usize)];
    let id = mako_format::indirect::IndirectId {
        ino: f_ino,
        level: 1,
        index: 0,
    };
    let mut blk = mako_format::indirect::IndirectBlock::decode(
        &read_bytes(&disks, &ext),
        indirect_bytes,
        id,
        mako_format::error::Location::Memory,
    )
    .unwrap();
    assert!(!blk.pointers[10].is_null());
    blk.pointers[10] = DiskAddress::new(7, 4096);
    write_bytes(&disks, &ext, &blk.encode(indirect_bytes));

    let m = disks.mount(quiet());
    let fs = &m.fs;
    let core = m.core().clone();
    let before = core.stats.corruptions.load(Relaxed);
    let b = fs.lookup(ROOT_INO, b"b").unwrap();
    let e = fs.unlink(b.ino, b"f").unwrap_err();
    assert_integrity_failure(
        &e,
        &core,
        before,
        &[
            "indirect block",
            &format!("inode {f_ino}"),
            &indirect_da.to_string(),
            "7:4096",
        ],
    );
    assert_eq!(
        fs.create(C, b.ino, b"refused", 0o644, 0, true)
            .unwrap_err()
            .errno(),
        libc::EROFS
    );
    assert!(fs.sync().is_err(), "nothing commits any more");
    drop(m);
    let m = disks.mount(quiet());
    let b = m.fs.lookup(ROOT_INO, b"b").unwrap();
    let f =
        m.fs.lookup(b.ino, b"f")
            .expect("the failed unlink was not committed");
    assert_eq!(f.size, 6 << 20);
    // The damage itself is still there for fsck to repair; it is refused again.
    let e = m.fs.read(f.ino, 0, 4096).unwrap_err();
    assert!(matches!(e, FsError::Integrity(_)), "{e}");
}

/// An allocation map that says a file's block is free (checksum-valid: a lost or
/// misdirected write of an older map page): unlinking the file frees its first block,
/// then finds the second already free. A double free is an integrity failure: the
/// unlink, half done in memory, never commits.
#[test]
fn a_double_free_through_a_damaged_allocation_map_commits_nothing() {
    use mako_format::alloc_segment::AllocSegment;
    use std::sync::atomic::Ordering::Relaxed;
    let disks = MemDisks::new(2, 64 << 20);
    disks.format(&small_params());
    let (victim, sps, slot, segments);
    {
        let m = disks.mount(quiet());
        let fs = &m.fs;
        let core = m.core().clone();
        let g = fs.create(C, ROOT_INO, b"g", 0o644, 0, true).unwrap();
        fs.write(g.ino, 0, &pattern(3, 3 << 16), false).unwrap(); // three blocks
        fs.sync().unwrap();
        let h = core.get(g.ino).unwrap();
        victim = mako_fs::block_map::lookup(&core, &h.state.read(), 1).unwrap();
        assert!(!victim.is_null());
        sps = core.geo.sectors_per_subblock();
        let desc = core.desc.lock().clone();
        slot = mako_fs::alloc_map::segment_slot_bytes(&desc);
        let map = core.metadata_inodes().block_alloc_map;
        segments = (0..desc.regions)
            .map(|r| {
                core.metafile_extents(map, r as u64 * slot as u64, slot)
                    .unwrap()
            })
            .collect::<Vec<_>>();
        m.unmount().unwrap();
    }
    // Clear the victim block's bits in the segment that covers it, and reseal it.
    let spb = small_params().block_bytes as u64 / (sps * 512);
    let subblock = victim.sector() / sps;
    let mut damaged = 0;
    for (r, ext) in segments.iter().enumerate() {
        let mut seg = AllocSegment::decode(
            &read_bytes(&disks, ext),
            r as u32,
            mako_format::error::Location::Memory,
        )
        .unwrap();
        for (s, bm) in seg.slices.iter().zip(seg.bitmaps.iter_mut()) {
            let covers = s.disk == victim.disk()
                && (s.first_subblock..s.first_subblock + s.subblocks).contains(&subblock);
            if covers {
                for i in subblock - s.first_subblock..subblock - s.first_subblock + spb {
                    bm[(i / 64) as usize] &= !(1 << (i % 64));
                }
                damaged += 1;
            }
        }
        write_bytes(&disks, ext, &seg.encode(slot));
    }
    assert_eq!(damaged, 1, "one segment covers the block");

    let m = disks.mount(quiet());
    let fs = &m.fs;
    let core = m.core().clone();
    let before = core.stats.corruptions.load(Relaxed);
    let e = fs.unlink(ROOT_INO, b"g").unwrap_err();
    assert_integrity_failure(
        &e,
        &core,
        before,
        &["block allocation map", "double free", &victim.to_string()],
    );
    drop(m);
    let m = disks.mount(quiet());
    let g =
        m.fs.lookup(ROOT_INO, b"g")
            .expect("the failed unlink was not committed");
    assert_eq!(m.fs.read(g.ino, 0, 3 << 16).unwrap(), pattern(3, 3 << 16));
}

/// An inode whose checksum is valid but whose last fragment claims more subblocks
/// than a block has would make a directory read allocate and index past its block:
/// refused when the inode is read, as an integrity failure.
#[test]
fn an_impossible_inode_is_refused_when_read() {
    use std::sync::atomic::Ordering::Relaxed;
    let disks = MemDisks::new(2, 64 << 20);
    disks.format(&small_params());
    let (ext, ino, inode_bytes);
    {
        let m = disks.mount(quiet());
        let core = m.core().clone();
        let d = m.fs.mkdir(C, ROOT_INO, b"d", 0o755, 0).unwrap();
        for i in 0..150 {
            m.fs.create(
                C,
                d.ino,
                format!("a-long-file-name-{i}").as_bytes(),
                0o644,
                0,
                true,
            )
            .unwrap();
        }
        m.fs.sync().unwrap();
        ino = d.ino;
        inode_bytes = core.inode_bytes();
        let inode_file = core.metadata_inodes().inode_file;
        ext = core
            .metafile_extents(inode_file, ino * inode_bytes as u64, inode_bytes as usize)
            .unwrap();
        m.unmount().unwrap();
    }
    let mut inode = mako_format::inode::Inode::decode(
        &read_bytes(&disks, &ext),
        inode_bytes,
        ino,
        mako_format::error::Location::Memory,
    )
    .unwrap();
    assert!(
        inode.last_block_subblocks > 0,
        "the directory is a fragment"
    );
    inode.last_block_subblocks = 60_000;
    write_bytes(&disks, &ext, &inode.encode(inode_bytes).unwrap());
    let m = disks.mount(quiet());
    let before = m.core().stats.corruptions.load(Relaxed);
    let e = m.fs.lookup(ROOT_INO, b"d").unwrap_err();
    assert_integrity_failure(
        &e,
        m.core(),
        before,
        &["inode", &format!("inode {ino}"), "60000 subblocks"],
    );
}

/// A commit that is already waiting at the gate when an operation in flight meets an
/// integrity failure must not snapshot what that operation left half done: it sees
/// the mount read-only once the gate is closed, and writes nothing.
#[test]
fn a_commit_waiting_at_the_gate_never_snapshots_an_operation_that_failed() {
    use std::sync::atomic::Ordering::Relaxed;
    use std::time::{Duration, Instant};
    let disks = MemDisks::new(2, 64 << 20);
    disks.format(&small_params());
    let m = disks.mount(quiet());
    let core = m.core().clone();
    let a = m.fs.create(C, ROOT_INO, b"a", 0o644, 0, true).unwrap();
    m.fs.sync().unwrap();
    let commits = core.journal.stats.commits.load(Relaxed);
    let durable = core.journal.durable_seq();
    std::thread::scope(|s| {
        let tx = core.begin();
        // The operation changes the inode in memory...
        {
            let h = core.get(a.ino).unwrap();
            let mut st = h.state.write();
            st.inode.mode ^= 0o001;
            st.mark_dirty();
        }
        // Named, so that only this commit's wait counts (the registry is per process).
        let committer = std::thread::Builder::new()
            .name("gate-committer".into())
            .spawn_scoped(s, || core.journal.commit(&core))
            .unwrap();
        // ...while a commit waits for it at the gate...
        let deadline = Instant::now() + Duration::from_secs(30);
        while !mako_diag::waiters::snapshot(Duration::ZERO)
            .iter()
            .any(|w| {
                w.thread == "gate-committer"
                    && w.what.contains("commit waiting for operations in flight")
            })
        {
            assert!(
                Instant::now() < deadline,
                "the commit never reached the gate"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        // ...then meets an integrity failure and ends.
        let _ = core.integrity(
            mako_fs::error::IntegrityError::new("test structure", "an impossible value").ino(a.ino),
        );
        drop(tx);
        let r = committer.join().unwrap();
        assert!(matches!(r, Err(FsError::ReadOnly(_))), "{r:?}");
    });
    assert_eq!(
        core.journal.stats.commits.load(Relaxed),
        commits,
        "nothing committed"
    );
    assert_eq!(core.journal.durable_seq(), durable);
    drop(m);
    let m = disks.mount(quiet());
    let a2 = m.fs.lookup(ROOT_INO, b"a").unwrap();
    assert_eq!(
        a2.mode, a.mode,
        "the half-done change never reached the disk"
    );
}

/// A write of the recovery log that fails panics the file system on this node
/// (`mako_fs::core::FsPanic`, docs/cluster.md "Disk write errors"), and does not panic
/// the process: the hook (makod: ask to be expelled) runs once with the reason, every
/// later operation returns EIO, no I/O reaches the disks any more (not even once they
/// work again), and what was fsynced before is there at the next mount.
#[test]
fn a_failed_log_write_panics_the_file_system_on_this_node() {
    use std::sync::Arc;
    let disks = MemDisks::new(2, 64 << 20);
    disks.format(&small_params());
    let m = disks.mount(quiet());
    let core = m.core().clone();
    let calls: Arc<parking_lot::Mutex<Vec<String>>> = Arc::default();
    {
        let calls = calls.clone();
        core.fs_panic.set_hook(Arc::new(move |why: &str| {
            calls.lock().push(why.to_string())
        }));
    }
    m.fs.create(C, ROOT_INO, b"a", 0o644, 0, true).unwrap();
    m.fs.sync().unwrap();
    assert!(!core.fs_panic.is_set());
    for d in &disks.disks {
        d.fail_writes_after(0);
    }
    m.fs.create(C, ROOT_INO, b"b", 0o644, 0, true).unwrap();
    let e = m.fs.sync().unwrap_err();
    assert_eq!(e.errno(), libc::EIO, "{e}");
    assert!(core.fs_panic.is_set(), "the file system panicked");
    {
        let calls = calls.lock();
        assert_eq!(calls.len(), 1, "{calls:?}");
        assert!(calls[0].contains("recovery log"), "{calls:?}");
    }
    // The disks work again: nothing more reaches them from this mount.
    for d in &disks.disks {
        d.fail_writes_after(1 << 40);
    }
    let writes: Vec<u64> = disks.disks.iter().map(|d| d.writes()).collect();
    for r in [
        m.fs.lookup(ROOT_INO, b"a").map(|_| ()),
        m.fs.create(C, ROOT_INO, b"c", 0o644, 0, true).map(|_| ()),
        m.fs.sync(),
    ] {
        let e = r.expect_err("an operation after the panic");
        assert_eq!(e.errno(), libc::EIO, "{e}");
    }
    let _ = core.journal.checkpoint(&core);
    drop(m);
    let after: Vec<u64> = disks.disks.iter().map(|d| d.writes()).collect();
    assert_eq!(writes, after, "a write reached a disk after the panic");
    assert_eq!(calls.lock().len(), 1, "the hook runs once");
    // What was fsynced is there; what was not made durable is not.
    let m = disks.mount(quiet());
    m.fs.lookup(ROOT_INO, b"a")
        .expect("fsynced before the panic");
    assert_eq!(
        m.fs.lookup(ROOT_INO, b"b").unwrap_err().errno(),
        libc::ENOENT
    );
}
