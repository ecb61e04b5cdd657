//! The per-node recovery log (DESIGN.md 3.6): write-ahead redo logging of metadata
//! with group commit, lazy checkpointing and deferred reuse of freed space.
//!
//! ## How a change becomes durable
//! 1. An operation opens a transaction handle (`Journal::begin`, a `Tx`) before it
//!    takes any inode lock, and holds it until its last change is made. Handles nest
//!    on one thread. While any handle is open, no commit can take its snapshot.
//! 2. Every change marks what it changed dirty in memory: the inode
//!    (`InodeState::mark_dirty`, which files the inode in the running transaction),
//!    its indirect and directory blocks, allocation-map pages and inode-map segments.
//!    Nothing is written in place.
//! 3. A commit (`Journal::commit`; fsync, the sync thread, a full log) closes the gate:
//!    new handles wait, open ones finish. With no operation in flight the in-memory
//!    metadata is consistent; the commit encodes every dirty structure as a physical
//!    image (`LogImage`) and opens the gate again. That is the only pause.
//! 4. Ordered mode: data blocks are written by write-behind while it holds a handle,
//!    so every data block that a committed pointer names was written before the
//!    snapshot. If any data was written since the last barrier, the commit syncs the
//!    disks first; then it writes the transaction to the log and syncs again. Only
//!    then is the transaction durable (`durable_seq`), and fsync returns.
//! 5. Committed images wait in the overlay (`pending`) until a checkpoint writes them
//!    in place, syncs, and moves the log's tail past them (header written and synced
//!    before the space is reused). Reads of metadata that is not cached see the
//!    overlay first, so an evicted inode is never read back older than committed.
//!
//! ## Durable-write order (what each sync protects)
//! data → sync → log transaction → sync → (checkpoint) metadata in place → sync →
//! log header (tail) → sync. Replay after a crash writes every image from the tail to
//! the last valid transaction; images are physical, so replay is idempotent and
//! rewrites any metadata block torn by a crash during write-back. A token leaving the
//! node (`write_in_place`): commit → images in place → sync → revoke records in the log
//! → sync, so that no replay of this log undoes what the next holder writes.
//!
//! ## Freed space
//! Space freed by a transaction is quarantined (`AllocMap::free`) until that
//! transaction has been checkpointed: reusing it earlier could let new data land in a
//! block that a not-yet-durable old pointer still names, or let replay of an older
//! image overwrite the block's new contents.

use crate::core::{Core, INODE_CACHE_KEY};
use crate::core::{FastMap, FastSet};
use crate::error::{FsError, FsResult};
use mako_diag::{Condvar, CountedMutex, CountedRwLock, LockClass};
use mako_diag::{Wait, WaitGuard};
use mako_disk::nsd::IoTag;
use mako_disk::BufferType;
use mako_format::log_header::{
    LogHeader, LOG_HEADER_BYTES, LOG_HEADER_OFFSETS, LOG_RECORDS_OFFSET,
};
use mako_format::log_record::{encode_txn_with, LogImage, LogRevoke};
use mako_format::DiskAddress;
use parking_lot::Mutex;
use std::cell::RefCell;
use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

/// Lock classes of `mako diag counters`.
pub static JOURNAL_GATE_LOCK: LockClass = LockClass::new("log.gate");
pub static JOURNAL_COMMIT_LOCK: LockClass = LockClass::new("log.commit");
pub static JOURNAL_CHECKPOINT_LOCK: LockClass = LockClass::new("log.checkpoint");
pub static JOURNAL_STATE_LOCK: LockClass = LockClass::new("log.state");
pub static JOURNAL_PENDING_LOCK: LockClass = LockClass::new("log.overlay");

/// A log image with the kind of buffer it describes.
type TypedImage = (BufferType, Arc<LogImage>);
/// A snapshot of the running transaction: its sequence number, images and revokes.
type Snapshot = (u64, Vec<TypedImage>, Vec<LogRevoke>);

/// Where the log stands when a file system is mounted (after any replay).
#[derive(Debug, Clone, Copy)]

pub struct LogStart {
    /// LSN where the next transaction goes (= the tail: the log is empty after mount).
    pub head_lsn: u64,
    /// Sequence number of the next transaction.
    pub next_seq: u64,
}

/// The dirty-inode set of the running transaction, shared with every cached inode so
/// that marking an inode dirty files it here (see `InodeState::mark_dirty`).
pub struct Inbox {
    /// Identity of the journal, to recognise this thread's open handles.
    pub(crate) id: usize,
    inodes: Mutex<FastSet<u64>>,
    /// Upper bound of the bytes the running transaction's images will take.
    bytes: AtomicU64,
    inode_bytes: u64,
    /// Changes made without an open handle (a bug: they are committed, but not
    /// atomically with the operation that made them).
    stray: AtomicU64,
}

impl Inbox {
    pub(crate) fn file_inode(&self, ino: u64) {
        if !holds_handle(self.id) && self.stray.fetch_add(1, Ordering::Relaxed) == 0 {
            tracing::error!(
                "inode {ino} changed outside a log transaction (a bug; the change is still logged)"
            );
        }
        self.inodes.lock().insert(ino);
        self.bytes.fetch_add(self.inode_bytes, Ordering::Relaxed);
    }
    /// An inode filed in the running transaction leaves it without an image of its own
    /// (it was freed, and its free image went to the transaction through
    /// `Journal::add_image`, counted by its size there): take back what filing it
    /// counted, so that an unlink counts its trimmed free image once instead of two
    /// whole inodes.
    pub(crate) fn unfile_inode(&self) {
        let _ = self
            .bytes
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |b| {
                Some(b.saturating_sub(self.inode_bytes))
            });
    }
    /// Account `bytes` more of images for the running transaction.
    pub fn note(&self, bytes: u64) {
        self.bytes.fetch_add(bytes, Ordering::Relaxed);
    }
    pub fn stray_changes(&self) -> u64 {
        self.stray.load(Ordering::Relaxed)
    }
}

thread_local! {
    /// Journals this thread holds a handle of, with the nesting depth.
    static HELD: RefCell<Vec<(usize, u32)>> = const { RefCell::new(Vec::new()) };
    /// The operation under this thread's outermost handle: did it change anything, did
    /// it meet damage (a metadata structure that failed its checks, a disk error)?
    static OP: std::cell::Cell<(bool, bool)> = const { std::cell::Cell::new((false, false)) };
}

/// Something in memory changed under the current operation.
pub fn note_change() {
    OP.with(|o| o.set((true, o.get().1)));
}

/// Run `f`, a change that is whole and consistent on its own (a node taking over as
/// metanode merges what it had not reported), inside whatever operation runs on this
/// thread: if it succeeds, it does not count as that operation's change, so the
/// operation may still restart for a token it finds missing afterwards. If it fails,
/// what it left counts like any other change.
pub fn complete_change<T, E>(f: impl FnOnce() -> Result<T, E>) -> Result<T, E> {
    let before = OP.with(|o| o.get().0);
    let r = f();
    if r.is_ok() {
        OP.with(|o| o.set((before, o.get().1)));
    }
    r
}

/// The current operation met damage (called where damage errors are made).
pub fn note_damage() {
    if damage_trace() && OP.with(|o| o.get().0) {
        // Debugging aid (the simulation's EROFS failures): where an operation that had
        // changed memory met the error that turns the mount read-only.
        eprintln!(
            "damage after a change (the mount will turn read-only):\n{}",
            std::backtrace::Backtrace::force_capture()
        );
    }
    OP.with(|o| o.set((o.get().0, true)));
}

/// `MAKO_DAMAGE_TRACE=1`: print a backtrace where an operation that changed memory
/// meets damage, a missing token or a missing block address.
fn damage_trace() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("MAKO_DAMAGE_TRACE").is_ok_and(|v| v == "1"))
}

fn holds_handle(id: usize) -> bool {
    HELD.with(|h| h.borrow().iter().any(|(j, _)| *j == id))
}

struct Gate {
    active: usize,
    closing: bool,
}

/// A committed image not yet written in place.
#[derive(Clone)]
struct Pending {
    seq: u64,
    kind: BufferType,
    /// Whose metadata the image is (an inode number, or `OWNER_ALLOC_MAP` /
    /// `OWNER_INODE_MAP`): a revoke writes one owner's images in place.
    owner: u64,
    image: Arc<LogImage>,
}

/// `owner` has no image at `da` in the overlay any more.
fn forget_owner(by_owner: &mut FastMap<u64, FastSet<DiskAddress>>, owner: u64, da: DiskAddress) {
    if let Some(set) = by_owner.get_mut(&owner) {
        set.remove(&da);
        if set.is_empty() {
            by_owner.remove(&owner);
        }
    }
}

/// Owner of allocation-map images in the overlay.
pub const OWNER_ALLOC_MAP: u64 = u64::MAX - 10;
/// Owner of inode-map images in the overlay.
pub const OWNER_INODE_MAP: u64 = u64::MAX - 11;

/// Consecutive checkpoint images gathered into one write.
#[derive(Default)]
struct CheckpointRun {
    start: Option<(DiskAddress, BufferType)>,
    buf: mako_disk::AlignedBuf,
}

impl CheckpointRun {
    /// Largest write a run grows to.
    const MAX_BYTES: usize = 1 << 20;

    /// Add `image` if it starts where the run ends (or the run is empty); false if it
    /// does not fit (the caller flushes and tries again, or writes it alone).
    fn append(&mut self, image: &LogImage, kind: BufferType) -> bool {
        let len = image.length as usize;
        if !len.is_multiple_of(512) || len > Self::MAX_BYTES {
            return false;
        }
        match self.start {
            None => self.start = Some((image.da, kind)),
            Some((da, _)) => {
                let end = da.sector() + (self.buf.len() / 512) as u64;
                if image.da.disk() != da.disk()
                    || image.da.sector() != end
                    || self.buf.len() + len > Self::MAX_BYTES
                {
                    return false;
                }
            }
        }
        self.buf.extend_from_slice(&image.bytes);
        self.buf.resize(self.buf.len() + len - image.bytes.len(), 0);
        true
    }

    fn flush(&mut self, core: &Core) -> FsResult<()> {
        if let Some((da, kind)) = self.start.take() {
            core.nsd.write(
                da,
                &self.buf,
                IoTag {
                    buffer_type: kind,
                    ino: 0,
                },
            )?;
            self.buf.clear();
        }
        Ok(())
    }
}

struct LogState {
    head_lsn: u64,
    tail_lsn: u64,
    /// Committed transactions not yet checkpointed: (seq, start LSN).
    txns: VecDeque<(u64, u64)>,
}

/// Counters of the log (`mako diag stats`, Prometheus).
#[derive(Debug, Default)]
pub struct LogStats {
    pub commits: AtomicU64,
    pub commit_bytes: AtomicU64,
    pub commit_images: AtomicU64,
    /// Revoke records committed (one per image `write_in_place` wrote).
    pub commit_revokes: AtomicU64,
    pub gate_waits: AtomicU64,
    pub checkpoints: AtomicU64,
    pub checkpoint_bytes: AtomicU64,
    pub barriers: AtomicU64,
    /// Images written in place because a token covering them left this node.
    pub revoke_writes: AtomicU64,
}

pub struct Journal {
    node: u32,
    fs_uuid: [u8; 16],
    log_ino: u64,
    /// Bytes of the circular area.
    capacity: u64,
    inbox: Arc<Inbox>,
    gate: CountedMutex<Gate>,
    gate_cv: Condvar,
    /// Images for the running transaction made outside any inode (freed inodes), with
    /// their owner.
    extra: Mutex<Vec<(BufferType, u64, LogImage)>>,
    /// Revoke records for the running transaction: structures written in place by
    /// `write_in_place` whose earlier images in this log must never be replayed.
    revokes: Mutex<Vec<LogRevoke>>,
    /// TEST ONLY (`set_revoke_fault`): `write_in_place` logs no revokes.
    revoke_fault: AtomicBool,
    /// Data reached a disk since the last barrier: the next commit syncs first.
    ordered_writes: AtomicBool,
    /// Sequence number the running transaction will get.
    running_seq: AtomicU64,
    durable_seq: AtomicU64,
    commit_lock: CountedMutex<()>,
    checkpoint_lock: CountedMutex<()>,
    state: CountedMutex<LogState>,
    /// Committed images by disk address, not yet in place: normally one, two when a
    /// newer image is committed while the older one is still being checkpointed.
    /// Ordered by sequence number; reads see the last.
    pending: CountedRwLock<BTreeMap<DiskAddress, Vec<Pending>>>,
    /// Per owner, the addresses where `pending` may hold one of its images (a superset:
    /// entries are dropped as images leave), so that a revoke's `write_in_place` costs
    /// the owner's images, not the whole overlay. Locked after `pending`.
    by_owner: parking_lot::Mutex<FastMap<u64, FastSet<DiskAddress>>>,
    pending_sectors_max: AtomicU64,
    pub stats: LogStats,
    last_checkpoint: Mutex<Instant>,
    read_only: Arc<crate::core::ReadOnly>,
}

static JOURNAL_IDS: AtomicUsize = AtomicUsize::new(1);

/// An open transaction handle. Dropping the outermost handle of a thread lets a
/// waiting commit proceed.
pub struct Tx<'a> {
    journal: &'a Journal,
}

impl Drop for Tx<'_> {
    fn drop(&mut self) {
        let id = self.journal.inbox.id;
        let last = HELD.with(|h| {
            let mut h = h.borrow_mut();
            let pos = h.iter().position(|(j, _)| *j == id).expect("handle held");
            h[pos].1 -= 1;
            if h[pos].1 == 0 {
                h.swap_remove(pos);
                true
            } else {
                false
            }
        });
        if last {
            // An operation that failed on damage after changing something may have left
            // half of itself in memory. Its transaction must never commit: the mount
            // turns read-only, and the disk keeps the last committed (consistent) state.
            let (changed, damaged) = OP.with(|o| o.replace((false, false)));
            if changed && damaged {
                self.journal.read_only.set(
                    "an operation met damaged metadata or a disk error after it had changed the file system in memory; \
                     its changes (and those not yet committed) are discarded, the disk holds the last commit",
                );
            }
            let mut g = self.journal.gate.lock();
            g.active -= 1;
            if g.active == 0 && g.closing {
                self.journal.gate_cv.notify_all();
            }
        }
    }
}

impl Journal {
    pub fn new(
        node: u32,
        fs_uuid: [u8; 16],
        log_ino: u64,
        log_bytes: u64,
        inode_bytes: u32,
        start: LogStart,
        read_only: Arc<crate::core::ReadOnly>,
    ) -> Journal {
        let capacity = log_capacity(log_bytes);
        let id = JOURNAL_IDS.fetch_add(1, Ordering::Relaxed);
        Journal {
            node,
            fs_uuid,
            log_ino,
            capacity,
            inbox: Arc::new(Inbox {
                id,
                inodes: Mutex::new(FastSet::default()),
                bytes: AtomicU64::new(0),
                inode_bytes: inode_bytes as u64,
                stray: AtomicU64::new(0),
            }),
            gate: CountedMutex::new(
                &JOURNAL_GATE_LOCK,
                Gate {
                    active: 0,
                    closing: false,
                },
            ),
            gate_cv: Condvar::new(),
            extra: Mutex::new(Vec::new()),
            revokes: Mutex::new(Vec::new()),
            revoke_fault: AtomicBool::new(false),
            ordered_writes: AtomicBool::new(false),
            running_seq: AtomicU64::new(start.next_seq),
            durable_seq: AtomicU64::new(start.next_seq - 1),
            commit_lock: CountedMutex::new(&JOURNAL_COMMIT_LOCK, ()),
            checkpoint_lock: CountedMutex::new(&JOURNAL_CHECKPOINT_LOCK, ()),
            state: CountedMutex::new(
                &JOURNAL_STATE_LOCK,
                LogState {
                    head_lsn: start.head_lsn,
                    tail_lsn: start.head_lsn,
                    txns: VecDeque::new(),
                },
            ),
            pending: CountedRwLock::new(&JOURNAL_PENDING_LOCK, BTreeMap::new()),
            by_owner: parking_lot::Mutex::new(FastMap::default()),
            pending_sectors_max: AtomicU64::new(0),
            stats: LogStats::default(),
            last_checkpoint: Mutex::new(Instant::now()),
            read_only,
        }
    }

    pub fn inbox(&self) -> &Arc<Inbox> {
        &self.inbox
    }
    pub fn capacity(&self) -> u64 {
        self.capacity
    }
    /// Bytes of the log holding committed transactions not yet checkpointed.
    pub fn used_bytes(&self) -> u64 {
        let s = self.state.lock();
        s.head_lsn - s.tail_lsn
    }
    pub fn head_lsn(&self) -> u64 {
        self.state.lock().head_lsn
    }
    pub fn durable_seq(&self) -> u64 {
        self.durable_seq.load(Ordering::Acquire)
    }
    /// The sequence number every change made so far will be durable with.
    pub fn running_seq(&self) -> u64 {
        self.running_seq.load(Ordering::Acquire)
    }
    /// Upper bound of the running transaction's size.
    pub fn running_bytes(&self, core: &Core) -> u64 {
        self.inbox.bytes.load(Ordering::Relaxed)
            + core.alloc.dirty_page_bytes()
            + core.imap.dirty_bytes()
    }
    /// Images waiting to be written in place.
    pub fn pending_images(&self) -> usize {
        self.pending.read().len()
    }

    /// Commit when the running transaction reaches this size (the sync thread).
    pub fn soft_limit(&self) -> u64 {
        self.capacity / 8
    }
    /// New operations commit first when the running transaction reaches this size, so
    /// that one transaction (plus what operations in flight add) always fits the log.
    pub fn hard_limit(&self) -> u64 {
        self.capacity / 2
    }

    /// Open a transaction handle. Must be called before taking any inode lock (a
    /// commit waits for open handles, and then takes inode locks itself).
    pub fn begin<'a>(&'a self, core: &Core) -> Tx<'a> {
        self.begin_for(core, 0)
    }

    /// `begin` for an operation that may log up to `bytes` of images (more than an
    /// inode and a few blocks): the running transaction is committed first if it would
    /// pass the hard limit with them, so it always fits the log.
    pub fn begin_for<'a>(&'a self, core: &Core, bytes: u64) -> Tx<'a> {
        let id = self.inbox.id;
        let nested = HELD.with(|h| {
            let mut h = h.borrow_mut();
            if let Some(e) = h.iter_mut().find(|(j, _)| *j == id) {
                e.1 += 1;
                true
            } else {
                false
            }
        });
        if nested {
            return Tx { journal: self };
        }
        if self.running_bytes(core) + bytes > self.hard_limit()
            && !core.read_only.load(Ordering::Relaxed)
        {
            if let Err(e) = self.commit(core) {
                tracing::error!("commit of a full log transaction failed: {e}");
            }
        }
        {
            let mut g = self.gate.lock();
            if g.closing {
                self.stats.gate_waits.fetch_add(1, Ordering::Relaxed);
                let _w = WaitGuard::new(Wait::Static(
                    "waiting for a recovery log commit to take its snapshot",
                ));
                while g.closing {
                    self.gate_cv.wait(&mut g);
                }
            }
            g.active += 1;
        }
        HELD.with(|h| h.borrow_mut().push((id, 1)));
        OP.with(|o| o.set((false, false)));
        Tx { journal: self }
    }

    /// Data reached a disk: the next commit must sync before its log write (ordered mode).
    pub fn note_ordered_write(&self) {
        self.ordered_writes.store(true, Ordering::Release);
    }

    /// Add an image to the running transaction directly (a freed inode, whose handle
    /// leaves the cache). Call with a handle open.
    pub fn add_image(&self, kind: BufferType, owner: u64, image: LogImage) {
        debug_assert!(
            holds_handle(self.inbox.id),
            "add_image without an open handle"
        );
        note_change();
        // What the log writes for it: the trimmed image and its record header (a freed
        // inode's is a few hundred bytes of a 4 KiB slot).
        self.inbox.note(image.encoded_len() as u64);
        self.extra.lock().push((kind, owner, image));
    }

    fn close_gate(&self) {
        let mut g = self.gate.lock();
        debug_assert!(!g.closing, "two commits at once");
        g.closing = true;
        if g.active > 0 {
            let _w = WaitGuard::new(Wait::Static(
                "recovery log commit waiting for operations in flight",
            ));
            while g.active > 0 {
                self.gate_cv.wait(&mut g);
            }
        }
    }
    fn open_gate(&self) {
        let mut g = self.gate.lock();
        g.closing = false;
        self.gate_cv.notify_all();
    }

    /// Make every change up to sequence `seq` durable (fsync): returns at once if a
    /// commit already covered it, else commits (group commit: callers queue on the
    /// commit lock, and one commit covers them all).
    pub fn commit_upto(&self, core: &Core, seq: u64) -> FsResult<()> {
        if self.durable_seq() >= seq && !self.ordered_writes.load(Ordering::Acquire) {
            return Ok(());
        }
        self.commit(core)
    }

    /// Commit the running transaction: snapshot every dirty structure, write it to the
    /// log and make it durable. Must not be called with a handle open on this thread.
    pub fn commit(&self, core: &Core) -> FsResult<()> {
        assert!(
            !holds_handle(self.inbox.id),
            "commit with a transaction handle open on this thread would wait for itself"
        );
        let _c = self.commit_lock.lock();
        self.commit_locked(core)
    }

    /// Commit everything so far, then hold off every further commit until the guard
    /// is dropped: the disks with the overlay (`Core::read_metadata`) then show one
    /// committed state that does not change, while operations go on in memory (an
    /// fsync, or a full log, waits). This is what an online check reads.
    pub fn hold_commits(&self, core: &Core) -> FsResult<parking_lot::MutexGuard<'_, ()>> {
        assert!(
            !holds_handle(self.inbox.id),
            "hold_commits with a transaction handle open on this thread would wait for itself"
        );
        let c = self.commit_lock.lock();
        if !core.read_only.load(Ordering::Relaxed) {
            self.commit_locked(core)?;
        }
        Ok(c)
    }

    fn commit_locked(&self, core: &Core) -> FsResult<()> {
        core.check_writable()?;
        // 1. Close the gate: no operation in flight, so memory is consistent.
        self.close_gate();
        // An operation that was in flight may have turned the mount read-only as it
        // ended (damage after a change, an integrity failure): what it left in memory
        // is half done and must not be snapshotted.
        if let Err(e) = core.check_writable() {
            self.open_gate();
            return Err(e);
        }
        let snapshot = self.snapshot(core);
        // 2. The running transaction is now the one being committed; new operations
        //    go to the next one as soon as the gate opens.
        self.open_gate();
        let (seq, images, revokes) = match snapshot {
            Ok(s) => s,
            Err(e) => {
                core.go_read_only(&format!("recovery log snapshot failed: {e}"));
                return Err(e);
            }
        };
        let r = self.write_txn(core, seq, &images, &revokes);
        if let Err(e) = &r {
            // A disk error here is a file system panic on this node (`FsPanic`).
            core.log_write_failed("writing the recovery log", e);
        }
        r
    }

    /// Encode the running transaction (gate closed). Returns its sequence number and
    /// images; registers the images in the overlay.
    fn snapshot(&self, core: &Core) -> FsResult<Snapshot> {
        let seq = self.running_seq.fetch_add(1, Ordering::AcqRel);
        let inos: Vec<u64> = {
            let mut set = self.inbox.inodes.lock();
            let mut v: Vec<u64> = set.drain().collect();
            v.sort_unstable();
            v
        };
        self.inbox.bytes.store(0, Ordering::Relaxed);
        if trace_enabled() {
            eprintln!("snapshot seq {seq}: inodes {inos:?}");
        }
        let mut images: Vec<(BufferType, u64, LogImage)> = std::mem::take(&mut *self.extra.lock());
        let revokes = std::mem::take(&mut *self.revokes.lock());
        for ino in inos {
            let Some(h) = core.cached_handle(ino) else {
                continue;
            };
            let mut st = h.state.write();
            if st.deleted {
                continue;
            }
            // A shared writer logs only the directory pages it changed under its name
            // tokens; the inode and its block map are the metanode's.
            let shared = st.shared.is_some();
            // In key order: the same changes always give the same log (reproducible tests).
            let mut ind = st.indirect.lock();
            let mut keys: Vec<(u8, u64)> = ind
                .iter()
                .filter(|(_, n)| n.dirty)
                .map(|(k, _)| *k)
                .collect();
            keys.sort_unstable();
            if shared {
                keys.clear();
            }
            for k in keys {
                let node = ind.get_mut(&k).expect("dirty indirect block");
                images.push((
                    BufferType::Indirect,
                    ino,
                    LogImage::from_vec(node.da, node.block.encode(core.geo.indirect_bytes)),
                ));
                node.dirty = false;
            }
            drop(ind);
            let mut dirs = st.dir_blocks.lock();
            let mut keys: Vec<u64> = dirs
                .iter()
                .filter(|(_, n)| n.dirty)
                .map(|(k, _)| *k)
                .collect();
            keys.sort_unstable();
            for k in keys {
                let node = dirs.get_mut(&k).expect("dirty directory block");
                {
                    // Only the pages that changed: one insert logs one page.
                    let pb = node.page_bytes() as u64;
                    for p in 0..node.pages() {
                        if node.dirty_pages >> p & 1 == 1 {
                            images.push((
                                BufferType::Directory,
                                ino,
                                LogImage::from_vec(
                                    node.da.offset_by(p as u64 * pb),
                                    node.encode_page(p),
                                ),
                            ));
                        }
                    }
                    node.dirty = false;
                    node.dirty_pages = 0;
                }
            }
            drop(dirs);
            crate::xattr::take_images(core, &st, &mut images);
            if !shared {
                let (da, bytes) = core.encode_inode(&st.inode)?;
                images.push((BufferType::Inode, ino, LogImage::from_vec(da, bytes)));
            }
            st.dirty = false;
        }
        let m = core.metadata_inodes();
        for (region, pages) in core.alloc.take_dirty_pages(core.alloc_slot_bytes) {
            for (offset, bytes) in pages {
                for img in core.metafile_images(
                    m.block_alloc_map,
                    region as u64 * core.alloc_slot_bytes as u64 + offset,
                    &bytes,
                )? {
                    images.push((BufferType::AllocMap, OWNER_ALLOC_MAP, img));
                }
            }
        }
        for (s, bytes) in core.imap.take_dirty() {
            for img in core.metafile_images(m.inode_alloc_map, core.imap.slot_offset(s), &bytes)? {
                images.push((BufferType::InodeMap, OWNER_INODE_MAP, img));
            }
        }
        // Space freed by this transaction becomes reusable once it is checkpointed.
        core.alloc.end_transaction(seq);
        core.imap.end_transaction(seq);
        let owned: Vec<(BufferType, u64, Arc<LogImage>)> = images
            .into_iter()
            .map(|(k, o, i)| (k, o, Arc::new(i)))
            .collect();
        let mut pending = self.pending.write();
        let mut by_owner = self.by_owner.lock();
        for (kind, owner, img) in &owned {
            by_owner.entry(*owner).or_default().insert(img.da);
            let sectors = img.length as u64 / 512;
            self.pending_sectors_max
                .fetch_max(sectors, Ordering::Relaxed);
            let v = pending.entry(img.da).or_default();
            // Within one transaction a later image of an address replaces an earlier
            // one (a freed inode's slot reused at once).
            if v.last().is_some_and(|p| p.seq == seq) {
                if let Some(old) = v.pop() {
                    if old.owner != *owner && !v.iter().any(|q| q.owner == old.owner) {
                        forget_owner(&mut by_owner, old.owner, img.da);
                    }
                }
            }
            v.push(Pending {
                seq,
                kind: *kind,
                owner: *owner,
                image: img.clone(),
            });
        }
        let images = owned.into_iter().map(|(k, _, i)| (k, i)).collect();
        Ok((seq, images, revokes))
    }

    /// Write a snapshot to the log and make it durable (steps 4 of the module doc).
    fn write_txn(
        &self,
        core: &Core,
        seq: u64,
        images: &[(BufferType, Arc<LogImage>)],
        revokes: &[LogRevoke],
    ) -> FsResult<()> {
        let ordered = self.ordered_writes.swap(false, Ordering::AcqRel);
        if images.is_empty() && revokes.is_empty() {
            if ordered {
                self.barrier(core)?;
            }
            self.durable_seq.fetch_max(seq, Ordering::AcqRel);
            return Ok(());
        }
        let lsn = self.state.lock().head_lsn;
        if trace_enabled() {
            eprintln!("commit seq {seq} at lsn {lsn} ordered {ordered}:");
            for r in revokes {
                eprintln!("  revoke {} len {}", r.da, r.length);
            }
            for (k, i) in images {
                eprintln!(
                    "  {:?} {} len {} stored {}",
                    k,
                    i.da,
                    i.length,
                    i.bytes.len()
                );
            }
        }
        let bytes = encode_txn_with(
            self.node,
            self.fs_uuid,
            lsn,
            seq,
            revokes,
            images.iter().map(|(_, i)| &**i),
        );
        let len = bytes.len() as u64;
        if len > self.capacity {
            return Err(FsError::NoSpace(format!(
                "a log transaction of {len} bytes does not fit the recovery log of {} bytes; recreate the file system with a larger log (`mako fs create -L`)",
                self.capacity
            )));
        }
        if self.capacity - self.used_bytes() < len {
            // The log is full: write committed images in place to make room.
            self.checkpoint(core)?;
            if self.capacity - self.used_bytes() < len {
                // `hard_limit` keeps every transaction within half the log.
                return Err(core.integrity(crate::error::IntegrityError::new(
                    "recovery log",
                    format!(
                        "{} bytes free after a checkpoint, the transaction needs {len} (a Mako bug)",
                        self.capacity - self.used_bytes()
                    ),
                )));
            }
        }
        if ordered {
            // Data named by this transaction's pointers is on disk before the log says so.
            self.barrier(core)?;
        }
        self.write_log(core, lsn, &bytes)?;
        self.barrier(core)?;
        {
            let mut s = self.state.lock();
            debug_assert_eq!(s.head_lsn, lsn, "the log head moved during a commit");
            s.head_lsn = lsn + len;
            s.txns.push_back((seq, lsn));
        }
        self.durable_seq.fetch_max(seq, Ordering::AcqRel);
        self.stats.commits.fetch_add(1, Ordering::Relaxed);
        self.stats.commit_bytes.fetch_add(len, Ordering::Relaxed);
        self.stats
            .commit_images
            .fetch_add(images.len() as u64, Ordering::Relaxed);
        self.stats
            .commit_revokes
            .fetch_add(revokes.len() as u64, Ordering::Relaxed);
        Ok(())
    }

    fn barrier(&self, core: &Core) -> FsResult<()> {
        self.stats.barriers.fetch_add(1, Ordering::Relaxed);
        core.nsd.sync_all()?;
        Ok(())
    }

    /// Write `bytes` at `lsn` of the circular area (wrapping, and split at the log
    /// file's block boundaries).
    fn write_log(&self, core: &Core, lsn: u64, bytes: &[u8]) -> FsResult<()> {
        for (da, range) in log_extents(core, self.log_ino, self.capacity, lsn, bytes.len() as u64)?
        {
            core.nsd.write(
                da,
                &bytes[range],
                IoTag {
                    buffer_type: BufferType::Log,
                    ino: self.log_ino,
                },
            )?;
        }
        Ok(())
    }

    /// Write every durable committed image in place, then move the tail past the
    /// transactions that held them and release the space they freed.
    pub fn checkpoint(&self, core: &Core) -> FsResult<()> {
        let r = self.checkpoint_inner(core);
        if let Err(e) = &r {
            // The log's tail cannot move past metadata not written in place.
            core.log_write_failed("a checkpoint of the recovery log", e);
        }
        r
    }

    fn checkpoint_inner(&self, core: &Core) -> FsResult<()> {
        let _k = self.checkpoint_lock.lock();
        let upto = self.durable_seq();
        // The newest durable image of every address.
        let work: Vec<Pending> = self
            .pending
            .read()
            .values()
            .filter_map(|v| v.iter().rev().find(|p| p.seq <= upto).cloned())
            .collect();
        let mut bytes = 0u64;
        // 1. Images in place, in address order. Images that follow one another on a disk
        //    (consecutive inodes, the pages of a directory block) go out as one write:
        //    one I/O instead of one per 4 KiB page, and on a VM every I/O is an exit to
        //    the host (measured: the in-place writes of a create storm were 11% of all
        //    CPU, most of it in the virtio doorbell).
        let mut run = CheckpointRun::default();
        for p in &work {
            bytes += p.image.length as u64;
            if !run.append(&p.image, p.kind) {
                run.flush(core)?;
                if !run.append(&p.image, p.kind) {
                    core.nsd.write(
                        p.image.da,
                        &p.image.expanded(),
                        IoTag {
                            buffer_type: p.kind,
                            ino: 0,
                        },
                    )?;
                }
            }
        }
        run.flush(core)?;
        // 2. Durable before the log forgets them.
        self.barrier(core)?;
        // 3. The new tail: the first transaction not checkpointed, else the head.
        let (tail, head) = {
            let s = self.state.lock();
            let tail = s
                .txns
                .iter()
                .find(|(seq, _)| *seq > upto)
                .map(|(_, lsn)| *lsn)
                .unwrap_or(s.head_lsn);
            (tail, s.head_lsn)
        };
        // 4. The header says so, durably, before the space is reused.
        if trace_enabled() {
            eprintln!(
                "checkpoint upto seq {upto}: {} images, tail {tail} head {head}",
                work.len()
            );
        }
        self.write_header(core, tail, head, false)?;
        {
            let mut s = self.state.lock();
            s.tail_lsn = tail;
            while s.txns.front().is_some_and(|(seq, _)| *seq <= upto) {
                s.txns.pop_front();
            }
        }
        // 5. The overlay drops what is now in place (unless a newer image replaced it).
        {
            let mut pending = self.pending.write();
            let mut by_owner = self.by_owner.lock();
            for p in &work {
                if let Some(v) = pending.get_mut(&p.image.da) {
                    let dropped: Vec<u64> = v
                        .iter()
                        .filter(|q| q.seq <= upto)
                        .map(|q| q.owner)
                        .collect();
                    v.retain(|q| q.seq > upto);
                    for o in dropped {
                        if !v.iter().any(|q| q.owner == o) {
                            forget_owner(&mut by_owner, o, p.image.da);
                        }
                    }
                    if v.is_empty() {
                        pending.remove(&p.image.da);
                    }
                }
            }
        }
        // 6. Space freed by checkpointed transactions can be handed out again.
        core.alloc.release_frees(upto);
        core.imap.release_frees(upto);
        *self.last_checkpoint.lock() = Instant::now();
        self.stats.checkpoints.fetch_add(1, Ordering::Relaxed);
        self.stats
            .checkpoint_bytes
            .fetch_add(bytes, Ordering::Relaxed);
        Ok(())
    }

    /// Make `owner`'s metadata durable where the next holder of its token reads it: commit
    /// the running transaction, write `owner`'s committed images in place, sync, and
    /// drop them from the overlay so that no later checkpoint writes them again (another
    /// node may change them once the token has gone). Then revoke those images in the
    /// log, durably, before returning: they stay in the log until its tail passes them,
    /// and a replay of this log (after a crash of this node or of the whole cluster)
    /// must never lay them over what the next holder wrote since (docs/coherence.md
    /// section 7). Called by a revoke, with no handle open on this thread (section 5).
    pub fn write_in_place(&self, core: &Core, owner: u64) -> FsResult<()> {
        self.commit(core)?;
        let r = self.write_in_place_inner(core, owner);
        if let Err(e) = &r {
            core.log_write_failed("writing metadata in place for a revoke", e);
        }
        r
    }

    fn write_in_place_inner(&self, core: &Core, owner: u64) -> FsResult<()> {
        let k = self.checkpoint_lock.lock();
        let upto = self.durable_seq();
        let addresses: Vec<DiskAddress> = self
            .by_owner
            .lock()
            .get(&owner)
            .map(|s| s.iter().copied().collect())
            .unwrap_or_default();
        let work: Vec<Pending> = {
            let pending = self.pending.read();
            let mut work: Vec<Pending> = addresses
                .iter()
                .filter_map(|da| {
                    pending
                        .get(da)?
                        .iter()
                        .rev()
                        .find(|p| p.seq <= upto && p.owner == owner)
                        .cloned()
                })
                .collect();
            // In address order, as a checkpoint writes them (runs of adjacent images).
            work.sort_by_key(|p| p.image.da);
            work
        };
        if work.is_empty() {
            return Ok(());
        }
        let mut run = CheckpointRun::default();
        for p in &work {
            if !run.append(&p.image, p.kind) {
                run.flush(core)?;
                if !run.append(&p.image, p.kind) {
                    core.nsd.write(
                        p.image.da,
                        &p.image.expanded(),
                        IoTag {
                            buffer_type: p.kind,
                            ino: owner,
                        },
                    )?;
                }
            }
        }
        run.flush(core)?;
        // In place and durable before the log revokes the images: a revoke that reached
        // the log without them would leave only an older (or torn) copy to recover.
        self.barrier(core)?;
        {
            let mut pending = self.pending.write();
            let mut by_owner = self.by_owner.lock();
            for p in &work {
                if let Some(v) = pending.get_mut(&p.image.da) {
                    v.retain(|q| !(q.owner == owner && q.seq <= upto));
                    if !v.iter().any(|q| q.owner == owner) {
                        forget_owner(&mut by_owner, owner, p.image.da);
                    }
                    if v.is_empty() {
                        pending.remove(&p.image.da);
                    }
                }
            }
        }
        self.stats
            .revoke_writes
            .fetch_add(work.len() as u64, Ordering::Relaxed);
        if self.revoke_fault.load(Ordering::Relaxed) {
            return Ok(());
        }
        // The revokes cover transactions up to `upto` only: an image of the same address
        // committed meanwhile (numbered higher) is not in place and stays replayable.
        // Committed outside the checkpoint lock, which a commit into a full log takes.
        drop(k);
        self.revokes.lock().extend(work.iter().map(|p| LogRevoke {
            da: p.image.da,
            length: p.image.length,
            upto_seq: upto,
        }));
        // Any commit that takes them makes them durable before it releases the commit
        // lock, so when this one returns they are in the log.
        self.commit(core)
    }

    /// TEST ONLY: write no revoke records (`write_in_place` still writes in place), to
    /// show that the tests of shared-disk replay catch a log that lacks them.
    pub fn set_revoke_fault(&self, on: bool) {
        self.revoke_fault.store(on, Ordering::Relaxed);
    }

    pub fn since_checkpoint(&self) -> std::time::Duration {
        self.last_checkpoint.lock().elapsed()
    }

    /// Write both header copies and sync.
    pub fn write_header(&self, core: &Core, tail: u64, head: u64, clean: bool) -> FsResult<()> {
        let h = LogHeader {
            node: self.node,
            log_bytes: core.desc.lock().log_bytes,
            tail_lsn: tail,
            head_lsn: head,
            clean,
        };
        let bytes = h.encode();
        debug_assert_eq!(bytes.len(), LOG_HEADER_BYTES);
        for off in LOG_HEADER_OFFSETS {
            core.metafile_write(self.log_ino, off, &bytes, BufferType::Log)?;
        }
        self.barrier(core)
    }

    /// Overlay committed images not yet in place onto `buf`, just read from `da`.
    pub fn overlay(&self, da: DiskAddress, buf: &mut [u8]) {
        let pending = self.pending.read();
        if pending.is_empty() {
            return;
        }
        let max = self.pending_sectors_max.load(Ordering::Relaxed);
        let start = da.sector().saturating_sub(max);
        let end = da.sector() + (buf.len() as u64).div_ceil(512);
        let from = DiskAddress::new(da.disk(), start);
        let to = DiskAddress::new(da.disk(), end);
        for v in pending.range(from..to).map(|(_, v)| v) {
            if let Some(p) = v.last() {
                p.image.apply(da, buf);
            }
        }
    }

    /// Commit, write everything in place and leave the log empty (unmount, idle).
    pub fn quiesce(&self, core: &Core) -> FsResult<()> {
        self.commit(core)?;
        self.checkpoint(core)
    }
}

/// `MAKO_LOG_TRACE=1`: every commit, checkpoint and replayed transaction is printed to
/// stderr (makod.log) with its images — for debugging the log, never on by default.
pub fn trace_enabled() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var_os("MAKO_LOG_TRACE").is_some())
}

/// Bytes of the circular area of a log file of `log_bytes`.
pub fn log_capacity(log_bytes: u64) -> u64 {
    (log_bytes - LOG_RECORDS_OFFSET) / 512 * 512
}

/// Disk extents of `len` bytes at `lsn` of the circular area: (address, byte range
/// within the caller's buffer).
pub fn log_extents(
    core: &Core,
    log_ino: u64,
    capacity: u64,
    lsn: u64,
    len: u64,
) -> FsResult<Vec<(DiskAddress, std::ops::Range<usize>)>> {
    let bb = core.block_bytes();
    let mut out = Vec::new();
    let mut done = 0u64;
    while done < len {
        let pos = (lsn + done) % capacity;
        let file_off = LOG_RECORDS_OFFSET + pos;
        let to_wrap = capacity - pos;
        let to_block = bb - file_off % bb;
        let n = (len - done).min(to_wrap).min(to_block);
        out.push((
            core.metafile_da(log_ino, file_off)?,
            done as usize..(done + n) as usize,
        ));
        done += n;
    }
    Ok(out)
}

impl Core {
    /// The inode's encoding and where it lives; updates the cached inode-file chunk so
    /// that a later miss reads what was committed.
    pub fn encode_inode(
        &self,
        inode: &mako_format::inode::Inode,
    ) -> FsResult<(DiskAddress, Vec<u8>)> {
        let bytes = inode.encode(self.inode_bytes())?;
        let inode_file = self.metadata_inodes().inode_file;
        let off = inode.ino * self.inode_bytes() as u64;
        let da = self.metafile_da(inode_file, off)?;
        let chunk = self.inode_chunk_bytes();
        if let Some(slot) = self.pool.get((INODE_CACHE_KEY, off / chunk)) {
            let mut buf = slot.buf.lock();
            let within = (off % chunk) as usize;
            if buf.loaded && buf.bytes.len() >= within + bytes.len() {
                buf.bytes[within..within + bytes.len()].copy_from_slice(&bytes);
            }
        }
        Ok((da, bytes))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn image(disk: u32, sector: u64, len: u32, fill: u8) -> LogImage {
        let mut full = vec![fill; len as usize];
        // Trailing zeros are stored implied: the run must restore them.
        full[len as usize - 100..].fill(0);
        LogImage::from_vec(DiskAddress::new(disk, sector), full)
    }

    #[test]
    fn checkpoint_runs_gather_only_images_that_follow_one_another() {
        let mut run = CheckpointRun::default();
        assert!(run.append(&image(1, 80, 4096, 1), BufferType::Inode));
        assert!(
            run.append(&image(1, 88, 4096, 2), BufferType::Inode),
            "starts where the run ends"
        );
        assert!(
            !run.append(&image(1, 104, 4096, 3), BufferType::Inode),
            "a gap"
        );
        assert!(
            !run.append(&image(2, 96, 4096, 3), BufferType::Inode),
            "another disk"
        );
        assert!(
            !run.append(&image(1, 90, 4096, 3), BufferType::Inode),
            "overlaps the run"
        );
        assert_eq!(run.buf.len(), 8192);
        assert!(
            run.buf[..3996].iter().all(|&b| b == 1) && run.buf[3996..4096].iter().all(|&b| b == 0)
        );
        assert!(
            run.buf[4096..8092].iter().all(|&b| b == 2) && run.buf[8092..].iter().all(|&b| b == 0)
        );
        // A run stops growing at MAX_BYTES.
        let mut run = CheckpointRun::default();
        let n = CheckpointRun::MAX_BYTES / 4096;
        for i in 0..n as u64 {
            assert!(run.append(&image(0, 8 + i * 8, 4096, 7), BufferType::Inode));
        }
        assert!(!run.append(&image(0, 8 + n as u64 * 8, 4096, 7), BufferType::Inode));
        // An image whose length is not whole sectors is never gathered.
        let odd = LogImage {
            da: DiskAddress::new(0, 8),
            length: 700,
            bytes: vec![1; 700],
        };
        assert!(!CheckpointRun::default().append(&odd, BufferType::Inode));
    }
}
