//! `AlignedBuf`: a growable byte buffer whose storage is aligned for direct I/O
//! (`O_DIRECT` needs the memory, the length and the offset aligned). Pagepool buffers
//! are `AlignedBuf`s, so full-block I/O goes from the pagepool to the disk with no copy.

use std::alloc::{alloc, dealloc, Layout};
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;

/// Alignment of every `AlignedBuf` (the largest direct-I/O memory alignment we meet).
pub const IO_ALIGN: usize = 4096;
/// Buffers at least this large are mapped directly (mmap/munmap) rather than taken from
/// the allocator: their memory goes back to the system the moment the buffer is freed,
/// so the pagepool's accounting is the daemon's real memory use. (glibc keeps freed
/// multi-MiB chunks in per-thread arenas once its dynamic mmap threshold has risen,
/// which let RSS grow to several times the pagepool.)
pub const MMAP_BYTES_MIN: usize = 256 * 1024;

/// Freed mapped buffers kept for reuse, so a streaming reader or writer does not pay a
/// fresh mapping (a page fault and a zeroed page per 4 KiB) for every block. Bounded by
/// a byte budget ([`AlignedBuf::set_spare_budget`]); what does not fit is unmapped. A
/// new mapping first unmaps spares of other sizes (at least its own size of them), so
/// live buffers and spares together never exceed the most that was ever live at once:
/// memory the pagepool once used stays mapped for it, as GPFS pins its pagepool.
struct Spares {
    budget: usize,
    bytes: usize,
    /// (address, capacity); few distinct capacities in practice (the block size).
    bufs: Vec<(usize, usize)>,
}

static SPARES: std::sync::Mutex<Spares> = std::sync::Mutex::new(Spares {
    budget: DEFAULT_SPARE_BUDGET,
    bytes: 0,
    bufs: Vec::new(),
});

/// Spare budget before anyone sets one (a mount sets it from its pagepool).
pub const DEFAULT_SPARE_BUDGET: usize = 16 << 20;

/// Give spares taken off the list back to the system.
fn unmap_spares(spares: Vec<(usize, usize)>) {
    for (addr, cap) in spares {
        // SAFETY: a spare is a live mapping of `cap` bytes that nothing else owns.
        unsafe { libc::munmap(addr as *mut libc::c_void, cap) };
    }
}

fn spares() -> std::sync::MutexGuard<'static, Spares> {
    // A panic while holding this lock leaves the list consistent (plain pushes/pops).
    SPARES.lock().unwrap_or_else(|e| e.into_inner())
}

pub struct AlignedBuf {
    ptr: NonNull<u8>,
    len: usize,
    cap: usize,
}

// The buffer owns its memory exclusively, like a Vec<u8>.
unsafe impl Send for AlignedBuf {}
unsafe impl Sync for AlignedBuf {}

impl Default for AlignedBuf {
    fn default() -> Self {
        Self::new()
    }
}

impl AlignedBuf {
    pub const fn new() -> AlignedBuf {
        AlignedBuf {
            ptr: NonNull::dangling(),
            len: 0,
            cap: 0,
        }
    }

    pub fn with_capacity(cap: usize) -> AlignedBuf {
        let mut b = AlignedBuf::new();
        b.grow_to(cap);
        b
    }

    /// A zero-filled buffer of `len` bytes.
    pub fn zeroed(len: usize) -> AlignedBuf {
        let mut b = AlignedBuf::with_capacity(len);
        b.resize(len, 0);
        b
    }

    pub fn from_slice(s: &[u8]) -> AlignedBuf {
        let mut b = AlignedBuf::with_capacity(s.len());
        b.extend_from_slice(s);
        b
    }

    fn layout(cap: usize) -> Layout {
        Layout::from_size_align(cap, IO_ALIGN).expect("buffer layout")
    }

    /// Keep at most `bytes` of freed mapped buffers for reuse (memory the daemon holds
    /// beyond its pagepool). Shrinking unmaps spares over the new budget.
    pub fn set_spare_budget(bytes: usize) {
        let freed: Vec<(usize, usize)> = {
            let mut sp = spares();
            sp.budget = bytes;
            let mut out = Vec::new();
            while sp.bytes > sp.budget {
                let Some((addr, cap)) = sp.bufs.pop() else {
                    break;
                };
                sp.bytes -= cap;
                out.push((addr, cap));
            }
            out
        };
        unmap_spares(freed);
    }

    /// Bytes held in spare buffers right now.
    pub fn spare_bytes() -> usize {
        spares().bytes
    }

    /// Allocate `cap` bytes (a multiple of IO_ALIGN), mapped when large.
    fn raw_alloc(cap: usize) -> NonNull<u8> {
        if cap >= MMAP_BYTES_MIN {
            let (reused, unmap) = {
                let mut sp = spares();
                match sp.bufs.iter().rposition(|&(_, c)| c == cap) {
                    Some(i) => {
                        sp.bytes -= cap;
                        (Some(sp.bufs.swap_remove(i).0), Vec::new())
                    }
                    None => {
                        // Spares of other sizes give way to the new mapping, so spares and
                        // live buffers together never exceed the most ever live at once.
                        let mut out = Vec::new();
                        let mut freed = 0;
                        while freed < cap {
                            let Some((addr, c)) = sp.bufs.pop() else {
                                break;
                            };
                            sp.bytes -= c;
                            freed += c;
                            out.push((addr, c));
                        }
                        (None, out)
                    }
                }
            };
            if let Some(addr) = reused {
                return NonNull::new(addr as *mut u8).expect("spare buffer address");
            }
            unmap_spares(unmap);
            // SAFETY: an anonymous private mapping; checked for failure below. Populated
            // at once: one call instead of a page fault per 4 KiB as it is first written.
            let p = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    cap,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_POPULATE,
                    -1,
                    0,
                )
            };
            if p == libc::MAP_FAILED {
                std::alloc::handle_alloc_error(Self::layout(cap));
            }
            NonNull::new(p as *mut u8).expect("mmap returned null")
        } else {
            // SAFETY: cap > 0 and the layout is valid.
            let p = unsafe { alloc(Self::layout(cap)) };
            NonNull::new(p).unwrap_or_else(|| std::alloc::handle_alloc_error(Self::layout(cap)))
        }
    }

    /// Free what `raw_alloc(cap)` returned.
    unsafe fn raw_free(ptr: NonNull<u8>, cap: usize) {
        if cap >= MMAP_BYTES_MIN {
            {
                let mut sp = spares();
                if sp.bytes + cap <= sp.budget {
                    sp.bytes += cap;
                    sp.bufs.push((ptr.as_ptr() as usize, cap));
                    return;
                }
            }
            libc::munmap(ptr.as_ptr() as *mut libc::c_void, cap);
        } else {
            dealloc(ptr.as_ptr(), Self::layout(cap));
        }
    }

    fn grow_to(&mut self, want: usize) {
        if want <= self.cap {
            return;
        }
        let cap = want.next_multiple_of(IO_ALIGN);
        let p = Self::raw_alloc(cap);
        // SAFETY: the old contents (len bytes) are copied before the old allocation is
        // freed with the size it was allocated with.
        unsafe {
            if self.cap > 0 {
                std::ptr::copy_nonoverlapping(self.ptr.as_ptr(), p.as_ptr(), self.len);
                Self::raw_free(self.ptr, self.cap);
            }
        }
        self.ptr = p;
        self.cap = cap;
    }

    pub fn len(&self) -> usize {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    pub fn capacity(&self) -> usize {
        self.cap
    }
    pub fn clear(&mut self) {
        self.len = 0;
    }
    pub fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
    }
    /// Make room for `extra` more bytes without growing again.
    pub fn reserve_exact(&mut self, extra: usize) {
        self.grow_to(self.len + extra);
    }
    /// Grow (zero-filling) or shrink to `len` bytes.
    pub fn resize(&mut self, len: usize, value: u8) {
        if len > self.len {
            if len > self.cap {
                self.grow_to(len.max(self.cap * 2));
            }
            // SAFETY: len <= cap after growing.
            unsafe {
                std::ptr::write_bytes(self.ptr.as_ptr().add(self.len), value, len - self.len)
            };
        }
        self.len = len;
    }
    /// Grow or shrink to `len` bytes without initialising the new ones, for a caller
    /// that overwrites all of them next (a disk read): zeroing a block-sized buffer first
    /// would only cost page faults.
    ///
    /// # Safety
    ///
    /// The bytes between the old length and `len` are not cleared. A large buffer's
    /// storage may be a mapping reused from the spare pool, so they can hold **another
    /// file's data**; they are never uninitialised memory (small buffers are zeroed, a
    /// fresh mapping reads as zeros), so reading them is not undefined behaviour, but
    /// handing them to anyone is a data leak. The caller must overwrite every one of
    /// them before any of them is read, copied, written to a disk or returned, and must
    /// cut them off again (`truncate`) if it cannot. The safe ways to grow a buffer
    /// that is about to be overwritten are [`AlignedBuf::overwrite_at`] (a copy) and
    /// `Nsd::read_append` (a disk read).
    ///
    /// The contract is in the type: calling it needs an `unsafe` block.
    ///
    /// ```compile_fail
    /// let mut b = mako_disk::AlignedBuf::new();
    /// b.resize_for_overwrite(4096); // error[E0133]: call to unsafe function
    /// ```
    pub unsafe fn resize_for_overwrite(&mut self, len: usize) {
        if len > self.len {
            if len > self.cap {
                self.grow_to(len);
            }
            if self.cap < MMAP_BYTES_MIN {
                // SAFETY: len <= cap; allocator memory must be initialised before use.
                unsafe {
                    std::ptr::write_bytes(self.ptr.as_ptr().add(self.len), 0, len - self.len)
                };
            }
        }
        self.len = len;
    }

    /// Copy `src` to `offset`, growing the buffer as needed: bytes between the old
    /// length and `offset` become zeros, the bytes `src` covers are copied without
    /// being zeroed first. Nothing the buffer's storage held before is ever exposed.
    pub fn overwrite_at(&mut self, offset: usize, src: &[u8]) {
        if self.len < offset {
            self.resize(offset, 0);
        }
        let end = offset + src.len();
        if end > self.len {
            if end > self.cap {
                self.grow_to(end);
            }
            // SAFETY: offset <= len, so every byte this exposes (len..end) lies in
            // offset..end and is overwritten by the copy just below.
            unsafe { self.resize_for_overwrite(end) };
        }
        self[offset..end].copy_from_slice(src);
    }

    pub fn extend_from_slice(&mut self, s: &[u8]) {
        let old = self.len;
        if old + s.len() > self.cap {
            self.grow_to((old + s.len()).max(self.cap * 2));
        }
        // SAFETY: capacity checked above; source and destination do not overlap.
        unsafe { std::ptr::copy_nonoverlapping(s.as_ptr(), self.ptr.as_ptr().add(old), s.len()) };
        self.len = old + s.len();
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        if self.cap > 0 {
            // SAFETY: allocated by raw_alloc with this capacity.
            unsafe { Self::raw_free(self.ptr, self.cap) };
        }
    }
}

impl Deref for AlignedBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: ptr is valid for len initialised bytes (dangling with len 0 is allowed).
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl DerefMut for AlignedBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in deref, and we hold &mut self.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl std::fmt::Debug for AlignedBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "AlignedBuf({} bytes)", self.len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spare_buffers_are_reused_within_budget() {
        // Other tests in this binary allocate too, so look only at what this one can see.
        let a = AlignedBuf::zeroed(3 << 20);
        let addr = a.as_ptr() as usize;
        drop(a);
        let b = AlignedBuf::with_capacity(3 << 20);
        let reused = b.as_ptr() as usize == addr;
        drop(b);
        assert!(
            reused || AlignedBuf::spare_bytes() > 0,
            "a freed mapped buffer is kept for reuse"
        );
        let mut r = AlignedBuf::with_capacity(3 << 20);
        // SAFETY: only the length is looked at.
        unsafe { r.resize_for_overwrite(1 << 20) };
        assert_eq!(r.len(), 1 << 20);
        let mut small = AlignedBuf::new();
        // SAFETY: a small buffer is zeroed, which is what is checked.
        unsafe { small.resize_for_overwrite(100) };
        assert!(small.iter().all(|&x| x == 0), "small buffers are zeroed");
        drop(r);
        // Budget 0: everything held is unmapped and nothing freed is kept.
        AlignedBuf::set_spare_budget(0);
        assert_eq!(AlignedBuf::spare_bytes(), 0);
        drop(AlignedBuf::zeroed(2 << 20));
        assert_eq!(AlignedBuf::spare_bytes(), 0);
        AlignedBuf::set_spare_budget(DEFAULT_SPARE_BUDGET);
    }

    /// A spare buffer still holds what its last owner wrote; growing a buffer with
    /// `overwrite_at` shows zeros and the copied bytes, never those.
    #[test]
    fn a_reused_buffer_never_shows_what_it_held() {
        // A capacity no other test uses, so the spare found again is this test's own.
        const CAP: usize = (5 << 20) + 7 * IO_ALIGN;
        let mut reused_once = false;
        // Another test's allocation may unmap the spare between the drop and the
        // reuse: try until a reuse is seen (it nearly always is at once).
        for _ in 0..100 {
            let mut secret = AlignedBuf::zeroed(CAP);
            secret.iter_mut().for_each(|x| *x = 0xa5);
            let addr = secret.as_ptr() as usize;
            drop(secret);
            let mut b = AlignedBuf::with_capacity(CAP);
            let reused = b.as_ptr() as usize == addr;
            b.overwrite_at(1000, b"data");
            b.overwrite_at(CAP - 10, b"tail");
            assert_eq!(b.len(), CAP - 6);
            assert!(
                b[..1000].iter().all(|&x| x == 0),
                "the gap before a copy is zeros"
            );
            assert_eq!(&b[1000..1004], b"data");
            assert!(b[1004..CAP - 10].iter().all(|&x| x == 0));
            assert_eq!(&b[CAP - 10..], b"tail");
            // Overwriting inside the buffer changes only the bytes copied.
            b.overwrite_at(2, b"in");
            assert_eq!(&b[..5], b"\0\0in\0");
            if reused {
                reused_once = true;
                break;
            }
        }
        assert!(
            reused_once,
            "a freed mapped buffer of the same size was never reused"
        );
    }

    #[test]
    fn aligned_and_behaves_like_a_vec() {
        let mut b = AlignedBuf::new();
        assert!(b.is_empty());
        b.extend_from_slice(b"hello");
        assert_eq!(&b[..], b"hello");
        assert_eq!(b.as_ptr() as usize % IO_ALIGN, 0);
        b.resize(10000, 7);
        assert_eq!(b.len(), 10000);
        assert_eq!(&b[..5], b"hello");
        assert!(b[5..].iter().all(|&x| x == 7));
        assert_eq!(b.as_ptr() as usize % IO_ALIGN, 0);
        b.truncate(3);
        assert_eq!(&b[..], b"hel");
        b.resize(6, 0);
        assert_eq!(
            &b[..],
            b"hel\0\0\0",
            "resize zero-fills what truncate dropped"
        );
        let mut big = AlignedBuf::zeroed(4 << 20);
        big[4 << (20 - 1)] = 1;
        big.resize(8 << 20, 0);
        assert_eq!(
            big[4 << (20 - 1)],
            1,
            "mapped buffers keep their content when they grow"
        );
        assert_eq!(big.as_ptr() as usize % IO_ALIGN, 0);
        drop(big);
        // A reused mapping comes back zeroed by `zeroed` even though it held data.
        let mut dirty = AlignedBuf::zeroed(8 << 20);
        dirty.iter_mut().for_each(|x| *x = 0xa5);
        drop(dirty);
        let again = AlignedBuf::zeroed(8 << 20);
        assert!(
            again.iter().all(|&x| x == 0),
            "zeroed() clears a reused buffer"
        );
        let z = AlignedBuf::zeroed(4096);
        assert!(z.iter().all(|&x| x == 0));
        b.clear();
        assert_eq!(b.len(), 0);
    }
}
