//! A directory grown to N entries (default 1,000,000; `MAKO_DIR_ENTRIES` to change):
//! create, lookup, readdir and unlink every entry through the file system core, and a
//! table of the cost per operation for each successive tenth of the directory, which
//! shows whether the cost grows with the directory's size (extendible hashing says it
//! must not). Correctness is asserted; times are only printed (no timed assertions).

use mako_fs::fs::{Ctx, ROOT_INO};
use mako_fs::test_util::{small_config, MemDisks};
use mako_fs::MkfsParams;
use std::collections::HashSet;
use std::time::Instant;

#[test]
fn directory_with_many_entries() {
    let n: usize = std::env::var("MAKO_DIR_ENTRIES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_000_000);
    // Default blocks (4 MiB) and directory blocks (256 KiB); 512-byte inodes keep the
    // inode file of a million files small enough for in-memory disks (the directory
    // algorithm does not depend on the inode size).
    let disks = MemDisks::new(2, (1 << 30) + (n as u64) * 1024);
    disks.format(&MkfsParams {
        inodes_max: Some(n as u64 + 1000),
        inode_bytes: 512,
        ..MkfsParams::default()
    });
    let cache: usize = std::env::var("MAKO_DIR_CACHE")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(4000);
    let m = disks.mount(mako_fs::FsConfig {
        max_files_to_cache: cache,
        ..small_config()
    });
    let fs = &m.fs;
    let c = Ctx::default();
    let d = fs.mkdir(c, ROOT_INO, b"big", 0o755, 0).unwrap();
    let name = |i: usize| format!("file.{i:08}.mdtest");
    let slices = 10;
    let per = n / slices;
    let mut rows = Vec::new();
    for s in 0..slices {
        let t = Instant::now();
        for i in s * per..(s + 1) * per {
            fs.create(c, d.ino, name(i).as_bytes(), 0o644, 0, true)
                .unwrap();
        }
        let create = t.elapsed().as_secs_f64() / per as f64;
        // Look up a sample spread over everything created so far.
        let t = Instant::now();
        let sample = 2000.min(per);
        for k in 0..sample {
            let i = (k * 7919) % ((s + 1) * per);
            fs.lookup(d.ino, name(i).as_bytes()).unwrap();
        }
        let lookup = t.elapsed().as_secs_f64() / sample as f64;
        rows.push((s, create, lookup));
    }
    let (blocks, depth, size) = fs.dir_shape(d.ino).unwrap();
    println!(
        "directory of {n} entries: hash depth {depth}, {blocks} blocks cached, size {size} bytes"
    );
    // readdir: every name exactly once.
    let t = Instant::now();
    let mut seen = HashSet::with_capacity(n);
    let mut after = 0;
    loop {
        let batch = fs.readdir(d.ino, after, 1000).unwrap();
        if batch.is_empty() {
            break;
        }
        for e in batch {
            after = e.cookie;
            if e.name != b"." && e.name != b".." {
                assert!(seen.insert(e.name), "readdir returned a name twice");
            }
        }
    }
    assert_eq!(seen.len(), n, "readdir must return every entry once");
    let readdir = t.elapsed().as_secs_f64() / n as f64;
    let mut unlink_rows = Vec::new();
    for s in 0..slices {
        let t = Instant::now();
        for i in s * per..(s + 1) * per {
            fs.unlink(d.ino, name(i).as_bytes()).unwrap();
        }
        unlink_rows.push(t.elapsed().as_secs_f64() / per as f64);
    }
    fs.rmdir(ROOT_INO, b"big").unwrap();
    println!(
        "{:>6} {:>14} {:>14} {:>14}",
        "slice", "create us/op", "lookup us/op", "unlink us/op"
    );
    for (i, (s, create, lookup)) in rows.iter().enumerate() {
        println!(
            "{:>5}0% {:>14.2} {:>14.2} {:>14.2}",
            s + 1,
            create * 1e6,
            lookup * 1e6,
            unlink_rows[i] * 1e6
        );
    }
    println!("readdir {:.2} us/entry", readdir * 1e6);
    let first = rows[0].1;
    let last = rows[slices - 1].1;
    println!("create cost, last tenth / first tenth: {:.2}", last / first);
    m.unmount().unwrap();
}
