//! Inode allocation map segments: a bitmap of used inode numbers for a range of them.
//!
//! The inode allocation map file holds segment `s` at `slot_offset(s)`. Since format
//! version 3 a slot never straddles a block of the file (a block holds
//! `slots_per_block` whole slots, the rest of it unused), and the file is sparse: a
//! block that does not exist (a hole in its block map) holds blank segments, all
//! inodes free. A block that exists holds a valid segment in every slot (a block is
//! written whole, all its slots encoded, before the file's block map names it). So a
//! file system made for 2^40 inodes has a map file of many gigabytes of which only
//! the blocks of segments ever used exist, and the indirect blocks of the file (each
//! checksummed, carrying its inode, level and index) are the directory that finds
//! them.

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

/// Whole segment slots a block of the inode map file holds (at least one: a descriptor
/// whose slot is larger than a block is refused).
pub fn slots_per_block(inodes: u32, block_bytes: u32) -> u64 {
    (block_bytes as u64 / InodeMapSegment::slot_bytes(inodes) as u64).max(1)
}

/// Byte offset of segment `segment`'s slot in the inode map file.
pub fn slot_offset(segment: u64, inodes: u32, block_bytes: u32) -> u64 {
    let per = slots_per_block(inodes, block_bytes);
    segment / per * block_bytes as u64 + segment % per * InodeMapSegment::slot_bytes(inodes) as u64
}

/// Size of the inode map file of `segments` segments (whole blocks).
pub fn file_bytes(segments: u64, inodes: u32, block_bytes: u32) -> u64 {
    segments.div_ceil(slots_per_block(inodes, block_bytes)) * block_bytes as u64
}

/// The segments whose slots lie in block `block` of the inode map file, of `segments`.
pub fn segments_in_block(
    block: u64,
    segments: u64,
    inodes: u32,
    block_bytes: u32,
) -> std::ops::Range<u64> {
    let per = slots_per_block(inodes, block_bytes);
    let first = block.saturating_mul(per).min(segments);
    first..(first + per).min(segments)
}

/// Most segments a file system may have: a segment's number is 32 bits on disk.
pub const SEGMENTS_MAX: u64 = 1 << 32;

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
