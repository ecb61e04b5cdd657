//! Errors of the token layer: each says what failed, on which resource or node, and
//! what the caller should do next.

use thiserror::Error;

use crate::manager::Holder;
use crate::mode::TokenMode;
use crate::range::ByteRange;
use crate::resource::{NodeId, ResourceId};

/// Everything that can go wrong when acquiring, giving up or revoking a token.
#[derive(Debug, Clone, PartialEq, Eq, Error, serde::Serialize, serde::Deserialize)]
pub enum TokenError {
    /// The request named an empty range (`start >= end`).
    #[error(
        "empty byte range {range} in a token request from {node} on {resource}: \
         ranges are half-open [start, end) and need start < end; fix the caller"
    )]
    EmptyRange {
        node: NodeId,
        resource: ResourceId,
        range: ByteRange,
    },

    /// The required range is not inside the desired range.
    #[error(
        "token request from {node} on {resource}: required range {required} is not inside \
         desired range {desired}; widen desired so that it contains required"
    )]
    RequiredOutsideDesired {
        node: NodeId,
        resource: ResourceId,
        required: ByteRange,
        desired: ByteRange,
    },

    /// A partial range was named for a resource that is only ever held whole.
    #[error(
        "token request from {node} on {resource} names range {range}, but {resource} is not \
         a ranged resource; use ByteRange::WHOLE for inodes, allocation regions and inode-map segments"
    )]
    WholeRangeRequired {
        node: NodeId,
        resource: ResourceId,
        range: ByteRange,
    },

    /// Other nodes hold tokens over the required range in incompatible modes. The
    /// requester must revoke them (ask each holder to give up the conflicting part) and
    /// retry; `TokenClient` does this itself.
    #[error(
        "{mode} token on {resource} conflicts with {} holder(s) ({}); revoke them and retry",
        copyset.len(),
        holders_text(copyset)
    )]
    Conflict {
        resource: ResourceId,
        mode: TokenMode,
        /// The range the manager needed free (the request's, or its fallback's).
        required: ByteRange,
        copyset: Vec<Holder>,
        /// The resource's metanode when it is in the copyset: revoked after the others,
        /// since their revokes report to it (docs/coherence.md section 4).
        metanode: Option<NodeId>,
    },

    /// An older request of another node for a conflicting mode waits on the resource:
    /// it is served first (fairness). The requester waits and asks again; it does not
    /// revoke (the older request's requester does). `TokenClient` does this itself.
    #[error(
        "{mode} token on {resource} {required} waits behind older requests of {}; \
         ask again once they are served",
        nodes_text(ahead)
    )]
    Queued {
        resource: ResourceId,
        mode: TokenMode,
        required: ByteRange,
        /// The nodes whose older conflicting requests are in the way.
        ahead: Vec<NodeId>,
        /// The holders in the way as well (for diagnostics).
        copyset: Vec<Holder>,
    },

    /// An acquire waited in the manager's queue for longer than any live cluster
    /// takes: the nodes ahead keep their requests alive but are never served.
    #[error(
        "{node} waited {waited_ms} ms for {mode} on {resource} {required} behind older \
         requests of {} without being served (TokenClientLimits::queue_wait_max_ms); \
         check that those nodes and the token manager are alive and answering",
        nodes_text(ahead)
    )]
    QueueTimeout {
        node: NodeId,
        resource: ResourceId,
        mode: TokenMode,
        required: ByteRange,
        waited_ms: u64,
        ahead: Vec<NodeId>,
    },

    /// Granting would take the table past `TokenManagerLimits::tokens_max`.
    #[error(
        "token table full: {tokens_max} tokens held (TokenManagerLimits::tokens_max) while \
         granting {resource} to {node}; raise tokens_max on the token manager or make nodes \
         cache fewer files so they relinquish tokens"
    )]
    TableFull {
        node: NodeId,
        resource: ResourceId,
        tokens_max: usize,
    },

    /// A downgrade asked for a mode the held token does not cover (for example `rw` to
    /// `ro`, which would add a promise, not drop one).
    #[error(
        "{node} cannot downgrade its {held} token on {resource} {range} to {to}: {held} does \
         not cover {to}; relinquish and acquire {to} instead"
    )]
    NotADowngrade {
        node: NodeId,
        resource: ResourceId,
        range: ByteRange,
        held: TokenMode,
        to: TokenMode,
    },

    /// A message to the manager or a holder could not be delivered or understood.
    #[error("token protocol message failed: {0}")]
    Transport(String),

    /// A holder's revoke handler failed (for example it could not flush dirty data).
    #[error("revoke of {resource} {range} on {node} failed: {source}; the holder still has its token, retry later or recover {node}")]
    RevokeFailed {
        node: NodeId,
        resource: ResourceId,
        range: ByteRange,
        #[source]
        source: Box<TokenError>,
    },

    /// A holder is fenced (its lease ran out, or it was expelled): it can no longer
    /// give up what it holds; its recovery by a survivor does (its log replayed, its
    /// tokens released). A requester waits for that, as for a holder that does not
    /// answer (`TokenClientLimits::holder_down_wait_ms`).
    #[error(
        "{node} is fenced and cannot give up its tokens until a survivor recovers it: {reason}"
    )]
    HolderFenced { node: NodeId, reason: String },

    /// A holder's cache could not be flushed while giving up a token.
    #[error("{node} could not flush cached data of {resource} {range}: {reason}; check the disks behind {resource}")]
    FlushFailed {
        node: NodeId,
        resource: ResourceId,
        range: ByteRange,
        reason: String,
    },

    /// Revoke rounds kept being overtaken by new holders. Requests are served oldest
    /// first, so this means holders came back ahead of the oldest request: a bug in
    /// the token protocol, not contention.
    #[error(
        "{node} gave up acquiring {mode} on {resource} {required} after {attempts} revoke \
         rounds (TokenClientLimits::acquire_attempts_max); last conflicting holders: {}; \
         they kept holding it although this request was the oldest in the way: a token \
         protocol bug, please report it",
        holders_text(last_copyset)
    )]
    AttemptsExhausted {
        node: NodeId,
        resource: ResourceId,
        mode: TokenMode,
        required: ByteRange,
        attempts: u32,
        last_copyset: Vec<Holder>,
    },
    /// The manager shard of the resource was just restarted on a new node and is
    /// rebuilding its table from the nodes' held tokens (docs/coherence.md section
    /// 7b): nothing is granted until every live node answered and every failed node
    /// was recovered. The requester asks again after a pause.
    #[error(
        "the token manager shard of {resource} is rebuilding its table: waiting for {} \
         to report the tokens they hold, and for the recovery of {}; ask again shortly",
        nodes_text(reporting),
        nodes_text(recovering)
    )]
    Rebuilding {
        resource: ResourceId,
        reporting: Vec<NodeId>,
        recovering: Vec<NodeId>,
    },
}

fn nodes_text(nodes: &[NodeId]) -> String {
    let parts: Vec<String> = nodes.iter().map(|n| n.to_string()).collect();
    parts.join(", ")
}

fn holders_text(holders: &[Holder]) -> String {
    let parts: Vec<String> = holders.iter().map(|h| h.to_string()).collect();
    parts.join(", ")
}
