//! The diagnostics tools on a real cluster, each checked against a workload whose
//! effect is known, not only for the shape of its output:
//!
//! - `iohist_lists_exactly_the_data_ios`: a 3-block file written then `mako sync`ed
//!   issues exactly 3 data writes (one block each, the file's inode, distinct runs);
//!   after `mako sync --drop-caches`, reading it issues data reads of exactly those runs.
//! - `config_out_of_range_is_refused_with_its_range`: the value is refused, the
//!   message names the allowed range, and the daemon keeps the old value.
//! - `immediate_config_changes_reach_the_running_daemon`: `iohistSize=4 -i` → iohist
//!   returns 4 entries; `prefetchAggressivenessRead=0 -i` → a sequential read issues no
//!   prefetch (and the same read with prefetch on does issue some, so the check bites).
//! - `waiters_show_a_slow_data_write`: with data I/O slowed by the test hook
//!   `MAKO_TEST_DATA_IO_DELAY_MS`, a writer blocked in the disk write shows up in
//!   `mako diag waiters` with the disk:sector, size and inode that iohist then lists.
//! - `counters_count_a_known_number_of_renames`: 25 renames add exactly 25
//!   acquisitions to the `rename` lock and creates add to `inodeMap.segment`.
//! - `prometheus_endpoint_matches_diag_stats`: a port in use is logged with the fix
//!   and is not fatal; on a free port `/metrics` is well-formed text exposition whose
//!   values match `mako diag stats --json` and `mako diag counters --json`.
//!
//! JSON is read by a minimal parser below (this crate has no JSON dependency).

use mako_tests::cluster::{require_fuse, run_cmd, ClusterOptions, TestCluster};
use mako_tests::pattern;
use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Write};
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

const BLOCK: u64 = 256 << 10;
const SECTOR: u64 = 512;

// ---------------------------------------------------------------- JSON (minimal)

#[derive(Debug, Clone, PartialEq)]
enum Json {
    Null,
    Bool(bool),
    Num(f64),
    Str(String),
    Arr(Vec<Json>),
    Obj(BTreeMap<String, Json>),
}

impl Json {
    fn parse(text: &str) -> Json {
        let b = text.as_bytes();
        let mut i = 0;
        let v = parse_value(b, &mut i);
        skip_ws(b, &mut i);
        assert_eq!(i, b.len(), "trailing text after JSON: {text}");
        v
    }
    fn get(&self, key: &str) -> &Json {
        match self {
            Json::Obj(m) => m
                .get(key)
                .unwrap_or_else(|| panic!("no key {key} in {self:?}")),
            _ => panic!("not an object: {self:?}"),
        }
    }
    fn arr(&self) -> &[Json] {
        match self {
            Json::Arr(v) => v,
            _ => panic!("not an array: {self:?}"),
        }
    }
    fn num(&self) -> f64 {
        match self {
            Json::Num(n) => *n,
            _ => panic!("not a number: {self:?}"),
        }
    }
    fn u64(&self) -> u64 {
        self.num() as u64
    }
    fn str(&self) -> &str {
        match self {
            Json::Str(s) => s,
            _ => panic!("not a string: {self:?}"),
        }
    }
    fn bool(&self) -> bool {
        match self {
            Json::Bool(b) => *b,
            _ => panic!("not a bool: {self:?}"),
        }
    }
}

fn skip_ws(b: &[u8], i: &mut usize) {
    while *i < b.len() && b[*i].is_ascii_whitespace() {
        *i += 1;
    }
}

fn parse_value(b: &[u8], i: &mut usize) -> Json {
    skip_ws(b, i);
    match b[*i] {
        b'{' => {
            *i += 1;
            let mut m = BTreeMap::new();
            skip_ws(b, i);
            if b[*i] == b'}' {
                *i += 1;
                return Json::Obj(m);
            }
            loop {
                skip_ws(b, i);
                let Json::Str(k) = parse_value(b, i) else {
                    panic!("object key is not a string")
                };
                skip_ws(b, i);
                assert_eq!(b[*i], b':');
                *i += 1;
                let v = parse_value(b, i);
                m.insert(k, v);
                skip_ws(b, i);
                *i += 1;
                if b[*i - 1] == b'}' {
                    return Json::Obj(m);
                }
            }
        }
        b'[' => {
            *i += 1;
            let mut v = Vec::new();
            skip_ws(b, i);
            if b[*i] == b']' {
                *i += 1;
                return Json::Arr(v);
            }
            loop {
                v.push(parse_value(b, i));
                skip_ws(b, i);
                *i += 1;
                if b[*i - 1] == b']' {
                    return Json::Arr(v);
                }
            }
        }
        b'"' => {
            *i += 1;
            let mut s = Vec::new();
            while b[*i] != b'"' {
                if b[*i] == b'\\' {
                    *i += 1;
                    match b[*i] {
                        b'n' => s.push(b'\n'),
                        b't' => s.push(b'\t'),
                        b'u' => {
                            let hex = std::str::from_utf8(&b[*i + 1..*i + 5]).unwrap();
                            let c = char::from_u32(u32::from_str_radix(hex, 16).unwrap())
                                .unwrap_or('?');
                            s.extend_from_slice(c.to_string().as_bytes());
                            *i += 4;
                        }
                        c => s.push(c),
                    }
                } else {
                    s.push(b[*i]);
                }
                *i += 1;
            }
            *i += 1;
            Json::Str(String::from_utf8_lossy(&s).into_owned())
        }
        b't' => {
            *i += 4;
            Json::Bool(true)
        }
        b'f' => {
            *i += 5;
            Json::Bool(false)
        }
        b'n' => {
            *i += 4;
            Json::Null
        }
        _ => {
            let start = *i;
            while *i < b.len() && matches!(b[*i], b'-' | b'+' | b'.' | b'e' | b'E' | b'0'..=b'9') {
                *i += 1;
            }
            Json::Num(std::str::from_utf8(&b[start..*i]).unwrap().parse().unwrap())
        }
    }
}

// ---------------------------------------------------------------- helpers

fn small_cluster() -> TestCluster {
    TestCluster::up(ClusterOptions {
        disks: 4,
        disk_size: "2G".into(),
        pagepool: "256M".into(),
        block_size: Some("256K".into()),
    })
    .unwrap_or_else(|e| panic!("{e:#}"))
}

fn mako_ok(c: &TestCluster, args: &[&str]) -> String {
    let out = c
        .mako(args)
        .unwrap_or_else(|e| panic!("mako {args:?}: {e:#}"));
    assert!(
        out.success(),
        "mako {args:?} failed: {out}\nmakod.log:\n{}",
        c.log_tail(30)
    );
    out.stdout
}

fn mako_json(c: &TestCluster, args: &[&str]) -> Json {
    let mut full = args.to_vec();
    full.push("--json");
    Json::parse(&mako_ok(c, &full))
}

fn now_micros() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_micros() as u64
}

/// `mako diag stats --json` counters of fs1 by name.
fn fs_counters(c: &TestCluster) -> BTreeMap<String, u64> {
    let stats = mako_json(c, &["diag", "stats"]);
    let fs = &stats.get("filesystems").arr()[0];
    assert_eq!(fs.get("name").str(), "fs1");
    fs.get("counters")
        .arr()
        .iter()
        .map(|p| (p.arr()[0].str().to_string(), p.arr()[1].u64()))
        .collect()
}

/// `mako diag counters --json` by lock name: (acquisitions, contended).
fn lock_counters(c: &TestCluster) -> BTreeMap<String, (u64, u64)> {
    mako_json(c, &["diag", "counters"])
        .arr()
        .iter()
        .map(|l| {
            (
                l.get("name").str().to_string(),
                (l.get("acquisitions").u64(), l.get("contended").u64()),
            )
        })
        .collect()
}

/// One iohist record: (write, buffer type, disk, sector, sectors, ino, start µs, service ms).
#[derive(Debug, Clone)]
struct Io {
    write: bool,
    buffer_type: String,
    disk: u64,
    sector: u64,
    sectors: u64,
    ino: u64,
    start: u64,
    service_ms: f64,
}

fn iohist(c: &TestCluster, last: usize) -> Vec<Io> {
    let n = last.to_string();
    mako_json(c, &["diag", "iohist", "-n", &n])
        .arr()
        .iter()
        .map(|r| Io {
            write: r.get("write").bool(),
            buffer_type: r.get("buffer_type").str().to_string(),
            disk: r.get("disk").u64(),
            sector: r.get("sector").u64(),
            sectors: r.get("sectors").u64(),
            ino: match r.get("ino") {
                Json::Null => 0,
                v => v.u64(),
            },
            start: r.get("start_unix_micros").u64(),
            service_ms: r.get("service_ms").num(),
        })
        .collect()
}

// ---------------------------------------------------------------- iohist

#[test]
fn iohist_lists_exactly_the_data_ios() {
    if !require_fuse("iohist_lists_exactly_the_data_ios") {
        return;
    }
    let c = small_cluster();
    let file = c.mount().join("three-blocks");
    mako_ok(&c, &["sync"]);
    let t0 = now_micros();
    std::fs::write(&file, pattern(3, 3 * BLOCK as usize)).unwrap();
    let ino = std::fs::metadata(&file).unwrap().ino();
    mako_ok(&c, &["sync"]);

    let after: Vec<Io> = iohist(&c, 512)
        .into_iter()
        .filter(|r| r.start >= t0)
        .collect();
    let data: Vec<&Io> = after.iter().filter(|r| r.buffer_type == "data").collect();
    assert_eq!(
        data.len(),
        3,
        "3 blocks written: expected exactly 3 data I/Os, got {data:#?}"
    );
    for r in &data {
        assert!(r.write, "{r:?}");
        assert_eq!(r.sectors, BLOCK / SECTOR, "one whole block per I/O: {r:?}");
        assert_eq!(r.ino, ino, "the file's inode: {r:?}");
    }
    let runs: BTreeSet<(u64, u64, u64)> =
        data.iter().map(|r| (r.disk, r.sector, r.sectors)).collect();
    assert_eq!(runs.len(), 3, "three distinct disk:sector runs: {runs:?}");
    for a in &runs {
        for b in &runs {
            if a != b && a.0 == b.0 {
                assert!(
                    a.1 + a.2 <= b.1 || b.1 + b.2 <= a.1,
                    "overlapping runs {a:?} {b:?}"
                );
            }
        }
    }

    // Read it back from disk: exactly the same runs, each read once.
    mako_ok(&c, &["sync", "--drop-caches"]);
    let t1 = now_micros();
    assert_eq!(
        std::fs::read(&file).unwrap(),
        pattern(3, 3 * BLOCK as usize)
    );
    let reads: Vec<Io> = iohist(&c, 512)
        .into_iter()
        .filter(|r| r.start >= t1 && r.buffer_type == "data")
        .collect();
    assert!(reads.iter().all(|r| !r.write), "{reads:#?}");
    let read_runs: Vec<(u64, u64, u64)> = reads
        .iter()
        .map(|r| (r.disk, r.sector, r.sectors))
        .collect();
    assert_eq!(read_runs.len(), 3, "each block read once: {reads:#?}");
    assert_eq!(
        read_runs.into_iter().collect::<BTreeSet<_>>(),
        runs,
        "reads hit the written runs"
    );
}

// ---------------------------------------------------------------- config

#[test]
fn config_out_of_range_is_refused_with_its_range() {
    if !require_fuse("config_out_of_range_is_refused_with_its_range") {
        return;
    }
    let c = small_cluster();
    for (assignment, range) in [
        ("iohistSize=-1", "0..1048576"),
        ("prefetchAggressivenessRead=7", "-1..3"),
    ] {
        let out = c.mako(&["config", "set", assignment, "-i"]).unwrap();
        assert!(!out.success(), "{assignment} accepted: {out}");
        assert!(
            out.stderr.contains(range),
            "{assignment}: message does not name the range {range}: {out}"
        );
        let name = assignment.split('=').next().unwrap();
        assert!(out.stderr.contains(name), "{out}");
    }
    let config = mako_json(&c, &["diag", "config"]);
    let value = |n: &str| {
        config
            .arr()
            .iter()
            .find(|r| r.get("name").str() == n)
            .unwrap()
            .get("value")
            .str()
            .to_string()
    };
    assert_eq!(
        value("iohistSize"),
        "512",
        "the refused value must not reach the daemon"
    );
    assert_eq!(value("prefetchAggressivenessRead"), "-1");
}

#[test]
fn immediate_config_changes_reach_the_running_daemon() {
    if !require_fuse("immediate_config_changes_reach_the_running_daemon") {
        return;
    }
    let c = small_cluster();

    // iohistSize=4 -i: the ring shrinks now.
    for i in 0..6 {
        std::fs::write(c.mount().join(format!("h{i}")), pattern(i, BLOCK as usize)).unwrap();
    }
    mako_ok(&c, &["sync"]);
    assert!(iohist(&c, 100).len() > 4, "some history before the change");
    mako_ok(&c, &["config", "set", "iohistSize=4", "-i"]);
    assert_eq!(iohist(&c, 100).len(), 4);
    for i in 0..6 {
        std::fs::write(c.mount().join(format!("g{i}")), pattern(i, BLOCK as usize)).unwrap();
    }
    mako_ok(&c, &["sync"]);
    assert_eq!(iohist(&c, 100).len(), 4, "iohistSize=4 keeps 4 entries");

    // prefetchAggressivenessRead: on (the default) a sequential read prefetches ...
    let file = c.mount().join("sequential");
    std::fs::write(&file, pattern(9, 32 * BLOCK as usize)).unwrap();
    let read_through = || {
        mako_ok(&c, &["sync", "--drop-caches"]);
        let before = fs_counters(&c)["prefetch_issued"];
        let mut f = std::fs::File::open(&file).unwrap();
        let mut buf = vec![0u8; BLOCK as usize];
        while f.read(&mut buf).unwrap() > 0 {}
        fs_counters(&c)["prefetch_issued"] - before
    };
    let with_prefetch = read_through();
    assert!(
        with_prefetch > 0,
        "the default setting prefetches on a sequential read"
    );
    // ... and 0 -i turns it off in the running daemon.
    mako_ok(&c, &["config", "set", "prefetchAggressivenessRead=0", "-i"]);
    assert_eq!(
        read_through(),
        0,
        "prefetchAggressivenessRead=0 -i: no prefetch"
    );
}

// ---------------------------------------------------------------- waiters

#[test]
fn waiters_show_a_slow_data_write() {
    if !require_fuse("waiters_show_a_slow_data_write") {
        return;
    }
    const DELAY_MS: u64 = 1500;
    let c = small_cluster();
    // Restart makod with slow data I/O (the test hook; metadata I/O stays fast).
    c.down().unwrap();
    let data = c.data_dir().to_str().unwrap().to_string();
    let out = std::process::Command::new(c.mako_binary())
        .args(["--data-dir", &data, "up"])
        .env("MAKO_TEST_DATA_IO_DELAY_MS", DELAY_MS.to_string())
        .env_remove("MAKO_DATA_DIR")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "mako up: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let t = Instant::now();
    while !mako_tests::cluster::is_mounted(c.mount()) {
        assert!(t.elapsed() < Duration::from_secs(15), "not mounted");
        std::thread::sleep(Duration::from_millis(50));
    }

    let file = c.mount().join("slow");
    std::fs::write(&file, b"").unwrap();
    let ino = std::fs::metadata(&file).unwrap().ino();
    let writer_file = file.clone();
    let started = Instant::now();
    let writer = std::thread::spawn(move || {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .open(&writer_file)
            .unwrap();
        f.write_all(&pattern(5, BLOCK as usize)).unwrap();
        f.sync_all().unwrap();
    });

    // Poll until the blocked writer shows, waiting at least 300 ms.
    let deadline = Instant::now() + Duration::from_secs(20);
    let waiter = loop {
        let listed = mako_json(&c, &["diag", "waiters", "--threshold-ms", "300"]);
        let elapsed_ms = started.elapsed().as_secs_f64() * 1000.0;
        if let Some(w) = listed
            .arr()
            .iter()
            .find(|w| w.get("what").str().starts_with("disk I/O write data "))
        {
            let waiting = w.get("waiting_ms").num();
            assert!(
                waiting >= 300.0,
                "threshold 300 ms but listed at {waiting} ms"
            );
            assert!(
                waiting <= elapsed_ms + 50.0,
                "waiting {waiting} ms, but the write started {elapsed_ms} ms ago"
            );
            break w.clone();
        }
        for w in listed.arr() {
            assert!(
                w.get("waiting_ms").num() >= 300.0,
                "below the threshold: {w:?}"
            );
        }
        assert!(
            Instant::now() < deadline,
            "no slow data write ever showed in mako diag waiters"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    let what = waiter.get("what").str().to_string();
    assert!(
        what.ends_with(&format!("{} sectors inode {ino}", BLOCK / SECTOR)),
        "{what}"
    );
    // A threshold above the wait hides it; the text form shows it the mmdiag way.
    let text = mako_ok(&c, &["diag", "waiters"]);
    assert!(
        text.contains("sec, thread ") && text.contains("disk I/O write data"),
        "{text}"
    );
    let none = mako_json(&c, &["diag", "waiters", "--threshold-ms", "600000"]);
    assert!(none.arr().is_empty(), "{none:?}");
    writer.join().unwrap();

    // The waiter named the I/O that iohist then lists, and it took the delay.
    let run = what
        .trim_start_matches("disk I/O write data ")
        .split(' ')
        .next()
        .unwrap()
        .to_string();
    let (disk, sector) = run.split_once(':').unwrap();
    let (disk, sector): (u64, u64) = (disk.parse().unwrap(), sector.parse().unwrap());
    let hist = iohist(&c, 512);
    let io = hist
        .iter()
        .find(|r| r.write && r.buffer_type == "data" && r.disk == disk && r.sector == sector)
        .unwrap_or_else(|| panic!("{run} not in iohist: {hist:#?}"));
    assert_eq!(io.ino, ino);
    assert!(io.service_ms >= DELAY_MS as f64, "{io:?}");
    // Once done, no thread waits on that I/O any more.
    let now = mako_json(&c, &["diag", "waiters"]);
    assert!(
        now.arr()
            .iter()
            .all(|w| !w.get("what").str().contains(&run)),
        "{now:?}"
    );
}

// ---------------------------------------------------------------- counters

#[test]
fn counters_count_a_known_number_of_renames() {
    if !require_fuse("counters_count_a_known_number_of_renames") {
        return;
    }
    let c = small_cluster();
    let dir = c.mount().join("r");
    std::fs::create_dir(&dir).unwrap();
    std::fs::write(dir.join("n0"), b"x").unwrap();
    let before = lock_counters(&c);
    const RENAMES: u64 = 25;
    for i in 0..RENAMES {
        std::fs::rename(dir.join(format!("n{i}")), dir.join(format!("n{}", i + 1))).unwrap();
    }
    let after = lock_counters(&c);
    assert_eq!(
        after["rename"].0 - before["rename"].0,
        RENAMES,
        "one rename-lock acquisition per rename"
    );
    assert!(
        after["inode"].0 > before["inode"].0 + RENAMES,
        "renames lock inodes"
    );

    const CREATES: u64 = 40;
    for i in 0..CREATES {
        std::fs::write(dir.join(format!("c{i}")), b"").unwrap();
    }
    let later = lock_counters(&c);
    assert!(
        later["inodeMap.segment"].0 >= after["inodeMap.segment"].0 + CREATES,
        "each create allocates an inode under an inode-map segment lock: {:?} → {:?}",
        after["inodeMap.segment"],
        later["inodeMap.segment"]
    );
    for (name, (acq, contended)) in &later {
        assert!(
            contended <= acq,
            "{name}: contended {contended} > acquisitions {acq}"
        );
    }
}

// ---------------------------------------------------------------- Prometheus

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// GET `path`; returns (status code, headers lower-cased, body).
fn http_get(port: u16, path: &str) -> (u16, String, String) {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port))
        .unwrap_or_else(|e| panic!("connect 127.0.0.1:{port}: {e}"));
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: localhost\r\nAccept: text/plain\r\n\r\n"
    )
    .unwrap();
    let mut all = String::new();
    s.read_to_string(&mut all).unwrap();
    let (head, body) = all.split_once("\r\n\r\n").expect("no header end");
    let code = head.split_whitespace().nth(1).unwrap().parse().unwrap();
    let len: usize = head
        .lines()
        .find_map(|l| {
            l.to_ascii_lowercase()
                .strip_prefix("content-length:")
                .map(|v| v.trim().parse().unwrap())
        })
        .expect("Content-Length");
    assert_eq!(body.len(), len, "Content-Length matches the body");
    (code, head.to_ascii_lowercase(), body.to_string())
}

/// Sends `request` as is; returns the status code of the answer.
fn raw_request(port: u16, request: &[u8]) -> u16 {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port))
        .unwrap_or_else(|e| panic!("connect 127.0.0.1:{port}: {e}"));
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    // The server may answer and close before it has read everything.
    let _ = s.write_all(request);
    let mut all = Vec::new();
    let _ = s.read_to_end(&mut all);
    let all = String::from_utf8_lossy(&all);
    all.split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("no status line in {all:?}"))
}

/// Parses and validates an OpenMetrics text exposition: HELP and TYPE once per family
/// before its samples (a counter family's samples are its name with `_total`), a
/// family's samples together, valid names, numeric values, no duplicate series, `# EOF`
/// last. Returns series ("name{labels}") → value.
fn parse_exposition(text: &str) -> BTreeMap<String, f64> {
    let valid_name = |n: &str| {
        !n.is_empty()
            && n.chars().enumerate().all(|(i, ch)| {
                ch.is_ascii_alphabetic() || ch == '_' || ch == ':' || (i > 0 && ch.is_ascii_digit())
            })
    };
    let mut types: BTreeMap<String, String> = BTreeMap::new();
    let mut helps: BTreeSet<String> = BTreeSet::new();
    let mut finished: BTreeSet<String> = BTreeSet::new();
    let mut current = String::new();
    let mut series = BTreeMap::new();
    let text = text
        .strip_suffix("# EOF\n")
        .unwrap_or_else(|| panic!("the exposition must end with # EOF:\n{text}"));
    assert!(text.ends_with('\n'), "exposition ends with a newline");
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let name = rest.split(' ').next().unwrap();
            assert!(valid_name(name), "{line}");
            assert!(helps.insert(name.to_string()), "HELP twice: {line}");
            continue;
        }
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let mut p = rest.split(' ');
            let (name, kind) = (p.next().unwrap(), p.next().unwrap());
            assert!(
                ["counter", "gauge", "untyped", "histogram", "summary"].contains(&kind),
                "{line}"
            );
            assert!(
                types.insert(name.to_string(), kind.to_string()).is_none(),
                "TYPE twice: {line}"
            );
            continue;
        }
        assert!(
            !line.starts_with('#') && !line.is_empty(),
            "unexpected line {line:?}"
        );
        let (key, value) = line
            .rsplit_once(' ')
            .unwrap_or_else(|| panic!("no value: {line}"));
        let name = key.split('{').next().unwrap();
        assert!(valid_name(name), "{line}");
        let family = match name.strip_suffix("_total") {
            Some(family) if types.get(family).is_some_and(|t| t == "counter") => family,
            _ => name,
        };
        assert!(types.contains_key(family), "sample before its TYPE: {line}");
        assert!(helps.contains(family), "sample without HELP: {line}");
        if types[family] == "counter" {
            assert!(
                name.ends_with("_total"),
                "counter samples end in _total: {name}"
            );
        }
        if name != current {
            assert!(!finished.contains(name), "family {name} is split");
            if !current.is_empty() {
                finished.insert(current.clone());
            }
            current = name.to_string();
        }
        if let Some(labels) = key.strip_prefix(name) {
            if !labels.is_empty() {
                assert!(labels.starts_with('{') && labels.ends_with('}'), "{line}");
                for pair in labels[1..labels.len() - 1].split("\",") {
                    let (k, v) = pair
                        .split_once('=')
                        .unwrap_or_else(|| panic!("label {pair} in {line}"));
                    assert!(
                        valid_name(k) && v.starts_with('"'),
                        "label {pair} in {line}"
                    );
                }
            }
        }
        let v: f64 = match value {
            "+Inf" => f64::INFINITY,
            "-Inf" => f64::NEG_INFINITY,
            v => v.parse().unwrap_or_else(|_| panic!("bad value: {line}")),
        };
        assert!(
            series.insert(key.to_string(), v).is_none(),
            "duplicate series {key}"
        );
    }
    series
}

#[test]
fn prometheus_endpoint_matches_diag_stats() {
    if !require_fuse("prometheus_endpoint_matches_diag_stats") {
        return;
    }
    let c = small_cluster();

    // 1. A port in use: makod starts anyway and says how to fix it.
    let squatter = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let busy = squatter.local_addr().unwrap().port().to_string();
    c.down().unwrap();
    mako_ok(&c, &["config", "set", &format!("prometheusPort={busy}")]);
    c.up_again().unwrap();
    let log = c.log_tail(200);
    assert!(
        log.contains(&format!("port {busy} is in use"))
            && log.contains("mako config set prometheusPort="),
        "makod.log does not explain the busy port:\n{log}"
    );
    drop(squatter);

    // 2. A free port.
    let port = free_port();
    c.down().unwrap();
    mako_ok(&c, &["config", "set", &format!("prometheusPort={port}")]);
    c.up_again().unwrap();
    assert!(c
        .log_tail(200)
        .contains(&format!("http://127.0.0.1:{port}/metrics")));

    for i in 0..10u64 {
        std::fs::write(
            c.mount().join(format!("m{i}")),
            pattern(i, (i as usize + 1) * 100_000),
        )
        .unwrap();
    }
    for i in 0..3 {
        std::fs::rename(
            c.mount().join(format!("m{i}")),
            c.mount().join(format!("renamed{i}")),
        )
        .unwrap();
    }
    mako_ok(&c, &["sync"]);

    let (code, head, first) = http_get(port, "/metrics");
    assert_eq!(code, 200);
    assert!(
        head.contains("content-type: application/openmetrics-text; version=1.0.0"),
        "{head}"
    );
    let stats = mako_json(&c, &["diag", "stats"]);
    let locks = lock_counters(&c);
    let (_, _, second) = http_get(port, "/metrics");
    let s1 = parse_exposition(&first);
    let s2 = parse_exposition(&second);

    // Every counter of `mako diag stats` is exported, between the two scrapes (all
    // are monotonic); the ones only user calls move are equal exactly.
    let fs = &stats.get("filesystems").arr()[0];
    let counters = fs.get("counters").arr();
    assert!(counters.len() >= 20);
    for p in counters {
        let (name, value) = (p.arr()[0].str(), p.arr()[1].num());
        let key = format!("mako_fs_{name}_total{{fs=\"fs1\"}}");
        let (a, b) = (s1.get(&key).copied(), s2.get(&key).copied());
        let (a, b) = (a.unwrap_or_else(|| panic!("{key} missing")), b.unwrap());
        assert!(
            a <= value && value <= b,
            "{key}: scrapes {a}, {b}; mako diag stats {value}"
        );
        if ["creates", "writes", "bytes_written", "removes"].contains(&name) {
            assert_eq!(a, value, "{key}");
        }
    }
    let created = s1["mako_fs_creates_total{fs=\"fs1\"}"];
    assert!(created >= 10.0, "10 files created, counter says {created}");
    assert!(s1["mako_fs_bytes_written_total{fs=\"fs1\"}"] >= 5_500_000.0);
    for d in stats.get("disks").arr() {
        let disk = d.get("name").str();
        for (json_name, metric) in [
            ("reads", "mako_disk_reads_total"),
            ("writes", "mako_disk_writes_total"),
            ("read_bytes", "mako_disk_read_bytes_total"),
            ("write_bytes", "mako_disk_write_bytes_total"),
            ("errors", "mako_disk_errors_total"),
        ] {
            let key = format!("{metric}{{fs=\"fs1\",disk=\"{disk}\"}}");
            let value = d.get(json_name).num();
            let (a, b) = (s1[&key], s2[&key]);
            assert!(
                a <= value && value <= b,
                "{key}: scrapes {a}, {b}; mako diag stats {value}"
            );
        }
    }
    // Lock counters as `mako diag counters`; renames happened only before the scrapes.
    assert_eq!(
        s1["mako_lock_acquisitions_total{lock=\"rename\"}"],
        locks["rename"].0 as f64
    );
    assert_eq!(s2["mako_lock_acquisitions_total{lock=\"rename\"}"], 3.0);
    for (name, (acq, _)) in &locks {
        let key = format!("mako_lock_acquisitions_total{{lock=\"{name}\"}}");
        assert!(s1[&key] <= *acq as f64 && *acq as f64 <= s2[&key], "{key}");
    }
    // Gauges.
    assert_eq!(s1["mako_up"], 1.0);
    assert_eq!(
        s1["mako_pagepool_limit_bytes{fs=\"fs1\"}"],
        (256u64 << 20) as f64
    );
    assert!(s1["mako_fs_inodes_used{fs=\"fs1\"}"] >= 11.0);
    assert!(s1["mako_fs_free_bytes{fs=\"fs1\"}"] < s1["mako_fs_size_bytes{fs=\"fs1\"}"]);
    assert!(s1.contains_key("mako_waiters") && s1.contains_key("mako_waiter_longest_seconds"));

    assert_eq!(http_get(port, "/nothing-here").0, 404);
    // Malformed and oversized requests get an answer, and the endpoint lives on.
    assert_eq!(raw_request(port, b"\x01\x02 nonsense\r\n\r\n"), 400);
    let mut huge = b"GET /metrics HTTP/1.1\r\nX-Filler: ".to_vec();
    huge.extend(std::iter::repeat_n(b'a', 64 << 10));
    assert_eq!(raw_request(port, &huge), 431);
    assert_eq!(http_get(port, "/metrics").0, 200);
    assert!(Path::new(c.mount()).is_dir());
    // curl, as the README shows it (scripts/install-deps installs it).
    match run_cmd(
        Path::new("curl"),
        &["-sf", &format!("http://127.0.0.1:{port}/metrics")],
        Duration::from_secs(10),
    ) {
        Err(e) => mako_tests::skip::cannot_run(
            "prometheus_endpoint_matches_diag_stats (curl check)",
            &format!("curl cannot run: {e:#}"),
        ),
        Ok(out) => {
            assert!(out.success(), "curl: {out}");
            assert!(out.stdout.contains("# TYPE mako_fs_creates counter"));
            assert!(out.stdout.contains("mako_fs_creates_total{fs=\"fs1\"}"));
        }
    }
}
