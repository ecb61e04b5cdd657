//! The kernel's caches under tokens, through the real kernel: two nodes of one file
//! system (`makod --local-nodes 2`), each with its own FUSE mount. A node hands its
//! kernel attributes and names (and absences: negative entries) with a long timeout
//! while it holds the token covering them, so each check below first makes mount A's
//! kernel cache something, then changes it through mount B, then asks A at once: only
//! the invalidation that B's token request causes on A (a revoke) can make A's answer
//! right. Attributes are read with stat(2) (`newfstatat`), which the kernel answers from
//! its cache while the timeout runs; Rust's `metadata` asks statx for the birth time,
//! which FUSE never caches, and would not test the cache at all.
//!
//! Each test ends by stopping both nodes and running `mako fsck -n` on the disk files.

use mako_tests::cluster::require_fuse;
use mako_tests::multinode::{MultiNode, MultiNodeOptions};
use std::ffi::CString;
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

fn up() -> MultiNode {
    MultiNode::up(MultiNodeOptions::default()).expect("two nodes up")
}

/// stat(2), as `ls -l`, mdtest and find call it: answered from the kernel's attribute
/// cache while its timeout runs.
fn stat(p: &Path) -> std::io::Result<libc::stat> {
    let c = CString::new(p.as_os_str().as_bytes()).expect("path without NUL");
    // SAFETY: a NUL-terminated path and a zeroed buffer stat(2) fills.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    if unsafe { libc::stat(c.as_ptr(), &mut st) } == 0 {
        Ok(st)
    } else {
        Err(std::io::Error::last_os_error())
    }
}

fn exists(p: &Path) -> bool {
    match stat(p) {
        Ok(_) => true,
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => false,
        Err(e) => panic!("stat {}: {e}", p.display()),
    }
}

fn ino(p: &Path) -> u64 {
    stat(p)
        .unwrap_or_else(|e| panic!("stat {}: {e}", p.display()))
        .st_ino
}

#[test]
fn names_changed_on_one_node_are_seen_at_once_on_the_other() {
    if !require_fuse("names_changed_on_one_node_are_seen_at_once_on_the_other") {
        return;
    }
    let c = up();
    let (a, b) = (c.mount(0).join("d"), c.mount(1).join("d"));
    std::fs::create_dir(&a).unwrap();
    for round in 0..3 {
        let x = format!("x{round}");
        // A misses the name twice (a negative entry, kept under A's name token) …
        assert!(!exists(&a.join(&x)), "{x} before its create");
        assert!(!exists(&a.join(&x)), "{x} before its create, again");
        // … B creates it: A sees it at once.
        std::fs::write(b.join(&x), b"from B").unwrap();
        assert!(
            exists(&a.join(&x)),
            "round {round}: node A still misses {x}, created on node B (its negative entry survived)"
        );
        assert_eq!(std::fs::read(a.join(&x)).unwrap(), b"from B");
        // A has the name cached (positive) now; B removes it: A must miss it at once.
        assert_eq!(ino(&a.join(&x)), ino(&b.join(&x)));
        std::fs::remove_file(b.join(&x)).unwrap();
        assert!(
            !exists(&a.join(&x)),
            "round {round}: node A still finds {x}, unlinked on node B"
        );
        // Renamed on B over a name A has cached, and away from one A has cached.
        let (y, z) = (format!("y{round}"), format!("z{round}"));
        std::fs::write(b.join(&y), b"y").unwrap();
        std::fs::write(a.join(&z), b"z").unwrap();
        let y_ino = ino(&a.join(&y));
        assert!(exists(&a.join(&z)));
        std::fs::rename(b.join(&y), b.join(&z)).unwrap();
        assert!(
            !exists(&a.join(&y)),
            "round {round}: node A still finds {y}, renamed away on node B"
        );
        assert_eq!(
            ino(&a.join(&z)),
            y_ino,
            "round {round}: node A's {z} is not the file renamed over it on node B"
        );
        assert_eq!(std::fs::read(a.join(&z)).unwrap(), b"y");
        std::fs::remove_file(a.join(&z)).unwrap();
        assert!(!exists(&b.join(&z)), "{z} unlinked on A, gone on B");
    }
    // A directory made on B under a name A missed, removed on B after A looked into it.
    assert!(!exists(&a.join("sub")));
    std::fs::create_dir(b.join("sub")).unwrap();
    assert!(exists(&a.join("sub")), "mkdir on B seen on A");
    assert!(!exists(&a.join("sub/f")));
    std::fs::write(b.join("sub/f"), b"f").unwrap();
    assert!(
        exists(&a.join("sub/f")),
        "create in the new directory seen on A"
    );
    std::fs::remove_file(b.join("sub/f")).unwrap();
    std::fs::remove_dir(b.join("sub")).unwrap();
    assert!(!exists(&a.join("sub")), "rmdir on B seen on A");
    // Listings agree after all that.
    let list = |d: &Path| -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(d)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    };
    assert_eq!(list(&a), list(&b));
    c.finish().expect("stop and fsck");
}

#[test]
fn attributes_changed_on_one_node_are_seen_at_once_on_the_other() {
    if !require_fuse("attributes_changed_on_one_node_are_seen_at_once_on_the_other") {
        return;
    }
    let c = up();
    let (a, b) = (c.mount(0).join("f"), c.mount(1).join("f"));
    std::fs::write(&a, b"0123456789").unwrap();
    for round in 0..3u64 {
        // A caches the size …
        let before = stat(&a).unwrap().st_size as u64;
        assert_eq!(stat(&a).unwrap().st_size as u64, before);
        // … B appends and closes: A's stat shows the new size at once.
        let grow = 1000 + round * 4096;
        {
            let mut f = std::fs::OpenOptions::new().append(true).open(&b).unwrap();
            f.write_all(&vec![b'b'; grow as usize]).unwrap();
        }
        assert_eq!(
            stat(&a).unwrap().st_size as u64,
            before + grow,
            "round {round}: node A's stat after node B's write and close"
        );
        // Truncated on B.
        let cut = before + grow / 2;
        std::fs::OpenOptions::new()
            .write(true)
            .open(&b)
            .unwrap()
            .set_len(cut)
            .unwrap();
        assert_eq!(
            stat(&a).unwrap().st_size as u64,
            cut,
            "round {round}: node A's stat after node B's truncate"
        );
        // chmod and chown on B.
        let mode = 0o600 + round as u32;
        std::os::unix::fs::chown(&b, Some(1000 + round as u32), Some(2000)).unwrap();
        std::fs::set_permissions(&b, std::os::unix::fs::PermissionsExt::from_mode(mode)).unwrap();
        let st = stat(&a).unwrap();
        assert_eq!(st.st_mode & 0o7777, mode, "round {round}: mode on A");
        assert_eq!(st.st_uid, 1000 + round as u32, "round {round}: owner on A");
        // Times set on B.
        let t = 1_000_000_000 + round as i64;
        let times = [
            libc::timespec {
                tv_sec: t,
                tv_nsec: 0,
            },
            libc::timespec {
                tv_sec: t,
                tv_nsec: 0,
            },
        ];
        let cb = CString::new(b.as_os_str().as_bytes()).unwrap();
        assert_eq!(
            unsafe { libc::utimensat(libc::AT_FDCWD, cb.as_ptr(), times.as_ptr(), 0) },
            0
        );
        assert_eq!(stat(&a).unwrap().st_mtime, t, "round {round}: mtime on A");
        // Back to B for the next round's cached size on A.
        assert_eq!(stat(&b).unwrap().st_size as u64, cut);
    }
    c.finish().expect("stop and fsck");
}

/// Changes a node makes itself, behind its kernel's back, reach the kernel too: the
/// blocks write-behind allocates (st_blocks) after the kernel fetched the attributes.
#[test]
fn local_changes_the_kernel_did_not_make_reach_it() {
    if !require_fuse("local_changes_the_kernel_did_not_make_reach_it") {
        return;
    }
    let c = up();
    let a = c.mount(0).join("blocks");
    {
        let mut f = std::fs::File::create(&a).unwrap();
        // Less than a block: it stays dirty (no space allocated) until the fsync.
        f.write_all(&vec![7u8; 100 << 10]).unwrap();
        // The kernel now has the attributes from before write-behind allocated.
        let _ = stat(&a).unwrap();
        f.sync_all().unwrap();
    }
    assert!(
        stat(&a).unwrap().st_blocks >= (100 << 10) / 512,
        "st_blocks after fsync: {} (the kernel kept the count from before write-behind)",
        stat(&a).unwrap().st_blocks
    );
    c.finish().expect("stop and fsck");
}
