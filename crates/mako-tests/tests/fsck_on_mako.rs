//! `mako fsck` on file systems written by a real makod through FUSE (write-behind,
//! fragments promoted and shrunk by truncates, preallocation, renames across
//! directories, deletes, a directory that splits): a busy tree checks clean after
//! `mako down`; a repair of it writes nothing; damage written into a disk file is
//! found (exit 4), repaired (exit 1), and the file system then checks clean, mounts and
//! reads back every file the damage did not hit.

use mako_tests::cluster::{require_fuse, ClusterOptions, TestCluster};
use mako_tests::pattern;
use mako_tests::sys;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::Path;

fn write(p: &Path, data: &[u8]) {
    std::fs::write(p, data).unwrap_or_else(|e| panic!("write {}: {e}", p.display()));
}

/// Files of every shape; returns (path, content) of the regular files that must survive.
fn build(t: &Path) -> Vec<(std::path::PathBuf, Vec<u8>)> {
    let mut keep = Vec::new();
    for d in ["a", "a/b", "a/b/c", "big", "moved", "gone"] {
        std::fs::create_dir(t.join(d)).unwrap();
    }
    for (i, len) in [0usize, 1, 3000, 5000, 70_000, 300_000, 3_000_000]
        .into_iter()
        .enumerate()
    {
        let p = t.join(format!("a/f{i}"));
        write(&p, &pattern(i as u64, len));
        keep.push((p, pattern(i as u64, len)));
    }
    // Truncated down (fragment shrinks in size), then up (a sparse tail).
    let p = t.join("a/b/trunc");
    write(&p, &pattern(50, 2_000_000));
    sys::truncate(&p, 100_000).unwrap();
    sys::truncate(&p, 1_500_000).unwrap();
    let mut data = pattern(50, 2_000_000);
    data.truncate(100_000);
    data.resize(1_500_000, 0);
    keep.push((p, data));
    // Sparse with data far out, and preallocated past its end.
    let p = t.join("a/b/c/sparse");
    let fd = sys::open(&p, libc::O_CREAT | libc::O_RDWR, 0o644).unwrap();
    sys::pwrite_all(&fd, &pattern(60, 10_000), 0).unwrap();
    sys::pwrite_all(&fd, &pattern(61, 10_000), 1 << 32).unwrap();
    sys::fallocate(&fd, libc::FALLOC_FL_KEEP_SIZE, (1 << 32) + 10_000, 2 << 20).unwrap();
    fd.close().unwrap();
    // Links, symlinks, xattrs, special files.
    std::fs::hard_link(t.join("a/f3"), t.join("a/b/hard")).unwrap();
    sys::symlink("f1", &t.join("a/sym")).unwrap();
    sys::symlink(&"x".repeat(4000), &t.join("a/longsym")).unwrap();
    sys::setxattr(&t.join("a/f2"), "user.k", &pattern(70, 300), 0, false).unwrap();
    sys::mknod(&t.join("a/fifo"), libc::S_IFIFO | 0o644, 0).unwrap();
    // A directory that splits, half of it deleted again.
    for i in 0..6000 {
        write(
            &t.join(format!("big/entry-number-{i:05}")),
            &pattern(1000 + i, (i % 3) as usize * 700),
        );
    }
    for i in (0..6000).step_by(2) {
        std::fs::remove_file(t.join(format!("big/entry-number-{i:05}"))).unwrap();
    }
    for i in (1..6000).step_by(2) {
        let p = t.join(format!("big/entry-number-{i:05}"));
        keep.push((p, pattern(1000 + i, (i % 3) as usize * 700)));
    }
    // Renames across directories, and a removed subtree.
    std::fs::rename(t.join("a/b/c"), t.join("moved/c")).unwrap();
    write(&t.join("gone/x"), &pattern(80, 5000));
    std::fs::remove_file(t.join("gone/x")).unwrap();
    std::fs::remove_dir(t.join("gone")).unwrap();
    keep
}

fn flip(path: &Path, offset: u64) {
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .unwrap();
    let mut b = [0u8; 1];
    f.seek(SeekFrom::Start(offset)).unwrap();
    f.read_exact(&mut b).unwrap();
    b[0] ^= 0x04;
    f.seek(SeekFrom::Start(offset)).unwrap();
    f.write_all(&b).unwrap();
    f.sync_all().unwrap();
}

#[test]
fn fsck_of_file_systems_written_by_makod() {
    if !require_fuse("fsck_of_file_systems_written_by_makod") {
        return;
    }
    let c = TestCluster::up(ClusterOptions {
        disks: 3,
        disk_size: "2G".into(),
        block_size: Some("256K".into()),
        ..Default::default()
    })
    .unwrap();
    let t = c.mount().join("t");
    std::fs::create_dir(&t).unwrap();
    let keep = build(&t);
    // Online, while mounted: the committed state checks clean, and the file system
    // keeps working (an fsync after the check returns).
    let out = c.mako(&["fsck", "fs1", "--online"]).unwrap();
    assert_eq!(
        out.code,
        Some(0),
        "an online check of a mounted file system:\n{}",
        out.text()
    );
    assert!(out.stdout.contains("No problems found"), "{}", out.text());
    let out = c.mako(&["fsck", "fs1", "--online", "--json"]).unwrap();
    assert_eq!(out.code, Some(0), "{}", out.text());
    assert!(
        out.stdout.trim_start().starts_with('{') && out.stdout.contains("\"exit_code\""),
        "{}",
        out.text()
    );
    write(&t.join("after-online"), b"still writable");
    std::fs::File::open(t.join("after-online"))
        .unwrap()
        .sync_all()
        .unwrap();
    c.down().unwrap();

    let out = c.mako(&["fsck", "fs1", "-n", "--threads", "2"]).unwrap();
    assert_eq!(
        out.code,
        Some(0),
        "a file system makod wrote must check clean:\n{}",
        out.text()
    );
    assert!(out.stdout.contains("No problems found"), "{}", out.text());
    let images: Vec<Vec<u8>> = (0..3)
        .map(|i| std::fs::read(c.disk_path(i)).unwrap())
        .collect();
    let out = c.mako(&["fsck", "fs1", "-y"]).unwrap();
    assert_eq!(out.code, Some(0), "{}", out.text());
    for (i, before) in images.iter().enumerate() {
        assert!(
            std::fs::read(c.disk_path(i as u32)).unwrap() == *before,
            "a repair of a clean file system changed disk {i}"
        );
    }

    // Damage: the descriptor copy and the header of one disk, a leaked allocation
    // (a bit set in a free area of the allocation map is what most flips there
    // become: the segment's checksum fails).
    flip(&c.disk_path(1), 4096 + 100);
    flip(&c.disk_path(2), 20);
    let out = c.mako(&["fsck", "fs1", "-n"]).unwrap();
    assert_eq!(out.code, Some(4), "{}", out.text());
    assert!(
        out.stdout.contains("[descriptor_copy]") && out.stdout.contains("[disk_header]"),
        "{}",
        out.text()
    );
    let out = c.mako(&["fsck", "fs1", "-y"]).unwrap();
    assert_eq!(out.code, Some(1), "{}", out.text());
    let out = c.mako(&["fsck", "fs1", "-n"]).unwrap();
    assert_eq!(out.code, Some(0), "{}", out.text());

    c.up_again().unwrap();
    for (p, data) in &keep {
        assert!(
            std::fs::read(p).unwrap_or_else(|e| panic!("{}: {e}", p.display())) == *data,
            "{}: content differs",
            p.display()
        );
    }
    assert_eq!(sys::readlink(&t.join("a/sym")).unwrap(), "f1");
    assert_eq!(std::fs::read_dir(t.join("big")).unwrap().count(), 3000);
    c.down().unwrap();
}
