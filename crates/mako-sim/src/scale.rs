//! The scale harness: many simulated nodes hitting one directory or one file at once,
//! measured rather than model-checked. Two workloads from the issue: M nodes each
//! create one file in a new shared directory (4,096 in the issue), and M nodes each
//! write their own 47,008-byte record of one shared file (1,024). What comes out: the
//! simulated time from the first operation's start to the last one's end, the network
//! messages per operation (by service), and the busiest node's message count. After
//! the run every file must be there exactly once and every record read back exact
//! from another node than its writer, and fsck must find the file system clean.

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
    /// The same in a directory that node 0 filled with `PREFILLED` names first, so
    /// that it lives in directory blocks: the nodes create under the directory in `rw`
    /// and their names' pages in `xw`.
    CreateStormInBlocks,
    /// Every node writes record `node` of `/records`.
    SharedFileRecords,
}

/// Names node 0 puts in `/storm` before `CreateStormInBlocks` (more than an inode
/// holds).
pub const PREFILLED: u32 = 256;

impl ScaleWorkload {
    fn prefilled(self) -> u32 {
        if self == ScaleWorkload::CreateStormInBlocks {
            PREFILLED
        } else {
            0
        }
    }
}

#[derive(Clone, Debug)]
pub struct ScaleReport {
    pub workload: ScaleWorkload,
    pub nodes: u32,
    /// From the first operation's start to the last one's end.
    pub simulated: Duration,
    /// Operations that returned an error (they all returned).
    pub errors: Vec<String>,
    /// What the check after the run found wrong: a file missing or listed twice, a
    /// record that does not read back exactly, fsck's findings.
    pub check_failures: Vec<String>,
    /// Network traffic of the measured phase only.
    pub net: NetStats,
    /// The token manager's counters over the measured phase (differences).
    pub tokens: mako_token::TokenStats,
    /// Real time the whole run took (mounts included).
    pub wall: Duration,
    /// The run's schedule hash and decision count (`SimReport`): equal for two runs of
    /// one seed.
    pub trace: u64,
    pub steps: u64,
    pub seed: u64,
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
            "{:?} on {} nodes: {:.3} ms simulated, {:.1} messages per operation (token manager {:.1}, revokes {:.1}, file system {:.1}, fs manager {:.1} requests), busiest: {busiest} with {busiest_count} messages, {} of {} operations failed ({:.1} s real; seed {}, schedule trace {:#x} in {} decisions)",
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
            self.wall.as_secs_f64(),
            self.seed,
            self.trace,
            self.steps
        )?;
        let t = &self.tokens;
        write!(
            f,
            "\n    manager: {} acquires, {} refused behind older requests (queued), {} refused for holders, {} conditional requests granted their fallback (reason gone), {} turn notices",
            t.acquires, t.queued, t.conflicts, t.downgraded, t.turns
        )?;
        for (what, n) in &self.net.by_token_request {
            write!(
                f,
                "\n    {what}: {:.2} per operation",
                *n as f64 / self.nodes as f64
            )?;
        }
        Ok(())
    }
}

impl ScaleReport {
    /// Everything went right: every operation succeeded and the check after the run
    /// (every file present exactly once, every record exact, fsck clean) found nothing.
    pub fn ok(&self) -> Result<(), String> {
        if self.errors.is_empty() && self.check_failures.is_empty() {
            return Ok(());
        }
        let mut m = format!(
            "{:?} on {} nodes: {} of {} operations failed, {} check failures",
            self.workload,
            self.nodes,
            self.errors.len(),
            self.nodes,
            self.check_failures.len()
        );
        for e in self.errors.iter().chain(&self.check_failures).take(10) {
            m.push_str("\n  ");
            m.push_str(e);
        }
        Err(m)
    }
}

/// Check what the phase made, from other nodes than the ones that made it: every
/// `f<n>` in `/storm` exactly once (and nothing else), or every record of `/records`
/// exactly as its node wrote it (records of different nodes share blocks: each must
/// survive the others' writes).
fn check_result(
    cluster: &SimCluster,
    workload: ScaleWorkload,
    nodes: u32,
    errors: &[String],
) -> Vec<String> {
    let mut bad = Vec::new();
    let fs0 = cluster.fs(0).expect("node 0");
    let Ok(target) = fs0.lookup(
        ROOT_INO,
        match workload {
            ScaleWorkload::CreateStorm | ScaleWorkload::CreateStormInBlocks => b"storm",
            ScaleWorkload::SharedFileRecords => b"records",
        },
    ) else {
        return vec!["the shared directory or file is gone".into()];
    };
    let failed = |n: u32| errors.iter().any(|e| e.starts_with(&format!("node {n}:")));
    match workload {
        ScaleWorkload::CreateStorm | ScaleWorkload::CreateStormInBlocks => {
            // The whole listing, from the last node (not the directory's first user).
            let lister = cluster.fs(nodes - 1).expect("mounted");
            let mut names: Vec<Vec<u8>> = Vec::new();
            let mut after = 0;
            loop {
                match lister.readdir(target.ino, after, 256) {
                    Ok(page) if page.is_empty() => break,
                    Ok(page) => {
                        after = page.last().expect("not empty").cookie;
                        names.extend(
                            page.into_iter()
                                .map(|e| e.name)
                                .filter(|n| n != b"." && n != b".."),
                        );
                    }
                    Err(e) => {
                        bad.push(format!("readdir of /storm on node {}: {e}", nodes - 1));
                        break;
                    }
                }
            }
            let mut sorted = names.clone();
            sorted.sort();
            sorted.dedup();
            if sorted.len() != names.len() {
                bad.push(format!(
                    "readdir lists {} names, {} distinct",
                    names.len(),
                    sorted.len()
                ));
            }
            for n in 0..nodes {
                let name = format!("f{n}");
                let listed = names.iter().filter(|x| x == &name.as_bytes()).count();
                let want = usize::from(!failed(n));
                if listed != want {
                    bad.push(format!("{name} listed {listed} times, expected {want}"));
                }
                // Looked up by another node than its creator.
                let other = cluster.fs((n + 1) % nodes).expect("mounted");
                match (other.lookup(target.ino, name.as_bytes()), want) {
                    (Ok(_), 1) | (Err(mako_fs::error::FsError::NotFound(_)), 0) => {}
                    (r, _) => bad.push(format!(
                        "lookup of {name} on node {}: {:?}",
                        (n + 1) % nodes,
                        r.map(|a| a.ino)
                    )),
                }
            }
            let made = (0..nodes).filter(|n| !failed(*n)).count() + workload.prefilled() as usize;
            if names.len() != made {
                bad.push(format!(
                    "{} names in /storm, {made} made ({} by node 0 first)",
                    names.len(),
                    workload.prefilled()
                ));
            }
        }
        ScaleWorkload::SharedFileRecords => {
            for n in 0..nodes {
                if failed(n) {
                    continue;
                }
                let reader = (n + 1) % nodes;
                let fs = cluster.fs(reader).expect("mounted");
                let want = crate::ops::pattern(n as u64 + 1, RECORD_BYTES as usize);
                match fs.read(target.ino, n as u64 * RECORD_BYTES, RECORD_BYTES as u32) {
                    Ok(got) if got == want => {}
                    Ok(got) => {
                        let first = got
                            .iter()
                            .zip(&want)
                            .position(|(a, b)| a != b)
                            .unwrap_or(got.len().min(want.len()));
                        let zeros = got[first..].iter().take(64).all(|b| *b == 0);
                        let own = fs
                            .read(target.ino, n as u64 * RECORD_BYTES, RECORD_BYTES as u32)
                            .map(|again| again == want);
                        let writer = cluster
                            .fs(n)
                            .expect("mounted")
                            .read(target.ino, n as u64 * RECORD_BYTES, RECORD_BYTES as u32)
                            .map(|again| again == want);
                        bad.push(format!(
                            "record {n} read on node {reader}: {} bytes, first difference at byte {first}{} (read again there: {own:?}, on its writer: {writer:?})",
                            got.len(),
                            if zeros { ", zeros from there" } else { "" }
                        ))
                    }
                    Err(e) => bad.push(format!("record {n} read on node {reader}: {e}")),
                }
            }
            match fs0.getattr(target.ino) {
                Ok(a) if errors.is_empty() && a.size != nodes as u64 * RECORD_BYTES => {
                    bad.push(format!(
                        "/records is {} bytes, {} expected",
                        a.size,
                        nodes as u64 * RECORD_BYTES
                    ))
                }
                Ok(_) => {}
                Err(e) => bad.push(format!("stat of /records: {e}")),
            }
        }
    }
    bad
}

/// Run `workload` on `nodes` nodes (seeded like the simulation), check the result and
/// fsck the file system after unmounting. Fails (Err) only if the run cannot complete:
/// the cluster cannot be built or mounted, or the simulation deadlocks, hangs or
/// panics; failed operations and checks are in the report (`ScaleReport::ok`).
pub fn run_scale(workload: ScaleWorkload, nodes: u32, seed: u64) -> Result<ScaleReport, String> {
    run_scale_on(workload, nodes, seed, None)
}

/// `run_scale` on disks of `disk_bytes` each (the default sizes them by the node
/// count, with room for every node's recovery log in its own region).
pub fn run_scale_on(
    workload: ScaleWorkload,
    nodes: u32,
    seed: u64,
    disk_bytes: Option<u64>,
) -> Result<ScaleReport, String> {
    let started = std::time::Instant::now();
    let sim = Sim::new(
        seed,
        SimConfig {
            // Many nodes: many threads, small stacks.
            stack_bytes: 2 << 20,
            hang_timeout: Duration::from_secs(120),
            // Decisions grow faster than the node count (every node's tasks take
            // turns while the others work: 10.7 million at 256 writers, 47.5 million
            // at 512).
            // 1,024 creators in one directory take 277 million since turn notices
            // (237 million before, past the budget of 250 per node²).
            // `MAKO_SIM_SCALE_STEPS_PER_NODE2` changes the 300 (long runs only).
            steps_max: SimConfig::default().steps_max.max(
                nodes as u64
                    * nodes as u64
                    * std::env::var("MAKO_SIM_SCALE_STEPS_PER_NODE2")
                        .ok()
                        .and_then(|v| v.parse().ok())
                        .unwrap_or(300),
            ),
            ..SimConfig::default()
        },
    );
    let mut config = ClusterConfig::small(nodes);
    config.thief = Thief::Off;
    // Disks sized for the node count: a region of every disk per node holding the
    // node's recovery log (made from its own space at its first mount) and its share of
    // the inode file (64 inodes of 4 KiB), with room to spare. Only what is written
    // takes memory.
    config.disk_bytes = disk_bytes.unwrap_or_else(|| {
        config
            .disk_bytes
            .max(nodes as u64 * ((1 << 20) + 2 * config.log_bytes))
    });
    // A node's pagepool need not be big for one small operation.
    config.pagepool_bytes = 1 << 20;
    let cluster = SimCluster::new(&sim, config)?;
    struct Shared {
        phase_start: Option<Duration>,
        phase_end: Duration,
        net: Option<NetStats>,
        tokens: [mako_token::TokenStats; 2],
        errors: Vec<String>,
        check_failures: Vec<String>,
        failure: Option<String>,
    }
    let shared = Arc::new(Mutex::new(Shared {
        phase_start: None,
        phase_end: Duration::ZERO,
        net: None,
        tokens: Default::default(),
        errors: Vec::new(),
        check_failures: Vec::new(),
        failure: None,
    }));
    {
        let (cluster, shared) = (cluster.clone(), shared.clone());
        sim.spawn_task("driver", move || {
            let sim = crate::sched::current().expect("in the simulation");
            let fail = |m: String| shared.lock().failure = Some(m);
            // Node 0 first (it hosts the managers and makes the file system's first
            // changes), then every other node at once: mounted one after the other,
            // the mounts' simulated time grows with the node count, and with it the
            // turns of every mounted node's periodic work (quadratic in the nodes).
            if let Err(e) = cluster.mount(0) {
                return fail(format!("mount of node 0: {e}"));
            }
            let mounting = Arc::new(AtomicU64::new(nodes as u64 - 1));
            let mount_errors = Arc::new(Mutex::new(Vec::new()));
            for n in 1..nodes {
                let (cluster, mounting, mount_errors) =
                    (cluster.clone(), mounting.clone(), mount_errors.clone());
                sim.spawn(format!("mount{n}"), move || {
                    if let Err(e) = cluster.mount(n) {
                        mount_errors.lock().push(format!("mount of node {n}: {e}"));
                    }
                    mounting.fetch_sub(1, Ordering::SeqCst);
                });
            }
            mako_diag::sched::wait_until("mounts", || mounting.load(Ordering::SeqCst) == 0);
            if let Some(e) = mount_errors.lock().first() {
                return fail(e.clone());
            }
            let fs0 = cluster.fs(0).expect("node 0");
            let ctx = Ctx::default();
            let target = match workload {
                ScaleWorkload::CreateStorm | ScaleWorkload::CreateStormInBlocks => {
                    fs0.mkdir(ctx, ROOT_INO, b"storm", 0o755, 0).and_then(|d| {
                        for i in 0..workload.prefilled() {
                            fs0.create(ctx, d.ino, format!("p{i}").as_bytes(), 0o644, 0, true)?;
                        }
                        Ok(d)
                    })
                }
                ScaleWorkload::SharedFileRecords => {
                    fs0.create(ctx, ROOT_INO, b"records", 0o644, 0, true)
                }
            };
            if let Err(e) = target {
                return fail(format!("setup on node 0: {e}"));
            }
            cluster.net.reset_stats();
            shared.lock().tokens[0] = cluster.manager().stats();
            let pending = Arc::new(AtomicU64::new(nodes as u64));
            let name = match workload {
                ScaleWorkload::CreateStorm | ScaleWorkload::CreateStormInBlocks => &b"storm"[..],
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
                        ScaleWorkload::CreateStorm | ScaleWorkload::CreateStormInBlocks => fs
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
            mako_diag::sched::wait_until("scale phase", || pending.load(Ordering::SeqCst) == 0);
            shared.lock().net = Some(cluster.net.stats());
            shared.lock().tokens[1] = cluster.manager().stats();
            let errors = shared.lock().errors.clone();
            let bad = check_result(&cluster, workload, nodes, &errors);
            shared.lock().check_failures = bad;
            for n in 0..nodes {
                if let Err(e) = cluster.unmount(n) {
                    return fail(format!("unmount of node {n}: {e}"));
                }
            }
        });
    }
    let run = sim.run();
    let s = shared.lock();
    let run = match run {
        Ok(r) => r,
        Err(e) => {
            cluster.abandon();
            return Err(e.to_string());
        }
    };
    if let Some(f) = &s.failure {
        cluster.abandon();
        return Err(f.clone());
    }
    let mut check_failures = s.check_failures.clone();
    if let Err(e) = cluster.fsck() {
        check_failures.push(e);
    }
    Ok(ScaleReport {
        workload,
        nodes,
        simulated: s.phase_end - s.phase_start.unwrap_or_default(),
        errors: s.errors.clone(),
        check_failures,
        net: s.net.clone().unwrap_or_default(),
        tokens: {
            let [a, b] = s.tokens;
            mako_token::TokenStats {
                acquires: b.acquires - a.acquires,
                conflicts: b.conflicts - a.conflicts,
                revokes: b.revokes - a.revokes,
                table_full: b.table_full - a.table_full,
                tokens: b.tokens,
                downgraded: b.downgraded - a.downgraded,
                queued: b.queued - a.queued,
                waiters_expired: b.waiters_expired - a.waiters_expired,
                waiters_dropped: b.waiters_dropped - a.waiters_dropped,
                turns: b.turns - a.turns,
                rebuild_refused: b.rebuild_refused - a.rebuild_refused,
                reports: b.reports - a.reports,
            }
        },
        wall: started.elapsed(),
        trace: run.trace,
        steps: run.steps,
        seed,
    })
}
