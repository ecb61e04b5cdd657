//! Inode numbers past 2^32 through the kernel: a file system made with `--inodes 1099511627776` (2^40)
//! (format version 3: sparse inode file and inode map), mounted by makod with the
//! `MAKO_TEST_FIRST_INODE` test hook so its new numbers come from a segment past 2^39,
//! serves mkdir, create, write, stat (st_ino), readdir (d_ino), rename and unlink on
//! them; `mako fsck -n` finds it clean after `mako down`, and after `mako up` again
//! (without the hook) every name still has its number and its data.

use mako_tests::cluster::{is_mounted, require_fuse, ClusterOptions, TestCluster};
use std::os::unix::fs::{DirEntryExt, MetadataExt};
use std::path::Path;
use std::time::{Duration, Instant};

const FIRST: u64 = (1 << 39) + 12_345;

fn wait_mounted(p: &Path) {
    let t = Instant::now();
    while !is_mounted(p) {
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "{} not mounted",
            p.display()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn listing(dir: &Path) -> Vec<(String, u64)> {
    let mut v: Vec<(String, u64)> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            (e.file_name().to_string_lossy().into_owned(), e.ino())
        })
        .collect();
    v.sort();
    v
}

#[test]
fn inode_numbers_past_2_32_through_fuse() {
    if !require_fuse("inode_numbers_past_2_32_through_fuse") {
        return;
    }
    let c = TestCluster::up(ClusterOptions {
        disks: 1,
        disk_size: "1G".into(),
        pagepool: "128M".into(),
        block_size: Some("1M".into()),
    })
    .unwrap_or_else(|e| panic!("{e:#}"));
    c.down().unwrap();
    let out = c.mako(&["disk", "create", "e0", "--size", "1G"]).unwrap();
    assert!(out.success(), "{out}");
    let mnt2 = c.root().join("mnt2");
    let out = c
        .mako(&[
            "fs",
            "create",
            "fs2",
            "-d",
            "e0",
            "-B",
            "1M",
            "--inodes",
            "1099511627776",
            "-T",
            mnt2.to_str().unwrap(),
        ])
        .unwrap();
    assert!(out.success(), "{out}");
    // makod with the hook (the harness passes its own environment).
    let data = c.data_dir().to_str().unwrap().to_string();
    let up = std::process::Command::new(c.mako_binary())
        .args(["--data-dir", &data, "up"])
        .env("MAKO_TEST_FIRST_INODE", FIRST.to_string())
        .env_remove("MAKO_DATA_DIR")
        .output()
        .unwrap();
    assert!(
        up.status.success(),
        "mako up: {}",
        String::from_utf8_lossy(&up.stderr)
    );
    wait_mounted(&mnt2);
    let out = c.mako(&["fs", "show", "fs2"]).unwrap();
    assert!(out.stdout.contains("1099511627776"), "{out}");

    let dir = mnt2.join("high");
    std::fs::create_dir(&dir).unwrap();
    let dino = std::fs::metadata(&dir).unwrap().ino();
    // From the start of the hooked number's segment on.
    assert!((1 << 39..=FIRST).contains(&dino), "mkdir: st_ino {dino}");
    let mut inos = Vec::new();
    for i in 0..30 {
        let p = dir.join(format!("f{i}"));
        std::fs::write(&p, format!("content {i}")).unwrap();
        let ino = std::fs::metadata(&p).unwrap().ino();
        assert!(ino > 1 << 32, "create: st_ino {ino}");
        inos.push(ino);
    }
    let l = listing(&dir);
    assert_eq!(l.len(), 30);
    for (name, ino) in &l {
        let i: usize = name[1..].parse().unwrap();
        assert_eq!(*ino, inos[i], "readdir's d_ino of {name}");
    }
    std::fs::rename(dir.join("f1"), dir.join("g1")).unwrap();
    std::fs::rename(dir.join("f2"), mnt2.join("moved")).unwrap();
    std::fs::remove_file(dir.join("f0")).unwrap();
    assert_eq!(
        std::fs::metadata(mnt2.join("moved")).unwrap().ino(),
        inos[2]
    );
    assert_eq!(std::fs::read(dir.join("g1")).unwrap(), b"content 1");
    c.down().unwrap();

    let out = c.mako(&["fsck", "fs2", "-n"]).unwrap();
    assert_eq!(out.code, Some(0), "fsck of fs2:\n{}", out.text());

    c.up_again().unwrap();
    wait_mounted(&mnt2);
    assert_eq!(
        std::fs::metadata(mnt2.join("moved")).unwrap().ino(),
        inos[2]
    );
    assert_eq!(std::fs::metadata(dir.join("g1")).unwrap().ino(), inos[1]);
    assert!(!dir.join("f0").exists());
    assert_eq!(listing(&dir).len(), 28);
    for i in 3..30 {
        assert_eq!(
            std::fs::read(dir.join(format!("f{i}"))).unwrap(),
            format!("content {i}").as_bytes()
        );
    }
    // A new file after the remount (no hook) gets an ordinary low number.
    std::fs::write(mnt2.join("low"), b"x").unwrap();
    assert!(std::fs::metadata(mnt2.join("low")).unwrap().ino() < 1 << 32);
    c.down().unwrap();
    let out = c.mako(&["fsck", "fs2", "-n"]).unwrap();
    assert_eq!(out.code, Some(0), "fsck of fs2:\n{}", out.text());
}
