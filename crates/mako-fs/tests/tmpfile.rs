//! O_TMPFILE at the file system API: a file with no links lives while open or known to
//! the kernel, is freed after, and can be given a name by link first.

use mako_fs::fs::{Ctx, ROOT_INO};
use mako_fs::test_util::{small_config, small_params, MemDisks};

const C: Ctx = Ctx {
    uid: 1000,
    gid: 1000,
    pid: 1,
};

#[test]
fn tmpfile_is_freed_after_close_unless_linked() {
    let disks = MemDisks::new(4, 32 << 20);
    disks.format(&small_params());
    let m = disks.mount(small_config());
    let fs = &m.fs;
    let used = || m.core().imap.used();
    let before = used();
    // As the FUSE layer does it: create, open, and one kernel reference.
    let a = fs.tmpfile(C, ROOT_INO, 0o640, 0o022).unwrap();
    assert_eq!((a.nlink, a.mode, a.uid), (0, 0o100640, 1000));
    fs.open(a.ino).unwrap();
    fs.add_lookup(a.ino);
    fs.write(a.ino, 0, &[7u8; 100_000], false).unwrap();
    assert_eq!(used(), before + 1);
    assert!(fs.readdir(ROOT_INO, 0, 100).unwrap().len() == 2, "no name");
    fs.release(a.ino).unwrap();
    fs.forget(a.ino, 1);
    assert_eq!(used(), before, "freed after close and forget");
    // Linked before close: it stays, with its data.
    let b = fs.tmpfile(C, ROOT_INO, 0o600, 0).unwrap();
    fs.open(b.ino).unwrap();
    fs.add_lookup(b.ino);
    fs.write(b.ino, 0, b"kept", false).unwrap();
    assert_eq!(fs.link(b.ino, ROOT_INO, b"named").unwrap().nlink, 1);
    fs.release(b.ino).unwrap();
    fs.forget(b.ino, 1);
    let n = fs.lookup(ROOT_INO, b"named").unwrap();
    assert_eq!(n.ino, b.ino);
    assert_eq!(fs.read(n.ino, 0, 10).unwrap(), b"kept");
    m.unmount().unwrap();
}
