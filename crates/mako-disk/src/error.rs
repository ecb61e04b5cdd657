//! Disk errors: which disk, which operation, which offset.

#[derive(Debug, thiserror::Error)]
pub enum DiskError {
    #[error("disk {disk}: cannot open {path}: {source}; check that the file exists and is writable by makod")]
    Open {
        disk: String,
        path: String,
        source: std::io::Error,
    },
    #[error("disk {disk}: {op} of {len} bytes at byte {offset} failed: {source}")]
    Io {
        disk: String,
        op: &'static str,
        offset: u64,
        len: usize,
        source: std::io::Error,
    },
    #[error("disk {disk}: {op} at byte {offset}+{len} is beyond the disk size {size}")]
    OutOfRange {
        disk: String,
        op: &'static str,
        offset: u64,
        len: usize,
        size: u64,
    },
    #[error("disk index {index} is not attached to this NSD (have {count} disks)")]
    NoSuchDisk { index: u32, count: usize },
    #[error("disk {disk}: injected fault ({what})")]
    Injected { disk: String, what: String },
    /// An NSD server refused a request for this disk (it does not serve the disk, or
    /// the request was malformed): a configuration mismatch or a bug, never a disk fault.
    #[error("disk {disk}: NSD server {server} refused the request: {reason}; check the disk's NSD server list in the cluster configuration and that every node runs the same Mako release")]
    Refused {
        disk: String,
        server: String,
        reason: String,
    },
    /// No NSD server of the disk answered (each one's reason in `tried`, in the order
    /// they were tried).
    #[error("disk {disk}: no NSD server answered ({tried}); check that makod runs on a server of the disk and that the network reaches it (`mako status`)")]
    NoServer { disk: String, tried: String },
    /// Writes a server acknowledged since the disk's last sync cannot be confirmed
    /// durable: that server did not answer the sync, so they may be lost.
    #[error("disk {disk}: writes acknowledged by NSD server {server} since the last sync may not be durable: {reason}; bring the server back, or unmount and check the file system (`mako fsck`)")]
    WritesInDoubt {
        disk: String,
        server: String,
        reason: String,
    },
    /// A crash-test disk after its simulated crash (`CrashController`).
    #[error("disk {disk}: {op} refused after a simulated crash ({crash}); a crash-test disk takes no I/O once its controller crashed")]
    Crashed {
        disk: String,
        op: &'static str,
        crash: String,
    },
    /// This node may not do disk I/O: its lease from the cluster manager ran out, or
    /// it was expelled (docs/cluster.md "Leases, expel and fencing"); `by` says who
    /// refused (this node's lease, or an NSD server).
    #[error("disk {disk}: I/O refused by {by}: {reason}")]
    Fenced {
        disk: String,
        by: String,
        reason: String,
    },
}

impl DiskError {
    /// The errno a failed disk I/O maps to at the POSIX boundary.
    pub fn errno(&self) -> i32 {
        libc::EIO
    }
}
