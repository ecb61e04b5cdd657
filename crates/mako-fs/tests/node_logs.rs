//! Recovery logs for many nodes (format version 2): a file system made for N nodes
//! (`-n`) has a log table with a sector and an inode slot per node, and each node's
//! log is created the first time it mounts. So -n 1024 and -n 4096 cost little at
//! mkfs, nodes with high numbers mount side by side, a log created at a first mount is
//! replayed after a crash, a crash while a log is being created leaves nothing behind
//! that fsck objects to, and a file system of the old format is refused clearly.

use mako_disk::crash_disk::{CrashAt, CrashController, CrashDisk, LossPolicy};
use mako_disk::{Disk, MemDisk};
use mako_fs::env::NodeEnv;
use mako_fs::fs::{Ctx, ROOT_INO};
use mako_fs::mkfs::{MkfsParams, BLOCK_ALLOC_MAP_INO, INODE_FILE_INO};
use mako_fs::mount::{mount_node, Mounted};
use mako_fs::test_util::{pattern, small_config, small_params, MemDisks};
use mako_fs::FsConfig;
use std::sync::Arc;

const C: Ctx = Ctx {
    uid: 0,
    gid: 0,
    pid: 1,
};

fn params(nodes: u32) -> MkfsParams {
    MkfsParams {
        log_count: nodes,
        ..small_params()
    }
}

/// Disks with a block of each for every node's own allocation region (mkfs refuses
/// fewer regions than nodes), and at least 64 MiB.
fn disk_bytes(nodes: u32) -> u64 {
    ((nodes as u64 + 256) << 16).max(64 << 20)
}

fn config() -> FsConfig {
    FsConfig {
        background_workers: false,
        ..small_config()
    }
}

/// Environments of `nodes` of one cluster in this process: one registry, the token
/// manager on node 0 (whether or not node 0 mounts).
fn cluster(nodes: &[u32]) -> Vec<NodeEnv> {
    NodeEnv::in_process_nodes(nodes)
}

fn fsck_clean(disks: &[Arc<dyn Disk>]) {
    let r = mako_fsck::check_offline(
        disks.to_vec(),
        &mako_fsck::Options::check(),
        &mako_fsck::NoProgress,
    )
    .expect("fsck runs");
    assert!(r.is_clean(), "{}", r.render());
}

/// Bytes in use as `df` sees them.
fn used_bytes(m: &Mounted) -> u64 {
    let s = m.fs.statfs();
    (s.blocks - s.blocks_free) * s.fragment_bytes as u64
}

fn copy(disks: &MemDisks) -> MemDisks {
    MemDisks {
        disks: disks
            .disks
            .iter()
            .enumerate()
            .map(|(i, d)| {
                let img = d.snapshot();
                let m = MemDisk::new(&format!("d{i}"), img.len() as u64);
                m.write_at(&img, 0).unwrap();
                Arc::new(m)
            })
            .collect(),
    }
}

#[test]
fn a_file_system_for_thousands_of_nodes_costs_a_sector_and_an_inode_per_node() {
    for nodes in [1024u32, 4096] {
        let disks = MemDisks::new(2, disk_bytes(nodes));
        disks.format(&params(nodes));
        let desc = mako_fs::mount::find_descriptor(disks.as_dyn()).unwrap().0;
        assert_eq!(desc.metadata_inodes.log_count, nodes);
        // The first mount makes node 0's log, and only that one.
        let m = mount_node(disks.as_dyn(), config(), cluster(&[0]).remove(0)).unwrap();
        assert!(m.recovery.absent, "a fresh file system has no log yet");
        let used = used_bytes(&m);
        let table = mako_format::log_table::table_bytes(nodes, 4096);
        let logs_up_front = nodes as u64 * desc.log_bytes;
        println!(
            "-n {nodes}: {} KiB in use after mkfs and one mount (log table {} KiB; {} MiB if every log were made up front)",
            used >> 10,
            table >> 10,
            logs_up_front >> 20
        );
        // What mkfs sizes by the node count besides the table: a region's slot of the
        // allocation map per node, and the inode file pre-sized for the first nodes'
        // first segments (both bounded, neither a log).
        let sized: u64 = {
            let map = m.fs.core.metafile_blocks.read();
            [INODE_FILE_INO, BLOCK_ALLOC_MAP_INO]
                .iter()
                .map(|ino| map[ino].len() as u64 * desc.geometry.block_bytes as u64)
                .sum()
        };
        assert!(
            used <= table + sized + desc.log_bytes + (2 << 20),
            "-n {nodes}: {used} bytes in use, the table is {table} bytes, the inode file and allocation map {sized} and one log {}",
            desc.log_bytes
        );
        assert!(used * 8 < logs_up_front);
        m.unmount().unwrap();
        fsck_clean(&disks.as_dyn());
    }
}

#[test]
fn nodes_0_511_and_1023_mount_side_by_side_each_making_its_log() {
    let disks = MemDisks::new(2, disk_bytes(1024));
    disks.format(&params(1024));
    let ids = [0u32, 511, 1023];
    let mounted: Vec<Mounted> = cluster(&ids)
        .into_iter()
        .map(|env| mount_node(disks.as_dyn(), config(), env).expect("mount"))
        .collect();
    for (m, id) in mounted.iter().zip(ids) {
        assert!(m.recovery.absent, "node {id} mounts for the first time");
        let f =
            m.fs.create(C, ROOT_INO, format!("from-{id}").as_bytes(), 0o644, 0, true)
                .unwrap();
        m.fs.write(f.ino, 0, &pattern(id as u64, 9000), false)
            .unwrap();
        m.fs.fsync(f.ino, false).unwrap();
    }
    // Each node hands out numbers from inode-map segments of its own, far apart; the
    // inode file grows only by the blocks that hold them (a dense inode file up to
    // node 1023's numbers would not fit on these disks).
    let far = mounted[2].fs.lookup(ROOT_INO, b"from-1023").unwrap().ino;
    let per_segment = mako_fs::mount::find_descriptor(disks.as_dyn())
        .unwrap()
        .0
        .inodes_per_segment as u64;
    assert!(
        far >= 1023 * per_segment,
        "node 1023's first inode number is {far}"
    );
    assert!(used_bytes(&mounted[2]) < 32 << 20);
    // Each sees what the others wrote.
    for m in &mounted {
        for id in ids {
            let a =
                m.fs.lookup(ROOT_INO, format!("from-{id}").as_bytes())
                    .unwrap();
            assert_eq!(m.fs.read(a.ino, 0, 9000).unwrap(), pattern(id as u64, 9000));
        }
    }
    for m in mounted {
        m.unmount().unwrap();
    }
    fsck_clean(&disks.as_dyn());
    // The second mount of node 1023 finds its log; node 1024 is refused with advice.
    let mut envs = cluster(&[1023, 1024]);
    let again = mount_node(disks.as_dyn(), config(), envs.remove(0)).unwrap();
    assert!(!again.recovery.absent, "node 1023's log exists now");
    assert!(again.recovery.was_clean);
    again.unmount().unwrap();
    let e = mount_node(disks.as_dyn(), config(), envs.remove(0))
        .err()
        .expect("node 1024 is past -n 1024");
    let msg = e.to_string();
    assert!(
        msg.contains("at most 1024 node") && msg.contains("larger -n"),
        "{msg}"
    );
    fsck_clean(&disks.as_dyn());
}

#[test]
fn a_log_made_at_a_first_mount_is_replayed_after_a_crash() {
    let disks = MemDisks::new(2, 32 << 20);
    disks.format(&params(8));
    let m = mount_node(disks.as_dyn(), config(), NodeEnv::single_node(5)).unwrap();
    assert!(m.recovery.absent);
    let f =
        m.fs.create(C, ROOT_INO, b"durable", 0o644, 0, true)
            .unwrap();
    m.fs.write(f.ino, 0, &pattern(5, 70_000), false).unwrap();
    m.fs.fsync(f.ino, false).unwrap();
    let crashed = copy(&disks);
    drop(m);
    // fsck -n sees the committed state through the log: only the unclean stop.
    let r = mako_fsck::check_offline(
        crashed.as_dyn(),
        &mako_fsck::Options::check(),
        &mako_fsck::NoProgress,
    )
    .unwrap();
    assert!(
        r.problems
            .iter()
            .all(|p| p.kind == mako_fsck::ProblemKind::LogReplay),
        "{}",
        r.render()
    );
    assert!(!r.problems.is_empty(), "the crash left a log to replay");
    let m = mount_node(crashed.as_dyn(), config(), NodeEnv::single_node(5)).unwrap();
    assert!(!m.recovery.absent);
    assert!(m.recovery.transactions >= 1, "{}", m.recovery.summary());
    let a = m.fs.lookup(ROOT_INO, b"durable").unwrap();
    assert_eq!(m.fs.read(a.ino, 0, 70_000).unwrap(), pattern(5, 70_000));
    m.unmount().unwrap();
    fsck_clean(&crashed.as_dyn());
}

/// A crash at every write and sync of a node's first mount (which makes its log),
/// with unsynced writes kept, dropped or torn: fsck finds at most the unclean stop,
/// the node mounts again (making its log if the first one never finished), and fsck
/// then finds nothing — no leaked block, no block referenced while free.
#[test]
fn a_crash_while_a_log_is_made_leaves_nothing_behind() {
    let disks = MemDisks::new(2, 16 << 20);
    disks.format(&params(4));
    let images: Vec<Vec<u8>> = disks.disks.iter().map(|d| d.snapshot()).collect();
    let on_crash_disks = |ctl: &Arc<CrashController>| -> Vec<Arc<dyn Disk>> {
        images
            .iter()
            .enumerate()
            .map(|(i, img)| {
                Arc::new(CrashDisk::from_image(ctl, &format!("d{i}"), img.clone())) as Arc<dyn Disk>
            })
            .collect()
    };
    // How many writes and syncs a first mount of node 2 makes, to its end.
    let ctl = CrashController::new();
    let m = mount_node(on_crash_disks(&ctl), config(), NodeEnv::single_node(2)).unwrap();
    let (writes, syncs) = (ctl.writes(), ctl.sync_points());
    drop(m);
    assert!(writes > 4 && syncs > 2, "{writes} writes, {syncs} syncs");
    let mut points: Vec<CrashAt> = (0..syncs).map(CrashAt::Sync).collect();
    for k in 0..writes {
        points.push(CrashAt::Write {
            index: k,
            torn_seed: None,
        });
        points.push(CrashAt::Write {
            index: k,
            torn_seed: Some(k + 7),
        });
    }
    let mut cases = 0;
    for at in points {
        for policy in [
            LossPolicy::KeepAll,
            LossPolicy::DropAll,
            LossPolicy::Random { seed: 11 },
        ] {
            let ctl = CrashController::new();
            ctl.arm(at);
            let disks = on_crash_disks(&ctl);
            if let Ok(m) = mount_node(disks, config(), NodeEnv::single_node(2)) {
                drop(m);
            }
            assert!(ctl.is_crashed(), "the first mount never reached {at}");
            let after = MemDisks {
                disks: ctl
                    .crash_images(policy)
                    .into_iter()
                    .enumerate()
                    .map(|(i, img)| {
                        let m = MemDisk::new(&format!("d{i}"), img.len() as u64);
                        m.write_at(&img, 0).unwrap();
                        Arc::new(m)
                    })
                    .collect(),
            };
            let r = mako_fsck::check_offline(
                after.as_dyn(),
                &mako_fsck::Options::check(),
                &mako_fsck::NoProgress,
            )
            .unwrap_or_else(|e| panic!("crash at {at}, {policy}: fsck cannot run: {e}"));
            // A crash while the descriptor copies are rewritten (the mount flag) leaves
            // some a generation behind: the next mount takes the newest.
            assert!(
                r.problems
                    .iter()
                    .all(|p| p.kind == mako_fsck::ProblemKind::LogReplay
                        || (p.kind == mako_fsck::ProblemKind::DescriptorCopy
                            && p.what.contains("is stale"))),
                "crash at {at}, {policy}:\n{}",
                r.render()
            );
            let m = mount_node(after.as_dyn(), config(), NodeEnv::single_node(2))
                .unwrap_or_else(|e| panic!("crash at {at}, {policy}: the mount after: {e}"));
            let f = m.fs.create(C, ROOT_INO, b"after", 0o644, 0, true).unwrap();
            m.fs.write(f.ino, 0, b"x", false).unwrap();
            m.unmount().unwrap();
            fsck_clean(&after.as_dyn());
            cases += 1;
        }
    }
    println!("{cases} crash cases during a first mount");
}

#[test]
fn a_file_system_of_format_version_1_is_refused_saying_what_to_do() {
    use mako_format::descriptor::DESCRIPTOR_OFFSET;
    let disks = MemDisks::new(3, 16 << 20);
    disks.format(&small_params());
    // Rewrite every descriptor copy as a version-1 descriptor (the layout of the
    // fields is the same; only what they mean changed).
    for d in &disks.disks {
        let mut b = vec![0u8; 4096];
        d.read_at(&mut b, DESCRIPTOR_OFFSET).unwrap();
        if u64::from_le_bytes(b[..8].try_into().unwrap())
            != mako_format::descriptor::DESCRIPTOR_MAGIC
        {
            continue;
        }
        let len = u32::from_le_bytes(b[14..18].try_into().unwrap()) as usize;
        b[8..10].copy_from_slice(&1u16.to_le_bytes());
        let crc = mako_format::checksum_with_hole(&b[..len], 10);
        b[10..14].copy_from_slice(&crc.to_le_bytes());
        d.write_at(&b, DESCRIPTOR_OFFSET).unwrap();
    }
    let e = mako_fs::mount::mount_disks(disks.as_dyn(), config(), 0)
        .err()
        .expect("an old format is refused");
    let msg = e.to_string();
    assert!(
        msg.contains("format version 1") && msg.contains("mako fs create"),
        "{msg}"
    );
    let e = mako_fsck::check_offline(
        disks.as_dyn(),
        &mako_fsck::Options::check(),
        &mako_fsck::NoProgress,
    )
    .expect_err("fsck refuses it too");
    assert!(e.to_string().contains("format version 1"), "{e}");
}
