//! The decoding error: which structure, where it was read from, what was wrong.

use crate::DiskAddress;
use std::fmt;

/// Where a structure's bytes came from, for error messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Location {
    /// A disk address (`disk:sector`, as in iohist).
    Disk(DiskAddress),
    /// Bytes that did not come from a disk address (tests, the descriptor in memory).
    Memory,
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Location::Disk(da) => write!(f, "{da}"),
            Location::Memory => write!(f, "memory"),
        }
    }
}

impl From<DiskAddress> for Location {
    fn from(da: DiskAddress) -> Self {
        Location::Disk(da)
    }
}

/// What was wrong with the bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FormatErrorKind {
    /// The magic number is not the structure's: the block holds something else.
    BadMagic { found: u64 },
    /// Written by a newer Mako than this one.
    UnsupportedVersion { found: u16, supported: u16 },
    /// The bytes changed after they were written (bit rot, torn write).
    BadChecksum { stored: u32, computed: u32 },
    /// A valid structure, but not the one that was asked for (a misdirected or lost write).
    WrongIdentity { expected: String, found: String },
    /// Fewer bytes than the structure needs.
    Truncated { needed: usize, available: usize },
    /// A field holds a value that cannot be right.
    Invalid(String),
}

/// A structure could not be decoded. Never a panic: the caller decides what to do.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct FormatError {
    pub structure: &'static str,
    pub location: Location,
    pub kind: FormatErrorKind,
}

impl FormatError {
    pub fn new(
        structure: &'static str,
        location: impl Into<Location>,
        kind: FormatErrorKind,
    ) -> Self {
        FormatError {
            structure,
            location: location.into(),
            kind,
        }
    }
    pub fn invalid(
        structure: &'static str,
        location: impl Into<Location>,
        what: impl Into<String>,
    ) -> Self {
        Self::new(structure, location, FormatErrorKind::Invalid(what.into()))
    }
    /// Re-label an error with the disk address the bytes came from.
    pub fn at(mut self, location: impl Into<Location>) -> Self {
        self.location = location.into();
        self
    }
    /// True if the bytes are damaged (as opposed to holding a different, valid structure).
    pub fn is_corruption(&self) -> bool {
        !matches!(self.kind, FormatErrorKind::UnsupportedVersion { .. })
    }
}

impl fmt::Display for FormatError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} at {}: ", self.structure, self.location)?;
        match &self.kind {
            FormatErrorKind::BadMagic { found } => write!(f, "bad magic {found:#x} (block does not hold a {})", self.structure),
            FormatErrorKind::UnsupportedVersion { found, supported } => write!(
                f,
                "format version {found} is newer than this Mako supports ({supported}); upgrade Mako"
            ),
            FormatErrorKind::BadChecksum { stored, computed } => write!(
                f,
                "checksum mismatch (stored {stored:#010x}, computed {computed:#010x}); the block is damaged, run `mako fsck`"
            ),
            FormatErrorKind::WrongIdentity { expected, found } => write!(
                f,
                "holds {found} where {expected} was expected (misdirected or lost write); run `mako fsck`"
            ),
            FormatErrorKind::Truncated { needed, available } => {
                write!(f, "truncated: needs {needed} bytes, {available} available")
            }
            FormatErrorKind::Invalid(what) => write!(f, "invalid: {what}"),
        }
    }
}
