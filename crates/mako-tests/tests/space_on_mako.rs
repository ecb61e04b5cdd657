//! Issue 11 through a real mount (what xfstests' generic quick group found): small
//! O_DIRECT appends keep `df` exact and never run out of space early; `fallocate` of
//! everything `df` calls available succeeds, also right after a delete; a file carries
//! thousands of extended attributes and 64 KiB values, listxattr says ERANGE for a
//! small buffer, and a refused setxattr leaves the mount writable; SEEK_DATA finds data
//! after holes spanning several indirect levels.
//!
//! One cluster of one 600 MiB disk with 1 MiB blocks, as in the issue.

use mako_tests::cluster::{require_fuse, ClusterOptions, TestCluster};
use mako_tests::sys::{self, AlignedBuf, Fd};
use std::path::Path;

fn statfs(dir: &Path) -> (u64, u64, u64) {
    let s = sys::statvfs(dir).expect("statvfs");
    (s.f_frsize, s.f_bfree, s.f_bavail)
}

fn st_blocks(fd: &Fd) -> u64 {
    sys::fstat(fd).expect("fstat").st_blocks as u64
}

/// 8 KiB O_DIRECT appends (`xfs_io -d -c "pwrite -b 8192 0 300m"`): every one succeeds
/// and after each one `df`'s used space grew by exactly what the file holds.
fn direct_appends(dir: &Path) {
    let (frsize, free0, _) = statfs(dir);
    let path = dir.join("direct");
    let fd = sys::open(
        &path,
        libc::O_CREAT | libc::O_WRONLY | libc::O_DIRECT,
        0o644,
    )
    .expect("open O_DIRECT");
    let mut buf = AlignedBuf::new(8192, 4096);
    for (i, b) in buf.as_mut_slice().iter_mut().enumerate() {
        *b = (i % 251) as u8;
    }
    let total: u64 = 300 << 20;
    let mut off = 0;
    while off < total {
        let n = sys::pwrite(&fd, buf.as_slice(), off)
            .unwrap_or_else(|e| panic!("O_DIRECT append at {off}: {e}"));
        assert_eq!(n, 8192);
        off += 8192;
        let (_, free, _) = statfs(dir);
        assert_eq!(
            (free0 - free) * frsize,
            st_blocks(&fd) * 512,
            "after {off} bytes: df's used space grew by what the file holds"
        );
    }
    assert_eq!(st_blocks(&fd) * 512 / (1 << 20), 300, "300 full blocks");
    drop(fd);
    let back = sys::read_file(&path).expect("read back");
    assert_eq!(back.len() as u64, total);
    assert!(back.chunks(8192).all(|c| c == buf.as_slice()));
}

/// Right after deleting the 300 MiB file (its space waits for a checkpoint), one
/// fallocate of everything `df` shows as available, less 512 KiB, succeeds.
fn fallocate_all(dir: &Path) {
    sys::unlink(&dir.join("direct")).expect("unlink");
    // The kernel tells makod that the file is gone from its caches (FORGET) after the
    // unlink returns; its space is free from then on.
    let t0 = std::time::Instant::now();
    let (frsize, avail) = loop {
        let (frsize, _, avail) = statfs(dir);
        if avail * frsize > 400 << 20 || t0.elapsed() > std::time::Duration::from_secs(10) {
            break (frsize, avail);
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    };
    eprintln!("space of the deleted file free after {:?}", t0.elapsed());
    let avail = avail * frsize;
    assert!(
        avail > 400 << 20,
        "{avail} bytes available after the delete"
    );
    let fd = sys::open(&dir.join("all"), libc::O_CREAT | libc::O_RDWR, 0o644).expect("open");
    sys::fallocate(&fd, 0, 0, avail - (512 << 10))
        .unwrap_or_else(|e| panic!("fallocate of {avail} - 512 KiB: {e}"));
    drop(fd);
    sys::unlink(&dir.join("all")).expect("unlink");
}

/// Thousands of attributes, a 1-byte value replaced by a 64 KiB one, listxattr's size
/// query and ERANGE, and the 200 attributes with one replaced by a longer
/// value: the mount stays writable after the next sync.
fn xattrs(c: &TestCluster, dir: &Path) {
    let f = dir.join("x");
    sys::write_file(&f, b"data", 0o644).expect("create");
    for i in 0..2000 {
        sys::setxattr(
            &f,
            &format!("user.attribute_{i}"),
            format!("value_{i}").as_bytes(),
            0,
            false,
        )
        .unwrap_or_else(|e| panic!("attribute {i}: {e}"));
    }
    sys::setxattr(&f, "user.grow", b"x", 0, false).expect("1-byte value");
    let big: Vec<u8> = (0..65536).map(|i| (i % 253) as u8).collect();
    sys::setxattr(&f, "user.grow", &big, libc::XATTR_REPLACE, false).expect("64 KiB value");
    assert_eq!(sys::getxattr(&f, "user.grow").expect("getxattr"), big);
    let need = sys::listxattr_raw(&f, &mut []).expect("listxattr size query");
    let names = sys::listxattr(&f).expect("listxattr");
    assert_eq!(names.len(), 2001);
    assert_eq!(need, names.iter().map(|n| n.len() + 1).sum::<usize>());
    let mut short = vec![0u8; need - 1];
    assert_eq!(
        sys::listxattr_raw(&f, &mut short).map_err(|e| e.0),
        Err(libc::ERANGE)
    );
    assert_eq!(
        sys::setxattr(&f, "user.huge", &vec![1u8; 65537], 0, false).map_err(|e| e.0),
        Err(libc::E2BIG)
    );
    // The reproducer, then a sync as the periodic one would do.
    let g = dir.join("f");
    sys::write_file(&g, b"", 0o644).expect("create");
    for i in 1..=200 {
        sys::setxattr(
            &g,
            &format!("user.attribute_{i}"),
            format!("value_{i}").as_bytes(),
            0,
            false,
        )
        .unwrap_or_else(|e| panic!("attribute {i}: {e}"));
    }
    sys::setxattr(&g, "user.attribute_5", &[b'v'; 3000], 0, false).expect("longer value");
    let out = c.mako(&["sync"]).expect("mako sync");
    assert!(out.success(), "{out}");
    sys::write_file(&dir.join("after"), b"still writable", 0o644)
        .expect("the mount stays writable");
    for p in ["x", "f", "after"] {
        sys::unlink(&dir.join(p)).expect("unlink");
    }
}

/// generic/490 (seek_sanity_test 20) with 1 MiB blocks: data one block before the end
/// of a file of about 2^59 bytes; SEEK_DATA from inside holes spanning every indirect
/// level finds it, and SEEK_HOLE from the data finds the end of file.
fn seek_huge_hole(dir: &Path) {
    let fd = sys::open(&dir.join("seek"), libc::O_CREAT | libc::O_RDWR, 0o644).expect("open");
    let bs: u64 = 1 << 20;
    let filsz = (12 + bs / 4 + 8 * bs / 4 * bs / 4 + 2 * bs / 4 + 5) * bs;
    sys::pwrite(&fd, &vec![b'a'; bs as usize], filsz - bs).expect("write at the end");
    for from in [
        14 * bs,
        (12 + 2 * bs / 4) * bs,
        (12 + bs / 4 + bs / 4 * bs / 4 + 3 * bs / 4 + 5) * bs,
        (12 + bs / 4 + 7 * bs / 4 * bs / 4 + 5 * bs / 4) * bs,
        (12 + bs / 4 + 8 * bs / 4 * bs / 4 + bs / 4 + 11) * bs,
    ] {
        assert_eq!(
            sys::lseek(&fd, from as i64, libc::SEEK_DATA).expect("SEEK_DATA"),
            filsz - bs,
            "SEEK_DATA from {from}"
        );
        assert_eq!(
            sys::lseek(&fd, from as i64, libc::SEEK_HOLE).expect("SEEK_HOLE"),
            from,
            "SEEK_HOLE from {from}"
        );
    }
    assert_eq!(
        sys::lseek(&fd, (filsz - bs + 5) as i64, libc::SEEK_HOLE).expect("SEEK_HOLE"),
        filsz
    );
    drop(fd);
    sys::unlink(&dir.join("seek")).expect("unlink");
}

#[test]
fn space_xattrs_and_seek_on_mako() {
    if !require_fuse("space_xattrs_and_seek_on_mako") {
        return;
    }
    let cluster = TestCluster::up(ClusterOptions {
        disks: 1,
        disk_size: "600M".into(),
        pagepool: "128M".into(),
        block_size: Some("1M".into()),
    })
    .expect("mako up");
    let dir = cluster.mount().to_path_buf();
    direct_appends(&dir);
    fallocate_all(&dir);
    xattrs(&cluster, &dir);
    seek_huge_hole(&dir);
}
