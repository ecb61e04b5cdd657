//! I/O history: a bounded ring of the most recent disk I/Os, as `mmdiag --iohist`
//! shows them (start, R/W, buffer type, disk:sector, sectors, time).

use parking_lot::Mutex;
use std::collections::VecDeque;
use std::time::{Duration, SystemTime};

/// What a block I/O carried.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BufferType {
    Data,
    Inode,
    Indirect,
    Directory,
    /// Extended attributes outside the inode (xattr index and xattr blocks).
    Xattr,
    Log,
    AllocMap,
    InodeMap,
    Descriptor,
    DiskHeader,
}

impl BufferType {
    pub fn name(self) -> &'static str {
        match self {
            BufferType::Data => "data",
            BufferType::Inode => "inode",
            BufferType::Indirect => "indirect",
            BufferType::Directory => "directory",
            BufferType::Xattr => "xattr",
            BufferType::Log => "log",
            BufferType::AllocMap => "allocMap",
            BufferType::InodeMap => "inodeMap",
            BufferType::Descriptor => "descriptor",
            BufferType::DiskHeader => "diskHeader",
        }
    }
}

#[derive(Debug, Clone)]
pub struct IoRecord {
    pub start: SystemTime,
    pub write: bool,
    pub buffer_type: BufferType,
    pub disk: u32,
    pub sector: u64,
    pub sectors: u64,
    pub service: Duration,
    /// Time the request waited before the disk call (0 for synchronous local I/O).
    pub queue: Duration,
    pub thread: String,
    pub ino: u64,
    pub ok: bool,
}

pub struct IoHistory {
    ring: Mutex<VecDeque<IoRecord>>,
    capacity: Mutex<usize>,
}

impl IoHistory {
    pub fn new(capacity: usize) -> Self {
        IoHistory {
            ring: Mutex::new(VecDeque::with_capacity(capacity.min(1 << 16))),
            capacity: Mutex::new(capacity),
        }
    }
    pub fn set_capacity(&self, capacity: usize) {
        *self.capacity.lock() = capacity;
        let mut r = self.ring.lock();
        while r.len() > capacity {
            r.pop_front();
        }
    }
    pub fn record(&self, rec: IoRecord) {
        let cap = *self.capacity.lock();
        if cap == 0 {
            return;
        }
        let mut r = self.ring.lock();
        while r.len() >= cap {
            r.pop_front();
        }
        r.push_back(rec);
    }
    /// The last `n` records, oldest first.
    pub fn last(&self, n: usize) -> Vec<IoRecord> {
        let r = self.ring.lock();
        r.iter().skip(r.len().saturating_sub(n)).cloned().collect()
    }
    pub fn clear(&self) {
        self.ring.lock().clear();
    }
}
