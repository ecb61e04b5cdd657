//! Block allocation map segments: one per allocation region, a subblock bitmap for
//! the slice of every disk that the region covers (DESIGN.md 3.4).

use crate::codec::{check_header, Reader, Writer};
use crate::error::{FormatError, FormatErrorKind, Location};

pub const ALLOC_SEGMENT_MAGIC: u64 = 0x4c41_4b4d; // "MKAL"
pub const ALLOC_HEADER_BYTES: usize = 32;
const CRC_OFFSET: usize = 6;

/// The slice of one disk a region covers, in subblocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DiskSlice {
    pub disk: u32,
    pub first_subblock: u64,
    pub subblocks: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AllocSegment {
    pub region: u32,
    pub slices: Vec<DiskSlice>,
    /// One bitmap per slice, one bit per subblock, set = in use.
    pub bitmaps: Vec<Vec<u64>>,
}

impl AllocSegment {
    pub fn new(region: u32, slices: Vec<DiskSlice>) -> Self {
        let bitmaps = slices
            .iter()
            .map(|s| vec![0u64; s.subblocks.div_ceil(64) as usize])
            .collect();
        AllocSegment {
            region,
            slices,
            bitmaps,
        }
    }

    /// Bytes the encoding of a segment with these slices takes (before sector rounding).
    pub fn encoded_len(slices: &[DiskSlice]) -> usize {
        ALLOC_HEADER_BYTES
            + slices
                .iter()
                .map(|s| 20 + s.subblocks.div_ceil(64) as usize * 8)
                .sum::<usize>()
    }

    pub fn encode(&self, slot_bytes: usize) -> Vec<u8> {
        let mut w = Writer::with_capacity(slot_bytes);
        w.u32(ALLOC_SEGMENT_MAGIC as u32);
        w.u16(crate::FORMAT_VERSION);
        w.u32(0);
        w.u32(self.region);
        w.u32(self.slices.len() as u32);
        w.pad_to(ALLOC_HEADER_BYTES);
        for (s, b) in self.slices.iter().zip(&self.bitmaps) {
            w.u32(s.disk);
            w.u64(s.first_subblock);
            w.u64(s.subblocks);
            for word in b {
                w.u64(*word);
            }
        }
        assert!(
            w.len() <= slot_bytes,
            "allocation segment larger than its slot"
        );
        w.pad_to(slot_bytes);
        let crc = crate::checksum_with_hole(&w.buf, CRC_OFFSET);
        w.buf[CRC_OFFSET..CRC_OFFSET + 4].copy_from_slice(&crc.to_le_bytes());
        w.buf
    }

    pub fn decode(
        bytes: &[u8],
        expected_region: u32,
        location: Location,
    ) -> Result<Self, FormatError> {
        const S: &str = "allocation map segment";
        let mut r = Reader::new(bytes, S, location);
        let magic = r.u32()? as u64;
        let version = r.u16()?;
        let crc = r.u32()?;
        check_header(
            bytes,
            S,
            location,
            ALLOC_SEGMENT_MAGIC,
            magic,
            version,
            CRC_OFFSET,
            crc,
        )?;
        let region = r.u32()?;
        if region != expected_region {
            return Err(FormatError::new(
                S,
                location,
                FormatErrorKind::WrongIdentity {
                    expected: format!("region {expected_region}"),
                    found: format!("region {region}"),
                },
            ));
        }
        let n = r.u32()? as usize;
        if n > 65536 {
            return Err(FormatError::invalid(
                S,
                location,
                format!("{n} disk slices"),
            ));
        }
        r.seek(ALLOC_HEADER_BYTES)?;
        // Room is reserved for the slices the bytes can hold (20 bytes each at least),
        // not for what the count claims: a damaged count must not reserve megabytes.
        let fit = n.min(r.remaining() / 20);
        let mut slices = Vec::with_capacity(fit);
        let mut bitmaps = Vec::with_capacity(fit);
        for _ in 0..n {
            let disk = r.u32()?;
            let first_subblock = r.u64()?;
            let subblocks = r.u64()?;
            let words = subblocks.div_ceil(64);
            if words as usize * 8 > r.remaining() {
                return Err(FormatError::invalid(
                    S,
                    location,
                    format!("slice of {subblocks} subblocks overflows"),
                ));
            }
            let mut b = Vec::with_capacity(words as usize);
            for _ in 0..words {
                b.push(r.u64()?);
            }
            slices.push(DiskSlice {
                disk,
                first_subblock,
                subblocks,
            });
            bitmaps.push(b);
        }
        Ok(AllocSegment {
            region,
            slices,
            bitmaps,
        })
    }
}
