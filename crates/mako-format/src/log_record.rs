//! Transactions of the per-node recovery log (DESIGN.md 3.6).
//!
//! A transaction is the unit of atomicity: every metadata change made between two
//! commits, written as one contiguous run of the circular log. It starts at a
//! sector-aligned log sequence number (LSN: the byte position in the endless log
//! stream; the physical offset is `LOG_RECORDS_OFFSET + lsn % capacity`) with a
//! 64-byte header, followed by the records, padded to a whole sector:
//!
//! ```text
//! header  magic "MAKOLOGT" u64 | version u16 | crc u32 (header, with hole) | node u32
//!         | fs uuid [16] | lsn u64 | seq u64 | records u32 | payload bytes u32
//!         | payload crc u32 | zero padding to 64
//! image   kind u8 = 1 | disk u32 | sector u64 | length u32 | stored u32
//!         | stored bytes (the image; the remaining length - stored bytes are zero)
//! revoke  kind u8 = 2 | disk u32 | sector u64 | length u32 | upto seq u64
//! ```
//!
//! Image records are physical redo images: "these bytes belong at this disk address".
//! Replaying them in log order is idempotent, and a metadata block torn by a crash
//! during write-back is rewritten whole from its image.
//!
//! A revoke record (`LogRevoke`, transaction version 2) says "the images of these
//! sectors in this log's transactions up to number `upto_seq` are obsolete: do not
//! replay them". A node writes one
//! after it has written a structure in place because the token covering it leaves for
//! another node (docs/coherence.md section 7): from then on the other node may change
//! the structure, and its newer copy must never be overwritten by this log's older
//! image, whatever order the logs are replayed in. Images of later transactions (the
//! token came back) are replayed as usual. A transaction holding a revoke is written as
//! version 2, so a Mako that knows no revokes refuses it instead of replaying the
//! images it cancels; transactions without one stay version 1. A transaction is valid only if
//! its header checksum, its identity (node, file system, LSN) and its payload checksum
//! all match: a torn or partly lost transaction is recognised, and a transaction left
//! from an earlier lap of the circle or from another file system is never taken for a
//! current one. Whether a bad transaction ends the log (a torn last commit) or is
//! media damage (a valid transaction follows it) is recovery's to decide
//! (`mako_fs::recovery`).

use crate::codec::{check_header_upto, Reader, Writer};
use crate::error::{FormatError, FormatErrorKind, Location};
use crate::DiskAddress;

pub const TXN_MAGIC: u64 = u64::from_le_bytes(*b"MAKOLOGT");
pub const TXN_HEADER_BYTES: usize = 64;
const CRC_OFFSET: usize = 10;
/// Record kind: a physical image of metadata bytes at a disk address.
pub const RECORD_IMAGE: u8 = 1;
/// Record kind: earlier images of these sectors in this log are not to be replayed.
pub const RECORD_REVOKE: u8 = 2;
/// Transaction version of a transaction without revoke records.
pub const TXN_VERSION_IMAGES: u16 = 1;
/// Transaction version with revoke records (the newest this build reads and writes).
pub const TXN_VERSION_REVOKE: u16 = 2;
/// Bytes of a record before its image bytes.
pub const RECORD_HEADER_BYTES: usize = 21;
/// Largest image one record may describe (a directory block is at most 256 KiB; an
/// inode-file chunk or a map page is smaller). Guards the decoder against absurd lengths.
pub const IMAGE_BYTES_MAX: u32 = 16 << 20;

/// The fixed header of a transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TxnHeader {
    /// 1, or 2 when the transaction may hold revoke records.
    pub version: u16,
    pub node: u32,
    pub fs_uuid: [u8; 16],
    /// Where this transaction starts in the log stream (its identity).
    pub lsn: u64,
    /// Transaction sequence number (diagnostics; increases by one per transaction).
    pub seq: u64,
    pub records: u32,
    pub payload_bytes: u32,
    pub payload_crc: u32,
}

/// One redo record: `bytes` belong at `da`, followed by `length - bytes.len()` zeros.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogImage {
    pub da: DiskAddress,
    /// Bytes the image covers on disk (a multiple of the sector size).
    pub length: u32,
    /// The image without its trailing zeros (which are implied).
    pub bytes: Vec<u8>,
}

impl LogImage {
    /// An image of `full` at `da`, stored without its trailing zeros.
    pub fn trimmed(da: DiskAddress, full: &[u8]) -> LogImage {
        let keep = full.iter().rposition(|&b| b != 0).map_or(0, |i| i + 1);
        LogImage {
            da,
            length: full.len() as u32,
            bytes: full[..keep].to_vec(),
        }
    }
    /// An image of `full` at `da`, trimmed in place (no copy).
    pub fn from_vec(da: DiskAddress, mut full: Vec<u8>) -> LogImage {
        let length = full.len() as u32;
        let keep = full.iter().rposition(|&b| b != 0).map_or(0, |i| i + 1);
        full.truncate(keep);
        LogImage {
            da,
            length,
            bytes: full,
        }
    }
    /// The whole image, trailing zeros restored.
    pub fn expanded(&self) -> Vec<u8> {
        let mut v = self.bytes.clone();
        v.resize(self.length as usize, 0);
        v
    }
    pub fn encoded_len(&self) -> usize {
        RECORD_HEADER_BYTES + self.bytes.len()
    }
    /// Lay this image over `buf`, just read from `da`: the part of the image the
    /// buffer covers replaces what was read (stored bytes, then the implied zeros).
    /// Nothing happens where they do not overlap (or are on different disks).
    pub fn apply(&self, da: DiskAddress, buf: &mut [u8]) {
        if self.da.disk() != da.disk() {
            return;
        }
        let (blo, ilo) = (da.byte_offset(), self.da.byte_offset());
        let (lo, hi) = (
            ilo.max(blo),
            (ilo + self.length as u64).min(blo + buf.len() as u64),
        );
        if lo >= hi {
            return;
        }
        let stored_hi = (ilo + self.bytes.len() as u64).clamp(lo, hi);
        if stored_hi > lo {
            buf[(lo - blo) as usize..(stored_hi - blo) as usize]
                .copy_from_slice(&self.bytes[(lo - ilo) as usize..(stored_hi - ilo) as usize]);
        }
        buf[(stored_hi - blo) as usize..(hi - blo) as usize].fill(0);
    }
}

/// A revoke record: images overlapping `length` bytes at `da` in this log's
/// transactions numbered up to `upto_seq` are not to be replayed (the structure was
/// written in place and its token left the node).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogRevoke {
    pub da: DiskAddress,
    /// Bytes covered (a multiple of the sector size).
    pub length: u32,
    /// The last transaction whose images of these bytes are revoked.
    pub upto_seq: u64,
}

/// Bytes of a revoke record.
pub const REVOKE_RECORD_BYTES: usize = 25;

impl LogRevoke {
    /// True if this revoke covers any byte of `img`.
    pub fn overlaps(&self, img: &LogImage) -> bool {
        self.da.disk() == img.da.disk()
            && self.da.sector() < img.da.sector() + img.length as u64 / crate::SECTOR_BYTES
            && img.da.sector() < self.da.sector() + self.length as u64 / crate::SECTOR_BYTES
    }
}

/// One record of a transaction, in log order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LogRecord {
    Image(LogImage),
    Revoke(LogRevoke),
}

/// Round up to a whole sector.
pub fn sector_round(n: usize) -> usize {
    n.div_ceil(crate::SECTOR_BYTES as usize) * crate::SECTOR_BYTES as usize
}

/// Encode a whole transaction of images (header, records, padding to a sector).
pub fn encode_txn<'a>(
    node: u32,
    fs_uuid: [u8; 16],
    lsn: u64,
    seq: u64,
    images: impl Iterator<Item = &'a LogImage> + Clone,
) -> Vec<u8> {
    encode_txn_with(node, fs_uuid, lsn, seq, &[], images)
}

/// Encode a whole transaction: the revoke records, then the images. With revokes the
/// transaction is version 2.
pub fn encode_txn_with<'a>(
    node: u32,
    fs_uuid: [u8; 16],
    lsn: u64,
    seq: u64,
    revokes: &[LogRevoke],
    images: impl Iterator<Item = &'a LogImage> + Clone,
) -> Vec<u8> {
    let payload_len: usize = revokes.len() * REVOKE_RECORD_BYTES
        + images.clone().map(|i| i.encoded_len()).sum::<usize>();
    let count = revokes.len() + images.clone().count();
    let mut w = Writer::with_capacity(sector_round(TXN_HEADER_BYTES + payload_len));
    w.pad_to(TXN_HEADER_BYTES);
    for r in revokes {
        w.u8(RECORD_REVOKE);
        w.u32(r.da.disk());
        w.u64(r.da.sector());
        w.u32(r.length);
        w.u64(r.upto_seq);
    }
    for img in images {
        w.u8(RECORD_IMAGE);
        w.u32(img.da.disk());
        w.u64(img.da.sector());
        w.u32(img.length);
        w.u32(img.bytes.len() as u32);
        w.bytes(&img.bytes);
    }
    let payload_crc = crc32c::crc32c(&w.buf[TXN_HEADER_BYTES..]);
    let header = TxnHeader {
        version: if revokes.is_empty() {
            TXN_VERSION_IMAGES
        } else {
            TXN_VERSION_REVOKE
        },
        node,
        fs_uuid,
        lsn,
        seq,
        records: count as u32,
        payload_bytes: payload_len as u32,
        payload_crc,
    };
    w.buf[..TXN_HEADER_BYTES].copy_from_slice(&header.encode());
    let total = sector_round(w.len());
    w.pad_to(total);
    w.buf
}

impl TxnHeader {
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::with_capacity(TXN_HEADER_BYTES);
        w.u64(TXN_MAGIC);
        w.u16(self.version);
        w.u32(0);
        w.u32(self.node);
        w.bytes(&self.fs_uuid);
        w.u64(self.lsn);
        w.u64(self.seq);
        w.u32(self.records);
        w.u32(self.payload_bytes);
        w.u32(self.payload_crc);
        w.pad_to(TXN_HEADER_BYTES);
        let crc = crate::checksum_with_hole(&w.buf, CRC_OFFSET);
        w.buf[CRC_OFFSET..CRC_OFFSET + 4].copy_from_slice(&crc.to_le_bytes());
        w.buf
    }

    /// Decode the header of the transaction expected at `expected_lsn` of node
    /// `expected_node`'s log in file system `fs_uuid`. An error means the log ends here
    /// (or, for a checksum-valid header of the wrong identity, that it holds an older lap).
    pub fn decode(
        bytes: &[u8],
        expected_node: u32,
        fs_uuid: [u8; 16],
        expected_lsn: u64,
        location: Location,
    ) -> Result<Self, FormatError> {
        const S: &str = "log transaction header";
        if bytes.len() < TXN_HEADER_BYTES {
            return Err(FormatError::new(
                S,
                location,
                FormatErrorKind::Truncated {
                    needed: TXN_HEADER_BYTES,
                    available: bytes.len(),
                },
            ));
        }
        let bytes = &bytes[..TXN_HEADER_BYTES];
        let mut r = Reader::new(bytes, S, location);
        let magic = r.u64()?;
        let version = r.u16()?;
        let crc = r.u32()?;
        check_header_upto(
            bytes,
            S,
            location,
            TXN_MAGIC,
            magic,
            version,
            TXN_VERSION_REVOKE,
            CRC_OFFSET,
            crc,
        )?;
        let node = r.u32()?;
        let mut uuid = [0u8; 16];
        uuid.copy_from_slice(r.take(16)?);
        let lsn = r.u64()?;
        let seq = r.u64()?;
        let records = r.u32()?;
        let payload_bytes = r.u32()?;
        let payload_crc = r.u32()?;
        let wrong = |expected: String, found: String| {
            FormatError::new(
                S,
                location,
                FormatErrorKind::WrongIdentity { expected, found },
            )
        };
        if node != expected_node {
            return Err(wrong(
                format!("a transaction of node {expected_node}"),
                format!("one of node {node}"),
            ));
        }
        if uuid != fs_uuid {
            return Err(wrong(
                "a transaction of this file system".into(),
                "one of another file system".into(),
            ));
        }
        if lsn != expected_lsn {
            return Err(wrong(format!("LSN {expected_lsn}"), format!("LSN {lsn}")));
        }
        if (records as usize).saturating_mul(RECORD_HEADER_BYTES) > payload_bytes as usize {
            return Err(FormatError::invalid(
                S,
                location,
                format!("{records} records cannot fit in {payload_bytes} payload bytes"),
            ));
        }
        Ok(TxnHeader {
            version,
            node,
            fs_uuid: uuid,
            lsn,
            seq,
            records,
            payload_bytes,
            payload_crc,
        })
    }

    /// Bytes the whole transaction occupies in the log (header, payload, padding).
    pub fn total_bytes(&self) -> u64 {
        sector_round(TXN_HEADER_BYTES + self.payload_bytes as usize) as u64
    }

    /// Check the payload (the bytes right after the header) and decode its records, in
    /// log order.
    pub fn decode_payload(
        &self,
        payload: &[u8],
        location: Location,
    ) -> Result<Vec<LogRecord>, FormatError> {
        const S: &str = "log transaction payload";
        let n = self.payload_bytes as usize;
        if payload.len() < n {
            return Err(FormatError::new(
                S,
                location,
                FormatErrorKind::Truncated {
                    needed: n,
                    available: payload.len(),
                },
            ));
        }
        let payload = &payload[..n];
        let computed = crc32c::crc32c(payload);
        if computed != self.payload_crc {
            return Err(FormatError::new(
                S,
                location,
                FormatErrorKind::BadChecksum {
                    stored: self.payload_crc,
                    computed,
                },
            ));
        }
        let mut r = Reader::new(payload, S, location);
        let mut out = Vec::with_capacity(self.records as usize);
        for i in 0..self.records {
            let kind = r.u8()?;
            let revoke = match kind {
                RECORD_IMAGE => false,
                RECORD_REVOKE if self.version >= TXN_VERSION_REVOKE => true,
                _ => {
                    return Err(FormatError::invalid(
                        S,
                        location,
                        format!(
                            "record {i} has unknown kind {kind} (transaction version {})",
                            self.version
                        ),
                    ))
                }
            };
            let disk = r.u32()?;
            let sector = r.u64()?;
            let length = r.u32()?;
            let (stored, upto_seq) = if revoke { (0, r.u64()?) } else { (r.u32()?, 0) };
            if length == 0
                || length > IMAGE_BYTES_MAX
                || !(length as u64).is_multiple_of(crate::SECTOR_BYTES)
                || stored > length
            {
                return Err(FormatError::invalid(
                    S,
                    location,
                    format!("record {i}: image of {length} bytes with {stored} stored"),
                ));
            }
            if disk > crate::da::DISK_INDEX_MAX || sector > crate::da::SECTOR_MAX {
                return Err(FormatError::invalid(
                    S,
                    location,
                    format!("record {i}: disk address {disk}:{sector} out of range"),
                ));
            }
            let da = DiskAddress::new(disk, sector);
            if revoke {
                out.push(LogRecord::Revoke(LogRevoke {
                    da,
                    length,
                    upto_seq,
                }));
                continue;
            }
            let bytes = r.take(stored as usize)?.to_vec();
            out.push(LogRecord::Image(LogImage { da, length, bytes }));
        }
        if r.remaining() != 0 {
            return Err(FormatError::invalid(
                S,
                location,
                format!("{} bytes after the last record", r.remaining()),
            ));
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Vec<LogImage> {
        let mut full = vec![0u8; 4096];
        full[..5].copy_from_slice(b"inode");
        vec![
            LogImage::trimmed(DiskAddress::new(1, 64), &full),
            LogImage::trimmed(DiskAddress::new(3, 8), &[7u8; 1024]),
        ]
    }

    #[test]
    fn round_trip_and_identity() {
        let uuid = [5u8; 16];
        let bytes = encode_txn(0, uuid, 4096, 9, sample().iter());
        assert_eq!(bytes.len() % 512, 0);
        let h = TxnHeader::decode(&bytes, 0, uuid, 4096, Location::Memory).unwrap();
        assert_eq!(h.seq, 9);
        assert_eq!(h.total_bytes() as usize, bytes.len());
        assert_eq!(
            h.version, TXN_VERSION_IMAGES,
            "no revokes: readable by older builds"
        );
        let imgs: Vec<LogImage> = h
            .decode_payload(&bytes[TXN_HEADER_BYTES..], Location::Memory)
            .unwrap()
            .into_iter()
            .map(|r| match r {
                LogRecord::Image(i) => i,
                LogRecord::Revoke(r) => panic!("no revoke was written: {r:?}"),
            })
            .collect();
        assert_eq!(imgs, sample());
        assert_eq!(imgs[0].bytes.len(), 5, "trailing zeros are not stored");
        assert_eq!(imgs[0].expanded().len(), 4096);
        // Another lap, another node, another file system: not this transaction.
        assert!(TxnHeader::decode(&bytes, 0, uuid, 4096 + (1 << 20), Location::Memory).is_err());
        assert!(TxnHeader::decode(&bytes, 1, uuid, 4096, Location::Memory).is_err());
        assert!(TxnHeader::decode(&bytes, 0, [6u8; 16], 4096, Location::Memory).is_err());
    }

    #[test]
    fn revokes_come_first_and_make_the_transaction_version_2() {
        let uuid = [5u8; 16];
        let revokes = [
            LogRevoke {
                da: DiskAddress::new(1, 64),
                length: 4096,
                upto_seq: 8,
            },
            LogRevoke {
                da: DiskAddress::new(2, 8),
                length: 512,
                upto_seq: 7,
            },
        ];
        let bytes = encode_txn_with(0, uuid, 4096, 9, &revokes, sample().iter());
        let h = TxnHeader::decode(&bytes, 0, uuid, 4096, Location::Memory).unwrap();
        assert_eq!(h.version, TXN_VERSION_REVOKE);
        let recs = h
            .decode_payload(&bytes[TXN_HEADER_BYTES..], Location::Memory)
            .unwrap();
        let mut want: Vec<LogRecord> = revokes.iter().map(|r| LogRecord::Revoke(*r)).collect();
        want.extend(sample().into_iter().map(LogRecord::Image));
        assert_eq!(recs, want);
        // The first revoke covers the first sample image exactly, the second nothing.
        assert!(revokes[0].overlaps(&sample()[0]));
        assert!(!revokes[0].overlaps(&sample()[1]));
        assert!(!revokes[1].overlaps(&sample()[1]), "disk 2 is not disk 3");
        // A version-1 transaction cannot hold a revoke: an older writer never made one,
        // so such a record is damage, not something to skip.
        let mut v1 = bytes.clone();
        v1[8..10].copy_from_slice(&TXN_VERSION_IMAGES.to_le_bytes());
        let crc = crate::checksum_with_hole(&v1[..TXN_HEADER_BYTES], CRC_OFFSET);
        v1[CRC_OFFSET..CRC_OFFSET + 4].copy_from_slice(&crc.to_le_bytes());
        let h1 = TxnHeader::decode(&v1, 0, uuid, 4096, Location::Memory).unwrap();
        assert!(h1
            .decode_payload(&v1[TXN_HEADER_BYTES..], Location::Memory)
            .is_err());
        // A newer transaction version is refused by the header check.
        let mut v3 = bytes.clone();
        v3[8..10].copy_from_slice(&3u16.to_le_bytes());
        let crc = crate::checksum_with_hole(&v3[..TXN_HEADER_BYTES], CRC_OFFSET);
        v3[CRC_OFFSET..CRC_OFFSET + 4].copy_from_slice(&crc.to_le_bytes());
        assert!(TxnHeader::decode(&v3, 0, uuid, 4096, Location::Memory).is_err());
    }

    #[test]
    fn torn_payload_is_detected() {
        let uuid = [5u8; 16];
        let mut bytes = encode_txn(0, uuid, 0, 1, sample().iter());
        let last = bytes.len() - 600;
        bytes[last] ^= 1;
        let h = TxnHeader::decode(&bytes, 0, uuid, 0, Location::Memory).unwrap();
        assert!(h
            .decode_payload(&bytes[TXN_HEADER_BYTES..], Location::Memory)
            .is_err());
    }
}
