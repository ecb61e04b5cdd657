//! The kernel's mount table as Mako reads it (`/proc/self/mountinfo`): what is mounted
//! at a mount point, whether it is one of Mako's FUSE mounts and of which file
//! system, and whether such a mount still has a daemon behind it.
//!
//! This is the one place that decides "is file system X mounted at P": makod asks it
//! before it reports or changes a mount's state, and the CLI before it trusts what a
//! daemon remembers or cleans up after a dead one. A Mako FUSE mount is recognised by
//! its source, `mako:NAME` (the `fsname` makod gives it), and its type, `fuse` or
//! `fuse.mako` (with the `mako` subtype).

use std::path::{Path, PathBuf};
use std::time::Duration;

/// The source (`fsname`) of the FUSE mount of file system `fs`.
pub fn fuse_source(fs: &str) -> String {
    format!("{SOURCE_PREFIX}{fs}")
}

const SOURCE_PREFIX: &str = "mako:";

/// One line of `/proc/self/mountinfo`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MountEntry {
    /// The device of the mounted file system (`major:minor`); for FUSE, the connection.
    pub device: (u32, u32),
    pub mountpoint: PathBuf,
    pub fstype: String,
    pub source: String,
    /// The mount's own options (`rw,nosuid,relatime`).
    pub mount_options: String,
    /// The superblock's options (`rw,user_id=0,…`).
    pub super_options: String,
}

impl MountEntry {
    /// True if writes through this mount are refused by the kernel: the mount or its
    /// superblock is read-only.
    pub fn read_only(&self) -> bool {
        let ro = |list: &str| list.split(',').any(|o| o == "ro");
        ro(&self.mount_options) || ro(&self.super_options)
    }

    /// The Mako file system this mount serves, if it is a Mako FUSE mount.
    pub fn mako_fs(&self) -> Option<&str> {
        let fuse = self.fstype == "fuse" || self.fstype == "fuse.mako";
        fuse.then(|| self.source.strip_prefix(SOURCE_PREFIX))
            .flatten()
    }
}

/// Every mount this process sees, in mount order (a later entry at the same mount point
/// covers an earlier one). Empty if the table cannot be read.
pub fn read() -> Vec<MountEntry> {
    std::fs::read_to_string("/proc/self/mountinfo")
        .map(|text| parse_mountinfo(&text))
        .unwrap_or_default()
}

/// The entry visible at `mountpoint` (the last one mounted there), if any.
pub fn at(mountpoint: &Path) -> Option<MountEntry> {
    let wanted = canonical_mountpoint(mountpoint);
    read().into_iter().rev().find(|e| e.mountpoint == wanted)
}

/// True if anything is mounted at `mountpoint`.
pub fn is_mounted(mountpoint: &Path) -> bool {
    at(mountpoint).is_some()
}

/// True if the mount visible at `mountpoint` is Mako's FUSE mount of file system `fs`.
pub fn is_mako_mount_of(mountpoint: &Path, fs: &str) -> bool {
    at(mountpoint).is_some_and(|e| e.mako_fs() == Some(fs))
}

/// `path` as the kernel writes it in the mount table: absolute, with the symbolic
/// links of its parent resolved. The last component is not resolved: a dead FUSE mount
/// cannot be looked at (ENOTCONN), and a mount point is never a symbolic link.
pub fn canonical_mountpoint(path: &Path) -> PathBuf {
    let absolute = if path.is_absolute() {
        path.to_path_buf()
    } else {
        std::env::current_dir()
            .map(|d| d.join(path))
            .unwrap_or_else(|_| path.to_path_buf())
    };
    match (absolute.parent(), absolute.file_name()) {
        (Some(parent), Some(name)) => parent
            .canonicalize()
            .map(|p| p.join(name))
            .unwrap_or(absolute),
        _ => absolute,
    }
}

/// Parses the text of `/proc/PID/mountinfo`; lines that do not parse are left out.
pub fn parse_mountinfo(text: &str) -> Vec<MountEntry> {
    text.lines().filter_map(parse_line).collect()
}

/// `36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 - ext3 /dev/root rw,errors=continue`:
/// id, parent, device, root, mount point, options, optional fields, `-`, type, source,
/// super-block options.
fn parse_line(line: &str) -> Option<MountEntry> {
    let (before, after) = line.split_once(" - ")?;
    let fields: Vec<&str> = before.split(' ').collect();
    let device = fields.get(2)?.split_once(':')?;
    let device = (device.0.parse().ok()?, device.1.parse().ok()?);
    let mountpoint = PathBuf::from(unescape(fields.get(4)?));
    let mount_options = fields.get(5).unwrap_or(&"").to_string();
    let mut rest = after.split(' ');
    let fstype = unescape(rest.next()?);
    let source = unescape(rest.next().unwrap_or(""));
    let super_options = rest.next().unwrap_or("").to_string();
    Some(MountEntry {
        device,
        mountpoint,
        fstype,
        source,
        mount_options,
        super_options,
    })
}

/// The mount table writes space, tab, newline and backslash as `\ooo` octal.
pub fn unescape(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\' && i + 4 <= bytes.len() {
            let digits = &bytes[i + 1..i + 4];
            if digits.iter().all(|d| (b'0'..=b'7').contains(d)) {
                let value = digits.iter().fold(0u32, |v, d| v * 8 + u32::from(d - b'0'));
                if let Ok(value) = u8::try_from(value) {
                    out.push(value);
                    i += 4;
                    continue;
                }
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// What a look at a FUSE mount's root found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Probe {
    /// Someone answers for it.
    Answers,
    /// The kernel says the connection is gone (ENOTCONN, or ECONNABORTED once it was
    /// aborted): its daemon has died.
    Dead,
    /// Any other error, or no answer within the time limit (a hung daemon).
    Unknown(String),
}

/// Asks the file system mounted at `mountpoint` for its `statfs`, which the kernel
/// always sends to the daemon (a `stat` may be answered from the kernel's attribute
/// cache, even for a dead mount). In a helper thread, so that a hung daemon cannot hang
/// the caller longer than `limit`.
pub fn probe(mountpoint: &Path, limit: Duration) -> Probe {
    use std::os::unix::ffi::OsStrExt;
    let Ok(path) = std::ffi::CString::new(mountpoint.as_os_str().as_bytes()) else {
        return Probe::Unknown("the path contains a NUL byte".into());
    };
    let (tx, rx) = std::sync::mpsc::channel();
    let spawned = std::thread::Builder::new()
        .name("mount-probe".into())
        .spawn(move || {
            // SAFETY: statfs writes into a zeroed plain-data struct through a valid path.
            let mut buf: libc::statfs = unsafe { std::mem::zeroed() };
            let result = if unsafe { libc::statfs(path.as_ptr(), &mut buf) } == 0 {
                Ok(())
            } else {
                Err(std::io::Error::last_os_error())
            };
            let _ = tx.send(result);
        });
    if let Err(e) = spawned {
        return Probe::Unknown(format!("cannot start a probe thread: {e}"));
    }
    match rx.recv_timeout(limit) {
        Ok(Ok(())) => Probe::Answers,
        Ok(Err(e)) if matches!(e.raw_os_error(), Some(libc::ENOTCONN | libc::ECONNABORTED)) => {
            Probe::Dead
        }
        Ok(Err(e)) => Probe::Unknown(e.to_string()),
        Err(_) => Probe::Unknown(format!("no answer within {} s", limit.as_secs())),
    }
}

/// Most processes [`holders`] names (the rest are counted).
pub const HOLDERS_SHOWN_MAX: usize = 5;

/// The processes that keep the mount at `mountpoint` busy — a file open there, their
/// current or root directory there, a file mapped from there — each as `pid N (comm):
/// what` (at most three things each), the process `except` left out (makod itself).
/// Read from /proc: processes this user may not inspect are not seen.
pub fn holders(mountpoint: &Path, except: u32) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let under = |p: &Path| p.starts_with(mountpoint);
    let mut out = Vec::new();
    for e in entries.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        if pid == except {
            continue;
        }
        let base = e.path();
        let mut what: Vec<String> = Vec::new();
        for (link, word) in [("cwd", "current directory"), ("root", "root directory")] {
            if let Ok(t) = std::fs::read_link(base.join(link)) {
                if under(&t) {
                    what.push(format!("{word} {}", t.display()));
                }
            }
        }
        if let Ok(fds) = std::fs::read_dir(base.join("fd")) {
            for fd in fds.flatten() {
                if let Ok(t) = std::fs::read_link(fd.path()) {
                    if under(&t) {
                        what.push(format!("open file {}", t.display()));
                    }
                }
            }
        }
        if let Ok(maps) = std::fs::read_to_string(base.join("maps")) {
            for line in maps.lines() {
                // address perms offset dev inode path
                if let Some(path) = line.split_whitespace().nth(5) {
                    if path.starts_with('/') && under(Path::new(path)) {
                        what.push(format!("mapped file {path}"));
                    }
                }
            }
        }
        if what.is_empty() {
            continue;
        }
        what.dedup();
        let more = what.len().saturating_sub(3);
        what.truncate(3);
        if more > 0 {
            what.push(format!("{more} more"));
        }
        let comm = std::fs::read_to_string(base.join("comm")).unwrap_or_default();
        out.push(format!("pid {pid} ({}): {}", comm.trim(), what.join(", ")));
    }
    out.sort();
    out
}

/// [`holders`] as one sentence for an error message: "held by …; and N more".
pub fn holders_text(holders: &[String]) -> String {
    let mut text = holders
        .iter()
        .take(HOLDERS_SHOWN_MAX)
        .cloned()
        .collect::<Vec<_>>()
        .join("; ");
    if holders.len() > HOLDERS_SHOWN_MAX {
        text.push_str(&format!(
            "; and {} more processes",
            holders.len() - HOLDERS_SHOWN_MAX
        ));
    }
    text
}

/// Ends the FUSE connection whose device is `device` (a [`MountEntry::device`]) by
/// writing to its `abort` file in the FUSE control file system, mounted at
/// `/sys/fs/fuse/connections` first if it is not; as `umount -f` would. Every request
/// waiting on it fails (ENOTCONN), and its daemon, if a thread of it is stuck in the
/// kernel on that connection, can finish exiting.
pub fn abort_fuse_connection(device: (u32, u32)) -> std::io::Result<()> {
    let connections = Path::new("/sys/fs/fuse/connections");
    let abort = connections.join(device.1.to_string()).join("abort");
    if !abort.exists() {
        // SAFETY: mount(2) of the FUSE control file system with constant arguments.
        let mounted = unsafe {
            libc::mount(
                c"fusectl".as_ptr(),
                c"/sys/fs/fuse/connections".as_ptr(),
                c"fusectl".as_ptr(),
                0,
                std::ptr::null(),
            )
        };
        if mounted != 0 && !abort.exists() {
            let e = std::io::Error::last_os_error();
            return Err(std::io::Error::new(
                e.kind(),
                format!("mounting fusectl on {}: {e}", connections.display()),
            ));
        }
    }
    std::fs::write(&abort, "1")
        .map_err(|e| std::io::Error::new(e.kind(), format!("writing {}: {e}", abort.display())))
}

/// Detaches the mount at `mountpoint` now (`umount -l`): as root with umount2
/// (MNT_DETACH), otherwise through `fusermount3 -uz` / `fusermount -uz`.
pub fn lazy_unmount(mountpoint: &Path) -> std::io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let path = std::ffi::CString::new(mountpoint.as_os_str().as_bytes())
        .map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
    // SAFETY: umount2 with a valid NUL-terminated path.
    if unsafe { libc::umount2(path.as_ptr(), libc::MNT_DETACH) } == 0 {
        return Ok(());
    }
    let error = std::io::Error::last_os_error();
    if error.raw_os_error() != Some(libc::EPERM) {
        return Err(error);
    }
    for helper in ["fusermount3", "fusermount"] {
        let status = std::process::Command::new(helper)
            .arg("-uz")
            .arg(mountpoint)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status();
        if status.is_ok_and(|s| s.success()) {
            return Ok(());
        }
    }
    Err(error)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = "\
22 1 259:1 / / rw,relatime shared:1 - ext4 /dev/root rw
42 27 0:39 / /tmp/a\\040b/mnt rw,relatime - fuse mako:fs1 rw,user_id=0,group_id=0
43 27 0:40 / /mnt/x rw,relatime shared:7 master:2 - fuse.mako mako:fs2 rw
44 27 0:41 / /mnt/y rw - fuse.sshfs host:/ rw
45 27 0:42 / /mnt/z rw - tmpfs mako:fs3 rw
garbage line
";

    #[test]
    fn holders_finds_a_process_with_its_current_directory_below() {
        let dir = std::env::temp_dir().join(format!("mako-holders-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("sub")).unwrap();
        let mut child = std::process::Command::new("sleep")
            .arg("60")
            .current_dir(dir.join("sub"))
            .spawn()
            .unwrap();
        let found = holders(&dir, std::process::id());
        let _ = child.kill();
        let _ = child.wait();
        let _ = std::fs::remove_dir_all(&dir);
        let pid = format!("pid {} (sleep): current directory", child.id());
        assert!(found.iter().any(|h| h.starts_with(&pid)), "{found:?}");
        assert!(holders(Path::new("/nonexistent-mako-dir"), 0).is_empty());
    }

    #[test]
    fn parses_mountinfo_and_recognises_mako_mounts() {
        let table = parse_mountinfo(SAMPLE);
        assert_eq!(table.len(), 5);
        assert_eq!(table[1].mountpoint, PathBuf::from("/tmp/a b/mnt"));
        assert_eq!(table[1].device, (0, 39));
        assert_eq!(table[1].mako_fs(), Some("fs1"));
        assert_eq!(table[2].mako_fs(), Some("fs2"), "optional fields skipped");
        assert_eq!(table[3].mako_fs(), None, "another FUSE file system");
        assert_eq!(table[4].mako_fs(), None, "not FUSE");
        assert_eq!(table[0].mako_fs(), None);
    }

    #[test]
    fn escapes() {
        assert_eq!(unescape("/mnt/a\\040b"), "/mnt/a b");
        assert_eq!(unescape("/plain"), "/plain");
        assert_eq!(unescape("/end\\"), "/end\\");
        assert_eq!(unescape("/x\\01"), "/x\\01");
    }

    #[test]
    fn the_root_is_mounted_and_a_fresh_directory_is_not() {
        assert!(is_mounted(Path::new("/")));
        let dir = tempfile::tempdir().unwrap();
        assert!(!is_mounted(dir.path()));
        assert_eq!(probe(dir.path(), Duration::from_secs(5)), Probe::Answers);
    }
}
