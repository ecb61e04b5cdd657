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
    fn sync_all(&self) -> Result<(), DiskError> {
        let _wait = WaitGuard::new(Wait::DiskSync);
        for (d, unsynced) in self.disks.iter().zip(&self.unsynced) {
            if unsynced.swap(false, Ordering::AcqRel) {
                if let Err(e) = d.sync() {
                    unsynced.store(true, Ordering::Release);
                    return Err(e);
                }
            }
        }
        Ok(())
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
