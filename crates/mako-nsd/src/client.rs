//! The client side: a disk this node reaches through NSD servers.
//!
//! `RemoteDisk` is one disk behind its server list (primary first). Each request goes
//! to the server that answered last; when it does not answer within the deadline, or
//! its connection fails, or it does not serve the disk, the next server in the list is
//! tried, and the one that answers is remembered (GPFS's NSD server failover). When
//! every server has failed the request fails with `DiskError::NoServer`, naming the
//! disk and each server tried with its reason.
//!
//! `RemoteDisk` is a `Disk`, so a `LocalNsd` over remote disks (`RemoteNsd`), or over a
//! mix of local and remote ones (`DiskRoute::choose`: local access if this node has
//! it), keeps the local `Nsd`'s accounting, I/O history and barrier logic; the file
//! system core mounts it like any other list of disks.
//!
//! Durability: a sync of a remote disk is a sync on every server that acknowledged a
//! write of it since its last sync, not only on the current one: writes a failed
//! server acknowledged are in its memory or its disk's cache, and another server's
//! sync does not make them durable. If such a server does not answer the sync, or
//! answers with another boot id (it restarted), the sync fails with
//! `DiskError::WritesInDoubt`: the barrier never claims durability it cannot prove.

use crate::protocol::{self, Failure, Op};
use mako_disk::iohist::BufferType;
use mako_disk::nsd::IoTag;
use mako_disk::{Disk, DiskError, DiskStats, IoHistory, LocalNsd, Nsd};
use mako_format::DiskAddress;
use mako_rt::{CallOptions, NodeId, Priority, ServiceId, Transport, TransportError};
use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

/// How a client talks to NSD servers.
#[derive(Clone, Copy, Debug)]
pub struct RemoteOptions {
    /// How long one server may take to answer one request before the next server is
    /// tried. A request fails after at most this times the number of servers.
    pub deadline: Duration,
    /// Largest read or write sent in one request: the servers' limit
    /// (`server::MAX_IO_BYTES_DEFAULT`).
    pub max_io_bytes: usize,
    /// A larger I/O is sent as pieces of this size, all at once, so the server works
    /// on them in parallel and one piece's transfer overlaps another's disk time
    /// (`tests/bench.rs` compares a single stream's reads with and without pieces).
    pub piece_bytes: usize,
}

impl Default for RemoteOptions {
    fn default() -> Self {
        RemoteOptions {
            deadline: Duration::from_secs(30),
            max_io_bytes: crate::server::MAX_IO_BYTES_DEFAULT,
            piece_bytes: 1 << 20,
        }
    }
}

/// One disk reached through its NSD servers.
pub struct RemoteDisk {
    name: String,
    size: u64,
    servers: Vec<NodeId>,
    transport: Arc<dyn Transport>,
    options: RemoteOptions,
    /// Index in `servers` of the server that answered last.
    current: AtomicUsize,
    failovers: AtomicU64,
    /// Servers that acknowledged writes since the disk's last successful sync, with
    /// the boot id they answered with.
    unsynced: Mutex<BTreeMap<NodeId, u64>>,
}

impl std::fmt::Debug for RemoteDisk {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteDisk")
            .field("name", &self.name)
            .field("servers", &self.servers)
            .field("current", &self.current_server())
            .finish()
    }
}

/// A failure of one request on one server: try the next one, or stop here.
enum Attempt {
    /// The server cannot be used for this disk now (no answer, connection failed,
    /// not served there): the reason, for `NoServer`.
    NextServer(String),
    /// The answer is final (a disk error, a refused request): no other server would
    /// answer differently.
    Final(DiskError),
}

impl RemoteDisk {
    /// Reaches disk `name` through `servers` (primary first): asks them in turn for
    /// its size, and fails if none serves it.
    pub fn connect(
        name: &str,
        servers: Vec<NodeId>,
        transport: Arc<dyn Transport>,
        options: RemoteOptions,
    ) -> Result<RemoteDisk, DiskError> {
        let refuse = |reason: String| DiskError::Refused {
            disk: name.to_string(),
            server: "(none: refused on this node)".into(),
            reason,
        };
        protocol::check_name(name).map_err(refuse)?;
        if servers.is_empty() {
            return Err(refuse(
                "the disk has no NSD servers and this node has no local access to it".into(),
            ));
        }
        if options.max_io_bytes.min(options.piece_bytes) < protocol::SECTOR as usize {
            return Err(refuse(format!(
                "max_io_bytes {} or piece_bytes {} is smaller than a sector",
                options.max_io_bytes, options.piece_bytes
            )));
        }
        let mut disk = RemoteDisk {
            name: name.to_string(),
            size: 0,
            servers,
            transport,
            options,
            current: AtomicUsize::new(0),
            failovers: AtomicU64::new(0),
            unsynced: Mutex::new(BTreeMap::new()),
        };
        let (_, _, reply) = disk.call(Priority::Small, || {
            protocol::encode_request(Op::Info, name, 0, 0, BufferType::DiskHeader, 0, &[])
        })?;
        let size = reply
            .get(protocol::OK_PREFIX..protocol::OK_PREFIX + 8)
            .map(|b| {
                let mut a = [0u8; 8];
                a.copy_from_slice(b);
                u64::from_le_bytes(a)
            })
            .ok_or_else(|| refuse(format!("the size answer has {} bytes", reply.len())))?;
        disk.size = size;
        Ok(disk)
    }

    /// The server requests go to now (the primary until it fails).
    pub fn current_server(&self) -> NodeId {
        self.servers[self.current.load(Relaxed) % self.servers.len()]
    }

    /// The server list, primary first.
    pub fn servers(&self) -> &[NodeId] {
        &self.servers
    }

    /// How many times requests moved to another server.
    pub fn failovers(&self) -> u64 {
        self.failovers.load(Relaxed)
    }

    fn options(&self, priority: Priority) -> CallOptions {
        CallOptions {
            priority,
            deadline: self.options.deadline,
        }
    }

    /// One request to one server: its boot id and whole reply, or why not.
    fn call_one(
        &self,
        server: NodeId,
        priority: Priority,
        request: Vec<u8>,
    ) -> Result<(u64, Vec<u8>), Attempt> {
        let result = self
            .transport
            .call(server, ServiceId::Nsd, request, self.options(priority));
        self.classify(server, result)
    }

    /// What the answer of `server` means: a reply that succeeded, a reason to try
    /// another server, or a final error.
    fn classify(
        &self,
        server: NodeId,
        result: Result<Vec<u8>, TransportError>,
    ) -> Result<(u64, Vec<u8>), Attempt> {
        let reply = match result {
            Ok(reply) => reply,
            // Too large to send: the same everywhere.
            Err(e @ TransportError::Encode { .. }) => {
                return Err(Attempt::Final(DiskError::Refused {
                    disk: self.name.clone(),
                    server: server.to_string(),
                    reason: e.to_string(),
                }))
            }
            Err(e) => return Err(Attempt::NextServer(e.to_string())),
        };
        let refused = |reason: String| {
            Attempt::Final(DiskError::Refused {
                disk: self.name.clone(),
                server: server.to_string(),
                reason,
            })
        };
        match protocol::decode_reply(&reply) {
            Ok(Ok((boot, _))) => Ok((boot, reply)),
            Ok(Err(Failure::UnknownDisk { served, .. })) => Err(Attempt::NextServer(format!(
                "does not serve it (it serves: {})",
                if served.is_empty() {
                    "no disks".to_string()
                } else {
                    served.join(", ")
                }
            ))),
            Ok(Err(Failure::BadRequest(why))) => Err(refused(why)),
            Ok(Err(Failure::Disk(e))) => Err(Attempt::Final(e.into_error(&server.to_string()))),
            Err(why) => Err(refused(why)),
        }
    }

    /// Sends the request `encode` builds to the current server, then to the next ones
    /// while they fail. Returns the server that answered, its boot id and the reply.
    /// `encode` is called once per server tried: a write's payload is copied from the
    /// caller's buffer for each attempt, never kept twice for a retry.
    fn call(
        &self,
        priority: Priority,
        encode: impl Fn() -> Vec<u8>,
    ) -> Result<(NodeId, u64, Vec<u8>), DiskError> {
        self.call_after(priority, encode, None)
    }

    /// `call`, knowing that `failed` (a server, and why) has just failed this request:
    /// if it is still the current server, it is not asked again.
    fn call_after(
        &self,
        priority: Priority,
        encode: impl Fn() -> Vec<u8>,
        failed: Option<(NodeId, String)>,
    ) -> Result<(NodeId, u64, Vec<u8>), DiskError> {
        let n = self.servers.len();
        let first = self.current.load(Relaxed) % n;
        let mut tried: Vec<String> = Vec::new();
        let mut skip = 0;
        if let Some((server, why)) = failed {
            if self.servers[first] == server {
                tried.push(format!("{server}: {why}"));
                skip = 1;
            }
        }
        for k in skip..n {
            let i = (first + k) % n;
            let server = self.servers[i];
            let result = self.call_one(server, priority, encode());
            if k > 0 && !matches!(result, Err(Attempt::NextServer(_))) {
                // This server answers: later requests go to it first. Another thread
                // may have moved on meanwhile; the first to move wins.
                if self
                    .current
                    .compare_exchange(first, i, Relaxed, Relaxed)
                    .is_ok()
                {
                    self.failovers.fetch_add(1, Relaxed);
                    tracing::warn!(disk = %self.name, from = %self.servers[first], to = %server, tried = %tried.join("; "), "NSD server failover");
                }
            }
            match result {
                Ok((boot, reply)) => return Ok((server, boot, reply)),
                Err(Attempt::Final(e)) => return Err(e),
                Err(Attempt::NextServer(why)) => tried.push(format!("{server}: {why}")),
            }
        }
        Err(DiskError::NoServer {
            disk: self.name.clone(),
            tried: tried.join("; "),
        })
    }

    /// The pieces an I/O of `len` bytes is sent in: (start in the buffer, length).
    /// Whole sectors of at most `piece_bytes`, except possibly the last.
    fn pieces(&self, len: usize) -> Vec<(usize, usize)> {
        let s = protocol::SECTOR as usize;
        let piece = (self.options.piece_bytes.min(self.options.max_io_bytes) / s).max(1) * s;
        (0..len.div_ceil(piece).max(1))
            .map(|k| (k * piece, piece.min(len - k * piece)))
            .collect()
    }

    /// Sends one request per piece: all at once to the current server (so the server
    /// reads or writes them in parallel and their transfers overlap its disk time),
    /// each then checked; a piece whose server failed is sent again with failover.
    /// `done` gets each piece's index, server, boot id and reply, in order.
    fn call_pieces(
        &self,
        pieces: &[(usize, usize)],
        encode: impl Fn(usize) -> Vec<u8>,
        mut done: impl FnMut(usize, NodeId, u64, Vec<u8>) -> Result<(), DiskError>,
    ) -> Result<(), DiskError> {
        if pieces.len() == 1 {
            let (server, boot, reply) = self.call(Priority::Bulk, || encode(0))?;
            return done(0, server, boot, reply);
        }
        let server = self.current_server();
        let calls = (0..pieces.len())
            .map(|k| (server, ServiceId::Nsd, encode(k)))
            .collect();
        let results = self
            .transport
            .call_many(calls, self.options(Priority::Bulk));
        // Every piece's outcome is taken, even after one failed: a write piece the
        // server acknowledged must be recorded for the next sync either way.
        let mut first_error = None;
        for (k, result) in results.into_iter().enumerate() {
            let outcome = match self.classify(server, result) {
                Ok((boot, reply)) => done(k, server, boot, reply),
                Err(Attempt::Final(e)) => Err(e),
                Err(Attempt::NextServer(_)) if first_error.is_some() => continue,
                Err(Attempt::NextServer(why)) => self
                    .call_after(Priority::Bulk, || encode(k), Some((server, why)))
                    .and_then(|(s, boot, reply)| done(k, s, boot, reply)),
            };
            if let Err(e) = outcome {
                first_error.get_or_insert(e);
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    fn len_u32(len: usize) -> u32 {
        // Pieces are at most max_io_bytes, far below u32::MAX.
        u32::try_from(len).unwrap_or(u32::MAX)
    }
}

fn tag_or_data(tag: Option<IoTag>) -> IoTag {
    tag.unwrap_or(IoTag {
        buffer_type: BufferType::Data,
        ino: 0,
    })
}

impl RemoteDisk {
    fn read_pieces(&self, buf: &mut [u8], offset: u64, tag: IoTag) -> Result<(), DiskError> {
        let pieces = self.pieces(buf.len());
        let encode = |k: usize| {
            let (start, len) = pieces[k];
            protocol::encode_request(
                Op::Read,
                &self.name,
                offset + start as u64,
                Self::len_u32(len),
                tag.buffer_type,
                tag.ino,
                &[],
            )
        };
        self.call_pieces(&pieces, encode, |k, server, _, reply| {
            let (start, len) = pieces[k];
            let payload = &reply[protocol::OK_PREFIX..];
            if payload.len() != len {
                // Never a short read: a reply of the wrong length is refused whole.
                return Err(DiskError::Refused {
                    disk: self.name.clone(),
                    server: server.to_string(),
                    reason: format!(
                        "a read of {len} bytes at byte {} was answered with {} bytes",
                        offset + start as u64,
                        payload.len()
                    ),
                });
            }
            // The one copy of a read on the client: from the reply frame into the
            // caller's buffer (the transport's reader task receives a frame before
            // it knows whose it is, so it cannot read into the caller's buffer).
            buf[start..start + len].copy_from_slice(payload);
            Ok(())
        })
    }

    fn write_pieces(&self, buf: &[u8], offset: u64, tag: IoTag) -> Result<(), DiskError> {
        let pieces = self.pieces(buf.len());
        // The one copy of a write on the client: from the caller's buffer into the
        // request frame, which the transport's writer task owns until it is sent.
        let encode = |k: usize| {
            let (start, len) = pieces[k];
            protocol::encode_request(
                Op::Write,
                &self.name,
                offset + start as u64,
                Self::len_u32(len),
                tag.buffer_type,
                tag.ino,
                &buf[start..start + len],
            )
        };
        self.call_pieces(&pieces, encode, |_, server, boot, _| {
            // Recorded after the acknowledgement: a sync that took the set before
            // this point did not cover this write, and the next one will.
            let mut unsynced = self.unsynced.lock();
            let known = unsynced.entry(server).or_insert(boot);
            if *known != boot {
                // The server restarted between two unsynced writes: the older ones
                // are in doubt; the old boot id stays so the next sync says so.
                tracing::warn!(disk = %self.name, %server, "NSD server restarted with writes unsynced");
            }
            Ok(())
        })
    }
}

impl Disk for RemoteDisk {
    fn name(&self) -> &str {
        &self.name
    }
    fn size_bytes(&self) -> u64 {
        self.size
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<(), DiskError> {
        self.read_pieces(buf, offset, tag_or_data(None))
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> Result<(), DiskError> {
        self.write_pieces(buf, offset, tag_or_data(None))
    }
    fn read_tagged(&self, buf: &mut [u8], offset: u64, tag: IoTag) -> Result<(), DiskError> {
        self.read_pieces(buf, offset, tag)
    }
    fn write_tagged(&self, buf: &[u8], offset: u64, tag: IoTag) -> Result<(), DiskError> {
        self.write_pieces(buf, offset, tag)
    }
    /// Syncs on every server that acknowledged writes since the last sync (see the
    /// module comment); with none, there is nothing to make durable.
    /// A round trip to its servers, independent of other disks' (each `RemoteDisk` keeps
    /// its own record of the writes a sync must confirm).
    fn sync_in_parallel(&self) -> bool {
        true
    }
    fn sync(&self) -> Result<(), DiskError> {
        let pending = std::mem::take(&mut *self.unsynced.lock());
        let mut failed: Vec<(NodeId, String)> = Vec::new();
        for (&server, &boot) in &pending {
            let request =
                protocol::encode_request(Op::Sync, &self.name, 0, 0, BufferType::Data, 0, &[]);
            let outcome: Result<(), String> = match self.call_one(server, Priority::Bulk, request) {
                Ok((now, _)) if now == boot => continue,
                Ok(_) => {
                    // It restarted: what it acknowledged before may be lost, and no
                    // later sync can bring it back, so it is reported once.
                    Err(format!(
                        "{server} restarted since it acknowledged them; they may be lost"
                    ))
                }
                Err(Attempt::Final(e)) => {
                    // The server answered with a failed sync: its disk may not have
                    // the writes. Kept, so a later sync tries again.
                    self.unsynced.lock().entry(server).or_insert(boot);
                    Err(format!("{server} could not sync: {e}"))
                }
                Err(Attempt::NextServer(why)) => {
                    self.unsynced.lock().entry(server).or_insert(boot);
                    Err(format!(
                        "{server} did not answer the sync ({why}); the writes it \
                         acknowledged since the last sync may be lost"
                    ))
                }
            };
            if let Err(reason) = outcome {
                tracing::error!(disk = %self.name, %server, %reason, "NSD sync failed");
                failed.push((server, reason));
            }
        }
        if failed.is_empty() {
            return Ok(());
        }
        // One error naming every server whose writes are in doubt.
        Err(DiskError::WritesInDoubt {
            disk: self.name.clone(),
            server: failed
                .iter()
                .map(|(s, _)| s.to_string())
                .collect::<Vec<_>>()
                .join(", "),
            reason: failed
                .into_iter()
                .map(|(_, r)| r)
                .collect::<Vec<_>>()
                .join("; "),
        })
    }
}

/// The disks `server` serves, with their sizes, sorted by name (`mako disk show`, and
/// a check of the cluster configuration's server lists).
pub fn served_disks(
    transport: &dyn Transport,
    server: NodeId,
    deadline: Duration,
) -> Result<Vec<(String, u64)>, DiskError> {
    let request = protocol::encode_request(Op::List, "", 0, 0, BufferType::DiskHeader, 0, &[]);
    let options = CallOptions {
        priority: Priority::Small,
        deadline,
    };
    let refused = |reason: String| DiskError::Refused {
        disk: "(the list of disks served)".into(),
        server: server.to_string(),
        reason,
    };
    let reply = transport
        .call(server, ServiceId::Nsd, request, options)
        .map_err(|e| DiskError::NoServer {
            disk: "(the list of disks served)".into(),
            tried: format!("{server}: {e}"),
        })?;
    match protocol::decode_reply(&reply).map_err(refused)? {
        Ok((_, payload)) => protocol::decode_list(payload).map_err(refused),
        Err(Failure::Disk(e)) => Err(e.into_error(&server.to_string())),
        Err(f) => Err(refused(format!("{f:?}"))),
    }
}

/// How this node reaches one disk: directly, or through its NSD servers.
pub enum DiskRoute {
    /// This node has local access (a disk file or a block device it can open).
    Local(Arc<dyn Disk>),
    /// Through these servers, primary first.
    Servers { name: String, servers: Vec<NodeId> },
}

impl std::fmt::Debug for DiskRoute {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DiskRoute::Local(d) => write!(f, "Local({})", d.name()),
            DiskRoute::Servers { name, servers } => write!(f, "Servers({name}: {servers:?})"),
        }
    }
}

impl DiskRoute {
    /// Local access if this node has it, else the disk's servers (this node left out:
    /// it cannot serve a disk it cannot open). `local` is the outcome of opening the
    /// disk here. A disk with no other server that cannot be opened here is an error:
    /// the open's own.
    pub fn choose(
        name: &str,
        local: Result<Arc<dyn Disk>, DiskError>,
        servers: &[NodeId],
        me: NodeId,
    ) -> Result<DiskRoute, DiskError> {
        match local {
            Ok(disk) => Ok(DiskRoute::Local(disk)),
            Err(e) => {
                let servers: Vec<NodeId> = servers.iter().copied().filter(|&s| s != me).collect();
                if servers.is_empty() {
                    return Err(e);
                }
                tracing::info!(disk = name, reason = %e, ?servers, "no local access: using NSD servers");
                Ok(DiskRoute::Servers {
                    name: name.to_string(),
                    servers,
                })
            }
        }
    }

    /// The disk to do I/O on: the local one, or a `RemoteDisk` connected to a server.
    pub fn open(
        self,
        transport: &Arc<dyn Transport>,
        options: RemoteOptions,
    ) -> Result<Arc<dyn Disk>, DiskError> {
        match self {
            DiskRoute::Local(d) => Ok(d),
            DiskRoute::Servers { name, servers } => Ok(Arc::new(RemoteDisk::connect(
                &name,
                servers,
                transport.clone(),
                options,
            )?)),
        }
    }
}

/// An `Nsd` over disks chosen per disk (`DiskRoute`): a `LocalNsd` over local disks
/// and `RemoteDisk`s, so accounting, the I/O history and the barrier are the local
/// ones. A node with no local disk access mounts on it.
pub struct RemoteNsd {
    inner: LocalNsd,
    /// The remote disks, by disk index (None: local access).
    remote: Vec<Option<Arc<RemoteDisk>>>,
}

impl RemoteNsd {
    pub fn new(
        routes: Vec<DiskRoute>,
        transport: Arc<dyn Transport>,
        options: RemoteOptions,
        iohist_size: usize,
    ) -> Result<RemoteNsd, DiskError> {
        let mut disks: Vec<Arc<dyn Disk>> = Vec::with_capacity(routes.len());
        let mut remote = Vec::with_capacity(routes.len());
        for route in routes {
            match route {
                DiskRoute::Local(d) => {
                    disks.push(d);
                    remote.push(None);
                }
                DiskRoute::Servers { name, servers } => {
                    let d = Arc::new(RemoteDisk::connect(
                        &name,
                        servers,
                        transport.clone(),
                        options,
                    )?);
                    disks.push(d.clone());
                    remote.push(Some(d));
                }
            }
        }
        Ok(RemoteNsd {
            inner: LocalNsd::new(disks, iohist_size),
            remote,
        })
    }

    /// The remote disk at `index` (None: local access, or no such disk).
    pub fn remote(&self, index: u32) -> Option<&Arc<RemoteDisk>> {
        self.remote.get(index as usize).and_then(|r| r.as_ref())
    }
}

impl Nsd for RemoteNsd {
    fn disk_count(&self) -> usize {
        self.inner.disk_count()
    }
    fn disk_size(&self, disk: u32) -> Result<u64, DiskError> {
        self.inner.disk_size(disk)
    }
    fn disk_name(&self, disk: u32) -> String {
        self.inner.disk_name(disk)
    }
    fn read(&self, da: DiskAddress, buf: &mut [u8], tag: IoTag) -> Result<(), DiskError> {
        self.inner.read(da, buf, tag)
    }
    fn write(&self, da: DiskAddress, buf: &[u8], tag: IoTag) -> Result<(), DiskError> {
        self.inner.write(da, buf, tag)
    }
    fn sync_all(&self) -> Result<(), DiskError> {
        self.inner.sync_all()
    }
    fn history(&self) -> &IoHistory {
        self.inner.history()
    }
    fn stats(&self) -> Vec<DiskStats> {
        self.inner.stats()
    }
}
