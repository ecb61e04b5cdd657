//! Indirect blocks: arrays of block pointers forming a tree under an inode.

use crate::codec::{check_header, Reader, Writer};
use crate::error::{FormatError, FormatErrorKind, Location};
use crate::DiskAddress;

pub const INDIRECT_MAGIC: u64 = 0x444e_494d; // "MIND"
pub const INDIRECT_HEADER_BYTES: usize = 32;
const CRC_OFFSET: usize = 6;

/// An indirect block's identity: which file, which level, which slot of its parent.
/// Checked on every read so a misdirected write is never followed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct IndirectId {
    pub ino: u64,
    /// 1 = points at data blocks; 2 = points at level-1 indirect blocks; …
    pub level: u8,
    /// Index of this block among the blocks of its level.
    pub index: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IndirectBlock {
    pub id: IndirectId,
    pub pointers: Vec<DiskAddress>,
}

impl IndirectBlock {
    pub fn new(id: IndirectId, pointers_per_block: usize) -> Self {
        IndirectBlock {
            id,
            pointers: vec![DiskAddress::NULL; pointers_per_block],
        }
    }

    pub fn encode(&self, indirect_bytes: u32) -> Vec<u8> {
        let mut w = Writer::with_capacity(indirect_bytes as usize);
        w.u32(INDIRECT_MAGIC as u32);
        w.u16(crate::FORMAT_VERSION);
        w.u32(0);
        w.u8(self.id.level);
        w.u8(0);
        w.u64(self.id.ino);
        w.u64(self.id.index);
        w.u32(self.pointers.len() as u32);
        w.pad_to(INDIRECT_HEADER_BYTES);
        for p in &self.pointers {
            w.u64(p.raw());
        }
        w.pad_to(indirect_bytes as usize);
        let crc = crate::checksum_with_hole(&w.buf, CRC_OFFSET);
        w.buf[CRC_OFFSET..CRC_OFFSET + 4].copy_from_slice(&crc.to_le_bytes());
        w.buf
    }

    pub fn decode(
        bytes: &[u8],
        indirect_bytes: u32,
        expected: IndirectId,
        location: Location,
    ) -> Result<Self, FormatError> {
        const S: &str = "indirect block";
        if bytes.len() < indirect_bytes as usize {
            return Err(FormatError::new(
                S,
                location,
                FormatErrorKind::Truncated {
                    needed: indirect_bytes as usize,
                    available: bytes.len(),
                },
            ));
        }
        let bytes = &bytes[..indirect_bytes as usize];
        let mut r = Reader::new(bytes, S, location);
        let magic = r.u32()? as u64;
        let version = r.u16()?;
        let crc = r.u32()?;
        check_header(
            bytes,
            S,
            location,
            INDIRECT_MAGIC,
            magic,
            version,
            CRC_OFFSET,
            crc,
        )?;
        let level = r.u8()?;
        r.u8()?;
        let ino = r.u64()?;
        let index = r.u64()?;
        let found = IndirectId { ino, level, index };
        if found != expected {
            return Err(FormatError::new(
                S,
                location,
                FormatErrorKind::WrongIdentity {
                    expected: format!("{expected:?}"),
                    found: format!("{found:?}"),
                },
            ));
        }
        let n = r.u32()? as usize;
        let max = (indirect_bytes as usize - INDIRECT_HEADER_BYTES) / 8;
        if n != max {
            return Err(FormatError::invalid(
                S,
                location,
                format!("{n} pointers, expected {max}"),
            ));
        }
        r.seek(INDIRECT_HEADER_BYTES)?;
        let mut pointers = Vec::with_capacity(n);
        for _ in 0..n {
            pointers.push(DiskAddress::from_raw(r.u64()?));
        }
        Ok(IndirectBlock {
            id: found,
            pointers,
        })
    }
}
