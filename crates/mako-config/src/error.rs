//! Typed errors of the configuration layer: unknown names, malformed or out-of-range
//! values, broken relations between parameters, and config file problems.
//!
//! Every message names the parameter (and the file and line where there is one), the
//! value that was given, and what the administrator should do instead.

use std::fmt;
use std::path::PathBuf;

/// Result alias for this crate.
pub type Result<T> = std::result::Result<T, ConfigError>;

/// Which side of a range a refused value fell on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bound {
    /// The value is smaller than the parameter's minimum.
    BelowMinimum,
    /// The value is larger than the parameter's maximum.
    AboveMaximum,
}

impl fmt::Display for Bound {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Bound::BelowMinimum => f.write_str("below the minimum"),
            Bound::AboveMaximum => f.write_str("above the maximum"),
        }
    }
}

/// Renders an optional "did you mean" hint as a message fragment.
pub(crate) struct DidYouMean(pub Option<&'static str>);

impl fmt::Display for DidYouMean {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(name) => write!(f, " (did you mean `{name}`?)"),
            None => Ok(()),
        }
    }
}

/// Everything that can go wrong when naming, parsing, storing or applying a parameter.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// A parameter name that is not in the registry.
    #[error(
        "unknown configuration parameter `{name}`{}; names are case-sensitive, \
         `mako config show` lists every parameter",
        DidYouMean(*suggestion)
    )]
    UnknownParameter {
        /// The name as given.
        name: String,
        /// The closest registered name, if one is close enough to be a likely typo.
        suggestion: Option<&'static str>,
    },

    /// A value that could not be read in the parameter's notation at all.
    #[error("{name}: cannot read `{given}`: {problem}; expected {expected}")]
    WrongForm {
        /// Parameter name.
        name: &'static str,
        /// The text as given (trimmed).
        given: String,
        /// What exactly is wrong with it.
        problem: String,
        /// The accepted form, with an example.
        expected: String,
    },

    /// A well-formed value outside the parameter's allowed range.
    #[error("{name}: {given} is {bound} {limit} (allowed {range})")]
    OutOfRange {
        /// Parameter name.
        name: &'static str,
        /// The text as given (trimmed).
        given: String,
        /// Which limit was crossed.
        bound: Bound,
        /// The crossed limit in the parameter's notation.
        limit: String,
        /// The whole allowed range in the parameter's notation, e.g. `64M..256G`.
        range: String,
    },

    /// A size that must be a multiple of some granule and is not.
    #[error("{name}: {given} is not a multiple of {multiple}; use {suggestion} instead")]
    Misaligned {
        /// Parameter name.
        name: &'static str,
        /// The text as given (trimmed).
        given: String,
        /// The required granule, e.g. `4K`.
        multiple: String,
        /// The nearest acceptable value at or below the given one.
        suggestion: String,
    },

    /// A `NAME=VALUE` assignment (command-line override) without the `=`.
    #[error("cannot read override `{given}`: expected NAME=VALUE, for example pagepool=4G")]
    BadAssignment {
        /// The text as given.
        given: String,
    },

    /// An attempt to change a restart-only parameter in a running daemon.
    #[error(
        "{name} cannot change while the daemon runs; it takes effect at the next \
         `mako down`/`mako up` (set it without -i to store it for the next start)"
    )]
    RestartRequired {
        /// Parameter name.
        name: &'static str,
    },

    /// Two parameters whose values contradict each other.
    #[error("inconsistent configuration: {left} ({left_value}) must be {relation} {right} ({right_value}); {hint}")]
    Relation {
        /// First parameter of the relation.
        left: &'static str,
        /// Its value in the parameter's notation.
        left_value: String,
        /// The relation that must hold, e.g. "at most".
        relation: &'static str,
        /// Second parameter of the relation (or a derived quantity).
        right: String,
        /// Its value in the parameter's notation.
        right_value: String,
        /// What to change to fix it.
        hint: &'static str,
    },

    /// The config file could not be read, written, synced or renamed.
    #[error("cannot {action} config file {}: {cause}; check the path and its permissions", path.display())]
    Io {
        /// What was being done, e.g. "read" or "rename the new".
        action: &'static str,
        /// The file (or directory) concerned.
        path: PathBuf,
        /// The operating system's error.
        cause: std::io::Error,
    },

    /// The config file is not valid TOML.
    #[error("config file {} is not valid TOML: {detail}; fix the file or restore it from a backup", path.display())]
    FileSyntax {
        /// The file.
        path: PathBuf,
        /// The TOML parser's message, with line and column.
        detail: String,
    },

    /// The config file names a parameter that does not exist.
    #[error(
        "{}:{line}: unknown configuration parameter `{key}`{}; fix the name or remove the line",
        path.display(), DidYouMean(*suggestion)
    )]
    FileUnknownKey {
        /// The file.
        path: PathBuf,
        /// 1-based line of the key.
        line: usize,
        /// The key as written.
        key: String,
        /// The closest registered name, if any.
        suggestion: Option<&'static str>,
    },

    /// A key in the config file whose value is a table, array or date instead of a
    /// single number, boolean or string.
    #[error("{}:{line}: `{key}` must be a single value like `{key} = \"...\"`, found {found}", path.display())]
    FileNotScalar {
        /// The file.
        path: PathBuf,
        /// 1-based line of the value.
        line: usize,
        /// The key.
        key: String,
        /// What was found instead ("a table", "an array", ...).
        found: &'static str,
    },

    /// A value in the config file that the parameter refuses.
    #[error("{}:{line}: {error}", path.display())]
    FileValue {
        /// The file.
        path: PathBuf,
        /// 1-based line of the value.
        line: usize,
        /// Why the value was refused.
        error: Box<ConfigError>,
    },
}
