//! The coherence seam: every cached object is covered by a token from the token
//! manager (DESIGN.md 4). In a single-node cluster the manager is in-process and the
//! node is the only holder, so acquires are local cache hits after the first; the same
//! calls go to a remote token manager shard in a multi-node cluster.

use crate::error::{DamageSink, FsError, FsResult, IntegrityError, SinkSlot};
use mako_token::{
    ByteRange, NodeId, ResourceId, ResourceKind, RevokeRegistry, TokenClient, TokenClientLimits,
    TokenManager, TokenManagerLimits, TokenMode,
};
use std::sync::Arc;

pub trait Coherence: Send + Sync {
    /// Cover the inode's attributes (`Ro` to read, `Xw` to change).
    fn inode(&self, ino: u64, mode: TokenMode) -> FsResult<()>;
    /// Cover a byte range of a file's data; `required` is rounded to blocks by the caller.
    fn data(&self, ino: u64, mode: TokenMode, required: ByteRange) -> FsResult<()>;
    /// Give up every token on the inode (cache eviction, delete).
    fn release(&self, ino: u64);
    /// Token table for `mako diag tokens`: (resource, holders).
    fn dump(&self) -> Vec<(String, Vec<String>)>;
    /// Where a token failure is reported (see `map_err`).
    fn attach_damage(&self, sink: DamageSink);
}

/// Token-manager-backed coherence for one node.
pub struct TokenCoherence {
    fs: u32,
    manager: Arc<TokenManager>,
    client: TokenClient,
    damage: SinkSlot,
}

impl TokenCoherence {
    /// A single-node setup: an in-process manager and this node's client.
    pub fn single_node(
        fs: u32,
        node: u32,
        flush: Arc<dyn mako_token::CacheFlush>,
    ) -> TokenCoherence {
        let manager = Arc::new(TokenManager::new(TokenManagerLimits {
            tokens_max: 10_000_000,
        }));
        let registry = Arc::new(RevokeRegistry::new());
        let client = TokenClient::new(
            NodeId(node),
            manager.clone(),
            registry,
            flush,
            TokenClientLimits::default(),
        );
        TokenCoherence {
            fs,
            manager,
            client,
            damage: SinkSlot::default(),
        }
    }
    fn res(&self, kind: ResourceKind, ino: u64) -> ResourceId {
        ResourceId {
            fs: self.fs,
            kind,
            id: ino,
        }
    }
}

impl TokenCoherence {
    /// A token request failed. On one node every failure is an integrity failure:
    /// the node is the only holder, so a conflict, a malformed request, a full table
    /// or a failed revoke means the code broke an invariant of the token layer, and
    /// the cache it was about to cover cannot be trusted (not EINVAL: the caller did
    /// nothing wrong). A multi-node cluster will retry conflicts before this.
    fn map_err(&self, ino: u64, e: mako_token::TokenError) -> FsError {
        self.damage
            .integrity(IntegrityError::new("token", e.to_string()).ino(ino))
    }
}

impl Coherence for TokenCoherence {
    fn inode(&self, ino: u64, _mode: TokenMode) -> FsResult<()> {
        // Ask for xw whatever the need: on a single node the only holder keeps the
        // strongest mode, so a later change needs no second round trip. A multi-node
        // cluster must ask for `_mode` (and revoke conflicting holders).
        self.client
            .acquire_whole(self.res(ResourceKind::Inode, ino), TokenMode::Xw)
            .map(|_| ())
            .map_err(|e| self.map_err(ino, e))
    }
    fn data(&self, ino: u64, _mode: TokenMode, required: ByteRange) -> FsResult<()> {
        // As for inodes: xw on one node; `_mode` once there are others.
        self.client
            .acquire(
                self.res(ResourceKind::ByteRange, ino),
                TokenMode::Xw,
                required,
                ByteRange::WHOLE,
            )
            .map(|_| ())
            .map_err(|e| self.map_err(ino, e))
    }
    fn release(&self, ino: u64) {
        let _ = self
            .client
            .release(self.res(ResourceKind::Inode, ino), ByteRange::WHOLE);
        let _ = self
            .client
            .release(self.res(ResourceKind::ByteRange, ino), ByteRange::WHOLE);
    }
    fn attach_damage(&self, sink: DamageSink) {
        self.damage.attach(sink);
    }
    fn dump(&self) -> Vec<(String, Vec<String>)> {
        self.manager
            .dump()
            .into_iter()
            .map(|(r, h)| (r.to_string(), h.iter().map(|x| x.to_string()).collect()))
            .collect()
    }
}
