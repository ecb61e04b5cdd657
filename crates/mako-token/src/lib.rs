//! Mako's distributed token manager: which node may cache or change which object.
//!
//! Tokens are granted per resource ([`ResourceId`]) in a mode ([`TokenMode`]) over a
//! byte range ([`ByteRange`]). The [`TokenManager`] is the authority and answers plain
//! requests from node ids; each node's [`TokenClient`] caches what it holds and runs the
//! revoke protocol (docs/coherence.md section 2) when another node is in the way. Nodes
//! reach the manager and each other only through `mako_rt::Transport`.

mod client;
mod error;
mod held_ranges;
mod manager;
mod mode;
mod protocol;
mod range;
mod resource;

/// Maps with a fixed hasher: iteration order is a function of the contents, so a
/// simulation seed replays exactly (std's random hasher differs per process).
pub(crate) type DetMap<K, V> =
    std::collections::HashMap<K, V, std::hash::BuildHasherDefault<FxHasher>>;
pub use rustc_hash::FxHasher;

#[cfg(test)]
mod invariant_tests;
#[cfg(test)]
mod rebuild_tests;

pub use client::{
    AcquireOptions, CacheFlush, Hold, ManagerMap, NoCache, TokenClient, TokenClientLimits,
    TokenClientStats,
};
pub use error::TokenError;
pub use manager::{
    AcquireRequest, Condition, Grant, HeldToken, Holder, TokenManager, TokenManagerLimits,
    TokenStats, SHARD_COUNT_DEFAULT,
};
pub use mode::{compatible, covers, join, TokenMode};
pub use protocol::{ClientReply, ClientRequest, ManagerReply, ManagerRequest, ManagerService};
pub use range::ByteRange;
pub use resource::{NodeId, ResourceId, ResourceKind};
