//! Mako's on-disk format: every persistent structure, its encoder and its decoder.
//!
//! Invariants of this crate:
//! - It never does I/O: it turns structures into bytes and bytes into structures.
//! - Every structure is little-endian, carries a magic number and a format version,
//!   and is protected by a crc32c (file data blocks excepted).
//! - Decoding never panics on bad bytes: it returns a [`FormatError`] naming the
//!   structure and the disk address it was read from.
//! - Structures that can be misdirected (inodes, indirect blocks, directory blocks,
//!   xattr blocks, map segments) carry their own identity (inode number, logical index, level) so a
//!   block written to the wrong place is recognised as such, not trusted.

pub mod alloc_segment;
pub mod codec;
pub mod da;
pub mod descriptor;
pub mod dir_block;
pub mod disk_header;
pub mod error;
pub mod geometry;
pub mod indirect;
pub mod inode;
pub mod inode_map_segment;
pub mod log_header;
pub mod log_record;
pub mod log_table;
pub mod name_hash;
pub mod xattr;

pub use da::DiskAddress;
pub use error::{FormatError, FormatErrorKind};

/// Sector size every Mako address is expressed in.
pub const SECTOR_BYTES: u64 = 512;

/// Format version written by this build. Decoders accept versions up to this one.
/// Version 2: recovery logs found through the log table (`log_table`), created as
/// nodes first mount; a version-1 file system (logs at fixed inode numbers) is
/// refused by its descriptor (`descriptor::DESCRIPTOR_VERSION_MIN`).
/// Version 3: the inode allocation map file is sparse and its segment slots never
/// straddle a block (`inode_map_segment::slot_offset`), so a file system may be made
/// for 2^40 inodes and more; a version-2 file system (slots packed across blocks) is
/// refused by its descriptor (`descriptor::DESCRIPTOR_VERSION_MIN`).
pub const FORMAT_VERSION: u16 = 3;

/// crc32c of `bytes` with the 4 bytes at `crc_offset` treated as zero.
pub fn checksum_with_hole(bytes: &[u8], crc_offset: usize) -> u32 {
    let crc = crc32c::crc32c(&bytes[..crc_offset]);
    let crc = crc32c::crc32c_append(crc, &[0u8; 4]);
    crc32c::crc32c_append(crc, &bytes[crc_offset + 4..])
}
