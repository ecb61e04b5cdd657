//! Message faults (issue 14): the simulated network loses messages and handles
//! requests twice, in seeds without any other fault (no leases: a lost message is not
//! a failed node).
//!
//! The contract (docs/coherence.md, "Lost and duplicated messages"): the transport
//! delivers a request at most once (`TcpTransport` never resends a request it has
//! queued); a message it loses is a broken connection, and every call on it fails at
//! once with `TransportError::Unreachable`, the request handled or not. No layer
//! resends a call that failed that way except where resending is harmless: a revoke
//! whose holder did not answer is sent again until it answers or is recovered
//! (`TokenClient`'s holder-down wait), and relinquishing what is not held is not an
//! error. So an operation whose call lost a message fails (EIO) and may or may not
//! have taken effect; checked: it runs again on its node and is accepted either way
//! (`check_uncertain`), every other outcome is checked as usual, the invariants after
//! every step, the final read-back, fsck clean. A duplicated request (which the real
//! transport never makes) must do no harm when it comes right after the first copy.
//!
//! `MAKO_SIM_SEEDS`, `MAKO_SIM_SEED_BASE`, `MAKO_SIM_NODES`, `MAKO_SIM_JOBS`,
//! `MAKO_SIM_STEPS`, `MAKO_SIM_LONG=1` (ten times the seeds) choose the seeds;
//! `MAKO_SIM_LOSS` and `MAKO_SIM_DUPLICATE` the probabilities; a failing seed prints
//! the command that replays it.

use mako_sim::runner::{run_seeds, SeedPlan};
use mako_sim::{run_seed, SeedConfig};

fn steps() -> u32 {
    std::env::var("MAKO_SIM_STEPS")
        .ok()
        .map_or(8, |v| v.parse().expect("MAKO_SIM_STEPS is a number"))
}

fn probability(name: &str, default: f64) -> f64 {
    std::env::var(name)
        .ok()
        .map_or(default, |v| v.parse().expect("a probability"))
}

fn config(seed: u64, nodes: u32, loss: f64, duplicate: f64, late: bool) -> SeedConfig {
    let mut c = SeedConfig::new(seed, nodes);
    c.steps = steps();
    c.cluster.net.loss_probability = loss;
    c.cluster.net.duplicate_probability = duplicate;
    c.cluster.net.duplicate_late = late;
    // Small disks: a seed's end replays every log in two orders and fsck reads them.
    c.cluster.disk_bytes = 8 << 20;
    c
}

fn run(test: &str, plan: SeedPlan, loss: f64, duplicate: f64) {
    let nodes = plan.nodes;
    let summary = run_seeds(&plan, true, |seed| {
        config(seed, nodes, loss, duplicate, false)
    });
    summary.report(
        "messages",
        test,
        nodes,
        &format!("nodes, messages lost with probability {loss}, duplicated with {duplicate}"),
        false,
    );
    assert_eq!(summary.seeds, plan.count, "every seed ran");
}

/// Calls that lose their request or their reply.
#[test]
fn lost_messages() {
    run(
        "lost_messages",
        SeedPlan::from_env(48, 2),
        probability("MAKO_SIM_LOSS", 0.002),
        0.0,
    );
}

/// Requests handled twice. Ignored: the two requests sent again above the transport
/// (metanode updates, batches of frees) carry idempotency keys and a copy changes
/// nothing (`mako_fs::writer_seq`; before, seed 17 freed an inode number twice and
/// node 1's integrity check turned its mount read-only), and the 24 seeds pass with
/// them, but the other requests that are not idempotent (acquire, allocation) carry
/// none: the contract is that the transport delivers at most once (module comment),
/// so a failure of one of those here is not a bug. Run by hand.
#[test]
#[ignore = "duplicated requests other than metanode updates and frees carry no key; the transport delivers at most once"]
fn duplicated_messages() {
    run(
        "duplicated_messages",
        SeedPlan::from_env(24, 2),
        0.0,
        probability("MAKO_SIM_DUPLICATE", 0.05),
    );
}

/// Seed 17 of `duplicated_messages`: a batch of frees in node 1's space is handled
/// twice. Without its key the copy freed the blocks a second time (node 1: "a double
/// free", its mount read-only, node 0's token release failed).
#[test]
fn seed_17_a_duplicated_free_is_applied_once() {
    run_seed(&config(17, 2, 0.0, 0.05, false)).unwrap_or_else(|f| panic!("{f}"));
}

/// A seed with lost messages is a function of its seed.
#[test]
fn a_message_fault_seed_replays_bit_for_bit() {
    let (c, a) = (1..=20)
        .map(|seed| config(seed, 2, 0.002, 0.0, false))
        .find_map(|c| {
            let a = run_seed(&c).unwrap_or_else(|f| panic!("{f}"));
            (!a.net.lost_by.is_empty()).then_some((c, a))
        })
        .expect("a seed that loses a message");
    let b = run_seed(&c).unwrap_or_else(|f| panic!("{f}"));
    assert_eq!(a.trace(), b.trace(), "scheduler traces differ");
    assert_eq!(a.digest, b.digest, "outcomes differ");
    assert_eq!(a.net, b.net);
}

/// Seeds tried before the checker is declared blind to a duplicate that arrives late.
const SEEDS_MAX: u64 = 30;

/// A network that delivers a second copy of a request late, after its caller went on
/// (what at-most-once delivery rules out): a stale relinquish drops a token the node
/// acquired again since, a stale acquire grants one it gave back; the checker must
/// catch what follows (two nodes caching one object, a stale read, a lost write).
#[test]
fn a_late_duplicate_is_caught() {
    for seed in 1..=SEEDS_MAX {
        if let Err(f) = run_seed(&config(seed, 2, 0.0, 0.3, true)) {
            eprintln!("caught at seed {seed}: {f}");
            run_seed(&config(seed, 2, 0.0, 0.3, false))
                .unwrap_or_else(|f| panic!("seed {seed} fails with prompt duplicates too: {f}"));
            return;
        }
    }
    panic!("late duplicates were not caught in {SEEDS_MAX} seeds");
}

/// Seed 16 of `lost_messages` (2 nodes), found by this simulation: node 1, revoking a
/// directory token for node 0, relinquishes it to the manager; the request is lost,
/// node 1's revoke fails and node 0's create fails with EIO. Fixed in `TokenClient`:
/// a relinquish or downgrade whose connection broke is sent again (both are
/// idempotent).
#[test]
fn seed_16_a_lost_relinquish_is_sent_again() {
    run_seed(&config(16, 2, 0.002, 0.0, false)).unwrap_or_else(|f| panic!("{f}"));
}
