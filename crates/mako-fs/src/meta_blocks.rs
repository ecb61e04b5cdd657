//! The block list of a metadata file, kept sparse: the inode file and the inode
//! allocation map grow lazily (a block is allocated when a number in it is first used),
//! so a file system made for 2^40 inodes has files of terabytes of which a few blocks
//! exist. Memory and every walk cost what is allocated, never the files' sizes.

use mako_format::DiskAddress;
use std::collections::BTreeMap;

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MetaBlocks {
    blocks: BTreeMap<u64, DiskAddress>,
    /// Logical length in blocks (holes included): the file's size / block size.
    len: u64,
}

impl MetaBlocks {
    pub fn new(len: u64) -> Self {
        MetaBlocks {
            blocks: BTreeMap::new(),
            len,
        }
    }
    /// Logical length in blocks, holes included.
    pub fn len(&self) -> usize {
        self.len as usize
    }
    pub fn len_blocks(&self) -> u64 {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// Blocks actually allocated.
    pub fn allocated(&self) -> usize {
        self.blocks.len()
    }
    /// The address of block `b`; `None` for a hole or past the end.
    pub fn get(&self, b: usize) -> Option<&DiskAddress> {
        self.blocks.get(&(b as u64))
    }
    pub fn set(&mut self, b: u64, da: DiskAddress) {
        if da.is_null() {
            self.blocks.remove(&b);
        } else {
            self.blocks.insert(b, da);
        }
        self.len = self.len.max(b + 1);
    }
    pub fn set_len(&mut self, len: u64) {
        self.len = self.len.max(len);
    }
    /// Allocated blocks, in order: (block index, address).
    pub fn iter(&self) -> impl Iterator<Item = (u64, DiskAddress)> + '_ {
        self.blocks.iter().map(|(b, d)| (*b, *d))
    }
    /// Allocated blocks whose index lies in `range`.
    pub fn range(
        &self,
        range: std::ops::Range<u64>,
    ) -> impl Iterator<Item = (u64, DiskAddress)> + '_ {
        self.blocks.range(range).map(|(b, d)| (*b, *d))
    }
}

impl From<Vec<DiskAddress>> for MetaBlocks {
    fn from(v: Vec<DiskAddress>) -> Self {
        let mut m = MetaBlocks::new(v.len() as u64);
        for (i, d) in v.into_iter().enumerate() {
            m.set(i as u64, d);
        }
        m
    }
}

impl std::ops::Index<usize> for MetaBlocks {
    type Output = DiskAddress;
    /// A hole reads as `DiskAddress::NULL`.
    fn index(&self, b: usize) -> &DiskAddress {
        static NULL: DiskAddress = DiskAddress::NULL;
        self.blocks.get(&(b as u64)).unwrap_or(&NULL)
    }
}
