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
use mako_sim::runner::{replay_command_in, run_seeds, SeedPlan};
use mako_sim::{run_seed, SeedConfig, SeedFailure};

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
    let nodes = plan.nodes;
    let summary = run_seeds(&plan, true, |seed| config(seed, nodes, RecoveryFault::None));
    eprintln!(
        "{test}: {} seeds of {nodes} nodes with a crash and a recovery each, {} operations, {:.1} s wall ({:.0} seeds/min), {:.2} s simulated",
        summary.seeds,
        summary.operations,
        summary.wall.as_secs_f64(),
        summary.seeds_per_minute(),
        summary.simulated.as_secs_f64()
    );
    if let Some(f) = summary.failures.first() {
        panic!(
            "{f}\n\nreplay: {}",
            replay_command_in("recovery", test, nodes, f.seed, false)
        );
    }
    assert_eq!(summary.seeds, plan.count, "every seed ran");
}

#[test]
fn crash_and_recover_two_nodes() {
    run("crash_and_recover_two_nodes", SeedPlan::from_env(200, 2));
}

#[test]
fn crash_and_recover_three_nodes() {
    run("crash_and_recover_three_nodes", SeedPlan::from_env(100, 3));
}

/// Seeds tried before the checker is declared blind to a broken recovery.
const SEEDS_MAX: u64 = 30;

/// The first seed whose run fails with `fault` in the recovery, and its failure.
fn first_caught(fault: RecoveryFault) -> (u64, SeedFailure) {
    for seed in 1..=SEEDS_MAX {
        if let Err(f) = run_seed(&config(seed, 2, fault)) {
            return (seed, f);
        }
    }
    panic!("{fault:?} was not caught in {SEEDS_MAX} seeds");
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
