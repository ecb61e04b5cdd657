//! A real one-node Mako cluster for integration tests: [`TestCluster::up`] runs the `mako`
//! binary (`mako up`) in a private temp directory (data dir + mount point) and mounts the file
//! system through FUSE; dropping the guard stops everything again — also when the test panics:
//!
//! 1. `mako down` (bounded wait),
//! 2. if the mount point (or anything else under the temp dir) is still mounted: `umount -l`,
//! 3. if makod still runs: `kill -9` it,
//! 4. remove the temp dir (only when nothing is mounted below it, so a stuck mount is never
//!    recursed into).
//!
//! The `mako` and `makod` binaries are taken from the cargo profile directory of the running
//! test executable (`target/<profile>/deps/xxx` → `target/<profile>/`). Build them first with
//! `cargo build --workspace [--release]`.
//!
//! Tests call [`require_fuse`] first: without `/dev/fuse` or root they fail, unless the run
//! allows skips (`MAKO_ALLOW_SKIP=1`, recorded for the summary of `scripts/test`).

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context as _, Result};

/// How long the guard waits for `mako up` (it has its own 30 s limit) and `mako down` (60 s).
const CMD_LIMIT: Duration = Duration::from_secs(150);

/// Parameters of a test cluster.
#[derive(Clone, Debug)]
pub struct ClusterOptions {
    /// Number of file-backed disks (`--disks`).
    pub disks: u32,
    /// Size of each (sparse) disk file (`--disk-size`).
    pub disk_size: String,
    /// Daemon cache (`--pagepool`); small by default so several clusters fit on one machine.
    pub pagepool: String,
    /// File system block size (`--block-size`); `None` = Mako's default (4M).
    pub block_size: Option<String>,
}

impl Default for ClusterOptions {
    fn default() -> Self {
        ClusterOptions {
            disks: 4,
            disk_size: "2G".into(),
            pagepool: "256M".into(),
            block_size: None,
        }
    }
}

/// Output of one `mako` command.
#[derive(Debug, Clone)]
pub struct CmdOutput {
    /// The exit code (`None` if killed by a signal or by the time limit).
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
    /// True if the command was killed because it exceeded its time limit.
    pub timed_out: bool,
}

impl CmdOutput {
    pub fn success(&self) -> bool {
        self.code == Some(0)
    }
    /// stdout and stderr together (for searching messages).
    pub fn text(&self) -> String {
        format!("{}\n{}", self.stdout, self.stderr)
    }
}

impl std::fmt::Display for CmdOutput {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "exit {:?}{}\n--- stdout ---\n{}\n--- stderr ---\n{}",
            self.code,
            if self.timed_out {
                " (TIMED OUT, killed)"
            } else {
                ""
            },
            self.stdout.trim_end(),
            self.stderr.trim_end()
        )
    }
}

/// True if FUSE tests can run here (`/dev/fuse` exists and we are root). Otherwise the
/// test fails (panics) naming `test` and what is missing — unless the run allows skips
/// (`MAKO_ALLOW_SKIP=1`, see [`crate::skip`]): then the skip is recorded and this returns
/// false, and the test returns.
pub fn require_fuse(test: &str) -> bool {
    let reason = if !Path::new("/dev/fuse").exists() {
        Some("/dev/fuse is missing (modprobe fuse; install fuse3)".to_string())
    } else if unsafe { libc::geteuid() } != 0 {
        Some(
            "not running as root (mako up mounts with allow_other and the tests chown)".to_string(),
        )
    } else {
        None
    };
    let Some(reason) = reason else { return true };
    crate::skip::cannot_run(test, &reason);
    false
}

/// `target/<profile>/` of the running test executable.
fn profile_dir() -> Result<PathBuf> {
    let exe = std::env::current_exe().context("current_exe")?;
    let mut dir = exe.parent().map(Path::to_path_buf).unwrap_or_default();
    if dir.file_name().is_some_and(|n| n == "deps") {
        dir.pop();
    }
    Ok(dir)
}

/// Paths of the `mako` and `makod` binaries next to the test executable's profile dir.
pub fn binaries() -> Result<(PathBuf, PathBuf)> {
    let dir = profile_dir()?;
    let mako = dir.join("mako");
    let makod = dir.join("makod");
    for b in [&mako, &makod] {
        if !b.is_file() {
            let release = if dir.ends_with("release") {
                " --release"
            } else {
                ""
            };
            bail!(
                "{} is missing: build the workspace first: cargo build --workspace{release}",
                b.display()
            );
        }
    }
    Ok((mako, makod))
}

/// Runs `program args…` with a time limit, capturing stdout and stderr.
pub fn run_cmd(program: &Path, args: &[&str], limit: Duration) -> Result<CmdOutput> {
    let mut child = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .env_remove("MAKO_DATA_DIR")
        .spawn()
        .with_context(|| format!("cannot run {}", program.display()))?;
    let mut out = child.stdout.take().unwrap();
    let mut err = child.stderr.take().unwrap();
    let t_out = std::thread::spawn(move || {
        let mut s = Vec::new();
        let _ = out.read_to_end(&mut s);
        String::from_utf8_lossy(&s).into_owned()
    });
    let t_err = std::thread::spawn(move || {
        let mut s = Vec::new();
        let _ = err.read_to_end(&mut s);
        String::from_utf8_lossy(&s).into_owned()
    });
    let start = Instant::now();
    let mut timed_out = false;
    let status = loop {
        if let Some(st) = child.try_wait()? {
            break st;
        }
        if start.elapsed() > limit {
            timed_out = true;
            let _ = child.kill();
            break child.wait()?;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    Ok(CmdOutput {
        code: status.code(),
        stdout: t_out.join().unwrap_or_default(),
        stderr: t_err.join().unwrap_or_default(),
        timed_out,
    })
}

/// Everything mounted at or below `root`, deepest first.
pub fn mounts_below(root: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = kernel_mounts()
        .into_iter()
        .filter(|m| m.starts_with(root))
        .collect();
    v.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    v.dedup();
    v
}

/// Detach (`umount -l`) everything still mounted at or below `root`, saying so for
/// `who`'s cleanup.
pub fn detach_mounts_below(root: &Path, who: &str) {
    for m in mounts_below(root) {
        eprintln!("{who} cleanup: {} still mounted; umount -l", m.display());
        if let Ok(c) = std::ffi::CString::new(m.as_os_str().to_string_lossy().as_bytes()) {
            unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
        }
    }
}

/// Mount points in `/proc/self/mounts` (octal escapes decoded).
pub fn kernel_mounts() -> Vec<PathBuf> {
    let text = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
    text.lines()
        .filter_map(|l| l.split(' ').nth(1))
        .map(|f| {
            let b = f.as_bytes();
            let mut out = Vec::new();
            let mut i = 0;
            while i < b.len() {
                if b[i] == b'\\'
                    && i + 3 < b.len()
                    && b[i + 1..i + 4].iter().all(|d| (b'0'..=b'7').contains(d))
                {
                    out.push(
                        b[i + 1..i + 4]
                            .iter()
                            .fold(0u8, |v, d| v.wrapping_mul(8) + (d - b'0')),
                    );
                    i += 4;
                } else {
                    out.push(b[i]);
                    i += 1;
                }
            }
            PathBuf::from(String::from_utf8_lossy(&out).into_owned())
        })
        .collect()
}

/// True if `path` is a mount point now.
pub fn is_mounted(path: &Path) -> bool {
    kernel_mounts().iter().any(|m| m == path)
}

/// True if process `pid` exists and is not a zombie.
pub fn process_alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => !stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.trim_start().chars().next())
            .is_some_and(|s| s == 'Z' || s == 'X'),
        Err(_) => false,
    }
}

/// A running one-node Mako cluster in a private temp dir; see the module docs.
pub struct TestCluster {
    root: Option<tempfile::TempDir>,
    root_path: PathBuf,
    data: PathBuf,
    mnt: PathBuf,
    mako: PathBuf,
    opts: ClusterOptions,
}

impl TestCluster {
    /// Creates the temp dir and runs `mako up` with `opts`; waits for the mount.
    pub fn up(opts: ClusterOptions) -> Result<TestCluster> {
        let (mako, _makod) = binaries()?;
        // /var/tmp is disk-backed on most systems (disk files are sparse; chattr works there).
        let base = ["/var/tmp", "/tmp"]
            .into_iter()
            .map(PathBuf::from)
            .find(|p| p.is_dir())
            .unwrap_or_else(std::env::temp_dir);
        let root = tempfile::Builder::new()
            .prefix("mako-test-")
            .tempdir_in(&base)
            .context("create temp dir")?;
        let root_path = root.path().to_path_buf();
        let cluster = TestCluster {
            data: root_path.join("data"),
            mnt: root_path.join("mnt"),
            root_path,
            root: Some(root),
            mako,
            opts,
        };
        let o = &cluster.opts;
        let disks = o.disks.to_string();
        let mut args: Vec<&str> = vec![
            "up",
            "--mountpoint",
            cluster.mnt.to_str().unwrap(),
            "--disks",
            &disks,
            "--disk-size",
            &o.disk_size,
            "--pagepool",
            &o.pagepool,
        ];
        if let Some(bs) = &o.block_size {
            args.push("--block-size");
            args.push(bs);
        }
        let out = cluster.mako(&args)?;
        if !out.success() {
            bail!("mako up failed in {}: {out}", cluster.root_path.display());
        }
        cluster.wait_mounted()?;
        Ok(cluster)
        // On error `cluster` is dropped here, which cleans up.
    }

    /// The mount point of file system fs1.
    pub fn mount(&self) -> &Path {
        &self.mnt
    }
    /// The data dir (cluster.toml, disks/, makod.log, makod.pid).
    pub fn data_dir(&self) -> &Path {
        &self.data
    }
    /// The temp dir holding data dir and mount point.
    pub fn root(&self) -> &Path {
        &self.root_path
    }
    /// The options the cluster was created with.
    pub fn options(&self) -> &ClusterOptions {
        &self.opts
    }
    /// The disk image files `disks/d<i>.img`.
    pub fn disk_path(&self, i: u32) -> PathBuf {
        self.data.join("disks").join(format!("d{i}.img"))
    }
    /// The `mako` binary used.
    pub fn mako_binary(&self) -> &Path {
        &self.mako
    }

    /// Runs `mako --data-dir <data> args…` (bounded wait) and returns its output.
    pub fn mako(&self, args: &[&str]) -> Result<CmdOutput> {
        mako_cmd(&self.mako, &self.data, args)
    }

    /// Runs `mako down`; fails unless it succeeds and the mount is gone.
    pub fn down(&self) -> Result<()> {
        remote_down(&self.mako, &self.data, &self.mnt)
    }

    /// Runs `mako up` again (after [`down`](Self::down)); fails unless the mount is back.
    pub fn up_again(&self) -> Result<()> {
        remote_up(&self.mako, &self.data, &self.mnt)
    }

    /// Crash the node: `kill -9` makod and wait until it is gone. Its FUSE mount stays,
    /// dead: every access fails (ENOTCONN), so a program still working under the mount
    /// point stops instead of carrying on in the directory below it. Then
    /// `up_after_crash`.
    pub fn crash(&self) -> Result<()> {
        let pid = self
            .makod_pid()
            .ok_or_else(|| anyhow!("no makod.pid in {}", self.data.display()))?;
        unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) };
        let t = Instant::now();
        while process_alive(pid) {
            if t.elapsed() > Duration::from_secs(20) {
                bail!("makod (pid {pid}) still alive 20 s after kill -9");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(())
    }

    /// After `crash` (and after everything using the mount has stopped): `mako up`, which
    /// must clean up the dead mount, socket and pid file itself (and say so) and replays
    /// the recovery log.
    pub fn up_after_crash(&self) -> Result<()> {
        let out = self.mako(&["up"])?;
        if !out.success() {
            bail!("mako up after a crash failed: {out}");
        }
        if !out.stdout.contains("Cleaned up after makod") {
            bail!("mako up after a crash did not say what it cleaned up: {out}");
        }
        self.wait_mounted()
    }

    /// `mako down` then `mako up`.
    pub fn remount(&self) -> Result<()> {
        self.down()?;
        self.up_again()
    }

    /// A `'static` closure doing `mako down && mako up` on this cluster (for fsx's remount hook).
    pub fn remount_fn(&self) -> Box<dyn FnMut() -> Result<()>> {
        let (mako, data, mnt) = (self.mako.clone(), self.data.clone(), self.mnt.clone());
        Box::new(move || {
            remote_down(&mako, &data, &mnt)?;
            remote_up(&mako, &data, &mnt)
        })
    }

    /// The shell form of the remount hook, for reproduction lines.
    pub fn remount_cmd_text(&self) -> String {
        let m = self.mako.display();
        let d = self.data.display();
        format!("{m} --data-dir {d} down && {m} --data-dir {d} up")
    }

    /// makod's pid from `<data>/makod.pid`, if present.
    pub fn makod_pid(&self) -> Option<u32> {
        std::fs::read_to_string(self.data.join("makod.pid"))
            .ok()
            .and_then(|t| t.trim().parse().ok())
    }

    /// The last `n` lines of makod.log (for failure messages).
    pub fn log_tail(&self, n: usize) -> String {
        let text = std::fs::read_to_string(self.data.join("makod.log")).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }

    fn wait_mounted(&self) -> Result<()> {
        wait_mounted(&self.mnt)
    }

    /// The cleanup of `Drop`, callable early; idempotent.
    fn cleanup(&mut self) {
        let Some(root) = self.root.take() else { return };
        let pid = self.makod_pid();
        let running = pid.is_some_and(process_alive);
        if running || is_mounted(&self.mnt) {
            match self.mako(&["down"]) {
                Ok(out) if out.success() => {}
                Ok(out) => eprintln!("TestCluster cleanup: mako down failed: {out}"),
                Err(e) => eprintln!("TestCluster cleanup: mako down: {e:#}"),
            }
        }
        // Anything still mounted below the temp dir (the FUSE mount, a read-only bind mount
        // made by a test): detach it lazily.
        detach_mounts_below(&self.root_path, "TestCluster");
        if let Some(pid) = pid.filter(|&p| process_alive(p)) {
            let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
            if comm.trim() == "makod" {
                eprintln!("TestCluster cleanup: makod (pid {pid}) still runs; kill -9");
                unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) };
                let t = Instant::now();
                while process_alive(pid) && t.elapsed() < Duration::from_secs(10) {
                    std::thread::sleep(Duration::from_millis(50));
                }
            }
        }
        if !mounts_below(&self.root_path).is_empty() {
            eprintln!(
                "TestCluster cleanup: mounts remain below {}; NOT removing it",
                self.root_path.display()
            );
            std::mem::forget(root);
            return;
        }
        let path = root.path().to_path_buf();
        if let Err(e) = root.close() {
            // An immutable file left by a test (chattr +i): clear the flag and retry.
            let _ = Command::new("chattr")
                .args(["-R", "-i"])
                .arg(&path)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
            if let Err(e2) = std::fs::remove_dir_all(&path) {
                eprintln!(
                    "TestCluster cleanup: cannot remove {}: {e}; {e2}",
                    path.display()
                );
            }
        }
    }
}

impl Drop for TestCluster {
    fn drop(&mut self) {
        self.cleanup();
    }
}

fn mako_cmd(mako: &Path, data: &Path, args: &[&str]) -> Result<CmdOutput> {
    let mut full: Vec<&str> = vec![
        "--data-dir",
        data.to_str().ok_or_else(|| anyhow!("non-UTF-8 path"))?,
    ];
    full.extend_from_slice(args);
    run_cmd(mako, &full, CMD_LIMIT)
}

fn remote_down(mako: &Path, data: &Path, mnt: &Path) -> Result<()> {
    let out = mako_cmd(mako, data, &["down"])?;
    if !out.success() {
        bail!("mako down failed: {out}");
    }
    if is_mounted(mnt) {
        bail!("mako down succeeded but {} is still mounted", mnt.display());
    }
    Ok(())
}

fn remote_up(mako: &Path, data: &Path, mnt: &Path) -> Result<()> {
    let out = mako_cmd(mako, data, &["up"])?;
    if !out.success() {
        bail!("mako up failed: {out}");
    }
    wait_mounted(mnt)
}

fn wait_mounted(mnt: &Path) -> Result<()> {
    let t = Instant::now();
    while !is_mounted(mnt) {
        if t.elapsed() > Duration::from_secs(15) {
            bail!(
                "mako up succeeded but {} is not mounted after 15 s",
                mnt.display()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(())
}
