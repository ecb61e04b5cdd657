//! What this node does when another node's request revokes one of its tokens: write
//! back dirty data under the range and drop the cached copies, in the pagepool and in
//! the kernel (DESIGN.md 4). With one node nothing revokes; the path is wired so that
//! multi-node coherence only has to call it.

use crate::core::Core;
use mako_token::{ByteRange, ResourceId, ResourceKind, TokenError};
use std::sync::{Arc, OnceLock, Weak};

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
                let bb = core.block_bytes();
                let first = range.start / bb;
                let last = if range.end == u64::MAX {
                    u64::MAX
                } else {
                    range.end.div_ceil(bb)
                };
                for (_, b) in core.pool.keys_of(ino, true) {
                    if b >= first && b < last {
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
                core.alloc
                    .unreserve(core.pool.remove_from_range(ino, first, last));
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
