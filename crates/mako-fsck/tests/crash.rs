//! A repair interrupted at any write (a crash: every later write fails) leaves a file
//! system that the next `fsck -y` repairs completely, after which it checks clean,
//! mounts, and every file the damage did not hit reads back its exact content.

mod common;

use common::*;
use mako_disk::Disk;
use mako_format::inode::InodeContent;
use mako_fsck::{check_offline, FsckError, NoProgress, Options, EXIT_CLEAN, EXIT_CORRECTED};
use std::sync::atomic::AtomicI64;
use std::sync::Arc;

/// Iterations at most; beyond that the crash points are spread over the repair.
const CRASH_POINTS_MAX: u64 = 40;

/// Several kinds of damage at once, so that every repair step has work.
fn damage(ins: &Inspect, fx: &Fixture) {
    let bigdir = ins.dir_blocks(fx.ino("/bigdir"));
    ins.flip(bigdir[1].1, 100, 0x01);
    let (units, _) = ins.tree(fx.ino("/block64k"));
    let mut i = ins.inode(fx.ino("/blockplus"));
    let InodeContent::Pointers(p) = &mut i.content else {
        panic!("pointers")
    };
    p[0] = units[0].1;
    ins.put_inode(&i);
    let dir3 = fx.ino("/dir1/dir2/dir3");
    let mut e = ins.inline_entries(dir3);
    e.retain(|x| x.name != b"deep");
    ins.set_inline_entries(dir3, e);
    let (_, ind) = ins.tree(fx.ino("/sparse"));
    ins.flip(ind[1].2, 64, 0x08);
    let (da, _) = ins.alloc_segment(1);
    ins.flip(da, 40, 0x01);
    let mut h = ins.inode(fx.ino("/hard1"));
    h.nlink = 9;
    ins.put_inode(&h);
    ins.flip(ins.descriptor_da(ins.desc.descriptor_disks[2]), 60, 0x04);
}

const HIT: &[&str] = &[
    "/bigdir",
    "/blockplus",
    "/dir1/dir2/dir3/deep",
    "/sparse",
    "/dir1/dir2/dir3",
];

fn writes(disks: &mako_fs::test_util::MemDisks) -> u64 {
    disks.disks.iter().map(|d| d.writes()).sum()
}

#[test]
fn a_crash_at_any_write_of_a_repair_is_repaired_by_the_next_run() {
    let fx = fixture();
    // The uninterrupted repair, to count its writes.
    let disks = fx.restore();
    damage(&Inspect::open(&disks), fx);
    let before = writes(&disks);
    let r = fsck(&disks, true);
    assert_eq!(r.exit_code, EXIT_CORRECTED, "{}", r.render());
    let total = writes(&disks) - before;
    assert!(total > 10, "the repair wrote only {total} blocks");
    let stride = total.div_ceil(CRASH_POINTS_MAX).max(1);
    let mut points: Vec<u64> = (0..total).step_by(stride as usize).collect();
    points.extend([total - 2, total - 1]);
    points.dedup();
    for k in points {
        let disks = fx.restore();
        damage(&Inspect::open(&disks), fx);
        let budget = Arc::new(AtomicI64::new(k as i64));
        let crashing: Vec<Arc<dyn Disk>> = disks
            .disks
            .iter()
            .map(|d| {
                Arc::new(CrashDisk {
                    inner: d.clone(),
                    budget: budget.clone(),
                }) as Arc<dyn Disk>
            })
            .collect();
        match check_offline(crashing, &Options::repair().threads(2), &NoProgress) {
            Err(FsckError::Disk { .. }) => {}
            other => {
                panic!("crash after {k} of {total} writes: the repair should fail, got {other:?}")
            }
        }
        // Reboot: the next run repairs what is left, and the one after finds nothing.
        let r = fsck(&disks, true);
        assert!(
            r.exit_code == EXIT_CORRECTED || r.exit_code == EXIT_CLEAN,
            "after a crash at write {k}/{total}:\n{}",
            r.render()
        );
        let r = fsck(&disks, false);
        assert_eq!(
            r.exit_code,
            EXIT_CLEAN,
            "after a crash at write {k}/{total} and a second repair:\n{}",
            r.render()
        );
        let m = disks.mount(config());
        verify_untouched(&m.fs, fx, HIT);
        let hard = lookup(&m.fs, "/hard1").unwrap();
        assert_eq!(m.fs.getattr(hard).unwrap().nlink, 2);
        m.unmount().unwrap();
    }
}
