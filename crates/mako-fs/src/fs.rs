//! `FileSystem`: the mounted file system's API, one method per POSIX operation.
//! The FUSE adapter calls these; tests call them directly.
//!
//! Locking: a directory's state lock is taken before its children's (ancestor first);
//! renames that change parents hold `rename_lock`, lock the two parents ancestor
//! first, then the inodes involved in inode-number order.

use crate::acl;
use crate::block_map;
use crate::coherence::Need;
use crate::core::{Core, InodeHandle, InodeState};
use crate::directory;
use crate::error::{FsError, FsResult};
use crate::file_io;
use mako_disk::AlignedBuf;
use mako_format::inode::{Inode, InodeContent, Timestamp};
use mako_token::{ByteRange, TokenMode};
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// An extended attribute: (name, value).
type Xattr = (Vec<u8>, Vec<u8>);

pub const S_IFMT: u32 = 0o170000;
pub const S_IFDIR: u32 = 0o040000;
pub const S_IFREG: u32 = 0o100000;
pub const S_IFLNK: u32 = 0o120000;
pub const S_ISUID: u32 = 0o4000;
pub const S_ISGID: u32 = 0o2000;
pub const ROOT_INO: u64 = 1;
/// Longest symlink target (PATH_MAX - 1).
pub const SYMLINK_BYTES_MAX: usize = 4095;
pub const LINKS_MAX: u32 = 65000;
pub const XATTR_VALUE_BYTES_MAX: usize = 65536;

/// Who is asking (from the FUSE request).
#[derive(Debug, Clone, Copy, Default)]

pub struct Ctx {
    pub uid: u32,
    pub gid: u32,
    pub pid: u32,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attr {
    pub ino: u64,
    pub size: u64,
    /// 512-byte blocks allocated.
    pub blocks: u64,
    pub atime: Timestamp,
    pub mtime: Timestamp,
    pub ctime: Timestamp,
    pub crtime: Timestamp,
    pub mode: u32,
    pub nlink: u32,
    pub uid: u32,
    pub gid: u32,
    pub rdev: u32,
    pub blksize: u32,
    pub generation: u32,
}

#[derive(Debug, Clone, Copy)]
pub enum TimeSet {
    Now,
    At(Timestamp),
}

#[derive(Debug, Clone, Default)]
pub struct SetAttr {
    pub mode: Option<u32>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub size: Option<u64>,
    pub atime: Option<TimeSet>,
    pub mtime: Option<TimeSet>,
    pub ctime: Option<Timestamp>,
}

#[derive(Debug, Clone)]
pub struct DirListing {
    /// The readdir offset of the entry after this one.
    pub cookie: u64,
    pub ino: u64,
    pub kind: u8,
    pub name: Vec<u8>,
}

#[derive(Debug, Clone)]
pub struct StatFs {
    pub block_bytes: u32,
    pub fragment_bytes: u32,
    pub blocks: u64,
    pub blocks_free: u64,
    pub files: u64,
    pub files_free: u64,
    pub name_max: u32,
}

/// The byte range a data token must cover for `len` bytes at `offset`: rounded out to
/// whole blocks (only one node ever allocates a block), never empty.
fn block_range(offset: u64, len: u64, block: u64) -> ByteRange {
    let start = offset / block * block;
    let end = offset
        .saturating_add(len)
        .div_ceil(block)
        .saturating_mul(block)
        .max(start.saturating_add(block));
    ByteRange { start, end }
}

pub fn dtype(mode: u32) -> u8 {
    ((mode & S_IFMT) >> 12) as u8
}
pub fn is_dir_mode(mode: u32) -> bool {
    mode & S_IFMT == S_IFDIR
}

#[derive(Clone)]
pub struct FileSystem {
    pub core: Arc<Core>,
}

impl FileSystem {
    pub fn attr_of(&self, inode: &Inode) -> Attr {
        let sb = self.core.geo.subblock_bytes() as u64;
        let inline = match &inode.content {
            InodeContent::InlineData(d) => (d.len() as u64).div_ceil(512),
            _ => 0,
        };
        Attr {
            ino: inode.ino,
            size: inode.size,
            blocks: inode.subblocks * sb / 512 + inline,
            atime: inode.atime,
            mtime: inode.mtime,
            ctime: inode.ctime,
            crtime: inode.crtime,
            mode: inode.mode,
            nlink: inode.nlink,
            uid: inode.uid,
            gid: inode.gid,
            rdev: inode.rdev,
            blksize: self.core.geo.block_bytes,
            generation: inode.generation,
        }
    }

    fn handle(&self, ino: u64) -> FsResult<Arc<InodeHandle>> {
        self.core.get(ino)
    }

    /// Hold the inode's token for what the operation is about to do (docs/coherence.md
    /// section 3): before the first change, never after.
    fn need(&self, ino: u64, need: Need) -> FsResult<()> {
        crate::op::hold_inode(&self.core, ino, need)
    }

    /// Hold a directory's names in `mode` (all of them, for now: one name range per
    /// directory).
    fn need_names(&self, dir: u64, mode: TokenMode) -> FsResult<()> {
        crate::op::hold_range(
            &self.core,
            self.core.tokens.dir(dir),
            mode,
            ByteRange::WHOLE,
            ByteRange::WHOLE,
        )
    }

    /// Hold a file's data over `range` in `mode`.
    fn need_data(&self, ino: u64, mode: TokenMode, range: ByteRange) -> FsResult<()> {
        crate::op::hold_range(
            &self.core,
            self.core.tokens.data(ino),
            mode,
            range,
            ByteRange::WHOLE,
        )
    }

    fn live_dir<'a>(&self, st: &'a InodeState) -> FsResult<&'a Inode> {
        if st.deleted {
            return Err(FsError::Stale(st.inode.ino));
        }
        if !is_dir_mode(st.inode.mode) {
            return Err(FsError::NotDir(format!("inode {}", st.inode.ino)));
        }
        Ok(&st.inode)
    }

    pub fn getattr(&self, ino: u64) -> FsResult<Attr> {
        crate::op::run(&self.core, || {
            let h = self.handle(ino)?;
            let st = h.state.read();
            if st.deleted {
                return Err(FsError::Stale(ino));
            }
            Ok(self.attr_of(&st.inode))
        })
    }

    pub fn lookup(&self, parent: u64, name: &[u8]) -> FsResult<Attr> {
        crate::op::run(&self.core, || {
            self.core.stats.lookups.fetch_add(1, Ordering::Relaxed);
            let p = self.handle(parent)?;
            if !matches!(name, b"." | b"..") {
                self.need_names(parent, TokenMode::Ro)?;
            }
            let ino = {
                let st = p.state.read();
                let dir = self.live_dir(&st)?;
                match name {
                    b"." => dir.ino,
                    b".." => dir.parent,
                    _ => {
                        directory::lookup(&self.core, &st, name)?
                            .ok_or_else(|| {
                                FsError::NotFound(String::from_utf8_lossy(name).into_owned())
                            })?
                            .ino
                    }
                }
            };
            self.getattr(ino)
        })
    }

    fn new_inode(
        &self,
        ctx: Ctx,
        parent: &InodeState,
        mode: u32,
        umask: u32,
        rdev: u32,
        ino: u64,
    ) -> FsResult<(Inode, Vec<Xattr>)> {
        let t = self.core.now();
        let mut mode = mode;
        let mut xattrs = Vec::new();
        let default_acl = parent
            .inode
            .xattrs
            .iter()
            .find(|(n, _)| n == acl::DEFAULT)
            .map(|(_, v)| v.clone());
        match default_acl.as_deref().and_then(|d| acl::inherit(d, mode)) {
            Some((m, access)) if mode & S_IFMT != S_IFLNK => {
                mode = m;
                if let Some(a) = access {
                    xattrs.push((acl::ACCESS.to_vec(), a));
                }
                if is_dir_mode(mode) {
                    xattrs.push((
                        acl::DEFAULT.to_vec(),
                        default_acl.clone().unwrap_or_default(),
                    ));
                }
            }
            _ => mode &= !(umask & 0o777),
        }
        let mut inode = Inode::new(ino, mode);
        inode.uid = ctx.uid;
        inode.gid = ctx.gid;
        if parent.inode.mode & S_ISGID != 0 {
            // setgid directory: new files take its group, new directories its setgid bit.
            inode.gid = parent.inode.gid;
            if is_dir_mode(mode) {
                inode.mode |= S_ISGID;
            }
        }
        inode.atime = t;
        inode.mtime = t;
        inode.ctime = t;
        inode.crtime = t;
        inode.rdev = rdev;
        inode.generation = self.core.next_generation();
        inode.nlink = if is_dir_mode(mode) { 2 } else { 1 };
        if is_dir_mode(mode) {
            inode.content = InodeContent::InlineDir(Vec::new());
            inode.parent = parent.inode.ino;
        }
        Ok((inode, xattrs))
    }

    /// Create a file, directory, device, fifo or socket (and symlinks, with `target`).
    #[allow(clippy::too_many_arguments)]
    fn make(
        &self,
        ctx: Ctx,
        parent: u64,
        name: &[u8],
        mode: u32,
        umask: u32,
        rdev: u32,
        target: Option<&[u8]>,
        exclusive: bool,
    ) -> FsResult<Attr> {
        self.core.check_writable()?;
        directory::check_name(name)?;
        // The new inode's number is set aside first, so its token can be held before
        // anything changes; it goes back to the map if the operation fails.
        let mut reservation = self.core.reserve_inode()?;
        let ino = reservation.ino();
        crate::op::run(&self.core, || {
            self.need(ino, Need::Exclusive)?;
            self.need_data(ino, TokenMode::Xw, ByteRange::WHOLE)?;
            if !self.core.inode_slot_exists(ino) {
                self.need(self.core.metadata_inodes().inode_file, Need::Exclusive)?;
            }
            let p = self.handle(parent)?;
            self.need(parent, Need::Exclusive)?;
            self.need_names(parent, TokenMode::Xw)?;
            let _tx = self.core.begin();
            let mut pst = p.state.write();
            self.make_locked(
                ctx,
                &mut pst,
                name,
                (mode, umask, rdev),
                target,
                exclusive,
                &mut reservation,
            )
        })
    }

    /// The part of `make` under the parent's lock, with every token held.
    #[allow(clippy::too_many_arguments)]
    fn make_locked(
        &self,
        ctx: Ctx,
        pst: &mut InodeState,
        name: &[u8],
        (mode, umask, rdev): (u32, u32, u32),
        target: Option<&[u8]>,
        exclusive: bool,
        reservation: &mut crate::core::InodeReservation,
    ) -> FsResult<Attr> {
        let parent = pst.inode.ino;
        self.live_dir(pst)?;
        if let Some(e) = directory::lookup(&self.core, pst, name)? {
            if exclusive || is_dir_mode(mode) {
                return Err(FsError::Exists(String::from_utf8_lossy(name).into_owned()));
            }
            return self.getattr(e.ino);
        }
        if is_dir_mode(mode) && pst.inode.nlink >= LINKS_MAX {
            return Err(FsError::TooManyLinks(format!("directory inode {parent}")));
        }
        let ino = self.core.allocate_reserved_inode(reservation)?;
        let (mut inode, xattrs) = self.new_inode(ctx, pst, mode, umask, rdev, ino)?;
        inode.xattrs = xattrs;
        if let Err(e) = directory::insert(&self.core, pst, name, ino, dtype(inode.mode)) {
            let _ = self.core.imap.free(ino);
            return Err(e);
        }
        if is_dir_mode(inode.mode) {
            pst.inode.nlink += 1;
        }
        let t = self.core.now();
        pst.inode.mtime = t;
        pst.inode.ctime = t;
        pst.mark_dirty();
        let h = self.core.insert_new(inode);
        if let Some(target) = target {
            file_io::write(&self.core, &h, 0, target)?;
            // A symlink is metadata to its users: a target too long for the inode goes
            // to disk now, so no commit ever names a symlink whose target is not there.
            file_io::flush_data(&self.core, &h)?;
        }
        self.core.stats.creates.fetch_add(1, Ordering::Relaxed);
        let st = h.state.read();
        Ok(self.attr_of(&st.inode))
    }

    pub fn create(
        &self,
        ctx: Ctx,
        parent: u64,
        name: &[u8],
        mode: u32,
        umask: u32,
        exclusive: bool,
    ) -> FsResult<Attr> {
        let a = self.make(
            ctx,
            parent,
            name,
            S_IFREG | (mode & 0o7777),
            umask,
            0,
            None,
            exclusive,
        )?;
        if is_dir_mode(a.mode) {
            return Err(FsError::IsDir(String::from_utf8_lossy(name).into_owned()));
        }
        Ok(a)
    }

    pub fn mknod(
        &self,
        ctx: Ctx,
        parent: u64,
        name: &[u8],
        mode: u32,
        umask: u32,
        rdev: u32,
    ) -> FsResult<Attr> {
        let kind = mode & S_IFMT;
        let kind = if kind == 0 { S_IFREG } else { kind };
        if kind == S_IFDIR || kind == S_IFLNK {
            return Err(FsError::Invalid("mknod of a directory or symlink".into()));
        }
        self.make(
            ctx,
            parent,
            name,
            kind | (mode & 0o7777),
            umask,
            rdev,
            None,
            true,
        )
    }

    pub fn mkdir(
        &self,
        ctx: Ctx,
        parent: u64,
        name: &[u8],
        mode: u32,
        umask: u32,
    ) -> FsResult<Attr> {
        self.make(
            ctx,
            parent,
            name,
            S_IFDIR | (mode & 0o7777),
            umask,
            0,
            None,
            true,
        )
    }

    pub fn symlink(&self, ctx: Ctx, parent: u64, name: &[u8], target: &[u8]) -> FsResult<Attr> {
        if target.is_empty() {
            return Err(FsError::NotFound("empty symlink target".into()));
        }
        if target.len() > SYMLINK_BYTES_MAX {
            return Err(FsError::NameTooLong(target.len()));
        }
        self.make(ctx, parent, name, S_IFLNK | 0o777, 0, 0, Some(target), true)
    }

    pub fn readlink(&self, ino: u64) -> FsResult<Vec<u8>> {
        crate::op::run(&self.core, || {
            let h = self.handle(ino)?;
            let st = h.state.read();
            if st.inode.mode & S_IFMT != S_IFLNK {
                return Err(FsError::Invalid(format!("inode {ino} is not a symlink")));
            }
            Ok(file_io::read(&self.core, &st, 0, st.inode.size as usize, true)?.to_vec())
        })
    }

    pub fn link(&self, ino: u64, newparent: u64, newname: &[u8]) -> FsResult<Attr> {
        crate::op::run(&self.core, || {
            self.core.check_writable()?;
            directory::check_name(newname)?;
            let p = self.handle(newparent)?;
            let c = self.handle(ino)?;
            if ino == newparent {
                // Linking an inode into itself: refused before its lock is taken twice.
                // A directory cannot be hard-linked; anything else is not a directory.
                return Err(if is_dir_mode(c.state.read().inode.mode) {
                    FsError::Perm("hard links to directories are not allowed".into())
                } else {
                    FsError::NotDir(format!("inode {ino}"))
                });
            }
            self.need(newparent, Need::Exclusive)?;
            self.need_names(newparent, TokenMode::Xw)?;
            self.need(ino, Need::Exclusive)?;
            let _tx = self.core.begin();
            let mut pst = p.state.write();
            self.live_dir(&pst)?;
            let mut cst = c.state.write();
            if cst.deleted || cst.inode.nlink == 0 {
                return Err(FsError::NotFound(format!("inode {ino}")));
            }
            if is_dir_mode(cst.inode.mode) {
                return Err(FsError::Perm(
                    "hard links to directories are not allowed".into(),
                ));
            }
            if cst.inode.nlink >= LINKS_MAX {
                return Err(FsError::TooManyLinks(format!("inode {ino}")));
            }
            directory::insert(&self.core, &mut pst, newname, ino, dtype(cst.inode.mode))?;
            let t = self.core.now();
            cst.inode.nlink += 1;
            cst.inode.ctime = t;
            cst.mark_dirty();
            pst.inode.mtime = t;
            pst.inode.ctime = t;
            pst.mark_dirty();
            Ok(self.attr_of(&cst.inode))
        })
    }

    pub fn unlink(&self, parent: u64, name: &[u8]) -> FsResult<()> {
        crate::op::run(&self.core, || self.remove(parent, name, false))
    }

    pub fn rmdir(&self, parent: u64, name: &[u8]) -> FsResult<()> {
        crate::op::run(&self.core, || {
            if name == b"." {
                return Err(FsError::Invalid("rmdir of .".into()));
            }
            if name == b".." {
                return Err(FsError::NotEmpty("..".into()));
            }
            self.remove(parent, name, true)
        })
    }

    fn remove(&self, parent: u64, name: &[u8], dir: bool) -> FsResult<()> {
        self.core.check_writable()?;
        let p = self.handle(parent)?;
        self.need(parent, Need::Exclusive)?;
        self.need_names(parent, TokenMode::Xw)?;
        let _tx = self.core.begin();
        let mut pst = p.state.write();
        self.live_dir(&pst)?;
        let e = directory::lookup(&self.core, &pst, name)?
            .ok_or_else(|| FsError::NotFound(String::from_utf8_lossy(name).into_owned()))?;
        let c = self.handle(e.ino)?;
        // The victim's link count changes, and it may be freed here: all of it.
        self.need(e.ino, Need::Exclusive)?;
        self.need_data(e.ino, TokenMode::Xw, ByteRange::WHOLE)?;
        if e.kind == dtype(S_IFDIR) {
            self.need_names(e.ino, TokenMode::Xw)?;
        }
        let mut cst = c.state.write();
        let is_dir = is_dir_mode(cst.inode.mode);
        if dir && !is_dir {
            return Err(FsError::NotDir(String::from_utf8_lossy(name).into_owned()));
        }
        if !dir && is_dir {
            return Err(FsError::IsDir(String::from_utf8_lossy(name).into_owned()));
        }
        if is_dir && cst.inode.entries > 0 {
            return Err(FsError::NotEmpty(
                String::from_utf8_lossy(name).into_owned(),
            ));
        }
        directory::remove(&self.core, &mut pst, name)?;
        let t = self.core.now();
        if is_dir {
            cst.inode.nlink = 0;
            pst.inode.nlink = pst.inode.nlink.saturating_sub(1);
        } else {
            cst.inode.nlink = cst.inode.nlink.saturating_sub(1);
        }
        cst.inode.ctime = t;
        cst.mark_dirty();
        pst.inode.mtime = t;
        pst.inode.ctime = t;
        pst.mark_dirty();
        drop(cst);
        drop(pst);
        self.core.stats.removes.fetch_add(1, Ordering::Relaxed);
        self.maybe_free(&c)
    }

    /// Free an inode whose last link is gone once no kernel reference or open remains.
    pub fn maybe_free(&self, h: &Arc<InodeHandle>) -> FsResult<()> {
        crate::op::run(&self.core, || {
            let lookups = self.core.lookups.lock().get(&h.ino).copied().unwrap_or(0);
            if lookups > 0 || h.opens.load(Ordering::SeqCst) > 0 {
                return Ok(());
            }
            if self.core.read_only.load(Ordering::Relaxed) {
                // Left for fsck (an orphan) rather than changed on a damaged file system.
                return Ok(());
            }
            {
                let st = h.state.read();
                if st.deleted || st.inode.nlink > 0 {
                    return Ok(());
                }
            }
            self.need(h.ino, Need::Exclusive)?;
            self.need_data(h.ino, TokenMode::Xw, ByteRange::WHOLE)?;
            let _tx = self.core.begin();
            let mut st = h.state.write();
            if st.deleted || st.inode.nlink > 0 {
                return Ok(());
            }
            crate::workers::free_inode(&self.core, &mut st)
        })
    }

    /// The directories from `ino` up to the root, `ino` first. Called under
    /// `rename_lock` and before any inode lock is taken: only renames change parents.
    fn ancestors(&self, mut ino: u64) -> FsResult<Vec<u64>> {
        let mut out = Vec::new();
        for _ in 0..100_000 {
            out.push(ino);
            if ino == ROOT_INO {
                return Ok(out);
            }
            let h = self.handle(ino)?;
            let next = h.state.read().inode.parent;
            if next == ino || next == 0 {
                return Ok(out);
            }
            ino = next;
        }
        Err(FsError::Invalid(
            "directory tree deeper than 100000 levels (loop?)".into(),
        ))
    }

    /// Renaming a file over an existing one is how programs replace a file atomically
    /// (write a temporary, rename it over): write the source's data first, so the
    /// commit that makes the rename durable never exposes a file whose data was not
    /// written (zeros) in place of the old one, even without an fsync — as ext4's
    /// auto_da_alloc does.
    fn flush_before_replace(&self, p1: u64, n1: &[u8], p2: u64, n2: &[u8]) -> FsResult<()> {
        let entry =
            |parent: u64, name: &[u8]| -> FsResult<Option<mako_format::dir_block::DirEntry>> {
                let h = self.handle(parent)?;
                self.need_names(parent, TokenMode::Ro)?;
                let st = h.state.read();
                if st.deleted || !is_dir_mode(st.inode.mode) {
                    return Ok(None);
                }
                directory::lookup(&self.core, &st, name)
            };
        let (Some(src), Some(_)) = (entry(p1, n1)?, entry(p2, n2)?) else {
            return Ok(());
        };
        if src.kind == dtype(S_IFREG) {
            let h = self.handle(src.ino)?;
            file_io::flush_data(&self.core, &h)?;
        }
        Ok(())
    }

    /// rename(2) / renameat2(2) with RENAME_NOREPLACE (1) and RENAME_EXCHANGE (2).
    pub fn rename(&self, p1: u64, n1: &[u8], p2: u64, n2: &[u8], flags: u32) -> FsResult<()> {
        crate::op::run(&self.core, || {
            const NOREPLACE: u32 = 1;
            const EXCHANGE: u32 = 2;
            self.core.check_writable()?;
            if flags & !(NOREPLACE | EXCHANGE) != 0 {
                return Err(FsError::NotSupported(format!(
                    "rename flags {flags:#x} (only RENAME_NOREPLACE and RENAME_EXCHANGE)"
                )));
            }
            if flags & NOREPLACE != 0 && flags & EXCHANGE != 0 {
                return Err(FsError::Invalid(
                    "RENAME_NOREPLACE with RENAME_EXCHANGE".into(),
                ));
            }
            directory::check_name(n2)?;
            self.flush_before_replace(p1, n1, p2, n2)?;
            let h1 = self.handle(p1)?;
            let h2 = self.handle(p2)?;
            self.need(p1, Need::Exclusive)?;
            self.need(p2, Need::Exclusive)?;
            self.need_names(p1, TokenMode::Xw)?;
            self.need_names(p2, TokenMode::Xw)?;
            let _tx = self.core.begin();
            let _serial = self.core.rename_lock.lock();
            let up1 = self.ancestors(p1)?;
            let up2 = self.ancestors(p2)?;
            // Lock the parents ancestor first.
            let (g1, g2);
            let (mut s1, mut s2_opt) = if p1 == p2 {
                g1 = h1.state.write();
                (g1, None)
            } else if up1.contains(&p2) {
                g2 = h2.state.write();
                g1 = h1.state.write();
                (g1, Some(g2))
            } else {
                g1 = h1.state.write();
                g2 = h2.state.write();
                (g1, Some(g2))
            };
            // The target directory: the second parent, or the first when they are one.
            macro_rules! target_dir {
                () => {
                    match s2_opt.as_deref_mut() {
                        Some(s) => s,
                        None => &mut s1,
                    }
                };
            }
            self.live_dir(&s1)?;
            if let Some(s2) = &s2_opt {
                self.live_dir(s2)?;
            }
            let src = directory::lookup(&self.core, &s1, n1)?
                .ok_or_else(|| FsError::NotFound(String::from_utf8_lossy(n1).into_owned()))?;
            let dst = {
                let s2: &InodeState = s2_opt.as_deref().unwrap_or(&s1);
                directory::lookup(&self.core, s2, n2)?
            };
            if let Some(d) = &dst {
                if d.ino == src.ino {
                    return Ok(()); // two names of one inode: POSIX says do nothing
                }
                if up1.contains(&d.ino) && flags & (EXCHANGE | NOREPLACE) == 0 {
                    // The target is the source's parent or one of its ancestors: a
                    // directory that is not empty (it holds the source), as Linux
                    // answers. Refused here, before the target's lock is taken: it may
                    // be the source parent's, which this thread already holds.
                    return Err(FsError::NotEmpty(String::from_utf8_lossy(n2).into_owned()));
                }
            }
            let src_h = self.handle(src.ino)?;
            self.need(src.ino, Need::Exclusive)?;
            let src_is_dir = src.kind == dtype(S_IFDIR);
            if src_is_dir && p1 != p2 {
                // A directory moves: the loop check above must have seen a tree no node
                // can change meanwhile (the cluster's rename lock; checked before any
                // change, so a restart recomputes the ancestors under it).
                crate::op::hold_range(
                    &self.core,
                    self.core.tokens.rename_lock(),
                    TokenMode::Xw,
                    ByteRange::WHOLE,
                    ByteRange::WHOLE,
                )?;
            }
            if let Some(d) = &dst {
                self.need(d.ino, Need::Exclusive)?;
                self.need_data(d.ino, TokenMode::Xw, ByteRange::WHOLE)?;
                if d.kind == dtype(S_IFDIR) {
                    self.need_names(d.ino, TokenMode::Xw)?;
                }
            }
            if src_is_dir && p1 != p2 && up2.contains(&src.ino) {
                return Err(FsError::Invalid(
                    "cannot move a directory into itself".into(),
                ));
            }
            let t = self.core.now();
            if flags & EXCHANGE != 0 {
                let d =
                    dst.ok_or_else(|| FsError::NotFound(String::from_utf8_lossy(n2).into_owned()))?;
                let dst_is_dir = d.kind == dtype(S_IFDIR);
                if dst_is_dir && p1 != p2 && up1.contains(&d.ino) {
                    return Err(FsError::Invalid(
                        "cannot move a directory into itself".into(),
                    ));
                }
                directory::replace(&self.core, &mut s1, n1, d.ino, d.kind)?;
                {
                    let s2: &mut InodeState = target_dir!();
                    directory::replace(&self.core, s2, n2, src.ino, src.kind)?;
                }
                let dst_h = self.handle(d.ino)?;
                if p1 != p2 {
                    let s2 = s2_opt.as_deref_mut().expect("two parents");
                    if src_is_dir != dst_is_dir {
                        if src_is_dir {
                            s1.inode.nlink -= 1;
                            s2.inode.nlink += 1;
                        } else {
                            s1.inode.nlink += 1;
                            s2.inode.nlink -= 1;
                        }
                    }
                    let (a, b) = if src.ino < d.ino {
                        (&src_h, &dst_h)
                    } else {
                        (&dst_h, &src_h)
                    };
                    let mut ga = a.state.write();
                    let mut gb = b.state.write();
                    for g in [&mut ga, &mut gb] {
                        if is_dir_mode(g.inode.mode) {
                            g.inode.parent = if g.inode.ino == src.ino { p2 } else { p1 };
                        }
                        g.inode.ctime = t;
                        g.mark_dirty();
                    }
                }
                s1.inode.mtime = t;
                s1.inode.ctime = t;
                s1.mark_dirty();
                if let Some(s2) = s2_opt.as_deref_mut() {
                    s2.inode.mtime = t;
                    s2.inode.ctime = t;
                    s2.mark_dirty();
                }
                return Ok(());
            }
            let mut victim = None;
            if let Some(d) = &dst {
                if flags & NOREPLACE != 0 {
                    return Err(FsError::Exists(String::from_utf8_lossy(n2).into_owned()));
                }
                let dst_is_dir = d.kind == dtype(S_IFDIR);
                let dh = self.handle(d.ino)?;
                {
                    let dst_st = dh.state.read();
                    if src_is_dir && !dst_is_dir {
                        return Err(FsError::NotDir(String::from_utf8_lossy(n2).into_owned()));
                    }
                    if !src_is_dir && dst_is_dir {
                        return Err(FsError::IsDir(String::from_utf8_lossy(n2).into_owned()));
                    }
                    if dst_is_dir && dst_st.inode.entries > 0 {
                        return Err(FsError::NotEmpty(String::from_utf8_lossy(n2).into_owned()));
                    }
                }
                let s2: &mut InodeState = target_dir!();
                directory::replace(&self.core, s2, n2, src.ino, src.kind)?;
                victim = Some((dh, dst_is_dir));
            } else {
                let s2: &mut InodeState = target_dir!();
                directory::insert(&self.core, s2, n2, src.ino, src.kind)?;
            }
            directory::remove(&self.core, &mut s1, n1)?;
            if let Some((dh, dst_is_dir)) = &victim {
                let mut vs = dh.state.write();
                if *dst_is_dir {
                    vs.inode.nlink = 0;
                    let s2: &mut InodeState = target_dir!();
                    s2.inode.nlink = s2.inode.nlink.saturating_sub(1);
                } else {
                    vs.inode.nlink = vs.inode.nlink.saturating_sub(1);
                }
                vs.inode.ctime = t;
                vs.mark_dirty();
            }
            if src_is_dir && p1 != p2 {
                s1.inode.nlink = s1.inode.nlink.saturating_sub(1);
                let s2 = s2_opt.as_deref_mut().expect("two parents");
                s2.inode.nlink += 1;
            }
            {
                let mut ss = src_h.state.write();
                if src_is_dir {
                    ss.inode.parent = p2;
                }
                ss.inode.ctime = t;
                ss.mark_dirty();
            }
            s1.inode.mtime = t;
            s1.inode.ctime = t;
            s1.mark_dirty();
            if let Some(s2) = s2_opt.as_deref_mut() {
                s2.inode.mtime = t;
                s2.inode.ctime = t;
                s2.mark_dirty();
            }
            drop(s1);
            drop(s2_opt);
            if let Some((dh, _)) = victim {
                self.maybe_free(&dh)?;
            }
            Ok(())
        })
    }

    /// Before a write by a caller without CAP_FSETID: clear S_ISUID, and S_ISGID when
    /// the group may execute, as the kernel does itself for writes through its page
    /// cache. Writes that bypass the page cache (FUSE direct I/O) leave it to us.
    pub fn kill_setid_for_write(&self, ino: u64) -> FsResult<()> {
        crate::op::run(&self.core, || {
            let h = self.handle(ino)?;
            let kill = |mode: u32| {
                let mut k = mode & S_ISUID;
                if mode & S_ISGID != 0 && mode & 0o010 != 0 {
                    k |= S_ISGID;
                }
                k
            };
            if kill(h.state.read().inode.mode) == 0 {
                return Ok(());
            }
            self.core.check_writable()?;
            self.need(ino, Need::Exclusive)?;
            let _tx = self.core.begin();
            let mut st = h.state.write();
            let k = kill(st.inode.mode);
            if k != 0 && !st.deleted {
                st.inode.mode &= !k;
                st.inode.ctime = self.core.now();
                st.mark_dirty();
            }
            Ok(())
        })
    }

    pub fn setattr(&self, ino: u64, set: SetAttr) -> FsResult<Attr> {
        crate::op::run(&self.core, || {
            self.core.check_writable()?;
            let h = self.handle(ino)?;
            self.need(ino, Need::Exclusive)?;
            if set.size.is_some() {
                self.need_data(ino, TokenMode::Xw, ByteRange::WHOLE)?;
            }
            let _tx = self.core.begin();
            let mut st = h.state.write();
            if st.deleted {
                return Err(FsError::Stale(ino));
            }
            let t = self.core.now();
            if let Some(size) = set.size {
                if is_dir_mode(st.inode.mode) {
                    return Err(FsError::IsDir(format!("inode {ino}")));
                }
                if st.inode.mode & S_IFMT != S_IFREG {
                    return Err(FsError::Invalid(format!(
                        "truncate of a special file (inode {ino})"
                    )));
                }
                file_io::set_size(&self.core, &mut st, size)?;
                st.inode.mtime = t;
                st.inode.ctime = t;
            }
            if let Some(mode) = set.mode {
                st.inode.mode = (st.inode.mode & S_IFMT) | (mode & 0o7777);
                if let Some(pos) = st.inode.xattrs.iter().position(|(n, _)| n == acl::ACCESS) {
                    if let Some(mut entries) = acl::decode(&st.inode.xattrs[pos].1) {
                        acl::chmod(&mut entries, mode);
                        st.inode.xattrs[pos].1 = acl::encode(&entries);
                    }
                }
                st.inode.ctime = t;
            }
            if let Some(uid) = set.uid {
                st.inode.uid = uid;
                st.inode.ctime = t;
            }
            if let Some(gid) = set.gid {
                st.inode.gid = gid;
                st.inode.ctime = t;
            }
            let resolve = |s: TimeSet| match s {
                TimeSet::Now => t,
                TimeSet::At(ts) => ts,
            };
            if let Some(a) = set.atime {
                st.inode.atime = resolve(a);
                st.inode.ctime = t;
            }
            if let Some(m) = set.mtime {
                st.inode.mtime = resolve(m);
                st.inode.ctime = t;
            }
            if let Some(c) = set.ctime {
                st.inode.ctime = c;
            }
            st.mark_dirty();
            Ok(self.attr_of(&st.inode))
        })
    }

    pub fn open(&self, ino: u64) -> FsResult<Attr> {
        crate::op::run(&self.core, || {
            let h = self.handle(ino)?;
            h.opens.fetch_add(1, Ordering::SeqCst);
            let st = h.state.read();
            Ok(self.attr_of(&st.inode))
        })
    }

    pub fn release(&self, ino: u64) -> FsResult<()> {
        if let Some(h) = self.core.cached_handle(ino) {
            let prev = h.opens.fetch_sub(1, Ordering::SeqCst);
            debug_assert!(prev > 0, "release without open on inode {ino}");
            if prev == 1 {
                self.maybe_free(&h)?;
            }
        }
        Ok(())
    }

    /// A kernel reference was handed out for `ino` (FUSE lookup count).
    pub fn add_lookup(&self, ino: u64) {
        *self.core.lookups.lock().entry(ino).or_insert(0) += 1;
    }

    /// The kernel dropped `n` references.
    pub fn forget(&self, ino: u64, n: u64) {
        let gone = {
            let mut l = self.core.lookups.lock();
            match l.get_mut(&ino) {
                Some(c) if *c > n => {
                    *c -= n;
                    false
                }
                Some(_) => {
                    l.remove(&ino);
                    true
                }
                None => false,
            }
        };
        if gone {
            if let Some(h) = self.core.cached_handle(ino) {
                if let Err(e) = self.maybe_free(&h) {
                    tracing::warn!("freeing inode {ino} after forget: {e}");
                }
            }
        }
    }

    pub fn read(&self, ino: u64, offset: u64, size: u32) -> FsResult<Vec<u8>> {
        self.read_with(ino, offset, size, |d| d.to_vec())
    }

    /// Read, handing the bytes to `f` (the FUSE reply) without copying them out of the
    /// pagepool when they lie in one cached block.
    pub fn read_with<R>(
        &self,
        ino: u64,
        offset: u64,
        size: u32,
        f: impl FnOnce(&[u8]) -> R,
    ) -> FsResult<R> {
        // Called once, at the end, after every token is held: a restart never needs it.
        let mut f = Some(f);
        crate::op::run(&self.core, || {
            self.core.stats.reads.fetch_add(1, Ordering::Relaxed);
            let h = self.handle(ino)?;
            let bb = self.core.block_bytes();
            self.need_data(ino, TokenMode::Ro, block_range(offset, size as u64, bb))?;
            let sequential = {
                let mut p = h.pattern.lock();
                // The kernel's readahead sends several requests of a window at once and our
                // threads serve them in any order, so "sequential" means near where the
                // stream is: within a block behind it or two blocks ahead of it.
                let near = p.next_offset > 0
                    && offset + bb > p.next_offset
                    && offset <= p.next_offset.saturating_add(2 * bb);
                let seq = near || offset == p.next_offset;
                p.run = if seq { p.run.saturating_add(1) } else { 0 };
                if seq {
                    p.next_offset = p.next_offset.max(offset + size as u64);
                } else {
                    // A new pass (a re-read from the start, a seek): what was prefetched
                    // for the last one says nothing about this one.
                    p.prefetched_upto = 0;
                    p.next_offset = offset + size as u64;
                }
                p.run >= 2
            };
            let (out, atime_due) = {
                let st = h.state.read();
                if st.deleted {
                    return Err(FsError::Stale(ino));
                }
                if is_dir_mode(st.inode.mode) {
                    return Err(FsError::IsDir(format!("inode {ino}")));
                }
                // Queue read-ahead first, so prefetch overlaps this read's copy.
                if sequential {
                    self.schedule_prefetch(&h, offset + size as u64, st.inode.size);
                }
                // relatime: update atime when it is older than mtime/ctime or a day old.
                let i = &st.inode;
                let t = self.core.now();
                let due = i.atime.sec < i.mtime.sec
                    || (i.atime.sec == i.mtime.sec && i.atime.nsec <= i.mtime.nsec)
                    || i.atime.sec < i.ctime.sec
                    || t.sec - i.atime.sec >= 24 * 3600;
                let f = f.take().expect("the read's reply is made once");
                (
                    file_io::read_with(&self.core, &st, offset, size as usize, sequential, f)?,
                    due,
                )
            };
            // atime is updated by a node that may write the inode anyway; a reader that
            // shares the file with writers on other nodes leaves it to them (taking a
            // write token for every read would bounce the inode between nodes).
            if atime_due
                && !self.core.read_only.load(Ordering::Relaxed)
                && self.need(ino, Need::Write).is_ok()
            {
                let _tx = self.core.begin();
                let mut st = h.state.write();
                st.inode.atime = self.core.now();
                st.mark_dirty();
            }
            Ok(out)
        })
    }

    fn schedule_prefetch(&self, h: &Arc<InodeHandle>, from: u64, fsize: u64) {
        let aggr = self.core.cfg.read().prefetch_aggressiveness_read;
        if aggr == 0 {
            return;
        }
        let bb = self.core.block_bytes();
        let by_pool = (self.core.pool.limit() / bb / 8).max(1);
        // Automatic (-1) is level 2: on the test VM two 1 MiB readers got 1.00-1.15 GB/s
        // with 4 blocks ahead and 0.95-1.00 with 8 (4 alternating pairs, `-i` switches).
        let window = match aggr {
            1 => 2,
            3 => 8,
            _ => 4,
        }
        .min(by_pool);
        // Back off when prefetch wastes more than half of what it reads.
        let s = &self.core.pool.stats;
        let used = s.prefetch_used.load(Ordering::Relaxed);
        let wasted = s.prefetch_wasted.load(Ordering::Relaxed);
        let window = if wasted > 16 && wasted > used {
            (window / 2).max(1)
        } else {
            window
        };
        let first = from / bb;
        let last_block = if fsize == 0 { return } else { (fsize - 1) / bb };
        let mut p = h.pattern.lock();
        if p.prefetched_upto > first + window {
            // Stale: left by an earlier pass further into the file.
            p.prefetched_upto = 0;
        }
        let start = first.max(p.prefetched_upto);
        let end = (first + window).min(last_block + 1);
        for b in start..end {
            self.core.queue_prefetch(h.ino, b);
        }
        p.prefetched_upto = p.prefetched_upto.max(end);
    }

    /// Write `data` at `offset` (at the end of file when `append`). Returns the bytes
    /// written and the offset they went to.
    pub fn write(&self, ino: u64, offset: u64, data: &[u8], append: bool) -> FsResult<usize> {
        crate::op::run(&self.core, || {
            self.core.stats.writes.fetch_add(1, Ordering::Relaxed);
            let core = &self.core;
            if !core.cfg.read().background_workers {
                // No write-behind threads (deterministic tests): the writer makes room itself.
                while core.pool.dirty_bytes() + data.len() as u64 > core.pool.dirty_limit() {
                    let before = core.pool.dirty_bytes();
                    for (i, b) in core.pool.dirty_keys(8) {
                        if let Some(h) = core.cached_handle(i) {
                            file_io::flush_block(core, &h, b)?;
                        }
                    }
                    if core.pool.dirty_bytes() >= before {
                        break;
                    }
                }
            }
            core.pool.wait_for_room(data.len() as u64, &|| {
                core.read_only.load(Ordering::Relaxed)
            });
            match self.write_logged(ino, offset, data, append) {
                // Space freed recently is reusable only after a checkpoint: make one, retry.
                Err(FsError::NoSpace(_)) if core.alloc.quarantined_subblocks() > 0 => {
                    core.journal.quiesce(core)?;
                    self.write_logged(ino, offset, data, append)
                }
                r => r,
            }
        })
    }

    fn write_logged(&self, ino: u64, offset: u64, data: &[u8], append: bool) -> FsResult<usize> {
        let h = self.handle(ino)?;
        let bb = self.core.block_bytes();
        if append {
            // O_APPEND must see every other node's appends: the size is only certain
            // under an exclusive token, and the data from it on.
            self.need(ino, Need::Exclusive)?;
            self.need_data(ino, TokenMode::Xw, ByteRange::WHOLE)?;
        } else {
            self.need(ino, Need::Write)?;
            self.need_data(
                ino,
                TokenMode::Xw,
                block_range(offset, data.len() as u64, bb),
            )?;
        }
        let _tx = self.core.begin();
        {
            let st = h.state.read();
            if is_dir_mode(st.inode.mode) {
                return Err(FsError::IsDir(format!("inode {ino}")));
            }
        }
        if append {
            // O_APPEND: the offset is the size, read under the write's own lock.
            return file_io::write_append(&self.core, &h, data);
        }
        file_io::write(&self.core, &h, offset, data)
    }

    /// O_DIRECT read: aligned requests bypass the pagepool.
    pub fn read_direct(&self, ino: u64, offset: u64, size: u32) -> FsResult<AlignedBuf> {
        crate::op::run(&self.core, || {
            if !offset.is_multiple_of(512) || !size.is_multiple_of(512) {
                return self.read_with(ino, offset, size, AlignedBuf::from_slice);
            }
            let h = self.handle(ino)?;
            let bb = self.core.block_bytes();
            self.need_data(ino, TokenMode::Ro, block_range(offset, size as u64, bb))?;
            // Dirty buffers under the range go to disk first so the disk is current.
            for b in offset / bb..(offset + size as u64).div_ceil(bb) {
                file_io::flush_block(&self.core, &h, b)?;
            }
            self.core.stats.direct_reads.fetch_add(1, Ordering::Relaxed);
            let st = h.state.read();
            file_io::read_direct(&self.core, &st, offset, size as usize)
        })
    }

    /// O_DIRECT write: aligned overwrites of allocated full blocks go straight to disk;
    /// anything else (allocation, small or unaligned I/O) is buffered and then written
    /// through synchronously.
    pub fn write_direct(&self, ino: u64, offset: u64, data: &[u8]) -> FsResult<usize> {
        crate::op::run(&self.core, || {
            let h = self.handle(ino)?;
            if offset.is_multiple_of(512) && data.len().is_multiple_of(512) {
                let bb = self.core.block_bytes();
                self.need(ino, Need::Write)?;
                self.need_data(
                    ino,
                    TokenMode::Xw,
                    block_range(offset, data.len() as u64, bb),
                )?;
                let _tx = self.core.begin();
                let mut st = h.state.write();
                if file_io::direct_eligible(&self.core, &st, offset, data.len())? {
                    self.core
                        .stats
                        .direct_writes
                        .fetch_add(1, Ordering::Relaxed);
                    return file_io::write_direct(&self.core, &mut st, offset, data);
                }
            }
            let n = self.write(ino, offset, data, false)?;
            let bb = self.core.block_bytes();
            for b in offset / bb..(offset + data.len() as u64).div_ceil(bb) {
                file_io::flush_block(&self.core, &h, b)?;
            }
            Ok(n)
        })
    }

    /// fsync/fdatasync of a file or directory: its dirty data is written, then the log
    /// is committed up to now (which covers every metadata change made before the call,
    /// this file's and any other's: one compound transaction, as in GPFS and ext4).
    pub fn fsync(&self, ino: u64, _datasync: bool) -> FsResult<()> {
        crate::op::run(&self.core, || {
            self.core.stats.fsyncs.fetch_add(1, Ordering::Relaxed);
            let h = self.handle(ino)?;
            file_io::flush_data(&self.core, &h)?;
            let seq = self.core.journal.running_seq();
            self.core.journal.commit_upto(&self.core, seq)
        })
    }

    pub fn readdir(&self, ino: u64, after: u64, max: usize) -> FsResult<Vec<DirListing>> {
        crate::op::run(&self.core, || {
            let h = self.handle(ino)?;
            self.need_names(ino, TokenMode::Ro)?;
            let st = h.state.read();
            let dir = self.live_dir(&st)?;
            let mut out = Vec::new();
            if after < 1 {
                out.push(DirListing {
                    cookie: 1,
                    ino: dir.ino,
                    kind: dtype(S_IFDIR),
                    name: b".".to_vec(),
                });
            }
            if after < 2 && out.len() < max {
                out.push(DirListing {
                    cookie: 2,
                    ino: dir.parent,
                    kind: dtype(S_IFDIR),
                    name: b"..".to_vec(),
                });
            }
            if out.len() < max {
                for e in directory::list(&self.core, &st, after.max(2), max - out.len())? {
                    out.push(DirListing {
                        cookie: e.cookie,
                        ino: e.ino,
                        kind: e.kind,
                        name: e.name,
                    });
                }
            }
            Ok(out)
        })
    }

    pub fn statfs(&self) -> StatFs {
        let c = &self.core;
        StatFs {
            block_bytes: c.geo.block_bytes,
            fragment_bytes: c.geo.subblock_bytes(),
            blocks: c.alloc.total_subblocks(),
            // Space freed and waiting for a checkpoint counts as free: it is, as soon as
            // the log is checkpointed (a write that needs it forces that).
            blocks_free: c.alloc.available_subblocks() + c.alloc.quarantined_subblocks(),
            files: c.imap.inodes_max(),
            files_free: c.imap.inodes_max() - c.imap.used(),
            name_max: 255,
        }
    }

    // ---- extended attributes -------------------------------------------------

    fn check_xattr_name(name: &[u8]) -> FsResult<()> {
        if name.is_empty() || name.len() > 255 {
            return Err(FsError::Range(name.len()));
        }
        let ok = [&b"user."[..], b"trusted.", b"security."]
            .iter()
            .any(|p| name.starts_with(p) && name.len() > p.len())
            || name == acl::ACCESS
            || name == acl::DEFAULT;
        if !ok {
            return Err(FsError::NotSupported(format!(
                "xattr namespace of {:?}",
                String::from_utf8_lossy(name)
            )));
        }
        Ok(())
    }

    pub fn setxattr(&self, ino: u64, name: &[u8], value: &[u8], flags: i32) -> FsResult<()> {
        crate::op::run(&self.core, || {
            self.core.check_writable()?;

            Self::check_xattr_name(name)?;
            if value.len() > XATTR_VALUE_BYTES_MAX {
                return Err(FsError::TooBig(format!(
                    "xattr value of {} bytes (at most {XATTR_VALUE_BYTES_MAX})",
                    value.len()
                )));
            }
            let h = self.handle(ino)?;
            self.need(ino, Need::Exclusive)?;
            let _tx = self.core.begin();
            let mut st = h.state.write();
            let kind = st.inode.mode & S_IFMT;
            if name.starts_with(b"user.") && kind != S_IFREG && kind != S_IFDIR {
                return Err(FsError::Perm(
                    "user.* attributes only on files and directories".into(),
                ));
            }
            if (name == acl::ACCESS || name == acl::DEFAULT) && acl::decode(value).is_none() {
                return Err(FsError::Invalid("malformed POSIX ACL".into()));
            }
            if name == acl::DEFAULT && kind != S_IFDIR {
                return Err(FsError::Perm("default ACLs only on directories".into()));
            }
            let pos = st.inode.xattrs.iter().position(|(n, _)| n == name);
            match (pos, flags) {
                (Some(_), f) if f & libc::XATTR_CREATE != 0 => {
                    return Err(FsError::Exists(String::from_utf8_lossy(name).into_owned()))
                }
                (None, f) if f & libc::XATTR_REPLACE != 0 => return Err(FsError::NoAttr),
                _ => {}
            }
            let old = pos.map(|p| st.inode.xattrs.remove(p));
            st.inode.xattrs.push((name.to_vec(), value.to_vec()));
            if !st.inode.fits(self.core.inode_bytes()) {
                // Make room by moving inline data or entries out of the inode.
                match &st.inode.content {
                    InodeContent::InlineData(_) => file_io::convert_inline(&self.core, &mut st)?,
                    InodeContent::InlineDir(_) => {
                        st.inode.xattrs.pop();
                        directory::force_out_of_inode(&self.core, &mut st)?;
                        st.inode.xattrs.push((name.to_vec(), value.to_vec()));
                    }
                    InodeContent::Pointers(_) => {}
                }
                if !st.inode.fits(self.core.inode_bytes()) {
                    st.inode.xattrs.pop();
                    if let Some(o) = old {
                        st.inode.xattrs.push(o);
                    }
                    let room = mako_format::inode::payload_bytes(self.core.inode_bytes())
                        .saturating_sub(
                            mako_format::inode::xattrs_encoded_len(&st.inode.xattrs)
                                + st.inode.content_len(self.core.inode_bytes()),
                        );
                    return Err(FsError::NoSpace(format!(
                    "extended attributes live in the inode: {room} bytes free in inode {ino}; use a larger inode size (-i 4K)"
                )));
                }
            }
            if name == acl::ACCESS {
                if let Some(m) = acl::decode(value).and_then(|e| acl::mode_from(&e)) {
                    st.inode.mode = (st.inode.mode & !0o777) | m;
                }
            }
            st.inode.ctime = self.core.now();
            st.mark_dirty();
            Ok(())
        })
    }

    pub fn getxattr(&self, ino: u64, name: &[u8]) -> FsResult<Vec<u8>> {
        crate::op::run(&self.core, || {
            let h = self.handle(ino)?;
            let st = h.state.read();
            st.inode
                .xattrs
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, v)| v.clone())
                .ok_or(FsError::NoAttr)
        })
    }

    pub fn listxattr(&self, ino: u64) -> FsResult<Vec<u8>> {
        crate::op::run(&self.core, || {
            let h = self.handle(ino)?;
            let st = h.state.read();
            let mut out = Vec::new();
            for (n, _) in &st.inode.xattrs {
                out.extend_from_slice(n);
                out.push(0);
            }
            Ok(out)
        })
    }

    pub fn removexattr(&self, ino: u64, name: &[u8]) -> FsResult<()> {
        crate::op::run(&self.core, || {
            self.core.check_writable()?;
            let h = self.handle(ino)?;
            self.need(ino, Need::Exclusive)?;
            let _tx = self.core.begin();
            let mut st = h.state.write();
            let pos = st
                .inode
                .xattrs
                .iter()
                .position(|(n, _)| n == name)
                .ok_or(FsError::NoAttr)?;
            st.inode.xattrs.remove(pos);
            st.inode.ctime = self.core.now();
            st.mark_dirty();
            Ok(())
        })
    }

    // ---- space management -------------------------------------------------------

    /// fallocate(2): mode 0, FALLOC_FL_KEEP_SIZE, PUNCH_HOLE|KEEP_SIZE, ZERO_RANGE.
    pub fn fallocate(&self, ino: u64, offset: u64, len: u64, mode: i32) -> FsResult<()> {
        crate::op::run(&self.core, || {
            self.core.check_writable()?;
            let keep = mode & libc::FALLOC_FL_KEEP_SIZE != 0;
            let punch = mode & libc::FALLOC_FL_PUNCH_HOLE != 0;
            let zero = mode & libc::FALLOC_FL_ZERO_RANGE != 0;
            let known =
                libc::FALLOC_FL_KEEP_SIZE | libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_ZERO_RANGE;
            if mode & !known != 0 {
                return Err(FsError::NotSupported(format!(
                    "fallocate mode {mode:#x} (collapse/insert range are not supported)"
                )));
            }
            if len == 0 {
                return Err(FsError::Invalid("fallocate length 0".into()));
            }
            if punch && !keep {
                return Err(FsError::NotSupported(
                    "FALLOC_FL_PUNCH_HOLE needs FALLOC_FL_KEEP_SIZE".into(),
                ));
            }
            let h = self.handle(ino)?;
            self.need(ino, Need::Exclusive)?;
            self.need_data(ino, TokenMode::Xw, ByteRange::WHOLE)?;
            let _tx = self.core.begin();
            let mut st = h.state.write();
            if st.inode.mode & S_IFMT != S_IFREG {
                return Err(FsError::NotSupported(format!(
                    "fallocate on a non-regular file (inode {ino})"
                )));
            }
            let t = self.core.now();
            if punch {
                file_io::punch_hole(&self.core, &mut st, offset, len)?;
            } else if zero {
                let end = offset.saturating_add(len);
                file_io::punch_hole(&self.core, &mut st, offset, len)?;
                if !keep && end > st.inode.size {
                    file_io::set_size(&self.core, &mut st, end)?;
                }
            } else {
                file_io::allocate_range(&self.core, &mut st, offset, len, keep)?;
            }
            st.inode.mtime = t;
            st.inode.ctime = t;
            st.mark_dirty();
            Ok(())
        })
    }

    /// lseek SEEK_DATA (3) and SEEK_HOLE (4); other whence values are the kernel's.
    pub fn lseek(&self, ino: u64, offset: u64, whence: i32) -> FsResult<u64> {
        crate::op::run(&self.core, || {
            let h = self.handle(ino)?;
            self.need_data(ino, TokenMode::Ro, ByteRange::WHOLE)?;
            let st = h.state.read();
            match whence {
                libc::SEEK_DATA => file_io::seek_data(&self.core, &st, offset),
                libc::SEEK_HOLE => file_io::seek_hole(&self.core, &st, offset),
                _ => Err(FsError::Invalid(format!("lseek whence {whence}"))),
            }
        })
    }

    /// Flush everything and drop clean cached data (benchmarks' cache drop).
    pub fn clear_cache(&self) -> FsResult<()> {
        crate::workers::sync_all(&self.core)?;
        self.core.pool.drop_clean();
        Ok(())
    }

    pub fn sync(&self) -> FsResult<()> {
        crate::workers::sync_all(&self.core)
    }

    /// Blocks and hash depth of a directory (tests, diagnostics).
    pub fn dir_shape(&self, ino: u64) -> FsResult<(usize, u8, u64)> {
        crate::op::run(&self.core, || {
            let h = self.handle(ino)?;
            let st = h.state.read();
            let (n, d) = directory::shape(&self.core, &st);
            Ok((n, d, st.inode.size))
        })
    }

    /// Allocated units of a file (tests: fragments, holes, striping).
    pub fn block_list(&self, ino: u64) -> FsResult<Vec<(u64, mako_format::DiskAddress)>> {
        crate::op::run(&self.core, || {
            let h = self.handle(ino)?;
            let st = h.state.read();
            block_map::allocated_from(&self.core, &st, 0, usize::MAX)
        })
    }

    pub fn raw_inode(&self, ino: u64) -> FsResult<Inode> {
        crate::op::run(&self.core, || {
            let h = self.handle(ino)?;
            let st = h.state.read();
            Ok(st.inode.clone())
        })
    }
}
