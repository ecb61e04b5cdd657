//! Self-tests of the tools against local file systems: the POSIX suite on the local disk (and on
//! a private tmpfs when running as root), fsx runs, corruption detection and the remount hook.
//! Temp dirs are `TempDir`s (removed on drop, also when a test panics); the tmpfs is unmounted by
//! a drop guard.

use mako_tests::fsx::{run_fsx, FsxOptions};
use mako_tests::posix::{check_names, run_posix_suite, Outcome, Report};
use std::cell::Cell;
use std::path::{Path, PathBuf};
use std::rc::Rc;

fn tempdir(prefix: &str) -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix(prefix)
        .tempdir()
        .expect("create temp dir")
}

fn assert_no_failures(report: &Report, expected_skips: &[&str]) {
    println!("{report}");
    let failures: Vec<String> = report.failures().map(|r| r.to_string()).collect();
    assert!(
        failures.is_empty(),
        "POSIX checks failed:\n{}",
        failures.join("\n")
    );
    for r in &report.results {
        if let Outcome::Skip(why) = &r.outcome {
            let root = unsafe { libc::geteuid() } == 0;
            assert!(
                expected_skips.contains(&r.name) || (!root && why.contains("requires root")),
                "unexpected skip of {}: {why}",
                r.name
            );
        }
    }
}

fn leftover_entries(dir: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .collect()
}

#[test]
fn posix_suite_passes_on_local_disk() {
    let dir = tempdir("mako-posix-");
    let report = run_posix_suite(dir.path(), None);
    assert!(
        report.results.len() >= 60,
        "expected the full check table, ran {}",
        report.results.len()
    );
    assert_no_failures(&report, &[]);
    assert!(
        leftover_entries(dir.path()).is_empty(),
        "check directories must be removed"
    );
}

/// Unmounts on drop (also during a panic).
struct Mount(PathBuf);

impl Drop for Mount {
    fn drop(&mut self) {
        let c = mako_tests::sys::cstr(&self.0);
        unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
    }
}

#[test]
fn posix_suite_passes_on_tmpfs() {
    if unsafe { libc::geteuid() } != 0 {
        return mako_tests::skip::cannot_run(
            "posix_suite_passes_on_tmpfs",
            "mounting tmpfs needs root",
        );
    }
    let dir = tempdir("mako-posix-tmpfs-");
    let (src, fstype, data) = (c"mako-tests", c"tmpfs", c"size=256m,mode=0755");
    let target = mako_tests::sys::cstr(dir.path());
    let r = unsafe {
        libc::mount(
            src.as_ptr(),
            target.as_ptr(),
            fstype.as_ptr(),
            0,
            data.as_ptr().cast(),
        )
    };
    if r != 0 {
        return mako_tests::skip::cannot_run(
            "posix_suite_passes_on_tmpfs",
            &format!("cannot mount tmpfs: {}", std::io::Error::last_os_error()),
        );
    }
    let _m = Mount(dir.path().to_path_buf());
    let report = run_posix_suite(dir.path(), None);
    // tmpfs lacks FALLOC_FL_ZERO_RANGE and keeps mmap writes beyond EOF (documented skips).
    assert_no_failures(&report, &["fallocate_zero_range", "mmap_write_beyond_eof"]);
}

#[test]
fn posix_filter_and_names() {
    let all = check_names(None);
    let mut uniq = all.clone();
    uniq.sort();
    uniq.dedup();
    assert_eq!(uniq.len(), all.len(), "check names must be unique");
    let renames = check_names(Some("rename"));
    assert!(renames.len() >= 5 && renames.iter().all(|n| n.contains("rename")));
    let dir = tempdir("mako-posix-filter-");
    let report = run_posix_suite(dir.path(), Some("symlink"));
    assert_eq!(report.results.len(), check_names(Some("symlink")).len());
    assert_eq!(
        report.summary(),
        format!("posix: {} passed, 0 failed", report.passed())
    );
}

#[test]
fn posix_failures_are_reported_not_panicking() {
    // A "directory" below a regular file: the check fails cleanly with the errno in the message.
    let dir = tempdir("mako-posix-bad-");
    std::fs::write(dir.path().join("file"), b"").unwrap();
    let report = run_posix_suite(dir.path().join("file/sub"), Some("getattr_file"));
    assert_eq!(report.failed(), 1);
    match report.get("getattr_file") {
        Some(Outcome::Fail(m)) => assert!(m.contains("ENOTDIR"), "message: {m}"),
        other => panic!("unexpected outcome {other:?}"),
    }
}

#[test]
fn posix_creates_missing_dir() {
    let dir = tempdir("mako-posix-new-");
    let report = run_posix_suite(dir.path().join("posix"), Some("link"));
    assert!(report.all_passed() && report.passed() > 0, "{report}");
}

fn fsx_local(seed: u64) {
    let dir = tempdir("mako-fsx-");
    let mut o = FsxOptions::new(dir.path(), seed, 20_000);
    let stats = run_fsx(&mut o).unwrap_or_else(|f| panic!("{f}"));
    println!("{stats}");
    assert_eq!(stats.ops, 20_000);
    assert!(stats.verifies >= 20);
    assert!(
        leftover_entries(dir.path()).is_empty(),
        "fsx must remove its files on success"
    );
}

#[test]
fn fsx_seed_1_20k_ops() {
    fsx_local(1);
}

#[test]
fn fsx_seed_2_20k_ops() {
    fsx_local(2);
}

#[test]
fn fsx_detects_injected_corruption() {
    for seed in [11, 12, 13] {
        let dir = tempdir("mako-fsx-bug-");
        let mut o = FsxOptions::new(dir.path(), seed, 5_000);
        o.max_size = 256 << 10;
        o.max_op_len = 64 << 10;
        o.verify_every = 1;
        o.inject_bug = Some(300);
        let f =
            run_fsx(&mut o).expect_err("fsx must detect a byte written behind the model's back");
        let text = f.to_string();
        println!("{text}");
        let injected = f.injected_offset.expect("injection happened");
        assert_eq!(
            f.offset,
            Some(injected),
            "reported offset must be the corrupted byte"
        );
        assert!(f.op >= 300, "detected at op #{}", f.op);
        assert!(
            text.contains(&format!("op #{}", f.op)),
            "report names the op: {text}"
        );
        assert!(
            text.contains(&format!("{injected:#x}")),
            "report names the offset: {text}"
        );
        assert!(
            text.contains(&format!("--seed {seed}")),
            "report has the repro line: {text}"
        );
        assert!(!f.recent_ops.is_empty());
    }
}

#[test]
fn fsx_size_divergence_is_detected() {
    // Shrinking the file behind fsx's back must be caught by the per-op size check or a read.
    let dir = tempdir("mako-fsx-size-");
    let seed = 5;
    let path = dir.path().join(format!("fsx.{seed}.0"));
    let mut o = FsxOptions::new(dir.path(), seed, 2_000);
    o.remount_every = 500;
    o.remount = Some(Box::new(move || {
        let f = std::fs::OpenOptions::new().write(true).open(&path)?;
        let len = f.metadata()?.len();
        f.set_len(len / 2 + 1)?;
        Ok(())
    }));
    let f = run_fsx(&mut o).expect_err("fsx must notice the truncation done by the hook");
    println!("{f}");
    assert_eq!(f.op, 500);
}

#[test]
fn fsx_remount_hook_is_called_and_state_survives() {
    let dir = tempdir("mako-fsx-remount-");
    let calls = Rc::new(Cell::new(0));
    let c2 = calls.clone();
    let mut o = FsxOptions::new(dir.path(), 3, 3_000);
    o.files = 2;
    o.remount_every = 700;
    o.remount = Some(Box::new(move || {
        c2.set(c2.get() + 1);
        Ok(())
    }));
    let stats = run_fsx(&mut o).unwrap_or_else(|f| panic!("{f}"));
    assert_eq!(calls.get(), 4);
    assert_eq!(stats.remounts, 4);
    assert_eq!(stats.final_sizes.len(), 2);
}

#[test]
fn fsx_same_seed_same_run() {
    let a = tempdir("mako-fsx-det-a-");
    let b = tempdir("mako-fsx-det-b-");
    let sa = run_fsx(&mut FsxOptions::new(a.path(), 99, 3_000)).unwrap();
    let sb = run_fsx(&mut FsxOptions::new(b.path(), 99, 3_000)).unwrap();
    assert_eq!(sa.op_counts, sb.op_counts);
    assert_eq!(sa.final_sizes, sb.final_sizes);
}
