//! makod's memory stays bounded by its pagepool while data streams through it.
//!
//! Proves: with `pagepool=256M`, writing a 1 GiB file (4× the pagepool) in 1 MiB records,
//! fsync, dropping the kernel's page cache for it (`posix_fadvise(DONTNEED)`, so the reads
//! really go through makod) and reading it back (contents verified) keeps makod's resident
//! memory (VmHWM = peak RSS, and VmRSS sampled every 100 ms) at or below
//! `pagepool + OVERHEAD`. The measured numbers are printed either way.

use mako_tests::cluster::{require_fuse, ClusterOptions, TestCluster};
use std::io::{Read, Write};
use std::os::unix::io::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const MIB: u64 = 1 << 20;
const PAGEPOOL: u64 = 256 * MIB;
/// Allowed resident memory beyond the pagepool. It covers: the makod binary and its shared
/// libraries (~10-20 MiB resident); the FUSE worker threads, each with a request buffer of
/// max_write (1 MiB) + header plus a reply buffer, and their stacks (a few MiB per thread
/// for the default worker count); the inode, directory and stat caches (maxFilesToCache /
/// maxStatCache entries), allocation maps and recovery-log buffers of a mounted file system;
/// write-behind/prefetch thread stacks; and allocator slack. (Freed block buffers kept
/// for reuse, `PagePool::spare_budget`, are memory the pagepool used before: they never
/// raise the peak.)
const OVERHEAD: u64 = 160 * MIB;
const FILE_BYTES: u64 = 4 * PAGEPOOL;

fn status_kib(pid: u32, field: &str) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    s.lines()
        .find(|l| l.starts_with(field))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
}

fn fill(buf: &mut [u8], record: u64) {
    for (i, w) in buf.chunks_mut(8).enumerate() {
        w.copy_from_slice(&(record.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ i as u64).to_le_bytes());
    }
}

#[test]
fn makod_memory_stays_within_pagepool_plus_overhead() {
    if !require_fuse("makod_memory_stays_within_pagepool_plus_overhead") {
        return;
    }
    let cluster = TestCluster::up(ClusterOptions {
        pagepool: "256M".into(),
        ..Default::default()
    })
    .expect("mako up");
    let pid = cluster.makod_pid().expect("makod.pid");
    let rss_at_start = status_kib(pid, "VmRSS:").unwrap() * 1024;

    let max_rss = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let sampler = {
        let (max_rss, stop) = (max_rss.clone(), stop.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                if let Some(kib) = status_kib(pid, "VmRSS:") {
                    max_rss.fetch_max(kib * 1024, Ordering::Relaxed);
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        })
    };

    let path = cluster.mount().join("stream");
    let mut buf = vec![0u8; MIB as usize];
    let t = Instant::now();
    {
        let mut f = std::fs::File::create(&path).unwrap();
        for r in 0..FILE_BYTES / MIB {
            fill(&mut buf, r);
            f.write_all(&buf).unwrap();
        }
        f.sync_all().unwrap();
        unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    }
    let write_s = t.elapsed().as_secs_f64();
    let rss_after_write = status_kib(pid, "VmRSS:").unwrap() * 1024;
    let hwm_after_write = status_kib(pid, "VmHWM:").unwrap() * 1024;
    let t = Instant::now();
    {
        let mut f = std::fs::File::open(&path).unwrap();
        let mut want = vec![0u8; MIB as usize];
        for r in 0..FILE_BYTES / MIB {
            f.read_exact(&mut buf).unwrap();
            fill(&mut want, r);
            assert!(buf == want, "record {r} (MiB offset) read back wrong");
        }
        let mut rest = Vec::new();
        f.read_to_end(&mut rest).unwrap();
        assert!(rest.is_empty(), "file longer than written");
    }
    let read_s = t.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    sampler.join().unwrap();
    let rss_end = status_kib(pid, "VmRSS:").unwrap() * 1024;
    let hwm = status_kib(pid, "VmHWM:").unwrap() * 1024;
    let sampled = max_rss.load(Ordering::Relaxed);
    let peak = hwm.max(sampled);
    let limit = PAGEPOOL + OVERHEAD;
    let m = |b: u64| b as f64 / MIB as f64;
    println!(
        "makod memory, pagepool {:.0} MiB, streamed {:.0} MiB write + read:",
        m(PAGEPOOL),
        m(FILE_BYTES)
    );
    println!("  VmRSS at start          {:8.1} MiB", m(rss_at_start));
    println!(
        "  VmRSS after write+fsync {:8.1} MiB (VmHWM {:.1} MiB)",
        m(rss_after_write),
        m(hwm_after_write)
    );
    println!("  VmRSS at end            {:8.1} MiB", m(rss_end));
    println!("  max sampled VmRSS       {:8.1} MiB", m(sampled));
    println!("  VmHWM (peak RSS)        {:8.1} MiB", m(hwm));
    println!(
        "  limit pagepool+overhead {:8.1} MiB (overhead {:.0} MiB); peak - pagepool = {:.1} MiB",
        m(limit),
        m(OVERHEAD),
        m(peak) - m(PAGEPOOL)
    );
    println!(
        "  write {:.0} MiB/s, read {:.0} MiB/s",
        m(FILE_BYTES) / write_s,
        m(FILE_BYTES) / read_s
    );
    assert!(
        peak <= limit,
        "makod peak RSS {:.1} MiB exceeds pagepool + overhead = {:.1} MiB",
        m(peak),
        m(limit)
    );
}
