//! Extended attributes kept outside the inode. While a file's attributes fit in its
//! inode they live there (`Inode::xattrs`); the others go to xattr blocks, listed by an
//! xattr index block that the inode points at (`Inode::xattr_index`), as Storage Scale
//! keeps attributes that overflow the inode in separate blocks.
//!
//! Both kinds of block are `Geometry::xattr_block_bytes` long (4 KiB, or a subblock
//! when subblocks are larger) and start with a 48-byte header: magic, format version,
//! crc32c, and their identity — the inode number, and for an xattr block its place in
//! the index — so a misdirected or stale block is recognised, never trusted.
//!
//! - The index: the number of attributes the blocks hold and the blocks' addresses,
//!   in order.
//! - An xattr block: pieces, each `name_len u8, 0 u8, total u32, offset u32, len u32,
//!   name, len bytes of the value from offset`. An attribute that fits in the rest of
//!   a block is one piece (offset 0, len = total); a larger value is cut into pieces
//!   over consecutive blocks (`pack`).
//!
//! Invariants (checked by `XattrBlock::decode` per block and by `assemble` over all of
//! them): names are 1..=255 bytes without NUL; values are at most 64 KiB; the pieces of
//! one value come in block order with increasing offsets and cover it exactly once; a
//! name belongs to one attribute only; the index counts the attributes.

use crate::codec::{check_header, Reader, Writer};
use crate::error::{FormatError, FormatErrorKind, Location};
use crate::DiskAddress;

pub const XATTR_INDEX_MAGIC: u64 = 0x4958_4b4d; // "MKXI"
pub const XATTR_BLOCK_MAGIC: u64 = 0x4158_4b4d; // "MKXA"
/// Bytes of the header of an index or xattr block.
pub const XATTR_HEADER_BYTES: usize = 48;
/// Bytes a piece takes besides its name and value bytes.
pub const XATTR_PIECE_OVERHEAD_BYTES: usize = 14;
/// Longest attribute name (Linux XATTR_NAME_MAX).
pub const XATTR_NAME_BYTES_MAX: usize = 255;
/// Largest attribute value (Linux XATTR_SIZE_MAX).
pub const XATTR_VALUE_BYTES_MAX: usize = 65536;
/// A value is not cut into a piece smaller than this at the end of a block: the rest
/// of that block stays free and the value starts in the next one.
pub const XATTR_PIECE_BYTES_MIN: usize = 256;
const CRC_OFFSET: usize = 6;

/// An extended attribute: (name, value).
pub type Xattr = (Vec<u8>, Vec<u8>);

/// Bytes of an encoded attribute's piece with `name` and `value_bytes` of its value.
pub fn piece_bytes(name: &[u8], value_bytes: usize) -> usize {
    XATTR_PIECE_OVERHEAD_BYTES + name.len() + value_bytes
}

/// Bytes of pieces one xattr block of `block_bytes` holds.
pub fn block_room(block_bytes: u32) -> usize {
    block_bytes as usize - XATTR_HEADER_BYTES
}

/// Xattr blocks one index of `block_bytes` lists.
pub fn index_capacity(block_bytes: u32) -> usize {
    (block_bytes as usize - XATTR_HEADER_BYTES) / 8
}

/// One piece of an attribute in an xattr block.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct XattrPiece {
    pub name: Vec<u8>,
    /// Bytes of the whole value.
    pub total: u32,
    /// Where in the value `bytes` start.
    pub offset: u32,
    pub bytes: Vec<u8>,
}

impl XattrPiece {
    pub fn encoded_len(&self) -> usize {
        piece_bytes(&self.name, self.bytes.len())
    }
}

fn check_name(name: &[u8]) -> Result<(), String> {
    if name.is_empty() || name.len() > XATTR_NAME_BYTES_MAX || name.contains(&0) {
        return Err(format!(
            "attribute name of {} bytes{}",
            name.len(),
            if name.contains(&0) {
                " holding a NUL"
            } else {
                ""
            }
        ));
    }
    Ok(())
}

fn read_header<'a>(
    bytes: &'a [u8],
    block_bytes: u32,
    structure: &'static str,
    magic: u64,
    location: Location,
) -> Result<Reader<'a>, FormatError> {
    if bytes.len() < block_bytes as usize {
        return Err(FormatError::new(
            structure,
            location,
            FormatErrorKind::Truncated {
                needed: block_bytes as usize,
                available: bytes.len(),
            },
        ));
    }
    let bytes = &bytes[..block_bytes as usize];
    let mut r = Reader::new(bytes, structure, location);
    let found = r.u32()? as u64;
    let version = r.u16()?;
    let crc = r.u32()?;
    check_header(
        bytes, structure, location, magic, found, version, CRC_OFFSET, crc,
    )?;
    Ok(r)
}

fn seal(mut w: Writer, block_bytes: u32) -> Vec<u8> {
    w.pad_to(block_bytes as usize);
    let crc = crate::checksum_with_hole(&w.buf, CRC_OFFSET);
    w.buf[CRC_OFFSET..CRC_OFFSET + 4].copy_from_slice(&crc.to_le_bytes());
    w.buf
}

/// The index: the xattr blocks of inode `ino`, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct XattrIndex {
    pub ino: u64,
    /// Attributes the blocks hold.
    pub attrs: u32,
    pub blocks: Vec<DiskAddress>,
}

impl XattrIndex {
    pub fn encode(&self, block_bytes: u32) -> Vec<u8> {
        debug_assert!(self.blocks.len() <= index_capacity(block_bytes));
        let mut w = Writer::with_capacity(block_bytes as usize);
        w.u32(XATTR_INDEX_MAGIC as u32);
        w.u16(crate::FORMAT_VERSION);
        w.u32(0);
        w.u64(self.ino);
        w.u32(self.blocks.len() as u32);
        w.u32(self.attrs);
        w.pad_to(XATTR_HEADER_BYTES);
        for da in &self.blocks {
            w.u64(da.raw());
        }
        seal(w, block_bytes)
    }

    /// Decode the index of inode `ino` from one block's bytes.
    pub fn decode(
        bytes: &[u8],
        block_bytes: u32,
        ino: u64,
        location: Location,
    ) -> Result<Self, FormatError> {
        const S: &str = "xattr index block";
        let mut r = read_header(bytes, block_bytes, S, XATTR_INDEX_MAGIC, location)?;
        let found = r.u64()?;
        if found != ino {
            return Err(FormatError::new(
                S,
                location,
                FormatErrorKind::WrongIdentity {
                    expected: format!("the xattr index of inode {ino}"),
                    found: format!("the xattr index of inode {found}"),
                },
            ));
        }
        let count = r.u32()? as usize;
        let attrs = r.u32()?;
        if count == 0 || count > index_capacity(block_bytes) {
            return Err(FormatError::invalid(
                S,
                location,
                format!(
                    "inode {ino}: {count} xattr blocks listed (1..={})",
                    index_capacity(block_bytes)
                ),
            ));
        }
        r.seek(XATTR_HEADER_BYTES)?;
        let mut blocks = Vec::with_capacity(count);
        for k in 0..count {
            let da = DiskAddress::from_raw(r.u64()?);
            if da.is_null() {
                return Err(FormatError::invalid(
                    S,
                    location,
                    format!("inode {ino}: xattr block {k} has no address"),
                ));
            }
            blocks.push(da);
        }
        Ok(XattrIndex { ino, attrs, blocks })
    }
}

/// One xattr block: block `index` of inode `ino`'s index.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct XattrBlock {
    pub ino: u64,
    pub index: u32,
    pub pieces: Vec<XattrPiece>,
}

impl XattrBlock {
    pub fn used_bytes(&self) -> usize {
        self.pieces.iter().map(XattrPiece::encoded_len).sum()
    }

    pub fn encode(&self, block_bytes: u32) -> Vec<u8> {
        debug_assert!(self.used_bytes() <= block_room(block_bytes));
        let mut w = Writer::with_capacity(block_bytes as usize);
        w.u32(XATTR_BLOCK_MAGIC as u32);
        w.u16(crate::FORMAT_VERSION);
        w.u32(0);
        w.u64(self.ino);
        w.u32(self.index);
        w.u32(self.pieces.len() as u32);
        w.u32(self.used_bytes() as u32);
        w.pad_to(XATTR_HEADER_BYTES);
        for p in &self.pieces {
            w.u8(p.name.len() as u8);
            w.u8(0);
            w.u32(p.total);
            w.u32(p.offset);
            w.u32(p.bytes.len() as u32);
            w.bytes(&p.name);
            w.bytes(&p.bytes);
        }
        seal(w, block_bytes)
    }

    /// Decode xattr block `index` of inode `ino` from one block's bytes.
    pub fn decode(
        bytes: &[u8],
        block_bytes: u32,
        ino: u64,
        index: u32,
        location: Location,
    ) -> Result<Self, FormatError> {
        const S: &str = "xattr block";
        let mut r = read_header(bytes, block_bytes, S, XATTR_BLOCK_MAGIC, location)?;
        let found_ino = r.u64()?;
        let found_index = r.u32()?;
        if (found_ino, found_index) != (ino, index) {
            return Err(FormatError::new(
                S,
                location,
                FormatErrorKind::WrongIdentity {
                    expected: format!("xattr block {index} of inode {ino}"),
                    found: format!("xattr block {found_index} of inode {found_ino}"),
                },
            ));
        }
        let count = r.u32()? as usize;
        let used = r.u32()? as usize;
        if used > block_room(block_bytes) {
            return Err(FormatError::invalid(
                S,
                location,
                format!("inode {ino}: xattr block {index} says it holds {used} bytes"),
            ));
        }
        r.seek(XATTR_HEADER_BYTES)?;
        let mut pr = Reader::new(r.take(used)?, S, location);
        let mut pieces = Vec::new();
        while pr.remaining() > 0 {
            let name_len = pr.u8()? as usize;
            let _ = pr.u8()?;
            let total = pr.u32()?;
            let offset = pr.u32()?;
            let len = pr.u32()? as usize;
            let name = pr.take(name_len)?.to_vec();
            let bytes = pr.take(len)?.to_vec();
            let bad = check_name(&name).err().or_else(|| {
                (total as usize > XATTR_VALUE_BYTES_MAX
                    || offset as u64 + len as u64 > total as u64)
                    .then(|| format!("a piece of {len} bytes at {offset} of a {total}-byte value"))
            });
            if let Some(why) = bad {
                return Err(FormatError::invalid(
                    S,
                    location,
                    format!("inode {ino}: xattr block {index}: {why}"),
                ));
            }
            pieces.push(XattrPiece {
                name,
                total,
                offset,
                bytes,
            });
        }
        if pieces.len() != count {
            return Err(FormatError::invalid(
                S,
                location,
                format!(
                    "inode {ino}: xattr block {index} says it holds {count} pieces, it holds {}",
                    pieces.len()
                ),
            ));
        }
        Ok(XattrBlock { ino, index, pieces })
    }
}

/// Cut attributes into the pieces of consecutive xattr blocks of `block_bytes`, in
/// order: an attribute goes whole into the current block when it fits, else its value
/// is cut at the end of the block (if at least `XATTR_PIECE_BYTES_MIN` of it fits
/// there) and goes on in the next. The same attributes always give the same blocks, so
/// a change rewrites only the blocks from the first one it touches.
pub fn pack(attrs: &[Xattr], block_bytes: u32) -> Vec<Vec<XattrPiece>> {
    let room = block_room(block_bytes);
    let mut blocks = Vec::new();
    let mut cur: Vec<XattrPiece> = Vec::new();
    let mut used = 0usize;
    for (name, value) in attrs {
        let overhead = piece_bytes(name, 0);
        let mut offset = 0usize;
        loop {
            let rest = value.len() - offset;
            let free = room - used;
            let n = if overhead + rest <= free {
                rest
            } else if rest > 0 && free >= overhead + XATTR_PIECE_BYTES_MIN {
                free - overhead
            } else {
                blocks.push(std::mem::take(&mut cur));
                used = 0;
                continue;
            };
            cur.push(XattrPiece {
                name: name.clone(),
                total: value.len() as u32,
                offset: offset as u32,
                bytes: value[offset..offset + n].to_vec(),
            });
            used += overhead + n;
            offset += n;
            if offset == value.len() {
                break;
            }
        }
    }
    if !cur.is_empty() {
        blocks.push(cur);
    }
    blocks
}

/// Attributes put back together from the pieces of every block, in order. `None`
/// stands for a block that could not be read: attributes with a piece there are lost.
/// Returns the complete attributes and a sentence per attribute that is not.
pub fn assemble_lossy(blocks: &[Option<&[XattrPiece]>]) -> (Vec<Xattr>, Vec<String>) {
    struct Partial {
        total: u32,
        value: Vec<u8>,
        /// A piece is missing (a lost block, a gap, a mismatch): the attribute is lost.
        broken: Option<String>,
    }
    let mut order: Vec<Vec<u8>> = Vec::new();
    let mut parts: std::collections::HashMap<Vec<u8>, Partial> = Default::default();
    let mut lost_block_seen = false;
    for block in blocks {
        let Some(pieces) = block else {
            // Every attribute not complete yet had its next piece there, maybe.
            for p in parts.values_mut() {
                if p.value.len() < p.total as usize && p.broken.is_none() {
                    p.broken = Some("a piece of it was in an unreadable xattr block".into());
                }
            }
            lost_block_seen = true;
            continue;
        };
        for piece in pieces.iter() {
            match parts.get_mut(&piece.name) {
                None => {
                    let broken = (piece.offset != 0).then(|| {
                        if lost_block_seen {
                            "its first piece was in an unreadable xattr block".to_string()
                        } else {
                            format!("its first piece starts at byte {}", piece.offset)
                        }
                    });
                    order.push(piece.name.clone());
                    parts.insert(
                        piece.name.clone(),
                        Partial {
                            total: piece.total,
                            value: piece.bytes.clone(),
                            broken,
                        },
                    );
                }
                Some(p) => {
                    if p.broken.is_some() {
                        continue;
                    }
                    if p.value.len() == p.total as usize {
                        p.broken = Some("two attributes have this name".into());
                    } else if piece.total != p.total || piece.offset as usize != p.value.len() {
                        p.broken = Some(format!(
                            "a piece at byte {} of {} follows {} bytes of {}",
                            piece.offset,
                            piece.total,
                            p.value.len(),
                            p.total
                        ));
                    } else {
                        p.value.extend_from_slice(&piece.bytes);
                    }
                }
            }
        }
    }
    let mut out = Vec::new();
    let mut lost = Vec::new();
    for name in order {
        let p = parts.remove(&name).expect("every name seen has a part");
        let shown = String::from_utf8_lossy(&name).into_owned();
        match p.broken {
            Some(why) => lost.push(format!("{shown:?}: {why}")),
            None if p.value.len() != p.total as usize => lost.push(format!(
                "{shown:?}: {} of its {} bytes are there",
                p.value.len(),
                p.total
            )),
            None => out.push((name, p.value)),
        }
    }
    (out, lost)
}

/// Attributes put back together from every block's pieces; an error names the first
/// inconsistency (the blocks are damaged).
pub fn assemble(blocks: &[XattrBlock]) -> Result<Vec<Xattr>, String> {
    let refs: Vec<Option<&[XattrPiece]>> = blocks.iter().map(|b| Some(&b.pieces[..])).collect();
    let (attrs, lost) = assemble_lossy(&refs);
    match lost.first() {
        Some(why) => Err(format!("attribute {why}")),
        None => Ok(attrs),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attrs(n: usize, value_bytes: impl Fn(usize) -> usize) -> Vec<Xattr> {
        (0..n)
            .map(|i| {
                (
                    format!("user.attribute_{i}").into_bytes(),
                    (0..value_bytes(i)).map(|k| (k * 7 + i) as u8).collect(),
                )
            })
            .collect()
    }

    #[test]
    fn pack_and_assemble_round_trip_small_and_large_values() {
        for block in [4096u32, 8192, 16384] {
            let mut a = attrs(300, |i| i % 40);
            a.push((b"user.big".to_vec(), vec![0xab; XATTR_VALUE_BYTES_MAX]));
            a.push((b"user.empty".to_vec(), Vec::new()));
            a.extend(attrs(3, |_| 5000).into_iter().map(|(mut n, v)| {
                n.extend_from_slice(b".large");
                (n, v)
            }));
            let blocks = pack(&a, block);
            for b in &blocks {
                let used: usize = b.iter().map(XattrPiece::encoded_len).sum();
                assert!(used <= block_room(block), "a block overflows");
            }
            let xb: Vec<XattrBlock> = blocks
                .iter()
                .enumerate()
                .map(|(k, p)| XattrBlock {
                    ino: 9,
                    index: k as u32,
                    pieces: p.clone(),
                })
                .collect();
            for b in &xb {
                let enc = b.encode(block);
                assert_eq!(enc.len(), block as usize);
                let dec = XattrBlock::decode(&enc, block, 9, b.index, Location::Memory).unwrap();
                assert_eq!(&dec, b);
            }
            assert_eq!(assemble(&xb).unwrap(), a);
            // A 64 KiB value takes about 64 KiB: its pieces fill the blocks.
            let total: usize = a.iter().map(|(n, v)| n.len() + v.len()).sum();
            assert!(blocks.len() * block_room(block) < total * 11 / 10 + 2 * block as usize);
        }
    }

    #[test]
    fn a_lost_block_loses_only_the_attributes_with_a_piece_in_it() {
        let mut a = attrs(100, |_| 50);
        a.insert(50, (b"user.big".to_vec(), vec![7; 20_000]));
        let blocks = pack(&a, 4096);
        let hit = blocks
            .iter()
            .position(|b| b.iter().any(|p| p.name == b"user.big" && p.offset > 0))
            .unwrap();
        let view: Vec<Option<&[XattrPiece]>> = blocks
            .iter()
            .enumerate()
            .map(|(k, b)| (k != hit).then_some(&b[..]))
            .collect();
        let (kept, lost) = assemble_lossy(&view);
        assert!(lost.iter().any(|l| l.contains("user.big")), "{lost:?}");
        assert!(!kept.iter().any(|(n, _)| n == b"user.big"));
        let in_hit: Vec<&Vec<u8>> = blocks[hit].iter().map(|p| &p.name).collect();
        for (n, v) in &a {
            if !in_hit.contains(&n) {
                assert!(kept.contains(&(n.clone(), v.clone())), "{n:?} kept");
            }
        }
    }

    #[test]
    fn inconsistent_pieces_are_refused() {
        let a = vec![(b"user.a".to_vec(), vec![1u8; 10_000])];
        let mut blocks: Vec<XattrBlock> = pack(&a, 4096)
            .into_iter()
            .enumerate()
            .map(|(k, pieces)| XattrBlock {
                ino: 1,
                index: k as u32,
                pieces,
            })
            .collect();
        assert!(assemble(&blocks).is_ok());
        let mut twice = blocks.clone();
        twice.extend(blocks.clone());
        assert!(assemble(&twice).unwrap_err().contains("two attributes"));
        blocks.remove(1);
        assert!(assemble(&blocks).is_err());
    }

    #[test]
    fn identity_and_fields_are_checked() {
        let b = XattrBlock {
            ino: 5,
            index: 2,
            pieces: vec![XattrPiece {
                name: b"user.x".to_vec(),
                total: 3,
                offset: 0,
                bytes: b"abc".to_vec(),
            }],
        };
        let enc = b.encode(4096);
        let e = XattrBlock::decode(&enc, 4096, 5, 3, Location::Memory).unwrap_err();
        assert!(e.to_string().contains("xattr block 3 of inode 5"), "{e}");
        let e = XattrBlock::decode(&enc, 4096, 6, 2, Location::Memory).unwrap_err();
        assert!(matches!(e.kind, FormatErrorKind::WrongIdentity { .. }));
        let i = XattrIndex {
            ino: 5,
            attrs: 1,
            blocks: vec![DiskAddress::new(0, 64)],
        };
        let enc = i.encode(4096);
        assert_eq!(
            XattrIndex::decode(&enc, 4096, 5, Location::Memory).unwrap(),
            i
        );
        assert!(XattrIndex::decode(&enc, 4096, 4, Location::Memory).is_err());
        // An index or block read where the other was expected is named as such.
        let e = XattrBlock::decode(&enc, 4096, 5, 0, Location::Memory).unwrap_err();
        assert!(matches!(e.kind, FormatErrorKind::BadMagic { .. }));
    }
}
