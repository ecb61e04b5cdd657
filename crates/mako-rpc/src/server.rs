//! The serving side: accept connections, negotiate the version, authenticate the
//! peer, then hand its requests to the registry's services on handler threads.
//!
//! Invariants: no request frame is read as a request before the handshake has
//! authenticated the peer (the request loop starts only after it); a bad frame closes
//! its own connection and nothing else; handlers run on the blocking pool, bounded by
//! a semaphore per lane class, never on the I/O workers, so a handler that blocks or
//! calls another node cannot stall any socket.

use crate::auth::{self, Role, Transcript};
use crate::dedup::Admit;
use crate::io::{send_control, write_frames, OutFrame};
use crate::stats::Counters;
use crate::transport::Inner;
use crate::wire::{
    self, decode_body, read_frame, Auth, AuthV2, FrameError, Header, Hello, HelloAck, Kind,
    LaneClass, Refuse, WireError, CONTROL_BODY_MAX, FLAG_BULK, VERSION_MAX, VERSION_MIN,
    VERSION_RESEND,
};
use bytes::Bytes;
use mako_rt::{NodeId, ServiceId};
use std::net::SocketAddr;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncWrite, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc::{unbounded_channel, UnboundedSender};
use tokio::sync::OwnedSemaphorePermit;

/// Read buffer of a connection: small frames come in whole with few system calls;
/// a body larger than this is read straight into its own buffer.
pub(crate) const READ_BUFFER_BYTES: usize = 64 << 10;

/// The service a wire number names, if this build knows it.
pub fn service_from_wire(n: u16) -> Option<ServiceId> {
    const ALL: [ServiceId; 8] = [
        ServiceId::TokenManager,
        ServiceId::TokenClient,
        ServiceId::FileSystem,
        ServiceId::FsManager,
        ServiceId::Cluster,
        ServiceId::Nsd,
        ServiceId::Lease,
        ServiceId::Recovery,
    ];
    // A new ServiceId variant makes this match fail to compile: add it to ALL too.
    const fn _every_service_is_listed(s: ServiceId) {
        match s {
            ServiceId::TokenManager
            | ServiceId::TokenClient
            | ServiceId::FileSystem
            | ServiceId::FsManager
            | ServiceId::Cluster
            | ServiceId::Nsd
            | ServiceId::Lease
            | ServiceId::Recovery => {}
        }
    }
    ALL.into_iter().find(|s| *s as u16 == n)
}

/// Why a handshake ended without an authenticated peer.
pub(crate) enum HandshakeFail {
    /// A frame was malformed: closed like any bad frame.
    Frame(FrameError),
    /// The peer was refused (version, key) or refused us; the reason is logged.
    Refused(String),
    /// The peer went away.
    Closed,
}

impl From<FrameError> for HandshakeFail {
    fn from(e: FrameError) -> Self {
        HandshakeFail::Frame(e)
    }
}

/// An authenticated incoming connection.
#[derive(Clone, Copy)]
struct Session {
    node: NodeId,
    version: u16,
    lane: LaneClass,
    /// The client's incarnation (version 2 clients): its requests are remembered, so a
    /// copy sent again runs once (`dedup`).
    incarnation: Option<u64>,
}

/// Reads one handshake frame (bounded to a control body).
pub(crate) async fn read_control<R: AsyncRead + Unpin>(
    r: &mut R,
) -> Result<(Header, Bytes), HandshakeFail> {
    match read_frame(r, CONTROL_BODY_MAX).await? {
        Some(frame) => Ok(frame),
        None => Err(HandshakeFail::Closed),
    }
}

/// Sends a refusal (best effort: the peer may be gone) and returns it as the failure.
async fn refuse<W: AsyncWrite + Unpin>(w: &mut W, version: u16, reason: String) -> HandshakeFail {
    let _ = send_control(
        w,
        version,
        Kind::Refuse,
        &Refuse {
            reason: reason.clone(),
        },
    )
    .await;
    HandshakeFail::Refused(reason)
}

async fn server_handshake<R, W>(
    inner: &Inner,
    r: &mut R,
    w: &mut W,
) -> Result<Session, HandshakeFail>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let (h, body) = read_control(r).await?;
    if h.kind != Kind::Hello {
        return Err(HandshakeFail::Frame(FrameError::Unexpected {
            got: h.kind,
            when: "before hello and authentication",
        }));
    }
    let hello: Hello = decode_body("hello", &body)?;
    let low = VERSION_MIN.max(hello.min_version);
    let high = VERSION_MAX.min(hello.max_version);
    if low > high {
        let reason = format!(
            "no common protocol version: node {} speaks {}..={}, node {} speaks \
             {VERSION_MIN}..={VERSION_MAX}; run the same Mako release on both",
            hello.node, hello.min_version, hello.max_version, inner.me.0
        );
        return Err(refuse(w, VERSION_MIN, reason).await);
    }
    let version = high;
    if hello.node == inner.me.0 {
        let reason = format!(
            "the connecting node claims this node's own id ({}): two nodes share an id",
            inner.me
        );
        return Err(refuse(w, version, reason).await);
    }
    if inner.removed.read().contains(&NodeId(hello.node)) {
        let reason = format!(
            "node {} was removed from the cluster (`mako node remove`): it cannot join \
             again under that number; add it again with `mako node add`",
            hello.node
        );
        return Err(refuse(w, version, reason).await);
    }
    let transcript = Transcript {
        version,
        client_node: hello.node,
        server_node: inner.me.0,
        lane: hello.lane,
        client_nonce: hello.nonce,
        server_nonce: rand::random(),
    };
    let ack = HelloAck {
        node: inner.me.0,
        version,
        nonce: transcript.server_nonce,
        proof: auth::proof(&inner.config.cluster_key, Role::Server, &transcript),
    };
    send_control(w, version, Kind::HelloAck, &ack).await?;
    let (h, body) = read_control(r).await?;
    if h.version != version {
        return Err(HandshakeFail::Frame(FrameError::WrongVersion {
            got: h.version,
            negotiated: version,
        }));
    }
    match h.kind {
        Kind::Auth => {}
        Kind::Refuse => {
            let refusal: Refuse = decode_body("refusal", &body)?;
            return Err(HandshakeFail::Refused(format!(
                "node {} refused this node: {}",
                hello.node, refusal.reason
            )));
        }
        got => {
            return Err(HandshakeFail::Frame(FrameError::Unexpected {
                got,
                when: "before authentication",
            }))
        }
    }
    // A version 2 client names its incarnation; one that sends a plain `Auth` is
    // served without the memory of its requests (it does not resend them).
    let (client, incarnation) = if version >= VERSION_RESEND {
        match decode_body::<AuthV2>("authentication", &body) {
            Ok(a) => (Auth { proof: a.proof }, Some(a.incarnation)),
            Err(_) => (decode_body::<Auth>("authentication", &body)?, None),
        }
    } else {
        (decode_body::<Auth>("authentication", &body)?, None)
    };
    if !auth::verify(
        &inner.config.cluster_key,
        Role::Client,
        &transcript,
        &client.proof,
    ) {
        let reason = format!(
            "node {} did not prove it holds the cluster key: it belongs to another \
             cluster or was not given this cluster's key",
            hello.node
        );
        return Err(refuse(w, version, reason).await);
    }
    send_control(w, version, Kind::AuthOk, &()).await?;
    Ok(Session {
        node: NodeId(hello.node),
        version,
        lane: hello.lane,
        incarnation,
    })
}

/// How long a connection may be silent before TCP probes the peer, the probes' interval
/// and count: a peer that vanished without closing (power loss, a cut link) is noticed
/// in about 45 s and its connection closed, instead of being kept forever.
const KEEPALIVE_IDLE: Duration = Duration::from_secs(30);
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(5);
const KEEPALIVE_PROBES: u32 = 3;

/// Socket options of every connection, either way: no Nagle delay for small messages,
/// and keepalive probes.
pub(crate) fn tune_socket(stream: &TcpStream) {
    let _ = stream.set_nodelay(true);
    let keepalive = socket2::TcpKeepalive::new()
        .with_time(KEEPALIVE_IDLE)
        .with_interval(KEEPALIVE_INTERVAL)
        .with_retries(KEEPALIVE_PROBES);
    // Best effort: a socket without keepalive still works, its calls have deadlines.
    let _ = socket2::SockRef::from(stream).set_tcp_keepalive(&keepalive);
}

/// A duplicate of the connection's socket (its own descriptor), to shut it down from
/// outside. `None` if the system has no descriptor to spare: the connection works,
/// only `reset_inbound` cannot reach it.
fn control_handle(r: &BufReader<tokio::net::tcp::OwnedReadHalf>) -> Option<std::net::TcpStream> {
    let sock = socket2::SockRef::from(r.get_ref().as_ref());
    sock.try_clone().ok().map(std::net::TcpStream::from)
}

/// Accepts connections until the transport shuts down (the runtime drops this task).
pub(crate) async fn accept_loop(inner: Arc<Inner>, listener: TcpListener) {
    loop {
        match listener.accept().await {
            Ok((stream, peer)) => {
                inner.handle.spawn(serve(inner.clone(), stream, peer));
            }
            Err(e) => {
                // Out of file descriptors and the like: the listener stays, and a
                // short pause keeps a persistent error from spinning a core.
                tracing::warn!(node = %inner.me, error = %e, "accepting a connection failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

/// One incoming connection: handshake, then requests until it ends.
async fn serve(inner: Arc<Inner>, stream: TcpStream, peer: SocketAddr) {
    tune_socket(&stream);
    let (r, mut w) = stream.into_split();
    let mut r = BufReader::with_capacity(READ_BUFFER_BYTES, r);
    let limit = inner.config.handshake_timeout;
    let session = match tokio::time::timeout(limit, server_handshake(&inner, &mut r, &mut w)).await
    {
        Ok(Ok(session)) => session,
        Ok(Err(HandshakeFail::Frame(e))) => {
            Counters::add(&inner.stats.bad_frames);
            tracing::warn!(%peer, reason = %e, "closing connection: bad frame before authentication");
            return;
        }
        Ok(Err(HandshakeFail::Refused(reason))) => {
            Counters::add(&inner.stats.handshakes_refused);
            tracing::warn!(%peer, %reason, "refused a connection");
            return;
        }
        Ok(Err(HandshakeFail::Closed)) => {
            tracing::debug!(%peer, "connection closed during the handshake");
            return;
        }
        Err(_) => {
            Counters::add(&inner.stats.handshakes_refused);
            tracing::warn!(%peer, ?limit, "closing connection: no hello and authentication in time");
            return;
        }
    };
    Counters::add(&inner.stats.accepted);
    // A second handle on the socket, so `TcpTransport::reset_inbound` can shut it down
    // as a network fault would (the read below then ends).
    let conn_id = inner.inbound_seq.fetch_add(1, Relaxed);
    if let Some(ctl) = control_handle(&r) {
        inner
            .inbound_ctl
            .lock()
            .insert(conn_id, (session.node, ctl));
    }
    tracing::debug!(%peer, node = %session.node, lane = %session.lane, version = session.version, "node connected");
    let (tx, rx) = unbounded_channel();
    let writer = inner.handle.spawn(async move {
        // A failed write means the peer is gone; the read side sees it too and ends.
        let _ = write_frames(w, rx).await;
    });
    let handlers = match session.lane {
        LaneClass::Small => inner.small_handlers.clone(),
        LaneClass::Bulk | LaneClass::Shared => inner.bulk_handlers.clone(),
    };
    inner.inbound.fetch_add(1, Relaxed);
    loop {
        match read_frame(&mut r, inner.config.max_frame_bytes).await {
            Ok(None) => {
                tracing::debug!(%peer, node = %session.node, "connection closed by the peer");
                break;
            }
            Ok(Some((h, body))) => {
                let bad = if h.version != session.version {
                    Some(FrameError::WrongVersion {
                        got: h.version,
                        negotiated: session.version,
                    })
                } else if h.kind != Kind::Request {
                    Some(FrameError::Unexpected {
                        got: h.kind,
                        when: "where a request was expected",
                    })
                } else {
                    None
                };
                if let Some(e) = bad {
                    Counters::add(&inner.stats.bad_frames);
                    tracing::warn!(%peer, node = %session.node, reason = %e, "closing connection: bad frame");
                    break;
                }
                if inner.removed.read().contains(&session.node) {
                    tracing::warn!(%peer, node = %session.node, "closing connection: the node was removed from the cluster");
                    break;
                }
                if let Some(inc) = session.incarnation {
                    if let Admit::Handled =
                        inner.dedup.admit(session.node, inc, &h, &tx, &inner.stats)
                    {
                        continue;
                    }
                }
                let received = Instant::now();
                // Waiting here for a free handler holds back this connection's
                // reading only (TCP flow control), never another connection's.
                let Ok(permit) = handlers.clone().acquire_owned().await else {
                    break;
                };
                dispatch(&inner, &session, h, body, received, permit, tx.clone());
            }
            Err(e) => {
                Counters::add(&inner.stats.bad_frames);
                tracing::warn!(%peer, node = %session.node, reason = %e, "closing connection: bad frame");
                break;
            }
        }
    }
    inner.inbound.fetch_sub(1, Relaxed);
    inner.inbound_ctl.lock().remove(&conn_id);
    // Closing both halves closes the socket; replies still being computed are dropped
    // (their caller gets a lost connection or a timeout).
    writer.abort();
}

fn reply_header(session: &Session, request: &Header, kind: Kind, body: &[u8]) -> Header {
    let mut h = Header::new(session.version, kind, body.len());
    h.service = request.service;
    h.request_id = request.request_id;
    h
}

fn send_error(
    inner: &Inner,
    session: &Session,
    request: &Header,
    tx: &UnboundedSender<OutFrame>,
    e: WireError,
) {
    answer(
        inner,
        session,
        request,
        tx,
        Kind::Error,
        Bytes::from(wire::encode_body(&e)),
    );
}

/// Sends the answer of `request` on its connection and, for a version 2 client, to the
/// copies of it waiting and into the memory for later copies.
fn answer(
    inner: &Inner,
    session: &Session,
    request: &Header,
    tx: &UnboundedSender<OutFrame>,
    kind: Kind,
    body: Bytes,
) {
    let mut h = reply_header(session, request, kind, &body);
    if kind == Kind::Reply && body.len() > inner.config.small_msg_size_threshold {
        h.flags |= FLAG_BULK;
    }
    let _ = tx.send(OutFrame::new(&h, body.clone()));
    if let Some(inc) = session.incarnation {
        inner
            .dedup
            .answered(session.node, inc, request, kind, &body);
    }
}

/// Hands one request to its service on a handler thread.
fn dispatch(
    inner: &Arc<Inner>,
    session: &Session,
    h: Header,
    body: Bytes,
    received: Instant,
    permit: OwnedSemaphorePermit,
    tx: UnboundedSender<OutFrame>,
) {
    let Some(service) = service_from_wire(h.service) else {
        send_error(
            inner,
            session,
            &h,
            &tx,
            WireError::UnknownService(h.service),
        );
        return;
    };
    let Some(handler) = inner.registry.service(inner.me, service) else {
        send_error(inner, session, &h, &tx, WireError::NoService);
        return;
    };
    if let Err(reason) = inner.registry.admit(session.node, service) {
        tracing::debug!(node = %inner.me, from = %session.node, ?service, %reason, "refused a request");
        send_error(inner, session, &h, &tx, WireError::Refused(reason));
        return;
    }
    let session = *session;
    let inner2 = inner.clone();
    inner.handle.spawn_blocking(move || {
        let _permit = permit;
        let inner = inner2;
        if h.deadline_ms > 0 && received.elapsed() > Duration::from_millis(h.deadline_ms.into()) {
            // Its caller has already given up: running it would only add load.
            Counters::add(&inner.stats.requests_expired);
            send_error(&inner, &session, &h, &tx, WireError::Expired);
            return;
        }
        Counters::add(&inner.stats.requests_dispatched);
        match catch_unwind(AssertUnwindSafe(|| handler.handle(session.node, &body))) {
            Ok(reply) if reply.len() > inner.config.max_frame_bytes => {
                // Sending it would make the caller close the connection, failing every
                // other call on it: refuse this one reply instead.
                tracing::error!(node = %inner.me, from = %session.node, ?service, len = reply.len(), max = inner.config.max_frame_bytes, "a reply exceeds the frame limit");
                let e = WireError::ReplyTooLarge {
                    len: reply.len() as u64,
                    max: inner.config.max_frame_bytes as u64,
                };
                send_error(&inner, &session, &h, &tx, e);
            }
            Ok(reply) => answer(&inner, &session, &h, &tx, Kind::Reply, Bytes::from(reply)),
            Err(panic) => {
                Counters::add(&inner.stats.handler_panics);
                let what = panic
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "a panic".to_string());
                tracing::error!(node = %inner.me, from = %session.node, ?service, panic = %what, "a request handler panicked");
                send_error(&inner, &session, &h, &tx, WireError::HandlerPanicked(what));
            }
        }
    });
}
