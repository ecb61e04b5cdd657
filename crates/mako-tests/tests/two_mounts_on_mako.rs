//! Two nodes of one file system through the real kernel: `makod --local-nodes 2` runs both
//! nodes in one process, each with its own recovery log, pagepool and FUSE mount, with the
//! FUSE settings as the product ships them (entry and attribute TTLs, page cache per open,
//! no writeback cache). What one node changes reaches the other node's kernel caches only
//! through that node's token revokes, so a stale kernel cache shows up as a wrong answer on
//! the other mount. Every test ends by stopping both nodes and running `mako fsck -n` on
//! the disk files, which must be clean.
//!
//! Env: `MAKO_FSX_SEED` (comma-separated seeds of the fsx test; default 1,3,5 — seed 5
//! reaches a rename whose dentry the kernel moved, op 1574),
//! `MAKO_FSX_OPS` (operations per seed, default 2,500; e.g. 100000 for a long local run).
//! Replay a failing seed with
//! `MAKO_FSX_SEED=S MAKO_FSX_OPS=N cargo test --release -p mako-tests --test two_mounts_on_mako fsx_across_two_mounts`.

use mako_tests::cluster::require_fuse;
use mako_tests::fsx::{run_fsx, FsxOptions, OpWeights};
use mako_tests::multinode::{MultiNode, MultiNodeOptions};
use mako_tests::pattern;
use std::collections::BTreeSet;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

fn up() -> MultiNode {
    MultiNode::up(MultiNodeOptions::default()).expect("two nodes up")
}

/// fsx on one file and a few names, each operation through a random one of the two mounts.
fn fsx_seed(seed: u64, ops: u64) -> Result<(), String> {
    let c = up();
    let dir = c.mount(0).join("fsx");
    std::fs::create_dir(&dir).expect("mkdir fsx");
    let mut o = FsxOptions::new(&dir, seed, ops);
    o.mounts = vec![c.mount(1).join("fsx")];
    o.weights = OpWeights::cluster();
    o.keep_on_failure = false;
    println!(
        "fsx: seed {seed}, {ops} ops over two mounts; replay: MAKO_FSX_SEED={seed} MAKO_FSX_OPS={ops} \
         cargo test --release -p mako-tests --test two_mounts_on_mako fsx_across_two_mounts"
    );
    match run_fsx(&mut o) {
        Ok(stats) => println!("{stats}"),
        Err(f) => {
            return Err(format!(
                "{f}\n(replay: MAKO_FSX_SEED={seed} MAKO_FSX_OPS={ops} cargo test --release -p \
                 mako-tests --test two_mounts_on_mako fsx_across_two_mounts)\nmakod log tail:\n{}",
                c.log_tail(20)
            ))
        }
    }
    c.finish().map_err(|e| format!("seed {seed}: {e:#}"))
}

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .map(|s| s.parse().unwrap_or_else(|_| panic!("{name}: an integer")))
        .unwrap_or(default)
}

#[test]
fn fsx_across_two_mounts() {
    if !require_fuse("fsx_across_two_mounts") {
        return;
    }
    let ops = env_u64("MAKO_FSX_OPS", 2_500);
    let seeds: Vec<u64> = match std::env::var("MAKO_FSX_SEED") {
        Ok(s) => s
            .split(',')
            .map(|t| {
                t.trim()
                    .parse()
                    .expect("MAKO_FSX_SEED: comma-separated integers")
            })
            .collect(),
        Err(_) => vec![1, 3, 5],
    };
    let failed: Vec<String> = seeds
        .iter()
        .filter_map(|&s| fsx_seed(s, ops).err())
        .collect();
    assert!(failed.is_empty(), "{}", failed.join("\n\n"));
}

/// Seeds where data one node wrote read back as zeros on the other (seed 2 at op 1316,
/// seed 4 at op 3093): a write that grew the file changed its old last block without
/// holding that block's data token. Fixed in the core; kept as a regression check.
#[test]
fn fsx_seeds_that_lost_writes_across_two_mounts() {
    if !require_fuse("fsx_seeds_that_lost_writes_across_two_mounts") {
        return;
    }
    let failed: Vec<String> = [(2, 1_316), (4, 3_093)]
        .iter()
        .filter_map(|&(s, ops)| fsx_seed(s, ops).err())
        .collect();
    assert!(failed.is_empty(), "{}", failed.join("\n\n"));
}

fn read_file(p: &Path) -> Vec<u8> {
    std::fs::read(p).unwrap_or_else(|e| panic!("read {}: {e}", p.display()))
}

fn drop_caches() {
    std::fs::write("/proc/sys/vm/drop_caches", "3").expect("echo 3 > /proc/sys/vm/drop_caches");
}

#[test]
fn data_written_on_one_node_reads_on_the_other() {
    if !require_fuse("data_written_on_one_node_reads_on_the_other") {
        return;
    }
    let c = up();
    let (a, b) = (c.mount(0).join("data"), c.mount(1).join("data"));
    // Written on node 0: 9 MiB + 1 byte (unaligned end), then 47,008-byte records.
    let mut want = pattern(1, 9 * 1024 * 1024 + 1);
    std::fs::write(&a, &want).unwrap();
    {
        let mut f = std::fs::OpenOptions::new().write(true).open(&a).unwrap();
        for r in 0..20u64 {
            let rec = pattern(100 + r, 47_008);
            let off = r * 3 * 47_008;
            f.seek(SeekFrom::Start(off)).unwrap();
            f.write_all(&rec).unwrap();
            want[off as usize..off as usize + rec.len()].copy_from_slice(&rec);
        }
    }
    assert_eq!(std::fs::metadata(&b).unwrap().len(), want.len() as u64);
    assert!(read_file(&b) == want, "node 1 reads what node 0 wrote");
    drop_caches();
    assert!(read_file(&b) == want, "node 1, after drop_caches");
    assert!(read_file(&a) == want, "node 0, after drop_caches");
    // Both open at once: node 1 overwrites and extends, node 0 reads through its open file.
    let mut fa = std::fs::File::open(&a).unwrap();
    let mut before = Vec::new();
    fa.read_to_end(&mut before).unwrap();
    assert!(before == want);
    {
        let mut fb = std::fs::OpenOptions::new().write(true).open(&b).unwrap();
        let patch = pattern(7, 300_001);
        fb.seek(SeekFrom::Start(1_000_003)).unwrap();
        fb.write_all(&patch).unwrap();
        want[1_000_003..1_300_004].copy_from_slice(&patch);
        let tail = pattern(8, 47_008);
        fb.seek(SeekFrom::Start(want.len() as u64 + 5)).unwrap();
        fb.write_all(&tail).unwrap();
        want.resize(want.len() + 5, 0);
        want.extend_from_slice(&tail);
    }
    assert_eq!(
        fa.metadata().unwrap().len(),
        want.len() as u64,
        "size on node 0"
    );
    let mut again = Vec::new();
    fa.seek(SeekFrom::Start(0)).unwrap();
    fa.read_to_end(&mut again).unwrap();
    assert!(again == want, "node 0's open file sees node 1's writes");
    drop(fa);
    drop_caches();
    assert!(read_file(&a) == want, "node 0, after drop_caches");
    assert!(read_file(&b) == want, "node 1, after drop_caches");
    // Truncated on node 0: node 1 sees the new size and the bytes up to it.
    let f = std::fs::OpenOptions::new().write(true).open(&a).unwrap();
    f.set_len(123_457).unwrap();
    drop(f);
    want.truncate(123_457);
    assert!(read_file(&b) == want, "node 1 after node 0's truncate");
    c.finish().expect("stop and fsck");
}

fn listing(dir: &Path) -> BTreeSet<String> {
    std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("readdir {}: {e}", dir.display()))
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect()
}

/// `ls -1` of `dir` as the command prints it.
fn ls(dir: &Path) -> BTreeSet<String> {
    let out = std::process::Command::new("ls")
        .arg("-1")
        .arg(dir)
        .output()
        .expect("run ls");
    assert!(out.status.success(), "ls {}: {:?}", dir.display(), out);
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .collect()
}

#[test]
fn names_in_one_shared_directory_from_both_mounts() {
    if !require_fuse("names_in_one_shared_directory_from_both_mounts") {
        return;
    }
    let c = up();
    let d = [c.mount(0).join("shared"), c.mount(1).join("shared")];
    std::fs::create_dir(&d[0]).unwrap();
    let mut model = BTreeSet::new();
    let check = |model: &BTreeSet<String>, when: &str| {
        for (i, dir) in d.iter().enumerate() {
            assert_eq!(&listing(dir), model, "readdir on node {i} {when}");
        }
    };
    // Creates alternating between the mounts; every name checked on the other at once.
    for i in 0..300 {
        let name = format!("f{i}");
        std::fs::write(d[i % 2].join(&name), name.as_bytes()).unwrap();
        assert_eq!(read_file(&d[(i + 1) % 2].join(&name)), name.as_bytes());
        model.insert(name);
    }
    check(&model, "after the creates");
    for (i, dir) in d.iter().enumerate() {
        assert_eq!(ls(dir), model, "ls on node {i}");
    }
    // Unlinks of every third, alternating; the other mount must not find them.
    for i in (0..300).step_by(3) {
        let name = format!("f{i}");
        std::fs::remove_file(d[i % 2].join(&name)).unwrap();
        let other = d[(i + 1) % 2].join(&name);
        assert!(
            std::fs::symlink_metadata(&other).is_err(),
            "{} still there after its unlink on the other node",
            other.display()
        );
        model.remove(&name);
    }
    check(&model, "after the unlinks");
    // Renames, alternating, over free names and over existing ones.
    for i in (1..300).step_by(3) {
        let (from, to) = (format!("f{i}"), format!("g{i}"));
        std::fs::rename(d[i % 2].join(&from), d[i % 2].join(&to)).unwrap();
        let o = &d[(i + 1) % 2];
        assert!(
            std::fs::symlink_metadata(o.join(&from)).is_err(),
            "{from} gone"
        );
        assert_eq!(
            read_file(&o.join(&to)),
            from.as_bytes(),
            "{to} on the other node"
        );
        model.remove(&from);
        model.insert(to);
    }
    for i in (2..299).step_by(3) {
        // f{i} replaces g{i-1}.
        let (from, to) = (format!("f{i}"), format!("g{}", i - 1));
        std::fs::rename(d[(i + 1) % 2].join(&from), d[(i + 1) % 2].join(&to)).unwrap();
        assert_eq!(read_file(&d[i % 2].join(&to)), from.as_bytes());
        model.remove(&from);
    }
    check(&model, "after the renames");
    for (i, dir) in d.iter().enumerate() {
        assert_eq!(ls(dir), model, "ls on node {i}");
    }
    drop_caches();
    check(&model, "after drop_caches");
    // A directory made on one node, filled and removed from the other.
    std::fs::create_dir(d[1].join("sub")).unwrap();
    std::fs::write(d[0].join("sub/x"), b"x").unwrap();
    assert!(std::fs::remove_dir(d[1].join("sub")).is_err(), "not empty");
    std::fs::remove_file(d[1].join("sub/x")).unwrap();
    std::fs::remove_dir(d[0].join("sub")).unwrap();
    assert!(std::fs::symlink_metadata(d[1].join("sub")).is_err());
    check(&model, "at the end");
    c.finish().expect("stop and fsck");
}

#[test]
fn posix_suite_on_one_mount_while_the_other_writes() {
    if !require_fuse("posix_suite_on_one_mount_while_the_other_writes") {
        return;
    }
    let c = up();
    let dir = c.mount(1).join("posix");
    std::fs::create_dir(&dir).unwrap();
    let wdir = c.mount(0).join("writer");
    std::fs::create_dir(&wdir).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    // Node 0 writes, reads back and replaces files in its own directory all along.
    let writer = {
        let stop = stop.clone();
        let wdir = wdir.clone();
        std::thread::spawn(move || -> Result<u64, String> {
            let mut rounds = 0u64;
            while !stop.load(Ordering::SeqCst) {
                let data = pattern(rounds, 200_000 + (rounds as usize % 7) * 47_008);
                let p = wdir.join(format!("w{}", rounds % 8));
                std::fs::write(&p, &data).map_err(|e| format!("write {}: {e}", p.display()))?;
                let got = std::fs::read(&p).map_err(|e| format!("read {}: {e}", p.display()))?;
                if got != data {
                    return Err(format!("round {rounds}: {} reads back wrong", p.display()));
                }
                rounds += 1;
            }
            Ok(rounds)
        })
    };
    let report = mako_tests::run_posix_suite(&dir, None);
    stop.store(true, Ordering::SeqCst);
    let rounds = writer.join().expect("writer thread");
    println!("{report}");
    let failures: Vec<String> = report.failures().map(|r| r.to_string()).collect();
    assert!(
        report.results.len() >= 60,
        "ran {} checks",
        report.results.len()
    );
    assert!(
        failures.is_empty(),
        "POSIX checks failed on node 1 while node 0 wrote ({}):\n{}\n\nmakod log tail:\n{}",
        report.summary(),
        failures.join("\n"),
        c.log_tail(30)
    );
    let rounds = rounds.expect("node 0's writer");
    assert!(rounds > 0, "node 0 wrote nothing while the suite ran");
    println!("node 0 wrote and checked {rounds} files meanwhile");
    // What node 0 wrote last is what node 1 reads.
    for k in 0..rounds.min(8) {
        let last = (0..rounds).rev().find(|r| r % 8 == k).unwrap();
        let want = pattern(last, 200_000 + (last as usize % 7) * 47_008);
        assert!(
            read_file(&c.mount(1).join(format!("writer/w{k}"))) == want,
            "w{k} on node 1"
        );
    }
    c.finish().expect("stop and fsck");
}
