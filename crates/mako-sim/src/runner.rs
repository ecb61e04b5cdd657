//! One seed of the cluster simulation from start to end, and many seeds in a row.
//!
//! A seed: format, start the network and the token manager, mount N nodes, run the
//! workload step by step (checking every outcome against the model and every
//! invariant after each step), read everything back on every node, unmount, fsck.
//! Everything is a function of the seed: `SeedReport::trace` (the scheduler's hash of
//! every decision) and `SeedReport::digest` (every outcome) are equal for two runs.

use crate::cluster::{Background, ClusterConfig, RecoveryFault, SimCluster, Thief};
use crate::invariants::Checks;
use crate::model::{nanos, Kind, MInode, Model, Window};
use crate::ops::{self, show_outcome, Op, Outcome, Path, Value};
use crate::sched::{Sim, SimConfig, SimReport};
use crate::workload::{Planned, Workload};
use crate::{NetStats, SimRng};
use mako_format::inode::Timestamp;
use mako_fs::cache_flush::RevokeFault;
use parking_lot::Mutex;
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What one seed runs.
#[derive(Clone, Debug)]
pub struct SeedConfig {
    pub seed: u64,
    pub cluster: ClusterConfig,
    /// Steps of the workload (the setup and the final read-back come on top).
    pub steps: u32,
    /// Probability that a step also runs background work (write-behind, commit,
    /// checkpoint, eviction, token release) on random nodes, concurrently.
    pub background_probability: f64,
    /// Probability that a step also has the token thief steal a data range.
    pub steal_probability: f64,
    /// Run inode eviction and token release concurrently with operations (as the
    /// daemon's sync thread does). Off: they run after the step's operations, alone,
    /// because today the release of an inode's tokens races with an operation that
    /// reuses the inode's number (the inode is then cached without a token; seed 360
    /// at one node shows it). `MAKO_SIM_CONCURRENT_RELEASE=1` turns it on.
    pub concurrent_release: bool,
    /// Let the token thief steal while operations run. Off: it steals after the
    /// step's operations, alone, because today an operation that holds a data token
    /// and asks for it again (unlink freeing the file: `remove` then `maybe_free`)
    /// is refused while a revoke waits for that very hold, after it changed memory,
    /// and the mount turns read-only (seed 1288 at one node shows it).
    /// `MAKO_SIM_STEAL_CONCURRENT=1` turns it on.
    pub steal_concurrent: bool,
    /// Run queued prefetches as background work. Off by default while the token thief
    /// runs: today a prefetch loads a block without holding a data token, so after a
    /// revoke it caches data the node no longer holds (seed 28 at one node shows it).
    /// `MAKO_SIM_PREFETCH=1` turns it on.
    pub prefetch: bool,
    pub checks: Checks,
    /// Check outcomes against the model, invariants and fsck. Off (`MAKO_SIM_NO_CHECKS=1`)
    /// only to time a workload or see whether it completes: a failure is then only a
    /// deadlock, a hang or a panic.
    pub verify: bool,
    /// TEST ONLY: a broken revoke to inject in every node (the checker's own test).
    pub revoke_fault: RevokeFault,
    /// `mako_fs::directory::CROWD_NODES` of every node, if not the default
    /// (`Core::crowd_nodes`; `MAKO_SIM_CROWD_NODES` sets it for any run).
    pub crowd_nodes: Option<u32>,
    /// Crash a node (not node 0, which hosts the token manager, unless the fault is
    /// `FaultKind::ManagerCrash`) at a random point of a random step; a survivor
    /// recovers it; it may rejoin a few steps later (`CrashPlan`). `MAKO_SIM_CRASH=1`
    /// turns it on for any run.
    pub crash: bool,
    /// TEST ONLY: a broken recovery (the checker's own test).
    pub recovery_fault: RecoveryFault,
    /// What the fault of a seed with `crash` may be (one drawn per seed).
    pub fault_kinds: Vec<FaultKind>,
}

/// The kinds of fault a seed may have (`SeedConfig::crash`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FaultKind {
    /// The node stops at once; a survivor recovers it after a fixed detection delay.
    Crash,
    /// The node's process stops (SIGSTOP) for longer than its lease: the manager
    /// expels it, a survivor recovers it, then it runs again and must neither write
    /// nor answer any operation until it rejoins (needs leases).
    Pause,
    /// The node is cut off from every other node until it was expelled and
    /// recovered; then the partition heals (needs leases).
    Partition,
    /// The node's path to the disks goes bad for good: every write and sync it makes
    /// fails with EIO (reads work), until it rejoins with the path repaired. Its next
    /// log write fails (the fault forces one, as makod's sync thread would before
    /// long), its file system panics (`mako_fs::core::FsPanic`: every operation EIO,
    /// no more I/O, the node silent to the lease manager), the manager expels it and a
    /// survivor recovers its log (needs leases).
    BadDisk,
    /// Node 0 crashes with the token manager it hosts: the lowest-numbered survivor
    /// takes the manager over and rebuilds its table from the survivors' held tokens
    /// (`SimCluster::crash_manager`, docs/coherence.md section 7b); a survivor
    /// recovers node 0 after the detection delay, as for `Crash`. Without leases (the
    /// crash is detected after a fixed delay; `ManagerPause` and `ManagerPartition`
    /// are the faults of the cluster manager under leases).
    ManagerCrash,
    /// Node 0, the cluster manager and the token manager's node, stops (SIGSTOP) for
    /// longer than its lease: the other quorum nodes elect a new cluster manager, which
    /// expels node 0 once its lease ran out, moves the token manager to itself and
    /// rebuilds it from the survivors' tokens, and has a survivor recover node 0's log
    /// (needs leases and three nodes: a majority of the quorum without node 0).
    /// Survivors' calls to the old token manager meanwhile fail (EIO, as in makod
    /// today): those operations are uncertain (`SimNet::set_lossy_target`).
    ManagerPause,
    /// As `ManagerPause`, but node 0 is cut off from every other node (a minority of
    /// one): it keeps running, confirms nothing with the quorum, so grants no lease
    /// (not even its own) and must not write after its lease ran out.
    ManagerPartition,
}

impl FaultKind {
    /// Needs the lease model (detection by lease expiry and expel).
    pub fn needs_leases(self) -> bool {
        !matches!(self, FaultKind::Crash | FaultKind::ManagerCrash)
    }

    /// A fault of node 0, the cluster manager and the token manager's node.
    pub fn of_the_manager(self) -> bool {
        matches!(
            self,
            FaultKind::ManagerCrash | FaultKind::ManagerPause | FaultKind::ManagerPartition
        )
    }
}

impl SeedConfig {
    pub fn new(seed: u64, nodes: u32) -> SeedConfig {
        SeedConfig {
            seed,
            cluster: ClusterConfig::small(nodes),
            steps: 40,
            background_probability: 0.6,
            steal_probability: 0.3,
            concurrent_release: env_flag("MAKO_SIM_CONCURRENT_RELEASE"),
            prefetch: env_flag("MAKO_SIM_PREFETCH"),
            steal_concurrent: env_flag("MAKO_SIM_STEAL_CONCURRENT"),
            checks: Checks::from_env(),
            verify: !env_flag("MAKO_SIM_NO_CHECKS"),
            revoke_fault: RevokeFault::None,
            crowd_nodes: env_u64("MAKO_SIM_CROWD_NODES").map(|n| n as u32),
            crash: env_flag("MAKO_SIM_CRASH"),
            recovery_fault: RecoveryFault::None,
            fault_kinds: vec![FaultKind::Crash],
        }
    }
}

/// The crash of one seed (`SeedConfig::crash`), drawn from its own stream.
///
/// What the model knows: node `node` syncs everything at the end of step `step - 1`
/// (as fsync would), so all its operations before step `step` are durable and must
/// all be there after the crash. Its operations of step `step` may be lost (they run
/// when it crashes, `delay_micros` into the step): after the recovery each runs again
/// on node `by` and is accepted whether or not it had taken effect before the crash
/// (`check_uncertain`). Operations of the other nodes in that step, including those
/// that need the crashed node's tokens and wait for its recovery, are checked as
/// usual.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CrashPlan {
    pub node: u32,
    pub step: u32,
    pub delay_micros: u64,
    /// The survivor that recovers it and runs its uncertain operations again.
    pub by: u32,
    /// The step at whose start the crashed node mounts again (None: it stays down).
    pub rejoin: Option<u32>,
    pub kind: FaultKind,
}

impl CrashPlan {
    pub fn draw(config: &SeedConfig) -> Option<CrashPlan> {
        let nodes = config.cluster.nodes;
        if !config.crash || nodes < 2 || config.steps < 4 {
            return None;
        }
        let mut rng = SimRng::new(config.seed ^ 0x4352_4153_4850_4c4e);
        let node = 1 + rng.below(nodes as u64 - 1) as u32;
        let step = 2 + rng.below(config.steps.saturating_sub(5).max(1) as u64) as u32;
        let delay_micros = rng.below(400);
        let by = (node + 1 + rng.below(nodes as u64 - 1) as u32) % nodes;
        let rejoin = rng
            .chance(0.5)
            .then(|| step + 1 + rng.below(3) as u32)
            .filter(|s| *s <= config.steps);
        let kinds = &config.fault_kinds;
        let kind = match kinds.len() {
            0 => return None,
            1 => kinds[0],
            n => kinds[rng.below(n as u64) as usize],
        };
        // The manager's node is node 0; the survivor that recovers it is drawn as
        // for any other node (`by` is never `node`, which stands in for it).
        assert!(
            !matches!(kind, FaultKind::ManagerPause | FaultKind::ManagerPartition) || nodes >= 3,
            "{kind:?} needs three nodes or more: a majority of the quorum (nodes 0, 1, 2) without node 0 elects the new cluster manager"
        );
        let (node, by) = if kind.of_the_manager() {
            (0, if by == 0 { node } else { by })
        } else {
            (node, by)
        };
        Some(CrashPlan {
            node,
            step,
            delay_micros,
            by,
            rejoin,
            kind,
        })
    }
}

/// How a seed went.
#[derive(Clone, Debug)]
pub struct SeedReport {
    pub seed: u64,
    pub sim: SimReport,
    /// Hash of every operation's outcome, in order.
    pub digest: u64,
    pub operations: u64,
    pub steps: u32,
    pub net: NetStats,
    /// Real time the seed took, fsck included.
    pub wall: Duration,
}

impl SeedReport {
    /// The scheduler's trace: equal for two runs of one seed.
    pub fn trace(&self) -> u64 {
        self.sim.trace
    }
}

/// Why a seed failed.
#[derive(Clone, Debug)]
pub struct SeedFailure {
    pub seed: u64,
    pub nodes: u32,
    /// The step that failed (None: before the first or after the last).
    pub step: Option<u32>,
    pub message: String,
}

impl fmt::Display for SeedFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "seed {} ({} node", self.seed, self.nodes)?;
        if self.nodes != 1 {
            write!(f, "s")?;
        }
        match self.step {
            Some(s) => write!(f, ", step {s}): {}", self.message),
            None => write!(f, "): {}", self.message),
        }
    }
}

/// What the driver task leaves for the caller.
#[derive(Default)]
struct DriverState {
    failure: Option<(Option<u32>, String)>,
    /// What the simulation was doing (for failures the scheduler reports: a deadlock,
    /// a panic, a hang).
    context: String,
    step: Option<u32>,
    digest: u64,
    operations: u64,
}

fn mix(h: u64, v: u64) -> u64 {
    (h ^ v.wrapping_mul(0x9e37_79b9_7f4a_7c15))
        .rotate_left(31)
        .wrapping_mul(0xbf58_476d_1ce4_e5b9)
}

/// A stable hash of an outcome (FNV-1a over its fields).
fn hash_outcome(o: &Outcome) -> u64 {
    struct Fnv(u64);
    impl Fnv {
        fn bytes(&mut self, b: &[u8]) {
            for x in b {
                self.0 = (self.0 ^ *x as u64).wrapping_mul(0x100_0000_01b3);
            }
        }
        fn num(&mut self, n: u64) {
            self.bytes(&n.to_le_bytes());
        }
    }
    let mut h = Fnv(0xcbf2_9ce4_8422_2325);
    match o {
        Err(e) => {
            h.num(1);
            h.num(e.errno as u64);
        }
        Ok(v) => match v {
            Value::Unit => h.num(2),
            Value::Attr(a) => {
                for n in [
                    3,
                    a.ino,
                    a.mode as u64,
                    a.size,
                    a.nlink as u64,
                    a.mtime.sec as u64,
                    a.mtime.nsec as u64,
                    a.ctime.sec as u64,
                    a.ctime.nsec as u64,
                ] {
                    h.num(n);
                }
            }
            Value::Bytes(b) => {
                h.num(4);
                h.bytes(b);
            }
            Value::Names(n) => {
                h.num(5);
                for x in n {
                    h.bytes(x);
                    h.num(0);
                }
            }
            Value::Entries(e) => {
                h.num(6);
                for (n, i) in e {
                    h.bytes(n);
                    h.num(*i);
                }
            }
            Value::Count(n) => {
                h.num(7);
                h.num(*n);
            }
            Value::Offset(n) => {
                h.num(8);
                h.num(*n);
            }
        },
    }
    h.0
}

/// Run one seed.
pub fn run_seed(config: &SeedConfig) -> Result<SeedReport, SeedFailure> {
    let started = Instant::now();
    let nodes = config.cluster.nodes;
    let fail = |step, message| SeedFailure {
        seed: config.seed,
        nodes,
        step,
        message,
    };
    let sim = Sim::new(
        config.seed,
        SimConfig {
            hang_timeout: Duration::from_secs(60),
            ..SimConfig::default()
        },
    );
    let cluster = SimCluster::new(&sim, config.cluster.clone()).map_err(|e| fail(None, e))?;
    let state = Arc::new(Mutex::new(DriverState::default()));
    {
        let (cluster, state, config) = (cluster.clone(), state.clone(), config.clone());
        sim.spawn_task("driver", move || {
            let r = drive(&cluster, &config, &state);
            if let Err((step, msg)) = r {
                let mut s = state.lock();
                if s.failure.is_none() {
                    s.failure = Some((step, msg));
                }
                drop(s);
                cluster.abandon();
            }
        });
    }
    // Where a seed's real time goes (`MAKO_SIM_TIMING=1`).
    let t_fmt = started.elapsed();
    let sim_result = sim.run();
    let t_run = started.elapsed();
    let s = state.lock();
    let report = match sim_result {
        Ok(r) => r,
        Err(e) => {
            cluster.abandon();
            return Err(fail(
                s.step,
                format!("{}\n  while: {}", e.message, s.context),
            ));
        }
    };
    if let Some((step, msg)) = &s.failure {
        return Err(fail(*step, msg.clone()));
    }
    if config.verify && CrashPlan::draw(config).is_some() {
        cluster.fsck_after_crash().map_err(|e| fail(None, e))?;
    } else if config.verify {
        cluster.fsck().map_err(|e| fail(None, e))?;
    }
    if env_flag("MAKO_SIM_TIMING") {
        eprintln!(
            "seed {}: format {:?}, run {:?} ({} scheduling decisions, {} handoffs, {} tasks, {:?} simulated), fsck {:?}",
            config.seed,
            t_fmt,
            t_run - t_fmt,
            report.steps,
            report.handoffs,
            report.tasks,
            report.elapsed,
            started.elapsed() - t_run,
        );
    }
    Ok(SeedReport {
        seed: config.seed,
        sim: report,
        digest: s.digest,
        operations: s.operations,
        steps: config.steps,
        net: cluster.net.stats(),
        wall: started.elapsed(),
    })
}

type DriveResult = Result<(), (Option<u32>, String)>;

fn now(cluster: &SimCluster) -> Timestamp {
    mako_fs::core::timestamp(mako_rt::Clock::wall(cluster.clock.as_ref()))
}

/// The driver task: everything from mount to unmount.
fn drive(
    cluster: &Arc<SimCluster>,
    config: &SeedConfig,
    state: &Mutex<DriverState>,
) -> DriveResult {
    let nodes = config.cluster.nodes;
    // Leases first: a mount does I/O, which needs one.
    let crash = CrashPlan::draw(config);
    if crash.is_some_and(|c| {
        matches!(
            c.kind,
            FaultKind::ManagerPause | FaultKind::ManagerPartition
        )
    }) {
        cluster.net.set_lossy_target(mako_rt::NodeId(0));
    }
    if let Some(leases) = &cluster.leases {
        let (cl, fault) = (cluster.clone(), config.recovery_fault);
        leases.set_on_expel(Arc::new(move |n, epoch| {
            let r = match crash.filter(|c| c.node == n && c.kind.needs_leases()) {
                None => Err(format!(
                    "node {n} (lease epoch {epoch}) was expelled, but no fault was planned for it: a live node lost its lease"
                )),
                Some(c) => {
                    cl.expelled(n);
                    if n == cl.manager_node() {
                        // The token manager's node was expelled: the new cluster
                        // manager serves it now, rebuilt from the survivors' tokens,
                        // before the survivor replays the expelled node's log.
                        let to = cl.leases.as_ref().map(|l| l.manager());
                        let successor = cl.move_manager(to, fault);
                        let rounds = cl.rebuild_manager();
                        if verbose() {
                            eprintln!(
                                "  node {successor} took the token manager over from expelled node {n}, {} report(s) in {rounds} round(s)",
                                cl.manager().stats().reports
                            );
                        }
                    }
                    cl.recover(c.by, n, fault)
                        .map(|r| {
                            r.map_or_else(|| format!("broken recovery {fault:?}"), |r| r.summary())
                        })
                        .map_err(|e| format!("node {} could not recover node {n}: {e}", c.by))
                }
            };
            cl.expels.lock().push((n, r));
        }));
        leases.start();
    }
    state.lock().context = "mounting".into();
    for n in 0..nodes {
        cluster
            .mount(n)
            .map_err(|e| (None, format!("mount of node {n} failed: {e}")))?;
    }
    for (_, core) in cluster.cores() {
        core.revoke_fault
            .store(config.revoke_fault as u8, Ordering::Relaxed);
        if let Some(n) = config.crowd_nodes {
            core.crowd_nodes.store(n, Ordering::Relaxed);
        }
    }
    let fs0 = cluster.fs(0).expect("node 0 mounted");
    let root = fs0
        .getattr(mako_fs::fs::ROOT_INO)
        .map_err(|e| (None, format!("stat of the root on node 0: {e}")))?;
    let mkfs_time = config
        .cluster
        .mkfs_params(config.seed)
        .reproducible
        .expect("reproducible")
        .time;
    let mut model = Model::new(
        root.ino,
        config.cluster.block_bytes as u64,
        Window::exact(mkfs_time),
    );
    let mut workload = Workload::new(config.seed, nodes);
    let mut background_rng = SimRng::new(config.seed ^ 0x4241_434b_4752_4f55);
    // The crashed node while it is down, and the survivor that takes its work.
    let mut down: Option<(u32, u32)> = None;
    let mut probe_rng = SimRng::new(config.seed ^ 0x5a4f_4d42_4945_5052);
    for step in 0..=config.steps + 1 {
        if let (Some((dead, _)), Some(c)) = (down, crash) {
            if c.kind.needs_leases() && c.rejoin != Some(step) {
                state.lock().context =
                    format!("step {step}: expelled node {dead} is asked before it rejoins");
                probe_zombie(cluster, &model, dead, &mut probe_rng).map_err(|e| (Some(step), e))?;
            }
        }
        if let Some(c) = crash.filter(|c| c.rejoin == Some(step)) {
            state.lock().context = format!("step {step}: node {} rejoins", c.node);
            let report = cluster.rejoin(c.node).map_err(|e| {
                (
                    Some(step),
                    format!(
                        "node {} could not mount again after its recovery: {e}",
                        c.node
                    ),
                )
            })?;
            // Its log was replayed by the survivor: nothing of it may replay again.
            if report.transactions > 0 && config.recovery_fault == RecoveryFault::None {
                return Err((
                    Some(step),
                    format!(
                        "node {} replayed its own log again when it rejoined, after node {} had recovered it: {}",
                        c.node,
                        c.by,
                        report.summary()
                    ),
                ));
            }
            down = None;
        }
        let mut plan = if step == 0 {
            workload.setup()
        } else if step == config.steps + 1 {
            read_back(&model, nodes)
        } else {
            let kind = workload.step_kind();
            workload.plan(&model, kind)
        };
        let background = if step == 0 {
            Vec::new()
        } else {
            background_for(config, &mut background_rng, &model, step <= config.steps)
        };
        // Work that must not overlap operations yet (see `concurrent_release` and
        // `steal_concurrent`) goes after them.
        let (mut background, mut after): (Vec<_>, Vec<_>) =
            background.into_iter().partition(|(_, w, _)| match w {
                Background::Evict | Background::ReleaseTokens => config.concurrent_release,
                Background::Steal { .. } => config.steal_concurrent,
                _ => true,
            });
        let mut step_crash = None;
        if let Some((dead, by)) = down {
            // The crashed node's share of the work goes to a survivor.
            if step == config.steps + 1 {
                plan.retain(|p| p.node != dead);
            }
            for p in &mut plan {
                if p.node == dead {
                    p.node = by;
                }
            }
            background.retain(|(n, w, _)| *n != dead || matches!(w, Background::Steal { .. }));
            after.retain(|(n, w, _)| *n != dead || matches!(w, Background::Steal { .. }));
        }
        if let Some(c) = crash {
            if step + 1 == c.step {
                // Everything the node did so far is made durable (as fsync would).
                after.push((c.node, Background::Sync, 0));
            } else if step == c.step {
                // Observers race one change; the crashed node's changes are checked
                // only after its recovery, so none here. An exchange run twice undoes
                // itself: the crashed node does not do one in this step.
                plan.retain(|p| !p.observer);
                for p in &mut plan {
                    if p.node == c.node
                        && matches!(p.op, Op::Rename { flags, .. } if flags & crate::ops::RENAME_EXCHANGE != 0)
                    {
                        p.node = c.by;
                    }
                }
                after.retain(|(n, w, _)| *n != c.node || matches!(w, Background::Steal { .. }));
                step_crash = Some(c);
                down = Some((c.node, c.by));
            }
        }
        run_step(
            cluster,
            config,
            step,
            &plan,
            &background,
            &after,
            step_crash,
            &mut model,
            state,
        )?;
        if let Some(leases) = &cluster.leases {
            if let Some(w) = leases.fenced_writes().first() {
                return Err((
                    Some(step),
                    format!(
                        "a write of fenced node {} (lease epoch {}, expelled at {:?}) reached disk {} at {:?} (offset {}, {} bytes): the lease fence let it through",
                        w.node, w.epoch, w.expelled_at, w.disk, w.at, w.offset, w.len
                    ),
                ));
            }
        }
    }
    if config.verify && nodes > 1 {
        state.lock().context = "replaying the logs of a whole-cluster crash".into();
        replay_orders_agree(cluster, nodes).map_err(|e| (None, e))?;
    }
    state.lock().context = "unmounting".into();
    for n in (0..nodes).filter(|n| cluster.is_mounted(*n)) {
        cluster
            .unmount(n)
            .map_err(|e| (None, format!("unmount of node {n} failed: {e}")))?;
    }
    if let Some(leases) = &cluster.leases {
        leases.stop();
        if let Some(w) = leases.fenced_writes().first() {
            return Err((
                None,
                format!(
                    "a write of fenced node {} (lease epoch {}) reached disk {} at {:?}: the lease fence let it through",
                    w.node, w.epoch, w.disk, w.at
                ),
            ));
        }
        let expels = cluster.expels.lock();
        if let Some((n, Err(e))) = expels.iter().find(|(_, r)| r.is_err()) {
            return Err((None, format!("expel of node {n}: {e}")));
        }
    }
    state.lock().context = "done".into();
    Ok(())
}

/// An expelled node, back from its pause or partition and not yet rejoined, must
/// refuse every operation (its mount returns errors until it mounts again): a read it
/// answered from its cache could be stale (its tokens were released by its recovery),
/// a write could not reach the disks. A few operations on paths the model knows.
fn probe_zombie(
    cluster: &SimCluster,
    model: &Model,
    node: u32,
    rng: &mut SimRng,
) -> Result<(), String> {
    let Some(fs) = cluster.zombie(node) else {
        return Ok(());
    };
    let paths = model.all_paths();
    for _ in 0..3 {
        let (path, i) = &paths[rng.below(paths.len() as u64) as usize];
        let op = read_whole(path, model.get(*i));
        for op in [op, Op::Stat { path: path.clone() }] {
            if op == (Op::Stat { path: Vec::new() }) {
                continue;
            }
            let outcome = ops::exec(&fs, &op);
            if outcome.is_ok() {
                return Err(format!(
                    "node {node} was expelled and has not rejoined, yet its mount answered {op}: {}; an expelled node's mount must refuse every operation (its tokens were released: what it answers from its cache may be stale)",
                    show_outcome(&outcome)
                ));
            }
        }
    }
    Ok(())
}

/// A whole-cluster crash now: every node's log replayed onto a copy of the disks in
/// node order, and onto another copy in reverse order, must leave the same bytes. Each
/// node revokes in its log what it wrote in place before a token left it, so at most
/// one log may replay an image of any structure (docs/coherence.md section 7); an
/// image replayed from two logs would make the order matter.
fn replay_orders_agree(cluster: &SimCluster, nodes: u32) -> Result<(), String> {
    use mako_disk::Disk;
    // The disks as they are now, shared by both replays; each replay writes to an
    // overlay of its own (copying the whole disks twice, then comparing them byte by
    // byte, was most of a cheap seed's system time).
    // (Taking them costs nothing: nothing writes the disks before they are dropped. A
    // copy of every disk here was half of a cheap fault seed's time.)
    let images: Vec<Arc<crate::disk::Pages>> = cluster.disks.iter().map(|d| d.image()).collect();
    let replayed = |order: &[u32]| -> Result<Vec<Arc<Overlay>>, String> {
        let copies: Vec<Arc<Overlay>> = images
            .iter()
            .enumerate()
            .map(|(i, img)| Arc::new(Overlay::new(format!("d{i}"), img.clone())))
            .collect();
        let dyn_disks: Vec<Arc<dyn Disk>> =
            copies.iter().map(|d| d.clone() as Arc<dyn Disk>).collect();
        let (desc, found) = mako_fs::mount::find_descriptor(dyn_disks)
            .map_err(|e| format!("the crashed disks have no descriptor: {e}"))?;
        let nsd = mako_disk::LocalNsd::new(found, 16);
        for &n in order {
            mako_fs::recovery::replay(&nsd, &desc, n)
                .map_err(|e| format!("replay of node {n}'s log (order {order:?}): {e}"))?;
        }
        Ok(copies)
    };
    let forward: Vec<u32> = (0..nodes).collect();
    let backward: Vec<u32> = (0..nodes).rev().collect();
    let (a, b) = (replayed(&forward)?, replayed(&backward)?);
    for (disk, (x, y)) in a.iter().zip(&b).enumerate() {
        if let Some(byte) = x.first_difference(y) {
            return Err(format!(
                "after a whole-cluster crash, the logs replayed in order {forward:?} and {backward:?} \
                 leave different bytes on disk d{disk} from byte {byte} (sector {}): an image one node \
                 revoked (or should have) was replayed over another node's",
                byte / 512
            ));
        }
    }
    Ok(())
}

/// A disk that reads `base` and keeps its writes to itself, a page at a time: a copy
/// of a disk that costs what is written to it.
struct Overlay {
    name: String,
    base: Arc<crate::disk::Pages>,
    pages: Mutex<std::collections::BTreeMap<u64, Box<[u8]>>>,
}

impl Overlay {
    const PAGE: u64 = 4096;

    fn new(name: String, base: Arc<crate::disk::Pages>) -> Overlay {
        Overlay {
            name,
            base,
            pages: Mutex::new(Default::default()),
        }
    }

    fn check(&self, op: &'static str, offset: u64, len: usize) -> Result<(), mako_disk::DiskError> {
        match offset.checked_add(len as u64) {
            Some(end) if end <= self.base.len() as u64 => Ok(()),
            _ => Err(mako_disk::DiskError::OutOfRange {
                disk: self.name.clone(),
                op,
                offset,
                len,
                size: self.base.len() as u64,
            }),
        }
    }

    fn page_of<'a>(
        &'a self,
        pages: &'a std::collections::BTreeMap<u64, Box<[u8]>>,
        page: u64,
    ) -> &'a [u8] {
        match pages.get(&page) {
            Some(p) => p,
            None => {
                let at = (page * Self::PAGE) as usize;
                &self.base[at..(at + Self::PAGE as usize).min(self.base.len())]
            }
        }
    }

    /// The first byte at which `self` and `other` (overlays of the same base) differ.
    fn first_difference(&self, other: &Overlay) -> Option<u64> {
        let (mine, theirs) = (self.pages.lock(), other.pages.lock());
        let touched: std::collections::BTreeSet<u64> =
            mine.keys().chain(theirs.keys()).copied().collect();
        touched.into_iter().find_map(|page| {
            let (x, y) = (self.page_of(&mine, page), other.page_of(&theirs, page));
            x.iter()
                .zip(y)
                .position(|(p, q)| p != q)
                .map(|i| page * Self::PAGE + i as u64)
        })
    }
}

impl mako_disk::Disk for Overlay {
    fn name(&self) -> &str {
        &self.name
    }
    fn size_bytes(&self) -> u64 {
        self.base.len() as u64
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<(), mako_disk::DiskError> {
        self.check("read", offset, buf.len())?;
        let pages = self.pages.lock();
        let mut done = 0usize;
        while done < buf.len() {
            let at = offset + done as u64;
            let (page, within) = (at / Self::PAGE, (at % Self::PAGE) as usize);
            let src = self.page_of(&pages, page);
            let n = (src.len() - within).min(buf.len() - done);
            buf[done..done + n].copy_from_slice(&src[within..within + n]);
            done += n;
        }
        Ok(())
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> Result<(), mako_disk::DiskError> {
        self.check("write", offset, buf.len())?;
        let mut pages = self.pages.lock();
        let mut done = 0usize;
        while done < buf.len() {
            let at = offset + done as u64;
            let (page, within) = (at / Self::PAGE, (at % Self::PAGE) as usize);
            if !pages.contains_key(&page) {
                let copy: Box<[u8]> = self.page_of(&pages, page).into();
                pages.insert(page, copy);
            }
            let dst = pages.get_mut(&page).expect("just made");
            let n = (dst.len() - within).min(buf.len() - done);
            dst[within..within + n].copy_from_slice(&buf[done..done + n]);
            done += n;
        }
        Ok(())
    }
    fn sync(&self) -> Result<(), mako_disk::DiskError> {
        Ok(())
    }
}

/// The background work of one step, at random nodes and times: what the daemon's
/// worker threads would be doing, and (`steal`) the token thief. Drawn from its own
/// stream, so switching background work or the thief leaves the operations alone.
fn background_for(
    config: &SeedConfig,
    rng: &mut SimRng,
    model: &Model,
    steal_allowed: bool,
) -> Vec<(u32, Background, u64)> {
    let nodes = config.cluster.nodes;
    let prefetch = config.prefetch || config.cluster.thief == Thief::Off;
    let mut out = Vec::new();
    if rng.chance(config.background_probability) {
        for _ in 0..1 + rng.below(2) {
            let node = rng.below(nodes as u64) as u32;
            let work = match rng.below(20) {
                0..=6 => Background::WriteBehind(1 + rng.below(8) as usize),
                7..=9 => Background::Commit,
                10..=11 => Background::Sync,
                12..=14 => Background::Checkpoint,
                15..=16 => Background::Evict,
                17..=18 => Background::ReleaseTokens,
                _ if prefetch => Background::Prefetch(4),
                _ => Background::WriteBehind(2),
            };
            out.push((node, work, rng.below(300)));
        }
    }
    if steal_allowed && config.cluster.thief != Thief::Off && rng.chance(config.steal_probability) {
        let block = config.cluster.block_bytes as u64;
        let inode = 4096;
        if let Some(s) = steal(model, rng, block, inode, config.cluster.thief) {
            let delay = rng.below(300);
            out.push((0, s, delay));
        }
    }
    out
}

/// What the token thief takes this time: the data token of a random file, whole or
/// (`Thief::Ranges`) sometimes a few blocks of it.
fn steal(
    model: &Model,
    rng: &mut SimRng,
    block: u64,
    inode_bytes: u64,
    thief: Thief,
) -> Option<Background> {
    let files: Vec<(u64, u64)> = model
        .inodes
        .values()
        .filter(|i| i.kind == Kind::File)
        .filter(|i| thief != Thief::Large || i.size() > inode_bytes)
        .filter_map(|i| i.real.map(|r| (r, i.size())))
        .collect();
    if files.is_empty() {
        return None;
    }
    let (ino, size) = files[rng.below(files.len() as u64) as usize];
    if thief != Thief::Ranges || rng.chance(0.2) {
        return Some(Background::Steal {
            ino,
            start: 0,
            end: u64::MAX,
        });
    }
    let blocks = size.div_ceil(block).max(1);
    let first = rng.below(blocks);
    let n = 1 + rng.below(3);
    Some(Background::Steal {
        ino,
        start: first * block,
        end: (first + n) * block,
    })
}

/// The operation that reads object `path` whole: a directory listed, a file read
/// from 0 to its end, a symlink's target.
fn read_whole(path: &Path, m: &MInode) -> Op {
    match m.kind {
        Kind::Dir => Op::Readdir { path: path.clone() },
        Kind::File => Op::Read {
            path: path.clone(),
            offset: 0,
            len: m.size().max(1),
        },
        Kind::Symlink => Op::Readlink { path: path.clone() },
    }
}

/// Every node reads everything back: each directory listed, each name stat'ed, each
/// file read whole. Only reads: they commute.
fn read_back(model: &Model, nodes: u32) -> Vec<Planned> {
    let mut out = Vec::new();
    for node in 0..nodes {
        for (path, i) in model.all_paths() {
            let op = read_whole(&path, model.get(i));
            out.push(Planned {
                node,
                op,
                delay_micros: 0,
                observer: false,
            });
            if !path.is_empty() {
                out.push(Planned {
                    node,
                    op: Op::Stat { path },
                    delay_micros: 0,
                    observer: false,
                });
            }
        }
    }
    out
}

type Slot = Option<(Outcome, Timestamp, Timestamp)>;

/// `MAKO_SIM_VERBOSE=1`: print every operation and its outcome (to replay a seed).
fn verbose() -> bool {
    static V: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *V.get_or_init(|| std::env::var("MAKO_SIM_VERBOSE").is_ok_and(|v| v == "1"))
}

#[allow(clippy::too_many_arguments)]
fn run_step(
    cluster: &Arc<SimCluster>,
    config: &SeedConfig,
    step: u32,
    plan: &[Planned],
    background: &[(u32, Background, u64)],
    after: &[(u32, Background, u64)],
    crash: Option<CrashPlan>,
    model: &mut Model,
    state: &Mutex<DriverState>,
) -> DriveResult {
    let (checks, verify) = (config.checks, config.verify);
    let sim = crate::sched::current().expect("the driver runs in the simulation");
    let step_start = now(cluster);
    let crashed = crash.map(|c| c.node);
    {
        let mut s = state.lock();
        s.step = Some(step);
        s.context = format!(
            "step {step}: {}{}",
            plan.iter()
                .map(|p| format!(
                    "[node {}] {}{}",
                    p.node,
                    if p.observer { "(observer) " } else { "" },
                    p.op
                ))
                .collect::<Vec<_>>()
                .join("; "),
            background
                .iter()
                .map(|(n, w, _)| format!("; [node {n}] background {w:?}"))
                .chain(
                    after
                        .iter()
                        .map(|(n, w, _)| format!("; [node {n}] then background {w:?}"))
                )
                .collect::<String>()
        );
    }
    let results: Arc<Mutex<Vec<Slot>>> = Arc::new(Mutex::new(vec![None; plan.len()]));
    // When each operation's answer was fixed (`Core::answer_hook`): None if no
    // operation of it passed its final fence check.
    let answered: Arc<Mutex<Vec<Option<Timestamp>>>> = Arc::new(Mutex::new(vec![None; plan.len()]));
    let bg_errors: Arc<Mutex<Vec<(u32, String)>>> = Arc::new(Mutex::new(Vec::new()));
    // Calls each node made that lost a message before the step (`NetConfig::
    // loss_probability`): a node whose calls lost some in the step may see its
    // operations fail, and what failed may or may not have taken effect.
    let nodes = config.cluster.nodes;
    // Node `nodes` is the token thief (`ClusterConfig::thief`): its calls lose
    // messages too, and its steals' errors are counted as its own.
    let lost_before: Vec<u64> = (0..=nodes)
        .map(|n| cluster.net.lost_by(mako_rt::NodeId(n)))
        .collect();
    let lossy = |n: u32| cluster.net.lost_by(mako_rt::NodeId(n)) > lost_before[n as usize];
    // Who does background work: the token thief steals, the node does the rest.
    let worker = move |node: u32, work: &Background| match work {
        Background::Steal { .. } => nodes,
        _ => node,
    };
    let pending = Arc::new(AtomicU64::new(
        (plan.len() + background.len() + crash.is_some() as usize) as u64,
    ));
    // The crash, then (after a detection delay) the recovery by a survivor.
    let recovery: Arc<Mutex<Option<Result<String, String>>>> = Arc::new(Mutex::new(None));
    if let Some(c) = crash.filter(|c| c.kind.needs_leases()) {
        let (cluster, pending, recovery) = (cluster.clone(), pending.clone(), recovery.clone());
        sim.spawn(format!("s{step}-{:?}-n{}", c.kind, c.node), move || {
            mako_diag::sched::sleep(Duration::from_micros(c.delay_micros));
            match c.kind {
                FaultKind::Pause | FaultKind::ManagerPause => cluster.pause(c.node),
                FaultKind::BadDisk => {
                    cluster.break_disks(c.node);
                    // Its next commit (if anything is dirty) and checkpoint (a sync,
                    // then the log's header) fail: the file system panics.
                    let _ = cluster.background(c.node, Background::Commit);
                    let _ = cluster.background(c.node, Background::Checkpoint);
                }
                _ => cluster.partition(c.node),
            }
            // The manager notices, expels it and has a survivor recover it (the expel
            // hook); only then does it run again, or its partition heal.
            let expelled = |cl: &SimCluster| cl.expels.lock().iter().any(|(n, _)| *n == c.node);
            let mut bad_disk_unnoticed = None;
            if c.kind == FaultKind::BadDisk {
                // A node whose file system did not panic goes on renewing its lease:
                // give up after many leases rather than wait for ever.
                let leases = cluster.leases.as_ref().expect("BadDisk needs leases");
                let limit = (leases.times.lease + leases.times.missed_ping) * 10;
                let until = mako_rt::Clock::monotonic(cluster.clock.as_ref()) + limit;
                while !expelled(&cluster)
                    && mako_rt::Clock::monotonic(cluster.clock.as_ref()) < until
                {
                    mako_diag::sched::sleep(leases.times.renew_interval() / 2);
                }
                if !expelled(&cluster) {
                    bad_disk_unnoticed = Some(format!(
                        "node {}'s writes fail (its path to the disks went bad) and its log write failed, yet {limit:?} later it was not expelled: its file system did not panic (panicked: {}), it keeps its tokens and stays in the cluster",
                        c.node,
                        cluster.panicked(c.node)
                    ));
                }
            } else {
                mako_diag::sched::wait_until("expel and recovery", || expelled(&cluster));
            }
            match c.kind {
                FaultKind::Pause | FaultKind::ManagerPause => cluster.resume(c.node),
                FaultKind::BadDisk => {}
                _ => cluster.heal(c.node),
            }
            let r = match bad_disk_unnoticed {
                Some(e) => Some(Err(e)),
                None => cluster
                    .expels
                    .lock()
                    .iter()
                    .find(|(n, _)| *n == c.node)
                    .map(|(_, r)| r.clone()),
            };
            *recovery.lock() = r;
            pending.fetch_sub(1, Ordering::SeqCst);
        });
    }
    if let Some(c) = crash.filter(|c| !c.kind.needs_leases()) {
        let (cluster, pending, recovery) = (cluster.clone(), pending.clone(), recovery.clone());
        let fault = config.recovery_fault;
        sim.spawn(format!("s{step}-crash-n{}", c.node), move || {
            mako_diag::sched::sleep(Duration::from_micros(c.delay_micros));
            if c.kind == FaultKind::ManagerCrash {
                let successor = cluster.crash_manager(fault);
                let rounds = cluster.rebuild_manager();
                if verbose() {
                    eprintln!(
                        "  step {step}: node {successor} took the token manager over from node {}, {} report(s) in {rounds} round(s)",
                        c.node,
                        cluster.manager().stats().reports
                    );
                }
            } else {
                cluster.crash(c.node);
            }
            mako_diag::sched::sleep(CRASH_DETECTION);
            let r = cluster
                .recover(c.by, c.node, fault)
                .map(|r| r.map_or_else(|| format!("broken recovery {fault:?}"), |r| r.summary()))
                .map_err(|e| format!("node {} could not recover node {}: {e}", c.by, c.node));
            *recovery.lock() = Some(r);
            pending.fetch_sub(1, Ordering::SeqCst);
        });
    }
    for (i, p) in plan.iter().enumerate() {
        let Some(fs) = cluster.fs(p.node) else {
            return Err((Some(step), format!("node {} is not mounted", p.node)));
        };
        let (cluster, results, answered, pending, p) = (
            cluster.clone(),
            results.clone(),
            answered.clone(),
            pending.clone(),
            p.clone(),
        );
        sim.spawn_in(
            Some(p.node),
            format!("s{step}-n{}-op{i}", p.node),
            move || {
                mako_diag::sched::sleep(Duration::from_micros(p.delay_micros));
                crate::cluster::ANSWERED.with(|a| a.set(None));
                let start = now(&cluster);
                let outcome = ops::exec(&fs, &p.op);
                let end = now(&cluster);
                answered.lock()[i] = crate::cluster::ANSWERED.with(|a| a.take());
                results.lock()[i] = Some((outcome, start, end));
                pending.fetch_sub(1, Ordering::SeqCst);
            },
        );
    }
    for (node, work, delay) in background.iter().copied() {
        let (cluster, errors, pending) = (cluster.clone(), bg_errors.clone(), pending.clone());
        let group = (!matches!(work, Background::Steal { .. })).then_some(node);
        sim.spawn_in(group, format!("s{step}-n{node}-{work:?}"), move || {
            mako_diag::sched::sleep(Duration::from_micros(delay));
            if let Err(e) = cluster.background(node, work) {
                // The crashed node's work fails once it has crashed: what it did not
                // finish is lost with it.
                if crashed != Some(node) || matches!(work, Background::Steal { .. }) {
                    errors.lock().push((
                        worker(node, &work),
                        format!("node {node}: background {work:?} failed: {e}"),
                    ));
                }
            }
            pending.fetch_sub(1, Ordering::SeqCst);
        });
    }
    mako_diag::sched::wait_until("step", || pending.load(Ordering::SeqCst) == 0);
    for (node, work, _) in after {
        if let Err(e) = cluster.background(*node, *work) {
            bg_errors.lock().push((
                worker(*node, work),
                format!("node {node}: background {work:?} failed: {e}"),
            ));
        }
    }
    if verbose() {
        for (n, w, _) in background.iter().chain(after) {
            eprintln!("  step {step} [node {n}] background {w:?}");
        }
    }
    // Background work of a node that lost messages may fail (what it did not finish
    // stays to do: later steps and the final read-back check that nothing was lost).
    if let Some((_, e)) = bg_errors.lock().iter().find(|(n, _)| !lossy(*n)) {
        return Err((Some(step), e.clone()));
    }
    if crash.is_some() {
        match recovery.lock().take() {
            Some(Ok(summary)) => {
                if verbose() {
                    eprintln!("  step {step}: {summary}");
                }
            }
            Some(Err(e)) => return Err((Some(step), e)),
            None => return Err((Some(step), "the recovery never finished".into())),
        }
    }
    // Observers are checked against the state before the step and after it; the
    // others, which commute, against the model as it goes.
    let before = plan.iter().any(|p| p.observer).then(|| model.clone());
    model.begin_step(step as u64);
    let results = std::mem::take(&mut *results.lock());
    // The operations of a step commute, so any order of checking is right; creations
    // go last, because a new inode may reuse the number of one freed in this step.
    let mut order: Vec<usize> = (0..plan.len())
        .filter(|i| !plan[*i].observer && Some(plan[*i].node) != crashed)
        .collect();
    order.sort_by_key(|i| {
        matches!(
            plan[*i].op,
            Op::Create { .. } | Op::Mkdir { .. } | Op::Symlink { .. }
        )
    });
    // An operation that failed on a node that lost messages in the step is uncertain:
    // checked by running it again (`check_uncertain`), before the observers, which may
    // race it. An observer that failed there is not checked.
    let failed_lossy =
        |i: usize| lossy(plan[i].node) && results[i].as_ref().is_some_and(|(o, _, _)| o.is_err());
    let uncertain: Vec<usize> = order.iter().copied().filter(|i| failed_lossy(*i)).collect();
    order.retain(|i| !failed_lossy(*i));
    let observers: Vec<usize> = (0..plan.len())
        .filter(|i| plan[*i].observer && !failed_lossy(*i))
        .collect();
    let first_observer = order.len();
    order.extend(&observers);
    // A paused or partitioned node's operations whose answer was fixed after it was
    // expelled must have failed: it no longer held its tokens, nor could it write. The
    // answer is fixed at the operation's last final fence check (`Core::answer_hook`,
    // in `op::run`: after everything it read or changed, its holds still kept): a
    // pause between that check and the caller seeing the answer (the node stopped
    // right after it) does not make the answer stale (2-node seeds 97 and 209). An
    // operation that succeeded without passing any final fence check (none ran, or
    // the node's fence is broken) is judged by its end.
    if let Some(c) = crash.filter(|c| c.kind.needs_leases()) {
        let expelled_at = cluster
            .leases
            .as_ref()
            .and_then(|l| l.record(c.node).expelled.map(|(at, _)| at));
        if let Some(at) = expelled_at {
            let at = nanos(mako_fs::core::timestamp(crate::SIM_EPOCH + at));
            let answered = answered.lock();
            for ((p, r), answered) in plan.iter().zip(&results).zip(answered.iter()) {
                if let (true, Some((outcome @ Ok(_), _, end))) = (p.node == c.node, r) {
                    let answer = answered.unwrap_or(*end);
                    if verbose() && nanos(*end) > at {
                        eprintln!(
                            "  step {step} [node {}] {} ended {} ns after the expel, its answer fixed {} ns before it",
                            p.node,
                            p.op,
                            nanos(*end) - at,
                            answered.map_or("(no final fence check)".into(), |a| {
                                (at - nanos(a)).to_string()
                            })
                        );
                    }
                    if nanos(answer) > at && verify {
                        return Err((
                            Some(step),
                            format!(
                                "node {} was expelled ({:?}) during {}, which then succeeded with an answer fixed after the expel ({}): {}",
                                c.node,
                                c.kind,
                                p.op,
                                if answered.is_some() {
                                    "its final fence check passed after it"
                                } else {
                                    "it ended after it, no final fence check passed"
                                },
                                show_outcome(outcome)
                            ),
                        ));
                    }
                }
            }
        }
    }
    let mut results: Vec<Option<Slot>> = results.into_iter().map(Some).collect();
    let mut s = state.lock();
    for (k, i) in order.into_iter().enumerate() {
        if k == first_observer && !uncertain.is_empty() {
            drop(s);
            run_again_after_loss(cluster, plan, &uncertain, step, step_start, model, state)?;
            s = state.lock();
        }
        let p = &plan[i];
        let r = results[i].take().flatten();
        let (outcome, start, end) = r.expect("every operation finished");
        s.operations += 1;
        s.digest = mix(s.digest, hash_outcome(&outcome));
        let window = Window {
            lo: nanos(start),
            hi: nanos(end),
        };
        if verbose() {
            eprintln!(
                "  step {step} [node {}] {}{} -> {}",
                p.node,
                if p.observer { "(observer) " } else { "" },
                p.op,
                show_outcome(&outcome)
            );
        }
        let verdict = if p.observer {
            // Read-only: checked on copies, so neither model changes.
            let pre = before.as_ref().expect("a copy when there are observers");
            match pre.clone().check_and_apply(&p.op, &outcome, window) {
                Ok(()) => Ok(()),
                Err(pre_why) => model.clone().check_and_apply(&p.op, &outcome, window).map_err(
                    |post_why| {
                        format!(
                            "it raced one change and saw neither the state before it nor the state after it (not atomic?): against the state before the step: {pre_why}; after: {post_why}"
                        )
                    },
                ),
            }
        } else {
            model.check_and_apply(&p.op, &outcome, window)
        };
        if let (Err(why), true) = (verdict, verify) {
            return Err((
                Some(step),
                format!(
                    "node {}: {}: {why}\n  outcome: {}\n  step: {}",
                    p.node,
                    p.op,
                    show_outcome(&outcome),
                    s.context
                ),
            ));
        }
    }
    drop(s);
    if observers.is_empty() && !uncertain.is_empty() {
        run_again_after_loss(cluster, plan, &uncertain, step, step_start, model, state)?;
    }
    // The crashed node's operations of this step may or may not have taken effect:
    // each runs again on the survivor, checked by `check_uncertain`.
    if let Some(c) = crash {
        for p in plan.iter().filter(|p| p.node == c.node) {
            state.lock().context = format!(
                "step {step}: node {} runs again what crashed node {} was doing: {}",
                c.by, c.node, p.op
            );
            let fs = cluster
                .fs(c.by)
                .ok_or_else(|| (Some(step), format!("node {} is not mounted", c.by)))?;
            // It may have taken effect at any time since the step began.
            let r = check_uncertain(cluster, &fs, &p.op, step_start, model);
            if verbose() {
                eprintln!(
                    "  step {step} [node {}] again for failed node {}: {} -> {r:?}",
                    c.by, c.node, p.op
                );
            }
            let mut s = state.lock();
            s.operations += 1;
            if let (Err(why), true) = (r, verify) {
                return Err((
                    Some(step),
                    format!(
                        "node {} crashed during {}; run again on node {} after the recovery: {why}",
                        c.node, p.op, c.by
                    ),
                ));
            }
        }
    }
    let violations = if verify {
        crate::invariants::check(cluster, checks)
    } else {
        Vec::new()
    };
    if !violations.is_empty() {
        return Err((
            Some(step),
            format!(
                "invariant violated after the step: {}\n  step: {}",
                violations.join("\n  "),
                state.lock().context
            ),
        ));
    }
    Ok(())
}

/// The operations of a step (`uncertain`, indices into `plan`) that failed on nodes
/// that lost messages meanwhile: each may or may not have taken effect (a lost reply),
/// so each runs again on its node and is checked by `check_uncertain`. A run again
/// that fails while its node loses messages again is tried again (a few times).
fn run_again_after_loss(
    cluster: &SimCluster,
    plan: &[Planned],
    uncertain: &[usize],
    step: u32,
    step_start: Timestamp,
    model: &mut Model,
    state: &Mutex<DriverState>,
) -> DriveResult {
    for &i in uncertain {
        let p = &plan[i];
        let node = mako_rt::NodeId(p.node);
        let fs = cluster
            .fs(p.node)
            .ok_or_else(|| (Some(step), format!("node {} is not mounted", p.node)))?;
        state.lock().context = format!(
            "step {step}: node {} runs again what failed while it lost messages: {}",
            p.node, p.op
        );
        let mut tries = 0;
        loop {
            let lost = cluster.net.lost_by(node);
            let r = check_uncertain(cluster, &fs, &p.op, step_start, model);
            if verbose() {
                eprintln!(
                    "  step {step} [node {}] again after a lost message: {} -> {r:?}",
                    p.node, p.op
                );
            }
            state.lock().operations += 1;
            match r {
                Ok(()) => break,
                Err(_) if cluster.net.lost_by(node) > lost && tries < 8 => tries += 1,
                Err(why) => {
                    return Err((
                        Some(step),
                        format!(
                            "node {} lost a message during {} (which failed); run again: {why}",
                            p.node, p.op
                        ),
                    ))
                }
            }
        }
    }
    Ok(())
}

/// Simulated time between a node's crash and its recovery by a survivor (the real
/// cluster's failure detection and expel; issue 14 items 1 and 2).
const CRASH_DETECTION: Duration = Duration::from_millis(2);

/// Check `op`, which a crashed node was running when it crashed (it may or may not
/// have taken effect, durably), by running it again on survivor `fs` after the
/// recovery, and apply it to the model. Run again, an operation that had taken effect
/// either does the same again (a write, a truncate, a chmod: the outcome is checked
/// as usual) or fails because it had (a create, a link, a mkdir or a symlink finds its
/// name: EEXIST; an unlink, rmdir or rename no longer finds its source: ENOENT); in
/// the second case its success is what the model takes, with the attributes the
/// survivor now sees. Either way the model then matches the disks exactly, and every
/// later step and the final read-back check everything else, durable state included.
fn check_uncertain(
    cluster: &SimCluster,
    fs: &mako_fs::fs::FileSystem,
    op: &Op,
    lo: Timestamp,
    model: &mut Model,
) -> Result<(), String> {
    let outcome = ops::exec(fs, op);
    let window = Window {
        lo: nanos(lo),
        hi: nanos(now(cluster)),
    };
    let mut again = model.clone();
    let first = match again.check_and_apply(op, &outcome, window) {
        Ok(()) => {
            *model = again;
            return Ok(());
        }
        Err(why) => why,
    };
    if outcome.is_ok() {
        return Err(first);
    }
    // Had it taken effect before the crash? Then it succeeded, with these attributes.
    let named = match op {
        Op::Create { parent, name, .. }
        | Op::Mkdir { parent, name, .. }
        | Op::Symlink { parent, name, .. }
        | Op::Link { parent, name, .. } => {
            let mut path = parent.clone();
            path.push(name.clone());
            Some(path)
        }
        _ => None,
    };
    let success = match named {
        Some(path) => ops::exec(fs, &Op::Stat { path }),
        None => Ok(Value::Unit),
    };
    let mut took_effect = model.clone();
    match took_effect.check_and_apply(op, &success, window) {
        Ok(()) => {
            *model = took_effect;
            Ok(())
        }
        Err(why) => Err(format!(
            "{} again: {first}; nor had it taken effect before the crash: {why}",
            show_outcome(&outcome)
        )),
    }
}

/// Seeds to run, from the environment: `MAKO_SIM_SEEDS` (how many), `MAKO_SIM_SEED_BASE`
/// (the first), `MAKO_SIM_NODES`, `MAKO_SIM_JOBS` (seeds at once), `MAKO_SIM_LONG=1`
/// (the long local mode: 10x the seeds).
#[derive(Clone, Debug)]
pub struct SeedPlan {
    pub base: u64,
    pub count: u64,
    pub nodes: u32,
    pub jobs: usize,
}

fn env_flag(name: &str) -> bool {
    std::env::var(name).is_ok_and(|v| v == "1")
}

fn env_u64(name: &str) -> Option<u64> {
    let v = std::env::var(name).ok()?;
    match v.trim().parse() {
        Ok(n) => Some(n),
        Err(_) => panic!("{name}={v:?} is not a number"),
    }
}

impl SeedPlan {
    pub fn from_env(default_count: u64, default_nodes: u32) -> SeedPlan {
        let long = std::env::var("MAKO_SIM_LONG").is_ok_and(|v| v == "1");
        let count = env_u64("MAKO_SIM_SEEDS").unwrap_or(if long {
            default_count * 10
        } else {
            default_count
        });
        SeedPlan {
            base: env_u64("MAKO_SIM_SEED_BASE").unwrap_or(1),
            count,
            nodes: env_u64("MAKO_SIM_NODES").map_or(default_nodes, |n| n as u32),
            jobs: env_u64("MAKO_SIM_JOBS").map_or(2, |n| n.max(1) as usize),
        }
    }
}

/// Totals of a run of many seeds.
#[derive(Clone, Debug, Default)]
pub struct RunSummary {
    pub seeds: u64,
    pub operations: u64,
    pub wall: Duration,
    pub simulated: Duration,
    /// The failures, by seed (the run stops taking new seeds after the first).
    pub failures: Vec<SeedFailure>,
}

impl RunSummary {
    pub fn seeds_per_minute(&self) -> f64 {
        self.seeds as f64 * 60.0 / self.wall.as_secs_f64().max(1e-9)
    }

    /// Prints what test `test` of `tests/<file>.rs` ran (`what`: the seeds' kind, e.g.
    /// "node(s) with a crash and a recovery each"), then panics with the first failure
    /// and the command that replays its seed.
    pub fn report(&self, file: &str, test: &str, nodes: u32, what: &str, ignored: bool) {
        eprintln!(
            "{test}: {} seeds of {nodes} {what}, {} operations, {:.1} s wall ({:.0} seeds/min), {:.2} s simulated",
            self.seeds,
            self.operations,
            self.wall.as_secs_f64(),
            self.seeds_per_minute(),
            self.simulated.as_secs_f64()
        );
        if let Some(f) = self.failures.first() {
            panic!(
                "{f}\n\nreplay: {}",
                replay_command_in(file, test, nodes, f.seed, ignored)
            );
        }
    }
}

/// Run `plan`'s seeds, `jobs` at once (each seed is its own simulation; they share
/// nothing), with `config` making each seed's configuration. Stops starting seeds at
/// the first failure when `stop_at_failure`.
pub fn run_seeds(
    plan: &SeedPlan,
    stop_at_failure: bool,
    config: impl Fn(u64) -> SeedConfig + Sync,
) -> RunSummary {
    let started = Instant::now();
    let next = AtomicU64::new(plan.base);
    let stop = AtomicBool::new(false);
    let summary = Mutex::new(RunSummary::default());
    std::thread::scope(|s| {
        for _ in 0..plan.jobs {
            s.spawn(|| loop {
                if stop.load(Ordering::SeqCst) {
                    return;
                }
                let seed = next.fetch_add(1, Ordering::SeqCst);
                if seed >= plan.base + plan.count {
                    return;
                }
                let r = run_seed(&config(seed));
                let mut sm = summary.lock();
                sm.seeds += 1;
                match r {
                    Ok(rep) => {
                        sm.operations += rep.operations;
                        sm.simulated += rep.sim.elapsed;
                    }
                    Err(f) => {
                        sm.failures.push(f);
                        if stop_at_failure {
                            stop.store(true, Ordering::SeqCst);
                        }
                    }
                }
            });
        }
    });
    let mut sm = summary.into_inner();
    sm.wall = started.elapsed();
    sm.failures.sort_by_key(|f| f.seed);
    sm
}

/// The command that replays `seed` of the test `test` in `tests/cluster.rs`, with the
/// `MAKO_SIM_*` settings of this run that change what a seed does.
pub fn replay_command(test: &str, nodes: u32, seed: u64, ignored: bool) -> String {
    replay_command_in("cluster", test, nodes, seed, ignored)
}

/// `replay_command` for test `test` of the test file `file` (`tests/<file>.rs`).
pub fn replay_command_in(file: &str, test: &str, nodes: u32, seed: u64, ignored: bool) -> String {
    let mut env = String::new();
    for name in [
        "MAKO_SIM_THIEF",
        "MAKO_SIM_SKIP_CHECKS",
        "MAKO_SIM_PREFETCH",
        "MAKO_SIM_CONCURRENT_RELEASE",
        "MAKO_SIM_STEAL_CONCURRENT",
        "MAKO_SIM_NO_CHECKS",
        "MAKO_SIM_CRASH",
        "MAKO_SIM_STEPS",
        "MAKO_SIM_CROWD_NODES",
    ] {
        if let Ok(v) = std::env::var(name) {
            env.push_str(&format!("{name}={v} "));
        }
    }
    format!(
        "{env}MAKO_SIM_NODES={nodes} MAKO_SIM_SEED_BASE={seed} MAKO_SIM_SEEDS=1 MAKO_SIM_JOBS=1 cargo test --release -p mako-sim --test {file} -- --exact {test} --nocapture{}",
        if ignored { " --ignored" } else { "" }
    )
}
