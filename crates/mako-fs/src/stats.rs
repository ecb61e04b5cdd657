//! Per-file-system counters (`mako diag stats`, Prometheus).

use std::sync::atomic::{AtomicU64, Ordering};

#[derive(Default)]
pub struct FsStats {
    pub creates: AtomicU64,
    pub removes: AtomicU64,
    pub lookups: AtomicU64,
    pub reads: AtomicU64,
    pub writes: AtomicU64,
    pub bytes_read: AtomicU64,
    pub bytes_written: AtomicU64,
    pub blocks_flushed: AtomicU64,
    pub fsyncs: AtomicU64,
    pub inode_hits: AtomicU64,
    pub inode_misses: AtomicU64,
    pub stat_cache_hits: AtomicU64,
    /// Inodes read again alone into a cached inode-file chunk (granted since it was read).
    pub inode_slot_rereads: AtomicU64,
    /// Slots read to learn a new inode's last generation (`Core::generation_for`).
    pub generation_slot_reads: AtomicU64,
    pub dir_splits: AtomicU64,
    /// Inode-file blocks made ahead for other nodes' first segments (`Core::inode_file_growth`).
    pub inode_file_blocks_ahead: AtomicU64,
    /// Entries moved back into a freed cookie to keep a probe chain whole.
    pub dir_entries_moved: AtomicU64,
    /// Shared with the damage sink (`error::DamageSink`), which counts integrity
    /// failures where no `Core` is at hand.
    pub corruptions: std::sync::Arc<AtomicU64>,
    pub background_errors: AtomicU64,
    pub direct_reads: AtomicU64,
    pub direct_writes: AtomicU64,
    /// Operations restarted because a token they needed was not held (or was revoked
    /// before they could hold it).
    pub op_restarts: AtomicU64,
    /// Revokes this node answered, by what they covered.
    pub revokes_inode: AtomicU64,
    pub revokes_data: AtomicU64,
    pub revokes_dir: AtomicU64,
    /// Requests this node served as metanode, and sent to other metanodes.
    pub metanode_served: AtomicU64,
    pub metanode_sent: AtomicU64,
    /// Takeovers by a node the manager named metanode (with its grant) when another
    /// node asked it before any operation of its own used the inode.
    pub metanode_named: AtomicU64,
    /// Allocation regions this node took beyond its share at mount (its space ran out).
    pub regions_acquired: AtomicU64,
    /// Of those, regions taken from another node with a revoke (every region was owned).
    pub regions_stolen: AtomicU64,
    /// Frees in other nodes' space this node sent to them, and served for them.
    pub foreign_frees_sent: AtomicU64,
    pub foreign_frees_served: AtomicU64,
    /// Batches of frees given up: a copy may have been applied by a receiver that
    /// can no longer tell (`writer_seq`); their space leaks until fsck reclaims it.
    pub foreign_frees_abandoned: AtomicU64,
    /// Copies of resent requests (updates, frees) answered without applying them.
    pub copies_answered: AtomicU64,
}

impl FsStats {
    /// Every counter by name, for diagnostics.
    pub fn snapshot(&self) -> Vec<(String, u64)> {
        let f = |n: &str, v: &AtomicU64| (n.to_string(), v.load(Ordering::Relaxed));
        vec![
            f("creates", &self.creates),
            f("removes", &self.removes),
            f("lookups", &self.lookups),
            f("reads", &self.reads),
            f("writes", &self.writes),
            f("bytes_read", &self.bytes_read),
            f("bytes_written", &self.bytes_written),
            f("blocks_flushed", &self.blocks_flushed),
            f("fsyncs", &self.fsyncs),
            f("inode_cache_hits", &self.inode_hits),
            f("inode_cache_misses", &self.inode_misses),
            f("stat_cache_hits", &self.stat_cache_hits),
            f("inode_slot_rereads", &self.inode_slot_rereads),
            f("generation_slot_reads", &self.generation_slot_reads),
            f("dir_splits", &self.dir_splits),
            f("inode_file_blocks_ahead", &self.inode_file_blocks_ahead),
            f("dir_entries_moved", &self.dir_entries_moved),
            f("corruptions_detected", &self.corruptions),
            f("background_errors", &self.background_errors),
            f("direct_reads", &self.direct_reads),
            f("direct_writes", &self.direct_writes),
            f("op_restarts", &self.op_restarts),
            f("revokes_inode", &self.revokes_inode),
            f("revokes_data", &self.revokes_data),
            f("revokes_dir", &self.revokes_dir),
            f("metanode_served", &self.metanode_served),
            f("metanode_sent", &self.metanode_sent),
            f("metanode_named", &self.metanode_named),
            f("regions_acquired", &self.regions_acquired),
            f("regions_stolen", &self.regions_stolen),
            f("foreign_frees_sent", &self.foreign_frees_sent),
            f("foreign_frees_served", &self.foreign_frees_served),
            f("foreign_frees_abandoned", &self.foreign_frees_abandoned),
            f("copies_answered", &self.copies_answered),
        ]
    }
}
