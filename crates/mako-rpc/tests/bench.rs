//! RPC figures over loopback, with their references measured in the same run:
//! `cargo test --release -p mako-rpc --test bench -- --ignored --nocapture`.
//!
//! - small-message round trip (64 bytes, p50 and p99) alone, and while another thread
//!   streams 4 MiB bulk messages to the same peer, with the small-message lanes on
//!   (`tscSmallMsgTcpConnPct=50`) and off (`0`);
//! - bulk throughput (4 MiB requests) against a plain tokio TCP copy of the same bytes.
//!
//! Not a check: it prints figures and fails only if a call fails.

mod common;

use common::*;
use mako_rt::{CallOptions, NodeId, Priority, Service, ServiceId, Transport};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const SMALL_CALLS: usize = 3000;
const BULK_BYTES: usize = 4 << 20;
const BULK_TOTAL: usize = 2 << 30;

/// Answers a bulk request with its length only (an NSD write's shape).
struct Sink;
impl Service for Sink {
    fn handle(&self, _from: NodeId, request: &[u8]) -> Vec<u8> {
        (request.len() as u64).to_le_bytes().to_vec()
    }
}

fn percentile(sorted: &[Duration], p: usize) -> Duration {
    sorted[(sorted.len() * p / 100).min(sorted.len() - 1)]
}

fn micros(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

/// p50 and p99 of `SMALL_CALLS` small round trips, while `streams` threads stream
/// bulk messages to the same peer. Returns them with the bulk messages sent meanwhile.
fn small_round_trips(pct: u8, streams: usize) -> (Duration, Duration, u64) {
    let (_key, nodes) = cluster(2, |c| c.small_msg_tcp_conn_pct = pct);
    nodes[1].register(ServiceId::TokenClient, Echo::new("2"));
    nodes[1].register(ServiceId::FsManager, Arc::new(Sink));
    let stop = AtomicBool::new(false);
    let streamed = AtomicU64::new(0);
    let mut samples = Vec::with_capacity(SMALL_CALLS);
    std::thread::scope(|s| {
        for _ in 0..streams {
            let t = nodes[0].transport.clone();
            let (stop, streamed) = (&stop, &streamed);
            s.spawn(move || {
                let block = bytes::Bytes::from(vec![0x5au8; BULK_BYTES]);
                while !stop.load(Ordering::Relaxed) {
                    t.call_bytes(NodeId(2), ServiceId::FsManager, block.clone(), bulk())
                        .unwrap();
                    streamed.fetch_add(1, Ordering::Relaxed);
                }
            });
        }
        if streams > 0 {
            wait_for("the stream to start", || {
                streamed.load(Ordering::Relaxed) >= 2
            });
        }
        let t = &nodes[0].transport;
        let small = CallOptions {
            priority: Priority::Small,
            deadline: PATIENCE,
        };
        for i in 0..SMALL_CALLS + 100 {
            let start = Instant::now();
            t.call(NodeId(2), ServiceId::TokenClient, vec![i as u8; 64], small)
                .unwrap();
            if i >= 100 {
                samples.push(start.elapsed());
            }
        }
        stop.store(true, Ordering::Relaxed);
    });
    samples.sort();
    (
        percentile(&samples, 50),
        percentile(&samples, 99),
        streamed.load(Ordering::Relaxed),
    )
}

/// GiB/s of `BULK_TOTAL` bytes sent as 4 MiB bulk requests by `threads` callers.
fn rpc_bulk(threads: usize) -> f64 {
    let (_key, nodes) = cluster(2, |_| {});
    nodes[1].register(ServiceId::FsManager, Arc::new(Sink));
    let per_thread = BULK_TOTAL / BULK_BYTES / threads;
    let t = &nodes[0].transport;
    // Connections up first, as a streaming client has them.
    t.call_bytes(
        NodeId(2),
        ServiceId::FsManager,
        bytes::Bytes::from(vec![1u8; BULK_BYTES]),
        bulk(),
    )
    .unwrap();
    let start = Instant::now();
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| {
                let block = bytes::Bytes::from(vec![0xa5u8; BULK_BYTES]);
                for _ in 0..per_thread {
                    let r = t
                        .call_bytes(NodeId(2), ServiceId::FsManager, block.clone(), bulk())
                        .unwrap();
                    assert_eq!(&r[..], &(BULK_BYTES as u64).to_le_bytes());
                }
            });
        }
    });
    (per_thread * threads * BULK_BYTES) as f64 / start.elapsed().as_secs_f64() / (1u64 << 30) as f64
}

/// GiB/s of the same bytes written in 4 MiB pieces over one plain tokio TCP
/// connection on loopback and read into a 4 MiB buffer: the reference.
fn raw_tcp_copy() -> f64 {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let reader = tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            let mut buf = vec![0u8; BULK_BYTES];
            let mut total = 0usize;
            loop {
                let n = s.read(&mut buf).await.unwrap();
                if n == 0 {
                    return total;
                }
                total += n;
            }
        });
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        s.set_nodelay(true).unwrap();
        let block = vec![0xa5u8; BULK_BYTES];
        let start = Instant::now();
        for _ in 0..BULK_TOTAL / BULK_BYTES {
            s.write_all(&block).await.unwrap();
        }
        s.shutdown().await.unwrap();
        let total = reader.await.unwrap();
        assert_eq!(total, BULK_TOTAL);
        total as f64 / start.elapsed().as_secs_f64() / (1u64 << 30) as f64
    })
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Rounds of every measurement (`MAKO_RPC_BENCH_ROUNDS`, default 3): each figure is
/// the median of its rounds, each ratio the median of the per-round ratios, so one
/// round disturbed by a neighbour on a shared machine does not make the figure.
fn rounds() -> usize {
    std::env::var("MAKO_RPC_BENCH_ROUNDS")
        .ok()
        .map(|v| v.trim().parse().expect("MAKO_RPC_BENCH_ROUNDS is a number"))
        .unwrap_or(3)
        .max(1)
}

#[test]
#[ignore = "a benchmark: run with --ignored --nocapture"]
fn rpc_figures() {
    let rounds = rounds();
    // [alone, lanes on, lanes off] x [p50, p99], per round, in microseconds.
    let mut small: [[Vec<f64>; 2]; 3] = Default::default();
    let mut off_over_on = Vec::new();
    let mut streamed = [0u64; 2];
    let (mut raw, mut rpc1, mut rpc4, mut ratio1, mut ratio4) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for _ in 0..rounds {
        let runs = [
            small_round_trips(50, 0),
            small_round_trips(50, 1),
            small_round_trips(0, 1),
        ];
        for (i, (p50, p99, n)) in runs.iter().enumerate() {
            small[i][0].push(micros(*p50));
            small[i][1].push(micros(*p99));
            if i > 0 {
                streamed[i - 1] += n;
            }
        }
        off_over_on.push(runs[2].0.as_secs_f64() / runs[1].0.as_secs_f64());
        let reference = raw_tcp_copy();
        let one = rpc_bulk(1);
        let four = rpc_bulk(4);
        raw.push(reference);
        rpc1.push(one);
        rpc4.push(four);
        ratio1.push(one / reference);
        ratio4.push(four / reference);
    }
    println!("small-message round trip, 64 B, {SMALL_CALLS} calls, median of {rounds} rounds (p50 / p99, us):");
    let names = [
        "alone                                        ",
        "beside a 4 MiB stream, lanes on  (pct=50)    ",
        "beside a 4 MiB stream, lanes off (pct=0)     ",
    ];
    for (i, name) in names.iter().enumerate() {
        println!(
            "  {name}{:8.1} / {:8.1}",
            median(small[i][0].clone()),
            median(small[i][1].clone())
        );
    }
    println!(
        "  p50 lanes off / lanes on: {:.1}x (blocks streamed meanwhile: {} on, {} off)",
        median(off_over_on),
        streamed[0],
        streamed[1]
    );
    println!(
        "bulk, 4 MiB requests, {} GiB over loopback, median of {rounds} rounds:",
        BULK_TOTAL >> 30
    );
    println!(
        "  plain tokio TCP copy (reference):  {:6.2} GiB/s",
        median(raw)
    );
    println!(
        "  mako-rpc, 1 caller thread:         {:6.2} GiB/s  ({:.2}x the reference)",
        median(rpc1),
        median(ratio1)
    );
    println!(
        "  mako-rpc, 4 caller threads:        {:6.2} GiB/s  ({:.2}x the reference)",
        median(rpc4),
        median(ratio4)
    );
}
