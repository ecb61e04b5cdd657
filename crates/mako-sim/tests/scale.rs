//! The scale harness (`mako_sim::scale`): M simulated nodes create one file each in
//! one new directory (and in one that already lives in directory blocks), and M nodes write their own 47,008-byte record of one file.
//! `MAKO_SIM_SCALE_NODES` sets M, or a comma-separated list of them (default 12; the
//! issue's figures are 4,096 creates and 1,024 writers). Prints the simulated
//! completion time, messages per operation by service and the busiest node; fails if
//! any operation fails, if a file is missing or listed twice, if a record does not
//! read back exactly, or if fsck finds the file system unclean afterwards.
//!
//! The issue's sizes run as ignored tests (`cargo test --release -p mako-sim --test
//! scale -- --ignored --nocapture`): minutes to hours of real time, not for CI.

use mako_sim::scale::{run_scale, ScaleWorkload};

fn node_counts() -> Vec<u32> {
    match std::env::var("MAKO_SIM_SCALE_NODES") {
        Ok(v) => v
            .split(',')
            .map(|n| {
                n.trim()
                    .parse()
                    .expect("MAKO_SIM_SCALE_NODES is a number or a list like 1,2,4,8")
            })
            .collect(),
        Err(_) => vec![12],
    }
}

fn run(workload: ScaleWorkload) {
    run_seed(workload, 1)
}

fn run_seed(workload: ScaleWorkload, seed: u64) {
    let mut failures = Vec::new();
    for m in node_counts() {
        let r = run_scale(workload, m, seed)
            .unwrap_or_else(|e| panic!("{workload:?} on {m} nodes did not complete: {e}"));
        eprintln!("{r}");
        assert!(r.simulated > std::time::Duration::ZERO);
        if m > 1 {
            assert!(r.net.messages > 0, "{m} nodes worked without a message");
        }
        if let Err(e) = r.ok() {
            eprintln!("{e}");
            failures.push(e);
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn create_storm_in_one_directory() {
    run(ScaleWorkload::CreateStorm);
}

/// Creates in a directory already in blocks (node 0 filled it first): under the
/// directory in `rw`, names in `xw` per page.
#[test]
fn create_storm_in_a_directory_in_blocks() {
    run(ScaleWorkload::CreateStormInBlocks);
}

/// 256 nodes once failed the setup of `create_storm_in_a_directory_in_blocks` (node 0
/// creating 256 names): its inode-map segments ran out and the next segment's map block
/// was one another node had made; reading it needed the map file's token, which
/// `Core::reserve_inode` (outside any operation) could not ask for ("operation needs
/// token ro fs0:inode:3"). About 35 s: not for CI.
#[test]
#[ignore = "about 35 s; run with --ignored"]
fn create_storm_in_blocks_on_256_nodes() {
    let r = run_scale(ScaleWorkload::CreateStormInBlocks, 256, 1).expect("the run completes");
    eprintln!("{r}");
    r.ok().expect("every create succeeds and the result checks");
}

/// Seeds that once lost a name of concurrent creates in a directory in blocks (seed 1
/// on the default disks, seed 9 on 128 MiB disks): a revoke of some of the
/// directory's names dropped every cached block, with it a page another operation had
/// just changed under names the node still held, while the directory's entry count kept
/// the name (`cache_flush::revoke_names`). The name was listed by nobody and its inode
/// was an orphan.
#[test]
fn create_storm_seeds_that_lost_a_name() {
    let mut failed = Vec::new();
    for (seed, disk) in [(1, None), (9, Some(128 << 20))] {
        let r = mako_sim::scale::run_scale_on(ScaleWorkload::CreateStormInBlocks, 12, seed, disk)
            .expect("the run completes");
        eprintln!("seed {seed}: {r}");
        if let Err(e) = r.ok() {
            failed.push(format!("seed {seed}: {e}"));
        }
    }
    assert!(failed.is_empty(), "{}", failed.join("\n"));
}

/// The seeds' pitfall (docs/coherence.md section 4): 64 nodes creating in one new
/// directory, whose entries start in its inode. Once a crowd waits for the directory
/// inode in `xw`, the node granted it moves the directory into a block and the others'
/// requests fall back to `rw`: messages per create stop growing with the node count.
/// Before, every create took the directory inode in `xw` from the node before it:
/// 200.8 messages per create at 64 nodes (102.5 at 12, 376.5 at 256); since, 79.0
/// (seed 1; the figures are functions of the seed). The bound leaves room for schedule
/// changes, not for the old behaviour.
#[test]
fn a_crowd_moves_a_new_directory_out_of_its_inode() {
    let r = run_scale(ScaleWorkload::CreateStorm, 64, 1).expect("the run completes");
    eprintln!("{r}");
    r.ok().expect("every create succeeds and the result checks");
    assert!(
        r.messages_per_op() < 130.0,
        "{:.1} messages per create on 64 nodes (200.8 when every create took the directory inode in xw)",
        r.messages_per_op()
    );
}

/// Nodes past the inode file mkfs pre-sized (here 128 MiB disks: room for 48 nodes'
/// first segments of 64 inodes) grow it at their first create, under its token in
/// `xw`, which every node that reads inodes holds: a growth per node took the token
/// from every node again (103 requests for it per create at 512 nodes). The first
/// growth now makes the other nodes' first blocks too (`Core::inode_file_growth`),
/// and a node learns them under `ro`. Every create must succeed and the result check
/// (every name once, fsck clean) pass with the blocks made ahead.
#[test]
fn nodes_past_the_presized_inode_file_create_in_one_directory() {
    let r = mako_sim::scale::run_scale_on(ScaleWorkload::CreateStorm, 64, 1, Some(128 << 20))
        .expect("the run completes");
    eprintln!("{r}");
    r.ok().expect("every create succeeds and the result checks");
    let xw = r
        .net
        .by_token_request
        .get("acquire inode Xw")
        .copied()
        .unwrap_or(0) as f64
        / 64.0;
    assert!(
        xw < XW_PER_CREATE_MAX,
        "{xw:.1} requests for an inode in xw per create on 64 nodes"
    );
}

/// Requests for an inode in `xw` per create in the test above: 13.19 before the inode
/// file grew ahead (72.5 messages per create), 5.94 since (66.9); seed 1. At 512 nodes
/// on the harness's disks: 103.4 before, 13.7 since (261.4 and 129.3 messages).
const XW_PER_CREATE_MAX: f64 = 9.0;

/// Every record reads back exact from another node. It once lost records of shared
/// blocks with 4 or more writers (the bugs of three-node seeds 19 and 22: pending
/// pointers dropped by an upgrade to `xw`, and another node's data taken for a hole
/// past a stale size).
#[test]
fn shared_file_records() {
    run(ScaleWorkload::SharedFileRecords);
}

/// A scale run is a function of its seed: two runs make the same schedule decision for
/// decision (the scheduler's trace hash) and the same figures.
#[test]
fn a_scale_run_replays_bit_for_bit() {
    let runs: Vec<_> = (0..2)
        .map(|_| run_scale(ScaleWorkload::CreateStorm, 12, 3).expect("the run completes"))
        .collect();
    let (a, b) = (&runs[0], &runs[1]);
    a.ok().expect("first run");
    assert_eq!(
        (a.trace, a.steps, a.simulated, &a.net),
        (b.trace, b.steps, b.simulated, &b.net)
    );
}

fn issue_case(workload: ScaleWorkload, nodes: u32) {
    let r = run_scale(workload, nodes, 1)
        .unwrap_or_else(|e| panic!("{workload:?} on {nodes} nodes did not complete: {e}"));
    eprintln!("{r}");
    r.ok()
        .expect("every operation succeeds and the result checks");
}

/// The issue's shared-directory case: 4,096 nodes each create one file in a new
/// directory. Prints simulated time, messages per create (by token request) and the
/// busiest node. Not run to completion yet: the 1,024-node storm (`MAKO_SIM_SCALE_
/// NODES=1024` on `create_storm_in_one_directory`) takes 277 million scheduler
/// decisions and 8 minutes of real time, 102 messages per create (docs/coherence.md
/// section 9, "Scale").
#[test]
#[ignore = "long (the issue's 4,096-node figure); run with --ignored"]
fn issue_4096_nodes_create_in_one_new_directory() {
    issue_case(ScaleWorkload::CreateStorm, 4096);
}

/// The issue's shared-file case: 1,024 nodes each write their 47,008-byte record of
/// one file.
#[test]
#[ignore = "long (the issue's 1,024-node figure); run with --ignored"]
fn issue_1024_nodes_write_records_of_one_file() {
    issue_case(ScaleWorkload::SharedFileRecords, 1024);
}
