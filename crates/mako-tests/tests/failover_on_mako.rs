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
//! name is there per the journal, and starts the node again (`mako startup -N`, in a
//! thread of its own: `NetCluster::spawn_startup`). The restart overlaps the next
//! round: node 0 and the next victim (the two clients take turns) start working at
//! once, the restarted node rejoins, mounts, checks its own journal from its mount and
//! joins in, and only then, every node having made progress, is the next victim
//! killed (a client restarting while the other one was down was seen to wait for its
//! rejoin past `mako startup`'s 30 s under load). 20 rounds per run
//! (`MAKO_FAILOVER_ROUNDS=N` for a longer one); then every journal is checked whole
//! from every node and `mako fsck -n` runs, which may find only leaked space, of frees
//! lost with a killed node (a known limit, docs/coherence.md 7a; see the end of the
//! test): `fsck -y` then repairs it and `fsck -n` must be clean. About 3 min at a load
//! average of 8-10 (4.8 min at 17-20). Not in CI yet: see the `ignore` reason. Of the
//! causes of red runs found before, ENOSPC on node 0 at about 40 % use (a node took no
//! region another node owned: docs/coherence.md section 6, "Taking a region from another
//! node") and a restarted node that did not rejoin for 30 s ("quorum lost … no answer
//! within 1ms": docs/cluster.md "Rejoin") are fixed; an ENOSPC while a node is down remains,
//! with no region steal logged (so not the regions' exhaustion), cause not found.
//!
//! `failureDetectionTime` is 5 s (its minimum, see `mako_config::spec`) and
//! `minMissedPingTimeout` 1 s, so a round lasts 7-12 s (about 6 s of it from the kill
//! to the recovery). Every wait is for a state
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

use mako_tests::cluster::{is_mounted, require_fuse, CmdOutput};
use mako_tests::netcluster::{line_of, NetCluster, NetClusterOptions, FS_NAME};
use mako_tests::workload::{
    check_journal, check_touched, percentile, work, Journal, Latencies, Timed,
};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
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

type Worker = JoinHandle<Option<std::io::Error>>;

/// The restart of a round's victim (`mako startup -N`), under way while the next
/// round runs, with the victim's worker if it was still waiting on its dead mount.
/// Declared after the cluster, so a failed test drops it first: its `Drop` waits for
/// the start to end before the cluster's cleanup stops every node.
struct Restart {
    node: u32,
    start: Option<JoinHandle<anyhow::Result<CmdOutput>>>,
    worker: Option<Worker>,
    began: Instant,
}

impl Drop for Restart {
    fn drop(&mut self) {
        if let Some(h) = self.start.take() {
            let _ = h.join();
        }
    }
}

/// Ends `r` once its `mako startup` returned: the node is active again (not
/// expelled), mounted, and sees what it acknowledged before its kill (its worker's
/// journal, checked from node 0 too if that worker only ended with the restart); that
/// journal's names touched so far are then settled (every view of them was checked:
/// the survivors' in the round of the kill). Returns how long the restart took, to
/// the node active and checked.
fn rejoined(c: &NetCluster, mut r: Restart, journals: &[Arc<Mutex<Journal>>]) -> Duration {
    let n = r.node;
    let h = r.start.take().expect("a restart under way");
    let out = h
        .join()
        .expect("the restart's thread panicked")
        .unwrap_or_else(|e| panic!("mako startup -N node{n}: {e:#}"));
    assert!(
        out.success(),
        "mako startup -N node{n}: {out}\n{}",
        c.logs_tail(15)
    );
    wait_for(c, &format!("node{n} active again"), || {
        let line = line_of(&c.node_show(), &format!("node{n}"));
        line.contains("active") && !line.contains("expelled")
    });
    assert!(
        is_mounted(&c.mount(n)),
        "node {n} is not mounted after its restart"
    );
    let j = &journals[n as usize];
    if let Some(w) = r.worker.take() {
        w.join().expect("the victim's worker panicked");
        eprintln!(
            "node {n}'s worker was still waiting on its dead mount when the survivors were \
             checked; it ended with the restart"
        );
        check_touched(n, j, &c.mount(0), 0);
    }
    check_touched(n, j, &c.mount(n), n);
    j.lock().unwrap().settle_touched();
    r.began.elapsed()
}

/// Frees the nodes sent to another node that did not answer and then abandoned
/// (`mako_fs::ownership`'s warning): extents and inode numbers, over every node's log.
fn abandoned_frees(c: &NetCluster) -> (usize, usize) {
    let (mut extents, mut numbers) = (0, 0);
    for i in 0..3 {
        for l in c.log_lines(i) {
            if !l.contains("freed in another node's space were sent to") {
                continue;
            }
            let Some(at) = l.find(" extents and ") else {
                continue;
            };
            let count = |s: Option<&str>| -> usize {
                s.and_then(|v| v.parse().ok())
                    .unwrap_or_else(|| panic!("an abandoned free's count in {l:?}"))
            };
            extents += count(l[..at].rsplit(' ').next());
            numbers += count(l[at + " extents and ".len()..].split(' ').next());
        }
    }
    (extents, numbers)
}

#[test]
#[ignore = "not in CI: 1 of 3 runs of the final code of 2026-11-29 was red (two CI runs \
            green in 184-188 s; a local run met ENOSPC on node 0's workload in round 15 \
            while node 2 was down, a second one in round 26 of 30; no node logged a region \
            steal or ran out of regions, so the cause is another NoSpace, not found yet); \
            run with --ignored"]
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
    let started = Instant::now();
    let mut c = short_lease_cluster();
    let up = started.elapsed();
    let mounts: Vec<PathBuf> = (0..3).map(|n| c.mount(n)).collect();
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
    let mut restarts = Vec::new();
    // The last round's victim, starting while this round runs (after `c`: dropped
    // first).
    let mut restart: Option<Restart> = None;
    for round in 0..rounds {
        let victim = 1 + round % 2;
        // The other client: the last round's victim, maybe still starting.
        let survivor = 3 - victim;
        let t0 = Instant::now();
        let stop = Arc::new(AtomicBool::new(false));
        let lat: Vec<Latencies> = (0..3).map(|_| Latencies::default()).collect();
        let spawn_worker = |n: u32| -> Worker {
            let (m, j, s, st, l) = (
                mounts[n as usize].clone(),
                journals[n as usize].clone(),
                seqs[n as usize].clone(),
                stop.clone(),
                lat[n as usize].clone(),
            );
            std::thread::spawn(move || work(n, m, j, s, st, l, t0))
        };
        // Node 0 and the victim work at once; the other client, the last round's
        // victim, joins in once it is back: its restart, under way since the end of
        // the last round, overlaps their work.
        let mut workers: Vec<Option<Worker>> = (0..3u32)
            .map(|n| (restart.as_ref().map(|r| r.node) != Some(n)).then(|| spawn_worker(n)))
            .collect();
        let progress = Instant::now();
        let base: Vec<u64> = journals.iter().map(|j| j.lock().unwrap().ops).collect();
        let mut restarted = None;
        if let Some(r) = restart.take() {
            let n = r.node;
            let took = rejoined(&c, r, &journals);
            restarts.push(took);
            restarted = Some(took);
            workers[n as usize] = Some(spawn_worker(n));
        }
        // Mid-workload: every node acknowledged a few operations this round. (The
        // victim is killed only once the other client is back: a client restarting
        // while the other one is down was seen to wait for its rejoin for more than
        // `mako startup`'s 30 s on this loaded machine — its first try at the rejoin
        // failed, "no answer within 1ms" from the quorum node —, and the survivors'
        // checks want both views.)
        wait_for(&c, "every node's workload makes progress", || {
            journals
                .iter()
                .zip(&base)
                .all(|(j, b)| j.lock().unwrap().ops >= b + 3)
        });
        let progress = progress.elapsed();
        // The victim's file a survivor will wait for: one it wrote and fsynced, so it
        // may still hold its tokens.
        let probe = journals[victim as usize].lock().unwrap().last_written();
        let recovered_before = recoveries(&c, victim).len();
        // No abort of the victim's FUSE connection here: a makod that cannot finish
        // exiting (stuck in the kernel on its connection) is the restart's to clean
        // up (`mako startup` aborts a connection of a dead makod that does not answer).
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
                    c.telling_lines()
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
        // kept open ends when makod's FUSE guard, or `mako startup`, aborts it).
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
        let checks = Instant::now();
        for seen_from in [0, survivor] {
            for (n, j) in journals.iter().enumerate() {
                if (n as u32 != victim || victim_done) && (n != 0 || seen_from == 0) {
                    check_touched(n as u32, j, &c.mount(seen_from), seen_from);
                }
            }
        }
        // Every view of what the survivors touched was checked; the victim's journal
        // is settled once it has seen it itself, after its restart.
        for n in [0, survivor] {
            journals[n as usize].lock().unwrap().settle_touched();
        }
        let checks = checks.elapsed();
        // No survivor was expelled.
        let show = c.node_show();
        assert!(
            !line_of(&show, "node0").contains("expelled")
                && !line_of(&show, &format!("node{survivor}")).contains("expelled"),
            "round {round}: a survivor was expelled:\n{show}"
        );
        // The victim comes back, rejoins and mounts while the next round runs.
        restart = Some(Restart {
            node: victim,
            start: Some(c.spawn_startup(victim).expect("the victim's restart")),
            worker: workers[victim as usize].take(),
            began: Instant::now(),
        });
        let ms = |d: Option<Duration>| {
            d.map(|d| format!("{:.0} ms", d.as_secs_f64() * 1e3))
                .unwrap_or_else(|| "-".into())
        };
        let s1 = |d: Option<Duration>| {
            d.map(|d| format!("{:.1} s", d.as_secs_f64()))
                .unwrap_or_else(|| "-".into())
        };
        eprintln!(
            "round {round}: node {victim} killed; expel seen after {:.1} s, recovered after \
             {:.1} s (replay {}), survivor's read of its file stalled {}; survivors' p99 \
             during recovery: node 0's own directory {} (slowest: {}), directories the victim \
             may hold tokens of {}; round {:.1} s (workload progress, beside node \
             {survivor}'s restart, {:.1} s; kill to recovered {:.1} s; survivors' checks \
             {:.1} s); node {survivor}'s restart to active and checked {}",
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
            recovered_after.as_secs_f64(),
            checks.as_secs_f64(),
            s1(restarted),
        );
    }
    // The last victim comes back.
    if let Some(r) = restart.take() {
        restarts.push(rejoined(&c, r, &journals));
    }
    let ops: u64 = journals.iter().map(|j| j.lock().unwrap().ops).sum();
    let secs = |v: &[Duration], p: f64| percentile(v.to_vec(), p).as_secs_f64();
    replays.sort();
    let elapsed = started.elapsed().as_secs_f64();
    eprintln!(
        "failover_on_mako: {rounds} kill -9 rounds in {elapsed:.1} s ({:.2} rounds/min; \
         cluster up {:.1} s), {ops} operations acknowledged; failureDetectionTime \
         {FAILURE_DETECTION_S} s, minMissedPingTimeout {MISSED_PING_S} s; kill -9 to recovery \
         done: median {:.2} s, max {:.2} s; recovery stall (kill -9 to a survivor's read of \
         the victim's file) median {:.2} s, max {:.2} s over {} probes; survivors' p99 during \
         recovery, worst round: node 0's own directory (no other node reads it) {:.1} ms, \
         directories the victim may hold tokens of {:.1} ms; recovery (log replay and token \
         release) on the manager: median {} ms, max {} ms; restart of a victim (mako startup \
         to active and checked, beside the next round): median {:.1} s, max {:.1} s",
        f64::from(rounds) * 60.0 / elapsed,
        up.as_secs_f64(),
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
        secs(&restarts, 0.5),
        secs(&restarts, 1.0),
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
    c.down().expect("mako down");
    let fsck_n = c.mako(&["fsck", FS_NAME, "-n"]).expect("mako fsck -n");
    let (leaked_runs, unlinked) = if fsck_n.success() {
        (0, 0)
    } else {
        // What fsck may find: space whose free, handed from one node to another, was
        // lost with a killed node, which no node sends again (docs/coherence.md 7a,
        // "Space the failed node freed in other nodes' regions…", and "The receiver's
        // memory is not durable"): frees a victim had queued for another node's space
        // and not delivered, which nothing on disk records (`block_leaked`, and
        // `unlinked_inode` of a 0-byte file for an inode number freed after its
        // transaction left the log); and frees a survivor sent to a victim that was
        // killed before it answered, which the survivor abandons (the victim may have
        // applied them, so another receiver must not; logged, counted below). Leaked
        // space, never a block two files share, a name without its file or a wrong
        // count: fsck's other findings, which fail here.
        let (mut runs, mut inos) = (0usize, 0usize);
        for l in fsck_n.stdout.lines().filter(|l| l.starts_with('[')) {
            if l.starts_with("[unlinked_inode]") && l.contains("file of 0 bytes") {
                inos += 1;
            } else if l.starts_with("[block_leaked]") {
                runs += 1;
            } else {
                panic!("fsck -n: {l}\n{fsck_n}\n{}", c.telling_lines());
            }
        }
        let (extents, numbers) = abandoned_frees(&c);
        eprintln!(
            "failover_on_mako: fsck -n found {runs} leaked runs of blocks and {inos} unlinked \
             0-byte inodes; the survivors abandoned frees of {extents} extents and {numbers} \
             inode numbers sent to a victim that died before it answered"
        );
        let fix = c.mako(&["fsck", FS_NAME, "-y"]).expect("mako fsck -y");
        // Exit 1: errors corrected, the file system is consistent.
        assert!(fix.code == Some(1), "fsck -y: {fix}");
        (runs, inos)
    };
    c.fsck().expect("fsck -n clean");
    eprintln!(
        "failover_on_mako: final check of every journal {:.1} s, mako down and fsck {:.1} s \
         (space of frees abandoned with a victim, reclaimed by fsck -y: {unlinked} inodes, \
         {leaked_runs} runs of blocks); test total {:.1} s",
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
