//! Many nodes mount one file system in the simulation: each makes its recovery log at
//! its first mount (the log table has a place for every node the file system was made
//! for), all stay mounted idle at once, then all unmount and fsck finds the disks clean.
//! `MAKO_SIM_MOUNT_NODES` sets how many (default 64); the figures printed are the real
//! time per mount and the memory each idle mounted node adds (the process's resident
//! set, read from /proc, before and after the mounts).

use mako_sim::{ClusterConfig, Sim, SimCluster, SimConfig, Thief};
use parking_lot::Mutex;
use std::sync::Arc;
use std::time::{Duration, Instant};

fn nodes() -> u32 {
    std::env::var("MAKO_SIM_MOUNT_NODES")
        .ok()
        .map(|v| v.trim().parse().expect("MAKO_SIM_MOUNT_NODES is a number"))
        .unwrap_or(64)
}

/// Resident memory of this process in KiB.
fn rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS in /proc/self/status")
}

/// Real time of the mounts and resident KiB before and after them, or what failed.
type Outcome = Result<(Duration, u64, u64), String>;

#[test]
fn every_node_mounts_with_a_log_of_its_own() {
    let m = nodes();
    let sim = Sim::new(
        7,
        SimConfig {
            stack_bytes: 2 << 20,
            hang_timeout: Duration::from_secs(600),
            ..SimConfig::default()
        },
    );
    let mut config = ClusterConfig::small(m);
    config.thief = Thief::Off;
    config.pagepool_bytes = 1 << 20;
    let cluster = SimCluster::new(&sim, config).expect("cluster");
    let result: Arc<Mutex<Option<Outcome>>> = Arc::new(Mutex::new(None));
    {
        let (cluster, result) = (cluster.clone(), result.clone());
        sim.spawn_task("driver", move || {
            let before = rss_kib();
            let started = Instant::now();
            for n in 0..m {
                if let Err(e) = cluster.mount(n) {
                    *result.lock() = Some(Err(format!("mount of node {n}: {e}")));
                    return;
                }
            }
            let took = started.elapsed();
            let after = rss_kib();
            // Every node made its own log at this first mount.
            for (n, core) in cluster.cores() {
                let ino = mako_format::log_table::log_ino(n);
                if core.metafile_blocks.read().get(&ino).is_none() {
                    *result.lock() = Some(Err(format!("node {n} has no log")));
                    return;
                }
            }
            for n in 0..m {
                if let Err(e) = cluster.unmount(n) {
                    *result.lock() = Some(Err(format!("unmount of node {n}: {e}")));
                    return;
                }
            }
            *result.lock() = Some(Ok((took, before, after)));
        });
    }
    let run = sim.run();
    if let Err(e) = run {
        cluster.abandon();
        panic!("{m} mounts did not complete: {e}");
    }
    let (took, before, after) = result
        .lock()
        .take()
        .expect("the driver ran")
        .unwrap_or_else(|e| panic!("{e}"));
    println!(
        "{m} nodes mounted (each making its log): {:.2} ms real per mount, {} KiB resident per idle mounted node ({} MiB before, {} MiB after)",
        took.as_secs_f64() * 1000.0 / m as f64,
        after.saturating_sub(before) / m as u64,
        before >> 10,
        after >> 10
    );
    cluster
        .fsck()
        .expect("fsck clean after every node mounted and unmounted");
}
