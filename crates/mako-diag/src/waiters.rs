//! The registry of current waits: every thread that is blocked on a lock, a disk I/O,
//! a sync or the pagepool, since when and on what (`mako diag waiters`).
//!
//! Each thread owns a small stack of its current waits (waits nest: a writer waiting
//! for pagepool room may then block on a lock). The stack lives behind a mutex that
//! only its thread and a snapshot ever take, so registering a wait costs an
//! uncontended lock, a clock read and a push into a vector that keeps its capacity.
//! The description is a plain enum (`Wait`) formatted only when a snapshot asks, so
//! the fast path never builds a string.

use parking_lot::Mutex;
use std::cell::OnceCell;
use std::fmt;
use std::marker::PhantomData;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

/// How a lock was requested.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LockMode {
    Exclusive,
    Shared,
}

/// What a thread waits for. Cheap to build: no allocation except `Text`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Wait {
    /// A contended lock of a named class (see `lock_stats`).
    Lock { name: &'static str, mode: LockMode },
    /// A block read or write on `disk:sector` (the iohist notation).
    DiskIo {
        write: bool,
        buffer_type: &'static str,
        disk: u32,
        sector: u64,
        sectors: u64,
        ino: u64,
    },
    /// A durability barrier (fsync) on every disk.
    DiskSync,
    /// A fixed description, e.g. "waiting for write-behind to free pagepool".
    Static(&'static str),
    /// A description built by the caller (allocates: keep it off hot paths).
    Text(String),
}

impl fmt::Display for Wait {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Wait::Lock { name, mode } => {
                let mode = match mode {
                    LockMode::Exclusive => "exclusive",
                    LockMode::Shared => "shared",
                };
                write!(f, "lock {name} ({mode})")
            }
            Wait::DiskIo {
                write,
                buffer_type,
                disk,
                sector,
                sectors,
                ino,
            } => {
                let rw = if *write { "write" } else { "read" };
                write!(
                    f,
                    "disk I/O {rw} {buffer_type} {disk}:{sector} {sectors} sectors"
                )?;
                if *ino != 0 {
                    write!(f, " inode {ino}")?;
                }
                Ok(())
            }
            Wait::DiskSync => f.write_str("disk sync (fsync of every disk)"),
            Wait::Static(s) => f.write_str(s),
            Wait::Text(s) => f.write_str(s),
        }
    }
}

/// One blocked thread in a snapshot.
#[derive(Debug, Clone, PartialEq)]
pub struct Waiter {
    pub thread: String,
    pub waiting: Duration,
    pub what: String,
}

struct ThreadWaits {
    name: String,
    /// Current waits, outermost first.
    stack: Mutex<Vec<(Instant, Wait)>>,
}

/// Every thread that ever registered a wait and still runs. Threads that exited leave
/// a dead `Weak`, pruned when the next thread registers or a snapshot runs.
static THREADS: Mutex<Vec<Weak<ThreadWaits>>> = Mutex::new(Vec::new());

thread_local! {
    static ME: OnceCell<Arc<ThreadWaits>> = const { OnceCell::new() };
}

fn register_thread() -> Arc<ThreadWaits> {
    let current = std::thread::current();
    let name = match current.name() {
        Some(n) => n.to_string(),
        None => format!("{:?}", current.id()),
    };
    let me = Arc::new(ThreadWaits {
        name,
        stack: Mutex::new(Vec::with_capacity(4)),
    });
    let mut all = THREADS.lock();
    all.retain(|w| w.strong_count() > 0);
    all.push(Arc::downgrade(&me));
    me
}

fn with_me<R>(f: impl FnOnce(&ThreadWaits) -> R) -> Option<R> {
    ME.try_with(|cell| f(cell.get_or_init(register_thread)))
        .ok()
}

/// Registers `what` as a wait of the current thread until dropped. Not `Send`: it
/// belongs to the thread's own stack.
#[must_use = "the wait ends when the guard is dropped"]
pub struct WaitGuard {
    registered: bool,
    _not_send: PhantomData<*const ()>,
}

impl WaitGuard {
    pub fn new(what: Wait) -> WaitGuard {
        let registered = with_me(|t| t.stack.lock().push((Instant::now(), what))).is_some();
        WaitGuard {
            registered,
            _not_send: PhantomData,
        }
    }
}

impl Drop for WaitGuard {
    fn drop(&mut self) {
        if self.registered {
            with_me(|t| t.stack.lock().pop());
        }
    }
}

/// Threads waiting at least `threshold` (zero: every current wait), longest first.
/// A thread with nested waits is listed once, for its outermost (longest) wait, with
/// the innermost one named after it.
pub fn snapshot(threshold: Duration) -> Vec<Waiter> {
    let now = Instant::now();
    let threads: Vec<Arc<ThreadWaits>> = {
        let mut all = THREADS.lock();
        all.retain(|w| w.strong_count() > 0);
        all.iter().filter_map(Weak::upgrade).collect()
    };
    let mut out = Vec::new();
    for t in threads {
        let stack = t.stack.lock();
        let Some((start, outer)) = stack.first() else {
            continue;
        };
        let waiting = now.saturating_duration_since(*start);
        if waiting < threshold {
            continue;
        }
        let mut what = outer.to_string();
        if let Some((inner_start, inner)) = stack.last().filter(|_| stack.len() > 1) {
            let inner_ms = now.saturating_duration_since(*inner_start).as_secs_f64() * 1000.0;
            what.push_str(&format!("; now {inner} for {inner_ms:.1} ms"));
        }
        out.push(Waiter {
            thread: t.name.clone(),
            waiting,
            what,
        });
    }
    out.sort_by_key(|w| std::cmp::Reverse(w.waiting));
    out
}

/// Number of threads waiting now and the longest current wait (for metrics).
pub fn summary() -> (usize, Duration) {
    let all = snapshot(Duration::ZERO);
    (
        all.len(),
        all.first().map(|w| w.waiting).unwrap_or_default(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;

    #[test]
    fn a_blocked_thread_is_listed_with_what_and_since_when() {
        let (tx, rx) = mpsc::channel();
        let (done_tx, done_rx) = mpsc::channel::<()>();
        let t = std::thread::Builder::new()
            .name("diag-test-blocked".into())
            .spawn(move || {
                let _g = WaitGuard::new(Wait::DiskIo {
                    write: true,
                    buffer_type: "data",
                    disk: 2,
                    sector: 8192,
                    sectors: 64,
                    ino: 7,
                });
                tx.send(()).unwrap();
                done_rx.recv().unwrap();
            })
            .unwrap();
        rx.recv().unwrap();
        // The wait is registered; it shows above a 50 ms threshold once it is that old.
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        let w: Vec<Waiter> = loop {
            let w: Vec<Waiter> = snapshot(Duration::from_millis(50))
                .into_iter()
                .filter(|w| w.thread == "diag-test-blocked")
                .collect();
            if !w.is_empty() {
                break w;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the blocked thread never showed above the threshold"
            );
            std::thread::sleep(Duration::from_millis(1)); // poll
        };
        assert_eq!(w.len(), 1, "{w:?}");
        assert_eq!(w[0].what, "disk I/O write data 2:8192 64 sectors inode 7");
        assert!(
            w[0].waiting >= Duration::from_millis(50),
            "listed below the threshold: {:?}",
            w[0].waiting
        );
        assert!(w[0].waiting < Duration::from_secs(30));
        // A threshold above the wait hides it.
        assert!(snapshot(Duration::from_secs(60))
            .iter()
            .all(|w| w.thread != "diag-test-blocked"));
        done_tx.send(()).unwrap();
        t.join().unwrap();
        // The guard is gone with the wait, and the exited thread with its registration.
        assert!(snapshot(Duration::ZERO)
            .iter()
            .all(|w| w.thread != "diag-test-blocked"));
    }

    #[test]
    fn nested_waits_name_outer_and_inner() {
        let _outer = WaitGuard::new(Wait::Static("waiting for write-behind to free pagepool"));
        let me = std::thread::current().name().unwrap().to_string();
        {
            let _inner = WaitGuard::new(Wait::Lock {
                name: "buffer",
                mode: LockMode::Exclusive,
            });
            let w: Vec<Waiter> = snapshot(Duration::ZERO)
                .into_iter()
                .filter(|w| w.thread == me)
                .collect();
            assert_eq!(w.len(), 1);
            assert!(
                w[0].what.starts_with(
                    "waiting for write-behind to free pagepool; now lock buffer (exclusive) for "
                ),
                "{}",
                w[0].what
            );
        }
        let w: Vec<Waiter> = snapshot(Duration::ZERO)
            .into_iter()
            .filter(|w| w.thread == me)
            .collect();
        assert_eq!(w[0].what, "waiting for write-behind to free pagepool");
    }
}
