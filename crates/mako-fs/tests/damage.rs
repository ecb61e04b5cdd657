//! Damaged metadata on a mounted file system: a structure whose checksum or identity
//! does not match is never used. Reads of it fail with EIO (`FsError::Corrupt`, which
//! names the structure and disk:sector), everything else keeps working, and makod's
//! core never panics. An operation that meets damage after it has changed something
//! turns the mount read-only instead of committing half of itself; the disk keeps the
//! last committed state, so a remount shows the operation not done.

use mako_format::DiskAddress;
use mako_fs::fs::{Ctx, ROOT_INO};
use mako_fs::test_util::{small_config, small_params, MemDisks};
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
