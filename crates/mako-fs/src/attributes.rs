//! File attributes set with chattr (FS_IOC_SETFLAGS / FS_IOC_FSSETXATTR): immutable and
//! append-only, kept in the inode's flags (`FLAG_IMMUTABLE`, `FLAG_APPEND`).
//!
//! The kernel decides who may set them (the owner, and only with CAP_LINUX_IMMUTABLE), but
//! a FUSE kernel does not know the attributes and so enforces nothing: every operation that
//! changes a file or a directory's entries checks them here, for every caller including
//! root, and answers EPERM as ext4 does:
//! - immutable: no write, truncate, fallocate, attribute change (mode, owner, times), xattr
//!   change, link, unlink or rename; an immutable directory gets no new or removed entries;
//! - append-only: writes only at the end of the file (an `O_APPEND` open); no truncate,
//!   punch hole or zero range, no mode, owner or explicit time change, no xattr change,
//!   link, unlink or rename; an append-only directory takes new entries but loses none.

use crate::error::{FsError, FsResult};
use crate::fs::{FileSystem, SetAttr, TimeSet};
use mako_format::inode::{Inode, FLAG_APPEND, FLAG_IMMUTABLE};

/// FS_IOC_GETFLAGS / FS_IOC_SETFLAGS bits (linux/fs.h) Mako keeps.
pub const FS_IMMUTABLE_FL: u32 = 0x10;
pub const FS_APPEND_FL: u32 = 0x20;
/// FS_IOC_FSGETXATTR / FS_IOC_FSSETXATTR bits (`fsx_xflags`) Mako keeps.
pub const FS_XFLAG_IMMUTABLE: u32 = 0x8;
pub const FS_XFLAG_APPEND: u32 = 0x10;

pub fn is_immutable(i: &Inode) -> bool {
    i.flags & FLAG_IMMUTABLE != 0
}

pub fn is_append_only(i: &Inode) -> bool {
    i.flags & FLAG_APPEND != 0
}

fn refused(i: &Inode, what: &str) -> FsError {
    let (attr, flag) = if is_immutable(i) {
        ("immutable", "i")
    } else {
        ("append-only", "a")
    };
    FsError::Perm(format!(
        "cannot {what}: inode {} is {attr} (clear it with chattr -{flag})",
        i.ino
    ))
}

/// EPERM if `i` is immutable.
pub fn check_not_immutable(i: &Inode, what: &str) -> FsResult<()> {
    if is_immutable(i) {
        return Err(refused(i, what));
    }
    Ok(())
}

/// EPERM if `i` is immutable or append-only: for unlink, rename, link, xattr changes, and
/// removing entries from a directory.
pub fn check_changeable(i: &Inode, what: &str) -> FsResult<()> {
    if is_immutable(i) || is_append_only(i) {
        return Err(refused(i, what));
    }
    Ok(())
}

/// May a write of file `i` at `offset` go ahead? `append` says the file was opened with
/// O_APPEND (the write goes to the end, wherever that is).
pub fn check_write(i: &Inode, offset: u64, append: bool) -> FsResult<()> {
    check_not_immutable(i, "write")?;
    if is_append_only(i) && !append && offset < i.size {
        return Err(refused(i, "write before the end of the file"));
    }
    Ok(())
}

/// May a file be opened with open(2) `flags`? Write access to an immutable file, write
/// access without O_APPEND to an append-only one, and O_TRUNC of either are refused, as
/// `may_open` does for the kernel's own file systems.
pub fn check_open(i: &Inode, flags: i32) -> FsResult<()> {
    let writes = flags & libc::O_ACCMODE != libc::O_RDONLY;
    let trunc = flags & libc::O_TRUNC != 0;
    if is_immutable(i) && (writes || trunc) {
        return Err(refused(i, "open for writing"));
    }
    if is_append_only(i) && ((writes && flags & libc::O_APPEND == 0) || trunc) {
        return Err(refused(i, "open for writing without O_APPEND"));
    }
    Ok(())
}

/// May `set` be applied to `i`? Immutable: nothing. Append-only: only times set to now
/// (utimes with no times, as `may_setattr` allows).
pub fn check_setattr(i: &Inode, set: &SetAttr) -> FsResult<()> {
    let explicit_time = |t: &Option<TimeSet>| matches!(t, Some(TimeSet::At(_)));
    let any_time = set.atime.is_some() || set.mtime.is_some() || set.ctime.is_some();
    let owner_or_mode = set.mode.is_some() || set.uid.is_some() || set.gid.is_some();
    if is_immutable(i) && (owner_or_mode || set.size.is_some() || any_time) {
        return Err(refused(i, "change attributes"));
    }
    if is_append_only(i)
        && (owner_or_mode
            || set.size.is_some()
            || explicit_time(&set.atime)
            || explicit_time(&set.mtime))
    {
        return Err(refused(i, "change the size, mode, owner or times"));
    }
    Ok(())
}

/// The FS_IOC_GETFLAGS bits of `i`.
pub fn fs_flags(i: &Inode) -> u32 {
    let mut f = 0;
    if is_immutable(i) {
        f |= FS_IMMUTABLE_FL;
    }
    if is_append_only(i) {
        f |= FS_APPEND_FL;
    }
    f
}

/// The FS_IOC_FSGETXATTR `fsx_xflags` of `i`.
pub fn fs_xflags(i: &Inode) -> u32 {
    let mut f = 0;
    if is_immutable(i) {
        f |= FS_XFLAG_IMMUTABLE;
    }
    if is_append_only(i) {
        f |= FS_XFLAG_APPEND;
    }
    f
}

impl FileSystem {
    /// The chattr attributes of `ino` as FS_IOC_GETFLAGS bits.
    pub fn file_attributes(&self, ino: u64) -> FsResult<u32> {
        Ok(fs_flags(&self.raw_inode(ino)?))
    }

    /// The chattr attributes of `ino` as FS_IOC_FSGETXATTR `fsx_xflags`.
    pub fn file_xflags(&self, ino: u64) -> FsResult<u32> {
        Ok(fs_xflags(&self.raw_inode(ino)?))
    }

    /// FS_IOC_SETFLAGS: set the attributes to `flags` (FS_*_FL). Mako keeps immutable and
    /// append-only; any other bit is EOPNOTSUPP, so chattr says what it could not do
    /// instead of pretending. The kernel has already checked that the caller owns the
    /// file and, for these two, has CAP_LINUX_IMMUTABLE.
    pub fn set_file_attributes(&self, ino: u64, flags: u32) -> FsResult<()> {
        let other = flags & !(FS_IMMUTABLE_FL | FS_APPEND_FL);
        if other != 0 {
            return Err(FsError::NotSupported(format!(
                "file attribute flags {other:#x} (Mako keeps only immutable and append-only)"
            )));
        }
        let mut inode_flags = 0;
        if flags & FS_IMMUTABLE_FL != 0 {
            inode_flags |= FLAG_IMMUTABLE;
        }
        if flags & FS_APPEND_FL != 0 {
            inode_flags |= FLAG_APPEND;
        }
        self.set_inode_attribute_flags(ino, inode_flags)
    }

    /// FS_IOC_FSSETXATTR: as `set_file_attributes`, from `fsx_xflags`. Extent size hints
    /// and project ids are not supported (EOPNOTSUPP unless zero).
    pub fn set_file_xflags(
        &self,
        ino: u64,
        xflags: u32,
        extsize: u32,
        projid: u32,
    ) -> FsResult<()> {
        let other = xflags & !(FS_XFLAG_IMMUTABLE | FS_XFLAG_APPEND);
        if other != 0 || extsize != 0 || projid != 0 {
            return Err(FsError::NotSupported(format!(
                "fsxattr flags {other:#x}, extent size {extsize}, project {projid} \
                 (Mako keeps only immutable and append-only)"
            )));
        }
        let mut inode_flags = 0;
        if xflags & FS_XFLAG_IMMUTABLE != 0 {
            inode_flags |= FLAG_IMMUTABLE;
        }
        if xflags & FS_XFLAG_APPEND != 0 {
            inode_flags |= FLAG_APPEND;
        }
        self.set_inode_attribute_flags(ino, inode_flags)
    }

    fn set_inode_attribute_flags(&self, ino: u64, inode_flags: u32) -> FsResult<()> {
        self.core.check_writable()?;
        crate::op::run(&self.core, || {
            let h = self.core.get(ino)?;
            crate::op::hold_inode(&self.core, ino, crate::coherence::Need::Exclusive)?;
            let _tx = self.core.begin();
            let mut st = h.state.write();
            if st.deleted {
                return Err(FsError::Stale(ino));
            }
            let new = (st.inode.flags & !(FLAG_IMMUTABLE | FLAG_APPEND)) | inode_flags;
            if new != st.inode.flags {
                st.inode.flags = new;
                st.inode.ctime = self.core.now();
                st.mark_dirty();
            }
            Ok(())
        })
    }
}
