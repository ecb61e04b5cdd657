//! How the checker sees metadata: a reader trait, and a writer trait for repairs.
//!
//! Offline, both are `OfflineDisks`: the file system's disks through a `LocalNsd`
//! (every I/O counted and registered as a wait, like the daemon's). Online, the daemon
//! will plug in a reader that returns the committed state of a mounted file system —
//! blocks as the recovery log says they are, not yet written back — and no writer:
//! the checker itself is the same code.

use mako_disk::nsd::IoTag;
use mako_disk::{BufferType, Disk, DiskError, LocalNsd, Nsd};
use mako_format::DiskAddress;
use std::sync::Arc;

/// Reads metadata blocks as the checker must see them.
pub trait MetadataReader: Send + Sync {
    /// Read `buf.len()` bytes at `da`. `what` and `ino` label the I/O (iohist).
    fn read(
        &self,
        da: DiskAddress,
        buf: &mut [u8],
        what: BufferType,
        ino: u64,
    ) -> Result<(), DiskError>;
}

/// Writes repairs. Only offline: a mounted file system is repaired by its daemon.
pub trait MetadataWriter: Send + Sync {
    fn write(
        &self,
        da: DiskAddress,
        buf: &[u8],
        what: BufferType,
        ino: u64,
    ) -> Result<(), DiskError>;
    /// Durability barrier on every disk: the repair steps are ordered by it.
    fn sync(&self) -> Result<(), DiskError>;
}

/// The disks of an unmounted file system, ordered by their index in it.
pub struct OfflineDisks {
    nsd: LocalNsd,
}

/// I/O history entries kept for an offline run (`mako diag` is not running; the ring
/// only has to exist).
const IOHIST_ENTRIES: usize = 64;

impl OfflineDisks {
    pub fn new(ordered: Vec<Arc<dyn Disk>>) -> OfflineDisks {
        OfflineDisks {
            nsd: LocalNsd::new(ordered, IOHIST_ENTRIES),
        }
    }
    pub fn nsd(&self) -> &LocalNsd {
        &self.nsd
    }
}

impl MetadataReader for OfflineDisks {
    fn read(
        &self,
        da: DiskAddress,
        buf: &mut [u8],
        what: BufferType,
        ino: u64,
    ) -> Result<(), DiskError> {
        self.nsd.read(
            da,
            buf,
            IoTag {
                buffer_type: what,
                ino,
            },
        )
    }
}

impl MetadataWriter for OfflineDisks {
    fn write(
        &self,
        da: DiskAddress,
        buf: &[u8],
        what: BufferType,
        ino: u64,
    ) -> Result<(), DiskError> {
        self.nsd.write(
            da,
            buf,
            IoTag {
                buffer_type: what,
                ino,
            },
        )
    }
    fn sync(&self) -> Result<(), DiskError> {
        self.nsd.sync_all()
    }
}
