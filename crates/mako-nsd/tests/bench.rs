//! NSD figures over loopback, with their references measured in the same run:
//! `cargo test --release -p mako-nsd --test bench -- --ignored --nocapture`.
//!
//! - streaming write (then sync) and read of 4 MiB blocks from pagepool-aligned
//!   buffers, through an NSD server on loopback against the same disk files used
//!   locally (`LocalNsd` on this node: the reference), with 1 and 4 streams; the ratio
//!   is the goal (>= 0.8x);
//! - what the client's one copy per block costs: a 4 MiB memcpy against the time per
//!   block through the server;
//! - small NSD round trips (an info request, p50 and p99) alone and while another
//!   thread streams 4 MiB writes through the same server, with the small-message lanes
//!   on (`tscSmallMsgTcpConnPct=50`) and off (`0`).
//!
//! `MAKO_NSD_BENCH_ROUNDS` (default 3): each figure is the median of its rounds, each
//! ratio the median of the per-round ratios. `MAKO_NSD_BENCH_MIB` (default 1024):
//! bytes streamed per measurement. `MAKO_NSD_BENCH_DIR`: where the disk files go
//! (default: the system's temporary directory). Not a check: it prints figures and
//! fails only if an I/O fails.

mod common;

use common::*;
use mako_disk::iohist::BufferType;
use mako_disk::nsd::IoTag;
use mako_disk::{AlignedBuf, Disk, FileDisk, LocalNsd, Nsd};
use mako_format::DiskAddress;
use mako_nsd::protocol::{self, Op};
use mako_nsd::{DiskRoute, RemoteNsd, RemoteOptions};
use mako_rt::{CallOptions, NodeId, Priority, ServiceId};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const BLOCK: usize = 4 << 20;
const SMALL_CALLS: usize = 3000;
const TAG: IoTag = IoTag {
    buffer_type: BufferType::Data,
    ino: 1,
};

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .map(|v| {
            v.trim()
                .parse()
                .unwrap_or_else(|_| panic!("{name} is a number"))
        })
        .unwrap_or(default)
        .max(1)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn gib_per_s(bytes: usize, d: Duration) -> f64 {
    bytes as f64 / d.as_secs_f64() / (1u64 << 30) as f64
}

/// Disk files for the streaming runs, removed at the end.
struct Files {
    _dir: tempfile::TempDir,
    paths: Vec<std::path::PathBuf>,
}

impl Files {
    fn new(n: usize, bytes: u64) -> Files {
        let dir = match std::env::var_os("MAKO_NSD_BENCH_DIR") {
            Some(d) => tempfile::tempdir_in(d),
            None => tempfile::tempdir(),
        }
        .expect("tempdir");
        let paths = (0..n)
            .map(|i| {
                let p = dir.path().join(format!("d{i}.img"));
                FileDisk::create(&format!("d{i}"), &p, bytes).expect("create");
                p
            })
            .collect();
        Files { _dir: dir, paths }
    }

    fn nsd(&self) -> Arc<dyn Nsd> {
        let disks: Vec<Arc<dyn Disk>> = self
            .paths
            .iter()
            .enumerate()
            .map(|(i, p)| {
                let d = FileDisk::open(&format!("d{i}"), p).expect("open");
                Arc::new(d) as Arc<dyn Disk>
            })
            .collect();
        Arc::new(LocalNsd::new(disks, 0))
    }
}

/// Streams `total` bytes in 4 MiB blocks with `streams` threads (each its own region,
/// disks taken in turn), writing (then one barrier) or reading. GiB/s.
fn stream(nsd: &dyn Nsd, disks: usize, streams: usize, total: usize, write: bool) -> f64 {
    let blocks_per_stream = total / BLOCK / streams;
    let start = Instant::now();
    std::thread::scope(|s| {
        for t in 0..streams {
            s.spawn(move || {
                let mut buf = AlignedBuf::zeroed(BLOCK);
                buf.iter_mut()
                    .enumerate()
                    .for_each(|(i, b)| *b = (i % 253) as u8);
                let disk = (t % disks) as u32;
                let region = (t / disks) * blocks_per_stream;
                for b in 0..blocks_per_stream {
                    let sector = ((region + b) * BLOCK / 512) as u64;
                    let da = DiskAddress::new(disk, sector);
                    if write {
                        nsd.write(da, &buf, TAG).expect("write");
                    } else {
                        nsd.read(da, &mut buf, TAG).expect("read");
                    }
                }
            });
        }
    });
    if write {
        nsd.sync_all().expect("sync");
    }
    gib_per_s(blocks_per_stream * streams * BLOCK, start.elapsed())
}

/// GiB/s of 4 MiB memcpys between two aligned buffers (the client's copy per block).
fn memcpy_rate() -> f64 {
    let src = AlignedBuf::zeroed(BLOCK);
    let mut dst = AlignedBuf::zeroed(BLOCK);
    dst.copy_from_slice(&src);
    let n = 256;
    let start = Instant::now();
    for i in 0..n {
        dst[i % 7] = i as u8;
        dst.copy_from_slice(std::hint::black_box(&src));
    }
    std::hint::black_box(&dst);
    gib_per_s(n * BLOCK, start.elapsed())
}

/// GiB/s through a server whose disk is in memory: the NSD path alone, no disk time.
fn memory_server(streams: usize, total: usize, write: bool) -> f64 {
    let nodes = cluster(2);
    let mem: Arc<dyn Disk> = Arc::new(mako_disk::MemDisk::new("d0", (total + BLOCK) as u64));
    nodes[0].serve(Arc::new(LocalNsd::new(vec![mem], 0)));
    let remote = RemoteNsd::new(
        vec![DiskRoute::Servers {
            name: "d0".into(),
            servers: vec![NodeId(1)],
        }],
        nodes[1].dyn_transport(),
        RemoteOptions {
            deadline: PATIENCE,
            ..RemoteOptions::default()
        },
        0,
    )
    .expect("connect");
    stream(&remote, 1, streams, total, write)
}

struct Streaming {
    local_w: f64,
    local_r: f64,
    remote_w: f64,
    remote_r: f64,
    /// Reads through the server with each block in one request (no pieces).
    remote_r_whole: f64,
}

fn streaming_round(
    files: &Files,
    disks: usize,
    streams: usize,
    total: usize,
    remote_first: bool,
) -> Streaming {
    let nodes = cluster(2);
    nodes[0].serve(files.nsd());
    let routes = || {
        (0..disks)
            .map(|i| DiskRoute::Servers {
                name: format!("d{i}"),
                servers: vec![NodeId(1)],
            })
            .collect()
    };
    let options = RemoteOptions {
        deadline: PATIENCE,
        ..RemoteOptions::default()
    };
    let remote = RemoteNsd::new(routes(), nodes[1].dyn_transport(), options, 0).expect("connect");
    let whole = RemoteOptions {
        piece_bytes: BLOCK,
        ..options
    };
    let remote_whole =
        RemoteNsd::new(routes(), nodes[1].dyn_transport(), whole, 0).expect("connect");
    let local = files.nsd();
    let mut out = Streaming {
        local_w: 0.0,
        local_r: 0.0,
        remote_w: 0.0,
        remote_r: 0.0,
        remote_r_whole: 0.0,
    };
    for k in 0..2 {
        if (k == 0) == remote_first {
            out.remote_w = stream(&remote, disks, streams, total, true);
            // Pieces and whole blocks in turn, so neither always reads second.
            if remote_first {
                out.remote_r = stream(&remote, disks, streams, total, false);
                out.remote_r_whole = stream(&remote_whole, disks, streams, total, false);
            } else {
                out.remote_r_whole = stream(&remote_whole, disks, streams, total, false);
                out.remote_r = stream(&remote, disks, streams, total, false);
            }
        } else {
            out.local_w = stream(&*local, disks, streams, total, true);
            out.local_r = stream(&*local, disks, streams, total, false);
        }
    }
    out
}

/// p50 and p99 (us) of small NSD round trips (info requests on small priority), while
/// `streamers` threads write 4 MiB blocks through the same server; and blocks written.
fn small_round_trips(files: &Files, pct: u8, streamers: usize) -> (f64, f64, u64) {
    let nodes = cluster_with(2, |c| c.small_msg_tcp_conn_pct = pct);
    nodes[0].serve(files.nsd());
    let stop = AtomicBool::new(false);
    let streamed = AtomicU64::new(0);
    let mut samples = Vec::with_capacity(SMALL_CALLS);
    let t = nodes[1].dyn_transport();
    std::thread::scope(|s| {
        for k in 0..streamers {
            let (stop, streamed, t) = (&stop, &streamed, t.clone());
            s.spawn(move || {
                let nsd = RemoteNsd::new(
                    vec![DiskRoute::Servers {
                        name: "d0".into(),
                        servers: vec![NodeId(1)],
                    }],
                    t,
                    RemoteOptions {
                        deadline: PATIENCE,
                        ..RemoteOptions::default()
                    },
                    0,
                )
                .expect("connect");
                let buf = AlignedBuf::zeroed(BLOCK);
                let mut b = k * 64;
                while !stop.load(Ordering::Relaxed) {
                    let da = DiskAddress::new(0, ((b % 128) * BLOCK / 512) as u64);
                    nsd.write(da, &buf, TAG).expect("write");
                    b += 1;
                    streamed.fetch_add(1, Ordering::Relaxed);
                }
            });
        }
        if streamers > 0 {
            wait_for("the stream to start", || {
                streamed.load(Ordering::Relaxed) >= 2
            });
        }
        let small = CallOptions {
            priority: Priority::Small,
            deadline: PATIENCE,
        };
        for i in 0..SMALL_CALLS + 100 {
            let request =
                protocol::encode_request(Op::Info, "d0", 0, 0, BufferType::DiskHeader, 0, &[]);
            let start = Instant::now();
            let reply = t
                .call(NodeId(1), ServiceId::Nsd, request, small)
                .expect("info");
            let elapsed = start.elapsed();
            assert!(matches!(protocol::decode_reply(&reply), Ok(Ok(_))));
            if i >= 100 {
                samples.push(elapsed.as_secs_f64() * 1e6);
            }
        }
        stop.store(true, Ordering::Relaxed);
    });
    samples.sort_by(f64::total_cmp);
    let at = |p: usize| samples[(samples.len() * p / 100).min(samples.len() - 1)];
    (at(50), at(99), streamed.load(Ordering::Relaxed))
}

#[test]
#[ignore = "a benchmark: run with --ignored --nocapture"]
fn nsd_figures() {
    // As in makod, whose pagepool sets it: freed aligned buffers are kept for reuse
    // (the server's read buffers and direct-I/O bounce buffers), not unmapped.
    AlignedBuf::set_spare_budget(256 << 20);
    let rounds = env_usize("MAKO_NSD_BENCH_ROUNDS", 3);
    let total = env_usize("MAKO_NSD_BENCH_MIB", 1024) << 20;
    let disks = 2;
    // Each disk holds every stream's region: total / disks, rounded up, plus room.
    let files = Files::new(disks, (total / disks + 8 * BLOCK) as u64 * 2);
    // Allocate the files' space once, untimed, so neither side pays it in its run.
    stream(&*files.nsd(), disks, disks, total, true);
    let direct = FileDisk::open("d0", &files.paths[0])
        .expect("open")
        .is_direct();
    let copy = memcpy_rate();
    println!(
        "NSD streaming, 4 MiB blocks, {} MiB per run, {disks} disk files ({}), median of {rounds} rounds:",
        total >> 20,
        if direct { "O_DIRECT" } else { "buffered" }
    );
    for streams in [1usize, 4] {
        let mem_total = total.min(512 << 20);
        let w = median(
            (0..rounds)
                .map(|_| memory_server(streams, mem_total, true))
                .collect(),
        );
        let r = median(
            (0..rounds)
                .map(|_| memory_server(streams, mem_total, false))
                .collect(),
        );
        println!(
            "  {streams} stream(s), server disk in memory (the NSD path alone): write {w:6.2} GiB/s, read {r:6.2} GiB/s"
        );
        let (mut lw, mut lr, mut rw, mut rr, mut qw, mut qr) =
            (vec![], vec![], vec![], vec![], vec![], vec![]);
        let mut q_whole = vec![];
        for round in 0..rounds {
            let s = streaming_round(&files, disks, streams, total, round % 2 == 1);
            qw.push(s.remote_w / s.local_w);
            qr.push(s.remote_r / s.local_r);
            q_whole.push(s.remote_r_whole / s.local_r);
            lw.push(s.local_w);
            lr.push(s.local_r);
            rw.push(s.remote_w);
            rr.push(s.remote_r);
        }
        let (rw_med, rr_med) = (median(rw), median(rr));
        println!("  {streams} stream(s):");
        println!(
            "    write+sync  local {:6.2} GiB/s   through a server {:6.2} GiB/s   ratio {:.2}x",
            median(lw),
            rw_med,
            median(qw)
        );
        println!(
            "    read        local {:6.2} GiB/s   through a server {:6.2} GiB/s   ratio {:.2}x",
            median(lr),
            rr_med,
            median(qr)
        );
        println!(
            "    read, each block in one request instead of 1 MiB pieces: ratio {:.2}x",
            median(q_whole)
        );
        println!(
            "    the client's one copy per block (4 MiB memcpy at {copy:.1} GiB/s) is {:.0}% of a written block's time, {:.0}% of a read one's",
            100.0 * rw_med / copy,
            100.0 * rr_med / copy
        );
    }
    let mut small: [[Vec<f64>; 2]; 3] = Default::default();
    let mut streamed = [0u64; 2];
    for _ in 0..rounds {
        let runs = [
            small_round_trips(&files, 50, 0),
            small_round_trips(&files, 50, 1),
            small_round_trips(&files, 0, 1),
        ];
        for (i, (p50, p99, n)) in runs.iter().enumerate() {
            small[i][0].push(*p50);
            small[i][1].push(*p99);
            if i > 0 {
                streamed[i - 1] += n;
            }
        }
    }
    println!("small NSD round trip (info request), {SMALL_CALLS} calls, median of {rounds} rounds (p50 / p99, us):");
    let names = [
        "alone                                          ",
        "beside 4 MiB writes, lanes on  (pct=50)        ",
        "beside 4 MiB writes, lanes off (pct=0)         ",
    ];
    for (i, name) in names.iter().enumerate() {
        println!(
            "  {name}{:8.1} / {:8.1}",
            median(small[i][0].clone()),
            median(small[i][1].clone())
        );
    }
    println!(
        "  blocks written meanwhile: {} with lanes on, {} off",
        streamed[0], streamed[1]
    );
}
