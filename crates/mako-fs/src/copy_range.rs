//! copy_file_range(2) inside makod: bytes go from one file's pagepool buffers to another's
//! without a round trip through the kernel, and holes in the source stay holes in the
//! destination (not zeros written out). Shared blocks (reflink) are for later.
//!
//! The copy walks the source's data and holes (`seek_data`/`seek_hole`, block-granular):
//! data runs are read and written through the pagepool in pieces of at most one block, so
//! memory stays bounded; a hole becomes a punched hole in the destination where the
//! destination has bytes, and nothing past its end. The destination's size then covers
//! everything copied. Like Linux's own, the copy is not atomic: each piece is its own
//! transaction, and a concurrent writer may see part of it.

use crate::attributes;
use crate::error::{FsError, FsResult};
use crate::file_io::FILE_BYTES_MAX;
use crate::fs::{is_dir_mode, FileSystem, SetAttr, S_IFMT, S_IFREG};

/// Most bytes one copy_file_range request copies. Callers loop on a short count (the
/// system call may always return one), and a request holds a FUSE thread while it runs.
pub const COPY_BYTES_MAX: u64 = 1 << 30;
// The FUSE reply carries the count in 32 bits.
const _: () = assert!(COPY_BYTES_MAX <= u32::MAX as u64);

/// What the source holds from some offset on.
enum Run {
    /// Data up to this offset.
    Data(u64),
    /// A hole up to this offset (or the end of the file).
    Hole(u64),
}

impl FileSystem {
    /// Copy up to `len` bytes at `off_in` of `ino_in` to `off_out` of `ino_out`; returns the
    /// bytes copied (0 at or past the source's end). Overlapping ranges of one file are
    /// EINVAL, as in Linux; a destination past the largest file size is EFBIG.
    pub fn copy_file_range(
        &self,
        ino_in: u64,
        off_in: u64,
        ino_out: u64,
        off_out: u64,
        len: u64,
    ) -> FsResult<u64> {
        self.core.check_writable()?;
        // Every look at either file goes through an operation of its own (under the
        // inode's token, so another node's writes are seen).
        let size_in = {
            let a = self.getattr(ino_in)?;
            if is_dir_mode(a.mode) {
                return Err(FsError::IsDir(format!("copy from inode {ino_in}")));
            }
            if a.mode & S_IFMT != S_IFREG {
                return Err(FsError::Invalid(format!(
                    "copy from inode {ino_in}, not a regular file"
                )));
            }
            a.size
        };
        {
            let target = self.raw_inode(ino_out)?;
            if is_dir_mode(target.mode) {
                return Err(FsError::IsDir(format!("copy to inode {ino_out}")));
            }
            if target.mode & S_IFMT != S_IFREG {
                return Err(FsError::Invalid(format!(
                    "copy to inode {ino_out}, not a regular file"
                )));
            }
            attributes::check_changeable(&target, "copy into")?;
        }
        let len = len.min(COPY_BYTES_MAX).min(size_in.saturating_sub(off_in));
        if len == 0 {
            return Ok(0);
        }
        if ino_in == ino_out && off_in < off_out.saturating_add(len) && off_out < off_in + len {
            return Err(FsError::Invalid(format!(
                "copy within inode {ino_in}: ranges {off_in}+{len} and {off_out}+{len} overlap"
            )));
        }
        // As a write does: what does not fit below the largest file size is not copied,
        // and a copy that would start there is EFBIG.
        let room = FILE_BYTES_MAX.saturating_sub(off_out);
        if room == 0 {
            return Err(FsError::TooBig(format!(
                "copy to offset {off_out} of inode {ino_out} (files end at {FILE_BYTES_MAX})"
            )));
        }
        let len = len.min(room);
        let piece_max = self.core.block_bytes();
        let mut done = 0u64;
        while done < len {
            let pos = off_in + done;
            let run = self.next_run(ino_in, pos)?;
            match run {
                Run::Data(end) => {
                    let n = (end.min(off_in + len) - pos).min(piece_max);
                    let bytes = self.read(ino_in, pos, n as u32)?;
                    if bytes.is_empty() {
                        break; // the source shrank meanwhile
                    }
                    let written = self.write(ino_out, off_out + done, &bytes, false)?;
                    done += written as u64;
                    if written < bytes.len() {
                        break; // out of space: a short copy, as a short write
                    }
                }
                Run::Hole(end) => {
                    let n = end.min(off_in + len).saturating_sub(pos);
                    if n == 0 {
                        break; // the source shrank meanwhile
                    }
                    self.zero_out(ino_out, off_out + done, n)?;
                    done += n;
                }
            }
        }
        // Holes copied past the destination's end leave nothing to write: the size says
        // they are there.
        let end = off_out + done;
        if done > 0 && self.getattr(ino_out)?.size < end {
            self.setattr(
                ino_out,
                SetAttr {
                    size: Some(end),
                    ..Default::default()
                },
            )?;
        }
        Ok(done)
    }

    /// The run of data or hole in `ino` starting at `pos` (below the size).
    fn next_run(&self, ino: u64, pos: u64) -> FsResult<Run> {
        let size = self.getattr(ino)?.size;
        let data = match self.lseek(ino, pos, libc::SEEK_DATA) {
            Ok(d) => d,
            Err(FsError::NoSuchOffset) => return Ok(Run::Hole(size.max(pos))),
            Err(e) => return Err(e),
        };
        if data > pos {
            return Ok(Run::Hole(data));
        }
        match self.lseek(ino, pos, libc::SEEK_HOLE) {
            Ok(hole) => Ok(Run::Data(hole.max(pos + 1))),
            Err(FsError::NoSuchOffset) => Ok(Run::Data(size.max(pos + 1))),
            Err(e) => Err(e),
        }
    }

    /// Make `len` bytes at `off` of `ino` read as zeros, deallocating whole blocks: a punched
    /// hole where the file has bytes, nothing past its end.
    fn zero_out(&self, ino: u64, off: u64, len: u64) -> FsResult<()> {
        let size = self.getattr(ino)?.size;
        if off >= size || len == 0 {
            return Ok(());
        }
        let n = len.min(size - off);
        self.fallocate(
            ino,
            off,
            n,
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
        )
    }
}
