//! A cluster of several makod processes on this machine, in a private temp directory:
//! [`NetCluster::up`] runs `mako up --nodes N` (node i: its own data directory
//! `<root>/data/node<i>`, its own loopback port, its own FUSE mount `<root>/fs.node<i>`;
//! node 0 runs the token and file-system managers; the disk files are shared), the nodes
//! reaching each other over mako-rpc's TCP transport. [`NetCluster::finish`] runs
//! `mako down` (clients first, the manager last) and `mako fsck -n`, which must find
//! the disks clean.
//!
//! Dropping the guard cleans up whatever happened, also when the test panics (it then
//! prints the tail of every node's makod.log first): `mako down` (bounded), SIGKILL of every node's makod that still runs, lazy unmount of
//! anything mounted below the temp dir, removal of the temp dir (only when nothing is
//! mounted below it).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context as _, Result};

use crate::cluster::{
    binaries, detach_mounts_below, is_mounted, mounts_below, process_alive, run_cmd, CmdOutput,
};

/// How long one `mako` command may take (`mako up --nodes 3` formats and starts three
/// daemons one after another).
const CMD_LIMIT: Duration = Duration::from_secs(240);
/// The file system `mako up` makes.
pub const FS_NAME: &str = "fs1";

/// Parameters of a multi-process test cluster.
#[derive(Clone, Debug)]
pub struct NetClusterOptions {
    pub nodes: u32,
    pub disks: u32,
    pub disk_size: String,
    pub pagepool: String,
    pub block_size: String,
    /// Made with `mako cluster create <these args>` and started with `mako startup -a`
    /// instead of `mako up --nodes`.
    pub create_args: Option<Vec<String>>,
    /// `mako up --nsd-servers`: only these nodes open the disk files and serve them,
    /// primary first; the others reach the disks through them (empty: every node opens
    /// the disk files itself).
    pub nsd_servers: Vec<u32>,
    /// Parameters written into the overview's config.toml before the cluster is made
    /// (every node's config.toml starts as a copy), e.g. `("failureDetectionTime",
    /// "10")`.
    pub config: Vec<(String, String)>,
}

impl Default for NetClusterOptions {
    fn default() -> Self {
        NetClusterOptions {
            nodes: 3,
            disks: 2,
            disk_size: "2G".into(),
            pagepool: "128M".into(),
            block_size: "1M".into(),
            create_args: None,
            nsd_servers: Vec::new(),
            config: Vec::new(),
        }
    }
}

impl NetClusterOptions {
    /// `nodes` nodes for lease and failure tests: node0 the only quorum node (the
    /// cluster manager) and the NSD server of one disk of `disk_size`, the others
    /// clients without disk access, with these `failureDetectionTime` and
    /// `minMissedPingTimeout` (seconds).
    pub fn leased(
        nodes: u32,
        disk_size: &str,
        failure_detection_s: u32,
        min_missed_ping_s: u32,
    ) -> Self {
        NetClusterOptions {
            nodes,
            disks: 1,
            disk_size: disk_size.into(),
            nsd_servers: vec![0],
            create_args: Some(vec!["--quorum-nodes".into(), "node0".into()]),
            config: vec![
                (
                    "failureDetectionTime".into(),
                    failure_detection_s.to_string(),
                ),
                ("minMissedPingTimeout".into(), min_missed_ping_s.to_string()),
            ],
            ..NetClusterOptions::default()
        }
    }
}

/// A running multi-process cluster; see the module docs.
pub struct NetCluster {
    root: Option<tempfile::TempDir>,
    root_path: PathBuf,
    data: PathBuf,
    mako: PathBuf,
    makod: PathBuf,
    nodes: u32,
    /// Every makod pid seen, killed at cleanup if still alive.
    pids: Vec<u32>,
    up: bool,
}

impl NetCluster {
    /// Creates the cluster and starts every node (`mako up --nodes`); each is mounted
    /// when this returns.
    pub fn up(opts: NetClusterOptions) -> Result<NetCluster> {
        let (mako, makod) = binaries()?;
        let base = ["/var/tmp", "/tmp"]
            .into_iter()
            .map(PathBuf::from)
            .find(|p| p.is_dir())
            .unwrap_or_else(std::env::temp_dir);
        let root = tempfile::Builder::new()
            .prefix("mako-net-")
            .tempdir_in(&base)
            .context("create temp dir")?;
        let root_path = root.path().to_path_buf();
        let mut c = NetCluster {
            data: root_path.join("data"),
            root_path,
            root: Some(root),
            mako,
            makod,
            nodes: opts.nodes,
            pids: Vec::new(),
            up: false,
        };
        if !opts.config.is_empty() {
            std::fs::create_dir_all(&c.data).context("create the data directory")?;
            let text: String = opts
                .config
                .iter()
                .map(|(k, v)| format!("{k} = \"{v}\"\n"))
                .collect();
            std::fs::write(c.data.join("config.toml"), text).context("write config.toml")?;
        }
        let fs = c.root_path.join("fs");
        let nodes = opts.nodes.to_string();
        let disks = opts.disks.to_string();
        let mut args: Vec<String> = match &opts.create_args {
            Some(extra) => ["cluster", "create"]
                .into_iter()
                .map(String::from)
                .chain(extra.iter().cloned())
                .collect(),
            None => vec!["up".into()],
        };
        args.extend(
            [
                "--nodes",
                &nodes,
                "--mountpoint",
                path_str(&fs)?,
                "--disks",
                &disks,
                "--disk-size",
                &opts.disk_size,
                "--block-size",
                &opts.block_size,
                "--pagepool",
                &opts.pagepool,
            ]
            .into_iter()
            .map(String::from),
        );
        let servers = opts
            .nsd_servers
            .iter()
            .map(|i| i.to_string())
            .collect::<Vec<_>>()
            .join(",");
        if !servers.is_empty() {
            args.extend(["--nsd-servers".to_string(), servers]);
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let mut out = c.mako(&args);
        if opts.create_args.is_some() && out.as_ref().is_ok_and(|o| o.success()) {
            c.up = true;
            out = c.mako(&["startup", "-a"]);
        }
        c.note_pids();
        let out = out?;
        if !out.success() {
            bail!("mako up --nodes {nodes} failed: {out}\n{}", c.logs_tail(15));
        }
        c.up = true;
        for i in 0..opts.nodes {
            if !is_mounted(&c.mount(i)) {
                bail!(
                    "mako up said the cluster is up but {} is not mounted:\n{out}",
                    c.mount(i).display()
                );
            }
        }
        Ok(c)
    }

    /// `mako node show`, asked through node 0's data directory (panics if it fails).
    pub fn node_show(&self) -> String {
        let out = self
            .mako_in(&self.node_dir(0), &["node", "show"])
            .expect("mako node show");
        assert!(out.success(), "mako node show: {out}");
        out.stdout.clone()
    }

    /// Node `i`'s mount point.
    pub fn mount(&self, i: u32) -> PathBuf {
        self.root_path.join(format!("fs.node{i}"))
    }

    /// Node `i`'s data directory.
    pub fn node_dir(&self, i: u32) -> PathBuf {
        self.data.join(format!("node{i}"))
    }

    /// The cluster's overview data directory.
    pub fn data_dir(&self) -> &Path {
        &self.data
    }

    /// Tells the fixture the cluster has `n` nodes now (`mako node add`): the added
    /// node's makod is then watched and stopped like the others.
    pub fn set_nodes(&mut self, n: u32) {
        self.nodes = n;
        self.note_pids();
    }

    pub fn nodes(&self) -> u32 {
        self.nodes
    }

    /// The makod binary.
    pub fn makod_binary(&self) -> &Path {
        &self.makod
    }

    /// `kill -9` of node `i`'s makod; returns once the process is gone.
    pub fn kill9(&mut self, i: u32) -> Result<()> {
        self.note_pids();
        let pid = self
            .pid(i)
            .with_context(|| format!("node {i} has no makod.pid"))?;
        unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) };
        // A hang guard only: SIGKILL ends a process at once unless it is stuck in the
        // kernel.
        let t = Instant::now();
        while process_alive(pid) {
            if t.elapsed() > Duration::from_secs(60) {
                bail!("node {i}'s makod pid {pid} outlived SIGKILL for 60 s");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(())
    }

    /// Sends `signal` (SIGSTOP, SIGCONT) to node `i`'s makod. The cleanup sends
    /// SIGCONT to every makod it saw before anything else, so a stopped node never
    /// outlives a failed test.
    pub fn signal(&mut self, i: u32, signal: libc::c_int) -> Result<()> {
        self.note_pids();
        let pid = self
            .pid(i)
            .with_context(|| format!("node {i} has no makod.pid"))?;
        if unsafe { libc::kill(pid as libc::pid_t, signal) } != 0 {
            bail!(
                "signal {signal} to node {i}'s makod pid {pid}: {}",
                std::io::Error::last_os_error()
            );
        }
        Ok(())
    }

    /// `mako up` of the cluster again: starts every node that does not run.
    pub fn start_stopped(&mut self) -> Result<()> {
        let out = self.mako(&["up"]);
        self.note_pids();
        let out = out?;
        if !out.success() {
            bail!("mako up failed: {out}\n{}", self.logs_tail(15));
        }
        self.up = true;
        Ok(())
    }

    /// The paths of the files node `i`'s makod has open below the cluster's disk
    /// directory (`<data>/disks`): none on a node with no disk access of its own.
    pub fn open_disk_files(&self, i: u32) -> Result<Vec<PathBuf>> {
        let pid = self
            .pid(i)
            .with_context(|| format!("node {i} has no makod.pid"))?;
        let disks = self.data.join("disks");
        let mut out = Vec::new();
        for e in std::fs::read_dir(format!("/proc/{pid}/fd"))? {
            if let Ok(target) = std::fs::read_link(e?.path()) {
                if target.starts_with(&disks) {
                    out.push(target);
                }
            }
        }
        Ok(out)
    }

    /// Node `i`'s makod pid (from its pid file).
    pub fn pid(&self, i: u32) -> Option<u32> {
        std::fs::read_to_string(self.node_dir(i).join("makod.pid"))
            .ok()
            .and_then(|t| t.trim().parse().ok())
    }

    /// Records the makod pids of the nodes now (every makod seen is killed at cleanup
    /// if still alive): after a `mako up` run through [`NetCluster::mako`].
    pub fn note_pids(&mut self) {
        for i in 0..self.nodes {
            if let Some(p) = self.pid(i) {
                if !self.pids.contains(&p) {
                    self.pids.push(p);
                }
            }
        }
    }

    /// Runs `mako --data-dir <overview> args…` (bounded wait).
    pub fn mako(&self, args: &[&str]) -> Result<CmdOutput> {
        self.mako_in(&self.data, args)
    }

    /// Runs `mako --data-dir <dir> args…` (bounded wait).
    pub fn mako_in(&self, dir: &Path, args: &[&str]) -> Result<CmdOutput> {
        let mut full = vec!["--data-dir", path_str(dir)?];
        full.extend_from_slice(args);
        run_cmd(&self.mako, &full, CMD_LIMIT)
    }

    /// The last `n` lines of node `i`'s makod.log.
    pub fn log_tail(&self, i: u32, n: usize) -> String {
        let text = std::fs::read_to_string(self.node_dir(i).join("makod.log")).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }

    /// Every node's log tail.
    pub fn logs_tail(&self, n: usize) -> String {
        (0..self.nodes)
            .map(|i| format!("--- node{i} makod.log ---\n{}", self.log_tail(i, n)))
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// `mako down`: every node must stop, every mount must go.
    pub fn down(&mut self) -> Result<()> {
        self.note_pids();
        let out = self.mako(&["down"])?;
        self.up = false;
        if !out.success() {
            bail!("mako down failed: {out}\n{}", self.logs_tail(15));
        }
        if let Some(p) = self.pids.iter().find(|&&p| process_alive(p)) {
            bail!("mako down returned but makod pid {p} still runs");
        }
        if let Some(i) = (0..self.nodes).find(|&i| is_mounted(&self.mount(i))) {
            bail!("mako down returned but node {i} is still mounted");
        }
        Ok(())
    }

    /// `mako fsck fs1 -n` on the shared disk files (every node stopped).
    pub fn fsck(&self) -> Result<CmdOutput> {
        let out = self.mako(&["fsck", FS_NAME, "-n"])?;
        if !out.success() {
            bail!("fsck of {FS_NAME} is not clean: {out}");
        }
        Ok(out)
    }

    /// Stops every node and checks the disks: the end of every test.
    pub fn finish(mut self) -> Result<()> {
        self.down()?;
        self.fsck()?;
        Ok(())
    }

    fn cleanup(&mut self) {
        if std::thread::panicking() && self.root.is_some() {
            // A failed test: what the nodes said is the first thing to read.
            eprintln!("{}", self.logs_tail(60));
        }
        let Some(root) = self.root.take() else { return };
        self.note_pids();
        for &p in &self.pids {
            unsafe { libc::kill(p as libc::pid_t, libc::SIGCONT) };
        }
        if std::thread::panicking() {
            // What each node said before the test failed: on CI this is all there is.
            eprintln!(
                "NetCluster: the test failed; the last lines of every node's makod.log:\n{}",
                self.logs_tail(40)
            );
        }
        if self.up || self.pids.iter().any(|&p| process_alive(p)) {
            let _ = run_cmd(
                &self.mako,
                &["--data-dir", &self.data.to_string_lossy(), "down"],
                Duration::from_secs(60),
            );
        }
        for &p in &self.pids {
            if process_alive(p) {
                eprintln!("NetCluster cleanup: makod pid {p} still runs; kill -9");
                unsafe { libc::kill(p as libc::pid_t, libc::SIGKILL) };
            }
        }
        let t = Instant::now();
        while self.pids.iter().any(|&p| process_alive(p)) && t.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(50));
        }
        detach_mounts_below(&self.root_path, "NetCluster");
        if !mounts_below(&self.root_path).is_empty() {
            eprintln!(
                "NetCluster cleanup: mounts remain below {}; NOT removing it",
                self.root_path.display()
            );
            std::mem::forget(root);
            return;
        }
        let path = root.path().to_path_buf();
        if let Err(e) = root.close() {
            eprintln!("NetCluster cleanup: cannot remove {}: {e}", path.display());
        }
    }
}

impl Drop for NetCluster {
    fn drop(&mut self) {
        self.cleanup();
    }
}

fn path_str(p: &Path) -> Result<&str> {
    p.to_str()
        .ok_or_else(|| anyhow!("non-UTF-8 path {}", p.display()))
}

/// The line of `mako node show` (`show`) about node `name` (empty if none).
pub fn line_of(show: &str, name: &str) -> String {
    show.lines()
        .find(|l| l.split_whitespace().any(|w| w == name))
        .unwrap_or_default()
        .to_string()
}
