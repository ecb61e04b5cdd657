//! The Mako file system core: what a mounted file system is, independent of FUSE.
//!
//! Invariants:
//! - All block I/O goes through `mako_disk::Nsd`; nothing here opens a disk file
//!   except `mount::open_disk_files`/`mkfs::format`, which hand them to an NSD.
//! - Every cached inode is covered by a token (`coherence`), even on one node.
//! - Memory for file data is bounded by the pagepool; metadata caches by
//!   `maxFilesToCache` (full inodes) and `maxStatCache` (attributes only).
//! - Ordered writes: file data reaches disk before the metadata that points at it.
//!   The recovery log (crash consistency) is not implemented yet: after an unclean
//!   stop the mount warns and fsck is the remedy.
//! - Errors are `FsError`, converted to errno only by `FsError::errno`.

pub mod acl;
pub mod alloc_map;
pub mod block_map;
pub mod cache_flush;
pub mod coherence;
pub mod core;
pub mod directory;
pub mod error;
pub mod file_io;
pub mod fs;
pub mod inode_map;
pub mod mkfs;
pub mod mount;
pub mod pagepool;
pub mod stats;
pub mod test_util;
pub mod workers;

pub use crate::core::{Core, FsConfig, KernelInvalidator};
pub use error::{FsError, FsResult};
pub use fs::{Attr, Ctx, FileSystem, SetAttr, TimeSet};
pub use mkfs::{format, DiskSpec, MkfsParams};
pub use mount::{mount, read_descriptor, Mounted};
