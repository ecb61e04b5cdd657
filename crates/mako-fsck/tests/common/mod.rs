//! Test fixtures for fsck: a busy file system image on in-memory disks (files of
//! every shape), built once per test binary and restored per test; and `Inspect`,
//! small helpers that find where structures live by reading the metadata, written
//! independently of the checker so that a bug in its walks cannot hide in the tests.

#![allow(dead_code)]

use mako_disk::{Disk, MemDisk};
use mako_format::alloc_segment::AllocSegment;
use mako_format::descriptor::{Descriptor, DESCRIPTOR_OFFSET};
use mako_format::dir_block::{DirBlock, DirBlockId, DirEntry};
use mako_format::error::Location;
use mako_format::indirect::{IndirectBlock, IndirectId};
use mako_format::inode::{Inode, InodeContent};
use mako_format::inode_map_segment::InodeMapSegment;
use mako_format::xattr::{Xattr, XattrBlock, XattrIndex};
use mako_format::DiskAddress;
use mako_fs::fs::{Ctx, FileSystem, ROOT_INO};
pub use mako_fs::test_util::pattern;
use mako_fs::test_util::{small_config, small_params, MemDisks};
use mako_fs::FsConfig;
use mako_fsck::{check_offline, NoProgress, Options, Report};
use std::collections::BTreeMap;
use std::sync::{Arc, OnceLock};

pub const C: Ctx = Ctx {
    uid: 0,
    gid: 0,
    pid: 1,
};
pub const DISKS: usize = 4;
pub const DISK_BYTES: u64 = 32 << 20;
/// Entries of /bigdir: several hashed directory blocks of 64 KiB.
pub const BIGDIR_ENTRIES: usize = 4000;
/// Entries of /fragdir: out of the inode, in one fragment.
pub const FRAGDIR_ENTRIES: usize = 200;

/// What a path held when the image was built.
#[derive(Debug, Clone)]
pub enum Expect {
    File(Vec<u8>),
    Symlink(Vec<u8>),
    Dir(Vec<String>),
    Special,
}

pub struct Fixture {
    pub snapshot: Vec<Vec<u8>>,
    /// Every path (without the root) and what it held.
    pub paths: BTreeMap<String, Expect>,
    /// Inode numbers by path.
    pub inos: BTreeMap<String, u64>,
    /// Extended attributes of the paths that have some, sorted by name.
    pub xattrs: BTreeMap<String, Vec<Xattr>>,
}

/// Attributes /xattr_file gets after `user.a` and `user.b`: more than its inode
/// holds (xattr blocks), one value spread over several blocks.
pub fn many_xattrs() -> Vec<Xattr> {
    let mut v: Vec<Xattr> = (0..80)
        .map(|i| {
            (
                format!("user.many{i:03}").into_bytes(),
                pattern(300 + i, 100),
            )
        })
        .collect();
    v.insert(40, (b"user.large".to_vec(), pattern(299, 20_000)));
    v
}

/// Every attribute of `ino`, sorted by name.
pub fn xattrs_of(fs: &FileSystem, ino: u64) -> Vec<Xattr> {
    let list = fs.listxattr(ino).unwrap();
    let mut out: Vec<Xattr> = list
        .split(|&b| b == 0)
        .filter(|n| !n.is_empty())
        .map(|n| (n.to_vec(), fs.getxattr(ino, n).unwrap()))
        .collect();
    out.sort();
    out
}

pub fn config() -> FsConfig {
    FsConfig {
        background_workers: false,
        ..small_config()
    }
}

/// Write in pieces, syncing every MiB: without background workers nothing else
/// drains the pagepool, and a write waits for room in it.
fn write_all(fs: &FileSystem, ino: u64, off: u64, data: &[u8]) {
    let mut done = 0;
    while done < data.len() {
        let n = (data.len() - done).min(100_000);
        fs.write(ino, off + done as u64, &data[done..done + n], false)
            .unwrap();
        done += n;
        if done % (1 << 20) < n {
            fs.fsync(ino, false).unwrap();
        }
    }
}

/// The busy image: data in the inode, fragments, full blocks, indirect trees, a sparse
/// file, preallocation, hard links, symlinks (short and long), xattrs, a fragment
/// directory, a big hashed directory, nested directories, special files.
fn build() -> Fixture {
    let disks = MemDisks::new(DISKS, DISK_BYTES);
    disks.format(&small_params());
    let m = disks.mount(config());
    let fs = &m.fs;
    let mut paths: BTreeMap<String, Expect> = BTreeMap::new();
    let mut inos: BTreeMap<String, u64> = BTreeMap::new();
    fn add(
        paths: &mut BTreeMap<String, Expect>,
        inos: &mut BTreeMap<String, u64>,
        fs: &FileSystem,
        parent: u64,
        path: &str,
        data: Vec<u8>,
    ) -> u64 {
        let name = path.rsplit('/').next().unwrap();
        let a = fs
            .create(C, parent, name.as_bytes(), 0o644, 0, true)
            .unwrap();
        write_all(fs, a.ino, 0, &data);
        paths.insert(path.to_string(), Expect::File(data));
        inos.insert(path.to_string(), a.ino);
        a.ino
    }
    macro_rules! file {
        ($($a:expr),*) => { add(&mut paths, &mut inos, $($a),*) };
    }
    for (i, (path, len)) in [
        ("/empty", 0usize),
        ("/tiny", 100),
        ("/inline3k", 3000),
        ("/frag5000", 5000),
        ("/block64k", 65536),
        ("/blockplus", 65537),
        ("/big", 8 << 20),
    ]
    .into_iter()
    .enumerate()
    {
        file!(fs, ROOT_INO, path, pattern(i as u64 + 1, len));
    }
    // Sparse: 10000 bytes at 0 and 5000 at 40 MiB (unit 640, under the second
    // indirect block of a depth-1 tree).
    let sparse = file!(fs, ROOT_INO, "/sparse", pattern(20, 10_000));
    let tail = pattern(21, 5000);
    write_all(fs, sparse, 40 << 20, &tail);
    let mut content = pattern(20, 10_000);
    content.resize(40 << 20, 0);
    content.extend_from_slice(&tail);
    paths.insert("/sparse".into(), Expect::File(content));
    // Preallocated past the end of file.
    let pre = file!(fs, ROOT_INO, "/prealloc", pattern(22, 1000));
    fs.fallocate(pre, 0, 300_000, libc::FALLOC_FL_KEEP_SIZE)
        .unwrap();
    // Hard links and nested directories.
    let hard = file!(fs, ROOT_INO, "/hard1", pattern(23, 7000));
    let dir1 = fs.mkdir(C, ROOT_INO, b"dir1", 0o755, 0).unwrap().ino;
    let dir2 = fs.mkdir(C, dir1, b"dir2", 0o755, 0).unwrap().ino;
    let dir3 = fs.mkdir(C, dir2, b"dir3", 0o755, 0).unwrap().ino;
    inos.insert("/dir1".into(), dir1);
    inos.insert("/dir1/dir2".into(), dir2);
    inos.insert("/dir1/dir2/dir3".into(), dir3);
    fs.link(hard, dir1, b"hard2").unwrap();
    paths.insert("/dir1/hard2".into(), Expect::File(pattern(23, 7000)));
    inos.insert("/dir1/hard2".into(), hard);
    file!(fs, dir3, "/dir1/dir2/dir3/deep", pattern(24, 20_000));
    file!(fs, dir1, "/dir1/small", pattern(25, 10));
    // Symlinks: in the inode, and one long enough to need a fragment.
    let sym = fs.symlink(C, ROOT_INO, b"sym", b"tiny").unwrap().ino;
    paths.insert("/sym".into(), Expect::Symlink(b"tiny".to_vec()));
    inos.insert("/sym".into(), sym);
    let long_target: Vec<u8> = (0..4000).map(|i| b'a' + (i % 26) as u8).collect();
    let longsym = fs
        .symlink(C, ROOT_INO, b"longsym", &long_target)
        .unwrap()
        .ino;
    paths.insert("/longsym".into(), Expect::Symlink(long_target));
    inos.insert("/longsym".into(), longsym);
    // Extended attributes on a file and a directory.
    let xf = file!(fs, ROOT_INO, "/xattr_file", pattern(26, 1000));
    fs.setxattr(xf, b"user.a", &pattern(27, 100), 0).unwrap();
    fs.setxattr(xf, b"user.b", &pattern(28, 200), 0).unwrap();
    fs.setxattr(dir1, b"user.dir", b"value", 0).unwrap();
    // More attributes than the inode holds: xattr blocks, on a file and on a hashed
    // directory (no new file: the inode file is full, a test relies on it).
    for (n, v) in many_xattrs() {
        fs.setxattr(xf, &n, &v, 0).unwrap();
    }
    // Special files.
    let fifo = fs
        .mknod(C, ROOT_INO, b"fifo", libc::S_IFIFO | 0o644, 0, 0)
        .unwrap()
        .ino;
    let chr = fs
        .mknod(C, ROOT_INO, b"chardev", libc::S_IFCHR | 0o600, 0, 0x0501)
        .unwrap()
        .ino;
    paths.insert("/fifo".into(), Expect::Special);
    paths.insert("/chardev".into(), Expect::Special);
    inos.insert("/fifo".into(), fifo);
    inos.insert("/chardev".into(), chr);
    let empty = fs.mkdir(C, ROOT_INO, b"emptydir", 0o755, 0).unwrap().ino;
    inos.insert("/emptydir".into(), empty);
    // A directory in one fragment, and a big hashed one.
    let fragdir = fs.mkdir(C, ROOT_INO, b"fragdir", 0o755, 0).unwrap().ino;
    inos.insert("/fragdir".into(), fragdir);
    for i in 0..FRAGDIR_ENTRIES {
        file!(
            fs,
            fragdir,
            &format!("/fragdir/entry-{i:04}"),
            pattern(1000 + i as u64, i % 7)
        );
    }
    let bigdir = fs.mkdir(C, ROOT_INO, b"bigdir", 0o755, 0).unwrap().ino;
    inos.insert("/bigdir".into(), bigdir);
    for i in 0..BIGDIR_ENTRIES {
        let len = if i % 100 == 0 { 50 } else { 0 };
        file!(
            fs,
            bigdir,
            &format!("/bigdir/a-file-with-a-longer-name-{i:05}"),
            pattern(5000 + i as u64, len)
        );
    }
    // A file created and removed: its slot holds a freed inode.
    let gone = fs.create(C, ROOT_INO, b"gone", 0o644, 0, true).unwrap().ino;
    write_all(fs, gone, 0, &pattern(99, 9000));
    fs.unlink(ROOT_INO, b"gone").unwrap();
    inos.insert("(gone)".into(), gone);
    // Directory listings.
    for dir in [
        "/dir1",
        "/dir1/dir2",
        "/dir1/dir2/dir3",
        "/emptydir",
        "/fragdir",
        "/bigdir",
    ] {
        let mut names: Vec<String> = paths
            .keys()
            .filter(|p| p.rsplit_once('/').map(|x| x.0) == Some(dir))
            .map(|p| p.rsplit('/').next().unwrap().to_string())
            .collect();
        for sub in ["dir2", "dir3"] {
            if inos.contains_key(&format!("{dir}/{sub}")) {
                names.push(sub.into());
            }
        }
        names.sort();
        paths.insert(dir.into(), Expect::Dir(names));
    }
    for i in 0..40 {
        fs.setxattr(
            bigdir,
            format!("user.bigdir{i:02}").as_bytes(),
            &pattern(600 + i, 300),
            0,
        )
        .unwrap();
    }
    let mut xattrs = BTreeMap::new();
    for path in ["/xattr_file", "/bigdir", "/dir1"] {
        xattrs.insert(path.to_string(), xattrs_of(fs, inos[path]));
    }
    fs.sync().unwrap();
    for path in ["/xattr_file", "/bigdir"] {
        assert_ne!(
            fs.raw_inode(inos[path]).unwrap().xattr_index,
            DiskAddress::NULL,
            "{path} must have xattr blocks"
        );
    }
    let (n, depth, _) = fs.dir_shape(bigdir).unwrap();
    assert!(
        n >= 3 && depth >= 2,
        "bigdir must be hashed: {n} blocks, depth {depth}"
    );
    let (n, depth, size) = fs.dir_shape(fragdir).unwrap();
    assert!(
        n == 1 && depth == 0 && size < 65536,
        "fragdir must be one fragment: {n} {depth} {size}"
    );
    assert!(fs.raw_inode(inos["/big"]).unwrap().depth >= 1);
    m.unmount().unwrap();
    Fixture {
        snapshot: disks.disks.iter().map(|d| d.snapshot()).collect(),
        paths,
        inos,
        xattrs,
    }
}

pub fn fixture() -> &'static Fixture {
    static F: OnceLock<Fixture> = OnceLock::new();
    F.get_or_init(build)
}

impl Fixture {
    /// Fresh in-memory disks holding the image.
    pub fn restore(&self) -> MemDisks {
        let disks = MemDisks::new(DISKS, DISK_BYTES);
        for (d, bytes) in disks.disks.iter().zip(&self.snapshot) {
            d.write_at(bytes, 0).unwrap();
        }
        disks
    }
    pub fn ino(&self, path: &str) -> u64 {
        self.inos[path]
    }
}

pub fn snapshot(disks: &MemDisks) -> Vec<Vec<u8>> {
    disks.disks.iter().map(|d| d.snapshot()).collect()
}

pub fn fsck(disks: &MemDisks, repair: bool) -> Report {
    let opts = if repair {
        Options::repair()
    } else {
        Options::check()
    }
    .threads(2);
    check_offline(disks.as_dyn(), &opts, &NoProgress)
        .unwrap_or_else(|e| panic!("fsck failed to run: {e}"))
}

/// Resolve a path by reading directories through the file system.
pub fn lookup(fs: &FileSystem, path: &str) -> Option<u64> {
    let mut ino = ROOT_INO;
    for part in path.split('/').filter(|p| !p.is_empty()) {
        ino = fs.lookup(ino, part.as_bytes()).ok()?.ino;
    }
    Some(ino)
}

pub fn read_all(fs: &FileSystem, ino: u64) -> Vec<u8> {
    let size = fs.getattr(ino).unwrap().size;
    let mut out = Vec::with_capacity(size as usize);
    while (out.len() as u64) < size {
        let chunk = fs.read(ino, out.len() as u64, 1 << 20).unwrap();
        assert!(!chunk.is_empty(), "short read of inode {ino}");
        out.extend_from_slice(&chunk);
    }
    out
}

pub fn list(fs: &FileSystem, ino: u64) -> Vec<String> {
    let mut names = Vec::new();
    let mut after = 0;
    loop {
        let batch = fs.readdir(ino, after, 512).unwrap();
        if batch.is_empty() {
            break;
        }
        for e in &batch {
            after = e.cookie;
            if e.name != b"." && e.name != b".." {
                names.push(String::from_utf8_lossy(&e.name).into_owned());
            }
        }
    }
    names.sort();
    names
}

/// Every path of the fixture not under one of `hit` reads back exactly.
pub fn verify_untouched(fs: &FileSystem, fx: &Fixture, hit: &[&str]) {
    if hit.contains(&"*") {
        return;
    }
    let is_hit = |p: &str| {
        hit.iter()
            .any(|h| p == *h || p.starts_with(&format!("{h}/")))
    };
    let mut checked = 0;
    for (path, expect) in &fx.paths {
        if is_hit(path) {
            continue;
        }
        let ino = lookup(fs, path).unwrap_or_else(|| panic!("{path} is gone after the repair"));
        match expect {
            Expect::File(data) => assert!(
                read_all(fs, ino) == *data,
                "{path}: content differs after the repair"
            ),
            Expect::Symlink(t) => assert_eq!(&fs.readlink(ino).unwrap(), t, "{path}"),
            Expect::Dir(names) => {
                let mut now = list(fs, ino);
                now.retain(|n| !hit.iter().any(|h| *h == format!("{path}/{n}")));
                let mut want = names.clone();
                want.retain(|n| !hit.iter().any(|h| *h == format!("{path}/{n}")));
                assert_eq!(now, want, "{path}: entries differ after the repair");
            }
            Expect::Special => {
                fs.getattr(ino).unwrap();
            }
        }
        if let Some(x) = fx.xattrs.get(path) {
            assert!(
                xattrs_of(fs, ino) == *x,
                "{path}: extended attributes differ after the repair"
            );
        }
        checked += 1;
    }
    assert!(checked > 20, "only {checked} paths checked");
}

/// Units of a tree: (unit, address).
pub type Units = Vec<(u64, DiskAddress)>;
/// Indirect blocks of a tree: (level, index, address).
pub type Indirects = Vec<(u8, u64, DiskAddress)>;

/// Direct access to the image's structures, by reading its metadata.
pub struct Inspect {
    pub desc: Descriptor,
    pub disks: Vec<Arc<MemDisk>>,
    pub inode_file: Vec<DiskAddress>,
}

impl Inspect {
    pub fn open(d: &MemDisks) -> Inspect {
        // The disks of MemDisks are in index order (they were formatted that way).
        let (desc, _) = mako_fs::mount::find_descriptor(d.as_dyn()).expect("descriptor");
        let mut me = Inspect {
            desc,
            disks: d.disks.clone(),
            inode_file: Vec::new(),
        };
        let start = me.desc.inode_file_start;
        let inode0 = Inode::decode(&me.read(start, 4096), 4096, 0, Location::Memory).unwrap();
        let (units, _) = me.tree_of(&inode0);
        let mut blocks: Vec<(u64, DiskAddress)> = units;
        blocks.sort();
        me.inode_file = blocks.into_iter().map(|b| b.1).collect();
        me
    }
    pub fn block_bytes(&self) -> u64 {
        self.desc.geometry.block_bytes as u64
    }
    pub fn read(&self, da: DiskAddress, len: usize) -> Vec<u8> {
        let mut b = vec![0u8; len];
        self.disks[da.disk() as usize]
            .read_at(&mut b, da.byte_offset())
            .unwrap();
        b
    }
    pub fn write(&self, da: DiskAddress, bytes: &[u8]) {
        self.disks[da.disk() as usize]
            .write_at(bytes, da.byte_offset())
            .unwrap();
    }
    /// Flip bits of byte `offset` of the structure at `da`.
    pub fn flip(&self, da: DiskAddress, offset: u64, xor: u8) {
        self.disks[da.disk() as usize].corrupt(da.byte_offset() + offset, xor);
    }
    pub fn inode_da(&self, ino: u64) -> DiskAddress {
        // A log's inode lies in the log table, not in the inode file.
        if let Some(node) = mako_format::log_table::log_node(ino) {
            let m = self.desc.metadata_inodes;
            let off = mako_format::log_table::inode_offset(m.log_count, 4096, node);
            return self.metafile_da(m.log_table, off);
        }
        let off = ino * 4096;
        self.inode_file[(off / self.block_bytes()) as usize].offset_by(off % self.block_bytes())
    }
    pub fn inode(&self, ino: u64) -> Inode {
        Inode::decode(
            &self.read(self.inode_da(ino), 4096),
            4096,
            ino,
            Location::Memory,
        )
        .unwrap()
    }
    pub fn put_inode(&self, inode: &Inode) {
        self.write(self.inode_da(inode.ino), &inode.encode(4096).unwrap());
    }
    pub fn slot_blank(&self, ino: u64) -> bool {
        self.read(self.inode_da(ino), 4096).iter().all(|&b| b == 0)
    }
    /// Units and indirect blocks (level, index, address) of an inode's tree.
    pub fn tree_of(&self, inode: &Inode) -> (Units, Indirects) {
        let mut units = Vec::new();
        let mut ind = Vec::new();
        let ind_bytes = self.desc.geometry.indirect_bytes;
        let ppi = ((ind_bytes as usize - 32) / 8) as u64;
        let InodeContent::Pointers(p) = &inode.content else {
            return (units, ind);
        };
        #[allow(clippy::too_many_arguments)]
        fn go(
            me: &Inspect,
            ino: u64,
            level: u8,
            index: u64,
            da: DiskAddress,
            ppi: u64,
            ib: u32,
            units: &mut Units,
            ind: &mut Indirects,
        ) {
            if level == 0 {
                units.push((index, da));
                return;
            }
            let b = IndirectBlock::decode(
                &me.read(da, ib as usize),
                ib,
                IndirectId { ino, level, index },
                Location::Memory,
            )
            .unwrap();
            ind.push((level, index, da));
            for (j, &c) in b.pointers.iter().enumerate() {
                if !c.is_null() {
                    go(
                        me,
                        ino,
                        level - 1,
                        index * ppi + j as u64,
                        c,
                        ppi,
                        ib,
                        units,
                        ind,
                    );
                }
            }
        }
        for (i, &da) in p.iter().enumerate() {
            if !da.is_null() {
                go(
                    self,
                    inode.ino,
                    inode.depth,
                    i as u64,
                    da,
                    ppi,
                    ind_bytes,
                    &mut units,
                    &mut ind,
                );
            }
        }
        (units, ind)
    }
    pub fn tree(&self, ino: u64) -> (Units, Indirects) {
        self.tree_of(&self.inode(ino))
    }
    /// The xattr index block of an inode and the xattr blocks it lists, with their
    /// pieces.
    pub fn xattr_blocks(&self, ino: u64) -> (DiskAddress, Vec<(DiskAddress, XattrBlock)>) {
        let bb = self.desc.geometry.xattr_block_bytes();
        let index_da = self.inode(ino).xattr_index;
        let index =
            XattrIndex::decode(&self.read(index_da, bb as usize), bb, ino, Location::Memory)
                .unwrap();
        let blocks = index
            .blocks
            .iter()
            .enumerate()
            .map(|(k, &da)| {
                let b = XattrBlock::decode(
                    &self.read(da, bb as usize),
                    bb,
                    ino,
                    k as u32,
                    Location::Memory,
                )
                .unwrap();
                (da, b)
            })
            .collect();
        (index_da, blocks)
    }
    /// Address of byte `off` of metadata file `ino`.
    pub fn metafile_da(&self, ino: u64, off: u64) -> DiskAddress {
        let (units, _) = self.tree(ino);
        let b = off / self.block_bytes();
        units
            .iter()
            .find(|u| u.0 == b)
            .unwrap()
            .1
            .offset_by(off % self.block_bytes())
    }
    pub fn alloc_slot(&self) -> u64 {
        mako_fs::alloc_map::segment_slot_bytes(&self.desc) as u64
    }
    pub fn alloc_segment(&self, region: u32) -> (DiskAddress, AllocSegment) {
        let slot = self.alloc_slot();
        let da = self.metafile_da(
            self.desc.metadata_inodes.block_alloc_map,
            region as u64 * slot,
        );
        (
            da,
            AllocSegment::decode(&self.read(da, slot as usize), region, Location::Memory).unwrap(),
        )
    }
    pub fn put_alloc_segment(&self, da: DiskAddress, seg: &AllocSegment) {
        self.write(da, &seg.encode(self.alloc_slot() as usize));
    }
    /// The region segment and slice index holding subblock `s` of disk `disk`.
    pub fn region_of(&self, disk: u32, s: u64) -> (u32, usize) {
        for r in 0..self.desc.regions {
            let (_, seg) = self.alloc_segment(r);
            for (k, sl) in seg.slices.iter().enumerate() {
                if sl.disk == disk && s >= sl.first_subblock && s < sl.first_subblock + sl.subblocks
                {
                    return (r, k);
                }
            }
        }
        panic!("no region covers {disk}:{s}");
    }
    pub fn imap_segment(&self, s: u32) -> (DiskAddress, InodeMapSegment) {
        let per = self.desc.inodes_per_segment;
        let slot = InodeMapSegment::slot_bytes(per);
        let da = self.metafile_da(
            self.desc.metadata_inodes.inode_alloc_map,
            mako_format::inode_map_segment::slot_offset(
                s as u64,
                per,
                self.desc.geometry.block_bytes,
            ),
        );
        (
            da,
            InodeMapSegment::decode(&self.read(da, slot), s, per, Location::Memory).unwrap(),
        )
    }
    pub fn put_imap_segment(&self, da: DiskAddress, seg: &InodeMapSegment) {
        self.write(da, &seg.encode());
    }
    pub fn descriptor_da(&self, disk: u32) -> DiskAddress {
        DiskAddress::new(disk, DESCRIPTOR_OFFSET / 512)
    }
    /// Directory blocks of a directory: (unit, address, block).
    pub fn dir_blocks(&self, ino: u64) -> Vec<(u64, DiskAddress, DirBlock)> {
        let inode = self.inode(ino);
        let (units, _) = self.tree_of(&inode);
        let sb = self.desc.geometry.subblock_bytes() as u64;
        let dir_bytes = self.desc.geometry.dir_block_bytes() as u64;
        let last = inode.size.saturating_sub(1) / dir_bytes;
        units
            .into_iter()
            .map(|(u, da)| {
                let len = if u == last && inode.last_block_subblocks != 0 {
                    inode.last_block_subblocks as u64 * sb
                } else {
                    dir_bytes
                };
                let b = DirBlock::decode(
                    &self.read(da, len as usize),
                    DirBlockId { ino, index: u },
                    Location::Memory,
                )
                .unwrap();
                (u, da, b)
            })
            .collect()
    }
    /// Inline entries of a directory in its inode.
    pub fn inline_entries(&self, ino: u64) -> Vec<DirEntry> {
        match self.inode(ino).content {
            InodeContent::InlineDir(e) => e,
            other => panic!("inode {ino} is not an inline directory: {other:?}"),
        }
    }
    pub fn set_inline_entries(&self, ino: u64, mut entries: Vec<DirEntry>) {
        let mut inode = self.inode(ino);
        entries.sort_by_key(|e| e.cookie);
        inode.entries = entries.len() as u64;
        inode.content = InodeContent::InlineDir(entries);
        self.put_inode(&inode);
    }
    pub fn put_dir_block(&self, da: DiskAddress, b: &DirBlock) {
        self.write(da, &b.encode());
    }
    /// An inode number no inode holds: a blank slot, or the first past the inode file.
    pub fn unused_ino(&self) -> u64 {
        let slots = self.inode_file.len() as u64 * self.block_bytes() / 4096;
        (16..slots)
            .rev()
            .find(|&i| self.slot_blank(i))
            .unwrap_or(slots)
    }
}

impl Fixture {
    /// The fixture path of inode `ino` (any one of its names).
    pub fn path_of(&self, ino: u64) -> Option<&str> {
        self.inos
            .iter()
            .find(|(_, &i)| i == ino)
            .map(|(p, _)| p.as_str())
    }
}

/// Every entry of /lost+found names an inode of the fixture whose content is intact.
pub fn lost_found_intact(fs: &FileSystem, fx: &Fixture) -> usize {
    let lf = lookup(fs, "/lost+found").expect("/lost+found exists");
    let names = list(fs, lf);
    for n in &names {
        let ino: u64 = n
            .trim_start_matches('#')
            .split('.')
            .next()
            .unwrap()
            .parse()
            .expect("#ino names");
        let path = fx
            .path_of(ino)
            .unwrap_or_else(|| panic!("/lost+found/{n} is no fixture inode"));
        let got = lookup(fs, &format!("/lost+found/{n}")).unwrap();
        assert_eq!(got, ino, "/lost+found/{n}");
        if let Some(Expect::File(data)) = fx.paths.get(path) {
            assert!(
                read_all(fs, ino) == *data,
                "/lost+found/{n} ({path}): content differs"
            );
        }
    }
    names.len()
}

/// A disk that fails every write once a shared budget is spent: a crash at any point.
pub struct CrashDisk {
    pub inner: Arc<MemDisk>,
    pub budget: Arc<std::sync::atomic::AtomicI64>,
}

impl Disk for CrashDisk {
    fn name(&self) -> &str {
        self.inner.name()
    }
    fn size_bytes(&self) -> u64 {
        self.inner.size_bytes()
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<(), mako_disk::DiskError> {
        self.inner.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> Result<(), mako_disk::DiskError> {
        if self
            .budget
            .fetch_sub(1, std::sync::atomic::Ordering::SeqCst)
            <= 0
        {
            return Err(mako_disk::DiskError::Injected {
                disk: self.inner.name().into(),
                what: "crash".into(),
            });
        }
        self.inner.write_at(buf, offset)
    }
    fn sync(&self) -> Result<(), mako_disk::DiskError> {
        Ok(())
    }
}
