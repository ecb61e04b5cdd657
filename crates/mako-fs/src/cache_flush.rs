//! What this node does when another node's request revokes one of its tokens: write
//! back dirty data under the range and drop the cached copies, in the pagepool and in
//! the kernel (DESIGN.md 4). With one node nothing revokes; the path is wired so that
//! multi-node coherence only has to call it.

use crate::core::Core;
use mako_token::{ByteRange, ResourceId, ResourceKind, TokenError};
use std::sync::{Arc, OnceLock, Weak};

/// TEST ONLY: ways to break a revoke on purpose, for the tests that prove the cluster
/// simulation (`mako-sim`) catches a broken one. Stored in `Core::revoke_fault`, which
/// every real mount leaves at `None`; nothing but those tests sets it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum RevokeFault {
    /// Revokes work as they must.
    None = 0,
    /// A data revoke drops the dirty buffers without writing them back (lost writes).
    SkipWriteBack = 1,
    /// A data revoke writes back but keeps the cached buffers (a missing invalidation:
    /// the node goes on serving data it no longer holds a token for).
    KeepCachedData = 2,
}

impl RevokeFault {
    fn of(core: &Core) -> RevokeFault {
        match core.revoke_fault.load(std::sync::atomic::Ordering::Relaxed) {
            1 => RevokeFault::SkipWriteBack,
            2 => RevokeFault::KeepCachedData,
            _ => RevokeFault::None,
        }
    }
}

#[derive(Default)]
pub struct FsCacheFlush {
    core: OnceLock<Weak<Core>>,
}

impl FsCacheFlush {
    pub fn attach(&self, core: &Arc<Core>) {
        let _ = self.core.set(Arc::downgrade(core));
    }
}

impl mako_token::CacheFlush for FsCacheFlush {
    fn flush_and_invalidate(
        &self,
        resource: ResourceId,
        range: ByteRange,
        _keep: Option<mako_token::TokenMode>,
    ) -> Result<(), TokenError> {
        let Some(core) = self.core.get().and_then(|w| w.upgrade()) else {
            return Ok(());
        };
        let ino = resource.id;
        if let Some(h) = core.cached_handle(ino) {
            if resource.kind == ResourceKind::ByteRange {
                let fault = RevokeFault::of(&core);
                let bb = core.block_bytes();
                let first = range.start / bb;
                let last = if range.end == u64::MAX {
                    u64::MAX
                } else {
                    range.end.div_ceil(bb)
                };
                for (_, b) in core.pool.keys_of(ino, true) {
                    if b >= first && b < last && fault != RevokeFault::SkipWriteBack {
                        crate::file_io::flush_block(&core, &h, b).map_err(|e| {
                            TokenError::FlushFailed {
                                node: mako_token::NodeId(core.node),
                                resource,
                                range,
                                reason: e.to_string(),
                            }
                        })?;
                    }
                }
                if fault != RevokeFault::KeepCachedData {
                    core.alloc
                        .unreserve(core.pool.remove_from_range(ino, first, last));
                }
            } else {
                crate::workers::flush_inode(&core, &h).map_err(|e| TokenError::FlushFailed {
                    node: mako_token::NodeId(core.node),
                    resource,
                    range,
                    reason: e.to_string(),
                })?;
            }
        }
        core.invalidate_kernel_inode(ino);
        Ok(())
    }
}
