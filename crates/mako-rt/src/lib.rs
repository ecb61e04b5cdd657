//! mako-rt: the seams between Mako's core and the world (DESIGN.md section 10). The
//! core reads time through [`Clock`], identifies nodes by [`NodeId`] and reaches other
//! nodes only through [`Transport`]; the daemon plugs in the system clock and an
//! in-process (later TCP) transport, the simulation its own seeded ones.

pub mod clock;
pub mod transport;

pub use clock::{Clock, SystemClock};
pub use transport::{
    call, decode, encode, is_refusal, Admit, CallOptions, InProcessTransport, NodeId, Priority,
    Registry, Service, ServiceId, Transport, TransportError, REFUSED_WORDS,
};
