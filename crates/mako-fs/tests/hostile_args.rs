//! Hostile arguments at the file system API, beyond what the kernel lets through to FUSE
//! (offsets up to u64::MAX, nanoseconds past a second, file types that do not exist): each
//! call gives an error or a harmless answer, never a panic, a silent no-op that claims
//! success, or an inode that no longer decodes; the file system stays writable and the
//! inodes read back after a remount.

use mako_format::inode::{Timestamp, FILE_BYTES_MAX};
use mako_fs::fs::{Ctx, SetAttr, TimeSet, ROOT_INO};
use mako_fs::test_util::{small_config, small_params, MemDisks};
use mako_fs::FsError;
use std::sync::atomic::Ordering;

const C: Ctx = Ctx {
    uid: 0,
    gid: 0,
    pid: 1,
};

#[test]
fn hostile_arguments_give_errors_and_leave_the_file_system_sound() {
    let disks = MemDisks::new(4, 32 << 20);
    disks.format(&small_params());
    let (f, d) = {
        let m = disks.mount(small_config());
        let fs = &m.fs;
        let f = fs.create(C, ROOT_INO, b"f", 0o644, 0, true).unwrap().ino;
        let d = fs.mkdir(C, ROOT_INO, b"d", 0o755, 0).unwrap().ino;
        fs.write(f, 0, &vec![5u8; 200_000], false).unwrap();
        let top = u64::MAX;
        // Reads at the end of the offset space: nothing there.
        assert!(fs.read(f, top - 3, 100).unwrap().is_empty());
        assert!(fs.read(f, top - 1, 2).unwrap().is_empty());
        assert!(fs.read_direct(f, top - 511, 512).unwrap().is_empty());
        assert!(fs.read_direct(f, top - 1, 4096).unwrap().is_empty());
        // Writes there are EFBIG, not a success that wrote nothing.
        for (what, r) in [
            ("write", fs.write(f, top, b"x", false)),
            ("write", fs.write(f, top - 2, b"xyz", false)),
            ("direct write", fs.write_direct(f, top - 511, &[1u8; 512])),
            (
                "direct write",
                fs.write_direct(f, FILE_BYTES_MAX, &[1u8; 512]),
            ),
        ] {
            assert!(
                matches!(r, Err(FsError::TooBig(_))),
                "{what} at the end of the offset space: {r:?}"
            );
        }
        // A write across the largest file size is short, ending there.
        let g = fs.create(C, ROOT_INO, b"g", 0o644, 0, true).unwrap().ino;
        assert_eq!(
            fs.write(g, FILE_BYTES_MAX - 3, b"abcdef", false).unwrap(),
            3
        );
        assert_eq!(fs.getattr(g).unwrap().size, FILE_BYTES_MAX);
        assert_eq!(fs.read(g, FILE_BYTES_MAX - 3, 10).unwrap(), b"abc");
        for (what, off, len, mode) in [
            ("fallocate", top - 10, 100, 0),
            ("zero range", top - 10, 100, libc::FALLOC_FL_ZERO_RANGE),
            ("punch hole", top - 10, 100, 3),
            ("fallocate", FILE_BYTES_MAX, 1, 0),
        ] {
            let r = fs.fallocate(f, off, len, mode);
            assert!(matches!(r, Err(FsError::TooBig(_))), "{what}: {r:?}");
        }
        assert!(matches!(
            fs.lseek(f, top, libc::SEEK_DATA),
            Err(FsError::NoSuchOffset)
        ));
        assert_eq!(fs.copy_file_range(f, top, g, 0, 10).unwrap(), 0);
        assert!(matches!(
            fs.copy_file_range(f, 0, g, top, 10),
            Err(FsError::TooBig(_))
        ));
        assert!(fs.readdir(d, top, 10).unwrap().is_empty());
        // Times: nanoseconds past a second would make an inode that does not decode.
        let bad = TimeSet::At(Timestamp {
            sec: 0,
            nsec: 2_000_000_000,
        });
        let r = fs.setattr(
            f,
            SetAttr {
                mtime: Some(bad),
                ..Default::default()
            },
        );
        assert!(matches!(r, Err(FsError::Invalid(_))), "{r:?}");
        let extreme = Timestamp {
            sec: i64::MIN,
            nsec: 999_999_999,
        };
        fs.setattr(
            f,
            SetAttr {
                atime: Some(TimeSet::At(extreme)),
                ..Default::default()
            },
        )
        .unwrap();
        // File types that do not exist, names and values past their limits, flags.
        for mode in [0o070644, 0o170644, 0o040755, 0o120777] {
            let r = fs.mknod(C, d, b"node", mode, 0, 0);
            assert!(
                matches!(r, Err(FsError::Invalid(_))),
                "mknod {mode:o}: {r:?}"
            );
        }
        assert!(matches!(
            fs.create(C, d, &[b'n'; 256], 0o644, 0, true),
            Err(FsError::NameTooLong(256))
        ));
        assert!(matches!(
            fs.lookup(d, &[b'n'; 1024]),
            Err(FsError::NameTooLong(1024))
        ));
        assert!(fs.create(C, d, b"a/b", 0o644, 0, true).is_err());
        assert!(fs.create(C, d, b"a\0b", 0o644, 0, true).is_err());
        assert!(fs.create(C, d, b"", 0o644, 0, true).is_err());
        assert!(matches!(
            fs.setxattr(f, &[b'u'; 300], b"v", 0),
            Err(FsError::Range(_))
        ));
        assert!(fs.setxattr(f, b"user.k", &vec![0; 70_000], 0).is_err());
        assert!(matches!(
            fs.rename(ROOT_INO, b"f", ROOT_INO, b"h", 0x100),
            Err(FsError::Invalid(_))
        ));
        assert!(matches!(
            fs.symlink(C, d, b"s", &[b't'; 5000]),
            Err(FsError::NameTooLong(_))
        ));
        // Inodes that do not exist.
        assert!(fs.getattr(top).is_err());
        assert!(fs.lookup(top, b"x").is_err());
        assert!(fs.read(top, 0, 10).is_err());
        fs.forget(top, top);
        assert!(
            !m.core().read_only.load(Ordering::Relaxed),
            "nothing above turns the mount read-only"
        );
        fs.write(f, 0, b"still writable", false).unwrap();
        m.unmount().unwrap();
        (f, d)
    };
    // Every inode touched decodes again.
    let m = disks.mount(small_config());
    let fs = &m.fs;
    let a = fs.getattr(f).unwrap();
    assert_eq!(
        (a.atime.sec, a.atime.nsec),
        (i64::MIN, 999_999_999),
        "extreme time kept"
    );
    assert_eq!(fs.read(f, 0, 14).unwrap(), b"still writable");
    fs.getattr(d).unwrap();
    let g = fs.lookup(ROOT_INO, b"g").unwrap();
    assert_eq!(g.size, FILE_BYTES_MAX);
    fs.unlink(ROOT_INO, b"g").unwrap();
    m.unmount().unwrap();
}
