//! Mako's distributed token manager: which node may cache or change which object.
//!
//! Tokens are granted per resource ([`ResourceId`]) in a mode ([`TokenMode`]) over a
//! byte range ([`ByteRange`]). The [`TokenManager`] is the authority and answers plain
//! requests from node ids; each node's [`TokenClient`] caches what it holds and runs the
//! revoke protocol (DESIGN §4) when another node is in the way. Today everything runs
//! in one process; the request and reply types are the ones that will go over the wire.

mod client;
mod error;
mod held_ranges;
mod manager;
mod mode;
mod range;
mod resource;

#[cfg(test)]
mod invariant_tests;

pub use client::{
    CacheFlush, NoCache, RevokeHandler, RevokeRegistry, TokenClient, TokenClientLimits,
    TokenClientStats,
};
pub use error::TokenError;
pub use manager::{
    AcquireRequest, Grant, Holder, TokenManager, TokenManagerLimits, TokenStats,
    SHARD_COUNT_DEFAULT,
};
pub use mode::{compatible, covers, join, TokenMode};
pub use range::ByteRange;
pub use resource::{NodeId, ResourceId, ResourceKind};
