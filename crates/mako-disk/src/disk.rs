//! The disk trait: positioned reads and writes of whole sectors, and a durability barrier.

use crate::nsd::IoTag;
use crate::DiskError;

pub trait Disk: Send + Sync {
    /// Human name (the NSD name, e.g. `d0`).
    fn name(&self) -> &str;
    fn size_bytes(&self) -> u64;
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<(), DiskError>;
    fn write_at(&self, buf: &[u8], offset: u64) -> Result<(), DiskError>;
    /// Make every completed write durable.
    fn sync(&self) -> Result<(), DiskError>;
    /// True if this disk's `sync` may run on another thread at the same time as other
    /// disks' syncs (`Nsd::sync_all` then waits for the slowest instead of the sum). False
    /// by default: test disks (crash, simulated) count their syncs in one order, so a
    /// crash point or a seed replays exactly.
    fn sync_in_parallel(&self) -> bool {
        false
    }
    /// `read_at` with what the I/O carries: a disk behind an NSD server passes the tag
    /// on, so the server's I/O history says what it read. Others ignore it.
    fn read_tagged(&self, buf: &mut [u8], offset: u64, tag: IoTag) -> Result<(), DiskError> {
        let _ = tag;
        self.read_at(buf, offset)
    }
    /// `write_at` with what the I/O carries (see `read_tagged`).
    fn write_tagged(&self, buf: &[u8], offset: u64, tag: IoTag) -> Result<(), DiskError> {
        let _ = tag;
        self.write_at(buf, offset)
    }
}

/// Bounds check shared by implementations.
pub(crate) fn check_range(
    name: &str,
    op: &'static str,
    offset: u64,
    len: usize,
    size: u64,
) -> Result<(), DiskError> {
    match offset.checked_add(len as u64) {
        Some(end) if end <= size => Ok(()),
        _ => Err(DiskError::OutOfRange {
            disk: name.to_string(),
            op,
            offset,
            len,
            size,
        }),
    }
}
