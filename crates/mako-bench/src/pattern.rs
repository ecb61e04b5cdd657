//! The data pattern written by every write phase and checked by every read phase.
//!
//! Each byte is a pure function of (file key, absolute file offset): the 8-byte word at
//! every 8-aligned offset `a` is `a ^ key` in little endian. Because the pattern depends
//! only on the absolute offset, a file written with one record size can be verified with
//! another, a misdirected or stale block shows up as a wrong offset, and a hole or a
//! lost write shows up as zeros. The key comes from the file name so a file moved to
//! another directory still verifies.

use std::alloc::{alloc_zeroed, dealloc, Layout};

/// Alignment for direct I/O buffers; 4096 satisfies every Linux block device and file
/// system we care about.
pub const DIRECT_IO_ALIGN_BYTES: usize = 4096;

/// Key for a file, derived from its file name (FNV-1a 64, then mixed so that similar
/// names such as `file.1` and `file.2` give unrelated keys).
pub fn file_key(name: &str) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in name.bytes() {
        hash ^= byte as u64;
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    mix64(hash)
}

/// splitmix64 finaliser; also used as the benchmark's pseudo-random generator step.
pub fn mix64(mut value: u64) -> u64 {
    value = (value ^ (value >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    value = (value ^ (value >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    value ^ (value >> 31)
}

#[inline]
fn byte_at(offset: u64, key: u64) -> u8 {
    let word = (offset & !7) ^ key;
    word.to_le_bytes()[(offset & 7) as usize]
}

/// Fills `buffer` with the pattern for file `key` starting at absolute `offset`.
pub fn fill(buffer: &mut [u8], offset: u64, key: u64) {
    let head = (((8 - (offset % 8)) % 8) as usize).min(buffer.len());
    for (i, byte) in buffer[..head].iter_mut().enumerate() {
        *byte = byte_at(offset + i as u64, key);
    }
    let body_start = offset + head as u64;
    let total_len = buffer.len() as u64;
    let mut chunks = buffer[head..].chunks_exact_mut(8);
    for (i, chunk) in chunks.by_ref().enumerate() {
        let word = (body_start + 8 * i as u64) ^ key;
        chunk.copy_from_slice(&word.to_le_bytes());
    }
    let tail = chunks.into_remainder();
    let tail_len = tail.len() as u64;
    let tail_start = offset + total_len - tail_len;
    for (i, byte) in tail.iter_mut().enumerate() {
        *byte = byte_at(tail_start + i as u64, key);
    }
}

/// Checks `buffer` against the pattern; returns the absolute offset of the first bad
/// byte, or `None` when everything matches.
pub fn verify(buffer: &[u8], offset: u64, key: u64) -> Option<u64> {
    let head = (((8 - (offset % 8)) % 8) as usize).min(buffer.len());
    for (i, &byte) in buffer[..head].iter().enumerate() {
        if byte != byte_at(offset + i as u64, key) {
            return Some(offset + i as u64);
        }
    }
    let body_start = offset + head as u64;
    let chunks = buffer[head..].chunks_exact(8);
    let tail = chunks.remainder();
    for (i, chunk) in chunks.enumerate() {
        let expected = (body_start + 8 * i as u64) ^ key;
        // Compare whole words first (fast path); locate the byte only on a mismatch.
        if chunk != expected.to_le_bytes() {
            let word_offset = body_start + 8 * i as u64;
            let position = chunk
                .iter()
                .zip(expected.to_le_bytes())
                .position(|(a, b)| *a != b)
                .unwrap_or(0);
            return Some(word_offset + position as u64);
        }
    }
    let tail_start = offset + buffer.len() as u64 - tail.len() as u64;
    for (i, &byte) in tail.iter().enumerate() {
        if byte != byte_at(tail_start + i as u64, key) {
            return Some(tail_start + i as u64);
        }
    }
    None
}

/// A heap buffer aligned for O_DIRECT. `Vec<u8>` gives no alignment guarantee, so we
/// allocate with an explicit layout.
pub struct AlignedBuffer {
    pointer: *mut u8,
    layout: Layout,
}

// The buffer is plain memory owned by exactly one thread at a time.
unsafe impl Send for AlignedBuffer {}

impl AlignedBuffer {
    /// Allocates `len` zeroed bytes aligned to [`DIRECT_IO_ALIGN_BYTES`].
    pub fn new(len: usize) -> Result<AlignedBuffer, String> {
        let layout = Layout::from_size_align(len.max(1), DIRECT_IO_ALIGN_BYTES)
            .map_err(|e| format!("cannot lay out a {len}-byte buffer: {e}"))?;
        // SAFETY: the layout has a non-zero size.
        let pointer = unsafe { alloc_zeroed(layout) };
        if pointer.is_null() {
            return Err(format!("out of memory allocating a {len}-byte I/O buffer"));
        }
        Ok(AlignedBuffer { pointer, layout })
    }

    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: pointer is valid for layout.size() initialised (zeroed) bytes.
        unsafe { std::slice::from_raw_parts(self.pointer, self.layout.size()) }
    }

    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as above, and &mut self guarantees exclusive access.
        unsafe { std::slice::from_raw_parts_mut(self.pointer, self.layout.size()) }
    }
}

impl Drop for AlignedBuffer {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this exact layout.
        unsafe { dealloc(self.pointer, self.layout) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pattern_is_offset_based_and_verifies_any_split() {
        let key = file_key("file.7");
        let mut whole = vec![0u8; 1000];
        fill(&mut whole, 13, key);
        // A different record split of the same range gives the same bytes.
        let mut first = vec![0u8; 333];
        let mut second = vec![0u8; 667];
        fill(&mut first, 13, key);
        fill(&mut second, 13 + 333, key);
        assert_eq!(&whole[..333], &first[..]);
        assert_eq!(&whole[333..], &second[..]);
        assert_eq!(verify(&whole, 13, key), None);
        assert_eq!(verify(&whole[5..], 18, key), None);
        // The aligned word really is offset ^ key.
        let mut aligned = vec![0u8; 16];
        fill(&mut aligned, 4096, key);
        assert_eq!(
            u64::from_le_bytes(aligned[..8].try_into().unwrap()),
            4096 ^ key
        );
    }

    #[test]
    fn verify_finds_the_first_bad_byte() {
        let key = file_key("x");
        let mut buffer = vec![0u8; 100];
        fill(&mut buffer, 3, key);
        buffer[50] ^= 1;
        assert_eq!(verify(&buffer, 3, key), Some(53));
        assert_eq!(verify(&buffer, 3, file_key("y")), Some(3));
        let zeros = vec![0u8; 64];
        assert_eq!(verify(&zeros, 0, key), Some(0));
    }

    #[test]
    fn aligned_buffer_is_aligned() {
        let mut buffer = AlignedBuffer::new(10_000).unwrap();
        assert_eq!(
            buffer.as_slice().as_ptr() as usize % DIRECT_IO_ALIGN_BYTES,
            0
        );
        assert_eq!(buffer.as_mut_slice().len(), 10_000);
    }
}
