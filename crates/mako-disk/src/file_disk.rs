//! A disk backed by a file or block device, with pread/pwrite and fdatasync.
//!
//! Where the host file system allows it the disk is used with O_DIRECT, as GPFS uses
//! its disks: block I/O goes from the pagepool to the device with no copy into (and no
//! double caching in) the host page cache, and fdatasync has little left to flush.
//! Buffers that are not aligned for direct I/O (small metadata encodings) go through an
//! aligned bounce buffer. `MAKO_BUFFERED_DISKS=1` turns direct I/O off.
//!
//! A disk that is a sparse file gets its space from the host file system one write at a
//! time, so blocks written side by side by different streams end up interleaved in small
//! extents all over the host disk, and a later streaming read is slow (measured on ext4:
//! 4 images of 4 MiB writes read back at 0.84–0.93 GB/s, preallocated ones at 1.05–1.30).
//! So the first large write (a streaming data block) into a [`PREALLOC_CHUNK`] of the
//! file preallocates that whole chunk (`fallocate`, keeping the size). The image stays
//! sparse where only metadata and small files live; `MAKO_SPARSE_DISKS=1` turns it off.

use crate::aligned::{AlignedBuf, IO_ALIGN};
use crate::disk::{check_range, Disk};
use crate::DiskError;
use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// Offsets and lengths of every Mako disk I/O are multiples of this.
const SECTOR: u64 = 512;

/// A disk file is preallocated in chunks of this size, aligned to it.
pub const PREALLOC_CHUNK: u64 = 64 << 20;
/// Writes at least this long (streaming data blocks) preallocate their chunk.
pub const PREALLOC_MIN_WRITE: usize = 1 << 20;

/// Which chunks of a sparse disk file are known to be preallocated.
struct Prealloc {
    /// One bit per chunk.
    done: Vec<AtomicU64>,
    /// Cleared when the host file system cannot preallocate.
    enabled: AtomicBool,
}

impl Prealloc {
    fn new(size: u64) -> Prealloc {
        let chunks = size.div_ceil(PREALLOC_CHUNK);
        Prealloc {
            done: (0..chunks.div_ceil(64))
                .map(|_| AtomicU64::new(0))
                .collect(),
            enabled: AtomicBool::new(true),
        }
    }

    /// Preallocate the chunks `[offset, offset + len)` touches that are not yet known
    /// to be. Best effort: a failure leaves the write to allocate as it goes.
    fn cover(&self, file: &File, offset: u64, len: u64, size: u64) {
        use std::os::fd::AsRawFd;
        if !self.enabled.load(Ordering::Relaxed) {
            return;
        }
        let first = offset / PREALLOC_CHUNK;
        let last = (offset + len - 1) / PREALLOC_CHUNK;
        for c in first..=last {
            let (word, bit) = ((c / 64) as usize, 1u64 << (c % 64));
            if self.done[word].load(Ordering::Relaxed) & bit != 0 {
                continue;
            }
            let start = c * PREALLOC_CHUNK;
            let n = PREALLOC_CHUNK.min(size - start);
            // SAFETY: fallocate on a descriptor we own; no memory is passed.
            let r = unsafe {
                libc::fallocate(
                    file.as_raw_fd(),
                    libc::FALLOC_FL_KEEP_SIZE,
                    start as i64,
                    n as i64,
                )
            };
            if r == 0 {
                self.done[word].fetch_or(bit, Ordering::Relaxed);
            } else {
                let e = std::io::Error::last_os_error();
                if matches!(
                    e.raw_os_error(),
                    Some(libc::EOPNOTSUPP) | Some(libc::ENOSYS) | Some(libc::EINVAL)
                ) {
                    self.enabled.store(false, Ordering::Relaxed);
                }
                // ENOSPC and the rest: the write itself will allocate or report.
                return;
            }
        }
    }

    /// Chunks known to be preallocated.
    fn chunks(&self) -> u64 {
        self.done
            .iter()
            .map(|w| w.load(Ordering::Relaxed).count_ones() as u64)
            .sum()
    }
}

pub struct FileDisk {
    name: String,
    path: PathBuf,
    file: File,
    /// The same file opened O_DIRECT, when the host file system supports 512-byte
    /// aligned direct I/O.
    direct: Option<File>,
    size: u64,
    /// Chunk preallocation, for regular files (not block devices).
    prealloc: Option<Prealloc>,
}

fn prealloc_for(file: &File, size: u64) -> Option<Prealloc> {
    if std::env::var("MAKO_SPARSE_DISKS").is_ok_and(|v| v == "1") {
        return None;
    }
    let regular = file
        .metadata()
        .map(|m| m.file_type().is_file())
        .unwrap_or(false);
    (regular && size > 0).then(|| Prealloc::new(size))
}

/// Open `path` with O_DIRECT and check that a 512-byte aligned read works.
fn open_direct(path: &Path) -> Option<File> {
    if std::env::var("MAKO_BUFFERED_DISKS").is_ok_and(|v| v == "1") {
        return None;
    }
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_DIRECT)
        .open(path)
        .ok()?;
    let mut probe = AlignedBuf::zeroed(SECTOR as usize);
    f.read_exact_at(&mut probe, SECTOR).ok()?;
    Some(f)
}

fn io_err<'a>(
    name: &'a str,
    op: &'static str,
    offset: u64,
    len: usize,
) -> impl FnOnce(std::io::Error) -> DiskError + 'a {
    move |source| DiskError::Io {
        disk: name.to_string(),
        op,
        offset,
        len,
        source,
    }
}

impl FileDisk {
    /// Create (or extend) a sparse file of `size_bytes` to serve as a disk.
    pub fn create(name: &str, path: &Path, size_bytes: u64) -> Result<FileDisk, DiskError> {
        let err = |source| DiskError::Open {
            disk: name.into(),
            path: path.display().to_string(),
            source,
        };
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)
            .map_err(err)?;
        file.set_len(size_bytes).map_err(err)?;
        let direct = open_direct(path);
        let prealloc = prealloc_for(&file, size_bytes);
        Ok(FileDisk {
            name: name.into(),
            path: path.into(),
            file,
            direct,
            size: size_bytes,
            prealloc,
        })
    }

    /// Open an existing disk file read-write. A missing, read-only or too small
    /// file is refused with a message naming the disk.
    pub fn open(name: &str, path: &Path) -> Result<FileDisk, DiskError> {
        let err = |source| DiskError::Open {
            disk: name.into(),
            path: path.display().to_string(),
            source,
        };
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .map_err(err)?;
        let meta = file.metadata().map_err(err)?;
        let size = if meta.file_type().is_file() {
            meta.len()
        } else {
            // Block device: its size is where a seek to the end lands.
            use std::io::Seek;
            (&file).seek(std::io::SeekFrom::End(0)).map_err(err)?
        };
        let direct = open_direct(path);
        let prealloc = prealloc_for(&file, size);
        Ok(FileDisk {
            name: name.into(),
            path: path.into(),
            file,
            direct,
            size,
            prealloc,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// True when I/O bypasses the host page cache.
    pub fn is_direct(&self) -> bool {
        self.direct.is_some()
    }

    /// Chunks of [`PREALLOC_CHUNK`] bytes this disk has preallocated since it was opened.
    pub fn preallocated_chunks(&self) -> u64 {
        self.prealloc.as_ref().map_or(0, |p| p.chunks())
    }
}

fn aligned(buf: &[u8], offset: u64) -> bool {
    (buf.as_ptr() as usize).is_multiple_of(IO_ALIGN)
        && (buf.len() as u64).is_multiple_of(SECTOR)
        && offset.is_multiple_of(SECTOR)
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
            Some(d) if offset.is_multiple_of(SECTOR) => {
                let mut bounce =
                    AlignedBuf::zeroed((buf.len() as u64).next_multiple_of(SECTOR) as usize);
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
        if buf.len() >= PREALLOC_MIN_WRITE {
            if let Some(p) = &self.prealloc {
                p.cover(&self.file, offset, buf.len() as u64, self.size);
            }
        }
        match &self.direct {
            Some(d) if aligned(buf, offset) => d.write_all_at(buf, offset).map_err(err),
            Some(d)
                if offset.is_multiple_of(SECTOR) && (buf.len() as u64).is_multiple_of(SECTOR) =>
            {
                let bounce = AlignedBuf::from_slice(buf);
                d.write_all_at(&bounce, offset).map_err(err)
            }
            // A write that does not end on a sector: never issued by Mako, but kept
            // correct through the buffered descriptor, flushed so direct readers see it.
            _ => {
                self.file.write_all_at(buf, offset).map_err(err)?;
                if self.direct.is_some() {
                    self.file
                        .sync_data()
                        .map_err(io_err(&self.name, "sync", offset, buf.len()))?;
                }
                Ok(())
            }
        }
    }
    fn sync(&self) -> Result<(), DiskError> {
        let f = self.direct.as_ref().unwrap_or(&self.file);
        f.sync_data().map_err(io_err(&self.name, "sync", 0, 0))
    }
    /// A host `fdatasync` of its own file: independent of the other disks' files.
    fn sync_in_parallel(&self) -> bool {
        true
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
        let e = FileDisk::open("d9", &dir.path().join("missing.img"))
            .err()
            .unwrap();
        assert!(
            e.to_string().contains("disk d9") && e.to_string().contains("missing.img"),
            "{e}"
        );
    }

    /// Allocated bytes of a file on the host (st_blocks).
    fn host_bytes(p: &Path) -> u64 {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata(p).unwrap().blocks() * 512
    }

    #[test]
    fn large_writes_preallocate_their_chunk_small_ones_stay_sparse() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("d0.img");
        let size = 4 * PREALLOC_CHUNK;
        let d = FileDisk::create("d0", &p, size).unwrap();
        // Small (metadata-sized) writes anywhere: the file stays sparse.
        d.write_at(&AlignedBuf::zeroed(4096), 0).unwrap();
        d.write_at(&AlignedBuf::zeroed(4096), 3 * PREALLOC_CHUNK)
            .unwrap();
        assert!(
            host_bytes(&p) < PREALLOC_CHUNK / 4,
            "{} bytes allocated",
            host_bytes(&p)
        );
        assert_eq!(d.preallocated_chunks(), 0);
        // A streaming block straddling chunks 1 and 2 preallocates both, and the data
        // and the untouched rest of the chunk read back right.
        let mut block = AlignedBuf::zeroed(PREALLOC_MIN_WRITE * 2);
        block
            .iter_mut()
            .enumerate()
            .for_each(|(i, b)| *b = (i % 251) as u8 + 1);
        let at = 2 * PREALLOC_CHUNK - PREALLOC_MIN_WRITE as u64;
        d.write_at(&block, at).unwrap();
        let supported = d.preallocated_chunks() > 0;
        if supported {
            assert_eq!(d.preallocated_chunks(), 2);
            assert!(
                host_bytes(&p) >= 2 * PREALLOC_CHUNK,
                "{} bytes allocated",
                host_bytes(&p)
            );
        }
        let mut back = AlignedBuf::zeroed(block.len());
        d.read_at(&mut back, at).unwrap();
        assert!(back[..] == block[..]);
        let mut rest = AlignedBuf::zeroed(1 << 20);
        d.read_at(&mut rest, PREALLOC_CHUNK + 4096).unwrap();
        assert!(rest.iter().all(|&b| b == 0));
        // The size never changes.
        assert_eq!(std::fs::metadata(&p).unwrap().len(), size);
        // Chunk 3 only saw a small write: still sparse there.
        drop(d);
        let d = FileDisk::open("d0", &p).unwrap();
        d.write_at(&AlignedBuf::zeroed(8192), 3 * PREALLOC_CHUNK + 8192)
            .unwrap();
        if supported {
            assert!(
                host_bytes(&p) < 3 * PREALLOC_CHUNK,
                "{} bytes allocated",
                host_bytes(&p)
            );
        }
    }
}
