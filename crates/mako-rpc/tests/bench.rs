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

#[test]
#[ignore = "a benchmark: run with --ignored --nocapture"]
fn rpc_figures() {
    println!("small-message round trip, 64 B, {SMALL_CALLS} calls (p50 / p99, microseconds):");
    let (p50, p99, _) = small_round_trips(50, 0);
    println!(
        "  alone:                                  {:8.1} / {:8.1}",
        micros(p50),
        micros(p99)
    );
    let alone50 = p50;
    for (pct, what) in [
        (50, "lanes on  (tscSmallMsgTcpConnPct=50)"),
        (0, "lanes off (tscSmallMsgTcpConnPct=0) "),
    ] {
        let (p50, p99, streamed) = small_round_trips(pct, 1);
        println!(
            "  with a 4 MiB stream, {what}: {:8.1} / {:8.1}  (p50 {:.1}x alone; {streamed} blocks streamed meanwhile)",
            micros(p50),
            micros(p99),
            p50.as_secs_f64() / alone50.as_secs_f64()
        );
    }
    let raw = raw_tcp_copy();
    println!(
        "bulk, 4 MiB requests, {} GiB over loopback:",
        BULK_TOTAL >> 30
    );
    println!("  plain tokio TCP copy (reference):  {raw:6.2} GiB/s");
    for threads in [1, 4] {
        let rpc = rpc_bulk(threads);
        println!(
            "  mako-rpc, {threads} caller thread(s):         {rpc:6.2} GiB/s  ({:.2}x the reference)",
            rpc / raw
        );
    }
}
