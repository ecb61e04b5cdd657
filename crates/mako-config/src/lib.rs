//! Mako's typed configuration parameters.
//!
//! - `spec`: the registry `PARAMS` of every parameter (seed names, kinds and ranges,
//!   defaults, scope, immediate or restart, documentation) and name lookup with
//!   "did you mean" suggestions.
//! - `value`: the `Value` type, parsing of the administrator's notation (`4G`, `35s`,
//!   `yes`) with range checks, and printing back in that notation.
//! - `relations`: checks between the values of different parameters.
//! - `store`: `ConfigStore`, the set parameters persisted as a TOML file, saved
//!   atomically.
//! - `effective`: `EffectiveConfig`, every parameter resolved with its source, the
//!   daemon's typed getters, `-i` changes, `mako config show` and `explain`.
//!
//! This crate is a leaf: it depends on no other Mako crate, and its only I/O is the
//! config file of `ConfigStore` (plus reading the machine's memory size for the
//! `pagepool` default).

pub mod effective;
pub mod error;
pub mod relations;
pub mod spec;
pub mod store;
pub mod value;

pub use effective::{AllToAllConnection, EffectiveConfig, Entry, Row, Source};
pub use error::{Bound, ConfigError, Result};
pub use spec::{
    find, lookup, suggest, Apply, DefaultValue, ParamId, ParamKind, ParamSpec, Scope, TimeUnit,
    PARAMS,
};
pub use store::{ConfigStore, SetOutcome};
pub use value::{parse, parse_assignment, parse_for, Value};
