//! The log table: where each node's recovery log is (format version 2).
//!
//! A file system made for N nodes (`mako fs create -n N`) has one log table, a
//! metadata file whose inode lies in the first block of the inode file and whose block
//! map is fixed at creation, so recovery finds it from the descriptor alone. It holds,
//! for each node, one sector (`LogEntry`) and one inode slot:
//!
//! ```text
//! [entry 0][entry 1]...[entry N-1] (padded to an inode size) [log inode 0]...[log inode N-1]
//! ```
//!
//! A node's log is created the first time that node mounts: its blocks, header and its
//! first transaction are written, then its inode (in the node's slot of the table,
//! never in the inode file), and last the entry sector, which is what makes the log
//! exist. A sector is written whole or not at all, so an entry is either absent (all
//! zeros: the node never mounted, or its log's creation was interrupted, and whatever
//! the creation wrote before is unreferenced) or valid; any other content is damage.
//! Log inodes carry numbers of their own (`log_ino`), past every inode-file number.

use crate::codec::{check_header, Reader, Writer};
use crate::error::{FormatError, FormatErrorKind, Location};

pub const LOG_ENTRY_MAGIC: u64 = u64::from_le_bytes(*b"MAKOLOGE");
/// One entry per node, one sector each.
pub const LOG_ENTRY_BYTES: u64 = 512;
const CRC_OFFSET: usize = 10;

/// The inode number of node `node`'s recovery log: past every number the inode file
/// can hold (mkfs keeps `inodes_max × inode size` below 2^62), so it names no file.
pub const LOG_INO_BASE: u64 = 1 << 62;

/// Most nodes a file system can be made for (`mako fs create -n`).
pub const NODES_MAX: u32 = 65_536;

pub fn log_ino(node: u32) -> u64 {
    LOG_INO_BASE + node as u64
}

/// The node whose log `ino` is, if it is a log's number.
pub fn log_node(ino: u64) -> Option<u32> {
    ino.checked_sub(LOG_INO_BASE)
        .filter(|n| *n < NODES_MAX as u64)
        .map(|n| n as u32)
}

/// Byte offset of node `node`'s entry in the table.
pub fn entry_offset(node: u32) -> u64 {
    node as u64 * LOG_ENTRY_BYTES
}

/// Byte offset of node `node`'s log inode in a table for `nodes` nodes.
pub fn inode_offset(nodes: u32, inode_bytes: u32, node: u32) -> u64 {
    let entries = (nodes as u64 * LOG_ENTRY_BYTES).next_multiple_of(inode_bytes as u64);
    entries + node as u64 * inode_bytes as u64
}

/// Bytes of a table for `nodes` nodes.
pub fn table_bytes(nodes: u32, inode_bytes: u32) -> u64 {
    inode_offset(nodes, inode_bytes, nodes)
}

/// What makes node `node`'s log exist: its inode is in the node's slot of the table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogEntry {
    pub node: u32,
    pub fs_uuid: [u8; 16],
    /// Bytes of the log (the descriptor's log size when it was created).
    pub log_bytes: u64,
}

impl LogEntry {
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::with_capacity(LOG_ENTRY_BYTES as usize);
        w.u64(LOG_ENTRY_MAGIC);
        w.u16(crate::FORMAT_VERSION);
        w.u32(0);
        w.u32(self.node);
        w.bytes(&self.fs_uuid);
        w.u64(self.log_bytes);
        w.u64(log_ino(self.node));
        w.pad_to(LOG_ENTRY_BYTES as usize);
        let crc = crate::checksum_with_hole(&w.buf, CRC_OFFSET);
        w.buf[CRC_OFFSET..CRC_OFFSET + 4].copy_from_slice(&crc.to_le_bytes());
        w.buf
    }

    /// `Ok(None)` for an absent entry (all zeros).
    pub fn decode(
        bytes: &[u8],
        expected_node: u32,
        fs_uuid: &[u8; 16],
        location: Location,
    ) -> Result<Option<Self>, FormatError> {
        const S: &str = "log table entry";
        if bytes.len() < LOG_ENTRY_BYTES as usize {
            return Err(FormatError::new(
                S,
                location,
                FormatErrorKind::Truncated {
                    needed: LOG_ENTRY_BYTES as usize,
                    available: bytes.len(),
                },
            ));
        }
        let bytes = &bytes[..LOG_ENTRY_BYTES as usize];
        if bytes.iter().all(|b| *b == 0) {
            return Ok(None);
        }
        let mut r = Reader::new(bytes, S, location);
        let magic = r.u64()?;
        let version = r.u16()?;
        let crc = r.u32()?;
        check_header(
            bytes,
            S,
            location,
            LOG_ENTRY_MAGIC,
            magic,
            version,
            CRC_OFFSET,
            crc,
        )?;
        let node = r.u32()?;
        let mut uuid = [0u8; 16];
        uuid.copy_from_slice(r.take(16)?);
        if node != expected_node || &uuid != fs_uuid {
            return Err(FormatError::new(
                S,
                location,
                FormatErrorKind::WrongIdentity {
                    expected: format!("log entry of node {expected_node} of this file system"),
                    found: format!(
                        "log entry of node {node} (another file system: {})",
                        &uuid != fs_uuid
                    ),
                },
            ));
        }
        let log_bytes = r.u64()?;
        let ino = r.u64()?;
        if ino != log_ino(node) {
            return Err(FormatError::invalid(
                S,
                location,
                format!("log inode {ino}, not {}", log_ino(node)),
            ));
        }
        Ok(Some(LogEntry {
            node,
            fs_uuid: uuid,
            log_bytes,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entry_round_trip_and_blank() {
        let e = LogEntry {
            node: 1023,
            fs_uuid: [7; 16],
            log_bytes: 1 << 20,
        };
        let b = e.encode();
        assert_eq!(b.len(), 512);
        assert_eq!(
            LogEntry::decode(&b, 1023, &[7; 16], Location::Memory).unwrap(),
            Some(e.clone())
        );
        assert!(LogEntry::decode(&b, 1022, &[7; 16], Location::Memory).is_err());
        assert!(LogEntry::decode(&b, 1023, &[8; 16], Location::Memory).is_err());
        assert_eq!(
            LogEntry::decode(&[0u8; 512], 3, &[7; 16], Location::Memory).unwrap(),
            None
        );
        let mut torn = b.clone();
        torn[40] ^= 1;
        assert!(LogEntry::decode(&torn, 1023, &[7; 16], Location::Memory).is_err());
    }

    #[test]
    fn layout_never_straddles_an_inode() {
        for nodes in [1u32, 7, 1024, 4096, NODES_MAX] {
            for isz in [512u32, 1024, 4096] {
                let first = inode_offset(nodes, isz, 0);
                assert_eq!(first % isz as u64, 0);
                assert!(first >= nodes as u64 * LOG_ENTRY_BYTES);
                assert_eq!(table_bytes(nodes, isz), first + nodes as u64 * isz as u64);
            }
        }
        assert_eq!(log_node(log_ino(5)), Some(5));
        assert_eq!(log_node(5), None);
    }
}
