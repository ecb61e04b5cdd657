//! The daemon's state and its answers to control requests.

use anyhow::{bail, Context, Result};
use mako_config::{ConfigStore, EffectiveConfig};
use mako_control::{ClusterConfig, ControlHandler, DataDir, Request, Response};
use mako_control::{
    ConfigRowView, DaemonStatus, DiskCountersView, DiskStatusView, FsCountersView, FsStatus,
    FsckView, IoRecordView, LockCounterView, StatsView, TokenView, WaiterView,
};
use mako_format::disk_header::DiskUsage;
use mako_fs::{DiskSpec, FsConfig, Mounted};
use parking_lot::{Mutex, RwLock};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::mount_state::{atime_policy, Health, MountPoint, MountedFs};
use mako_control::mount_options::{MountOptions, MountRequestOptions};

/// One file system's counters: name, named counters, per-disk counters.
pub(crate) type FsCounters = (String, Vec<(String, u64)>, Vec<mako_disk::nsd::DiskStats>);

pub struct Daemon {
    dir: DataDir,
    cluster: Mutex<ClusterConfig>,
    config: RwLock<EffectiveConfig>,
    mounts: Mutex<HashMap<String, MountedFs>>,
    /// Held by whatever mounts, unmounts or releases a file system, so that two of them
    /// never work on the same file system at once (the `mounts` lock is not held for
    /// the length of a mount).
    mount_ops: Mutex<()>,
    started: Instant,
    stop: Arc<AtomicBool>,
    /// This node's network, when cluster.toml lists several nodes (`crate::net`).
    net: Option<crate::net::NetNode>,
    /// This node's member of the configuration quorum, in a multi-process cluster
    /// (`crate::member`).
    member: Mutex<Option<Arc<crate::member::Member>>>,
}

pub(crate) fn fs_config(c: &EffectiveConfig) -> FsConfig {
    FsConfig {
        pagepool_bytes: c.pagepool_bytes(),
        max_files_to_cache: c.max_files_to_cache(),
        max_stat_cache: c.max_stat_cache(),
        prefetch_aggressiveness_read: c
            .prefetch_aggressiveness_read()
            .map(|v| v as i32)
            .unwrap_or(-1),
        prefetch_threads: c.prefetch_threads().clamp(1, 64),
        writebehind_threads: 4,
        sync_interval_secs: 5,
        iohist_size: c.iohist_size(),
        avoid_dir_fragments: Some(c.avoid_dir_fragments()),
        dir_pre_split_levels: Some(c.dir_pre_split_levels()),
        background_workers: true,
    }
}

/// Let one FUSE request carry a whole block: raise the kernel's max_pages limit
/// (Linux 6.13+, root only). Returns the limit in force.
pub(crate) fn raise_fuse_max_pages(want_bytes: u32) -> Option<u32> {
    let path = "/proc/sys/fs/fuse/max_pages_limit";
    let cur: u32 = std::fs::read_to_string(path).ok()?.trim().parse().ok()?;
    let want = want_bytes.div_ceil(4096);
    if cur < want && std::fs::write(path, want.to_string()).is_ok() {
        tracing::info!("raised {path} from {cur} to {want} pages");
        return Some(want);
    }
    Some(cur)
}

/// The kernel reads ahead only 128 KiB on a FUSE mount by default, so a sequential
/// reader reaches Mako in 128 KiB requests. Raise the mount's readahead to a block
/// (root only), so reads arrive as large requests and prefetch sees whole blocks.
pub(crate) fn raise_readahead(mountpoint: &Path, block_bytes: u32) -> Option<u32> {
    use std::os::unix::fs::MetadataExt;
    let dev = std::fs::metadata(mountpoint).ok()?.dev();
    let (major, minor) = (libc::major(dev), libc::minor(dev));
    let path = format!("/sys/class/bdi/{major}:{minor}/read_ahead_kb");
    let kb = (block_bytes / 1024).max(1024);
    std::fs::write(&path, kb.to_string()).ok()?;
    Some(kb)
}

/// With the writeback cache, the kernel limits a FUSE device to 1% of dirty memory
/// (strict_limit), and writes back a page or two at a time under that pressure. Lift
/// the strict limit and allow a fair share of dirty memory (root only).
pub(crate) fn relax_dirty_limit(mountpoint: &Path) {
    use std::os::unix::fs::MetadataExt;
    let Ok(meta) = std::fs::metadata(mountpoint) else {
        return;
    };
    let dev = meta.dev();
    let bdi = format!("/sys/class/bdi/{}:{}", libc::major(dev), libc::minor(dev));
    let ok = std::fs::write(format!("{bdi}/strict_limit"), "0").is_ok()
        && std::fs::write(format!("{bdi}/max_ratio"), "50").is_ok();
    if ok {
        tracing::info!("FUSE writeback cache: dirty limit of {bdi} relaxed");
    } else {
        tracing::warn!("FUSE writeback cache: could not relax the dirty limit of {bdi}; small writes may be slow");
    }
}

impl Daemon {
    pub(crate) fn load_config(dir: &DataDir) -> Result<EffectiveConfig> {
        let store = ConfigStore::load_or_default(dir.config_file())
            .with_context(|| format!("reading {}", dir.config_file().display()))?;
        Ok(EffectiveConfig::resolve(Some(&store), &[])?)
    }

    /// Mounts `name` at `mountpoint` (its mount point in cluster.toml if `None`) with
    /// `options` as `mount -o` gives them; with `remount` among them, changes the
    /// options of the mount at `mountpoint` instead. A file system already mounted
    /// elsewhere gets one more FUSE session over the same mounted core.
    pub(crate) fn mount_fs(
        &self,
        name: &str,
        mountpoint: Option<&Path>,
        options: &str,
    ) -> Result<String> {
        let _ops = self.mount_ops.lock();
        let cluster = ClusterConfig::load(self.dir.root.as_path())?;
        *self.cluster.lock() = cluster.clone();
        let fsdef = cluster
            .filesystem(name)
            .with_context(|| {
                let known: Vec<&str> = cluster
                    .filesystems
                    .iter()
                    .map(|f| f.name.as_str())
                    .collect();
                format!(
                    "no file system {name} in {} (known: {}); create it with `mako fs create`",
                    self.dir.cluster_file().display(),
                    if known.is_empty() {
                        "none".to_string()
                    } else {
                        known.join(", ")
                    }
                )
            })?
            .clone();
        let mp = match mountpoint {
            Some(p) if !p.is_absolute() => {
                bail!("mount point {} is not an absolute path", p.display())
            }
            Some(p) => mako_control::mount_table::canonical_mountpoint(p),
            None => fsdef.mountpoint.clone(),
        };
        // Checked before anything is taken out of `mounts`: an error from here on must
        // put back what it took.
        let request = MountRequestOptions::parse(options, &MountOptions::default())
            .map_err(|e| anyhow::anyhow!("{name} on {}: {e}", mp.display()))?;
        let known = self.mounts.lock().remove(name);
        if request.remount {
            let Some(mut m) = known else {
                bail!("{name} is not mounted, so it cannot be remounted; mount it first");
            };
            let r = Self::remount_point(&mut m, &mp, options);
            self.mounts.lock().insert(name.to_string(), m);
            return r;
        }
        let opts = request.options;
        let m = match known {
            None => None,
            Some(mut m) => {
                // What makod remembers is checked against the kernel first: a mount
                // point that was unmounted from outside is released.
                let mut kept = Vec::new();
                for p in std::mem::take(&mut m.points) {
                    match p.settle() {
                        Health::Ended => {
                            Self::note_outside_unmount(&p);
                            p.join_ended();
                        }
                        _ => kept.push(p),
                    }
                }
                m.points = kept;
                let here = m.points.iter().find(|p| p.mountpoint == mp);
                match here.map(|p| (p.health(), p.options.clone())) {
                    Some((Health::Mounted, o)) => {
                        self.mounts.lock().insert(name.to_string(), m);
                        return Ok(format!(
                            "{name} is already mounted on {} ({o})",
                            mp.display()
                        ));
                    }
                    Some((Health::Detached, _)) => {
                        self.mounts.lock().insert(name.to_string(), m);
                        bail!(
                            "{name} was detached from {} (`umount -l`) while files on it were open; \
                             makod serves those files until they are closed, and only then can it \
                             mount {name} there again. Close them (or end the programs using them), \
                             then run `mako fs mount {name}` again",
                            mp.display()
                        );
                    }
                    _ => {}
                }
                if m.points.is_empty() {
                    m.write_back()?;
                    tracing::info!("{name}: written back after the unmount from outside");
                    None
                } else {
                    Some(m)
                }
            }
        };
        let cfg = self.config.read().clone();
        let mut m = match m {
            Some(m) => m,
            None => {
                let mut specs = Vec::new();
                for d in cluster.disks_of(&fsdef) {
                    let usage = DiskUsage::parse(&d.usage)
                        .with_context(|| format!("disk {}: usage {:?}", d.name, d.usage))?;
                    specs.push(DiskSpec {
                        name: d.name.clone(),
                        path: d.path.clone(),
                        pool: d.pool.clone(),
                        failure_group: d.failure_group,
                        usage,
                    });
                }
                let (mounted, disk_access) =
                    self.mount_core(name, &specs, &cfg, cluster.node_id)?;
                MountedFs {
                    name: name.to_string(),
                    mounted,
                    points: Vec::new(),
                    sessions: mako_fuse::Sessions::new(),
                    direct_io_file_size: Arc::new(AtomicU64::new(cfg.fuse_direct_io_file_size())),
                    disk_paths: specs
                        .iter()
                        .map(|s| (s.name.clone(), s.path.clone()))
                        .collect(),
                    disk_access,
                }
            }
        };
        match self.add_mount_point(&mut m, &cfg, &mp, opts) {
            Ok(message) => {
                self.mounts.lock().insert(name.to_string(), m);
                Ok(message)
            }
            Err(e) if m.points.is_empty() => {
                let _ = m.write_back();
                Err(e)
            }
            Err(e) => {
                self.mounts.lock().insert(name.to_string(), m);
                Err(e)
            }
        }
    }

    /// Mounts the core of file system `name`: alone, or as this node of a multi-process
    /// cluster (its token client and file system served to the other nodes, the
    /// managers reached on the manager node).
    fn mount_core(
        &self,
        name: &str,
        specs: &[DiskSpec],
        cfg: &EffectiveConfig,
        node_id: u32,
    ) -> Result<(Mounted, crate::net::DiskAccessList)> {
        let Some(net) = &self.net else {
            return mako_fs::mount(specs, fs_config(cfg), node_id)
                .map(|m| (m, Vec::new()))
                .with_context(|| format!("mounting file system {name}"));
        };
        // Token resources and the registry's services are per node, not per file
        // system, in this first version: one file system per node.
        if let Some(other) = self.mounts.lock().keys().find(|k| k.as_str() != name) {
            bail!(
                "node {} already mounts {other}; a node of a multi-process cluster mounts one \
                 file system at a time for now (unmount {other} first)",
                net.me.name
            );
        }
        let member = self.member()?;
        let lease = member.leases.lease.clone();
        let quorum = member.quorum();
        let me = mako_rt::NodeId(net.me.id);
        // The lease first: a node restarted after its expel opens its disks (through
        // NSD servers that refuse an expelled node) only once it rejoined.
        let epoch = wait_for_lease(&lease, &|| quorum.leader().is_some(), &|| {
            quorum.read_local().lease_of(me).expelled.is_some()
        })?;
        // After the lease: every token manager shard must serve this node, and one
        // that has not applied its rejoin yet refuses it for a moment. The slots are
        // routed as the configuration says now (a failed manager node's slot moved to
        // its successor: `crate::shards`), and followed from then on.
        let managers = net.manager_ids();
        let shards = Arc::new(crate::lease::ShardWatch::new(quorum.clone(), me, &managers));
        let routing = shards.routing();
        net.wait_for_manager(&routing)?;
        let cluster = self.cluster.lock().clone();
        let names: Vec<String> = specs.iter().map(|s| s.name.clone()).collect();
        let (disks, access) = net
            .open_disks(&cluster, &names)
            .with_context(|| format!("opening the disks of {name}"))?;
        let fenced: Vec<Arc<crate::lease::FencedDisk>> = disks
            .into_iter()
            .map(|inner| {
                Arc::new(crate::lease::FencedDisk {
                    inner,
                    lease: lease.clone(),
                    epoch: std::sync::atomic::AtomicU64::new(epoch),
                    shards: shards.clone(),
                })
            })
            .collect();
        let first = fenced.first().cloned();
        let disks: Vec<Arc<dyn mako_disk::Disk>> = fenced
            .into_iter()
            .map(|d| d as Arc<dyn mako_disk::Disk>)
            .collect();
        let mounted = mako_fs::mount::mount_node(disks, fs_config(cfg), net.env(0, routing))
            .with_context(|| {
                format!(
                    "node {} ({}): mounting file system {name}",
                    net.me.id, net.me.name
                )
            })?;
        // Every operation is behind the lease too, not only disk I/O: an expelled
        // node must not answer from its cache (its tokens were released).
        if let Some(d) = first {
            let fence: mako_fs::core::MountFence =
                Arc::new(move || d.check().map_err(|e| e.to_string()));
            let _ = mounted.core().mount_fence.set(fence);
        }
        // A file system panic (its recovery log cannot be written): this node asks to
        // be expelled, and a survivor replays that log (docs/cluster.md "Disk write
        // errors").
        {
            let (leases, fs) = (Arc::downgrade(&member.leases), name.to_string());
            mounted.core().fs_panic.set_hook(Arc::new(move |why: &str| {
                if let Some(l) = leases.upgrade() {
                    l.fs_panicked(&fs, why);
                }
            }));
        }
        // A holder that does not answer a revoke is waited for as long as its expel
        // and recovery may take, not the token client's default of 10 minutes.
        let client = mounted.core().tokens.client();
        client.set_holder_down_wait(crate::lease::holder_down_wait(lease.times()));
        // A manager node that does not answer is waited for as long: its slot moves to
        // another manager node once it is expelled (`crate::shards`). With one manager
        // node there is nowhere to move: fail at once, as before.
        if managers.len() > 1 {
            client.set_manager_failover_wait(crate::lease::holder_down_wait(lease.times()));
        }
        shards.set_client(client.clone());
        if let Err(e) = self.recover_at_mount(name, &mounted) {
            if let Err(u) = mounted.unmount() {
                tracing::warn!("{name}: unmounting after the failed recovery: {u}");
            }
            return Err(e);
        }
        Ok((mounted, access))
    }

    /// One more FUSE session of `m`, at `mp`.
    fn add_mount_point(
        &self,
        m: &mut MountedFs,
        cfg: &EffectiveConfig,
        mp: &Path,
        options: MountOptions,
    ) -> Result<String> {
        let name = m.name.clone();
        if let Some(e) = mako_control::mount_table::at(mp) {
            // Something else (or a dead Mako mount) is there; mounting over it would hide
            // it. `mako up` cleans up dead mounts of its own file systems.
            bail!(
                "{} is already a mount point ({} {}); unmount it first or choose another directory",
                mp.display(),
                e.fstype,
                e.source
            );
        }
        std::fs::create_dir_all(mp)
            .with_context(|| format!("creating mount point {}", mp.display()))?;
        let flags = mako_fuse::MountFlags::new(options.read_only, atime_policy(options.atime));
        let opts = mako_fuse::FuseOptions {
            direct_io_file_size: m.direct_io_file_size.clone(),
            writeback_cache: cfg.fuse_writeback_cache(),
            threads: cfg.worker_threads(),
            max_write: cfg.fuse_max_write_bytes(),
            io_uring: cfg.fuse_io_uring(),
            allow_other: unsafe { libc::geteuid() } == 0,
            fs_name: format!("mako:{name}"),
            flags: flags.clone(),
            nosuid: options.nosuid,
            nodev: options.nodev,
            noexec: options.noexec,
            sessions: m.sessions.clone(),
        };
        let fuse = mako_fuse::mount(m.mounted.fs.clone(), mp, &opts).map_err(|e| {
            anyhow::anyhow!(
                "FUSE mount of {name} on {} failed: {e}; is /dev/fuse there and is fuse3 installed?",
                mp.display()
            )
        })?;
        if cfg.fuse_writeback_cache() {
            relax_dirty_limit(mp);
        }
        if let Some(kb) = raise_readahead(mp, m.mounted.core().geo.block_bytes) {
            tracing::info!("kernel readahead for {} set to {kb} KiB", mp.display());
        }
        let device = MountPoint::find_device(&name, mp);
        if device.is_none() {
            tracing::warn!(
                "mounted {name} on {}, but the kernel's mount table does not show it there; \
                 makod will go by the mount point alone",
                mp.display()
            );
        }
        tracing::info!("mounted {name} on {} ({options})", mp.display());
        let message = format!("{name} mounted on {} ({options})", mp.display());
        m.points.push(MountPoint {
            name,
            fuse,
            mountpoint: mp.to_path_buf(),
            options,
            flags,
            device,
            _guard: crate::fuse_guard::Watched::new(device, mp),
        });
        Ok(message)
    }

    /// `mount -o remount,…` of the mount of `m` at `mp`: the kernel's flags first
    /// (superblock read-only, the mount's nosuid, nodev, noexec and atime), then
    /// makod's own (it refuses writes through a read-only mount point itself and
    /// updates atime as the new option says).
    fn remount_point(m: &mut MountedFs, mp: &Path, options: &str) -> Result<String> {
        let name = m.name.clone();
        let Some(p) = m
            .points
            .iter_mut()
            .find(|p| p.mountpoint == mp && p.health() == Health::Mounted)
        else {
            let at: Vec<String> = m
                .points
                .iter()
                .map(|p| p.mountpoint.display().to_string())
                .collect();
            bail!(
                "{name} is not mounted on {} (it is mounted on {}); nothing was changed",
                mp.display(),
                at.join(", ")
            );
        };
        let new = MountRequestOptions::parse(options, &p.options)
            .map_err(|e| anyhow::anyhow!("{name} on {}: {e}", mp.display()))?
            .options;
        // Read-only first on makod's side, so no write slips in between; read-write
        // only once the kernel agreed.
        if new.read_only {
            p.flags.set(true, p.flags.atime());
        }
        if let Err(e) = mako_fuse::remount(
            mp,
            new.read_only,
            new.nosuid,
            new.nodev,
            new.noexec,
            atime_policy(new.atime),
        ) {
            p.flags.set(p.options.read_only, p.flags.atime());
            bail!(
                "remounting {name} on {} with {new}: {e}{}; the options stay {}",
                mp.display(),
                if e.raw_os_error() == Some(libc::EBUSY) {
                    " (a file is open for writing there)"
                } else {
                    ""
                },
                p.options
            );
        }
        tracing::info!(
            "remounted {name} on {}: {} -> {new}",
            mp.display(),
            p.options
        );
        let message = format!("{name} remounted on {} ({new})", mp.display());
        p.set_options(new);
        Ok(message)
    }

    fn note_outside_unmount(p: &MountPoint) {
        tracing::warn!(
            "{} was unmounted from outside ({} is no longer its mount point, e.g. by \
             `umount`); `mako fs mount {}` or `mako up` mounts it again",
            p.name,
            p.mountpoint.display(),
            p.name
        );
    }

    /// Unmounts `name` from `mountpoint`, or from every mount point. A mount detached
    /// by `umount -l` that still serves open files is refused (it is released when they
    /// close), unless makod is `stopping`: then its connection is aborted. When the last
    /// mount point goes, the file system is written back.
    pub(crate) fn unmount_fs(
        &self,
        name: &str,
        mountpoint: Option<&Path>,
        stopping: bool,
    ) -> Result<String> {
        let _ops = self.mount_ops.lock();
        let wanted = mountpoint.map(mako_control::mount_table::canonical_mountpoint);
        if !stopping {
            // A busy mount is refused, naming what holds it (the kernel would refuse
            // it too, and the lazy unmount that follows would leave it half there).
            let points: Vec<PathBuf> = self
                .mounts
                .lock()
                .get(name)
                .map(|m| {
                    m.points
                        .iter()
                        .filter(|p| wanted.as_ref().is_none_or(|w| *w == p.mountpoint))
                        .map(|p| p.mountpoint.clone())
                        .collect()
                })
                .unwrap_or_default();
            for mp in points {
                let holders = mako_control::mount_table::holders(&mp, std::process::id());
                if !holders.is_empty() {
                    bail!(
                        "{name} on {} is busy, nothing was unmounted: held by {}. Close those \
                         files, leave those directories or stop those processes, then unmount \
                         again",
                        mp.display(),
                        mako_control::mount_table::holders_text(&holders)
                    );
                }
            }
        }
        let mut m = self
            .mounts
            .lock()
            .remove(name)
            .with_context(|| format!("{name} is not mounted"))?;
        if let Some(w) = &wanted {
            if !m.points.iter().any(|p| &p.mountpoint == w) {
                let at: Vec<String> = m
                    .points
                    .iter()
                    .map(|p| p.mountpoint.display().to_string())
                    .collect();
                self.mounts.lock().insert(name.to_string(), m);
                bail!(
                    "{name} is not mounted on {} (it is mounted on {})",
                    w.display(),
                    at.join(", ")
                );
            }
        }
        let mut done = Vec::new();
        let mut refused = Vec::new();
        let mut kept = Vec::new();
        for p in std::mem::take(&mut m.points) {
            if wanted.as_ref().is_some_and(|w| *w != p.mountpoint) {
                kept.push(p);
                continue;
            }
            let mp = p.mountpoint.clone();
            match p.settle() {
                Health::Mounted => {
                    Self::unmount_point(p);
                    done.push(mp.display().to_string());
                }
                Health::Ended => {
                    Self::note_outside_unmount(&p);
                    p.join_ended();
                    done.push(format!("{} (unmounted from outside before)", mp.display()));
                }
                Health::Detached if stopping => {
                    tracing::warn!(
                        "{name} was detached from {} (`umount -l`) and still serves open files; \
                         makod is stopping: aborting its FUSE connection (those files fail from \
                         now on)",
                        mp.display()
                    );
                    if let Err(e) = p.abort_connection() {
                        // Write back all the same: what was accepted must reach the disks.
                        tracing::error!("{e:#}; writing {name} back with its session running");
                        // Not `FuseMount::unmount`: it would unmount whatever is at the
                        // mount point now. The connection ends when makod exits.
                        std::mem::forget(p.fuse);
                    } else {
                        p.join_ended();
                    }
                    done.push(format!("{} (detached; aborted)", mp.display()));
                }
                Health::Detached => {
                    refused.push(mp.display().to_string());
                    kept.push(p);
                }
            }
        }
        m.points = kept;
        let all_gone = m.points.is_empty();
        if all_gone {
            m.write_back()?;
            tracing::info!("{name} written back");
        } else {
            self.mounts.lock().insert(name.to_string(), m);
        }
        if !refused.is_empty() {
            bail!(
                "{name} was detached from {} (`umount -l`) while files on it were open; \
                 makod serves those files until they are closed and then releases it by itself{}",
                refused.join(", "),
                if done.is_empty() {
                    String::new()
                } else {
                    format!("; unmounted from {}", done.join(", "))
                }
            );
        }
        Ok(format!(
            "{name} unmounted from {}{}",
            done.join(", "),
            if all_gone {
                ""
            } else {
                "; its other mount points stay"
            }
        ))
    }

    /// Detaches one mount point from the kernel (no new requests) and joins its threads.
    fn unmount_point(p: MountPoint) {
        let (name, mp, device) = (p.name.clone(), p.mountpoint.clone(), p.device);
        if let Err(e) = p.fuse.unmount() {
            tracing::warn!(
                "FUSE unmount of {}: {e}; trying a lazy unmount",
                mp.display()
            );
            // Only our own mount: never detach what someone else mounted there since.
            let ours = mako_control::mount_table::at(&mp)
                .is_some_and(|e| Some(e.device) == device || e.mako_fs() == Some(name.as_str()));
            if ours {
                if let Err(e) = mako_control::mount_table::lazy_unmount(&mp) {
                    tracing::warn!("lazy unmount of {}: {e}", mp.display());
                }
            }
        }
        tracing::info!("unmounted {name} from {}", mp.display());
    }

    /// Releases every mount point whose FUSE session has ended (an admin's `umount`),
    /// writes back a file system that has none left, and follows a remount made
    /// without makod (`mount -o remount,ro` that did not go through the mount helper):
    /// a mount point the kernel shows read-only is read-only for makod too. Skipped
    /// while a mount or unmount is under way: that one checks for itself.
    pub(crate) fn release_ended_mounts(&self) {
        let Some(_ops) = self.mount_ops.try_lock() else {
            return;
        };
        let mut emptied = Vec::new();
        {
            let mut mounts = self.mounts.lock();
            let table = mako_control::mount_table::read();
            for m in mounts.values_mut() {
                let (ended, kept): (Vec<_>, Vec<_>) = std::mem::take(&mut m.points)
                    .into_iter()
                    .partition(|p| p.fuse.session_ended());
                m.points = kept;
                for p in ended {
                    Self::note_outside_unmount(&p);
                    p.join_ended();
                }
                for p in m.points.iter_mut() {
                    let entry = table
                        .iter()
                        .rev()
                        .find(|e| e.mountpoint == p.mountpoint && Some(e.device) == p.device);
                    if let Some(e) = entry {
                        if e.read_only() != p.options.read_only {
                            let mut o = p.options.clone();
                            o.read_only = e.read_only();
                            tracing::info!(
                                "{} on {} was remounted {} by the kernel directly; makod follows",
                                p.name,
                                p.mountpoint.display(),
                                if o.read_only {
                                    "read-only"
                                } else {
                                    "read-write"
                                }
                            );
                            p.set_options(o);
                        }
                    }
                }
            }
            let names: Vec<String> = mounts
                .iter()
                .filter(|(_, m)| m.points.is_empty())
                .map(|(n, _)| n.clone())
                .collect();
            for n in names {
                if let Some(m) = mounts.remove(&n) {
                    emptied.push(m);
                }
            }
        }
        for m in emptied {
            let name = m.name.clone();
            match m.write_back() {
                Ok(()) => tracing::info!("{name}: written back after the unmount from outside"),
                Err(e) => tracing::error!("{name}: {e:#}"),
            }
        }
    }

    fn fs_status(&self, def: &mako_control::FsDef) -> FsStatus {
        let mounts = self.mounts.lock();
        let cluster = self.cluster.lock();
        let mut st = FsStatus {
            name: def.name.clone(),
            mountpoint: def.mountpoint.display().to_string(),
            mounted: false,
            block_bytes: 0,
            subblock_bytes: 0,
            inode_bytes: 0,
            total_bytes: 0,
            free_bytes: 0,
            inodes_used: 0,
            inodes_max: 0,
            pagepool_bytes: 0,
            pagepool_used_bytes: 0,
            pagepool_dirty_bytes: 0,
            read_only: false,
            disks: Vec::new(),
            mounts: Vec::new(),
        };
        // Mounted means mounted in the kernel, not only remembered by makod.
        let served = mounts.get(&def.name).map(|m| {
            m.points
                .iter()
                .filter(|p| p.health() == Health::Mounted)
                .collect::<Vec<_>>()
        });
        match mounts
            .get(&def.name)
            .zip(served)
            .filter(|(_, s)| !s.is_empty())
        {
            Some((m, points)) => {
                st.mountpoint = points[0].mountpoint.display().to_string();
                st.mounts = points
                    .iter()
                    .map(|p| mako_control::MountView {
                        mountpoint: p.mountpoint.display().to_string(),
                        options: p.options.to_string(),
                    })
                    .collect();
                let core = m.mounted.core();
                let sb = core.geo.subblock_bytes() as u64;
                st.mounted = true;
                st.block_bytes = core.geo.block_bytes as u64;
                st.subblock_bytes = sb;
                st.inode_bytes = core.geo.inode_bytes as u64;
                st.total_bytes = core.alloc.total_subblocks() * sb;
                // As statfs (`df`) counts it: space freed and waiting for a checkpoint is free.
                st.free_bytes = core.alloc.user_free_subblocks() * sb;
                st.inodes_used = core.imap.used();
                st.inodes_max = core.imap.inodes_max();
                st.pagepool_bytes = core.pool.limit();
                st.pagepool_used_bytes = core.pool.used_bytes();
                st.pagepool_dirty_bytes = core.pool.dirty_bytes();
                st.read_only = core.read_only.load(Ordering::Relaxed);
                let desc = core.desc.lock().clone();
                let usage = core.alloc.per_disk_usage(desc.disks.len());
                for (d, (free, total)) in desc.disks.iter().zip(usage) {
                    let path = m
                        .disk_paths
                        .iter()
                        .find(|(n, _)| *n == d.name)
                        .map(|(_, p)| p.display().to_string())
                        .unwrap_or_default();
                    // A disk reached through NSD servers: which one it uses now.
                    let path = match m.disk_access.iter().find(|(n, _)| *n == d.name) {
                        Some((_, a @ crate::net::DiskAccess::Remote(_))) => {
                            let name_of = |id: mako_rt::NodeId| {
                                cluster
                                    .node(id.0)
                                    .map_or_else(|| id.to_string(), |n| n.name.clone())
                            };
                            format!("{path} {}", a.describe(&name_of))
                        }
                        _ => path,
                    };
                    let _ = total;
                    st.disks.push(DiskStatusView {
                        name: d.name.clone(),
                        path,
                        size_bytes: d.size_bytes,
                        free_bytes: free * sb,
                        pool: d.pool.clone(),
                        failure_group: d.failure_group,
                        usage: d.usage.name().to_string(),
                        status: d.status.name().to_string(),
                    });
                }
            }
            None => {
                for d in cluster.disks_of(def) {
                    st.disks.push(DiskStatusView {
                        name: d.name.clone(),
                        path: d.path.display().to_string(),
                        size_bytes: d.size_bytes,
                        free_bytes: 0,
                        pool: d.pool.clone(),
                        failure_group: d.failure_group,
                        usage: d.usage.clone(),
                        status: "unmounted".into(),
                    });
                }
            }
        }
        st
    }

    pub(crate) fn status(&self) -> DaemonStatus {
        let cluster = self.cluster.lock().clone();
        DaemonStatus {
            node_name: cluster.node_name.clone(),
            node_id: cluster.node_id,
            pid: std::process::id(),
            data_dir: self.dir.root.as_path().display().to_string(),
            uptime_secs: self.started.elapsed().as_secs(),
            version: env!("CARGO_PKG_VERSION").to_string(),
            filesystems: cluster
                .filesystems
                .iter()
                .map(|f| self.fs_status(f))
                .collect(),
        }
    }

    pub(crate) fn each_fs<T>(&self, name: Option<&str>, f: impl Fn(&str, &Mounted) -> T) -> Vec<T> {
        self.mounts
            .lock()
            .iter()
            .filter(|(n, _)| name.is_none_or(|x| x == n.as_str()))
            .map(|(n, m)| f(n, &m.mounted))
            .collect()
    }

    /// Per mounted file system: its name, its counters (file system, then pagepool) and
    /// its disks' counters. The one source of `mako diag stats` and the metrics endpoint.
    pub(crate) fn fs_counters(&self) -> Vec<FsCounters> {
        let mut all = self.each_fs(None, |n, m| {
            let core = m.core();
            let mut c = core.stats.snapshot();
            let p = &core.pool.stats;
            for (k, v) in [
                ("pagepool_hits", &p.hits),
                ("pagepool_misses", &p.misses),
                ("pagepool_evictions", &p.evictions),
                ("prefetch_issued", &p.prefetch_issued),
                ("prefetch_used", &p.prefetch_used),
                ("prefetch_wasted", &p.prefetch_wasted),
                ("writer_waits_for_writebehind", &p.writer_waits),
            ] {
                c.push((k.to_string(), v.load(Ordering::Relaxed)));
            }
            let j = &core.journal.stats;
            for (k, v) in [
                ("log_commits", &j.commits),
                ("log_bytes", &j.commit_bytes),
                ("log_images", &j.commit_images),
                ("log_revokes", &j.commit_revokes),
                ("log_barriers", &j.barriers),
                ("log_gate_waits", &j.gate_waits),
                ("log_checkpoints", &j.checkpoints),
                ("log_checkpoint_bytes", &j.checkpoint_bytes),
            ] {
                c.push((k.to_string(), v.load(Ordering::Relaxed)));
            }
            let r = &m.recovery;
            c.push(("log_replayed_transactions".to_string(), r.transactions));
            c.push(("log_replayed_images".to_string(), r.images));
            c.push(("log_replay_revoked_images".to_string(), r.revoked));
            c.push((
                "log_replay_millis".to_string(),
                r.duration.as_millis() as u64,
            ));
            (n.to_string(), c, core.nsd.stats())
        });
        all.sort_by(|a, b| a.0.cmp(&b.0));
        all
    }

    fn stats_view(&self) -> StatsView {
        let mut fss = Vec::new();
        let mut disks = Vec::new();
        for (name, counters, dstats) in self.fs_counters() {
            fss.push(FsCountersView { name, counters });
            for d in dstats {
                disks.push(DiskCountersView {
                    name: d.name,
                    reads: d.reads,
                    writes: d.writes,
                    read_bytes: d.read_bytes,
                    write_bytes: d.write_bytes,
                    read_ms_avg: if d.reads > 0 {
                        d.read_micros as f64 / d.reads as f64 / 1000.0
                    } else {
                        0.0
                    },
                    write_ms_avg: if d.writes > 0 {
                        d.write_micros as f64 / d.writes as f64 / 1000.0
                    } else {
                        0.0
                    },
                    errors: d.errors,
                });
            }
        }
        StatsView {
            filesystems: fss,
            disks,
        }
    }

    /// `mako fsck --online`: the checker reads the committed state of the mounted file
    /// system (disks with the log's overlay) while commits are held off, so what it
    /// reads cannot change under it; operations go on in memory meanwhile, and an fsync
    /// waits until the check ends.
    fn fsck_online(&self, name: &str, threads: usize) -> Result<FsckView> {
        let core = {
            let mounts = self.mounts.lock();
            let m = mounts.get(name).ok_or_else(|| {
                anyhow::anyhow!("file system {name} is not mounted by this makod; check it offline with `mako fsck {name}`")
            })?;
            m.mounted.core().clone()
        };
        let started = Instant::now();
        let hold = core
            .journal
            .hold_commits(&core)
            .with_context(|| format!("committing {name} before the check"))?;
        let desc = core.desc.lock().clone();
        let reader = OnlineReader { core: &core };
        let opts = mako_fsck::Options::check().threads(threads.max(1));
        let result = mako_fsck::check_through(&desc, &reader, &opts, &mako_fsck::NoProgress);
        drop(hold);
        let report = result.map_err(|e| anyhow::anyhow!("online check of {name}: {e}"))?;
        tracing::info!(
            "online fsck of {name}: {} problems, exit {}, commits held for {:.2} s",
            report.problems.len(),
            report.exit_code,
            started.elapsed().as_secs_f64()
        );
        Ok(FsckView {
            exit_code: report.exit_code,
            text: report.render(),
            json: report.to_json(),
        })
    }

    /// Gives the running daemon a parameter value of the replicated configuration,
    /// which the applier has already saved in config.toml (`None`: unset).
    pub(crate) fn apply_cluster_param(&self, name: &str, value: Option<&str>) -> Result<String> {
        let spec = mako_config::lookup(name)?;
        if spec.apply != mako_config::Apply::Immediate {
            return self.config_set(name, value.unwrap_or_default(), false);
        }
        match value {
            Some(v) => self.config_set(name, v, true),
            None => {
                *self.config.write() = Self::load_config(&self.dir)?;
                let text = self.config.read().entry(name)?.value.to_string();
                self.config_set(name, &text, true)
            }
        }
    }

    /// Recovery of an expelled node, on the cluster manager once the expel is
    /// committed (`crate::recovery`): on every file system of the cluster, by this
    /// node if it mounts it, else by the surviving nodes in the order of their
    /// numbers, each asked over the `Recovery` service until one that mounts it has
    /// recovered it, else at the next mount. Logged either way, and noted for `mako
    /// node show` (`Leases::note_recovered`).
    pub(crate) fn recover_expelled(&self, node: mako_rt::NodeId, epoch: u64) {
        let done = self.recover_on_each_fs(node, epoch);
        if let Ok(member) = self.member() {
            member.leases.note_recovered(node, epoch, done.join("; "));
        }
    }

    /// `recover_expelled` on each file system: what happened on each.
    fn recover_on_each_fs(&self, node: mako_rt::NodeId, epoch: u64) -> Vec<String> {
        use crate::recovery::{RecoveryReply, RecoveryRequest};
        let mut outcome = Vec::new();
        let names: Vec<String> = self
            .cluster
            .lock()
            .filesystems
            .iter()
            .map(|f| f.name.clone())
            .collect();
        for fs in names {
            match self.recover_here(&fs, node, epoch) {
                RecoveryReply::NotMounted => {}
                // Logged by recover_here.
                RecoveryReply::Recovered { millis, .. } => {
                    outcome.push(format!(
                        "recovered on {fs} by the cluster manager in {millis} ms"
                    ));
                    continue;
                }
                RecoveryReply::Failed(e) => {
                    outcome.push(format!("recovery on {fs} failed: {e}"));
                    continue;
                }
            }
            let (Some(net), Ok(member)) = (&self.net, self.member()) else {
                continue;
            };
            let me = mako_rt::NodeId(net.me.id);
            let config = member.quorum().read_local();
            let survivors: Vec<mako_rt::NodeId> = config
                .nodes
                .keys()
                .copied()
                .filter(|id| *id != me && *id != node && config.lease_of(*id).expelled.is_none())
                .collect();
            let request = RecoveryRequest::Recover {
                fs: fs.clone(),
                node: node.0,
                epoch,
            };
            let mut done = false;
            for survivor in survivors {
                let started = Instant::now();
                let reply: Result<RecoveryReply, _> = mako_rt::transport::call(
                    &*net.transport,
                    survivor,
                    mako_rt::ServiceId::Recovery,
                    &request,
                    mako_rt::CallOptions {
                        priority: mako_rt::Priority::Small,
                        // A hang guard: the survivor replays a whole log meanwhile.
                        deadline: Duration::from_secs(600),
                    },
                );
                match reply {
                    Ok(RecoveryReply::Recovered { millis, summary }) => {
                        tracing::warn!(
                            "{fs}: {node} (lease epoch {epoch}) recovered by {survivor} in {} ms \
                             ({millis} ms there): {summary}",
                            started.elapsed().as_millis()
                        );
                        outcome.push(format!("recovered on {fs} by {survivor} in {millis} ms"));
                        done = true;
                        break;
                    }
                    Ok(RecoveryReply::NotMounted) => {}
                    Ok(RecoveryReply::Failed(e)) => tracing::error!(
                        "{fs}: {survivor} mounts it but could not recover {node} (lease epoch \
                         {epoch}): {e}; asking the next survivor"
                    ),
                    Err(e) => tracing::warn!(
                        "{fs}: asking {survivor} to recover {node} (lease epoch {epoch}) \
                         failed: {e}; asking the next survivor"
                    ),
                }
            }
            if !done {
                tracing::warn!(
                    "{fs}: no surviving node mounts it, so nobody replays the log of {node} \
                     (lease epoch {epoch}) now: the next node that mounts {fs} replays it \
                     before its mount is served"
                );
                outcome.push(format!(
                    "{fs} mounted by no survivor: recovered at its next mount"
                ));
            }
        }
        outcome
    }

    /// Recovers expelled node `node` on file system `fs` if this node mounts it
    /// (`mako_fs::recovery::recover_failed_node`: its log replayed, its tokens
    /// released); the cluster manager's own recovery and the `Recovery` service.
    pub(crate) fn recover_here(
        &self,
        fs: &str,
        node: mako_rt::NodeId,
        epoch: u64,
    ) -> crate::recovery::RecoveryReply {
        use crate::recovery::RecoveryReply;
        let core = match self.mounts.lock().get(fs) {
            Some(m) => m.mounted.core().clone(),
            None => return RecoveryReply::NotMounted,
        };
        let started = Instant::now();
        match mako_fs::recovery::recover_failed_node(&core, node.0) {
            Ok(report) => {
                let millis = started.elapsed().as_millis() as u64;
                tracing::warn!(
                    "{fs}: {node} (lease epoch {epoch}) recovered in {millis} ms: {}",
                    report.summary()
                );
                recount_in_background(fs, core, report.clone());
                RecoveryReply::Recovered {
                    millis,
                    summary: report.summary(),
                }
            }
            Err(e) => {
                tracing::error!(
                    "{fs}: recovery of {node} (lease epoch {epoch}) failed: {e}; its tokens \
                     stay held until it is recovered at the next mount of {fs}"
                );
                RecoveryReply::Failed(e.to_string())
            }
        }
    }

    /// At a mount, before it is served: recovers every node the replicated
    /// configuration lists as expelled and not rejoined (`crate::recovery` step 3: an
    /// expel while no survivor mounted the file system). A log already replayed
    /// replays nothing. A failure fails the mount: the failed node's tokens must not be
    /// trusted before its log is replayed.
    fn recover_at_mount(&self, fs: &str, mounted: &Mounted) -> Result<()> {
        let (Some(net), Ok(member)) = (&self.net, self.member()) else {
            return Ok(());
        };
        let config = member.quorum().read_local();
        let core = mounted.core();
        for (id, _) in config.nodes.iter() {
            let lease = config.lease_of(*id);
            if id.0 == net.me.id || lease.expelled.is_none() {
                continue;
            }
            let started = Instant::now();
            let report = mako_fs::recovery::recover_failed_node(core, id.0).with_context(|| {
                format!(
                    "{fs}: recovering expelled {id} (lease epoch {}) before this mount is served",
                    lease.epoch
                )
            })?;
            recount_in_background(fs, core.clone(), report.clone());
            tracing::warn!(
                "{fs}: {id} (lease epoch {}) expelled and not rejoined: recovered at this mount \
                 in {} ms: {}",
                lease.epoch,
                started.elapsed().as_millis(),
                report.summary()
            );
        }
        Ok(())
    }

    fn member(&self) -> Result<Arc<crate::member::Member>> {
        self.member.lock().clone().ok_or_else(|| {
            anyhow::anyhow!(
                "this makod is the whole cluster (its cluster.toml lists no [[nodes]]): it \
                 keeps no replicated configuration; `mako config set` changes it directly"
            )
        })
    }

    fn config_set(&self, name: &str, value: &str, immediate: bool) -> Result<String> {
        if !immediate {
            // Re-read the saved file so the next mount uses it.
            *self.config.write() = Self::load_config(&self.dir)?;
            return Ok(format!("{name} saved; it applies at the next mount"));
        }
        let old = self.config.write().apply_immediate(name, value)?;
        let c = self.config.read().clone();
        for (_, m) in self.mounts.lock().iter() {
            m.direct_io_file_size
                .store(c.fuse_direct_io_file_size(), Ordering::Relaxed);
            let core = m.mounted.core();
            let mut fc = core.cfg.write();
            let new = fs_config(&c);
            fc.prefetch_aggressiveness_read = new.prefetch_aggressiveness_read;
            fc.avoid_dir_fragments = new.avoid_dir_fragments;
            fc.dir_pre_split_levels = new.dir_pre_split_levels;
            fc.iohist_size = new.iohist_size;
            core.nsd.history().set_capacity(new.iohist_size);
        }
        Ok(format!(
            "{name} changed from {old} to {value} in the running daemon"
        ))
    }
}

impl ControlHandler for Daemon {
    fn handle(&self, request: Request) -> Response {
        let r: Result<Response> = (|| {
            Ok(match request {
                Request::Status => Response::Status(self.status()),
                Request::Mount {
                    fs,
                    mountpoint,
                    options,
                } => Response::ok(self.mount_fs(
                    &fs,
                    mountpoint.as_deref().map(Path::new),
                    &options,
                )?),
                Request::Unmount { fs, mountpoint } => Response::ok(self.unmount_fs(
                    &fs,
                    mountpoint.as_deref().map(Path::new),
                    false,
                )?),
                Request::Shutdown => {
                    self.stop.store(true, Ordering::SeqCst);
                    Response::ok("makod is stopping: writing back and unmounting")
                }
                Request::Sync => {
                    for r in self.each_fs(None, |n, m| {
                        m.fs.sync().with_context(|| format!("sync of {n}"))
                    }) {
                        r?;
                    }
                    Response::ok("all file systems written back")
                }
                Request::ClearCache { fs } => {
                    for r in self.each_fs(fs.as_deref(), |n, m| {
                        m.fs.clear_cache()
                            .with_context(|| format!("clearing the cache of {n}"))
                    }) {
                        r?;
                    }
                    Response::ok("pagepool written back and clean buffers dropped")
                }
                Request::ConfigSet {
                    name,
                    value,
                    immediate,
                } => Response::ok(self.config_set(&name, &value, immediate)?),
                Request::DiagIohist { last } => {
                    let mut out: Vec<IoRecordView> = Vec::new();
                    for recs in self.each_fs(None, |_, m| m.core().nsd.history().last(last)) {
                        for r in recs {
                            out.push(IoRecordView {
                                start_unix_micros: r
                                    .start
                                    .duration_since(std::time::UNIX_EPOCH)
                                    .map(|d| d.as_micros() as u64)
                                    .unwrap_or(0),
                                write: r.write,
                                buffer_type: r.buffer_type.name().to_string(),
                                disk: r.disk,
                                sector: r.sector,
                                sectors: r.sectors,
                                service_ms: r.service.as_secs_f64() * 1000.0,
                                queue_ms: r.queue.as_secs_f64() * 1000.0,
                                thread: r.thread,
                                ino: Some(r.ino),
                                ok: r.ok,
                            });
                        }
                    }
                    out.sort_by_key(|r| r.start_unix_micros);
                    let skip = out.len().saturating_sub(last);
                    Response::Iohist(out.into_iter().skip(skip).collect())
                }
                Request::DiagWaiters { threshold_ms } => Response::Waiters(
                    mako_diag::waiters::snapshot(Duration::from_millis(threshold_ms))
                        .into_iter()
                        .map(|w| WaiterView {
                            thread: w.thread,
                            waiting_ms: w.waiting.as_secs_f64() * 1000.0,
                            what: w.what,
                        })
                        .collect(),
                ),
                Request::DiagCounters => Response::Counters(
                    mako_diag::lock_stats::snapshot()
                        .into_iter()
                        .map(|c| LockCounterView {
                            name: c.name.to_string(),
                            acquisitions: c.acquisitions,
                            contended: c.contended,
                            wait_total_ms: c.wait_total_ns as f64 / 1e6,
                            wait_max_ms: c.wait_max_ns as f64 / 1e6,
                        })
                        .collect(),
                ),
                Request::DiagStats => Response::Stats(self.stats_view()),
                Request::DiagTokens => {
                    let cluster = self.cluster.lock().clone();
                    let manager_name = |id: u32| match (&self.net, cluster.node(id)) {
                        (None, _) => String::new(),
                        (Some(_), Some(n)) => n.name.clone(),
                        (Some(_), None) => format!("node {id}"),
                    };
                    let mut out = Vec::new();
                    for list in self.each_fs(None, |_, m| m.core().tokens.dump()) {
                        out.extend(list.into_iter().map(|(resource, manager, holders)| {
                            TokenView {
                                resource,
                                manager: manager_name(manager),
                                holders,
                            }
                        }));
                    }
                    Response::Tokens(out)
                }
                Request::Fsck { fs, threads } => Response::Fsck(self.fsck_online(&fs, threads)?),
                Request::ClusterShow => Response::Cluster(self.member()?.view()),
                Request::ClusterParam { name, value, nodes } => {
                    Response::ok(self.member()?.set_param(&name, value.as_deref(), &nodes)?)
                }
                Request::ClusterDeleteDisk { name } => {
                    Response::ok(self.member()?.delete(&name, false)?)
                }
                Request::ClusterDeleteFs { name } => {
                    Response::ok(self.member()?.delete(&name, true)?)
                }
                Request::ClusterAddNode {
                    id,
                    name,
                    address,
                    roles,
                } => Response::ok(self.member()?.add_node(id, &name, &address, &roles)?),
                Request::ClusterRemoveNode { name } => {
                    Response::ok(self.member()?.remove_node(&name)?)
                }
                Request::DiagConfig => Response::Config(
                    self.config
                        .read()
                        .show_table()
                        .into_iter()
                        .map(|r| ConfigRowView {
                            name: r.name.to_string(),
                            value: r.value,
                            source: format!("{:?}", r.source),
                            default: r.default,
                            range: r.range,
                            apply: format!("{:?}", r.apply).to_lowercase(),
                        })
                        .collect(),
                ),
            })
        })();
        r.unwrap_or_else(|e| Response::error(format!("{e:#}")))
    }
}

/// SIGTERM, SIGINT and SIGHUP become a stop request: makod writes everything back and
/// unmounts, as for `mako down`. The handlers (signal-hook's, with SA_RESTART) only
/// wake the "signals" thread, which sets the flag the main loop watches.
pub(crate) fn watch_signals(stop: Arc<AtomicBool>) -> Result<()> {
    use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
    let mut signals = signal_hook::iterator::Signals::new([SIGTERM, SIGINT, SIGHUP])
        .context("installing the handlers of SIGTERM, SIGINT and SIGHUP")?;
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            if let Some(signal) = signals.forever().next() {
                tracing::info!("signal {signal}: stopping");
                stop.store(true, Ordering::SeqCst);
            }
        })
        .context("starting the signal thread")?;
    Ok(())
}

pub fn run(root: &Path) -> Result<()> {
    // Before any FUSE mount (see `fuse_guard`): it must not inherit a /dev/fuse.
    crate::fuse_guard::start();
    let dir = DataDir::new(root);
    let stop = Arc::new(AtomicBool::new(false));
    watch_signals(stop.clone())?;
    let cluster = ClusterConfig::load(root).with_context(|| {
        format!(
            "no cluster in {}; create one with `mako up`",
            root.display()
        )
    })?;
    let config = Daemon::load_config(&dir)?;
    if unsafe { libc::geteuid() } == 0 {
        let block = 16 << 20;
        if let Some(pages) = raise_fuse_max_pages(config.fuse_max_write_bytes().max(block)) {
            tracing::info!(
                "FUSE max_pages_limit {pages} ({} KiB per request at most)",
                pages * 4
            );
        }
    }
    let net = crate::net::NetNode::start(&dir, &cluster, &config)?;
    let daemon = Arc::new(Daemon {
        dir: dir.clone(),
        cluster: Mutex::new(cluster.clone()),
        config: RwLock::new(config),
        mounts: Mutex::new(HashMap::new()),
        mount_ops: Mutex::new(()),
        started: Instant::now(),
        stop: stop.clone(),
        net,
        member: Mutex::new(None),
    });
    if let Some(net) = &daemon.net {
        let transport: Arc<dyn mako_rt::Transport> = net.transport.clone();
        let times = mako_cluster::lease::LeaseTimes::from_config(&daemon.config.read());
        let member =
            crate::member::Member::start(&dir, &cluster, transport, net.registry.clone(), times)?;
        if let Some(nsd) = &net.nsd {
            nsd.set_fence(Arc::new(crate::lease::LeaseFence(member.quorum())));
        }
        // Token, metanode and space requests of an expelled node are refused too: one
        // back from a pause or a partition must not undo what a survivor recovered.
        let fence = crate::lease::LeaseFence(member.quorum());
        net.registry.set_admit(Arc::new(move |from, _| {
            mako_nsd::server::Fence::admit(&fence, from)
        }));
        let weak = Arc::downgrade(&daemon);
        let tcp = net.transport.clone();
        let me = mako_rt::NodeId(net.me.id);
        let expelled_seen = Mutex::new(std::collections::BTreeSet::new());
        member.start_applier(
            &dir,
            Box::new(
                move |name: &str, value: Option<&str>| match weak.upgrade() {
                    Some(d) => d.apply_cluster_param(name, value),
                    None => Ok("makod is stopping".to_string()),
                },
            ),
            // Peers follow the configuration's node list: a node added is reachable
            // (revokes, raft), a node removed is forgotten and refused. Calls waiting
            // for a node expelled since the last epoch give up (a stopped node keeps
            // its connections open: they would wait out their deadlines, 60 s for a
            // token request whose manager slot moved to a survivor meanwhile).
            Box::new(move |config| {
                let nodes = &config.nodes;
                let mut seen = expelled_seen.lock();
                for id in nodes.keys() {
                    let expelled = config.lease_of(*id).expelled.is_some();
                    if expelled && *id != me && seen.insert(*id) {
                        tracing::info!(
                            "node {} was expelled: calls waiting for its answers give up",
                            id.0
                        );
                        tcp.give_up_on(*id);
                    } else if !expelled {
                        seen.remove(id);
                    }
                }
                drop(seen);
                for (id, e) in nodes {
                    if let Some(addr) = e.addresses.first() {
                        if *id != me && tcp.peers().get(id) != Some(addr) {
                            tracing::info!("node {} ({}) is a peer at {addr}", id.0, e.name);
                            tcp.set_peer(*id, *addr);
                        }
                    }
                }
                for id in tcp.peers().keys() {
                    if !nodes.contains_key(id) && *id != me {
                        tracing::info!(
                            "node {} is no longer in the cluster's configuration: its \
                             connections are closed and refused",
                            id.0
                        );
                        tcp.remove_member(*id);
                    }
                }
            }),
        )?;
        let weak = Arc::downgrade(&daemon);
        net.registry.register(
            mako_rt::NodeId(net.me.id),
            mako_rt::ServiceId::Recovery,
            Arc::new(crate::recovery::RecoveryService(Arc::downgrade(&daemon))),
        );
        member.leases.set_on_expel(Arc::new(move |node, epoch| {
            if let Some(d) = weak.upgrade() {
                d.recover_expelled(node, epoch);
            }
        }));
        // A manager node serves its slots, and takes over the slot of a manager node
        // that failed (`crate::shards`).
        if let Some(manager) = &net.token_manager {
            let (manager, quorum, transport, stop) = (
                manager.clone(),
                member.quorum(),
                net.transport.clone() as Arc<dyn mako_rt::Transport>,
                stop.clone(),
            );
            let managers = net.manager_ids();
            std::thread::Builder::new()
                .name("token-takeover".into())
                .spawn(move || {
                    crate::shards::run_takeover(manager, quorum, transport, me, managers, stop)
                })
                .context("starting the token-takeover thread")?;
        }
        *daemon.member.lock() = Some(member);
    }
    tracing::info!(
        "makod {} starting: node {} (id {}), data dir {}",
        env!("CARGO_PKG_VERSION"),
        cluster.node_name,
        cluster.node_id,
        root.display()
    );
    let server = mako_control::serve(&dir.socket_file(), daemon.clone(), stop.clone())
        .with_context(|| format!("control socket {}", dir.socket_file().display()))?;
    // The metrics endpoint starts before the mounts so a scrape during a slow mount
    // still answers (with the daemon's figures); a bind failure is logged, never fatal.
    let metrics = daemon
        .config
        .read()
        .prometheus_socket_addr()
        .and_then(|addr| crate::metrics::start(addr, daemon.clone(), stop.clone()));
    let mut failed = Vec::new();
    for f in cluster.filesystems.iter().filter(|f| f.automount) {
        if let Err(e) = daemon.mount_fs(&f.name, None, &f.mount_options) {
            tracing::error!("{e:#}");
            failed.push(format!("{e:#}"));
        }
    }
    if !failed.is_empty()
        && daemon.mounts.lock().is_empty()
        && cluster.filesystems.iter().any(|f| f.automount)
    {
        stop.store(true, Ordering::SeqCst);
        let member = daemon.member.lock().take();
        if let Some(member) = member {
            member.shutdown();
        }
        let _ = server.join();
        bail!("no file system could be mounted: {}", failed.join("; "));
    }
    // The stop flag is looked at often (`mako down` waits for it); mounts ended from
    // outside (umount) are looked for every 100 ms (that reads the mount table).
    let mut tick = 0u32;
    while !stop.load(Ordering::SeqCst) {
        if tick % 5 == 0 {
            daemon.release_ended_mounts();
        }
        tick = tick.wrapping_add(1);
        std::thread::sleep(Duration::from_millis(20));
    }
    let names: Vec<String> = daemon.mounts.lock().keys().cloned().collect();
    let mut errors = Vec::new();
    for n in names {
        if let Err(e) = daemon.unmount_fs(&n, None, true) {
            tracing::error!("{e:#}");
            errors.push(format!("{e:#}"));
        }
    }
    let member = daemon.member.lock().take();
    if let Some(member) = member {
        member.shutdown();
    }
    if let Some(net) = &daemon.net {
        // After every file system is written back and its tokens given up.
        net.shutdown();
    }
    let _ = server.join();
    if let Some(m) = metrics {
        let _ = m.join();
    }
    remove_own_pid_file(&dir);
    if !errors.is_empty() {
        bail!("stopped with errors: {}", errors.join("; "));
    }
    Ok(())
}

/// Removes `makod.pid` (written by `mako up`) if it names this process, so that after a
/// stop by a signal a pid file is left only by a makod that died.
fn remove_own_pid_file(dir: &DataDir) {
    let path = dir.pid_file();
    let ours = std::fs::read_to_string(&path)
        .ok()
        .and_then(|t| t.trim().parse::<u32>().ok())
        == Some(std::process::id());
    if ours {
        let _ = std::fs::remove_file(&path);
    }
}

/// The committed state of a mounted file system, as `mako_fsck` reads it online.
struct OnlineReader<'a> {
    core: &'a mako_fs::core::Core,
}

impl mako_fsck::MetadataReader for OnlineReader<'_> {
    fn read(
        &self,
        da: mako_format::DiskAddress,
        buf: &mut [u8],
        what: mako_disk::BufferType,
        ino: u64,
    ) -> Result<(), mako_disk::DiskError> {
        self.core.nsd.read(
            da,
            buf,
            mako_disk::nsd::IoTag {
                buffer_type: what,
                ino,
            },
        )?;
        self.core.journal.overlay(da, buf);
        Ok(())
    }
}

/// Waits until this node holds a lease and returns its epoch: a file system is
/// mounted at one epoch and fenced after it. While no cluster manager is known (after
/// 2 s) and within the start-up grace — the quorum nodes start one after another and
/// the first mounts before the others run — it mounts at epoch 0, which takes the
/// first epoch granted; with a manager known it waits up to two renewal intervals.
fn wait_for_lease(
    lease: &mako_cluster::lease::NodeLease,
    leader_known: &dyn Fn() -> bool,
    expelled_in_config: &dyn Fn() -> bool,
) -> Result<u64> {
    let start = Instant::now();
    let deadline = start + lease.times().renew_interval() * 2;
    // An expelled node (restarted after a crash, or resumed after a pause) mounts only
    // once it rejoined, which waits for a survivor to replay its log: its I/O would be
    // refused before (by the NSD servers and its own fence).
    let rejoin_deadline = start + crate::lease::holder_down_wait(lease.times());
    let mut logged = false;
    loop {
        let expelled = matches!(
            lease.state(),
            mako_cluster::lease::LeaseState::Expelled { .. }
        ) || expelled_in_config();
        if expelled {
            if Instant::now() >= rejoin_deadline {
                bail!(
                    "this node is expelled from the cluster and did not rejoin within {:?}; \
                     see makod.log for why",
                    rejoin_deadline - start
                );
            }
            if !logged {
                tracing::warn!(
                    "this node is expelled from the cluster: the mount waits until it rejoined \
                     (once a survivor has replayed its log)"
                );
                logged = true;
            }
            std::thread::sleep(Duration::from_millis(50));
            continue;
        }
        let no_manager = !leader_known() && start.elapsed() >= Duration::from_secs(2);
        match lease.check() {
            Ok(epoch) => return Ok(epoch),
            Err(_) if (no_manager || Instant::now() >= deadline) && lease.in_startup_grace() => {
                tracing::warn!(
                    "mounting before this node holds a lease (no cluster manager answers yet): \
                     its disk I/O is allowed for failureDetectionTime after makod started, \
                     then only with a lease"
                );
                return Ok(0);
            }
            Err(why) if Instant::now() >= deadline => {
                bail!("no lease from the cluster manager, so no disk I/O: {why}")
            }
            Err(_) => std::thread::sleep(Duration::from_millis(50)),
        }
    }
}

/// Step 3 of a recovery (`mako_fs::recovery::recount_after`), on a thread of its own:
/// the recount acquires directory tokens and may wait, and the recovery (the failed
/// node's tokens released) must not wait for it. Logged when done.
fn recount_in_background(
    fs: &str,
    core: std::sync::Arc<mako_fs::core::Core>,
    mut report: mako_fs::recovery::NodeRecoveryReport,
) {
    if report.replay.directories.is_empty() && report.replay.orphans.is_empty() {
        return;
    }
    let name = fs.to_string();
    let spawned = std::thread::Builder::new()
        .name(format!("recount-{}", report.failed))
        .spawn(move || {
            let started = Instant::now();
            mako_fs::recovery::recount_after(&core, &mut report);
            tracing::warn!(
                "{name}: entry counts after the recovery of node {} recounted in {} ms: {} \
                 directories, {} fixed {:?}, {} not recounted {:?}; inodes it left in use \
                 with no links: {} freed {:?}, {} not freed {:?}",
                report.failed,
                started.elapsed().as_millis(),
                report.recounted,
                report.recount_fixed.len(),
                report.recount_fixed,
                report.recount_failed.len(),
                report.recount_failed,
                report.reclaimed.len(),
                report.reclaimed,
                report.reclaim_failed.len(),
                report.reclaim_failed
            );
        });
    if let Err(e) = spawned {
        tracing::error!("{fs}: no thread for the entry-count recount: {e}");
    }
}
