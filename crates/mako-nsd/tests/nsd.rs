//! NSD servers and clients over real TCP on loopback: data through a server, server
//! failover, every server down, bad requests, disk errors, the local-or-served choice,
//! and the file system core on disks it reaches only through a server.

mod common;

use common::*;
use mako_disk::iohist::BufferType;
use mako_disk::nsd::IoTag;
use mako_disk::{Disk, DiskError, LocalNsd, MemDisk, Nsd};
use mako_format::DiskAddress;
use mako_nsd::protocol::{self, Failure, Op};
use mako_nsd::{DiskRoute, RemoteDisk, RemoteNsd, RemoteOptions};
use mako_rt::{CallOptions, NodeId, Priority, Service, ServiceId};
use parking_lot::{Condvar, Mutex};
use std::sync::Arc;
use std::time::Duration;

const MIB: u64 = 1 << 20;

fn tag(buffer_type: BufferType, ino: u64) -> IoTag {
    IoTag { buffer_type, ino }
}

fn served(names: &[String], servers: &[NodeId]) -> Vec<DiskRoute> {
    names
        .iter()
        .map(|n| DiskRoute::Servers {
            name: n.clone(),
            servers: servers.to_vec(),
        })
        .collect()
}

fn options() -> RemoteOptions {
    RemoteOptions {
        deadline: PATIENCE,
        ..RemoteOptions::default()
    }
}

/// Data written through a server reads back byte for byte through the server and from
/// the disk files directly; a write larger than one request is split; the server's I/O
/// history says what each I/O carried.
#[test]
fn data_through_a_server_reads_back_locally_and_remotely() {
    let files = DiskFiles::new(2, 64 * MIB);
    let nodes = cluster(2);
    let server_nsd = files.local_nsd();
    let server = nodes[0].serve(server_nsd.clone());
    let small_requests = RemoteOptions {
        piece_bytes: 64 << 10,
        ..options()
    };
    let client = RemoteNsd::new(
        served(&files.names, &[NodeId(1)]),
        nodes[1].dyn_transport(),
        small_requests,
        64,
    )
    .expect("connect");
    assert_eq!(client.disk_count(), 2);
    assert_eq!(client.disk_size(1).unwrap(), 64 * MIB);
    assert_eq!(client.disk_name(1), "d1");
    // (disk, sector, length): a block, one split over many requests, small metadata.
    let ios = [
        (0u32, 8u64, 4096usize),
        (1, 2048, 1 << 20),
        (0, 4096, (200 << 10) + 512),
        (1, (64 * MIB / 512) - 8, 4096),
    ];
    for (i, &(disk, sector, len)) in ios.iter().enumerate() {
        client
            .write(
                DiskAddress::new(disk, sector),
                &pattern(i as u64, len),
                tag(BufferType::Log, 40 + i as u64),
            )
            .unwrap();
    }
    client.sync_all().unwrap();
    let local = files.open();
    for (i, &(disk, sector, len)) in ios.iter().enumerate() {
        let want = pattern(i as u64, len);
        let mut got = vec![0u8; len];
        client
            .read(
                DiskAddress::new(disk, sector),
                &mut got,
                tag(BufferType::Data, 0),
            )
            .unwrap();
        assert!(got == want, "io {i} read back through the server");
        let mut direct = vec![0u8; len];
        local[disk as usize]
            .read_at(&mut direct, sector * 512)
            .unwrap();
        assert!(direct == want, "io {i} read from the disk file");
    }
    // The tags reached the server: its history has the log writes with their inodes.
    let history = server_nsd.history().last(1000);
    assert!(
        history
            .iter()
            .any(|r| r.write && r.buffer_type == BufferType::Log && r.ino == 41),
        "{history:?}"
    );
    assert_eq!(server.refused(), 0);
    assert_eq!(client.remote(0).unwrap().failovers(), 0);
    // Disk names and sizes, as the server has them.
    let listed = mako_nsd::served_disks(&*nodes[1].dyn_transport(), NodeId(1), PATIENCE).unwrap();
    assert_eq!(
        listed,
        vec![("d0".to_string(), 64 * MIB), ("d1".to_string(), 64 * MIB)]
    );
    let e = mako_nsd::served_disks(&*nodes[1].dyn_transport(), NodeId(7), PATIENCE).unwrap_err();
    assert!(e.to_string().contains("node 7"), "{e}");
}

/// A service that stops answering while `stalled` (a hung server: the connection
/// stays up, nothing comes back), then serves again.
struct Stall {
    inner: Arc<dyn Service>,
    stalled: Mutex<bool>,
    cv: Condvar,
}

impl Stall {
    fn set(&self, on: bool) {
        *self.stalled.lock() = on;
        self.cv.notify_all();
    }
}

impl Service for Stall {
    fn handle(&self, from: NodeId, request: &[u8]) -> Vec<u8> {
        let mut stalled = self.stalled.lock();
        while *stalled {
            self.cv.wait(&mut stalled);
        }
        drop(stalled);
        self.inner.handle(from, request)
    }
}

/// Releases a stalled service however the test ends, so no handler thread waits on.
struct Unstall(Arc<Stall>);
impl Drop for Unstall {
    fn drop(&mut self) {
        self.0.set(false);
    }
}

/// Primary stopped (its transport shut down): the client moves to the backup, says so,
/// and stays there; a primary that hangs instead is left after the deadline.
#[test]
fn failover_to_the_backup_when_the_primary_stops() {
    let files = DiskFiles::new(1, 16 * MIB);
    let nodes = cluster(4);
    // Nodes 1, 2 and 3 all have the disk file (shared disk); node 4 has no access.
    for n in &nodes[..3] {
        n.serve(files.local_nsd());
    }
    let disk = RemoteDisk::connect(
        "d0",
        vec![NodeId(1), NodeId(2), NodeId(3)],
        nodes[3].dyn_transport(),
        RemoteOptions {
            deadline: Duration::from_millis(300),
            piece_bytes: 64 << 10,
            ..options()
        },
    )
    .unwrap();
    assert_eq!(disk.current_server(), NodeId(1), "the primary first");
    disk.write_at(&pattern(1, 8192), 4096).unwrap();
    disk.sync().unwrap();
    nodes[0].transport.shutdown();
    // Connection refused: the next server takes the request, which succeeds; a
    // write sent as several pieces at once moves each failed piece.
    disk.write_at(&pattern(2, 8192), 65536).unwrap();
    assert_eq!(disk.current_server(), NodeId(2), "moved to the backup");
    assert_eq!(disk.failovers(), 1);
    let big = pattern(5, 300 << 10);
    disk.write_at(&big, 1 << 20).unwrap();
    let mut back = vec![0u8; 8192];
    disk.read_at(&mut back, 4096).unwrap();
    assert_eq!(back, pattern(1, 8192), "data written before the failover");
    disk.read_at(&mut back, 65536).unwrap();
    assert_eq!(back, pattern(2, 8192));
    let mut big_back = vec![0u8; big.len()];
    disk.read_at(&mut big_back, 1 << 20).unwrap();
    assert!(big_back == big);
    disk.sync().unwrap();
    assert_eq!(disk.failovers(), 1, "the working server is remembered");
    // Node 2 now hangs: after the deadline the request goes to node 3.
    let stall = Arc::new(Stall {
        inner: nodes[1]
            .registry
            .service(NodeId(2), ServiceId::Nsd)
            .unwrap(),
        stalled: Mutex::new(true),
        cv: Condvar::new(),
    });
    let _release = Unstall(stall.clone());
    nodes[1]
        .registry
        .register(NodeId(2), ServiceId::Nsd, stall.clone());
    disk.read_at(&mut big_back, 1 << 20).unwrap();
    assert!(
        big_back == big,
        "read in pieces from the hung server's backup"
    );
    assert_eq!(disk.current_server(), NodeId(3), "left the hung server");
    assert_eq!(disk.failovers(), 2);
    // What went through the backups is on the disk file itself.
    let local = &files.open()[0];
    local.read_at(&mut back, 65536).unwrap();
    assert_eq!(back, pattern(2, 8192));
}

/// Writes acknowledged by a server that stops before the sync are not claimed
/// durable: the sync fails naming that server, though later writes went elsewhere.
#[test]
fn a_sync_after_the_acknowledging_server_stopped_reports_writes_in_doubt() {
    let files = DiskFiles::new(1, 16 * MIB);
    let nodes = cluster(3);
    nodes[0].serve(files.local_nsd());
    nodes[1].serve(files.local_nsd());
    let nsd = RemoteNsd::new(
        served(&files.names, &[NodeId(1), NodeId(2)]),
        nodes[2].dyn_transport(),
        options(),
        16,
    )
    .unwrap();
    let t = tag(BufferType::Data, 7);
    nsd.write(DiskAddress::new(0, 64), &pattern(3, 4096), t)
        .unwrap();
    nodes[0].transport.shutdown();
    nsd.write(DiskAddress::new(0, 128), &pattern(4, 4096), t)
        .unwrap();
    assert_eq!(nsd.remote(0).unwrap().current_server(), NodeId(2));
    let e = nsd.sync_all().unwrap_err();
    assert!(matches!(e, DiskError::WritesInDoubt { .. }), "{e}");
    let msg = e.to_string();
    assert!(msg.contains("d0") && msg.contains("node 1"), "{msg}");
    assert_eq!(e.errno(), libc_eio());
    // Node 2 restarts (a new server, a new boot id) with a write unsynced: its sync
    // answers, but what it acknowledged before may be gone.
    nsd.write(DiskAddress::new(0, 192), &pattern(5, 4096), t)
        .unwrap();
    nodes[1].serve(files.local_nsd());
    let e = nsd.sync_all().unwrap_err();
    let msg = e.to_string();
    assert!(
        msg.contains("node 1, node 2") && msg.contains("node 2 restarted"),
        "{msg}"
    );
    // A restart is reported once (nothing can bring those writes back); node 1's
    // writes stay in doubt until it answers a sync.
    let e = nsd.sync_all().unwrap_err();
    let msg = e.to_string();
    assert!(msg.contains("node 1") && !msg.contains("node 2"), "{msg}");
}

fn libc_eio() -> i32 {
    5
}

/// Every server down: connecting and I/O fail with one error naming the disk and
/// each server tried, once every server has had its chance.
#[test]
fn all_servers_down_is_a_clear_error() {
    let files = DiskFiles::new(1, 16 * MIB);
    let nodes = cluster(3);
    nodes[0].serve(files.local_nsd());
    nodes[1].serve(files.local_nsd());
    let disk = RemoteDisk::connect(
        "d0",
        vec![NodeId(1), NodeId(2)],
        nodes[2].dyn_transport(),
        RemoteOptions {
            deadline: Duration::from_secs(2),
            ..options()
        },
    )
    .unwrap();
    nodes[0].transport.shutdown();
    nodes[1].transport.shutdown();
    let mut buf = vec![0u8; 4096];
    let e = disk.read_at(&mut buf, 0).unwrap_err();
    assert!(matches!(e, DiskError::NoServer { .. }), "{e}");
    let msg = e.to_string();
    for what in ["disk d0", "node 1", "node 2", "no NSD server answered"] {
        assert!(msg.contains(what), "{what:?} missing from: {msg}");
    }
    let e = RemoteDisk::connect(
        "d0",
        vec![NodeId(1), NodeId(2)],
        nodes[2].dyn_transport(),
        options(),
    )
    .unwrap_err();
    assert!(matches!(e, DiskError::NoServer { .. }), "{e}");
    // A node that is in no node map at all: the same clear error.
    let e = RemoteDisk::connect("d0", vec![NodeId(9)], nodes[2].dyn_transport(), options())
        .unwrap_err();
    assert!(e.to_string().contains("node 9"), "{e}");
}

/// Bad requests (unknown disk, out-of-range address, wrong length, garbage) are each
/// refused with a clear error, and the server goes on serving.
#[test]
fn bad_requests_are_refused_and_the_server_keeps_serving() {
    let files = DiskFiles::new(2, 16 * MIB);
    let nodes = cluster(2);
    let server = nodes[0].serve(files.local_nsd());
    let t = nodes[1].dyn_transport();
    let raw = |body: Vec<u8>| {
        let reply = t
            .call(
                NodeId(1),
                ServiceId::Nsd,
                body,
                CallOptions {
                    priority: Priority::Small,
                    deadline: PATIENCE,
                },
            )
            .expect("the server answers");
        protocol::decode_reply(&reply)
            .expect("a well-formed reply")
            .err()
    };
    // A disk the server does not serve: refused by the server, then by the client.
    let f = raw(protocol::encode_request(
        Op::Read,
        "nope",
        0,
        512,
        BufferType::Data,
        0,
        &[],
    ));
    assert_eq!(
        f,
        Some(Failure::UnknownDisk {
            disk: "nope".into(),
            served: vec!["d0".into(), "d1".into()]
        })
    );
    let e = RemoteDisk::connect("nope", vec![NodeId(1)], t.clone(), options()).unwrap_err();
    assert!(
        e.to_string()
            .contains("does not serve it (it serves: d0, d1)"),
        "{e}"
    );
    // A write whose length does not match its payload, garbage, a bad offset.
    let mut body =
        protocol::encode_request(Op::Write, "d0", 0, 4096, BufferType::Data, 0, &[1u8; 4096]);
    body.truncate(body.len() - 100);
    let Some(Failure::BadRequest(why)) = raw(body) else {
        panic!("a short write was not refused")
    };
    assert!(why.contains("carries 3996 payload bytes"), "{why}");
    assert!(matches!(raw(vec![0xff; 7]), Some(Failure::BadRequest(_))));
    assert!(matches!(raw(Vec::new()), Some(Failure::BadRequest(_))));
    let huge = protocol::encode_request(Op::Read, "d0", 0, u32::MAX, BufferType::Data, 0, &[]);
    let Some(Failure::BadRequest(why)) = raw(huge) else {
        panic!("a 4 GiB read was not refused")
    };
    assert!(why.contains("exceeds this server's limit"), "{why}");
    let far = protocol::encode_request(
        Op::Read,
        "d0",
        u64::MAX - 511,
        512,
        BufferType::Data,
        0,
        &[],
    );
    assert!(matches!(raw(far), Some(Failure::BadRequest(_))));
    // Out of range through the client: the server disk's own typed error.
    let nsd = RemoteNsd::new(served(&files.names, &[NodeId(1)]), t.clone(), options(), 16).unwrap();
    let mut buf = vec![0u8; 8192];
    let e = nsd
        .read(
            DiskAddress::new(1, 16 * MIB / 512 - 8),
            &mut buf,
            tag(BufferType::Data, 0),
        )
        .unwrap_err();
    assert!(matches!(e, DiskError::OutOfRange { .. }), "{e}");
    assert!(e.to_string().contains("disk d1"), "{e}");
    // A disk index the client does not have.
    let e = nsd
        .read(DiskAddress::new(5, 0), &mut buf, tag(BufferType::Data, 0))
        .unwrap_err();
    assert!(matches!(e, DiskError::NoSuchDisk { .. }), "{e}");
    // Still serving.
    nsd.write(
        DiskAddress::new(1, 8),
        &pattern(9, 8192),
        tag(BufferType::Data, 1),
    )
    .unwrap();
    nsd.read(DiskAddress::new(1, 8), &mut buf, tag(BufferType::Data, 1))
        .unwrap();
    assert_eq!(buf, pattern(9, 8192));
    assert!(server.refused() >= 6, "{}", server.refused());
    // A server with two disks of one name refuses to start serving.
    let twins: Vec<Arc<dyn Disk>> = vec![
        Arc::new(MemDisk::new("d0", MIB)),
        Arc::new(MemDisk::new("d0", MIB)),
    ];
    let e = mako_nsd::NsdServer::new(Arc::new(LocalNsd::new(twins, 4)), 1 << 20)
        .err()
        .expect("refused");
    assert!(e.to_string().contains("both named \"d0\""), "{e}");
}

/// A failing disk on the server comes back as the same `DiskError` variant, naming
/// the server; the request never hangs.
#[test]
fn disk_errors_on_the_server_come_back_typed() {
    let nodes = cluster(2);
    let mem = Arc::new(MemDisk::new("d0", 4 * MIB));
    nodes[0].serve(Arc::new(LocalNsd::new(
        vec![mem.clone() as Arc<dyn Disk>],
        16,
    )));
    let disk =
        RemoteDisk::connect("d0", vec![NodeId(1)], nodes[1].dyn_transport(), options()).unwrap();
    disk.write_at(&[3u8; 4096], 0).unwrap();
    mem.set_fail_reads(true);
    let mut buf = vec![0u8; 4096];
    let e = disk.read_at(&mut buf, 0).unwrap_err();
    assert!(matches!(e, DiskError::Injected { .. }), "{e}");
    assert!(e.to_string().contains("node 1"), "{e}");
    mem.set_fail_reads(false);
    mem.fail_writes_after(0);
    let e = disk.write_at(&[4u8; 4096], 0).unwrap_err();
    assert!(matches!(e, DiskError::Injected { .. }), "{e}");
    assert_eq!(disk.failovers(), 0, "a disk error is no reason to move");
    disk.read_at(&mut buf, 0).unwrap();
    assert_eq!(buf, vec![3u8; 4096], "the failed write changed nothing");
}

/// Local access wins; without it, the servers other than this node; with neither,
/// the open's own error.
#[test]
fn a_node_uses_local_access_when_it_has_it() {
    let files = DiskFiles::new(1, 4 * MIB);
    let me = NodeId(3);
    let local = files.open().remove(0);
    let r = DiskRoute::choose("d0", Ok(local), &[NodeId(1)], me).unwrap();
    assert!(matches!(r, DiskRoute::Local(_)), "{r:?}");
    let missing = || {
        mako_disk::FileDisk::open("d0", &files.dir().join("missing.img"))
            .map(|d| Arc::new(d) as Arc<dyn Disk>)
    };
    let r = DiskRoute::choose("d0", missing(), &[me, NodeId(1), NodeId(2)], me).unwrap();
    match r {
        DiskRoute::Servers { name, servers } => {
            assert_eq!(name, "d0");
            assert_eq!(servers, vec![NodeId(1), NodeId(2)]);
        }
        other => panic!("{other:?}"),
    }
    let e = DiskRoute::choose("d0", missing(), &[me], me).unwrap_err();
    assert!(e.to_string().contains("missing.img"), "{e}");
    // The local route opens to the local disk itself, with no transport call.
    let nodes = cluster(1);
    let d = DiskRoute::choose("d0", Ok(files.open().remove(0)), &[], me)
        .unwrap()
        .open(&nodes[0].dyn_transport(), options())
        .unwrap();
    assert_eq!(d.size_bytes(), 4 * MIB);
}

/// The file system core with no local disk access: mkfs, mount, write, fsync, read
/// and unmount all through an NSD server; then the server's own disks, mounted
/// locally, hold the file.
#[test]
fn the_file_system_core_runs_on_served_disks() {
    use mako_fs::fs::{Ctx, ROOT_INO};
    use mako_fs::mkfs::{format_disks, DiskMeta};
    use mako_fs::test_util::{small_config, small_params, MemDisks};
    const C: Ctx = Ctx {
        uid: 0,
        gid: 0,
        pid: 1,
    };
    let mem = MemDisks::new(3, 64 * MIB);
    let nodes = cluster(2);
    let server = nodes[0].serve(Arc::new(LocalNsd::new(mem.as_dyn(), 64)));
    let remote: Vec<Arc<dyn Disk>> = (0..3)
        .map(|i| {
            DiskRoute::Servers {
                name: format!("d{i}"),
                servers: vec![NodeId(1)],
            }
            .open(&nodes[1].dyn_transport(), options())
            .unwrap()
        })
        .collect();
    let meta: Vec<DiskMeta> = (0..3)
        .map(|i| DiskMeta {
            name: format!("d{i}"),
            pool: "system".into(),
            failure_group: i + 1,
            usage: mako_format::disk_header::DiskUsage::DataAndMetadata,
        })
        .collect();
    format_disks(remote.clone(), &meta, &small_params()).expect("mkfs through the server");
    let data = pattern(11, (3 << 20) + 4321);
    {
        let m = mako_fs::mount::mount_disks(remote, small_config(), 0).expect("mount");
        let a = m.fs.create(C, ROOT_INO, b"served", 0o644, 0, true).unwrap();
        let mut off = 0;
        while off < data.len() {
            let n = (data.len() - off).min(47008);
            m.fs.write(a.ino, off as u64, &data[off..off + n], false)
                .unwrap();
            off += n;
        }
        m.fs.sync().unwrap();
        assert!(m.fs.read(a.ino, 0, data.len() as u32 + 10).unwrap() == data);
        m.unmount().expect("unmount");
    }
    assert!(server.served() > 0);
    // The server's disks, mounted where they are: the same file.
    let m = mem.mount(small_config());
    let e = m.fs.lookup(ROOT_INO, b"served").unwrap();
    assert!(m.fs.read(e.ino, 0, data.len() as u32 + 10).unwrap() == data);
    m.unmount().unwrap();
}

/// The file system core keeps working when the primary server of its disks stops
/// between two syncs: the disks move to the backup (both servers have the same
/// shared disks), and what was written before and after reads back, there and
/// locally on the disks afterwards.
#[test]
fn the_file_system_core_survives_a_server_failover() {
    use mako_fs::fs::{Ctx, ROOT_INO};
    use mako_fs::mkfs::{format_disks, DiskMeta};
    use mako_fs::test_util::{small_config, small_params, MemDisks};
    const C: Ctx = Ctx {
        uid: 0,
        gid: 0,
        pid: 1,
    };
    let mem = MemDisks::new(2, 64 * MIB);
    let nodes = cluster(3);
    nodes[0].serve(Arc::new(LocalNsd::new(mem.as_dyn(), 64)));
    nodes[1].serve(Arc::new(LocalNsd::new(mem.as_dyn(), 64)));
    let remote: Vec<Arc<RemoteDisk>> = (0..2)
        .map(|i| {
            Arc::new(
                RemoteDisk::connect(
                    &format!("d{i}"),
                    vec![NodeId(1), NodeId(2)],
                    nodes[2].dyn_transport(),
                    options(),
                )
                .unwrap(),
            )
        })
        .collect();
    let disks: Vec<Arc<dyn Disk>> = remote.iter().map(|d| d.clone() as Arc<dyn Disk>).collect();
    let meta: Vec<DiskMeta> = (0..2)
        .map(|i| DiskMeta {
            name: format!("d{i}"),
            pool: "system".into(),
            failure_group: i + 1,
            usage: mako_format::disk_header::DiskUsage::DataAndMetadata,
        })
        .collect();
    format_disks(disks.clone(), &meta, &small_params()).unwrap();
    let before = pattern(21, (1 << 20) + 777);
    let after = pattern(22, (2 << 20) + 5);
    let write = |m: &mako_fs::mount::Mounted, name: &[u8], data: &[u8]| {
        let a = m.fs.create(C, ROOT_INO, name, 0o644, 0, true).unwrap();
        m.fs.write(a.ino, 0, data, false).unwrap();
        a.ino
    };
    {
        let m = mako_fs::mount::mount_disks(disks, small_config(), 0).unwrap();
        let first = write(&m, b"before", &before);
        m.fs.sync().unwrap();
        nodes[0].transport.shutdown();
        let second = write(&m, b"after", &after);
        m.fs.sync().expect("a sync through the backup server");
        assert!(m.fs.read(first, 0, before.len() as u32).unwrap() == before);
        assert!(m.fs.read(second, 0, after.len() as u32).unwrap() == after);
        m.unmount().expect("unmount through the backup server");
    }
    assert!(
        remote.iter().all(|d| d.current_server() == NodeId(2)),
        "every disk moved to the backup: {remote:?}"
    );
    let m = mem.mount(small_config());
    for (name, data) in [(&b"before"[..], &before), (&b"after"[..], &after)] {
        let e = m.fs.lookup(ROOT_INO, name).unwrap();
        assert!(m.fs.read(e.ino, 0, data.len() as u32 + 1).unwrap() == *data);
    }
    m.unmount().unwrap();
}

/// Several threads write and read back their own blocks (in pieces) while the
/// primary stops: every I/O succeeds, the disk moves to the backup once, every block
/// is on the disk file afterwards, and the sync reports the primary's acknowledged
/// writes as in doubt.
#[test]
fn concurrent_io_survives_a_failover() {
    use std::sync::atomic::{AtomicU64, Ordering};
    let files = DiskFiles::new(1, 64 * MIB);
    let nodes = cluster(3);
    nodes[0].serve(files.local_nsd());
    nodes[1].serve(files.local_nsd());
    let disk = RemoteDisk::connect(
        "d0",
        vec![NodeId(1), NodeId(2)],
        nodes[2].dyn_transport(),
        RemoteOptions {
            piece_bytes: 32 << 10,
            ..options()
        },
    )
    .unwrap();
    const THREADS: u64 = 4;
    const ROUNDS: u64 = 40;
    const LEN: usize = 96 << 10;
    let done = AtomicU64::new(0);
    let stopped = std::sync::atomic::AtomicBool::new(false);
    let at = |t: u64, r: u64| (t * ROUNDS + r) * 128 * 1024;
    std::thread::scope(|s| {
        for t in 0..THREADS {
            let (disk, done, stopped) = (&disk, &done, &stopped);
            s.spawn(move || {
                for r in 0..ROUNDS {
                    if r == 2 {
                        // The rest only once the primary is gone.
                        wait_for("the primary to stop", || stopped.load(Ordering::SeqCst));
                    }
                    let data = pattern(t * 1000 + r, LEN);
                    disk.write_at(&data, at(t, r)).expect("write");
                    let mut back = vec![0u8; LEN];
                    disk.read_at(&mut back, at(t, r)).expect("read");
                    assert!(back == data, "thread {t} round {r}");
                    done.fetch_add(1, Ordering::SeqCst);
                }
            });
        }
        wait_for("every thread to write through the primary", || {
            done.load(Ordering::SeqCst) >= THREADS * 2
        });
        nodes[0].transport.shutdown();
        stopped.store(true, Ordering::SeqCst);
    });
    assert_eq!(disk.current_server(), NodeId(2));
    assert_eq!(
        disk.failovers(),
        1,
        "one move, whichever thread saw it first"
    );
    let local = &files.open()[0];
    for t in 0..THREADS {
        for r in 0..ROUNDS {
            let mut back = vec![0u8; LEN];
            local.read_at(&mut back, at(t, r)).unwrap();
            assert!(
                back == pattern(t * 1000 + r, LEN),
                "thread {t} round {r} on disk"
            );
        }
    }
    let e = disk.sync().unwrap_err();
    assert!(e.to_string().contains("node 1"), "{e}");
}
