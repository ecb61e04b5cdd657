//! Replay of a node's recovery log (DESIGN.md 3.6): at mount, and by an offline fsck,
//! before anything else reads metadata.
//!
//! 1. Find the log file without trusting anything a crash may have torn: the log
//!    table's inode lives in the first block of the inode file (`inode_file_start`,
//!    fixed at creation) and its block map never changes; the node's entry in the
//!    table (one sector, written last when the log is created) says whether the log
//!    exists, and its inode, in the node's slot of the table, and the log's block map
//!    never change after creation (`mako_format::log_table`). A node without a log
//!    (it never mounted) has nothing to replay.
//! 2. Read both header copies; the valid one with the greater tail LSN says where the
//!    oldest transaction still needed starts.
//! 3. From the tail, read transaction after transaction; each must have a valid header
//!    of this node and file system at exactly the expected LSN and a valid payload
//!    checksum. The first that does not ends the chain. The last image of every
//!    address is kept; a revoke record drops the images it covers from transactions
//!    up to its `upto_seq` (the node wrote them in place before their token left it,
//!    and another node may have changed them since: docs/coherence.md section 7).
//! 4. Is that the end of the log, or damage? Each commit is synced before the next one
//!    is written, so only the last transaction can be torn: a transaction header of
//!    this node and file system further on, at the LSN its position has in this lap
//!    (`find_successor`), proves that the bad one was complete and durable once — media
//!    damage, not a torn commit. The next transaction starts where the bad one's header
//!    says it ends; when that header is itself unusable, the rest of the window is
//!    searched sector by sector. Transactions of earlier laps lie there too, but with
//!    LOWER LSNs than their position has now, so they never match. A mount refuses
//!    damage (dropping the committed transactions after it would be silent loss);
//!    `mako fsck -y` replays every valid transaction on both sides
//!    (`replay_around_damage`) and reports the lost range.
//! 5. Write the last image of every address in place (in address order) and sync.
//!    Images are physical, so a crash during replay is recovered by replaying again:
//!    nothing has changed on disk that the log cannot rewrite.
//! 6. Only then record the empty log (tail = head) in the header, and sync.
//!
//! Fault model of the log: a torn or lost write of the last transaction (never
//! acknowledged: discarded); a damaged header copy (the other is used); a damaged
//! transaction before the last (media damage: refused at mount, reported and replayed
//! around by fsck). The search costs one read of the rest of the log after an unclean
//! stop; a log marked clean holds nothing to replay and is not searched.

use crate::error::{FsError, FsResult, IntegrityError};
use crate::journal::{log_capacity, LogStart};
use mako_disk::nsd::IoTag;
use mako_disk::{BufferType, Nsd};
use mako_format::descriptor::Descriptor;
use mako_format::error::Location;
use mako_format::inode::Inode;
use mako_format::log_header::{
    best_copy, LogHeader, LOG_HEADER_BYTES, LOG_HEADER_OFFSETS, LOG_RECORDS_OFFSET,
};
use mako_format::log_record::{LogRecord, LogRevoke, TxnHeader, IMAGE_BYTES_MAX, TXN_HEADER_BYTES};
use mako_format::DiskAddress;
use std::time::{Duration, Instant};

/// What a replay did (logged at mount, shown by `mako fs show`, printed by fsck).
#[derive(Debug, Clone, Default)]
pub struct ReplayReport {
    pub node: u32,
    /// The log said the node stopped cleanly.
    pub was_clean: bool,
    pub transactions: u64,
    pub images: u64,
    /// Revoke records read, and images they kept from being replayed: structures this
    /// node wrote in place before their token left it, which another node may have
    /// changed since (docs/coherence.md section 7).
    pub revokes: u64,
    pub revoked: u64,
    /// Bytes of log read and of metadata written in place.
    pub log_bytes: u64,
    pub image_bytes: u64,
    pub tail_lsn: u64,
    pub head_lsn: u64,
    pub next_seq: u64,
    /// Why the scan stopped if not at a clean end (a torn last commit after a crash).
    pub torn_tail: Option<String>,
    /// Damaged committed transactions with valid ones after them (media damage).
    pub lost: Vec<LostRange>,
    /// Which header copy was used, and what was wrong with the other one, if anything.
    pub header_copy: usize,
    pub header_problem: Option<String>,
    pub duration: Duration,
    /// The node has no log yet (it never mounted): nothing was read.
    pub absent: bool,
    /// Directories with pages among the images read (replayed or revoked): the ones
    /// whose entry counts a survivor recounts after replaying a failed node's log
    /// (`recount_directories`).
    pub directories: std::collections::BTreeSet<u64>,
    /// Inodes whose last replayed image has no links while the log does not show their
    /// number freed (no image of their inode-map segment with their bit clear), with
    /// their generation: files the node unlinked while they were still open or looked
    /// up there, and numbers it freed in other nodes' segments without having handed
    /// the free to the owner yet (`ownership::deliver_frees` waits for the checkpoint).
    /// Both would stay allocated with no name; a survivor's recovery frees them
    /// (`reclaim_orphans`).
    pub orphans: std::collections::BTreeMap<u64, u32>,
}

/// Committed transactions that are damaged, with a valid transaction after them: what
/// a torn last commit can never leave (each commit is synced before the next starts).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LostRange {
    /// LSN where the damage starts (the first bad transaction).
    pub from_lsn: u64,
    /// LSN of the next valid transaction.
    pub to_lsn: u64,
    /// Where `from_lsn` lies (`disk:sector`).
    pub da: DiskAddress,
    /// What is wrong with the transaction at `from_lsn`.
    pub why: String,
    /// Sequence number of the next valid transaction.
    pub next_seq: u64,
}

impl LostRange {
    /// One sentence: where, how much, why.
    pub fn describe(&self, node: u32) -> String {
        format!(
            "the committed transaction at LSN {} of node {node}'s log is damaged ({}), \
             yet a valid transaction follows at LSN {} (number {}): {} bytes of log lost to media damage, not a torn last commit",
            self.from_lsn,
            self.why,
            self.to_lsn,
            self.next_seq,
            self.to_lsn - self.from_lsn
        )
    }
}

impl ReplayReport {
    pub fn start(&self) -> LogStart {
        LogStart {
            head_lsn: self.head_lsn,
            next_seq: self.next_seq,
        }
    }
    /// One line for the daemon log.
    pub fn summary(&self) -> String {
        let mut s = if self.absent {
            format!(
                "node {} has no recovery log yet: it is created at this first mount",
                self.node
            )
        } else if self.transactions == 0 {
            format!("recovery log of node {}: nothing to replay", self.node)
        } else {
            format!(
                "recovery log of node {}: replayed {} transactions ({} metadata images, {} bytes; LSN {}..{}, up to transaction {}) in {} ms",
                self.node,
                self.transactions,
                self.images,
                self.image_bytes,
                self.tail_lsn,
                self.head_lsn,
                self.next_seq.saturating_sub(1),
                self.duration.as_millis()
            )
        };
        if self.revoked > 0 {
            s.push_str(&format!(
                "; {} older images not replayed: revoked by {} records (written in place before their token left this node)",
                self.revoked, self.revokes
            ));
        }
        if let Some(t) = &self.torn_tail {
            s.push_str(&format!(
                "; the last commit was incomplete and is discarded ({t})"
            ));
        }
        if let Some(h) = &self.header_problem {
            s.push_str(&format!(
                "; header copy {} unusable: {h}",
                1 - self.header_copy
            ));
        }
        for l in &self.lost {
            s.push_str(&format!("; LOST: {}", l.describe(self.node)));
        }
        s
    }
}

/// The error for a node past the number the file system was made for.
pub fn node_out_of_range(desc: &Descriptor, node: u32) -> FsError {
    FsError::Invalid(format!(
        "node {node} cannot mount file system {}: it was made for at most {} node(s) \
         (`mako fs create -n {}`), numbered 0..{}; use a node number below {}, or create \
         the file system again with a larger -n",
        desc.fs_name,
        desc.metadata_inodes.log_count,
        desc.metadata_inodes.log_count,
        desc.metadata_inodes.log_count - 1,
        desc.metadata_inodes.log_count
    ))
}

/// The log table's blocks, found from fixed places only: its inode in the first block
/// of the inode file, and its block map, both never changed after creation.
pub fn table_blocks(nsd: &dyn Nsd, desc: &Descriptor) -> FsResult<Vec<DiskAddress>> {
    let geo = desc.geometry;
    let ino = desc.metadata_inodes.log_table;
    let off = ino * geo.inode_bytes as u64;
    if off + geo.inode_bytes as u64 > geo.block_bytes as u64 {
        return Err(FsError::integrity(IntegrityError::new(
            "descriptor",
            format!("the log table's inode {ino} lies past the first block of the inode file; run `mako fsck`"),
        )));
    }
    let da = desc.inode_file_start.offset_by(off);
    let mut buf = vec![0u8; geo.inode_bytes as usize];
    nsd.read(
        da,
        &mut buf,
        IoTag {
            buffer_type: BufferType::Inode,
            ino,
        },
    )?;
    let inode = Inode::decode(&buf, geo.inode_bytes, ino, Location::Disk(da))?;
    let blocks = crate::mount::collect_blocks(nsd, &geo, &inode)?;
    let need = mako_format::log_table::table_bytes(desc.metadata_inodes.log_count, geo.inode_bytes);
    if (blocks.len() as u64) * (geo.block_bytes as u64) < need {
        return Err(FsError::integrity(
            IntegrityError::new(
                "log table",
                format!(
                    "{} blocks, too few for the {} bytes of {} nodes; run `mako fsck`",
                    blocks.len(),
                    need,
                    desc.metadata_inodes.log_count
                ),
            )
            .ino(ino),
        ));
    }
    Ok(blocks)
}

/// Where a node's log is (`find_log`).
#[derive(Debug, Clone)]
pub struct LogLocation {
    pub ino: u64,
    pub inode: Inode,
    /// Where its inode lies in the log table.
    pub inode_da: DiskAddress,
    /// Where its entry lies in the log table.
    pub entry_da: DiskAddress,
    pub blocks: Vec<DiskAddress>,
}

/// Addresses of node `node`'s entry and inode slot in the log table.
pub fn table_slots(
    desc: &Descriptor,
    table: &[DiskAddress],
    node: u32,
) -> FsResult<(DiskAddress, DiskAddress)> {
    let geo = desc.geometry;
    let bb = geo.block_bytes as u64;
    let at = |off: u64| -> FsResult<DiskAddress> {
        table
            .get((off / bb) as usize)
            .map(|d| d.offset_by(off % bb))
            .ok_or_else(|| {
                FsError::integrity(
                    IntegrityError::new(
                        "log table",
                        format!("too short for offset {off}; run `mako fsck`"),
                    )
                    .ino(desc.metadata_inodes.log_table),
                )
            })
    };
    let n = desc.metadata_inodes.log_count;
    Ok((
        at(mako_format::log_table::entry_offset(node))?,
        at(mako_format::log_table::inode_offset(
            n,
            geo.inode_bytes,
            node,
        ))?,
    ))
}

/// Where the log of `node` is, found from fixed places only; `None` when the node has
/// none yet (it never mounted, or its log's creation was interrupted).
pub fn find_log(nsd: &dyn Nsd, desc: &Descriptor, node: u32) -> FsResult<Option<LogLocation>> {
    let geo = desc.geometry;
    if node >= desc.metadata_inodes.log_count {
        return Err(node_out_of_range(desc, node));
    }
    let table = table_blocks(nsd, desc)?;
    let (entry_da, inode_da) = table_slots(desc, &table, node)?;
    let ino = mako_format::log_table::log_ino(node);
    let mut sector = vec![0u8; mako_format::log_table::LOG_ENTRY_BYTES as usize];
    nsd.read(
        entry_da,
        &mut sector,
        IoTag {
            buffer_type: BufferType::Log,
            ino,
        },
    )?;
    let Some(entry) = mako_format::log_table::LogEntry::decode(
        &sector,
        node,
        &desc.fs_uuid,
        Location::Disk(entry_da),
    )?
    else {
        return Ok(None);
    };
    let mut buf = vec![0u8; geo.inode_bytes as usize];
    nsd.read(
        inode_da,
        &mut buf,
        IoTag {
            buffer_type: BufferType::Inode,
            ino,
        },
    )?;
    let inode = Inode::decode(&buf, geo.inode_bytes, ino, Location::Disk(inode_da))?;
    let blocks = crate::mount::collect_blocks(nsd, &geo, &inode)?;
    if entry.log_bytes != desc.log_bytes
        || (blocks.len() as u64) * (geo.block_bytes as u64) < desc.log_bytes
    {
        return Err(FsError::integrity(
            IntegrityError::new(
                "recovery log",
                format!(
                    "node {node}'s log has {} blocks and says it is {} bytes, the file system's logs are {} bytes; run `mako fsck`",
                    blocks.len(),
                    entry.log_bytes,
                    desc.log_bytes
                ),
            )
            .ino(ino)
            .at(entry_da),
        ));
    }
    Ok(Some(LogLocation {
        ino,
        inode,
        inode_da,
        entry_da,
        blocks,
    }))
}

/// Where the log of `node` is: its inode number and block addresses. An error when
/// the node has no log.
pub fn log_blocks(
    nsd: &dyn Nsd,
    desc: &Descriptor,
    node: u32,
) -> FsResult<(u64, Vec<DiskAddress>)> {
    match find_log(nsd, desc, node)? {
        Some(l) => Ok((l.ino, l.blocks)),
        None => Err(FsError::Invalid(format!(
            "node {node} has no recovery log in file system {} (it never mounted)",
            desc.fs_name
        ))),
    }
}

/// The report of a node that has no log: nothing to replay, a fresh log starts at LSN
/// 0 with transaction 1.
fn absent(node: u32) -> ReplayReport {
    ReplayReport {
        node,
        was_clean: true,
        next_seq: 1,
        absent: true,
        ..ReplayReport::default()
    }
}

struct LogReader<'a> {
    nsd: &'a dyn Nsd,
    blocks: Vec<DiskAddress>,
    block_bytes: u64,
    capacity: u64,
    log_ino: u64,
}

impl LogReader<'_> {
    fn da(&self, file_off: u64) -> DiskAddress {
        self.blocks[(file_off / self.block_bytes) as usize].offset_by(file_off % self.block_bytes)
    }
    fn read_file(&self, file_off: u64, buf: &mut [u8]) -> FsResult<()> {
        let mut done = 0usize;
        while done < buf.len() {
            let off = file_off + done as u64;
            let n = ((self.block_bytes - off % self.block_bytes) as usize).min(buf.len() - done);
            self.nsd.read(
                self.da(off),
                &mut buf[done..done + n],
                IoTag {
                    buffer_type: BufferType::Log,
                    ino: self.log_ino,
                },
            )?;
            done += n;
        }
        Ok(())
    }
    fn write_file(&self, file_off: u64, buf: &[u8]) -> FsResult<()> {
        let mut done = 0usize;
        while done < buf.len() {
            let off = file_off + done as u64;
            let n = ((self.block_bytes - off % self.block_bytes) as usize).min(buf.len() - done);
            self.nsd.write(
                self.da(off),
                &buf[done..done + n],
                IoTag {
                    buffer_type: BufferType::Log,
                    ino: self.log_ino,
                },
            )?;
            done += n;
        }
        Ok(())
    }
    /// Read `len` bytes at `lsn` of the circular area.
    fn read_lsn(&self, lsn: u64, len: usize) -> FsResult<Vec<u8>> {
        let mut out = vec![0u8; len];
        let mut done = 0usize;
        while done < len {
            let pos = (lsn + done as u64) % self.capacity;
            let n = ((self.capacity - pos) as usize).min(len - done);
            self.read_file(LOG_RECORDS_OFFSET + pos, &mut out[done..done + n])?;
            done += n;
        }
        Ok(out)
    }
    fn header_location(&self, copy: usize) -> Location {
        Location::Disk(self.da(LOG_HEADER_OFFSETS[copy]))
    }
}

/// Read the log header of `node` (both copies; the better one).
pub fn read_header(
    nsd: &dyn Nsd,
    desc: &Descriptor,
    node: u32,
) -> FsResult<(LogHeader, usize, Option<String>)> {
    let (log_ino, blocks) = log_blocks(nsd, desc, node)?;
    let r = LogReader {
        nsd,
        blocks,
        block_bytes: desc.geometry.block_bytes as u64,
        capacity: log_capacity(desc.log_bytes),
        log_ino,
    };
    read_header_with(&r, node)
}

fn read_header_with(r: &LogReader<'_>, node: u32) -> FsResult<(LogHeader, usize, Option<String>)> {
    let mut copies = Vec::new();
    for (i, off) in LOG_HEADER_OFFSETS.iter().enumerate() {
        let mut b = vec![0u8; LOG_HEADER_BYTES];
        r.read_file(*off, &mut b)?;
        copies.push(LogHeader::decode(&b, node, r.header_location(i)));
    }
    let problems: Vec<Option<String>> = copies
        .iter()
        .map(|c| c.as_ref().err().map(|e| e.to_string()))
        .collect();
    let copies: [Result<LogHeader, mako_format::FormatError>; 2] =
        [copies.remove(0), copies.remove(0)];
    match best_copy(copies) {
        Ok((h, i)) => Ok((h, i, problems[1 - i].clone())),
        Err(both) => Err(FsError::integrity(
            IntegrityError::new(
                "recovery log header",
                format!(
                    "both copies of node {node} are unreadable ({}; {}); run `mako fsck -y` to rebuild the log",
                    both[0], both[1]
                ),
            )
            .ino(r.log_ino),
        )),
    }
}

/// Replay the log of `node` onto the disks behind `nsd` (the mount). Safe to run on a
/// cleanly stopped file system (it finds nothing) and to run again after a crash
/// during replay. Damage in the middle of the log is refused before anything is
/// written: the error names the LSN, `disk:sector` and `mako fsck -y`.
pub fn replay(nsd: &dyn Nsd, desc: &Descriptor, node: u32) -> FsResult<ReplayReport> {
    replay_with(nsd, desc, node, false, false)
}

/// `replay` by a survivor of failed node `node` (`recover_failed_node`): the log is
/// then also marked clean — empty and not in use — as a clean unmount leaves it, until
/// `node` mounts again.
pub fn replay_failed(nsd: &dyn Nsd, desc: &Descriptor, node: u32) -> FsResult<ReplayReport> {
    replay_with(nsd, desc, node, false, true)
}

/// The inodes the last images of `latest` leave with no links and in use
/// (`ReplayReport::orphans`). Images are physical: inodes and inode-map segments are
/// found by their magic at every slot boundary and must decode whole (checksum
/// included); a segment image of the log says whether the node freed a number there.
fn orphans_of(desc: &Descriptor, latest: &Latest) -> std::collections::BTreeMap<u64, u32> {
    use mako_format::inode_map_segment::{InodeMapSegment, INODE_MAP_MAGIC};
    let inode_bytes = desc.geometry.inode_bytes as usize;
    let per_segment = desc.inodes_per_segment;
    let seg_bytes = InodeMapSegment::slot_bytes(per_segment);
    let inode_magic = (mako_format::inode::INODE_MAGIC as u32).to_le_bytes();
    let seg_magic = (INODE_MAP_MAGIC as u32).to_le_bytes();
    let mut unlinked = std::collections::BTreeMap::new();
    let mut segments: std::collections::BTreeMap<u32, InodeMapSegment> = Default::default();
    if inode_bytes == 0 || per_segment == 0 {
        return unlinked;
    }
    let mut full = Vec::new();
    for (da, (_, img)) in latest {
        full.clear();
        full.extend_from_slice(&img.bytes);
        full.resize(img.length as usize, 0);
        let step = inode_bytes.min(512);
        let mut at = 0;
        while at + 18 <= full.len() {
            let head = &full[at..at + 4];
            if head == inode_magic && at + inode_bytes <= full.len() {
                let ino = u64::from_le_bytes(full[at + 10..at + 18].try_into().expect("8 bytes"));
                let loc = Location::Disk(*da);
                if let Ok(i) = Inode::decode(&full[at..], desc.geometry.inode_bytes, ino, loc) {
                    if i.nlink == 0 && i.flags & mako_format::inode::FLAG_SYSTEM == 0 {
                        unlinked.insert(ino, i.generation);
                    } else {
                        unlinked.remove(&ino);
                    }
                }
            } else if head == seg_magic && at % 512 == 0 && at + seg_bytes <= full.len() {
                let seg = u32::from_le_bytes(full[at + 10..at + 14].try_into().expect("4 bytes"));
                let loc = Location::Disk(*da);
                if let Ok(s) = InodeMapSegment::decode(&full[at..], seg, per_segment, loc) {
                    segments.insert(seg, s);
                }
            }
            at += step;
        }
    }
    unlinked.retain(|&ino, _| {
        let seg = (ino / per_segment as u64) as u32;
        segments.get(&seg).is_none_or(|s| {
            let bit = ino % per_segment as u64;
            s.bitmap
                .get(bit as usize / 64)
                .is_none_or(|w| w >> (bit % 64) & 1 == 1)
        })
    });
    unlinked
}

/// The directories whose pages an image holds (a directory page starts with its magic
/// and names its directory: `mako_format::dir_block::encode_page`). Pages start at
/// sector boundaries of the image; something else that looks like one only costs a
/// recount that finds the count right (or no such directory).
fn note_directory_pages(bytes: &[u8], out: &mut std::collections::BTreeSet<u64>) {
    let magic = (mako_format::dir_block::DIR_BLOCK_MAGIC as u32).to_le_bytes();
    for at in (0..bytes.len()).step_by(512) {
        if bytes.len() >= at + 18 && bytes[at..at + 4] == magic {
            let ino = u64::from_le_bytes(bytes[at + 10..at + 18].try_into().expect("8 bytes"));
            if ino != 0 {
                out.insert(ino);
            }
        }
    }
}

/// What a survivor's recovery of a failed node did (`recover_failed_node`).
#[derive(Debug, Clone)]
pub struct NodeRecoveryReport {
    /// The failed node.
    pub failed: u32,
    /// The node that recovered it.
    pub by: u32,
    /// The replay of the failed node's log (empty when it was replayed before).
    pub replay: ReplayReport,
    /// Directories recounted after the replay, and the ones whose count was wrong:
    /// (inode, count before, count after).
    pub recounted: usize,
    pub recount_fixed: Vec<(u64, u64, u64)>,
    /// Directories that could not be recounted, and why.
    pub recount_failed: Vec<(u64, String)>,
    /// Orphans of the failed node freed after the replay (`reclaim_orphans`), and the
    /// ones that could not be, with why.
    pub reclaimed: Vec<u64>,
    pub reclaim_failed: Vec<(u64, String)>,
}

impl NodeRecoveryReport {
    /// One line for the daemon log.
    pub fn summary(&self) -> String {
        let mut line = format!(
            "node {} recovered failed node {}: {}; its tokens, metanode roles, regions and inode-map segments released",
            self.by,
            self.failed,
            self.replay.summary(),
        );
        if self.recounted > 0 {
            line += &format!("; {} directories recounted", self.recounted);
        }
        for (ino, was, is) in &self.recount_fixed {
            line += &format!("; directory {ino}: entry count {was} set to {is}");
        }
        for (ino, why) in &self.recount_failed {
            line += &format!("; directory {ino} not recounted: {why}");
        }
        if !self.reclaimed.is_empty() {
            line += &format!(
                "; {} inode(s) it left in use with no links freed {:?}",
                self.reclaimed.len(),
                self.reclaimed
            );
        }
        for (ino, why) in &self.reclaim_failed {
            line += &format!("; inode {ino} with no links not freed: {why}");
        }
        line
    }
}

/// Recovery of failed node `failed` by a survivor (issue 14, docs/coherence.md
/// "Recovery of a failed node"), on disks both share. The caller must know that
/// `failed` writes nothing more (it stopped, or is fenced: expelled with its lease
/// expired and its NSD requests refused); this function cannot check that.
///
/// 0. Claim the log: steps 1 and 2 run under `failed`'s `RecoveryLog` token in `xw`
///    (`Tokens::recovery_log`), released at the end, so two recoveries of one node
///    never overlap — the second replays nothing (the first left the log empty) and
///    its release of the tokens is a no-op. A claim whose holder died is waited for
///    like any token of a failed node (`holder_down_wait_ms`): until that holder is
///    recovered, which releases its claim with its other tokens.
/// 1. Replay `failed`'s recovery log onto the disks (`replay`: only what its log may
///    still replay — images it wrote in place before a token left it were revoked in
///    its log, docs/coherence.md section 7). Every structure it held dirty is covered
///    by a token it still holds, so nobody else changed those since. The log is then
///    empty (tail = head) and marked clean, synced (`replay_failed`): `failed`, when
///    it mounts again, replays nothing of what was replayed here, and a second
///    recovery replays nothing either.
/// 2. Release every token `failed` held, in every token manager shard
///    (`TokenClient::release_failed_node`). Acquires of other nodes that wait for it
///    (they could not revoke it: `holder_down_wait_ms`) then proceed; metanode roles
///    it had go with its tokens, to whichever node asks next; its allocation regions
///    and inode-map segments become unowned, and the next node that needs space takes
///    them, reading their maps from disk — as the replay left them, with the frees
///    committed in its log applied.
///
/// 3. The caller then recounts the entries of every directory whose pages `failed`'s
///    log held (`recount_after`, with `replay.directories`): a shared writer's
///    entry-count change reaches the directory's metanode after its own log commit of
///    the page, so a node that died between the two leaves the count one below the
///    entries (docs/coherence.md section 4, "Entry and link counts"). Not here: the
///    recount acquires tokens and may wait (once 180 s in the kill -9 rounds), and
///    the recovery — its tokens released — must not wait for it.
///
/// Operations that need none of `failed`'s tokens never wait for any of this.
/// 4. With the recount, the caller frees the orphans the replay found
///    (`reclaim_orphans`, with `replay.orphans`): files `failed` had unlinked while
///    open, and inode numbers it freed in other nodes' segments but had not handed over.
///
/// Not covered: space `failed` freed in other nodes' regions (its log holds no record
/// of those frees), and inode numbers freed there after their transaction was
/// checkpointed but before it delivered them (`ownership::deliver_frees`), are lost
/// with its memory: they leak until fsck reclaims them.
pub fn recover_failed_node(
    core: &crate::core::Core,
    failed: u32,
) -> crate::error::FsResult<NodeRecoveryReport> {
    if failed == core.node {
        return Err(FsError::Invalid(format!(
            "node {failed} cannot recover itself: a node replays its own log when it mounts"
        )));
    }
    let desc = core.desc.lock().clone();
    if failed >= desc.metadata_inodes.log_count {
        return Err(node_out_of_range(&desc, failed));
    }
    // The claim on the log: two survivors recovering `failed` at once (the cluster
    // manager's choice and a mount, or a recoverer taken for dead that was only slow)
    // take turns. Without it the slower one could lay an image it read before the
    // other finished over what a third node wrote after the tokens were released.
    // The second finds the log empty and replays nothing. A claim whose holder died
    // is waited for like any token of a failed node: until that node is recovered.
    use mako_token::{ByteRange, TokenMode};
    let client = core.tokens.client();
    let claim = core.tokens.recovery_log(failed);
    let hold = client
        .hold(claim, TokenMode::Xw, ByteRange::WHOLE, ByteRange::WHOLE)
        .map_err(crate::coherence::token_error)?;
    let replayed = replay_failed(core.nsd.as_ref(), &desc, failed).and_then(|replay| {
        client
            .release_failed_node(mako_rt::NodeId(failed))
            .map_err(crate::coherence::token_error)?;
        Ok(replay)
    });
    drop(hold);
    // Not kept cached: a holder that fails later would make the next recovery of
    // `failed` wait for its own.
    let released = client
        .release(claim, ByteRange::WHOLE)
        .map_err(crate::coherence::token_error);
    let replay = replayed?;
    released?;
    let report = NodeRecoveryReport {
        failed,
        by: core.node,
        recounted: 0,
        replay,
        recount_fixed: Vec::new(),
        recount_failed: Vec::new(),
        reclaimed: Vec::new(),
        reclaim_failed: Vec::new(),
    };
    tracing::info!("{}", report.summary());
    Ok(report)
}

/// Replay every valid transaction of `node`'s log, on both sides of damaged ones
/// (`mako fsck -y`): what the lost transactions changed is gone, and the caller
/// repairs what they left inconsistent. The lost ranges are in the report.
pub fn replay_around_damage(nsd: &dyn Nsd, desc: &Descriptor, node: u32) -> FsResult<ReplayReport> {
    replay_with(nsd, desc, node, true, false)
}

/// The error a mount gives for damage in the middle of the log.
fn damage_error(report: &ReplayReport, log_ino: u64) -> FsError {
    let first = &report.lost[0];
    let after: u64 = report.head_lsn - first.to_lsn;
    FsError::integrity(
        IntegrityError::new(
            "recovery log",
            format!(
                "{}. Mounting would drop the {after} bytes of committed transactions after it \
                 (LSN {}..{}), so the file system is not mounted and the log is left as it is{}",
                first.describe(report.node),
                first.to_lsn,
                report.head_lsn,
                if report.lost.len() > 1 {
                    format!(" ({} damaged ranges in all)", report.lost.len())
                } else {
                    String::new()
                }
            ),
        )
        .ino(log_ino)
        .at(first.da),
    )
}

fn replay_with(
    nsd: &dyn Nsd,
    desc: &Descriptor,
    node: u32,
    around_damage: bool,
    mark_clean: bool,
) -> FsResult<ReplayReport> {
    let started = Instant::now();
    let Some(log) = find_log(nsd, desc, node)? else {
        return Ok(absent(node));
    };
    let log_ino = log.ino;
    let capacity = log_capacity(desc.log_bytes);
    let r = LogReader {
        nsd,
        blocks: log.blocks,
        block_bytes: desc.geometry.block_bytes as u64,
        capacity,
        log_ino,
    };
    let (mut report, header, latest) = scan_with(&r, desc, node)?;
    if !report.lost.is_empty() && !around_damage {
        return Err(damage_error(&report, log_ino));
    }
    report.orphans = orphans_of(desc, &latest);
    let lsn = report.head_lsn;
    // 5. In place: the last image of each address, in address order.
    // Adjacent images (neighbouring inodes, pages of one block) go out as one write.
    let mut run: Option<(DiskAddress, Vec<u8>)> = None;
    let flush = |run: &mut Option<(DiskAddress, Vec<u8>)>| -> FsResult<()> {
        if let Some((da, bytes)) = run.take() {
            nsd.write(
                da,
                &bytes,
                IoTag {
                    buffer_type: BufferType::Log,
                    ino: 0,
                },
            )?;
        }
        Ok(())
    };
    for (_, img) in latest.values() {
        report.image_bytes += img.length as u64;
        let contiguous = run.as_ref().is_some_and(|(da, bytes)| {
            da.disk() == img.da.disk()
                && da.sector() + bytes.len() as u64 / 512 == img.da.sector()
                && bytes.len() < (4 << 20)
        });
        if !contiguous {
            flush(&mut run)?;
            run = Some((img.da, Vec::with_capacity(img.length as usize)));
        }
        let (_, bytes) = run.as_mut().expect("a run");
        bytes.extend_from_slice(&img.bytes);
        bytes.resize(bytes.len() + img.length as usize - img.bytes.len(), 0);
    }
    flush(&mut run)?;
    if report.transactions > 0 {
        nsd.sync_all()?;
    }
    // A torn last transaction (never acknowledged) is cleared, so that the log ends
    // normally there and no later scan reports it again.
    if report.torn_tail.is_some() {
        let pos = lsn % r.capacity;
        let n = (r.capacity - pos).min(TXN_HEADER_BYTES.next_multiple_of(512) as u64) as usize;
        r.write_file(LOG_RECORDS_OFFSET + pos, &vec![0u8; n])?;
    }
    // 6. The log is empty now: say so before anything writes to it.
    if report.transactions > 0
        || header.tail_lsn != header.head_lsn
        || report.header_problem.is_some()
        || report.torn_tail.is_some()
        || !report.lost.is_empty()
        || (mark_clean && !header.clean)
    {
        let h = LogHeader {
            node,
            log_bytes: desc.log_bytes,
            tail_lsn: lsn,
            head_lsn: lsn,
            clean: header.clean || mark_clean,
        };
        let bytes = h.encode();
        for off in LOG_HEADER_OFFSETS {
            r.write_file(off, &bytes)?;
        }
        nsd.sync_all()?;
    }
    report.duration = started.elapsed();
    Ok(report)
}

/// What a replay of `node`'s log would write, without writing anything: the last
/// image of every address the committed transactions changed (no two overlap), in
/// address order. A read-only check (`mako fsck -n`, `--online`) lays these over
/// what it reads from the disks to see the file system as its last commit left it.
pub fn pending(
    nsd: &dyn Nsd,
    desc: &Descriptor,
    node: u32,
) -> FsResult<(ReplayReport, Vec<mako_format::log_record::LogImage>)> {
    let started = Instant::now();
    let Some(log) = find_log(nsd, desc, node)? else {
        return Ok((absent(node), Vec::new()));
    };
    let capacity = log_capacity(desc.log_bytes);
    let r = LogReader {
        nsd,
        blocks: log.blocks,
        block_bytes: desc.geometry.block_bytes as u64,
        capacity,
        log_ino: log.ino,
    };
    let (mut report, _, latest) = scan_with(&r, desc, node)?;
    report.orphans = orphans_of(desc, &latest);
    report.image_bytes = latest.values().map(|(_, i)| i.length as u64).sum();
    report.duration = started.elapsed();
    Ok((report, latest.into_values().map(|(_, i)| i).collect()))
}

/// The last image of every address, with the sequence number of its transaction.
type Latest = std::collections::BTreeMap<DiskAddress, (u64, mako_format::log_record::LogImage)>;

/// Drop from `latest` every image the revoke covers: of these sectors, from a
/// transaction up to the revoke's `upto_seq`. Returns how many were dropped.
fn revoke(latest: &mut Latest, rv: &LogRevoke) -> u64 {
    // Images start at most `IMAGE_BYTES_MAX` before the revoked range and still reach it.
    let from = DiskAddress::new(
        rv.da.disk(),
        rv.da
            .sector()
            .saturating_sub(IMAGE_BYTES_MAX as u64 / mako_format::SECTOR_BYTES),
    );
    let to = DiskAddress::new(
        rv.da.disk(),
        rv.da.sector() + rv.length as u64 / mako_format::SECTOR_BYTES,
    );
    let gone: Vec<DiskAddress> = latest
        .range(from..to)
        .filter(|(_, (seq, img))| *seq <= rv.upto_seq && rv.overlaps(img))
        .map(|(da, _)| *da)
        .collect();
    for da in &gone {
        latest.remove(da);
    }
    gone.len() as u64
}

/// Where and why a chain of transactions stopped.
struct ChainStop {
    /// The decoder's whole message (for a torn tail), and a short one for a lost range
    /// (whose location and advice are said once by the caller).
    why: String,
    short: String,
    /// Nothing that looks like a transaction (zeros, no magic, an earlier lap): the
    /// normal end of a log, unless something valid follows.
    normal: bool,
    /// Where a later transaction may start: the end the bad one's header gives, or
    /// the next sector when that header is unusable.
    search_from: u64,
}

/// What is wrong with a transaction, without where (said by the caller) or advice.
fn short_reason(e: &mako_format::FormatError) -> String {
    use mako_format::FormatErrorKind as K;
    let what = match &e.kind {
        K::BadMagic { found: 0 } => "is blank (zeros)".to_string(),
        K::BadMagic { found } => format!("has a wrong magic number ({found:#x})"),
        K::UnsupportedVersion { found, .. } => format!("has format version {found}"),
        K::BadChecksum { .. } => "fails its checksum".to_string(),
        K::WrongIdentity { expected, found } => {
            format!("holds {found} where {expected} was expected")
        }
        K::Truncated { needed, available } => {
            format!("is truncated ({available} of {needed} bytes)")
        }
        K::Invalid(w) => format!("is invalid: {w}"),
    };
    format!(
        "its {} {what}",
        e.structure.trim_start_matches("log transaction ")
    )
}

/// Step 3: follow the chain of valid transactions from `*lsn`, each where the one
/// before ends, recording their images. Returns why it stopped (`None`: the window is
/// full), with `*lsn` at the transaction that stopped it.
fn scan_chain(
    r: &LogReader<'_>,
    desc: &Descriptor,
    node: u32,
    lsn: &mut u64,
    window_end: u64,
    report: &mut ReplayReport,
    latest: &mut Latest,
) -> FsResult<Option<ChainStop>> {
    let capacity = r.capacity;
    loop {
        if *lsn + TXN_HEADER_BYTES as u64 > window_end {
            return Ok(None);
        }
        let at = *lsn;
        let hbytes = r.read_lsn(at, TXN_HEADER_BYTES)?;
        let loc = Location::Disk(r.da(LOG_RECORDS_OFFSET + at % capacity));
        let th = match TxnHeader::decode(&hbytes, node, desc.fs_uuid, at, loc) {
            Ok(h) => h,
            Err(e) => {
                // The normal end: a zeroed area, a transaction of an earlier lap, or the
                // middle of one (no header magic). A header with the magic that does
                // not decode is a damaged or torn commit.
                let normal = hbytes.iter().all(|&b| b == 0)
                    || matches!(
                        e.kind,
                        mako_format::FormatErrorKind::WrongIdentity { .. }
                            | mako_format::FormatErrorKind::BadMagic { .. }
                    );
                return Ok(Some(ChainStop {
                    why: e.to_string(),
                    short: short_reason(&e),
                    normal,
                    search_from: at + 512,
                }));
            }
        };
        let total = th.total_bytes();
        if at + total > window_end {
            let why =
                format!("transaction at LSN {at} claims {total} bytes, more than the log holds");
            return Ok(Some(ChainStop {
                short: why.clone(),
                why,
                normal: false,
                search_from: at + 512,
            }));
        }
        let all = r.read_lsn(at, total as usize)?;
        let images = match th.decode_payload(&all[TXN_HEADER_BYTES..], loc) {
            Ok(i) => i,
            Err(e) => {
                return Ok(Some(ChainStop {
                    why: e.to_string(),
                    short: short_reason(&e),
                    normal: false,
                    search_from: at + total,
                }))
            }
        };
        if crate::journal::trace_enabled() {
            eprintln!("replay seq {} at lsn {at}: {} images", th.seq, images.len());
        }
        for rec in images {
            match rec {
                LogRecord::Image(img) => {
                    report.images += 1;
                    note_directory_pages(&img.bytes, &mut report.directories);
                    latest.insert(img.da, (th.seq, img));
                }
                LogRecord::Revoke(rv) => {
                    report.revokes += 1;
                    report.revoked += revoke(latest, &rv);
                }
            }
        }
        report.transactions += 1;
        report.log_bytes += total;
        report.next_seq = th.seq + 1;
        *lsn = at + total;
    }
}

/// Step 4: the first transaction header of this node and file system at or after
/// `from` whose LSN is the one its position has in this lap (an earlier lap's
/// transactions there have lower LSNs). Returns its LSN and sequence number. Reads
/// the rest of the window in 1 MiB pieces, decoding only sectors that start with the
/// header magic.
fn find_successor(
    r: &LogReader<'_>,
    desc: &Descriptor,
    node: u32,
    from: u64,
    window_end: u64,
) -> FsResult<Option<(u64, u64)>> {
    const PIECE_BYTES: u64 = 1 << 20;
    let magic = mako_format::log_record::TXN_MAGIC.to_le_bytes();
    let mut p = from;
    while p + TXN_HEADER_BYTES as u64 <= window_end {
        // LSNs and the window are whole sectors, so a piece is too.
        let n = PIECE_BYTES.min(window_end - p);
        let buf = r.read_lsn(p, n as usize)?;
        for off in (0..n).step_by(512) {
            let at = p + off;
            let h = &buf[off as usize..];
            if at + TXN_HEADER_BYTES as u64 > window_end
                || h.len() < TXN_HEADER_BYTES
                || h[..8] != magic
            {
                continue;
            }
            let loc = Location::Disk(r.da(LOG_RECORDS_OFFSET + at % r.capacity));
            if let Ok(th) = TxnHeader::decode(&h[..TXN_HEADER_BYTES], node, desc.fs_uuid, at, loc) {
                return Ok(Some((at, th.seq)));
            }
        }
        p += n;
    }
    Ok(None)
}

/// Steps 2 and 3: the header and every committed transaction after its tail.
fn scan_with(
    r: &LogReader<'_>,
    desc: &Descriptor,
    node: u32,
) -> FsResult<(ReplayReport, LogHeader, Latest)> {
    let capacity = r.capacity;
    let (header, copy, header_problem) = read_header_with(r, node)?;
    let mut report = ReplayReport {
        node,
        was_clean: header.clean,
        tail_lsn: header.tail_lsn,
        header_copy: copy,
        header_problem,
        next_seq: 1,
        ..ReplayReport::default()
    };
    // 3. Scan, transaction by transaction; keep the last image of every address.
    let mut latest = Latest::new();
    // Every transaction of this lap lies in the window of `capacity` bytes from the
    // tail the header names: the header is written before space is reused.
    let window_end = header.tail_lsn + capacity;
    let mut lsn = header.tail_lsn;
    loop {
        let stop = scan_chain(
            r,
            desc,
            node,
            &mut lsn,
            window_end,
            &mut report,
            &mut latest,
        )?;
        let Some(stop) = stop else { break };
        // 4. The end of the log, or damage? A log marked clean with nothing in it was
        //    checkpointed whole at a clean unmount: nothing after its tail is needed.
        let clean_and_empty = header.clean && report.transactions == 0 && report.lost.is_empty();
        let next = if clean_and_empty {
            None
        } else {
            find_successor(r, desc, node, stop.search_from, window_end)?
        };
        match next {
            Some((to_lsn, next_seq)) => {
                report.lost.push(LostRange {
                    from_lsn: lsn,
                    to_lsn,
                    da: r.da(LOG_RECORDS_OFFSET + lsn % capacity),
                    why: stop.short,
                    next_seq,
                });
                lsn = to_lsn;
            }
            None => {
                if !stop.normal {
                    report.torn_tail = Some(stop.why);
                }
                break;
            }
        }
    }
    // Images of one log window never overlap at different addresses (freed space is
    // not reused before a checkpoint), which is checked: if they did, order would matter.
    let mut prev_end: Option<(u32, u64)> = None;
    for (da, (_, img)) in &latest {
        if let Some((disk, end)) = prev_end {
            if disk == da.disk() && da.sector() < end {
                return Err(FsError::integrity(
                    IntegrityError::new(
                        "recovery log",
                        format!(
                            "node {node}: images overlap at {da}; run `mako fsck` (the log is left as it is)"
                        ),
                    )
                    .ino(r.log_ino),
                ));
            }
        }
        prev_end = Some((da.disk(), da.sector() + img.length as u64 / 512));
    }
    report.head_lsn = lsn;
    Ok((report, header, latest))
}

/// Step 3 of `recover_failed_node`: recount the directories its replay found, into
/// `report` (`recounted`, `recount_fixed`, `recount_failed`).
pub fn recount_after(core: &crate::core::Core, report: &mut NodeRecoveryReport) {
    let (fixed, failed) = recount_directories(core, &report.replay.directories);
    report.recounted = report.replay.directories.len();
    report.recount_fixed = fixed;
    report.recount_failed = failed;
    let (freed, failed) = reclaim_orphans(core, &report.replay.orphans);
    report.reclaimed = freed;
    report.reclaim_failed = failed;
}

/// Free the orphans a failed node left (`ReplayReport::orphans`), on a survivor after
/// the replay and the release of the failed node's tokens: files it had unlinked while
/// they were open or looked up there (POSIX keeps such a file until its last close; the
/// node that held it open is gone, so nobody will close it), and numbers it freed in
/// other nodes' inode-map segments that it had not yet handed to their owner. Each is
/// freed as its own last close would have (`workers::free_inode`: blocks, extended
/// attributes, the number; what lies in other nodes' space is handed to them as this
/// node's foreign free), under its inode in `xw` and its data in `xw`, and only if it
/// still has no links and the generation the log left (its number was not used again
/// since), and no file of this node has it open (its own last close frees it then).
/// Committed at the end. Returns the inodes freed, and those that could not be,
/// with why.
#[allow(clippy::type_complexity)]
pub fn reclaim_orphans(
    core: &crate::core::Core,
    orphans: &std::collections::BTreeMap<u64, u32>,
) -> (Vec<u64>, Vec<(u64, String)>) {
    let (mut freed, mut failed) = (Vec::new(), Vec::new());
    for (&ino, &generation) in orphans {
        match reclaim(core, ino, generation) {
            Ok(true) => freed.push(ino),
            Ok(false) => {}
            Err(e) => {
                tracing::error!("inode {ino}, left with no links by a failed node: not freed: {e}");
                failed.push((ino, e.to_string()));
            }
        }
    }
    if !freed.is_empty() {
        if let Err(e) = core.journal.commit(core) {
            for ino in freed.drain(..) {
                failed.push((ino, format!("the commit of its free failed: {e}")));
            }
        }
    }
    (freed, failed)
}

/// Free one orphan (`reclaim_orphans`): `true` if it was freed here.
fn reclaim(core: &crate::core::Core, ino: u64, generation: u32) -> FsResult<bool> {
    use crate::coherence::Need;
    use mako_token::{ByteRange, TokenMode};
    if ino >= core.imap.inodes_max() {
        return Ok(false);
    }
    crate::op::run(core, || {
        crate::op::hold_inode(core, ino, Need::Exclusive)?;
        crate::op::hold_range(
            core,
            core.tokens.data(ino),
            TokenMode::Xw,
            ByteRange::WHOLE,
            ByteRange::WHOLE,
        )?;
        let cached = core.cached_handle(ino);
        // What is committed now, under the token: the replay's image, or what another
        // node wrote since.
        let inode = match core.read_inode(ino) {
            Ok(i) => i,
            Err(FsError::Stale(_) | FsError::NotFound(_)) => return Ok(false),
            Err(e) => return Err(e),
        };
        if inode.nlink > 0
            || inode.generation != generation
            || inode.flags & mako_format::inode::FLAG_SYSTEM != 0
        {
            return Ok(false);
        }
        // Open here too: this node's last close frees it, once its cached copy says it
        // has no links. Only known to this node's kernel (a lookup, from reading it
        // before the failed node unlinked it) is no reason to keep it: its forget finds
        // it freed.
        if let Some(h) = &cached {
            if h.opens.load(std::sync::atomic::Ordering::SeqCst) > 0 {
                let mut st = h.state.write();
                if !st.dirty && !st.deleted {
                    st.inode = inode;
                    st.indirect.lock().clear();
                    st.dir_blocks.lock().clear();
                    st.stale = false;
                }
                return Ok(false);
            }
        }
        // A segment this node owns says for sure whether the number is in use; one it
        // does not own is the owner's to free (a foreign free), and its number is in
        // use there: the log shows no free of it.
        let segment = core.imap.segment_of(ino);
        if core.imap.is_owned(segment) && !core.imap.is_used(ino) {
            return Ok(false);
        }
        let h = cached.unwrap_or_else(|| {
            let h = core.new_handle(inode.clone());
            core.inodes.lock().insert(ino, h.clone());
            h
        });
        let _tx = core.begin();
        let mut st = h.state.write();
        if st.deleted || st.dirty {
            return Ok(false);
        }
        st.inode = inode.clone();
        st.indirect.lock().clear();
        st.dir_blocks.lock().clear();
        st.stale = false;
        crate::workers::free_inode(core, &mut st)?;
        Ok(true)
    })
}

/// Recount the entries of `dirs` on this node (step 3 of `recover_failed_node`), each
/// under its inode in `xw` (every other writer's pages and counts come in first), and
/// set the count where it is wrong, committed. A directory that no longer exists (or
/// is no longer one) is skipped. Returns the counts fixed (inode, before, after) and
/// the directories that could not be recounted, with why.
#[allow(clippy::type_complexity)]
pub fn recount_directories(
    core: &crate::core::Core,
    dirs: &std::collections::BTreeSet<u64>,
) -> (Vec<(u64, u64, u64)>, Vec<(u64, String)>) {
    let (mut fixed, mut failed) = (Vec::new(), Vec::new());
    for &ino in dirs {
        match recount(core, ino) {
            Ok(Some((was, is))) => {
                tracing::warn!(
                    "directory inode {ino}: entry count {was} after a failed node's recovery, \
                     {is} entries: set to {is}"
                );
                fixed.push((ino, was, is));
            }
            Ok(None) => {}
            Err(e) => {
                tracing::error!("directory inode {ino}: entry count not recounted: {e}");
                failed.push((ino, e.to_string()));
            }
        }
    }
    if !fixed.is_empty() {
        if let Err(e) = core.journal.commit(core) {
            for (ino, _, _) in fixed.drain(..) {
                failed.push((ino, format!("the recount's commit failed: {e}")));
            }
        }
    }
    (fixed, failed)
}

/// Recount one directory: `Some((before, after))` if its count was wrong.
fn recount(core: &crate::core::Core, ino: u64) -> FsResult<Option<(u64, u64)>> {
    use crate::coherence::Need;
    crate::op::run(core, || {
        let h = match core.get(ino) {
            Ok(h) => h,
            Err(FsError::NotFound(_) | FsError::Stale(_)) => return Ok(None),
            Err(e) => return Err(e),
        };
        if !crate::fs::is_dir_mode(h.state.read().inode.mode) {
            return Ok(None);
        }
        crate::op::hold_inode(core, ino, Need::Exclusive)?;
        let _tx = core.begin();
        let mut st = h.state.write();
        if st.deleted || !crate::fs::is_dir_mode(st.inode.mode) || st.inode.nlink == 0 {
            return Ok(None);
        }
        let mut count = 0u64;
        let mut after = 0u64;
        loop {
            let batch = crate::directory::list(core, &st, after, 4096)?;
            let Some(last) = batch.last() else { break };
            after = last.cookie;
            count += batch.len() as u64;
        }
        if st.inode.entries == count {
            return Ok(None);
        }
        let was = st.inode.entries;
        st.inode.entries = count;
        st.mark_dirty();
        Ok(Some((was, count)))
    })
}
