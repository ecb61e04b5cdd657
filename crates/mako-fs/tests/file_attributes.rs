//! chattr attributes (immutable, append-only) at the file system API: kept in the inode,
//! so they survive a remount and a crash after fsync, and enforced for every caller.

use mako_fs::attributes::{FS_APPEND_FL, FS_IMMUTABLE_FL};
use mako_fs::fs::{Ctx, SetAttr, ROOT_INO};
use mako_fs::test_util::{small_config, small_params, MemDisks};
use mako_fs::FsError;

const C: Ctx = Ctx {
    uid: 0,
    gid: 0,
    pid: 1,
};

fn is_perm<T: std::fmt::Debug>(r: Result<T, FsError>, what: &str) {
    match r {
        Err(FsError::Perm(m)) => assert!(m.contains("chattr"), "{what}: message {m:?}"),
        other => panic!("{what}: expected EPERM, got {other:?}"),
    }
}

#[test]
fn attributes_persist_across_remount_and_crash() {
    let disks = MemDisks::new(4, 32 << 20);
    disks.format(&small_params());
    let (f, d) = {
        let m = disks.mount(small_config());
        let fs = &m.fs;
        let f = fs.create(C, ROOT_INO, b"f", 0o644, 0, true).unwrap().ino;
        let d = fs.mkdir(C, ROOT_INO, b"d", 0o755, 0).unwrap().ino;
        fs.set_file_attributes(f, FS_IMMUTABLE_FL).unwrap();
        fs.set_file_attributes(d, FS_APPEND_FL).unwrap();
        assert_eq!(fs.getattr(f).unwrap().attributes, FS_IMMUTABLE_FL);
        m.unmount().unwrap();
        (f, d)
    };
    {
        let m = disks.mount(small_config());
        let fs = &m.fs;
        assert_eq!(fs.file_attributes(f).unwrap(), FS_IMMUTABLE_FL);
        assert_eq!(fs.file_attributes(d).unwrap(), FS_APPEND_FL);
        is_perm(fs.write(f, 0, b"x", false), "write after remount");
        // Changed and fsynced, then crashed (dropped without unmount).
        fs.set_file_attributes(f, FS_APPEND_FL).unwrap();
        fs.fsync(f, false).unwrap();
    }
    let m = disks.mount(small_config());
    let fs = &m.fs;
    assert_eq!(fs.file_attributes(f).unwrap(), FS_APPEND_FL);
    assert!(matches!(
        fs.set_file_attributes(f, 0x80),
        Err(FsError::NotSupported(_))
    ));
    m.unmount().unwrap();
}

#[test]
fn immutable_and_append_only_are_enforced_for_root() {
    let disks = MemDisks::new(4, 32 << 20);
    disks.format(&small_params());
    let m = disks.mount(small_config());
    let fs = &m.fs;
    let f = fs.create(C, ROOT_INO, b"f", 0o644, 0, true).unwrap().ino;
    fs.write(f, 0, b"abc", false).unwrap();
    fs.set_file_attributes(f, FS_IMMUTABLE_FL).unwrap();
    is_perm(fs.write(f, 3, b"d", false), "append to an immutable file");
    is_perm(fs.write_direct(f, 0, b"d"), "direct write");
    is_perm(
        fs.setattr(
            f,
            SetAttr {
                size: Some(0),
                ..Default::default()
            },
        ),
        "truncate",
    );
    is_perm(fs.fallocate(f, 0, 4096, 0), "fallocate");
    is_perm(fs.setxattr(f, b"user.k", b"v", 0), "setxattr");
    is_perm(fs.link(f, ROOT_INO, b"g"), "link");
    is_perm(fs.unlink(ROOT_INO, b"f"), "unlink");
    is_perm(fs.rename(ROOT_INO, b"f", ROOT_INO, b"h", 0), "rename");
    is_perm(fs.check_open(f, libc::O_RDWR), "open for writing");
    fs.check_open(f, libc::O_RDONLY).unwrap();
    // Append-only: only writes at the end.
    fs.set_file_attributes(f, FS_APPEND_FL).unwrap();
    is_perm(
        fs.write(f, 0, b"z", false),
        "overwrite of an append-only file",
    );
    assert_eq!(fs.write(f, 0, b"d", true).unwrap(), 1, "O_APPEND write");
    assert_eq!(fs.read(f, 0, 10).unwrap(), b"abcd");
    is_perm(
        fs.fallocate(
            f,
            0,
            1,
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
        ),
        "punch hole",
    );
    is_perm(fs.check_open(f, libc::O_WRONLY), "open without O_APPEND");
    fs.check_open(f, libc::O_WRONLY | libc::O_APPEND).unwrap();
    fs.set_file_attributes(f, 0).unwrap();
    fs.unlink(ROOT_INO, b"f").unwrap();
    m.unmount().unwrap();
}
