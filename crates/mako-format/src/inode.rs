//! The inode: a fixed-size record (512 B, 1 KiB or 4 KiB) holding attributes,
//! extended attributes, and either data-in-inode, directory entries, or block pointers.
//!
//! Layout: a 144-byte header, then the payload: the extended attributes first, then
//! the content (inline bytes, or a fixed array of block pointers). Attributes that do
//! not fit in the inode are in xattr blocks (`xattr`), listed by the xattr index block
//! whose address is in the header.
//!
//! Versions: 1, and 2 for an inode with an xattr index (the address at byte 135 is new
//! in version 2, and an older Mako must not take such an inode for one without those
//! attributes — nor its fsck the blocks for leaked space). An inode without one is
//! still written as version 1.

use crate::codec::{check_header_upto, Reader, Writer};
use crate::dir_block::{decode_entries, encode_entries, DirEntry};
use crate::error::{FormatError, FormatErrorKind, Location};
use crate::DiskAddress;

pub const INODE_MAGIC: u64 = 0x4e49_4b4d; // "MKIN"
pub const INODE_HEADER_BYTES: usize = 144;
const CRC_OFFSET: usize = 6;
/// Newest inode version this build reads and writes (see the module doc).
pub const INODE_VERSION: u16 = 2;
/// First inode version with an xattr index address.
pub const INODE_VERSION_XATTR_INDEX: u16 = 2;

/// Inode flags.
pub const FLAG_INLINE: u32 = 1 << 0;
pub const FLAG_POINTERS: u32 = 1 << 1;
/// Metadata file: invisible to users, never freed.
pub const FLAG_SYSTEM: u32 = 1 << 2;
/// Bits 16 and up are file attributes users set with chattr (FS_IOC_SETFLAGS); bits below
/// describe the structure.
/// Immutable (chattr +i): no change of data or attributes, no link, rename or removal,
/// for root too.
pub const FLAG_IMMUTABLE: u32 = 1 << 16;
/// Append-only (chattr +a): data may only be appended; no truncate, rename or removal.
pub const FLAG_APPEND: u32 = 1 << 17;
/// Every flag this format version knows. A decoder refuses an inode with any other bit
/// set, so a flag added by a later version is never silently ignored (an immutable file
/// must not become writable under an older build).
pub const FLAGS_KNOWN: u32 =
    FLAG_INLINE | FLAG_POINTERS | FLAG_SYSTEM | FLAG_IMMUTABLE | FLAG_APPEND;

/// The largest file the format allows, in bytes (4 EiB). A decoder refuses an inode whose
/// size is larger, so no offset arithmetic on a file's size can overflow; the file system
/// answers EFBIG for anything that would make a file larger.
pub const FILE_BYTES_MAX: u64 = 1 << 62;

/// Direct block pointers an inode holds, by inode size.
pub fn pointers_in_inode(inode_bytes: u32) -> usize {
    match inode_bytes {
        512 => 16,
        1024 => 32,
        _ => 64,
    }
}

/// Bytes of payload (xattrs + content) an inode has room for.
pub fn payload_bytes(inode_bytes: u32) -> usize {
    inode_bytes as usize - INODE_HEADER_BYTES
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Timestamp {
    pub sec: i64,
    pub nsec: u32,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InodeContent {
    /// File data or symlink target held in the inode.
    InlineData(Vec<u8>),
    /// A small directory held in the inode, entries sorted by cookie.
    InlineDir(Vec<DirEntry>),
    /// Block pointers: to data blocks (depth 0) or to indirect blocks of level `depth`.
    Pointers(Vec<DiskAddress>),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Inode {
    pub ino: u64,
    pub generation: u32,
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub nlink: u32,
    pub size: u64,
    /// Subblocks allocated to the file (data, indirect and directory blocks).
    pub subblocks: u64,
    pub atime: Timestamp,
    pub mtime: Timestamp,
    pub ctime: Timestamp,
    pub crtime: Timestamp,
    pub rdev: u32,
    /// Flags other than the content kind (which the encoder derives from `content`).
    pub flags: u32,
    /// Depth of the indirect tree (0: the inode points at data blocks).
    pub depth: u8,
    /// Subblocks of the last block when it is a fragment; 0 when it is a full block.
    pub last_block_subblocks: u16,
    pub data_replicas: u8,
    pub metadata_replicas: u8,
    /// Directories: number of entries (without `.` and `..`).
    pub entries: u64,
    /// Directories: the parent directory (`..`). Zero for other files.
    pub parent: u64,
    /// The extended attributes held in the inode.
    pub xattrs: Vec<(Vec<u8>, Vec<u8>)>,
    /// The xattr index block of the attributes that do not fit in the inode (NULL:
    /// there are none). Its blocks count in `subblocks`.
    pub xattr_index: DiskAddress,
    pub content: InodeContent,
}

pub fn xattrs_encoded_len(xattrs: &[(Vec<u8>, Vec<u8>)]) -> usize {
    xattrs.iter().map(|(n, v)| 3 + n.len() + v.len()).sum()
}

impl Inode {
    pub fn new(ino: u64, mode: u32) -> Self {
        Inode {
            ino,
            generation: 0,
            mode,
            uid: 0,
            gid: 0,
            nlink: 0,
            size: 0,
            subblocks: 0,
            atime: Timestamp::default(),
            mtime: Timestamp::default(),
            ctime: Timestamp::default(),
            crtime: Timestamp::default(),
            rdev: 0,
            flags: 0,
            depth: 0,
            last_block_subblocks: 0,
            data_replicas: 1,
            metadata_replicas: 1,
            entries: 0,
            parent: 0,
            xattrs: Vec::new(),
            xattr_index: DiskAddress::NULL,
            content: InodeContent::InlineData(Vec::new()),
        }
    }

    /// Bytes the content needs in the payload.
    pub fn content_len(&self, inode_bytes: u32) -> usize {
        match &self.content {
            InodeContent::InlineData(d) => d.len(),
            InodeContent::InlineDir(e) => crate::dir_block::entries_encoded_len(e),
            InodeContent::Pointers(_) => pointers_in_inode(inode_bytes) * 8,
        }
    }

    /// True if xattrs and content fit in an inode of `inode_bytes`.
    pub fn fits(&self, inode_bytes: u32) -> bool {
        xattrs_encoded_len(&self.xattrs) + self.content_len(inode_bytes)
            <= payload_bytes(inode_bytes)
    }

    pub fn encode(&self, inode_bytes: u32) -> Result<Vec<u8>, FormatError> {
        if !self.fits(inode_bytes) {
            return Err(FormatError::invalid(
                "inode",
                Location::Memory,
                format!(
                    "inode {} content does not fit in {inode_bytes} bytes",
                    self.ino
                ),
            ));
        }
        let mut w = Writer::with_capacity(inode_bytes as usize);
        w.u32(INODE_MAGIC as u32);
        w.u16(if self.xattr_index.is_null() {
            1
        } else {
            INODE_VERSION_XATTR_INDEX
        });
        w.u32(0); // crc
        w.u64(self.ino);
        w.u32(self.generation);
        w.u32(self.mode);
        w.u32(self.uid);
        w.u32(self.gid);
        w.u32(self.nlink);
        w.u64(self.size);
        w.u64(self.subblocks);
        for t in [self.atime, self.mtime, self.ctime, self.crtime] {
            w.i64(t.sec);
            w.u32(t.nsec);
        }
        w.u32(self.rdev);
        let kind = match &self.content {
            InodeContent::InlineData(_) | InodeContent::InlineDir(_) => FLAG_INLINE,
            InodeContent::Pointers(_) => FLAG_POINTERS,
        };
        w.u32((self.flags & !(FLAG_INLINE | FLAG_POINTERS)) | kind);
        w.u8(self.depth);
        w.u16(self.last_block_subblocks);
        w.u8(self.data_replicas);
        w.u8(self.metadata_replicas);
        w.u16(xattrs_encoded_len(&self.xattrs) as u16);
        w.u16(self.content_len(inode_bytes) as u16);
        w.u64(self.entries);
        w.u64(self.parent);
        w.u64(self.xattr_index.raw());
        debug_assert!(w.len() <= INODE_HEADER_BYTES);
        w.pad_to(INODE_HEADER_BYTES);
        for (n, v) in &self.xattrs {
            w.u8(n.len() as u8);
            w.u16(v.len() as u16);
            w.bytes(n);
            w.bytes(v);
        }
        match &self.content {
            InodeContent::InlineData(d) => w.bytes(d),
            InodeContent::InlineDir(e) => encode_entries(&mut w, e),
            InodeContent::Pointers(p) => {
                let n = pointers_in_inode(inode_bytes);
                for i in 0..n {
                    w.u64(p.get(i).copied().unwrap_or(DiskAddress::NULL).raw());
                }
            }
        }
        w.pad_to(inode_bytes as usize);
        let crc = crate::checksum_with_hole(&w.buf, CRC_OFFSET);
        w.buf[CRC_OFFSET..CRC_OFFSET + 4].copy_from_slice(&crc.to_le_bytes());
        Ok(w.buf)
    }

    /// True if the bytes are all zero: an inode slot never written.
    pub fn is_blank(bytes: &[u8]) -> bool {
        bytes.iter().all(|&b| b == 0)
    }

    /// Decode inode `expected_ino` from `bytes` (exactly one inode's worth).
    pub fn decode(
        bytes: &[u8],
        inode_bytes: u32,
        expected_ino: u64,
        location: Location,
    ) -> Result<Self, FormatError> {
        const S: &str = "inode";
        if bytes.len() < inode_bytes as usize {
            return Err(FormatError::new(
                S,
                location,
                FormatErrorKind::Truncated {
                    needed: inode_bytes as usize,
                    available: bytes.len(),
                },
            ));
        }
        let bytes = &bytes[..inode_bytes as usize];
        let mut r = Reader::new(bytes, S, location);
        let magic = r.u32()? as u64;
        let version = r.u16()?;
        let crc = r.u32()?;
        check_header_upto(
            bytes,
            S,
            location,
            INODE_MAGIC,
            magic,
            version,
            INODE_VERSION,
            CRC_OFFSET,
            crc,
        )?;
        let ino = r.u64()?;
        if ino != expected_ino {
            return Err(FormatError::new(
                S,
                location,
                FormatErrorKind::WrongIdentity {
                    expected: format!("inode {expected_ino}"),
                    found: format!("inode {ino}"),
                },
            ));
        }
        let generation = r.u32()?;
        let mode = r.u32()?;
        let uid = r.u32()?;
        let gid = r.u32()?;
        let nlink = r.u32()?;
        let size = r.u64()?;
        let subblocks = r.u64()?;
        let mut times = [Timestamp::default(); 4];
        for t in times.iter_mut() {
            t.sec = r.i64()?;
            t.nsec = r.u32()?;
            if t.nsec >= 1_000_000_000 {
                return Err(FormatError::invalid(
                    S,
                    location,
                    format!("inode {ino}: nanoseconds {}", t.nsec),
                ));
            }
        }
        let rdev = r.u32()?;
        let flags = r.u32()?;
        if flags & !FLAGS_KNOWN != 0 {
            return Err(FormatError::invalid(
                S,
                location,
                format!(
                    "inode {ino}: unknown flags {:#x} (written by a newer Mako?)",
                    flags & !FLAGS_KNOWN
                ),
            ));
        }
        let depth = r.u8()?;
        let last_block_subblocks = r.u16()?;
        let data_replicas = r.u8()?;
        let metadata_replicas = r.u8()?;
        let xattr_len = r.u16()? as usize;
        let content_len = r.u16()? as usize;
        let entries = r.u64()?;
        let parent = r.u64()?;
        let xattr_index = DiskAddress::from_raw(r.u64()?);
        if version < INODE_VERSION_XATTR_INDEX && !xattr_index.is_null() {
            return Err(FormatError::invalid(
                S,
                location,
                format!("inode {ino}: version {version} inode with an xattr index address"),
            ));
        }
        if size > FILE_BYTES_MAX {
            return Err(FormatError::invalid(
                S,
                location,
                format!("inode {ino}: size {size} beyond the largest file ({FILE_BYTES_MAX})"),
            ));
        }
        if xattr_len + content_len > payload_bytes(inode_bytes) {
            return Err(FormatError::invalid(
                S,
                location,
                format!("inode {ino}: payload {xattr_len}+{content_len} bytes overflows"),
            ));
        }
        if depth > 8 {
            return Err(FormatError::invalid(
                S,
                location,
                format!("inode {ino}: indirect depth {depth}"),
            ));
        }
        r.seek(INODE_HEADER_BYTES)?;
        let xbytes = r.take(xattr_len)?;
        let mut xr = Reader::new(xbytes, S, location);
        let mut xattrs = Vec::new();
        while xr.remaining() > 0 {
            let nl = xr.u8()? as usize;
            let vl = xr.u16()? as usize;
            let n = xr.take(nl)?.to_vec();
            let v = xr.take(vl)?.to_vec();
            xattrs.push((n, v));
        }
        let cbytes = r.take(content_len)?;
        let is_dir = mode & 0o170000 == 0o040000;
        let content = if flags & FLAG_POINTERS != 0 {
            let n = pointers_in_inode(inode_bytes);
            if content_len != n * 8 {
                return Err(FormatError::invalid(
                    S,
                    location,
                    format!("inode {ino}: pointer area {content_len} bytes"),
                ));
            }
            let mut cr = Reader::new(cbytes, S, location);
            let mut p = Vec::with_capacity(n);
            for _ in 0..n {
                p.push(DiskAddress::from_raw(cr.u64()?));
            }
            InodeContent::Pointers(p)
        } else if is_dir {
            InodeContent::InlineDir(decode_entries(cbytes, "inline directory", location)?)
        } else {
            InodeContent::InlineData(cbytes.to_vec())
        };
        let [atime, mtime, ctime, crtime] = times;
        Ok(Inode {
            ino,
            generation,
            mode,
            uid,
            gid,
            nlink,
            size,
            subblocks,
            atime,
            mtime,
            ctime,
            crtime,
            rdev,
            flags: flags & !(FLAG_INLINE | FLAG_POINTERS),
            depth,
            last_block_subblocks,
            data_replicas,
            metadata_replicas,
            entries,
            parent,
            xattrs,
            xattr_index,
            content,
        })
    }
}
