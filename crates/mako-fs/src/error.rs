//! The file system's error type. It is converted to an errno in exactly one place
//! ([`FsError::errno`]), called at the FUSE boundary.
//!
//! Three kinds are damage, never an ordinary outcome (`FsError::is_serious`): a
//! structure that failed its checks when read (`Corrupt`), a disk I/O error (`Disk`),
//! and an internal integrity failure (`Integrity`): a checksum-valid structure that
//! says something impossible (a block pointer outside every disk, a bit freed twice in
//! an allocation map, an inode number past the inode file) or an invariant of the code
//! itself broken (a token request it must never make). An integrity failure is made
//! through `DamageSink::integrity`, which logs it with structure, inode and
//! `disk:sector`, counts it in `corruptions_detected` and turns the mount read-only, so
//! the operation it interrupted never commits. `Invalid` (EINVAL) is kept for a
//! caller's bad argument.

use crate::core::ReadOnly;
use mako_disk::DiskError;
use mako_format::{DiskAddress, FormatError};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

#[derive(Debug, thiserror::Error)]
pub enum FsError {
    #[error("no such file or directory: {0}")]
    NotFound(String),
    #[error("already exists: {0}")]
    Exists(String),
    #[error("not a directory: {0}")]
    NotDir(String),
    #[error("is a directory: {0}")]
    IsDir(String),
    #[error("directory not empty: {0}")]
    NotEmpty(String),
    #[error("name too long ({0} bytes, at most 255)")]
    NameTooLong(usize),
    #[error("invalid argument: {0}")]
    Invalid(String),
    #[error("no space left: {0}")]
    NoSpace(String),
    #[error("no such attribute")]
    NoAttr,
    #[error("buffer too small: need {0} bytes")]
    Range(usize),
    #[error("operation not permitted: {0}")]
    Perm(String),
    #[error("file too large: {0}")]
    TooBig(String),
    #[error("too many links: {0}")]
    TooManyLinks(String),
    #[error("not supported: {0}")]
    NotSupported(String),
    #[error("no data or hole past the end of the file")]
    NoSuchOffset,
    #[error("file system is read-only: {0}")]
    ReadOnly(String),
    #[error("bad metadata: {0}")]
    Corrupt(FormatError),
    #[error("integrity failure: {0}; run `mako fsck -y` on the unmounted file system")]
    Integrity(Box<IntegrityError>),
    #[error(transparent)]
    Disk(DiskError),
    #[error("stale file handle: inode {0}")]
    Stale(u64),
    /// The token protocol failed (a node stopped answering, a revoke failed).
    #[error("cluster coherence: {0}")]
    Token(String),
    /// An operation needs a token this node does not hold: `op::run` acquires it and
    /// restarts the operation. Never reaches a user.
    #[error("operation needs token {0}")]
    NeedToken(crate::coherence::Missing),
    /// A shared writer needs block addresses from the file's metanode: `op::run`
    /// fetches them and restarts the operation. Never reaches a user.
    #[error("inode {ino} needs the address of unit {unit} from its metanode")]
    NeedBlocks { ino: u64, unit: u64 },
}

pub type FsResult<T> = Result<T, FsError>;

/// What an internal integrity failure is about: which structure, of which inode, read
/// from where, and what is impossible about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IntegrityError {
    pub structure: &'static str,
    pub ino: Option<u64>,
    pub da: Option<DiskAddress>,
    pub what: String,
}

impl IntegrityError {
    pub fn new(structure: &'static str, what: impl Into<String>) -> IntegrityError {
        IntegrityError {
            structure,
            ino: None,
            da: None,
            what: what.into(),
        }
    }
    pub fn ino(mut self, ino: u64) -> IntegrityError {
        self.ino = Some(ino);
        self
    }
    pub fn at(mut self, da: DiskAddress) -> IntegrityError {
        self.da = Some(da);
        self
    }
}

impl std::fmt::Display for IntegrityError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.structure)?;
        if let Some(ino) = self.ino {
            write!(f, " of inode {ino}")?;
        }
        if let Some(da) = self.da {
            write!(f, " at {da}")?;
        }
        write!(f, ": {}", self.what)
    }
}

/// Where integrity failures are reported: shared by the core and the structures that
/// can detect one (allocation map, inode map, token seam), which are built before the
/// core and attached to it (`attach`).
#[derive(Clone, Default)]
pub struct DamageSink {
    pub read_only: Arc<ReadOnly>,
    /// `corruptions_detected`: structures that failed validation when read, and
    /// integrity failures.
    pub corruptions: Arc<AtomicU64>,
}

impl DamageSink {
    /// Report an integrity failure and return the error for the caller to pass up:
    /// logged with what, where and which inode, counted, and the mount turned
    /// read-only (the operation in flight, half done, must never commit).
    pub fn integrity(&self, e: IntegrityError) -> FsError {
        tracing::error!(
            structure = e.structure,
            ino = e.ino,
            da = e.da.map(|d| d.to_string()),
            "integrity failure: {e}"
        );
        self.corruptions.fetch_add(1, Ordering::Relaxed);
        self.read_only.set(&format!("integrity failure: {e}"));
        FsError::integrity(e)
    }
}

/// A slot for the damage sink in a structure built before the core.
#[derive(Default)]
pub struct SinkSlot(std::sync::OnceLock<DamageSink>);

impl SinkSlot {
    pub fn attach(&self, sink: DamageSink) {
        let _ = self.0.set(sink);
    }
    /// Report through the attached sink; unattached (file system creation, unit
    /// tests) the error is only returned.
    pub fn integrity(&self, e: IntegrityError) -> FsError {
        match self.0.get() {
            Some(s) => s.integrity(e),
            None => FsError::integrity(e),
        }
    }
}

/// Damage is noted where it becomes an `FsError` (see `journal::note_damage`): an
/// operation that meets it after changing something must not commit.
impl From<FormatError> for FsError {
    fn from(e: FormatError) -> Self {
        crate::journal::note_damage();
        FsError::Corrupt(e)
    }
}
impl FsError {
    /// An integrity failure not reported anywhere (yet): for code with no sink (mount
    /// before the core exists, recovery, mkfs), whose caller fails as a whole. Notes
    /// damage like every other damage error.
    pub fn integrity(e: IntegrityError) -> FsError {
        crate::journal::note_damage();
        FsError::Integrity(Box::new(e))
    }
}

impl From<DiskError> for FsError {
    fn from(e: DiskError) -> Self {
        crate::journal::note_damage();
        FsError::Disk(e)
    }
}

impl FsError {
    /// See `FsError::NeedBlocks`; counts as damage for the journal like `need_token`.
    pub fn need_blocks(ino: u64, unit: u64) -> FsError {
        crate::journal::note_damage();
        FsError::NeedBlocks { ino, unit }
    }

    /// An operation found a token missing. Counts as damage for the journal's check:
    /// an operation that already changed memory must not commit (see `op`).
    pub fn need_token(missing: crate::coherence::Missing) -> FsError {
        crate::journal::note_damage();
        FsError::NeedToken(missing)
    }

    /// The one conversion to errno (used by the FUSE adapter).
    pub fn errno(&self) -> i32 {
        use libc::*;
        match self {
            FsError::NotFound(_) => ENOENT,
            FsError::Exists(_) => EEXIST,
            FsError::NotDir(_) => ENOTDIR,
            FsError::IsDir(_) => EISDIR,
            FsError::NotEmpty(_) => ENOTEMPTY,
            FsError::NameTooLong(_) => ENAMETOOLONG,
            FsError::Invalid(_) => EINVAL,
            FsError::NoSpace(_) => ENOSPC,
            FsError::NoAttr => ENODATA,
            FsError::Range(_) => ERANGE,
            FsError::Perm(_) => EPERM,
            FsError::TooBig(_) => EFBIG,
            FsError::TooManyLinks(_) => EMLINK,
            FsError::NotSupported(_) => EOPNOTSUPP,
            FsError::NoSuchOffset => ENXIO,
            FsError::ReadOnly(_) => EROFS,
            FsError::Corrupt(_) => EIO,
            FsError::Integrity(_) => EIO,
            FsError::Disk(_) => EIO,
            FsError::Stale(_) => ESTALE,
            FsError::Token(_) => EIO,
            // Only escapes `op::run` by a bug.
            FsError::NeedToken(_) => EIO,
            FsError::NeedBlocks { .. } => EIO,
        }
    }
    /// Errors worth a line in the daemon log (damage, I/O), as opposed to ordinary
    /// POSIX outcomes like ENOENT.
    pub fn is_serious(&self) -> bool {
        matches!(
            self,
            FsError::Corrupt(_) | FsError::Integrity(_) | FsError::Disk(_) | FsError::Token(_)
        )
    }
}
