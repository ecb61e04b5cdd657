//! Recovery of a failed node (issue 14, docs/coherence.md "Recovery of a failed
//! node"): in every seed one node (not node 0, which hosts the token manager)
//! crashes at a random point of a random step — its I/O stops at once, even a write
//! under way, and nothing it sends or is sent arrives — and a survivor recovers it
//! (`mako_fs::recovery::recover_failed_node`: replay of its log, then its tokens
//! released); in half the seeds it mounts again a few steps later and must replay
//! nothing. The model knows what the crashed node made durable (it syncs at the end
//! of the step before the crash) and what it may have lost (its operations of the
//! crash step, run again on the survivor: `runner::CrashPlan`). Checked: every
//! outcome against the model (other nodes' operations that need the crashed node's
//! tokens wait for the recovery and then succeed), the invariants after every step,
//! the final read-back on every mounted node, replay in both orders, fsck clean.
//!
//! `MAKO_SIM_SEEDS`, `MAKO_SIM_SEED_BASE`, `MAKO_SIM_NODES`, `MAKO_SIM_JOBS`,
//! `MAKO_SIM_STEPS` and `MAKO_SIM_LONG=1` (ten times the seeds) choose the seeds; a
//! failing seed prints the command that replays it.

use mako_sim::cluster::RecoveryFault;
use mako_sim::runner::{run_seeds, FaultKind, SeedPlan};
use mako_sim::{run_seed, SeedConfig, SeedFailure, SimCluster};
use parking_lot::Mutex;
use std::sync::Arc;

use mako_fs::fs::{Ctx, ROOT_INO};

/// The caller of the hand-written scenarios below.
const C: Ctx = Ctx {
    uid: 0,
    gid: 0,
    pid: 1,
};

/// Steps per seed (the setup and the final read-back come on top).
fn steps() -> u32 {
    std::env::var("MAKO_SIM_STEPS")
        .ok()
        .map_or(12, |v| v.parse().expect("MAKO_SIM_STEPS is a number"))
}

fn config(seed: u64, nodes: u32, fault: RecoveryFault) -> SeedConfig {
    let mut c = SeedConfig::new(seed, nodes);
    c.steps = steps();
    c.crash = true;
    c.recovery_fault = fault;
    c
}

fn run(test: &str, plan: SeedPlan) {
    run_kind(test, plan, FaultKind::Crash);
}

fn run_kind(test: &str, plan: SeedPlan, kind: FaultKind) {
    let nodes = plan.nodes;
    let summary = run_seeds(&plan, true, |seed| {
        let mut c = config(seed, nodes, RecoveryFault::None);
        c.fault_kinds = vec![kind];
        c
    });
    summary.report(
        "recovery",
        test,
        nodes,
        "nodes with a crash and a recovery each",
        false,
    );
    assert_eq!(summary.seeds, plan.count, "every seed ran");
}

/// 24 seeds of two nodes (about 40 s on a loaded 2-core machine; `MAKO_SIM_LONG=1`
/// runs ten times as many).
#[test]
fn crash_and_recover_two_nodes() {
    run("crash_and_recover_two_nodes", SeedPlan::from_env(24, 2));
}

/// 10 seeds of three nodes (a crashed node may be a metanode another node writes
/// through, or own regions a third node frees in).
#[test]
fn crash_and_recover_three_nodes() {
    run("crash_and_recover_three_nodes", SeedPlan::from_env(10, 3));
}

/// Node 0 crashes with the token manager: node 1 takes it over and rebuilds its table
/// from the survivors' held tokens (docs/coherence.md section 7b), a survivor
/// recovers node 0; the same checks as for any crash (12 seeds of three nodes and 12
/// of two; `MAKO_SIM_LONG=1` ten times as many).
#[test]
fn the_token_manager_moves_off_a_crashed_node_three_nodes() {
    run_kind(
        "the_token_manager_moves_off_a_crashed_node_three_nodes",
        SeedPlan::from_env(12, 3),
        FaultKind::ManagerCrash,
    );
}

#[test]
fn the_token_manager_moves_off_a_crashed_node_two_nodes() {
    run_kind(
        "the_token_manager_moves_off_a_crashed_node_two_nodes",
        SeedPlan::from_env(12, 2),
        FaultKind::ManagerCrash,
    );
}

/// Seeds tried before the checker is declared blind to a broken recovery.
const SEEDS_MAX: u64 = 30;

/// The first seed whose run fails with `fault` in the recovery, and its failure.
fn first_caught(fault: RecoveryFault) -> (u64, SeedFailure) {
    first_caught_in(fault, FaultKind::Crash, 2)
}

fn first_caught_in(fault: RecoveryFault, kind: FaultKind, nodes: u32) -> (u64, SeedFailure) {
    for seed in 1..=SEEDS_MAX {
        let mut c = config(seed, nodes, fault);
        c.fault_kinds = vec![kind];
        if let Err(f) = run_seed(&c) {
            return (seed, f);
        }
    }
    panic!("{fault:?} was not caught in {SEEDS_MAX} seeds");
}

/// A token manager taken over from crashed node 0 that does not ask the survivors
/// what they hold grants their tokens again: caught (two nodes believe they hold
/// conflicting tokens, or one more than the table records).
#[test]
fn a_rebuild_without_reports_is_caught() {
    let (seed, failure) = first_caught_in(
        RecoveryFault::RebuildWithoutReports,
        FaultKind::ManagerCrash,
        3,
    );
    eprintln!("caught at seed {seed}: {failure}");
    assert!(!failure.message.contains("panicked"), "{failure}");
    let mut c = config(seed, 3, RecoveryFault::None);
    c.fault_kinds = vec![FaultKind::ManagerCrash];
    run_seed(&c).unwrap_or_else(|f| panic!("seed {seed} fails without the fault too: {f}"));
}

/// A recovery that releases the failed node's tokens without replaying its log: what
/// it had committed but not written in place is lost, and the other nodes read the
/// older copies.
#[test]
fn a_recovery_without_log_replay_is_caught() {
    let (seed, failure) = first_caught(RecoveryFault::SkipReplay);
    eprintln!("caught at seed {seed}: {failure}");
    assert!(!failure.message.contains("panicked"), "{failure}");
    run_seed(&config(seed, 2, RecoveryFault::None))
        .unwrap_or_else(|f| panic!("seed {seed} fails without the fault too: {f}"));
}

/// A recovery that replays the log but never releases the failed node's tokens:
/// operations that need them wait until they give up.
#[test]
fn a_recovery_without_token_release_is_caught() {
    let (seed, failure) = first_caught(RecoveryFault::SkipTokenRelease);
    eprintln!("caught at seed {seed}: {failure}");
    assert!(!failure.message.contains("panicked"), "{failure}");
    run_seed(&config(seed, 2, RecoveryFault::None))
        .unwrap_or_else(|f| panic!("seed {seed} fails without the fault too: {f}"));
}

/// A survivor replays a full log: node 1 fills its log (transactions of 50 creates
/// with an xattr each, every directory fsynced, no checkpoint), creates one more
/// file it never syncs, and crashes. Before the recovery, node 0 lists one of node 1's
/// directories (it needs node 1's token: it waits) and creates a file in its own
/// directory (it needs nothing of node 1's: it does not wait). Node 0 then recovers
/// node 1: the listing completes with every fsynced name, nothing unsynced appears,
/// and node 1, mounting again, replays nothing. Prints the replay's figures
/// (simulated time, log size).
#[test]
fn a_survivor_replays_a_full_log() {
    use std::time::Duration;
    let (cluster, r) = two_mounted_nodes(
        1,
        move |cluster, fs0, fs1| {
            let mine = fs0
                .mkdir(C, ROOT_INO, b"zero", 0o755, 0)
                .map_err(e("mkdir"))?;
            fs0.fsync(mine.ino, false).map_err(e("fsync"))?;
            let core = fs1.core.clone();
            let cap = core.journal.capacity();
            let checkpoints = || {
                core.journal
                    .stats
                    .checkpoints
                    .load(std::sync::atomic::Ordering::Relaxed)
            };
            let mut dirs = Vec::new();
            while core.journal.used_bytes() < cap * 8 / 10 && checkpoints() == 0 {
                let n = dirs.len();
                let d = fs1
                    .mkdir(C, ROOT_INO, format!("d{n}").as_bytes(), 0o755, 0)
                    .map_err(e("mkdir"))?;
                for k in 0..50u32 {
                    let a = fs1
                        .create(C, d.ino, format!("f{k}").as_bytes(), 0o644, 0, true)
                        .map_err(e("create"))?;
                    fs1.setxattr(a.ino, b"user.k", &k.to_le_bytes(), 0)
                        .map_err(e("setxattr"))?;
                }
                fs1.fsync(d.ino, false).map_err(e("fsync"))?;
                dirs.push(d.ino);
            }
            if checkpoints() > 0 {
                return Err("the log checkpointed before it was full".into());
            }
            let used = core.journal.used_bytes();
            // Never synced: may be lost (it is: the crash comes first).
            fs1.create(C, dirs[0], b"unsynced", 0o644, 0, true)
                .map_err(e("create"))?;
            cluster.crash(1);
            let t = |c: &SimCluster| mako_rt::Clock::monotonic(c.clock.as_ref());
            let crashed_at = t(&cluster);
            // Node 0, before the recovery: a listing of node 1's directory waits
            // for it; a create in its own directory does not.
            let listing: Arc<Mutex<Option<(Duration, usize)>>> = Arc::new(Mutex::new(None));
            {
                let (cluster, listing, d) = (cluster.clone(), listing.clone(), dirs[0]);
                let fs0 = fs0.clone();
                mako_sim::current().unwrap().spawn("listing", move || {
                    let n = fs0.readdir(d, 0, 1000).map(|v| v.len()).unwrap_or(0);
                    *listing.lock() = Some((t(&cluster), n));
                });
            }
            fs0.create(C, mine.ino, b"own", 0o644, 0, true)
                .map_err(e("create in node 0's own directory"))?;
            let own_done = t(&cluster);
            mako_diag::sched::sleep(Duration::from_millis(5));
            if listing.lock().is_some() {
                return Err(
                    "node 0's listing of node 1's directory did not wait for the recovery".into(),
                );
            }
            let started = t(&cluster);
            let rep =
                mako_fs::recovery::recover_failed_node(&fs0.core, 1).map_err(e("recovery"))?;
            let recovered = t(&cluster);
            mako_diag::sched::wait_until("listing", || listing.lock().is_some());
            let (listed_at, names) = listing.lock().unwrap();
            // ".", ".." and the 50 fsynced names; not the unsynced one.
            if names != 52 {
                return Err(format!(
                    "node 0 listed {names} entries of d0 after the recovery, not 52"
                ));
            }
            if own_done >= started || listed_at < recovered {
                return Err(format!(
                "the create in node 0's own directory ended at {own_done:?} (recovery began {started:?}), \
                 the listing of node 1's directory at {listed_at:?} (recovery ended {recovered:?})"
            ));
            }
            for (n, d) in dirs.iter().enumerate() {
                let got = fs0.readdir(*d, 0, 1000).map_err(e("readdir"))?.len();
                if got != 52 {
                    return Err(format!("d{n}: {got} entries after the recovery, not 52"));
                }
            }
            let again = cluster.rejoin(1).map_err(e("rejoin"))?;
            if again.transactions > 0 {
                return Err(format!(
                    "node 1 replayed its log again: {}",
                    again.summary()
                ));
            }
            cluster.unmount(1).map_err(e("unmount 1"))?;
            cluster.unmount(0).map_err(e("unmount 0"))?;
            Ok(format!(
            "node 0 replayed node 1's full log ({:.2} of {:.2} MiB in use, {} transactions, {} images, {:.2} MiB written in place) \
             in {:?} simulated ({} ms real); crash to recovery start {:?} (the test's detection delay)",
            used as f64 / (1 << 20) as f64,
            cap as f64 / (1 << 20) as f64,
            rep.replay.transactions,
            rep.replay.images,
            rep.replay.image_bytes as f64 / (1 << 20) as f64,
            recovered - started,
            rep.replay.duration.as_millis(),
            started - crashed_at,
        ))
        },
        |f| panic!("{}", f),
    );
    match r {
        Ok(line) => eprintln!("{line}"),
        Err(e) => panic!("{e}"),
    }
    cluster.fsck().unwrap_or_else(|e| panic!("{e}"));
}

/// A shared writer of a directory dies between its log commit of a new entry's page
/// and the metanode's merge of the entry count it sends after (the window is opened
/// for good by `Core::counts_unsent`: the count is never sent): the replay brings the
/// entry back, and the survivor's recovery recounts the directory, so the count is
/// exact (docs/coherence.md section 4, "Entry and link counts"). Without the recount
/// fsck finds the directory's count one below its entries.
#[test]
fn a_crash_between_a_page_commit_and_its_count_is_recounted() {
    // Whether node 1 becomes a shared writer beside node 0 depends on the schedule (the
    // token manager's turn notices changed it for seed 1): the first seeds that set
    // the scene are run; at least one must.
    let mut setups = Vec::new();
    for seed in 1..=24 {
        match count_recount_seed(seed) {
            Ok(line) => {
                eprintln!("seed {seed}: {line}");
                return;
            }
            Err(setup) => setups.push(format!("seed {seed}: {setup}")),
        }
    }
    panic!(
        "no seed set the scene (node 1 a shared writer of the directory):\n{}",
        setups.join("\n")
    );
}

/// One seed of `a_crash_between_a_page_commit_and_its_count_is_recounted`: the recovery
/// summary, or `Err` when the seed's schedule did not make node 1 a shared writer (a
/// failure of what is tested panics).
fn count_recount_seed(seed: u64) -> Result<String, String> {
    const SETUP: &str = "setup: ";
    let (cluster, r) = two_mounted_nodes(
        seed,
        move |cluster, fs0, fs1| {
            // A directory leaves its inode as soon as another node waits for it
            // (`directory::CROWD_NODES` 1): node 1 then writes in it beside node 0.
            for fs in [&fs0, &fs1] {
                fs.core
                    .crowd_nodes
                    .store(1, std::sync::atomic::Ordering::Relaxed);
            }
            let d = fs0
                .mkdir(C, ROOT_INO, b"shared", 0o755, 0)
                .map_err(e("mkdir"))?;
            // Node 0 creates in the directory all along, so that node 1's creates
            // get the directory inode in `rw` beside it (a node alone in it gets
            // `xw`) and node 1 becomes a shared writer.
            let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
            let made0: Arc<Mutex<Result<u64, String>>> = Arc::new(Mutex::new(Ok(0)));
            {
                let (fs0, stop, made0, dir) = (fs0.clone(), stop.clone(), made0.clone(), d.ino);
                mako_sim::current()
                    .unwrap()
                    .spawn("node 0 creates", move || {
                        let mut k = 0u64;
                        while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                            if let Err(x) =
                                fs0.create(C, dir, format!("a{k}").as_bytes(), 0o644, 0, true)
                            {
                                *made0.lock() = Err(format!("node 0's create a{k}: {x}"));
                                return;
                            }
                            k += 1;
                            *made0.lock() = Ok(k);
                        }
                    });
            }
            let shared = |fs: &mako_fs::fs::FileSystem| {
                fs.core
                    .cached_handle(d.ino)
                    .is_some_and(|h| h.state.read().shared.is_some())
            };
            // Node 0 is the directory's metanode when node 1 comes.
            mako_diag::sched::wait_until("node 0's first create", || {
                made0.lock().as_ref().map_or(true, |k| *k > 0)
            });
            let mut made1 = 0u64;
            while !shared(&fs1) {
                if made1 == 500 {
                    stop.store(true, std::sync::atomic::Ordering::SeqCst);
                    return Err(format!(
                        "{SETUP}node 1 never became a shared writer of the directory in \
                     500 creates"
                    ));
                }
                fs1.create(C, d.ino, format!("b{made1}").as_bytes(), 0o644, 0, true)
                    .map_err(e("create on node 1"))?;
                made1 += 1;
            }
            fs1.core
                .counts_unsent
                .store(true, std::sync::atomic::Ordering::Relaxed);
            fs1.create(C, d.ino, b"c", 0o644, 0, true)
                .map_err(e("create c on node 1"))?;
            if !shared(&fs1) {
                return Err("node 1 was no longer a shared writer after its create of c".into());
            }
            cluster.crash(1);
            let mut rep =
                mako_fs::recovery::recover_failed_node(&fs0.core, 1).map_err(e("recovery"))?;
            mako_fs::recovery::recount_after(&fs0.core, &mut rep);
            stop.store(true, std::sync::atomic::Ordering::SeqCst);
            if !rep.recount_failed.is_empty() {
                return Err(format!("recount failed: {}", rep.summary()));
            }
            if !rep.recount_fixed.iter().any(|(ino, _, _)| *ino == d.ino) {
                return Err(format!(
                    "the recovery did not fix the directory's count (the window was not hit?): {}",
                    rep.summary()
                ));
            }
            mako_diag::sched::sleep(std::time::Duration::from_millis(50));
            let made0 = made0.lock().clone()?;
            let names = fs0.readdir(d.ino, 0, 100_000).map_err(e("readdir"))?.len() as u64;
            // ".", "..", node 0's (the last may or may not have been made when it
            // stopped), node 1's and c: c's page was committed before the crash.
            let want = 2 + made0 + made1 + 1;
            if names != want && names != want + 1 {
                return Err(format!(
                    "node 0 listed {names} entries after the recovery, not {want} \
                 ({made0} of node 0, {made1} of node 1, and c)"
                ));
            }
            cluster.rejoin(1).map_err(e("rejoin"))?;
            cluster.unmount(1).map_err(e("unmount 1"))?;
            cluster.unmount(0).map_err(e("unmount 0"))?;
            Ok(rep.summary())
        },
        |f| panic!("seed {seed}: {}", f),
    );
    match r {
        Ok(line) => {
            cluster
                .fsck()
                .unwrap_or_else(|e| panic!("seed {seed}: {e}"));
            Ok(line)
        }
        Err(e) if e.starts_with(SETUP) => Err(e),
        Err(e) => panic!("seed {seed}: {e}"),
    }
}

/// A seed with a crash, a recovery and a rejoin is a function of its seed too.
#[test]
fn a_crash_seed_replays_bit_for_bit() {
    let seed = (1..50)
        .find(|s| {
            mako_sim::runner::CrashPlan::draw(&config(*s, 3, RecoveryFault::None))
                .is_some_and(|c| c.rejoin.is_some())
        })
        .expect("a seed whose crashed node rejoins");
    let a = run_seed(&config(seed, 3, RecoveryFault::None)).unwrap_or_else(|f| panic!("{f}"));
    let b = run_seed(&config(seed, 3, RecoveryFault::None)).unwrap_or_else(|f| panic!("{f}"));
    assert_eq!(a.trace(), b.trace(), "scheduler traces differ");
    assert_eq!(a.digest, b.digest, "outcomes differ");
    assert_eq!(a.net, b.net);
}

/// What a failed node leaves allocated with no name, which its survivor's recovery
/// must free (`mako_fs::recovery::reclaim_orphans`).
#[derive(Clone, Copy, Debug)]
enum Orphan {
    /// A file it unlinked while it still had it open (POSIX keeps it until its last
    /// close, which never comes).
    OpenUnlinked,
    /// An `O_TMPFILE` file it had open.
    Tmpfile,
    /// A small file of node 0 (its number in node 0's inode-map segment, its data in
    /// its inode) that it unlinked and freed: the free waits in its memory for its log's checkpoint before it goes to
    /// node 0 (`ownership::deliver_frees`), so its crash leaves the number in use with
    /// a blank, linkless inode — fsck's "file of 0 bytes is in use but has no links"
    /// of the kill -9 rounds.
    ForeignFree,
}

/// Node 1 leaves an orphan of `kind`, its log committed, and crashes; node 0 recovers
/// it (replay, token release, then `recount_after`, which frees orphans); node 1
/// rejoins; both unmount; fsck must be clean. Without the reclaim fsck finds
/// `unlinked_inode`.
fn orphan_of_a_failed_node(kind: Orphan) -> Result<String, String> {
    let (cluster, r) = two_mounted_nodes(
        7,
        move |cluster, fs0, fs1| {
            let d = fs0.mkdir(C, ROOT_INO, b"d", 0o755, 0).map_err(e("mkdir"))?;
            fs0.fsync(d.ino, false).map_err(e("fsync d"))?;
            let data = vec![7u8; 200_000];
            let ino = match kind {
                Orphan::OpenUnlinked => {
                    let a = fs1
                        .create(C, d.ino, b"f", 0o644, 0, true)
                        .map_err(e("create"))?;
                    fs1.open(a.ino).map_err(e("open"))?;
                    fs1.write(a.ino, 0, &data, false).map_err(e("write"))?;
                    fs1.fsync(a.ino, false).map_err(e("fsync f"))?;
                    // Node 0's kernel knows the file too (it read it): a lookup
                    // without an open does not keep it after node 1 is gone.
                    fs0.lookup(d.ino, b"f").map_err(e("lookup on node 0"))?;
                    fs0.add_lookup(a.ino);
                    fs1.unlink(d.ino, b"f").map_err(e("unlink"))?;
                    a.ino
                }
                Orphan::Tmpfile => {
                    let a = fs1.tmpfile(C, d.ino, 0o644, 0).map_err(e("tmpfile"))?;
                    fs1.open(a.ino).map_err(e("open"))?;
                    fs1.write(a.ino, 0, &data, false).map_err(e("write"))?;
                    fs1.fsync(a.ino, false).map_err(e("fsync tmpfile"))?;
                    a.ino
                }
                Orphan::ForeignFree => {
                    // Small enough to live in its inode: space freed in other nodes'
                    // regions is not covered (see `reclaim_orphans`).
                    let a = fs0
                        .create(C, d.ino, b"g", 0o644, 0, true)
                        .map_err(e("create"))?;
                    fs0.write(a.ino, 0, &data[..100], false)
                        .map_err(e("write"))?;
                    fs0.fsync(a.ino, false).map_err(e("fsync g"))?;
                    fs1.unlink(d.ino, b"g").map_err(e("unlink on node 1"))?;
                    a.ino
                }
            };
            fs1.fsync(d.ino, false).map_err(e("fsync d on node 1"))?;
            cluster.crash(1);
            let mut rep =
                mako_fs::recovery::recover_failed_node(&fs0.core, 1).map_err(e("recovery"))?;
            if !rep.replay.orphans.contains_key(&ino) {
                return Err(format!(
                    "{kind:?}: the replay of node 1's log did not find inode {ino} as an \
                 orphan: {:?}",
                    rep.replay.orphans
                ));
            }
            mako_fs::recovery::recount_after(&fs0.core, &mut rep);
            if rep.reclaimed != vec![ino] || !rep.reclaim_failed.is_empty() {
                return Err(format!(
                    "{kind:?}: inode {ino} not freed: {}",
                    rep.summary()
                ));
            }
            // Node 0's kernel lets its lookup go: nothing left to free.
            fs0.forget(ino, 1);
            cluster.rejoin(1).map_err(e("rejoin"))?;
            cluster.unmount(1).map_err(e("unmount 1"))?;
            cluster.unmount(0).map_err(e("unmount 0"))?;
            Ok(rep.summary())
        },
        |f| panic!("{kind:?}: {}", f),
    );
    let line = r?;
    cluster.fsck().map_err(|e| format!("{kind:?}: {e}"))?;
    Ok(line)
}

/// A failed node's orphans — a file it unlinked while open, an `O_TMPFILE` file, an
/// inode number it freed in another node's segment and had not handed over yet — are
/// freed by the survivor that recovers it: fsck is clean after. Without
/// `reclaim_orphans` fsck finds `unlinked_inode` in each case.
#[test]
fn a_failed_nodes_orphans_are_freed_by_its_recovery() {
    for kind in [Orphan::OpenUnlinked, Orphan::Tmpfile, Orphan::ForeignFree] {
        match orphan_of_a_failed_node(kind) {
            Ok(line) => eprintln!("{kind:?}: {line}"),
            Err(e) => panic!("{e}"),
        }
    }
}

/// Two survivors recover one failed node at once (the cluster manager's choice and a
/// mount, say): node 2 writes and fsyncs, crashes, and nodes 0 and 1 each run
/// `recover_failed_node(2)` on a task of their own. The claim on node 2's log (its
/// `RecoveryLog` token) makes them take turns: exactly one replays the transactions,
/// the other finds the log empty. Without the claim both scan the log before either
/// empties it, and both replay (in most of these seeds), which could lay an old
/// image over what a third node wrote after the first released node 2's tokens.
fn two_recoveries_at_once(seed: u64) -> Result<String, String> {
    use mako_sim::{ClusterConfig, Sim, SimConfig};
    let sim = Sim::new(seed, SimConfig::default());
    let mut cc = ClusterConfig::small(3);
    cc.thief = mako_sim::Thief::Off;
    let cluster = SimCluster::new(&sim, cc).expect("cluster");
    let setup: Arc<Mutex<Option<Result<(), String>>>> = Arc::new(Mutex::new(None));
    // Per recovery: (node that ran it, transactions it replayed), or what failed.
    type Replays = Arc<Mutex<Vec<Result<(u32, u64), String>>>>;
    let replays: Replays = Arc::default();
    {
        let (cluster, setup, replays, sim2) =
            (cluster.clone(), setup.clone(), replays.clone(), sim.clone());
        sim.spawn_task("driver", move || {
            let r = (|| -> Result<(), String> {
                for n in 0..3 {
                    cluster.mount(n).map_err(e("mount"))?;
                }
                let fs2 = cluster.fs(2).unwrap();
                let d = fs2.mkdir(C, ROOT_INO, b"d", 0o755, 0).map_err(e("mkdir"))?;
                for i in 0..8u8 {
                    let a = fs2
                        .create(C, d.ino, &[b'f', b'0' + i], 0o644, 0, true)
                        .map_err(e("create"))?;
                    fs2.write(a.ino, 0, &vec![i; 20_000], false)
                        .map_err(e("write"))?;
                    fs2.fsync(a.ino, false).map_err(e("fsync"))?;
                }
                fs2.fsync(d.ino, false).map_err(e("fsync d"))?;
                cluster.crash(2);
                for by in [0u32, 1] {
                    let (fs, replays, cluster) =
                        (cluster.fs(by).unwrap(), replays.clone(), cluster.clone());
                    sim2.spawn_task(format!("recover-by-{by}"), move || {
                        let r = mako_fs::recovery::recover_failed_node(&fs.core, 2)
                            .map(|rep| (by, rep.replay.transactions))
                            .map_err(|x| format!("node {by} recovering node 2: {x}"));
                        let mut got = replays.lock();
                        got.push(r);
                        if got.len() < 2 {
                            return;
                        }
                        drop(got);
                        // The last one done: node 2 rejoins, every node unmounts.
                        let end = |what: String, r: mako_fs::error::FsResult<()>| {
                            if let Err(x) = r {
                                replays.lock().push(Err(format!("{what}: {x}")));
                            }
                        };
                        end("rejoin of node 2".into(), cluster.rejoin(2).map(|_| ()));
                        for n in 0..3 {
                            end(format!("unmount {n}"), cluster.unmount(n));
                        }
                    });
                }
                Ok(())
            })();
            *setup.lock() = Some(r);
        });
    }
    sim.run()
        .unwrap_or_else(|f| panic!("seed {seed}: {}", f.message));
    setup.lock().take().expect("the driver finished")?;
    let got: Vec<(u32, u64)> = replays.lock().drain(..).collect::<Result<_, _>>()?;
    if got.len() != 2 || got.iter().filter(|(_, t)| *t > 0).count() != 1 {
        return Err(format!(
            "seed {seed}: two recoveries of node 2 at once, (node, transactions replayed): \
             {got:?}; exactly one must replay"
        ));
    }
    cluster.fsck().map_err(|e| format!("seed {seed}: {e}"))?;
    Ok(format!("seed {seed}: {got:?}"))
}

#[test]
fn two_recoveries_of_one_node_take_turns() {
    for seed in 1..=6 {
        match two_recoveries_at_once(seed) {
            Ok(line) => eprintln!("{line}"),
            Err(e) => panic!("{e}"),
        }
    }
}

/// The simulation (seed `seed`) of two nodes without the thief whose driver task mounts
/// both and runs `body` with the cluster and the two file systems; returns the cluster
/// (for fsck after) and what `body` returned. A failure of the simulation itself goes
/// to `failed` with its message.
fn two_mounted_nodes(
    seed: u64,
    body: impl FnOnce(
            Arc<SimCluster>,
            mako_fs::fs::FileSystem,
            mako_fs::fs::FileSystem,
        ) -> Result<String, String>
        + Send
        + 'static,
    failed: impl FnOnce(String),
) -> (Arc<SimCluster>, Result<String, String>) {
    use mako_sim::{ClusterConfig, Sim, SimConfig};
    let sim = Sim::new(seed, SimConfig::default());
    let mut cc = ClusterConfig::small(2);
    cc.thief = mako_sim::Thief::Off;
    let cluster = SimCluster::new(&sim, cc).expect("cluster");
    let out: Arc<Mutex<Option<Result<String, String>>>> = Arc::new(Mutex::new(None));
    {
        let (cluster, out) = (cluster.clone(), out.clone());
        sim.spawn_task("driver", move || {
            let r = (|| {
                cluster.mount(0).map_err(e("mount 0"))?;
                cluster.mount(1).map_err(e("mount 1"))?;
                let (fs0, fs1) = (cluster.fs(0).unwrap(), cluster.fs(1).unwrap());
                body(cluster, fs0, fs1)
            })();
            *out.lock() = Some(r);
        });
    }
    if let Err(f) = sim.run() {
        failed(f.message);
    }
    let r = out.lock().take().expect("the driver finished");
    (cluster, r)
}

/// An `FsError` as a message saying what failed.
fn e(what: &'static str) -> impl Fn(mako_fs::error::FsError) -> String {
    move |x| format!("{what}: {x}")
}
