//! NFS export of a Mako mount (Storage Scale clusters commonly export over NFS).
//!
//! An NFS server names files by file handles, which must stay valid when the kernel
//! drops its caches and across remounts. A FUSE handle is (node id, generation); Mako's
//! inode number is the node id, and with `FUSE_EXPORT_SUPPORT` the kernel finds an
//! inode it no longer caches by a LOOKUP of "." in that number, and a directory's parent
//! by "..". Proves, on a real mount:
//! - `handles_outlive_kernel_caches_and_remounts`: `name_to_handle_at` of files and
//!   directories; `open_by_handle_at` reads the data back and reconnects a directory to
//!   its path after the kernel dropped its caches (`drop_caches`), after the mount point
//!   was unmounted and mounted again, and after makod restarted; a handle of a deleted
//!   file, and of a file whose inode number another file now has, gets ESTALE.
//! - `kernel_nfs_server_exports_a_mako_mount`: the kernel NFS server exports the mount
//!   (`exportfs` with `fsid=`, which a FUSE file system needs) and the kernel NFS client
//!   mounts it over loopback; data both ways, a file kept open across a cache drop. A
//!   kernel without the NFS server or client (and no modules to load) fails the test
//!   with what is missing, as every test that cannot run does.
//!
//! Every test stops what it started (Drop guards): nfsd threads, its own export only,
//! NFS mounts (lazily), the cluster.

use mako_tests::cluster::{is_mounted, require_fuse, run_cmd, ClusterOptions, TestCluster};
use mako_tests::{pattern, skip, sys};
use std::fs::File;
use std::io::Read;
use std::os::unix::io::{AsRawFd, FromRawFd};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// `MAX_HANDLE_SZ` of linux/exportfs.h.
const MAX_HANDLE_BYTES: usize = 128;
/// `FILEID_INO64_GEN`: the handle type a FUSE file system encodes (node id, generation).
const FILEID_INO64_GEN: i32 = 0x81;

fn options() -> ClusterOptions {
    ClusterOptions {
        disks: 2,
        disk_size: "2G".into(),
        pagepool: "128M".into(),
        block_size: Some("1M".into()),
    }
}

/// A file handle as `name_to_handle_at` gives it: `struct file_handle` (its byte count,
/// its type, the bytes), in u32 words for the alignment the kernel expects.
#[derive(Clone, Debug)]
struct Handle {
    words: Vec<u32>,
}

impl Handle {
    fn of(path: &Path) -> sys::SysResult<Handle> {
        let mut words = vec![0u32; 2 + MAX_HANDLE_BYTES / 4];
        words[0] = MAX_HANDLE_BYTES as u32;
        let mut mount_id: libc::c_int = 0;
        let c = sys::cstr(path);
        let r = unsafe {
            libc::syscall(
                libc::SYS_name_to_handle_at,
                libc::AT_FDCWD,
                c.as_ptr(),
                words.as_mut_ptr(),
                &mut mount_id as *mut libc::c_int,
                0,
            )
        };
        if r < 0 {
            return Err(sys::Errno::last());
        }
        let bytes = words[0] as usize;
        words.truncate(2 + bytes.div_ceil(4));
        Ok(Handle { words })
    }

    fn kind(&self) -> i32 {
        self.words[1] as i32
    }

    /// The node id the kernel put in the handle (FUSE: high word, then low word).
    fn node_id(&self) -> u64 {
        ((self.words[2] as u64) << 32) | self.words[3] as u64
    }

    fn generation(&self) -> u32 {
        self.words[4]
    }

    /// `open_by_handle_at` on the file system of `mount_fd`.
    fn open(&self, mount_fd: &File, flags: libc::c_int) -> sys::SysResult<File> {
        let r = unsafe {
            libc::syscall(
                libc::SYS_open_by_handle_at,
                mount_fd.as_raw_fd(),
                self.words.as_ptr(),
                flags | libc::O_CLOEXEC,
            )
        };
        if r < 0 {
            return Err(sys::Errno::last());
        }
        Ok(unsafe { File::from_raw_fd(r as i32) })
    }
}

fn handle(path: &Path) -> Handle {
    let h =
        Handle::of(path).unwrap_or_else(|e| panic!("name_to_handle_at {}: {e:?}", path.display()));
    let ino = sys::stat(path)
        .unwrap_or_else(|e| panic!("stat {}: {e:?}", path.display()))
        .st_ino;
    assert_eq!(
        h.kind(),
        FILEID_INO64_GEN,
        "handle type of {}",
        path.display()
    );
    assert_eq!(
        h.node_id(),
        ino,
        "the kernel's node id of {} is Mako's inode number",
        path.display()
    );
    h
}

fn open_mount(m: &Path) -> File {
    File::open(m).unwrap_or_else(|e| panic!("open {}: {e}", m.display()))
}

fn read_all(mut f: &File) -> Vec<u8> {
    let mut v = Vec::new();
    f.read_to_end(&mut v).expect("read through the handle");
    v
}

/// Where the kernel says an open file is (its dentry's path, once reconnected).
fn fd_path(f: &File) -> PathBuf {
    std::fs::read_link(format!("/proc/self/fd/{}", f.as_raw_fd())).expect("readlink fd")
}

fn names_in(dir: &File) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(format!("/proc/self/fd/{}", dir.as_raw_fd()))
        .expect("readdir through the handle")
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

/// Drop the kernel's dentry and inode caches (every unused inode of every file system
/// is forgotten; a FUSE file system gets FORGETs). False if this machine does not let
/// the test do it (then the test cannot run).
fn drop_kernel_caches(test: &str) -> bool {
    match std::fs::write("/proc/sys/vm/drop_caches", "2") {
        Ok(()) => true,
        Err(e) => {
            skip::cannot_run(
                test,
                &format!("cannot drop the kernel's caches (/proc/sys/vm/drop_caches: {e})"),
            );
            false
        }
    }
}

fn expect_stale(r: sys::SysResult<File>, what: &str) {
    match r {
        Err(e) if e.0 == libc::ESTALE => {}
        Err(e) => panic!("{what}: expected ESTALE, got {e:?}"),
        Ok(f) => panic!(
            "{what}: expected ESTALE, but the handle opened {}",
            fd_path(&f).display()
        ),
    }
}

#[test]
fn handles_outlive_kernel_caches_and_remounts() {
    const T: &str = "handles_outlive_kernel_caches_and_remounts";
    if !require_fuse(T) {
        return;
    }
    let c = TestCluster::up(options()).expect("mako up");
    let m = c.mount().to_path_buf();
    let data = pattern(7, (3 << 20) + 123);
    std::fs::create_dir_all(m.join("d/sub")).unwrap();
    std::fs::write(m.join("d/f"), &data).unwrap();
    std::fs::write(m.join("d/sub/g"), b"g").unwrap();
    std::fs::write(m.join("gone"), b"gone").unwrap();
    std::fs::write(m.join("victim"), b"victim").unwrap();
    let hf = handle(&m.join("d/f"));
    let hd = handle(&m.join("d"));
    let hsub = handle(&m.join("d/sub"));
    let hg = handle(&m.join("d/sub/g"));
    let hgone = handle(&m.join("gone"));
    let victim_ino = sys::stat(&m.join("victim")).unwrap().st_ino;
    let hvictim = handle(&m.join("victim"));

    // Everything the handles reach, through a mount fd opened now.
    let check = |when: &str| {
        let mfd = open_mount(&m);
        let f = hf
            .open(&mfd, libc::O_RDONLY)
            .unwrap_or_else(|e| panic!("{when}: open_by_handle_at of d/f: {e:?}"));
        assert!(read_all(&f) == data, "{when}: d/f read through its handle");
        let sub = hsub
            .open(&mfd, libc::O_RDONLY | libc::O_DIRECTORY)
            .unwrap_or_else(|e| panic!("{when}: open_by_handle_at of d/sub: {e:?}"));
        // A directory is reconnected to the tree by its parents ("..") and their names.
        assert_eq!(fd_path(&sub), m.join("d/sub"), "{when}: path of d/sub");
        assert_eq!(
            names_in(&sub),
            ["g"],
            "{when}: d/sub listed through its handle"
        );
        let d = hd
            .open(&mfd, libc::O_RDONLY | libc::O_DIRECTORY)
            .unwrap_or_else(|e| panic!("{when}: open_by_handle_at of d: {e:?}"));
        assert_eq!(
            names_in(&d),
            ["f", "sub"],
            "{when}: d listed through its handle"
        );
        let g = hg
            .open(&mfd, libc::O_RDWR)
            .unwrap_or_else(|e| panic!("{when}: open_by_handle_at of d/sub/g: {e:?}"));
        assert_eq!(read_all(&g), b"g", "{when}: d/sub/g");
    };
    check("with the kernel's caches warm");
    if !drop_kernel_caches(T) {
        return;
    }
    check("after the kernel dropped its caches");

    // A deleted file's handle is stale, cached or not.
    std::fs::remove_file(m.join("gone")).unwrap();
    expect_stale(hgone.open(&open_mount(&m), libc::O_RDONLY), "deleted file");
    assert!(drop_kernel_caches(T));
    expect_stale(
        hgone.open(&open_mount(&m), libc::O_RDONLY),
        "deleted file, caches dropped",
    );

    // The victim's number goes to a new file (once the kernel has forgotten the victim,
    // which frees it: the lowest free number is taken first).
    std::fs::remove_file(m.join("victim")).unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    let reborn = (0..)
        .map(|i| {
            let p = m.join(format!("reborn{i}"));
            std::fs::write(&p, format!("reborn {i}")).unwrap();
            assert!(
                Instant::now() < deadline,
                "inode {victim_ino} of the deleted victim was not used again within 60 s"
            );
            p
        })
        .find(|p| sys::stat(p).unwrap().st_ino == victim_ino)
        .unwrap();
    let hreborn = handle(&reborn);
    assert_ne!(
        hreborn.generation(),
        hvictim.generation(),
        "inode {victim_ino} used again with the same generation"
    );
    expect_stale(
        hvictim.open(&open_mount(&m), libc::O_RDONLY),
        "handle of a file whose inode number another file now has",
    );
    assert!(drop_kernel_caches(T));
    expect_stale(
        hvictim.open(&open_mount(&m), libc::O_RDONLY),
        "handle of a file whose inode number another file now has, caches dropped",
    );
    let r = hreborn.open(&open_mount(&m), libc::O_RDONLY).unwrap();
    assert!(read_all(&r).starts_with(b"reborn"));
    drop(r);

    // A new kernel superblock: nothing of the file system is cached any more.
    let out = c.mako(&["fs", "unmount", "fs1"]).unwrap();
    assert!(out.success(), "mako fs unmount: {out}");
    let out = c.mako(&["fs", "mount", "fs1"]).unwrap();
    assert!(out.success(), "mako fs mount: {out}");
    let t = Instant::now();
    while !is_mounted(&m) {
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "fs1 not mounted again"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    check("after the file system was unmounted and mounted again");
    c.remount().expect("mako down, mako up");
    check("after makod restarted (mako down, mako up)");
    expect_stale(
        hgone.open(&open_mount(&m), libc::O_RDONLY),
        "deleted file after makod restarted",
    );
    expect_stale(
        hvictim.open(&open_mount(&m), libc::O_RDONLY),
        "reused number after makod restarted",
    );
}

/// Runs a program with a time limit; its output for messages.
fn run(program: &str, args: &[&str]) -> mako_tests::cluster::CmdOutput {
    run_cmd(Path::new(program), args, Duration::from_secs(60))
        .unwrap_or_else(|e| panic!("{program} {args:?}: {e:#}"))
}

fn on_path(program: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(program).is_file()))
}

/// Whether this kernel has `name` in /proc/filesystems.
fn kernel_has_fs(name: &str) -> bool {
    std::fs::read_to_string("/proc/filesystems")
        .unwrap_or_default()
        .lines()
        .any(|l| l.split_whitespace().last() == Some(name))
}

/// The kernel NFS server and client, or why they cannot be had here.
fn kernel_nfs_available() -> Result<(), String> {
    let mut tried = Vec::new();
    for module in ["nfsd", "nfs"] {
        if !kernel_has_fs(module) && on_path("modprobe") {
            let out = run("modprobe", &[module]);
            tried.push(format!("modprobe {module}: {}", out.text().trim()));
        }
    }
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let modules = if Path::new("/proc/modules").exists() {
        "it can load modules"
    } else {
        "it cannot load modules (built without CONFIG_MODULES: no /proc/modules)"
    };
    let mut missing = Vec::new();
    if !kernel_has_fs("nfsd") {
        missing.push("the NFS server (no nfsd in /proc/filesystems: CONFIG_NFSD)");
    }
    if !kernel_has_fs("nfs") && !kernel_has_fs("nfs4") {
        missing.push("the NFS client (no nfs in /proc/filesystems: CONFIG_NFS_FS)");
    }
    if !missing.is_empty() {
        return Err(format!(
            "kernel {} has neither module nor built-in {}, and {modules}{}",
            release.trim(),
            missing.join(" nor "),
            if tried.is_empty() {
                String::new()
            } else {
                format!(" ({})", tried.join("; "))
            }
        ));
    }
    let tools: Vec<&str> = ["exportfs", "rpc.nfsd", "mount.nfs"]
        .into_iter()
        .filter(|p| {
            !on_path(p)
                && !Path::new("/usr/sbin").join(p).is_file()
                && !Path::new("/sbin").join(p).is_file()
        })
        .collect();
    if !tools.is_empty() {
        return Err(format!(
            "{} missing (apt-get install nfs-kernel-server nfs-common; scripts/install-deps does)",
            tools.join(", ")
        ));
    }
    Ok(())
}

/// Everything the kernel NFS test started, undone on drop in reverse order: the NFS
/// mount (lazily), this test's export only, the nfsd threads and the nfsd file system
/// if it started them.
#[derive(Default)]
struct KernelNfs {
    nfsd_fs_mounted: bool,
    threads_started: bool,
    export: Option<String>,
    nfs_mount: Option<PathBuf>,
}

impl Drop for KernelNfs {
    fn drop(&mut self) {
        if let Some(p) = self.nfs_mount.take() {
            if is_mounted(&p) {
                let _ = run("umount", &["-l", p.to_str().unwrap()]);
            }
        }
        if let Some(e) = self.export.take() {
            let _ = run("exportfs", &["-u", &e]);
        }
        if self.threads_started {
            let _ = run("rpc.nfsd", &["0"]);
        }
        if self.nfsd_fs_mounted {
            let _ = run("umount", &["-l", "/proc/fs/nfsd"]);
        }
    }
}

/// Blocked on this machine: its kernel has no NFS server or client (CONFIG_NFSD,
/// CONFIG_NFS_FS) and cannot load modules (no CONFIG_MODULES), so the export cannot be
/// tried here at all; run it with `-- --ignored` on a kernel that has them. The file
/// handle side that NFS relies on is checked by `handles_outlive_kernel_caches_and_remounts`.
#[test]
#[ignore = "blocked: this machine's kernel has no nfsd or NFS client and cannot load modules"]
fn kernel_nfs_server_exports_a_mako_mount() {
    const T: &str = "kernel_nfs_server_exports_a_mako_mount";
    if !require_fuse(T) {
        return;
    }
    if let Err(why) = kernel_nfs_available() {
        skip::cannot_run(T, &format!("no kernel NFS here: {why}"));
        return;
    }
    let c = TestCluster::up(options()).expect("mako up");
    let m = c.mount().to_path_buf();
    let client_dir = tempfile::Builder::new()
        .prefix("mako-nfs-client-")
        .tempdir_in("/var/tmp")
        .expect("temp dir");
    let n = client_dir.path().join("mnt");
    std::fs::create_dir(&n).unwrap();
    // Declared after the cluster and the client's dir: undone before them.
    let mut k = KernelNfs::default();
    if !is_mounted(Path::new("/proc/fs/nfsd")) {
        let out = run("mount", &["-t", "nfsd", "nfsd", "/proc/fs/nfsd"]);
        assert!(out.success(), "mount -t nfsd: {out}");
        k.nfsd_fs_mounted = true;
    }
    let threads = std::fs::read_to_string("/proc/fs/nfsd/threads").unwrap_or_default();
    if threads.trim().parse::<u32>().unwrap_or(0) == 0 {
        // No clients to recover: a short grace period (set while nfsd is stopped).
        let _ = std::fs::write("/proc/fs/nfsd/nfsv4gracetime", "10");
        let _ = std::fs::write("/proc/fs/nfsd/nfsv4leasetime", "10");
        let out = run("rpc.nfsd", &["4"]);
        assert!(out.success(), "rpc.nfsd 4: {out}");
        k.threads_started = true;
    }
    // A FUSE file system has no UUID for nfsd to name it by: fsid= does.
    let fsid = 0x6d61_0000 + (std::process::id() & 0xffff);
    let export = format!("127.0.0.1:{}", m.display());
    let out = run(
        "exportfs",
        &[
            "-o",
            &format!("rw,no_root_squash,no_subtree_check,sync,insecure,fsid={fsid}"),
            &export,
        ],
    );
    assert!(out.success(), "exportfs {export}: {out}");
    k.export = Some(export.clone());
    let out = run(
        "mount",
        &[
            "-t",
            "nfs",
            "-o",
            "vers=4.2,proto=tcp",
            &export,
            n.to_str().unwrap(),
        ],
    );
    assert!(out.success(), "mount -t nfs {export}: {out}");
    k.nfs_mount = Some(n.clone());

    // Written through NFS, read on Mako; and the other way.
    let a = pattern(21, (3 << 20) + 17);
    std::fs::write(n.join("via_nfs"), &a).unwrap();
    assert!(
        std::fs::read(m.join("via_nfs")).unwrap() == a,
        "via_nfs on Mako"
    );
    let b = pattern(22, (1 << 20) + 5);
    std::fs::write(m.join("via_mako"), &b).unwrap();
    assert!(
        std::fs::read(n.join("via_mako")).unwrap() == b,
        "via_mako through NFS"
    );
    std::fs::create_dir(n.join("dir")).unwrap();
    std::fs::write(n.join("dir/inner"), b"inner").unwrap();

    // A file kept open through NFS across a cache drop: nfsd's handle of it must
    // still reach the file.
    let open = File::open(n.join("via_nfs")).unwrap();
    if !drop_kernel_caches(T) {
        return;
    }
    let mut again = Vec::new();
    (&open).read_to_end(&mut again).unwrap();
    assert!(
        again == a,
        "via_nfs through the fd kept open across a cache drop"
    );
    assert_eq!(std::fs::read(n.join("dir/inner")).unwrap(), b"inner");
    assert_eq!(std::fs::read(m.join("dir/inner")).unwrap(), b"inner");
    drop(open);
    drop(k);
}
