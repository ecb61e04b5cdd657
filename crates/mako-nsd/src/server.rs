//! `NsdServer`: the `ServiceId::Nsd` service of a node that has local access to some
//! disks and serves them to nodes that have not.
//!
//! Invariants: every request is checked (protocol, disk name, range, length) before
//! any I/O and refused with a reason otherwise; a disk error is answered as the same
//! `DiskError` variant, never dropped; nothing in a request can panic the handler or
//! make it reserve more than `max_io_bytes`; a write is acknowledged only after the
//! local `Nsd` completed it, and a sync only after the local barrier succeeded, so the
//! client gets the local `Nsd`'s contract (no short reads, sync is a barrier).

use crate::protocol::{self, Failure, Op, WireDiskError, SECTOR};
use mako_disk::nsd::IoTag;
use mako_disk::{AlignedBuf, DiskError, Nsd};
use mako_format::da::SECTOR_MAX;
use mako_format::DiskAddress;
use mako_rt::{NodeId, Service};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

/// Decides whether a node's requests are served at all (makod: refuses a node the
/// replicated configuration lists as expelled, docs/nsd.md "Fencing").
pub trait Fence: Send + Sync {
    /// `Err(reason)` refuses every request of `from` but the list of disks.
    fn admit(&self, from: NodeId) -> Result<(), String>;
}

/// Largest read or write a server accepts by default: the largest block size.
pub const MAX_IO_BYTES_DEFAULT: usize = 16 << 20;

/// Serves the disks of `nsd` by their NSD names.
pub struct NsdServer {
    nsd: Arc<dyn Nsd>,
    /// NSD name → index in `nsd`.
    names: HashMap<String, u32>,
    max_io_bytes: usize,
    /// Drawn at start: replies carry it, so a client sees a restart (writes it had
    /// acknowledged but not synced may be gone).
    boot: u64,
    refused: AtomicU64,
    served: AtomicU64,
    fence: parking_lot::RwLock<Option<Arc<dyn Fence>>>,
}

impl NsdServer {
    /// Serves every disk of `nsd` under its `disk_name`. `max_io_bytes` bounds one
    /// request (it must stay under the transport's frame limit). Refused when two
    /// disks have one name (requests for it could reach either) or a name cannot be
    /// sent (empty or over 255 bytes).
    pub fn new(nsd: Arc<dyn Nsd>, max_io_bytes: usize) -> Result<NsdServer, DiskError> {
        let mut names = HashMap::new();
        for i in 0..nsd.disk_count() as u32 {
            let name = nsd.disk_name(i);
            let refuse = |reason: String| DiskError::Refused {
                disk: name.clone(),
                server: "(this node, starting to serve)".into(),
                reason,
            };
            protocol::check_name(&name).map_err(refuse)?;
            if let Some(other) = names.insert(name.clone(), i) {
                return Err(refuse(format!(
                    "disks {other} and {i} of this node are both named {name:?}; \
                     NSD names must be unique"
                )));
            }
        }
        Ok(NsdServer {
            nsd,
            names,
            max_io_bytes,
            boot: boot_id(),
            refused: AtomicU64::new(0),
            served: AtomicU64::new(0),
            fence: parking_lot::RwLock::new(None),
        })
    }

    /// From now on, every request but the list of disks asks `fence` first.
    pub fn set_fence(&self, fence: Arc<dyn Fence>) {
        *self.fence.write() = Some(fence);
    }

    /// This server's boot id.
    pub fn boot_id(&self) -> u64 {
        self.boot
    }

    /// The names of the disks served, sorted.
    pub fn disks(&self) -> Vec<String> {
        let mut v: Vec<String> = self.names.keys().cloned().collect();
        v.sort();
        v
    }

    /// Requests refused as malformed or for a disk not served.
    pub fn refused(&self) -> u64 {
        self.refused.load(Relaxed)
    }

    /// Requests answered (successfully or with a disk error).
    pub fn served(&self) -> u64 {
        self.served.load(Relaxed)
    }

    fn refuse(&self, from: NodeId, f: Failure) -> Vec<u8> {
        self.refused.fetch_add(1, Relaxed);
        tracing::warn!(%from, failure = ?f, "refused an NSD request");
        protocol::failed_reply(&f)
    }

    fn serve(&self, from: NodeId, body: &[u8]) -> Vec<u8> {
        let req = match protocol::decode_request(body, self.max_io_bytes) {
            Ok(r) => r,
            Err(why) => return self.refuse(from, Failure::BadRequest(why)),
        };
        if req.op == Op::List {
            self.served.fetch_add(1, Relaxed);
            let mut disks = Vec::with_capacity(self.names.len());
            for name in self.disks() {
                let index = self.names[&name];
                match self.nsd.disk_size(index) {
                    Ok(size) => disks.push((name, size)),
                    Err(e) => {
                        return protocol::failed_reply(&Failure::Disk(WireDiskError::from_error(
                            &name, &e,
                        )))
                    }
                }
            }
            return protocol::encode_list(self.boot, &disks);
        }
        if let Some(fence) = self.fence.read().clone() {
            if let Err(why) = fence.admit(from) {
                return self.refuse(from, Failure::Fenced(why));
            }
        }
        let Some(&index) = self.names.get(req.disk) else {
            let f = Failure::UnknownDisk {
                disk: req.disk.to_string(),
                served: self.disks(),
            };
            return self.refuse(from, f);
        };
        let sector = req.offset / SECTOR;
        if sector > SECTOR_MAX {
            let f = Failure::BadRequest(format!(
                "offset {} on disk {} is past the largest disk address",
                req.offset, req.disk
            ));
            return self.refuse(from, f);
        }
        self.served.fetch_add(1, Relaxed);
        let da = DiskAddress::new(index, sector);
        let tag = IoTag {
            buffer_type: req.buffer_type,
            ino: req.ino,
        };
        let disk_failed = |e: mako_disk::DiskError| {
            tracing::warn!(%from, disk = req.disk, error = %e, "NSD request failed on the disk");
            protocol::failed_reply(&Failure::Disk(WireDiskError::from_error(req.disk, &e)))
        };
        match req.op {
            Op::Info => match self.nsd.disk_size(index) {
                Ok(size) => {
                    let mut out = protocol::ok_reply(self.boot, 8);
                    out[protocol::OK_PREFIX..].copy_from_slice(&size.to_le_bytes());
                    out
                }
                Err(e) => disk_failed(e),
            },
            Op::Read => {
                // Read into an aligned buffer (a direct-I/O disk needs no bounce buffer
                // then, and `read_append` does not zero it first), then one copy into
                // the reply body, which the reply frame carries as it is.
                let len = req.len as usize;
                let mut block = AlignedBuf::with_capacity(len);
                match self.nsd.read_append(da, &mut block, len, tag) {
                    Ok(()) => {
                        let mut out = protocol::ok_reply(self.boot, 0);
                        out.reserve_exact(len);
                        out.extend_from_slice(&block);
                        out
                    }
                    Err(e) => disk_failed(e),
                }
            }
            Op::Write => match self.nsd.write(da, req.payload, tag) {
                Ok(()) => protocol::ok_reply(self.boot, 0),
                Err(e) => disk_failed(e),
            },
            // The local barrier syncs every disk written since its last sync, this one
            // included (LocalNsd syncs only those).
            Op::Sync => match self.nsd.sync_all() {
                Ok(()) => protocol::ok_reply(self.boot, 0),
                Err(e) => disk_failed(e),
            },
            // Answered above, before the disk name is looked up.
            Op::List => protocol::encode_list(self.boot, &[]),
        }
    }
}

impl Service for NsdServer {
    fn handle(&self, from: NodeId, request: &[u8]) -> Vec<u8> {
        self.serve(from, request)
    }
}

/// A boot id: the clock's nanoseconds mixed with the process id and an address, so two
/// servers started in the same instant (tests) still differ.
fn boot_id() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    h.write_u32(std::process::id());
    h.finish()
}
