//! mkfs options the cluster needs: one recovery log per node, and reproducible
//! formatting (fixed UUIDs and time) for simulations that replay bit-for-bit.

use mako_format::inode::Timestamp;
use mako_fs::env::NodeEnv;
use mako_fs::fs::{Ctx, ROOT_INO};
use mako_fs::mkfs::{MkfsParams, Reproducible};
use mako_fs::mount::mount_node;
use mako_fs::test_util::{small_config, small_params, MemDisks};

fn reproducible(seed: u64) -> MkfsParams {
    MkfsParams {
        reproducible: Some(Reproducible {
            uuid_seed: seed,
            time: Timestamp {
                sec: 1_704_067_200,
                nsec: 5,
            },
        }),
        ..small_params()
    }
}

fn images(d: &MemDisks) -> Vec<Vec<u8>> {
    d.disks.iter().map(|d| d.snapshot()).collect()
}

#[test]
fn a_reproducible_format_is_the_same_bytes_every_time() {
    let a = MemDisks::new(3, 16 << 20);
    let b = MemDisks::new(3, 16 << 20);
    a.format(&reproducible(9));
    b.format(&reproducible(9));
    assert!(images(&a) == images(&b), "same seed, same disks");
    let c = MemDisks::new(3, 16 << 20);
    c.format(&reproducible(10));
    assert!(images(&a) != images(&c), "another seed, other UUIDs");
    // Without the option UUIDs are random: two formats differ.
    let (d, e) = (MemDisks::new(3, 16 << 20), MemDisks::new(3, 16 << 20));
    d.format(&small_params());
    e.format(&small_params());
    assert!(images(&d) != images(&e));
    // The fixed time is the root's.
    let m = a.mount(small_config());
    let root = m.fs.getattr(ROOT_INO).unwrap();
    assert_eq!((root.mtime.sec, root.mtime.nsec), (1_704_067_200, 5));
    m.unmount().unwrap();
}

#[test]
fn every_node_has_its_own_log() {
    let disks = MemDisks::new(2, 32 << 20);
    disks.format(&MkfsParams {
        log_count: 3,
        ..small_params()
    });
    // Node 2 mounts (alone here) with log 2, writes, unmounts cleanly.
    let m = mount_node(disks.as_dyn(), small_config(), NodeEnv::single_node(2)).unwrap();
    let f =
        m.fs.create(Ctx::default(), ROOT_INO, b"from-node-2", 0o644, 0, true)
            .unwrap();
    m.fs.write(f.ino, 0, b"hello", false).unwrap();
    m.fs.fsync(f.ino, false).unwrap();
    m.unmount().unwrap();
    let r = mako_fsck::check_offline(
        disks.as_dyn(),
        &mako_fsck::Options::check(),
        &mako_fsck::NoProgress,
    )
    .unwrap();
    assert!(r.is_clean(), "{}", r.render());
    // A node past the nodes it was made for cannot mount; the error says what to do.
    let e = mount_node(disks.as_dyn(), small_config(), NodeEnv::single_node(3))
        .err()
        .expect("node 3 is past -n 3");
    assert!(e.to_string().contains("larger -n"), "{e}");
    // mkfs refuses a node count out of range.
    for bad in [0, mako_fs::mkfs::NODES_MAX + 1] {
        let d = MemDisks::new(1, 16 << 20);
        let meta = vec![mako_fs::mkfs::DiskMeta {
            name: "d0".into(),
            pool: "system".into(),
            failure_group: 1,
            usage: mako_format::disk_header::DiskUsage::DataAndMetadata,
        }];
        let e = mako_fs::mkfs::format_disks(
            d.as_dyn(),
            &meta,
            &MkfsParams {
                log_count: bad,
                ..small_params()
            },
        )
        .expect_err("out of range");
        assert!(e.to_string().contains("number of nodes"), "{e}");
    }
}

/// Every node allocates only in regions of its own: mkfs refuses fewer regions than
/// nodes (a node without one could not allocate a block), and says what to change.
#[test]
fn a_region_for_every_node() {
    let d = MemDisks::new(1, 16 << 20);
    let meta = vec![mako_fs::mkfs::DiskMeta {
        name: "d0".into(),
        pool: "system".into(),
        failure_group: 1,
        usage: mako_format::disk_header::DiskUsage::DataAndMetadata,
    }];
    let e = mako_fs::mkfs::format_disks(
        d.as_dyn(),
        &meta,
        &MkfsParams {
            log_count: 3,
            regions: Some(2),
            ..small_params()
        },
    )
    .expect_err("2 regions for 3 nodes");
    assert!(e.to_string().contains("region of its own"), "{e}");
    assert!(e.to_string().contains("at least 3 regions"), "{e}");
    // With as many regions as nodes it formats.
    mako_fs::mkfs::format_disks(
        d.as_dyn(),
        &meta,
        &MkfsParams {
            log_count: 3,
            regions: Some(3),
            ..small_params()
        },
    )
    .expect("3 regions for 3 nodes");
}
