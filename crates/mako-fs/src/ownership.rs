//! Ownership of space (docs/coherence.md section 6): a node allocates blocks only in
//! allocation regions whose token it holds, and inode numbers only in inode-map
//! segments whose token it holds; it frees in them directly. Everything else about a
//! region or segment (its map as last read) is a stale copy this node never writes.
//!
//! - **Taking.** Tokens of regions and segments are taken with `no_revoke`: a node gets
//!   one nobody holds, never another node's. At mount a node of a cluster takes its
//!   share of regions (`r % nodes == node`, the file system's `log_count` being the most
//!   nodes it was made for; mkfs makes at least one region per node) and inode-map
//!   segment `node`, and gives up the in-memory claim on the rest; when its space or its
//!   inode numbers run out it takes one more, reading its map from disk (the last owner
//!   wrote it in place when its token left). A file system with one log is mounted by
//!   one node: it owns everything and takes no token at all.
//! - **Stealing.** When every region is owned and this node's are full, an operation's
//!   ENOSPC is not final: the node takes, with a revoke, the region of another node
//!   with the most free space as last known here (`acquire_or_steal_region`), and
//!   runs the operation again. The counts it ranks by are stale hints (read at mount,
//!   or kept when a token left here); the region's map read from disk after the
//!   revoke decides. Only regions with at least 1/16 of their space free (as known)
//!   are stolen, most free first: two full nodes do not pass a nearly full region back
//!   and forth. ENOSPC stands when no region qualifies, and is logged with the space
//!   the file system has free.
//! - **Freeing elsewhere.** A block or inode number freed in a region or segment of
//!   another node (a file another node created) is queued with its transaction. Once
//!   that transaction is checkpointed (this node's log can never write the freed
//!   structure again) the frees go to the owner (`FsRequest::Free`), which frees them in
//!   its map in a transaction of its own; a region nobody owns is taken and freed in
//!   here. A crash before delivery leaks the space until fsck reclaims it, never
//!   double-allocates it.
//! - **Leaving.** When a region's or segment's token is revoked (another node steals
//!   it, a failed node's recovery later), this node stops allocating there first, then
//!   commits (waiting for the operations in flight) and writes the map in place, then
//!   forgets it (`revoke_region`).

use crate::core::Core;
use crate::error::{FsError, FsResult};
use crate::journal::{OWNER_ALLOC_MAP, OWNER_INODE_MAP};
use crate::writer_seq::FreeBatch;
use mako_disk::BufferType;
use mako_format::alloc_segment::AllocSegment;
use mako_format::error::Location;
use mako_format::inode_map_segment::InodeMapSegment;
use mako_format::DiskAddress;
use mako_token::{AcquireOptions, ByteRange, ResourceId, TokenError, TokenMode};
use std::collections::BTreeMap;
use std::sync::Arc;

/// Nodes the file system shares its space among: one per recovery log.
fn nodes(core: &Core) -> u32 {
    core.desc.lock().metadata_inodes.log_count.max(1)
}

/// True when this node shares the space with others (tokens decide who owns what).
pub fn shared(core: &Core) -> bool {
    nodes(core) > 1
}

/// Take `resource` if nobody holds it: Ok(false) when another node does.
fn take(core: &Core, resource: ResourceId) -> FsResult<bool> {
    match core.tokens.client().acquire_with_options(
        resource,
        TokenMode::Xw,
        ByteRange::WHOLE,
        ByteRange::WHOLE,
        AcquireOptions {
            no_revoke: true,
            ..Default::default()
        },
    ) {
        Ok(()) => Ok(true),
        Err(TokenError::Conflict { .. }) => Ok(false),
        Err(e) => Err(crate::coherence::token_error(e)),
    }
}

fn read_region(core: &Core, region: usize) -> FsResult<AllocSegment> {
    let desc = core.desc.lock().clone();
    let slot = crate::alloc_map::segment_slot_bytes(&desc);
    let mut b = vec![0u8; slot];
    let da = core.metafile_read(
        desc.metadata_inodes.block_alloc_map,
        region as u64 * slot as u64,
        &mut b,
        BufferType::AllocMap,
    )?;
    Ok(AllocSegment::decode(&b, region as u32, Location::Disk(da))?)
}

fn read_segment(core: &Core, segment: usize) -> FsResult<InodeMapSegment> {
    let desc = core.desc.lock().clone();
    let imap_ino = desc.metadata_inodes.inode_alloc_map;
    let per = desc.inodes_per_segment;
    let slot = InodeMapSegment::slot_bytes(per);
    let s = segment as u64;
    let block = core.imap.block_of(s) as usize;
    let known = |core: &Core| {
        core.metafile_blocks
            .read()
            .get(&imap_ino)
            .is_some_and(|b| b.get(block).is_some())
    };
    if !known(core) {
        // A hole as far as this node knows: another node may have made the block since
        // (`Core::ensure_imap_block`, under the map file's token, written in place).
        // Under the map file's token, asked for here when no operation is around
        // (`Core::reserve_inode` runs before its operation's; the token's absence was
        // an error: scale seed 1 at 256 nodes, node 0's fifth segment); inside one, a
        // missing token restarts it as usual.
        crate::op::run(core, || {
            crate::op::hold_inode(core, imap_ino, crate::coherence::Need::Cache)?;
            core.refresh_metafile(imap_ino)
        })?;
        if !known(core) {
            // Still a hole: the segment was never used, all free.
            return Ok(core.imap.blank(s));
        }
    }
    let mut b = vec![0u8; slot];
    let da = core.metafile_read(
        imap_ino,
        core.imap.slot_offset(s),
        &mut b,
        BufferType::InodeMap,
    )?;
    Ok(InodeMapSegment::decode(
        &b,
        segment as u32,
        per,
        Location::Disk(da),
    )?)
}

/// At mount, before any operation: a node of a cluster takes its share of regions and
/// segments and stops allocating in the rest.
pub fn claim_at_mount(core: &Core) -> FsResult<()> {
    if !shared(core) {
        return Ok(());
    }
    let (n, me) = (nodes(core), core.node);
    for r in 0..core.alloc.region_count() {
        let mine = r as u32 % n == me && take(core, core.tokens.region(r as u32))?;
        if !mine {
            core.alloc.disown(r);
        }
    }
    // One inode-map segment each, numbered like the nodes: the inode file grows densely
    // up to the highest number in use, so the nodes' first numbers must be the lowest
    // ones (spread over the whole map, node k of n would make the inode file k/n of its
    // largest size with its first create). More are taken when these run out.
    // Only this node's own segment is looked at: the map has as many segments as the
    // inode limit asks (2^32 for 2^40 inodes), nearly all never used.
    core.imap.disown_all();
    let s = me as usize;
    if s < core.imap.segments() && take(core, core.tokens.segment(me))? {
        core.imap.own(s, read_segment(core, s)?);
    }
    Ok(())
}

/// Take `resource` (a region or a segment) if nobody holds it, and start using it with
/// its map as read from disk. False when another node holds it.
fn take_and_own(core: &Core, resource: ResourceId) -> FsResult<bool> {
    let index = resource.id as usize;
    let is_region = resource.kind == mako_token::ResourceKind::AllocRegion;
    let seen = is_region.then(|| core.alloc.revokes(index));
    if !take(core, resource)? {
        return Ok(false);
    }
    if is_region {
        // Revoked again before its map was read: another node's now.
        if !core
            .alloc
            .own_since(index, read_region(core, index)?, seen)?
        {
            return Ok(false);
        }
        core.stats
            .regions_acquired
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    } else {
        core.imap.own(index, read_segment(core, index)?);
    }
    Ok(true)
}

/// Take one more of `count` resources (regions or segments) that nobody owns, starting
/// at this node's share. False when every one is owned (by this node or others).
/// Blocks: call with no lock, no transaction handle and no hold open.
fn acquire_one(
    core: &Core,
    count: usize,
    start: usize,
    owned: impl Fn(usize) -> bool,
    resource: impl Fn(u32) -> ResourceId,
) -> FsResult<bool> {
    if !shared(core) || count == 0 {
        return Ok(false);
    }
    for k in 0..count {
        let i = (start + k) % count;
        if !owned(i) && take_and_own(core, resource(i as u32))? {
            return Ok(true);
        }
    }
    Ok(false)
}

/// Take one more allocation region nobody owns (this node's space ran out).
pub fn acquire_region(core: &Core) -> FsResult<bool> {
    let count = core.alloc.region_count();
    acquire_one(
        core,
        count,
        // Regions are spread: this node's share lies around its own number.
        core.node as usize * count / nodes(core) as usize,
        |r| core.alloc.is_owned(r),
        |r| core.tokens.region(r),
    )
}

/// A region is stolen only when it had at least this share of its space free as this
/// node last knew it (docs/coherence.md section 6): a region the nodes would pass back
/// and forth for a few blocks each is left where it is.
const STEAL_MIN_FREE_DIVISOR: u64 = 16;

/// This node's space ran out: take one more region nobody owns, or else (every region
/// owned) take, with a revoke, another node's region with the most free space as last
/// known here. False when no region anywhere has space this node can take: the
/// caller's ENOSPC stands (and is logged with what the file system has free).
/// Blocks: call with no lock, no transaction handle and no hold open.
pub fn acquire_or_steal_region(core: &Core) -> FsResult<bool> {
    if acquire_region(core)? {
        return Ok(true);
    }
    if !shared(core) {
        return Ok(false);
    }
    steal_region(core)
}

/// Take another node's region (module doc, "Stealing"). Candidates are ranked by the
/// free space this node last knew of (read at mount, or kept when its token left
/// here): a hint only. The decision is made on the map read from disk after the
/// revoke, which the old owner wrote in place as committed.
fn steal_region(core: &Core) -> FsResult<bool> {
    let count = core.alloc.region_count();
    let mut candidates: Vec<(u64, u64, usize)> = (0..count)
        .filter(|&r| !core.alloc.is_owned(r))
        .map(|r| {
            let (free, total) = core.alloc.region_space(r);
            (free, total, r)
        })
        .filter(|&(free, total, _)| free > 0 && free >= total / STEAL_MIN_FREE_DIVISOR)
        .collect();
    // Most free first; the lowest region number among equals (deterministic).
    candidates.sort_by(|a, b| b.0.cmp(&a.0).then(a.2.cmp(&b.2)));
    for (hint, total, r) in candidates {
        let resource = core.tokens.region(r as u32);
        let seen = core.alloc.revokes(r);
        core.tokens
            .client()
            .acquire_with_options(
                resource,
                TokenMode::Xw,
                ByteRange::WHOLE,
                ByteRange::WHOLE,
                AcquireOptions::default(),
            )
            .map_err(crate::coherence::token_error)?;
        // Its old owner stopped allocating there, committed and wrote the map in place
        // before the token left it (`revoke_region`): the map on disk is the region.
        if !core.alloc.own_since(r, read_region(core, r)?, Some(seen))? {
            // Taken by another node again before this one read its map.
            continue;
        }
        core.stats
            .regions_acquired
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        core.stats
            .regions_stolen
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let (free, _) = core.alloc.region_space(r);
        tracing::info!(
            "node {}: took allocation region {r} from another node (its space ran out): \
             {free} of {total} subblocks free ({hint} as last known here)",
            core.node
        );
        if free >= total / STEAL_MIN_FREE_DIVISOR && free > 0 {
            return Ok(true);
        }
        // Fuller than known: kept (nobody need steal it back), and the next one tried.
    }
    let (unowned_free, _) = core.alloc.unowned_space();
    tracing::warn!(
        "node {}: no space left: {} subblocks free in its own regions, {} in other nodes' \
         (as last known here, none of them with 1/{STEAL_MIN_FREE_DIVISOR} of its region \
         free), {} subblocks in the file system",
        core.node,
        core.alloc.free_subblocks(),
        unowned_free,
        core.alloc.total_subblocks()
    );
    Ok(false)
}

/// Take one more inode-map segment nobody owns (this node's numbers ran out).
pub fn acquire_segment(core: &Core) -> FsResult<bool> {
    acquire_one(
        core,
        core.imap.segments(),
        // Past every node's first segment (taken at mount), lowest first: the inode
        // file stays as small as the numbers in use allow.
        nodes(core) as usize,
        |s| core.imap.is_owned(s),
        |s| core.tokens.segment(s),
    )
}

/// Hand out the next inode numbers from segment `segment` (taking it first on a node
/// of a cluster, if nobody holds it): numbers anywhere up to the inode limit through
/// the ordinary allocation path, for tests of numbers past 2^32 and for an
/// administrator who wants a node's numbers in a range of their own. False when
/// another node holds the segment.
pub fn allocate_from_segment(core: &Core, segment: u64) -> FsResult<bool> {
    if segment >= core.imap.segments() as u64 {
        return Err(FsError::Invalid(format!(
            "inode-map segment {segment}: the file system has {} segments",
            core.imap.segments()
        )));
    }
    if shared(core)
        && !core.imap.is_owned(segment as usize)
        && !take_and_own(core, core.tokens.segment(segment as u32))?
    {
        return Ok(false);
    }
    core.imap.start_at(segment);
    Ok(true)
}

/// Free what other nodes freed in this node's regions and segments (`FsRequest::Free`).
/// Anything no longer owned here goes back as this node's own foreign free.
pub fn apply_frees(core: &Core, extents: &[(u64, u32)], inos: &[u64]) -> FsResult<()> {
    core.check_writable()?;
    let _tx = core.begin();
    for &(raw, n) in extents {
        core.alloc.free(DiskAddress::from_raw(raw), n, 0)?;
    }
    for &ino in inos {
        core.imap.free(ino)?;
    }
    Ok(())
}

/// Send the checkpointed frees in other nodes' regions and segments to their owners
/// (or take an unowned one and free here). What cannot be delivered now stays queued,
/// as the same batch under the same key (`writer_seq`): a copy its receiver already
/// applied is answered without freeing anything twice.
/// Blocks: call with no lock, no transaction handle and no hold open.
pub fn deliver_frees(core: &Core) -> FsResult<()> {
    let extents = core.alloc.take_foreign_frees();
    let inos = core.imap.take_foreign_frees();
    // Per owner resource: what goes there, one batch each.
    let mut by_region: BTreeMap<usize, Vec<(DiskAddress, u32)>> = BTreeMap::new();
    for (da, n) in extents {
        match core.alloc.region_of(da) {
            Some(r) => by_region.entry(r).or_default().push((da, n)),
            None => tracing::warn!("foreign free of {n} subblocks at {da}: outside every region"),
        }
    }
    let mut by_segment: BTreeMap<usize, Vec<u64>> = BTreeMap::new();
    for ino in inos {
        by_segment
            .entry(core.imap.segment_of(ino))
            .or_default()
            .push(ino);
    }
    let mut fresh = Vec::new();
    for (r, list) in by_region {
        fresh.push(FreeBatch {
            resource: core.tokens.region(r as u32),
            extents: list,
            inos: Vec::new(),
            seq: core.writer.next_seq(),
            sent_to: None,
        });
    }
    for (s, list) in by_segment {
        fresh.push(FreeBatch {
            resource: core.tokens.segment(s as u32),
            extents: Vec::new(),
            inos: list,
            seq: core.writer.next_seq(),
            sent_to: None,
        });
    }
    // The batches left over from earlier deliveries first (a concurrent delivery has
    // taken its own out of the queue: each batch is sent by one thread at a time).
    let mut batches = std::mem::take(&mut *core.writer.frees.lock());
    batches.extend(fresh);
    let mut result = Ok(());
    let mut kept = Vec::new();
    for mut batch in batches {
        match deliver(core, &mut batch) {
            Ok(()) => core.writer.answered(batch.seq),
            Err(e) => {
                kept.push(batch);
                result = result.and(Err(e));
            }
        }
    }
    core.writer.frees.lock().extend(kept);
    result
}

/// Frees queued for other nodes and not answered yet (batches, extents and inode
/// numbers in them).
pub fn frees_queued(core: &Core) -> (usize, usize) {
    let q = core.writer.frees.lock();
    (
        q.len(),
        q.iter().map(|b| b.extents.len() + b.inos.len()).sum(),
    )
}

/// A batch a receiver other than `sent_to` would apply, while `sent_to` may have
/// applied it already and its answer was lost: the space it frees leaks (fsck
/// reclaims it) rather than risking a free applied twice (a block handed to two
/// files).
fn abandon(batch: &FreeBatch, now: &str) -> FsResult<()> {
    let (node, incarnation) = batch.sent_to.unwrap_or_default();
    tracing::warn!(
        "{}: {} extents and {} inode numbers freed in another node's space were sent to \
         node {node} (incarnation {incarnation:x}) without an answer, and {now} owns it: \
         not sent again (leaked until fsck reclaims them)",
        batch.resource,
        batch.extents.len(),
        batch.inos.len()
    );
    Ok(())
}

/// Deliver one batch. Ok when it is answered (or abandoned); Err leaves it queued.
fn deliver(core: &Core, batch: &mut FreeBatch) -> FsResult<()> {
    let raw: Vec<(u64, u32)> = batch.extents.iter().map(|(da, n)| (da.raw(), *n)).collect();
    let resource = batch.resource;
    let abandoned = |core: &Core, batch: &FreeBatch, now: &str| {
        core.stats
            .foreign_frees_abandoned
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        abandon(batch, now)
    };
    for _ in 0..4 {
        let owner = core
            .tokens
            .client()
            .locate_metanode(resource, false)
            .map_err(crate::coherence::token_error)?;
        match owner {
            Some(n) if n == core.tokens.node() => {
                if batch.sent_to.is_some() {
                    return abandoned(core, batch, "this node");
                }
                return apply_frees(core, &raw, &batch.inos);
            }
            Some(n) => {
                let to = core.writer.peer(n.0).unwrap_or(0);
                if batch.sent_to.is_some_and(|s| s != (n.0, to)) {
                    return abandoned(core, batch, &format!("node {n}"));
                }
                let req = crate::metanode::FsRequest::Free {
                    key: core.writer.key(batch.seq),
                    to,
                    extents: raw.clone(),
                    inos: batch.inos.clone(),
                };
                let reply = match crate::metanode::call_node(core, n, &req) {
                    Ok(r) => r,
                    Err(e) => {
                        // It may have been applied: from now on only this receiver
                        // (which remembers the key) may get the batch. With `to`
                        // unknown the receiver freed nothing (it answers
                        // `Incarnation`).
                        if to != 0 {
                            batch.sent_to = Some((n.0, to));
                        }
                        return Err(e);
                    }
                };
                match reply {
                    crate::metanode::FsReply::Done => {
                        core.stats
                            .foreign_frees_sent
                            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        return Ok(());
                    }
                    // The receiver's incarnation, learnt; it freed nothing.
                    crate::metanode::FsReply::Incarnation(i) => core.writer.set_peer(n.0, i),
                    // Nothing freed (its log cannot commit now, or a copy is being
                    // applied): later.
                    crate::metanode::FsReply::Unavailable(e) => {
                        return Err(FsError::Token(format!(
                            "node {n} could not free what this node freed in its space now: {e}"
                        )))
                    }
                    crate::metanode::FsReply::Failed(e) => {
                        // Perhaps part freed: never sent again (every copy would get
                        // this answer).
                        core.stats
                            .foreign_frees_abandoned
                            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        tracing::error!(
                            "node {n} could not free what this node freed in its space \
                             (not sent again; fsck reclaims what it did not free): {e}"
                        );
                        return Ok(());
                    }
                    // Not the owner any more: look again.
                    _ => continue,
                }
            }
            None => {
                if batch.sent_to.is_some() {
                    return abandoned(core, batch, "nobody");
                }
                // Nobody owns it: take it and free here.
                if take_and_own(core, resource)? {
                    return apply_frees(core, &raw, &batch.inos);
                }
            }
        }
    }
    Err(FsError::Token(format!(
        "{resource}: its owner keeps changing; frees queued for later"
    )))
}

/// At unmount: commit and checkpoint what is still running (frees just delivered
/// included), then give back every region and segment token, so other nodes can take
/// the space.
pub fn release_all(core: &Core) -> FsResult<()> {
    // A region leaves this node with its changes committed: `disown` forgets what the
    // running transaction changed there, and the revoke writes in place only what the
    // log holds.
    core.journal.quiesce(core)?;
    for r in 0..core.alloc.region_count() {
        if core.alloc.is_owned(r) {
            core.alloc.disown(r);
            core.tokens
                .client()
                .release(core.tokens.region(r as u32), ByteRange::WHOLE)
                .map_err(crate::coherence::token_error)?;
        }
    }
    for s in core.imap.owned_segments().unwrap_or_default() {
        core.imap.disown(s);
        core.tokens
            .client()
            .release(core.tokens.segment(s as u32), ByteRange::WHOLE)
            .map_err(crate::coherence::token_error)?;
    }
    Ok(())
}

/// The allocation region's token leaves this node (another node steals it, or a
/// recovery takes it): the next owner reads the region's map from disk, so it must
/// hold everything this node ever allocated there. In this order:
///
/// 1. Stop allocating there (`AllocMap::stop_allocating`, under the region's lock):
///    an allocation either took the lock before (done, its operation in flight) or
///    finds the region leaving and goes elsewhere. Frees there from now on are queued
///    for the next owner, like any other node's region's.
/// 2. Commit: the commit waits for every operation in flight (its gate), so every
///    allocation made before step 1 is in the committed map, with the file that uses
///    it.
///    With space freed there and still quarantined (its transaction not checkpointed:
///    this node's log may still replay an image of a freed indirect or directory
///    block), also checkpoint: the map on disk shows that space free, and the next
///    owner may reuse it at once.
/// 3. Write the committed map in place (durable before the token goes).
/// 4. Disown: forget the region's counters and its (now unchanged) pages.
///
/// Writing in place before stopping (the order until issue 14) lost an allocation
/// made between the two: the next owner read a map without it and handed it out
/// again. A token granted here and revoked before this node read the map and started
/// using it finds nothing owned to stop: step 1 counts the revoke, and the taker
/// (`AllocMap::own_since`) does not use the map it read.
pub fn revoke_region(core: &Arc<Core>, region: u64) -> FsResult<()> {
    let region = region as usize;
    if region < core.alloc.region_count() {
        core.alloc.stop_allocating(region);
        // Read after the stop: a free there from now on is queued for the next owner.
        if core.alloc.region_quarantined(region) > 0 {
            core.journal.quiesce(core)?;
        }
    }
    core.journal.write_in_place(core, OWNER_ALLOC_MAP)?;
    if region < core.alloc.region_count() {
        core.alloc.disown(region);
    }
    Ok(())
}

/// The inode-map segment's token leaves this node.
pub fn revoke_segment(core: &Arc<Core>, segment: u64) -> FsResult<()> {
    core.journal.write_in_place(core, OWNER_INODE_MAP)?;
    if (segment as usize) < core.imap.segments() {
        core.imap.disown(segment as usize);
    }
    Ok(())
}
