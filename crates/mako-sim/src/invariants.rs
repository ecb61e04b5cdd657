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
use mako_token::{compatible, covers, ByteRange, Holder, TokenMode};
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
    let table = cluster.manager().dump();
    for (r, holders) in &table {
        out.extend(
            conflicting(holders)
                .into_iter()
                .map(|(a, b)| format!("token manager: {r} is held as {a} and as {b}")),
        );
    }
    let table: BTreeMap<_, _> = table.into_iter().collect();
    for (node, core) in cores {
        let me = mako_rt::NodeId(*node);
        for (r, pieces) in core.tokens.client().held_all() {
            let recorded: Vec<Holder> = table
                .get(&r)
                .map(|h| h.iter().filter(|h| h.node == me).copied().collect())
                .unwrap_or_default();
            for (range, mode) in pieces {
                if !recorded_covers(&recorded, range, mode) {
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

/// Pairs of holders of one resource on different nodes whose ranges overlap in
/// conflicting modes.
fn conflicting(holders: &[Holder]) -> Vec<(Holder, Holder)> {
    let mut out = Vec::new();
    for (i, a) in holders.iter().enumerate() {
        for b in &holders[i + 1..] {
            if a.node != b.node && a.range.overlaps(&b.range) && !compatible(a.mode, b.mode) {
                out.push((*a, *b));
            }
        }
    }
    out
}

/// Do the manager's records of one node cover `mode` over all of `range`?
fn recorded_covers(recorded: &[Holder], range: ByteRange, mode: TokenMode) -> bool {
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
    cursor >= range.end
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
            // A stale handle holds nothing to trust: its inode is read again (under a
            // token) at its next use. A revoke keeps one while a thread still has it.
            st.inode.flags & FLAG_SYSTEM == 0 && !st.deleted && !st.stale
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

/// What owns an allocated extent: a file (its inode number, and its generation and
/// creation time, so that two files given one inode number by two nodes stay apart),
/// and the place in its block tree: level 0 is a data or directory block (a unit),
/// higher levels are indirect blocks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Owner {
    ino: u64,
    generation: u32,
    crtime_ns: i128,
    level: u8,
    index: u64,
}

impl std::fmt::Display for Owner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "inode {} (generation {}) ", self.ino, self.generation)?;
        if self.level == 0 {
            write!(f, "block {}", self.index)
        } else {
            write!(
                f,
                "indirect block level {} index {}",
                self.level, self.index
            )
        }
    }
}

/// Subblocks `[first, first + len)` of a disk, owned by `owner` in `node`'s caches.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Extent {
    disk: u32,
    first: u64,
    len: u64,
    owner: Owner,
    node: u32,
}

fn blocks(cores: &[(u32, std::sync::Arc<Core>)], out: &mut Vec<String>) {
    let mut extents: Vec<Extent> = Vec::new();
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
            let file = Owner {
                ino: h.ino,
                generation: st.inode.generation,
                crtime_ns: crate::model::nanos(st.inode.crtime),
                level: 0,
                index: 0,
            };
            let mut add = |da: mako_format::DiskAddress, len: u64, level: u8, index: u64| {
                if !da.is_null() {
                    extents.push(Extent {
                        disk: da.disk(),
                        first: da.sector() * 512 / sb_bytes,
                        len,
                        owner: Owner {
                            level,
                            index,
                            ..file
                        },
                        node: *node,
                    });
                }
            };
            if let Some(shared) = &st.shared {
                // A shared writer's copy of the inode is the metanode's as it was when
                // this node joined: its pointers go stale as others move blocks. What it
                // uses are the addresses it keeps under its data tokens.
                let bb = core.block_bytes();
                let data = core.tokens.data(h.ino);
                for (&unit, &(da, sb)) in &shared.blocks {
                    let range = ByteRange {
                        start: unit.saturating_mul(bb),
                        end: unit.saturating_add(1).saturating_mul(bb),
                    };
                    if core.tokens.client().holds_any(data, range) {
                        add(da, sb as u64, 0, unit);
                    }
                }
                continue;
            }
            let InodeContent::Pointers(ptrs) = &st.inode.content else {
                continue;
            };
            let depth = st.inode.depth;
            for (i, da) in ptrs.iter().enumerate() {
                if depth == 0 {
                    let n = mako_fs::block_map::allocated_subblocks(core, &st, i as u64) as u64;
                    add(*da, n, 0, i as u64);
                } else {
                    add(*da, ind_sb, depth, i as u64);
                }
            }
            for ((level, index), ind) in st.indirect.lock().iter() {
                for (k, da) in ind.block.pointers.iter().enumerate() {
                    let child = index * ppi + k as u64;
                    if *level > 1 {
                        add(*da, ind_sb, level - 1, child);
                    } else {
                        let n = mako_fs::block_map::allocated_subblocks(core, &st, child) as u64;
                        add(*da, n, 0, child);
                    }
                }
            }
        }
    }
    out.extend(overlaps(extents));
}

/// Extents of different owners that share subblocks (at most five reported).
fn overlaps(mut extents: Vec<Extent>) -> Vec<String> {
    extents.sort();
    let mut out = Vec::new();
    for (i, a) in extents.iter().enumerate() {
        // Sorted by start: only the next extents that start before `a` ends overlap it.
        for b in &extents[i + 1..] {
            if b.disk != a.disk || b.first >= a.first + a.len {
                break;
            }
            if b.owner != a.owner && out.len() < 5 {
                out.push(format!(
                    "disk {} subblocks {}..{} belong to {} on node {} and overlap {} on node {} (subblocks {}..{})",
                    a.disk,
                    a.first,
                    a.first + a.len,
                    a.owner,
                    a.node,
                    b.owner,
                    b.node,
                    b.first,
                    b.first + b.len
                ));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ext(disk: u32, first: u64, len: u64, ino: u64, index: u64, node: u32) -> Extent {
        Extent {
            disk,
            first,
            len,
            owner: Owner {
                ino,
                generation: 1,
                crtime_ns: 5,
                level: 0,
                index,
            },
            node,
        }
    }

    #[test]
    fn token_tables_are_checked_both_ways() {
        use mako_rt::NodeId;
        let h = |node: u32, mode: TokenMode, start: u64, end: u64| Holder {
            node: NodeId(node),
            mode,
            range: ByteRange::new(start, end),
        };
        // Readers share, writers on disjoint ranges share, xw meets ro: conflict.
        assert!(conflicting(&[h(0, TokenMode::Ro, 0, 10), h(1, TokenMode::Ro, 0, 10)]).is_empty());
        assert!(conflicting(&[h(0, TokenMode::Xw, 0, 10), h(1, TokenMode::Xw, 10, 20)]).is_empty());
        assert_eq!(
            conflicting(&[h(0, TokenMode::Xw, 0, 10), h(1, TokenMode::Ro, 5, 6)]).len(),
            1
        );
        // A node's belief must be covered by the manager's records, in pieces or not.
        let rec = [h(0, TokenMode::Xw, 0, 10), h(0, TokenMode::Ro, 10, 20)];
        assert!(recorded_covers(&rec, ByteRange::new(0, 20), TokenMode::Ro));
        assert!(recorded_covers(&rec, ByteRange::new(2, 8), TokenMode::Xw));
        assert!(!recorded_covers(&rec, ByteRange::new(5, 15), TokenMode::Xw));
        assert!(!recorded_covers(&rec, ByteRange::new(0, 30), TokenMode::Ro));
        assert!(!recorded_covers(&[], ByteRange::new(0, 1), TokenMode::Ro));
    }

    #[test]
    fn overlapping_extents_of_two_owners_are_found() {
        // One block cached by two nodes for the same file: fine.
        assert!(overlaps(vec![ext(0, 32, 32, 16, 0, 0), ext(0, 32, 32, 16, 0, 1)]).is_empty());
        // Adjacent extents, other disks: fine.
        assert!(overlaps(vec![
            ext(0, 32, 32, 16, 0, 0),
            ext(0, 64, 32, 17, 0, 1),
            ext(1, 32, 32, 18, 0, 1),
        ])
        .is_empty());
        // Fragments inside a block.
        let v = overlaps(vec![
            ext(0, 32, 32, 16, 0, 0),
            ext(0, 40, 2, 17, 3, 1),
            ext(0, 34, 1, 16, 9, 0),
        ]);
        // Both: block 9 of inode 16 lies in its own block 0 (one file, two places)
        // and inode 17's fragment does too.
        assert_eq!(v.len(), 2, "{v:?}");
        assert!(v.iter().any(|m| m.contains("block 9")), "{v:?}");
        assert!(v.iter().any(|m| m.contains("inode 17")), "{v:?}");
        // Two files that two nodes gave one inode number apart: different creation
        // times, so two owners.
        let mut a = ext(0, 32, 32, 16, 0, 0);
        let b = ext(0, 32, 32, 16, 0, 1);
        a.owner.crtime_ns = 6;
        assert_eq!(overlaps(vec![a, b]).len(), 1);
    }
}
