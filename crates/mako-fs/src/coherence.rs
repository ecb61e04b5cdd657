//! The coherence seam: every cached object is covered by a token from the token
//! manager (DESIGN.md 4). In a single-node cluster the manager is in-process and the
//! node is the only holder, so acquires are local cache hits after the first; the same
//! calls go to a remote token manager shard in a multi-node cluster.

use crate::error::{FsError, FsResult};
use mako_rt::{InProcessTransport, Registry, ServiceId};
use mako_token::{
    ByteRange, ManagerMap, ManagerService, NodeId, ResourceId, ResourceKind, TokenClient,
    TokenClientLimits, TokenManager, TokenManagerLimits, TokenMode,
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
}

/// Token-manager-backed coherence for one node.
pub struct TokenCoherence {
    fs: u32,
    manager: Arc<TokenManager>,
    client: TokenClient,
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
        let registry = Registry::new();
        registry.register(
            NodeId(node),
            ServiceId::TokenManager,
            Arc::new(ManagerService {
                manager: manager.clone(),
            }),
        );
        let transport = Arc::new(InProcessTransport::new(NodeId(node), registry.clone()));
        let client = TokenClient::new(
            NodeId(node),
            transport,
            ManagerMap::single(NodeId(node)),
            TokenClientLimits::default(),
        );
        client.set_cache_flush(flush);
        registry.register(NodeId(node), ServiceId::TokenClient, client.service());
        TokenCoherence {
            fs,
            manager,
            client,
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

fn map_err(e: mako_token::TokenError) -> FsError {
    FsError::Invalid(format!("token: {e}"))
}

impl Coherence for TokenCoherence {
    fn inode(&self, ino: u64, _mode: TokenMode) -> FsResult<()> {
        // Ask for xw whatever the need: on a single node the only holder keeps the
        // strongest mode, so a later change needs no second round trip. A multi-node
        // cluster must ask for `_mode` (and revoke conflicting holders).
        self.client
            .acquire_whole(self.res(ResourceKind::Inode, ino), TokenMode::Xw)
            .map(|_| ())
            .map_err(map_err)
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
            .map_err(map_err)
    }
    fn release(&self, ino: u64) {
        let _ = self
            .client
            .release(self.res(ResourceKind::Inode, ino), ByteRange::WHOLE);
        let _ = self
            .client
            .release(self.res(ResourceKind::ByteRange, ino), ByteRange::WHOLE);
    }
    fn dump(&self) -> Vec<(String, Vec<String>)> {
        self.manager
            .dump()
            .into_iter()
            .map(|(r, h)| (r.to_string(), h.iter().map(|x| x.to_string()).collect()))
            .collect()
    }
}
