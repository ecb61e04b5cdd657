//! NSD servers and clients (DESIGN.md section 6, docs/nsd.md): a node without local
//! access to a disk reaches it through the disk's NSD servers.
//!
//! - `protocol`: the requests and replies of `ServiceId::Nsd` (a fixed little-endian
//!   header, the disk's NSD name, and block payloads as raw bytes);
//! - `server`: `NsdServer`, the service that serves a node's local disks (an `Nsd` it
//!   owns) to other nodes;
//! - `client`: `RemoteDisk` (one disk through its server list, primary first, with
//!   failover), `DiskRoute` (local access if this node has it, else the servers) and
//!   `RemoteNsd` (an `Nsd` over routes, for a node that mounts with no local disks).
//!
//! It knows disks, NSD names and nodes, not file systems; the transport is any
//! `mako_rt::Transport` (TCP between daemons, in-process in tests).

pub mod client;
pub mod protocol;
pub mod server;

pub use client::{served_disks, DiskRoute, RemoteDisk, RemoteNsd, RemoteOptions};
pub use server::NsdServer;
