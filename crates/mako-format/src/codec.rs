//! Bounds-checked little-endian writer and reader shared by every structure.
//!
//! The reader returns `Truncated` instead of panicking; decoders build on it so that no
//! byte pattern can make them index out of bounds.

use crate::error::{FormatError, FormatErrorKind, Location};

pub struct Writer {
    pub buf: Vec<u8>,
}

impl Writer {
    pub fn with_capacity(n: usize) -> Self {
        Writer {
            buf: Vec::with_capacity(n),
        }
    }
    pub fn u8(&mut self, v: u8) {
        self.buf.push(v);
    }
    pub fn u16(&mut self, v: u16) {
        self.buf.extend_from_slice(&v.to_le_bytes());
    }
    pub fn u32(&mut self, v: u32) {
        self.buf.extend_from_slice(&v.to_le_bytes());
    }
    pub fn u64(&mut self, v: u64) {
        self.buf.extend_from_slice(&v.to_le_bytes());
    }
    pub fn i64(&mut self, v: i64) {
        self.buf.extend_from_slice(&v.to_le_bytes());
    }
    pub fn bytes(&mut self, v: &[u8]) {
        self.buf.extend_from_slice(v);
    }
    /// A string or byte field with a u16 length prefix.
    pub fn blob16(&mut self, v: &[u8]) {
        self.u16(v.len() as u16);
        self.bytes(v);
    }
    pub fn pad_to(&mut self, len: usize) {
        if self.buf.len() < len {
            self.buf.resize(len, 0);
        }
    }
    pub fn len(&self) -> usize {
        self.buf.len()
    }
    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }
}

pub struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
    structure: &'static str,
    location: Location,
}

impl<'a> Reader<'a> {
    pub fn new(buf: &'a [u8], structure: &'static str, location: Location) -> Self {
        Reader {
            buf,
            pos: 0,
            structure,
            location,
        }
    }
    pub fn pos(&self) -> usize {
        self.pos
    }
    pub fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }
    pub fn seek(&mut self, pos: usize) -> Result<(), FormatError> {
        if pos > self.buf.len() {
            return Err(self.truncated(pos));
        }
        self.pos = pos;
        Ok(())
    }
    fn truncated(&self, needed: usize) -> FormatError {
        FormatError::new(
            self.structure,
            self.location,
            FormatErrorKind::Truncated {
                needed,
                available: self.buf.len(),
            },
        )
    }
    pub fn take(&mut self, n: usize) -> Result<&'a [u8], FormatError> {
        let end = self
            .pos
            .checked_add(n)
            .ok_or_else(|| self.truncated(usize::MAX))?;
        if end > self.buf.len() {
            return Err(self.truncated(end));
        }
        let s = &self.buf[self.pos..end];
        self.pos = end;
        Ok(s)
    }
    pub fn u8(&mut self) -> Result<u8, FormatError> {
        Ok(self.take(1)?[0])
    }
    pub fn u16(&mut self) -> Result<u16, FormatError> {
        let b = self.take(2)?;
        Ok(u16::from_le_bytes([b[0], b[1]]))
    }
    pub fn u32(&mut self) -> Result<u32, FormatError> {
        let b = self.take(4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }
    pub fn u64(&mut self) -> Result<u64, FormatError> {
        let b = self.take(8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_le_bytes(a))
    }
    pub fn i64(&mut self) -> Result<i64, FormatError> {
        Ok(self.u64()? as i64)
    }
    pub fn blob16(&mut self) -> Result<&'a [u8], FormatError> {
        let n = self.u16()? as usize;
        self.take(n)
    }
    pub fn string16(&mut self, field: &str) -> Result<String, FormatError> {
        let b = self.blob16()?;
        String::from_utf8(b.to_vec()).map_err(|_| {
            FormatError::invalid(
                self.structure,
                self.location,
                format!("{field} is not UTF-8"),
            )
        })
    }
}

/// Common header check: magic, version (up to this build's `FORMAT_VERSION`), and
/// crc32c over `bytes[..len]` with the crc at `crc_offset`.
pub fn check_header(
    bytes: &[u8],
    structure: &'static str,
    location: Location,
    magic: u64,
    found_magic: u64,
    version: u16,
    crc_offset: usize,
    stored_crc: u32,
) -> Result<(), FormatError> {
    check_header_upto(
        bytes,
        structure,
        location,
        magic,
        found_magic,
        version,
        crate::FORMAT_VERSION,
        crc_offset,
        stored_crc,
    )
}

/// `check_header` for a structure whose own version runs up to `supported`.
#[allow(clippy::too_many_arguments)]
pub fn check_header_upto(
    bytes: &[u8],
    structure: &'static str,
    location: Location,
    magic: u64,
    found_magic: u64,
    version: u16,
    supported: u16,
    crc_offset: usize,
    stored_crc: u32,
) -> Result<(), FormatError> {
    if found_magic != magic {
        return Err(FormatError::new(
            structure,
            location,
            FormatErrorKind::BadMagic { found: found_magic },
        ));
    }
    if version == 0 || version > supported {
        return Err(FormatError::new(
            structure,
            location,
            FormatErrorKind::UnsupportedVersion {
                found: version,
                supported,
            },
        ));
    }
    let computed = crate::checksum_with_hole(bytes, crc_offset);
    if computed != stored_crc {
        return Err(FormatError::new(
            structure,
            location,
            FormatErrorKind::BadChecksum {
                stored: stored_crc,
                computed,
            },
        ));
    }
    Ok(())
}
