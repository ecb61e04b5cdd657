//! What file handles (NFS export, `open_by_handle_at`) need from the core: a file found
//! again by its inode number alone (`lookup_self`, the kernel's LOOKUP of "." in a
//! number), a directory's parent by "..", and a generation that changes whenever a
//! number is used again — also across remounts, whatever the clock says.

use mako_fs::env::NodeEnv;
use mako_fs::fs::{Ctx, ROOT_INO};
use mako_fs::mount::{mount_node, Mounted};
use mako_fs::test_util::{small_config, small_params, MemDisks};
use mako_fs::FsError;
use mako_rt::Clock;
use std::sync::Arc;
use std::time::{Duration, Instant};

const C: Ctx = Ctx {
    uid: 0,
    gid: 0,
    pid: 1,
};

/// A wall clock that always says the same second: two mounts of one file system in the
/// same second (or on nodes whose clocks agree) see the same time.
struct StuckClock {
    start: Instant,
}

impl Clock for StuckClock {
    fn wall(&self) -> Duration {
        Duration::from_secs(1_700_000_000)
    }
    fn monotonic(&self) -> Duration {
        self.start.elapsed()
    }
    fn sleep(&self, duration: Duration) {
        std::thread::sleep(duration)
    }
}

fn mount_stuck(disks: &MemDisks) -> Mounted {
    let env = NodeEnv {
        clock: Arc::new(StuckClock {
            start: Instant::now(),
        }),
        ..NodeEnv::single_node(0)
    };
    mount_node(disks.as_dyn(), small_config(), env).expect("mount")
}

fn stale(r: Result<mako_fs::Attr, FsError>, what: &str) {
    match r {
        Err(FsError::Stale(_)) => {}
        other => panic!("{what}: expected Stale (ESTALE), got {other:?}"),
    }
}

#[test]
fn a_number_used_again_gets_a_new_generation_across_remounts() {
    let disks = MemDisks::new(4, 64 << 20);
    disks.format(&small_params());
    let (ino, first) = {
        let m = mount_stuck(&disks);
        let a = m.fs.create(C, ROOT_INO, b"a", 0o644, 0, true).unwrap();
        m.fs.unlink(ROOT_INO, b"a").unwrap();
        m.unmount().unwrap();
        (a.ino, a.generation)
    };
    let m = mount_stuck(&disks);
    let b = m.fs.create(C, ROOT_INO, b"b", 0o644, 0, true).unwrap();
    assert_eq!(
        b.ino, ino,
        "the test needs the freed number to be used again"
    );
    assert_ne!(
        b.generation, first,
        "inode {ino} used again after a remount got the generation of the deleted file: \
         a handle of the deleted file would reach the new one"
    );
    assert!(b.generation > first, "{} after {first}", b.generation);
    // And within one mount, before the delete is even committed.
    m.fs.unlink(ROOT_INO, b"b").unwrap();
    let c = m.fs.create(C, ROOT_INO, b"c", 0o644, 0, true).unwrap();
    assert_eq!(c.ino, ino);
    assert!(
        c.generation > b.generation,
        "{} after {}",
        c.generation,
        b.generation
    );
    m.unmount().unwrap();
}

#[test]
fn lookup_of_dot_finds_files_by_number_and_nothing_else() {
    let disks = MemDisks::new(4, 64 << 20);
    disks.format(&small_params());
    let m = disks.mount(small_config());
    let fs = &m.fs;
    let d = fs.mkdir(C, ROOT_INO, b"d", 0o755, 0).unwrap();
    let e = fs.mkdir(C, d.ino, b"e", 0o755, 0).unwrap();
    let f = fs.create(C, e.ino, b"f", 0o644, 0, true).unwrap();
    fs.write(f.ino, 0, b"data", false).unwrap();

    // A file of any type, a directory, the root: themselves, with their generation.
    for (what, a) in [
        ("file", &f),
        ("directory", &e),
        ("root", &fs.getattr(ROOT_INO).unwrap()),
    ] {
        let found = fs
            .lookup(a.ino, b".")
            .unwrap_or_else(|err| panic!("lookup of . in the {what}: {err:?}"));
        assert_eq!(
            (found.ino, found.generation),
            (a.ino, a.generation),
            "{what}"
        );
    }
    // A directory's parent, also after it moved.
    assert_eq!(fs.lookup(e.ino, b"..").unwrap().ino, d.ino);
    fs.rename(d.ino, b"e", ROOT_INO, b"e2", 0).unwrap();
    assert_eq!(fs.lookup(e.ino, b"..").unwrap().ino, ROOT_INO);
    assert_eq!(fs.lookup(ROOT_INO, b"..").unwrap().ino, ROOT_INO);
    assert!(matches!(fs.lookup(f.ino, b".."), Err(FsError::NotDir(_))));

    // Mako's own metadata files (inode file, allocation maps, logs) are not reachable
    // by number, nor numbers never used, past the end, or freed.
    for ino in [0, 2, 3, 4, 5, 15] {
        stale(fs.lookup(ino, b"."), &format!("metadata inode {ino}"));
    }
    stale(fs.lookup(f.ino + 1000, b"."), "a number never used");
    stale(fs.lookup(u64::MAX, b"."), "a number past every inode");
    // An open file whose last name is gone is no longer reachable by a handle.
    fs.open(f.ino).unwrap();
    fs.unlink(e.ino, b"f").unwrap();
    stale(fs.lookup(f.ino, b"."), "an open file without links");
    fs.release(f.ino).unwrap();
    stale(fs.lookup(f.ino, b"."), "a deleted file");
    fs.rmdir(ROOT_INO, b"e2").unwrap();
    stale(fs.lookup(e.ino, b"."), "a removed directory");
    m.unmount().unwrap();
}
