//! The cluster simulation: seeded POSIX workloads on simulated nodes sharing simulated
//! disks, checked against a model of one POSIX machine, with the cluster's invariants
//! checked after every step and fsck at the end.
//!
//! `MAKO_SIM_SEEDS`, `MAKO_SIM_SEED_BASE`, `MAKO_SIM_NODES`, `MAKO_SIM_JOBS` and
//! `MAKO_SIM_LONG=1` choose the seeds (see `mako_sim::runner::SeedPlan`); a failing
//! seed prints the command that replays it.

use mako_sim::runner::{replay_command, run_seeds, SeedPlan};
use mako_sim::{run_seed, SeedConfig};

fn run(test: &str, plan: SeedPlan, ignored: bool) {
    let nodes = plan.nodes;
    let summary = run_seeds(&plan, true, |seed| SeedConfig::new(seed, nodes));
    summary.report("cluster", test, nodes, "node(s)", ignored);
}

#[test]
fn one_node() {
    run("one_node", SeedPlan::from_env(2500, 1), false);
}

/// Three nodes, 60 seeds per run (about 2.5 minutes on two cores; `MAKO_SIM_LONG=1`
/// runs ten times as many, `MAKO_SIM_SEEDS` and `MAKO_SIM_SEED_BASE` choose others).
#[test]
fn three_nodes() {
    run("three_nodes", SeedPlan::from_env(60, 3), false);
}

/// Three-node seed 3 with `CROWD_NODES` 1 (a directory leaves its inode as soon as
/// another node waits for it, so shared writers of directories are everywhere): a
/// takeover raced a shared writer's update and applied its entry count a second time,
/// and fsck found the directory's count one above its entries (docs/coherence.md
/// section 4, "Entry and link counts").
#[test]
fn a_crowd_of_one_counts_entries_once() {
    crowd_of_one(&[1, 2, 3]);
}

/// Three-node seed 53 with `CROWD_NODES` 1: an operation whose acquire of a page's
/// name token found it granted already (to another operation of the same node, which
/// had not read the cached directory blocks again yet) looked the name up in a page
/// read before the grant and missed a directory another node had created (ENOENT;
/// `directory::fresh`, docs/coherence.md section 4). The schedules changed since, and
/// seed 53 no longer fails without `fresh`. Seed 86 did, at step 24, but that failure
/// was the model's (`lseek SEEK_DATA` in directory `/f`, which the model checked as an
/// empty file; fixed), so it may not guard `fresh` either: a seed that fails without
/// `fresh` on today's schedules is still to be found. Both run.
#[test]
fn a_crowd_of_one_reads_pages_as_new_as_their_grant() {
    crowd_of_one(&[53, 86]);
}

/// Three nodes with `CROWD_NODES` 1 (`MAKO_SIM_LONG=1`: 300 seeds; `MAKO_SIM_SEEDS`,
/// `MAKO_SIM_SEED_BASE` choose others). Not in CI: the seeds above cover what it found.
#[test]
#[ignore]
fn three_nodes_crowd_of_one() {
    let plan = SeedPlan::from_env(30, 3);
    let nodes = plan.nodes;
    let summary = run_seeds(&plan, true, |seed| {
        let mut c = SeedConfig::new(seed, nodes);
        c.crowd_nodes = Some(1);
        c
    });
    summary.report(
        "cluster",
        "three_nodes_crowd_of_one",
        nodes,
        "node(s)",
        true,
    );
}

fn crowd_of_one(seeds: &[u64]) {
    for &seed in seeds {
        let mut c = SeedConfig::new(seed, 3);
        c.crowd_nodes = Some(1);
        if let Err(f) = run_seed(&c) {
            panic!(
                "{f}\nseed {seed} with crowd_nodes 1; replay: {}",
                replay_command("three_nodes_crowd_of_one", 3, seed, true)
            );
        }
    }
}

/// Three-node seeds that once lost a record of the shared ior-hard file: 19 (a
/// truncate's upgrade from `rw` to `xw` dropped the block pointers this node had not
/// reported yet: `metanode::take_over`) and 22 (a shared writer took a block another
/// node had written for a hole past its stale view of the size, and wrote zeros over
/// it: `FsReply::Blocks` carries the metanode's size), 88 (EIO: a block fetch
/// between an operation's attempts raced the revoke of the inode token), 105 (the
/// invariant checker took a shared writer's stale inode copy for its block map) and
/// 211 (an inode-file chunk cached before a grant hid a name another node had added
/// to an inline directory: `Core::read_inode` checks the grant clock) and 227 (a
/// shared writer found a block address missing after its write had begun: EROFS;
/// `file_io::shared_write_ready` checks them all first), 266 (taking over as
/// metanode inside an unlink counted as the unlink's change: EROFS at its restart);
/// 7 and 211 again with the fair queue (EIO, "the metanode kept changing hands": a
/// node the manager named metanode with its `rw` grant answered "not metanode" until
/// its own operation reached the inode; the grant now says so and `metanode::serve`
/// takes over); 172 (EIO, "needs the address of unit 2 from its metanode": the
/// metanode's own operation began a shared writer's view just after `serve` had
/// taken over, so it answered `GetBlocks` from an empty view; `metanode::settle`
/// looks again under the write lock; mako-fs `two_nodes.rs`,
/// `a_request_served_while_a_shared_view_begins`, without the schedule); 184 the same
/// way once a create asked for its new inode's two tokens in one request.
#[test]
fn three_node_seeds_that_once_failed() {
    for seed in [7, 19, 22, 88, 105, 172, 184, 211, 227, 266] {
        if let Err(f) = run_seed(&SeedConfig::new(seed, 3)) {
            panic!(
                "{f}\n\nreplay: {}",
                replay_command("three_nodes", 3, seed, false)
            );
        }
    }
}

#[test]
fn a_seed_replays_bit_for_bit() {
    let a = run_seed(&SeedConfig::new(7, 1)).unwrap_or_else(|f| panic!("{f}"));
    let b = run_seed(&SeedConfig::new(7, 1)).unwrap_or_else(|f| panic!("{f}"));
    assert_eq!(a.trace(), b.trace(), "scheduler traces differ");
    assert_eq!(a.digest, b.digest, "outcomes differ");
    assert_eq!(a.sim.elapsed, b.sim.elapsed);
    assert_eq!(a.net, b.net);
    assert!(a.operations > 50, "{} operations", a.operations);
    let c = run_seed(&SeedConfig::new(8, 1)).unwrap_or_else(|f| panic!("{f}"));
    assert_ne!(a.trace(), c.trace(), "another seed, another schedule");
    // Seeds running at once in one process (as `MAKO_SIM_JOBS` runs them) share
    // nothing: each replays as it does alone.
    let (x, y) = std::thread::scope(|s| {
        let x = s.spawn(|| run_seed(&SeedConfig::new(7, 1)));
        let y = s.spawn(|| run_seed(&SeedConfig::new(8, 1)));
        (x.join().expect("seed 7"), y.join().expect("seed 8"))
    });
    let (x, y) = (
        x.unwrap_or_else(|f| panic!("{f}")),
        y.unwrap_or_else(|f| panic!("{f}")),
    );
    assert_eq!((x.trace(), x.digest), (a.trace(), a.digest));
    assert_eq!((y.trace(), y.digest), (c.trace(), c.digest));
}

/// Three nodes replay bit-for-bit too, whether the seed passes or fails: a failure
/// (today's multi-node core fails early) is the same failure every time.
#[test]
fn a_three_node_seed_replays_bit_for_bit() {
    let show = |r: Result<mako_sim::SeedReport, mako_sim::SeedFailure>| match r {
        Ok(r) => format!(
            "ok trace {} digest {} at {:?}",
            r.trace(),
            r.digest,
            r.sim.elapsed
        ),
        Err(f) => format!("failed: {f}"),
    };
    for seed in [1, 2, 3] {
        let a = show(run_seed(&SeedConfig::new(seed, 3)));
        let b = show(run_seed(&SeedConfig::new(seed, 3)));
        assert_eq!(a, b, "seed {seed}");
    }
}

/// Not a pass/fail test: runs the seeds without stopping and prints each distinct kind
/// of failure once, with the first seed that shows it and the command that replays
/// it. For the multi-node core under construction: what is still broken.
#[test]
#[ignore = "a survey for developers, not a check"]
fn survey() {
    let plan = SeedPlan::from_env(50, 3);
    let nodes = plan.nodes;
    let summary = run_seeds(&plan, false, |seed| SeedConfig::new(seed, nodes));
    let mut kinds: std::collections::BTreeMap<String, Vec<u64>> = Default::default();
    for f in &summary.failures {
        kinds.entry(signature(&f.message)).or_default().push(f.seed);
    }
    eprintln!(
        "survey: {} seeds of {nodes} node(s), {} failed, {} kinds of failure",
        summary.seeds,
        summary.failures.len(),
        kinds.len()
    );
    for (sig, seeds) in &kinds {
        let first = summary
            .failures
            .iter()
            .find(|f| f.seed == seeds[0])
            .expect("a failure of that seed");
        eprintln!(
            "\n== {} seed(s), e.g. {:?}: {sig}\n{first}\nreplay: {}",
            seeds.len(),
            &seeds[..seeds.len().min(8)],
            replay_command("three_nodes", nodes, first.seed, true)
        );
    }
}

/// A failure message with its numbers and paths taken out: failures of one kind
/// share it.
fn signature(message: &str) -> String {
    let first = message.lines().next().unwrap_or("");
    // Drop "node N: <op> <path ...>: " and keep the verdict.
    let verdict = match first.find(": expected") {
        Some(i) => {
            let op = first[..i]
                .split(": ")
                .nth(1)
                .unwrap_or("")
                .split(' ')
                .next()
                .unwrap_or("");
            format!("{op}: {}", &first[i + 2..])
        }
        None => first.to_string(),
    };
    let mut out = String::new();
    let mut last_digit = false;
    for c in verdict.chars() {
        if c.is_ascii_digit() {
            if !last_digit {
                out.push('#');
            }
            last_digit = true;
        } else {
            out.push(c);
            last_digit = false;
        }
    }
    // Names in messages ("records", "a") vary too: cut at the first parenthesis.
    match out.find(" (") {
        Some(i) => out[..i].to_string(),
        None => out,
    }
}

/// Issue 14: a node whose own regions are full takes another node's region with free
/// space (a revoke) instead of answering ENOSPC. Three nodes on three 16 MiB disks
/// write at once: node 0 until ENOSPC, nodes 1 and 2 until 10 % and 5 % of the file
/// system is in their files (then they stay mounted, owning regions node 0 must
/// take). Each node deletes some of its own files and some of another node's as it
/// goes (frees in regions that change hands become frees for the new owner). At node
/// 0's ENOSPC the file system must be at least 80 % in use (on main, node 0 stopped
/// at its own share); every file reads back as written on another node, the
/// cluster's invariants hold (no subblock in two files) and fsck finds the disks
/// clean. `MAKO_SIM_FILL_SEEDS` sets the seeds (default 16, about half a second
/// each, from `MAKO_SIM_SEED_BASE`, default 1).
#[test]
fn a_full_node_takes_space_from_the_others() {
    fill_seeds(false);
}

/// As above, but nodes 1 and 2 go on writing (and deleting their oldest files) until
/// node 0 meets ENOSPC, so regions are taken from nodes that allocate in them. NOT
/// PASSING YET (issue 14, left open): a node whose region was taken may hold
/// reservations of dirty data the rest of its space no longer covers, and the revoke
/// of that data's token (another node reads or deletes the file) fails with ENOSPC
/// while it writes the data back (`cluster coherence: ... could not flush cached
/// data ...: no space left`); two seeds in 30 also ran into the livelock guard.
#[test]
#[ignore]
fn a_full_node_takes_space_from_the_others_while_they_write() {
    fill_seeds(true);
}

fn fill_seeds(concurrent: bool) {
    let count: u64 = std::env::var("MAKO_SIM_FILL_SEEDS")
        .ok()
        .map(|v| v.trim().parse().expect("MAKO_SIM_FILL_SEEDS is a number"))
        .unwrap_or(16);
    let base: u64 = std::env::var("MAKO_SIM_SEED_BASE")
        .ok()
        .map(|v| v.trim().parse().expect("MAKO_SIM_SEED_BASE is a number"))
        .unwrap_or(1);
    let mut failed = Vec::new();
    for seed in base..base + count {
        let started = std::time::Instant::now();
        match fill::run(seed, concurrent) {
            Ok((used, stolen, frees)) => eprintln!(
                "fill seed {seed}: {:.1} % of the file system in use at node 0's ENOSPC, \
                 {stolen} regions taken from another node, {frees} batches of frees sent ({:?})",
                used * 100.0,
                started.elapsed()
            ),
            Err(e) => {
                eprintln!("fill seed {seed} FAILED: {e}");
                failed.push(seed);
            }
        }
    }
    assert!(failed.is_empty(), "fill seeds failed: {failed:?}");
}

mod fill {
    use mako_fs::error::FsError;
    use mako_fs::fs::{Ctx, FileSystem, ROOT_INO};
    use mako_fs::test_util::pattern;
    use mako_sim::{Background, ClusterConfig, Sim, SimCluster, SimConfig, Thief};
    use parking_lot::Mutex;
    use std::sync::Arc;
    use std::time::Duration;

    const CTX: Ctx = Ctx {
        uid: 0,
        gid: 0,
        pid: 1,
    };
    const NODES: u32 = 3;
    const CHUNK: usize = 64 << 10;
    const FILE_CHUNKS: usize = 4;

    /// A file written to the end (or as far as space allowed): its node's directory,
    /// name, the pattern seed and length.
    #[derive(Clone)]
    struct Done {
        dir: u32,
        name: String,
        seed: u64,
        len: usize,
    }

    #[derive(Default)]
    struct Shared {
        files: Vec<Done>,
        running: u32,
        /// Node 0's ENOSPC was seen.
        enospc: bool,
        failure: Option<String>,
        used: f64,
        /// Regions taken from another node, and batches of frees sent to another node.
        stolen: u64,
        frees_sent: u64,
    }

    fn dir_of(fs: &FileSystem, n: u32) -> Result<u64, String> {
        fs.lookup(ROOT_INO, format!("n{n}").as_bytes())
            .map(|a| a.ino)
            .map_err(|e| format!("lookup of /n{n}: {e}"))
    }

    /// Node `n` writes files of `FILE_CHUNKS` chunks: node 0 until ENOSPC, the others
    /// until they hold `budget` bytes in their files (`concurrent`: until node 0 met
    /// ENOSPC, deleting their oldest files to stay under `budget`).
    fn writer(
        cluster: &SimCluster,
        shared: &Mutex<Shared>,
        seed: u64,
        n: u32,
        budget: u64,
        concurrent: bool,
    ) -> Result<(), String> {
        let fs = cluster.fs(n).ok_or("not mounted")?;
        let dir = dir_of(&fs, n)?;
        let mut mine: Vec<Done> = Vec::new();
        for k in 0u64.. {
            if n != 0 && !concurrent && mine.iter().map(|f| f.len as u64).sum::<u64>() >= budget {
                return Ok(());
            }
            if n != 0 && concurrent {
                // Nodes 1 and 2 go on until node 0 met ENOSPC, allocating all the while
                // (their regions are taken from under them, and they take some back),
                // with at most `budget` bytes in their files.
                if shared.lock().enospc {
                    return Ok(());
                }
                while !mine.is_empty() && mine.iter().map(|f| f.len as u64).sum::<u64>() >= budget {
                    let oldest = mine.remove(0);
                    remove(&fs, shared, &oldest)?;
                }
            }
            let name = format!("f{k}");
            let pseed = seed * 1_000_000 + n as u64 * 100_000 + k;
            let data = pattern(pseed, CHUNK * FILE_CHUNKS);
            let ino = match fs.create(CTX, dir, name.as_bytes(), 0o644, 0, true) {
                Ok(a) => a.ino,
                Err(FsError::NoSpace(why)) => return out_of_space(cluster, shared, n, &why),
                Err(e) => return Err(format!("node {n}: create {name}: {e}")),
            };
            // As a program writes: after a short write (the space ran out within the
            // call), a call for the rest; only an ENOSPC answered for a call's first
            // block stops it.
            let mut len = 0;
            let mut full = None;
            while len < data.len() {
                let end = (len + CHUNK).min(data.len()) / CHUNK * CHUNK;
                let end = if end <= len { data.len() } else { end };
                match fs.write(ino, len as u64, &data[len..end], false) {
                    Ok(0) => return Err(format!("node {n}: a write of {name} wrote nothing")),
                    Ok(w) => len += w,
                    Err(FsError::NoSpace(why)) => {
                        full = Some(why);
                        break;
                    }
                    Err(e) => return Err(format!("node {n}: write of {name}: {e}")),
                }
            }
            let done = Done {
                dir: n,
                name: name.clone(),
                seed: pseed,
                len,
            };
            mine.push(done.clone());
            shared.lock().files.push(done);
            if let Some(why) = full {
                return out_of_space(cluster, shared, n, &why);
            }
            // Frees: one of its own files every third file, one of another node's
            // every fifth (a free in another node's space, perhaps in a region that
            // changed hands since).
            if k % 3 == 2 {
                let victim = mine.remove(mine.len() / 2);
                remove(&fs, shared, &victim)?;
            }
            if k % 5 == 4 {
                let other = shared.lock().files.iter().find(|f| f.dir != n).cloned();
                if let Some(victim) = other {
                    remove(&fs, shared, &victim)?;
                }
            }
            if k % 4 == 3 {
                for work in [
                    Background::Commit,
                    Background::Checkpoint,
                    Background::ReleaseTokens,
                ] {
                    cluster
                        .background(n, work)
                        .map_err(|e| format!("node {n}: {work:?}: {e}"))?;
                }
            }
        }
        Ok(())
    }

    /// Node `n` met ENOSPC: what node 0 must meet, in a file system at least 80 % in
    /// use; another node too may meet it then (it wrote less than its budget only
    /// because node 0 was faster).
    fn out_of_space(
        cluster: &SimCluster,
        shared: &Mutex<Shared>,
        n: u32,
        why: &str,
    ) -> Result<(), String> {
        let used = used(cluster);
        if used < 0.8 {
            return Err(format!(
                "node {n} met ENOSPC with {:.1} % of the file system in use: {why}",
                used * 100.0
            ));
        }
        if n == 0 {
            let mut s = shared.lock();
            s.enospc = true;
            s.used = used;
        }
        Ok(())
    }

    fn remove(fs: &FileSystem, shared: &Mutex<Shared>, victim: &Done) -> Result<(), String> {
        {
            let mut s = shared.lock();
            let Some(i) = s
                .files
                .iter()
                .position(|f| f.dir == victim.dir && f.name == victim.name)
            else {
                // Another node removed it already.
                return Ok(());
            };
            s.files.remove(i);
        }
        let dir = dir_of(fs, victim.dir)?;
        fs.unlink(dir, victim.name.as_bytes())
            .map_err(|e| format!("unlink of /n{}/{}: {e}", victim.dir, victim.name))
    }

    /// Fraction of the file system in use: every region's free space as its owner
    /// knows it (all regions are owned by now).
    fn used(cluster: &SimCluster) -> f64 {
        let cores = cluster.cores();
        let alloc = &cores[0].1.alloc;
        let (mut free, mut total) = (0u64, 0u64);
        for r in 0..alloc.region_count() {
            let owner = cores
                .iter()
                .find(|(_, c)| c.alloc.is_owned(r))
                .map(|(_, c)| c)
                .unwrap_or(&cores[0].1);
            let (f, t) = owner.alloc.region_space(r);
            free += f;
            total += t;
        }
        1.0 - free as f64 / total as f64
    }

    fn drive(
        cluster: &Arc<SimCluster>,
        shared: &Arc<Mutex<Shared>>,
        seed: u64,
        concurrent: bool,
    ) -> Result<(), String> {
        for n in 0..NODES {
            cluster
                .mount(n)
                .map_err(|e| format!("mount of node {n}: {e}"))?;
        }
        let fs0 = cluster.fs(0).ok_or("node 0 not mounted")?;
        for n in 0..NODES {
            fs0.mkdir(CTX, ROOT_INO, format!("n{n}").as_bytes(), 0o755, 0)
                .map_err(|e| format!("mkdir /n{n}: {e}"))?;
        }
        let capacity = fs0.statfs().blocks * fs0.statfs().fragment_bytes as u64;
        let sim = mako_sim::current().ok_or("not in the simulation")?;
        shared.lock().running = NODES;
        for n in 0..NODES {
            let budget = match n {
                0 => u64::MAX,
                1 => capacity / 10,
                _ => capacity / 20,
            };
            let (cluster, shared) = (cluster.clone(), shared.clone());
            sim.spawn_task(format!("writer {n}"), move || {
                let r = writer(&cluster, &shared, seed, n, budget, concurrent);
                let mut s = shared.lock();
                if let Err(e) = r {
                    s.failure.get_or_insert(e);
                }
                s.running -= 1;
            });
        }
        let mut waited = 0;
        while shared.lock().running > 0 {
            mako_diag::sched::sleep(Duration::from_millis(10));
            waited += 1;
            if waited > 1_000_000 {
                return Err("the writers did not finish".into());
            }
        }
        if let Some(e) = shared.lock().failure.clone() {
            return Err(e);
        }
        if !shared.lock().enospc {
            return Err("node 0 never met ENOSPC".into());
        }
        let violations =
            mako_sim::invariants::check(cluster, mako_sim::invariants::Checks::default());
        if !violations.is_empty() {
            return Err(format!("invariants: {violations:?}"));
        }
        // Every file as written, read on another node than its writer's.
        let files = shared.lock().files.clone();
        for f in &files {
            let reader = cluster.fs((f.dir + 1) % NODES).ok_or("not mounted")?;
            let dir = dir_of(&reader, f.dir)?;
            let a = reader
                .lookup(dir, f.name.as_bytes())
                .map_err(|e| format!("lookup of /n{}/{}: {e}", f.dir, f.name))?;
            if a.size != f.len as u64 {
                return Err(format!(
                    "/n{}/{}: size {}, {} written",
                    f.dir, f.name, a.size, f.len
                ));
            }
            let got = reader
                .read(a.ino, 0, f.len as u32)
                .map_err(|e| format!("read of /n{}/{}: {e}", f.dir, f.name))?;
            if got != pattern(f.seed, CHUNK * FILE_CHUNKS)[..f.len] {
                return Err(format!(
                    "/n{}/{}: data differs from what was written",
                    f.dir, f.name
                ));
            }
        }
        {
            use std::sync::atomic::Ordering::Relaxed;
            let mut s = shared.lock();
            for (_, core) in cluster.cores() {
                s.stolen += core.stats.regions_stolen.load(Relaxed);
                s.frees_sent += core.stats.foreign_frees_sent.load(Relaxed);
            }
        }
        for n in 0..NODES {
            cluster
                .unmount(n)
                .map_err(|e| format!("unmount of node {n}: {e}"))?;
        }
        Ok(())
    }

    /// One seed: the fraction of the file system in use at node 0's ENOSPC, or what
    /// failed.
    pub fn run(seed: u64, concurrent: bool) -> Result<(f64, u64, u64), String> {
        let sim = Sim::new(
            seed,
            SimConfig {
                hang_timeout: Duration::from_secs(120),
                ..SimConfig::default()
            },
        );
        let mut config = ClusterConfig::small(NODES);
        config.thief = Thief::Off;
        config.disk_bytes = 16 << 20;
        let cluster = SimCluster::new(&sim, config)?;
        let shared = Arc::new(Mutex::new(Shared::default()));
        {
            let (cluster, shared) = (cluster.clone(), shared.clone());
            sim.spawn_task("driver", move || {
                if let Err(e) = drive(&cluster, &shared, seed, concurrent) {
                    shared.lock().failure.get_or_insert(e);
                    cluster.abandon();
                }
            });
        }
        if let Err(e) = sim.run() {
            cluster.abandon();
            return Err(e.to_string());
        }
        let s = shared.lock();
        if let Some(e) = &s.failure {
            return Err(e.clone());
        }
        cluster.fsck()?;
        Ok((s.used, s.stolen, s.frees_sent))
    }
}
