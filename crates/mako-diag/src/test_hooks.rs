//! Test-only fault hooks that real-process tests switch on through the environment of
//! `mako up` (makod inherits it). Off unless the variable is set; when off, a hook
//! costs one load of an initialised `OnceLock`.
//!
//! - `MAKO_TEST_DATA_IO_DELAY_MS=<ms>`: every *data* block I/O (not metadata, so
//!   mounting stays fast) sleeps this long inside its disk-I/O wait, so a test can
//!   see a known waiter in `mako diag waiters`. A slow disk, made on purpose.
//! - `MAKO_TEST_PANIC_ON_LOOKUP=<name>`: a lookup of that name panics inside the FUSE
//!   handler, so a test can check what a bug does to a mount (EIO, read-only, no crash).

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
