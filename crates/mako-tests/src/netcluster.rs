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

use std::collections::BTreeMap;
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
    /// Nodes that run in a network namespace of their own, linked to the others by a
    /// veth pair that [`NetCluster::cut_link`] takes down (needs `create_args`; see
    /// [`NetCluster::up`]). Empty: every node on 127.0.0.1.
    pub isolated: Vec<u32>,
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
            isolated: Vec::new(),
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
    /// The network namespaces of isolated nodes, removed at cleanup.
    netns: Vec<NetNs>,
    /// The address added to the host's loopback for the other nodes, removed at cleanup.
    host_address: Option<String>,
}

/// An isolated node's network namespace and the host end of its veth pair.
struct NetNs {
    node: u32,
    name: String,
    host_veth: String,
    ns_veth: String,
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
            netns: Vec::new(),
            host_address: None,
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
        if !opts.isolated.is_empty() {
            if opts.create_args.is_none() {
                bail!("NetClusterOptions::isolated needs create_args (mako cluster create)");
            }
            if out.as_ref().is_ok_and(|o| o.success()) {
                c.isolate(&opts.isolated)?;
                c.up = true;
                out = c.startup_isolated();
            }
        } else if opts.create_args.is_some() && out.as_ref().is_ok_and(|o| o.success()) {
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

    /// Gives each node of `nodes` a network namespace of its own (`ip netns`) linked
    /// to the host by a veth pair (host end `10.214.K.4j+1/30`, the node's end
    /// `.4j+2`, its default route through the host end), puts the other nodes on an
    /// address added to the host's loopback (`10.213.K.1`, so taking a veth down
    /// leaves them connected), and rewrites every cluster.toml of the cluster with
    /// those addresses (the replicated configuration is made from them at the first
    /// start). Every namespace, veth and address is recorded before it is made, so the
    /// cleanup removes it whatever fails.
    fn isolate(&mut self, nodes: &[u32]) -> Result<()> {
        let pid = std::process::id();
        let taken = ip(&["-o", "addr", "show"])?;
        let k = (0..250)
            .map(|a| (pid as usize + a) % 250 + 1)
            .find(|k| {
                !taken.contains(&format!("10.213.{k}.")) && !taken.contains(&format!("10.214.{k}."))
            })
            .context("no free 10.213.K.0/24 for the host address")?;
        let host = format!("10.213.{k}.1");
        ip(&["addr", "add", &format!("{host}/32"), "dev", "lo"])?;
        self.host_address = Some(host.clone());
        let mut address = BTreeMap::new();
        for i in 0..self.nodes {
            address.insert(i, host.clone());
        }
        for (j, &node) in nodes.iter().enumerate() {
            let ns = NetNs {
                node,
                name: format!("mako-{pid}-{node}"),
                host_veth: format!("mk{pid}h{node}"),
                ns_veth: format!("mk{pid}n{node}"),
            };
            let (name, hv, nv) = (ns.name.clone(), ns.host_veth.clone(), ns.ns_veth.clone());
            self.netns.push(ns);
            let here = format!("10.214.{k}.{}", 4 * j + 1);
            let there = format!("10.214.{k}.{}", 4 * j + 2);
            ip(&["netns", "add", &name])?;
            ip(&["link", "add", &hv, "type", "veth", "peer", "name", &nv])?;
            ip(&["link", "set", &nv, "netns", &name])?;
            ip(&["addr", "add", &format!("{here}/30"), "dev", &hv])?;
            ip(&["link", "set", &hv, "up"])?;
            ip(&[
                "-n",
                &name,
                "addr",
                "add",
                &format!("{there}/30"),
                "dev",
                &nv,
            ])?;
            ip(&["-n", &name, "link", "set", &nv, "up"])?;
            ip(&["-n", &name, "link", "set", "lo", "up"])?;
            ip(&["-n", &name, "route", "add", "default", "via", &here])?;
            address.insert(node, there);
        }
        // Port of each node, from the overview's node list.
        let overview = std::fs::read_to_string(self.data.join("cluster.toml"))
            .context("read the overview's cluster.toml")?;
        let mut rewrite = Vec::new();
        for block in overview.split("[[nodes]]").skip(1) {
            let field = |key: &str| {
                block.lines().find_map(|l| {
                    let (k, v) = l.split_once('=')?;
                    (k.trim() == key).then(|| v.trim().trim_matches('"').to_string())
                })
            };
            let (Some(id), Some(addr)) = (field("id"), field("address")) else {
                bail!("a [[nodes]] entry of the overview's cluster.toml without id or address");
            };
            let id: u32 = id.parse().context("node id")?;
            let port = addr.rsplit(':').next().unwrap_or_default().to_string();
            let new = format!("{}:{port}", address[&id]);
            rewrite.push((format!("\"{addr}\""), format!("\"{new}\"")));
        }
        let mut files = vec![self.data.join("cluster.toml")];
        files.extend((0..self.nodes).map(|i| self.node_dir(i).join("cluster.toml")));
        for f in files {
            let mut text =
                std::fs::read_to_string(&f).with_context(|| format!("read {}", f.display()))?;
            for (old, new) in &rewrite {
                text = text.replace(old.as_str(), new);
            }
            std::fs::write(&f, text).with_context(|| format!("write {}", f.display()))?;
        }
        Ok(())
    }

    /// `mako startup` of the nodes that are not isolated, then of each isolated node
    /// from inside its namespace (`nsenter --net`: its makod inherits it; the mount
    /// namespace stays the host's, so its FUSE mount is seen here).
    fn startup_isolated(&mut self) -> Result<CmdOutput> {
        let others: Vec<String> = (0..self.nodes)
            .filter(|i| !self.netns.iter().any(|n| n.node == *i))
            .map(|i| format!("node{i}"))
            .collect();
        let out = self.mako(&["startup", "-N", &others.join(",")])?;
        if !out.success() {
            return Ok(out);
        }
        self.note_pids();
        let isolated: Vec<u32> = self.netns.iter().map(|n| n.node).collect();
        for i in isolated {
            let out = self.startup(i)?;
            if !out.success() {
                return Ok(out);
            }
        }
        Ok(out)
    }

    /// `mako startup -N node<i>`, from inside node `i`'s network namespace if it has
    /// one.
    pub fn startup(&mut self, i: u32) -> Result<CmdOutput> {
        let node = format!("node{i}");
        let out = match self.netns.iter().find(|n| n.node == i) {
            Some(ns) => {
                let net = format!("--net=/run/netns/{}", ns.name);
                run_cmd(
                    Path::new("nsenter"),
                    &[
                        &net,
                        path_str(&self.mako)?,
                        "--data-dir",
                        path_str(&self.data)?,
                        "startup",
                        "-N",
                        &node,
                    ],
                    CMD_LIMIT,
                )
            }
            None => self.mako(&["startup", "-N", &node]),
        };
        self.note_pids();
        self.up = true;
        out
    }

    /// `mako startup -N node<i>` of a node that is not isolated, in a thread of its own:
    /// the test goes on (other nodes' workloads, another node's kill) while node `i`
    /// starts, rejoins and mounts. The thread ends within the command's time limit;
    /// a test that fails while it runs should join it before the cluster is dropped,
    /// so `mako down` of the cleanup does not race the start.
    pub fn spawn_startup(&self, i: u32) -> Result<std::thread::JoinHandle<Result<CmdOutput>>> {
        if self.netns.iter().any(|n| n.node == i) {
            bail!("spawn_startup would start isolated node {i} outside its namespace: use startup");
        }
        let (mako, data, node) = (self.mako.clone(), self.data.clone(), format!("node{i}"));
        Ok(std::thread::spawn(move || {
            run_cmd(
                &mako,
                &["--data-dir", path_str(&data)?, "startup", "-N", &node],
                CMD_LIMIT,
            )
        }))
    }

    /// Takes the link of isolated node `i` down (its end of the veth pair): it can
    /// reach no other node and none reaches it; it keeps running.
    pub fn cut_link(&self, i: u32) -> Result<()> {
        let ns = self.isolated(i)?;
        ip(&["-n", &ns.name, "link", "set", &ns.ns_veth, "down"])?;
        Ok(())
    }

    /// Brings the link of isolated node `i` back (with its default route).
    pub fn restore_link(&self, i: u32) -> Result<()> {
        let ns = self.isolated(i)?;
        ip(&["-n", &ns.name, "link", "set", &ns.ns_veth, "up"])?;
        let routes = ip(&["-n", &ns.name, "route", "show"])?;
        if !routes.contains("default") {
            let j = self.netns.iter().position(|n| n.node == i).unwrap_or(0);
            let host = self.host_address.as_deref().unwrap_or_default();
            let k = host.split('.').nth(2).unwrap_or_default();
            let here = format!("10.214.{k}.{}", 4 * j + 1);
            ip(&["-n", &ns.name, "route", "add", "default", "via", &here])?;
        }
        Ok(())
    }

    fn isolated(&self, i: u32) -> Result<&NetNs> {
        self.netns
            .iter()
            .find(|n| n.node == i)
            .with_context(|| format!("node {i} is not isolated (NetClusterOptions::isolated)"))
    }

    /// `mako node show`, asked through node 0's data directory (panics if it fails).
    pub fn node_show(&self) -> String {
        let out = self
            .mako_in(&self.node_dir(0), &["node", "show"])
            .expect("mako node show");
        assert!(out.success(), "mako node show: {out}");
        out.stdout.clone()
    }

    /// The lines of node `i`'s makod.log (none if it has none yet).
    pub fn log_lines(&self, i: u32) -> Vec<String> {
        std::fs::read_to_string(self.node_dir(i).join("makod.log"))
            .unwrap_or_default()
            .lines()
            .map(String::from)
            .collect()
    }

    /// What the nodes said about leases, expels, recoveries and managers, the last 40
    /// lines of each (the transport's reconnection attempts to a dead node would
    /// drown everything else).
    pub fn telling_lines(&self) -> String {
        let mut out = String::new();
        for i in 0..self.nodes() {
            out.push_str(&format!(
                "--- node{i} makod.log (leases, expels, recoveries, managers, errors) ---\n"
            ));
            let lines: Vec<String> = self
                .log_lines(i)
                .into_iter()
                .filter(|l| {
                    !l.contains("cannot connect")
                        && !l.contains("openraft")
                        && (l.contains("lease")
                            || l.contains("expel")
                            || l.contains("recover")
                            || l.contains("manager")
                            || l.contains("ERROR")
                            || l.contains("WARN")
                            || l.contains("rejoin"))
                })
                .collect();
            for l in &lines[lines.len().saturating_sub(40)..] {
                out.push_str(l);
                out.push('\n');
            }
        }
        out
    }

    /// Waits (polling every 100 ms) until `done`, at most `guard` (a hang guard: past
    /// it the test fails with `telling_lines`); returns how long it took.
    pub fn wait_for(
        &self,
        what: &str,
        guard: Duration,
        mut done: impl FnMut() -> bool,
    ) -> Duration {
        let start = Instant::now();
        while !done() {
            assert!(
                start.elapsed() < guard,
                "{what}: not reached within the {guard:?} hang guard\n{}",
                self.telling_lines()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        start.elapsed()
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
        if !self.netns.is_empty() {
            bail!("start_stopped would start isolated nodes outside their namespace: use startup");
        }
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
        for ns in std::mem::take(&mut self.netns) {
            // Deleting the namespace destroys its end of the veth pair, and so the pair.
            let _ = ip(&["netns", "del", &ns.name]);
            let _ = ip(&["link", "del", &ns.host_veth]);
        }
        if let Some(host) = self.host_address.take() {
            let _ = ip(&["addr", "del", &format!("{host}/32"), "dev", "lo"]);
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

/// Runs `ip args…`; its stdout, or an error with its stderr.
fn ip(args: &[&str]) -> Result<String> {
    let out = run_cmd(Path::new("ip"), args, Duration::from_secs(30))?;
    if !out.success() {
        bail!("ip {}: {out}", args.join(" "));
    }
    Ok(out.stdout)
}

fn path_str(p: &Path) -> Result<&str> {
    p.to_str()
        .ok_or_else(|| anyhow!("non-UTF-8 path {}", p.display()))
}

/// The line of `mako node show` (`show`) about node `name` (empty if none): the one
/// that starts with the name (the header names the node that answered too).
pub fn line_of(show: &str, name: &str) -> String {
    show.lines()
        .find(|l| l.split_whitespace().next() == Some(name))
        .unwrap_or_default()
        .to_string()
}
