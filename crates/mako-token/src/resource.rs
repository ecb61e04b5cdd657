//! Names of the objects that tokens protect, in a form that can cross the network.

use std::fmt;

use serde::{Deserialize, Serialize};

/// The class of object a token protects (DESIGN §4, "Resources").
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum ResourceKind {
    /// An inode's attributes; `id` is the inode number.
    Inode,
    /// Byte ranges of one file's data; `id` is the inode number.
    ByteRange,
    /// The hash space of one directory, locked by ranges for parallel creates;
    /// `id` is the directory's inode number.
    DirBucket,
    /// One allocation region of the block allocation map; `id` is the region number.
    AllocRegion,
    /// One segment of the inode allocation map; `id` is the segment number.
    InodeMapSegment,
    /// The file system's rename lock: renames that move a directory to another parent
    /// hold it, so the loop check sees a stable tree. `id` is 0.
    RenameLock,
    /// The claim on a failed node's recovery log: a survivor replays it and releases
    /// the node's tokens only while it holds this in `xw`, so two recoveries of one
    /// node never overlap (`mako_fs::recovery::recover_failed_node`). `id` is the
    /// failed node's number. Covers no cached state.
    RecoveryLog,
}

impl ResourceKind {
    /// Whether tokens on this kind cover sub-ranges. The others are always held over
    /// [`crate::ByteRange::WHOLE`], so the manager rejects partial ranges for them.
    pub fn is_ranged(self) -> bool {
        matches!(self, ResourceKind::ByteRange | ResourceKind::DirBucket)
    }

    /// Short name for diagnostics.
    pub fn as_str(self) -> &'static str {
        match self {
            ResourceKind::Inode => "inode",
            ResourceKind::ByteRange => "byterange",
            ResourceKind::DirBucket => "dirbucket",
            ResourceKind::AllocRegion => "allocregion",
            ResourceKind::InodeMapSegment => "inodemap",
            ResourceKind::RenameLock => "renamelock",
            ResourceKind::RecoveryLog => "recoverylog",
        }
    }
}

/// One object that tokens protect: a file system, a kind and a number within it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ResourceId {
    /// File system number within the cluster.
    pub fs: u32,
    /// What kind of object `id` names.
    pub kind: ResourceKind,
    /// Inode, region or segment number, depending on `kind`.
    pub id: u64,
}

impl ResourceId {
    pub fn new(fs: u32, kind: ResourceKind, id: u64) -> Self {
        ResourceId { fs, kind, id }
    }
}

impl fmt::Display for ResourceId {
    /// `fs1:inode:42`, the form used in error messages and `mako diag tokens`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "fs{}:{}:{}", self.fs, self.kind.as_str(), self.id)
    }
}

/// A cluster node (defined with the transport, which names nodes too).
pub use mako_rt::NodeId;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display() {
        let r = ResourceId::new(1, ResourceKind::Inode, 42);
        assert_eq!(r.to_string(), "fs1:inode:42");
        assert_eq!(NodeId(3).to_string(), "node 3");
    }

    #[test]
    fn ranged_kinds() {
        assert!(ResourceKind::ByteRange.is_ranged());
        assert!(ResourceKind::DirBucket.is_ranged());
        assert!(!ResourceKind::Inode.is_ranged());
        assert!(!ResourceKind::AllocRegion.is_ranged());
        assert!(!ResourceKind::InodeMapSegment.is_ranged());
    }
}
