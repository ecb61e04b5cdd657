//! Space accounting as a user sees it (issue 11): what statfs reports as free and
//! available is what the file system holds and can hand out at that moment — after
//! small O_DIRECT appends, after deletes whose space waits for a checkpoint, and for
//! one fallocate of everything `df` says is available.

use mako_fs::fs::{Ctx, FileSystem, ROOT_INO};
use mako_fs::mkfs::MkfsParams;
use mako_fs::test_util::{pattern, small_config, MemDisks};
use mako_fs::FsConfig;

const C: Ctx = Ctx {
    uid: 0,
    gid: 0,
    pid: 1,
};

/// 1 MiB blocks of 128 subblocks of 8 KiB, as in the issue.
fn params_1m() -> MkfsParams {
    MkfsParams {
        block_bytes: 1 << 20,
        indirect_bytes: 32 << 10,
        inode_bytes: 4096,
        inodes_max: Some(10_000),
        log_bytes: 4 << 20,
        ..MkfsParams::default()
    }
}

/// No background threads: nothing commits or checkpoints behind the test's back, so
/// space freed by a transaction stays quarantined until the test (or a full log)
/// causes a checkpoint.
fn config() -> FsConfig {
    FsConfig {
        background_workers: false,
        ..small_config()
    }
}

/// Subblocks a file of `size` bytes written from start to end holds (full blocks and
/// a fragment of the last), without its indirect blocks.
fn data_subblocks(size: u64, block: u64, sb: u64) -> u64 {
    size / block * (block / sb) + (size % block).div_ceil(sb)
}

/// Bytes written to every disk so far (data, log and metadata).
fn disk_bytes_written(fs: &FileSystem) -> u64 {
    fs.core.nsd.stats().iter().map(|s| s.write_bytes).sum()
}

fn subblocks_of(fs: &FileSystem, ino: u64) -> u64 {
    fs.getattr(ino).unwrap().blocks * 512 / fs.core.geo.subblock_bytes() as u64
}

/// Sequential 8 KiB O_DIRECT appends, many times more than the file system could hold
/// if every append left a copy of the growing last block behind until a checkpoint:
/// every append succeeds, statfs after each one says exactly what the file holds, no
/// space waits in quarantine beyond one block, and the file ends with the same full
/// blocks and fragment a buffered write of the same bytes gets.
#[test]
fn small_direct_appends_fill_fragments_and_keep_statfs_exact() {
    let disks = MemDisks::new(2, 48 << 20);
    disks.format(&params_1m());
    let m = disks.mount(config());
    let fs = &m.fs;
    let core = &fs.core;
    let sb = core.geo.subblock_bytes() as u64;
    let bb = core.block_bytes();
    let spb = core.geo.subblocks_per_block as u64;
    let f = fs.create(C, ROOT_INO, b"direct", 0o644, 0, true).unwrap();
    let s0 = fs.statfs();
    let chunk = 8192usize;
    // 40 MiB of the ~94 MiB: the O(n^2) copies of a growing fragment that waited for a
    // checkpoint used to fill the file system within the first 6 MiB.
    let total: u64 = 40 << 20;
    let data = pattern(3, chunk);
    let written0 = disk_bytes_written(fs);
    let mut off = 0u64;
    while off < total {
        let n = fs
            .write_direct(f.ino, off, &data)
            .unwrap_or_else(|e| panic!("O_DIRECT append at {off}: {e}"));
        assert_eq!(n, chunk);
        off += chunk as u64;
        let s = fs.statfs();
        let held = subblocks_of(fs, f.ino);
        assert_eq!(
            s0.blocks_free - s.blocks_free,
            held,
            "after {off} bytes: statfs free space dropped by what the file holds"
        );
        // Available space counts whole blocks (what one large file can get): it drops
        // by the blocks the file's data touches, and at most one more for the block
        // its indirect block went to.
        let touched = off.div_ceil(bb) * spb;
        let drop = s0.blocks_available - s.blocks_available;
        assert!(
            drop >= touched && drop <= touched + spb,
            "after {off} bytes: statfs available space dropped by {drop} subblocks, the file touches {touched}"
        );
        assert!(
            core.alloc.quarantined_subblocks() <= spb,
            "after {off} bytes: {} subblocks wait for a checkpoint",
            core.alloc.quarantined_subblocks()
        );
        assert_eq!(
            core.alloc.reserved_subblocks(),
            0,
            "no reservation left over"
        );
    }
    // Each append writes about what it appends (its pages, the partial page before
    // them, the rest of the subblock), not the whole fragment again, and the log.
    let written = disk_bytes_written(fs) - written0;
    assert!(
        written < 4 * total,
        "{written} bytes written to disk for {total} bytes appended"
    );
    // Full blocks and an exact fragment, as a buffered write would leave them (the
    // difference is the file's indirect blocks).
    let want = data_subblocks(total + 4096, bb, sb);
    fs.write_direct(f.ino, total, &data[..4096]).unwrap();
    let held = subblocks_of(fs, f.ino);
    let indirect = held - want;
    assert!(
        indirect <= 2 * core.geo.indirect_subblocks() as u64,
        "the file holds {held} subblocks, its data needs {want}"
    );
    let blocks = fs.block_list(f.ino).unwrap();
    assert_eq!(blocks.len() as u64, (total + 4096).div_ceil(bb));
    let raw = fs.raw_inode(f.ino).unwrap();
    assert_eq!(raw.last_block_subblocks as u64, 4096u64.div_ceil(sb));
    // The bytes are all there.
    for (i, at) in [0u64, 12 << 20, total - chunk as u64]
        .into_iter()
        .enumerate()
    {
        assert_eq!(fs.read(f.ino, at, chunk as u32).unwrap(), data, "probe {i}");
    }
    m.unmount().unwrap();
    let m = disks.mount(config());
    assert_eq!(m.fs.read(f.ino, 0, chunk as u32).unwrap(), data);
    m.unmount().unwrap();
}

/// What statfs reports as available can be allocated in one fallocate, also when part
/// of it was freed by a delete that is not checkpointed yet, and the indirect blocks
/// the allocation needs come on top of it.
#[test]
fn fallocate_of_all_available_space_succeeds() {
    let disks = MemDisks::new(2, 48 << 20);
    disks.format(&params_1m());
    let m = disks.mount(config());
    let fs = &m.fs;
    let core = &fs.core;
    // Space freed just now: quarantined until a checkpoint.
    let a = fs.create(C, ROOT_INO, b"gone", 0o644, 0, true).unwrap();
    fs.fallocate(a.ino, 0, 20 << 20, 0).unwrap();
    fs.fsync(a.ino, false).unwrap();
    fs.unlink(ROOT_INO, b"gone").unwrap();
    assert!(core.alloc.quarantined_subblocks() > 0);
    let s = fs.statfs();
    let avail = s.blocks_available * s.fragment_bytes as u64;
    assert!(avail > 40 << 20, "{avail} bytes available");
    let b = fs.create(C, ROOT_INO, b"all", 0o644, 0, true).unwrap();
    fs.fallocate(b.ino, 0, avail - (512 << 10), 0)
        .unwrap_or_else(|e| panic!("fallocate of {avail} - 512 KiB available: {e}"));
    // Exactly all of it: what is left is available too.
    let s = fs.statfs();
    let rest = s.blocks_available * s.fragment_bytes as u64;
    if rest > 0 {
        fs.fallocate(b.ino, avail, rest, 0)
            .unwrap_or_else(|e| panic!("fallocate of the {rest} bytes still available: {e}"));
    }
    assert_eq!(fs.statfs().blocks_available, 0);
    // A refused fallocate changes nothing.
    let before = fs.statfs();
    let c = fs.create(C, ROOT_INO, b"more", 0o644, 0, true).unwrap();
    let e = fs.fallocate(c.ino, 0, 8 << 20, 0).unwrap_err();
    assert_eq!(e.errno(), libc::ENOSPC, "{e}");
    assert_eq!(fs.getattr(c.ino).unwrap().size, 0);
    assert_eq!(fs.getattr(c.ino).unwrap().blocks, 0);
    assert_eq!(fs.statfs().blocks_free, before.blocks_free);
    fs.sync().unwrap();
    m.unmount().unwrap();
}

/// A buffered writer gets what statfs calls available — at most one block more (the
/// metadata reserve is rounded to whole blocks in statfs), and less only by the blocks
/// its own indirect blocks took while write-behind ran — and all of it reaches disk.
#[test]
fn buffered_writes_fill_what_statfs_calls_available() {
    let disks = MemDisks::new(2, 48 << 20);
    disks.format(&params_1m());
    let m = disks.mount(config());
    let fs = &m.fs;
    let bb = fs.core.block_bytes();
    let s = fs.statfs();
    let avail = s.blocks_available * s.fragment_bytes as u64;
    let f = fs.create(C, ROOT_INO, b"fill", 0o644, 0, true).unwrap();
    let chunk = pattern(9, 1 << 20);
    let mut off = 0u64;
    let e = loop {
        match fs.write(f.ino, off, &chunk, false) {
            Ok(n) => off += n as u64,
            Err(e) => break e,
        }
        assert!(
            off <= avail + bb,
            "accepted {off} bytes, {avail} were available"
        );
    };
    assert_eq!(e.errno(), libc::ENOSPC, "{e}");
    fs.fsync(f.ino, false)
        .expect("everything accepted reaches disk");
    let sb = fs.core.geo.subblock_bytes() as u64;
    let indirect =
        (subblocks_of(fs, f.ino) - off.div_ceil(sb)) / fs.core.geo.indirect_subblocks() as u64;
    assert!(
        off + indirect * bb >= avail,
        "accepted {off} bytes, {avail} were available ({indirect} indirect blocks)"
    );
    assert_eq!(
        fs.read(f.ino, off - 100, 100).unwrap(),
        chunk[chunk.len() - 100..]
    );
    m.unmount().unwrap();
}
