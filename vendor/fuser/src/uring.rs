//! MAKO PATCH: FUSE over io_uring (kernel >= 6.14 with `CONFIG_FUSE_IO_URING` and
//! `/sys/module/fuse/parameters/enable_uring` set).
//!
//! Once `FUSE_OVER_IO_URING` was negotiated at INIT, one ring per CPU ("queue", as the
//! kernel counts them: every possible CPU must have registered entries before the kernel
//! uses any) registers `depth` entries with `FUSE_IO_URING_CMD_REGISTER`. Each entry is
//! a header (`fuse_uring_req_header`) and a payload buffer; the kernel fills one with a
//! request and completes the entry's command. The reply goes into the same buffers and
//! `FUSE_IO_URING_CMD_COMMIT_AND_FETCH` hands it to the kernel and the entry back for the
//! next request: one `io_uring_enter` per request instead of a read and a write on
//! `/dev/fuse`, and a request is served on the CPU that issued it.
//!
//! Requests are laid out again as `/dev/fuse` delivers them (in header, op header,
//! payload) and dispatched by the same code as the `/dev/fuse` loop; a reply reaches the
//! ring through [`ChannelSender`](crate::channel::ChannelSender), which carries the
//! entry it answers. Until every queue is registered, and for FORGET and INTERRUPT always,
//! the kernel keeps sending requests through `/dev/fuse`, whose loop keeps running. If the
//! kernel refuses a registration it falls back to `/dev/fuse` by itself; the session then
//! reports that transport.

use std::alloc::Layout;
use std::io;
use std::io::IoSlice;
use std::os::fd::AsRawFd;
use std::os::fd::FromRawFd;
use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::sync::atomic::AtomicU8;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering;

use io_uring::IoUring;
use io_uring::cqueue;
use io_uring::opcode;
use io_uring::squeue;
use io_uring::types;
use log::error;
use parking_lot::Mutex;

use crate::Filesystem;
use crate::ReplyEmpty;
use crate::channel::ChannelSender;
use crate::dev_fuse::DevFuse;
use crate::ll::Operation;
use crate::request::RequestWithSender;
use crate::session::SessionEventLoop;

const CMD_REGISTER: u8 = 1;
const CMD_COMMIT_AND_FETCH: u8 = 2;

/// `sizeof(struct fuse_uring_req_header)`: in/out header (128), op header (128),
/// `fuse_uring_ent_in_out` (32).
const REQ_HEADER_SIZE: usize = 288;
const OP_IN_OFFSET: usize = 128;
const OP_IN_SIZE: usize = 128;
const ENT_COMMIT_ID: usize = 264;
const ENT_PAYLOAD_SZ: usize = 272;
const IN_HEADER_SIZE: usize = 40;
const OUT_HEADER_SIZE: usize = 16;

/// `user_data` of the eventfd poll that ends a queue's threads.
const STOP: u64 = u64::MAX;
/// `user_data` of the eventfd poll that hands a queue's threads the commits of replies
/// sent from other threads.
const KICK: u64 = u64::MAX - 1;

/// A job for a queue's first thread, once the session runs.
pub(crate) type Job = Box<dyn FnOnce() + Send>;

std::thread_local! {
    /// The queue whose thread this is, if it is one.
    static ON_QUEUE: std::cell::Cell<*const RingQueue> = const { std::cell::Cell::new(std::ptr::null()) };
}

/// How requests reach this session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Transport {
    /// The `/dev/fuse` read/write loop; the reason io_uring is not in use.
    DevFuse(String),
    /// FUSE over io_uring: this many queues (one per CPU) of this many entries.
    IoUring {
        /// Queues, one per possible CPU.
        queues: usize,
        /// Entries per queue.
        depth: usize,
    },
}

impl std::fmt::Display for Transport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Transport::DevFuse(why) => write!(f, "/dev/fuse ({why})"),
            Transport::IoUring { queues, depth } => {
                write!(f, "io_uring ({queues} queues x {depth} entries)")
            }
        }
    }
}

/// A page-aligned, zeroed buffer the kernel reads and writes.
struct PageBuf {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: a plain heap buffer; who writes it when is ruled by the entry's protocol
// (the kernel between fetch and completion, the one request's handler after).
unsafe impl Send for PageBuf {}
unsafe impl Sync for PageBuf {}

impl PageBuf {
    fn new(len: usize) -> io::Result<Self> {
        let layout = Layout::from_size_align(len.max(4096), 4096).map_err(io::Error::other)?;
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        if ptr.is_null() {
            return Err(io::Error::from(io::ErrorKind::OutOfMemory));
        }
        Ok(Self {
            ptr,
            len: len.max(4096),
        })
    }
}

impl Drop for PageBuf {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout.
        unsafe {
            std::alloc::dealloc(
                self.ptr,
                Layout::from_size_align_unchecked(self.len, 4096),
            )
        };
    }
}

struct RingEnt {
    header: PageBuf,
    payload: PageBuf,
    payload_size: usize,
    /// The two buffers, as `FUSE_IO_URING_CMD_REGISTER` wants them.
    iov: Box<[libc::iovec; 2]>,
    commit_id: AtomicU64,
    last_cmd: AtomicU8,
}

// SAFETY: `iov` only points into the entry's own buffers.
unsafe impl Send for RingEnt {}
unsafe impl Sync for RingEnt {}

/// One queue: a ring bound to one CPU and its entries.
pub(crate) struct RingQueue {
    // Dropped first: closing the ring cancels the commands that point into `ents`.
    ring: IoUring<squeue::Entry128, cqueue::Entry>,
    qid: u16,
    dev: Arc<DevFuse>,
    ents: Vec<RingEnt>,
    /// Serializes pushes to the submission queue (replies come from any thread).
    sq: Mutex<()>,
    /// Held by the thread that reaps the completion queue.
    cq: Mutex<()>,
    stop: AtomicBool,
    stop_fd: OwnedFd,
    /// Commits of replies sent from other threads, and the eventfd that says so.
    pending: Mutex<Vec<squeue::Entry128>>,
    kick_fd: OwnedFd,
    /// Completions read while checking the registrations.
    early: Mutex<Vec<cqueue::Entry>>,
}

impl std::fmt::Debug for RingQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "RingQueue({})", self.qid)
    }
}

/// The ring entry a request came in on, for its reply.
#[derive(Debug, Clone)]
pub(crate) struct RingSlot {
    queue: Arc<RingQueue>,
    idx: usize,
}

fn cmd_area(commit_id: u64, qid: u16) -> [u8; 80] {
    // struct fuse_uring_cmd_req { u64 flags; u64 commit_id; u16 qid; u8 padding[6]; }
    let mut cmd = [0u8; 80];
    cmd[8..16].copy_from_slice(&commit_id.to_ne_bytes());
    cmd[16..18].copy_from_slice(&qid.to_ne_bytes());
    cmd
}

impl RingQueue {
    fn sqe(&self, idx: usize, cmd: u8) -> squeue::Entry128 {
        let ent = &self.ents[idx];
        let (commit_id, addr) = if cmd == CMD_REGISTER {
            (0, ent.iov.as_ptr() as u64)
        } else {
            (ent.commit_id.load(Ordering::Acquire), 0)
        };
        let e = opcode::UringCmd80::new(types::Fd(self.dev.as_raw_fd()), u32::from(cmd))
            .cmd(cmd_area(commit_id, self.qid))
            .addr(Some(addr))
            .build()
            .user_data(idx as u64);
        if cmd != CMD_REGISTER {
            return e;
        }
        // The kernel wants `sqe->len` = 2 (the iovec count), which the builder cannot set:
        // `len` is the u32 at offset 24 of `struct io_uring_sqe`.
        // SAFETY: `Entry128` is `repr(C)`, 128 bytes, plain data.
        let mut raw: [u8; 128] = unsafe { std::mem::transmute(e) };
        raw[24..28].copy_from_slice(&2u32.to_ne_bytes());
        // SAFETY: as above.
        unsafe { std::mem::transmute::<[u8; 128], squeue::Entry128>(raw) }
    }

    fn submit(&self, entries: &[squeue::Entry128]) -> io::Result<()> {
        let _g = self.sq.lock();
        // SAFETY: `sq` serializes every access to the submission queue.
        unsafe {
            let mut sq = self.ring.submission_shared();
            sq.push_multiple(entries)
                .map_err(|_| io::Error::other("io_uring submission queue full"))?;
        }
        loop {
            match self.ring.submitter().submit() {
                Ok(_) => return Ok(()),
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
                Err(e) => return Err(e),
            }
        }
    }

    /// Submits a command for an entry. Only the queue's own threads issue commands: the
    /// kernel hands an entry its next request through task work of the thread that
    /// issued the entry's command, so that thread must live as long as the queue and
    /// never wait on this file system (the thread that mounted does, for one). A reply
    /// sent from any other thread is queued and the queue's threads are woken to issue it.
    fn send(&self, cmd: u8, idx: usize) -> io::Result<()> {
        self.ents[idx].last_cmd.store(cmd, Ordering::Relaxed);
        let sqe = self.sqe(idx, cmd);
        if ON_QUEUE.with(|q| q.get()) == self as *const RingQueue {
            return self.submit(&[sqe]);
        }
        self.pending.lock().push(sqe);
        let one = 1u64.to_ne_bytes();
        // SAFETY: writing 8 bytes from a local to our eventfd.
        if unsafe { libc::write(self.kick_fd.as_raw_fd(), one.as_ptr().cast(), 8) } != 8 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    fn kick_poll(&self) -> squeue::Entry128 {
        opcode::PollAdd::new(types::Fd(self.kick_fd.as_raw_fd()), libc::POLLIN as u32)
            .build()
            .user_data(KICK)
            .into()
    }

    /// Issues the commits queued by other threads and arms the wake-up again.
    fn issue_pending(&self) -> io::Result<()> {
        let mut count = [0u8; 8];
        // SAFETY: reading 8 bytes into a local from our (non-blocking) eventfd.
        let _ = unsafe { libc::read(self.kick_fd.as_raw_fd(), count.as_mut_ptr().cast(), 8) };
        let mut sqes = std::mem::take(&mut *self.pending.lock());
        sqes.push(self.kick_poll());
        self.submit(&sqes)
    }

    /// The next completion, waiting for one; `None` once the queue is stopped.
    fn next_completion(&self) -> Option<(u64, i32)> {
        let _g = self.cq.lock();
        loop {
            if self.stop.load(Ordering::Acquire) {
                return None;
            }
            let early = self.early.lock().pop();
            // SAFETY: `cq` makes this thread the only reader of the completion queue.
            let next = early.or_else(|| unsafe { self.ring.completion_shared().next() });
            if let Some(cqe) = next {
                if cqe.user_data() == STOP {
                    self.stop.store(true, Ordering::Release);
                    return None;
                }
                if cqe.user_data() == KICK {
                    if let Err(e) = self.issue_pending() {
                        error!("FUSE io_uring queue {}: issuing replies: {e}", self.qid);
                    }
                    continue;
                }
                return Some((cqe.user_data(), cqe.result()));
            }
            // SAFETY: wait only (nothing to submit), no argument.
            let r = unsafe {
                self.ring
                    .submitter()
                    .enter::<libc::sigset_t>(0, 1, 1 /* IORING_ENTER_GETEVENTS */, None)
            };
            if let Err(e) = r {
                if e.raw_os_error() != Some(libc::EINTR) {
                    error!("FUSE io_uring queue {}: waiting: {e}", self.qid);
                    self.stop.store(true, Ordering::Release);
                    return None;
                }
            }
        }
    }

    /// Ends the queue's threads.
    pub(crate) fn stop(&self) {
        let one = 1u64.to_ne_bytes();
        // SAFETY: writing 8 bytes from a local to our eventfd.
        let _ = unsafe { libc::write(self.stop_fd.as_raw_fd(), one.as_ptr().cast(), 8) };
    }

    /// The error of a registration the kernel refused, if any (it answers at once).
    fn registration_error(&self) -> Option<i32> {
        let _g = self.cq.lock();
        // SAFETY: as in `next_completion`. A completion that is a request is left in
        // place: it is read only if it is an error (the command ended).
        let mut cq = unsafe { self.ring.completion_shared() };
        cq.sync();
        let mut err = None;
        let mut kept = Vec::new();
        for cqe in &mut cq {
            if cqe.result() < 0 && cqe.user_data() < KICK {
                err = Some(-cqe.result());
            } else {
                kept.push(cqe);
            }
        }
        drop(cq);
        // A request the kernel fetched already (possible on the last queue to
        // register) is served first by the queue's threads.
        self.early.lock().extend(kept);
        err
    }
}

impl RingSlot {
    /// Writes the reply (out header, then the payload) into the entry and commits it.
    pub(crate) fn send(&self, bufs: &[IoSlice<'_>]) -> io::Result<()> {
        let q = &self.queue;
        let ent = &q.ents[self.idx];
        let header = bufs.first().map(|b| &b[..]).unwrap_or(&[]);
        let payload_len: usize = bufs.iter().skip(1).map(|b| b.len()).sum();
        // SAFETY: the entry is ours between the kernel's completion and this commit;
        // the header buffer is a page.
        unsafe {
            if header.len() != OUT_HEADER_SIZE || payload_len > ent.payload_size {
                error!(
                    "FUSE io_uring reply of {payload_len} bytes does not fit {}",
                    ent.payload_size
                );
                // Answer EIO: keep the unique, set the error, no payload.
                let h = ent.header.ptr;
                std::ptr::copy_nonoverlapping(header.as_ptr(), h, header.len().min(16));
                std::ptr::copy_nonoverlapping(
                    (-libc::EIO).to_ne_bytes().as_ptr(),
                    h.add(4),
                    4,
                );
                std::ptr::copy_nonoverlapping(
                    0u32.to_ne_bytes().as_ptr(),
                    h.add(ENT_PAYLOAD_SZ),
                    4,
                );
            } else {
                std::ptr::copy_nonoverlapping(header.as_ptr(), ent.header.ptr, OUT_HEADER_SIZE);
                let mut off = 0;
                for b in &bufs[1..] {
                    std::ptr::copy_nonoverlapping(b.as_ptr(), ent.payload.ptr.add(off), b.len());
                    off += b.len();
                }
                std::ptr::copy_nonoverlapping(
                    (payload_len as u32).to_ne_bytes().as_ptr(),
                    ent.header.ptr.add(ENT_PAYLOAD_SZ),
                    4,
                );
            }
        }
        q.send(CMD_COMMIT_AND_FETCH, self.idx)
    }
}

/// The number of queues the kernel expects: one per possible CPU.
fn possible_cpus() -> usize {
    if let Ok(s) = std::fs::read_to_string("/sys/devices/system/cpu/possible") {
        // "0-3" or "0" or "0-1,4-5": the highest CPU number + 1.
        if let Some(max) = s
            .trim()
            .split([',', '-'])
            .filter_map(|n| n.parse::<usize>().ok())
            .max()
        {
            return max + 1;
        }
    }
    // SAFETY: sysconf has no preconditions.
    let n = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_CONF) };
    usize::try_from(n).unwrap_or(1).max(1)
}

/// Whether the fuse module offers io_uring (`enable_uring`), for the log line.
pub(crate) fn module_enabled() -> Option<bool> {
    std::fs::read_to_string("/sys/module/fuse/parameters/enable_uring")
        .ok()
        .map(|s| s.trim() == "Y")
}

/// A queue's first thread, started at set-up: it registers the queue's entries and
/// later serves the queue (see `RingQueue::send` for why the same thread).
pub(crate) struct Lead {
    pub(crate) job: std::sync::mpsc::Sender<Job>,
    pub(crate) thread: std::thread::JoinHandle<()>,
}

impl std::fmt::Debug for Lead {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Lead")
    }
}

/// Sets up and registers every queue, each from its first thread. On error the queues
/// made so far are returned too: their commands may be pending in the kernel, so their
/// buffers must live on until the connection ends.
pub(crate) fn start(
    dev: &Arc<DevFuse>,
    depth: usize,
    payload_size: usize,
) -> (Vec<Arc<RingQueue>>, Vec<Lead>, io::Result<()>) {
    let mut queues: Vec<Arc<RingQueue>> = Vec::new();
    let mut leads = Vec::new();
    let n = possible_cpus();
    for qid in 0..n {
        match new_queue(dev, qid as u16, depth, payload_size) {
            Ok(q) => queues.push(Arc::new(q)),
            Err(e) => return (queues, leads, Err(e)),
        }
    }
    for q in &queues {
        let (job_tx, job_rx) = std::sync::mpsc::channel::<Job>();
        let (res_tx, res_rx) = std::sync::mpsc::sync_channel::<io::Result<()>>(1);
        let queue = q.clone();
        let thread = std::thread::Builder::new()
            .name(format!("fuser-ring-{}-0", q.qid))
            .spawn(move || {
                ON_QUEUE.with(|c| c.set(Arc::as_ptr(&queue)));
                pin_to_cpu(queue.qid);
                let _ = res_tx.send(register(&queue, depth));
                drop(queue);
                if let Ok(job) = job_rx.recv() {
                    job();
                }
            });
        let thread = match thread {
            Ok(t) => t,
            Err(e) => return (queues, leads, Err(e)),
        };
        leads.push(Lead { job: job_tx, thread });
        let res = res_rx
            .recv()
            .unwrap_or_else(|_| Err(io::Error::other("io_uring queue thread ended")));
        if let Err(e) = res {
            return (queues, leads, Err(e));
        }
    }
    (queues, leads, Ok(()))
}

fn register(q: &RingQueue, depth: usize) -> io::Result<()> {
    let mut sqes: Vec<squeue::Entry128> = (0..depth)
        .map(|i| {
            q.ents[i].last_cmd.store(CMD_REGISTER, Ordering::Relaxed);
            q.sqe(i, CMD_REGISTER)
        })
        .collect();
    sqes.push(
        opcode::PollAdd::new(types::Fd(q.stop_fd.as_raw_fd()), libc::POLLIN as u32)
            .build()
            .user_data(STOP)
            .into(),
    );
    sqes.push(q.kick_poll());
    q.submit(&sqes)?;
    if let Some(errno) = q.registration_error() {
        let e = io::Error::from_raw_os_error(errno);
        return Err(io::Error::new(
            e.kind(),
            format!(
                "the kernel refused FUSE_IO_URING_CMD_REGISTER on queue {}: {e}",
                q.qid
            ),
        ));
    }
    Ok(())
}

fn pin_to_cpu(qid: u16) {
    // Serve the requests of this CPU on this CPU (best effort).
    // SAFETY: a zeroed cpu_set_t is valid; CPU_SET stays in bounds for qid < 1024.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if usize::from(qid) < 1024 {
            libc::CPU_SET(usize::from(qid), &mut set);
            libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
        }
    }
}

fn new_queue(
    dev: &Arc<DevFuse>,
    qid: u16,
    depth: usize,
    payload_size: usize,
) -> io::Result<RingQueue> {
    let entries = u32::try_from(depth + 1).map_err(io::Error::other)?;
    let ring = IoUring::<squeue::Entry128, cqueue::Entry>::builder()
        .setup_cqsize(entries * 2)
        .build(entries)?;
    // SAFETY: eventfd has no memory preconditions; the result is checked.
    let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a new descriptor we own.
    let stop_fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: as above.
    let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a new descriptor we own.
    let kick_fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let mut ents = Vec::with_capacity(depth);
    for _ in 0..depth {
        let header = PageBuf::new(REQ_HEADER_SIZE)?;
        let payload = PageBuf::new(payload_size)?;
        let iov = Box::new([
            libc::iovec {
                iov_base: header.ptr.cast(),
                iov_len: REQ_HEADER_SIZE,
            },
            libc::iovec {
                iov_base: payload.ptr.cast(),
                iov_len: payload_size,
            },
        ]);
        ents.push(RingEnt {
            header,
            payload,
            payload_size,
            iov,
            commit_id: AtomicU64::new(0),
            last_cmd: AtomicU8::new(CMD_REGISTER),
        });
    }
    Ok(RingQueue {
        ring,
        qid,
        dev: dev.clone(),
        ents,
        sq: Mutex::new(()),
        cq: Mutex::new(()),
        stop: AtomicBool::new(false),
        stop_fd,
        pending: Mutex::new(Vec::new()),
        kick_fd,
        early: Mutex::new(Vec::new()),
    })
}

/// One of a queue's threads: takes the next request, dispatches it as the `/dev/fuse`
/// loop does, until the queue is stopped.
pub(crate) fn queue_loop<FS: Filesystem>(queue: Arc<RingQueue>, se: SessionEventLoop<FS>) {
    ON_QUEUE.with(|c| c.set(Arc::as_ptr(&queue)));
    pin_to_cpu(queue.qid);
    let mut buf: Vec<u8> = Vec::new();
    while let Some((idx, res)) = queue.next_completion() {
        let idx = idx as usize;
        if idx >= queue.ents.len() {
            continue;
        }
        if res == -libc::EAGAIN || res == -libc::EINTR {
            let cmd = queue.ents[idx].last_cmd.load(Ordering::Relaxed);
            if let Err(e) = queue.send(cmd, idx) {
                error!("FUSE io_uring queue {}: resubmitting: {e}", queue.qid);
            }
            continue;
        }
        if res < 0 {
            // ENOTCONN: the connection ended (unmount); the entry is done.
            if res == -libc::ENOTCONN {
                log::debug!("FUSE io_uring queue {} entry {idx}: ended", queue.qid);
            } else {
                error!(
                    "FUSE io_uring queue {} entry {idx}: {}",
                    queue.qid,
                    io::Error::from_raw_os_error(-res)
                );
            }
            continue;
        }
        let ent = &queue.ents[idx];
        // SAFETY: the kernel completed the entry's command: the buffers are ours until
        // the reply commits it. The header buffer is a page.
        let (in_len, commit_id, payload_sz) = unsafe {
            let h = ent.header.ptr;
            let rd32 = |o: usize| u32::from_ne_bytes(*(h.add(o) as *const [u8; 4]));
            let rd64 = |o: usize| u64::from_ne_bytes(*(h.add(o) as *const [u8; 8]));
            (
                rd32(0) as usize,
                rd64(ENT_COMMIT_ID),
                rd32(ENT_PAYLOAD_SZ) as usize,
            )
        };
        ent.commit_id.store(commit_id, Ordering::Release);
        let op_in = in_len
            .checked_sub(IN_HEADER_SIZE + payload_sz)
            .filter(|&n| n <= OP_IN_SIZE && payload_sz <= ent.payload_size);
        let slot = RingSlot {
            queue: queue.clone(),
            idx,
        };
        let sender = ChannelSender::ring(queue.dev.clone(), slot.clone());
        let Some(op_in) = op_in else {
            error!(
                "FUSE io_uring queue {}: malformed request (len {in_len}, payload {payload_sz})",
                queue.qid
            );
            fail(&slot, ent);
            continue;
        };
        buf.clear();
        // SAFETY: lengths checked against the buffers above.
        unsafe {
            let h = ent.header.ptr;
            buf.extend_from_slice(std::slice::from_raw_parts(h, IN_HEADER_SIZE));
            buf.extend_from_slice(std::slice::from_raw_parts(h.add(OP_IN_OFFSET), op_in));
            buf.extend_from_slice(std::slice::from_raw_parts(ent.payload.ptr, payload_sz));
        }
        match RequestWithSender::new(sender, &buf) {
            Some(req) => {
                if let Ok(Operation::Destroy(_)) = req.request.operation() {
                    req.reply::<ReplyEmpty>().ok();
                } else {
                    req.dispatch(&se);
                }
            }
            None => fail(&slot, ent),
        }
    }
}

/// Answers EIO to a request that cannot be parsed, so that its entry comes back.
fn fail(slot: &RingSlot, ent: &RingEnt) {
    // SAFETY: the header buffer is a page; the unique is at offset 8 of the in header.
    let unique = unsafe { u64::from_ne_bytes(*(ent.header.ptr.add(8) as *const [u8; 8])) };
    let mut out = [0u8; OUT_HEADER_SIZE];
    out[0..4].copy_from_slice(&(OUT_HEADER_SIZE as u32).to_ne_bytes());
    out[4..8].copy_from_slice(&(-libc::EIO).to_ne_bytes());
    out[8..16].copy_from_slice(&unique.to_ne_bytes());
    if let Err(e) = slot.send(&[IoSlice::new(&out)]) {
        error!("FUSE io_uring: answering a malformed request: {e}");
    }
}
