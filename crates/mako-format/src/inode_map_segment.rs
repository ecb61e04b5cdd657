//! Inode allocation map segments: a bitmap of used inode numbers for a range of them.

use crate::codec::{check_header, Reader, Writer};
use crate::error::{FormatError, FormatErrorKind, Location};

pub const INODE_MAP_MAGIC: u64 = 0x4d49_4b4d; // "MKIM"
pub const INODE_MAP_HEADER_BYTES: usize = 24;
const CRC_OFFSET: usize = 6;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InodeMapSegment {
    pub segment: u32,
    pub first_ino: u64,
    /// One bit per inode, set = in use.
    pub bitmap: Vec<u64>,
}

impl InodeMapSegment {
    pub fn new(segment: u32, first_ino: u64, inodes: u32) -> Self {
        InodeMapSegment {
            segment,
            first_ino,
            bitmap: vec![0; inodes.div_ceil(64) as usize],
        }
    }
    pub fn slot_bytes(inodes: u32) -> usize {
        (INODE_MAP_HEADER_BYTES + inodes.div_ceil(64) as usize * 8).div_ceil(512) * 512
    }
    pub fn encode(&self) -> Vec<u8> {
        let slot = Self::slot_bytes(self.bitmap.len() as u32 * 64);
        let mut w = Writer::with_capacity(slot);
        w.u32(INODE_MAP_MAGIC as u32);
        w.u16(crate::FORMAT_VERSION);
        w.u32(0);
        w.u32(self.segment);
        w.u64(self.first_ino);
        w.u16(0);
        debug_assert_eq!(w.len(), INODE_MAP_HEADER_BYTES);
        for word in &self.bitmap {
            w.u64(*word);
        }
        w.pad_to(slot);
        let crc = crate::checksum_with_hole(&w.buf, CRC_OFFSET);
        w.buf[CRC_OFFSET..CRC_OFFSET + 4].copy_from_slice(&crc.to_le_bytes());
        w.buf
    }
    pub fn decode(
        bytes: &[u8],
        expected_segment: u32,
        inodes: u32,
        location: Location,
    ) -> Result<Self, FormatError> {
        const S: &str = "inode map segment";
        let slot = Self::slot_bytes(inodes);
        if bytes.len() < slot {
            return Err(FormatError::new(
                S,
                location,
                FormatErrorKind::Truncated {
                    needed: slot,
                    available: bytes.len(),
                },
            ));
        }
        let bytes = &bytes[..slot];
        let mut r = Reader::new(bytes, S, location);
        let magic = r.u32()? as u64;
        let version = r.u16()?;
        let crc = r.u32()?;
        check_header(
            bytes,
            S,
            location,
            INODE_MAP_MAGIC,
            magic,
            version,
            CRC_OFFSET,
            crc,
        )?;
        let segment = r.u32()?;
        if segment != expected_segment {
            return Err(FormatError::new(
                S,
                location,
                FormatErrorKind::WrongIdentity {
                    expected: format!("segment {expected_segment}"),
                    found: format!("segment {segment}"),
                },
            ));
        }
        let first_ino = r.u64()?;
        r.u16()?;
        let mut bitmap = Vec::with_capacity(inodes.div_ceil(64) as usize);
        for _ in 0..inodes.div_ceil(64) {
            bitmap.push(r.u64()?);
        }
        Ok(InodeMapSegment {
            segment,
            first_ino,
            bitmap,
        })
    }
}
