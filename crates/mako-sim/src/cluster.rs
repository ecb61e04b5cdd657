//! A simulated cluster: one small Mako file system formatted on `SimDisk`s, the token
//! manager on node 0, and N nodes mounted with `mako_fs::mount::mount_node` over the
//! simulated network and clock. The daemon's background threads do not run here;
//! the simulation drives their work itself (`Background`) at seeded times, so every
//! write-back, commit, checkpoint and eviction is part of the replayable schedule.

use crate::clock::{SimClock, SIM_EPOCH};
use crate::disk::{DiskLatency, NodeDisk, SimDisk, WriteFaults};
use crate::net::{NetConfig, SimNet};
use crate::sched::Sim;
use mako_disk::Disk;
use mako_fs::core::{Core, FsConfig, INODE_CACHE_KEY};
use mako_fs::env::NodeEnv;
use mako_fs::error::{FsError, FsResult};
use mako_fs::fs::FileSystem;
use mako_fs::mkfs::{DiskMeta, MkfsParams, Reproducible};
use mako_fs::mount::Mounted;
use mako_rt::{NodeId, ServiceId};
use mako_token::{
    ByteRange, ManagerMap, ResourceId, ResourceKind, TokenClient, TokenClientLimits, TokenManager,
    TokenManagerLimits, TokenMode,
};
use parking_lot::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

thread_local! {
    /// When the operation running on this thread (a runner's operation task) last had
    /// its answer fixed (`mako_fs::core::Core::answer_hook`: its final fence check
    /// passed, its holds kept), in simulated wall time.
    pub static ANSWERED: std::cell::Cell<Option<mako_format::inode::Timestamp>> =
        const { std::cell::Cell::new(None) };
}

/// The shape of a simulated cluster.
#[derive(Clone, Debug)]
pub struct ClusterConfig {
    pub nodes: u32,
    pub disks: u32,
    pub disk_bytes: u64,
    pub block_bytes: u32,
    pub log_bytes: u64,
    pub pagepool_bytes: u64,
    /// Small, so that eviction and the stat cache's token releases happen.
    pub max_files_to_cache: usize,
    pub max_stat_cache: usize,
    pub net: NetConfig,
    pub disk_latency: DiskLatency,
    /// The token thief: a phantom node (number `nodes`, never mounted) that takes
    /// data tokens away from the nodes as another node's write would, and gives them
    /// back at once. It makes revokes happen even with one node.
    pub thief: Thief,
    /// Leases and the lease fence (`crate::lease`): every node renews a lease with the
    /// cluster manager (node 0 first, elected by the quorum), which expels a node that
    /// stops renewing; every mount's disks are behind its node's lease. None: no
    /// leases (a crash is detected by the test).
    pub leases: Option<mako_cluster::lease::LeaseTimes>,
    /// TEST ONLY: false turns the nodes' own lease fence off (the checker's test).
    pub lease_fence: bool,
    /// TEST ONLY: false lets the cluster manager grant leases without a majority of
    /// the quorum confirming that it leads (the checker's test).
    pub lease_quorum_check: bool,
    /// TEST ONLY: false turns the file system panic off (`mako_fs::core::FsPanic`, the
    /// checker's test): a node that cannot write its log only turns read-only, keeps
    /// its tokens and stays in the cluster.
    pub fs_panic: bool,
    /// TEST ONLY: false skips every operation's final fence check
    /// (`mako_fs::core::Core::test_no_answer_fence`, the checker's test): a node paused
    /// in the middle of an operation answers it after its expel.
    pub answer_fence: bool,
}

/// What the token thief steals.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Thief {
    Off,
    /// The whole data token of a file larger than an inode (whose data cannot be
    /// inline in it).
    Large,
    /// The whole data token of any file.
    Whole,
    /// A file's whole data token, or a range of a few blocks (a node then holds parts
    /// of a file's data, as when several nodes write one file).
    Ranges,
}

impl Thief {
    /// `MAKO_SIM_THIEF=off|large|whole|ranges`, or `default`.
    pub fn from_env(default: Thief) -> Thief {
        match std::env::var("MAKO_SIM_THIEF").as_deref() {
            Ok("off") => Thief::Off,
            Ok("large") => Thief::Large,
            Ok("whole") => Thief::Whole,
            Ok("ranges") => Thief::Ranges,
            Ok(other) => panic!("MAKO_SIM_THIEF={other:?}: off, large, whole or ranges"),
            Err(_) => default,
        }
    }
}

impl ClusterConfig {
    /// The simulation's usual cluster: three 32 MiB disks (more for more than 48
    /// nodes; memory is only used where written), 64 KiB blocks, a 2 MiB pagepool.
    pub fn small(nodes: u32) -> ClusterConfig {
        ClusterConfig {
            nodes,
            disks: 3,
            // Each node's recovery log (1 MiB) is made in a region of its own at its
            // first mount, with room left for its work: about 2 MiB a node.
            disk_bytes: (32u64 << 20).max((nodes as u64 * (2 << 20) / 3).next_multiple_of(1 << 20)),
            block_bytes: 64 << 10,
            log_bytes: 1 << 20,
            pagepool_bytes: 2 << 20,
            max_files_to_cache: 24,
            max_stat_cache: 16,
            net: NetConfig::default(),
            disk_latency: DiskLatency::default(),
            // Not `Whole` yet: an operation that moves a small file's inline data into a
            // block without its data token (setxattr, seed 1664 with
            // MAKO_SIM_THIEF=whole) fails the buffer check.
            thief: Thief::from_env(Thief::Large),
            leases: None,
            lease_quorum_check: true,
            lease_fence: true,
            fs_panic: true,
            answer_fence: true,
        }
    }

    pub fn mkfs_params(&self, seed: u64) -> MkfsParams {
        MkfsParams {
            name: "sim".into(),
            block_bytes: self.block_bytes,
            indirect_bytes: 4096,
            inode_bytes: 4096,
            // Room for every node's first inode-map segments (64 numbers each).
            inodes_max: Some(100_000u64.max(self.nodes as u64 * 64 * 4)),
            log_bytes: self.log_bytes,
            // A region of its own for every node (mkfs refuses fewer): a node makes its
            // log in its own space at its first mount.
            regions: Some(8u32.max(self.nodes)),
            log_count: self.nodes,
            reproducible: Some(Reproducible {
                uuid_seed: seed,
                time: mako_fs::core::timestamp(SIM_EPOCH),
            }),
            ..MkfsParams::default()
        }
    }

    pub fn fs_config(&self) -> FsConfig {
        FsConfig {
            pagepool_bytes: self.pagepool_bytes,
            max_files_to_cache: self.max_files_to_cache,
            max_stat_cache: self.max_stat_cache,
            prefetch_threads: 1,
            writebehind_threads: 1,
            sync_interval_secs: 3600,
            iohist_size: 16,
            background_workers: false,
            ..FsConfig::default()
        }
    }
}

/// TEST ONLY: a broken recovery of a crashed node, to show the checker catches it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RecoveryFault {
    None,
    /// Release the failed node's tokens without replaying its log.
    SkipReplay,
    /// Replay its log but never release its tokens.
    SkipTokenRelease,
    /// A token manager taken over from a crashed node (`FaultKind::ManagerCrash`)
    /// starts from an empty table without asking the survivors what they hold.
    RebuildWithoutReports,
}

/// Background work of one node, as the daemon's worker threads would do it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Background {
    /// Write back up to this many dirty blocks (queued complete blocks first).
    WriteBehind(usize),
    /// Read up to this many queued prefetch blocks.
    Prefetch(usize),
    /// Commit the running log transaction.
    Commit,
    /// Write back every dirty block, then commit (the sync thread's interval work).
    Sync,
    /// Write committed images in place and free log space.
    Checkpoint,
    /// Evict inodes over `maxFilesToCache` (and give back tokens the stat cache drops).
    Evict,
    /// Give back the tokens of inodes nothing uses any more.
    ReleaseTokens,
    /// The token thief takes `xw` over `[start, end)` of inode `ino`'s data (revoking
    /// it from every node that holds it) and gives it back.
    Steal { ino: u64, start: u64, end: u64 },
}

pub struct SimCluster {
    pub sim: Sim,
    pub config: ClusterConfig,
    pub net: Arc<SimNet>,
    pub clock: Arc<SimClock>,
    pub disks: Vec<Arc<SimDisk>>,
    /// The token manager and its node: node 0, or after node 0 crashed with it
    /// (`crash_manager`) its successor's, rebuilt from the survivors' tokens.
    manager: Mutex<(Arc<TokenManager>, u32)>,
    /// The manager nodes' transports through which a manager tells queued requesters
    /// that their turn came (`TokenManager::notify_through` holds it weakly).
    manager_transports: Mutex<Vec<Arc<dyn mako_rt::Transport>>>,
    /// The token thief's client (see `ClusterConfig::thief`).
    pub thief: Option<TokenClient>,
    /// Mounted nodes by node number (None before mount and after unmount).
    mounted: Mutex<Vec<Option<Mounted>>>,
    /// Per node, the fence of its current mount's disks (set when it crashes; a new
    /// one for each mount).
    fences: Mutex<Vec<Arc<AtomicBool>>>,
    /// Crashed mounts, kept until the end (their tasks may still be running into
    /// their fences).
    crashed: Mutex<Vec<Mounted>>,
    /// Leases (`ClusterConfig::leases`).
    pub leases: Option<Arc<crate::lease::SimLeases>>,
    /// Mounts of expelled nodes (paused or partitioned past their lease), by node,
    /// until they rejoin: what a node that comes back from a pause still has.
    zombies: Mutex<Vec<Option<Mounted>>>,
    /// Each expel the lease manager made, in order: the node, and how its recovery by
    /// a survivor went (the runner's expel hook fills it).
    pub expels: Mutex<Vec<(u32, Result<String, String>)>>,
    /// Per node, the write errors of its path to the disks (a new, healthy one when
    /// it rejoins).
    write_faults: Mutex<Vec<Arc<WriteFaults>>>,
}

impl SimCluster {
    /// Format the file system (outside the simulation: no time passes) and set up the
    /// network and the token manager. Nodes mount later, from a task (`mount`).
    pub fn new(sim: &Sim, config: ClusterConfig) -> Result<Arc<SimCluster>, String> {
        let disks: Vec<Arc<SimDisk>> = (0..config.disks)
            .map(|i| {
                Arc::new(SimDisk::new(
                    &format!("d{i}"),
                    config.disk_bytes,
                    config.disk_latency,
                    sim.fork_rng(),
                ))
            })
            .collect();
        let meta: Vec<DiskMeta> = (0..config.disks)
            .map(|i| DiskMeta {
                name: format!("d{i}"),
                pool: "system".into(),
                failure_group: i as i32 + 1,
                usage: mako_format::disk_header::DiskUsage::DataAndMetadata,
            })
            .collect();
        let dyn_disks: Vec<Arc<dyn Disk>> =
            disks.iter().map(|d| d.clone() as Arc<dyn Disk>).collect();
        mako_fs::mkfs::format_disks(dyn_disks, &meta, &config.mkfs_params(sim.seed()))
            .map_err(|e| format!("mkfs on the simulated disks: {e}"))?;
        let net = SimNet::new(sim, config.net);
        let manager = Arc::new(TokenManager::new(TokenManagerLimits {
            tokens_max: 10_000_000,
            ..TokenManagerLimits::default()
        }));
        let manager_transport = net.serve_token_manager(NodeId(0), manager.clone());
        let nodes = config.nodes as usize;
        let leases_times = config.leases;
        let lease_quorum_check = config.lease_quorum_check;
        let thief = (config.thief != Thief::Off).then(|| {
            let id = NodeId(config.nodes);
            let client = TokenClient::new(
                id,
                net.transport(id),
                ManagerMap::single(NodeId(0)),
                TokenClientLimits::default(),
            );
            net.registry()
                .register(id, ServiceId::TokenClient, client.service());
            client
        });
        Ok(Arc::new(SimCluster {
            sim: sim.clone(),
            clock: Arc::new(SimClock::new(sim)),
            config,
            disks,
            manager: Mutex::new((manager, 0)),
            manager_transports: Mutex::new(vec![manager_transport]),
            thief,
            mounted: Mutex::new((0..nodes).map(|_| None).collect()),
            fences: Mutex::new(
                (0..nodes)
                    .map(|_| Arc::new(AtomicBool::new(false)))
                    .collect(),
            ),
            crashed: Mutex::new(Vec::new()),
            leases: leases_times.map(|times| {
                let l = crate::lease::SimLeases::new(
                    sim,
                    Arc::new(SimClock::new(sim)),
                    net.clone(),
                    nodes as u32,
                    times,
                );
                l.quorum_check.store(lease_quorum_check, Ordering::Relaxed);
                l
            }),
            zombies: Mutex::new((0..nodes).map(|_| None).collect()),
            expels: Mutex::new(Vec::new()),
            write_faults: Mutex::new((0..nodes).map(|_| Arc::default()).collect()),
            net,
        }))
    }

    pub fn dyn_disks(&self) -> Vec<Arc<dyn Disk>> {
        self.disks
            .iter()
            .map(|d| d.clone() as Arc<dyn Disk>)
            .collect()
    }

    /// How node `node` reaches the cluster.
    pub fn env(&self, node: u32) -> NodeEnv {
        NodeEnv {
            node,
            fs_index: 0,
            clock: self.clock.clone(),
            transport: self.net.transport(NodeId(node)),
            managers: ManagerMap::single(NodeId(self.manager_node())),
            fs_manager: NodeId(self.manager_node()),
            registry: Some(self.net.registry().clone()),
        }
    }

    /// Node `node`'s view of the disks: cut off when it crashes.
    fn node_disks(&self, node: u32) -> Vec<Arc<dyn Disk>> {
        let fence = self.fences.lock()[node as usize].clone();
        let faults = self.write_faults.lock()[node as usize].clone();
        let lease = self.leases.as_ref().map(|l| crate::lease::MountLease {
            leases: l.clone(),
            node,
            epoch: l.record(node).epoch,
            enforce: self.config.lease_fence,
        });
        self.disks
            .iter()
            .map(|d| {
                Arc::new(NodeDisk {
                    disk: d.clone(),
                    fence: fence.clone(),
                    lease: lease.clone(),
                    faults: faults.clone(),
                }) as Arc<dyn Disk>
            })
            .collect()
    }

    /// Mount node `node` (from a simulated task).
    pub fn mount(&self, node: u32) -> FsResult<()> {
        let m = mako_fs::mount::mount_node(
            self.node_disks(node),
            self.config.fs_config(),
            self.env(node),
        )?;
        if let Some(l) = &self.leases {
            // Every operation of the mount is behind the node's lease too.
            let lease = crate::lease::MountLease {
                leases: l.clone(),
                node,
                epoch: l.record(node).epoch,
                enforce: self.config.lease_fence,
            };
            let fence: mako_fs::core::MountFence =
                Arc::new(move || lease.check("(mount)").map_err(|e| e.to_string()));
            let _ = m.core().mount_fence.set(fence);
            // A file system panic: the node asks the lease manager to expel it
            // (makod's `Leases::fs_panicked`).
            let leases = l.clone();
            m.core()
                .fs_panic
                .set_hook(Arc::new(move |why: &str| leases.fs_panicked(node, why)));
        }
        // The checker's record of when an operation's answer was fixed (`ANSWERED`).
        let clock = self.clock.clone();
        let _ = m.core().answer_hook.set(Arc::new(move || {
            let at = mako_fs::core::timestamp(mako_rt::Clock::wall(clock.as_ref()));
            ANSWERED.with(|a| a.set(Some(at)));
        }));
        m.core()
            .test_no_answer_fence
            .store(!self.config.answer_fence, Ordering::Relaxed);
        m.core()
            .fs_panic
            .test_off
            .store(!self.config.fs_panic, Ordering::Relaxed);
        self.mounted.lock()[node as usize] = Some(m);
        Ok(())
    }

    /// Node `node` stops at once: none of its I/O reaches the disks any more (not even
    /// a write under way), nothing it sends arrives, nothing sent to it is answered.
    /// What it had not written and synced is lost; its tokens stay in the manager's
    /// table until a survivor recovers it (`recover`).
    pub fn crash(&self, node: u32) {
        self.fences.lock()[node as usize].store(true, Ordering::SeqCst);
        self.net.crash(NodeId(node));
        if let Some(m) = self.mounted.lock()[node as usize].take() {
            self.crashed.lock().push(m);
        }
    }

    /// The token manager now.
    pub fn manager(&self) -> Arc<TokenManager> {
        self.manager.lock().0.clone()
    }

    /// The node hosting the token manager now.
    pub fn manager_node(&self) -> u32 {
        self.manager.lock().1
    }

    /// Node 0 crashes with the token manager (`crash`): the lowest-numbered mounted
    /// node takes the manager over at once (as a raft election among the survivors
    /// would pick one; the election's own delay is not modelled) and rebuilds it
    /// (`move_manager`). Returns the new manager node.
    pub fn crash_manager(&self, fault: RecoveryFault) -> u32 {
        let failed = self.manager_node();
        self.crash(failed);
        self.move_manager(None, fault)
    }

    /// The token manager leaves its node (crashed, or expelled: its process may still
    /// run, cut off or stopped, and its table is no longer the cluster's): `successor`
    /// (or the lowest-numbered mounted node) serves a new one, every mounted node and
    /// the token thief route to it, and it starts a rebuild (docs/coherence.md section
    /// 7b) that waits for every survivor's report (`rebuild_manager`) and for the
    /// failed node's recovery. Returns the new manager node.
    /// With `RecoveryFault::RebuildWithoutReports` (the checker's test) it asks
    /// nobody.
    pub fn move_manager(&self, successor: Option<u32>, fault: RecoveryFault) -> u32 {
        let failed = self.manager_node();
        self.net
            .registry()
            .unregister(NodeId(failed), ServiceId::TokenManager);
        let cores: Vec<(u32, Arc<Core>)> = self
            .cores()
            .into_iter()
            .filter(|(n, _)| *n != failed)
            .collect();
        let successor = successor.unwrap_or_else(|| {
            cores
                .first()
                .map(|(n, _)| *n)
                .expect("a node survives the manager")
        });
        let manager = Arc::new(TokenManager::new(self.manager().limits()));
        let transport = self
            .net
            .serve_token_manager(NodeId(successor), manager.clone());
        let map = ManagerMap::single(NodeId(successor));
        let mut live: Vec<NodeId> = cores.iter().map(|(n, _)| NodeId(*n)).collect();
        for (_, core) in &cores {
            core.tokens.client().set_managers(map.clone());
        }
        if let Some(thief) = &self.thief {
            thief.set_managers(map.clone());
            live.push(thief.node());
        }
        if fault == RecoveryFault::RebuildWithoutReports {
            live.clear();
        }
        manager.begin_rebuild(map, 0, &live, &[NodeId(failed)]);
        self.manager_transports.lock().push(transport);
        *self.manager.lock() = (manager, successor);
        successor
    }

    /// The new manager asks the survivors what they hold (`crash_manager`), until all
    /// answered or were recovered. Returns the rounds of asking.
    pub fn rebuild_manager(&self) -> u32 {
        let (manager, node) = self.manager.lock().clone();
        let transport = self.net.transport(NodeId(node));
        manager.collect_reports(&*transport, std::time::Duration::from_millis(1))
    }

    /// Node `node`'s process stops (SIGSTOP): none of its tasks runs, messages to it
    /// wait (and time out), its lease is not renewed; I/O it submitted still lands.
    pub fn pause(&self, node: u32) {
        self.sim.pause_group(node);
    }

    /// Node `node`'s process runs again (SIGCONT).
    pub fn resume(&self, node: u32) {
        self.sim.resume_group(node);
    }

    /// Node `node` is cut off from every other node.
    pub fn partition(&self, node: u32) {
        self.net.partition(NodeId(node));
    }

    /// Node `node`'s path to the disks goes bad for good: every write and sync it
    /// makes fails with EIO (until it rejoins, with the path repaired).
    pub fn break_disks(&self, node: u32) {
        self.write_faults.lock()[node as usize]
            .bad
            .store(true, Ordering::SeqCst);
    }

    /// Whether node `node`'s file system panicked (`mako_fs::core::FsPanic`).
    pub fn panicked(&self, node: u32) -> bool {
        let any = |m: &Option<Mounted>| m.as_ref().is_some_and(|m| m.core().fs_panic.is_set());
        any(&self.mounted.lock()[node as usize]) || any(&self.zombies.lock()[node as usize])
    }

    /// The partition of node `node` heals.
    pub fn heal(&self, node: u32) {
        self.net.heal(NodeId(node));
    }

    /// Node `node` was expelled: its mount is no longer the cluster's (operations go
    /// to survivors), but the node still has it (`zombie`) until it rejoins.
    pub fn expelled(&self, node: u32) {
        if let Some(m) = self.mounted.lock()[node as usize].take() {
            self.zombies.lock()[node as usize] = Some(m);
        }
    }

    /// The file system as expelled node `node` still sees it (before it rejoins).
    pub fn zombie(&self, node: u32) -> Option<FileSystem> {
        self.zombies.lock()[node as usize]
            .as_ref()
            .map(|m| m.fs.clone())
    }

    /// Node `by` recovers crashed node `failed` (`mako_fs::recovery::recover_failed_node`),
    /// or, with a `fault` (the checker's own test), does it wrong.
    pub fn recover(
        &self,
        by: u32,
        failed: u32,
        fault: RecoveryFault,
    ) -> FsResult<Option<mako_fs::recovery::NodeRecoveryReport>> {
        let Some(fs) = self.fs(by) else {
            return Err(FsError::Invalid(format!(
                "node {by} cannot recover node {failed}: it is not mounted"
            )));
        };
        match fault {
            RecoveryFault::None | RecoveryFault::RebuildWithoutReports => {
                let mut rep = mako_fs::recovery::recover_failed_node(&fs.core, failed)?;
                mako_fs::recovery::recount_after(&fs.core, &mut rep);
                Ok(Some(rep))
            }
            RecoveryFault::SkipReplay => {
                self.manager().release_node(NodeId(failed));
                Ok(None)
            }
            RecoveryFault::SkipTokenRelease => {
                let desc = fs.core.desc.lock().clone();
                mako_fs::recovery::replay(fs.core.nsd.as_ref(), &desc, failed)?;
                Ok(None)
            }
        }
    }

    /// Crashed node `node` mounts again (a new epoch: its old transport stays cut off),
    /// replaying what its log still holds (nothing, once a survivor recovered it).
    pub fn rejoin(&self, node: u32) -> FsResult<mako_fs::recovery::ReplayReport> {
        // The expelled mount is dropped without unmounting (it is fenced).
        if let Some(m) = self.zombies.lock()[node as usize].take() {
            self.fences.lock()[node as usize].store(true, Ordering::SeqCst);
            self.crashed.lock().push(m);
        }
        if let Some(l) = &self.leases {
            if l.record(node).expelled.is_some() {
                l.rejoin(node);
            }
        }
        self.fences.lock()[node as usize] = Arc::new(AtomicBool::new(false));
        self.write_faults.lock()[node as usize] = Arc::default();
        self.net.rejoin(NodeId(node));
        self.mount(node)?;
        let m = self.mounted.lock();
        Ok(m[node as usize]
            .as_ref()
            .expect("just mounted")
            .recovery
            .clone())
    }

    /// Whether node `node` is mounted (not crashed, not unmounted).
    pub fn is_mounted(&self, node: u32) -> bool {
        self.mounted.lock()[node as usize].is_some()
    }

    /// The file system as node `node` sees it.
    pub fn fs(&self, node: u32) -> Option<FileSystem> {
        self.mounted.lock()[node as usize]
            .as_ref()
            .map(|m| m.fs.clone())
    }

    /// The core of every mounted node, by node number.
    pub fn cores(&self) -> Vec<(u32, Arc<Core>)> {
        self.mounted
            .lock()
            .iter()
            .enumerate()
            .filter_map(|(i, m)| m.as_ref().map(|m| (i as u32, m.core().clone())))
            .collect()
    }

    /// Unmount node `node` cleanly (from a simulated task).
    pub fn unmount(&self, node: u32) -> FsResult<()> {
        let m = self.mounted.lock()[node as usize].take();
        match m {
            Some(m) => m.unmount(),
            None => Ok(()),
        }
    }

    /// Forget every node without unmounting (after a failure: like a crash, nothing
    /// more is written).
    pub fn abandon(&self) {
        let all: Vec<Option<Mounted>> = std::mem::take(&mut *self.mounted.lock());
        drop(all);
        let crashed: Vec<Mounted> = std::mem::take(&mut *self.crashed.lock());
        drop(crashed);
        let zombies: Vec<Option<Mounted>> = std::mem::take(&mut *self.zombies.lock());
        drop(zombies);
        if let Some(l) = &self.leases {
            l.stop();
        }
    }

    /// Do one piece of background work on `node`.
    pub fn background(&self, node: u32, work: Background) -> FsResult<()> {
        if let Background::Steal { ino, start, end } = work {
            let Some(thief) = &self.thief else {
                return Ok(());
            };
            let resource = ResourceId::new(0, ResourceKind::ByteRange, ino);
            let range = ByteRange::new(start, end);
            let e = |e: mako_token::TokenError| FsError::Token(format!("token thief: {e}"));
            thief
                .acquire(resource, TokenMode::Xw, range, range)
                .map_err(e)?;
            mako_diag::sched::sleep(std::time::Duration::from_micros(50));
            return thief.release(resource, range).map_err(e);
        }
        let Some(fs) = self.fs(node) else {
            return Ok(());
        };
        let core = &fs.core;
        match work {
            Background::WriteBehind(max) => {
                let mut keys: Vec<(u64, u64)> = Vec::new();
                while keys.len() < max {
                    match core.flushq.lock().pop_front() {
                        Some(k) => keys.push(k),
                        None => break,
                    }
                }
                if keys.len() < max {
                    keys.extend(
                        core.pool
                            .dirty_keys(max)
                            .into_iter()
                            .filter(|(ino, _)| *ino != INODE_CACHE_KEY)
                            .take(max - keys.len()),
                    );
                }
                for (ino, b) in keys {
                    if let Some(h) = core.cached_handle(ino) {
                        let r = match mako_fs::file_io::flush_block(core, &h, b) {
                            // As the write-behind thread: space freed but waiting for a
                            // checkpoint is made usable, then the block is tried again.
                            Err(FsError::NoSpace(_)) if core.alloc.quarantined_subblocks() > 0 => {
                                core.journal.quiesce(core)?;
                                mako_fs::file_io::flush_block(core, &h, b)
                            }
                            r => r,
                        };
                        match r {
                            // Also as the write-behind thread: a region backing the
                            // block's reservation was stolen; take one more.
                            Err(FsError::NoSpace(why)) => {
                                if !mako_fs::ownership::acquire_or_steal_region(core)? {
                                    return Err(FsError::NoSpace(why));
                                }
                                mako_fs::file_io::flush_block(core, &h, b)?;
                            }
                            r => r?,
                        }
                    }
                }
                Ok(())
            }
            Background::Prefetch(max) => {
                for _ in 0..max {
                    let Some((ino, b)) = core.prefetchq.lock().pop_front() else {
                        break;
                    };
                    if let Some(h) = core.cached_handle(ino) {
                        mako_fs::file_io::prefetch_block(core, &h, b)?;
                    }
                }
                Ok(())
            }
            Background::Commit => core.journal.commit(core),
            Background::Sync => mako_fs::workers::sync_all(core),
            Background::Checkpoint => core.journal.checkpoint(core),
            Background::Evict => mako_fs::workers::evict_inodes(core),
            Background::ReleaseTokens => mako_fs::workers::release_tokens(core),
            Background::Steal { .. } => unreachable!("handled above"),
        }
    }

    /// After a node crashed, fsck may find two leftovers of it that recovery does not
    /// handle yet (docs/coherence.md, "Recovery of a failed node"): files it had
    /// unlinked while they were still open or looked up on it (`unlinked_inode`: their
    /// last close would have freed them), and space or inode numbers it freed in other
    /// nodes' regions and segments but had not yet handed to their owners
    /// (`block_leaked`, `inode_leaked`: those frees live in its memory only, docs
    /// section 6). Those alone are repaired (`fsck -y`), then the check must be clean.
    /// Anything else fails. Returns how many such leftovers were repaired.
    pub fn fsck_after_crash(&self) -> Result<usize, String> {
        use mako_fsck::ProblemKind;
        let opts = mako_fsck::Options::check().threads(1);
        let report = match mako_fsck::check_offline(self.dyn_disks(), &opts, &mako_fsck::NoProgress)
        {
            Ok(r) if r.is_clean() => return Ok(0),
            Ok(r) => r,
            Err(e) => return Err(format!("fsck could not check the file system: {e}")),
        };
        if report.problems.iter().any(|p| {
            !matches!(
                p.kind,
                ProblemKind::UnlinkedInode | ProblemKind::BlockLeaked | ProblemKind::InodeLeaked
            )
        }) {
            return Err(format!("fsck found problems:\n{}", report.render()));
        }
        let n = report.problems.len();
        let repair = mako_fsck::Options::repair().threads(1);
        mako_fsck::check_offline(self.dyn_disks(), &repair, &mako_fsck::NoProgress)
            .map_err(|e| format!("fsck -y of the crashed node's leftovers: {e}"))?;
        self.fsck().map_err(|e| {
            format!("after fsck -y repaired {n} leftover(s) of the crashed node: {e}")
        })?;
        Ok(n)
    }

    /// Check the unmounted file system with the offline fsck (after the run).
    pub fn fsck(&self) -> Result<(), String> {
        let opts = mako_fsck::Options::check().threads(1);
        match mako_fsck::check_offline(self.dyn_disks(), &opts, &mako_fsck::NoProgress) {
            Ok(r) if r.is_clean() => Ok(()),
            Ok(r) => Err(format!("fsck found problems:\n{}", r.render())),
            Err(e) => Err(format!("fsck could not check the file system: {e}")),
        }
    }
}
