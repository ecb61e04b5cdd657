//! Support code of the crash-consistency test (`tests/crash_consistency.rs`): the
//! model, the seeded workload, the checks of a recovered file system and the case
//! runner. See `run.rs` for the steps of one case.

pub mod check;
pub mod log_damage;
pub mod model;
pub mod run;
pub mod workload;
