//! What fsck found and what it did about it: problem kinds with stable names (the
//! names are part of the `--json` output and of the tests), one `Problem` per finding,
//! and the `Report` with its per-kind counts, timing and e2fsck-style exit code.

use mako_format::{FormatError, FormatErrorKind};
use serde::Serialize;
use std::collections::BTreeMap;
use std::fmt::Write as _;

/// Exit codes, as e2fsck: they combine by OR (1|4 = some fixed, some left).
pub const EXIT_CLEAN: i32 = 0;
pub const EXIT_CORRECTED: i32 = 1;
pub const EXIT_UNCORRECTED: i32 = 4;
pub const EXIT_OPERATIONAL: i32 = 8;
pub const EXIT_USAGE: i32 = 16;
pub const EXIT_CANCELLED: i32 = 32;

/// Problems listed one by one per kind in the human summary; the rest are counted.
pub const LISTED_PER_KIND_MAX: usize = 50;

/// Every kind of damage fsck knows. The snake_case name is stable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ProblemKind {
    /// A descriptor copy that is lost, damaged, stale or differs from the others.
    DescriptorCopy,
    /// A disk header that is damaged or disagrees with the descriptor.
    DiskHeader,
    /// A metadata file (inode file, allocation maps, log, root) damaged or misshapen.
    MetadataFile,
    /// The recovery log header: a damaged copy, or fields that disagree.
    LogHeader,
    /// The file system was not stopped cleanly: committed transactions in the
    /// recovery log are not yet in place (or the last one is torn). Replayed by -y.
    LogReplay,
    /// Committed transactions in the middle of the recovery log are damaged (media
    /// damage: a valid transaction follows them). `-y` replays the valid ones on both
    /// sides; the lost ones' changes are gone and what they left inconsistent is
    /// repaired as any other damage.
    LogTransactionLost,
    /// An inode in use that does not decode (checksum, identity, invalid field).
    BadInode,
    /// A free inode slot holding damaged bytes.
    DamagedFreeInode,
    /// An inode field that disagrees with the rest of the inode (size, subblocks, …).
    InodeField,
    /// The inode's tree depth disagrees with the indirect blocks it points at.
    TreeDepth,
    /// A block pointer outside the disks, misaligned, or past the end of a file.
    BadPointer,
    /// An indirect block that is unreadable or not the one its parent expects.
    BadIndirectBlock,
    /// A directory block that is unreadable or not the one its directory expects.
    BadDirectoryBlock,
    /// An xattr index or xattr block that is unreadable, not the one its inode
    /// expects, or whose pieces do not fit together.
    BadXattrBlock,
    /// Directory blocks whose depths and cookie ranges do not tile the hash space.
    DirectoryShape,
    /// An entry that lookup cannot reach: a gap in its name's cookie chain.
    BrokenHashChain,
    /// Two entries with one name in one directory.
    DuplicateName,
    /// An entry naming a free inode.
    EntryToFreeInode,
    /// An entry naming a damaged inode or an invalid inode number.
    EntryToBadInode,
    /// An entry whose file type differs from its inode's.
    EntryType,
    /// A directory with more than one name.
    DirectoryHardLink,
    /// A directory whose `..` (parent field) is not the directory holding its name.
    BadParent,
    /// A link count that is not the number of names (files) or 2 + subdirectories.
    LinkCount,
    /// An inode in use that no path reaches: reconnected under /lost+found.
    Orphan,
    /// An inode in use with no links (open and unlinked at a crash): freed.
    UnlinkedInode,
    /// /lost+found missing when needed: created.
    LostFound,
    /// A block owned by two files (or twice by one).
    CrossLinkedBlock,
    /// Subblocks in use but marked free: they would be handed out twice.
    BlockMarkedFree,
    /// Subblocks marked in use that nothing owns: leaked space.
    BlockLeaked,
    /// An allocation map segment that is unreadable or misshapen.
    AllocSegment,
    /// An inode map segment that is unreadable or misshapen.
    InodeMapSegment,
    /// An inode in use but free in the inode map.
    InodeMarkedFree,
    /// An inode number marked in use that no inode holds.
    InodeLeaked,
}

impl ProblemKind {
    pub fn name(self) -> &'static str {
        use ProblemKind::*;
        match self {
            DescriptorCopy => "descriptor_copy",
            DiskHeader => "disk_header",
            MetadataFile => "metadata_file",
            LogHeader => "log_header",
            LogReplay => "log_replay",
            LogTransactionLost => "log_transaction_lost",
            BadInode => "bad_inode",
            DamagedFreeInode => "damaged_free_inode",
            InodeField => "inode_field",
            TreeDepth => "tree_depth",
            BadPointer => "bad_pointer",
            BadIndirectBlock => "bad_indirect_block",
            BadDirectoryBlock => "bad_directory_block",
            BadXattrBlock => "bad_xattr_block",
            DirectoryShape => "directory_shape",
            BrokenHashChain => "broken_hash_chain",
            DuplicateName => "duplicate_name",
            EntryToFreeInode => "entry_to_free_inode",
            EntryToBadInode => "entry_to_bad_inode",
            EntryType => "entry_type",
            DirectoryHardLink => "directory_hard_link",
            BadParent => "bad_parent",
            LinkCount => "link_count",
            Orphan => "orphan",
            UnlinkedInode => "unlinked_inode",
            LostFound => "lost_found",
            CrossLinkedBlock => "cross_linked_block",
            BlockMarkedFree => "block_marked_free",
            BlockLeaked => "block_leaked",
            AllocSegment => "alloc_segment",
            InodeMapSegment => "inode_map_segment",
            InodeMarkedFree => "inode_marked_free",
            InodeLeaked => "inode_leaked",
        }
    }
}

/// One finding.
#[derive(Debug, Clone, Serialize)]
pub struct Problem {
    pub kind: ProblemKind,
    /// The inode concerned, when there is one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ino: Option<u64>,
    /// A path to that inode, when one is known (resolved after the namespace pass).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// Where on disk (`disk:sector`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub location: Option<String>,
    /// What is wrong.
    pub what: String,
    /// What the repair does (or would do with `-y`).
    pub repair: String,
    /// False when `-y` cannot fix it (the summary then says what to do).
    pub correctable: bool,
    /// Set once a repair run has fixed it.
    pub fixed: bool,
}

impl Problem {
    pub fn new(kind: ProblemKind, what: impl Into<String>, repair: impl Into<String>) -> Problem {
        Problem {
            kind,
            ino: None,
            path: None,
            location: None,
            what: what.into(),
            repair: repair.into(),
            correctable: true,
            fixed: false,
        }
    }
    pub fn ino(mut self, ino: u64) -> Problem {
        self.ino = Some(ino);
        self
    }
    pub fn at(mut self, location: impl ToString) -> Problem {
        self.location = Some(location.to_string());
        self
    }
    pub fn uncorrectable(mut self) -> Problem {
        self.correctable = false;
        self
    }
}

/// A decoding error in fsck's words: the structure, where, and what was wrong,
/// without the "run `mako fsck`" advice the decoders give to everyone else.
pub fn describe(e: &FormatError) -> String {
    let what = match &e.kind {
        FormatErrorKind::BadMagic { found: 0 } => {
            "is blank (zeros): never written or overwritten".to_string()
        }
        FormatErrorKind::BadMagic { found } => format!("holds something else (magic {found:#x})"),
        FormatErrorKind::UnsupportedVersion { found, supported } => {
            format!("has format version {found}, newer than this fsck supports ({supported})")
        }
        FormatErrorKind::BadChecksum { stored, computed } => {
            format!("fails its checksum (stored {stored:#010x}, computed {computed:#010x})")
        }
        FormatErrorKind::WrongIdentity { expected, found } => {
            format!("holds {found} where {expected} was expected (misdirected or lost write)")
        }
        FormatErrorKind::Truncated { needed, available } => {
            format!("is truncated ({available} of {needed} bytes)")
        }
        FormatErrorKind::Invalid(what) => format!("is invalid: {what}"),
    };
    match e.location {
        mako_format::error::Location::Memory => format!("{} {what}", e.structure),
        location => format!("{} at {location} {what}", e.structure),
    }
}

/// Found and fixed counts of one kind.
#[derive(Debug, Clone, Default, Serialize)]
pub struct KindCount {
    pub found: u64,
    pub fixed: u64,
}

/// What a run found and did.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub fs_name: String,
    /// "check" (`-n`) or "repair" (`-y`).
    pub mode: String,
    pub threads: usize,
    pub problems: Vec<Problem>,
    /// Per problem kind (by stable name).
    pub counts: BTreeMap<String, KindCount>,
    /// Inode slots read from the inode file.
    pub inodes_scanned: u64,
    /// Inodes in use: files of every type, directories included.
    pub files: u64,
    pub directories: u64,
    pub elapsed_secs: f64,
    /// Files checked per second (`files` / `elapsed_secs`).
    pub files_per_sec: f64,
    /// e2fsck-style exit code of this run.
    pub exit_code: i32,
    /// Online only: inodes in use with no links — files still open (or known to a
    /// kernel) on a live node after their last name went, which POSIX keeps until their
    /// last close. Not a problem while the file system is mounted; offline (every node
    /// down) such an inode is one (`unlinked_inode`).
    pub open_unlinked: Vec<u64>,
    /// Offline check only (`-n`) of a file system of one node: inodes in use with no
    /// links that its recovery log leaves so (the last logged image of each has no
    /// links, and no free of its number is logged): files unlinked while open or known
    /// to the node's kernel when it stopped. Its next mount frees them
    /// (`mako_fs::mount`), so they are listed here, not as `unlinked_inode`.
    pub freed_at_mount: Vec<u64>,
}

impl Report {
    pub fn new(fs_name: &str, repair: bool, threads: usize) -> Report {
        Report {
            fs_name: fs_name.to_string(),
            mode: if repair { "repair" } else { "check" }.to_string(),
            threads,
            problems: Vec::new(),
            counts: BTreeMap::new(),
            inodes_scanned: 0,
            files: 0,
            directories: 0,
            elapsed_secs: 0.0,
            files_per_sec: 0.0,
            exit_code: EXIT_CLEAN,
            open_unlinked: Vec::new(),
            freed_at_mount: Vec::new(),
        }
    }

    /// Fill the counts and the exit code from the problems.
    pub fn finish(&mut self, elapsed: std::time::Duration) {
        self.counts.clear();
        for p in &self.problems {
            let c = self.counts.entry(p.kind.name().to_string()).or_default();
            c.found += 1;
            if p.fixed {
                c.fixed += 1;
            }
        }
        self.elapsed_secs = elapsed.as_secs_f64();
        self.files_per_sec = if self.elapsed_secs > 0.0 {
            self.files as f64 / self.elapsed_secs
        } else {
            0.0
        };
        let mut code = EXIT_CLEAN;
        if self.problems.iter().any(|p| p.fixed) {
            code |= EXIT_CORRECTED;
        }
        if self.problems.iter().any(|p| !p.fixed) {
            code |= EXIT_UNCORRECTED;
        }
        self.exit_code = code;
    }

    pub fn is_clean(&self) -> bool {
        self.problems.is_empty()
    }

    /// Problems of one kind.
    pub fn of_kind(&self, kind: ProblemKind) -> impl Iterator<Item = &Problem> {
        self.problems.iter().filter(move |p| p.kind == kind)
    }

    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self)
            .unwrap_or_else(|e| format!("{{\"error\": \"report not serialisable: {e}\"}}"))
    }

    /// The human summary: every problem (up to `LISTED_PER_KIND_MAX` per kind), the
    /// counts per kind, the time and rate, and the outcome with the exit code.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let repair = self.mode == "repair";
        let _ = writeln!(
            out,
            "mako fsck {}: {} with {} thread{}",
            self.fs_name,
            if repair {
                "check and repair (-y)"
            } else {
                "check only (-n)"
            },
            self.threads,
            if self.threads == 1 { "" } else { "s" }
        );
        if self.problems.is_empty() {
            let _ = writeln!(out, "No problems found.");
        } else {
            let mut listed: BTreeMap<ProblemKind, usize> = BTreeMap::new();
            for p in &self.problems {
                let n = listed.entry(p.kind).or_default();
                *n += 1;
                if *n > LISTED_PER_KIND_MAX {
                    continue;
                }
                let mut line = format!("[{}]", p.kind.name());
                if let Some(ino) = p.ino {
                    let _ = write!(line, " inode {ino}");
                }
                if let Some(path) = &p.path {
                    let _ = write!(line, " ({path})");
                }
                if let Some(loc) = &p.location {
                    let _ = write!(line, " at {loc}");
                }
                let _ = write!(line, ": {}", p.what);
                let status = if p.fixed {
                    format!("fixed: {}", p.repair)
                } else if !p.correctable {
                    format!("NOT fixable by fsck: {}", p.repair)
                } else if repair {
                    format!("NOT fixed: {}", p.repair)
                } else {
                    format!("-y would: {}", p.repair)
                };
                let _ = writeln!(out, "{line}\n    {status}");
            }
            for (kind, n) in &listed {
                if *n > LISTED_PER_KIND_MAX {
                    let _ = writeln!(
                        out,
                        "[{}] … and {} more of this kind",
                        kind.name(),
                        n - LISTED_PER_KIND_MAX
                    );
                }
            }
            let _ = writeln!(
                out,
                "\n{:<22} {:>8} {:>8}",
                "problem kind", "found", "fixed"
            );
            for (name, c) in &self.counts {
                let _ = writeln!(out, "{name:<22} {:>8} {:>8}", c.found, c.fixed);
            }
        }
        if !self.freed_at_mount.is_empty() {
            let _ = writeln!(
                out,
                "\nThe recovery log leaves {} inode(s) in use with no links (unlinked while open or known to the kernel \
                 when the node stopped), which the next mount frees: {:?}",
                self.freed_at_mount.len(),
                self.freed_at_mount
            );
        }
        let _ =
            writeln!(
            out,
            "\nChecked {} inodes in use ({} directories) of {} slots in {:.2} s: {:.0} files/s.",
            self.files, self.directories, self.inodes_scanned, self.elapsed_secs, self.files_per_sec
        );
        let outcome = match self.exit_code {
            EXIT_CLEAN => "clean".to_string(),
            EXIT_CORRECTED => "errors corrected; the file system is consistent".to_string(),
            c if c & EXIT_UNCORRECTED != 0 && !repair => {
                "errors found; run `mako fsck FS -y` to repair (the file system must stay unmounted)".to_string()
            }
            c if c & EXIT_UNCORRECTED != 0 => {
                "errors left uncorrected; see the NOT fixed lines above for what to do".to_string()
            }
            c => format!("exit {c}"),
        };
        let _ = writeln!(out, "Result: {outcome} (exit {}).", self.exit_code);
        out
    }
}
