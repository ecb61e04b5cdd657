//! Directory entries and directory blocks (extendible hashing, DESIGN.md 3.5).
//!
//! A directory block covers a contiguous range of the 63-bit cookie space: at local
//! depth `d`, the block whose prefix is `p` holds every entry whose cookie's top `d`
//! bits (of 63) equal `p`. Its logical index in the directory file is `p` with its
//! `d` bits reversed, so a split of block `i` at depth `d` creates block `i + 2^d`,
//! and the directory file only ever grows by doubling (sparse, as in GPFS).

use crate::codec::{check_header, Reader, Writer};
use crate::error::{FormatError, FormatErrorKind, Location};

pub const DIR_BLOCK_MAGIC: u64 = 0x5249_444d; // "MDIR"
pub const DIR_BLOCK_HEADER_BYTES: usize = 48;
const CRC_OFFSET: usize = 6;
/// Bytes an entry takes besides its name.
pub const ENTRY_OVERHEAD_BYTES: usize = 18;
pub const NAME_BYTES_MAX: usize = 255;

/// File type stored in the entry (d_type values).
pub const DT_UNKNOWN: u8 = 0;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirEntry {
    /// Position in hash order; stable for the life of the entry (readdir offset).
    pub cookie: u64,
    pub ino: u64,
    /// d_type (DT_REG = 8, DT_DIR = 4, …).
    pub kind: u8,
    pub name: Vec<u8>,
}

impl DirEntry {
    pub fn encoded_len(&self) -> usize {
        ENTRY_OVERHEAD_BYTES + self.name.len()
    }
}

pub fn entries_encoded_len(entries: &[DirEntry]) -> usize {
    entries.iter().map(DirEntry::encoded_len).sum()
}

pub fn encode_entries(w: &mut Writer, entries: &[DirEntry]) {
    for e in entries {
        w.u64(e.cookie);
        w.u64(e.ino);
        w.u8(e.kind);
        w.u8(e.name.len() as u8);
        w.bytes(&e.name);
    }
}

/// Decode a run of entries; checks names and that cookies strictly increase.
pub fn decode_entries(bytes: &[u8], structure: &'static str, location: Location) -> Result<Vec<DirEntry>, FormatError> {
    let mut r = Reader::new(bytes, structure, location);
    let mut out: Vec<DirEntry> = Vec::new();
    while r.remaining() > 0 {
        let cookie = r.u64()?;
        let ino = r.u64()?;
        let kind = r.u8()?;
        let nl = r.u8()? as usize;
        let name = r.take(nl)?.to_vec();
        if name.is_empty() || name.contains(&b'/') || name.contains(&0) || name == b"." || name == b".." {
            return Err(FormatError::invalid(structure, location, format!("bad entry name {:?}", String::from_utf8_lossy(&name))));
        }
        if let Some(prev) = out.last() {
            if prev.cookie >= cookie {
                return Err(FormatError::invalid(structure, location, format!("cookies out of order ({} then {cookie})", prev.cookie)));
            }
        }
        if cookie < crate::name_hash::COOKIE_MIN || cookie > crate::name_hash::COOKIE_MAX || ino == 0 {
            return Err(FormatError::invalid(structure, location, format!("entry cookie {cookie} ino {ino}")));
        }
        out.push(DirEntry { cookie, ino, kind, name });
    }
    Ok(out)
}

/// Identity of a directory block.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DirBlockId {
    pub ino: u64,
    pub index: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirBlock {
    pub id: DirBlockId,
    pub depth: u8,
    /// Encoded size of this block (a fragment's or a full directory block's).
    pub capacity_bytes: u32,
    /// Sorted by cookie.
    pub entries: Vec<DirEntry>,
}

/// Bit-reverse the low `bits` bits of `v`.
pub fn reverse_bits(v: u64, bits: u8) -> u64 {
    if bits == 0 {
        0
    } else {
        v.reverse_bits() >> (64 - bits as u32)
    }
}

/// Logical index of the block holding `cookie` at depth `d`.
pub fn index_for(cookie: u64, d: u8) -> u64 {
    if d == 0 {
        0
    } else {
        reverse_bits(cookie >> (63 - d as u32), d)
    }
}

/// Inclusive cookie range covered by the block at logical `index` and depth `d`.
pub fn cookie_range(index: u64, d: u8) -> (u64, u64) {
    if d == 0 {
        return (0, crate::name_hash::COOKIE_MAX);
    }
    let prefix = reverse_bits(index, d);
    let shift = 63 - d as u32;
    let lo = prefix << shift;
    let hi = lo | ((1u64 << shift) - 1);
    (lo, hi)
}

impl DirBlock {
    pub fn used_bytes(&self) -> usize {
        DIR_BLOCK_HEADER_BYTES + entries_encoded_len(&self.entries)
    }
    pub fn has_room(&self, extra: usize) -> bool {
        self.used_bytes() + extra <= self.capacity_bytes as usize
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::with_capacity(self.capacity_bytes as usize);
        w.u32(DIR_BLOCK_MAGIC as u32);
        w.u16(crate::FORMAT_VERSION);
        w.u32(0);
        w.u64(self.id.ino);
        w.u64(self.id.index);
        w.u8(self.depth);
        w.u32(self.capacity_bytes);
        w.u32(self.entries.len() as u32);
        w.u32(entries_encoded_len(&self.entries) as u32);
        w.pad_to(DIR_BLOCK_HEADER_BYTES);
        encode_entries(&mut w, &self.entries);
        assert!(w.len() <= self.capacity_bytes as usize, "directory block overfull");
        w.pad_to(self.capacity_bytes as usize);
        let crc = crate::checksum_with_hole(&w.buf, CRC_OFFSET);
        w.buf[CRC_OFFSET..CRC_OFFSET + 4].copy_from_slice(&crc.to_le_bytes());
        w.buf
    }

    pub fn decode(bytes: &[u8], expected: DirBlockId, location: Location) -> Result<Self, FormatError> {
        const S: &str = "directory block";
        let mut r = Reader::new(bytes, S, location);
        let magic = r.u32()? as u64;
        let version = r.u16()?;
        let crc = r.u32()?;
        let ino = r.u64()?;
        let index = r.u64()?;
        let depth = r.u8()?;
        let capacity_bytes = r.u32()?;
        let count = r.u32()? as usize;
        let used = r.u32()? as usize;
        if capacity_bytes as usize > bytes.len() || (capacity_bytes as usize) < DIR_BLOCK_HEADER_BYTES {
            if magic != DIR_BLOCK_MAGIC {
                return Err(FormatError::new(S, location, FormatErrorKind::BadMagic { found: magic }));
            }
            return Err(FormatError::invalid(S, location, format!("capacity {capacity_bytes} (buffer {})", bytes.len())));
        }
        let bytes = &bytes[..capacity_bytes as usize];
        check_header(bytes, S, location, DIR_BLOCK_MAGIC, magic, version, CRC_OFFSET, crc)?;
        let found = DirBlockId { ino, index };
        if found != expected {
            return Err(FormatError::new(
                S,
                location,
                FormatErrorKind::WrongIdentity { expected: format!("{expected:?}"), found: format!("{found:?}") },
            ));
        }
        if depth > 62 || (depth < 64 && index >= (1u64 << depth.min(63)) && depth > 0) || (depth == 0 && index != 0) {
            return Err(FormatError::invalid(S, location, format!("index {index} at depth {depth}")));
        }
        if DIR_BLOCK_HEADER_BYTES + used > bytes.len() {
            return Err(FormatError::invalid(S, location, format!("{used} bytes of entries overflow")));
        }
        let entries = decode_entries(&bytes[DIR_BLOCK_HEADER_BYTES..DIR_BLOCK_HEADER_BYTES + used], S, location)?;
        if entries.len() != count {
            return Err(FormatError::invalid(S, location, format!("entry count {count}, found {}", entries.len())));
        }
        let (lo, hi) = cookie_range(index, depth);
        if let Some(e) = entries.iter().find(|e| e.cookie < lo || e.cookie > hi) {
            return Err(FormatError::invalid(S, location, format!("entry cookie {} outside block range {lo}..={hi}", e.cookie)));
        }
        Ok(DirBlock { id: found, depth, capacity_bytes, entries })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn index_and_range_agree() {
        for d in 0..10u8 {
            for i in 0..(1u64 << d) {
                let (lo, hi) = cookie_range(i, d);
                assert_eq!(index_for(lo, d), i);
                assert_eq!(index_for(hi, d), i);
            }
        }
        // A split of block i at depth d: left keeps i, right is i + 2^d.
        let (lo, hi) = cookie_range(3, 2);
        let (llo, lhi) = cookie_range(3, 3);
        let (rlo, rhi) = cookie_range(3 + 4, 3);
        assert_eq!((lo, hi), (llo, rhi));
        assert_eq!(lhi + 1, rlo);
    }
}
