//! Fuzz targets for every decoder, runnable on stable Rust: valid encodings are
//! mutated (bit flips, truncation, random overwrites, random bytes, fields set to
//! boundary values) under a seeded RNG and fed to the decoder, which must return (Ok or
//! a FormatError), never panic, and never allocate much more than the bytes it was
//! given (a length field must not make it reserve gigabytes).
//!
//! Every target runs twice:
//! - **raw**: the mutated bytes as they are. Nearly all fail the checksum, which is what
//!   a torn or rotted block looks like; a mutation inside the checked bytes that still
//!   decodes must decode to the original (impossible for checksummed data).
//! - **resealed**: after the mutation the checksum(s) are recomputed, so the decoder's
//!   field validation behind the crc is exercised (a misdirected write, or a bug that
//!   wrote a well-formed lie). What decodes must also encode again without a panic.
//!
//! `MAKO_FUZZ_ITERS` sets iterations per target and mode (default 3000 for CI);
//! `MAKO_FUZZ_SEED` reproduces a run. The seed is printed when a target starts (shown
//! with `--nocapture` and in the output of a failing test) and in every failure.

use mako_format::alloc_segment::{AllocSegment, DiskSlice};
use mako_format::descriptor::*;
use mako_format::dir_block::*;
use mako_format::disk_header::*;
use mako_format::error::Location;
use mako_format::geometry::Geometry;
use mako_format::indirect::*;
use mako_format::inode::*;
use mako_format::inode_map_segment::InodeMapSegment;
use mako_format::log_header::LogHeader;
use mako_format::xattr::*;
use mako_format::DiskAddress;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

/// The system allocator, noting the largest single request made by a thread while it
/// decodes (see `largest_allocation`).
struct Tracking;

thread_local! {
    static ARMED: Cell<bool> = const { Cell::new(false) };
    static LARGEST: Cell<usize> = const { Cell::new(0) };
}

fn note(bytes: usize) {
    let _ = ARMED.try_with(|armed| {
        if armed.get() {
            let _ = LARGEST.try_with(|m| m.set(m.get().max(bytes)));
        }
    });
}

// SAFETY: every call is forwarded unchanged to the system allocator.
unsafe impl GlobalAlloc for Tracking {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        System.alloc(layout)
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        System.alloc_zeroed(layout)
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note(new_size);
        System.realloc(ptr, layout, new_size)
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        System.dealloc(ptr, layout)
    }
}

#[global_allocator]
static ALLOCATOR: Tracking = Tracking;

/// Run `f` and return its result with the largest single allocation it made.
fn largest_allocation<R>(f: impl FnOnce() -> R) -> (R, usize) {
    LARGEST.with(|m| m.set(0));
    ARMED.with(|a| a.set(true));
    let r = f();
    ARMED.with(|a| a.set(false));
    (r, LARGEST.with(|m| m.get()))
}

/// The most a decoder may allocate at once for `input` bytes: a few times the input
/// (decoded structures are larger than their encoding) plus a small constant.
fn allocation_limit(input: usize) -> usize {
    4 * input + (64 << 10)
}

fn iters() -> usize {
    std::env::var("MAKO_FUZZ_ITERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3000)
}
fn seed() -> u64 {
    std::env::var("MAKO_FUZZ_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(rand::random)
}
const LOC: Location = Location::Memory;

fn geometry() -> Geometry {
    Geometry {
        block_bytes: 4 << 20,
        subblocks_per_block: 512,
        inode_bytes: 4096,
        indirect_bytes: 32768,
    }
}
pub fn sample_descriptor() -> Descriptor {
    let disks: Vec<DiskEntry> = (0..4)
        .map(|i| DiskEntry {
            index: i,
            uuid: [i as u8; 16],
            name: format!("d{i}"),
            size_bytes: 8 << 30,
            pool: "system".into(),
            failure_group: i as i32 + 1,
            usage: DiskUsage::DataAndMetadata,
            status: DiskStatus::Ready,
        })
        .collect();
    Descriptor {
        version: 1,
        generation: 7,
        fs_name: "fs1".into(),
        fs_uuid: [9; 16],
        geometry: geometry(),
        default_metadata_replicas: 1,
        max_metadata_replicas: 2,
        default_data_replicas: 1,
        max_data_replicas: 2,
        layout: LayoutMap::Scatter,
        avoid_dir_fragments: false,
        dir_pre_split_levels: 0,
        log_bytes: 32 << 20,
        inodes_max: 1 << 20,
        regions: 32,
        inodes_per_segment: 32768,
        created_unix: 1_700_000_000,
        mounted: false,
        metadata_inodes: MetadataInodes {
            inode_file: 0,
            root_dir: 1,
            block_alloc_map: 2,
            inode_alloc_map: 3,
            log_table: 4,
            log_count: 1,
            first_user_inode: 16,
        },
        inode_file_start: DiskAddress::new(0, 128),
        descriptor_disks: Descriptor::choose_descriptor_disks(&disks),
        disks,
    }
}

fn sample_inode(content: u8) -> Inode {
    let mut i = Inode::new(42, if content == 1 { 0o040755 } else { 0o100644 });
    i.nlink = 1;
    i.size = 12345;
    i.mtime.sec = 1_700_000_000;
    i.mtime.nsec = 999_999_999;
    i.xattrs.push((b"user.a".to_vec(), b"value".to_vec()));
    i.content = match content {
        0 => InodeContent::InlineData(b"hello world".to_vec()),
        1 => InodeContent::InlineDir(vec![
            DirEntry {
                cookie: 10,
                ino: 17,
                kind: 8,
                name: b"a".to_vec(),
            },
            DirEntry {
                cookie: 99,
                ino: 18,
                kind: 4,
                name: b"bb".to_vec(),
            },
        ]),
        _ => InodeContent::Pointers(
            (0..64)
                .map(|k| DiskAddress::new(k % 4, 1000 + k as u64))
                .collect(),
        ),
    };
    i
}

fn mutate(rng: &mut StdRng, valid: &[u8]) -> Vec<u8> {
    let mut b = valid.to_vec();
    match rng.gen_range(0..6) {
        0 => {
            let i = rng.gen_range(0..b.len());
            b[i] ^= 1 << rng.gen_range(0..8);
        }
        1 => {
            let n = rng.gen_range(0..b.len());
            b.truncate(n);
        }
        2 => {
            for _ in 0..rng.gen_range(1..16) {
                let i = rng.gen_range(0..b.len());
                b[i] = rng.gen();
            }
        }
        3 => {
            let n = rng.gen_range(0..b.len() + 64);
            b = (0..n).map(|_| rng.gen()).collect();
        }
        4 => {
            // Header fields: flip bytes near the start where lengths and counts live.
            for _ in 0..rng.gen_range(1..4) {
                let i = rng.gen_range(0..b.len().min(160));
                b[i] = rng.gen();
            }
        }
        _ => {
            // A field set to a boundary value: lengths, counts and indices of 0, 1, the
            // largest value or just past the structure are what validation must stop.
            for _ in 0..rng.gen_range(1..3) {
                let width = [1usize, 2, 4, 8][rng.gen_range(0..4)];
                let near_start = rng.gen_bool(0.7);
                let span = if near_start {
                    b.len().min(200)
                } else {
                    b.len()
                };
                if span < width {
                    continue;
                }
                let at = rng.gen_range(0..=span - width);
                let len = valid.len() as u64;
                let value: u64 = match rng.gen_range(0..7) {
                    0 => 0,
                    1 => 1,
                    2 => u64::MAX,
                    3 => u64::MAX >> (64 - 8 * width as u32),
                    4 => len,
                    5 => len + rng.gen_range(1..4096),
                    _ => 1 << rng.gen_range(0..64),
                };
                b[at..at + width].copy_from_slice(&value.to_le_bytes()[..width]);
            }
        }
    }
    b
}

/// Recompute a crc32c stored at `crc_offset` over `bytes[..len]` (with the crc's own
/// bytes taken as zero), if the buffer is that long.
fn seal(b: &mut [u8], crc_offset: usize, len: usize) {
    if len > b.len() || len < crc_offset + 4 {
        return;
    }
    let crc = mako_format::checksum_with_hole(&b[..len], crc_offset);
    b[crc_offset..crc_offset + 4].copy_from_slice(&crc.to_le_bytes());
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

/// One fuzz target: how to decode, how to make mutated bytes checksum-valid again, and
/// how to encode what decoded (the file system re-encodes what it read).
struct Target<'a, T> {
    name: &'a str,
    valid: Vec<u8>,
    /// Bytes the checksum covers (for the exhaustive single-bit-flip check).
    covered: usize,
    decode: &'a dyn Fn(&[u8]) -> Result<T, mako_format::FormatError>,
    reseal: &'a dyn Fn(&mut [u8]),
    encode: &'a dyn Fn(&T),
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Mode {
    Raw,
    Resealed,
}

/// Run one target in both modes (see the module doc). Panics name the seed and the
/// iteration; `MAKO_FUZZ_SEED=<seed>` replays the same mutations.
fn run_target<T: PartialEq + std::fmt::Debug>(t: Target<'_, T>) {
    let seed = seed();
    eprintln!(
        "fuzz {}: MAKO_FUZZ_SEED={seed} ({} iterations per mode)",
        t.name,
        iters()
    );
    let original = (t.decode)(&t.valid)
        .unwrap_or_else(|e| panic!("{}: valid encoding does not decode: {e}", t.name));
    for mode in [Mode::Raw, Mode::Resealed] {
        // Each mode has its own stream, so a failure in one replays alone.
        let mut rng = StdRng::seed_from_u64(seed ^ (mode as u64).wrapping_mul(0x9e37_79b9));
        for it in 0..iters() {
            let mut m = mutate(&mut rng, &t.valid);
            if mode == Mode::Resealed {
                (t.reseal)(&mut m);
            }
            let at = || format!("MAKO_FUZZ_SEED={seed}, {mode:?} iteration {it}");
            let (res, largest) = largest_allocation(|| {
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| (t.decode)(&m)))
            });
            let decoded = match res {
                Err(_) => panic!("{}: decoder panicked ({})", t.name, at()),
                Ok(r) => r,
            };
            assert!(
                largest <= allocation_limit(m.len()),
                "{}: decoding {} bytes allocated {largest} bytes at once ({})",
                t.name,
                m.len(),
                at()
            );
            let Ok(v) = decoded else { continue };
            if std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| (t.encode)(&v))).is_err() {
                panic!(
                    "{}: encoding what decoded panicked ({}): {v:?}",
                    t.name,
                    at()
                );
            }
            if mode == Mode::Raw
                && m != t.valid
                && m.len() >= t.valid.len()
                && m[..t.valid.len()] != t.valid[..]
            {
                // Bytes within the structure changed and it still decoded: only
                // acceptable if the change was in padding that the checksum covers
                // identically (impossible) — so it must equal the original.
                assert_eq!(
                    v,
                    original,
                    "{}: corruption went undetected ({})",
                    t.name,
                    at()
                );
            }
        }
    }
    // Every single-bit flip in the first 512 checksummed bytes is detected.
    for bit in 0..(t.valid.len().min(t.covered).min(512) * 8) {
        let mut m = t.valid.clone();
        m[bit / 8] ^= 1 << (bit % 8);
        if let Ok(v) = (t.decode)(&m) {
            panic!(
                "{}: bit flip at bit {bit} not detected, decoded {v:?}",
                t.name
            );
        }
    }
}

#[test]
fn fuzz_disk_header() {
    let h = DiskHeader {
        version: 1,
        disk_uuid: [1; 16],
        fs_uuid: [2; 16],
        name: "d0".into(),
        size_bytes: 8 << 30,
        sector_bytes: 512,
        pool: "system".into(),
        failure_group: 1,
        usage: DiskUsage::DataAndMetadata,
        disk_index: 0,
    };
    run_target(Target {
        name: "disk header",
        valid: h.encode(),
        covered: usize::MAX,
        decode: &|b| DiskHeader::decode(b, Location::Memory),
        reseal: &|b| seal(b, 10, DISK_HEADER_BYTES),
        encode: &|h| {
            h.encode();
        },
    });
}

#[test]
fn fuzz_descriptor() {
    let d = sample_descriptor();
    let mut enc = d.encode().unwrap();
    let covered = u32::from_le_bytes(enc[14..18].try_into().unwrap()) as usize;
    enc.resize(DESCRIPTOR_BYTES_MAX.min(8192), 0);
    run_target(Target {
        name: "descriptor",
        valid: enc,
        covered,
        decode: &|b| Descriptor::decode(b, Location::Memory),
        // The checksum covers the length the descriptor states.
        reseal: &|b| {
            if let Some(len) = u32_at(b, 14) {
                seal(b, 10, len as usize);
            }
        },
        encode: &|d| {
            let _ = d.encode();
        },
    });
}

#[test]
fn fuzz_inode() {
    for content in 0..3 {
        let i = sample_inode(content);
        run_target(Target {
            name: "inode",
            valid: i.encode(4096).unwrap(),
            covered: usize::MAX,
            decode: &|b| Inode::decode(b, 4096, 42, Location::Memory),
            reseal: &|b| seal(b, 6, 4096),
            encode: &|i| {
                let _ = i.encode(4096);
            },
        });
    }
}

#[test]
fn fuzz_inode_with_xattr_index() {
    let mut i = sample_inode(2);
    i.xattr_index = DiskAddress::new(1, 4096);
    run_target(Target {
        name: "inode with an xattr index",
        valid: i.encode(4096).unwrap(),
        covered: usize::MAX,
        decode: &|b| Inode::decode(b, 4096, 42, Location::Memory),
        reseal: &|b| seal(b, 6, 4096),
        encode: &|i| {
            let _ = i.encode(4096);
        },
    });
}

#[test]
fn fuzz_xattr_index() {
    let index = XattrIndex {
        ino: 42,
        attrs: 17,
        blocks: (0..5)
            .map(|k| DiskAddress::new(k % 2, 64 + 8 * k as u64))
            .collect(),
    };
    run_target(Target {
        name: "xattr index block",
        valid: index.encode(4096),
        covered: usize::MAX,
        decode: &|b| XattrIndex::decode(b, 4096, 42, Location::Memory),
        reseal: &|b| seal(b, 6, 4096),
        encode: &|x| {
            let _ = x.encode(4096);
        },
    });
}

#[test]
fn fuzz_xattr_block() {
    let attrs: Vec<(Vec<u8>, Vec<u8>)> = (0..30)
        .map(|k| (format!("user.a{k}").into_bytes(), vec![k as u8 + 1; 7 * k]))
        .chain(std::iter::once((b"user.big".to_vec(), vec![9u8; 3000])))
        .collect();
    for (k, pieces) in pack(&attrs, 4096).into_iter().enumerate() {
        let block = XattrBlock {
            ino: 42,
            index: k as u32,
            pieces,
        };
        run_target(Target {
            name: "xattr block",
            valid: block.encode(4096),
            covered: usize::MAX,
            decode: &|b| XattrBlock::decode(b, 4096, 42, k as u32, Location::Memory),
            reseal: &|b| seal(b, 6, 4096),
            encode: &|x| {
                let _ = x.encode(4096);
            },
        });
    }
}

#[test]
fn fuzz_indirect_block() {
    let id = IndirectId {
        ino: 42,
        level: 1,
        index: 3,
    };
    let mut ib = IndirectBlock::new(id, geometry().pointers_per_indirect() as usize);
    ib.pointers[5] = DiskAddress::new(2, 4096);
    run_target(Target {
        name: "indirect block",
        valid: ib.encode(32768),
        covered: usize::MAX,
        decode: &|b| IndirectBlock::decode(b, 32768, id, Location::Memory),
        reseal: &|b| seal(b, 6, 32768),
        encode: &|ib| {
            ib.encode(32768);
        },
    });
}

/// Reseal every page of a directory block: page 0's capacity says how big a page is;
/// each page's checksum covers the page size its own header implies.
fn reseal_dir_block(b: &mut [u8]) {
    let Some(cap0) = u32_at(b, 31) else { return };
    let pb = page_bytes(cap0) as usize;
    if pb == 0 {
        return;
    }
    let mut at = 0;
    while at + pb <= b.len() && at <= cap0 as usize {
        let own = u32_at(b, at + 31).map_or(pb, |c| page_bytes(c) as usize);
        seal(&mut b[at..at + pb], 6, own);
        at += pb;
    }
    seal(b, 6, pb);
}

fn sample_dir_block(capacity_bytes: u32, depth: u8, index: u64, count: u64) -> DirBlock {
    let id = DirBlockId { ino: 42, index };
    let (lo, hi) = cookie_range(index, depth);
    let step = ((hi - lo) / (count + 2)).max(1);
    let entries = (0..count)
        .map(|k| DirEntry {
            cookie: lo + 3 + k * step,
            ino: 100 + k,
            kind: 8,
            name: format!("file{k}").into_bytes(),
        })
        .collect();
    DirBlock {
        id,
        depth,
        capacity_bytes,
        entries,
    }
}

#[test]
fn fuzz_dir_block() {
    // A multi-page block and a one-page fragment (whose page is the whole block).
    for blk in [
        sample_dir_block(32768, 1, 1, 50),
        sample_dir_block(2048, 0, 0, 20),
    ] {
        let id = blk.id;
        run_target(Target {
            name: "directory block",
            valid: blk.encode(),
            covered: usize::MAX,
            decode: &|b| DirBlock::decode(b, id, Location::Memory),
            reseal: &reseal_dir_block,
            encode: &|b| {
                b.encode();
            },
        });
    }
}

#[test]
fn fuzz_alloc_segment() {
    let mut s = AllocSegment::new(
        3,
        vec![
            DiskSlice {
                disk: 0,
                first_subblock: 128,
                subblocks: 1000,
            },
            DiskSlice {
                disk: 1,
                first_subblock: 128,
                subblocks: 1000,
            },
        ],
    );
    s.bitmaps[0][0] = 0xdead_beef;
    let slot = AllocSegment::encoded_len(&s.slices).div_ceil(512) * 512;
    run_target(Target {
        name: "allocation map segment",
        valid: s.encode(slot),
        covered: usize::MAX,
        decode: &|b| AllocSegment::decode(b, 3, Location::Memory),
        reseal: &|b| {
            let n = b.len();
            seal(b, 6, n)
        },
        encode: &|s| {
            s.encode(AllocSegment::encoded_len(&s.slices).div_ceil(512) * 512);
        },
    });
}

#[test]
fn fuzz_inode_map_segment() {
    let mut s = InodeMapSegment::new(2, 65536, 32768);
    s.bitmap[3] = 0xff;
    run_target(Target {
        name: "inode map segment",
        valid: s.encode(),
        covered: usize::MAX,
        decode: &|b| InodeMapSegment::decode(b, 2, 32768, Location::Memory),
        reseal: &|b| seal(b, 6, InodeMapSegment::slot_bytes(32768)),
        encode: &|s| {
            s.encode();
        },
    });
}

#[test]
fn fuzz_log_header() {
    let h = LogHeader {
        node: 0,
        log_bytes: 32 << 20,
        tail_lsn: 5,
        head_lsn: 9,
        clean: true,
    };
    run_target(Target {
        name: "log header",
        valid: h.encode(),
        covered: usize::MAX,
        decode: &|b| LogHeader::decode(b, 0, Location::Memory),
        reseal: &|b| seal(b, 10, 512),
        encode: &|h| {
            h.encode();
        },
    });
}

#[test]
fn fuzz_log_transaction() {
    use mako_format::log_record::*;
    let mut inode = vec![0u8; 4096];
    inode[..100].copy_from_slice(&[3u8; 100]);
    let images = [
        LogImage::trimmed(DiskAddress::new(1, 64), &inode),
        LogImage::trimmed(DiskAddress::new(2, 4096), &[9u8; 512]),
    ];
    let uuid = [4u8; 16];
    // A revoke record too, so mutations reach both record kinds (version 2).
    let revokes = [LogRevoke {
        da: DiskAddress::new(3, 128),
        length: 4096,
        upto_seq: 2,
    }];
    let txn = encode_txn_with(0, uuid, 8192, 3, &revokes, images.iter());
    // Header and payload are checked together: what replay does with the bytes it reads.
    let decode = |b: &[u8]| -> Result<Vec<LogRecord>, mako_format::FormatError> {
        let h = TxnHeader::decode(b, 0, uuid, 8192, Location::Memory)?;
        let payload = b.get(TXN_HEADER_BYTES..).unwrap_or(&[]);
        h.decode_payload(payload, Location::Memory)
    };
    // The payload crc (in the header) covers the payload length the header states;
    // the header crc covers the header, payload crc included.
    let reseal = |b: &mut [u8]| {
        if let Some(n) = u32_at(b, 54) {
            let end = TXN_HEADER_BYTES.saturating_add(n as usize);
            if end <= b.len() && b.len() >= 62 {
                let crc = crc32c::crc32c(&b[TXN_HEADER_BYTES..end]);
                b[58..62].copy_from_slice(&crc.to_le_bytes());
            }
        }
        seal(b, 10, TXN_HEADER_BYTES);
    };
    run_target(Target {
        name: "log transaction",
        valid: txn,
        covered: usize::MAX,
        decode: &decode,
        reseal: &reseal,
        encode: &|records: &Vec<LogRecord>| {
            let mut images = Vec::new();
            let mut revokes = Vec::new();
            for r in records {
                match r {
                    LogRecord::Image(i) => images.push(i.clone()),
                    LogRecord::Revoke(r) => revokes.push(*r),
                }
            }
            encode_txn_with(0, uuid, 8192, 3, &revokes, images.iter());
            for i in &images {
                let mut buf = vec![0u8; 4096];
                i.apply(DiskAddress::new(i.da.disk(), i.da.sector()), &mut buf);
                for r in &revokes {
                    r.overlaps(i);
                }
            }
        },
    });
}

/// The resealing itself works: a resealed copy of a valid structure with one field
/// changed decodes (or fails validation) instead of failing its checksum, so the
/// resealed mode really reaches the code behind the crc.
#[test]
fn resealed_mutations_get_past_the_checksum() {
    let i = sample_inode(0);
    let mut b = i.encode(4096).unwrap();
    b[22] ^= 1; // the mode's low byte
    assert!(matches!(
        Inode::decode(&b, 4096, 42, Location::Memory)
            .unwrap_err()
            .kind,
        mako_format::FormatErrorKind::BadChecksum { .. }
    ));
    seal(&mut b, 6, 4096);
    let d = Inode::decode(&b, 4096, 42, Location::Memory).expect("resealed inode decodes");
    assert_ne!(d.mode, i.mode);
    let blk = sample_dir_block(32768, 1, 1, 50);
    let mut b = blk.encode();
    b[4096 + 100] ^= 0x40; // inside page 1's entries
    reseal_dir_block(&mut b);
    let e = DirBlock::decode(&b, blk.id, Location::Memory);
    assert!(
        !matches!(&e, Err(e) if matches!(e.kind, mako_format::FormatErrorKind::BadChecksum { .. })),
        "{e:?}"
    );
}

/// Fields behind a valid checksum that later code divides by or subtracts from are
/// refused by the decoder: a log of 0 bytes would make every LSN computation of the
/// mount divide by zero.
#[test]
fn descriptor_with_an_impossible_log_size_is_refused() {
    for log_bytes in [0, 4096, (1 << 20) - 512, (1 << 30) + 512, u64::MAX] {
        let d = Descriptor {
            log_bytes,
            ..sample_descriptor()
        };
        let e = Descriptor::decode(&d.encode().unwrap(), Location::Memory).unwrap_err();
        assert!(e.to_string().contains("recovery log of"), "{e}");
    }
}

/// A region count the disks cannot hold would size the allocation map's tables (one
/// entry per region per disk): refused by the decoder.
#[test]
fn descriptor_with_more_regions_than_blocks_is_refused() {
    let d = Descriptor {
        regions: u32::MAX,
        ..sample_descriptor()
    };
    let e = Descriptor::decode(&d.encode().unwrap(), Location::Memory).unwrap_err();
    assert!(e.to_string().contains("allocation regions"), "{e}");
}

#[test]
fn misdirected_blocks_are_named() {
    let i = sample_inode(0);
    let e = Inode::decode(&i.encode(4096).unwrap(), 4096, 43, LOC_DISK()).unwrap_err();
    let msg = e.to_string();
    assert!(msg.contains("inode at 1:77"), "{msg}");
    assert!(
        msg.contains("inode 43") && msg.contains("inode 42"),
        "{msg}"
    );
}

#[allow(non_snake_case)]
fn LOC_DISK() -> Location {
    Location::Disk(DiskAddress::new(1, 77))
}
#[allow(dead_code)]
fn _unused() -> Location {
    LOC
}
