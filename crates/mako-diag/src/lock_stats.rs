//! Per-lock-class contention counters (`mako diag counters`) and the lock wrappers
//! that keep them: `CountedMutex` and `CountedRwLock` around parking_lot.
//!
//! A lock class is a `static LockClass` named after what it protects ("inode",
//! "buffer", "alloc.region", …); every lock of the class adds to the same counters.
//! The wrappers return parking_lot's own guards, so `Condvar::wait` and code that
//! names `MutexGuard`/`RwLockWriteGuard` keep working unchanged.
//!
//! Under a deterministic simulation (`sched`), every acquisition is a preemption point
//! and a contended lock blocks the simulated task instead of the thread.
//!
//! Cost: an acquisition that finds the lock free is one relaxed load (no simulation
//! running in this process), one `try_lock` plus one relaxed
//! increment on a stripe of the class's counter chosen per thread, so threads that
//! take different locks of one class do not bounce one cache line between cores.
//! Only a failed `try_lock` reads the clock, registers a waiter (`waiters.rs`) and
//! adds to the contended count, the total wait and the maximum wait.

use crate::waiters::{LockMode, Wait, WaitGuard};
use parking_lot::{Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Instant;

/// Counter stripes per class; a power of two, at least the cores we expect to share
/// a class's counters at once.
const STRIPES: usize = 16;
const _: () = assert!(STRIPES.is_power_of_two());

#[repr(align(64))]
struct Stripe {
    acquisitions: AtomicU64,
}

impl Stripe {
    const fn new() -> Stripe {
        Stripe {
            acquisitions: AtomicU64::new(0),
        }
    }
}

/// A named class of locks and its counters. Declare one per lock kind as a `static`.
pub struct LockClass {
    name: &'static str,
    registered: AtomicBool,
    stripes: [Stripe; STRIPES],
    contended: AtomicU64,
    wait_total_ns: AtomicU64,
    wait_max_ns: AtomicU64,
}

/// The counters of one lock class at one moment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LockCounters {
    pub name: &'static str,
    pub acquisitions: u64,
    pub contended: u64,
    pub wait_total_ns: u64,
    pub wait_max_ns: u64,
}

/// Every class that has had a lock constructed, in order of first use.
static CLASSES: Mutex<Vec<&'static LockClass>> = Mutex::new(Vec::new());

static NEXT_STRIPE: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    static STRIPE: usize = NEXT_STRIPE.fetch_add(1, Ordering::Relaxed) & (STRIPES - 1);
}

impl LockClass {
    pub const fn new(name: &'static str) -> LockClass {
        LockClass {
            name,
            registered: AtomicBool::new(false),
            stripes: [const { Stripe::new() }; STRIPES],
            contended: AtomicU64::new(0),
            wait_total_ns: AtomicU64::new(0),
            wait_max_ns: AtomicU64::new(0),
        }
    }

    pub fn name(&self) -> &'static str {
        self.name
    }

    /// Makes the class visible to `snapshot` (once; cheap afterwards).
    pub fn register(&'static self) {
        if self.registered.load(Ordering::Acquire) {
            return;
        }
        let mut all = CLASSES.lock();
        if !self.registered.load(Ordering::Relaxed) {
            all.push(self);
            self.registered.store(true, Ordering::Release);
        }
    }

    #[inline]
    fn acquired(&self) {
        let i = STRIPE.try_with(|s| *s).unwrap_or(0);
        self.stripes[i].acquisitions.fetch_add(1, Ordering::Relaxed);
    }

    #[cold]
    fn waited(&self, start: Instant) {
        let ns = u64::try_from(start.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.acquired();
        self.contended.fetch_add(1, Ordering::Relaxed);
        self.wait_total_ns.fetch_add(ns, Ordering::Relaxed);
        self.wait_max_ns.fetch_max(ns, Ordering::Relaxed);
    }

    pub fn counters(&self) -> LockCounters {
        LockCounters {
            name: self.name,
            acquisitions: self
                .stripes
                .iter()
                .map(|s| s.acquisitions.load(Ordering::Relaxed))
                .sum(),
            contended: self.contended.load(Ordering::Relaxed),
            wait_total_ns: self.wait_total_ns.load(Ordering::Relaxed),
            wait_max_ns: self.wait_max_ns.load(Ordering::Relaxed),
        }
    }
}

/// Counters of every registered lock class, sorted by name.
pub fn snapshot() -> Vec<LockCounters> {
    let mut v: Vec<LockCounters> = CLASSES.lock().iter().map(|c| c.counters()).collect();
    v.sort_by(|a, b| a.name.cmp(b.name));
    v
}

/// A parking_lot `Mutex` that counts its acquisitions and contended waits under a class.
pub struct CountedMutex<T: ?Sized> {
    class: &'static LockClass,
    inner: Mutex<T>,
}

impl<T> CountedMutex<T> {
    pub fn new(class: &'static LockClass, value: T) -> CountedMutex<T> {
        class.register();
        CountedMutex {
            class,
            inner: Mutex::new(value),
        }
    }
    pub fn into_inner(self) -> T {
        self.inner.into_inner()
    }
}

impl<T: ?Sized> CountedMutex<T> {
    #[inline]
    pub fn lock(&self) -> MutexGuard<'_, T> {
        if let Some(s) = crate::sched::current() {
            return self.lock_simulated(&*s);
        }
        match self.inner.try_lock() {
            Some(g) => {
                self.class.acquired();
                g
            }
            None => self.lock_contended(),
        }
    }

    #[cold]
    #[inline(never)]
    fn lock_contended(&self) -> MutexGuard<'_, T> {
        let _wait = WaitGuard::new(Wait::Lock {
            name: self.class.name,
            mode: LockMode::Exclusive,
        });
        let start = Instant::now();
        let g = self.inner.lock();
        self.class.waited(start);
        g
    }

    /// Under a simulation: a preemption point, then a lock whose contention blocks
    /// the task (never the thread, which the other tasks need).
    #[cold]
    fn lock_simulated(&self, s: &dyn crate::sched::TaskScheduler) -> MutexGuard<'_, T> {
        s.preempt(self.class.name);
        loop {
            if let Some(g) = self.inner.try_lock() {
                self.class.acquired();
                return g;
            }
            s.block(self.class.name);
        }
    }

    /// Never blocks; a failed attempt is not counted.
    #[inline]
    pub fn try_lock(&self) -> Option<MutexGuard<'_, T>> {
        let g = self.inner.try_lock();
        if g.is_some() {
            self.class.acquired();
        }
        g
    }

    pub fn get_mut(&mut self) -> &mut T {
        self.inner.get_mut()
    }

    pub fn class(&self) -> &'static LockClass {
        self.class
    }
}

impl<T: ?Sized + std::fmt::Debug> std::fmt::Debug for CountedMutex<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CountedMutex")
            .field("class", &self.class.name)
            .field("inner", &&self.inner)
            .finish()
    }
}

/// A parking_lot `RwLock` that counts its acquisitions and contended waits under a class.
pub struct CountedRwLock<T: ?Sized> {
    class: &'static LockClass,
    inner: RwLock<T>,
}

impl<T> CountedRwLock<T> {
    pub fn new(class: &'static LockClass, value: T) -> CountedRwLock<T> {
        class.register();
        CountedRwLock {
            class,
            inner: RwLock::new(value),
        }
    }
    pub fn into_inner(self) -> T {
        self.inner.into_inner()
    }
}

impl<T: ?Sized> CountedRwLock<T> {
    #[inline]
    pub fn read(&self) -> RwLockReadGuard<'_, T> {
        if let Some(s) = crate::sched::current() {
            s.preempt(self.class.name);
            loop {
                if let Some(g) = self.inner.try_read() {
                    self.class.acquired();
                    return g;
                }
                s.block(self.class.name);
            }
        }
        match self.inner.try_read() {
            Some(g) => {
                self.class.acquired();
                g
            }
            None => self.read_contended(),
        }
    }

    #[inline]
    pub fn write(&self) -> RwLockWriteGuard<'_, T> {
        if let Some(s) = crate::sched::current() {
            s.preempt(self.class.name);
            loop {
                if let Some(g) = self.inner.try_write() {
                    self.class.acquired();
                    return g;
                }
                s.block(self.class.name);
            }
        }
        match self.inner.try_write() {
            Some(g) => {
                self.class.acquired();
                g
            }
            None => self.write_contended(),
        }
    }

    #[cold]
    #[inline(never)]
    fn read_contended(&self) -> RwLockReadGuard<'_, T> {
        let _wait = WaitGuard::new(Wait::Lock {
            name: self.class.name,
            mode: LockMode::Shared,
        });
        let start = Instant::now();
        let g = self.inner.read();
        self.class.waited(start);
        g
    }

    #[cold]
    #[inline(never)]
    fn write_contended(&self) -> RwLockWriteGuard<'_, T> {
        let _wait = WaitGuard::new(Wait::Lock {
            name: self.class.name,
            mode: LockMode::Exclusive,
        });
        let start = Instant::now();
        let g = self.inner.write();
        self.class.waited(start);
        g
    }

    #[inline]
    pub fn try_read(&self) -> Option<RwLockReadGuard<'_, T>> {
        let g = self.inner.try_read();
        if g.is_some() {
            self.class.acquired();
        }
        g
    }

    #[inline]
    pub fn try_write(&self) -> Option<RwLockWriteGuard<'_, T>> {
        let g = self.inner.try_write();
        if g.is_some() {
            self.class.acquired();
        }
        g
    }

    pub fn get_mut(&mut self) -> &mut T {
        self.inner.get_mut()
    }

    pub fn class(&self) -> &'static LockClass {
        self.class
    }
}

impl<T: ?Sized + std::fmt::Debug> std::fmt::Debug for CountedRwLock<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CountedRwLock")
            .field("class", &self.class.name)
            .field("inner", &&self.inner)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::waiters;
    use std::sync::Arc;
    use std::time::Duration;

    static TEST_UNCONTENDED: LockClass = LockClass::new("test.uncontended");
    static TEST_CONTENDED: LockClass = LockClass::new("test.contended");
    static TEST_RW: LockClass = LockClass::new("test.rw");

    fn counters(name: &str) -> LockCounters {
        snapshot()
            .into_iter()
            .find(|c| c.name == name)
            .unwrap_or_else(|| panic!("{name} not registered"))
    }

    #[test]
    fn acquisitions_count_exactly_and_free_locks_never_wait() {
        let m = CountedMutex::new(&TEST_UNCONTENDED, 0u64);
        for _ in 0..1000 {
            *m.lock() += 1;
        }
        assert!(m.try_lock().is_some());
        let c = counters("test.uncontended");
        assert_eq!(c.acquisitions, 1001);
        assert_eq!(c.contended, 0);
        assert_eq!(c.wait_total_ns, 0);
        assert_eq!(*m.lock(), 1000);
    }

    #[test]
    fn a_contended_lock_counts_its_wait_and_shows_a_waiter() {
        let m = Arc::new(CountedMutex::new(&TEST_CONTENDED, ()));
        let held = m.lock();
        let m2 = m.clone();
        let t = std::thread::Builder::new()
            .name("diag-test-lock-waiter".into())
            .spawn(move || {
                drop(m2.lock());
            })
            .unwrap();
        // Wait until the other thread is registered as blocked on the lock.
        let deadline = Instant::now() + Duration::from_secs(10);
        let w = loop {
            let w: Vec<_> = waiters::snapshot(Duration::ZERO)
                .into_iter()
                .filter(|w| w.thread == "diag-test-lock-waiter")
                .collect();
            if !w.is_empty() {
                break w;
            }
            assert!(
                Instant::now() < deadline,
                "the blocked thread never showed as a waiter"
            );
            std::thread::sleep(Duration::from_millis(1)); // poll
        };
        assert_eq!(w[0].what, "lock test.contended (exclusive)");
        // The waiter is blocked (it is listed): release it. Its wait is timed from just
        // after it registered to its wake-up, so it is positive, however short.
        drop(held);
        t.join().unwrap();
        let c = counters("test.contended");
        assert_eq!(c.acquisitions, 2);
        assert_eq!(c.contended, 1);
        assert!(c.wait_max_ns > 0, "{c:?}");
        assert_eq!(c.wait_total_ns, c.wait_max_ns);
    }

    #[test]
    fn rwlock_readers_share_and_writer_waits() {
        let l = Arc::new(CountedRwLock::new(&TEST_RW, 5u32));
        let r1 = l.read();
        let r2 = l.read();
        assert_eq!(*r1 + *r2, 10);
        let l2 = l.clone();
        let t = std::thread::Builder::new()
            .name("diag-test-rw-writer".into())
            .spawn(move || *l2.write() = 6)
            .unwrap();
        // Release the readers only once the writer is blocked on them (listed as a
        // waiter), so that its write is certainly contended.
        let deadline = Instant::now() + Duration::from_secs(10);
        while !waiters::snapshot(Duration::ZERO)
            .iter()
            .any(|w| w.thread == "diag-test-rw-writer" && w.what == "lock test.rw (exclusive)")
        {
            assert!(
                Instant::now() < deadline,
                "the writer never showed as a waiter"
            );
            std::thread::sleep(Duration::from_millis(1)); // poll
        }
        drop((r1, r2));
        t.join().unwrap();
        assert_eq!(*l.read(), 6);
        let c = counters("test.rw");
        assert_eq!(c.acquisitions, 4);
        assert_eq!(c.contended, 1);
        assert!(c.wait_max_ns > 0, "{c:?}");
    }

    /// The cost of counting, uncontended: `cargo test --release -p mako-diag -- --ignored --nocapture`.
    #[test]
    #[ignore]
    fn measure_uncontended_overhead() {
        static BENCH: LockClass = LockClass::new("test.bench");
        const N: u32 = 20_000_000;
        for threads in [1usize, 2] {
            let plain: Vec<Arc<parking_lot::Mutex<u64>>> = (0..threads)
                .map(|_| Arc::new(parking_lot::Mutex::new(0)))
                .collect();
            let counted: Vec<Arc<CountedMutex<u64>>> = (0..threads)
                .map(|_| Arc::new(CountedMutex::new(&BENCH, 0)))
                .collect();
            let run = |f: &(dyn Fn(usize) + Sync)| {
                let t = Instant::now();
                std::thread::scope(|s| {
                    for i in 0..threads {
                        s.spawn(move || f(i));
                    }
                });
                t.elapsed().as_nanos() as f64 / N as f64
            };
            let p = run(&|i| {
                for _ in 0..N {
                    *plain[i].lock() += 1;
                }
            });
            let c = run(&|i| {
                for _ in 0..N {
                    *counted[i].lock() += 1;
                }
            });
            println!("{threads} thread(s), one lock each, one class: parking_lot {p:.2} ns/lock, CountedMutex {c:.2} ns/lock");
        }
    }

    #[test]
    fn guards_work_with_condvar() {
        static TEST_CV: LockClass = LockClass::new("test.condvar");
        let pair = Arc::new((
            CountedMutex::new(&TEST_CV, false),
            parking_lot::Condvar::new(),
        ));
        let p2 = pair.clone();
        let t = std::thread::spawn(move || {
            *p2.0.lock() = true;
            p2.1.notify_all();
        });
        let mut g = pair.0.lock();
        while !*g {
            pair.1.wait_for(&mut g, Duration::from_millis(10));
        }
        drop(g);
        t.join().unwrap();
    }
}
