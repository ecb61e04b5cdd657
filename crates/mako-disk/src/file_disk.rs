//! A disk backed by a file or block device, with pread/pwrite and fdatasync.

use crate::disk::{check_range, Disk};
use crate::DiskError;
use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

pub struct FileDisk {
    name: String,
    path: PathBuf,
    file: File,
    size: u64,
}

impl FileDisk {
    /// Create (or extend) a sparse file of `size_bytes` to serve as a disk.
    pub fn create(name: &str, path: &Path, size_bytes: u64) -> Result<FileDisk, DiskError> {
        let err = |source| DiskError::Open { disk: name.into(), path: path.display().to_string(), source };
        let file = OpenOptions::new().read(true).write(true).create(true).truncate(false).open(path).map_err(err)?;
        file.set_len(size_bytes).map_err(err)?;
        Ok(FileDisk { name: name.into(), path: path.into(), file, size: size_bytes })
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
        Ok(FileDisk { name: name.into(), path: path.into(), file, size })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
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
        self.file.read_exact_at(buf, offset).map_err(|source| DiskError::Io {
            disk: self.name.clone(),
            op: "read",
            offset,
            len: buf.len(),
            source,
        })
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> Result<(), DiskError> {
        check_range(&self.name, "write", offset, buf.len(), self.size)?;
        self.file.write_all_at(buf, offset).map_err(|source| DiskError::Io {
            disk: self.name.clone(),
            op: "write",
            offset,
            len: buf.len(),
            source,
        })
    }
    fn sync(&self) -> Result<(), DiskError> {
        self.file.sync_data().map_err(|source| DiskError::Io { disk: self.name.clone(), op: "sync", offset: 0, len: 0, source })
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
        let e = FileDisk::open("d9", &dir.path().join("missing.img")).err().unwrap();
        assert!(e.to_string().contains("disk d9") && e.to_string().contains("missing.img"), "{e}");
    }
}
