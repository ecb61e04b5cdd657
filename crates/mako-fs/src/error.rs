//! The file system's error type. It is converted to an errno in exactly one place
//! ([`FsError::errno`]), called at the FUSE boundary.

use mako_disk::DiskError;
use mako_format::FormatError;

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

/// Damage is noted where it becomes an `FsError` (see `journal::note_damage`): an
/// operation that meets it after changing something must not commit.
impl From<FormatError> for FsError {
    fn from(e: FormatError) -> Self {
        crate::journal::note_damage();
        FsError::Corrupt(e)
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
            FsError::Corrupt(_) | FsError::Disk(_) | FsError::Token(_)
        )
    }
}
