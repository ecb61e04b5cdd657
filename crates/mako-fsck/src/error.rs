//! Why a run could not check or could not finish: operational errors (exit 8) and
//! cancellation (exit 32). Damage itself is never an error here: it is a `Problem`.

use crate::problem::{EXIT_CANCELLED, EXIT_OPERATIONAL};
use mako_disk::DiskError;

#[derive(Debug, thiserror::Error)]
pub enum FsckError {
    /// The file system cannot be checked at all (disks missing, no descriptor
    /// majority, the inode file unreachable). The message says what to do.
    #[error("{0}")]
    Unusable(String),
    /// Structures written by a newer Mako: this fsck must not touch them.
    #[error("{0}")]
    NewerFormat(String),
    /// A mode this build does not have yet.
    #[error("{0}")]
    NotSupported(String),
    /// A disk I/O failed during the repair; the message names the step reached.
    #[error("{what}: {source}")]
    Disk {
        what: String,
        #[source]
        source: DiskError,
    },
    /// The user interrupted the run.
    #[error("{}", cancel_message(*during_repair))]
    Cancelled { during_repair: bool },
}

fn cancel_message(during_repair: bool) -> &'static str {
    if during_repair {
        "cancelled by the user during the repair, between two steps: the file system is \
         consistent enough for another run; run `mako fsck FS -y` again before mounting it"
    } else {
        "cancelled by the user before any change was written"
    }
}

impl FsckError {
    /// The e2fsck exit code of this error.
    pub fn exit_code(&self) -> i32 {
        match self {
            FsckError::Cancelled { .. } => EXIT_CANCELLED,
            _ => EXIT_OPERATIONAL,
        }
    }
}
