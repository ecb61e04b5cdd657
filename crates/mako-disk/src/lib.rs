//! Disks and the NSD (network shared disk) interface.
//!
//! Invariants:
//! - Every block read or write of the file system goes through [`Nsd`]; nothing above
//!   this crate touches a disk file. [`LocalNsd`] does the I/O on its [`Disk`]s, local
//!   ones or disks behind NSD servers (`mako_nsd::RemoteDisk`, a `Disk` too).
//! - A [`Disk`] is the world boundary: tests swap in [`MemDisk`], which can inject
//!   faults (failed reads/writes, a read-only disk), and crash tests swap in
//!   [`CrashDisk`]s, which keep the durable image apart from unsynced writes and can
//!   crash at any write or sync (fault model in `crash_disk.rs`).
//! - Every I/O is recorded in the I/O history (`mako diag iohist`) and per-disk counters.

pub mod aligned;
pub mod crash_disk;
pub mod disk;
pub mod error;
pub mod file_disk;
pub mod iohist;
pub mod mem_disk;
pub mod nsd;

pub use aligned::{AlignedBuf, IO_ALIGN};
pub use crash_disk::{CrashAt, CrashController, CrashDisk, CrashPoint, CrashRecord, LossPolicy};
pub use disk::Disk;
pub use error::DiskError;
pub use file_disk::FileDisk;
pub use iohist::{BufferType, IoHistory, IoRecord};
pub use mem_disk::MemDisk;
pub use nsd::{DiskStats, LocalNsd, Nsd};
