//! Micro-benchmark of the token hot path: a covered acquire (answered from the
//! client's cache) against an uncovered one (a manager call), reported as ns per
//! acquire and as a ratio measured in the same run. No assertions on time.
//!
//! Small run (as in CI): `cargo run -p mako-token --release --example token_bench`
//! Larger run: `cargo run -p mako-token --release --example token_bench -- 2000000`

use std::hint::black_box;
use std::sync::Arc;
use std::time::Instant;

use mako_rt::{InProcessTransport, Registry, ServiceId};
use mako_token::{
    AcquireRequest, ByteRange, ManagerMap, ManagerService, NodeId, ResourceId, ResourceKind,
    TokenClient, TokenClientLimits, TokenManager, TokenManagerLimits, TokenMode,
};

fn main() {
    let iterations: u64 = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(200_000);
    // Room for one token per uncovered acquire in both loops below.
    let limits = TokenManagerLimits {
        tokens_max: (iterations as usize).saturating_mul(3).max(1024),
        ..TokenManagerLimits::default()
    };
    let manager = Arc::new(TokenManager::new(limits));
    let registry = Registry::new();
    registry.register(
        NodeId(1),
        ServiceId::TokenManager,
        Arc::new(ManagerService {
            manager: Arc::clone(&manager),
        }),
    );
    let client = TokenClient::new(
        NodeId(1),
        Arc::new(InProcessTransport::new(NodeId(1), registry.clone())),
        ManagerMap::single(NodeId(1)),
        TokenClientLimits::default(),
    );
    registry.register(NodeId(1), ServiceId::TokenClient, client.service());
    let file = ResourceId::new(1, ResourceKind::ByteRange, 42);

    // Covered: the node holds xw over the whole file, then reads 4 KiB blocks.
    client
        .acquire(file, TokenMode::Xw, ByteRange::WHOLE, ByteRange::WHOLE)
        .expect("initial token");
    let start = Instant::now();
    for i in 0..iterations {
        let offset = (i % 1024) * 4096;
        let required = ByteRange::new(offset, offset + 4096);
        client
            .acquire(
                black_box(file),
                TokenMode::Ro,
                required,
                ByteRange::from(offset),
            )
            .expect("covered");
    }
    let covered_ns = start.elapsed().as_nanos() as f64 / iterations as f64;

    // The operation hot path: a hold taken and dropped under a held token.
    let start = Instant::now();
    for i in 0..iterations {
        let offset = (i % 1024) * 4096;
        let range = ByteRange::new(offset, offset + 4096);
        black_box(client.try_hold(file, TokenMode::Xw, range).expect("held"));
    }
    let hold_ns = start.elapsed().as_nanos() as f64 / iterations as f64;

    // Uncovered through the client: a new inode each time, so each is a manager call.
    let start = Instant::now();
    for i in 0..iterations {
        let inode = ResourceId::new(1, ResourceKind::Inode, i);
        client
            .acquire_whole(black_box(inode), TokenMode::Ro)
            .expect("uncovered");
    }
    let uncovered_ns = start.elapsed().as_nanos() as f64 / iterations as f64;

    // The manager alone, without the client's cache update.
    let start = Instant::now();
    for i in 0..iterations {
        let inode = ResourceId::new(2, ResourceKind::Inode, i);
        black_box(
            manager
                .acquire(AcquireRequest::whole(NodeId(2), inode, TokenMode::Ro))
                .expect("manager"),
        );
    }
    let manager_ns = start.elapsed().as_nanos() as f64 / iterations as f64;

    let stats = client.stats();
    println!("iterations                 {iterations}");
    println!("covered acquire            {covered_ns:8.1} ns");
    println!("try_hold + drop            {hold_ns:8.1} ns");
    println!("uncovered acquire (client) {uncovered_ns:8.1} ns");
    println!("manager acquire alone      {manager_ns:8.1} ns");
    println!(
        "uncovered / covered        {:8.1} x",
        uncovered_ns / covered_ns.max(f64::MIN_POSITIVE)
    );
    println!(
        "client: {} covered, {} manager calls; manager tokens {}",
        stats.covered,
        stats.manager_calls,
        manager.stats().tokens
    );
}
