//! Persistence across `mako down` / `mako up`, and an idempotent `mako up`.
//!
//! Proves: a tree with every kind of object Mako stores — nested directories; regular files of
//! 0, 1, 3901, 4096, 5000, 1 MiB+1 and 9 MiB bytes (around inode-inline, fragment, block and
//! indirect-block boundaries); a sparse file with data at 1 TiB; symlinks (short, dangling,
//! to a directory, and one with a 4000-byte target); hard links; user.* and trusted.* xattrs
//! (empty, small, 3000-byte values); a directory with 20,000 entries; modes including
//! setuid/setgid/sticky/0000; several owners; nanosecond atime/mtime set with utimensat (also
//! beyond 2038) — comes back after a full daemon stop and restart with every byte and every
//! stat field (type, mode, uid, gid, nlink, size, blocks, ino, atime, mtime, ctime, all in ns),
//! every xattr and every readdir set identical (each name exactly once).
//! Then `mako up` while already up exits 0, says "already up", keeps the same makod pid and
//! mount, and changes nothing in the tree.
//!
//! Contents are compared by hash; the 1 TiB sparse file is compared on its first 64 KiB, the
//! last 64 KiB up to EOF and 4 KiB probes in the hole (reading 1 TiB of zeros through FUSE is
//! not practical), plus size and allocated blocks.

use mako_tests::cluster::{is_mounted, kernel_mounts, require_fuse, ClusterOptions, TestCluster};
use mako_tests::pattern;
use mako_tests::sys;
use std::collections::hash_map::DefaultHasher;
use std::collections::BTreeMap;
use std::hash::Hasher;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

const TIB: u64 = 1 << 40;
const BIG_DIR_ENTRIES: usize = 20_000;

fn write(p: &Path, data: &[u8]) {
    std::fs::write(p, data).unwrap_or_else(|e| panic!("write {}: {e}", p.display()));
}

fn set_times(p: &Path, i: i64) {
    let times = [
        libc::timespec {
            tv_sec: 1_000_000_000 + i * 3_601,
            tv_nsec: (i * 7_919 + 1) % 1_000_000_000,
        },
        libc::timespec {
            tv_sec: 1_500_000_000 + i * 86_399,
            tv_nsec: (999_999_999 - i * 104_729) % 1_000_000_000,
        },
    ];
    sys::utimensat(p, &times, libc::AT_SYMLINK_NOFOLLOW)
        .unwrap_or_else(|e| panic!("utimensat {}: {e:?}", p.display()));
}

/// Builds the tree under `t`; returns every path (relative) that exists.
fn build_tree(t: &Path) {
    std::fs::create_dir(t).unwrap();
    for d in ["a", "a/b", "a/b/c", "setgid", "sticky", "private", "big"] {
        std::fs::create_dir(t.join(d)).unwrap();
    }
    let sizes: [usize; 7] = [0, 1, 3901, 4096, 5000, (1 << 20) + 1, 9 << 20];
    for (i, &n) in sizes.iter().enumerate() {
        write(&t.join(format!("a/b/c/f{n}")), &pattern(i as u64 + 1, n));
    }
    write(&t.join("a/top"), b"top level file\n");
    write(&t.join("setgid/inner"), &pattern(99, 12345));
    write(&t.join("sticky/tmpfile"), &pattern(98, 777));
    write(&t.join("private/secret"), &pattern(97, 4097));
    // Sparse: a few bytes at 0, 4 KiB at 1 TiB.
    {
        let f = std::fs::File::create(t.join("sparse")).unwrap();
        f.write_all_at(b"head", 0).unwrap();
        f.write_all_at(&pattern(7, 4096), TIB).unwrap();
    }
    // Symlinks.
    std::os::unix::fs::symlink("a/b/c/f5000", t.join("sym_file")).unwrap();
    std::os::unix::fs::symlink("a/b", t.join("sym_dir")).unwrap();
    std::os::unix::fs::symlink("does/not/exist", t.join("sym_dangling")).unwrap();
    let long: String = "d123456789/".repeat(400).chars().take(4000).collect();
    assert_eq!(long.len(), 4000);
    std::os::unix::fs::symlink(&long, t.join("sym_long")).unwrap();
    // Hard links: f5000 gets nlink 3.
    std::fs::hard_link(t.join("a/b/c/f5000"), t.join("a/hl1")).unwrap();
    std::fs::hard_link(t.join("a/b/c/f5000"), t.join("hl2")).unwrap();
    // Big directory: empty files, every 1000th with content.
    for i in 0..BIG_DIR_ENTRIES {
        let p = t.join(format!("big/entry-{i:05}"));
        if i % 1000 == 0 {
            write(&p, format!("entry {i}\n").as_bytes());
        } else {
            std::fs::File::create(&p).unwrap();
        }
    }
    // Xattrs.
    let xa = |p: &str, n: &str, v: &[u8]| {
        sys::setxattr(&t.join(p), n, v, 0, false)
            .unwrap_or_else(|e| panic!("setxattr {p} {n}: {e:?}"))
    };
    xa("a/b/c/f4096", "user.small", b"v");
    xa("a/b/c/f4096", "user.empty", b"");
    xa("a/b/c/f4096", "user.big", &pattern(5, 3000));
    xa("a/b/c/f0", "user.on_empty_file", b"hello");
    xa("a", "user.dir_attr", b"directory xattr");
    xa("big", "user.big_dir", b"20000");
    xa("a/b/c/f1", "trusted.root_only", b"trusted value");
    // Owners, then modes (chown clears set-id bits).
    let own = |p: &str, u: u32, g: u32| sys::lchown(&t.join(p), u, g).unwrap();
    own("a/b/c/f1", 1000, 1000);
    own("a/b/c/f3901", 12345, 54321);
    own("setgid", 1000, 2000);
    own("sticky", 65534, 65534);
    own("sym_file", 4242, 4343);
    own("private/secret", 1, 2);
    let md = |p: &str, m: u32| sys::chmod(&t.join(p), m).unwrap();
    md("a/b/c/f0", 0o000);
    md("a/b/c/f1", 0o4755);
    md("a/b/c/f3901", 0o2711);
    md("a/b/c/f4096", 0o600);
    md("a/b/c/f5000", 0o777);
    md("setgid", 0o2775);
    md("sticky", 0o1777);
    md("private", 0o700);
    md("private/secret", 0o400);
    // Nanosecond times, post-order (children first so a directory's mtime stays as set).
    let mut ordered: Vec<PathBuf> = walk(t)
        .into_iter()
        .filter(|p| !p.starts_with("big/"))
        .collect();
    ordered.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    for (i, rel) in ordered.iter().enumerate() {
        set_times(&t.join(rel), i as i64);
    }
    // One time beyond 2038 (64-bit seconds).
    let far = [
        libc::timespec {
            tv_sec: 4_102_444_800,
            tv_nsec: 1,
        },
        libc::timespec {
            tv_sec: 8_589_934_592,
            tv_nsec: 999_999_999,
        },
    ];
    sys::utimensat(&t.join("a/top"), &far, 0).unwrap();
}

/// All paths below `t` (relative, including `t` itself as ""), depth-first.
fn walk(t: &Path) -> Vec<PathBuf> {
    let mut out = vec![PathBuf::new()];
    let mut i = 0;
    while i < out.len() {
        let rel = out[i].clone();
        let p = t.join(&rel);
        if std::fs::symlink_metadata(&p).unwrap().is_dir() {
            let mut names: Vec<_> = std::fs::read_dir(&p)
                .unwrap()
                .map(|e| e.unwrap().file_name())
                .collect();
            names.sort();
            for n in names {
                out.push(rel.join(n));
            }
        }
        i += 1;
    }
    out
}

#[derive(Debug, PartialEq, Eq, Clone)]
struct StatRec {
    mode: u32,
    uid: u32,
    gid: u32,
    nlink: u64,
    size: i64,
    blocks: i64,
    ino: u64,
    atime: i128,
    mtime: i128,
    ctime: i128,
}

#[derive(Debug, PartialEq, Eq, Clone)]
enum Content {
    File(u64),
    Sparse(u64),
    Symlink(Vec<u8>),
    Dir(Vec<Vec<u8>>),
}

#[derive(Debug, PartialEq, Eq, Clone)]
struct ContentRec {
    content: Content,
    xattrs: BTreeMap<String, Vec<u8>>,
}

fn stat_rec(p: &Path) -> StatRec {
    let s = sys::lstat(p).unwrap_or_else(|e| panic!("lstat {}: {e:?}", p.display()));
    StatRec {
        mode: s.st_mode,
        uid: s.st_uid,
        gid: s.st_gid,
        nlink: s.st_nlink,
        size: s.st_size,
        blocks: s.st_blocks,
        ino: s.st_ino,
        atime: sys::ts_ns(s.st_atime, s.st_atime_nsec),
        mtime: sys::ts_ns(s.st_mtime, s.st_mtime_nsec),
        ctime: sys::ts_ns(s.st_ctime, s.st_ctime_nsec),
    }
}

fn hash_range(f: &std::fs::File, h: &mut DefaultHasher, mut off: u64, end: u64) {
    let mut buf = vec![0u8; 1 << 20];
    while off < end {
        let n = ((end - off) as usize).min(buf.len());
        f.read_exact_at(&mut buf[..n], off).unwrap();
        h.write(&buf[..n]);
        off += n as u64;
    }
}

fn content_rec(p: &Path) -> ContentRec {
    let md = std::fs::symlink_metadata(p).unwrap();
    let ft = md.file_type();
    let content = if ft.is_symlink() {
        Content::Symlink(
            std::fs::read_link(p)
                .unwrap()
                .as_os_str()
                .as_bytes()
                .to_vec(),
        )
    } else if ft.is_dir() {
        let mut names: Vec<Vec<u8>> = std::fs::read_dir(p)
            .unwrap()
            .map(|e| e.unwrap().file_name().as_bytes().to_vec())
            .collect();
        let n = names.len();
        names.sort();
        names.dedup();
        assert_eq!(
            n,
            names.len(),
            "readdir of {} returned a name twice",
            p.display()
        );
        Content::Dir(names)
    } else {
        let f = std::fs::File::open(p).unwrap();
        let size = md.len();
        let mut h = DefaultHasher::new();
        if size > 64 << 20 {
            hash_range(&f, &mut h, 0, 64 << 10);
            for probe in [1u64 << 20, 1 << 30, 1 << 35, TIB - 8192] {
                hash_range(&f, &mut h, probe, probe + 4096);
            }
            hash_range(&f, &mut h, size.saturating_sub(64 << 10), size);
            Content::Sparse(h.finish())
        } else {
            hash_range(&f, &mut h, 0, size);
            Content::File(h.finish())
        }
    };
    let mut xattrs = BTreeMap::new();
    if !ft.is_symlink() {
        for name in sys::listxattr(p).unwrap() {
            xattrs.insert(name.clone(), sys::getxattr(p, &name).unwrap());
        }
    }
    ContentRec { content, xattrs }
}

/// Contents first (reads may update atime), then stats.
fn record(
    t: &Path,
    paths: &[PathBuf],
) -> (BTreeMap<PathBuf, ContentRec>, BTreeMap<PathBuf, StatRec>) {
    let contents = paths
        .iter()
        .map(|r| (r.clone(), content_rec(&t.join(r))))
        .collect();
    let stats = paths
        .iter()
        .map(|r| (r.clone(), stat_rec(&t.join(r))))
        .collect();
    (contents, stats)
}

fn compare_stats(t: &Path, expected: &BTreeMap<PathBuf, StatRec>, when: &str) -> Vec<String> {
    let mut diffs = Vec::new();
    for (rel, want) in expected {
        let got = stat_rec(&t.join(rel));
        if &got != want {
            diffs.push(format!(
                "{when}: stat of {:?} differs:\n   before {want:?}\n   after  {got:?}",
                rel
            ));
        }
    }
    diffs
}

fn compare_contents(t: &Path, expected: &BTreeMap<PathBuf, ContentRec>, when: &str) -> Vec<String> {
    let mut diffs = Vec::new();
    for (rel, want) in expected {
        let got = content_rec(&t.join(rel));
        if &got != want {
            let show = |c: &ContentRec| match &c.content {
                Content::Dir(n) => format!(
                    "dir of {} names, xattrs {:?}",
                    n.len(),
                    c.xattrs.keys().collect::<Vec<_>>()
                ),
                other => format!(
                    "{other:?}, xattrs {:?}",
                    c.xattrs
                        .iter()
                        .map(|(k, v)| (k, v.len()))
                        .collect::<Vec<_>>()
                ),
            };
            diffs.push(format!(
                "{when}: content of {:?} differs:\n   before {}\n   after  {}",
                rel,
                show(want),
                show(&got)
            ));
        }
    }
    diffs
}

fn report(diffs: Vec<String>) {
    if !diffs.is_empty() {
        let n = diffs.len();
        let shown: Vec<String> = diffs.into_iter().take(40).collect();
        panic!("{n} difference(s):\n{}", shown.join("\n"));
    }
}

#[test]
fn tree_survives_remount_and_up_is_idempotent() {
    if !require_fuse("tree_survives_remount_and_up_is_idempotent") {
        return;
    }
    let cluster = TestCluster::up(ClusterOptions::default()).expect("mako up");
    let t = cluster.mount().join("tree");
    let t0 = std::time::Instant::now();
    build_tree(&t);
    println!("built tree in {:.1} s", t0.elapsed().as_secs_f64());
    let paths = walk(&t);
    assert_eq!(
        paths.len(),
        1 + 7 + 7 + 1 + 3 + 1 + 4 + 2 + BIG_DIR_ENTRIES,
        "tree has an unexpected number of entries"
    );
    // Sanity of what we built (the recorded values are what must survive).
    let (contents, stats) = record(&t, &paths);
    assert_eq!(stats[Path::new("a/b/c/f5000")].nlink, 3);
    assert_eq!(stats[Path::new("sparse")].size as u64, TIB + 4096);
    assert!(
        matches!(&contents[Path::new("sym_long")].content, Content::Symlink(s) if s.len() == 4000)
    );
    assert_eq!(stats[Path::new("a/b/c/f1")].mode & 0o7777, 0o4755);
    assert!(stats[Path::new("a/b/c/f3901")].mtime % 1_000_000_000 != 0);
    match &contents[Path::new("big")].content {
        Content::Dir(n) => assert_eq!(n.len(), BIG_DIR_ENTRIES),
        other => panic!("big: {other:?}"),
    }
    let statvfs_before = sys::statvfs(cluster.mount()).unwrap();
    let pid_before = cluster.makod_pid();

    let t1 = std::time::Instant::now();
    cluster.remount().expect("mako down; mako up");
    println!("down+up in {:.1} s", t1.elapsed().as_secs_f64());
    assert_ne!(
        cluster.makod_pid(),
        pid_before,
        "mako down/up must restart makod"
    );

    // Stats first (before any read can touch atime), then contents.
    let mut diffs = compare_stats(&t, &stats, "after remount");
    assert_eq!(
        walk(&t),
        paths,
        "the set of paths changed across the remount"
    );
    diffs.extend(compare_contents(&t, &contents, "after remount"));
    let statvfs_after = sys::statvfs(cluster.mount()).unwrap();
    println!(
        "statvfs free blocks before {} after {}, free inodes before {} after {}",
        statvfs_before.f_bfree,
        statvfs_after.f_bfree,
        statvfs_before.f_ffree,
        statvfs_after.f_ffree
    );
    report(diffs);

    // `mako up` while up: exit 0, "already up", same daemon, same single mount, no changes.
    let stats_now: BTreeMap<PathBuf, StatRec> = paths
        .iter()
        .map(|r| (r.clone(), stat_rec(&t.join(r))))
        .collect();
    let pid = cluster.makod_pid();
    let out = cluster.mako(&["up"]).unwrap();
    println!("mako up (already up):\n{out}");
    assert!(out.success(), "mako up when up must exit 0: {out}");
    assert!(
        out.text().contains("already up"),
        "mako up when up must say \"already up\": {out}"
    );
    assert_eq!(
        cluster.makod_pid(),
        pid,
        "mako up when up must not restart makod"
    );
    assert!(pid.is_some_and(mako_tests::cluster::process_alive));
    assert!(is_mounted(cluster.mount()));
    let n_mounts = kernel_mounts()
        .iter()
        .filter(|m| m.as_path() == cluster.mount())
        .count();
    assert_eq!(n_mounts, 1, "mako up when up must not mount a second time");
    report(compare_stats(&t, &stats_now, "after second mako up"));
    assert_eq!(walk(&t), paths);
}
