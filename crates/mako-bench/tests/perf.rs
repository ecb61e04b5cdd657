//! Integration tests for `mako perf`: counts, file sizes and content, interleaving,
//! time limits, errors. They run on temporary directories of the local disk.

use std::path::Path;

use clap::Parser;
use mako_bench::pattern;
use mako_bench::perf::{PerfArgs, PerfReport};

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    perf: PerfArgs,
}

fn perf(args: &[&str]) -> anyhow::Result<PerfReport> {
    let mut argv = vec!["perf".to_string()];
    argv.extend(args.iter().map(|a| a.to_string()));
    argv.push("--worker-exe".into());
    argv.push(env!("CARGO_BIN_EXE_mako-bench-dev").into());
    let cli = Cli::try_parse_from(mako_bench::normalize_args(argv))?;
    mako_bench::run_perf(&cli.perf)
}

fn assert_pattern(path: &Path, expected_len: u64) {
    let data = std::fs::read(path).unwrap();
    assert_eq!(data.len() as u64, expected_len, "{}", path.display());
    let key = pattern::file_key(&path.file_name().unwrap().to_string_lossy());
    assert_eq!(pattern::verify(&data, 0, key), None, "{}", path.display());
}

#[test]
fn write_seq_counts_bytes_and_ops_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap();
    // gpfsperf spelling: -th, and sizes with suffixes.
    let report = perf(&["create", "seq", "-r", "64k", "-n", "320k", "-th", "3", d]).unwrap();
    let group = &report.groups[0];
    assert_eq!(group.role, "write");
    assert_eq!(group.ops, 15);
    assert_eq!(group.bytes, 983_040);
    assert_eq!(group.latency.count, 15);
    assert_eq!(group.per_thread.len(), 3);
    for thread in &group.per_thread {
        assert_eq!(thread.bytes, 327_680);
        assert_eq!(thread.ops, 5);
        assert!(thread.utilization > 0.0 && thread.utilization <= 1.0);
        assert_pattern(&thread.file, 327_680);
    }
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 3);

    // write overwrites in place; read reads and verifies the same bytes.
    let again = perf(&["write", "seq", "-r", "64k", "-n", "320k", "-th", "3", d]).unwrap();
    assert!(
        again
            .notes
            .iter()
            .any(|n| n.contains("3 existing file(s) overwritten")),
        "{:?}",
        again.notes
    );
    let read = perf(&["read", "rand", "-r", "64k", "-n", "320k", "-th", "3", d]).unwrap();
    assert_eq!(read.groups[0].ops, 15);
    assert_eq!(read.groups[0].bytes, 983_040);
    assert_eq!(read.verify_errors, 0);
}

#[test]
fn shared_file_interleaves_records_across_threads_and_processes() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("shared");
    let f = file.to_str().unwrap();
    // 2 processes × 2 threads × 5 records of 47008 bytes (ior-hard's size).
    let report = perf(&[
        "create", "seq", "-r", "47008", "-n", "235040", "-th", "2", "--procs", "2", "--shared", f,
    ])
    .unwrap();
    let group = &report.groups[0];
    assert_eq!(group.ops, 20);
    assert_eq!(group.bytes, 20 * 47008);
    assert_eq!(report.files, vec![file.clone()]);
    // Every record is present and at the right offset (the pattern encodes offsets).
    assert_pattern(&file, 20 * 47008);
    let read = perf(&[
        "read", "seq", "-r", "47008", "-n", "235040", "-th", "2", "--procs", "2", "--shared", f,
    ])
    .unwrap();
    assert_eq!(read.groups[0].bytes, 20 * 47008);
    assert_eq!(read.verify_errors, 0);
}

#[test]
fn strided_leaves_holes_between_records() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("strided");
    let f = file.to_str().unwrap();
    let report = perf(&[
        "create", "strided", "-r", "4k", "-n", "16k", "--stride", "12k", f,
    ])
    .unwrap();
    assert_eq!(report.groups[0].ops, 4);
    let data = std::fs::read(&file).unwrap();
    assert_eq!(data.len(), 3 * 12288 + 4096);
    let key = pattern::file_key("strided");
    for record in 0..4u64 {
        let offset = record * 12288;
        let slice = &data[offset as usize..offset as usize + 4096];
        assert_eq!(pattern::verify(slice, offset, key), None);
    }
    assert!(
        data[4096..12288].iter().all(|&b| b == 0),
        "the gap must stay a hole"
    );
}

#[test]
fn millis_stops_near_the_limit() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("timed");
    let report = perf(&[
        "create",
        "seq",
        "-r",
        "4k",
        "-n",
        "64k",
        "--millis",
        "300",
        f.to_str().unwrap(),
    ])
    .unwrap();
    let group = &report.groups[0];
    // It cycled through the 16-record segment, so it did more than one pass...
    assert!(group.ops > 16, "only {} ops in 300 ms", group.ops);
    assert_eq!(group.bytes, group.ops * 4096);
    // ...and stopped near the limit (generous upper bound: never assert a speed).
    assert!(
        group.elapsed_s >= 0.3 && group.elapsed_s < 10.0,
        "{}",
        group.elapsed_s
    );
    assert_eq!(std::fs::metadata(&f).unwrap().len(), 64 * 1024);
}

#[test]
fn rw_reports_both_rates_and_their_ratio() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("mix");
    let report = perf(&[
        "rw",
        "seq",
        "-r",
        "64k",
        "-n",
        "1m",
        "-th",
        "2",
        f.to_str().unwrap(),
    ])
    .unwrap();
    assert_eq!(report.groups.len(), 2);
    assert_eq!(report.groups[0].role, "write");
    assert_eq!(report.groups[1].role, "read");
    assert_eq!(report.groups[0].bytes, 1 << 20);
    assert_eq!(report.groups[1].bytes, 1 << 20);
    let ratio = report.write_read_ratio.unwrap();
    let expected = report.groups[0].mb_per_s / report.groups[1].mb_per_s;
    assert!((ratio - expected).abs() < 1e-9);
}

#[test]
fn user_errors_are_clear() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("absent");
    let f = f.to_str().unwrap();
    let absent = perf(&["read", "seq", "-r", "4k", "-n", "8k", f])
        .unwrap_err()
        .to_string();
    assert!(
        absent.contains("cannot open") && absent.contains("create it first"),
        "{absent}"
    );
    perf(&["create", "seq", "-r", "4k", "-n", "8k", f]).unwrap();
    let short = perf(&["read", "seq", "-r", "4k", "-n", "16k", f])
        .unwrap_err()
        .to_string();
    assert!(
        short.contains("8192 bytes") && short.contains("16384"),
        "{short}"
    );
    let dio = perf(&["create", "seq", "-r", "47008", "-n", "1m", "-dio", f])
        .unwrap_err()
        .to_string();
    assert!(
        dio.contains("multiple of 4096") && dio.contains("47008"),
        "{dio}"
    );
    let tiny = perf(&["create", "seq", "-r", "1m", "-n", "4k", f])
        .unwrap_err()
        .to_string();
    assert!(tiny.contains("smaller than one record"), "{tiny}");
    assert!(perf(&["create", "seq", "-r", "4x", f]).is_err());
}

#[test]
fn corrupted_data_fails_verification_loudly() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("victim");
    let path = f.to_str().unwrap();
    perf(&["create", "seq", "-r", "4k", "-n", "16k", path]).unwrap();
    let mut data = std::fs::read(&f).unwrap();
    data[5000] ^= 0xff;
    std::fs::write(&f, &data).unwrap();
    let error = perf(&["read", "seq", "-r", "4k", "-n", "16k", path])
        .unwrap_err()
        .to_string();
    assert!(error.contains("verification failed: 1 record"), "{error}");
    assert!(error.contains("byte 5000"), "{error}");
    // --no-verify reads the same file without complaint.
    perf(&["read", "seq", "-r", "4k", "-n", "16k", "--no-verify", path]).unwrap();
}

#[test]
fn json_report_is_the_same_structure() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("j");
    let report = perf(&[
        "create",
        "seq",
        "-r",
        "4k",
        "-n",
        "8k",
        "--json",
        f.to_str().unwrap(),
    ])
    .unwrap();
    let text = serde_json::to_string(&report).unwrap();
    let back: PerfReport = serde_json::from_str(&text).unwrap();
    assert_eq!(back.groups[0].bytes, 8192);
}
