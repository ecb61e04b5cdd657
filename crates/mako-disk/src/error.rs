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
    /// A crash-test disk after its simulated crash (`CrashController`).
    #[error("disk {disk}: {op} refused after a simulated crash ({crash}); a crash-test disk takes no I/O once its controller crashed")]
    Crashed {
        disk: String,
        op: &'static str,
        crash: String,
    },
}

impl DiskError {
    /// The errno a failed disk I/O maps to at the POSIX boundary.
    pub fn errno(&self) -> i32 {
        libc::EIO
    }
}
