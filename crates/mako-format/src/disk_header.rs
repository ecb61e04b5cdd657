//! The disk header: sector 0 of every Mako disk.

use crate::codec::{check_header, Reader, Writer};
use crate::error::{FormatError, Location};

pub const DISK_HEADER_MAGIC: u64 = u64::from_le_bytes(*b"MAKODISK");
/// Bytes reserved for the header at the start of a disk.
pub const DISK_HEADER_BYTES: usize = 4096;
const CRC_OFFSET: usize = 10;
pub const NAME_BYTES_MAX: usize = 63;

/// What a disk may hold (the seeds' NSD usage).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DiskUsage {
    DataAndMetadata = 0,
    DataOnly = 1,
    MetadataOnly = 2,
    DescOnly = 3,
}

impl DiskUsage {
    pub fn from_u8(v: u8) -> Option<Self> {
        Some(match v {
            0 => DiskUsage::DataAndMetadata,
            1 => DiskUsage::DataOnly,
            2 => DiskUsage::MetadataOnly,
            3 => DiskUsage::DescOnly,
            _ => return None,
        })
    }
    pub fn name(self) -> &'static str {
        match self {
            DiskUsage::DataAndMetadata => "dataAndMetadata",
            DiskUsage::DataOnly => "dataOnly",
            DiskUsage::MetadataOnly => "metadataOnly",
            DiskUsage::DescOnly => "descOnly",
        }
    }
    pub fn parse(s: &str) -> Option<Self> {
        [
            Self::DataAndMetadata,
            Self::DataOnly,
            Self::MetadataOnly,
            Self::DescOnly,
        ]
        .into_iter()
        .find(|u| u.name().eq_ignore_ascii_case(s))
    }
    pub fn holds_data(self) -> bool {
        matches!(self, DiskUsage::DataAndMetadata | DiskUsage::DataOnly)
    }
    pub fn holds_metadata(self) -> bool {
        matches!(self, DiskUsage::DataAndMetadata | DiskUsage::MetadataOnly)
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiskHeader {
    pub version: u16,
    pub disk_uuid: [u8; 16],
    /// Zero until the disk is added to a file system.
    pub fs_uuid: [u8; 16],
    pub name: String,
    pub size_bytes: u64,
    pub sector_bytes: u32,
    pub pool: String,
    pub failure_group: i32,
    pub usage: DiskUsage,
    /// Index of the disk in its file system (the `disk` of a disk address).
    pub disk_index: u32,
}

impl DiskHeader {
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::with_capacity(DISK_HEADER_BYTES);
        w.u64(DISK_HEADER_MAGIC);
        w.u16(crate::FORMAT_VERSION);
        w.u32(0); // crc
        w.bytes(&self.disk_uuid);
        w.bytes(&self.fs_uuid);
        w.blob16(self.name.as_bytes());
        w.u64(self.size_bytes);
        w.u32(self.sector_bytes);
        w.blob16(self.pool.as_bytes());
        w.u32(self.failure_group as u32);
        w.u8(self.usage as u8);
        w.u32(self.disk_index);
        w.pad_to(DISK_HEADER_BYTES);
        let crc = crate::checksum_with_hole(&w.buf, CRC_OFFSET);
        w.buf[CRC_OFFSET..CRC_OFFSET + 4].copy_from_slice(&crc.to_le_bytes());
        w.buf
    }

    pub fn decode(bytes: &[u8], location: Location) -> Result<Self, FormatError> {
        const S: &str = "disk header";
        let mut r = Reader::new(bytes, S, location);
        let magic = r.u64()?;
        let version = r.u16()?;
        let crc = r.u32()?;
        if bytes.len() < DISK_HEADER_BYTES {
            r.seek(DISK_HEADER_BYTES)?;
        }
        check_header(
            &bytes[..DISK_HEADER_BYTES],
            S,
            location,
            DISK_HEADER_MAGIC,
            magic,
            version,
            CRC_OFFSET,
            crc,
        )?;
        let mut disk_uuid = [0u8; 16];
        disk_uuid.copy_from_slice(r.take(16)?);
        let mut fs_uuid = [0u8; 16];
        fs_uuid.copy_from_slice(r.take(16)?);
        let name = r.string16("disk name")?;
        let size_bytes = r.u64()?;
        let sector_bytes = r.u32()?;
        let pool = r.string16("pool name")?;
        let failure_group = r.u32()? as i32;
        let usage_raw = r.u8()?;
        let usage = DiskUsage::from_u8(usage_raw).ok_or_else(|| {
            FormatError::invalid(S, location, format!("disk usage code {usage_raw}"))
        })?;
        let disk_index = r.u32()?;
        if sector_bytes != crate::SECTOR_BYTES as u32 {
            return Err(FormatError::invalid(
                S,
                location,
                format!("sector size {sector_bytes}, expected 512"),
            ));
        }
        Ok(DiskHeader {
            version,
            disk_uuid,
            fs_uuid,
            name,
            size_bytes,
            sector_bytes,
            pool,
            failure_group,
            usage,
            disk_index,
        })
    }
}
