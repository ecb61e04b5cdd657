//! Reusable file-system test tools for Mako: a POSIX conformance checker ([`posix`]), an
//! fsx-style randomized model-based exerciser ([`fsx`]) and a crash workload with its checker
//! ([`crashload`]). They work on any directory (a Mako mount point, ext4, tmpfs, ...) and are
//! also available as the `mako-posix`, `mako-fsx` and `mako-crashload` binaries.

pub mod cluster;
pub mod crashload;
pub mod fsx;
pub mod posix;
pub mod sys;

pub use fsx::{run_fsx, FsxFailure, FsxOptions, FsxStats};
pub use posix::{run_posix_suite, Outcome, Report};
