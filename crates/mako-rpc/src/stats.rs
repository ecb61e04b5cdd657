//! Counters of one transport: what tests assert on and what a daemon will export.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

macro_rules! counters {
    ($($(#[$doc:meta])* $name:ident),* $(,)?) => {
        /// A snapshot of a transport's counters.
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
        pub struct RpcStats {
            $($(#[$doc])* pub $name: u64,)*
        }

        #[derive(Default)]
        pub(crate) struct Counters {
            $(pub(crate) $name: AtomicU64,)*
        }

        impl Counters {
            pub(crate) fn snapshot(&self) -> RpcStats {
                RpcStats { $($name: self.$name.load(Relaxed),)* }
            }
        }
    };
}

counters! {
    /// Requests this node sent to other nodes.
    requests_sent,
    /// Replies (or error answers) delivered to a waiting caller.
    replies_received,
    /// Replies that arrived after their caller gave up (dropped).
    late_replies,
    /// Calls that ended with `Timeout`.
    timeouts,
    /// Outgoing connections established (hello and authentication done).
    connects,
    /// Outgoing connection attempts that failed (connect, hello or authentication).
    connect_failures,
    /// Outgoing connections closed because they were idle (`idleSocketTimeout`).
    idle_closed,
    /// Incoming connections authenticated.
    accepted,
    /// Incoming connections refused at hello or authentication (version, cluster key).
    handshakes_refused,
    /// Connections (either way) closed because of a bad frame.
    bad_frames,
    /// Requests handed to a service.
    requests_dispatched,
    /// Requests not run because their caller's deadline passed while they waited.
    requests_expired,
    /// Handlers that panicked (a bug; the caller gets an error, the server lives on).
    handler_panics,
    /// Requests this node sent again because their connection closed before the answer
    /// came (version 2 peers: the server runs each request once).
    resends,
    /// Copies of requests that had run here, answered with the answer kept.
    copies_answered,
    /// Copies of requests still running here, answered when the original finished.
    copies_joined,
    /// Copies of requests that had run here whose answer was not kept (or was
    /// acknowledged): answered "reply lost", not run again.
    copies_lost,
}

impl Counters {
    pub(crate) fn add(counter: &AtomicU64) {
        counter.fetch_add(1, Relaxed);
    }
}
