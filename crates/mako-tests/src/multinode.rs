//! Several nodes of one Mako file system, each with its own FUSE mount, in a private temp
//! directory: [`MultiNode::up`] creates a data directory with the CLI (`mako up` and
//! `mako down` for the cluster, `mako disk create`, `mako fs create -n N`), then starts
//! `makod --local-nodes N` (every node in that one process, each with its own log,
//! pagepool and FUSE session at `<root>/fs.node<i>`). [`MultiNode::finish`] stops makod
//! (SIGTERM: both mounts unmounted, every node written back) and runs `mako fsck -n` on the
//! disk files, which must find them clean.
//!
//! Dropping the guard cleans up whatever happened, also when the test panics: SIGTERM
//! (bounded wait), lazy unmount of anything mounted below the temp dir, SIGKILL of makod
//! if it still runs, removal of the temp dir (only when nothing is mounted below it).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context as _, Result};

use crate::cluster::{binaries, detach_mounts_below, is_mounted, mounts_below, run_cmd, CmdOutput};

/// How long one `mako` command may take.
const CMD_LIMIT: Duration = Duration::from_secs(150);
/// How long makod may take to mount every node, and to stop.
const MOUNT_LIMIT: Duration = Duration::from_secs(60);
const STOP_LIMIT: Duration = Duration::from_secs(120);
/// The file system the nodes share.
pub const FS_NAME: &str = "fs2";

/// Parameters of a multi-node test cluster.
#[derive(Clone, Debug)]
pub struct MultiNodeOptions {
    /// Nodes (mounts), at least 2.
    pub nodes: u32,
    /// Disk files of the shared file system.
    pub disks: u32,
    /// Size of each (sparse) disk file.
    pub disk_size: String,
    /// Each node's pagepool.
    pub pagepool: String,
    /// Block size of the file system.
    pub block_size: String,
}

impl Default for MultiNodeOptions {
    fn default() -> Self {
        MultiNodeOptions {
            nodes: 2,
            disks: 4,
            disk_size: "2G".into(),
            pagepool: "128M".into(),
            block_size: "1M".into(),
        }
    }
}

/// A running multi-node cluster; see the module docs.
pub struct MultiNode {
    root: Option<tempfile::TempDir>,
    root_path: PathBuf,
    data: PathBuf,
    mako: PathBuf,
    makod: PathBuf,
    child: Option<Child>,
    mounts: Vec<PathBuf>,
}

impl MultiNode {
    /// Creates the cluster and starts its nodes; waits until every mount is there.
    pub fn up(opts: MultiNodeOptions) -> Result<MultiNode> {
        if opts.nodes < 2 {
            bail!(
                "a multi-node cluster needs at least 2 nodes, not {}",
                opts.nodes
            );
        }
        let (mako, makod) = binaries()?;
        let base = ["/var/tmp", "/tmp"]
            .into_iter()
            .map(PathBuf::from)
            .find(|p| p.is_dir())
            .unwrap_or_else(std::env::temp_dir);
        let root = tempfile::Builder::new()
            .prefix("mako-multi-")
            .tempdir_in(&base)
            .context("create temp dir")?;
        let root_path = root.path().to_path_buf();
        let fs_mount = root_path.join("fs");
        let mut c = MultiNode {
            data: root_path.join("data"),
            mounts: (0..opts.nodes)
                .map(|i| root_path.join(format!("fs.node{i}")))
                .collect(),
            root_path,
            root: Some(root),
            mako,
            makod,
            child: None,
        };
        // The cluster (cluster.toml, config.toml with the pagepool) comes from `mako up`,
        // with a small one-node file system of its own that is not used further.
        let mnt1 = c.root_path.join("mnt");
        c.mako_ok(&[
            "up",
            "--mountpoint",
            path_str(&mnt1)?,
            "--disks",
            "1",
            "--disk-size",
            "1G",
            "--pagepool",
            &opts.pagepool,
        ])?;
        c.mako_ok(&["down"])?;
        let mut names = Vec::new();
        for i in 0..opts.disks {
            let name = format!("e{i}");
            c.mako_ok(&["disk", "create", &name, "--size", &opts.disk_size])?;
            names.push(name);
        }
        let nodes = opts.nodes.to_string();
        c.mako_ok(&[
            "fs",
            "create",
            FS_NAME,
            "-d",
            &names.join(","),
            "-n",
            &nodes,
            "-B",
            &opts.block_size,
            "-T",
            path_str(&fs_mount)?,
            "-A",
            "no",
        ])?;
        let log = std::fs::File::create(c.log_path()).context("create nodes.log")?;
        let child = Command::new(&c.makod)
            .args(["--data-dir", path_str(&c.data)?, "--local-nodes", &nodes])
            .args(["--fs", FS_NAME])
            .env_remove("MAKO_DATA_DIR")
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .with_context(|| format!("starting {}", c.makod.display()))?;
        c.child = Some(child);
        let t = Instant::now();
        while !c.mounts.iter().all(|m| is_mounted(m)) {
            if let Some(st) = c.child.as_mut().and_then(|ch| ch.try_wait().ok().flatten()) {
                bail!(
                    "makod --local-nodes exited ({st}) before mounting every node:\n{}",
                    c.log_tail(30)
                );
            }
            if t.elapsed() > MOUNT_LIMIT {
                bail!(
                    "the nodes are not all mounted after {MOUNT_LIMIT:?}:\n{}",
                    c.log_tail(30)
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(c)
    }

    /// Node `i`'s mount point.
    pub fn mount(&self, i: usize) -> &Path {
        &self.mounts[i]
    }

    /// How many nodes there are.
    pub fn nodes(&self) -> usize {
        self.mounts.len()
    }

    /// The data directory (cluster.toml, disks/, nodes.log).
    pub fn data_dir(&self) -> &Path {
        &self.data
    }

    /// Runs `mako --data-dir <data> args…` (bounded wait).
    pub fn mako(&self, args: &[&str]) -> Result<CmdOutput> {
        let mut full = vec!["--data-dir", path_str(&self.data)?];
        full.extend_from_slice(args);
        run_cmd(&self.mako, &full, CMD_LIMIT)
    }

    fn mako_ok(&self, args: &[&str]) -> Result<CmdOutput> {
        let out = self.mako(args)?;
        if !out.success() {
            bail!(
                "mako {} failed in {}: {out}",
                args.join(" "),
                self.root_path.display()
            );
        }
        Ok(out)
    }

    fn log_path(&self) -> PathBuf {
        self.data.join("nodes.log")
    }

    /// The last `n` lines of makod's log.
    pub fn log_tail(&self, n: usize) -> String {
        let text = std::fs::read_to_string(self.log_path()).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }

    /// Stops makod (SIGTERM) and waits: it must exit 0 with every mount gone.
    pub fn stop(&mut self) -> Result<()> {
        let Some(mut child) = self.child.take() else {
            return Ok(());
        };
        unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
        let t = Instant::now();
        let status = loop {
            if let Some(st) = child.try_wait()? {
                break st;
            }
            if t.elapsed() > STOP_LIMIT {
                let _ = child.kill();
                let _ = child.wait();
                bail!(
                    "makod --local-nodes did not stop within {STOP_LIMIT:?} of SIGTERM:\n{}",
                    self.log_tail(30)
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        if !status.success() {
            bail!(
                "makod --local-nodes stopped with {status}:\n{}",
                self.log_tail(30)
            );
        }
        if let Some(m) = self.mounts.iter().find(|m| is_mounted(m)) {
            bail!("makod stopped but {} is still mounted", m.display());
        }
        Ok(())
    }

    /// `mako fsck fs2 -n` on the disk files (makod stopped): the output, or an error
    /// unless it found the file system clean.
    pub fn fsck(&self) -> Result<CmdOutput> {
        if self.child.is_some() {
            bail!("fsck needs the nodes stopped first");
        }
        let out = self.mako(&["fsck", FS_NAME, "-n"])?;
        if !out.success() {
            bail!("fsck of {FS_NAME} is not clean: {out}");
        }
        Ok(out)
    }

    /// Stops every node and checks the disks: the end of every test.
    pub fn finish(mut self) -> Result<()> {
        self.stop()?;
        self.fsck()?;
        Ok(())
    }

    fn cleanup(&mut self) {
        let Some(root) = self.root.take() else { return };
        if let Some(mut child) = self.child.take() {
            unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
            let t = Instant::now();
            while child.try_wait().ok().flatten().is_none() && t.elapsed() < STOP_LIMIT / 2 {
                std::thread::sleep(Duration::from_millis(50));
            }
            detach_mounts_below(&self.root_path, "MultiNode");
            if child.try_wait().ok().flatten().is_none() {
                eprintln!(
                    "MultiNode cleanup: makod (pid {}) still runs; kill -9",
                    child.id()
                );
                let _ = child.kill();
            }
            let _ = child.wait();
        }
        detach_mounts_below(&self.root_path, "MultiNode");
        if !mounts_below(&self.root_path).is_empty() {
            eprintln!(
                "MultiNode cleanup: mounts remain below {}; NOT removing it",
                self.root_path.display()
            );
            std::mem::forget(root);
            return;
        }
        let path = root.path().to_path_buf();
        if let Err(e) = root.close() {
            eprintln!("MultiNode cleanup: cannot remove {}: {e}", path.display());
        }
    }
}

impl Drop for MultiNode {
    fn drop(&mut self) {
        self.cleanup();
    }
}

fn path_str(p: &Path) -> Result<&str> {
    p.to_str()
        .ok_or_else(|| anyhow!("non-UTF-8 path {}", p.display()))
}
