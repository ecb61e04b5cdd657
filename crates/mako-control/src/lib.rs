//! mako-control: what the `mako` CLI and the `makod` daemon share.
//!
//! - `cluster`: `ClusterConfig`, the cluster configuration file `DIR/cluster.toml`
//!   (node identity, disks, file systems), validated on load and saved atomically;
//!   `DataDir`, the names of every file in a data directory; the default data
//!   directory and mount point.
//! - `protocol`: `Request` and `Response` of the control protocol, one JSON object per
//!   line with a protocol version `"v"` checked on both sides, and the plain data
//!   views (`DaemonStatus`, `IoRecordView`, …) the daemon reports.
//! - `client`: `ControlClient`, the CLI side of the control socket.
//! - `mount_table`: the kernel's mount table (`/proc/self/mountinfo`): what is mounted
//!   where, which mounts are Mako's, whether a mount's daemon is gone; both makod and
//!   the CLI decide "is it mounted" here.
//! - `mount_options`: `MountOptions`, the `-o` options of mount(8), fstab and
//!   `mako fs mount`, parsed and printed the same way everywhere.
//! - `server`: `serve`, the daemon side: one thread per connection, a
//!   `ControlHandler` answers each request.
//!
//! Invariant: this crate knows nothing about the file system itself; it carries plain
//! data. It depends on no other Mako crate.

pub mod client;
pub mod cluster;
pub mod mount_options;
pub mod mount_table;
pub mod protocol;
pub mod server;

pub use client::{ClientError, ControlClient};
pub use cluster::{
    default_data_dir, default_mountpoint, same_dir, ClusterConfig, ClusterError, DataDir, DiskDef,
    FsDef, NodeDef, CLUSTER_KEY_FILE_NAME, DISK_USAGES,
};
pub use protocol::{
    ClusterDiskView, ClusterFsView, ClusterView, ConfigRowView, DaemonStatus, DiskCountersView,
    DiskStatusView, FsCountersView, FsStatus, FsckView, IoRecordView, LockCounterView, MountView,
    NodeStateView, ProtocolError, Request, Response, StatsView, TokenView, WaiterView,
    PROTOCOL_VERSION,
};
pub use server::{serve, ControlHandler};
