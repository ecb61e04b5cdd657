//! The scale harness (`mako_sim::scale`): M simulated nodes create one file each in
//! one new directory, and M nodes write their own 47,008-byte record of one file.
//! `MAKO_SIM_SCALE_NODES` sets M (default 8; the figures are 4,096 creates and
//! 1,024 writers). Prints the simulated completion time, messages per operation by
//! service and the busiest node; fails only if the run cannot complete.

use mako_sim::scale::{run_scale, ScaleWorkload};

fn nodes() -> u32 {
    std::env::var("MAKO_SIM_SCALE_NODES")
        .ok()
        .map(|v| v.trim().parse().expect("MAKO_SIM_SCALE_NODES is a number"))
        .unwrap_or(8)
}

fn run(workload: ScaleWorkload) {
    let m = nodes();
    let r = run_scale(workload, m, 1)
        .unwrap_or_else(|e| panic!("{workload:?} on {m} nodes did not complete: {e}"));
    eprintln!("{r}");
    for e in r.errors.iter().take(5) {
        eprintln!("  {e}");
    }
    assert!(r.simulated > std::time::Duration::ZERO);
    if m > 1 {
        assert!(r.net.messages > 0, "{m} nodes worked without a message");
    }
}

#[test]
fn create_storm_in_one_directory() {
    run(ScaleWorkload::CreateStorm);
}

#[test]
fn shared_file_records() {
    run(ScaleWorkload::SharedFileRecords);
}
