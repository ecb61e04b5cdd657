//! The Mako file system core: what a mounted file system is, independent of FUSE.
//!
//! Invariants:
//! - All block I/O goes through `mako_disk::Nsd`; nothing here opens a disk file
//!   except `mount::open_disk_files`/`mkfs::format`, which hand them to an NSD.
//! - Every cached inode is covered by a token (`coherence`), even on one node.
//! - Memory for file data is bounded by the pagepool; metadata caches by
//!   `maxFilesToCache` (full inodes) and `maxStatCache` (attributes only).
//! - Metadata reaches disk only through the recovery log (`journal`): write-ahead, as
//!   physical redo images in atomic transactions, written in place by checkpoints and
//!   replayed at mount after a crash (`recovery`). File data is not logged but is
//!   written before the commit whose metadata points at it (ordered mode).
//! - Errors are `FsError`, converted to errno only by `FsError::errno`.

pub mod acl;
pub mod alloc_map;
pub mod attributes;
pub mod block_map;
pub mod cache_flush;
pub mod coherence;
pub mod copy_range;
pub mod core;
pub mod directory;
pub mod env;
pub mod error;
pub mod file_io;
pub mod fs;
pub mod inode_map;
pub mod journal;
pub mod meta_blocks;
pub mod metanode;
pub mod mkfs;
pub mod mount;
pub mod op;
pub mod ownership;
pub mod pagepool;
pub mod recovery;
pub mod stat_cache;
pub mod stats;
pub mod test_util;
pub mod workers;
pub mod writer_seq;
pub mod xattr;

pub use crate::core::{Core, FsConfig, KernelInvalidator};
pub use error::{FsError, FsResult};
pub use fs::{Attr, Ctx, FileSystem, SetAttr, TimeSet};
pub use mkfs::{format, DiskSpec, MkfsParams};
pub use mount::{mount, read_descriptor, Mounted};
