//! The NSD interface: block I/O by disk address. `LocalNsd` does the I/O on its
//! `Disk`s, which are local (a disk file, a block device) or reached through NSD
//! servers (`mako_nsd::RemoteDisk`).

use crate::iohist::{BufferType, IoHistory, IoRecord};
use crate::{AlignedBuf, Disk, DiskError};
use mako_diag::{Wait, WaitGuard};
use mako_format::DiskAddress;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Instant, SystemTime};

/// Context carried with every I/O for diagnostics.
#[derive(Debug, Clone, Copy)]
pub struct IoTag {
    pub buffer_type: BufferType,
    pub ino: u64,
}

pub trait Nsd: Send + Sync {
    fn disk_count(&self) -> usize;
    fn disk_size(&self, disk: u32) -> Result<u64, DiskError>;
    fn disk_name(&self, disk: u32) -> String;
    /// Read `buf.len()` bytes at `da`. `Ok` means every byte of `buf` was read from
    /// the disk (never a short read); callers rely on it to expose no stale bytes
    /// (see `read_append`).
    fn read(&self, da: DiskAddress, buf: &mut [u8], tag: IoTag) -> Result<(), DiskError>;
    fn write(&self, da: DiskAddress, buf: &[u8], tag: IoTag) -> Result<(), DiskError>;
    /// Append `len` bytes read at `da` to `buf`, without zeroing them first (a block
    /// read into a pagepool-sized buffer costs no page faults). If the read fails, `buf`
    /// is cut back to its old length: what a reused buffer held is never exposed.
    fn read_append(
        &self,
        da: DiskAddress,
        buf: &mut AlignedBuf,
        len: usize,
        tag: IoTag,
    ) -> Result<(), DiskError> {
        let old = buf.len();
        // SAFETY: `read` fills every byte of the range it is given or fails, and on a
        // failure the range is cut off again before anything can read it.
        unsafe { buf.resize_for_overwrite(old + len) };
        let r = self.read(da, &mut buf[old..], tag);
        if r.is_err() {
            buf.truncate(old);
        }
        r
    }
    /// Durability barrier on every disk.
    fn sync_all(&self) -> Result<(), DiskError>;
    fn history(&self) -> &IoHistory;
    fn stats(&self) -> Vec<DiskStats>;
}

/// Per-disk counters (`mako diag stats`).
#[derive(Debug, Clone, Default)]
pub struct DiskStats {
    pub name: String,
    pub reads: u64,
    pub writes: u64,
    pub read_bytes: u64,
    pub write_bytes: u64,
    pub read_micros: u64,
    pub write_micros: u64,
    pub errors: u64,
}

#[derive(Default)]
struct Counters {
    reads: AtomicU64,
    writes: AtomicU64,
    read_bytes: AtomicU64,
    write_bytes: AtomicU64,
    read_micros: AtomicU64,
    write_micros: AtomicU64,
    errors: AtomicU64,
}

pub struct LocalNsd {
    disks: Vec<Arc<dyn Disk>>,
    counters: Vec<Counters>,
    history: IoHistory,
    /// Per disk: written since its last sync (a barrier syncs only these; true at
    /// first, so the first barrier also covers whatever was written before this NSD).
    unsynced: Vec<std::sync::atomic::AtomicBool>,
}

impl LocalNsd {
    pub fn new(disks: Vec<Arc<dyn Disk>>, iohist_size: usize) -> Self {
        let counters = disks.iter().map(|_| Counters::default()).collect();
        let unsynced = disks
            .iter()
            .map(|_| std::sync::atomic::AtomicBool::new(true))
            .collect();
        LocalNsd {
            disks,
            counters,
            history: IoHistory::new(iohist_size),
            unsynced,
        }
    }
    fn disk(&self, index: u32) -> Result<&Arc<dyn Disk>, DiskError> {
        self.disks.get(index as usize).ok_or(DiskError::NoSuchDisk {
            index,
            count: self.disks.len(),
        })
    }
    fn account(
        &self,
        da: DiskAddress,
        len: usize,
        write: bool,
        tag: IoTag,
        start: (SystemTime, Instant),
        ok: bool,
    ) {
        let elapsed = start.1.elapsed();
        if let Some(c) = self.counters.get(da.disk() as usize) {
            let micros = elapsed.as_micros() as u64;
            if write {
                c.writes.fetch_add(1, Ordering::Relaxed);
                c.write_bytes.fetch_add(len as u64, Ordering::Relaxed);
                c.write_micros.fetch_add(micros, Ordering::Relaxed);
            } else {
                c.reads.fetch_add(1, Ordering::Relaxed);
                c.read_bytes.fetch_add(len as u64, Ordering::Relaxed);
                c.read_micros.fetch_add(micros, Ordering::Relaxed);
            }
            if !ok {
                c.errors.fetch_add(1, Ordering::Relaxed);
            }
        }
        self.history.record(IoRecord {
            start: start.0,
            write,
            buffer_type: tag.buffer_type,
            disk: da.disk(),
            sector: da.sector(),
            sectors: (len as u64).div_ceil(mako_format::SECTOR_BYTES),
            service: elapsed,
            queue: std::time::Duration::ZERO,
            thread: std::thread::current()
                .name()
                .unwrap_or("worker")
                .to_string(),
            ino: tag.ino,
            ok,
        });
    }
}

/// The waiter entry of one block I/O (`mako diag waiters`), in iohist's terms.
fn wait_for_io(da: DiskAddress, len: usize, write: bool, tag: IoTag) -> Wait {
    Wait::DiskIo {
        write,
        buffer_type: tag.buffer_type.name(),
        disk: da.disk(),
        sector: da.sector(),
        sectors: (len as u64).div_ceil(mako_format::SECTOR_BYTES),
        ino: tag.ino,
    }
}

/// A slow data disk for tests (`MAKO_TEST_DATA_IO_DELAY_MS`); metadata I/O is never
/// delayed so mounting stays quick. Counted in the I/O's service time, like a slow disk.
fn test_delay(tag: IoTag) {
    if tag.buffer_type == BufferType::Data {
        if let Some(d) = mako_diag::test_hooks::data_io_delay() {
            std::thread::sleep(d);
        }
    }
}

impl Nsd for LocalNsd {
    fn disk_count(&self) -> usize {
        self.disks.len()
    }
    fn disk_size(&self, disk: u32) -> Result<u64, DiskError> {
        Ok(self.disk(disk)?.size_bytes())
    }
    fn disk_name(&self, disk: u32) -> String {
        self.disk(disk)
            .map(|d| d.name().to_string())
            .unwrap_or_else(|_| format!("#{disk}"))
    }
    fn read(&self, da: DiskAddress, buf: &mut [u8], tag: IoTag) -> Result<(), DiskError> {
        let start = (SystemTime::now(), Instant::now());
        let wait = WaitGuard::new(wait_for_io(da, buf.len(), false, tag));
        test_delay(tag);
        let r = self
            .disk(da.disk())?
            .read_tagged(buf, da.byte_offset(), tag);
        drop(wait);
        self.account(da, buf.len(), false, tag, start, r.is_ok());
        r
    }
    fn write(&self, da: DiskAddress, buf: &[u8], tag: IoTag) -> Result<(), DiskError> {
        let start = (SystemTime::now(), Instant::now());
        let wait = WaitGuard::new(wait_for_io(da, buf.len(), true, tag));
        test_delay(tag);
        let r = self
            .disk(da.disk())?
            .write_tagged(buf, da.byte_offset(), tag);
        // After the write: a barrier that clears the flag before this point syncs the
        // disk anyway, one that clears it after sees it set.
        self.unsynced[da.disk() as usize].store(true, Ordering::Release);
        drop(wait);
        self.account(da, buf.len(), true, tag, start, r.is_ok());
        r
    }
    /// Syncs the disks written since their last sync: a disk with nothing new has
    /// nothing to make durable (a commit that wrote one log block syncs one disk, not
    /// all of them).
    ///
    /// Several disks are synced at once (one thread each but the first, which this
    /// thread syncs): a commit's barrier waits for the slowest disk, not for the sum of
    /// them, which matters on file-backed disks (a host `fdatasync` each) and behind NSD
    /// servers (a round trip each). Every disk due is tried even when one fails; the
    /// first error is returned and the failed disks stay due.
    fn sync_all(&self) -> Result<(), DiskError> {
        let _wait = WaitGuard::new(Wait::DiskSync);
        let due: Vec<usize> = self
            .unsynced
            .iter()
            .enumerate()
            .filter(|(_, unsynced)| unsynced.swap(false, Ordering::AcqRel))
            .map(|(i, _)| i)
            .collect();
        let sync_one = |i: usize| {
            let r = self.disks[i].sync();
            if r.is_err() {
                // Still owed: the next barrier tries again.
                self.unsynced[i].store(true, Ordering::Release);
            }
            r
        };
        let parallel =
            !mako_diag::sched::active() && due.iter().all(|&i| self.disks[i].sync_in_parallel());
        if due.len() > 1 && !parallel {
            // Test disks and simulated tasks: one at a time, in disk order.
            let mut result = Ok(());
            for i in due {
                let r = sync_one(i);
                if result.is_ok() {
                    result = r;
                }
            }
            return result;
        }
        match due.as_slice() {
            [] => Ok(()),
            [only] => sync_one(*only),
            [first, rest @ ..] => std::thread::scope(|scope| {
                let others: Vec<_> = rest
                    .iter()
                    .map(|&i| {
                        (
                            i,
                            std::thread::Builder::new().spawn_scoped(scope, move || sync_one(i)),
                        )
                    })
                    .collect();
                let mut result = sync_one(*first);
                for (i, spawned) in others {
                    // A thread that cannot be had syncs here instead.
                    let r = match spawned {
                        Ok(handle) => handle.join().unwrap_or_else(|_| sync_one(i)),
                        Err(_) => sync_one(i),
                    };
                    if result.is_ok() {
                        result = r;
                    }
                }
                result
            }),
        }
    }
    fn history(&self) -> &IoHistory {
        &self.history
    }
    fn stats(&self) -> Vec<DiskStats> {
        self.disks
            .iter()
            .zip(&self.counters)
            .map(|(d, c)| DiskStats {
                name: d.name().to_string(),
                reads: c.reads.load(Ordering::Relaxed),
                writes: c.writes.load(Ordering::Relaxed),
                read_bytes: c.read_bytes.load(Ordering::Relaxed),
                write_bytes: c.write_bytes.load(Ordering::Relaxed),
                read_micros: c.read_micros.load(Ordering::Relaxed),
                write_micros: c.write_micros.load(Ordering::Relaxed),
                errors: c.errors.load(Ordering::Relaxed),
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MemDisk;
    #[test]
    fn iohist_lists_exactly_the_ios() {
        let d: Arc<dyn Disk> = Arc::new(MemDisk::new("d0", 1 << 20));
        let nsd = LocalNsd::new(vec![d], 4);
        let tag = IoTag {
            buffer_type: BufferType::Data,
            ino: 9,
        };
        for i in 0..6u64 {
            nsd.write(DiskAddress::new(0, 8 + i * 8), &[1u8; 4096], tag)
                .unwrap();
        }
        let h = nsd.history().last(10);
        assert_eq!(h.len(), 4, "ring keeps iohistSize entries");
        assert_eq!(
            h.iter().map(|r| r.sector).collect::<Vec<_>>(),
            vec![24, 32, 40, 48]
        );
        assert!(h.iter().all(|r| r.write && r.sectors == 8 && r.ino == 9));
        assert_eq!(nsd.stats()[0].writes, 6);
        assert!(nsd
            .read(DiskAddress::new(3, 0), &mut [0u8; 512], tag)
            .is_err());
    }

    /// A failed `read_append` leaves the buffer as it was: the bytes it grew by (which
    /// may hold what a reused buffer held) are cut off, never left for a caller.
    #[test]
    fn a_failed_read_append_exposes_nothing() {
        let mem = Arc::new(MemDisk::new("d0", 1 << 20));
        mem.write_at(&[3u8; 4096], 4096).unwrap();
        let nsd = LocalNsd::new(vec![mem.clone() as Arc<dyn Disk>], 4);
        let tag = IoTag {
            buffer_type: BufferType::Data,
            ino: 9,
        };
        let mut buf = AlignedBuf::from_slice(b"head");
        nsd.read_append(DiskAddress::new(0, 8), &mut buf, 4096, tag)
            .unwrap();
        assert_eq!(buf.len(), 4100);
        assert!(buf[4..].iter().all(|&b| b == 3));
        mem.set_fail_reads(true);
        assert!(nsd
            .read_append(DiskAddress::new(0, 8), &mut buf, 1 << 19, tag)
            .is_err());
        assert_eq!(buf.len(), 4100, "the failed read's bytes are cut off");
        assert!(nsd
            .read_append(DiskAddress::new(0, 4000), &mut buf, 1 << 20, tag)
            .is_err());
        assert_eq!(buf.len(), 4100, "an out-of-range read appends nothing");
    }

    /// A disk that counts its syncs.
    struct Counting(MemDisk, std::sync::atomic::AtomicU64);
    impl Disk for Counting {
        fn name(&self) -> &str {
            self.0.name()
        }
        fn size_bytes(&self) -> u64 {
            self.0.size_bytes()
        }
        fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<(), DiskError> {
            self.0.read_at(buf, offset)
        }
        fn write_at(&self, buf: &[u8], offset: u64) -> Result<(), DiskError> {
            self.0.write_at(buf, offset)
        }
        fn sync(&self) -> Result<(), DiskError> {
            self.1.fetch_add(1, Ordering::Relaxed);
            self.0.sync()
        }
    }

    /// A disk whose syncs may overlap, meet at a rendezvous (so a test sees whether they
    /// ran at once) and fail on demand.
    struct Overlapping {
        mem: MemDisk,
        syncs: std::sync::atomic::AtomicU64,
        fail: std::sync::atomic::AtomicBool,
        rendezvous: Arc<(parking_lot::Mutex<u32>, parking_lot::Condvar)>,
        met: std::sync::atomic::AtomicBool,
    }
    impl Disk for Overlapping {
        fn name(&self) -> &str {
            self.mem.name()
        }
        fn size_bytes(&self) -> u64 {
            self.mem.size_bytes()
        }
        fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<(), DiskError> {
            self.mem.read_at(buf, offset)
        }
        fn write_at(&self, buf: &[u8], offset: u64) -> Result<(), DiskError> {
            self.mem.write_at(buf, offset)
        }
        fn sync(&self) -> Result<(), DiskError> {
            self.syncs.fetch_add(1, Ordering::Relaxed);
            let (arrived, cv) = &*self.rendezvous;
            let mut n = arrived.lock();
            *n += 1;
            cv.notify_all();
            // A hang guard only: disks synced one after another never meet.
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
            while *n < 2 && !cv.wait_until(&mut n, deadline).timed_out() {}
            self.met.store(*n >= 2, Ordering::Relaxed);
            drop(n);
            if self.fail.load(Ordering::Relaxed) {
                return Err(DiskError::Io {
                    disk: self.name().to_string(),
                    op: "sync",
                    offset: 0,
                    len: 0,
                    source: std::io::Error::other("injected sync failure"),
                });
            }
            self.mem.sync()
        }
        fn sync_in_parallel(&self) -> bool {
            true
        }
    }

    #[test]
    fn disks_that_allow_it_are_synced_at_once_and_a_failed_one_stays_due() {
        let rendezvous = Arc::new((parking_lot::Mutex::new(0), parking_lot::Condvar::new()));
        let disks: Vec<Arc<Overlapping>> = (0..2)
            .map(|i| {
                Arc::new(Overlapping {
                    mem: MemDisk::new(&format!("d{i}"), 1 << 20),
                    syncs: Default::default(),
                    fail: Default::default(),
                    rendezvous: rendezvous.clone(),
                    met: Default::default(),
                })
            })
            .collect();
        let nsd = LocalNsd::new(
            disks.iter().map(|d| d.clone() as Arc<dyn Disk>).collect(),
            4,
        );
        disks[1].fail.store(true, Ordering::Relaxed);
        let err = nsd.sync_all().expect_err("disk d1's sync failed");
        assert!(err.to_string().contains("d1"), "{err}");
        assert!(
            disks.iter().all(|d| d.met.load(Ordering::Relaxed)),
            "both syncs ran at the same time"
        );
        assert_eq!(disks[0].syncs.load(Ordering::Relaxed), 1);
        assert_eq!(disks[1].syncs.load(Ordering::Relaxed), 1);
        // Only the failed disk is still due; the next barrier syncs it alone.
        disks[1].fail.store(false, Ordering::Relaxed);
        *rendezvous.0.lock() = 1; // let a lone sync pass the rendezvous
        nsd.sync_all().unwrap();
        assert_eq!(disks[0].syncs.load(Ordering::Relaxed), 1);
        assert_eq!(disks[1].syncs.load(Ordering::Relaxed), 2);
    }

    #[test]
    fn a_barrier_syncs_exactly_the_disks_written_since_the_last() {
        let disks: Vec<Arc<Counting>> = (0..3)
            .map(|i| {
                Arc::new(Counting(
                    MemDisk::new(&format!("d{i}"), 1 << 20),
                    Default::default(),
                ))
            })
            .collect();
        let nsd = LocalNsd::new(
            disks.iter().map(|d| d.clone() as Arc<dyn Disk>).collect(),
            4,
        );
        let syncs = || {
            disks
                .iter()
                .map(|d| d.1.load(Ordering::Relaxed))
                .collect::<Vec<_>>()
        };
        nsd.sync_all().unwrap();
        assert_eq!(
            syncs(),
            vec![1, 1, 1],
            "the first barrier covers writes made before the NSD"
        );
        nsd.sync_all().unwrap();
        assert_eq!(syncs(), vec![1, 1, 1], "nothing written, nothing synced");
        let tag = IoTag {
            buffer_type: BufferType::Log,
            ino: 4,
        };
        nsd.write(DiskAddress::new(1, 8), &[7u8; 512], tag).unwrap();
        nsd.sync_all().unwrap();
        assert_eq!(syncs(), vec![1, 2, 1]);
        nsd.write(DiskAddress::new(0, 8), &[7u8; 512], tag).unwrap();
        nsd.write(DiskAddress::new(2, 8), &[7u8; 512], tag).unwrap();
        nsd.sync_all().unwrap();
        assert_eq!(syncs(), vec![2, 2, 2]);
    }
}
