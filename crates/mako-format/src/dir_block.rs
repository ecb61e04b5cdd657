//! Directory entries and directory blocks (extendible hashing, DESIGN.md 3.5).
//!
//! A directory block covers a contiguous range of the 63-bit cookie space: at local
//! depth `d`, the block whose prefix is `p` holds every entry whose cookie's top `d`
//! bits (of 63) equal `p`. Its logical index in the directory file is `p` with its
//! `d` bits reversed, so a split of block `i` at depth `d` creates block `i + 2^d`,
//! and the directory file only ever grows by doubling (sparse, as in GPFS).
//!
//! A block is made of pages (4 KiB, or the whole block when it is a small fragment
//! that is not a multiple of 4 KiB). Page `k` of `n` holds the entries whose cookies
//! fall in the `k`-th `n`-th of the block's cookie range, and carries its own header,
//! identity and checksum. An insert or delete therefore changes one page: the recovery
//! log records that page, not the whole 256 KiB block, and a write torn between pages
//! damages only pages the log holds images of. A block is full when the page an entry
//! belongs in is full; then it splits.

use crate::codec::{check_header, Reader, Writer};
use crate::error::{FormatError, FormatErrorKind, Location};

pub const DIR_BLOCK_MAGIC: u64 = 0x5044_444d; // "MDDP": a directory page
/// Bytes of a page header.
pub const DIR_BLOCK_HEADER_BYTES: usize = 40;
/// Bytes of a directory page (unless the block is a small fragment, see module doc).
pub const DIR_PAGE_BYTES: u32 = 4096;
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
pub fn decode_entries(
    bytes: &[u8],
    structure: &'static str,
    location: Location,
) -> Result<Vec<DirEntry>, FormatError> {
    let mut r = Reader::new(bytes, structure, location);
    let mut out: Vec<DirEntry> = Vec::new();
    while r.remaining() > 0 {
        let cookie = r.u64()?;
        let ino = r.u64()?;
        let kind = r.u8()?;
        let nl = r.u8()? as usize;
        let name = r.take(nl)?.to_vec();
        if name.is_empty()
            || name.contains(&b'/')
            || name.contains(&0)
            || name == b"."
            || name == b".."
        {
            return Err(FormatError::invalid(
                structure,
                location,
                format!("bad entry name {:?}", String::from_utf8_lossy(&name)),
            ));
        }
        if let Some(prev) = out.last() {
            if prev.cookie >= cookie {
                return Err(FormatError::invalid(
                    structure,
                    location,
                    format!("cookies out of order ({} then {cookie})", prev.cookie),
                ));
            }
        }
        if !(crate::name_hash::COOKIE_MIN..=crate::name_hash::COOKIE_MAX).contains(&cookie)
            || ino == 0
        {
            return Err(FormatError::invalid(
                structure,
                location,
                format!("entry cookie {cookie} ino {ino}"),
            ));
        }
        out.push(DirEntry {
            cookie,
            ino,
            kind,
            name,
        });
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

/// Bytes of each page of a block of `capacity` bytes.
pub fn page_bytes(capacity: u32) -> u32 {
    if capacity >= DIR_PAGE_BYTES && capacity.is_multiple_of(DIR_PAGE_BYTES) {
        DIR_PAGE_BYTES
    } else {
        capacity
    }
}

/// Pages of a block of `capacity` bytes.
pub fn pages(capacity: u32) -> u32 {
    capacity / page_bytes(capacity).max(1)
}

/// Bytes of entries one page of a block of `capacity` bytes can hold.
pub fn page_room(capacity: u32) -> usize {
    (page_bytes(capacity) as usize).saturating_sub(DIR_BLOCK_HEADER_BYTES)
}

/// The page of the block (`index`, `depth`, `capacity`) that holds `cookie`.
pub fn page_of(index: u64, depth: u8, capacity: u32, cookie: u64) -> u32 {
    let (lo, hi) = cookie_range(index, depth);
    let n = pages(capacity) as u128;
    let span = (hi - lo) as u128 + 1;
    let off = cookie.clamp(lo, hi) - lo;
    ((off as u128 * n) / span) as u32
}

/// Inclusive cookie range of page `page` of the block (`index`, `depth`, `capacity`).
pub fn page_cookie_range(index: u64, depth: u8, capacity: u32, page: u32) -> (u64, u64) {
    let (lo, hi) = cookie_range(index, depth);
    let n = pages(capacity) as u128;
    let span = (hi - lo) as u128 + 1;
    // The smallest offset whose page is `k` is ceil(k * span / n).
    let first = |k: u128| -> u128 { (k * span).div_ceil(n) };
    let plo = lo + first(page as u128) as u64;
    let phi = lo + (first(page as u128 + 1) - 1) as u64;
    (plo, phi)
}

/// Encode page `page` of a block: its header and `entries` (sorted by cookie, all
/// belonging to this page), padded to the page size.
pub fn encode_page<'a>(
    id: DirBlockId,
    depth: u8,
    capacity: u32,
    page: u32,
    entries: impl Iterator<Item = &'a DirEntry> + Clone,
) -> Vec<u8> {
    let pb = page_bytes(capacity) as usize;
    let mut w = Writer::with_capacity(pb);
    let count = entries.clone().count();
    let used: usize = entries.clone().map(DirEntry::encoded_len).sum();
    w.u32(DIR_BLOCK_MAGIC as u32);
    w.u16(crate::FORMAT_VERSION);
    w.u32(0);
    w.u64(id.ino);
    w.u64(id.index);
    w.u16(page as u16);
    w.u16(pages(capacity) as u16);
    w.u8(depth);
    w.u32(capacity);
    w.u16(count as u16);
    w.u16(used as u16);
    w.pad_to(DIR_BLOCK_HEADER_BYTES);
    for e in entries {
        w.u64(e.cookie);
        w.u64(e.ino);
        w.u8(e.kind);
        w.u8(e.name.len() as u8);
        w.bytes(&e.name);
    }
    assert!(w.len() <= pb, "directory page overfull");
    w.pad_to(pb);
    let crc = crate::checksum_with_hole(&w.buf, CRC_OFFSET);
    w.buf[CRC_OFFSET..CRC_OFFSET + 4].copy_from_slice(&crc.to_le_bytes());
    w.buf
}

impl DirBlock {
    /// Bytes of entries in each page.
    pub fn page_used(&self) -> Vec<usize> {
        let mut used = vec![0usize; pages(self.capacity_bytes) as usize];
        for e in &self.entries {
            used[page_of(self.id.index, self.depth, self.capacity_bytes, e.cookie) as usize] +=
                e.encoded_len();
        }
        used
    }

    /// Room for an entry of `extra` bytes with cookie `cookie`.
    pub fn has_room(&self, cookie: u64, extra: usize) -> bool {
        let p = page_of(self.id.index, self.depth, self.capacity_bytes, cookie) as usize;
        self.page_used()[p] + extra <= page_room(self.capacity_bytes)
    }

    /// Encode every page.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.capacity_bytes as usize);
        let n = pages(self.capacity_bytes);
        let mut rest = &self.entries[..];
        for p in 0..n {
            let (_, phi) = page_cookie_range(self.id.index, self.depth, self.capacity_bytes, p);
            let k = rest.partition_point(|e| e.cookie <= phi);
            out.extend_from_slice(&encode_page(
                self.id,
                self.depth,
                self.capacity_bytes,
                p,
                rest[..k].iter(),
            ));
            rest = &rest[k..];
        }
        assert!(
            rest.is_empty(),
            "directory entries beyond the block's cookie range"
        );
        out
    }

    /// Decode a whole block (every page must be valid and agree on the block's shape).
    pub fn decode(
        bytes: &[u8],
        expected: DirBlockId,
        location: Location,
    ) -> Result<Self, FormatError> {
        const S: &str = "directory block";
        // The first page says how big the block and its pages are.
        let first = Self::decode_page_header(bytes, expected, 0, location)?;
        let capacity = first.capacity;
        if capacity as usize > bytes.len() {
            return Err(FormatError::invalid(
                S,
                location,
                format!("capacity {capacity} (buffer {})", bytes.len()),
            ));
        }
        let pb = page_bytes(capacity) as usize;
        let n = pages(capacity);
        let mut entries = Vec::new();
        for p in 0..n {
            let page_bytes = &bytes[p as usize * pb..(p as usize + 1) * pb];
            let loc = match location {
                Location::Disk(da) => Location::Disk(da.offset_by(p as u64 * pb as u64)),
                Location::Memory => Location::Memory,
            };
            let h = Self::decode_page_header(page_bytes, expected, p, loc)?;
            if h.capacity != capacity || h.depth != first.depth {
                return Err(FormatError::invalid(
                    S,
                    loc,
                    format!(
                        "page {p} says depth {} capacity {}, page 0 says {} {capacity}",
                        h.depth, h.capacity, first.depth
                    ),
                ));
            }
            let body = &page_bytes[DIR_BLOCK_HEADER_BYTES..DIR_BLOCK_HEADER_BYTES + h.used];
            let mine = decode_entries(body, S, loc)?;
            if mine.len() != h.count {
                return Err(FormatError::invalid(
                    S,
                    loc,
                    format!("page {p}: entry count {}, found {}", h.count, mine.len()),
                ));
            }
            let (plo, phi) = page_cookie_range(expected.index, first.depth, capacity, p);
            if let Some(e) = mine.iter().find(|e| e.cookie < plo || e.cookie > phi) {
                return Err(FormatError::invalid(
                    S,
                    loc,
                    format!(
                        "page {p}: entry cookie {} outside the page's range {plo}..={phi}",
                        e.cookie
                    ),
                ));
            }
            entries.extend(mine);
        }
        Ok(DirBlock {
            id: expected,
            depth: first.depth,
            capacity_bytes: capacity,
            entries,
        })
    }

    fn decode_page_header(
        bytes: &[u8],
        expected: DirBlockId,
        page: u32,
        location: Location,
    ) -> Result<PageHeader, FormatError> {
        const S: &str = "directory block";
        let mut r = Reader::new(bytes, S, location);
        let magic = r.u32()? as u64;
        let version = r.u16()?;
        let crc = r.u32()?;
        let ino = r.u64()?;
        let index = r.u64()?;
        let found_page = r.u16()? as u32;
        let npages = r.u16()? as u32;
        let depth = r.u8()?;
        let capacity = r.u32()?;
        let count = r.u16()? as usize;
        let used = r.u16()? as usize;
        let pb = page_bytes(capacity) as usize;
        if magic != DIR_BLOCK_MAGIC {
            return Err(FormatError::new(
                S,
                location,
                FormatErrorKind::BadMagic { found: magic },
            ));
        }
        if capacity < 512 || capacity % 512 != 0 || pb > bytes.len() || npages != pages(capacity) {
            return Err(FormatError::invalid(
                S,
                location,
                format!(
                    "capacity {capacity} with {npages} pages (buffer {})",
                    bytes.len()
                ),
            ));
        }
        check_header(
            &bytes[..pb],
            S,
            location,
            DIR_BLOCK_MAGIC,
            magic,
            version,
            CRC_OFFSET,
            crc,
        )?;
        let found = DirBlockId { ino, index };
        if found != expected || found_page != page {
            return Err(FormatError::new(
                S,
                location,
                FormatErrorKind::WrongIdentity {
                    expected: format!("{expected:?} page {page}"),
                    found: format!("{found:?} page {found_page}"),
                },
            ));
        }
        if depth > 62 || (depth > 0 && index >= (1u64 << depth)) || (depth == 0 && index != 0) {
            return Err(FormatError::invalid(
                S,
                location,
                format!("index {index} at depth {depth}"),
            ));
        }
        if DIR_BLOCK_HEADER_BYTES + used > pb {
            return Err(FormatError::invalid(
                S,
                location,
                format!("{used} bytes of entries overflow the page"),
            ));
        }
        Ok(PageHeader {
            depth,
            capacity,
            count,
            used,
        })
    }
}

struct PageHeader {
    depth: u8,
    capacity: u32,
    count: usize,
    used: usize,
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

    #[test]
    fn pages_partition_the_block_range() {
        for (index, depth) in [(0u64, 0u8), (5, 3), (1, 1), (1000, 12)] {
            for capacity in [2048u32, 6144, 4096, 65536, 262144] {
                let n = pages(capacity);
                let (lo, hi) = cookie_range(index, depth);
                let mut next = lo;
                for p in 0..n {
                    let (plo, phi) = page_cookie_range(index, depth, capacity, p);
                    assert_eq!(plo, next, "page {p} of {n} starts where the previous ended");
                    assert!(phi >= plo);
                    assert_eq!(page_of(index, depth, capacity, plo), p);
                    assert_eq!(page_of(index, depth, capacity, phi), p);
                    next = phi.wrapping_add(1);
                }
                assert_eq!(next.wrapping_sub(1), hi, "the pages cover the block");
            }
        }
    }

    #[test]
    fn a_torn_page_is_caught_and_named() {
        let id = DirBlockId { ino: 9, index: 0 };
        let entries: Vec<DirEntry> = (0..200u64)
            .map(|k| DirEntry {
                cookie: 3 + k * (crate::name_hash::COOKIE_MAX / 201),
                ino: 100 + k,
                kind: 8,
                name: format!("n{k}").into_bytes(),
            })
            .collect();
        let blk = DirBlock {
            id,
            depth: 0,
            capacity_bytes: 65536,
            entries,
        };
        let mut enc = blk.encode();
        assert_eq!(enc.len(), 65536);
        assert_eq!(DirBlock::decode(&enc, id, Location::Memory).unwrap(), blk);
        enc[5 * 4096 + 100] ^= 1;
        let e =
            DirBlock::decode(&enc, id, Location::Disk(crate::DiskAddress::new(1, 8))).unwrap_err();
        assert!(
            e.to_string().contains("1:48"),
            "the damaged page's address is named: {e}"
        );
    }
}
