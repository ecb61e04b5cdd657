//! The corruption corpus: one kind of damage per test, injected into the busy image by
//! writing into the disks (structures found by reading the metadata, see `Inspect`).
//! For each: `fsck -n` detects it (exit 4) and names it, `fsck -y` repairs it (exit 1),
//! a second `fsck -n` is clean (exit 0), the repaired file system mounts and every
//! file the damage did not hit reads back its exact content, and after a mount and
//! unmount the file system is still clean.

mod common;

use common::*;
use mako_format::dir_block::DirEntry;
use mako_format::inode::InodeContent;
use mako_format::name_hash::home_cookie;
use mako_format::DiskAddress;
use mako_fs::fs::{FileSystem, ROOT_INO};
use mako_fsck::{ProblemKind, EXIT_CLEAN, EXIT_CORRECTED, EXIT_UNCORRECTED};

struct Case {
    kind: ProblemKind,
    /// The problem must name this inode.
    ino: Option<u64>,
    /// Paths whose content or name the damage may change.
    hit: Vec<&'static str>,
    /// What the repair report must say it did about the problem.
    repaired: Option<&'static str>,
}

fn case(kind: ProblemKind, ino: Option<u64>, hit: &[&'static str]) -> Case {
    Case {
        kind,
        ino,
        hit: hit.to_vec(),
        repaired: None,
    }
}

fn run(
    name: &str,
    inject: impl FnOnce(&Inspect, &Fixture) -> Case,
    after: impl FnOnce(&FileSystem, &Fixture),
) {
    let fx = fixture();
    let disks = fx.restore();
    let ins = Inspect::open(&disks);
    let c = inject(&ins, fx);
    let r = fsck(&disks, false);
    if std::env::var_os("MAKO_FSCK_SHOW").is_some() {
        eprintln!("=== {name}\n{}", r.render());
    }
    assert_eq!(
        r.exit_code,
        EXIT_UNCORRECTED,
        "{name}: fsck -n must find the damage\n{}",
        r.render()
    );
    assert!(
        r.of_kind(c.kind)
            .any(|p| c.ino.is_none_or(|i| p.ino == Some(i))),
        "{name}: no {} problem{}\n{}",
        c.kind.name(),
        c.ino
            .map(|i| format!(" naming inode {i}"))
            .unwrap_or_default(),
        r.render()
    );
    assert!(
        r.problems.iter().all(|p| !p.fixed),
        "{name}: -n fixed something"
    );
    let r = fsck(&disks, true);
    assert_eq!(
        r.exit_code,
        EXIT_CORRECTED,
        "{name}: fsck -y must repair everything\n{}",
        r.render()
    );
    if let Some(said) = c.repaired {
        assert!(
            r.of_kind(c.kind)
                .any(|p| p.fixed && p.repair.contains(said)),
            "{name}: the repair should say {said:?}\n{}",
            r.render()
        );
    }
    let r = fsck(&disks, false);
    assert_eq!(
        r.exit_code,
        EXIT_CLEAN,
        "{name}: the second fsck -n is not clean\n{}",
        r.render()
    );
    let m = disks.mount(config());
    verify_untouched(&m.fs, fx, &c.hit);
    after(&m.fs, fx);
    m.unmount().unwrap();
    let r = fsck(&disks, false);
    assert_eq!(
        r.exit_code,
        EXIT_CLEAN,
        "{name}: not clean after a mount and unmount\n{}",
        r.render()
    );
}

fn nothing(_: &FileSystem, _: &Fixture) {}

#[test]
fn inode_bit_flip() {
    run(
        "inode bit flip",
        |ins, fx| {
            let ino = fx.ino("/frag5000");
            ins.flip(ins.inode_da(ino), 200, 0x40);
            case(ProblemKind::BadInode, Some(ino), &["/frag5000"])
        },
        |fs, _| {
            assert!(
                lookup(fs, "/frag5000").is_none(),
                "the cleared inode's entry is removed"
            )
        },
    );
}

#[test]
fn invalid_file_type() {
    run(
        "inode with an invalid file type",
        |ins, fx| {
            let ino = fx.ino("/inline3k");
            let mut i = ins.inode(ino);
            i.mode = 0o170644;
            ins.put_inode(&i);
            case(ProblemKind::BadInode, Some(ino), &["/inline3k"])
        },
        |fs, _| assert!(lookup(fs, "/inline3k").is_none()),
    );
}

#[test]
fn indirect_block_bit_flip() {
    run(
        "indirect block bit flip",
        |ins, fx| {
            let ino = fx.ino("/big");
            let (_, ind) = ins.tree(ino);
            ins.flip(ind[0].2, 500, 0x20);
            case(ProblemKind::BadIndirectBlock, Some(ino), &["/big"])
        },
        |fs, fx| {
            // Every unit hung under the damaged block: the file keeps its size, as a hole.
            let data = read_all(fs, fx.ino("/big"));
            assert_eq!(data.len(), 8 << 20);
            assert!(data.iter().all(|&b| b == 0), "lost units read as zeros");
        },
    );
}

#[test]
fn xattr_block_bit_flip() {
    let lost = std::cell::RefCell::new(Vec::<Vec<u8>>::new());
    run(
        "xattr block bit flip",
        |ins, fx| {
            let ino = fx.ino("/xattr_file");
            let (_, blocks) = ins.xattr_blocks(ino);
            assert!(blocks.len() >= 5, "{} xattr blocks", blocks.len());
            // The block holding the middle of the large value: the value is lost with
            // the other attributes that have a piece there.
            let (da, hit) = blocks
                .iter()
                .find(|(_, b)| {
                    b.pieces
                        .iter()
                        .any(|p| p.name == b"user.large" && p.offset > 0)
                })
                .unwrap();
            *lost.borrow_mut() = hit.pieces.iter().map(|p| p.name.clone()).collect();
            ins.flip(*da, 300, 0x08);
            Case {
                kind: ProblemKind::BadXattrBlock,
                ino: Some(ino),
                hit: vec!["/xattr_file"],
                repaired: Some("new xattr blocks"),
            }
        },
        |fs, fx| {
            let ino = fx.ino("/xattr_file");
            let lost = lost.borrow();
            assert!(lost.contains(&b"user.large".to_vec()));
            let now = xattrs_of(fs, ino);
            for (n, v) in &fx.xattrs["/xattr_file"] {
                let there = now.iter().find(|(m, _)| m == n);
                if lost.contains(n) {
                    assert!(there.is_none(), "{n:?} had a piece in the damaged block");
                } else {
                    assert_eq!(there.map(|x| &x.1), Some(v), "{n:?} survives");
                }
            }
            assert_eq!(
                read_all(fs, ino),
                pattern(26, 1000),
                "the data is untouched"
            );
        },
    );
}

#[test]
fn xattr_index_lost() {
    let inline = std::cell::RefCell::new(Vec::new());
    run(
        "xattr index block zeroed",
        |ins, fx| {
            let ino = fx.ino("/xattr_file");
            let i = ins.inode(ino);
            let mut v = i.xattrs.clone();
            v.sort();
            assert!(v.len() < fx.xattrs["/xattr_file"].len());
            *inline.borrow_mut() = v;
            let (index, _) = ins.xattr_blocks(ino);
            ins.write(index, &vec![0u8; 4096]);
            case(ProblemKind::BadXattrBlock, Some(ino), &["/xattr_file"])
        },
        |fs, fx| {
            // The attributes held in the inode are left, the others are gone.
            let ino = fx.ino("/xattr_file");
            assert_eq!(xattrs_of(fs, ino), *inline.borrow());
            assert!(fs.raw_inode(ino).unwrap().xattr_index.is_null());
        },
    );
}

#[test]
fn directory_rebuilt_keeps_its_xattr_blocks() {
    run(
        "directory block bit flip under a directory with xattr blocks",
        |ins, fx| {
            let ino = fx.ino("/bigdir");
            assert_ne!(ins.inode(ino).xattr_index, DiskAddress::NULL);
            let blocks = ins.dir_blocks(ino);
            ins.flip(blocks[1].1, 100, 0x01);
            case(ProblemKind::BadDirectoryBlock, Some(ino), &["/bigdir"])
        },
        |fs, fx| {
            let ino = fx.ino("/bigdir");
            assert_eq!(
                xattrs_of(fs, ino),
                fx.xattrs["/bigdir"],
                "the rebuilt directory keeps its attributes"
            );
        },
    );
}

#[test]
fn truncated_indirect_tree() {
    run(
        "truncated indirect tree (the last indirect block lost)",
        |ins, fx| {
            let ino = fx.ino("/sparse");
            let (_, ind) = ins.tree(ino);
            let last = ind.iter().filter(|b| b.0 == 1).max_by_key(|b| b.1).unwrap();
            assert_eq!(last.1, 1, "unit 640 hangs under the second level-1 block");
            ins.write(last.2, &vec![0u8; 4096]);
            case(ProblemKind::BadIndirectBlock, Some(ino), &["/sparse"])
        },
        |fs, fx| {
            let ino = fx.ino("/sparse");
            let data = read_all(fs, ino);
            assert_eq!(data.len(), (40 << 20) + 5000, "the size stays");
            assert!(
                data[..10_000] == pattern(20, 10_000)[..],
                "the first units survive"
            );
            assert!(
                data[40 << 20..].iter().all(|&b| b == 0),
                "the units under the lost block read as zeros"
            );
        },
    );
}

#[test]
fn tree_depth_too_small() {
    run(
        "inode depth smaller than its tree",
        |ins, fx| {
            let ino = fx.ino("/big");
            let mut i = ins.inode(ino);
            assert_eq!(i.depth, 1);
            i.depth = 0;
            ins.put_inode(&i);
            case(ProblemKind::TreeDepth, Some(ino), &[])
        },
        nothing,
    );
}

#[test]
fn subblock_count_wrong() {
    run(
        "subblock count wrong",
        |ins, fx| {
            let ino = fx.ino("/big");
            let mut i = ins.inode(ino);
            i.subblocks += 7;
            ins.put_inode(&i);
            case(ProblemKind::InodeField, Some(ino), &[])
        },
        nothing,
    );
}

#[test]
fn pointer_off_the_disks() {
    run(
        "block pointer to a disk that does not exist",
        |ins, fx| {
            let ino = fx.ino("/blockplus");
            let mut i = ins.inode(ino);
            let InodeContent::Pointers(p) = &mut i.content else {
                panic!("pointers")
            };
            p[1] = DiskAddress::new(9, 4096);
            ins.put_inode(&i);
            case(ProblemKind::BadPointer, Some(ino), &["/blockplus"])
        },
        |fs, fx| {
            let data = read_all(fs, fx.ino("/blockplus"));
            assert_eq!(data.len(), 65537);
            assert!(
                data[..65536] == pattern(6, 65537)[..65536],
                "the first block is kept"
            );
            assert_eq!(data[65536], 0, "the fragment is a hole");
        },
    );
}

#[test]
fn directory_block_bit_flip() {
    run(
        "directory block bit flip",
        |ins, fx| {
            let ino = fx.ino("/bigdir");
            let blocks = ins.dir_blocks(ino);
            assert!(blocks.len() >= 3);
            ins.flip(blocks[1].1, 100, 0x01);
            case(ProblemKind::BadDirectoryBlock, Some(ino), &["/bigdir"])
        },
        |fs, fx| {
            let kept = list(fs, fx.ino("/bigdir")).len();
            let found = lost_found_intact(fs, fx);
            assert!(found > 0, "the lost entries' files are in /lost+found");
            assert_eq!(
                kept + found,
                BIGDIR_ENTRIES,
                "every file is either still named or in /lost+found"
            );
        },
    );
}

#[test]
fn allocation_segment_bit_flip() {
    run(
        "allocation map segment bit flip",
        |ins, _| {
            let (da, _) = ins.alloc_segment(1);
            ins.flip(da, 40, 0x01);
            case(ProblemKind::AllocSegment, None, &[])
        },
        nothing,
    );
}

#[test]
fn inode_map_segment_bit_flip() {
    run(
        "inode map segment bit flip",
        |ins, _| {
            let (da, _) = ins.imap_segment(0);
            ins.flip(da, 100, 0x04);
            case(ProblemKind::InodeMapSegment, None, &[])
        },
        nothing,
    );
}

#[test]
fn descriptor_copy_bit_flip() {
    run(
        "descriptor copy bit flip",
        |ins, _| {
            ins.flip(ins.descriptor_da(ins.desc.descriptor_disks[0]), 50, 0x10);
            case(ProblemKind::DescriptorCopy, None, &[])
        },
        nothing,
    );
}

#[test]
fn lost_descriptor_copy() {
    run(
        "lost descriptor copy",
        |ins, _| {
            ins.write(
                ins.descriptor_da(ins.desc.descriptor_disks[1]),
                &vec![0u8; 4096],
            );
            case(ProblemKind::DescriptorCopy, None, &[])
        },
        nothing,
    );
}

#[test]
fn disk_header_bit_flip() {
    run(
        "disk header bit flip",
        |ins, _| {
            ins.flip(DiskAddress::new(2, 0), 30, 0x08);
            case(ProblemKind::DiskHeader, None, &[])
        },
        nothing,
    );
}

#[test]
fn cross_linked_block() {
    run(
        "cross-linked block",
        |ins, fx| {
            let (b64, bp) = (fx.ino("/block64k"), fx.ino("/blockplus"));
            let (units, _) = ins.tree(b64);
            let mut i = ins.inode(bp);
            let InodeContent::Pointers(p) = &mut i.content else {
                panic!("pointers")
            };
            p[0] = units[0].1;
            ins.put_inode(&i);
            Case {
                repaired: Some("its own copy"),
                ..case(ProblemKind::CrossLinkedBlock, Some(bp), &["/blockplus"])
            }
        },
        |fs, fx| {
            let (b64, bp) = (fx.ino("/block64k"), fx.ino("/blockplus"));
            let data = read_all(fs, bp);
            assert!(
                data[..65536] == pattern(5, 65536)[..],
                "the second owner has a copy of the shared block"
            );
            assert!(
                data[65536..] == pattern(6, 65537)[65536..],
                "its fragment is its own"
            );
            assert_ne!(
                fs.block_list(bp).unwrap()[0].1,
                fs.block_list(b64).unwrap()[0].1,
                "no block is shared any more"
            );
        },
    );
}

#[test]
fn fragment_cross_linked_with_an_xattr_block() {
    run(
        "a file's fragment pointing into another file's xattr block",
        |ins, fx| {
            let (xf, bp) = (fx.ino("/xattr_file"), fx.ino("/blockplus"));
            let (_, blocks) = ins.xattr_blocks(xf);
            let mut i = ins.inode(bp);
            assert_eq!(i.last_block_subblocks, 1, "/blockplus ends in a fragment");
            let InodeContent::Pointers(p) = &mut i.content else {
                panic!("pointers")
            };
            p[1] = blocks[1].0;
            ins.put_inode(&i);
            case(ProblemKind::CrossLinkedBlock, Some(bp), &["/blockplus"])
        },
        |fs, fx| {
            // The xattr block (identity-checked metadata) stays with its file, whose
            // attributes are all there (checked for every untouched path); the data
            // owner gets a copy.
            let (xf, bp) = (fx.ino("/xattr_file"), fx.ino("/blockplus"));
            assert_eq!(xattrs_of(fs, xf), fx.xattrs["/xattr_file"]);
            assert_eq!(read_all(fs, bp).len(), 65537);
        },
    );
}

fn set_bits(ins: &Inspect, da: DiskAddress, n: u64, on: bool) {
    let s = da.sector() / ins.desc.geometry.sectors_per_subblock();
    let (region, k) = ins.region_of(da.disk(), s);
    let (sda, mut seg) = ins.alloc_segment(region);
    let first = seg.slices[k].first_subblock;
    for i in s - first..s - first + n {
        let w = &mut seg.bitmaps[k][(i / 64) as usize];
        if on {
            *w |= 1 << (i % 64);
        } else {
            *w &= !(1 << (i % 64));
        }
    }
    ins.put_alloc_segment(sda, &seg);
}

#[test]
fn block_marked_free_but_in_use() {
    run(
        "block in use but marked free",
        |ins, fx| {
            let ino = fx.ino("/big");
            let (units, _) = ins.tree(ino);
            set_bits(ins, units[5].1, 32, false);
            case(ProblemKind::BlockMarkedFree, Some(ino), &[])
        },
        nothing,
    );
}

#[test]
fn block_marked_used_but_free() {
    run(
        "free block marked in use",
        |ins, _| {
            // The last block of region 2 on disk 3 is free in this image.
            let (_, seg) = ins.alloc_segment(2);
            let k = seg.slices.iter().position(|s| s.disk == 3).unwrap();
            let sl = seg.slices[k];
            let last = sl.first_subblock + sl.subblocks - 32;
            assert!(
                seg.bitmaps[k][((last - sl.first_subblock) / 64) as usize] == 0,
                "free in the image"
            );
            set_bits(
                ins,
                DiskAddress::new(3, last * ins.desc.geometry.sectors_per_subblock()),
                32,
                true,
            );
            case(ProblemKind::BlockLeaked, None, &[])
        },
        nothing,
    );
}

#[test]
fn wrong_link_count() {
    run(
        "wrong link count",
        |ins, fx| {
            let ino = fx.ino("/hard1");
            let mut i = ins.inode(ino);
            assert_eq!(i.nlink, 2);
            i.nlink = 5;
            ins.put_inode(&i);
            case(ProblemKind::LinkCount, Some(ino), &[])
        },
        |fs, fx| assert_eq!(fs.getattr(fx.ino("/hard1")).unwrap().nlink, 2),
    );
}

#[test]
fn entry_to_free_inode() {
    run(
        "directory entry naming a free inode",
        |ins, fx| {
            let dir = fx.ino("/dir1");
            let mut e = ins.inline_entries(dir);
            e.push(DirEntry {
                cookie: home_cookie(b"ghost"),
                ino: fx.ino("(gone)"),
                kind: 8,
                name: b"ghost".to_vec(),
            });
            ins.set_inline_entries(dir, e);
            case(ProblemKind::EntryToFreeInode, Some(dir), &[])
        },
        |fs, _| assert!(lookup(fs, "/dir1/ghost").is_none()),
    );
}

#[test]
fn broken_hash_chain() {
    run(
        "broken hash chain",
        |ins, fx| {
            let dir = fx.ino("/fragdir");
            let blocks = ins.dir_blocks(dir);
            assert_eq!(blocks.len(), 1, "one fragment");
            let (_, da, mut b) = blocks.into_iter().next().unwrap();
            let cookies: Vec<u64> = b.entries.iter().map(|e| e.cookie).collect();
            let e = b
                .entries
                .iter_mut()
                .find(|e| e.cookie == home_cookie(&e.name) && !cookies.contains(&(e.cookie + 1)))
                .unwrap();
            e.cookie += 1; // its home cookie is now free: lookup stops there
            b.entries.sort_by_key(|e| e.cookie);
            ins.put_dir_block(da, &b);
            case(ProblemKind::BrokenHashChain, Some(dir), &[])
        },
        nothing,
    );
}

#[test]
fn duplicate_name() {
    run(
        "one name twice in a directory",
        |ins, fx| {
            let dir = fx.ino("/fragdir");
            let (_, da, mut b) = ins.dir_blocks(dir).into_iter().next().unwrap();
            let cookies: Vec<u64> = b.entries.iter().map(|e| e.cookie).collect();
            let e = b
                .entries
                .iter()
                .find(|e| !cookies.contains(&(e.cookie + 1)))
                .unwrap()
                .clone();
            b.entries.push(DirEntry {
                cookie: e.cookie + 1,
                ino: fx.ino("/tiny"),
                kind: 8,
                name: e.name,
            });
            b.entries.sort_by_key(|e| e.cookie);
            ins.put_dir_block(da, &b);
            case(ProblemKind::DuplicateName, Some(dir), &[])
        },
        nothing,
    );
}

#[test]
fn orphan_inode() {
    run(
        "orphan inode (its only entry lost)",
        |ins, fx| {
            let dir = fx.ino("/dir1/dir2/dir3");
            let mut e = ins.inline_entries(dir);
            e.retain(|x| x.name != b"deep");
            ins.set_inline_entries(dir, e);
            case(
                ProblemKind::Orphan,
                Some(fx.ino("/dir1/dir2/dir3/deep")),
                &["/dir1/dir2/dir3/deep"],
            )
        },
        |fs, fx| {
            assert_eq!(lost_found_intact(fs, fx), 1);
            let ino = lookup(
                fs,
                &format!("/lost+found/#{}", fx.ino("/dir1/dir2/dir3/deep")),
            )
            .unwrap();
            assert!(read_all(fs, ino) == pattern(24, 20_000));
        },
    );
}

#[test]
fn orphan_directory_tree() {
    run(
        "orphan directory with files under it",
        |ins, fx| {
            let mut e = ins.inline_entries(fx.ino("/dir1"));
            e.retain(|x| x.name != b"dir2");
            ins.set_inline_entries(fx.ino("/dir1"), e);
            case(
                ProblemKind::Orphan,
                Some(fx.ino("/dir1/dir2")),
                &["/dir1/dir2", "/dir1"],
            )
        },
        |fs, fx| {
            assert_eq!(
                lost_found_intact(fs, fx),
                1,
                "only the top of the orphaned tree is reconnected"
            );
            let deep = lookup(
                fs,
                &format!("/lost+found/#{}/dir3/deep", fx.ino("/dir1/dir2")),
            )
            .expect("the tree below comes along");
            assert!(read_all(fs, deep) == pattern(24, 20_000));
            assert_eq!(
                fs.lookup(fx.ino("/dir1/dir2"), b"..").unwrap().ino,
                lookup(fs, "/lost+found").unwrap(),
                "`..` follows"
            );
        },
    );
}

#[test]
fn unlinked_inode() {
    run(
        "in use with no links (open and unlinked at a crash)",
        |ins, fx| {
            let ino = fx.ino("/tiny");
            let mut e = ins.inline_entries(ROOT_INO);
            e.retain(|x| x.name != b"tiny");
            ins.set_inline_entries(ROOT_INO, e);
            let mut i = ins.inode(ino);
            i.nlink = 0;
            ins.put_inode(&i);
            case(ProblemKind::UnlinkedInode, Some(ino), &["/tiny"])
        },
        |fs, fx| {
            assert!(lookup(fs, "/tiny").is_none());
            assert!(fs.getattr(fx.ino("/tiny")).is_err(), "the inode is free");
        },
    );
}

#[test]
fn bad_parent_pointer() {
    run(
        "directory whose .. is wrong",
        |ins, fx| {
            let ino = fx.ino("/dir1/dir2");
            let mut i = ins.inode(ino);
            i.parent = ROOT_INO;
            ins.put_inode(&i);
            case(ProblemKind::BadParent, Some(ino), &[])
        },
        |fs, fx| {
            assert_eq!(
                fs.lookup(fx.ino("/dir1/dir2"), b"..").unwrap().ino,
                fx.ino("/dir1")
            )
        },
    );
}

#[test]
fn entry_type_mismatch() {
    run(
        "entry type differs from the inode's",
        |ins, fx| {
            let dir = fx.ino("/dir1");
            let mut e = ins.inline_entries(dir);
            e.iter_mut().find(|x| x.name == b"hard2").unwrap().kind = 4;
            ins.set_inline_entries(dir, e);
            case(ProblemKind::EntryType, Some(dir), &[])
        },
        nothing,
    );
}

#[test]
fn directory_hard_link() {
    run(
        "directory with a second name",
        |ins, fx| {
            let mut e = ins.inline_entries(ROOT_INO);
            e.push(DirEntry {
                cookie: home_cookie(b"dir2again"),
                ino: fx.ino("/dir1/dir2"),
                kind: 4,
                name: b"dir2again".to_vec(),
            });
            ins.set_inline_entries(ROOT_INO, e);
            case(
                ProblemKind::DirectoryHardLink,
                Some(fx.ino("/dir1/dir2")),
                &[],
            )
        },
        |fs, _| assert!(lookup(fs, "/dir2again").is_none()),
    );
}

fn set_inode_bit(ins: &Inspect, ino: u64, on: bool) {
    let per = ins.desc.inodes_per_segment as u64;
    let (da, mut seg) = ins.imap_segment((ino / per) as u32);
    let i = ino % per;
    if on {
        seg.bitmap[(i / 64) as usize] |= 1 << (i % 64);
    } else {
        seg.bitmap[(i / 64) as usize] &= !(1 << (i % 64));
    }
    ins.put_imap_segment(da, &seg);
}

#[test]
fn inode_in_use_marked_free() {
    run(
        "inode in use but free in the inode map",
        |ins, fx| {
            let ino = fx.ino("/frag5000");
            set_inode_bit(ins, ino, false);
            case(ProblemKind::InodeMarkedFree, Some(ino), &[])
        },
        nothing,
    );
}

#[test]
fn free_inode_marked_in_use() {
    run(
        "free inode marked in use",
        |ins, _| {
            let ino = ins.unused_ino();
            set_inode_bit(ins, ino, true);
            case(ProblemKind::InodeLeaked, Some(ino), &[])
        },
        nothing,
    );
}

#[test]
fn log_header_bit_flip() {
    run(
        "recovery log header bit flip",
        |ins, _| {
            let log = mako_format::log_table::log_ino(0);
            ins.flip(ins.metafile_da(log, 0), 20, 0x02);
            case(ProblemKind::LogHeader, Some(log), &[])
        },
        nothing,
    );
}

#[test]
fn allocation_map_file_inode_bit_flip() {
    run(
        "the block allocation map's own inode damaged",
        |ins, _| {
            let ino = ins.desc.metadata_inodes.block_alloc_map;
            ins.flip(ins.inode_da(ino), 300, 0x01);
            case(ProblemKind::MetadataFile, Some(ino), &[])
        },
        nothing,
    );
}

#[test]
fn log_file_inode_bit_flip() {
    run(
        "the recovery log's own inode damaged",
        |ins, _| {
            let ino = mako_format::log_table::log_ino(0);
            ins.flip(ins.inode_da(ino), 300, 0x01);
            case(ProblemKind::MetadataFile, Some(ino), &[])
        },
        nothing,
    );
}

#[test]
fn root_directory_bit_flip() {
    run(
        "root directory inode damaged",
        |ins, _| {
            ins.flip(ins.inode_da(ROOT_INO), 400, 0x80);
            case(ProblemKind::MetadataFile, Some(ROOT_INO), &["*"])
        },
        |fs, fx| {
            let found = lost_found_intact(fs, fx);
            assert!(
                found >= 15,
                "everything the root held is in /lost+found ({found})"
            );
            let dir1 = lookup(fs, &format!("/lost+found/#{}", fx.ino("/dir1"))).unwrap();
            let small = fs.lookup(dir1, b"small").unwrap().ino;
            assert!(read_all(fs, small) == pattern(25, 10));
        },
    );
}

#[test]
fn orphan_when_the_inode_file_is_full() {
    run(
        "orphan with no free inode slot for /lost+found",
        |ins, fx| {
            // The image's only free slot is named by a stale entry, so it cannot be
            // reused: /lost+found needs a new block of the inode file.
            let slots = ins.inode_file.len() as u64 * ins.block_bytes() / 4096;
            let gone = fx.ino("(gone)");
            assert!(
                (16..slots).all(|i| i == gone || !ins.slot_blank(i)),
                "the fixture's inode file is full"
            );
            let dir1 = fx.ino("/dir1");
            let mut e = ins.inline_entries(dir1);
            e.push(DirEntry {
                cookie: home_cookie(b"stale"),
                ino: gone,
                kind: 8,
                name: b"stale".to_vec(),
            });
            ins.set_inline_entries(dir1, e);
            let dir3 = fx.ino("/dir1/dir2/dir3");
            let mut e = ins.inline_entries(dir3);
            e.retain(|x| x.name != b"deep");
            ins.set_inline_entries(dir3, e);
            case(ProblemKind::LostFound, None, &["/dir1/dir2/dir3/deep"])
        },
        |fs, fx| {
            assert_eq!(lost_found_intact(fs, fx), 1);
            assert!(
                lookup(fs, "/lost+found").unwrap() >= 4240,
                "/lost+found lives in the inode file's new block"
            );
        },
    );
}

#[test]
fn stale_descriptor_copy() {
    run(
        "descriptor copy of an older generation",
        |ins, _| {
            let mut old = ins.desc.clone();
            old.generation -= 1;
            old.mounted = true;
            ins.write(
                ins.descriptor_da(ins.desc.descriptor_disks[2]),
                &old.encode().unwrap(),
            );
            case(ProblemKind::DescriptorCopy, None, &[])
        },
        nothing,
    );
}

#[test]
fn cross_linked_block_with_no_space_left() {
    run(
        "cross-linked block when no space is left for a copy",
        |ins, fx| {
            let (b64, bp) = (fx.ino("/block64k"), fx.ino("/blockplus"));
            let (units, _) = ins.tree(b64);
            let mut i = ins.inode(bp);
            let InodeContent::Pointers(p) = &mut i.content else {
                panic!("pointers")
            };
            p[0] = units[0].1;
            ins.put_inode(&i);
            // Every free subblock marked in use: the repair may not take any of them.
            for r in 0..ins.desc.regions {
                let (da, mut seg) = ins.alloc_segment(r);
                for (s, bits) in seg.slices.iter().zip(seg.bitmaps.iter_mut()) {
                    for (w, word) in bits.iter_mut().enumerate() {
                        let valid = (s.subblocks - w as u64 * 64).min(64);
                        *word = if valid == 64 {
                            u64::MAX
                        } else {
                            (1u64 << valid) - 1
                        };
                    }
                }
                ins.put_alloc_segment(da, &seg);
            }
            Case {
                repaired: Some("no space left for a copy"),
                ..case(ProblemKind::CrossLinkedBlock, Some(bp), &["/blockplus"])
            }
        },
        |fs, fx| {
            let data = read_all(fs, fx.ino("/blockplus"));
            assert_eq!(data.len(), 65537);
            assert!(
                data[..65536].iter().all(|&b| b == 0),
                "without space the second owner's unit becomes a hole"
            );
            assert!(
                read_all(fs, fx.ino("/block64k")) == pattern(5, 65536),
                "the first owner keeps its block"
            );
        },
    );
}

#[test]
fn torn_log_tail() {
    run(
        "a crash with the last log transaction torn",
        |ins, _| {
            // Two committed transactions, then a crash (drop without unmount), then the
            // second one torn: a sector of its payload never reached the disk.
            let disks = mako_fs::test_util::MemDisks {
                disks: ins.disks.clone(),
            };
            let m = disks.mount(config());
            let a =
                m.fs.create(C, ROOT_INO, b"committed", 0o644, 0, true)
                    .unwrap()
                    .ino;
            m.fs.fsync(a, false).unwrap();
            let lsn = m.core().journal.head_lsn();
            let b =
                m.fs.create(C, ROOT_INO, b"torn", 0o644, 0, true)
                    .unwrap()
                    .ino;
            m.fs.fsync(b, false).unwrap();
            assert!(
                m.core().journal.head_lsn() > lsn + 1024,
                "the second transaction is in the log"
            );
            drop(m);
            let log = mako_format::log_table::log_ino(0);
            let capacity = mako_fs::journal::log_capacity(ins.desc.log_bytes);
            let off = mako_format::log_header::LOG_RECORDS_OFFSET + (lsn + 600) % capacity;
            ins.write(ins.metafile_da(log, off), &[0xa5; 512]);
            case(ProblemKind::LogReplay, Some(log), &[])
        },
        |fs, _| {
            assert!(
                lookup(fs, "/committed").is_some(),
                "the whole transaction before the torn one is replayed"
            );
            assert!(
                lookup(fs, "/torn").is_none(),
                "the torn transaction is discarded"
            );
        },
    );
}

/// Three committed transactions after the image was made (each an fsynced new file),
/// then a crash; the middle one is then damaged at `byte` of its first sector (media
/// damage: a valid transaction follows it). Returns the log inode and the damaged
/// transaction's LSN and address.
fn damage_middle_transaction(ins: &Inspect, byte: u64) -> (u64, u64, DiskAddress) {
    let disks = mako_fs::test_util::MemDisks {
        disks: ins.disks.clone(),
    };
    let m = disks.mount(config());
    // The first transaction grows the inode file (files made until it has), so that
    // the lost one does not: a transaction after the lost one whose inode lies in
    // inode-file growth the lost one made could not be kept (fsck finds it beyond
    // the inode file), and this case is about keeping what comes after.
    let inode_file = m.core().metadata_inodes().inode_file;
    let inode_file_blocks = || m.core().metafile_blocks.read()[&inode_file].len();
    let grown_from = inode_file_blocks();
    for i in 0..200 {
        if inode_file_blocks() > grown_from {
            break;
        }
        m.fs.create(C, ROOT_INO, format!("pad{i}").as_bytes(), 0o644, 0, true)
            .unwrap();
    }
    assert!(inode_file_blocks() > grown_from, "the inode file grew");
    let mut lsns = Vec::new();
    for (name, seed) in [("committed", 31u64), ("lost", 32), ("after", 33)] {
        lsns.push(m.core().journal.head_lsn());
        let a =
            m.fs.create(C, ROOT_INO, name.as_bytes(), 0o644, 0, true)
                .unwrap()
                .ino;
        m.fs.write(a, 0, &pattern(seed, 70_000), false).unwrap();
        m.fs.fsync(a, false).unwrap();
    }
    drop(m);
    let log = mako_format::log_table::log_ino(0);
    let capacity = mako_fs::journal::log_capacity(ins.desc.log_bytes);
    let off = mako_format::log_header::LOG_RECORDS_OFFSET + lsns[1] % capacity;
    let da = ins.metafile_da(log, off);
    ins.flip(da, byte, 0x5a);
    (log, lsns[1], da)
}

fn after_lost_transaction(fs: &FileSystem, _: &Fixture) {
    for (path, seed) in [("/committed", 31u64), ("/after", 33)] {
        let ino = lookup(fs, path).unwrap_or_else(|| panic!("{path}: replayed around the damage"));
        assert!(
            read_all(fs, ino) == pattern(seed, 70_000),
            "{path}: its data is intact"
        );
    }
    // The lost transaction's file: its inode was never written in place, so its name
    // (logged again by the transaction after it) is removed by the repair.
    assert!(lookup(fs, "/lost").is_none());
}

#[test]
fn damaged_log_transaction_in_the_middle() {
    run(
        "a committed log transaction before the last one damaged in its payload",
        |ins, _| {
            let (log, lsn, da) = damage_middle_transaction(ins, 300);
            // The mount refuses rather than drop the transaction after it.
            let disks = mako_fs::test_util::MemDisks {
                disks: ins.disks.clone(),
            };
            let e = match mako_fs::mount::mount_disks(disks.as_dyn(), config(), 0) {
                Err(e) => e.to_string(),
                Ok(_) => panic!("the mount dropped committed transactions"),
            };
            assert!(
                e.contains(&format!("LSN {lsn}"))
                    && e.contains(&da.to_string())
                    && e.contains("mako fsck -y"),
                "{e}"
            );
            Case {
                repaired: Some("replayed"),
                ..case(ProblemKind::LogTransactionLost, Some(log), &[])
            }
        },
        after_lost_transaction,
    );
}

#[test]
fn damaged_log_transaction_header_in_the_middle() {
    run(
        "a committed log transaction before the last one with a damaged header",
        |ins, _| {
            let (log, _, _) = damage_middle_transaction(ins, 20);
            Case {
                repaired: Some("replayed"),
                ..case(ProblemKind::LogTransactionLost, Some(log), &[])
            }
        },
        after_lost_transaction,
    );
}
