//! Fuzz targets for every decoder, runnable on stable Rust: valid encodings are
//! mutated (bit flips, truncation, random overwrites, random bytes) under a seeded RNG
//! and fed to the decoder, which must return (Ok or a FormatError) and never panic.
//! A single bit flip in a checksummed structure must always be detected.
//!
//! `MAKO_FUZZ_ITERS` sets iterations per target (default 3000 for CI); `MAKO_FUZZ_SEED`
//! reproduces a run. The seed is printed on failure.

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
            log_first: 4,
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
    match rng.gen_range(0..5) {
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
        _ => {
            // Header fields: flip bytes near the start where lengths and counts live.
            for _ in 0..rng.gen_range(1..4) {
                let i = rng.gen_range(0..b.len().min(160));
                b[i] = rng.gen();
            }
        }
    }
    b
}

/// Run one target: decode mutations of `valid`, never panic; a single bit flip that
/// decodes successfully must decode to the original (impossible for checksummed data).
fn run_target<T: PartialEq + std::fmt::Debug>(
    name: &str,
    valid: Vec<u8>,
    covered: usize,
    decode: impl Fn(&[u8]) -> Result<T, mako_format::FormatError>,
) {
    let seed = seed();
    let original =
        decode(&valid).unwrap_or_else(|e| panic!("{name}: valid encoding does not decode: {e}"));
    let mut rng = StdRng::seed_from_u64(seed);
    for it in 0..iters() {
        let m = mutate(&mut rng, &valid);
        let res = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| decode(&m)));
        match res {
            Err(_) => panic!("{name}: decoder panicked (MAKO_FUZZ_SEED={seed}, iteration {it})"),
            Ok(Ok(v)) if m != valid && m.len() >= valid.len() && m[..valid.len()] != valid[..] => {
                // Bytes within the structure changed and it still decoded: only
                // acceptable if the change was in padding that the checksum covers
                // identically (impossible) — so it must equal the original.
                assert_eq!(
                    v, original,
                    "{name}: corruption went undetected (MAKO_FUZZ_SEED={seed}, iteration {it})"
                );
            }
            Ok(_) => {}
        }
    }
    // Every single-bit flip in the first 512 checksummed bytes is detected.
    for bit in 0..(valid.len().min(covered).min(512) * 8) {
        let mut m = valid.clone();
        m[bit / 8] ^= 1 << (bit % 8);
        if let Ok(v) = decode(&m) {
            panic!("{name}: bit flip at bit {bit} not detected, decoded {v:?}");
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
    run_target("disk header", h.encode(), usize::MAX, |b| {
        DiskHeader::decode(b, Location::Memory)
    });
}

#[test]
fn fuzz_descriptor() {
    let d = sample_descriptor();
    let mut enc = d.encode().unwrap();
    let covered = u32::from_le_bytes(enc[14..18].try_into().unwrap()) as usize;
    enc.resize(DESCRIPTOR_BYTES_MAX.min(8192), 0);
    run_target("descriptor", enc, covered, |b| {
        Descriptor::decode(b, Location::Memory)
    });
}

#[test]
fn fuzz_inode() {
    for content in 0..3 {
        let i = sample_inode(content);
        run_target("inode", i.encode(4096).unwrap(), usize::MAX, |b| {
            Inode::decode(b, 4096, 42, Location::Memory)
        });
    }
}

#[test]
fn fuzz_inode_with_xattr_index() {
    let mut i = sample_inode(2);
    i.xattr_index = DiskAddress::new(1, 4096);
    run_target(
        "inode with an xattr index",
        i.encode(4096).unwrap(),
        usize::MAX,
        |b| Inode::decode(b, 4096, 42, Location::Memory),
    );
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
    run_target("xattr index block", index.encode(4096), usize::MAX, |b| {
        XattrIndex::decode(b, 4096, 42, Location::Memory)
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
        run_target("xattr block", block.encode(4096), usize::MAX, |b| {
            XattrBlock::decode(b, 4096, 42, k as u32, Location::Memory)
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
    run_target("indirect block", ib.encode(32768), usize::MAX, |b| {
        IndirectBlock::decode(b, 32768, id, Location::Memory)
    });
}

#[test]
fn fuzz_dir_block() {
    let id = DirBlockId { ino: 42, index: 1 };
    let (lo, _) = cookie_range(1, 1);
    let entries = (0..50u64)
        .map(|k| DirEntry {
            cookie: lo + 3 + k * 7,
            ino: 100 + k,
            kind: 8,
            name: format!("file{k}").into_bytes(),
        })
        .collect();
    let blk = DirBlock {
        id,
        depth: 1,
        capacity_bytes: 32768,
        entries,
    };
    run_target("directory block", blk.encode(), usize::MAX, |b| {
        DirBlock::decode(b, id, Location::Memory)
    });
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
    run_target("allocation map segment", s.encode(slot), usize::MAX, |b| {
        AllocSegment::decode(b, 3, Location::Memory)
    });
}

#[test]
fn fuzz_inode_map_segment() {
    let mut s = InodeMapSegment::new(2, 65536, 32768);
    s.bitmap[3] = 0xff;
    run_target("inode map segment", s.encode(), usize::MAX, |b| {
        InodeMapSegment::decode(b, 2, 32768, Location::Memory)
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
    run_target("log header", h.encode(), usize::MAX, |b| {
        LogHeader::decode(b, 0, Location::Memory)
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
    let txn = encode_txn(0, uuid, 8192, 3, images.iter());
    // Header and payload are checked together: what replay does with the bytes it reads.
    let decode = |b: &[u8]| -> Result<Vec<LogImage>, mako_format::FormatError> {
        let h = TxnHeader::decode(b, 0, uuid, 8192, Location::Memory)?;
        let payload = b.get(TXN_HEADER_BYTES..).unwrap_or(&[]);
        h.decode_payload(payload, Location::Memory)
    };
    run_target("log transaction", txn, usize::MAX, decode);
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
