//! Extended attributes outside the inode: the xattr index block an inode points at and
//! the xattr blocks it lists. Each is checked (extent, checksum, identity, pieces),
//! its space claimed like any block of the inode, and the pieces put back together.
//! Damage is repaired by writing the attributes that are still whole into new blocks
//! (`rebuild`) — those with a piece in a damaged block are lost, and said so.

use crate::allocator::{RepairAllocator, Use};
use crate::dir_build::BlockWrite;
use crate::layout::Layout;
use crate::problem::{describe, Problem, ProblemKind};
use crate::reader::MetadataReader;
use crate::scan::{Extent, Piece};
use mako_disk::BufferType;
use mako_format::error::Location;
use mako_format::inode::Inode;
use mako_format::xattr::{assemble_lossy, pack, Xattr, XattrBlock, XattrIndex, XattrPiece};
use mako_format::DiskAddress;

/// What the scan found outside one inode.
#[derive(Debug, Default)]
pub struct XattrScan {
    /// The index and the blocks that decoded as what the inode expects.
    pub extents: Vec<Extent>,
    /// Blocks (by place in the index) that cannot be used; `None` as a whole: the
    /// index itself is lost.
    pub damaged: Option<XattrDamage>,
}

/// Why the attributes outside an inode must be rebuilt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum XattrDamage {
    /// The index is unusable: every attribute outside the inode is lost.
    IndexLost,
    /// These blocks are unusable (the others are read again by the repair).
    Blocks(Vec<u32>),
}

fn read(l: &Layout, r: &dyn MetadataReader, ino: u64, da: DiskAddress) -> Result<Vec<u8>, String> {
    l.check_extent(da, l.geo.xattr_block_subblocks())?;
    let mut buf = vec![0u8; l.geo.xattr_block_bytes() as usize];
    r.read(da, &mut buf, BufferType::Xattr, ino)
        .map_err(|e| format!("cannot be read: {e}"))?;
    Ok(buf)
}

/// Check the attributes outside `inode` (nothing to do when it has no index).
pub fn check(
    l: &Layout,
    r: &dyn MetadataReader,
    inode: &Inode,
    slot: DiskAddress,
    problems: &mut Vec<Problem>,
) -> XattrScan {
    let mut out = XattrScan::default();
    let (ino, index_da) = (inode.ino, inode.xattr_index);
    if index_da.is_null() {
        return out;
    }
    let bb = l.geo.xattr_block_bytes();
    let xsb = l.geo.xattr_block_subblocks();
    let lost_all = |why: String, at: DiskAddress, problems: &mut Vec<Problem>| {
        problems.push(
            Problem::new(
                ProblemKind::BadXattrBlock,
                format!("the xattr index block of inode {ino} ({index_da}) {why}; the extended attributes outside the inode are lost"),
                "drop the attributes outside the inode (those in the inode stay)",
            )
            .ino(ino)
            .at(at),
        );
    };
    let index = match read(l, r, ino, index_da).and_then(|b| {
        XattrIndex::decode(&b, bb, ino, Location::Disk(index_da)).map_err(|e| describe(&e))
    }) {
        Ok(i) => i,
        Err(why) => {
            let at = if l.check_extent(index_da, xsb).is_ok() {
                index_da
            } else {
                slot
            };
            lost_all(why, at, problems);
            out.damaged = Some(XattrDamage::IndexLost);
            return out;
        }
    };
    out.extents.push(Extent {
        da: index_da,
        subblocks: xsb,
        piece: Piece::XattrIndex,
    });
    let mut blocks: Vec<Option<Vec<XattrPiece>>> = Vec::with_capacity(index.blocks.len());
    let mut bad = Vec::new();
    for (k, &da) in index.blocks.iter().enumerate() {
        let got = read(l, r, ino, da).and_then(|b| {
            XattrBlock::decode(&b, bb, ino, k as u32, Location::Disk(da)).map_err(|e| describe(&e))
        });
        match got {
            Ok(b) => {
                out.extents.push(Extent {
                    da,
                    subblocks: xsb,
                    piece: Piece::XattrBlock(k as u32),
                });
                blocks.push(Some(b.pieces));
            }
            Err(why) => {
                problems.push(
                    Problem::new(
                        ProblemKind::BadXattrBlock,
                        format!("xattr block {k} of inode {ino} ({da}) {why}; the attributes with a piece in it are lost"),
                        "write the attributes that are whole into new xattr blocks",
                    )
                    .ino(ino)
                    .at(da),
                );
                bad.push(k as u32);
                blocks.push(None);
            }
        }
    }
    let view: Vec<Option<&[XattrPiece]>> = blocks.iter().map(|b| b.as_deref()).collect();
    let (attrs, lost) = assemble_lossy(&view);
    if bad.is_empty() && (!lost.is_empty() || attrs.len() != index.attrs as usize) {
        let why = lost.first().cloned().unwrap_or_else(|| {
            format!(
                "the index counts {} attributes, the blocks hold {}",
                index.attrs,
                attrs.len()
            )
        });
        problems.push(
            Problem::new(
                ProblemKind::BadXattrBlock,
                format!("the xattr blocks of inode {ino} do not fit together: {why}"),
                "write the attributes that are whole into new xattr blocks",
            )
            .ino(ino)
            .at(index_da),
        );
        out.damaged = Some(XattrDamage::Blocks(Vec::new()));
    } else if !bad.is_empty() {
        out.damaged = Some(XattrDamage::Blocks(bad));
    }
    out
}

/// The attributes outside inode `ino` that are still whole, reading its index and
/// blocks again and leaving out `drop` (damaged, or cut from a cross-link). Returns
/// them with a sentence per attribute lost.
pub fn survivors(
    l: &Layout,
    r: &dyn MetadataReader,
    inode: &Inode,
    damage: &XattrDamage,
    drop: &[u32],
) -> (Vec<Xattr>, Vec<String>) {
    let XattrDamage::Blocks(bad) = damage else {
        return (
            Vec::new(),
            vec!["every attribute outside the inode (its index is lost)".into()],
        );
    };
    let (ino, index_da) = (inode.ino, inode.xattr_index);
    let bb = l.geo.xattr_block_bytes();
    let Ok(index) = read(l, r, ino, index_da).and_then(|b| {
        XattrIndex::decode(&b, bb, ino, Location::Disk(index_da)).map_err(|e| describe(&e))
    }) else {
        return (Vec::new(), vec!["every attribute outside the inode".into()]);
    };
    let blocks: Vec<Option<Vec<XattrPiece>>> = index
        .blocks
        .iter()
        .enumerate()
        .map(|(k, &da)| {
            if bad.contains(&(k as u32)) || drop.contains(&(k as u32)) {
                return None;
            }
            read(l, r, ino, da)
                .ok()
                .and_then(|b| XattrBlock::decode(&b, bb, ino, k as u32, Location::Disk(da)).ok())
                .map(|b| b.pieces)
        })
        .collect();
    let view: Vec<Option<&[XattrPiece]>> = blocks.iter().map(|b| b.as_deref()).collect();
    assemble_lossy(&view)
}

/// New xattr blocks and index for `attrs` of inode `ino`, in space the allocator hands
/// out: the index address (NULL when there is nothing to keep), the writes, and the
/// extents. `None` when there is no space.
pub fn rebuild(
    l: &Layout,
    alloc: &mut RepairAllocator,
    ino: u64,
    attrs: &[Xattr],
) -> Option<(DiskAddress, Vec<BlockWrite>, Vec<Extent>)> {
    if attrs.is_empty() {
        return Some((DiskAddress::NULL, Vec::new(), Vec::new()));
    }
    let bb = l.geo.xattr_block_bytes();
    let xsb = l.geo.xattr_block_subblocks();
    let packed = pack(attrs, bb);
    let index_da = alloc.allocate(Use::Metadata, xsb)?;
    let mut writes = Vec::new();
    let mut extents = vec![Extent {
        da: index_da,
        subblocks: xsb,
        piece: Piece::XattrIndex,
    }];
    let mut das = Vec::new();
    for (k, pieces) in packed.into_iter().enumerate() {
        let da = alloc.allocate(Use::Metadata, xsb)?;
        let block = XattrBlock {
            ino,
            index: k as u32,
            pieces,
        };
        writes.push((da, block.encode(bb), BufferType::Xattr));
        extents.push(Extent {
            da,
            subblocks: xsb,
            piece: Piece::XattrBlock(k as u32),
        });
        das.push(da);
    }
    let index = XattrIndex {
        ino,
        attrs: attrs.len() as u32,
        blocks: das,
    };
    writes.push((index_da, index.encode(bb), BufferType::Xattr));
    Some((index_da, writes, extents))
}
