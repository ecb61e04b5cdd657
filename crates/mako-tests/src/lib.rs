//! Reusable file-system test tools for Mako: a POSIX conformance checker ([`posix`]), an
//! fsx-style randomized model-based exerciser ([`fsx`]) and a crash workload with its checker
//! ([`crashload`]). They work on any directory (a Mako mount point, ext4, tmpfs, ...) and are
//! also available as the `mako-posix`, `mako-fsx` and `mako-crashload` binaries. The
//! real-process harness is [`cluster`] (one node) and [`multinode`] (several nodes of one
//! file system, each with its own FUSE mount); [`skip`] makes a test that cannot run fail
//! unless the run opts out (`MAKO_ALLOW_SKIP=1`).

pub mod cluster;
pub mod crashload;
pub mod fsx;
pub mod multinode;
pub mod netcluster;
pub mod posix;
pub mod skip;
pub mod sys;
pub mod workload;

pub use fsx::{run_fsx, FsxFailure, FsxOptions, FsxStats};
pub use posix::{run_posix_suite, Outcome, Report};

/// Deterministic test data: `len` bytes of an xorshift stream seeded by `seed`.
pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}
