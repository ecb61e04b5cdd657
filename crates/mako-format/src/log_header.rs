//! The header of a per-node recovery log file (DESIGN.md 3.6).
//!
//! The log file starts with two copies of the header, one sector each (a sector is
//! written atomically, so each copy is old or new, never a mixture; two copies survive
//! one damaged sector). The valid copy with the greater tail LSN wins. The circular
//! area of transactions (`log_record`) starts at `LOG_RECORDS_OFFSET`.

use crate::codec::{check_header, Reader, Writer};
use crate::error::{FormatError, FormatErrorKind, Location};

pub const LOG_HEADER_MAGIC: u64 = u64::from_le_bytes(*b"MAKOLOGH");
pub const LOG_HEADER_BYTES: usize = 512;
/// Byte offsets of the two header copies in the log file.
pub const LOG_HEADER_OFFSETS: [u64; 2] = [0, 512];
/// Byte offset where the circular area of transactions starts.
pub const LOG_RECORDS_OFFSET: u64 = 4096;
const CRC_OFFSET: usize = 10;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogHeader {
    pub node: u32,
    pub log_bytes: u64,
    /// Sequence number of the oldest record still needed for recovery.
    pub tail_lsn: u64,
    /// Sequence number the next record will get.
    pub head_lsn: u64,
    /// True when the node stopped cleanly: nothing to replay.
    pub clean: bool,
}

/// The header to trust of the two copies read from a log file: the valid one with the
/// greater tail LSN. Returns it with the index of the copy, or the errors of both.
pub fn best_copy(
    copies: [Result<LogHeader, FormatError>; 2],
) -> Result<(LogHeader, usize), Box<[FormatError; 2]>> {
    match copies {
        [Ok(a), Ok(b)] => Ok(if b.tail_lsn > a.tail_lsn {
            (b, 1)
        } else {
            (a, 0)
        }),
        [Ok(a), Err(_)] => Ok((a, 0)),
        [Err(_), Ok(b)] => Ok((b, 1)),
        [Err(a), Err(b)] => Err(Box::new([a, b])),
    }
}

impl LogHeader {
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::with_capacity(LOG_HEADER_BYTES);
        w.u64(LOG_HEADER_MAGIC);
        w.u16(crate::FORMAT_VERSION);
        w.u32(0);
        w.u32(self.node);
        w.u64(self.log_bytes);
        w.u64(self.tail_lsn);
        w.u64(self.head_lsn);
        w.u8(self.clean as u8);
        w.pad_to(LOG_HEADER_BYTES);
        let crc = crate::checksum_with_hole(&w.buf, CRC_OFFSET);
        w.buf[CRC_OFFSET..CRC_OFFSET + 4].copy_from_slice(&crc.to_le_bytes());
        w.buf
    }
    pub fn decode(
        bytes: &[u8],
        expected_node: u32,
        location: Location,
    ) -> Result<Self, FormatError> {
        const S: &str = "log header";
        if bytes.len() < LOG_HEADER_BYTES {
            return Err(FormatError::new(
                S,
                location,
                FormatErrorKind::Truncated {
                    needed: LOG_HEADER_BYTES,
                    available: bytes.len(),
                },
            ));
        }
        let bytes = &bytes[..LOG_HEADER_BYTES];
        let mut r = Reader::new(bytes, S, location);
        let magic = r.u64()?;
        let version = r.u16()?;
        let crc = r.u32()?;
        check_header(
            bytes,
            S,
            location,
            LOG_HEADER_MAGIC,
            magic,
            version,
            CRC_OFFSET,
            crc,
        )?;
        let node = r.u32()?;
        if node != expected_node {
            return Err(FormatError::new(
                S,
                location,
                FormatErrorKind::WrongIdentity {
                    expected: format!("log of node {expected_node}"),
                    found: format!("log of node {node}"),
                },
            ));
        }
        let log_bytes = r.u64()?;
        let tail_lsn = r.u64()?;
        let head_lsn = r.u64()?;
        let clean = r.u8()? != 0;
        if tail_lsn > head_lsn {
            return Err(FormatError::invalid(
                S,
                location,
                format!("tail LSN {tail_lsn} after head LSN {head_lsn}"),
            ));
        }
        Ok(LogHeader {
            node,
            log_bytes,
            tail_lsn,
            head_lsn,
            clean,
        })
    }
}
