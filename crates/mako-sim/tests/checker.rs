//! The checker must catch a broken cluster: a revoke that loses dirty data, and a
//! revoke that leaves cached data behind (a missing invalidation), each injected with
//! the core's test-only switch (`mako_fs::cache_flush::RevokeFault`). One node and the
//! token thief (a phantom node that takes data tokens away) make revokes happen; the
//! same seeds pass without the fault (the `one_node` test runs them), so what fails
//! is the injected fault. Each must be caught within a bounded number of seeds.

use mako_fs::cache_flush::RevokeFault;
use mako_sim::{run_seed, SeedConfig, SeedFailure, Thief};

/// Seeds tried before the checker is declared blind.
const SEEDS_MAX: u64 = 40;

fn config(seed: u64, fault: RevokeFault) -> SeedConfig {
    let mut c = SeedConfig::new(seed, 1);
    c.cluster.thief = Thief::Large;
    c.revoke_fault = fault;
    c
}

/// The first seed whose run fails with `fault` injected, and its failure.
fn first_caught(fault: RevokeFault) -> (u64, SeedFailure) {
    for seed in 1..=SEEDS_MAX {
        if let Err(f) = run_seed(&config(seed, fault)) {
            return (seed, f);
        }
    }
    panic!("{fault:?} was not caught in {SEEDS_MAX} seeds");
}

#[test]
fn a_revoke_that_loses_dirty_data_is_caught() {
    let (seed, failure) = first_caught(RevokeFault::SkipWriteBack);
    eprintln!("caught at seed {seed}: {failure}");
    // A lost write shows as an outcome the model refuses (a read of old bytes or
    // zeros, a hole where data was written), not as a crash of the harness.
    assert!(
        failure.message.contains("node 0: ") && !failure.message.contains("panicked"),
        "{failure}"
    );
    // The same seed with working revokes passes: the fault is what failed it.
    run_seed(&config(seed, RevokeFault::None))
        .unwrap_or_else(|f| panic!("seed {seed} fails without the fault too: {f}"));
}

#[test]
fn a_revoke_that_keeps_cached_data_is_caught() {
    let (seed, failure) = first_caught(RevokeFault::KeepCachedData);
    eprintln!("caught at seed {seed}: {failure}");
    assert!(
        failure
            .message
            .contains("in the pagepool but the node holds"),
        "{failure}"
    );
    run_seed(&config(seed, RevokeFault::None))
        .unwrap_or_else(|f| panic!("seed {seed} fails without the fault too: {f}"));
}
