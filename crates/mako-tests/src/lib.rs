//! Reusable file-system test tools for Mako: a POSIX conformance checker ([`posix`]) and an
//! fsx-style randomized model-based exerciser ([`fsx`]). Both work on any directory (a Mako mount
//! point, ext4, tmpfs, ...) and are also available as the `mako-posix` and `mako-fsx` binaries.

pub mod cluster;
pub mod fsx;
pub mod posix;
pub mod sys;

pub use fsx::{run_fsx, FsxFailure, FsxOptions, FsxStats};
pub use posix::{run_posix_suite, Outcome, Report};
