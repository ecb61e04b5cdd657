//! Disk addresses: `(disk index, sector)` packed in one u64, printed `disk:sector`.

use std::fmt;

/// A disk address. Sector 0 of disk 0 holds a disk header, never file data, so the
/// all-zero value is free to mean "no block" (a hole).
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct DiskAddress(u64);

/// Bits for the sector: 2^48 sectors of 512 bytes = 128 PiB per disk.
const SECTOR_BITS: u32 = 48;
const SECTOR_MASK: u64 = (1 << SECTOR_BITS) - 1;
/// Largest sector number.
pub const SECTOR_MAX: u64 = SECTOR_MASK;
/// Largest disk index: 65535 disks per file system.
pub const DISK_INDEX_MAX: u32 = u16::MAX as u32;

impl DiskAddress {
    pub const NULL: DiskAddress = DiskAddress(0);

    pub fn new(disk: u32, sector: u64) -> Self {
        assert!(disk <= DISK_INDEX_MAX, "disk index {disk} out of range");
        assert!(sector <= SECTOR_MASK, "sector {sector} out of range");
        DiskAddress(((disk as u64) << SECTOR_BITS) | sector)
    }
    /// The address packed in `raw`, as read from disk. Every u64 is a well-formed
    /// address (disk 0..=65535, a 48-bit sector), so this never fails and never
    /// panics; whether the disk and sector exist is for the reader to check against
    /// its file system before following it (`mako_fs::Core::check_pointer`), since
    /// `offset_by` on an address near the end of the sector space panics.
    pub fn from_raw(raw: u64) -> Self {
        DiskAddress(raw)
    }
    pub fn raw(self) -> u64 {
        self.0
    }
    pub fn is_null(self) -> bool {
        self.0 == 0
    }
    pub fn disk(self) -> u32 {
        (self.0 >> SECTOR_BITS) as u32
    }
    pub fn sector(self) -> u64 {
        self.0 & SECTOR_MASK
    }
    pub fn byte_offset(self) -> u64 {
        self.sector() * crate::SECTOR_BYTES
    }
    /// The address `bytes` further on the same disk (bytes must be sector-aligned).
    /// Panics past the last sector: only for addresses known to lie on a disk.
    pub fn offset_by(self, bytes: u64) -> Self {
        debug_assert_eq!(bytes % crate::SECTOR_BYTES, 0);
        DiskAddress::new(self.disk(), self.sector() + bytes / crate::SECTOR_BYTES)
    }
}

impl fmt::Display for DiskAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.disk(), self.sector())
    }
}
impl fmt::Debug for DiskAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "DA({self})")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn packs_and_prints() {
        let da = DiskAddress::new(3, 123456789);
        assert_eq!(da.disk(), 3);
        assert_eq!(da.sector(), 123456789);
        assert_eq!(da.to_string(), "3:123456789");
        assert_eq!(DiskAddress::from_raw(da.raw()), da);
        assert!(DiskAddress::NULL.is_null());
        assert_eq!(da.offset_by(1024).sector(), 123456791);
    }
}
