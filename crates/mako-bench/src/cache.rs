//! Dropping caches before read phases, so reads measure the file system, not memory.

use std::path::Path;

use crate::BenchHooks;

/// What happened when we tried to drop caches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CacheDrop {
    /// `sync; echo 3 > /proc/sys/vm/drop_caches` succeeded.
    Dropped,
    /// Not root: the kernel page cache may still hold the data.
    NotRoot,
    /// Root, but writing drop_caches failed (container without the right, …).
    Failed,
    /// The user asked not to (`--no-drop-caches`).
    Skipped,
}

pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// Syncs and drops the kernel caches when root, then runs the caller's hook (Mako's CLI
/// uses it to empty the daemon's pagepool, which the kernel knows nothing about).
pub fn drop_caches(path: &Path, hooks: &BenchHooks, enabled: bool) -> anyhow::Result<CacheDrop> {
    if !enabled {
        return Ok(CacheDrop::Skipped);
    }
    let outcome = if is_root() {
        // SAFETY: sync has no preconditions.
        unsafe { libc::sync() };
        match std::fs::write("/proc/sys/vm/drop_caches", "3\n") {
            Ok(()) => CacheDrop::Dropped,
            Err(e) => {
                eprintln!("warning: cannot write /proc/sys/vm/drop_caches ({e}); reads may be served from the page cache");
                CacheDrop::Failed
            }
        }
    } else {
        CacheDrop::NotRoot
    };
    if let Some(hook) = &hooks.drop_caches {
        hook(path).map_err(|e| e.context(format!("cache-drop hook for {}", path.display())))?;
    }
    Ok(outcome)
}
