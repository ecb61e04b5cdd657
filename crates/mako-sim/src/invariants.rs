//! The cluster's invariants, checked between steps (when no operation is in flight):
//!
//! 1. Tokens: the manager never records two conflicting holders of one range, and no
//!    node believes it holds more than the manager records for it.
//! 2. Every pagepool data buffer lies under a data token of its node, `xw` when
//!    dirty (the contract: the token covers the data in the pagepool).
//! 3. Every cached inode and stat-cache entry (other than the metadata files, which
//!    are not token-covered today) lies under an inode token of its node.
//! 4. No disk space is allocated to two owners: the block pointers that the nodes'
//!    token-covered caches hold (inode pointers and cached indirect blocks) never name
//!    overlapping subblocks for two different (inode, level, index). Two nodes
//!    allocating one block to two files is caught here while both files are cached;
//!    fsck at the end checks the whole file system against the allocation maps.

use crate::cluster::SimCluster;
use mako_format::inode::{InodeContent, FLAG_SYSTEM};
use mako_fs::core::{Core, INODE_CACHE_KEY};
use mako_token::{compatible, covers, ByteRange, TokenMode};
use std::collections::BTreeMap;

/// Which invariants to check. All by default; `MAKO_SIM_SKIP_CHECKS` (a comma list of
/// `tokens`, `buffers`, `cached`, `blocks`) turns some off, to see what fails beyond a
/// violation that is already known.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Checks {
    pub tokens: bool,
    pub buffers: bool,
    pub cached: bool,
    pub blocks: bool,
}

impl Default for Checks {
    fn default() -> Self {
        Checks {
            tokens: true,
            buffers: true,
            cached: true,
            blocks: true,
        }
    }
}

impl Checks {
    pub fn from_env() -> Checks {
        let mut c = Checks::default();
        if let Ok(v) = std::env::var("MAKO_SIM_SKIP_CHECKS") {
            for name in v.split(',').map(str::trim).filter(|n| !n.is_empty()) {
                match name {
                    "tokens" => c.tokens = false,
                    "buffers" => c.buffers = false,
                    "cached" => c.cached = false,
                    "blocks" => c.blocks = false,
                    other => panic!(
                        "MAKO_SIM_SKIP_CHECKS: unknown check {other:?} (tokens, buffers, cached, blocks)"
                    ),
                }
            }
        }
        c
    }
}

/// Every violation found right now (empty: all invariants hold).
pub fn check(cluster: &SimCluster, checks: Checks) -> Vec<String> {
    let mut out = Vec::new();
    let cores = cluster.cores();
    if checks.tokens {
        tokens(cluster, &cores, &mut out);
    }
    for (node, core) in &cores {
        if checks.buffers {
            buffers(*node, core, &mut out);
        }
        if checks.cached {
            cached_inodes(*node, core, &mut out);
        }
    }
    if checks.blocks {
        blocks(&cores, &mut out);
    }
    out
}

fn tokens(cluster: &SimCluster, cores: &[(u32, std::sync::Arc<Core>)], out: &mut Vec<String>) {
    let table = cluster.manager.dump();
    for (r, holders) in &table {
        for (i, a) in holders.iter().enumerate() {
            for b in &holders[i + 1..] {
                if a.node != b.node && a.range.overlaps(&b.range) && !compatible(a.mode, b.mode) {
                    out.push(format!("token manager: {r} is held as {a} and as {b}"));
                }
            }
        }
    }
    let table: BTreeMap<_, _> = table.into_iter().collect();
    for (node, core) in cores {
        let me = mako_rt::NodeId(*node);
        for (r, pieces) in core.tokens.client().held_all() {
            let recorded: Vec<_> = table
                .get(&r)
                .map(|h| h.iter().filter(|h| h.node == me).copied().collect())
                .unwrap_or_default();
            for (range, mode) in pieces {
                let mut cover: Vec<ByteRange> = recorded
                    .iter()
                    .filter(|h| covers(h.mode, mode))
                    .map(|h| h.range)
                    .collect();
                cover.sort();
                let mut cursor = range.start;
                for p in cover {
                    if p.start <= cursor && p.end > cursor {
                        cursor = p.end;
                    }
                }
                if cursor < range.end {
                    out.push(format!(
                        "node {node} believes it holds {mode} {range} on {r}, the manager records {}",
                        if recorded.is_empty() {
                            "nothing for it".to_string()
                        } else {
                            recorded.iter().map(|h| h.to_string()).collect::<Vec<_>>().join(", ")
                        }
                    ));
                }
            }
        }
    }
}

fn buffers(node: u32, core: &Core, out: &mut Vec<String>) {
    let bb = core.block_bytes();
    let dirty: std::collections::BTreeSet<(u64, u64)> =
        core.pool.dirty_keys(usize::MAX).into_iter().collect();
    for (ino, b) in core.pool.keys() {
        if ino == INODE_CACHE_KEY {
            continue;
        }
        let range = ByteRange::new(b * bb, (b + 1) * bb);
        let held = core.tokens.client().held_mode(core.tokens.data(ino), range);
        let is_dirty = dirty.contains(&(ino, b));
        let ok = if is_dirty {
            held == Some(TokenMode::Xw)
        } else {
            held.is_some()
        };
        if !ok {
            out.push(format!(
                "node {node}: block {b} of inode {ino} is {} in the pagepool but the node holds {} over {range}",
                if is_dirty { "dirty" } else { "cached" },
                held.map(|m| m.to_string()).unwrap_or_else(|| "no data token".into())
            ));
        }
    }
}

fn cached_inodes(node: u32, core: &Core, out: &mut Vec<String>) {
    let handles: Vec<_> = core.inodes.lock().values().cloned().collect();
    let mut inos: Vec<u64> = handles
        .iter()
        .filter(|h| {
            let st = h.state.read();
            st.inode.flags & FLAG_SYSTEM == 0 && !st.deleted
        })
        .map(|h| h.ino)
        .collect();
    inos.sort_unstable();
    let stat: Vec<u64> = core.stat_cache.lock().inos();
    for (ino, what) in inos
        .into_iter()
        .map(|i| (i, "cached"))
        .chain(stat.into_iter().map(|i| (i, "in the stat cache")))
    {
        if !core
            .tokens
            .client()
            .holds_any(core.tokens.inode(ino), ByteRange::WHOLE)
        {
            out.push(format!(
                "node {node}: inode {ino} is {what} without an inode token"
            ));
        }
    }
}

/// An allocated extent's owner: (inode, level, index); level 0 is a data or directory
/// block (a unit), higher levels are indirect blocks.
type Owner = (u64, u8, u64);

fn blocks(cores: &[(u32, std::sync::Arc<Core>)], out: &mut Vec<String>) {
    // (disk, first subblock) -> (subblocks, owner, node)
    let mut extents: Vec<((u32, u64), u64, Owner, u32)> = Vec::new();
    for (node, core) in cores {
        let sb_bytes = core.geo.subblock_bytes() as u64;
        let ind_sb = core.geo.indirect_subblocks() as u64;
        let ppi = core.geo.pointers_per_indirect();
        let handles: Vec<_> = core.inodes.lock().values().cloned().collect();
        for h in handles {
            let st = h.state.read();
            if st.deleted {
                continue;
            }
            let system = st.inode.flags & FLAG_SYSTEM != 0;
            if !system
                && !core
                    .tokens
                    .client()
                    .holds_any(core.tokens.inode(h.ino), ByteRange::WHOLE)
            {
                continue;
            }
            let InodeContent::Pointers(ptrs) = &st.inode.content else {
                continue;
            };
            let mut add = |da: mako_format::DiskAddress, n: u64, owner: Owner| {
                if !da.is_null() {
                    let first = da.sector() * 512 / sb_bytes;
                    extents.push(((da.disk(), first), n, owner, *node));
                }
            };
            let depth = st.inode.depth;
            for (i, da) in ptrs.iter().enumerate() {
                if depth == 0 {
                    let n = mako_fs::block_map::allocated_subblocks(core, &st, i as u64) as u64;
                    add(*da, n, (h.ino, 0, i as u64));
                } else {
                    add(*da, ind_sb, (h.ino, depth, i as u64));
                }
            }
            for ((level, index), ind) in st.indirect.lock().iter() {
                for (k, da) in ind.block.pointers.iter().enumerate() {
                    let child = index * ppi + k as u64;
                    if *level > 1 {
                        add(*da, ind_sb, (h.ino, level - 1, child));
                    } else {
                        let n = mako_fs::block_map::allocated_subblocks(core, &st, child) as u64;
                        add(*da, n, (h.ino, 0, child));
                    }
                }
            }
        }
    }
    extents.sort();
    // An extent overlaps the next ones that start before it ends.
    let mut reported = 0;
    for (i, (start, n, owner, node)) in extents.iter().enumerate() {
        for (s2, _, o2, n2) in &extents[i + 1..] {
            if s2.0 != start.0 || s2.1 >= start.1 + n {
                break;
            }
            if o2 != owner && reported < 5 {
                reported += 1;
                out.push(format!(
                    "disk {} subblocks {}..{} belong to inode {} ({}) on node {node} and overlap inode {} ({}) at subblock {} on node {n2}",
                    start.0,
                    start.1,
                    start.1 + n,
                    owner.0,
                    describe(owner),
                    o2.0,
                    describe(o2),
                    s2.1
                ));
            }
        }
    }
}

fn describe(o: &Owner) -> String {
    if o.1 == 0 {
        format!("block {}", o.2)
    } else {
        format!("indirect block level {} index {}", o.1, o.2)
    }
}
