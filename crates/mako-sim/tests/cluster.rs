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
/// takes over).
#[test]
fn three_node_seeds_that_once_failed() {
    for seed in [7, 19, 22, 88, 105, 211, 227, 266] {
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
