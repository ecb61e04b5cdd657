//! What a `TcpTransport` is started with: this node, where it listens, the other
//! nodes' addresses, the cluster key, and the connection parameters of mako-config
//! (`maxTcpConnsPerNodeConn`, `tscSmallMsgSizeThreshold`, `tscSmallMsgTcpConnPct`,
//! `idleSocketTimeout`, `allToAllConnection`, `tscTcpPort`).

use crate::auth::ClusterKey;
use crate::wire::LaneClass;
use mako_config::{AllToAllConnection, EffectiveConfig};
use mako_rt::NodeId;
use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

/// Default largest frame body: a 16 MiB block (the largest block size) with room for
/// its request around it, four times over.
pub const MAX_FRAME_BYTES_DEFAULT: usize = 64 << 20;
/// Smallest frame limit accepted: a control body must always fit.
pub const MAX_FRAME_BYTES_MIN: usize = 64 << 10;

/// Configuration of one node's transport.
#[derive(Clone, Debug)]
pub struct RpcConfig {
    /// This node.
    pub node: NodeId,
    /// Where this node accepts connections (port 0: any free port, for tests).
    pub listen: SocketAddr,
    /// The other nodes' addresses (updatable later with `TcpTransport::set_peer`).
    pub peers: BTreeMap<NodeId, SocketAddr>,
    /// The secret that proves membership.
    pub cluster_key: ClusterKey,
    /// `maxTcpConnsPerNodeConn`: connections this node opens to each other node.
    pub max_tcp_conns_per_node_conn: usize,
    /// `tscSmallMsgSizeThreshold`: largest request that may use a small lane.
    pub small_msg_size_threshold: usize,
    /// `tscSmallMsgTcpConnPct`: share of the connections reserved for small messages.
    pub small_msg_tcp_conn_pct: u8,
    /// `idleSocketTimeout`: close an outgoing connection idle this long (`None`: never).
    pub idle_socket_timeout: Option<Duration>,
    /// `allToAllConnection`: connect to every known node at start instead of on use.
    pub all_to_all_connection: bool,
    /// Largest frame body accepted; a larger one closes its connection.
    pub max_frame_bytes: usize,
    /// Handler threads for requests on bulk and shared connections.
    pub handler_threads: usize,
    /// Handler threads reserved for requests on small-message connections, so a revoke
    /// never waits for a handler behind streaming block I/O.
    pub small_handler_threads: usize,
    /// Threads that run the sockets (tokio workers).
    pub io_threads: usize,
    /// Longest wait for a TCP connect (a call's own deadline may cut it shorter).
    pub connect_timeout: Duration,
    /// Longest a connection may take to hello and authenticate.
    pub handshake_timeout: Duration,
}

impl RpcConfig {
    /// A configuration with every parameter at its mako-config default.
    pub fn new(node: NodeId, listen: SocketAddr, cluster_key: ClusterKey) -> RpcConfig {
        RpcConfig::from_effective(node, listen.ip(), cluster_key, &EffectiveConfig::defaults())
            .with_port(listen.port())
    }

    /// The configuration a daemon runs with: connection parameters from its effective
    /// configuration, listening on `address` at `tscTcpPort`.
    pub fn from_effective(
        node: NodeId,
        address: IpAddr,
        cluster_key: ClusterKey,
        config: &EffectiveConfig,
    ) -> RpcConfig {
        RpcConfig {
            node,
            listen: SocketAddr::new(address, config.tsc_tcp_port()),
            peers: BTreeMap::new(),
            cluster_key,
            max_tcp_conns_per_node_conn: config.max_tcp_conns_per_node_conn(),
            small_msg_size_threshold: usize::try_from(config.tsc_small_msg_size_threshold_bytes())
                .unwrap_or(usize::MAX),
            small_msg_tcp_conn_pct: config.tsc_small_msg_tcp_conn_pct(),
            idle_socket_timeout: config.idle_socket_timeout(),
            // No remote clusters exist yet: `local` and `all` both mean this cluster.
            all_to_all_connection: matches!(
                config.all_to_all_connection(),
                AllToAllConnection::Local | AllToAllConnection::All
            ),
            max_frame_bytes: MAX_FRAME_BYTES_DEFAULT,
            handler_threads: 16,
            small_handler_threads: 8,
            io_threads: 2,
            connect_timeout: Duration::from_secs(10),
            handshake_timeout: Duration::from_secs(10),
        }
    }

    fn with_port(mut self, port: u16) -> RpcConfig {
        self.listen.set_port(port);
        self
    }

    /// Connections per peer reserved for small messages (the share rounded down, as
    /// mako-config's relation check assumes).
    pub fn small_lanes(&self) -> usize {
        self.max_tcp_conns_per_node_conn * usize::from(self.small_msg_tcp_conn_pct) / 100
    }

    /// The class of each of the connections to one peer, in lane order.
    pub fn lane_classes(&self) -> Vec<LaneClass> {
        let small = self.small_lanes();
        (0..self.max_tcp_conns_per_node_conn)
            .map(|i| match (small, i < small) {
                (0, _) => LaneClass::Shared,
                (_, true) => LaneClass::Small,
                (_, false) => LaneClass::Bulk,
            })
            .collect()
    }

    /// Refuses a configuration the transport cannot run, saying which field and why.
    pub fn validate(&self) -> Result<(), String> {
        if self.max_tcp_conns_per_node_conn == 0 {
            return Err("maxTcpConnsPerNodeConn must be at least 1".into());
        }
        if self.small_msg_tcp_conn_pct > 50 {
            return Err(format!(
                "tscSmallMsgTcpConnPct is {}%, at most 50% may be reserved",
                self.small_msg_tcp_conn_pct
            ));
        }
        if self.max_frame_bytes < MAX_FRAME_BYTES_MIN || self.max_frame_bytes > u32::MAX as usize {
            return Err(format!(
                "the frame limit {} is outside {MAX_FRAME_BYTES_MIN}..={}",
                self.max_frame_bytes,
                u32::MAX
            ));
        }
        for (what, n) in [
            ("handler_threads", self.handler_threads),
            ("small_handler_threads", self.small_handler_threads),
            ("io_threads", self.io_threads),
        ] {
            if n == 0 {
                return Err(format!("{what} must be at least 1"));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_come_from_mako_config() {
        let c = RpcConfig::new(
            NodeId(1),
            "127.0.0.1:0".parse().unwrap(),
            ClusterKey::random(),
        );
        assert_eq!(c.listen.port(), 0);
        assert_eq!(c.max_tcp_conns_per_node_conn, 2);
        assert_eq!(c.small_msg_size_threshold, 512 << 10);
        assert_eq!(c.lane_classes(), vec![LaneClass::Small, LaneClass::Bulk]);
        assert!(c.idle_socket_timeout.is_none());
        assert!(!c.all_to_all_connection);
        c.validate().unwrap();
        let d = RpcConfig::from_effective(
            NodeId(1),
            "10.0.0.1".parse().unwrap(),
            ClusterKey::random(),
            &EffectiveConfig::defaults(),
        );
        assert_eq!(d.listen, "10.0.0.1:1191".parse().unwrap());
    }

    #[test]
    fn lanes_without_a_reserved_share_are_shared() {
        let mut c = RpcConfig::new(
            NodeId(1),
            "127.0.0.1:0".parse().unwrap(),
            ClusterKey::random(),
        );
        c.small_msg_tcp_conn_pct = 0;
        assert_eq!(c.lane_classes(), vec![LaneClass::Shared; 2]);
        c.max_tcp_conns_per_node_conn = 8;
        c.small_msg_tcp_conn_pct = 30;
        let classes = c.lane_classes();
        assert_eq!(
            classes.iter().filter(|&&l| l == LaneClass::Small).count(),
            2
        );
        assert_eq!(classes.iter().filter(|&&l| l == LaneClass::Bulk).count(), 6);
        c.max_frame_bytes = 10;
        assert!(c.validate().unwrap_err().contains("frame limit"));
    }
}
