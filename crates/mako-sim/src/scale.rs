//! The scale harness: many simulated nodes hitting one directory or one file at once,
//! measured rather than model-checked. Two workloads from the issue: M nodes each
//! create one file in a new shared directory (4,096 in the issue), and M nodes each
//! write their own 47,008-byte record of one shared file (1,024). What comes out: the
//! simulated time from the first operation's start to the last one's end, the network
//! messages per operation (by service), and the busiest node's message count.

use crate::cluster::{ClusterConfig, SimCluster, Thief};
use crate::net::NetStats;
use crate::sched::{Sim, SimConfig};
use crate::workload::RECORD_BYTES;
use mako_fs::fs::{Ctx, ROOT_INO};
use mako_rt::{NodeId, ServiceId};
use parking_lot::Mutex;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ScaleWorkload {
    /// Every node creates `f<node>` in the new directory `/storm`.
    CreateStorm,
    /// Every node writes record `node` of `/records`.
    SharedFileRecords,
}

#[derive(Clone, Debug)]
pub struct ScaleReport {
    pub workload: ScaleWorkload,
    pub nodes: u32,
    /// From the first operation's start to the last one's end.
    pub simulated: Duration,
    /// Operations that returned an error (they all returned).
    pub errors: Vec<String>,
    /// Network traffic of the measured phase only.
    pub net: NetStats,
    /// Real time the whole run took (mounts included).
    pub wall: Duration,
}

impl ScaleReport {
    pub fn messages_per_op(&self) -> f64 {
        self.net.messages as f64 / self.nodes as f64
    }
    /// Requests to one service per operation (each has a reply too).
    pub fn requests_per_op(&self, service: ServiceId) -> f64 {
        self.net.by_service.get(&service).copied().unwrap_or(0) as f64 / self.nodes as f64
    }
}

impl fmt::Display for ScaleReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (busiest, busiest_count) = self.net.busiest().unwrap_or((NodeId(0), 0));
        write!(
            f,
            "{:?} on {} nodes: {:.3} ms simulated, {:.1} messages per operation (token manager {:.1}, revokes {:.1}, file system {:.1}, fs manager {:.1} requests), busiest: {busiest} with {busiest_count} messages, {} of {} operations failed ({:.1} s real)",
            self.workload,
            self.nodes,
            self.simulated.as_secs_f64() * 1e3,
            self.messages_per_op(),
            self.requests_per_op(ServiceId::TokenManager),
            self.requests_per_op(ServiceId::TokenClient),
            self.requests_per_op(ServiceId::FileSystem),
            self.requests_per_op(ServiceId::FsManager),
            self.errors.len(),
            self.nodes,
            self.wall.as_secs_f64()
        )
    }
}

/// Run `workload` on `nodes` nodes (seeded like the simulation). Fails only if the
/// run cannot complete: the cluster cannot be built or mounted, or the simulation
/// deadlocks, hangs or panics.
pub fn run_scale(workload: ScaleWorkload, nodes: u32, seed: u64) -> Result<ScaleReport, String> {
    let started = std::time::Instant::now();
    let sim = Sim::new(
        seed,
        SimConfig {
            // Many nodes: many threads, small stacks.
            stack_bytes: 2 << 20,
            hang_timeout: Duration::from_secs(120),
            ..SimConfig::default()
        },
    );
    let mut config = ClusterConfig::small(nodes);
    config.thief = Thief::Off;
    // A node's pagepool need not be big for one small operation.
    config.pagepool_bytes = 1 << 20;
    let cluster = SimCluster::new(&sim, config)?;
    struct Shared {
        phase_start: Option<Duration>,
        phase_end: Duration,
        net: Option<NetStats>,
        errors: Vec<String>,
        failure: Option<String>,
    }
    let shared = Arc::new(Mutex::new(Shared {
        phase_start: None,
        phase_end: Duration::ZERO,
        net: None,
        errors: Vec::new(),
        failure: None,
    }));
    {
        let (cluster, shared) = (cluster.clone(), shared.clone());
        sim.spawn_task("driver", move || {
            let sim = crate::sched::current().expect("in the simulation");
            let fail = |m: String| shared.lock().failure = Some(m);
            for n in 0..nodes {
                if let Err(e) = cluster.mount(n) {
                    return fail(format!("mount of node {n}: {e}"));
                }
            }
            let fs0 = cluster.fs(0).expect("node 0");
            let ctx = Ctx::default();
            let target = match workload {
                ScaleWorkload::CreateStorm => fs0.mkdir(ctx, ROOT_INO, b"storm", 0o755, 0),
                ScaleWorkload::SharedFileRecords => {
                    fs0.create(ctx, ROOT_INO, b"records", 0o644, 0, true)
                }
            };
            if let Err(e) = target {
                return fail(format!("setup on node 0: {e}"));
            }
            cluster.net.reset_stats();
            let pending = Arc::new(AtomicU64::new(nodes as u64));
            let name = match workload {
                ScaleWorkload::CreateStorm => &b"storm"[..],
                ScaleWorkload::SharedFileRecords => &b"records"[..],
            };
            for n in 0..nodes {
                let (cluster, shared, pending) = (cluster.clone(), shared.clone(), pending.clone());
                let delay = sim.below(100);
                sim.spawn(format!("n{n}"), move || {
                    let now = || mako_diag::sched::current().expect("task").now();
                    mako_diag::sched::sleep(Duration::from_micros(delay));
                    let start = now();
                    let fs = cluster.fs(n).expect("mounted");
                    let r = fs.lookup(ROOT_INO, name).and_then(|a| match workload {
                        ScaleWorkload::CreateStorm => fs
                            .create(ctx, a.ino, format!("f{n}").as_bytes(), 0o644, 0, true)
                            .map(|_| ()),
                        ScaleWorkload::SharedFileRecords => {
                            let data = crate::ops::pattern(n as u64 + 1, RECORD_BYTES as usize);
                            fs.write(a.ino, n as u64 * RECORD_BYTES, &data, false)
                                .and_then(|_| fs.fsync(a.ino, false))
                        }
                    });
                    let end = now();
                    let mut s = shared.lock();
                    s.phase_start = Some(s.phase_start.map_or(start, |t| t.min(start)));
                    s.phase_end = s.phase_end.max(end);
                    if let Err(e) = r {
                        s.errors.push(format!("node {n}: {e}"));
                    }
                    drop(s);
                    pending.fetch_sub(1, Ordering::SeqCst);
                });
            }
            mako_diag::sched::block_until("scale phase", || pending.load(Ordering::SeqCst) == 0);
            shared.lock().net = Some(cluster.net.stats());
            for n in 0..nodes {
                if let Err(e) = cluster.unmount(n) {
                    return fail(format!("unmount of node {n}: {e}"));
                }
            }
        });
    }
    let run = sim.run();
    let s = shared.lock();
    if let Err(e) = run {
        cluster.abandon();
        return Err(e.to_string());
    }
    if let Some(f) = &s.failure {
        cluster.abandon();
        return Err(f.clone());
    }
    Ok(ScaleReport {
        workload,
        nodes,
        simulated: s.phase_end - s.phase_start.unwrap_or_default(),
        errors: s.errors.clone(),
        net: s.net.clone().unwrap_or_default(),
        wall: started.elapsed(),
    })
}
