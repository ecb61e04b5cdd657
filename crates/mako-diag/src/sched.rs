//! The seam through which a deterministic simulation (mako-sim) schedules the threads
//! of a process: the lock wrappers, `Condvar` and the blocking points of the daemon
//! ask the scheduler installed on their thread before they block.
//!
//! Outside a simulation nothing is installed and every call here is one relaxed load
//! of a process-wide flag: a daemon pays nothing measurable.
//!
//! Inside a simulation exactly one simulated task runs at a time, and a task gives up
//! the processor only at the points that call into this module. So every wait that
//! can last while another task must run has to come through here: a contended
//! `CountedMutex`/`CountedRwLock`, a `Condvar` wait, a disk I/O or a message (which the
//! simulated disk and network implement with [`sleep`]). A raw `parking_lot` lock that
//! is held across such a point would block the only running thread; the simulation's
//! watchdog reports it as a hang with the task that holds the baton.

use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// What a simulation scheduler offers the threads it runs.
pub trait TaskScheduler: Send + Sync {
    /// A point where the scheduler may switch to another runnable task (for example
    /// before a lock is taken), so that tests see many interleavings.
    fn preempt(&self, at: &'static str);
    /// The current task cannot go on until another task does something (a lock it
    /// wants is held, a condition it waits for is false). Returns when the scheduler
    /// lets it look again; the caller re-checks and may call `block` again.
    fn block(&self, on: &'static str);
    /// Block until `ready()` holds (it holds when this returns). `ready` must be a
    /// pure check that the scheduler may run on another task's thread while this task
    /// is blocked: it calls nothing of this module and takes no lock that a task may
    /// hold across a scheduling point (atomics, or a lock only ever held between two
    /// of them). A scheduler uses it to skip the turns in which this task would only
    /// find the condition still false and block again.
    fn block_until_ready(&self, on: &'static str, ready: &(dyn Fn() -> bool + Sync)) {
        while !ready() {
            self.block(on);
        }
    }
    /// Let simulated time pass for this task (disk latency, a message in flight, a
    /// timer). Other tasks run meanwhile.
    fn sleep(&self, duration: Duration);
    /// Simulated time since the simulation started.
    fn now(&self) -> Duration;
}

/// Set once any thread of the process installs a scheduler: until then every check
/// below is this one load.
static ANY_INSTALLED: AtomicBool = AtomicBool::new(false);

thread_local! {
    static CURRENT: RefCell<Option<Arc<dyn TaskScheduler>>> = const { RefCell::new(None) };
}

/// Run the current thread under `scheduler` (a simulated task's thread calls this
/// first). Returns the scheduler it replaces.
pub fn install(scheduler: Arc<dyn TaskScheduler>) -> Option<Arc<dyn TaskScheduler>> {
    ANY_INSTALLED.store(true, Ordering::Release);
    CURRENT.with(|c| c.borrow_mut().replace(scheduler))
}

/// Stop running the current thread under a scheduler.
pub fn uninstall() -> Option<Arc<dyn TaskScheduler>> {
    CURRENT.with(|c| c.borrow_mut().take())
}

/// The scheduler of the current thread, if it is a simulated task.
#[inline]
pub fn current() -> Option<Arc<dyn TaskScheduler>> {
    if !ANY_INSTALLED.load(Ordering::Relaxed) {
        return None;
    }
    CURRENT.try_with(|c| c.borrow().clone()).ok().flatten()
}

/// True if the current thread is a simulated task.
#[inline]
pub fn active() -> bool {
    ANY_INSTALLED.load(Ordering::Relaxed)
        && CURRENT.try_with(|c| c.borrow().is_some()).unwrap_or(false)
}

/// A preemption point (see [`TaskScheduler::preempt`]); free outside a simulation.
#[inline]
pub fn preempt_point(at: &'static str) {
    if let Some(s) = current() {
        s.preempt(at);
    }
}

/// Let `duration` of simulated time pass; outside a simulation, returns at once
/// (the real world takes its own time).
pub fn sleep(duration: Duration) {
    if let Some(s) = current() {
        s.sleep(duration);
    }
}

/// Wait until `ready()` holds: under a simulation by blocking the task between
/// checks, otherwise by the caller's own means (returns false at once so the caller
/// falls back to a real wait). Returns true when `ready()` held.
pub fn block_until(on: &'static str, mut ready: impl FnMut() -> bool) -> bool {
    let Some(s) = current() else {
        return false;
    };
    while !ready() {
        s.block(on);
    }
    true
}

/// As [`block_until`] for a pure check (see [`TaskScheduler::block_until_ready`]):
/// under a simulation the scheduler does not wake the task until `ready()` holds.
pub fn wait_until(on: &'static str, ready: impl Fn() -> bool + Sync) -> bool {
    let Some(s) = current() else {
        return false;
    };
    s.block_until_ready(on, &ready);
    true
}

/// A condition variable that works both in the daemon (parking_lot's) and under a
/// simulation (a notification generation the blocked task re-checks).
#[derive(Default)]
pub struct Condvar {
    inner: parking_lot::Condvar,
    generation: AtomicU64,
}

impl Condvar {
    pub const fn new() -> Condvar {
        Condvar {
            inner: parking_lot::Condvar::new(),
            generation: AtomicU64::new(0),
        }
    }

    pub fn notify_one(&self) -> bool {
        self.generation.fetch_add(1, Ordering::AcqRel);
        self.inner.notify_one()
    }

    pub fn notify_all(&self) -> usize {
        self.generation.fetch_add(1, Ordering::AcqRel);
        self.inner.notify_all()
    }

    /// Release the guard's mutex, wait for a notification (or a spurious wakeup, as
    /// with every condition variable: callers re-check their condition), re-lock.
    pub fn wait<T: ?Sized>(&self, guard: &mut parking_lot::MutexGuard<'_, T>) {
        let Some(s) = current() else {
            self.inner.wait(guard);
            return;
        };
        let seen = self.generation.load(Ordering::Acquire);
        relock_after(guard, || {
            s.block_until_ready("condition variable", &|| {
                self.generation.load(Ordering::Acquire) != seen
            });
        });
    }

    /// As `wait`, giving up after `timeout` (real time in the daemon, simulated time
    /// in a simulation). Returns true if it timed out.
    pub fn wait_for<T: ?Sized>(
        &self,
        guard: &mut parking_lot::MutexGuard<'_, T>,
        timeout: Duration,
    ) -> bool {
        let Some(s) = current() else {
            return self.inner.wait_for(guard, timeout).timed_out();
        };
        let seen = self.generation.load(Ordering::Acquire);
        let deadline = s.now() + timeout;
        let mut timed_out = false;
        relock_after(guard, || loop {
            if self.generation.load(Ordering::Acquire) != seen {
                break;
            }
            let now = s.now();
            if now >= deadline {
                timed_out = true;
                break;
            }
            // Sleep in small steps so a notification is seen soon after it comes.
            s.sleep((deadline - now).min(Duration::from_millis(1)));
        });
        timed_out
    }
}

/// Unlock `guard`'s mutex, run `f`, and lock it again through the scheduler (a
/// contended re-lock blocks the task, never the thread).
fn relock_after<T: ?Sized>(guard: &mut parking_lot::MutexGuard<'_, T>, f: impl FnOnce()) {
    let mutex: &parking_lot::Mutex<T> = parking_lot::MutexGuard::mutex(guard);
    // SAFETY: the guard is moved out and dropped (unlocking the mutex), and a new guard
    // for the same mutex is written back before `guard` is used again. Nothing between
    // the read and the write can unwind except `f` and the scheduler calls, and those
    // run while the slot holds no live guard only if they panic — in which case the
    // process is a failed simulation and the write below is skipped; to stay sound we
    // abort instead of unwinding through the moved-out slot.
    unsafe {
        let old = std::ptr::read(guard);
        drop(old);
        let abort_on_unwind = AbortOnUnwind;
        f();
        let new = loop {
            if let Some(g) = mutex.try_lock() {
                break g;
            }
            block_or_lock_blocking(mutex);
        };
        std::mem::forget(abort_on_unwind);
        std::ptr::write(guard, new);
    }
}

fn block_or_lock_blocking<T: ?Sized>(_mutex: &parking_lot::Mutex<T>) {
    if let Some(s) = current() {
        s.block("mutex (re-lock after condition variable)");
    }
}

/// Aborts the process if dropped during unwinding (see `relock_after`).
struct AbortOnUnwind;

impl Drop for AbortOnUnwind {
    fn drop(&mut self) {
        eprintln!("a simulated task panicked while waiting on a condition variable");
        std::process::abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outside_a_simulation_nothing_is_installed() {
        assert!(!active());
        assert!(current().is_none());
        preempt_point("test");
        assert!(!block_until("test", || false));
    }

    #[test]
    fn condvar_works_without_a_scheduler() {
        let pair = Arc::new((parking_lot::Mutex::new(false), Condvar::new()));
        let p2 = pair.clone();
        let t = std::thread::spawn(move || {
            *p2.0.lock() = true;
            p2.1.notify_all();
        });
        let mut g = pair.0.lock();
        while !*g {
            pair.1.wait(&mut g);
        }
        drop(g);
        t.join().expect("notifier");
        let mut g = pair.0.lock();
        assert!(pair.1.wait_for(&mut g, Duration::from_millis(1)));
    }
}
