//! Test-only fault hooks that real-process tests switch on through the environment of
//! `mako up` (makod inherits it). Off unless the variable is set; when off, a hook
//! costs one load of an initialised `OnceLock`.
//!
//! - `MAKO_TEST_DATA_IO_DELAY_MS=<ms>`: every *data* block I/O (not metadata, so
//!   mounting stays fast) sleeps this long inside its disk-I/O wait, so a test can
//!   see a known waiter in `mako diag waiters`. A slow disk, made on purpose.
//! - `MAKO_TEST_PANIC_ON_LOOKUP=<name>`: a lookup of that name panics inside the FUSE
//!   handler, so a test can check what a bug does to a mount (EIO, read-only, no crash).
//! - `MAKO_TEST_FIRST_INODE=<number>`: a mount of a file system whose inode limit is
//!   past that number hands out new numbers from its inode-map segment first
//!   (`mako_fs::ownership::allocate_from_segment`), so a test reaches numbers past 2^32.

use std::sync::OnceLock;
use std::time::Duration;

/// The environment variable of [`data_io_delay`].
pub const DATA_IO_DELAY_ENV: &str = "MAKO_TEST_DATA_IO_DELAY_MS";

/// The extra latency of each data block I/O, if a test asked for one.
#[inline]
pub fn data_io_delay() -> Option<Duration> {
    static DELAY: OnceLock<Option<Duration>> = OnceLock::new();
    *DELAY.get_or_init(|| {
        let ms: u64 = std::env::var(DATA_IO_DELAY_ENV).ok()?.trim().parse().ok()?;
        (ms > 0).then(|| Duration::from_millis(ms))
    })
}

/// The environment variable of [`panic_on_lookup`].
pub const PANIC_ON_LOOKUP_ENV: &str = "MAKO_TEST_PANIC_ON_LOOKUP";

/// The name whose lookup must panic, if a test asked for one.
#[inline]
pub fn panic_on_lookup() -> Option<&'static [u8]> {
    static NAME: OnceLock<Option<Vec<u8>>> = OnceLock::new();
    NAME.get_or_init(|| {
        std::env::var(PANIC_ON_LOOKUP_ENV)
            .ok()
            .filter(|n| !n.is_empty())
            .map(String::into_bytes)
    })
    .as_deref()
}

/// The environment variable of [`first_inode`].
pub const FIRST_INODE_ENV: &str = "MAKO_TEST_FIRST_INODE";

/// An inode number a mount hands out new numbers from (its segment's), if a test asked
/// for one: numbers past 2^32 through FUSE without creating 2^32 files first. Ignored
/// by a file system whose inode limit is not past it.
#[inline]
pub fn first_inode() -> Option<u64> {
    static INO: OnceLock<Option<u64>> = OnceLock::new();
    *INO.get_or_init(|| std::env::var(FIRST_INODE_ENV).ok()?.trim().parse().ok())
}
