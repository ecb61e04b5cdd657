//! `TcpTransport`: `mako_rt::Transport` over TCP. Each node opens its own connections
//! to each other node it calls (`maxTcpConnsPerNodeConn` lanes, some reserved for small
//! messages) and serves the connections other nodes open to it (`server.rs`).
//!
//! Callers are synchronous threads (FUSE workers, handler threads): a call queues its
//! frame on a connection's writer task and waits on a channel of its own with the
//! call's deadline; the connection's reader task delivers the reply by request id. A
//! reply whose caller has given up finds no waiter and is dropped. Sockets live on a
//! small tokio runtime owned by the transport; nothing a caller does blocks it.

use crate::auth::{self, Role, Transcript};
use crate::config::RpcConfig;
use crate::io::{send_control, write_frames, OutFrame};
use crate::server::{self, read_control, HandshakeFail, READ_BUFFER_BYTES};
use crate::stats::{Counters, RpcStats};
use crate::wire::{
    decode_body, read_frame, Auth, AuthV2, FrameError, Header, Hello, HelloAck, Kind, LaneClass,
    Refuse, WireError, FLAG_BULK, FLAG_RESENT, VERSION_MAX, VERSION_MIN, VERSION_RESEND,
};
use bytes::Bytes;
use mako_rt::{CallOptions, NodeId, Priority, Registry, ServiceId, Transport, TransportError};
use parking_lot::{Condvar, Mutex, RwLock};
use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::mpsc::{sync_channel, Receiver, RecvTimeoutError, SyncSender};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::BufReader;
use tokio::net::tcp::OwnedReadHalf;
use tokio::net::TcpStream;
use tokio::runtime::{Handle, Runtime, RuntimeFlavor};
use tokio::sync::mpsc::{unbounded_channel, UnboundedSender};
use tokio::sync::Semaphore;
use tokio::task::AbortHandle;

/// Why a transport could not start.
#[derive(Debug, thiserror::Error)]
pub enum RpcError {
    #[error("invalid RPC configuration: {0}")]
    Config(String),
    #[error("cannot listen on {addr}: {source} (is another daemon using tscTcpPort?)")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("cannot start the RPC runtime: {0}")]
    Runtime(std::io::Error),
}

/// State shared by the transport's callers, its tasks and its handler threads.
pub(crate) struct Inner {
    pub me: NodeId,
    pub config: RpcConfig,
    pub registry: Arc<Registry>,
    pub handle: Handle,
    pub stats: Counters,
    pub small_handlers: Arc<Semaphore>,
    pub bulk_handlers: Arc<Semaphore>,
    /// Open incoming (served) connections.
    pub inbound: AtomicUsize,
    peers: RwLock<BTreeMap<NodeId, SocketAddr>>,
    /// Nodes removed from the cluster: their handshakes are refused, even with the key.
    pub removed: RwLock<std::collections::BTreeSet<NodeId>>,
    /// Per node, how many times calls waiting for it were told to give up
    /// (`TcpTransport::give_up_on`: it was expelled).
    given_up: Mutex<HashMap<NodeId, u64>>,
    lanes: Mutex<HashMap<NodeId, Arc<[Arc<Lane>]>>>,
    /// Lane indices a small message may use, and those a large one may use.
    small_lanes: Vec<usize>,
    bulk_lanes: Vec<usize>,
    next_lane: AtomicUsize,
    closed: AtomicBool,
    started: Instant,
    /// Drawn at start: request ids are unique under it, so a server recognises a
    /// request sent again (version 2).
    incarnation: u64,
    ids: Mutex<Ids>,
    /// The server side's memory of its clients' requests (`dedup`).
    pub dedup: crate::dedup::Dedup,
    /// Served connections: a duplicate of each socket, to shut it down from outside.
    pub inbound_ctl: Mutex<HashMap<u64, (NodeId, std::net::TcpStream)>>,
    pub inbound_seq: AtomicU64,
}

/// Request ids, and per peer the ids still waiting for an answer (their lowest is
/// what requests acknowledge: every lower id to that peer is done).
#[derive(Default)]
struct Ids {
    next: u64,
    waiting: HashMap<NodeId, std::collections::BTreeSet<u64>>,
}

/// How often a request is sent again after its connection closed before its answer.
const RESENDS_MAX: u32 = 3;

/// One of the connections to a peer, made on demand and remade after it closes.
struct Lane {
    node: NodeId,
    class: LaneClass,
    state: Mutex<LaneState>,
    changed: Condvar,
}

#[derive(Default)]
struct LaneState {
    conn: Option<Arc<Conn>>,
    /// An attempt to connect is running (its number is `attempt`).
    connecting: bool,
    attempt: u64,
    /// Why the last attempt failed, with its number.
    failed: Option<(u64, String)>,
}

/// An established, authenticated outgoing connection.
struct Conn {
    node: NodeId,
    peer: SocketAddr,
    version: u16,
    tx: UnboundedSender<OutFrame>,
    pending: Mutex<Pending>,
    /// Milliseconds since the transport started at the last frame sent or received.
    last_used_ms: AtomicU64,
    tasks: Mutex<Vec<AbortHandle>>,
}

struct Pending {
    open: bool,
    calls: HashMap<u64, Waiter>,
}

struct Waiter {
    service: ServiceId,
    deadline: Duration,
    reply: SyncSender<Answer>,
}

/// What a waiting call receives.
enum Answer {
    /// The reply, or the server's error answer.
    Done(Result<Bytes, TransportError>),
    /// The connection closed before an answer came: the request may or may not have
    /// run (a version 2 call is sent again; the server runs it once).
    Closed(TransportError),
}

/// A request on its way: what `finish` needs to wait for the reply.
struct InFlight {
    conn: Arc<Conn>,
    id: u64,
    /// `Inner::given_up` of `to` when the call was queued.
    given_up: u64,
    reply: Receiver<Answer>,
    to: NodeId,
    service: ServiceId,
    options: CallOptions,
    deadline: Instant,
    request: Bytes,
}

/// Why a call could not start on a connection.
enum StartError {
    /// The connection closed before the call was queued: take another.
    Closed,
}

/// Runs `f`, which may block, without starving a tokio runtime whose worker thread
/// the caller happens to be on: the core's synchronous calls come from FUSE threads,
/// handler threads, and possibly from async code.
fn blocking<R>(f: impl FnOnce() -> R) -> R {
    match Handle::try_current() {
        Ok(h) if h.runtime_flavor() == RuntimeFlavor::MultiThread => tokio::task::block_in_place(f),
        // Outside a runtime (the usual case) or on a current-thread runtime, which
        // cannot hand its thread over: block it. Our own I/O runs on our own runtime,
        // so the call still completes.
        _ => f(),
    }
}

fn unreachable(node: NodeId, reason: impl Into<String>) -> TransportError {
    TransportError::Unreachable {
        node,
        reason: reason.into(),
    }
}

impl Inner {
    fn now_ms(&self) -> u64 {
        u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    fn address(&self, node: NodeId) -> Option<SocketAddr> {
        self.peers.read().get(&node).copied()
    }

    fn lanes_of(&self, node: NodeId) -> Arc<[Arc<Lane>]> {
        let mut lanes = self.lanes.lock();
        lanes
            .entry(node)
            .or_insert_with(|| {
                self.config
                    .lane_classes()
                    .into_iter()
                    .map(|class| {
                        Arc::new(Lane {
                            node,
                            class,
                            state: Mutex::new(LaneState::default()),
                            changed: Condvar::new(),
                        })
                    })
                    .collect()
            })
            .clone()
    }

    /// Which lane a request goes on: small lanes only for small-priority requests up
    /// to `tscSmallMsgSizeThreshold`, so a revoke never queues behind a block.
    fn pick_lane(&self, priority: Priority, len: usize) -> usize {
        let small = priority == Priority::Small && len <= self.config.small_msg_size_threshold;
        let class = if small && !self.small_lanes.is_empty() {
            &self.small_lanes
        } else {
            &self.bulk_lanes
        };
        class[self.next_lane.fetch_add(1, Relaxed) % class.len()]
    }

    /// Queues a request; the reply is waited for by `finish`.
    fn start(
        self: &Arc<Self>,
        to: NodeId,
        service: ServiceId,
        request: Bytes,
        options: CallOptions,
    ) -> Result<InFlight, TransportError> {
        let deadline = Instant::now()
            .checked_add(options.deadline)
            .unwrap_or_else(|| Instant::now() + Duration::from_secs(86_400 * 365));
        if request.len() > self.config.max_frame_bytes {
            // Sent, it would make the peer close the connection and fail every other
            // call on it.
            return Err(TransportError::Encode {
                what: "request",
                reason: format!(
                    "{} bytes exceed the frame limit of {} bytes",
                    request.len(),
                    self.config.max_frame_bytes
                ),
            });
        }
        let id = self.new_id(to);
        let started = self.start_with_id(to, service, request, options, deadline, id, false);
        if started.is_err() {
            self.done_id(to, id);
        }
        started
    }

    /// A new request id for a call to `to`, waiting until `done_id`. Allocated and
    /// registered under one lock, so no lower id can be registered after a request
    /// acknowledged everything below it.
    fn new_id(&self, to: NodeId) -> u64 {
        let mut ids = self.ids.lock();
        ids.next += 1;
        let id = ids.next;
        ids.waiting.entry(to).or_default().insert(id);
        id
    }

    fn done_id(&self, to: NodeId, id: u64) {
        let mut ids = self.ids.lock();
        if let Some(w) = ids.waiting.get_mut(&to) {
            w.remove(&id);
            if w.is_empty() {
                ids.waiting.remove(&to);
            }
        }
    }

    /// What a request `id` to `to` acknowledges: the distance down to the lowest id
    /// still waiting (every id to `to` below that is done).
    fn acked(&self, to: NodeId, id: u64) -> u16 {
        let ids = self.ids.lock();
        let lowest = ids
            .waiting
            .get(&to)
            .and_then(|w| w.first().copied())
            .unwrap_or(id)
            .min(id);
        u16::try_from(id - lowest).unwrap_or(u16::MAX)
    }

    /// Queues request `id` on a connection to `to` (`resent`: a copy after its
    /// connection closed).
    #[allow(clippy::too_many_arguments)]
    fn start_with_id(
        self: &Arc<Self>,
        to: NodeId,
        service: ServiceId,
        request: Bytes,
        options: CallOptions,
        deadline: Instant,
        id: u64,
        resent: bool,
    ) -> Result<InFlight, TransportError> {
        let lanes = self.lanes_of(to);
        let timeout = TransportError::Timeout {
            node: to,
            service,
            deadline: options.deadline,
        };
        // A connection may close between being taken and being used (idle timeout,
        // peer restart); a fresh one is taken then, a bounded number of times.
        for _ in 0..3 {
            if self.closed.load(Relaxed) {
                return Err(unreachable(to, "this node's transport has shut down"));
            }
            let lane = &lanes[self.pick_lane(options.priority, request.len())];
            let conn = match lane.get(self, deadline) {
                Ok(conn) => conn,
                Err(None) => {
                    Counters::add(&self.stats.timeouts);
                    return Err(timeout);
                }
                Err(Some(reason)) => return Err(unreachable(to, reason)),
            };
            match conn.start(
                self,
                service,
                request.clone(),
                options,
                deadline,
                id,
                resent,
            ) {
                Ok(reply) => {
                    Counters::add(&self.stats.requests_sent);
                    return Ok(InFlight {
                        conn,
                        id,
                        given_up: self.given_up_of(to),
                        reply,
                        to,
                        service,
                        options,
                        deadline,
                        request,
                    });
                }
                Err(StartError::Closed) => continue,
            }
        }
        Err(unreachable(
            to,
            "its connections kept closing as requests were sent",
        ))
    }

    /// Waits for the reply of `call` until its deadline. A call whose connection to a
    /// version 2 peer closed before the answer came is sent again under its id (at most
    /// `RESENDS_MAX` times): the peer runs it once and answers the copy.
    fn finish(self: &Arc<Self>, call: InFlight) -> Result<Bytes, TransportError> {
        let (to, id) = (call.to, call.id);
        let result = self.finish_resending(call);
        self.done_id(to, id);
        result
    }

    fn finish_resending(self: &Arc<Self>, mut call: InFlight) -> Result<Bytes, TransportError> {
        let mut resends = 0;
        loop {
            let remaining = call.deadline.saturating_duration_since(Instant::now());
            let closed = match call.reply.recv_timeout(remaining) {
                Ok(Answer::Done(result)) => return result,
                Ok(Answer::Closed(e)) => e,
                Err(RecvTimeoutError::Timeout) => {
                    // Withdraw the waiter; a reply that slipped in meanwhile still counts.
                    call.conn.pending.lock().calls.remove(&call.id);
                    match call.reply.try_recv() {
                        Ok(Answer::Done(result)) => return result,
                        Ok(Answer::Closed(_)) | Err(_) => {}
                    }
                    Counters::add(&self.stats.timeouts);
                    return Err(TransportError::Timeout {
                        node: call.to,
                        service: call.service,
                        deadline: call.options.deadline,
                    });
                }
                Err(RecvTimeoutError::Disconnected) => unreachable(
                    call.to,
                    "the connection dropped the request without an answer",
                ),
            };
            if self.given_up_of(call.to) != call.given_up {
                return Err(unreachable(
                    call.to,
                    "it was expelled while this call waited for its answer",
                ));
            }
            if call.conn.version < VERSION_RESEND
                || resends == RESENDS_MAX
                || Instant::now() >= call.deadline
                || self.closed.load(Relaxed)
            {
                return Err(closed);
            }
            resends += 1;
            Counters::add(&self.stats.resends);
            tracing::debug!(node = %call.to, id = call.id, %closed, "sending a request again");
            call = self.start_with_id(
                call.to,
                call.service,
                call.request.clone(),
                call.options,
                call.deadline,
                call.id,
                true,
            )?;
        }
    }

    fn call(
        self: &Arc<Self>,
        to: NodeId,
        service: ServiceId,
        request: Bytes,
        options: CallOptions,
    ) -> Result<Bytes, TransportError> {
        blocking(|| {
            if to == self.me {
                return self.call_local(service, &request).map(Bytes::from);
            }
            let call = self.start(to, service, request, options)?;
            self.finish(call)
        })
    }

    /// A call to this node's own services runs on the caller's thread, as the
    /// in-process transport does (a handler calling its own node needs no thread).
    fn call_local(&self, service: ServiceId, request: &[u8]) -> Result<Vec<u8>, TransportError> {
        let handler = self
            .registry
            .service(self.me, service)
            .ok_or(TransportError::NoService {
                node: self.me,
                service,
            })?;
        Ok(handler.handle(self.me, request))
    }

    /// Starts connecting every lane to `node` without waiting (`allToAllConnection`).
    fn connect_all(self: &Arc<Self>, node: NodeId) {
        for lane in self.lanes_of(node).iter() {
            let mut st = lane.state.lock();
            if st.conn.as_ref().is_some_and(|c| c.is_open()) || st.connecting {
                continue;
            }
            if let Some(addr) = self.address(node) {
                lane.begin_connect(self, &mut st, addr);
            }
        }
    }

    fn given_up_of(&self, node: NodeId) -> u64 {
        self.given_up.lock().get(&node).copied().unwrap_or(0)
    }

    /// Closes every outgoing connection to `node` (its address changed, or it left).
    fn close_node(&self, node: NodeId, why: &str) {
        let lanes = self.lanes.lock().get(&node).cloned();
        for lane in lanes.iter().flat_map(|l| l.iter()) {
            let conn = lane.state.lock().conn.take();
            if let Some(conn) = conn {
                conn.close(why);
            }
        }
    }

    fn all_lanes(&self) -> Vec<Arc<Lane>> {
        self.lanes
            .lock()
            .values()
            .flat_map(|l| l.iter().cloned())
            .collect()
    }

    /// Closes outgoing connections idle for `idle` with no call waiting on them.
    fn close_idle(&self, idle: Duration) {
        let idle_ms = u64::try_from(idle.as_millis()).unwrap_or(u64::MAX);
        let now = self.now_ms();
        for lane in self.all_lanes() {
            let conn = lane.state.lock().conn.clone();
            if let Some(conn) = conn {
                if conn.close_if_idle(now, idle_ms, &self.stats.idle_closed) {
                    tracing::debug!(node = %conn.node, peer = %conn.peer, "closed an idle connection");
                }
            }
        }
    }
}

impl Lane {
    /// An open connection of this lane, connecting first if needed. `Err(None)`: the
    /// deadline passed; `Err(Some(reason))`: the peer cannot be reached.
    fn get(
        self: &Arc<Self>,
        inner: &Arc<Inner>,
        deadline: Instant,
    ) -> Result<Arc<Conn>, Option<String>> {
        let mut st = self.state.lock();
        loop {
            if let Some(conn) = &st.conn {
                if conn.is_open() {
                    return Ok(conn.clone());
                }
                st.conn = None;
            }
            if Instant::now() >= deadline {
                return Err(None);
            }
            if !st.connecting {
                let Some(addr) = inner.address(self.node) else {
                    return Err(Some(format!(
                        "no address is known for {} (not in this node's node map)",
                        self.node
                    )));
                };
                self.begin_connect(inner, &mut st, addr);
            }
            let attempt = st.attempt;
            while st.connecting && st.attempt == attempt {
                if self.changed.wait_until(&mut st, deadline).timed_out() {
                    return Err(None);
                }
            }
            match (&st.conn, &st.failed) {
                (Some(conn), _) if conn.is_open() => return Ok(conn.clone()),
                // Never reconnect in a tight loop to a peer that drops us at once.
                (Some(conn), _) => {
                    return Err(Some(format!(
                        "the connection to {} closed as soon as it was made",
                        conn.peer
                    )))
                }
                (None, Some((failed, reason))) if *failed == attempt => {
                    return Err(Some(reason.clone()))
                }
                // Another caller's newer attempt superseded ours: look again.
                _ => {}
            }
        }
    }

    /// Starts an attempt to connect (the lane's lock is held by the caller).
    fn begin_connect(self: &Arc<Self>, inner: &Arc<Inner>, st: &mut LaneState, addr: SocketAddr) {
        st.connecting = true;
        st.attempt += 1;
        let attempt = st.attempt;
        let lane = self.clone();
        let inner = inner.clone();
        inner.clone().handle.spawn(async move {
            let result = connect(&inner, lane.node, lane.class, addr).await;
            match &result {
                Ok(_) => Counters::add(&inner.stats.connects),
                Err(reason) => {
                    Counters::add(&inner.stats.connect_failures);
                    tracing::warn!(node = %lane.node, peer = %addr, %reason, "cannot connect");
                }
            }
            let mut st = lane.state.lock();
            if st.attempt == attempt {
                st.connecting = false;
                match result {
                    Ok(conn) => st.conn = Some(conn),
                    Err(reason) => st.failed = Some((attempt, reason)),
                }
            } else if let Ok(conn) = result {
                conn.close("superseded by another connection attempt");
            }
            drop(st);
            lane.changed.notify_all();
        });
    }
}

impl Conn {
    fn is_open(&self) -> bool {
        self.pending.lock().open
    }

    fn touch(&self, inner: &Inner) {
        self.last_used_ms.store(inner.now_ms(), Relaxed);
    }

    fn start(
        &self,
        inner: &Inner,
        service: ServiceId,
        body: Bytes,
        options: CallOptions,
        deadline: Instant,
        id: u64,
        resent: bool,
    ) -> Result<Receiver<Answer>, StartError> {
        let (reply_tx, reply_rx) = sync_channel(1);
        {
            let mut pending = self.pending.lock();
            if !pending.open {
                return Err(StartError::Closed);
            }
            pending.calls.insert(
                id,
                Waiter {
                    service,
                    deadline: options.deadline,
                    reply: reply_tx,
                },
            );
        }
        let remaining = deadline.saturating_duration_since(Instant::now());
        let mut h = Header::new(self.version, Kind::Request, body.len());
        h.service = service as u16;
        h.request_id = id;
        if self.version >= VERSION_RESEND {
            h.acked = inner.acked(self.node, id);
            if resent {
                h.flags |= FLAG_RESENT;
            }
        }
        h.deadline_ms = u32::try_from(remaining.as_millis())
            .unwrap_or(u32::MAX)
            .max(1);
        if options.priority == Priority::Bulk || body.len() > inner.config.small_msg_size_threshold
        {
            h.flags |= FLAG_BULK;
        }
        self.touch(inner);
        if self.tx.send(OutFrame::new(&h, body)).is_err() {
            self.pending.lock().calls.remove(&id);
            return Err(StartError::Closed);
        }
        Ok(reply_rx)
    }

    /// Closes the connection: every waiting call fails at once (not at its deadline).
    fn close(&self, why: &str) {
        self.close_if(|_| true, why);
    }

    /// Closes the connection if `condition` holds for its calls, decided under the
    /// same lock that registers calls, so no call can slip in between.
    fn close_if(&self, condition: impl FnOnce(&Pending) -> bool, why: &str) -> bool {
        let waiters = {
            let mut pending = self.pending.lock();
            if !pending.open || !condition(&pending) {
                return false;
            }
            pending.open = false;
            std::mem::take(&mut pending.calls)
        };
        for (_, w) in waiters {
            let _ = w.reply.try_send(Answer::Closed(unreachable(
                self.node,
                format!("the connection to {} closed: {why}", self.peer),
            )));
        }
        for task in self.tasks.lock().drain(..) {
            task.abort();
        }
        true
    }

    /// Closes the connection if no call waits on it and it was last used `idle_ms`
    /// ago, counting it in `closed` before anyone can see it closed: counted after,
    /// a caller that saw the connection gone (and the peer see it close) could still
    /// read the old count.
    fn close_if_idle(&self, now_ms: u64, idle_ms: u64, closed: &AtomicU64) -> bool {
        let last_used = self.last_used_ms.load(Relaxed);
        self.close_if(
            |pending| {
                let idle = pending.calls.is_empty() && now_ms.saturating_sub(last_used) >= idle_ms;
                if idle {
                    Counters::add(closed);
                }
                idle
            },
            "idle (idleSocketTimeout)",
        )
    }
}

/// Connects, negotiates and authenticates one outgoing connection, then starts its
/// reader and writer tasks.
async fn connect(
    inner: &Arc<Inner>,
    node: NodeId,
    class: LaneClass,
    addr: SocketAddr,
) -> Result<Arc<Conn>, String> {
    let stream =
        match tokio::time::timeout(inner.config.connect_timeout, TcpStream::connect(addr)).await {
            Err(_) => {
                return Err(format!(
                    "no TCP connection to {addr} within {:?}",
                    inner.config.connect_timeout
                ))
            }
            Ok(Err(e)) => return Err(format!("cannot connect to {addr}: {e}")),
            Ok(Ok(stream)) => stream,
        };
    server::tune_socket(&stream);
    let (r, mut w) = stream.into_split();
    let mut r = BufReader::with_capacity(READ_BUFFER_BYTES, r);
    let handshake = tokio::time::timeout(
        inner.config.handshake_timeout,
        client_handshake(inner, node, class, &mut r, &mut w),
    )
    .await;
    let version = match handshake {
        Err(_) => {
            return Err(format!(
                "{addr} did not complete hello and authentication within {:?}",
                inner.config.handshake_timeout
            ))
        }
        Ok(Err(HandshakeFail::Frame(e))) => {
            Counters::add(&inner.stats.bad_frames);
            return Err(format!("bad frame from {addr} during the handshake: {e}"));
        }
        Ok(Err(HandshakeFail::Refused(reason))) => return Err(reason),
        Ok(Err(HandshakeFail::Closed)) => {
            return Err(format!("{addr} closed the connection during the handshake"))
        }
        Ok(Ok(version)) => version,
    };
    let (tx, rx) = unbounded_channel();
    let conn = Arc::new(Conn {
        node,
        peer: addr,
        version,
        tx,
        pending: Mutex::new(Pending {
            open: true,
            calls: HashMap::new(),
        }),
        last_used_ms: AtomicU64::new(inner.now_ms()),
        tasks: Mutex::new(Vec::new()),
    });
    let writer = {
        let conn = conn.clone();
        inner.handle.spawn(async move {
            if let Err(e) = write_frames(w, rx).await {
                conn.close(&format!("write failed: {e}"));
            }
        })
    };
    let reader = inner
        .handle
        .spawn(read_replies(inner.clone(), conn.clone(), r));
    conn.tasks
        .lock()
        .extend([writer.abort_handle(), reader.abort_handle()]);
    if !conn.is_open() {
        // It failed before its tasks were registered: stop them now.
        conn.close("closed while starting");
    }
    Ok(conn)
}

async fn client_handshake(
    inner: &Inner,
    node: NodeId,
    lane: LaneClass,
    r: &mut BufReader<OwnedReadHalf>,
    w: &mut tokio::net::tcp::OwnedWriteHalf,
) -> Result<u16, HandshakeFail> {
    let hello = Hello {
        node: inner.me.0,
        min_version: VERSION_MIN,
        max_version: VERSION_MAX,
        lane,
        nonce: rand::random(),
    };
    send_control(w, VERSION_MIN, Kind::Hello, &hello).await?;
    let (h, body) = read_control(r).await?;
    match h.kind {
        Kind::HelloAck => {}
        Kind::Refuse => {
            let refusal: Refuse = decode_body("refusal", &body)?;
            return Err(HandshakeFail::Refused(format!(
                "{node} refused the connection: {}",
                refusal.reason
            )));
        }
        got => {
            return Err(HandshakeFail::Frame(FrameError::Unexpected {
                got,
                when: "instead of the hello's answer",
            }))
        }
    }
    let ack: HelloAck = decode_body("hello answer", &body)?;
    if !(VERSION_MIN..=VERSION_MAX).contains(&ack.version) || ack.version != h.version {
        return Err(HandshakeFail::Refused(format!(
            "{node} chose protocol version {}, which this node does not speak \
             ({VERSION_MIN}..={VERSION_MAX})",
            ack.version
        )));
    }
    if ack.node != node.0 {
        return Err(HandshakeFail::Refused(format!(
            "the address of {node} is answered by node {}: check the node map",
            ack.node
        )));
    }
    let transcript = Transcript {
        version: ack.version,
        client_node: inner.me.0,
        server_node: ack.node,
        lane,
        client_nonce: hello.nonce,
        server_nonce: ack.nonce,
    };
    if !auth::verify(
        &inner.config.cluster_key,
        Role::Server,
        &transcript,
        &ack.proof,
    ) {
        let reason = format!(
            "{node} did not prove it holds the cluster key: it belongs to another \
             cluster, or this node was not given this cluster's key"
        );
        let _ = send_control(
            w,
            ack.version,
            Kind::Refuse,
            &Refuse {
                reason: "you did not prove you hold the cluster key".into(),
            },
        )
        .await;
        return Err(HandshakeFail::Refused(reason));
    }
    let proof = auth::proof(&inner.config.cluster_key, Role::Client, &transcript);
    if ack.version >= VERSION_RESEND {
        let auth = AuthV2 {
            proof,
            incarnation: inner.incarnation,
        };
        send_control(w, ack.version, Kind::Auth, &auth).await?;
    } else {
        send_control(w, ack.version, Kind::Auth, &Auth { proof }).await?;
    }
    let (h, body) = read_control(r).await?;
    match h.kind {
        Kind::AuthOk if h.version == ack.version => Ok(ack.version),
        Kind::Refuse => {
            let refusal: Refuse = decode_body("refusal", &body)?;
            Err(HandshakeFail::Refused(format!(
                "{node} refused the connection: {}",
                refusal.reason
            )))
        }
        got => Err(HandshakeFail::Frame(FrameError::Unexpected {
            got,
            when: "instead of the authentication's answer",
        })),
    }
}

/// Delivers the replies of one connection to their callers until it closes.
async fn read_replies(inner: Arc<Inner>, conn: Arc<Conn>, mut r: BufReader<OwnedReadHalf>) {
    let why = loop {
        let (h, body) = match read_frame(&mut r, inner.config.max_frame_bytes).await {
            Ok(Some(frame)) => frame,
            Ok(None) => break "closed by the peer".to_string(),
            Err(e) => {
                if !matches!(e, FrameError::Io(_)) {
                    Counters::add(&inner.stats.bad_frames);
                }
                tracing::warn!(node = %conn.node, peer = %conn.peer, reason = %e, "closing connection");
                break e.to_string();
            }
        };
        if h.version != conn.version || !matches!(h.kind, Kind::Reply | Kind::Error) {
            Counters::add(&inner.stats.bad_frames);
            let e = if h.version != conn.version {
                FrameError::WrongVersion {
                    got: h.version,
                    negotiated: conn.version,
                }
            } else {
                FrameError::Unexpected {
                    got: h.kind,
                    when: "where a reply was expected",
                }
            };
            tracing::warn!(node = %conn.node, peer = %conn.peer, reason = %e, "closing connection: bad frame");
            break e.to_string();
        }
        conn.touch(&inner);
        let Some(waiter) = conn.pending.lock().calls.remove(&h.request_id) else {
            Counters::add(&inner.stats.late_replies);
            tracing::debug!(node = %conn.node, id = h.request_id, "dropped a reply whose caller gave up");
            continue;
        };
        let result = if h.kind == Kind::Reply {
            Ok(body)
        } else {
            Err(remote_error(conn.node, &waiter, &body))
        };
        match waiter.reply.try_send(Answer::Done(result)) {
            Ok(()) => Counters::add(&inner.stats.replies_received),
            Err(_) => Counters::add(&inner.stats.late_replies),
        }
    };
    conn.close(&why);
}

fn remote_error(node: NodeId, waiter: &Waiter, body: &[u8]) -> TransportError {
    let service = waiter.service;
    match decode_body::<WireError>("error answer", body) {
        Ok(WireError::NoService) | Ok(WireError::UnknownService(_)) => {
            TransportError::NoService { node, service }
        }
        Ok(WireError::Refused(reason)) => TransportError::Refused {
            node,
            service,
            reason,
        },
        Ok(WireError::Expired) => TransportError::Timeout {
            node,
            service,
            deadline: waiter.deadline,
        },
        Ok(WireError::ReplyTooLarge { len, max }) => TransportError::Encode {
            what: "reply",
            reason: format!(
                "its {len} bytes exceed the frame limit of {node} ({max} bytes); \
                 the request was served but its reply not sent"
            ),
        },
        Ok(WireError::HandlerPanicked(what)) => unreachable(
            node,
            format!("its {service:?} handler panicked ({what}); a bug: see that node's log"),
        ),
        Ok(WireError::ReplyLost) => unreachable(
            node,
            format!(
                "its {service:?} request ran there, but its answer was lost with the \
                 connection and not kept for the copy sent again"
            ),
        ),
        Err(e) => unreachable(node, format!("its answer could not be read: {e}")),
    }
}

/// `mako_rt::Transport` over TCP. Dropping it (or `shutdown`) closes every connection.
pub struct TcpTransport {
    inner: Arc<Inner>,
    runtime: Mutex<Option<Runtime>>,
    local_addr: SocketAddr,
}

impl TcpTransport {
    /// Starts listening on `config.listen` and serving `registry`'s services of
    /// `config.node`. With `allToAllConnection`, connections to every known node are
    /// started too (in the background: a node that is down is not an error here).
    pub fn start(config: RpcConfig, registry: Arc<Registry>) -> Result<TcpTransport, RpcError> {
        config.validate().map_err(RpcError::Config)?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(config.io_threads)
            .max_blocking_threads(config.handler_threads + config.small_handler_threads)
            .thread_name(format!("mako-rpc-{}", config.node.0))
            .enable_io()
            .enable_time()
            .build()
            .map_err(RpcError::Runtime)?;
        let listener = std::net::TcpListener::bind(config.listen)
            .and_then(|l| l.set_nonblocking(true).map(|()| l))
            .map_err(|source| RpcError::Bind {
                addr: config.listen,
                source,
            })?;
        let local_addr = listener.local_addr().map_err(|source| RpcError::Bind {
            addr: config.listen,
            source,
        })?;
        let listener = {
            let _context = runtime.enter();
            tokio::net::TcpListener::from_std(listener).map_err(|source| RpcError::Bind {
                addr: config.listen,
                source,
            })?
        };
        let classes = config.lane_classes();
        let small_lanes: Vec<usize> = (0..classes.len())
            .filter(|&i| classes[i] == LaneClass::Small)
            .collect();
        let bulk_lanes: Vec<usize> = (0..classes.len())
            .filter(|&i| classes[i] != LaneClass::Small)
            .collect();
        let inner = Arc::new(Inner {
            me: config.node,
            registry,
            handle: runtime.handle().clone(),
            stats: Counters::default(),
            small_handlers: Arc::new(Semaphore::new(config.small_handler_threads)),
            bulk_handlers: Arc::new(Semaphore::new(config.handler_threads)),
            inbound: AtomicUsize::new(0),
            peers: RwLock::new(config.peers.clone()),
            removed: RwLock::new(Default::default()),
            given_up: Mutex::new(HashMap::new()),
            lanes: Mutex::new(HashMap::new()),
            small_lanes,
            bulk_lanes,
            next_lane: AtomicUsize::new(0),
            closed: AtomicBool::new(false),
            started: Instant::now(),
            incarnation: rand::random(),
            ids: Mutex::new(Ids::default()),
            dedup: Default::default(),
            inbound_ctl: Mutex::new(HashMap::new()),
            inbound_seq: AtomicU64::new(0),
            config,
        });
        runtime.spawn(server::accept_loop(inner.clone(), listener));
        if let Some(idle) = inner.config.idle_socket_timeout {
            let weak = Arc::downgrade(&inner);
            let period = (idle / 4).clamp(Duration::from_millis(10), Duration::from_secs(1));
            runtime.spawn(async move {
                loop {
                    tokio::time::sleep(period).await;
                    let Some(inner) = weak.upgrade() else { return };
                    inner.close_idle(idle);
                }
            });
        }
        if inner.config.all_to_all_connection {
            let nodes: Vec<NodeId> = inner.peers.read().keys().copied().collect();
            for node in nodes.into_iter().filter(|&n| n != inner.me) {
                inner.connect_all(node);
            }
        }
        tracing::info!(node = %inner.me, listen = %local_addr, "RPC transport started");
        Ok(TcpTransport {
            inner,
            runtime: Mutex::new(Some(runtime)),
            local_addr,
        })
    }

    /// The address this node accepts connections on (the real port if 0 was asked).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Sets or changes `node`'s address. Connections to its old address are closed;
    /// with `allToAllConnection`, connections to the new one are started.
    pub fn set_peer(&self, node: NodeId, addr: SocketAddr) {
        self.inner.removed.write().remove(&node);
        let old = self.inner.peers.write().insert(node, addr);
        if old.is_some_and(|old| old != addr) {
            self.inner.close_node(node, "the node's address changed");
        }
        if self.inner.config.all_to_all_connection && node != self.inner.me {
            self.inner.connect_all(node);
        }
    }

    /// `node` was expelled: the calls waiting for its answers fail now, as
    /// `Unreachable`, instead of at their deadlines, and are not sent again (its
    /// connections are closed). A node stopped (`SIGSTOP`, a long stall) keeps its
    /// connections open, so a caller would otherwise wait out its whole deadline
    /// (60 s for a token request to a token manager node whose slot has moved to a
    /// survivor meanwhile). Later calls to `node` connect again as usual.
    pub fn give_up_on(&self, node: NodeId) {
        *self.inner.given_up.lock().entry(node).or_insert(0) += 1;
        self.inner
            .close_node(node, "the node was expelled: calls waiting for it give up");
    }

    /// Forgets `node` (it left the cluster) and closes the connections to it.
    pub fn remove_peer(&self, node: NodeId) {
        self.inner.peers.write().remove(&node);
        self.inner.close_node(node, "the node left the node map");
    }

    /// Forgets `node` and refuses its handshakes from now on, even with the cluster
    /// key (`mako node remove`), until [`TcpTransport::set_peer`] names it again.
    pub fn remove_member(&self, node: NodeId) {
        self.inner.removed.write().insert(node);
        self.remove_peer(node);
    }

    /// The peers and their addresses.
    pub fn peers(&self) -> BTreeMap<NodeId, SocketAddr> {
        self.inner.peers.read().clone()
    }

    /// A call whose request and reply are `Bytes`: a block payload goes out from its
    /// own buffer and comes back in the buffer it was read into, never re-serialised.
    pub fn call_bytes(
        &self,
        to: NodeId,
        service: ServiceId,
        request: Bytes,
        options: CallOptions,
    ) -> Result<Bytes, TransportError> {
        self.inner.call(to, service, request, options)
    }

    /// The transport's counters.
    pub fn stats(&self) -> RpcStats {
        self.inner.stats.snapshot()
    }

    /// Open outgoing connections to `node`.
    pub fn open_connections(&self, node: NodeId) -> usize {
        let lanes = self.inner.lanes.lock().get(&node).cloned();
        lanes
            .iter()
            .flat_map(|l| l.iter())
            .filter(|l| l.state.lock().conn.as_ref().is_some_and(|c| c.is_open()))
            .count()
    }

    /// Closes this node's connections to `node` as a network fault would: calls waiting
    /// on them are sent again on new connections (a version 2 peer runs each once).
    /// For tests and fault drills.
    pub fn reset_connections(&self, node: NodeId) {
        self.inner.close_node(node, "reset (a fault drill)");
    }

    /// Shuts down the connections `node` opened to this node as a network fault
    /// would; answers not yet sent on them are lost with them. For tests and fault
    /// drills.
    pub fn reset_inbound(&self, node: NodeId) {
        for (n, s) in self.inner.inbound_ctl.lock().values() {
            if *n == node {
                let _ = s.shutdown(std::net::Shutdown::Both);
            }
        }
    }

    /// Requests of `node` this node remembers so a copy of one runs once.
    pub fn remembered_requests(&self, node: NodeId) -> usize {
        self.inner.dedup.remembered(node)
    }

    /// Open incoming connections (served, authenticated).
    pub fn inbound_connections(&self) -> usize {
        self.inner.inbound.load(Relaxed)
    }

    /// Stops serving and closes every connection; calls waiting fail at once, later
    /// calls fail with `Unreachable`. Handlers already running finish on their own.
    pub fn shutdown(&self) {
        if self.inner.closed.swap(true, Relaxed) {
            return;
        }
        for lane in self.inner.all_lanes() {
            let conn = lane.state.lock().conn.take();
            if let Some(conn) = conn {
                conn.close("this node's transport shut down");
            }
        }
        if let Some(runtime) = self.runtime.lock().take() {
            // Never waits: shutting down may be asked from any thread, async or not.
            runtime.shutdown_background();
        }
        tracing::info!(node = %self.inner.me, "RPC transport stopped");
    }
}

impl Drop for TcpTransport {
    fn drop(&mut self) {
        self.shutdown();
    }
}

impl Transport for TcpTransport {
    fn local_node(&self) -> NodeId {
        self.inner.me
    }

    fn call(
        &self,
        to: NodeId,
        service: ServiceId,
        request: Vec<u8>,
        options: CallOptions,
    ) -> Result<Vec<u8>, TransportError> {
        self.inner
            .call(to, service, Bytes::from(request), options)
            .map(Vec::from)
    }

    /// On a thread of its own: connecting and sending may wait (for a connection, up
    /// to the deadline), and the caller (a token manager's handler) must not.
    fn post(&self, to: NodeId, service: ServiceId, request: Vec<u8>, options: CallOptions) {
        let inner = self.inner.clone();
        let spawned = std::thread::Builder::new()
            .name(format!("mako-rpc-post-{}", to.0))
            .spawn(move || {
                let _ = inner.call(to, service, Bytes::from(request), options);
            });
        if let Err(e) = spawned {
            tracing::warn!(node = %to, ?service, error = %e, "could not start a thread to send a notice; it is lost");
        }
    }

    /// Sends every request before waiting for any reply, so the calls overlap.
    fn call_many(
        &self,
        calls: Vec<(NodeId, ServiceId, Vec<u8>)>,
        options: CallOptions,
    ) -> Vec<Result<Vec<u8>, TransportError>> {
        let inner = &self.inner;
        blocking(|| {
            let started: Vec<_> = calls
                .into_iter()
                .map(|(to, service, request)| {
                    if to == inner.me {
                        Err(inner.call_local(service, &request))
                    } else {
                        Ok(inner.start(to, service, Bytes::from(request), options))
                    }
                })
                .collect();
            started
                .into_iter()
                .map(|s| match s {
                    Err(local) => local,
                    Ok(Err(e)) => Err(e),
                    Ok(Ok(call)) => inner.finish(call).map(Vec::from),
                })
                .collect()
        })
    }
}
