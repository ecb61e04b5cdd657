//! Mako's network transport (DESIGN.md section 6): a framed binary RPC protocol over
//! TCP that implements `mako_rt::Transport` for nodes in separate processes.
//!
//! - `wire`: the frame header (magic, version, kind, service, request id, deadline,
//!   length, header crc32c) and the postcard control bodies;
//! - `auth`: the cluster key and the challenge–response both ends run at connect;
//! - `config`: `RpcConfig`, from mako-config's connection parameters;
//! - `transport`: `TcpTransport`, lanes per peer, deadlines, the caller side;
//! - `server`: accepting, authenticating, dispatching to handler threads;
//! - `dedup`: the server's memory of requests, so a request resent after its
//!   connection closed runs once.
//!
//! It knows bytes, services and nodes, not file systems.

pub mod auth;
pub mod config;
mod dedup;
mod io;
pub mod server;
pub mod stats;
pub mod transport;
pub mod wire;

pub use auth::ClusterKey;
pub use config::RpcConfig;
pub use stats::RpcStats;
pub use transport::{RpcError, TcpTransport};
pub use wire::LaneClass;
