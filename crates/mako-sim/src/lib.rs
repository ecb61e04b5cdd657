//! mako-sim: a deterministic simulation of a Mako cluster in one process (the
//! TigerBeetle VOPR / FoundationDB model). Nodes, their disks, the network and the
//! clock are test doubles behind the same traits the daemon uses; the scheduler
//! (`sched`) runs every thread of the simulated cluster one at a time in an order
//! drawn from a seed, so a failing seed replays bit-for-bit.
//!
//! On top of the scheduler: `SimDisk` (disks with seeded latency, shared by every
//! node), `SimClock`, `SimNet`, `SimCluster` (a formatted file system and N mounted
//! nodes), the seeded workload of POSIX operations (`workload`, `ops`) checked against
//! a model of one POSIX machine (`model`), the cluster's invariants (`invariants`),
//! the seed runner (`runner`), and the scale harness (`scale`).

pub mod clock;
pub mod cluster;
pub mod disk;
mod eligible;
pub mod invariants;
pub mod lease;
pub mod model;
pub mod net;
pub mod ops;
pub mod rng;
pub mod runner;
pub mod scale;
pub mod sched;
pub mod workload;

pub use clock::{SimClock, SIM_EPOCH};
pub use cluster::{Background, ClusterConfig, SimCluster, Thief};
pub use disk::{DiskLatency, SimDisk};
pub use net::{NetConfig, NetStats, SimNet, SimTransport};
pub use rng::SimRng;
pub use runner::{run_seed, run_seeds, FaultKind, SeedConfig, SeedFailure, SeedPlan, SeedReport};
pub use sched::{current, Sim, SimConfig, SimFailure, SimReport, TaskId};
