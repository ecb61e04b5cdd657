//! The mounted file system's shared state (`Core`), the inode cache, and reading and
//! writing inodes and metadata-file ranges through the NSD.

use crate::alloc_map::AllocMap;
use crate::coherence::{Need, Tokens};
use crate::env::NodeEnv;
use crate::error::{DamageSink, FsError, FsResult, IntegrityError};
use crate::inode_map::InodeMap;
use crate::journal::{Inbox, Journal, LogStart};
use crate::pagepool::PagePool;
use crate::stats::FsStats;
use mako_diag::{CountedMutex, CountedRwLock, LockClass};
use mako_disk::nsd::IoTag;
use mako_disk::{BufferType, Nsd};
use mako_format::descriptor::Descriptor;
use mako_format::dir_block::DirBlock;
use mako_format::error::Location;
use mako_format::geometry::Geometry;
use mako_format::indirect::IndirectBlock;
use mako_format::inode::{Inode, Timestamp};
use mako_format::DiskAddress;
use parking_lot::{Mutex, RwLock};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

/// Maps with a fixed hasher: iteration order depends only on the contents, so a
/// simulation seed replays exactly (std's hasher is seeded randomly per process).
pub type FastMap<K, V> =
    std::collections::HashMap<K, V, std::hash::BuildHasherDefault<rustc_hash::FxHasher>>;
pub type FastSet<K> =
    std::collections::HashSet<K, std::hash::BuildHasherDefault<rustc_hash::FxHasher>>;

/// Lock classes of `mako diag counters`: every lock of a kind counts under one name.
pub static INODE_LOCK: LockClass = LockClass::new("inode");
pub static INODE_READ_PATTERN_LOCK: LockClass = LockClass::new("inode.readPattern");
pub static INODE_INDIRECT_LOCK: LockClass = LockClass::new("inode.indirect");
pub static INODE_DIR_BLOCKS_LOCK: LockClass = LockClass::new("inode.dirBlocks");
pub static INODE_XATTR_LOCK: LockClass = LockClass::new("inode.xattr");
pub static INODE_CACHE_LOCK: LockClass = LockClass::new("inode.cache");
pub static INODE_LOOKUPS_LOCK: LockClass = LockClass::new("inode.lookups");
pub static STAT_CACHE_LOCK: LockClass = LockClass::new("statCache");
pub static TOKEN_RELEASE_LOCK: LockClass = LockClass::new("tokenRelease");
pub static DESCRIPTOR_LOCK: LockClass = LockClass::new("descriptor");
pub static CONFIG_LOCK: LockClass = LockClass::new("config");
pub static METAFILE_BLOCKS_LOCK: LockClass = LockClass::new("metafile.blocks");
pub static RENAME_LOCK: LockClass = LockClass::new("rename");
pub static WRITEBEHIND_QUEUE_LOCK: LockClass = LockClass::new("writebehind.queue");
pub static PREFETCH_QUEUE_LOCK: LockClass = LockClass::new("prefetch.queue");
pub static INODE_FILE_GROW_LOCK: LockClass = LockClass::new("inodeFile.grow");

/// Runtime parameters of a mounted file system (from the configuration).
#[derive(Debug, Clone)]
pub struct FsConfig {
    pub pagepool_bytes: u64,
    pub max_files_to_cache: usize,
    pub max_stat_cache: usize,
    /// 0 disables prefetch; 1..3 scale the read-ahead window.
    pub prefetch_aggressiveness_read: i32,
    pub prefetch_threads: usize,
    pub writebehind_threads: usize,
    /// Seconds between background syncs of dirty data and metadata.
    pub sync_interval_secs: u64,
    pub iohist_size: usize,
    pub avoid_dir_fragments: Option<bool>,
    pub dir_pre_split_levels: Option<u8>,
    /// Start the write-behind, prefetch and sync threads. Off only in deterministic
    /// tests (crash tests), which call `sync`/`fsync` themselves: without the threads
    /// dirty data reaches disk only through those calls.
    pub background_workers: bool,
}

impl Default for FsConfig {
    fn default() -> Self {
        FsConfig {
            pagepool_bytes: 256 << 20,
            max_files_to_cache: 4000,
            max_stat_cache: 20000,
            prefetch_aggressiveness_read: -1,
            prefetch_threads: 4,
            writebehind_threads: 2,
            sync_interval_secs: 5,
            iohist_size: 512,
            avoid_dir_fragments: None,
            dir_pre_split_levels: None,
            background_workers: true,
        }
    }
}

/// The host's time as a timestamp (mkfs; a mounted file system reads its `Clock`).
pub fn system_now() -> Timestamp {
    timestamp(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default(),
    )
}

pub fn timestamp(d: std::time::Duration) -> Timestamp {
    Timestamp {
        sec: d.as_secs() as i64,
        nsec: d.subsec_nanos(),
    }
}

/// A cached indirect block.
pub struct IndNode {
    pub block: IndirectBlock,
    pub da: DiskAddress,
    pub dirty: bool,
}

/// A cached directory block, kept as an ordered map with a running byte count per
/// page so that an insert or delete costs O(log entries) whatever the block's fill.
/// Changes mark the page they touch; the log records dirty pages only.
pub struct DirNode {
    pub id: mako_format::dir_block::DirBlockId,
    pub depth: u8,
    pub capacity_bytes: u32,
    pub entries: std::collections::BTreeMap<u64, mako_format::dir_block::DirEntry>,
    /// Bytes of entries per page.
    pub page_used: Vec<usize>,
    pub da: DiskAddress,
    /// Some page changed since the last commit.
    pub dirty: bool,
    /// Which pages changed since the last commit (a block has at most 64 pages).
    pub dirty_pages: u64,
}

impl DirNode {
    pub fn from_block(block: DirBlock, da: DiskAddress, dirty: bool) -> DirNode {
        let page_used = block.page_used();
        let mut n = DirNode {
            id: block.id,
            depth: block.depth,
            capacity_bytes: block.capacity_bytes,
            entries: block.entries.into_iter().map(|e| (e.cookie, e)).collect(),
            page_used,
            da,
            dirty: false,
            dirty_pages: 0,
        };
        if dirty {
            n.mark_all_dirty();
        }
        n
    }
    pub fn to_block(&self) -> DirBlock {
        DirBlock {
            id: self.id,
            depth: self.depth,
            capacity_bytes: self.capacity_bytes,
            entries: self.entries.values().cloned().collect(),
        }
    }
    pub fn pages(&self) -> u32 {
        mako_format::dir_block::pages(self.capacity_bytes)
    }
    pub fn page_of(&self, cookie: u64) -> usize {
        mako_format::dir_block::page_of(self.id.index, self.depth, self.capacity_bytes, cookie)
            as usize
    }
    /// Room for an entry of `extra` bytes with this cookie (in the page it belongs in).
    pub fn has_room(&self, cookie: u64, extra: usize) -> bool {
        self.page_used[self.page_of(cookie)] + extra
            <= mako_format::dir_block::page_room(self.capacity_bytes)
    }
    pub fn insert(&mut self, e: mako_format::dir_block::DirEntry) {
        let p = self.page_of(e.cookie);
        self.page_used[p] += e.encoded_len();
        self.dirty_pages |= 1 << p;
        self.entries.insert(e.cookie, e);
        self.dirty = true;
    }
    pub fn remove(&mut self, cookie: u64) -> Option<mako_format::dir_block::DirEntry> {
        let e = self.entries.remove(&cookie)?;
        let p = self.page_of(cookie);
        self.page_used[p] -= e.encoded_len();
        self.dirty_pages |= 1 << p;
        self.dirty = true;
        Some(e)
    }
    /// Take the pages this node has not changed since its last commit from `fresh` (the
    /// same block as read from disk now): another node may have changed them under
    /// name tokens this node did not hold.
    pub fn refresh_clean_pages(&mut self, fresh: DirBlock) {
        if fresh.depth != self.depth || fresh.capacity_bytes != self.capacity_bytes {
            // Only an exclusive holder changes a block's shape, and it revoked this
            // node's tokens first: a clean block is simply replaced.
            if self.dirty_pages == 0 {
                *self = DirNode::from_block(fresh, self.da, false);
            }
            return;
        }
        let mut fresh_entries: std::collections::BTreeMap<u64, mako_format::dir_block::DirEntry> =
            fresh.entries.into_iter().map(|e| (e.cookie, e)).collect();
        for p in 0..self.pages() {
            if self.dirty_pages >> p & 1 == 1 {
                continue;
            }
            let (lo, hi) = mako_format::dir_block::page_cookie_range(
                self.id.index,
                self.depth,
                self.capacity_bytes,
                p,
            );
            let old: Vec<u64> = self.entries.range(lo..=hi).map(|(c, _)| *c).collect();
            for c in old {
                self.entries.remove(&c);
            }
            let mut used = 0usize;
            let new: Vec<u64> = fresh_entries.range(lo..=hi).map(|(c, _)| *c).collect();
            for c in new {
                if let Some(e) = fresh_entries.remove(&c) {
                    used += e.encoded_len();
                    self.entries.insert(c, e);
                }
            }
            self.page_used[p as usize] = used;
        }
    }

    /// The entry with this cookie was changed in place (rename over a name).
    pub fn touch(&mut self, cookie: u64) {
        self.dirty_pages |= 1 << self.page_of(cookie);
        self.dirty = true;
    }
    /// The block's shape changed (new, split, moved, resized): every page is new.
    pub fn reshape(&mut self) {
        let mut used = vec![0usize; self.pages() as usize];
        for e in self.entries.values() {
            used[mako_format::dir_block::page_of(
                self.id.index,
                self.depth,
                self.capacity_bytes,
                e.cookie,
            ) as usize] += e.encoded_len();
        }
        self.page_used = used;
        self.mark_all_dirty();
    }
    pub fn mark_all_dirty(&mut self) {
        let n = self.pages();
        self.dirty_pages = if n >= 64 { u64::MAX } else { (1u64 << n) - 1 };
        self.dirty = true;
    }
    /// Encode page `p`.
    pub fn encode_page(&self, p: u32) -> Vec<u8> {
        let (lo, hi) = mako_format::dir_block::page_cookie_range(
            self.id.index,
            self.depth,
            self.capacity_bytes,
            p,
        );
        mako_format::dir_block::encode_page(
            self.id,
            self.depth,
            self.capacity_bytes,
            p,
            self.entries.range(lo..=hi).map(|(_, e)| e),
        )
    }
    pub fn page_bytes(&self) -> u32 {
        mako_format::dir_block::page_bytes(self.capacity_bytes)
    }
}

/// Mutable state of a cached inode, behind the handle's RwLock.
pub struct InodeState {
    pub inode: Inode,
    /// Changed since the last log commit. Set only through `mark_dirty`, which files
    /// the inode in the running transaction; cleared by the commit's snapshot.
    pub dirty: bool,
    inbox: Arc<Inbox>,
    /// Indirect blocks by (level, index). Behind a mutex so lookups work under a read lock.
    pub indirect: CountedMutex<FastMap<(u8, u64), IndNode>>,
    /// Directory blocks by logical index.
    pub dir_blocks: CountedMutex<FastMap<u64, DirNode>>,
    /// `TokenClient::grant_clock` when the cached directory blocks were last read again
    /// (`directory::refresh_cached`): a grant of the directory's names (or of its inode
    /// in `xw`) after it means their clean pages may be stale (`directory::cover`).
    pub names_seen: AtomicU64,
    /// Extended attributes outside the inode with their xattr blocks (`xattr`); `None`
    /// until first used.
    pub xattr: CountedMutex<Option<crate::xattr::Overflow>>,
    /// The inode was freed; the handle is stale.
    pub deleted: bool,
    /// The inode's token left this node while the handle stayed (the file is open):
    /// the next use reads the inode again from disk (`Core::get`).
    pub stale: bool,
    /// This node is the file's metanode: it owns the inode and its indirect blocks
    /// (it holds `xw`, or `rw` and the manager made it metanode).
    pub metanode: bool,
    /// This node writes the file beside others and another node is the metanode: the
    /// inode here is a view, changes go to the metanode (`metanode.rs`).
    pub shared: Option<Box<crate::metanode::Shared>>,
}

impl InodeState {
    /// Change the link count by `delta` (a shared writer's change goes to the metanode).
    pub fn add_nlink(&mut self, delta: i64) {
        self.inode.nlink = (self.inode.nlink as i64 + delta).max(0) as u32;
        if let Some(s) = self.shared.as_mut() {
            s.nlink_delta += delta;
        }
    }

    /// Change the directory's entry count by `delta` (as `add_nlink`).
    pub fn add_entries(&mut self, delta: i64) {
        self.inode.entries = (self.inode.entries as i64 + delta).max(0) as u64;
        if let Some(s) = self.shared.as_mut() {
            s.entries_delta += delta;
        }
    }

    /// Record that the inode (or one of its indirect or directory blocks) changed: the
    /// next log commit writes it. Call with a transaction handle open.
    pub fn mark_dirty(&mut self) {
        if self.shared.is_some() {
            // A shared writer's inode is a view: its changes go to the metanode.
            return;
        }
        crate::journal::note_change();
        if !self.dirty {
            self.dirty = true;
            self.inbox.file_inode(self.inode.ino);
        }
    }
    /// Account images of `bytes` (an indirect or directory block that just turned
    /// dirty) to the running transaction, and mark the inode dirty. A shared writer of
    /// a directory logs the directory pages it changed under its name tokens (its own
    /// work), never the inode (the metanode's).
    pub fn mark_unit_dirty(&mut self, bytes: u64) {
        if self.shared.is_some() {
            crate::journal::note_change();
            self.inbox.note(bytes);
            if !self.dirty {
                self.dirty = true;
                self.inbox.file_inode(self.inode.ino);
            }
            return;
        }
        self.inbox.note(bytes);
        self.mark_dirty();
    }
}

/// Sequential-read detector and prefetch window of one inode.
#[derive(Default)]
pub struct ReadPattern {
    pub next_offset: u64,
    pub run: u32,
    pub prefetched_upto: u64,
}

pub struct InodeHandle {
    pub ino: u64,
    pub state: CountedRwLock<InodeState>,
    pub pattern: CountedMutex<ReadPattern>,
    pub opens: AtomicU32,
    pub last_use: AtomicU64,
}

impl InodeHandle {
    pub fn new(inode: Inode, inbox: &Arc<Inbox>) -> Arc<InodeHandle> {
        Arc::new(InodeHandle {
            ino: inode.ino,
            state: CountedRwLock::new(
                &INODE_LOCK,
                InodeState {
                    inode,
                    dirty: false,
                    inbox: inbox.clone(),
                    indirect: CountedMutex::new(&INODE_INDIRECT_LOCK, FastMap::default()),
                    dir_blocks: CountedMutex::new(&INODE_DIR_BLOCKS_LOCK, FastMap::default()),
                    names_seen: AtomicU64::new(0),
                    xattr: CountedMutex::new(&INODE_XATTR_LOCK, None),
                    deleted: false,
                    stale: false,
                    metanode: false,
                    shared: None,
                },
            ),
            pattern: CountedMutex::new(&INODE_READ_PATTERN_LOCK, ReadPattern::default()),
            opens: AtomicU32::new(0),
            last_use: AtomicU64::new(0),
        })
    }
}

/// An inode number set aside for one operation (`Core::reserve_inode`).
pub struct InodeReservation {
    core: Arc<Core>,
    ino: u64,
    used: bool,
}

impl InodeReservation {
    pub fn ino(&self) -> u64 {
        self.ino
    }
}

impl Drop for InodeReservation {
    fn drop(&mut self) {
        if !self.used {
            self.core.imap.unreserve(self.ino);
        }
    }
}

/// Called when cached kernel state must be dropped (token loss, truncate by another
/// node). The FUSE adapter implements it with invalidation notifications.
pub trait KernelInvalidator: Send + Sync {
    fn invalidate_inode(&self, ino: u64, offset: i64, len: i64);
    fn invalidate_entry(&self, parent: u64, name: &[u8]);
    /// Every name of directory `dir` the kernel may have cached.
    fn invalidate_names(&self, dir: u64);
}

/// See `Core::mount_fence`.
pub type MountFence = Arc<dyn Fn() -> Result<(), String> + Send + Sync>;

/// See `Core::answer_hook`.
pub type AnswerHook = Arc<dyn Fn() + Send + Sync>;

/// Most bytes of inode-file blocks one growth makes ahead for other nodes' first
/// segments (`Core::inode_file_growth`), 1,024 nodes' first blocks of 64 KiB: zeroed
/// by the growing operation, a rare pause of that many writes (the seeds' inode
/// expansion) instead of a growth per node.
pub const INODE_FILE_AHEAD_BYTES_MAX: u64 = 64 << 20;

pub struct Core {
    pub nsd: Arc<dyn Nsd>,
    pub desc: CountedMutex<Descriptor>,
    pub geo: Geometry,
    pub cfg: CountedRwLock<FsConfig>,
    pub alloc: AllocMap,
    pub alloc_slot_bytes: usize,
    pub imap: InodeMap,
    pub inodes: CountedMutex<FastMap<u64, Arc<InodeHandle>>>,
    /// Kernel lookup references (FUSE nlookup) per inode.
    pub lookups: CountedMutex<FastMap<u64, u64>>,
    /// Disk addresses of the blocks of each metadata file, by block index.
    pub metafile_blocks: CountedRwLock<FastMap<u64, crate::meta_blocks::MetaBlocks>>,
    pub pool: PagePool,
    /// Serialises renames that move directories (loop checks need a stable tree).
    pub rename_lock: CountedMutex<()>,
    /// This node's tokens on the file system (docs/coherence.md).
    pub tokens: Tokens,
    /// Identity, clock and transport of this node.
    pub env: NodeEnv,
    pub invalidator: RwLock<Option<Arc<dyn KernelInvalidator>>>,
    pub stats: FsStats,
    /// Shared with the journal, which turns the mount read-only itself when an
    /// operation fails on damage after it changed something (see `journal`).
    pub read_only: Arc<ReadOnly>,
    /// Where integrity failures are reported (`Core::integrity`).
    pub damage: DamageSink,
    pub shutting_down: AtomicBool,
    /// The mount's fence, when the node runs under a lease (makod's lease, the
    /// simulation's lease model): Err once this node may no longer act for the cluster
    /// (its lease ran out, it was expelled, it rejoined since the mount). Every
    /// operation checks it when it starts and before it returns (`op::run`): an
    /// expelled node's mount answers nothing from its cache, whose tokens are gone.
    pub mount_fence: std::sync::OnceLock<MountFence>,
    /// TEST ONLY (the simulation's checker): called on the operation's thread when an
    /// operation's answer is fixed, its final fence check passed with its holds still
    /// kept (`op::run`). What it answers was read or changed before that check, while
    /// the node still held its lease: a pause between this moment and the caller
    /// seeing the answer does not make the answer stale.
    pub answer_hook: std::sync::OnceLock<AnswerHook>,
    /// TEST ONLY: skip an operation's final fence check (`op::run`), so a node paused
    /// in the middle of an operation answers from what it read before its lease ran
    /// out (the checker's test: it must catch it).
    pub test_no_answer_fence: AtomicBool,
    /// TEST ONLY: called in `metanode::settle` between its look at the handle and the
    /// write lock under which it begins a shared writer's view, with no lock held (a
    /// test serves a request there: `two_nodes.rs`,
    /// `a_request_served_while_a_shared_view_begins`).
    pub test_settle_gap: std::sync::OnceLock<AnswerHook>,
    /// The file system's panic on this node (`FsPanic`): set when a write of its
    /// recovery log (or of its metadata in place) fails.
    pub fs_panic: Arc<FsPanic>,
    pub use_tick: AtomicU64,
    pub generation: AtomicU32,
    pub node: u32,
    /// Attribute cache of inodes evicted past `maxFilesToCache` (`maxStatCache`), each
    /// entry covered by the inode's token.
    pub stat_cache: CountedMutex<crate::stat_cache::StatCache>,
    /// Inodes whose tokens this node may give back once nothing uses them (freed or
    /// pushed out of every cache); `workers::release_tokens` does it outside operations.
    pub token_release: CountedMutex<Vec<u64>>,
    /// Write-behind and prefetch work.
    pub flushq: CountedMutex<std::collections::VecDeque<(u64, u64)>>,
    pub prefetchq: CountedMutex<std::collections::VecDeque<(u64, u64)>>,
    pub prefetch_cv: mako_diag::Condvar,
    /// Serialises growth of the inode file.
    pub inode_file_grow: CountedMutex<()>,
    /// The recovery log: transactions, commits, checkpoints.
    pub journal: Journal,
    /// Inode-file chunks missed recently (a set and its insertion order).
    chunk_misses: Mutex<(FastSet<u64>, std::collections::VecDeque<u64>)>,
    /// TEST ONLY: a deliberately broken revoke (`cache_flush::RevokeFault`), so that
    /// the cluster simulation can prove its checker catches one. 0 (none) unless a
    /// test stores another value; read once per revoke.
    pub revoke_fault: std::sync::atomic::AtomicU8,
    /// TEST ONLY: a shared writer commits its log for a report and then sends
    /// nothing, keeping the entry and link counts it would have sent — what a node
    /// that dies between its log commit and the metanode's answer leaves (the
    /// simulation's `a_crash_between_a_page_commit_and_its_count_is_recounted`).
    pub counts_unsent: AtomicBool,
    /// Keys of this node's resent requests, and its batches of frees in other nodes'
    /// space (`writer_seq`, docs/coherence.md section 1).
    pub writer: crate::writer_seq::Writer,
    /// Keys of other nodes' requests this node applied (`writer_seq`).
    pub applied: crate::writer_seq::Applied,
    /// `directory::CROWD_NODES` of this node: a test may store another threshold (the
    /// simulation's `SeedConfig::crowd_nodes`).
    pub crowd_nodes: AtomicU32,
}

/// The mount's read-only state: once set (damage, a failed commit), nothing more is
/// written, and the reason is what every refused change reports.
#[derive(Default)]
pub struct ReadOnly {
    on: AtomicBool,
    reason: Mutex<String>,
}

impl ReadOnly {
    pub fn load(&self, order: Ordering) -> bool {
        self.on.load(order)
    }
    pub fn reason(&self) -> String {
        self.reason.lock().clone()
    }
    /// Turn read-only (the first reason is kept and logged).
    pub fn set(&self, why: &str) {
        if !self.on.swap(true, Ordering::SeqCst) {
            *self.reason.lock() = why.to_string();
            tracing::error!("file system turned read-only: {why}; unmount and run `mako fsck`");
        }
    }
}

/// What the node does once its file system panicked (`FsPanic::set_hook`): makod and
/// the simulation stop renewing the node's lease, so that the cluster manager expels
/// it and a survivor recovers its log. Called once, with the reason.
pub type PanicHook = Arc<dyn Fn(&str) + Send + Sync>;

/// A file system panic on this node (Storage Scale's term): the node cannot write its
/// recovery log (or its metadata in place, which the log's tail needs), so it can no
/// longer make any change durable nor give up a token cleanly. The file system is
/// then unmounted on this node in all but name: every operation returns EIO
/// (`Core::check_fence`), no I/O reaches the disks any more (`PanicFence` under the
/// mount's disks), and the node is treated as failed: the hook (makod, the
/// simulation) has the cluster expel it, and a survivor replays its log and releases
/// its tokens (`recovery::recover_failed_node`), as after a crash. The process goes
/// on (other file systems, the cluster's own work). A data write error alone is not a
/// panic: the operation that needed it gets EIO (docs/cluster.md "Disk write errors").
#[derive(Default)]
pub struct FsPanic {
    on: AtomicBool,
    reason: Mutex<String>,
    hook: std::sync::OnceLock<PanicHook>,
    /// TEST ONLY (the simulation's checker test): a failed log write only turns the
    /// mount read-only, as before panics existed; the node keeps its tokens and stays
    /// in the cluster.
    pub test_off: AtomicBool,
}

impl FsPanic {
    pub fn is_set(&self) -> bool {
        self.on.load(Ordering::SeqCst)
    }
    pub fn reason(&self) -> String {
        self.reason.lock().clone()
    }
    /// What runs once the file system panics (set once, at mount).
    pub fn set_hook(&self, hook: PanicHook) {
        let _ = self.hook.set(hook);
    }
    /// Panic (the first reason is kept, logged and handed to the hook). False when the
    /// panic is turned off (`test_off`).
    pub fn panic(&self, node: u32, why: &str) -> bool {
        if self.test_off.load(Ordering::Relaxed) {
            return false;
        }
        if !self.on.swap(true, Ordering::SeqCst) {
            *self.reason.lock() = why.to_string();
            tracing::error!(
                "file system panic on node {node}: {why}; the file system is unmounted on this node \
                 (every operation returns EIO, no more I/O reaches its disks) and this node is \
                 treated as failed: the cluster manager expels it and a survivor replays its \
                 recovery log and releases its tokens; mount it again once the disks are \
                 reachable"
            );
            if let Some(h) = self.hook.get() {
                h(why);
            }
        }
        true
    }
}

/// A disk of a mount behind the file system's panic (`FsPanic`): once it panicked,
/// every read, write and sync is refused, so nothing this node still had under way
/// (write-behind, a checkpoint, a revoke's flush) reaches the disk after a survivor
/// may have started replaying its log.
pub struct PanicFence {
    pub inner: Arc<dyn mako_disk::Disk>,
    pub panic: Arc<FsPanic>,
}

impl PanicFence {
    fn check(&self) -> Result<(), mako_disk::DiskError> {
        if self.panic.is_set() {
            return Err(mako_disk::DiskError::Fenced {
                disk: self.inner.name().to_string(),
                by: "this node's file system panic".into(),
                reason: self.panic.reason(),
            });
        }
        Ok(())
    }
}

impl mako_disk::Disk for PanicFence {
    fn name(&self) -> &str {
        self.inner.name()
    }
    fn size_bytes(&self) -> u64 {
        self.inner.size_bytes()
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<(), mako_disk::DiskError> {
        self.check()?;
        self.inner.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> Result<(), mako_disk::DiskError> {
        self.check()?;
        self.inner.write_at(buf, offset)
    }
    fn sync(&self) -> Result<(), mako_disk::DiskError> {
        self.check()?;
        self.inner.sync()
    }
}

/// Pagepool key under which chunks of the inode file are cached (never a real inode).
pub const INODE_CACHE_KEY: u64 = u64::MAX - 1;
/// Largest chunk of the inode file cached as one buffer.
pub const INODE_CHUNK_BYTES: u64 = 256 * 1024;

/// Inode-file chunks whose recent miss is remembered (see `read_inode`).
pub const CHUNK_MISSES_REMEMBERED: usize = 64;

/// Prefetch requests queued at most (older requests are dropped beyond this).
pub const PREFETCH_QUEUE_MAX: usize = 1024;

impl Core {
    pub fn new(
        nsd: Arc<dyn Nsd>,
        desc: Descriptor,
        alloc: AllocMap,
        imap: InodeMap,
        cfg: FsConfig,
        env: NodeEnv,
        tokens: Tokens,
        log: LogStart,
    ) -> Core {
        let node = env.node;
        let max_stat_cache = cfg.max_stat_cache;
        let geo = desc.geometry;
        let log_ino = mako_format::log_table::log_ino(node);
        // Integrity failures found by the maps and the token seam are reported here.
        let damage = DamageSink::default();
        alloc.attach_damage(damage.clone());
        imap.attach_damage(damage.clone());
        let read_only = damage.read_only.clone();
        let stats = FsStats {
            corruptions: damage.corruptions.clone(),
            ..FsStats::default()
        };
        let journal = Journal::new(
            node,
            desc.fs_uuid,
            log_ino,
            desc.log_bytes,
            geo.inode_bytes,
            log,
            read_only.clone(),
        );
        let alloc_slot_bytes = crate::alloc_map::segment_slot_bytes(&desc);
        let pool = PagePool::new(cfg.pagepool_bytes);
        let seed = env.clock.wall().as_secs() as u32;
        let incarnation = crate::writer_seq::draw_incarnation(env.clock.wall());
        Core {
            nsd,
            desc: CountedMutex::new(&DESCRIPTOR_LOCK, desc),
            geo,
            cfg: CountedRwLock::new(&CONFIG_LOCK, cfg),
            alloc,
            alloc_slot_bytes,
            imap,
            inodes: CountedMutex::new(&INODE_CACHE_LOCK, FastMap::default()),
            lookups: CountedMutex::new(&INODE_LOOKUPS_LOCK, FastMap::default()),
            metafile_blocks: CountedRwLock::new(&METAFILE_BLOCKS_LOCK, FastMap::default()),
            pool,
            rename_lock: CountedMutex::new(&RENAME_LOCK, ()),
            tokens,
            env,
            invalidator: RwLock::new(None),
            stats,
            read_only,
            damage,
            shutting_down: AtomicBool::new(false),
            use_tick: AtomicU64::new(0),
            mount_fence: std::sync::OnceLock::new(),
            answer_hook: std::sync::OnceLock::new(),
            test_no_answer_fence: AtomicBool::new(false),
            test_settle_gap: std::sync::OnceLock::new(),
            fs_panic: Arc::new(FsPanic::default()),
            generation: AtomicU32::new(seed),
            node,
            stat_cache: CountedMutex::new(
                &STAT_CACHE_LOCK,
                crate::stat_cache::StatCache::new(max_stat_cache),
            ),
            token_release: CountedMutex::new(&TOKEN_RELEASE_LOCK, Vec::new()),
            flushq: CountedMutex::new(&WRITEBEHIND_QUEUE_LOCK, std::collections::VecDeque::new()),
            prefetchq: CountedMutex::new(&PREFETCH_QUEUE_LOCK, std::collections::VecDeque::new()),
            prefetch_cv: mako_diag::Condvar::new(),
            inode_file_grow: CountedMutex::new(&INODE_FILE_GROW_LOCK, ()),
            journal,
            chunk_misses: Mutex::new(Default::default()),
            revoke_fault: std::sync::atomic::AtomicU8::new(0),
            counts_unsent: AtomicBool::new(false),
            writer: crate::writer_seq::Writer::new(node, incarnation),
            applied: Default::default(),
            crowd_nodes: AtomicU32::new(crate::directory::CROWD_NODES),
        }
    }

    /// The time for timestamps, from this node's clock.
    pub fn now(&self) -> Timestamp {
        timestamp(self.env.clock.wall())
    }

    /// Report an integrity failure (logged, counted, the mount turned read-only) and
    /// return its error (see `error::DamageSink`).
    pub fn integrity(&self, e: IntegrityError) -> FsError {
        self.damage.integrity(e)
    }

    /// Open a log transaction handle (see `journal`): before any inode lock.
    pub fn begin(&self) -> crate::journal::Tx<'_> {
        self.journal.begin(self)
    }

    /// A handle for an inode read from disk or just created.
    pub fn new_handle(&self, inode: Inode) -> Arc<InodeHandle> {
        InodeHandle::new(inode, self.journal.inbox())
    }

    pub fn queue_flush(&self, ino: u64, block: u64) {
        self.flushq.lock().push_back((ino, block));
        self.pool.wake_flushers();
    }

    pub fn queue_prefetch(&self, ino: u64, block: u64) {
        let mut q = self.prefetchq.lock();
        if q.len() >= PREFETCH_QUEUE_MAX {
            q.pop_front();
        }
        q.push_back((ino, block));
        self.prefetch_cv.notify_one();
    }

    /// Set aside a free inode number for an operation (see `InodeMap::reserve`); the
    /// reservation is given back when the guard drops unless `use_it` was called.
    pub fn reserve_inode(self: &Arc<Self>) -> FsResult<InodeReservation> {
        let ino = loop {
            match self.imap.reserve() {
                // This node's segments are full: take another one nobody owns.
                Err(FsError::NoSpace(_)) if crate::ownership::acquire_segment(self)? => {}
                r => break r?,
            }
        };
        Ok(InodeReservation {
            core: self.clone(),
            ino,
            used: false,
        })
    }

    /// True if the inode file already has a slot for `ino` (no growth needed): the
    /// block that holds it is allocated (the inode file is sparse).
    pub fn inode_slot_exists(&self, ino: u64) -> bool {
        let inode_file = self.metadata_inodes().inode_file;
        let block = ino * self.inode_bytes() as u64 / self.block_bytes();
        self.metafile_blocks
            .read()
            .get(&inode_file)
            .and_then(|v| v.get(block as usize))
            .is_some_and(|d| !d.is_null())
    }

    /// Take a reserved inode number into use, growing the inode file when the number
    /// lies past its end. Part of the operation's transaction.
    pub fn allocate_reserved_inode(&self, r: &mut InodeReservation) -> FsResult<u64> {
        self.ensure_inode_slot(r.ino)?;
        self.ensure_imap_block(r.ino)?;
        self.imap.use_reserved(r.ino)?;
        r.used = true;
        Ok(r.ino)
    }

    /// Give a number taken by `allocate_reserved_inode` back to its reservation: the
    /// operation failed or restarts before it committed.
    pub fn unallocate_reserved_inode(&self, r: &mut InodeReservation) -> FsResult<()> {
        if r.used {
            self.imap.unuse_reserved(r.ino)?;
            r.used = false;
        }
        Ok(())
    }

    /// Allocate the inode-file block that holds `ino` if it is a hole, and with it the
    /// first blocks of the next nodes' first segments (`inode_file_growth`). The inode
    /// file is sparse, so a node whose inode-map segments lie far out (each node has
    /// its own) costs its blocks, not every block before them.
    fn ensure_inode_slot(&self, ino: u64) -> FsResult<()> {
        if self.inode_slot_exists(ino) {
            return Ok(());
        }
        // Under the inode file's exclusive token (the caller holds it): reloaded first if
        // another node grew it since this node last did.
        let h = self.get(self.metadata_inodes().inode_file)?;
        let _g = self.inode_file_grow.lock();
        if self.inode_slot_exists(ino) {
            return Ok(());
        }
        let bb = self.block_bytes();
        let isz = self.inode_bytes() as u64;
        self.grow_inode_file(&h, ino * isz / bb)?;
        // The same exclusive token makes the blocks other nodes' first creates will
        // need: best effort, a block that cannot be made now is made at its first use.
        let per = self.desc.lock().inodes_per_segment as u64;
        let mut budget = self.inode_file_ahead_blocks();
        for s in self.inode_file_growth(ino) {
            let first = s * per;
            if self.inode_slot_exists(first) {
                continue;
            }
            if budget == 0 {
                break;
            }
            budget -= 1;
            if let Err(e) = self.grow_inode_file(&h, first * isz / bb) {
                tracing::debug!("inode file: segment {s} not made ahead: {e}");
                break;
            }
            self.stats
                .inode_file_blocks_ahead
                .fetch_add(1, Ordering::Relaxed);
        }
        Ok(())
    }

    /// Segments whose first inode-file block a growth for `ino` makes ahead, in the
    /// order it makes them. Node `k` starts with segment `k` (`ownership`), and mkfs
    /// pre-sizes the inode file for the first nodes' segments only as far as
    /// `INODE_FILE_PRESIZE_MAX` and the space allow; past that every node's first
    /// create would grow the file, and each growth takes the inode file's token in `xw`
    /// from every node that reads inodes: O(nodes) messages per node (512 nodes
    /// creating one file each in one directory: 103 requests for it per create). So a
    /// growth for a node's first segment also makes the first blocks of every other
    /// node's first segment that is still a hole, the following nodes first, as far as
    /// `inode_file_ahead_blocks` allows: like the inode expansion of the seeds, a few
    /// growths instead of one per node.
    fn inode_file_growth(&self, ino: u64) -> impl Iterator<Item = u64> {
        let s = self.imap.segment_of(ino) as u64;
        let nodes = (self.metadata_inodes().log_count as u64).min(self.imap.segments() as u64);
        // A segment taken when a node's own ran out (`s >= nodes`): nobody else
        // starts there, nothing is made ahead.
        let (after, before) = if s < nodes {
            (s + 1..nodes, 0..s)
        } else {
            (0..0, 0..0)
        };
        after.chain(before)
    }

    /// Blocks one growth may make ahead (`inode_file_growth`): at most
    /// `INODE_FILE_AHEAD_BYTES_MAX`, and a 64th of the file system, so that a small one
    /// does not give its space to nodes that may never exist.
    fn inode_file_ahead_blocks(&self) -> u64 {
        let total = self.alloc.total_subblocks() * self.geo.subblock_bytes() as u64;
        INODE_FILE_AHEAD_BYTES_MAX.min(total / 64) / self.block_bytes()
    }

    /// Allocate inode-file block `b` (a hole), zeroed, and map it. Under the inode
    /// file's exclusive token and `inode_file_grow`.
    fn grow_inode_file(&self, h: &InodeHandle, b: u64) -> FsResult<()> {
        let inode_file = h.ino;
        let spb = self.geo.subblocks_per_block;
        let da = self
            .alloc
            .allocate(crate::alloc_map::AllocKind::Metadata, spb, inode_file, b)?;
        // Fresh inode-file blocks are zeroed so an unused slot reads as blank.
        let zeros = vec![0u8; self.block_bytes() as usize];
        self.nsd.write(
            da,
            &zeros,
            IoTag {
                buffer_type: BufferType::Inode,
                ino: inode_file,
            },
        )?;
        // Written like data: on disk before the log names the block.
        self.journal.note_ordered_write();
        let mut st = h.state.write();
        if let Err(e) = crate::block_map::set(self, &mut st, b, da) {
            // Mapping the block can need an indirect block this node has no room
            // for (its regions are full: the operation takes another region and
            // runs again). The block is the running transaction's own allocation,
            // so freeing it undoes it exactly; kept, it would leak.
            drop(st);
            self.alloc.free(da, spb, inode_file)?;
            return Err(e);
        }
        st.inode.size = st.inode.size.max((b + 1) * self.block_bytes());
        st.inode.subblocks += spb as u64;
        st.mark_dirty();
        let mut map = self.metafile_blocks.write();
        map.entry(inode_file).or_default().set(b, da);
        Ok(())
    }

    /// True if the inode map file's block that holds `ino`'s segment exists (the file
    /// is sparse: a hole holds blank segments, and the block is made at the segment's
    /// first use).
    pub fn imap_block_exists(&self, ino: u64) -> bool {
        let imap_file = self.metadata_inodes().inode_alloc_map;
        let block = self.imap.block_of(self.imap.segment_of(ino) as u64);
        self.metafile_blocks
            .read()
            .get(&imap_file)
            .is_some_and(|v| v.get(block as usize).is_some())
    }

    /// Make the inode map file's block that holds `ino`'s segment if it is a hole: one
    /// block, written whole (every slot a valid blank segment) before the file's block map names it, like a fresh inode-file
    /// block (`ensure_inode_slot`). Under the map file's exclusive token (the caller
    /// holds it: `need_new_inode`).
    fn ensure_imap_block(&self, ino: u64) -> FsResult<()> {
        if self.imap_block_exists(ino) {
            return Ok(());
        }
        let imap_file = self.metadata_inodes().inode_alloc_map;
        let h = self.get(imap_file)?;
        let _g = self.inode_file_grow.lock();
        if self.imap_block_exists(ino) {
            return Ok(());
        }
        let b = self.imap.block_of(self.imap.segment_of(ino) as u64);
        let spb = self.geo.subblocks_per_block;
        let da = self
            .alloc
            .allocate(crate::alloc_map::AllocKind::Metadata, spb, imap_file, b)?;
        let bb = self.block_bytes();
        let mut bytes = vec![0u8; bb as usize];
        for s in self.imap.segments_in_block(b) {
            let off = (self.imap.slot_offset(s) - b * bb) as usize;
            // Blank: a segment in a hole has no committed change (a commit needs its
            // block); what the running transaction changed is logged at its commit.
            let enc = self.imap.blank(s).encode();
            bytes[off..off + enc.len()].copy_from_slice(&enc);
        }
        self.nsd.write(
            da,
            &bytes,
            IoTag {
                buffer_type: BufferType::InodeMap,
                ino: imap_file,
            },
        )?;
        // Written like data: on disk before the log names the block.
        self.journal.note_ordered_write();
        let mut st = h.state.write();
        if let Err(e) = crate::block_map::set(self, &mut st, b, da) {
            drop(st);
            self.alloc.free(da, spb, imap_file)?;
            return Err(e);
        }
        st.inode.size = st.inode.size.max((b + 1) * bb);
        st.inode.subblocks += spb as u64;
        st.mark_dirty();
        self.metafile_blocks
            .write()
            .entry(imap_file)
            .or_default()
            .set(b, da);
        Ok(())
    }

    pub fn block_bytes(&self) -> u64 {
        self.geo.block_bytes as u64
    }
    pub fn inode_bytes(&self) -> u32 {
        self.geo.inode_bytes
    }
    pub fn metadata_inodes(&self) -> mako_format::descriptor::MetadataInodes {
        self.desc.lock().metadata_inodes
    }

    /// Refuse changes once the file system turned read-only after damage.
    pub fn check_writable(&self) -> FsResult<()> {
        if self.read_only.load(Ordering::Relaxed) {
            // A file system panic is EIO, for every operation (`FsPanic`).
            self.check_fence()?;
            return Err(FsError::ReadOnly(self.read_only.reason()));
        }
        Ok(())
    }

    /// Refuse the operation once the mount's fence is up (`mount_fence`): EIO.
    pub fn check_fence(&self) -> FsResult<()> {
        if self.fs_panic.is_set() {
            return Err(FsError::Disk(mako_disk::DiskError::Fenced {
                disk: "(every disk of this mount)".into(),
                by: "this node's file system panic".into(),
                reason: self.fs_panic.reason(),
            }));
        }
        match self.mount_fence.get().map(|f| f()) {
            Some(Err(reason)) => Err(FsError::Disk(mako_disk::DiskError::Fenced {
                disk: "(every disk of this mount)".into(),
                by: "this node's lease".into(),
                reason,
            })),
            _ => Ok(()),
        }
    }

    /// A write of the recovery log, or of metadata in place, failed with `e` (`what`):
    /// the file system panics on this node (`FsPanic`), unless `e` is the lease fence
    /// (the node is being expelled already) or panics are off; either way the mount is
    /// read-only from now.
    pub fn log_write_failed(&self, what: &str, e: &FsError) {
        let why = format!("{what} failed: {e}");
        self.read_only.set(&why);
        if !matches!(e, FsError::Disk(mako_disk::DiskError::Fenced { .. }))
            && matches!(e, FsError::Disk(_))
        {
            self.fs_panic.panic(self.node, &why);
        }
    }

    /// Turn this mount read-only: continuing could persist damage.
    pub fn go_read_only(&self, why: &str) {
        self.read_only.set(why);
    }

    // ---- metadata files -------------------------------------------------------

    /// Disk address of byte `offset` of metadata file `ino`.
    pub fn metafile_da(&self, ino: u64, offset: u64) -> FsResult<DiskAddress> {
        let b = offset / self.block_bytes();
        let within = offset % self.block_bytes();
        let map = self.metafile_blocks.read();
        let da = map
            .get(&ino)
            .and_then(|v| v.get(b as usize))
            .copied()
            .filter(|d| !d.is_null())
            .ok_or_else(|| {
                self.integrity(
                    IntegrityError::new(
                        "metadata file",
                        format!("has no block {b} (byte {offset}): the offset lies past its end"),
                    )
                    .ino(ino),
                )
            })?;
        Ok(da.offset_by(within))
    }

    /// The disk extents of `len` bytes at `offset` of metadata file `ino`, split at its
    /// block boundaries: (address, range within the caller's buffer).
    pub fn metafile_extents(
        &self,
        ino: u64,
        offset: u64,
        len: usize,
    ) -> FsResult<Vec<(DiskAddress, std::ops::Range<usize>)>> {
        let bb = self.block_bytes();
        let mut out = Vec::new();
        let mut done = 0usize;
        while done < len {
            let off = offset + done as u64;
            let n = ((bb - off % bb) as usize).min(len - done);
            out.push((self.metafile_da(ino, off)?, done..done + n));
            done += n;
        }
        Ok(out)
    }

    /// Read metadata bytes: from disk, then committed images not yet written in place
    /// laid over them (the recovery log's overlay). Every metadata read that can miss
    /// the caches goes through here.
    pub fn read_metadata(&self, da: DiskAddress, buf: &mut [u8], tag: IoTag) -> FsResult<()> {
        self.nsd.read(da, buf, tag)?;
        self.journal.overlay(da, buf);
        Ok(())
    }

    /// Read a range of a metadata file (through the overlay). Returns where it starts.
    pub fn metafile_read(
        &self,
        ino: u64,
        offset: u64,
        buf: &mut [u8],
        bt: BufferType,
    ) -> FsResult<DiskAddress> {
        let extents = self.metafile_extents(ino, offset, buf.len())?;
        for (da, range) in &extents {
            self.read_metadata(
                *da,
                &mut buf[range.clone()],
                IoTag {
                    buffer_type: bt,
                    ino,
                },
            )?;
        }
        Ok(extents.first().map(|e| e.0).unwrap_or(DiskAddress::NULL))
    }

    /// Write a range of a metadata file in place. Only for what the log does not cover:
    /// the log file itself, and file system creation.
    pub fn metafile_write(
        &self,
        ino: u64,
        offset: u64,
        buf: &[u8],
        bt: BufferType,
    ) -> FsResult<()> {
        for (da, range) in self.metafile_extents(ino, offset, buf.len())? {
            self.nsd.write(
                da,
                &buf[range],
                IoTag {
                    buffer_type: bt,
                    ino,
                },
            )?;
        }
        Ok(())
    }

    /// Log images of a range of a metadata file, split at its block boundaries.
    pub fn metafile_images(
        &self,
        ino: u64,
        offset: u64,
        bytes: &[u8],
    ) -> FsResult<Vec<mako_format::log_record::LogImage>> {
        Ok(self
            .metafile_extents(ino, offset, bytes.len())?
            .into_iter()
            .map(|(da, range)| mako_format::log_record::LogImage::trimmed(da, &bytes[range]))
            .collect())
    }

    // ---- inodes ------------------------------------------------------------------

    /// Bytes of the inode file cached as one pagepool buffer: a miss reads this much
    /// (64 inodes of 4 KiB), so a scan of neighbouring inodes (stat, find, readdirplus)
    /// costs one disk read per chunk instead of one per inode.
    pub fn inode_chunk_bytes(&self) -> u64 {
        INODE_CHUNK_BYTES.min(self.block_bytes())
    }

    /// Check a block pointer read from disk (`found_in`, of inode `ino`) before it is
    /// followed: null (a hole), or a subblock of some disk's allocatable area. Only
    /// such an address can be read, freed or offset without leaving the disk.
    pub fn check_pointer(
        &self,
        ptr: DiskAddress,
        structure: &'static str,
        ino: u64,
        found_in: DiskAddress,
    ) -> FsResult<()> {
        if ptr.is_null() {
            return Ok(());
        }
        self.alloc.check_extent(ptr, 1).map_err(|why| {
            self.integrity(
                IntegrityError::new(structure, format!("a block pointer is impossible: {why}"))
                    .ino(ino)
                    .at(found_in),
            )
        })
    }

    /// Check what an inode read from disk says before anything uses it as an index:
    /// a tree depth the block map builds, a last fragment no larger than a unit, and
    /// block pointers inside the disks. (Its checksum only says the bytes are as
    /// written; these say they are possible.)
    pub fn check_inode(&self, inode: &Inode, da: DiskAddress) -> FsResult<()> {
        let bad = |what: String| {
            Err(self.integrity(IntegrityError::new("inode", what).ino(inode.ino).at(da)))
        };
        if inode.depth > crate::block_map::DEPTH_MAX {
            return bad(format!(
                "indirect tree depth {} (at most {})",
                inode.depth,
                crate::block_map::DEPTH_MAX
            ));
        }
        let unit = crate::block_map::unit_subblocks(self, inode);
        if inode.last_block_subblocks as u32 > unit {
            return bad(format!(
                "last block of {} subblocks (a block has {unit})",
                inode.last_block_subblocks
            ));
        }
        if let mako_format::inode::InodeContent::Pointers(p) = &inode.content {
            for ptr in p {
                self.check_pointer(*ptr, "inode", inode.ino, da)?;
            }
        }
        Ok(())
    }

    /// Read inode `ino` from the inode file, through the pagepool.
    pub fn read_inode(&self, ino: u64) -> FsResult<Inode> {
        let isz = self.inode_bytes() as u64;
        let chunk = self.inode_chunk_bytes();
        let off = ino * isz;
        let (index, within) = (off / chunk, (off % chunk) as usize);
        let inode_file = self.metadata_inodes().inode_file;
        if ino != inode_file && !self.inode_slot_exists(ino) {
            // Another node grew the inode file: learn its new blocks (the inode file's
            // inode, under its token, as that node wrote it in place).
            crate::op::hold_inode(self, inode_file, Need::Cache)?;
            self.refresh_metafile(inode_file)?;
            if !self.inode_slot_exists(ino) {
                return Err(FsError::Stale(ino));
            }
        }
        let decode = |bytes: &[u8]| -> FsResult<Inode> {
            if Inode::is_blank(bytes) {
                // Never written, or freed and cleared: no such file.
                return Err(FsError::Stale(ino));
            }
            let da = self.metafile_da(inode_file, off)?;
            let inode =
                Inode::decode(bytes, self.inode_bytes(), ino, Location::Disk(da)).map_err(|e| {
                    self.stats.corruptions.fetch_add(1, Ordering::Relaxed);
                    tracing::error!("{e} (inode {ino})");
                    FsError::from(e)
                })?;
            self.check_inode(&inode, da)?;
            Ok(inode)
        };
        // A cached chunk whose slot of `ino` was read before this node was granted `ino`
        // may hold an old copy of it (another node changed it and wrote it in place
        // before the grant): that slot is read again from disk, the chunk's other
        // inodes stay (three-node seed 211: a name added by another node was missing
        // from an inline directory when the old copy was used).
        let granted = self.tokens.client().granted_at(self.tokens.inode(ino));
        let slot_index = within / isz as usize;
        if let Some(slot) = self.pool.get((INODE_CACHE_KEY, index)) {
            let mut buf = slot.buf.lock();
            if buf.loaded && buf.bytes.len() >= within + isz as usize {
                let fresh = buf
                    .slot_stamps
                    .get(slot_index)
                    .is_some_and(|&s| s > granted);
                if !fresh {
                    let stamp = self.tokens.client().grant_clock();
                    let mut one =
                        mako_disk::AlignedBuf::zeroed((isz as usize).next_multiple_of(512));
                    self.metafile_read(inode_file, off, &mut one, BufferType::Inode)?;
                    buf.bytes[within..within + isz as usize].copy_from_slice(&one[..isz as usize]);
                    if buf.slot_stamps.len() <= slot_index {
                        buf.slot_stamps.resize(slot_index + 1, 0);
                    }
                    buf.slot_stamps[slot_index] = stamp + 1;
                    self.stats
                        .inode_slot_rereads
                        .fetch_add(1, Ordering::Relaxed);
                }
                return decode(&buf.bytes[within..within + isz as usize]);
            }
        }
        if !self.chunk_missed_recently(index) {
            // The first miss in a chunk reads just the inode: a random lookup costs one
            // small read. A second miss in the same chunk soon after (a scan: ls -l,
            // find, stat of neighbours) caches the whole chunk.
            let mut one = mako_disk::AlignedBuf::zeroed((isz as usize).next_multiple_of(512));
            self.metafile_read(inode_file, off, &mut one, BufferType::Inode)?;
            return decode(&one[..isz as usize]);
        }
        let slot = self.pool.get_or_create((INODE_CACHE_KEY, index));
        let mut buf = slot.buf.lock();
        if !buf.loaded {
            let stamp = self.tokens.client().grant_clock();
            let mut bytes = mako_disk::AlignedBuf::zeroed(chunk as usize);
            self.metafile_read(inode_file, index * chunk, &mut bytes, BufferType::Inode)?;
            let was = buf.is_dirty();
            buf.bytes = bytes;
            buf.loaded = true;
            buf.slot_stamps = vec![stamp + 1; (chunk / isz) as usize];
            self.pool.account(&mut buf, was);
        }
        decode(&buf.bytes[within..within + isz as usize])
    }

    /// Read a metadata file's inode again from disk and learn its block list (the
    /// inode file grows when another node needs more inodes). Only ever appends to
    /// what this node knew: a metadata file never shrinks.
    pub fn refresh_metafile(&self, ino: u64) -> FsResult<()> {
        let desc = self.desc.lock().clone();
        let mut buf = vec![0u8; self.inode_bytes() as usize];
        let da = if ino == desc.metadata_inodes.inode_file {
            desc.inode_file_start
        } else {
            self.metafile_da(
                desc.metadata_inodes.inode_file,
                ino * self.inode_bytes() as u64,
            )?
        };
        self.nsd.read(
            da,
            &mut buf,
            IoTag {
                buffer_type: BufferType::Inode,
                ino,
            },
        )?;
        self.journal.overlay(da, &mut buf);
        let inode = Inode::decode(&buf, self.inode_bytes(), ino, Location::Disk(da))?;
        let blocks = if ino == desc.metadata_inodes.inode_file
            || ino == desc.metadata_inodes.inode_alloc_map
        {
            crate::mount::collect_blocks_sparse(self.nsd.as_ref(), &self.geo, &inode)?
        } else {
            crate::mount::collect_blocks(self.nsd.as_ref(), &self.geo, &inode)?.into()
        };
        let mut map = self.metafile_blocks.write();
        let known = map.entry(ino).or_default();
        // A metadata file only gains blocks (the inode file and the inode map fill
        // holes, too): take the newer list when it knows more blocks.
        if blocks.allocated() > known.allocated() {
            *known = blocks;
        }
        drop(map);
        if let Some(h) = self.cached_handle(ino) {
            let mut st = h.state.write();
            if inode.size >= st.inode.size {
                st.inode = inode;
                st.indirect.lock().clear();
            }
            st.stale = false;
        }
        Ok(())
    }

    /// Note a miss in inode-file chunk `index`; true if it had a miss recently.
    fn chunk_missed_recently(&self, index: u64) -> bool {
        let mut m = self.chunk_misses.lock();
        let (set, order) = &mut *m;
        if set.contains(&index) {
            return true;
        }
        set.insert(index);
        order.push_back(index);
        while order.len() > CHUNK_MISSES_REMEMBERED {
            if let Some(old) = order.pop_front() {
                set.remove(&old);
            }
        }
        false
    }

    /// The cached handle of `ino`, loading it from disk on a miss. Holds the inode's
    /// token for the running operation first (`op`): a cached inode is only trusted
    /// under a token.
    pub fn get(&self, ino: u64) -> FsResult<Arc<InodeHandle>> {
        crate::op::hold_inode(self, ino, Need::Cache)?;
        let tick = self.use_tick.fetch_add(1, Ordering::Relaxed);
        let cached = self.inodes.lock().get(&ino).cloned();
        if let Some(h) = cached {
            h.last_use.store(tick, Ordering::Relaxed);
            self.stats.inode_hits.fetch_add(1, Ordering::Relaxed);
            if h.state.read().stale {
                // The token came back after it left: what another node changed is on
                // disk (it wrote it there before giving the token up).
                if h.state.read().inode.flags & mako_format::inode::FLAG_SYSTEM != 0 {
                    self.refresh_metafile(ino)?;
                    crate::metanode::settle(self, &h)?;
                    return Ok(h);
                }
                let inode = self.read_inode(ino)?;
                let mut st = h.state.write();
                if st.stale {
                    st.inode = inode;
                    st.indirect.lock().clear();
                    st.dir_blocks.lock().clear();
                    st.stale = false;
                }
            }
            crate::metanode::settle(self, &h)?;
            return Ok(h);
        }
        // Whether the number is in use is not this node's to know (another node may have
        // just allocated it from its own inode-map segment): the inode itself says, blank
        // or without links when it is not (`read_inode`, below).
        if ino >= self.imap.inodes_max() {
            return Err(FsError::Stale(ino));
        }
        self.stats.inode_misses.fetch_add(1, Ordering::Relaxed);
        // A stat-cache entry holds attributes only: the whole inode is read (from the
        // cached inode-file chunk, or the disk and the log) and becomes the cached copy.
        // Both are what this node last committed: the entry was made of a clean inode,
        // under the token held since.
        let inode = self.read_inode(ino)?;
        self.stat_cache.lock().remove(ino);
        if inode.nlink == 0 && inode.flags & mako_format::inode::FLAG_SYSTEM == 0 {
            // An inode with no links that is still marked in use: an orphan left by a
            // crash. It is fsck's to reclaim; to users it does not exist.
            return Err(FsError::Stale(ino));
        }
        let h = {
            let mut map = self.inodes.lock();
            map.entry(ino)
                .or_insert_with(|| InodeHandle::new(inode, self.journal.inbox()))
                .clone()
        };
        h.last_use.store(tick, Ordering::Relaxed);
        crate::metanode::settle(self, &h)?;
        Ok(h)
    }

    /// Insert a handle for a freshly created inode (call with a transaction open).
    pub fn insert_new(&self, inode: Inode) -> Arc<InodeHandle> {
        let h = self.new_handle(inode);
        h.state.write().mark_dirty();
        h.last_use.store(
            self.use_tick.fetch_add(1, Ordering::Relaxed),
            Ordering::Relaxed,
        );
        self.inodes.lock().insert(h.ino, h.clone());
        h
    }

    pub fn cached_handle(&self, ino: u64) -> Option<Arc<InodeHandle>> {
        self.inodes.lock().get(&ino).cloned()
    }

    /// The generation of a new file at inode number `ino` (its token held exclusively,
    /// its slot in the inode file). A file handle is (number, generation), so a number
    /// used again must never come back with a generation it had before, or a handle of
    /// the deleted file (NFS, `open_by_handle_at`) would reach the new one. A freed
    /// inode is written back with its generation and no links, so the slot's committed
    /// state tells the last generation any node gave that number: the new one is past
    /// it. Lives of the number since that commit were this node's (it holds the token),
    /// and every generation this node hands out is past all it handed out before (the
    /// counter only grows, and at least past what it returns): so the generations of one
    /// number only grow, across nodes and mounts, until they wrap after 2^32 lives. A slot
    /// never used, cleared by fsck or unreadable as an inode starts from the counter.
    ///
    /// On a file system of one node (one recovery log, `ownership::shared` false) the
    /// slot is not read from disk when the inode file says it is a hole (never used: the
    /// file never shrinks) or its chunk is cached: nothing but this node writes the
    /// inode file while it is mounted, and every inode it commits goes into the cached
    /// chunk too (`encode_inode`), so the cached slot is what the disk holds, or older
    /// only by lives this node gave (its counter is past those). With several nodes
    /// the slot is read under the new number's token as above: another node may have
    /// given the number a life since the chunk was read (`generation_slot_reads`
    /// counts the reads).
    pub fn generation_for(&self, ino: u64) -> FsResult<u32> {
        let last = match self.cached_generation(ino) {
            Some(known) => known,
            None => {
                self.stats
                    .generation_slot_reads
                    .fetch_add(1, Ordering::Relaxed);
                match self.read_inode(ino) {
                    Ok(old) => Some(old.generation),
                    // Blank (never used, or cleared), or damage that fsck reports as a
                    // damaged free slot: nothing is known of earlier lives.
                    Err(FsError::Stale(_) | FsError::Corrupt(_)) => None,
                    Err(e) => return Err(e),
                }
            }
        };
        let mut generation = 0;
        let _ = self
            .generation
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |next| {
                generation = match last {
                    Some(g) => next.max(g.wrapping_add(1)),
                    None => next,
                };
                Some(generation.wrapping_add(1))
            });
        Ok(generation)
    }

    /// The last generation of `ino`'s slot known without a disk read, on a file system
    /// of one node only (`generation_for`): `Some(None)` for a slot with no life (a
    /// hole of the inode file, blank, or not an inode), `Some(Some(g))` for one, `None`
    /// when the slot must be read.
    fn cached_generation(&self, ino: u64) -> Option<Option<u32>> {
        if crate::ownership::shared(self) {
            return None;
        }
        if !self.inode_slot_exists(ino) {
            return Some(None);
        }
        let isz = self.inode_bytes() as u64;
        let chunk = self.inode_chunk_bytes();
        let off = ino * isz;
        let within = (off % chunk) as usize;
        let slot = self.pool.get((INODE_CACHE_KEY, off / chunk))?;
        let buf = slot.buf.lock();
        if !buf.loaded || buf.bytes.len() < within + isz as usize {
            return None;
        }
        let bytes = &buf.bytes[within..within + isz as usize];
        if Inode::is_blank(bytes) {
            return Some(None);
        }
        let da = self
            .metafile_da(self.metadata_inodes().inode_file, off)
            .ok()?;
        // A slot that does not decode is read from disk as before (which reports it).
        let inode = Inode::decode(bytes, self.inode_bytes(), ino, Location::Disk(da)).ok()?;
        Some(Some(inode.generation))
    }

    pub fn invalidate_kernel_inode(&self, ino: u64) {
        if let Some(inv) = self.invalidator.read().as_ref() {
            inv.invalidate_inode(ino, 0, 0);
        }
    }

    /// The kernel must ask again for the inode's attributes (its token left).
    pub fn invalidate_kernel_attrs(&self, ino: u64) {
        if let Some(inv) = self.invalidator.read().as_ref() {
            // A negative offset invalidates the attributes only (FUSE_NOTIFY_INVAL_INODE).
            inv.invalidate_inode(ino, -1, 0);
        }
    }

    /// The kernel must drop its page cache of `len` bytes at `offset` (0: to the end).
    pub fn invalidate_kernel_data(&self, ino: u64, offset: i64, len: i64) {
        if let Some(inv) = self.invalidator.read().as_ref() {
            inv.invalidate_inode(ino, offset, len);
        }
    }

    /// The kernel must look names in directory `dir` up again.
    pub fn invalidate_kernel_names(&self, dir: u64) {
        if let Some(inv) = self.invalidator.read().as_ref() {
            inv.invalidate_names(dir);
        }
    }
}
