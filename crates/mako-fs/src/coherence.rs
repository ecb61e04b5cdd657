//! The coherence seam (docs/coherence.md sections 2 and 3): the tokens that cover what
//! this node caches, named as the file system sees them. Every cached object is
//! covered by a token acquired before the cached state is read; an operation holds
//! (`Hold`) what it uses until it is done, so a revoke waits for it.
//!
//! `Need` says what an operation wants to do with an inode, and maps to modes:
//! caching it (any token), writing data and growing it (`rw`, times and size merged by
//! the metanode), changing anything else (`xw`).

use crate::error::{FsError, FsResult};
use mako_token::{
    ByteRange, Hold, NodeId, ResourceId, ResourceKind, TokenClient, TokenError, TokenMode,
};

/// What an operation needs of an inode.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Need {
    /// Cache the inode and trust what every mode promises (its identity, type, link
    /// structure it does not change): any token.
    Cache,
    /// Write data, extend the size, set times to now: `rw` (or `xw`).
    Write,
    /// Change anything: `xw`.
    Exclusive,
}

/// A token an operation found missing: acquire it (with nothing held) and restart.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Missing {
    pub resource: ResourceId,
    pub mode: TokenMode,
    pub required: ByteRange,
    pub desired: ByteRange,
    /// Replace a weaker incomparable mode (`ro` → `rw`) instead of joining.
    pub replace: bool,
    /// Ask for this stronger mode if nobody is in the way (a node working alone then
    /// holds everything after its first acquire).
    pub upgrade_to: Option<TokenMode>,
    /// Settle for this mode rather than revoke anyone (a reader of an inode others
    /// write shares their `rw`).
    pub alt_mode: Option<TokenMode>,
    /// Grant only while the structure is the one the operation saw (else the
    /// condition's fallback): see `mako_token::AcquireRequest::condition`.
    pub condition: Option<mako_token::Condition>,
}

impl std::fmt::Display for Missing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {} {}", self.mode, self.resource, self.required)
    }
}

/// This node's tokens on one file system.
#[derive(Clone)]
pub struct Tokens {
    fs: u32,
    client: TokenClient,
}

pub fn token_error(e: TokenError) -> FsError {
    FsError::Token(e.to_string())
}

impl Tokens {
    pub fn new(fs: u32, client: TokenClient) -> Tokens {
        Tokens { fs, client }
    }

    pub fn client(&self) -> &TokenClient {
        &self.client
    }

    pub fn node(&self) -> NodeId {
        self.client.node()
    }

    pub fn inode(&self, ino: u64) -> ResourceId {
        ResourceId::new(self.fs, ResourceKind::Inode, ino)
    }
    pub fn data(&self, ino: u64) -> ResourceId {
        ResourceId::new(self.fs, ResourceKind::ByteRange, ino)
    }
    pub fn dir(&self, ino: u64) -> ResourceId {
        ResourceId::new(self.fs, ResourceKind::DirBucket, ino)
    }
    pub fn region(&self, region: u32) -> ResourceId {
        ResourceId::new(self.fs, ResourceKind::AllocRegion, region as u64)
    }
    pub fn segment(&self, segment: u32) -> ResourceId {
        ResourceId::new(self.fs, ResourceKind::InodeMapSegment, segment as u64)
    }
    pub fn rename_lock(&self) -> ResourceId {
        ResourceId::new(self.fs, ResourceKind::RenameLock, 0)
    }
    /// The claim on node `node`'s recovery log (`recovery::recover_failed_node`).
    pub fn recovery_log(&self, node: u32) -> ResourceId {
        ResourceId::new(self.fs, ResourceKind::RecoveryLog, node as u64)
    }

    /// The token acquire that `need` on `ino` calls for.
    pub fn inode_missing(&self, ino: u64, need: Need) -> Missing {
        let (mode, replace) = match need {
            Need::Cache => (TokenMode::Ro, false),
            Need::Write => (TokenMode::Rw, true),
            Need::Exclusive => (TokenMode::Xw, false),
        };
        Missing {
            resource: self.inode(ino),
            mode,
            required: ByteRange::WHOLE,
            desired: ByteRange::WHOLE,
            replace,
            upgrade_to: Some(TokenMode::Xw),
            // Caching an inode others write: share their rw, ask the metanode.
            alt_mode: (need == Need::Cache).then_some(TokenMode::Rw),
            condition: None,
        }
    }

    /// Hold the inode token for `need` if this node has it; never waits.
    pub fn try_hold_inode(&self, ino: u64, need: Need) -> Result<Hold, Missing> {
        let r = self.inode(ino);
        let h = match need {
            Need::Cache => self.client.try_hold_any(r, ByteRange::WHOLE),
            Need::Write => self.client.try_hold(r, TokenMode::Rw, ByteRange::WHOLE),
            Need::Exclusive => self.client.try_hold(r, TokenMode::Xw, ByteRange::WHOLE),
        };
        h.ok_or_else(|| self.inode_missing(ino, need))
    }

    /// The mode this node holds on the inode (`ro`, `rw`, `xw`), if any.
    pub fn inode_mode(&self, ino: u64) -> Option<TokenMode> {
        self.client.held_mode(self.inode(ino), ByteRange::WHOLE)
    }

    /// Hold `mode` over `range` of a ranged resource if held; never waits.
    pub fn try_hold_range(
        &self,
        resource: ResourceId,
        mode: TokenMode,
        range: ByteRange,
        desired: ByteRange,
    ) -> Result<Hold, Missing> {
        self.client.try_hold(resource, mode, range).ok_or(Missing {
            resource,
            mode,
            required: range,
            desired,
            replace: false,
            upgrade_to: Some(TokenMode::Xw),
            alt_mode: None,
            condition: None,
        })
    }

    /// Acquire what `missing` names. Blocks: call with no lock, no transaction handle
    /// and no hold open (docs/coherence.md R1).
    pub fn acquire(&self, missing: Missing) -> FsResult<()> {
        self.client
            .acquire_with_options(
                missing.resource,
                missing.mode,
                missing.required,
                missing.desired,
                mako_token::AcquireOptions {
                    condition: missing.condition,
                    replace: missing.replace,
                    upgrade_to: missing.upgrade_to,
                    alt_mode: missing.alt_mode,
                    no_revoke: false,
                },
            )
            .map_err(token_error)
    }

    /// Give up every token on the inode (eviction, delete). Blocks like `acquire`.
    pub fn release_inode(&self, ino: u64) -> FsResult<()> {
        self.client
            .release(self.data(ino), ByteRange::WHOLE)
            .map_err(token_error)?;
        self.client
            .release(self.dir(ino), ByteRange::WHOLE)
            .map_err(token_error)?;
        self.client
            .release(self.inode(ino), ByteRange::WHOLE)
            .map_err(token_error)
    }

    /// The tokens this node holds, for `mako diag tokens`: each resource, the manager
    /// node whose shard keeps it, and the pieces held.
    pub fn dump(&self) -> Vec<(String, u32, Vec<String>)> {
        self.client
            .held_all()
            .into_iter()
            .map(|(r, pieces)| {
                (
                    r.to_string(),
                    self.client.manager_of(&r).0,
                    pieces
                        .iter()
                        .map(|(range, mode)| format!("{} {mode} {range}", self.node()))
                        .collect(),
                )
            })
            .collect()
    }
}
