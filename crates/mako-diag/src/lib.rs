//! mako-diag: what the daemon's threads are blocked on (`mako diag waiters`, after
//! `mmdiag --waiters`) and how often each named lock was taken and waited for
//! (`mako diag counters`, after `mmfsadm dump` lock statistics).
//!
//! Both are process-wide: one daemon, one registry, whatever file systems it mounts.
//! The cost model is the point of this crate:
//!
//! - A lock that is free costs one `try_lock` (which parking_lot's `lock` does first
//!   anyway) plus one relaxed increment on a counter stripe private to the thread.
//! - Only a lock that is *contended* reads the clock, registers a waiter and updates
//!   the wait totals; that thread is about to sleep, so the extra work is hidden.
//! - A `WaitGuard` around a slow operation (disk I/O, sync) pushes one entry on a
//!   per-thread stack behind a mutex nobody else takes except a snapshot: no
//!   allocation and no shared cache line on the fast path.

pub mod lock_stats;
pub mod sched;
pub mod test_hooks;
pub mod waiters;

pub use lock_stats::{CountedMutex, CountedRwLock, LockClass, LockCounters};
pub use sched::Condvar;
pub use waiters::{LockMode, Wait, WaitGuard, Waiter};
