//! The simulated disk: an in-memory `mako_disk::Disk` whose reads, writes and syncs
//! take seeded simulated time. One `SimDisk` is shared by every node of a simulated
//! cluster (each node builds its own `LocalNsd` over the same `Arc`s), as the nodes of
//! a real cluster share their disks over a SAN.
//!
//! An I/O happens at the end of its latency: a read returns what the disk holds at
//! that moment, a write becomes visible to every node then. Writes are durable at
//! once (this disk never loses a write; crashes are `CrashDisk`'s business). Outside
//! a simulated task (formatting before the run, fsck after it) an I/O takes no time.

use crate::rng::SimRng;
use mako_disk::{Disk, DiskError};
use parking_lot::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// The bytes of a simulated disk, in memory mapped for it alone (`mmap`): the kernel
/// zeroes a page when it is first touched, so the untouched space of a disk costs
/// nothing. A `Vec` of zeroes was 15% of a cheap fault seed's time: the allocator
/// reuses freed memory and clears it whole (measured with `perf`, `tests/faults.rs`).
pub struct Pages {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: `Pages` owns its mapping exclusively, like a `Box<[u8]>`.
unsafe impl Send for Pages {}
// SAFETY: shared access is read-only (`Deref`); writes need `&mut` (`DerefMut`).
unsafe impl Sync for Pages {}

impl Pages {
    pub fn zeroed(len: usize) -> Pages {
        if len == 0 {
            return Pages {
                ptr: std::ptr::NonNull::dangling().as_ptr(),
                len,
            };
        }
        // SAFETY: a fresh private anonymous mapping; checked for failure below.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert!(
            ptr != libc::MAP_FAILED,
            "mapping {len} bytes for a simulated disk failed: {}",
            std::io::Error::last_os_error()
        );
        Pages {
            ptr: ptr as *mut u8,
            len,
        }
    }
}

impl std::ops::Deref for Pages {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: `ptr` maps `len` bytes (or is dangling with `len` 0) for as long as
        // `self` lives.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

impl std::ops::DerefMut for Pages {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as `deref`, and `&mut self` is the only access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl Clone for Pages {
    fn clone(&self) -> Pages {
        let mut copy = Pages::zeroed(self.len);
        copy.copy_from_slice(self);
        copy
    }
}

impl Drop for Pages {
    fn drop(&mut self) {
        if self.len > 0 {
            // SAFETY: the mapping made in `zeroed`, unmapped once.
            unsafe {
                libc::munmap(self.ptr as *mut libc::c_void, self.len);
            }
        }
    }
}

/// Latency of each kind of I/O, drawn uniformly per I/O; with probability
/// `spike_probability` an I/O is slow instead (up to `spike_max`: a busy disk, a
/// remapped sector), so that other tasks run far ahead of it.
#[derive(Clone, Copy, Debug)]
pub struct DiskLatency {
    pub read: (Duration, Duration),
    pub write: (Duration, Duration),
    pub sync: (Duration, Duration),
    pub spike_probability: f64,
    pub spike_max: Duration,
}

impl Default for DiskLatency {
    fn default() -> Self {
        DiskLatency {
            read: (Duration::from_micros(20), Duration::from_micros(200)),
            write: (Duration::from_micros(20), Duration::from_micros(300)),
            sync: (Duration::from_micros(50), Duration::from_micros(500)),
            spike_probability: 0.02,
            spike_max: Duration::from_millis(5),
        }
    }
}

/// I/O counters of one disk.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SimDiskStats {
    pub reads: u64,
    pub writes: u64,
    pub syncs: u64,
    pub read_bytes: u64,
    pub write_bytes: u64,
}

pub struct SimDisk {
    name: String,
    size_bytes: u64,
    latency: DiskLatency,
    rng: Mutex<SimRng>,
    /// The disk's bytes. Never held across a scheduling point (the latency is spent
    /// before the lock is taken), so one task's I/O cannot block another's thread.
    /// Shared with `image`s taken of it: a write copies them first if one is alive
    /// (none is, in a seed: the end-of-seed replay drops its images before anything
    /// is written again).
    data: Mutex<Arc<Pages>>,
    reads: AtomicU64,
    writes: AtomicU64,
    syncs: AtomicU64,
    read_bytes: AtomicU64,
    write_bytes: AtomicU64,
}

impl SimDisk {
    /// A zeroed disk (the memory is mapped lazily: untouched space costs nothing).
    pub fn new(name: &str, size_bytes: u64, latency: DiskLatency, rng: SimRng) -> SimDisk {
        SimDisk {
            name: name.to_string(),
            size_bytes,
            latency,
            rng: Mutex::new(rng),
            data: Mutex::new(Arc::new(Pages::zeroed(size_bytes as usize))),
            reads: AtomicU64::new(0),
            writes: AtomicU64::new(0),
            syncs: AtomicU64::new(0),
            read_bytes: AtomicU64::new(0),
            write_bytes: AtomicU64::new(0),
        }
    }

    /// The disk's bytes now: what a crash of every node at this moment leaves (the
    /// simulation has no volatile write cache). Costs nothing until the disk is
    /// written while the image lives (then the write copies the disk once).
    pub fn image(&self) -> Arc<Pages> {
        self.data.lock().clone()
    }

    pub fn stats(&self) -> SimDiskStats {
        SimDiskStats {
            reads: self.reads.load(Ordering::Relaxed),
            writes: self.writes.load(Ordering::Relaxed),
            syncs: self.syncs.load(Ordering::Relaxed),
            read_bytes: self.read_bytes.load(Ordering::Relaxed),
            write_bytes: self.write_bytes.load(Ordering::Relaxed),
        }
    }

    /// Spend the simulated time of one I/O (nothing outside a simulated task: the
    /// random stream is then left alone too, so formatting and checking do not shift
    /// the latencies a seed draws).
    fn take_time(&self, (lo, hi): (Duration, Duration)) {
        if !mako_diag::sched::active() {
            return;
        }
        let lo = lo.as_nanos() as u64;
        let hi = (hi.as_nanos() as u64).max(lo);
        let d = {
            let mut rng = self.rng.lock();
            let spike = self.latency.spike_probability;
            if spike > 0.0 && rng.chance(spike) {
                rng.range(hi, (self.latency.spike_max.as_nanos() as u64).max(hi))
            } else {
                rng.range(lo, hi)
            }
        };
        mako_diag::sched::sleep(Duration::from_nanos(d));
    }

    /// The bytes of a write reach the disk.
    fn land(&self, buf: &[u8], offset: u64) {
        let mut data = self.data.lock();
        Arc::make_mut(&mut data)[offset as usize..offset as usize + buf.len()].copy_from_slice(buf);
        self.writes.fetch_add(1, Ordering::Relaxed);
        self.write_bytes
            .fetch_add(buf.len() as u64, Ordering::Relaxed);
    }

    fn check(&self, op: &'static str, offset: u64, len: usize) -> Result<(), DiskError> {
        match offset.checked_add(len as u64) {
            Some(end) if end <= self.size_bytes => Ok(()),
            _ => Err(DiskError::OutOfRange {
                disk: self.name.clone(),
                op,
                offset,
                len,
                size: self.size_bytes,
            }),
        }
    }
}

impl Disk for SimDisk {
    fn name(&self) -> &str {
        &self.name
    }
    fn size_bytes(&self) -> u64 {
        self.size_bytes
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<(), DiskError> {
        self.check("read", offset, buf.len())?;
        self.take_time(self.latency.read);
        let data = self.data.lock();
        buf.copy_from_slice(&data[offset as usize..offset as usize + buf.len()]);
        self.reads.fetch_add(1, Ordering::Relaxed);
        self.read_bytes
            .fetch_add(buf.len() as u64, Ordering::Relaxed);
        Ok(())
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> Result<(), DiskError> {
        self.check("write", offset, buf.len())?;
        self.take_time(self.latency.write);
        self.land(buf, offset);
        Ok(())
    }
    fn sync(&self) -> Result<(), DiskError> {
        self.take_time(self.latency.sync);
        self.syncs.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}

/// One node's view of a shared `SimDisk`: once the node crashes (`fence` set), none
/// of its I/O reaches the disk, not even a write already under way (the crash comes
/// before it lands) — what fencing guarantees a real cluster.
///
/// With leases (`lease`), the mount's disks are also behind its node's lease, as
/// makod's `FencedDisk`: an I/O is refused (`DiskError::Fenced`) once the lease ran
/// out, and a write that lands after the mount's epoch was expelled is kept off the
/// disk and recorded (`SimLeases::fenced_writes`: the fence failed). A write's
/// latency is spent in a `kernel_section`: submitted, it lands at its time even if the
/// node is paused meanwhile.
pub struct NodeDisk {
    pub disk: Arc<SimDisk>,
    pub fence: Arc<std::sync::atomic::AtomicBool>,
    pub lease: Option<crate::lease::MountLease>,
    /// Write errors injected on this node's path to the disks.
    pub faults: Arc<WriteFaults>,
}

/// Write errors of one node's path to the disks (`FaultKind::BadDisk`): while `bad`,
/// every write and sync of the node fails with EIO after its latency (a dead path, a
/// disk that went bad for good as far as this node can tell); reads still work. The
/// other nodes reach the disks as before, so a survivor can replay the node's log.
#[derive(Default)]
pub struct WriteFaults {
    pub bad: std::sync::atomic::AtomicBool,
    /// Writes and syncs that failed.
    pub failed: AtomicU64,
}

impl WriteFaults {
    fn check(
        &self,
        disk: &str,
        op: &'static str,
        offset: u64,
        len: usize,
    ) -> Result<(), DiskError> {
        if !self.bad.load(Ordering::SeqCst) {
            return Ok(());
        }
        self.failed.fetch_add(1, Ordering::Relaxed);
        Err(DiskError::Io {
            disk: disk.to_string(),
            op,
            offset,
            len,
            source: std::io::Error::from_raw_os_error(libc::EIO),
        })
    }
}

impl NodeDisk {
    fn fenced(&self, op: &str) -> Result<(), DiskError> {
        if self.fence.load(Ordering::SeqCst) {
            return Err(DiskError::Injected {
                disk: self.disk.name.clone(),
                what: format!("{op} after this node crashed"),
            });
        }
        Ok(())
    }

    fn leased(&self) -> Result<(), DiskError> {
        match &self.lease {
            Some(l) => l.check(&self.disk.name),
            None => Ok(()),
        }
    }
}

impl Disk for NodeDisk {
    fn name(&self) -> &str {
        &self.disk.name
    }
    fn size_bytes(&self) -> u64 {
        self.disk.size_bytes
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<(), DiskError> {
        self.fenced("read")?;
        self.leased()?;
        crate::sched::kernel_section(|| self.disk.read_at(buf, offset))?;
        self.fenced("read")
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> Result<(), DiskError> {
        self.fenced("write")?;
        self.leased()?;
        self.disk.check("write", offset, buf.len())?;
        crate::sched::kernel_section(|| {
            self.disk.take_time(self.disk.latency.write);
            self.fenced("write")?;
            self.faults
                .check(&self.disk.name, "write", offset, buf.len())?;
            if let Some(l) = &self.lease {
                if !l
                    .leases
                    .admit_write(l.node, l.epoch, &self.disk.name, offset, buf.len())
                {
                    return Err(DiskError::Fenced {
                        disk: self.disk.name.clone(),
                        by: "the simulation's oracle".into(),
                        reason: format!(
                            "node {}'s lease epoch {} was expelled before this write landed",
                            l.node, l.epoch
                        ),
                    });
                }
            }
            self.disk.land(buf, offset);
            Ok(())
        })
    }
    fn sync(&self) -> Result<(), DiskError> {
        self.fenced("sync")?;
        self.leased()?;
        crate::sched::kernel_section(|| self.disk.sync())?;
        self.faults.check(&self.disk.name, "sync", 0, 0)?;
        self.fenced("sync")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Sim, SimConfig};
    use std::sync::Arc;

    #[test]
    fn io_takes_simulated_time_and_is_shared() {
        let sim = Sim::new(1, SimConfig::default());
        let disk = Arc::new(SimDisk::new(
            "d0",
            1 << 20,
            DiskLatency::default(),
            sim.fork_rng(),
        ));
        // Outside a task: no time passes, the bytes are there.
        disk.write_at(&[7u8; 512], 4096).expect("write");
        let d2 = disk.clone();
        sim.spawn("io", move || {
            let mut b = [0u8; 512];
            d2.read_at(&mut b, 4096).expect("read");
            assert_eq!(b, [7u8; 512]);
            d2.write_at(&[9u8; 512], 0).expect("write");
            d2.sync().expect("sync");
        });
        let r = sim.run().expect("run");
        assert!(r.elapsed >= Duration::from_micros(90), "{:?}", r.elapsed);
        let mut b = [0u8; 512];
        disk.read_at(&mut b, 0).expect("read");
        assert_eq!(b, [9u8; 512]);
        let e = disk.read_at(&mut b, (1 << 20) - 100).unwrap_err();
        assert!(e.to_string().contains("d0"), "{e}");
        assert_eq!(disk.stats().writes, 2);
    }
}
