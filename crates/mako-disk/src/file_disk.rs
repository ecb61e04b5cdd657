//! A disk backed by a file or block device, with pread/pwrite and fdatasync.
//!
//! Where the host file system allows it the disk is used with O_DIRECT, as GPFS uses
//! its disks: block I/O goes from the pagepool to the device with no copy into (and no
//! double caching in) the host page cache, and fdatasync has little left to flush.
//! Buffers that are not aligned for direct I/O (small metadata encodings) go through an
//! aligned bounce buffer. `MAKO_BUFFERED_DISKS=1` turns direct I/O off.

use crate::aligned::{AlignedBuf, IO_ALIGN};
use crate::disk::{check_range, Disk};
use crate::DiskError;
use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// Offsets and lengths of every Mako disk I/O are multiples of this.
const SECTOR: u64 = 512;

pub struct FileDisk {
    name: String,
    path: PathBuf,
    file: File,
    /// The same file opened O_DIRECT, when the host file system supports 512-byte
    /// aligned direct I/O.
    direct: Option<File>,
    size: u64,
}

/// Open `path` with O_DIRECT and check that a 512-byte aligned read works.
fn open_direct(path: &Path) -> Option<File> {
    if std::env::var("MAKO_BUFFERED_DISKS").is_ok_and(|v| v == "1") {
        return None;
    }
    let f = OpenOptions::new().read(true).write(true).custom_flags(libc::O_DIRECT).open(path).ok()?;
    let mut probe = AlignedBuf::zeroed(SECTOR as usize);
    f.read_exact_at(&mut probe, SECTOR).ok()?;
    Some(f)
}

fn io_err<'a>(name: &'a str, op: &'static str, offset: u64, len: usize) -> impl FnOnce(std::io::Error) -> DiskError + 'a {
    move |source| DiskError::Io { disk: name.to_string(), op, offset, len, source }
}

impl FileDisk {
    /// Create (or extend) a sparse file of `size_bytes` to serve as a disk.
    pub fn create(name: &str, path: &Path, size_bytes: u64) -> Result<FileDisk, DiskError> {
        let err = |source| DiskError::Open { disk: name.into(), path: path.display().to_string(), source };
        let file = OpenOptions::new().read(true).write(true).create(true).truncate(false).open(path).map_err(err)?;
        file.set_len(size_bytes).map_err(err)?;
        let direct = open_direct(path);
        Ok(FileDisk { name: name.into(), path: path.into(), file, direct, size: size_bytes })
    }

    /// Open an existing disk file read-write. A missing, read-only or too small
    /// file is refused with a message naming the disk.
    pub fn open(name: &str, path: &Path) -> Result<FileDisk, DiskError> {
        let err = |source| DiskError::Open { disk: name.into(), path: path.display().to_string(), source };
        let file = OpenOptions::new().read(true).write(true).open(path).map_err(err)?;
        let meta = file.metadata().map_err(err)?;
        let size = if meta.file_type().is_file() {
            meta.len()
        } else {
            // Block device: its size is where a seek to the end lands.
            use std::io::Seek;
            (&file).seek(std::io::SeekFrom::End(0)).map_err(err)?
        };
        let direct = open_direct(path);
        Ok(FileDisk { name: name.into(), path: path.into(), file, direct, size })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// True when I/O bypasses the host page cache.
    pub fn is_direct(&self) -> bool {
        self.direct.is_some()
    }
}

fn aligned(buf: &[u8], offset: u64) -> bool {
    buf.as_ptr() as usize % IO_ALIGN == 0 && buf.len() as u64 % SECTOR == 0 && offset % SECTOR == 0
}

impl Disk for FileDisk {
    fn name(&self) -> &str {
        &self.name
    }
    fn size_bytes(&self) -> u64 {
        self.size
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<(), DiskError> {
        check_range(&self.name, "read", offset, buf.len(), self.size)?;
        let err = io_err(&self.name, "read", offset, buf.len());
        match &self.direct {
            Some(d) if aligned(buf, offset) => d.read_exact_at(buf, offset).map_err(err),
            Some(d) if offset % SECTOR == 0 => {
                let mut bounce = AlignedBuf::zeroed((buf.len() as u64).next_multiple_of(SECTOR) as usize);
                d.read_exact_at(&mut bounce, offset).map_err(err)?;
                buf.copy_from_slice(&bounce[..buf.len()]);
                Ok(())
            }
            _ => self.file.read_exact_at(buf, offset).map_err(err),
        }
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> Result<(), DiskError> {
        check_range(&self.name, "write", offset, buf.len(), self.size)?;
        let err = io_err(&self.name, "write", offset, buf.len());
        match &self.direct {
            Some(d) if aligned(buf, offset) => d.write_all_at(buf, offset).map_err(err),
            Some(d) if offset % SECTOR == 0 && buf.len() as u64 % SECTOR == 0 => {
                let bounce = AlignedBuf::from_slice(buf);
                d.write_all_at(&bounce, offset).map_err(err)
            }
            // A write that does not end on a sector: never issued by Mako, but kept
            // correct through the buffered descriptor, flushed so direct readers see it.
            _ => {
                self.file.write_all_at(buf, offset).map_err(err)?;
                if self.direct.is_some() {
                    self.file.sync_data().map_err(io_err(&self.name, "sync", offset, buf.len()))?;
                }
                Ok(())
            }
        }
    }
    fn sync(&self) -> Result<(), DiskError> {
        let f = self.direct.as_ref().unwrap_or(&self.file);
        f.sync_data().map_err(io_err(&self.name, "sync", 0, 0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn create_write_read_and_bounds() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("d0.img");
        let d = FileDisk::create("d0", &p, 1 << 20).unwrap();
        d.write_at(&[7u8; 512], 4096).unwrap();
        let mut b = [0u8; 512];
        d.read_at(&mut b, 4096).unwrap();
        assert_eq!(b, [7u8; 512]);
        let e = d.write_at(&[0u8; 512], (1 << 20) - 100).unwrap_err();
        assert!(e.to_string().contains("beyond the disk size"), "{e}");
        // Unaligned buffers and lengths work whether or not the disk is direct.
        let v = vec![9u8; 700];
        d.write_at(&v[..512], 8192).unwrap();
        let mut small = vec![0u8; 100];
        d.read_at(&mut small, 8192).unwrap();
        assert_eq!(small, vec![9u8; 100]);
        let e = FileDisk::open("d9", &dir.path().join("missing.img")).err().unwrap();
        assert!(e.to_string().contains("disk d9") && e.to_string().contains("missing.img"), "{e}");
    }
}
