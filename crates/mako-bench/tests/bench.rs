//! Integration tests for `mako bench`: every phase runs with 2 worker processes, the
//! JSON parses, stonewalled reads read exactly what was written, comparisons give
//! ratios, and nothing is left behind, even after an error.

use std::path::Path;

use clap::Parser;
use mako_bench::bench::{BenchArgs, BenchReport, PhaseKind};
use mako_bench::BenchHooks;

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    bench: BenchArgs,
}

fn args(extra: &[&str]) -> BenchArgs {
    let mut argv = vec!["bench".to_string()];
    argv.extend(extra.iter().map(|a| a.to_string()));
    argv.push("--worker-exe".into());
    argv.push(env!("CARGO_BIN_EXE_mako-bench-dev").into());
    Cli::try_parse_from(argv).unwrap().bench
}

fn is_empty(dir: &Path) -> bool {
    std::fs::read_dir(dir).unwrap().next().is_none()
}

const PHASES: [&str; 13] = [
    "ior-easy-write",
    "mdtest-easy-write",
    "ior-hard-write",
    "mdtest-hard-write",
    "find",
    "ior-easy-read",
    "mdtest-easy-stat",
    "ior-hard-read",
    "ior-rnd4K-read",
    "mdtest-hard-stat",
    "mdtest-easy-delete",
    "mdtest-hard-read",
    "mdtest-hard-delete",
];

#[test]
fn small_run_end_to_end_with_two_processes() {
    let dir = tempfile::tempdir().unwrap();
    let out = tempfile::tempdir().unwrap();
    let json = out.path().join("bench.json");
    let svg = out.path().join("bench.svg");
    let report = mako_bench::run_bench(
        &args(&[
            dir.path().to_str().unwrap(),
            "--size",
            "small",
            "-N",
            "2",
            "--no-drop-caches",
            "--json",
            json.to_str().unwrap(),
            "--svg",
            svg.to_str().unwrap(),
        ]),
        &BenchHooks::default(),
    )
    .unwrap();
    let names: Vec<&str> = report
        .target
        .phases
        .iter()
        .map(|p| p.name.as_str())
        .collect();
    assert_eq!(names, PHASES);
    for phase in &report.target.phases {
        assert!(phase.value > 0.0, "{} is 0", phase.name);
        assert!(phase.ops > 0, "{} did nothing", phase.name);
        assert_eq!(phase.verify_errors, 0);
    }
    let phase = |name: &str| {
        report
            .target
            .phases
            .iter()
            .find(|p| p.name == name)
            .unwrap()
    };
    // Sizes of the small preset: 8 MiB per process, 64 × 47008 per process, …
    assert_eq!(phase("ior-easy-write").bytes, 2 * (8 << 20));
    assert_eq!(phase("ior-easy-read").bytes, 2 * (8 << 20));
    assert_eq!(phase("ior-hard-write").bytes, 2 * 64 * 47008);
    assert_eq!(phase("ior-hard-read").bytes, 2 * 64 * 47008);
    assert_eq!(phase("ior-rnd4K-read").ops, 2 * 256);
    assert_eq!(phase("mdtest-easy-write").ops, 400);
    assert_eq!(phase("mdtest-hard-read").ops, 200);
    assert_eq!(phase("mdtest-hard-read").bytes, 200 * 3901);
    // find sees 2 ior-easy files + 1 shared file + 200 md-hard files + 400 md-easy files.
    assert_eq!(phase("find").ops, 2 + 1 + 200 + 400);
    assert_eq!(phase("ior-easy-write").kind, PhaseKind::Bandwidth);
    assert!(report.target.score.total > 0.0);

    let parsed: BenchReport =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(parsed.target.phases.len(), PHASES.len());
    let picture = std::fs::read_to_string(&svg).unwrap();
    assert!(picture.starts_with("<svg") && picture.contains("ior-hard-write"));
    assert!(is_empty(dir.path()), "bench left files behind");
}

#[test]
fn stonewall_reads_exactly_what_was_written() {
    let dir = tempfile::tempdir().unwrap();
    let report = mako_bench::run_bench(
        &args(&[
            dir.path().to_str().unwrap(),
            "--size",
            "small",
            "--easy-bytes",
            "256m",
            "--hard-records",
            "100000",
            "--md-easy-files",
            "200000",
            "--md-hard-files",
            "100000",
            "--stonewall-secs",
            "0.02",
            "--no-drop-caches",
        ]),
        &BenchHooks::default(),
    )
    .unwrap();
    let phase = |name: &str| {
        report
            .target
            .phases
            .iter()
            .find(|p| p.name == name)
            .unwrap()
    };
    for (write, read) in [
        ("ior-easy-write", "ior-easy-read"),
        ("ior-hard-write", "ior-hard-read"),
    ] {
        assert!(phase(write).stonewalled, "{write} was not stonewalled");
        assert_eq!(
            phase(write).bytes,
            phase(read).bytes,
            "{read} read a different amount"
        );
        assert_eq!(phase(read).verify_errors, 0);
    }
    assert!(phase("ior-easy-write").bytes < 2 * (256 << 20));
    for (write, later) in [
        ("mdtest-easy-write", "mdtest-easy-stat"),
        ("mdtest-easy-write", "mdtest-easy-delete"),
        ("mdtest-hard-write", "mdtest-hard-stat"),
        ("mdtest-hard-write", "mdtest-hard-read"),
        ("mdtest-hard-write", "mdtest-hard-delete"),
    ] {
        assert!(phase(write).stonewalled);
        assert_eq!(phase(write).ops, phase(later).ops, "{later} vs {write}");
    }
    assert!(is_empty(dir.path()));
}

#[test]
fn compare_gives_a_ratio_per_phase() {
    let target = tempfile::tempdir().unwrap();
    let reference = tempfile::tempdir().unwrap();
    let report = mako_bench::run_bench(
        &args(&[
            target.path().to_str().unwrap(),
            "--size",
            "small",
            "--md-easy-files",
            "50",
            "--md-hard-files",
            "50",
            "--no-drop-caches",
            "--compare",
            reference.path().to_str().unwrap(),
        ]),
        &BenchHooks::default(),
    )
    .unwrap();
    let reference_run = report.reference.as_ref().unwrap();
    assert_eq!(reference_run.phases.len(), PHASES.len());
    assert_eq!(report.ratios.len(), PHASES.len() + 3);
    for ratio in &report.ratios {
        let value = ratio.ratio.unwrap();
        assert!((value - ratio.target / ratio.reference).abs() < 1e-9 * value.max(1.0));
    }
    let table = mako_bench::bench::format_compare_table(&report);
    assert!(table.contains("ior-hard-read") && table.contains("ratio"));
    assert!(is_empty(target.path()) && is_empty(reference.path()));
}

#[test]
fn cleanup_happens_even_when_a_phase_fails() {
    let dir = tempfile::tempdir().unwrap();
    let hooks = BenchHooks {
        drop_caches: Some(Box::new(|path: &Path| {
            anyhow::bail!("pagepool flush failed for {}", path.display())
        })),
    };
    // The hook runs before the first read phase; the write phases have left files by then.
    // Sizes are tiny so the real cache drop (when root) has little to sync.
    let error = mako_bench::run_bench(
        &args(&[
            dir.path().to_str().unwrap(),
            "--size",
            "small",
            "--easy-bytes",
            "1m",
            "--md-easy-files",
            "5",
            "--md-hard-files",
            "5",
        ]),
        &hooks,
    )
    .unwrap_err();
    assert!(
        format!("{error:#}").contains("pagepool flush failed"),
        "{error:#}"
    );
    assert!(is_empty(dir.path()), "files left behind after an error");
}

#[test]
fn dev_binary_runs_bench_and_exits_zero() {
    let dir = tempfile::tempdir().unwrap();
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_mako-bench-dev"))
        .args([
            "bench",
            dir.path().to_str().unwrap(),
            "--size",
            "small",
            "-N",
            "2",
            "--no-drop-caches",
        ])
        .args(["--md-easy-files", "20", "--md-hard-files", "20"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        stdout.contains("[RESULT] ior-easy-write") && stdout.contains("[SCORE ]"),
        "{stdout}"
    );
    assert!(is_empty(dir.path()));
}

#[test]
fn also_mounts_share_every_io500_phase_and_each_is_reported_and_dropped() {
    // A symbolic link to the directory stands in for another node's mount of the same
    // file system: it shows the same scratch directory under another path.
    let dir = tempfile::tempdir().unwrap();
    let links = tempfile::tempdir().unwrap();
    let other = links.path().join("node1");
    std::os::unix::fs::symlink(dir.path(), &other).unwrap();
    let dropped: std::sync::Arc<std::sync::Mutex<Vec<std::path::PathBuf>>> = Default::default();
    let seen = dropped.clone();
    let hooks = BenchHooks {
        drop_caches: Some(Box::new(move |path: &Path| {
            seen.lock().unwrap().push(path.to_path_buf());
            Ok(())
        })),
    };
    // Tiny sizes: the real kernel cache drop (when root) has little to sync.
    let report = mako_bench::run_bench(
        &args(&[
            dir.path().to_str().unwrap(),
            "--also",
            other.to_str().unwrap(),
            "--size",
            "small",
            "-N",
            "3",
            "--easy-bytes",
            "2m",
            "--md-easy-files",
            "30",
            "--md-hard-files",
            "30",
        ]),
        &hooks,
    )
    .unwrap();
    let names: Vec<&str> = report
        .target
        .phases
        .iter()
        .map(|p| p.name.as_str())
        .collect();
    assert_eq!(names, PHASES);
    for phase in &report.target.phases {
        // Processes 0 and 2 work through DIR, process 1 through the other mount.
        let mounts: Vec<(&Path, u32)> = phase
            .per_mount
            .iter()
            .map(|m| (m.mount.as_path(), m.procs))
            .collect();
        assert_eq!(
            mounts,
            [(dir.path(), 2), (other.as_path(), 1)],
            "{}",
            phase.name
        );
        let ops: u64 = phase.per_mount.iter().map(|m| m.ops).sum();
        let bytes: u64 = phase.per_mount.iter().map(|m| m.bytes).sum();
        assert_eq!((ops, bytes), (phase.ops, phase.bytes), "{}", phase.name);
        assert!(
            phase.per_mount.iter().all(|m| m.ops > 0 && m.value > 0.0),
            "{}: a mount did nothing: {:?}",
            phase.name,
            phase.per_mount
        );
        // Reads through one mount of what was written through the other verify.
        assert_eq!(phase.verify_errors, 0, "{}", phase.name);
    }
    // Every phase after a cache drop dropped the pagepool of both mounts' nodes.
    let drops = report
        .target
        .phases
        .iter()
        .filter(|p| p.cache.is_some())
        .count();
    let dropped = dropped.lock().unwrap().clone();
    assert_eq!(drops, 8);
    assert_eq!(
        dropped.iter().filter(|p| p.as_path() == dir.path()).count(),
        drops
    );
    assert_eq!(dropped.iter().filter(|p| **p == other).count(), drops);
    assert!(is_empty(dir.path()), "bench left files behind");
}
