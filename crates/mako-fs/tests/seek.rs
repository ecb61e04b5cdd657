//! SEEK_DATA and SEEK_HOLE (issue 11): data after holes that span every level of the
//! indirect tree, from any offset in a hole or in data, with data on disk, dirty in the
//! pagepool, preallocated, and after a remount with nothing cached — checked against a
//! model of which blocks hold data.

use mako_fs::fs::{Ctx, FileSystem, ROOT_INO};
use mako_fs::test_util::{small_config, small_params, MemDisks};
use mako_fs::FsError;
use std::collections::BTreeSet;

const C: Ctx = Ctx {
    uid: 0,
    gid: 0,
    pid: 1,
};
/// small_params: 64 KiB blocks, 4 KiB indirect blocks (508 pointers), 64 pointers in
/// the inode.
const BB: u64 = 64 << 10;
const PPI: u64 = 508;

/// What lseek must answer, from the blocks that hold data.
fn expect(data: &BTreeSet<u64>, size: u64, from: u64, whence: i32) -> Option<u64> {
    if from >= size {
        return None;
    }
    let b = from / BB;
    match whence {
        libc::SEEK_DATA => data
            .range(b..)
            .next()
            .map(|&u| from.max(u * BB))
            .filter(|&o| o < size),
        _ => {
            let mut u = b;
            while data.contains(&u) {
                u += 1;
            }
            Some(from.max(u * BB).min(size))
        }
    }
}

fn check(fs: &FileSystem, ino: u64, data: &BTreeSet<u64>, size: u64, when: &str) {
    // Probes: around every data block and in the middle of every hole.
    let mut probes = vec![0, 1, size - 1, size, size + 1];
    let list: Vec<u64> = data.iter().copied().collect();
    for (k, &u) in list.iter().enumerate() {
        for o in [u * BB, u * BB + 1, u * BB + BB - 1, (u + 1) * BB] {
            probes.push(o);
            probes.push(o.saturating_sub(1));
        }
        let next = list.get(k + 1).copied().unwrap_or(size / BB);
        probes.push((u + 1 + next) / 2 * BB + 12345);
    }
    for from in probes {
        for whence in [libc::SEEK_DATA, libc::SEEK_HOLE] {
            let got = match fs.lseek(ino, from, whence) {
                Ok(o) => Some(o),
                Err(FsError::NoSuchOffset) => None,
                Err(e) => panic!("{when}: lseek {from} {whence}: {e}"),
            };
            assert_eq!(
                got,
                expect(data, size, from, whence),
                "{when}: {} from {from}",
                if whence == libc::SEEK_DATA {
                    "SEEK_DATA"
                } else {
                    "SEEK_HOLE"
                }
            );
        }
    }
}

#[test]
fn seek_data_and_hole_across_every_tree_level() {
    let disks = MemDisks::new(2, 64 << 20);
    disks.format(&small_params());
    let m = disks.mount(small_config());
    let fs = &m.fs;
    let f = fs.create(C, ROOT_INO, b"sparse", 0o644, 0, true).unwrap();
    // Runs of data: in the inode's direct pointers, under level-1, level-2 and level-3
    // indirect blocks far apart, and one at the end of a file of ~2^53 bytes.
    let runs: [(u64, u64); 6] = [
        (0, 3),
        (63, 66),
        (64 * PPI + 7, 64 * PPI + 9),
        (64 * PPI * PPI + 1000, 64 * PPI * PPI + 1001),
        (3 * PPI * PPI * PPI + 5, 3 * PPI * PPI * PPI + 6),
        (1 << 37, (1 << 37) + 2),
    ];
    let mut data = BTreeSet::new();
    for (a, b) in runs {
        for u in a..b {
            fs.write(f.ino, u * BB, &[b'x'; 100], false).unwrap();
            fs.write(f.ino, u * BB + BB - 10, &[b'y'; 10], false)
                .unwrap();
            data.insert(u);
        }
    }
    let size = ((1u64 << 37) + 2) * BB;
    assert_eq!(fs.getattr(f.ino).unwrap().size, size);
    check(fs, f.ino, &data, size, "dirty in the pagepool");
    fs.sync().unwrap();
    assert!(
        fs.raw_inode(f.ino).unwrap().depth >= 4,
        "every level is used"
    );
    check(fs, f.ino, &data, size, "on disk");
    // Preallocated blocks are data; a punched block is a hole; a block written and not
    // yet allocated (dirty) is data.
    fs.fallocate(f.ino, 200 * BB, 3 * BB, 0).unwrap();
    data.extend(200..203);
    fs.fallocate(
        f.ino,
        64 * BB,
        BB,
        libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
    )
    .unwrap();
    data.remove(&64);
    fs.write(f.ino, 5000 * BB + 7, b"dirty", false).unwrap();
    data.insert(5000);
    check(fs, f.ino, &data, size, "mixed");
    fs.sync().unwrap();
    m.unmount().unwrap();
    let m = disks.mount(small_config());
    check(&m.fs, f.ino, &data, size, "after a remount");
    m.unmount().unwrap();
}
