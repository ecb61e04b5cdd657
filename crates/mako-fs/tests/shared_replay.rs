//! Replay on shared disks (docs/coherence.md section 7): a node's log must never lay an
//! old image over a structure another node changed after the token covering it left.
//!
//! Two nodes of one file system run in one process on in-memory disks (as in
//! `two_nodes.rs`). Node A changes an inode, directory pages and a file's indirect
//! block and commits them to its log; node B takes the tokens (A writes them in place
//! and revokes its images in its log), changes all three again and commits to its own
//! log. The disks are then copied
//! as a crash would leave them, and the logs are replayed: A's alone after B's changes
//! reached their place, and both logs in either order while B's changes were only in
//! B's log. The result must be B's inode and page every time, and fsck clean.
//!
//! `Journal::set_revoke_fault` makes A write no revoke records; the last test shows
//! that the checks above then catch A's replay undoing B's changes.

use mako_disk::{Disk, MemDisk};
use mako_fs::env::NodeEnv;
use mako_fs::fs::{Ctx, FileSystem, SetAttr, ROOT_INO};
use mako_fs::mount::{mount_node, Mounted};
use mako_fs::test_util::{pattern, small_config, small_params, MemDisks};
use mako_fs::{FsConfig, MkfsParams};
use std::sync::Arc;

const CTX: Ctx = Ctx {
    uid: 0,
    gid: 0,
    pid: 1,
};

/// Names node A creates in the directory: enough to move it out of the inode into a
/// directory block, so that its entries live in logged directory pages.
const NAMES: usize = 150;
const MODE_A: u32 = 0o600;
const MODE_B: u32 = 0o640;
/// A's file with an indirect block (past the inode's 64 direct pointers of 64 KiB),
/// and what B appends to it: a new pointer in that indirect block.
const BIG_A: usize = 5 << 20;
const TAIL_B: usize = 64 << 10;

fn config() -> FsConfig {
    FsConfig {
        background_workers: false,
        ..small_config()
    }
}

/// Mount nodes `nodes` of the file system on `disks`, meeting through one in-process
/// registry with the token manager on node 0 (mounted or not).
fn mount_nodes(disks: &MemDisks, nodes: &[u32]) -> Vec<Mounted> {
    NodeEnv::in_process_nodes(nodes)
        .into_iter()
        .map(|env| mount_node(disks.as_dyn(), config(), env).expect("mount"))
        .collect()
}

/// The disks as a crash leaves them: every completed write, nothing more.
fn crash_copy(disks: &MemDisks) -> MemDisks {
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

fn chmod(fs: &FileSystem, ino: u64, mode: u32) {
    fs.setattr(
        ino,
        SetAttr {
            mode: Some(mode),
            ..SetAttr::default()
        },
    )
    .expect("chmod");
}

/// What the scenario built: the live cluster, the directory and the file.
struct Scenario {
    disks: MemDisks,
    nodes: Vec<Mounted>,
    dir: u64,
    file: u64,
    big: u64,
}

/// A changes the file's inode and the directory's pages and commits them to its log;
/// B takes the tokens, changes both again (a chmod, a new name) and commits to its log.
/// With `b_in_place`, B also checkpoints, so its changes are in place and its log empty.
fn scenario(revoke_fault: bool, b_in_place: bool) -> Scenario {
    let disks = MemDisks::new(4, 64 << 20);
    disks.format(&MkfsParams {
        log_count: 2,
        ..small_params()
    });
    let nodes = mount_nodes(&disks, &[0, 1]);
    nodes[0].core().journal.set_revoke_fault(revoke_fault);
    let (a, b) = (&nodes[0].fs, &nodes[1].fs);
    let dir = a.mkdir(CTX, ROOT_INO, b"d", 0o755, 0).unwrap().ino;
    for i in 0..NAMES {
        a.create(CTX, dir, format!("a{i}").as_bytes(), 0o644, 0, true)
            .unwrap();
    }
    let file = a.create(CTX, dir, b"f", 0o644, 0, true).unwrap().ino;
    chmod(a, file, MODE_A);
    let big = a.create(CTX, ROOT_INO, b"big", 0o644, 0, true).unwrap().ino;
    a.write(big, 0, &pattern(1, BIG_A), false).unwrap();
    a.fsync(big, false).unwrap();
    nodes[0].core().journal.commit(nodes[0].core()).unwrap();
    // B's lookups and changes revoke A's tokens: A writes the directory and the inode in
    // place (and, unless the fault is on, revokes their images in its log).
    assert_eq!(b.lookup(dir, b"f").unwrap().ino, file);
    chmod(b, file, MODE_B);
    b.create(CTX, dir, b"b", 0o644, 0, true).unwrap();
    // B takes the big file's inode exclusively (it becomes its metanode) and appends a
    // block: a new pointer in the indirect block A wrote in place.
    chmod(b, big, MODE_B);
    b.write(big, BIG_A as u64, &pattern(2, TAIL_B), false)
        .unwrap();
    b.fsync(big, false).unwrap();
    let core_b = nodes[1].core();
    if b_in_place {
        core_b.journal.quiesce(core_b).unwrap();
    } else {
        core_b.journal.commit(core_b).unwrap();
    }
    Scenario {
        disks,
        nodes,
        dir,
        file,
        big,
    }
}

impl Scenario {
    /// Unmount the live cluster and check its disks (the crash copies are separate).
    fn finish(self) {
        for m in self.nodes.into_iter().rev() {
            m.unmount().expect("unmount");
        }
        fsck_clean(&self.disks, "the live cluster");
    }
}

/// After a crash copy was replayed: mount every node and unmount it again, as the
/// cluster coming back up would, so that each log is replayed and marked clean.
fn restart(disks: &MemDisks) {
    for m in mount_nodes(disks, &[0, 1]).into_iter().rev() {
        m.unmount().expect("unmount");
    }
}

fn fsck_clean(disks: &MemDisks, what: &str) {
    let r = mako_fsck::check_offline(
        disks.as_dyn(),
        &mako_fsck::Options::check(),
        &mako_fsck::NoProgress,
    )
    .expect("fsck runs");
    assert!(r.is_clean(), "{what}: {}", r.render());
}

/// What a mount of node 0 alone sees on `disks`.
#[derive(Debug, PartialEq, Eq)]
struct Seen {
    /// The file's mode (A's or B's chmod).
    mode: u32,
    /// B's name in the directory, and how many of A's.
    b_name: bool,
    a_names: usize,
    /// The big file: its size, and whether its last block holds what B appended.
    big_size: u64,
    b_tail: bool,
}

/// What B's changes leave, every one of them there.
fn b_wins() -> Seen {
    Seen {
        mode: MODE_B,
        b_name: true,
        a_names: NAMES,
        big_size: (BIG_A + TAIL_B) as u64,
        b_tail: true,
    }
}

fn seen(disks: &MemDisks, s: &Scenario) -> Seen {
    let m = mount_nodes(disks, &[0]).remove(0);
    let fs = &m.fs;
    let seen = Seen {
        mode: fs.getattr(s.file).expect("stat").mode & 0o7777,
        b_name: fs.lookup(s.dir, b"b").is_ok(),
        a_names: (0..NAMES)
            .filter(|i| fs.lookup(s.dir, format!("a{i}").as_bytes()).is_ok())
            .count(),
        big_size: fs.getattr(s.big).expect("stat").size,
        b_tail: fs.read(s.big, BIG_A as u64, TAIL_B as u32).ok() == Some(pattern(2, TAIL_B)),
    };
    m.unmount().expect("unmount");
    seen
}

/// Replay the logs of `order` in place, as mounts (or fsck -y) would.
fn replay(disks: &MemDisks, order: &[u32]) -> Vec<mako_fs::recovery::ReplayReport> {
    let (desc, dyn_disks) = mako_fs::mount::find_descriptor(disks.as_dyn()).unwrap();
    let nsd = mako_disk::LocalNsd::new(dyn_disks, 16);
    order
        .iter()
        .map(|&n| mako_fs::recovery::replay(&nsd, &desc, n).expect("replay"))
        .collect()
}

/// (a) B's changes are in place; A's log, replayed as A remounts after a crash, still
/// holds its images of the inode and the pages, revoked: B's changes stay.
#[test]
fn replaying_a_log_keeps_what_another_node_wrote_since() {
    let s = scenario(false, true);
    let crashed = crash_copy(&s.disks);
    let r = replay(&crash_copy(&s.disks), &[0]).remove(0);
    // The real path: node 0 mounts alone and replays its own log.
    assert_eq!(seen(&crashed, &s), b_wins());
    assert!(
        r.transactions > 0 && r.revoked > 0,
        "A's log held revoked images: {r:?}"
    );
    assert!(r.summary().contains("not replayed"), "{}", r.summary());
    restart(&crashed);
    fsck_clean(&crashed, "after A's replay");
    s.finish();
}

/// (b) B's changes are only in B's log: both logs replayed, in either order, give the
/// same disks, with B's inode and pages.
#[test]
fn two_logs_replayed_in_either_order_give_the_same_result() {
    let s = scenario(false, false);
    let ab = crash_copy(&s.disks);
    let ba = crash_copy(&s.disks);
    let r = replay(&ab, &[0, 1]);
    replay(&ba, &[1, 0]);
    for (x, y) in ab.disks.iter().zip(&ba.disks) {
        assert!(
            x.snapshot() == y.snapshot(),
            "the order of replay changed what is on disk"
        );
    }
    assert_eq!(seen(&ab, &s), b_wins());
    assert!(r[0].revoked > 0 && r[1].transactions > 0, "{r:?}");
    restart(&ab);
    fsck_clean(&ab, "after both replays");
    s.finish();
}

/// The checks above catch a log without revoke records: A's replay then undoes B's
/// chmod, drops B's name (leaving B's file without a name, which fsck reports) and
/// B's pointer to the block it appended, and the order of replay matters.
#[test]
fn without_revokes_a_replay_undoes_the_other_nodes_changes() {
    let s = scenario(true, true);
    let crashed = crash_copy(&s.disks);
    let got = seen(&crashed, &s);
    assert_eq!(
        (got.mode, got.b_name, got.b_tail),
        (MODE_A, false, false),
        "A's old images were replayed: {got:?}"
    );
    restart(&crashed);
    let r = mako_fsck::check_offline(
        crashed.as_dyn(),
        &mako_fsck::Options::check(),
        &mako_fsck::NoProgress,
    )
    .expect("fsck runs");
    assert!(!r.is_clean(), "fsck finds B's file without its name");
    assert!(
        r.of_kind(mako_fsck::ProblemKind::LogReplay)
            .next()
            .is_none(),
        "what fsck finds is the damage, not the crash: {}",
        r.render()
    );
    s.finish();

    let s = scenario(true, false);
    let ab = crash_copy(&s.disks);
    let ba = crash_copy(&s.disks);
    replay(&ab, &[0, 1]);
    replay(&ba, &[1, 0]);
    assert_eq!(seen(&ab, &s).mode, MODE_B);
    assert_eq!(seen(&ba, &s).mode, MODE_A, "the last log replayed wins");
    s.finish();
}

/// What a node that holds a file's data token over part of the file only writes and
/// fsyncs survives a crash of the whole cluster. (Its fsync used to take one hold over
/// the whole file, which failed, and returned without writing the data back.)
#[test]
fn an_fsync_on_a_node_holding_part_of_the_file_survives_a_crash() {
    for a_bytes in [0usize, 5 << 20] {
        let disks = MemDisks::new(4, 64 << 20);
        disks.format(&MkfsParams {
            log_count: 2,
            ..small_params()
        });
        let nodes = mount_nodes(&disks, &[0, 1]);
        let (a, b) = (&nodes[0].fs, &nodes[1].fs);
        let f = a.create(CTX, ROOT_INO, b"f", 0o644, 0, true).unwrap().ino;
        if a_bytes > 0 {
            a.write(f, 0, &pattern(1, a_bytes), false).unwrap();
            a.fsync(f, false).unwrap();
        }
        let tail = pattern(2, 64 << 10);
        assert_eq!(
            b.write(f, a_bytes as u64, &tail, false).unwrap(),
            tail.len()
        );
        b.fsync(f, false).unwrap();
        let crashed = crash_copy(&disks);
        for m in nodes.into_iter().rev() {
            m.unmount().expect("unmount");
        }
        restart(&crashed);
        let m = mount_nodes(&crashed, &[0]).remove(0);
        assert_eq!(
            m.fs.getattr(f).unwrap().size,
            (a_bytes + tail.len()) as u64,
            "A wrote {a_bytes}"
        );
        assert!(
            m.fs.read(f, a_bytes as u64, tail.len() as u32).unwrap() == tail,
            "A wrote {a_bytes}: B's fsynced bytes are lost"
        );
        m.unmount().expect("unmount");
        fsck_clean(&crashed, "after the crash");
    }
}
