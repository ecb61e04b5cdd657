//! Two failures of issue 14 with real processes (docs/cluster.md "Leases, expel and
//! fencing", "Recovery of a failed node"):
//!
//! - **The cluster manager killed.** Three quorum nodes, the token and file-system
//!   managers on node 1 (`--manager-nodes node1`), every node opening the disk files
//!   itself. Under the journalled mixed workload on all three nodes the cluster
//!   manager (the raft leader, node 0) is killed (`kill -9`): another quorum node
//!   becomes cluster manager, the survivors' leases go on (neither is expelled, their
//!   workloads never fail), the new manager expels node 0 and recovers it (its log
//!   replayed, its tokens released), both survivors see every fsynced byte per the
//!   journal, and node 0 restarted rejoins at a new lease epoch and mounts. The
//!   token-manager shard and the file-system manager are on a survivor here.
//! - **A token manager node killed.** Managers node0 and node1; node1 killed: its
//!   slot moves to node0, which rebuilds it from the survivors' tokens
//!   (`killing_a_token_manager_node_rebuilds_its_shard_on_a_survivor`, docs/coherence.md
//!   section 7b).
//! - **A node's link cut.** Node 2, a client with the disk files opened directly (so
//!   its lease is its only fence), runs in a network namespace of its own; its veth is
//!   taken down for longer than `failureDetectionTime` while it keeps writing one
//!   file: its writes fail once its lease ran out, its mount returns EIO, node 0 expels
//!   and recovers it, and nothing it wrote after the expel reaches the disk. When the
//!   link is back it rejoins at a new lease epoch on its own; its old mount stays
//!   fenced until mounted again (restarting its makod, as today), then works.
//!
//! `failureDetectionTime` 10 s, `minMissedPingTimeout` 2 s: longer than a raft
//! election (1.5–3 s) plus a renewal interval on a loaded machine. Every wait is for a
//! state, with a deadline only as a hang guard; the figures are printed, not asserted.

use mako_tests::cluster::{is_mounted, require_fuse};
use mako_tests::netcluster::{line_of, NetCluster, NetClusterOptions};
use mako_tests::skip::cannot_run;
use mako_tests::workload::{
    abort_fuse_connection, check_journal, percentile, work, write_synced, Journal, Latencies,
};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Hang guard of each wait for a state.
const WAIT: Duration = Duration::from_secs(180);

fn options(create: &[&str], isolated: Vec<u32>) -> NetClusterOptions {
    NetClusterOptions {
        nodes: 3,
        disks: 1,
        disk_size: "1G".into(),
        create_args: Some(create.iter().map(|s| s.to_string()).collect()),
        config: vec![
            ("failureDetectionTime".into(), "10".into()),
            ("minMissedPingTimeout".into(), "2".into()),
        ],
        isolated,
        ..NetClusterOptions::default()
    }
}

/// How many lines of node `i`'s makod.log contain every one of `words`.
/// Three quorum nodes (node0 the first cluster manager), the token manager on
/// `managers` (the file-system manager on the first of them).
fn three_quorum_nodes(managers: &str) -> NetCluster {
    NetCluster::up(options(
        &[
            "--quorum-nodes",
            "node0,node1,node2",
            "--manager-nodes",
            managers,
        ],
        Vec::new(),
    ))
    .unwrap_or_else(|e| panic!("three quorum nodes up, the token manager on {managers}: {e:#}"))
}

fn count(c: &NetCluster, i: u32, words: &[&str]) -> usize {
    c.log_lines(i)
        .iter()
        .filter(|l| words.iter().all(|w| l.contains(w)))
        .count()
}

/// Waits until `done`; returns how long it took.
fn wait_for(c: &NetCluster, what: &str, done: impl FnMut() -> bool) -> Duration {
    c.wait_for(what, WAIT, done)
}

/// The node `mako node show` names as cluster manager (state `active, cluster
/// manager`; other states may name the cluster manager too: "recovered on fs1 by the
/// cluster manager", "pinged by the cluster manager").
fn cluster_manager(show: &str) -> Option<u32> {
    (0..3).find(|i| line_of(show, &format!("node{i}")).contains("active, cluster manager"))
}

fn max_latency_between(l: &Latencies, from: Duration, to: Duration) -> Duration {
    l.lock()
        .unwrap()
        .iter()
        .filter(|t| t.start + t.took >= from && t.start <= to)
        .map(|t| t.took)
        .max()
        .unwrap_or_default()
}

#[test]
fn killing_the_cluster_manager_elects_another_recovers_it_and_it_rejoins() {
    let test = "killing_the_cluster_manager_elects_another_recovers_it_and_it_rejoins";
    if !require_fuse(test) {
        return;
    }
    let mut c = three_quorum_nodes("node1");
    // The lowest quorum node creates raft and is its first leader: the cluster manager.
    let show = c.node_show();
    let victim = cluster_manager(&show).expect("a cluster manager in mako node show");
    assert!(
        victim != 1,
        "node1, the token manager node, is the cluster manager: this test kills the \
         cluster manager and needs it elsewhere (the token manager's own loss is the \
         next test's):\n{show}"
    );
    let survivors: Vec<u32> = (0..3).filter(|i| *i != victim).collect();

    for n in 0..3 {
        std::fs::create_dir_all(c.mount(0).join(format!("p{n}"))).expect("mkdir p<n>");
    }
    std::fs::create_dir_all(c.mount(0).join("shared")).expect("mkdir shared");
    let journals: Vec<Arc<Mutex<Journal>>> = (0..3).map(|_| Arc::default()).collect();
    let t0 = Instant::now();
    let stop = Arc::new(AtomicBool::new(false));
    let lat: Vec<Latencies> = (0..3).map(|_| Latencies::default()).collect();
    let workers: Vec<_> = (0..3u32)
        .map(|n| {
            let (m, j, s, st, l) = (
                c.mount(n),
                journals[n as usize].clone(),
                Arc::new(AtomicU64::new(0)),
                stop.clone(),
                lat[n as usize].clone(),
            );
            std::thread::spawn(move || work(n, m, j, s, st, l, t0))
        })
        .collect();
    wait_for(&c, "every node's workload makes progress", || {
        journals.iter().all(|j| j.lock().unwrap().ops >= 5)
    });
    // A file the victim wrote and fsynced: a survivor reading it may need its tokens.
    let probe = journals[victim as usize]
        .lock()
        .unwrap()
        .last_written()
        .map(|(p, c)| (p, c.len));

    c.kill9(victim).expect("kill -9 of the cluster manager");
    abort_fuse_connection(&c.mount(victim));
    detach(&c.mount(victim));
    let killed = Instant::now();
    let killed_at = killed - t0;
    let reader = survivors[0];
    let stall = probe.map(|(p, len)| {
        let path = c.mount(reader).join(&p);
        std::thread::spawn(move || {
            let got = std::fs::read(&path);
            (killed.elapsed(), got.map(|b| b.len() == len), path)
        })
    });

    // Another quorum node becomes the cluster manager and watches the leases.
    let manager_line = "is the cluster manager now";
    let before: Vec<usize> = (0..3).map(|i| count(&c, i, &[manager_line])).collect();
    wait_for(&c, "a survivor becomes cluster manager", || {
        survivors
            .iter()
            .any(|&i| count(&c, i, &[manager_line]) > before[i as usize])
    });
    let to_leader = killed.elapsed();
    let new_manager = *survivors
        .iter()
        .find(|&&i| count(&c, i, &[manager_line]) > before[i as usize])
        .unwrap();
    // It expels the killed node and recovers it.
    let expel = format!("node {victim} expelled by node {new_manager}");
    wait_for(&c, "the new cluster manager expels the killed one", || {
        count(&c, new_manager, &[&expel]) > 0
    });
    let to_expel = killed.elapsed();
    let tag = format!("node {victim} (lease epoch");
    wait_for(&c, "the killed cluster manager is recovered", || {
        count(&c, new_manager, &[&tag, "recovered"]) > 0
    });
    let to_recovered = killed.elapsed();
    let recovered_at = killed_at + to_recovered;

    let probe_stall = stall.map(|h| {
        let (d, ok, path) = h.join().expect("the probe read");
        match ok {
            Ok(_) => d,
            Err(e) => {
                assert!(
                    e.kind() == std::io::ErrorKind::NotFound,
                    "node {reader} reads {} after the cluster manager's kill: {e}\n{}",
                    path.display(),
                    c.telling_lines()
                );
                d
            }
        }
    });
    // The survivors' workloads went on through the election, the expel and the
    // recovery: wait for a few more operations of each after the recovery.
    let base: Vec<u64> = journals.iter().map(|j| j.lock().unwrap().ops).collect();
    wait_for(
        &c,
        "the survivors' workloads go on after the recovery",
        || {
            survivors.iter().all(|&i| {
                journals[i as usize].lock().unwrap().ops >= base[i as usize] + 3
                    || workers[i as usize].is_finished()
            })
        },
    );
    stop.store(true, Ordering::SeqCst);
    for (n, w) in workers.into_iter().enumerate() {
        let err = w.join().expect("a worker panicked");
        if let Some(e) = err.filter(|_| n as u32 != victim) {
            panic!(
                "node {n}'s workload failed while the cluster manager, node {victim}, was \
                 killed and recovered: {e}\n{}",
                c.telling_lines()
            );
        }
    }
    let stalls: Vec<Duration> = survivors
        .iter()
        .map(|&i| max_latency_between(&lat[i as usize], killed_at, recovered_at))
        .collect();
    let during: Vec<Duration> = lat[survivors[0] as usize]
        .lock()
        .unwrap()
        .iter()
        .filter(|t| t.start >= killed_at && t.start <= recovered_at)
        .map(|t| t.took)
        .collect();
    let p99 = percentile(during.clone(), 0.99);

    // No survivor was expelled; the new manager is one of them. (The node answering
    // `mako node show` may apply the expel a moment after the manager logged it.)
    wait_for(&c, "mako node show shows the killed node expelled", || {
        line_of(&c.node_show(), &format!("node{victim}")).contains("expelled")
    });
    let show = c.node_show();
    for &i in &survivors {
        let line = line_of(&show, &format!("node{i}"));
        assert!(
            line.contains("active") && !line.contains("expelled"),
            "survivor node{i} is not active after the cluster manager's kill:\n{show}"
        );
    }
    assert!(
        line_of(&show, &format!("node{victim}")).contains("expelled"),
        "the killed cluster manager is not shown expelled:\n{show}"
    );
    assert_eq!(
        cluster_manager(&show),
        Some(new_manager),
        "mako node show names another cluster manager than the one that logged it:\n{show}"
    );
    // Both survivors see every node's acknowledged state.
    for &seen_from in &survivors {
        for (n, j) in journals.iter().enumerate() {
            check_journal(n as u32, j, &c.mount(seen_from), seen_from);
        }
    }

    // The killed node comes back: it rejoins at a new lease epoch and mounts.
    let rejoined = count(&c, victim, &["rejoined the cluster at lease epoch"]);
    let out = c.startup(victim).expect("mako startup of the killed node");
    assert!(
        out.success(),
        "mako startup -N node{victim}: {out}\n{}",
        c.telling_lines()
    );
    wait_for(&c, "the killed node active again", || {
        let line = line_of(&c.node_show(), &format!("node{victim}"));
        line.contains("active") && !line.contains("expelled")
    });
    assert!(
        count(&c, victim, &["rejoined the cluster at lease epoch"]) > rejoined,
        "node {victim} is active again but did not log its rejoin at a new lease epoch:\n{}",
        c.telling_lines()
    );
    assert!(
        is_mounted(&c.mount(victim)),
        "node {victim} is not mounted after its restart"
    );
    for (n, j) in journals.iter().enumerate() {
        check_journal(n as u32, j, &c.mount(victim), victim);
    }
    eprintln!(
        "manager_failover_on_mako: cluster manager node{victim} killed (kill -9) under the \
         mixed workload; failureDetectionTime 10 s, minMissedPingTimeout 2 s; kill to new \
         cluster manager (node{new_manager} logs it) {:.2} s, to expel {:.2} s, to recovery \
         done {:.2} s; survivors' longest operation across the window: {}; node{} during \
         it: {} operations, p99 {:.1} ms; node{reader}'s read of a file node{victim} had \
         fsynced took {}",
        to_leader.as_secs_f64(),
        to_expel.as_secs_f64(),
        to_recovered.as_secs_f64(),
        survivors
            .iter()
            .zip(&stalls)
            .map(|(i, d)| format!("node{i} {:.2} s", d.as_secs_f64()))
            .collect::<Vec<_>>()
            .join(", "),
        survivors[0],
        during.len(),
        p99.as_secs_f64() * 1e3,
        probe_stall
            .map(|d| format!("{:.2} s", d.as_secs_f64()))
            .unwrap_or_else(|| "-".into()),
    );

    c.finish().expect("mako down and fsck clean");
}

/// Lazy unmount of a killed node's mount (its FUSE connection aborted), so that `mako
/// down` finds nothing mounted there.
fn detach(mount: &Path) {
    let p = std::ffi::CString::new(mount.as_os_str().as_encoded_bytes()).expect("a C path");
    unsafe { libc::umount2(p.as_ptr(), libc::MNT_DETACH) };
}

/// Reads the sequence number at the start of `path` (8 bytes, little endian).
fn read_seq(path: &Path) -> std::io::Result<u64> {
    let mut f = std::fs::File::open(path)?;
    let mut b = [0u8; 8];
    f.read_exact(&mut b)?;
    Ok(u64::from_le_bytes(b))
}

#[test]
fn a_node_cut_off_stops_its_io_is_expelled_and_rejoins() {
    let test = "a_node_cut_off_stops_its_io_is_expelled_and_rejoins";
    if !require_fuse(test) {
        return;
    }
    if !Path::new("/run/netns").exists() && std::fs::create_dir_all("/run/netns").is_err() {
        cannot_run(test, "no /run/netns for ip netns");
        return;
    }
    let mut c = NetCluster::up(options(&["--quorum-nodes", "node0"], vec![2]))
        .expect("three nodes up, node2 in a network namespace of its own");
    let victim = 2u32;
    assert!(line_of(&c.node_show(), "node2").contains("active"));

    // What node 2 made durable before the cut.
    let first = vec![b'A'; 100_000];
    write_synced(&c.mount(victim).join("f"), &first).expect("node 2 writes and fsyncs f");
    // Node 2 keeps rewriting g: a sequence number, fsynced, as long as it can.
    let g = c.mount(victim).join("g");
    let acked = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let first_error: Arc<Mutex<Option<(Instant, std::io::Error)>>> = Arc::default();
    let writer = {
        let (g, acked, stop, first_error) =
            (g.clone(), acked.clone(), stop.clone(), first_error.clone());
        std::thread::spawn(move || {
            let mut seq = 0u64;
            let mut f = None;
            while !stop.load(Ordering::SeqCst) {
                seq += 1;
                let r = (|| -> std::io::Result<()> {
                    if f.is_none() {
                        f = Some(
                            std::fs::OpenOptions::new()
                                .read(true)
                                .write(true)
                                .create(true)
                                .truncate(false)
                                .open(&g)?,
                        );
                    }
                    let file = f.as_mut().unwrap();
                    file.seek(SeekFrom::Start(0))?;
                    file.write_all(&seq.to_le_bytes())?;
                    file.sync_all()
                })();
                match r {
                    Ok(()) => acked.store(seq, Ordering::SeqCst),
                    Err(e) => {
                        f = None;
                        let mut fe = first_error.lock().unwrap();
                        if fe.is_none() {
                            *fe = Some((Instant::now(), e));
                        }
                    }
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        })
    };
    wait_for(&c, "node 2 writes g", || acked.load(Ordering::SeqCst) >= 5);

    c.cut_link(victim).expect("take node 2's link down");
    let cut = Instant::now();
    // Its lease runs out: its writes fail.
    wait_for(&c, "node 2's writes fail once its lease ran out", || {
        first_error.lock().unwrap().is_some()
    });
    let (failed_at, err) = first_error.lock().unwrap().take().unwrap();
    assert!(
        matches!(err.raw_os_error(), Some(libc::EIO) | Some(libc::EROFS)),
        "node 2's write after its link was cut failed, but not with EIO or EROFS: {err}"
    );
    let to_fence = failed_at - cut;
    let last_acked = acked.load(Ordering::SeqCst);
    // Its mount returns errors for what needs no disk I/O too.
    let r = std::fs::read(c.mount(victim).join("f"));
    assert!(
        r.as_ref().err().and_then(|e| e.raw_os_error()) == Some(libc::EIO),
        "node 2 cut off reads f: {:?} (EIO expected)",
        r.map(|b| b.len())
    );
    // Node 0 expels and recovers it; node 0 then reads g as node 2 last fsynced it.
    wait_for(&c, "node 0 expels node 2", || {
        count(&c, 0, &["node 2 expelled by node 0"]) > 0
    });
    let to_expel = cut.elapsed();
    wait_for(&c, "node 0 recovers node 2", || {
        count(&c, 0, &["node 2 (lease epoch", "recovered"]) > 0
    });
    let to_recovered = cut.elapsed();
    let after_expel = read_seq(&c.mount(0).join("g")).expect("node 0 reads g after the recovery");
    assert!(
        after_expel == last_acked || after_expel == last_acked + 1,
        "node 0 reads sequence {after_expel} in g after node 2's recovery; node 2 had fsynced \
         {last_acked} before its writes started failing"
    );
    assert!(
        std::fs::read(c.mount(0).join("f")).expect("node 0 reads f") == first,
        "node 0 does not read what node 2 fsynced in f before the cut"
    );
    let show = c.node_show();
    assert!(
        line_of(&show, "node2").contains("expelled by node0"),
        "node2 not shown expelled:\n{show}"
    );
    for i in [0, 1] {
        assert!(
            !line_of(&show, &format!("node{i}")).contains("expelled"),
            "node{i} was expelled too:\n{show}"
        );
    }

    // The link comes back: node 2 rejoins at a new lease epoch by itself.
    c.restore_link(victim).expect("bring node 2's link back");
    let restored = Instant::now();
    wait_for(&c, "node 2 rejoins", || {
        count(&c, victim, &["rejoined the cluster at lease epoch"]) > 0
    });
    let to_rejoin = restored.elapsed();
    wait_for(&c, "node2 shown active again", || {
        let line = line_of(&c.node_show(), "node2");
        line.contains("active") && !line.contains("expelled")
    });
    // Its old mount stays fenced (made at the old epoch): every operation errors.
    let r = std::fs::read(c.mount(victim).join("f"));
    assert!(
        r.as_ref().err().and_then(|e| e.raw_os_error()) == Some(libc::EIO),
        "node 2's mount made before its expel reads f after the rejoin: {:?} (EIO expected)",
        r.map(|b| b.len())
    );
    // Its writer went on trying all along; nothing of it reached the disk.
    stop.store(true, Ordering::SeqCst);
    writer.join().expect("node 2's writer");
    let now = read_seq(&c.mount(0).join("g")).expect("node 0 reads g");
    assert_eq!(
        now, after_expel,
        "a write of node 2 reached the disk after its expel: node 0 read {after_expel} in g \
         after the recovery, {now} now"
    );

    // Mounted again (its makod restarted in its namespace), node 2 works.
    let out = c
        .mako(&["shutdown", "-N", "node2"])
        .expect("mako shutdown -N node2");
    assert!(out.success(), "mako shutdown -N node2: {out}");
    let out = c.startup(victim).expect("mako startup -N node2");
    assert!(
        out.success(),
        "mako startup -N node2: {out}\n{}",
        c.telling_lines()
    );
    assert_eq!(
        read_seq(&g).expect("node 2 reads g mounted again"),
        after_expel
    );
    let third = vec![b'C'; 50_000];
    write_synced(&c.mount(victim).join("f"), &third).expect("node 2 writes after it rejoined");
    assert!(std::fs::read(c.mount(0).join("f")).expect("node 0 reads f") == third);
    eprintln!(
        "manager_failover_on_mako: node2's link cut (veth down); failureDetectionTime 10 s, \
         minMissedPingTimeout 2 s; cut to its first failed write {:.2} s, to its expel by \
         node0 {:.2} s, to recovery done {:.2} s; link back to its rejoin {:.2} s",
        to_fence.as_secs_f64(),
        to_expel.as_secs_f64(),
        to_recovered.as_secs_f64(),
        to_rejoin.as_secs_f64(),
    );
    c.finish().expect("mako down and fsck clean");
}

/// The inode numbers of the inode tokens node `i` holds whose shard is `manager`'s,
/// and how many tokens it holds from that shard in all (`mako diag tokens --json`).
fn tokens_from(c: &NetCluster, i: u32, manager: &str) -> (Vec<u64>, usize) {
    let out = c
        .mako_in(&c.node_dir(i), &["diag", "tokens", "--json"])
        .expect("mako diag tokens");
    assert!(out.success(), "mako diag tokens on node{i}: {out}");
    let list: serde_json::Value = serde_json::from_str(&out.stdout).expect("tokens as JSON");
    let mut inodes = Vec::new();
    let mut all = 0;
    for t in list.as_array().expect("a list of tokens") {
        if t["manager"].as_str() != Some(manager) {
            continue;
        }
        all += 1;
        let resource = t["resource"].as_str().unwrap_or_default();
        let parts: Vec<&str> = resource.split(':').collect();
        if let [_, "inode", id] = parts.as_slice() {
            if let Ok(ino) = id.parse() {
                inodes.push(ino);
            }
        }
    }
    (inodes, all)
}

/// The content of test file `name`, version `v` (64 KiB, unlike any other's).
fn content(name: &str, v: u32) -> Vec<u8> {
    let seed = name.bytes().fold(u64::from(v) + 1, |h, b| {
        h.wrapping_mul(0x100_0000_01b3) ^ u64::from(b)
    });
    (0..64 * 1024u64)
        .map(|i| (seed.wrapping_mul(i + 1) >> 24) as u8)
        .collect()
}

fn write_file(path: &Path, data: &[u8]) -> std::io::Result<()> {
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(path)?;
    f.write_all(data)?;
    f.sync_all()
}

fn assert_content(path: &Path, want: &[u8], c: &NetCluster, what: &str) {
    match std::fs::read(path) {
        Ok(got) => assert!(
            got == want,
            "{what}: {} holds {} bytes, not the {} written{}\n{}",
            path.display(),
            got.len(),
            want.len(),
            if got.len() == want.len() {
                " (same length, other bytes)"
            } else {
                ""
            },
            c.telling_lines()
        ),
        Err(e) => panic!(
            "{what}: reading {}: {e}\n{}",
            path.display(),
            c.telling_lines()
        ),
    }
}

/// Issue 14's token rebuild with real processes (docs/coherence.md section 7b,
/// `makod::shards`): three quorum nodes, the token manager sharded over node0 and
/// node1. node1 writes and fsyncs files; node2 writes and fsyncs its own and reads
/// node1's, so it holds tokens of both shards. node1 is killed (`kill -9`): its slot
/// moves to node0 once it is expelled, node0 rebuilds the slot from the survivors'
/// reports and node1's recovery, and node2's operation on one of its files of the lost
/// shard, started at the kill, waits and then succeeds (no EIO). Both survivors then
/// read every file as written and fsynced before the kill; a write on one survivor is
/// read on the other and back (the rebuilt shard revokes the conflicting tokens).
/// node1, restarted, rejoins as a plain node (its slot stays on node0), mounts and
/// reads the same. The figures (stall against failureDetectionTime, rebuild time,
/// tokens rebuilt) are printed, not asserted.
#[test]
fn killing_a_token_manager_node_rebuilds_its_shard_on_a_survivor() {
    let test = "killing_a_token_manager_node_rebuilds_its_shard_on_a_survivor";
    if !require_fuse(test) {
        return;
    }
    token_manager_node_lost(Loss::Kill9);
}

/// The same with the token manager node stopped (`SIGSTOP`) rather than killed: its
/// connections stay open, so the survivors' token requests already sent to it get no
/// answer and no broken connection. They give up when it is expelled
/// (`TcpTransport::give_up_on`, from the configuration applier) and go to the slot's
/// new node; before that, node0's first read of a file of the lost shard waited out
/// the token client's 60 s call deadline and failed (EIO). The stopped node is killed
/// after the checks and restarted as in the kill test.
#[test]
fn stopping_a_token_manager_node_rebuilds_its_shard_on_a_survivor() {
    let test = "stopping_a_token_manager_node_rebuilds_its_shard_on_a_survivor";
    if !require_fuse(test) {
        return;
    }
    token_manager_node_lost(Loss::Stop);
}

/// How the token manager node is lost.
#[derive(Clone, Copy, PartialEq, Debug)]
enum Loss {
    Kill9,
    Stop,
}

fn token_manager_node_lost(how: Loss) {
    let mut c = three_quorum_nodes("node0,node1");
    let (victim, successor, holder) = (1u32, 0u32, 2u32);
    let manager_before = cluster_manager(&c.node_show());

    // The victim's files, fsynced; node2's own, fsynced; node2 reads the victim's.
    let victims: Vec<String> = (0..12).map(|k| format!("v{k}")).collect();
    let mine: Vec<String> = (0..32).map(|k| format!("a{k}")).collect();
    for f in &victims {
        write_file(&c.mount(victim).join(f), &content(f, 0)).expect("node1 writes a file");
    }
    for f in &mine {
        write_file(&c.mount(holder).join(f), &content(f, 0)).expect("node2 writes a file");
    }
    for f in &victims {
        assert_content(
            &c.mount(holder).join(f),
            &content(f, 0),
            &c,
            "node2 before the kill",
        );
    }
    // node2's files whose inode token is kept by node1's shard.
    let (inodes, held_from_victim) = tokens_from(&c, holder, "node1");
    let lost: Vec<&String> = mine
        .iter()
        .filter(|f| {
            let ino = std::fs::metadata(c.mount(holder).join(f)).map(|m| {
                use std::os::unix::fs::MetadataExt;
                m.ino()
            });
            ino.is_ok_and(|i| inodes.contains(&i))
        })
        .collect();
    assert!(
        !lost.is_empty(),
        "none of node2's {} files has its inode token in node1's shard (node2 holds {} \
         tokens from it, inodes {inodes:?})",
        mine.len(),
        held_from_victim
    );
    let probe = lost[0].clone();
    // A file node1 wrote of its own shard, which node0 never touched: reading it needs
    // a token of the lost shard, and node1's recovery (its xw token).
    let unread = victims
        .iter()
        .find(|f| {
            std::fs::metadata(c.mount(holder).join(f)).is_ok_and(|m| {
                use std::os::unix::fs::MetadataExt;
                inodes.contains(&m.ino())
            })
        })
        .expect("one of node1's 12 files has its inode token in node1's shard")
        .clone();

    match how {
        Loss::Kill9 => c
            .kill9(victim)
            .expect("kill -9 of node1, a token manager node"),
        Loss::Stop => c
            .signal(victim, libc::SIGSTOP)
            .expect("SIGSTOP of node1, a token manager node"),
    }
    abort_fuse_connection(&c.mount(victim));
    detach(&c.mount(victim));
    let killed = Instant::now();
    // node2's operation on its file of the lost shard: read it, write it anew, fsync.
    let stall = {
        let path = c.mount(holder).join(&probe);
        let (old, new) = (content(&probe, 0), content(&probe, 1));
        std::thread::spawn(move || {
            let r = std::fs::read(&path).and_then(|got| {
                if got != old {
                    return Err(std::io::Error::other("other bytes than written"));
                }
                write_file(&path, &new)
            });
            (killed.elapsed(), r)
        })
    };

    // node0's read of node1's file of the lost shard: the recovery stall.
    let recovery_stall = {
        let path = c.mount(successor).join(&unread);
        let want = content(&unread, 0);
        std::thread::spawn(move || {
            let r = std::fs::read(&path).and_then(|got| {
                if got != want {
                    return Err(std::io::Error::other("other bytes than node1 fsynced"));
                }
                Ok(())
            });
            (killed.elapsed(), r)
        })
    };

    let expel = format!("node {victim} expelled by");
    wait_for(&c, "node1 expelled", || {
        (0..3).any(|i| i != victim && count(&c, i, &[&expel]) > 0)
    });
    let to_expel = killed.elapsed();
    let take = format!("takes slot 1 over from node {victim}");
    wait_for(&c, "node0 takes node1's slot over", || {
        count(&c, successor, &[&take]) > 0
    });
    let to_takeover = killed.elapsed();
    let rebuilt = format!("slot 1 (from node {victim}) rebuilt in");
    wait_for(&c, "node0 rebuilds node1's slot", || {
        count(&c, successor, &[&rebuilt]) > 0
    });
    let to_rebuilt = killed.elapsed();
    let line = c
        .log_lines(successor)
        .into_iter()
        .find(|l| l.contains(&rebuilt))
        .unwrap_or_default();
    let (stall, r) = stall.join().expect("node2's operation");
    if let Err(e) = r {
        panic!(
            "node2's operation on {probe} (a file of node1's shard) failed after node1's \
             kill: {e}\n{}",
            c.telling_lines()
        );
    }

    let (recovery_stall, r) = recovery_stall.join().expect("node0's read");
    if let Err(e) = r {
        panic!(
            "node0's read of {unread} (node1's file, of node1's shard) failed after node1's \
             kill: {e}\n{}",
            c.telling_lines()
        );
    }

    // Every fsynced byte, on both survivors; node2's later write on both.
    for &i in &[holder, successor] {
        for f in &victims {
            assert_content(&c.mount(i).join(f), &content(f, 0), &c, "after the rebuild");
        }
        for f in &mine {
            let v = u32::from(*f == probe);
            assert_content(&c.mount(i).join(f), &content(f, v), &c, "after the rebuild");
        }
    }
    // Conflicting tokens revoked by the rebuilt shard: a write on node0 read on node2,
    // and back.
    for f in lost.iter().take(4) {
        write_file(&c.mount(successor).join(f), &content(f, 2)).expect("node0 writes");
        assert_content(
            &c.mount(holder).join(f),
            &content(f, 2),
            &c,
            "node0's write on node2",
        );
        write_file(&c.mount(holder).join(f), &content(f, 3)).expect("node2 writes");
        assert_content(
            &c.mount(successor).join(f),
            &content(f, 3),
            &c,
            "node2's write on node0",
        );
    }
    let created = c.mount(successor).join("after-rebuild");
    write_file(&created, &content("after-rebuild", 0)).expect("node0 creates a file");
    assert_content(
        &c.mount(holder).join("after-rebuild"),
        &content("after-rebuild", 0),
        &c,
        "a file created after the rebuild",
    );
    assert!(
        c.telling_lines()
            .lines()
            .all(|l| !l.contains("shard of") || !l.contains("was lost")),
        "a mount was fenced for the lost shard:\n{}",
        c.telling_lines()
    );

    if how == Loss::Stop {
        // Expelled, it would find out and rejoin once it ran again; killed here, it
        // comes back as in the kill test.
        c.kill9(victim).expect("kill -9 of the stopped node1");
    }
    // node1 comes back as a plain node: its slot stays on node0.
    let out = c.startup(victim).expect("mako startup of node1");
    assert!(
        out.success(),
        "mako startup -N node1: {out}\n{}",
        c.telling_lines()
    );
    wait_for(&c, "node1 mounted again", || is_mounted(&c.mount(victim)));
    for f in &victims {
        assert_content(
            &c.mount(victim).join(f),
            &content(f, 0),
            &c,
            "node1 after its rejoin",
        );
    }
    for f in lost.iter().take(4) {
        assert_content(
            &c.mount(victim).join(f),
            &content(f, 3),
            &c,
            "node1 after its rejoin",
        );
    }
    write_file(&c.mount(victim).join(&probe), &content(&probe, 4)).expect("node1 writes");
    assert_content(
        &c.mount(holder).join(&probe),
        &content(&probe, 4),
        &c,
        "node1's write",
    );
    assert!(
        count(&c, victim, &["serves slots []"]) > 0,
        "node1 serves a slot again after its rejoin:\n{}",
        c.telling_lines()
    );

    eprintln!(
        "manager_failover_on_mako: token manager node1 lost ({how:?}); cluster manager \
         {manager_before:?}; failureDetectionTime 10 s, minMissedPingTimeout 2 s; node2 held \
         {held_from_victim} tokens of node1's shard ({} of its 32 files' inodes); kill to \
         expel {:.2} s, to node0's takeover {:.2} s, to the slot rebuilt {:.2} s; recovery \
         stall (node0's first read of a file node1 wrote and fsynced, of node1's shard, \
         started at the kill): {:.2} s; node2's operation on its own file of the lost shard \
         (tokens cached: read, write, fsync), started at the kill: {:.2} s; node0: {}",
        lost.len(),
        to_expel.as_secs_f64(),
        to_takeover.as_secs_f64(),
        to_rebuilt.as_secs_f64(),
        recovery_stall.as_secs_f64(),
        stall.as_secs_f64(),
        line.split("token manager of")
            .nth(1)
            .unwrap_or(&line)
            .trim()
    );
    c.finish().expect("mako down and fsck clean");
}
