//! Recovery of an expelled node by a survivor that mounts the file system (issue 14,
//! docs/cluster.md "Recovery of a failed node").
//!
//! Once the cluster manager has committed the expel of a node (its lease ran out and
//! it did not answer pings, so it writes nothing more: `crate::lease`), its recovery
//! log must be replayed and its tokens released before the others may trust what
//! those tokens covered. Replaying needs a mounted core of the file system, so:
//!
//! 1. **The cluster manager itself**, if it mounts the file system
//!    (`Daemon::recover_here`).
//! 2. Else **a surviving node that mounts it**: the manager asks every node that is
//!    not expelled in turn, over [`mako_rt::ServiceId::Recovery`]
//!    ([`RecoveryRequest::Recover`]); the first that mounts it replays the log and
//!    answers [`RecoveryReply::Recovered`], a node that does not answers
//!    [`RecoveryReply::NotMounted`].
//! 3. Else **at the next mount** of the file system, by whichever node mounts it:
//!    before the mount is served, every node the replicated configuration lists as
//!    expelled (and not rejoined) is recovered (`Daemon::recover_at_mount`). Replaying
//!    a log that was replayed already replays nothing (it was marked clean), so this is
//!    safe to repeat.
//!
//! While 1 and 2 run, the manager answers the expelled node's renewals
//! `LeaseReply::Recovering`, so it does not rejoin and replay its own log at the same
//! time. Which node mounts what is not replicated: the order of asking (the manager,
//! then the others by node number) makes the choice deterministic.
//!
//! Two recoveries of one node (the manager's and a mount's; a survivor the manager
//! took for dead that was only slow; a new manager's, which starts the recovery of
//! every node still expelled again when it is elected, as its predecessor may have
//! died during one) take turns on the claim on the node's log, its `RecoveryLog`
//! token (`mako_fs::recovery::recover_failed_node`): the second replays nothing. A
//! survivor that dies during a recovery leaves its claim held until it is recovered
//! itself; the manager's call to it fails and the next survivor, asked, waits for it.
//!
//! Not covered: a node expelled while no node mounts the file system may rejoin and
//! mount at the moment another node mounts and replays its log (3): its own replay at
//! mount does not take the claim.

use mako_rt::{NodeId, Service};
use serde::{Deserialize, Serialize};
use std::sync::Weak;

/// The manager's request to a survivor.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum RecoveryRequest {
    /// Replay expelled node `node`'s log on file system `fs` and release its tokens,
    /// if this node mounts `fs`.
    Recover { fs: String, node: u32, epoch: u64 },
}

/// The survivor's answer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum RecoveryReply {
    /// Recovered here, in `millis` ms (`summary`: what the replay did).
    Recovered { millis: u64, summary: String },
    /// This node does not mount the file system: ask another.
    NotMounted,
    /// This node mounts it but the recovery failed.
    Failed(String),
}

/// The `Recovery` service of a node: recovers on the file systems it mounts.
pub struct RecoveryService(pub Weak<crate::daemon::Daemon>);

impl Service for RecoveryService {
    fn handle(&self, from: NodeId, request: &[u8]) -> Vec<u8> {
        let reply = match mako_rt::transport::decode::<RecoveryRequest>("recovery request", request)
        {
            Ok(RecoveryRequest::Recover { fs, node, epoch }) => match self.0.upgrade() {
                Some(d) => {
                    tracing::info!(
                        "{fs}: {from} asks this node to recover node {node} (lease epoch {epoch})"
                    );
                    d.recover_here(&fs, NodeId(node), epoch)
                }
                None => RecoveryReply::NotMounted,
            },
            Err(e) => RecoveryReply::Failed(e.to_string()),
        };
        mako_rt::transport::encode("recovery reply", &reply).unwrap_or_default()
    }
}
