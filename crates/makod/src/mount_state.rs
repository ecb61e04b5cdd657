//! What makod knows about each of its FUSE mounts, checked against the kernel.
//!
//! A mount makod made can end without makod doing anything: `umount` by an admin ends
//! the kernel's FUSE connection, the request threads return and the mount is gone from
//! the mount table; `umount -l` while files are open detaches it from its mount point
//! but keeps serving those files. makod must not go on reporting "mounted" (or refuse
//! `mako fs mount` as "already mounted") from what it remembers, so every report and
//! every mount or unmount first asks [`MountPoint::health`], which looks at the FUSE
//! session and the kernel's mount table (`mako_control::mount_table`). A file system
//! may have several mount points (a `MountPoint` each, one FUSE session over the one
//! mounted core): a mount point whose session ended is released
//! ([`MountPoint::join_ended`]), and the file system is written back and forgotten
//! ([`MountedFs::write_back`]) when its last mount point is gone. makod's main loop also
//! looks a few times a second, so the write-back happens and `makod.log` records it soon
//! after the unmount, not only at the next request.

use anyhow::{Context, Result};
use mako_control::mount_options::{AtimeOption, MountOptions};
use mako_control::mount_table;
use mako_fs::fs::AtimePolicy;
use mako_fs::Mounted;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long a mount request waits for the session of a mount that was just unmounted
/// from outside to end (the request threads return within milliseconds).
const SESSION_END_WAIT: Duration = Duration::from_secs(5);

/// A file system makod mounted, at one or more mount points.
pub(crate) struct MountedFs {
    pub(crate) name: String,
    pub(crate) mounted: Mounted,
    /// Its mount points, each a FUSE session over `mounted`. Never empty while makod
    /// keeps the file system: when the last one goes, it is written back and forgotten.
    pub(crate) points: Vec<MountPoint>,
    /// The file system's FUSE sessions, its kernel invalidator.
    pub(crate) sessions: Arc<mako_fuse::Sessions>,
    /// `fuseDirectIoFileSize` as the FUSE adapter reads it at each open.
    pub(crate) direct_io_file_size: Arc<AtomicU64>,
    pub(crate) disk_paths: Vec<(String, PathBuf)>,
    /// How a node of a multi-process cluster reaches each disk (empty for one makod
    /// that opens them all).
    pub(crate) disk_access: crate::net::DiskAccessList,
}

/// One mount point of a file system: a FUSE session, with its options.
pub(crate) struct MountPoint {
    pub(crate) name: String,
    pub(crate) fuse: mako_fuse::FuseMount,
    pub(crate) mountpoint: PathBuf,
    /// The options as makod applied them (a remount changes them).
    pub(crate) options: MountOptions,
    /// What the session's request handlers read: read-only and atime policy.
    pub(crate) flags: Arc<mako_fuse::MountFlags>,
    /// The kernel's device of this mount (its FUSE connection), read from the mount
    /// table right after mounting; `None` if it could not be found there.
    pub(crate) device: Option<(u32, u32)>,
    /// The FUSE guard watches this mount's connection while this lives.
    pub(crate) _guard: crate::fuse_guard::Watched,
}

/// A mount's state, as the kernel sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Health {
    /// At its mount point in the kernel's mount table, and served.
    Mounted,
    /// The FUSE session ended: unmounted from outside (`umount`) or the connection was
    /// aborted. Nothing is served; the file system still has to be written back.
    Ended,
    /// The session runs but the mount is no longer at its mount point (`umount -l` while
    /// files on it are open): only files opened before are served, until they close.
    Detached,
}

/// What the FUSE adapter needs of an atime option.
pub(crate) fn atime_policy(a: AtimeOption) -> AtimePolicy {
    match a {
        AtimeOption::Relatime => AtimePolicy::Relatime,
        AtimeOption::Strictatime => AtimePolicy::Strict,
        AtimeOption::Noatime => AtimePolicy::Never,
    }
}

impl MountedFs {
    /// Writes the file system back once its last mount point has gone.
    pub(crate) fn write_back(self) -> Result<()> {
        debug_assert!(self.points.is_empty());
        let name = self.name.clone();
        let core = self.mounted.core().clone();
        self.mounted
            .unmount()
            .with_context(|| format!("writing back {name}"))?;
        if mako_fs::ownership::shared(&core) && !core.read_only.load(Ordering::Relaxed) {
            // Everything is written back: give up every token, so no other node ever
            // revokes from this one once it is gone (in a multi-process cluster its
            // token client stops answering with its process).
            core.tokens
                .client()
                .release_all()
                .map_err(|e| anyhow::anyhow!("{name}: giving up this node's tokens: {e}"))?;
        }
        Ok(())
    }
}

impl MountPoint {
    /// The device of the Mako mount of `name` now visible at `mountpoint`.
    pub(crate) fn find_device(name: &str, mountpoint: &std::path::Path) -> Option<(u32, u32)> {
        mount_table::at(mountpoint)
            .filter(|e| e.mako_fs() == Some(name))
            .map(|e| e.device)
    }

    /// The mount's state now: its FUSE session, then the kernel's mount table.
    pub(crate) fn health(&self) -> Health {
        if self.fuse.session_ended() {
            return Health::Ended;
        }
        let entry = mount_table::at(&self.mountpoint);
        let ours = entry.is_some_and(|e| match self.device {
            Some(device) => e.device == device,
            None => e.mako_fs() == Some(self.name.as_str()),
        });
        if ours {
            Health::Mounted
        } else {
            Health::Detached
        }
    }

    /// Waits (briefly) for a mount that is no longer in the mount table to end its
    /// session: right after `umount` the request threads may still be returning.
    pub(crate) fn settle(&self) -> Health {
        let deadline = Instant::now() + SESSION_END_WAIT;
        loop {
            let health = self.health();
            if health != Health::Detached || Instant::now() >= deadline {
                return health;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Ends the FUSE connection of a detached mount (`umount -l` with files open) by
    /// writing to its `abort` file in the FUSE control file system (mounted at
    /// `/sys/fs/fuse/connections` first if it is not), then waits for the session to
    /// end. Files still open on it fail from then on (ENOTCONN), as after `umount -f`.
    pub(crate) fn abort_connection(&self) -> Result<()> {
        let device = self.device.with_context(|| {
            format!(
                "the kernel device of {}'s FUSE connection is not known",
                self.name
            )
        })?;
        mount_table::abort_fuse_connection(device)
            .with_context(|| format!("aborting the FUSE connection of {}", self.name))?;
        let deadline = Instant::now() + SESSION_END_WAIT;
        while !self.fuse.session_ended() {
            if Instant::now() >= deadline {
                anyhow::bail!(
                    "the FUSE session of {} did not end within {} s of its abort",
                    self.name,
                    SESSION_END_WAIT.as_secs()
                );
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        Ok(())
    }

    /// Releases a mount point whose session has ended: joins the request threads and
    /// gives back the references its kernel held.
    pub(crate) fn join_ended(self) {
        if let Err(e) = self.fuse.unmount() {
            // The session is over either way; its final error is only worth a note.
            tracing::warn!(
                "FUSE session of {} on {} ended with: {e}",
                self.name,
                self.mountpoint.display()
            );
        }
    }

    /// Applies a remount's options to makod's side of this mount point (the kernel's
    /// side is done by then).
    pub(crate) fn set_options(&mut self, options: MountOptions) {
        self.flags
            .set(options.read_only, atime_policy(options.atime));
        self.options = options;
    }
}
