//! Property tests: every encoder's output decodes to the same structure.

use mako_format::dir_block::*;
use mako_format::error::Location;
use mako_format::inode::*;
use mako_format::xattr::*;
use mako_format::DiskAddress;
use proptest::prelude::*;

fn name_strategy() -> impl Strategy<Value = Vec<u8>> {
    proptest::collection::vec(
        any::<u8>().prop_filter("no / or NUL", |b| *b != b'/' && *b != 0),
        1..40,
    )
    .prop_filter("not . or ..", |n| n != b"." && n != b"..")
}

proptest! {
    #[test]
    fn inode_roundtrip(mode in prop_oneof![Just(0o100644u32), Just(0o040755u32), Just(0o120777u32)],
                       size in 0..=FILE_BYTES_MAX, uid in any::<u32>(), nsec in 0u32..1_000_000_000,
                       data in proptest::collection::vec(any::<u8>(), 0..2000),
                       xname in proptest::collection::vec(any::<u8>(), 1..30),
                       xval in proptest::collection::vec(any::<u8>(), 0..500),
                       ptrs in proptest::collection::vec(any::<u64>(), 64),
                       kind in 0u8..2) {
        let mut i = Inode::new(1234, mode);
        i.size = size; i.uid = uid; i.atime.nsec = nsec; i.ctime.sec = -5;
        i.xattrs.push((xname, xval));
        i.content = if kind == 0 || mode == 0o040755 {
            if mode == 0o040755 { InodeContent::InlineDir(vec![]) } else { InodeContent::InlineData(data) }
        } else {
            InodeContent::Pointers(ptrs.into_iter().map(DiskAddress::from_raw).collect())
        };
        let enc = i.encode(4096).unwrap();
        prop_assert_eq!(enc.len(), 4096);
        prop_assert_eq!(u16::from_le_bytes([enc[4], enc[5]]), 1, "no xattr index: version 1");
        let dec = Inode::decode(&enc, 4096, 1234, Location::Memory).unwrap();
        prop_assert_eq!(&dec, &i);
        // With an xattr index the inode is version 2 and keeps the address.
        let mut j = i.clone();
        j.xattr_index = DiskAddress::new(3, 4096);
        let enc = j.encode(4096).unwrap();
        prop_assert_eq!(u16::from_le_bytes([enc[4], enc[5]]), INODE_VERSION_XATTR_INDEX);
        prop_assert_eq!(Inode::decode(&enc, 4096, 1234, Location::Memory).unwrap(), j);
    }

    #[test]
    fn xattr_blocks_roundtrip(
        attrs in proptest::collection::btree_map(
            proptest::collection::vec(1u8..=255, 1..=255),
            prop_oneof![
                proptest::collection::vec(any::<u8>(), 0..100),
                proptest::collection::vec(any::<u8>(), 0..=XATTR_VALUE_BYTES_MAX),
            ],
            0..40),
        block in prop_oneof![Just(4096u32), Just(8192u32), Just(16384u32)],
        ino in any::<u64>())
    {
        let attrs: Vec<Xattr> = attrs.into_iter().collect();
        let blocks: Vec<XattrBlock> = pack(&attrs, block)
            .into_iter()
            .enumerate()
            .map(|(k, pieces)| XattrBlock { ino, index: k as u32, pieces })
            .collect();
        let mut decoded = Vec::new();
        for b in &blocks {
            let enc = b.encode(block);
            prop_assert_eq!(enc.len(), block as usize);
            let d = XattrBlock::decode(&enc, block, ino, b.index, Location::Memory).unwrap();
            prop_assert_eq!(&d, b);
            decoded.push(d);
        }
        prop_assert_eq!(assemble(&decoded).unwrap(), attrs.clone());
        if !blocks.is_empty() {
            prop_assert!(blocks.len() <= index_capacity(block));
            let index = XattrIndex {
                ino,
                attrs: attrs.len() as u32,
                blocks: (0..blocks.len()).map(|k| DiskAddress::new(1, 8 + 8 * k as u64)).collect(),
            };
            let enc = index.encode(block);
            prop_assert_eq!(XattrIndex::decode(&enc, block, ino, Location::Memory).unwrap(), index);
        }
    }

    #[test]
    fn dir_block_roundtrip(names in proptest::collection::btree_set(name_strategy(), 0..200), depth in 0u8..6, idx_seed in any::<u64>()) {
        let index = if depth == 0 { 0 } else { idx_seed % (1 << depth) };
        let (lo, hi) = cookie_range(index, depth);
        let span = (hi - lo).max(1);
        let mut entries: Vec<DirEntry> = names.into_iter().enumerate().map(|(k, name)| {
            // Spread over the block's range: a page holds 1/64 of it.
            let cookie = (lo + ((k as u128 * span as u128) / 200) as u64 + (k as u64 % 7)).min(hi).max(3);
            DirEntry { cookie, ino: k as u64 + 1, kind: 8, name }
        }).collect();
        entries.sort_by_key(|e| e.cookie);
        entries.dedup_by_key(|e| e.cookie);
        let blk = DirBlock { id: DirBlockId { ino: 5, index }, depth, capacity_bytes: 256 * 1024, entries };
        let enc = blk.encode();
        let dec = DirBlock::decode(&enc, blk.id, Location::Memory).unwrap();
        prop_assert_eq!(dec, blk);
    }
}

/// The chattr attributes are kept in the inode's flags; a flag this version does not know
/// is refused, never silently dropped (it may be one that restricts access).
#[test]
fn inode_attribute_flags_roundtrip_and_unknown_flags_are_refused() {
    let mut i = Inode::new(77, 0o100644);
    i.flags = FLAG_IMMUTABLE | FLAG_APPEND;
    let enc = i.encode(512).unwrap();
    let dec = Inode::decode(&enc, 512, 77, Location::Memory).unwrap();
    assert_eq!(dec.flags, FLAG_IMMUTABLE | FLAG_APPEND);
    i.flags = 1 << 30;
    let enc = i.encode(512).unwrap();
    let err = Inode::decode(&enc, 512, 77, Location::Memory).unwrap_err();
    assert!(err.to_string().contains("unknown flags"), "{err}");
}

/// No inode claims a file larger than the format allows, so no offset arithmetic on a
/// size read from disk can overflow.
#[test]
fn inode_larger_than_the_largest_file_is_refused() {
    let mut i = Inode::new(78, 0o100644);
    i.size = FILE_BYTES_MAX;
    let enc = i.encode(512).unwrap();
    assert_eq!(
        Inode::decode(&enc, 512, 78, Location::Memory).unwrap().size,
        FILE_BYTES_MAX
    );
    i.size = FILE_BYTES_MAX + 1;
    let enc = i.encode(512).unwrap();
    let err = Inode::decode(&enc, 512, 78, Location::Memory).unwrap_err();
    assert!(err.to_string().contains("largest file"), "{err}");
}
