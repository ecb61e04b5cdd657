//! Inode limits up to 2^40 and past (format version 3): the inode map file and the
//! inode file are sparse, so a file system made for 2^40 inodes costs at mkfs and at
//! mount what one made for 2^16 does (measured in bytes written, read and allocated,
//! never in time), and numbers past 2^32 work through create, stat, readdir, rename
//! and unlink, a remount and fsck.

use mako_disk::nsd::IoTag;
use mako_disk::{Disk, DiskError, MemDisk};
use mako_fs::fs::{Ctx, ROOT_INO};
use mako_fs::mkfs::MkfsParams;
use mako_fs::mount::{mount_disks, Mounted};
use mako_fs::test_util::{small_config, small_params};
use mako_fs::FsConfig;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

const C: Ctx = Ctx {
    uid: 0,
    gid: 0,
    pid: 1,
};

/// A disk that counts the bytes read from and written to it.
struct Counting {
    inner: MemDisk,
    read: AtomicU64,
    written: AtomicU64,
}

impl Counting {
    fn new(name: &str, bytes: u64) -> Arc<Counting> {
        Arc::new(Counting {
            inner: MemDisk::new(name, bytes),
            read: AtomicU64::new(0),
            written: AtomicU64::new(0),
        })
    }
    fn reset(&self) {
        self.read.store(0, Ordering::SeqCst);
        self.written.store(0, Ordering::SeqCst);
    }
}

impl Disk for Counting {
    fn name(&self) -> &str {
        self.inner.name()
    }
    fn size_bytes(&self) -> u64 {
        self.inner.size_bytes()
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<(), DiskError> {
        self.read.fetch_add(buf.len() as u64, Ordering::SeqCst);
        self.inner.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> Result<(), DiskError> {
        self.written.fetch_add(buf.len() as u64, Ordering::SeqCst);
        self.inner.write_at(buf, offset)
    }
    fn sync(&self) -> Result<(), DiskError> {
        self.inner.sync()
    }
    fn read_tagged(&self, buf: &mut [u8], offset: u64, _tag: IoTag) -> Result<(), DiskError> {
        self.read_at(buf, offset)
    }
    fn write_tagged(&self, buf: &[u8], offset: u64, _tag: IoTag) -> Result<(), DiskError> {
        self.write_at(buf, offset)
    }
}

struct Disks(Vec<Arc<Counting>>);

impl Disks {
    fn new(n: usize, bytes: u64) -> Disks {
        Disks(
            (0..n)
                .map(|i| Counting::new(&format!("d{i}"), bytes))
                .collect(),
        )
    }
    fn dyns(&self) -> Vec<Arc<dyn Disk>> {
        self.0.iter().map(|d| d.clone() as Arc<dyn Disk>).collect()
    }
    fn reset(&self) {
        self.0.iter().for_each(|d| d.reset());
    }
    fn read(&self) -> u64 {
        self.0.iter().map(|d| d.read.load(Ordering::SeqCst)).sum()
    }
    fn written(&self) -> u64 {
        self.0
            .iter()
            .map(|d| d.written.load(Ordering::SeqCst))
            .sum()
    }
    fn format(&self, params: &MkfsParams) {
        let meta: Vec<mako_fs::mkfs::DiskMeta> = (0..self.0.len())
            .map(|i| mako_fs::mkfs::DiskMeta {
                name: format!("d{i}"),
                pool: "system".into(),
                failure_group: i as i32 + 1,
                usage: mako_format::disk_header::DiskUsage::DataAndMetadata,
            })
            .collect();
        mako_fs::mkfs::format_disks(self.dyns(), &meta, params).expect("format");
    }
    fn mount(&self) -> Mounted {
        mount_disks(self.dyns(), config(), 0).expect("mount")
    }
    fn fsck_clean(&self) -> mako_fsck::Report {
        let r = mako_fsck::check_offline(
            self.dyns(),
            &mako_fsck::Options::check(),
            &mako_fsck::NoProgress,
        )
        .expect("fsck runs");
        assert!(r.is_clean(), "{}", r.render());
        r
    }
}

fn config() -> FsConfig {
    FsConfig {
        background_workers: false,
        ..small_config()
    }
}

fn params(inodes: u64) -> MkfsParams {
    MkfsParams {
        inodes_max: Some(inodes),
        ..small_params()
    }
}

/// Bytes in use as `df` sees them.
fn used_bytes(m: &Mounted) -> u64 {
    let s = m.fs.statfs();
    (s.blocks - s.blocks_free) * s.fragment_bytes as u64
}

struct Cost {
    mkfs_written: u64,
    mount_read: u64,
    used: u64,
    segments_loaded: usize,
    fsck_scanned: u64,
}

fn cost(inodes: u64) -> Cost {
    let d = Disks::new(2, 64 << 20);
    d.format(&params(inodes));
    let mkfs_written = d.written();
    d.reset();
    let m = d.mount();
    let mount_read = d.read();
    assert_eq!(m.fs.statfs().files, inodes, "statfs reports the limit");
    let used = used_bytes(&m);
    let segments_loaded = m.fs.core.imap.segments_loaded();
    m.unmount().unwrap();
    let fsck_scanned = d.fsck_clean().inodes_scanned;
    Cost {
        mkfs_written,
        mount_read,
        used,
        segments_loaded,
        fsck_scanned,
    }
}

/// 2^40 inodes cost what 2^16 do: mkfs writes, a mount reads, the space in use and the
/// inode-map segments in memory differ at most by an indirect block or two of the
/// (sparse) inode map file, and fsck scans the same slots.
#[test]
fn a_file_system_for_2_40_inodes_costs_what_one_for_2_16_does() {
    let small = cost(1 << 16);
    let big = cost(1 << 40);
    for (what, c) in [("2^16", &small), ("2^40", &big)] {
        println!(
            "{what} inodes: mkfs wrote {} bytes, mount read {} bytes, {} bytes in use, {} map segments in memory, fsck scanned {} slots",
            c.mkfs_written, c.mount_read, c.used, c.segments_loaded, c.fsck_scanned
        );
    }
    let slack = 2 * (64 << 10); // two blocks
    assert!(
        big.mkfs_written <= small.mkfs_written + slack,
        "mkfs wrote {} bytes for 2^40 inodes, {} for 2^16",
        big.mkfs_written,
        small.mkfs_written
    );
    assert!(
        big.mount_read <= small.mount_read + slack,
        "a mount read {} bytes for 2^40 inodes, {} for 2^16",
        big.mount_read,
        small.mount_read
    );
    assert!(
        big.used <= small.used + slack,
        "{} bytes in use for 2^40 inodes, {} for 2^16",
        big.used,
        small.used
    );
    // At most the segments of the map file's first block (blank ones in its slots).
    let per_block = mako_format::inode_map_segment::slots_per_block(32768, 64 << 10) as usize;
    assert!(
        big.segments_loaded <= small.segments_loaded.max(per_block),
        "{} segments in memory for 2^40 inodes, {} for 2^16",
        big.segments_loaded,
        small.segments_loaded
    );
    assert_eq!(big.fsck_scanned, small.fsck_scanned);
}

fn names(m: &Mounted, dir: u64) -> Vec<(Vec<u8>, u64)> {
    let mut out: Vec<(Vec<u8>, u64)> =
        m.fs.readdir(dir, 0, 10_000)
            .unwrap()
            .into_iter()
            .filter(|e| e.name != b"." && e.name != b"..")
            .map(|e| (e.name, e.ino))
            .collect();
    out.sort();
    out
}

/// Numbers past 2^32 (from a segment near the top of a 2^40 map, in a hole of the map
/// file and of the inode file until its first create) work through create, mkdir,
/// write, stat, readdir, rename and unlink, survive a remount, and fsck finds the file
/// system clean; the map file grew by one block, not by the gigabytes before it.
#[test]
fn inode_numbers_past_2_32_work_end_to_end() {
    let d = Disks::new(2, 64 << 20);
    d.format(&params(1 << 40));
    let m = d.mount();
    let core = m.fs.core.clone();
    let per = core.imap.inodes_per_segment() as u64;
    let imap_ino = core.metadata_inodes().inode_alloc_map;
    let imap_blocks = || core.metafile_blocks.read()[&imap_ino].allocated();
    let before = imap_blocks();
    let high = (1u64 << 40) - 3 * per; // near the top: segment count - 3
    assert!(mako_fs::ownership::allocate_from_segment(&core, high / per).unwrap());
    let dir = m.fs.mkdir(C, ROOT_INO, b"high", 0o755, 0).unwrap();
    assert!(
        dir.ino >= high && dir.ino > 1 << 32,
        "mkdir got {}",
        dir.ino
    );
    let mut files = Vec::new();
    for i in 0..20u32 {
        let a =
            m.fs.create(C, dir.ino, format!("f{i}").as_bytes(), 0o644, 0, true)
                .unwrap();
        assert!(a.ino > 1 << 32);
        m.fs.write(a.ino, 0, format!("data {i}").as_bytes(), false)
            .unwrap();
        files.push(a.ino);
    }
    assert_eq!(
        imap_blocks(),
        before + 1,
        "one block of the map file was made"
    );
    // Numbers 2^32 apart land in other segments: a second range, low in the map.
    assert!(mako_fs::ownership::allocate_from_segment(&core, (1u64 << 33) / per).unwrap());
    let mid = m.fs.create(C, ROOT_INO, b"mid", 0o644, 0, true).unwrap();
    assert!(mid.ino >= 1 << 33 && mid.ino < high, "{}", mid.ino);
    // stat, readdir, rename (within the directory and across), unlink.
    assert_eq!(m.fs.getattr(files[3]).unwrap().size, 6);
    assert_eq!(m.fs.lookup(dir.ino, b"f7").unwrap().ino, files[7]);
    let listed = names(&m, dir.ino);
    assert_eq!(listed.len(), 20);
    assert!(listed.iter().all(|(_, ino)| files.contains(ino)));
    m.fs.rename(dir.ino, b"f1", dir.ino, b"g1", 0).unwrap();
    m.fs.rename(dir.ino, b"f2", ROOT_INO, b"moved", 0).unwrap();
    m.fs.rename(ROOT_INO, b"mid", dir.ino, b"mid", 0).unwrap();
    m.fs.unlink(dir.ino, b"f0").unwrap();
    m.fs.unlink(dir.ino, b"f19").unwrap();
    m.unmount().unwrap();
    d.fsck_clean();

    let m = d.mount();
    assert_eq!(m.fs.lookup(ROOT_INO, b"moved").unwrap().ino, files[2]);
    assert_eq!(m.fs.lookup(dir.ino, b"g1").unwrap().ino, files[1]);
    assert_eq!(m.fs.lookup(dir.ino, b"mid").unwrap().ino, mid.ino);
    assert!(m.fs.lookup(dir.ino, b"f0").is_err());
    let listed = names(&m, dir.ino);
    assert_eq!(listed.len(), 18, "{listed:?}");
    assert_eq!(
        m.fs.read(files[5], 0, 100).unwrap(),
        b"data 5".to_vec(),
        "data of an inode past 2^32"
    );
    // The numbers freed by the unlinks are free after the remount; those in use, used.
    assert!(!m.fs.core.imap.is_used(files[0]));
    assert!(m.fs.core.imap.is_used(files[5]));
    m.unmount().unwrap();
    d.fsck_clean();
}

/// A corrupted block of the inode map file's block map (the segment directory: an
/// indirect block of the sparse file) is caught by its checksum: the mount refuses,
/// naming it, and fsck reports the file unusable; neither panics.
#[test]
fn a_corrupted_inode_map_directory_block_is_reported_not_trusted() {
    let d = Disks::new(2, 64 << 20);
    d.format(&params(1 << 40));
    let m = d.mount();
    let core = m.fs.core.clone();
    let per = core.imap.inodes_per_segment() as u64;
    assert!(mako_fs::ownership::allocate_from_segment(&core, (1u64 << 39) / per).unwrap());
    let a = m.fs.create(C, ROOT_INO, b"far", 0o644, 0, true).unwrap();
    assert!(a.ino >= 1 << 39);
    let imap_ino = core.metadata_inodes().inode_alloc_map;
    drop(core);
    m.unmount().unwrap();
    // The map file's inode as the next mount reads it from disk.
    let m = d.mount();
    let inode =
        m.fs.core
            .cached_handle(imap_ino)
            .expect("the map file's inode is cached at mount")
            .state
            .read()
            .inode
            .clone();
    assert!(inode.depth > 0, "a block far out needs indirect blocks");
    let first_indirect = match &inode.content {
        mako_format::inode::InodeContent::Pointers(p) => {
            *p.iter().find(|p| !p.is_null()).expect("a pointer")
        }
        _ => panic!("the inode map file has block pointers"),
    };
    m.unmount().unwrap();
    // Flip a byte in the middle of the indirect block.
    let disk = &d.0[first_indirect.disk() as usize];
    disk.inner.corrupt(first_indirect.byte_offset() + 100, 0x5a);
    let e = mount_disks(d.dyns(), config(), 0)
        .err()
        .expect("a damaged map directory is refused");
    let text = e.to_string();
    assert!(text.contains("checksum") || text.contains("crc"), "{text}");
    let r = mako_fsck::check_offline(
        d.dyns(),
        &mako_fsck::Options::check(),
        &mako_fsck::NoProgress,
    )
    .expect("fsck runs");
    assert!(!r.is_clean(), "fsck must report the damage");
    let rendered = r.render();
    assert!(
        rendered.contains("inode allocation map")
            || rendered.contains(&format!("inode {imap_ino}")),
        "{rendered}"
    );
}

/// A version-2 file system (segments packed across blocks) is refused with a message
/// that names the version and what to do.
#[test]
fn a_file_system_of_format_version_2_is_refused_saying_what_to_do() {
    use mako_format::descriptor::DESCRIPTOR_OFFSET;
    let d = Disks::new(1, 64 << 20);
    d.format(&params(1 << 16));
    // Every descriptor copy as a version-2 descriptor (same fields, other meaning).
    for disk in &d.0 {
        let mut b = vec![0u8; 4096];
        disk.read_at(&mut b, DESCRIPTOR_OFFSET).unwrap();
        if u64::from_le_bytes(b[..8].try_into().unwrap())
            != mako_format::descriptor::DESCRIPTOR_MAGIC
        {
            continue;
        }
        let len = u32::from_le_bytes(b[14..18].try_into().unwrap()) as usize;
        b[8..10].copy_from_slice(&2u16.to_le_bytes());
        let crc = mako_format::checksum_with_hole(&b[..len], 10);
        b[10..14].copy_from_slice(&crc.to_le_bytes());
        disk.write_at(&b, DESCRIPTOR_OFFSET).unwrap();
    }
    let e = mount_disks(d.dyns(), config(), 0)
        .err()
        .expect("version 2 is refused");
    let text = e.to_string();
    assert!(
        text.contains("format version 2") && text.contains("mako fs create"),
        "{text}"
    );
}
