//! `FileSystem`: the mounted file system's API, one method per POSIX operation.
//! The FUSE adapter calls these; tests call them directly.
//!
//! Locking: a directory's state lock is taken before its children's (ancestor first);
//! renames that change parents hold `rename_lock`, lock the two parents ancestor
//! first, then the inodes involved in inode-number order.

use crate::acl;
use crate::attributes;
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
pub const S_IFCHR: u32 = 0o020000;
pub const S_ISUID: u32 = 0o4000;
pub const S_ISGID: u32 = 0o2000;
pub const ROOT_INO: u64 = 1;
/// Longest symlink target (PATH_MAX - 1).
pub const SYMLINK_BYTES_MAX: usize = 4095;
pub const LINKS_MAX: u32 = 65000;
pub use crate::xattr::{XATTR_BYTES_MAX, XATTR_LIST_BYTES_MAX, XATTR_VALUE_BYTES_MAX};

/// When a read updates a file's atime: the mount's `relatime` (the default),
/// `strictatime` or `noatime` option.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum AtimePolicy {
    /// When atime is not after mtime or ctime, or is a day old (Linux's default).
    #[default]
    Relatime,
    /// At every read that reaches makod.
    Strict,
    /// Never.
    Never,
}

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
    /// chattr attributes as FS_IOC_GETFLAGS bits (`attributes::FS_*_FL`).
    pub attributes: u32,
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
    /// Clear setuid and setgid as `setid_to_clear` says, in the same transaction: the
    /// kernel asks for it (FATTR_KILL_SUIDGID) on a truncate by a caller without
    /// CAP_FSETID and on every chown of a non-directory.
    pub clear_setid: bool,
    /// With `clear_setid`: the caller is neither in the file's group nor has CAP_FSETID.
    pub caller_outside_group: bool,
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
    /// Subblocks not in use (`f_bfree`).
    pub blocks_free: u64,
    /// Subblocks file data can still get (`f_bavail`): free less the metadata reserve.
    pub blocks_available: u64,
    pub files: u64,
    pub files_free: u64,
    pub name_max: u32,
}

/// Is an atime update due for a read now? relatime: when atime is older than mtime or
/// ctime, or a day old; strictatime: always; noatime: never.
fn atime_due(policy: AtimePolicy, i: &Inode, now: Timestamp) -> bool {
    match policy {
        AtimePolicy::Never => false,
        AtimePolicy::Strict => true,
        AtimePolicy::Relatime => {
            i.atime.sec < i.mtime.sec
                || (i.atime.sec == i.mtime.sec && i.atime.nsec <= i.mtime.nsec)
                || i.atime.sec < i.ctime.sec
                || now.sec.saturating_sub(i.atime.sec) >= 24 * 3600
        }
    }
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

/// The setid bits a data change or chown clears (`setattr_should_drop_suidgid` in the
/// kernel): setuid; setgid when the group may execute, or when the caller is neither in
/// the file's group nor has CAP_FSETID. Never on directories, where setgid says how new
/// entries inherit their group.
pub fn setid_to_clear(mode: u32, caller_outside_group: bool) -> u32 {
    if is_dir_mode(mode) {
        return 0;
    }
    let mut k = mode & S_ISUID;
    if mode & S_ISGID != 0 && (mode & 0o010 != 0 || caller_outside_group) {
        k |= S_ISGID;
    }
    k
}

pub fn dtype(mode: u32) -> u8 {
    ((mode & S_IFMT) >> 12) as u8
}
pub fn is_dir_mode(mode: u32) -> bool {
    mode & S_IFMT == S_IFDIR
}

/// How often a lookup looks a name up again when the inode it found lost its last
/// link meanwhile (each retry follows a change that completed on this node).
const LOOKUP_RACE_RETRIES: u32 = 16;

#[derive(Clone)]
pub struct FileSystem {
    pub core: Arc<Core>,
}

impl FileSystem {
    pub fn attr_of(&self, inode: &Inode) -> Attr {
        let inline = match &inode.content {
            InodeContent::InlineData(d) => d.len() as u64,
            _ => 0,
        };
        self.attr_with_inline(inode, inline)
    }

    /// The attributes of `inode` holding `inline_data_bytes` of data in itself (they
    /// count in `st_blocks`; a stat-cache entry keeps their number, not the bytes).
    fn attr_with_inline(&self, inode: &Inode, inline_data_bytes: u64) -> Attr {
        let sb = self.core.geo.subblock_bytes() as u64;
        let inline = inline_data_bytes.div_ceil(512);
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
            attributes: attributes::fs_flags(inode),
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

    /// Hold the name token around `name` in directory `p` (its page's cookie range).
    fn need_name(&self, p: &Arc<InodeHandle>, name: &[u8], mode: TokenMode) -> FsResult<()> {
        let range = {
            let st = p.state.read();
            directory::page_range(&self.core, &st, mako_format::name_hash::home_cookie(name))?
        };
        crate::op::hold_range(
            &self.core,
            self.core.tokens.dir(p.ino),
            mode,
            range,
            ByteRange::WHOLE,
        )
    }

    /// What an operation that adds or removes `name` in directory `p` holds: the
    /// name's page exclusively, and the directory in shared write (times, entry and
    /// link counts go to its metanode) — or exclusively while its entries are in its
    /// inode. A shape change found later asks for more (`directory::cover_structure`).
    fn need_parent(&self, p: &Arc<InodeHandle>, name: &[u8]) -> FsResult<()> {
        crate::metanode::prepare(&self.core, p)?;
        // Not a directory (any more): said before its "names" are looked for.
        self.live_dir(&p.state.read())?;
        let inline = matches!(p.state.read().inode.content, InodeContent::InlineDir(_));
        if inline {
            // Asked for on the condition that the directory is still in its inode as
            // this node last saw it; once it has left, `rw` is granted instead.
            directory::cover_structure(&self.core, &p.state.read())?;
        } else {
            self.need(p.ino, Need::Write)?;
        }
        crate::metanode::prepare(&self.core, p)?;
        self.need_name(p, name, TokenMode::Xw)?;
        crate::metanode::defer_report(&self.core, p)
    }

    /// What an operation that creates inode `ino` (a reserved number) holds before
    /// anything changes: the inode and its data exclusively, and the inode file
    /// exclusively when it must grow to reach the number.
    fn need_new_inode(&self, ino: u64) -> FsResult<()> {
        self.need(ino, Need::Exclusive)?;
        self.need_data(ino, TokenMode::Xw, ByteRange::WHOLE)?;
        let inode_file = self.core.metadata_inodes().inode_file;
        if !self.core.inode_slot_exists(ino) {
            // Another node may have made the block ahead for this node's segment
            // (`Core::inode_file_growth`): learn the file's blocks under `ro` before
            // taking it in `xw` from every node that reads inodes. A node holding it in
            // `xw` knows them all (and may have changed them since the disk copy).
            self.need(inode_file, Need::Cache)?;
            if self.core.tokens.inode_mode(inode_file) != Some(TokenMode::Xw) {
                self.core.refresh_metafile(inode_file)?;
            }
        }
        if !self.core.inode_slot_exists(ino) {
            self.need(inode_file, Need::Exclusive)?;
        }
        if !self.core.imap_block_exists(ino) {
            self.need(self.core.metadata_inodes().inode_alloc_map, Need::Exclusive)?;
        }
        Ok(())
    }

    /// Ask for a reserved number's inode and data tokens (`xw`) before the operation
    /// that creates the inode runs. Inside it, `need_new_inode` would find them missing
    /// one after the other, and `op::run` acquires one missing token per restart: two
    /// restarts of the whole operation per create. Nobody else uses a number reserved
    /// to this node, so both are granted without revoking anything; should one be
    /// taken back before the operation holds it, `need_new_inode` asks for it again.
    /// Only outside an operation (no lock, handle or hold open: docs/coherence.md R1);
    /// nested in one, the operation's own restarts do it. Both are asked for in one
    /// manager request when this node has neither (`TokenClient::try_acquire_fresh`);
    /// whatever that did not get is acquired one by one below. (Its changed message
    /// schedule made three-node seeds 184, 187 and 226 meet a metanode race, fixed in
    /// `metanode::settle`: docs/performance.md.)
    fn acquire_new_inode_tokens(&self, ino: u64) -> FsResult<()> {
        if crate::op::in_operation(&self.core) {
            return Ok(());
        }
        let tokens = &self.core.tokens;
        let client = tokens.client();
        let (inode, data) = (tokens.inode(ino), tokens.data(ino));
        if client.held_mode(inode, ByteRange::WHOLE).is_none()
            && client.held_mode(data, ByteRange::WHOLE).is_none()
        {
            client.try_acquire_fresh(&[(inode, TokenMode::Xw), (data, TokenMode::Xw)]);
        }
        if tokens.inode_mode(ino) != Some(TokenMode::Xw) {
            tokens.acquire(tokens.inode_missing(ino, Need::Exclusive))?;
        }
        let data = tokens.data(ino);
        if tokens.client().held_mode(data, ByteRange::WHOLE) != Some(TokenMode::Xw) {
            if let Err(missing) =
                tokens.try_hold_range(data, TokenMode::Xw, ByteRange::WHOLE, ByteRange::WHOLE)
            {
                tokens.acquire(missing)?;
            }
        }
        Ok(())
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

    /// Does this node share `ino` with writers on other nodes (an `rw` inode token)?
    /// Its attributes may then change without a revoke reaching this node, so no cache
    /// outside makod (the kernel's) may keep them.
    pub fn attributes_shared(&self, ino: u64) -> bool {
        self.core.tokens.inode_mode(ino) == Some(TokenMode::Rw)
    }

    /// May the kernel keep `ino`'s attributes for long without asking? Only while this
    /// node holds its inode token in `ro` or `xw`: a change anywhere else revokes that
    /// token first, and the revoke invalidates the kernel's copy (`cache_flush`). With
    /// `rw` others change size and times without a revoke (`attributes_shared`); with
    /// none nothing would tell the kernel.
    pub fn kernel_may_cache_attrs(&self, ino: u64) -> bool {
        matches!(
            self.core.tokens.inode_mode(ino),
            Some(TokenMode::Ro | TokenMode::Xw)
        )
    }

    /// The token client's grant clock, read before a listing whose entries the kernel
    /// may keep (`kernel_may_cache_listing`).
    pub fn grant_clock(&self) -> u64 {
        self.core.tokens.client().grant_clock()
    }

    /// May the kernel keep names of directory `dir` that were read when the grant clock
    /// showed `read_at` and recorded (for invalidation) since? Only if this node still
    /// holds every name of the directory, no revoke of them is under way, and nothing of
    /// them was granted since the read: the names were read under the token held now, and
    /// its revoke will find them recorded. Lookups and creates need no such check: they
    /// record the name before the operation reads it under its name token.
    pub fn kernel_may_cache_listing(&self, dir: u64, read_at: u64) -> bool {
        let client = self.core.tokens.client();
        let names = self.core.tokens.dir(dir);
        client.granted_at(names) <= read_at && client.holds_steadily(names, ByteRange::WHOLE)
    }

    pub fn getattr(&self, ino: u64) -> FsResult<Attr> {
        crate::op::run(&self.core, || {
            if let Some(attr) = self.stat_cached_attr(ino)? {
                return Ok(attr);
            }
            let h = self.handle(ino)?;
            // A shared writer's size and times are the metanode's merge.
            crate::metanode::prepare(&self.core, &h)?;
            if h.state.read().shared.is_some() {
                crate::metanode::refresh_attr(&self.core, &h)?;
            }
            let st = h.state.read();
            if st.deleted {
                return Err(FsError::Stale(ino));
            }
            Ok(self.attr_of(&st.inode))
        })
    }

    /// The attributes of an inode that is not cached whole but has a stat-cache entry,
    /// answered from the entry (no disk read, no full inode loaded, nothing else of the
    /// cache pushed out). Only under a token that no other node writes under (`ro` or
    /// `xw`, held for the operation): under `rw` other nodes change size and times and
    /// the metanode merges them, which `getattr` asks the whole inode for.
    fn stat_cached_attr(&self, ino: u64) -> FsResult<Option<Attr>> {
        if self.core.cached_handle(ino).is_some() || !self.core.stat_cache.lock().contains(ino) {
            return Ok(None);
        }
        crate::op::hold_inode(&self.core, ino, Need::Cache)?;
        if !matches!(
            self.core.tokens.inode_mode(ino),
            Some(TokenMode::Ro | TokenMode::Xw)
        ) {
            return Ok(None);
        }
        // The entry goes only with the token (held now) or when the whole inode is
        // loaded (then it is a copy of it, as current as this answer).
        let Some(entry) = self.core.stat_cache.lock().get(ino) else {
            return Ok(None);
        };
        self.core
            .stats
            .stat_cache_hits
            .fetch_add(1, Ordering::Relaxed);
        Ok(Some(
            self.attr_with_inline(&entry.inode, entry.inline_data_bytes),
        ))
    }

    pub fn lookup(&self, parent: u64, name: &[u8]) -> FsResult<Attr> {
        if name == b"." {
            // The kernel's path walk never asks for "."; an export does (see below).
            return self.lookup_self(parent);
        }
        crate::op::run(&self.core, || {
            self.core.stats.lookups.fetch_add(1, Ordering::Relaxed);
            let p = self.handle(parent)?;
            if !matches!(name, b"." | b"..") {
                crate::metanode::prepare(&self.core, &p)?;
                if name.len() <= mako_format::dir_block::NAME_BYTES_MAX {
                    self.need_name(&p, name, TokenMode::Ro)?;
                }
            }
            // The name is found under the directory's lock, the attributes after it is
            // released: an unlink or a rename over the name on this node may complete in
            // between, and the inode found has no link left (or is freed: ESTALE). Its
            // name is gone then, so
            // the name is looked up again (the directory now says ENOENT or the new
            // file): a lookup sees the state before the change or after it, never the
            // unlinked inode under its old name.
            let mut attempt = 0;
            loop {
                let ino = {
                    let st = p.state.read();
                    let dir = self.live_dir(&st)?;
                    match name {
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
                attempt += 1;
                match self.getattr(ino) {
                    Ok(attr) if attr.nlink == 0 && attempt < LOOKUP_RACE_RETRIES => {}
                    // Freed meanwhile (the name was unlinked, or renamed over).
                    Err(FsError::Stale(_)) if attempt < LOOKUP_RACE_RETRIES => {}
                    // Still under the name? A rename of it may have completed since it
                    // was found, its ctime with it: the attributes would then be the
                    // renamed file's under its old name, neither state (faults seed 134
                    // of `partition_of_one_node`). Looked up again then.
                    Ok(_)
                        if attempt < LOOKUP_RACE_RETRIES
                            && !matches!(name, b"." | b"..")
                            && directory::lookup(&self.core, &p.state.read(), name)?
                                .map(|e| e.ino)
                                != Some(ino) => {}
                    r => return r,
                }
            }
        })
    }

    /// Inode `ino` itself, found by its number instead of a name: how a file handle
    /// (NFS, `open_by_handle_at`) becomes a file again once the kernel has dropped the
    /// inode from its caches (it asks for "." in the handle's inode, of any type). Only a
    /// file that exists and has a name is found; a free or never used number, a deleted
    /// file, an open file whose last name is gone and Mako's own metadata files are
    /// `Stale`, so a handle, which an NFS client can forge, never reaches the file
    /// system's internals. The caller compares the generation: a number used again by
    /// another file has a new one (`generation_for`).
    pub fn lookup_self(&self, ino: u64) -> FsResult<Attr> {
        let m = self.core.metadata_inodes();
        if ino != m.root_dir && ino < m.first_user_inode {
            return Err(FsError::Stale(ino));
        }
        crate::op::run(&self.core, || {
            self.core.stats.lookups.fetch_add(1, Ordering::Relaxed);
            let h = self.handle(ino)?;
            {
                let st = h.state.read();
                let system = st.inode.flags & mako_format::inode::FLAG_SYSTEM != 0;
                if st.deleted || st.inode.nlink == 0 || system {
                    return Err(FsError::Stale(ino));
                }
            }
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
        let default_acl = crate::xattr::get(&self.core, parent, acl::DEFAULT)?;
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
        inode.generation = self.core.generation_for(ino)?;
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
        self.acquire_new_inode_tokens(ino)?;
        crate::op::run(&self.core, || {
            self.need_new_inode(ino)?;
            let p = self.handle(parent)?;
            self.need_parent(&p, name)?;
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
        attributes::check_not_immutable(&pst.inode, "create an entry in a directory")?;
        if is_dir_mode(mode) && pst.inode.nlink >= LINKS_MAX {
            return Err(FsError::TooManyLinks(format!("directory inode {parent}")));
        }
        // Whatever the insert needs is held before the first change.
        directory::prepare_insert(&self.core, pst, name, dtype(mode))?;
        let ino = self.core.allocate_reserved_inode(reservation)?;
        let (mut inode, xattrs) = self.new_inode(ctx, pst, mode, umask, rdev, ino)?;
        inode.xattrs = xattrs;
        if let Err(e) = directory::insert(&self.core, pst, name, ino, dtype(inode.mode)) {
            let _ = self.core.unallocate_reserved_inode(reservation);
            return Err(e);
        }
        if is_dir_mode(inode.mode) {
            pst.add_nlink(1);
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

    /// open(O_TMPFILE): a regular file in no directory (no links), as `create` would make
    /// it in `parent` (owner, setgid directory, default ACL, umask). It lives while it is
    /// open or known to the kernel and is freed after, unless `link` gives it a name first
    /// (the kernel allows that unless it was opened with O_EXCL). A crash leaves it an
    /// orphan, as it leaves an open unlinked file: fsck reclaims it.
    pub fn tmpfile(&self, ctx: Ctx, parent: u64, mode: u32, umask: u32) -> FsResult<Attr> {
        self.core.check_writable()?;
        let mut reservation = self.core.reserve_inode()?;
        let ino = reservation.ino();
        self.acquire_new_inode_tokens(ino)?;
        crate::op::run(&self.core, || {
            self.need_new_inode(ino)?;
            let p = self.handle(parent)?;
            self.need(parent, Need::Cache)?;
            let _tx = self.core.begin();
            let pst = p.state.read();
            self.live_dir(&pst)?;
            attributes::check_not_immutable(&pst.inode, "create a file in a directory")?;
            let ino = self.core.allocate_reserved_inode(&mut reservation)?;
            let (mut inode, xattrs) =
                self.new_inode(ctx, &pst, S_IFREG | (mode & 0o7777), umask, 0, ino)?;
            drop(pst);
            inode.xattrs = xattrs;
            inode.nlink = 0;
            let h = self.core.insert_new(inode);
            self.core.stats.creates.fetch_add(1, Ordering::Relaxed);
            let st = h.state.read();
            Ok(self.attr_of(&st.inode))
        })
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
        // Regular files, character and block devices, fifos and sockets; directories and
        // symlinks have their own calls, and any other type would not be a file at all.
        const MKNOD_KINDS: [u32; 5] = [S_IFREG, 0o020000, 0o060000, 0o010000, 0o140000];
        if !MKNOD_KINDS.contains(&kind) {
            return Err(FsError::Invalid(format!("mknod of file type {kind:#o}")));
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
            if !matches!(h.state.read().inode.content, InodeContent::InlineData(_)) {
                // A long target is file data in a block: cached under the data token.
                self.need_data(ino, TokenMode::Ro, ByteRange::WHOLE)?;
            }
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
            self.need_parent(&p, newname)?;
            self.need(ino, Need::Exclusive)?;
            let _tx = self.core.begin();
            let mut pst = p.state.write();
            self.live_dir(&pst)?;
            let mut cst = c.state.write();
            // No links but not freed: an O_TMPFILE file or an open unlinked one. The
            // kernel lets only the first be linked (I_LINKABLE: O_TMPFILE without O_EXCL).
            if cst.deleted {
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
            attributes::check_changeable(&cst.inode, "link")?;
            attributes::check_not_immutable(&pst.inode, "create an entry in a directory")?;
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
        self.need_parent(&p, name)?;
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
        attributes::check_changeable(&pst.inode, "remove an entry from a directory")?;
        attributes::check_changeable(&cst.inode, "remove")?;
        directory::remove(&self.core, &mut pst, name)?;
        let t = self.core.now();
        if is_dir {
            cst.inode.nlink = 0;
            pst.add_nlink(-1);
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
        let start = ino;
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
        // Parent pointers that never reach the root: damaged metadata.
        Err(self.core.integrity(
            crate::error::IntegrityError::new(
                "directory tree",
                "its parent pointers go more than 100000 levels up without reaching the root (a loop)",
            )
            .ino(start),
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
                crate::metanode::prepare(&self.core, &h)?;
                self.need_name(&h, name, TokenMode::Ro)?;
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
            crate::workers::flush_inode(&self.core, &h)?;
        }
        Ok(())
    }

    /// rename(2) / renameat2(2) with RENAME_NOREPLACE (1) and RENAME_EXCHANGE (2).
    /// rename(2) / renameat2(2) by root; see `rename_as`.
    pub fn rename(&self, p1: u64, n1: &[u8], p2: u64, n2: &[u8], flags: u32) -> FsResult<()> {
        self.rename_as(Ctx::default(), p1, n1, p2, n2, flags)
    }

    /// rename(2) / renameat2(2) with RENAME_NOREPLACE (1), RENAME_EXCHANGE (2) and
    /// RENAME_WHITEOUT (4: the source name is left to a whiteout, a character device 0:0
    /// owned by the caller `ctx`, as overlayfs uses it).
    pub fn rename_as(
        &self,
        ctx: Ctx,
        p1: u64,
        n1: &[u8],
        p2: u64,
        n2: &[u8],
        flags: u32,
    ) -> FsResult<()> {
        const NOREPLACE: u32 = 1;
        const EXCHANGE: u32 = 2;
        const WHITEOUT: u32 = 4;
        self.core.check_writable()?;
        if flags & !(NOREPLACE | EXCHANGE | WHITEOUT) != 0 {
            return Err(FsError::Invalid(format!(
                "rename flags {flags:#x} (RENAME_NOREPLACE, RENAME_EXCHANGE and RENAME_WHITEOUT exist)"
            )));
        }
        if flags & EXCHANGE != 0 && flags & (NOREPLACE | WHITEOUT) != 0 {
            return Err(FsError::Invalid(
                "RENAME_EXCHANGE with RENAME_NOREPLACE or RENAME_WHITEOUT".into(),
            ));
        }
        directory::check_name(n2)?;
        // The whiteout's inode number is set aside first, as `make` does.
        let mut whiteout_reservation = if flags & WHITEOUT != 0 {
            Some(self.core.reserve_inode()?)
        } else {
            None
        };
        crate::op::run(&self.core, || {
            self.flush_before_replace(p1, n1, p2, n2)?;
            if let Some(r) = &whiteout_reservation {
                let w = r.ino();
                self.need_new_inode(w)?;
            }
            let h1 = self.handle(p1)?;
            let h2 = self.handle(p2)?;
            self.need_parent(&h1, n1)?;
            self.need_parent(&h2, n2)?;
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
            if src.kind == dtype(S_IFDIR) && p1 != p2 && up2.contains(&src.ino) {
                // Into itself, or below itself. Refused before the source's handle is
                // looked at: it may be the target parent, whose lock this thread holds.
                return Err(FsError::Invalid(
                    "cannot move a directory into itself".into(),
                ));
            }
            let src_h = self.handle(src.ino)?;
            self.need(src.ino, Need::Exclusive)?;
            // chattr attributes: the source leaves its directory (neither may be immutable
            // or append-only), the target directory gets an entry (not immutable) and,
            // when a victim or an exchange removes one there, loses one (not append-only).
            attributes::check_changeable(&s1.inode, "rename out of a directory")?;
            {
                let target: &InodeState = s2_opt.as_deref().unwrap_or(&s1);
                attributes::check_not_immutable(&target.inode, "rename into a directory")?;
                if dst.is_some() {
                    attributes::check_changeable(&target.inode, "replace an entry of a directory")?;
                }
            }
            {
                // The source or victim may be one of the locked parents (the kernel
                // refuses such renames before they get here, but a lock taken twice would
                // hang).
                let changeable = |ino: u64, what: &str| -> FsResult<()> {
                    if ino == p1 {
                        return attributes::check_changeable(&s1.inode, what);
                    }
                    if let Some(s2) = s2_opt.as_deref().filter(|_| ino == p2) {
                        return attributes::check_changeable(&s2.inode, what);
                    }
                    attributes::check_changeable(&self.handle(ino)?.state.read().inode, what)
                };
                changeable(src.ino, "rename")?;
                if let Some(d) = &dst {
                    changeable(d.ino, "replace")?;
                }
            }
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
                            s1.add_nlink(-1);
                            s2.add_nlink(1);
                        } else {
                            s1.add_nlink(1);
                            s2.add_nlink(-1);
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
                victim = Some((dh, dst_is_dir));
            }
            // The whiteout's inode is allocated before any entry changes, so running out
            // of inodes leaves the rename undone.
            let whiteout = match whiteout_reservation.as_mut() {
                Some(r) => {
                    let wino = self.core.allocate_reserved_inode(r)?;
                    let (mut w, _) = self.new_inode(ctx, &s1, S_IFCHR, 0, 0, wino)?;
                    w.mode = S_IFCHR; // no permissions, no inherited ACL: 0:0 says "whiteout"
                    w.rdev = 0;
                    Some(w)
                }
                None => None,
            };
            let entered = {
                let s2: &mut InodeState = target_dir!();
                if victim.is_some() {
                    directory::replace(&self.core, s2, n2, src.ino, src.kind).map(|_| ())
                } else {
                    directory::insert(&self.core, s2, n2, src.ino, src.kind).map(|_| ())
                }
            };
            if let Err(e) = entered {
                if let Some(r) = whiteout_reservation.as_mut() {
                    let _ = self.core.unallocate_reserved_inode(r);
                }
                return Err(e);
            }
            match whiteout {
                Some(w) => {
                    directory::replace(&self.core, &mut s1, n1, w.ino, dtype(S_IFCHR))?;
                    self.core.insert_new(w);
                    self.core.stats.creates.fetch_add(1, Ordering::Relaxed);
                }
                None => {
                    directory::remove(&self.core, &mut s1, n1)?;
                }
            }
            if let Some((dh, dst_is_dir)) = &victim {
                let mut vs = dh.state.write();
                if *dst_is_dir {
                    vs.inode.nlink = 0;
                    let s2: &mut InodeState = target_dir!();
                    s2.add_nlink(-1);
                } else {
                    vs.inode.nlink = vs.inode.nlink.saturating_sub(1);
                }
                vs.inode.ctime = t;
                vs.mark_dirty();
            }
            if src_is_dir && p1 != p2 {
                s1.add_nlink(-1);
                let s2 = s2_opt.as_deref_mut().expect("two parents");
                s2.add_nlink(1);
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

    /// Clear setuid, and setgid when the group may execute, before a change of the file's
    /// data by a caller without CAP_FSETID (write, fallocate, copy_file_range into it), as
    /// the kernel's own file systems do (`file_remove_privs`). The caller knows who asks:
    /// with FUSE_HANDLE_KILLPRIV_V2 the kernel flags such writes (FUSE_WRITE_KILL_SUIDGID).
    ///
    /// `caller_in_group(gid)` says whether the caller is in group `gid` or has CAP_FSETID;
    /// it is asked only for a setgid bit without group execute (it may be costly).
    pub fn clear_setid(&self, ino: u64, caller_in_group: impl Fn(u32) -> bool) -> FsResult<()> {
        crate::op::run(&self.core, || {
            let h = self.handle(ino)?;
            self.need(ino, Need::Cache)?;
            let to_clear = |i: &Inode| {
                let nonexec_sgid = i.mode & S_ISGID != 0 && i.mode & 0o010 == 0;
                setid_to_clear(i.mode, nonexec_sgid && !caller_in_group(i.gid))
            };
            if to_clear(&h.state.read().inode) == 0 {
                return Ok(());
            }
            self.core.check_writable()?;
            self.need(ino, Need::Exclusive)?;
            let _tx = self.core.begin();
            let mut st = h.state.write();
            let k = to_clear(&st.inode);
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
            attributes::check_setattr(&st.inode, &set)?;
            for ts in [set.atime, set.mtime]
                .into_iter()
                .flatten()
                .filter_map(|s| match s {
                    TimeSet::At(ts) => Some(ts),
                    TimeSet::Now => None,
                })
                .chain(set.ctime)
            {
                // An inode with such a time would not decode again.
                if ts.nsec >= 1_000_000_000 {
                    return Err(FsError::Invalid(format!(
                        "timestamp with {} nanoseconds",
                        ts.nsec
                    )));
                }
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
                // The access ACL follows the mode (posix_acl_chmod). Its new encoding has
                // the same length, so it stays where it is and needs no space.
                if let Some(mut entries) =
                    crate::xattr::get(&self.core, &st, acl::ACCESS)?.and_then(|v| acl::decode(&v))
                {
                    acl::chmod(&mut entries, mode);
                    crate::xattr::set(&self.core, &mut st, acl::ACCESS, &acl::encode(&entries), 0)?;
                }
                st.inode.mode = (st.inode.mode & S_IFMT) | (mode & 0o7777);
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
            if set.clear_setid {
                let k = setid_to_clear(st.inode.mode, set.caller_outside_group);
                if k != 0 {
                    st.inode.mode &= !k;
                    st.inode.ctime = t;
                }
            }
            if let Some(c) = set.ctime {
                st.inode.ctime = c;
            }
            st.mark_dirty();
            Ok(self.attr_of(&st.inode))
        })
    }

    /// Whether `ino` may be opened with open(2) `flags` (chattr attributes).
    pub fn check_open(&self, ino: u64, flags: i32) -> FsResult<()> {
        crate::op::run(&self.core, || {
            let h = self.handle(ino)?;
            self.need(ino, Need::Cache)?;
            let st = h.state.read();
            attributes::check_open(&st.inode, flags)
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
        self.read_with_atime(ino, offset, size, AtimePolicy::Relatime, f)
    }

    /// `read_with`, updating atime as the mount's option says (`relatime`, `strictatime`
    /// or `noatime`: each mount point of a file system may have its own).
    pub fn read_with_atime<R>(
        &self,
        ino: u64,
        offset: u64,
        size: u32,
        atime: AtimePolicy,
        f: impl FnOnce(&[u8]) -> R,
    ) -> FsResult<R> {
        // Called once, at the end, after every token is held: a restart never needs it.
        let mut f = Some(f);
        crate::op::run(&self.core, || {
            self.core.stats.reads.fetch_add(1, Ordering::Relaxed);
            let h = self.handle(ino)?;
            let bb = self.core.block_bytes();
            self.need_data(ino, TokenMode::Ro, block_range(offset, size as u64, bb))?;
            crate::metanode::prepare(&self.core, &h)?;
            {
                // A shared writer's size is its own view: a read past it asks the
                // metanode, which has every writer's (a read started after a write
                // completed anywhere sees it).
                let st = h.state.read();
                let past_end = offset.saturating_add(size as u64) > st.inode.size;
                if st.shared.is_some() && past_end {
                    drop(st);
                    crate::metanode::refresh_attr(&self.core, &h)?;
                }
            }
            let sequential = {
                let mut p = h.pattern.lock();
                // The kernel's readahead sends several requests of a window at once and our
                // threads serve them in any order, so "sequential" means near where the
                // stream is: within a block behind it or two blocks ahead of it.
                let near = p.next_offset > 0
                    && offset.saturating_add(bb) > p.next_offset
                    && offset <= p.next_offset.saturating_add(2 * bb);
                let seq = near || offset == p.next_offset;
                p.run = if seq { p.run.saturating_add(1) } else { 0 };
                if seq {
                    p.next_offset = p.next_offset.max(offset.saturating_add(size as u64));
                } else {
                    // A new pass (a re-read from the start, a seek): what was prefetched
                    // for the last one says nothing about this one.
                    p.prefetched_upto = 0;
                    p.next_offset = offset.saturating_add(size as u64);
                }
                p.run >= 2
            };
            let atime_due = {
                let st = h.state.read();
                if st.deleted {
                    return Err(FsError::Stale(ino));
                }
                if is_dir_mode(st.inode.mode) {
                    return Err(FsError::IsDir(format!("inode {ino}")));
                }
                // relatime: update atime when it is older than mtime/ctime or a day old;
                // strictatime: at every read that reaches Mako; noatime: never.
                atime_due(atime, &st.inode, self.core.now())
            };
            // atime is updated before the reply when this node may write the inode anyway
            // (a stat right after the read sees it); otherwise by an operation of its
            // own once the read is answered (relatime: once per change of the file, so
            // the write token moves at most once per change).
            let mut later = false;
            if atime_due && !self.core.read_only.load(Ordering::Relaxed) {
                if self.need(ino, Need::Write).is_ok() {
                    let _tx = self.core.begin();
                    let mut st = h.state.write();
                    st.inode.atime = self.core.now();
                    st.mark_dirty();
                } else {
                    later = true;
                }
            }
            let out = {
                let st = h.state.read();
                if st.deleted {
                    return Err(FsError::Stale(ino));
                }
                // Queue read-ahead first, so prefetch overlaps this read's copy.
                if sequential {
                    self.schedule_prefetch(&h, offset.saturating_add(size as u64), st.inode.size);
                }
                file_io::read_with(&self.core, &st, offset, size as usize, sequential, &mut f)?
            };
            Ok((out, later, atime_due))
        })
        .map(|(out, later, touched)| {
            if later {
                if let Err(e) = self.touch_atime(ino, atime) {
                    // The read succeeded; a lost atime update is not the reader's error.
                    tracing::debug!("atime of inode {ino} not updated: {e}");
                }
            }
            if touched {
                // The kernel may keep the attributes it fetched before atime changed for
                // long (under this node's token).
                self.core.invalidate_kernel_attrs(ino);
            }
            out
        })
    }

    /// Update atime after a read, under the inode's write token (taken for it).
    fn touch_atime(&self, ino: u64, atime: AtimePolicy) -> FsResult<()> {
        crate::op::run(&self.core, || {
            self.core.check_writable()?;
            let h = self.handle(ino)?;
            self.need(ino, Need::Write)?;
            crate::metanode::prepare(&self.core, &h)?;
            let _tx = self.core.begin();
            let mut st = h.state.write();
            let now = self.core.now();
            if st.deleted || !atime_due(atime, &st.inode, now) {
                return Ok(());
            }
            st.inode.atime = now;
            st.mark_dirty();
            Ok(())
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
                            crate::workers::writebehind_block(core, &h, b)?;
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
            self.with_space_retry(|| self.write_logged(ino, offset, data, append))
        })
    }

    /// Run `op`; when it fails for lack of space while space freed earlier waits for a
    /// checkpoint, checkpoint and run it once more. That space is counted free by
    /// statfs, so an allocation that needs it must get it. `op` changes nothing when it
    /// fails with ENOSPC (or only what a second run completes), and runs with no
    /// transaction handle open on this thread (a checkpoint commits first).
    fn with_space_retry<T>(&self, op: impl Fn() -> FsResult<T>) -> FsResult<T> {
        match op() {
            Err(FsError::NoSpace(_)) if self.core.alloc.quarantined_subblocks() > 0 => {
                self.core.journal.quiesce(&self.core)?;
                op()
            }
            r => r,
        }
    }

    fn write_logged(&self, ino: u64, offset: u64, data: &[u8], append: bool) -> FsResult<usize> {
        // The inode token for writing before the inode is loaded: loading asks only to
        // cache it (`ro`), which takes a writer's `xw` away entirely (down to `ro`, then
        // nothing when this node asks `rw`), so nodes writing one file in turn passed
        // the inode and its metanode role back and forth at every write. Asked for at
        // once, `rw` lets the holder keep `rw` and stay the metanode
        // (docs/coherence.md, "Records of several nodes in one block").
        self.need(ino, if append { Need::Exclusive } else { Need::Write })?;
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
        crate::metanode::prepare(&self.core, &h)?;
        {
            let st = h.state.read();
            if st.shared.is_some() && !matches!(st.inode.content, InodeContent::Pointers(_)) {
                // Data in the inode is the metanode's: a shared writer of a small file
                // takes the inode exclusively (it leaves the inode once it grows).
                drop(st);
                self.need(ino, Need::Exclusive)?;
            }
        }
        if !append {
            // A write that grows the file past its old last block changes that block
            // too (`file_io::grow_prepare`: a fragment becomes a full block, the tail
            // past the old end is zeroed; inline data moves to block 0), so its data
            // token must cover it as well as the written range.
            let size = h.state.read().inode.size;
            let end = offset.saturating_add(data.len() as u64);
            if size > 0 && end > size && (size - 1) / bb < offset / bb {
                self.need_data(ino, TokenMode::Xw, block_range(size - 1, 1, bb))?;
            }
        }
        crate::metanode::defer_report(&self.core, &h)?;
        let _tx = self.core.begin();
        {
            let st = h.state.read();
            if is_dir_mode(st.inode.mode) {
                return Err(FsError::IsDir(format!("inode {ino}")));
            }
            attributes::check_write(&st.inode, offset, append)?;
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
            crate::metanode::prepare(&self.core, &h)?;
            // Dirty buffers under the range go to disk first so the disk is current
            // (nothing past the largest file can be dirty).
            let end = offset
                .saturating_add(size as u64)
                .min(file_io::FILE_BYTES_MAX);
            for b in offset / bb..end.div_ceil(bb) {
                crate::workers::writebehind_block(&self.core, &h, b)?;
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
            self.need(ino, Need::Cache)?;
            attributes::check_write(&h.state.read().inode, offset, false)?;
            // Across the largest file size only the buffered path below applies: it writes
            // what fits (or says EFBIG), then that part goes to disk.
            let fits = offset.saturating_add(data.len() as u64) <= file_io::FILE_BYTES_MAX;
            if fits && offset.is_multiple_of(512) && data.len().is_multiple_of(512) {
                let bb = self.core.block_bytes();
                self.need(ino, Need::Write)?;
                self.need_data(
                    ino,
                    TokenMode::Xw,
                    block_range(offset, data.len() as u64, bb),
                )?;
                crate::metanode::prepare(&self.core, &h)?;
                crate::metanode::defer_report(&self.core, &h)?;
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
            self.with_space_retry(|| {
                for b in offset / bb..(offset + n as u64).div_ceil(bb) {
                    file_io::flush_block(&self.core, &h, b)?;
                }
                Ok(())
            })?;
            crate::metanode::defer_report(&self.core, &h)?;
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
            self.with_space_retry(|| crate::workers::flush_inode(&self.core, &h))?;
            // A shared writer's pointers and size live in the metanode's log.
            crate::metanode::sync_metanode(&self.core, &h)?;
            let seq = self.core.journal.running_seq();
            self.core.journal.commit_upto(&self.core, seq)
        })
    }

    pub fn readdir(&self, ino: u64, after: u64, max: usize) -> FsResult<Vec<DirListing>> {
        crate::op::run(&self.core, || {
            let h = self.handle(ino)?;
            crate::metanode::prepare(&self.core, &h)?;
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
        let (unowned_free, unowned_empty) = c.alloc.unowned_space();
        StatFs {
            block_bytes: c.geo.block_bytes,
            fragment_bytes: c.geo.subblock_bytes(),
            blocks: c.alloc.total_subblocks(),
            // Space freed and waiting for a checkpoint counts as free: it is, as soon as
            // the log is checkpointed (an allocation that needs it forces that). What
            // data can never take (the metadata reserve) is not available.
            // Plus, in a cluster, the other nodes' space as this node last read it.
            blocks_free: c.alloc.user_free_subblocks() + unowned_free,
            blocks_available: c.alloc.user_available_subblocks() + unowned_empty,
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
        self.setxattr_as(ino, name, value, flags, false)
    }

    /// setxattr(2); `clear_sgid_for_acl` says the caller is neither in the file's group nor
    /// has CAP_FSETID, so setting an access ACL clears setgid, as `posix_acl_update_mode`
    /// does (the kernel says so with FUSE_SETXATTR_ACL_KILL_SGID).
    pub fn setxattr_as(
        &self,
        ino: u64,
        name: &[u8],
        value: &[u8],
        flags: i32,
        clear_sgid_for_acl: bool,
    ) -> FsResult<()> {
        self.core.check_writable()?;
        Self::check_xattr_name(name)?;
        if value.len() > XATTR_VALUE_BYTES_MAX {
            return Err(FsError::TooBig(format!(
                "xattr value of {} bytes (at most {XATTR_VALUE_BYTES_MAX})",
                value.len()
            )));
        }
        // A new xattr block needs space: what waits for a checkpoint counts.
        crate::op::run(&self.core, || {
            self.with_space_retry(|| {
                self.setxattr_once(ino, name, value, flags, clear_sgid_for_acl)
            })
        })
    }

    fn setxattr_once(
        &self,
        ino: u64,
        name: &[u8],
        value: &[u8],
        flags: i32,
        clear_sgid_for_acl: bool,
    ) -> FsResult<()> {
        let h = self.handle(ino)?;
        self.need(ino, Need::Exclusive)?;
        let _tx = self.begin_xattr_change(&h, value.len())?;
        let mut st = h.state.write();
        if st.deleted {
            return Err(FsError::Stale(ino));
        }
        attributes::check_changeable(&st.inode, "change extended attributes")?;
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
        // An access ACL sets the mode's permission bits (the mask, or the group entry when
        // there is no mask, gives the group bits), and clears setgid for a caller outside
        // the file's group.
        let mut acl_mode = None;
        if name == acl::ACCESS {
            let entries =
                acl::decode(value).ok_or_else(|| FsError::Invalid("malformed POSIX ACL".into()))?;
            let m = acl::mode_from(&entries).ok_or_else(|| {
                FsError::Invalid("POSIX ACL without an owner, group or other entry".into())
            })?;
            let mut mode = (st.inode.mode & !0o777) | m;
            if clear_sgid_for_acl {
                mode &= !S_ISGID;
            }
            if acl::is_minimal(&entries) {
                // A minimal ACL (owner, group and other only) says no more than the mode:
                // it is folded into the mode and not stored, as `posix_acl_update_mode`
                // does, so `ls -l` shows no `+` and getfacl shows the mode.
                match crate::xattr::remove(&self.core, &mut st, acl::ACCESS) {
                    Ok(()) | Err(FsError::NoAttr) => {}
                    Err(e) => return Err(e),
                }
                st.inode.mode = mode;
                st.inode.ctime = self.core.now();
                st.mark_dirty();
                return Ok(());
            }
            acl_mode = Some(mode);
        }
        crate::xattr::set(&self.core, &mut st, name, value, flags)?;
        if let Some(mode) = acl_mode {
            st.inode.mode = mode;
        }
        st.inode.ctime = self.core.now();
        st.mark_dirty();
        Ok(())
    }

    /// Open the transaction of a change to `h`'s attributes with room in the log for
    /// its images (a change of large values logs up to a few hundred KiB). If the
    /// commit that makes room fails, the mount is read-only and the change is refused.
    fn begin_xattr_change(
        &self,
        h: &Arc<InodeHandle>,
        value_bytes: usize,
    ) -> FsResult<crate::journal::Tx<'_>> {
        // The estimate reads the blocks under the inode's lock, released before the
        // transaction begins (a handle is opened before any inode lock is held).
        let bytes = crate::xattr::log_bytes_for(&self.core, &h.state.read(), value_bytes);
        let tx = self.core.journal.begin_for(&self.core, bytes);
        self.core.check_writable()?;
        Ok(tx)
    }

    pub fn getxattr(&self, ino: u64, name: &[u8]) -> FsResult<Vec<u8>> {
        crate::op::run(&self.core, || {
            let h = self.handle(ino)?;
            let st = h.state.read();
            crate::xattr::get(&self.core, &st, name)?.ok_or(FsError::NoAttr)
        })
    }

    /// The names of every attribute, each followed by a NUL. At most
    /// `XATTR_LIST_BYTES_MAX` (setxattr refuses names past it).
    pub fn listxattr(&self, ino: u64) -> FsResult<Vec<u8>> {
        crate::op::run(&self.core, || {
            let h = self.handle(ino)?;
            let st = h.state.read();
            crate::xattr::list(&self.core, &st)
        })
    }

    pub fn removexattr(&self, ino: u64, name: &[u8]) -> FsResult<()> {
        crate::op::run(&self.core, || self.removexattr_once(ino, name))
    }

    fn removexattr_once(&self, ino: u64, name: &[u8]) -> FsResult<()> {
        self.core.check_writable()?;
        let h = self.handle(ino)?;
        self.need(ino, Need::Exclusive)?;
        let _tx = self.begin_xattr_change(&h, 0)?;
        let mut st = h.state.write();
        if st.deleted {
            return Err(FsError::Stale(ino));
        }
        attributes::check_changeable(&st.inode, "change extended attributes")?;
        crate::xattr::remove(&self.core, &mut st, name)?;
        st.inode.ctime = self.core.now();
        st.mark_dirty();
        Ok(())
    }

    // ---- space management -------------------------------------------------------

    /// fallocate(2): mode 0, FALLOC_FL_KEEP_SIZE, PUNCH_HOLE|KEEP_SIZE, ZERO_RANGE.
    /// An allocation that does not fit fails with ENOSPC before it changes anything.
    pub fn fallocate(&self, ino: u64, offset: u64, len: u64, mode: i32) -> FsResult<()> {
        crate::op::run(&self.core, || {
            self.with_space_retry(|| self.fallocate_once(ino, offset, len, mode))
        })
    }

    fn fallocate_once(&self, ino: u64, offset: u64, len: u64, mode: i32) -> FsResult<()> {
        {
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
            // As `vfs_fallocate`: a range past the largest file size is EFBIG, whatever
            // the mode, and is refused before anything changes.
            if offset
                .checked_add(len)
                .is_none_or(|end| end > file_io::FILE_BYTES_MAX)
            {
                return Err(FsError::TooBig(format!(
                    "fallocate {offset}+{len} of inode {ino} (files end at {} bytes)",
                    file_io::FILE_BYTES_MAX
                )));
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
            attributes::check_not_immutable(&st.inode, "fallocate")?;
            if punch || zero {
                attributes::check_changeable(&st.inode, "punch a hole or zero a range")?;
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
        }
    }

    /// lseek SEEK_DATA (3) and SEEK_HOLE (4); other whence values are the kernel's.
    pub fn lseek(&self, ino: u64, offset: u64, whence: i32) -> FsResult<u64> {
        crate::op::run(&self.core, || {
            let h = self.handle(ino)?;
            self.need_data(ino, TokenMode::Ro, ByteRange::WHOLE)?;
            crate::metanode::prepare(&self.core, &h)?;
            if h.state.read().shared.is_some() {
                // Holes are in the metanode's block map: take the inode over (rare).
                self.need(ino, Need::Exclusive)?;
            }
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
