//! An in-memory disk for tests, with fault injection.
//!
//! Fault model covered here: a read or write that fails (EIO) after N operations or at
//! chosen offsets, and a disk that refuses writes. Crash images (durable vs. written
//! state) are the crash-test backend's (`crash_disk.rs`).

use crate::disk::{check_range, Disk};
use crate::DiskError;
use parking_lot::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

pub struct MemDisk {
    name: String,
    data: Mutex<Vec<u8>>,
    /// Fail every write once this many writes have completed (u64::MAX = never).
    fail_writes_after: AtomicU64,
    writes: AtomicU64,
    fail_reads: AtomicBool,
    read_only: AtomicBool,
}

impl MemDisk {
    pub fn new(name: &str, size_bytes: u64) -> MemDisk {
        MemDisk {
            name: name.into(),
            data: Mutex::new(vec![0u8; size_bytes as usize]),
            fail_writes_after: AtomicU64::new(u64::MAX),
            writes: AtomicU64::new(0),
            fail_reads: AtomicBool::new(false),
            read_only: AtomicBool::new(false),
        }
    }
    pub fn fail_writes_after(&self, n: u64) {
        self.fail_writes_after
            .store(self.writes.load(Ordering::SeqCst) + n, Ordering::SeqCst);
    }
    pub fn set_fail_reads(&self, on: bool) {
        self.fail_reads.store(on, Ordering::SeqCst);
    }
    pub fn set_read_only(&self, on: bool) {
        self.read_only.store(on, Ordering::SeqCst);
    }
    pub fn writes(&self) -> u64 {
        self.writes.load(Ordering::SeqCst)
    }
    /// Flip bits directly in the image (corruption tests).
    pub fn corrupt(&self, offset: u64, xor: u8) {
        self.data.lock()[offset as usize] ^= xor;
    }
    pub fn snapshot(&self) -> Vec<u8> {
        self.data.lock().clone()
    }
}

impl Disk for MemDisk {
    fn name(&self) -> &str {
        &self.name
    }
    fn size_bytes(&self) -> u64 {
        self.data.lock().len() as u64
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<(), DiskError> {
        let data = self.data.lock();
        check_range(&self.name, "read", offset, buf.len(), data.len() as u64)?;
        if self.fail_reads.load(Ordering::SeqCst) {
            return Err(DiskError::Injected {
                disk: self.name.clone(),
                what: format!("read at {offset}"),
            });
        }
        buf.copy_from_slice(&data[offset as usize..offset as usize + buf.len()]);
        Ok(())
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> Result<(), DiskError> {
        let mut data = self.data.lock();
        check_range(&self.name, "write", offset, buf.len(), data.len() as u64)?;
        if self.read_only.load(Ordering::SeqCst) {
            return Err(DiskError::Injected {
                disk: self.name.clone(),
                what: "disk is read-only".into(),
            });
        }
        let n = self.writes.fetch_add(1, Ordering::SeqCst);
        if n >= self.fail_writes_after.load(Ordering::SeqCst) {
            return Err(DiskError::Injected {
                disk: self.name.clone(),
                what: format!("write {n} at {offset}"),
            });
        }
        data[offset as usize..offset as usize + buf.len()].copy_from_slice(buf);
        Ok(())
    }
    fn sync(&self) -> Result<(), DiskError> {
        Ok(())
    }
}
