//! Ownership of space (docs/coherence.md section 6): a node allocates blocks only in
//! allocation regions whose token it holds, and inode numbers only in inode-map
//! segments whose token it holds. When such a token leaves, what the node changed in
//! the region's or segment's map is committed and written in place first, so the next
//! owner reads the current map from disk.

use crate::core::Core;
use crate::error::FsResult;
use crate::journal::{OWNER_ALLOC_MAP, OWNER_INODE_MAP};
use std::sync::Arc;

/// The allocation region's token leaves this node.
pub fn revoke_region(core: &Arc<Core>, _region: u64) -> FsResult<()> {
    core.journal.write_in_place(core, OWNER_ALLOC_MAP)
}

/// The inode-map segment's token leaves this node.
pub fn revoke_segment(core: &Arc<Core>, _segment: u64) -> FsResult<()> {
    core.journal.write_in_place(core, OWNER_INODE_MAP)
}
