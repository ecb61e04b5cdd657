//! A node dies, the cluster lives (issue 14, docs/cluster.md "Leases, expel and
//! fencing" and "Recovery of a failed node"), with real processes.
//!
//! `kill -9` rounds: three makod processes — node 0 the cluster manager (the only
//! quorum node), the token and file-system managers and the NSD server; nodes 1 and 2
//! clients without disk access of their own. In each round a worker on every node runs
//! a mixed workload (creates, writes + fsync, renames, unlinks; in a directory of its
//! own and in one shared by all) and journals what was acknowledged after an fsync;
//! one client is killed (`kill -9`) mid-workload; the test waits for the manager to
//! expel and recover it, checks from both survivors that every acknowledged byte and
//! name is there per the journal, restarts the node, which rejoins and mounts, and
//! goes on. 20 rounds per run (`MAKO_FAILOVER_ROUNDS=N` for a longer one); `mako fsck
//! -n` clean at the end. Not in CI yet: see the `ignore` reason.
//!
//! `failureDetectionTime` is 5 s (its minimum, see `mako_config::spec`) and
//! `minMissedPingTimeout` 1 s, so a round lasts about 10 s. Every wait is for a state
//! (an expel in `mako node show`, a recovery in makod.log, a mount), with a deadline
//! only as a hang guard. The victim's FUSE connection is not aborted by the test: a
//! makod stuck exiting in the kernel is its FUSE guard's to end (`makod::fuse_guard`).
//! The figures (per round and for the run: time from the kill to the expel and to the
//! recovery, the stall of a survivor's read of the victim's file, the p99 of the
//! survivors' operations during recovery — node 0's in its own directory, which no
//! other node reads, so they never need the victim, apart from the others, which may
//! wait for the victim's tokens —, log replay time) are printed, not asserted.
//!
//! `a_survivor_that_mounts_recovers_where_the_manager_does_not` (in CI, about 13 s):
//! the cluster manager does not mount the file system, so the killed node is
//! recovered by the survivor that does (docs/cluster.md "Recovery of a failed node").

use mako_tests::cluster::{is_mounted, require_fuse};
use mako_tests::netcluster::{line_of, NetCluster, NetClusterOptions};
use mako_tests::workload::{
    check_journal, check_touched, percentile, work, Journal, Latencies, Timed,
};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Hang guard of each wait for a state.
const WAIT: Duration = Duration::from_secs(240);
/// Rounds per CI run.
const ROUNDS_CI: u32 = 20;

fn wait_for(c: &NetCluster, what: &str, done: impl FnMut() -> bool) {
    c.wait_for(what, WAIT, done);
}

/// The lines of node 0's log saying node `victim` was recovered.
fn recoveries(c: &NetCluster, victim: u32) -> Vec<String> {
    let tag = format!("node {victim} (lease epoch");
    c.log_lines(0)
        .into_iter()
        .filter(|l| l.contains(&tag) && l.contains("recovered"))
        .collect()
}

/// `failureDetectionTime` and `minMissedPingTimeout` of the test's cluster (seconds).
const FAILURE_DETECTION_S: u32 = 5;
const MISSED_PING_S: u32 = 1;

fn short_lease_cluster() -> NetCluster {
    NetCluster::up(NetClusterOptions::leased(
        3,
        "2G",
        FAILURE_DETECTION_S,
        MISSED_PING_S,
    ))
    .expect("three nodes up: node0 the cluster manager and NSD server, nodes 1 and 2 clients")
}

/// p99 of the operations of `lat` (node, its operations) for which `which` holds
/// that were under way at some time between `from` and `to`, and the slowest of them
/// (node, operation).
fn p99_during(
    lat: &[(u32, &Latencies)],
    which: impl Fn(u32, &Timed) -> bool,
    from: Duration,
    to: Duration,
) -> (Option<Duration>, Option<(u32, Timed)>) {
    let mut took = Vec::new();
    let mut slowest: Option<(u32, Timed)> = None;
    for (node, l) in lat {
        for t in l.lock().unwrap().iter() {
            if t.start <= to && t.start + t.took >= from && which(*node, t) {
                took.push(t.took);
                if slowest.is_none_or(|(_, s)| s.took < t.took) {
                    slowest = Some((*node, *t));
                }
            }
        }
    }
    ((!took.is_empty()).then(|| percentile(took, 0.99)), slowest)
}

#[test]
#[ignore = "not yet in CI: 20 rounds take 3.3-3.5 min (208 s and 198 s in all in the two \
            green runs since the fix, load average about 12, the first with a clippy run beside; \
            about 6 s of each 8-10 s round is the kill-to-recovery floor of failureDetectionTime \
            5 s), over the 3 min CI can spend, and only 2 of the 3 green runs in a row asked for: \
            the run before them ended with fsck finding an unlinked inode of 70037 bytes in use \
            (an orphan of a killed node that a survivor's kernel had looked up, which recovery \
            now frees, docs/coherence.md 7a); run with --ignored"]
fn kill9_rounds_lose_nothing_fsynced() {
    if !require_fuse("kill9_rounds_lose_nothing_fsynced") {
        return;
    }
    let rounds: u32 = match std::env::var("MAKO_FAILOVER_ROUNDS") {
        Ok(v) => v
            .parse()
            .unwrap_or_else(|_| panic!("MAKO_FAILOVER_ROUNDS={v:?} is not a number of rounds")),
        Err(_) => ROUNDS_CI,
    };
    let mut c = short_lease_cluster();
    for n in 0..3 {
        std::fs::create_dir_all(c.mount(0).join(format!("p{n}"))).expect("mkdir p<n>");
    }
    std::fs::create_dir_all(c.mount(0).join("shared")).expect("mkdir shared");
    let journals: Vec<Arc<Mutex<Journal>>> = (0..3).map(|_| Arc::default()).collect();
    let seqs: Vec<Arc<AtomicU64>> = (0..3).map(|_| Arc::new(AtomicU64::new(0))).collect();
    let mut stalls = Vec::new();
    let mut to_recovered = Vec::new();
    let mut own_p99s = Vec::new();
    let mut shared_p99s = Vec::new();
    let mut replays = Vec::new();
    let started = Instant::now();
    for round in 0..rounds {
        let victim = 1 + round % 2;
        let survivor = 3 - victim;
        let t0 = Instant::now();
        let stop = Arc::new(AtomicBool::new(false));
        let lat: Vec<Latencies> = (0..3).map(|_| Latencies::default()).collect();
        let mut workers: Vec<_> = (0..3u32)
            .map(|n| {
                let (m, j, s, st, l) = (
                    c.mount(n),
                    journals[n as usize].clone(),
                    seqs[n as usize].clone(),
                    stop.clone(),
                    lat[n as usize].clone(),
                );
                Some(std::thread::spawn(move || work(n, m, j, s, st, l, t0)))
            })
            .collect();
        // Mid-workload: every node acknowledged a few operations this round.
        let progress = Instant::now();
        let base: Vec<u64> = journals.iter().map(|j| j.lock().unwrap().ops).collect();
        wait_for(&c, "every node's workload makes progress", || {
            journals
                .iter()
                .zip(&base)
                .all(|(j, b)| j.lock().unwrap().ops >= b + 3)
        });
        // The victim's file a survivor will wait for: one it wrote and fsynced, so it
        // may still hold its tokens.
        let progress = progress.elapsed();
        let probe = journals[victim as usize].lock().unwrap().last_written();
        let recovered_before = recoveries(&c, victim).len();
        // No abort of the victim's FUSE connection here: a makod that cannot finish
        // exiting (stuck in the kernel on its connection) is the restart's to clean
        // up (`mako up` aborts a connection of a dead makod that does not answer).
        c.kill9(victim).expect("kill -9 of the victim");
        let killed = Instant::now();
        let killed_at = killed - t0;
        // A survivor reads the victim's file: it waits for the victim's tokens, so
        // for its recovery.
        let stall = probe.map(|(p, content)| {
            let path = c.mount(survivor).join(&p);
            std::thread::spawn(move || {
                let got = std::fs::read(&path);
                (killed.elapsed(), got.map(|b| b.len() == content.len), path)
            })
        });
        let expel = format!("node {victim} expelled by node 0");
        wait_for(
            &c,
            &format!("round {round}: node 0 expels node {victim}"),
            || c.log_lines(0).iter().filter(|l| l.contains(&expel)).count() > round as usize / 2,
        );
        let expelled_after = killed.elapsed();
        wait_for(
            &c,
            &format!("round {round}: node {victim} recovered"),
            || recoveries(&c, victim).len() > recovered_before,
        );
        let recovered_after = killed.elapsed();
        to_recovered.push(recovered_after);
        let recovered_at = recovered_after + killed_at;
        let mut replay = None;
        if let Some(line) = recoveries(&c, victim).last() {
            if let Some(ms) = line
                .split(" recovered in ")
                .nth(1)
                .and_then(|r| r.split(" ms").next())
                .and_then(|v| v.parse::<u64>().ok())
            {
                replays.push(ms);
                replay = Some(ms);
            }
        }
        let mut stall_s = None;
        if let Some(h) = stall {
            let (d, ok, path) = h.join().expect("the probe read");
            // What it reads is checked against the journal below (the victim may have
            // overwritten, renamed or removed it since the probe was chosen).
            match ok {
                Ok(_) => {
                    stalls.push(d);
                    stall_s = Some(d);
                }
                Err(e) => assert!(
                    e.kind() == std::io::ErrorKind::NotFound,
                    "round {round}: node {survivor} reads {} after node {victim}'s kill: {e}",
                    path.display()
                ),
            }
        }
        stop.store(true, Ordering::SeqCst);
        for n in [0, survivor] {
            let w = workers[n as usize].take().expect("a survivor's worker");
            if let Some(e) = w.join().expect("a worker panicked") {
                panic!(
                    "round {round}: node {n}'s workload failed while node {victim} was killed \
                     and recovered: {e}\n{}",
                    c.logs_tail(30)
                );
            }
        }
        // The survivors' operations under way between the kill and the recovery: node
        // 0's in its own directory, which no other node ever reads, so they never need
        // the victim; and the others, in directories the victim may hold tokens of
        // (the shared one; a client's own, which the other nodes read to check it),
        // which may wait for its recovery.
        let survivors = [(0, &lat[0]), (survivor, &lat[survivor as usize])];
        let (own, slowest) = p99_during(
            &survivors,
            |node, t| node == 0 && !t.shared,
            killed_at,
            recovered_at,
        );
        let (shared, _) = p99_during(
            &survivors,
            |node, t| node != 0 || t.shared,
            killed_at,
            recovered_at,
        );
        own_p99s.extend(own);
        shared_p99s.extend(shared);
        // The victim's worker ended with the kill (its mount's requests fail once
        // makod is gone; one left waiting on a connection that a makod stuck exiting
        // kept open ends when makod's FUSE guard, or `mako up`, aborts it).
        let victim_done = workers[victim as usize]
            .as_ref()
            .is_some_and(|w| w.is_finished());
        if victim_done {
            let w = workers[victim as usize]
                .take()
                .expect("the victim's worker");
            w.join().expect("the victim's worker panicked");
        }
        // Every survivor sees every node's acknowledged state (the victim's once its
        // worker has ended; node 0's from node 0 only: no other node ever reads its
        // directory), before the victim is back.
        let back = Instant::now();
        for seen_from in [0, survivor] {
            for (n, j) in journals.iter().enumerate() {
                if (n as u32 != victim || victim_done) && (n != 0 || seen_from == 0) {
                    check_touched(n as u32, j, &c.mount(seen_from), seen_from);
                }
            }
        }
        // The victim comes back, rejoins and mounts.
        c.start_stopped().expect("the victim started again");
        if let Some(w) = workers[victim as usize].take() {
            w.join().expect("the victim's worker panicked");
            eprintln!(
                "round {round}: node {victim}'s worker was still waiting on its dead mount \
                 when the survivors were checked"
            );
            for seen_from in [0, survivor] {
                check_touched(
                    victim,
                    &journals[victim as usize],
                    &c.mount(seen_from),
                    seen_from,
                );
            }
        }
        wait_for(
            &c,
            &format!("round {round}: node{victim} active again"),
            || {
                let line = line_of(&c.node_show(), &format!("node{victim}"));
                line.contains("active") && !line.contains("expelled")
            },
        );
        assert!(
            is_mounted(&c.mount(victim)),
            "node {victim} is not mounted after its restart"
        );
        check_touched(victim, &journals[victim as usize], &c.mount(victim), victim);
        // Every view of what this round touched was checked.
        for j in &journals {
            j.lock().unwrap().settle_touched();
        }
        let back = back.elapsed();
        // No survivor was expelled.
        let show = c.node_show();
        assert!(
            !line_of(&show, "node0").contains("expelled")
                && !line_of(&show, &format!("node{survivor}")).contains("expelled"),
            "round {round}: a survivor was expelled:\n{show}"
        );
        let ms = |d: Option<Duration>| {
            d.map(|d| format!("{:.0} ms", d.as_secs_f64() * 1e3))
                .unwrap_or_else(|| "-".into())
        };
        eprintln!(
            "round {round}: node {victim} killed; expel seen after {:.1} s, recovered after \
             {:.1} s (replay {}), survivor's read of its file stalled {}; survivors' p99 \
             during recovery: node 0's own directory {} (slowest: {}), directories the victim \
             may hold tokens of {}; round {:.1} s \
             (workload progress {:.1} s, recovery to the victim back and checked {:.1} s)",
            expelled_after.as_secs_f64(),
            recovered_after.as_secs_f64(),
            replay
                .map(|r| format!("{r} ms"))
                .unwrap_or_else(|| "-".into()),
            stall_s
                .map(|d| format!("{:.2} s", d.as_secs_f64()))
                .unwrap_or_else(|| "-".into()),
            ms(own),
            slowest
                .map(|(n, t)| format!(
                    "node {n}'s {} from {:.2} s after the kill, {:.0} ms",
                    t.what,
                    t.start.as_secs_f64() - killed_at.as_secs_f64(),
                    t.took.as_secs_f64() * 1e3
                ))
                .unwrap_or_else(|| "-".into()),
            ms(shared),
            t0.elapsed().as_secs_f64(),
            progress.as_secs_f64(),
            back.as_secs_f64()
        );
    }
    let ops: u64 = journals.iter().map(|j| j.lock().unwrap().ops).sum();
    let secs = |v: &[Duration], p: f64| percentile(v.to_vec(), p).as_secs_f64();
    replays.sort();
    let elapsed = started.elapsed().as_secs_f64();
    eprintln!(
        "failover_on_mako: {rounds} kill -9 rounds in {elapsed:.1} s ({:.2} rounds/min), {ops} \
         operations acknowledged; failureDetectionTime {FAILURE_DETECTION_S} s, \
         minMissedPingTimeout {MISSED_PING_S} s; kill -9 to recovery done: median {:.2} s, max \
         {:.2} s; recovery stall (kill -9 to a survivor's read of the victim's file) median \
         {:.2} s, max {:.2} s over {} probes; survivors' p99 during recovery, worst round: \
         node 0's own directory (no other node reads it) {:.1} ms, directories the victim may \
         hold tokens of {:.1} ms; recovery (log replay and token release) on the manager: \
         median {} ms, max {} ms",
        f64::from(rounds) * 60.0 / elapsed,
        secs(&to_recovered, 0.5),
        secs(&to_recovered, 1.0),
        secs(&stalls, 0.5),
        secs(&stalls, 1.0),
        stalls.len(),
        own_p99s
            .iter()
            .max()
            .copied()
            .unwrap_or_default()
            .as_secs_f64()
            * 1e3,
        shared_p99s
            .iter()
            .max()
            .copied()
            .unwrap_or_default()
            .as_secs_f64()
            * 1e3,
        replays.get(replays.len() / 2).copied().unwrap_or_default(),
        replays.last().copied().unwrap_or_default(),
    );
    // Once at the end, every name of every journal (node 0's own directory from node 0
    // only, the others from both clients too), then fsck.
    let checked = Instant::now();
    for seen_from in 0..3u32 {
        for (n, j) in journals.iter().enumerate() {
            if n != 0 || seen_from == 0 {
                check_journal(n as u32, j, &c.mount(seen_from), seen_from);
            }
        }
    }
    let checked = checked.elapsed();
    let fsck = Instant::now();
    c.finish().expect("mako down and fsck clean");
    eprintln!(
        "failover_on_mako: final check of every journal {:.1} s, mako down and fsck {:.1} s; \
         test total {:.1} s",
        checked.as_secs_f64(),
        fsck.elapsed().as_secs_f64(),
        started.elapsed().as_secs_f64()
    );
}

/// The content of node 2's file `i` in `a_survivor_that_mounts_recovers_where_the_manager_does_not`.
fn content_of(i: u32) -> Vec<u8> {
    (0..40_000u32 + i * 1_000)
        .map(|b| (b.wrapping_mul(31) ^ i) as u8)
        .collect()
}

/// A failed node is recovered on a file system the cluster manager does not mount, by
/// a survivor that mounts it (docs/cluster.md "Recovery of a failed node"). Node 0
/// (the cluster manager, the token manager and the NSD server) unmounts fs1; node 2
/// makes a directory, writes and fsyncs files in it, keeps one open, and is killed
/// (`kill -9`) while it holds their tokens. The manager expels it and asks the
/// survivors in turn; node 1, the one that mounts fs1, replays node 2's log and
/// releases its tokens (its makod.log says so, node 0's names it). Then node 1 reads
/// every fsynced byte of node 2's files and creates in its directory; node 2 restarts,
/// rejoins and sees node 1's file; `mako fsck -n` is clean. Without a survivor's
/// recovery, node 1's wait for node 2's tokens never ends and the test stops at its
/// hang guard waiting for the recovery line.
#[test]
fn a_survivor_that_mounts_recovers_where_the_manager_does_not() {
    use std::io::Write;
    let test = "a_survivor_that_mounts_recovers_where_the_manager_does_not";
    if !require_fuse(test) {
        return;
    }
    let started = Instant::now();
    let mut c = short_lease_cluster();
    let out = c
        .mako(&["fs", "unmount", "fs1", "-N", "node0"])
        .expect("mako fs unmount fs1 -N node0");
    assert!(out.success(), "unmounting fs1 on node0: {out}");
    wait_for(&c, "node0 unmounted fs1", || !is_mounted(&c.mount(0)));
    // Node 2 makes a directory and files in it, fsyncs them, keeps one open: it holds
    // their tokens (the directory's, the files' inodes and data) when it dies.
    let dir2 = c.mount(2).join("d2");
    std::fs::create_dir(&dir2).expect("mkdir d2 on node2");
    const FILES: u32 = 12;
    for i in 0..FILES {
        let mut f = std::fs::File::create(dir2.join(format!("f{i}"))).expect("create on node2");
        f.write_all(&content_of(i)).expect("write on node2");
        f.sync_all().expect("fsync on node2");
    }
    std::fs::File::open(&dir2)
        .and_then(|d| d.sync_all())
        .expect("fsync of d2 on node2");
    let held = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(dir2.join("f0"))
        .expect("node2 keeps f0 open");
    let before = c.log_lines(1).len();
    c.kill9(2).expect("kill -9 of node2");
    let killed = Instant::now();
    drop(held);
    let expelled = "node 2 expelled by node 0";
    wait_for(&c, "node 0 expels node 2", || {
        c.log_lines(0).iter().any(|l| l.contains(expelled))
    });
    // Node 1, the only survivor that mounts fs1, recovers it; node 0 logs who did.
    let here = "fs1: node 2 (lease epoch";
    wait_for(&c, "node 1 recovers node 2 on fs1", || {
        c.log_lines(1)
            .iter()
            .skip(before)
            .any(|l| l.contains(here) && l.contains(" recovered in "))
    });
    let to_recovered = killed.elapsed();
    wait_for(&c, "node 0 logs that node 1 recovered node 2", || {
        c.log_lines(0)
            .iter()
            .any(|l| l.contains(here) && l.contains("recovered by node 1"))
    });
    // The cluster manager's `mako node show` says who recovered node 2.
    wait_for(&c, "mako node show says node 1 recovered node 2", || {
        line_of(&c.node_show(), "node2").contains("recovered on fs1 by node 1")
    });
    // Node 1 reads node 2's fsynced files and creates in its directory.
    let dir1 = c.mount(1).join("d2");
    let read = Instant::now();
    for i in 0..FILES {
        let got = std::fs::read(dir1.join(format!("f{i}"))).expect("node1 reads node2's file");
        assert!(
            got == content_of(i),
            "node1 reads f{i} of {} bytes, node2 had fsynced {}",
            got.len(),
            content_of(i).len()
        );
    }
    let read = read.elapsed();
    let mut f = std::fs::File::create(dir1.join("from1")).expect("node1 creates in d2");
    f.write_all(b"node1 was here").expect("write on node1");
    f.sync_all().expect("fsync on node1");
    drop(f);
    let names = std::fs::read_dir(&dir1).expect("node1 lists d2").count();
    assert_eq!(names as u32, FILES + 1, "node1's listing of d2");
    // Node 2 comes back, rejoins, mounts, and sees node 1's file.
    c.start_stopped().expect("node2 started again");
    wait_for(&c, "node2 active again", || {
        let line = line_of(&c.node_show(), "node2");
        line.contains("active") && !line.contains("expelled")
    });
    assert!(
        is_mounted(&c.mount(2)),
        "node2 is not mounted after its restart"
    );
    assert_eq!(
        std::fs::read(c.mount(2).join("d2/from1")).expect("node2 reads node1's file"),
        b"node1 was here"
    );
    eprintln!(
        "{test}: kill -9 of node2 to its recovery by node1 (node0, the cluster manager, not \
         mounting fs1) {:.2} s; node1's reads of its {FILES} files after {:.0} ms; \
         {:.1} s in all",
        to_recovered.as_secs_f64(),
        read.as_secs_f64() * 1e3,
        started.elapsed().as_secs_f64()
    );
    c.finish().expect("mako down and fsck clean");
}
