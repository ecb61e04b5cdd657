//! mako-sim: a deterministic simulation of a Mako cluster in one process (the
//! TigerBeetle VOPR / FoundationDB model). Nodes, their disks, the network and the
//! clock are test doubles behind the same traits the daemon uses; the scheduler
//! (`sched`) runs every thread of the simulated cluster one at a time in an order
//! drawn from a seed, so a failing seed replays bit-for-bit.

pub mod net;
pub mod rng;
pub mod sched;

pub use net::{NetConfig, NetStats, SimNet, SimTransport};
pub use rng::SimRng;
pub use sched::{current, Sim, SimConfig, SimFailure, SimReport, TaskId};
