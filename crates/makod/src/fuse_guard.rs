//! The FUSE guard: a small process (`makod --fuse-guard PID`, started by makod before
//! it mounts anything) that ends makod's FUSE connections if makod dies but cannot
//! finish exiting.
//!
//! Why: makod tells the kernel to forget names (`FUSE_NOTIFY_INVAL_ENTRY`, from its
//! `mako-inval` thread, never from a request handler). The kernel takes the
//! directory's lock for that, uninterruptibly, and the lock may be held by a create or
//! lookup in that directory that waits for makod's answer. While makod lives, its
//! request threads answer and the notification goes through a moment later (libfuse
//! documents the same constraint for `fuse_lowlevel_notify_inval_entry`: never from
//! the execution path of a related operation). If makod is killed (`kill -9`, the OOM
//! killer) at that moment, nothing answers the request: the notifying thread stays
//! stuck in the kernel, so makod's process never finishes exiting, its `/dev/fuse`
//! stays open, the connection is never aborted, and every program using the mount —
//! and anything that touches the mount point — hangs. No order of makod's own threads
//! can avoid that (the kernel may take the lock for a new request at any moment), so
//! something outside makod must end the connection: this guard. It watches makod's
//! main thread; once it has been a zombie (exited) for [`STUCK_AFTER`] while makod's
//! process is still there, it writes `1` to the `abort` file of every connection makod
//! had mounted (`/sys/fs/fuse/connections/N/abort`, as `umount -f`): the waiting
//! requests fail, the directory lock is released, the stuck thread returns and makod's
//! process ends. The guard ends once makod's process is gone (it is then no longer its
//! parent). `mako up` does the same for a connection that still hangs when it starts a
//! node again (`clean_up_after_dead_daemon` in the CLI).
//!
//! makod tells the guard its mounts on a pipe (the guard's stdin): `+ MAJOR MINOR
//! MOUNTPOINT` when it mounted, `- MAJOR MINOR` when the mount point is released. A
//! connection is aborted only if the kernel's mount table still shows that device at
//! that mount point.

use std::collections::BTreeMap;
use std::io::{BufRead, Write};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// How long makod's main thread must have exited while its process is still there
/// before the guard aborts its connections: a normal exit takes milliseconds.
pub const STUCK_AFTER: Duration = Duration::from_secs(2);
const POLL: Duration = Duration::from_millis(200);

/// The pipe to the guard, once started.
static GUARD: OnceLock<Mutex<std::process::ChildStdin>> = OnceLock::new();

/// Starts the guard of this makod (once). Call it before any FUSE mount: the guard
/// must not inherit a `/dev/fuse` descriptor (it would keep the connection open
/// itself); it also closes every descriptor it inherited but its standard ones.
pub fn start() {
    if GUARD.get().is_some() {
        return;
    }
    let exe = std::env::current_exe().unwrap_or_else(|_| PathBuf::from("/proc/self/exe"));
    let spawned = std::process::Command::new(exe)
        .arg("--fuse-guard")
        .arg(std::process::id().to_string())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .spawn();
    match spawned {
        Ok(mut child) => {
            let Some(stdin) = child.stdin.take() else {
                return;
            };
            let _ = GUARD.set(Mutex::new(stdin));
            // Reaped here if it ever ends before makod.
            let _ = std::thread::Builder::new()
                .name("fuse-guard-wait".into())
                .spawn(move || {
                    if let Ok(status) = child.wait() {
                        tracing::warn!("the FUSE guard process ended while makod runs: {status}");
                    }
                });
        }
        Err(e) => tracing::warn!(
            "could not start the FUSE guard process: {e}; if makod dies while the kernel \
             waits for it, its mounts may hang until `mako up` aborts their connections"
        ),
    }
}

fn tell(line: &str) {
    if let Some(g) = GUARD.get() {
        let mut pipe = g.lock().unwrap_or_else(|e| e.into_inner());
        if let Err(e) = pipe.write_all(line.as_bytes()) {
            tracing::warn!("telling the FUSE guard `{}`: {e}", line.trim_end());
        }
    }
}

/// A mount the guard watches, for as long as this lives.
#[derive(Debug)]
pub struct Watched(Option<(u32, u32)>);

impl Watched {
    /// The guard watches the connection `device` mounted at `mountpoint`.
    pub fn new(device: Option<(u32, u32)>, mountpoint: &std::path::Path) -> Watched {
        if let Some((major, minor)) = device {
            tell(&format!("+ {major} {minor} {}\n", mountpoint.display()));
        }
        Watched(device)
    }
}

impl Drop for Watched {
    fn drop(&mut self) {
        if let Some((major, minor)) = self.0 {
            tell(&format!("- {major} {minor}\n"));
        }
    }
}

/// The state letter of process `pid`'s main thread (`R`, `S`, `D`, `Z`, …).
fn state(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(')')
        .and_then(|(_, rest)| rest.trim_start().chars().next())
}

/// Closes every inherited descriptor above stderr but none of the standard ones.
fn close_inherited() {
    let fds: Vec<i32> = std::fs::read_dir("/proc/self/fd")
        .map(|d| {
            d.flatten()
                .filter_map(|e| e.file_name().to_str().and_then(|s| s.parse().ok()))
                .filter(|fd| *fd > 2)
                .collect()
        })
        .unwrap_or_default();
    for fd in fds {
        // SAFETY: closing a descriptor number this process inherited; none is used by
        // Rust objects here (the read_dir above is closed by now, or fails harmlessly).
        unsafe { libc::close(fd) };
    }
}

/// The guard's main (`makod --fuse-guard PID`): runs until process `pid` is gone.
pub fn run(pid: u32) {
    close_inherited();
    // SAFETY: getppid has no preconditions.
    let parent = || unsafe { libc::getppid() } as u32;
    if parent() != pid {
        tracing::error!("makod --fuse-guard {pid}: not started by makod {pid}; nothing to guard");
        return;
    }
    let mounts: Arc<Mutex<BTreeMap<(u32, u32), PathBuf>>> = Arc::default();
    {
        let mounts = mounts.clone();
        let _ = std::thread::Builder::new()
            .name("fuse-guard-pipe".into())
            .spawn(move || {
                for line in std::io::stdin().lock().lines() {
                    let Ok(line) = line else { break };
                    let mut f = line.splitn(4, ' ');
                    let (op, major, minor) = (f.next(), f.next(), f.next());
                    let device = major
                        .and_then(|m| m.parse().ok())
                        .zip(minor.and_then(|m| m.parse().ok()));
                    let mut m = mounts.lock().unwrap_or_else(|e| e.into_inner());
                    match (op, device, f.next()) {
                        (Some("+"), Some(d), Some(mp)) => {
                            m.insert(d, PathBuf::from(mp));
                        }
                        (Some("-"), Some(d), _) => {
                            m.remove(&d);
                        }
                        _ => {}
                    }
                }
            });
    }
    let mut exited_since: Option<Instant> = None;
    let mut aborted = false;
    // While any thread of makod lives, this process is its child; after, it is not.
    while parent() == pid {
        match state(pid) {
            Some('Z' | 'X') => {
                let since = *exited_since.get_or_insert_with(Instant::now);
                if !aborted && since.elapsed() >= STUCK_AFTER {
                    aborted = true;
                    abort_all(pid, &mounts.lock().unwrap_or_else(|e| e.into_inner()));
                }
            }
            _ => exited_since = None,
        }
        std::thread::sleep(POLL);
    }
}

fn abort_all(pid: u32, mounts: &BTreeMap<(u32, u32), PathBuf>) {
    for (device, mountpoint) in mounts {
        let still = mako_control::mount_table::at(mountpoint).is_some_and(|e| e.device == *device);
        if !still {
            continue;
        }
        match mako_control::mount_table::abort_fuse_connection(*device) {
            Ok(()) => tracing::warn!(
                "makod {pid} exited {} s ago but a thread of it is stuck in the kernel: \
                 aborted its FUSE connection {} on {} so that it can end (programs using the \
                 mount get ENOTCONN; `mako up` mounts it again)",
                STUCK_AFTER.as_secs(),
                device.1,
                mountpoint.display()
            ),
            Err(e) => tracing::error!(
                "makod {pid} exited but is stuck in the kernel; aborting its FUSE connection \
                 {} on {} failed: {e}. Abort it with `echo 1 > \
                 /sys/fs/fuse/connections/{}/abort`",
                device.1,
                mountpoint.display(),
                device.1
            ),
        }
    }
}
