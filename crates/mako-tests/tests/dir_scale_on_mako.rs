//! Large-directory correctness and a per-slice cost profile.
//!
//! Proves (asserted): in one directory with N entries (env `MAKO_DIR_ENTRIES`, default
//! 100,000), every `open(O_CREAT|O_EXCL)` of a new name succeeds, a second O_EXCL create of
//! an existing name fails with EEXIST, stat of a random sample of existing names succeeds
//! (regular, size 0) and of unlinked/never-created names gives ENOENT, readdir returns each
//! of the N names exactly once and nothing else, every unlink succeeds and the directory is
//! empty at the end (rmdir works).
//!
//! Measured (printed, never asserted — no timed assertions in tests): for each successive 10%
//! slice, creates/s while the directory grows through that slice, stats/s of a random sample
//! of all names present at the end of that slice, and unlinks/s of that slice of unlinks (in
//! random order, the directory shrinking); then the ratio of the last slice's cost per
//! operation to the first slice's.

use mako_tests::cluster::{require_fuse, ClusterOptions, TestCluster};
use mako_tests::fsx::Rng;
use mako_tests::sys;
use std::collections::HashSet;
use std::path::Path;
use std::time::Instant;

fn name(i: usize) -> String {
    // Varied lengths and a shared prefix, like real directories.
    format!("file-{i:07}-{}", "x".repeat(i % 23))
}

fn create(p: &Path) -> Result<(), sys::Errno> {
    sys::open(
        p,
        libc::O_CREAT | libc::O_EXCL | libc::O_WRONLY | libc::O_CLOEXEC,
        0o644,
    )
    .map(drop)
}

#[test]
fn directory_with_many_entries() {
    if !require_fuse("directory_with_many_entries") {
        return;
    }
    let n: usize = std::env::var("MAKO_DIR_ENTRIES")
        .ok()
        .map(|s| s.parse().expect("MAKO_DIR_ENTRIES: integer"))
        .unwrap_or(100_000);
    assert!(n >= 10, "MAKO_DIR_ENTRIES must be at least 10");
    let cluster = TestCluster::up(ClusterOptions {
        disk_size: "4G".into(),
        ..Default::default()
    })
    .expect("mako up");
    let dir = cluster.mount().join("big");
    std::fs::create_dir(&dir).unwrap();
    let mut rng = Rng::new(0x5eed_d1e5);
    let slice = n / 10;
    let bounds: Vec<(usize, usize)> = (0..10)
        .map(|k| (k * slice, if k == 9 { n } else { (k + 1) * slice }))
        .collect();
    let sample = slice.clamp(1, 2_000);
    let mut create_rate = Vec::new();
    let mut stat_rate = Vec::new();
    let t_all = Instant::now();
    for &(lo, hi) in &bounds {
        let t = Instant::now();
        for i in lo..hi {
            create(&dir.join(name(i))).unwrap_or_else(|e| panic!("create #{i} {}: {e:?}", name(i)));
        }
        create_rate.push((hi - lo) as f64 / t.elapsed().as_secs_f64());
        let picks: Vec<usize> = (0..sample).map(|_| rng.below(hi as u64) as usize).collect();
        let t = Instant::now();
        for &i in &picks {
            let st = sys::stat(&dir.join(name(i))).unwrap_or_else(|e| panic!("stat #{i}: {e:?}"));
            assert_eq!(st.st_mode & libc::S_IFMT, libc::S_IFREG);
            assert_eq!(st.st_size, 0);
        }
        stat_rate.push(sample as f64 / t.elapsed().as_secs_f64());
    }
    let create_s = t_all.elapsed().as_secs_f64();
    assert_eq!(
        create(&dir.join(name(n / 2))).unwrap_err().0,
        libc::EEXIST,
        "O_EXCL on an existing name"
    );
    assert_eq!(
        sys::stat(&dir.join("never-created")).unwrap_err().0,
        libc::ENOENT
    );

    let t = Instant::now();
    let mut seen = HashSet::with_capacity(n);
    let mut count = 0usize;
    for e in std::fs::read_dir(&dir).unwrap() {
        let s = e.unwrap().file_name().into_string().unwrap();
        count += 1;
        assert!(seen.insert(s.clone()), "readdir returned {s} twice");
    }
    let readdir_s = t.elapsed().as_secs_f64();
    assert_eq!(count, n, "readdir returned {count} entries, want {n}");
    for i in 0..n {
        assert!(seen.contains(&name(i)), "readdir lacks {}", name(i));
    }
    drop(seen);

    let mut order: Vec<usize> = (0..n).collect();
    for i in (1..n).rev() {
        order.swap(i, rng.below(i as u64 + 1) as usize);
    }
    let mut unlink_rate = Vec::new();
    let t_all = Instant::now();
    for &(lo, hi) in &bounds {
        let t = Instant::now();
        for &i in &order[lo..hi] {
            sys::unlink(&dir.join(name(i))).unwrap_or_else(|e| panic!("unlink #{i}: {e:?}"));
        }
        unlink_rate.push((hi - lo) as f64 / t.elapsed().as_secs_f64());
        if hi < n {
            assert_eq!(
                sys::stat(&dir.join(name(order[lo]))).unwrap_err().0,
                libc::ENOENT,
                "unlinked name still there"
            );
        }
    }
    let unlink_s = t_all.elapsed().as_secs_f64();
    assert!(
        std::fs::read_dir(&dir).unwrap().next().is_none(),
        "directory not empty after unlinking all"
    );
    std::fs::remove_dir(&dir).unwrap();

    println!();
    println!(
        "directory scaling, N = {n} entries ({} per slice; stats: {sample} random names per slice)",
        slice
    );
    println!(
        "{:>9} {:>12} {:>12} {:>12}",
        "slice", "creates/s", "stats/s", "unlinks/s"
    );
    for k in 0..10 {
        println!(
            "{:>4}-{:>3}% {:>12.0} {:>12.0} {:>12.0}",
            k * 10,
            (k + 1) * 10,
            create_rate[k],
            stat_rate[k],
            unlink_rate[k]
        );
    }
    let ratio = |r: &[f64]| r[0] / r[9];
    println!(
        "cost ratio last/first slice (time per op): create {:.2}, stat {:.2}, unlink {:.2}",
        ratio(&create_rate),
        ratio(&stat_rate),
        ratio(&unlink_rate)
    );
    println!(
        "totals: create {:.1} s ({:.0}/s), readdir {:.2} s ({:.0} entries/s), unlink {:.1} s ({:.0}/s)",
        create_s,
        n as f64 / create_s,
        readdir_s,
        n as f64 / readdir_s,
        unlink_s,
        n as f64 / unlink_s
    );
}
